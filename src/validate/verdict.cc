// The verdict over a run's metrics and its phases (docs/validate.md "Verdict"): every rule, pass or fail with its
// detail; and its JSON. Pure. (Moved from metrics.cc, which computes what the rules read.)
#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "validate/metrics.h"

namespace tandem::validate {

using nlohmann::json;

Verdict judge(const Metrics& m, const std::vector<PhaseResult>& phases) {
  Verdict v;
  auto add = [&](std::string rule, bool pass, std::string detail) {
    v.rules.push_back({std::move(rule), pass, std::move(detail)});
    v.pass = v.pass && pass;
  };
  // Lost jobs: over the phases (each phase checks its own jobs at its end) and over the whole log.
  std::set<std::uint64_t> lost(m.lost.begin(), m.lost.end());
  for (const auto& p : phases) lost.insert(p.metrics.lost.begin(), p.metrics.lost.end());
  {
    std::ostringstream o;
    if (lost.empty()) {
      o << "0 of " << m.accepted << " accepted jobs lost";
    } else {
      o << lost.size() << " accepted job" << (lost.size() == 1 ? "" : "s") << " never reached a terminal state (job";
      o << (lost.size() == 1 ? "" : "s");
      int shown = 0;
      for (auto id : lost) {
        if (shown++ == 20) {
          o << " ...";
          break;
        }
        o << " " << id;
        auto w = m.lost_why.find(id);
        if (w != m.lost_why.end()) o << ": " << w->second << (shown < static_cast<int>(lost.size()) ? ";" : "");
      }
      o << ")";
    }
    add("lost_jobs", lost.empty(), o.str());
  }
  {
    std::ostringstream o;
    if (m.duplicates.empty()) {
      o << "0 duplicated side effects";
    } else {
      o << m.duplicates.size() << " duplicate" << (m.duplicates.size() == 1 ? "" : "s") << ":";
      int shown = 0;
      for (const auto& d : m.duplicates) {
        if (shown++ == 10) {
          o << " ...";
          break;
        }
        o << " [" << d.kind << "] " << d.detail << ";";
      }
    }
    add("duplicate_side_effects", m.duplicates.empty(), o.str());
  }
  {
    std::ostringstream o;
    bool pass = false;
    if (m.rss_samples == 0) {
      o << "the daemon's RSS was never measured";
    } else if (m.host_budget == 0) {
      o << "no host-memory budget was known (HostMemory.budget was 0 or absent) to compare the peak RSS ("
        << m.peak_rss / 1048576 << " MiB) against";
    } else {
      pass = m.peak_rss <= m.host_budget;
      o << "peak RSS " << m.peak_rss / 1048576 << " MiB " << (pass ? "<=" : ">") << " budget "
        << m.host_budget / 1048576 << " MiB (" << m.rss_samples << " samples)";
    }
    add("host_ram_budget", pass, o.str());
  }
  {
    std::ostringstream o;
    const bool pass = m.degraded_violations.empty();
    o << m.degraded_announced_first << " of " << m.degraded_results << " degraded results were announced first ("
      << m.degraded_announced_first - m.degraded_job_notice_only << " by the service state, "
      << m.degraded_job_notice_only << " only by the job's own routed/migrated update)";
    for (const auto& x : m.degraded_violations) o << "; " << x.detail;
    add("degraded_announced", pass, o.str());
  }
  {
    std::ostringstream o;
    bool pass = true;
    int unmet = 0;
    for (const auto& p : phases) {
      if (!p.completed) {
        pass = false;
        o << (unmet++ ? "; " : "") << "phase " << p.name << " did not finish";
      }
      for (const auto& u : p.unmet) {
        pass = false;
        o << (unmet++ ? "; " : "") << "phase " << p.name << ": " << u;
      }
    }
    if (pass) o << "every phase finished and met its expectations";
    add("phase_expectations", pass, o.str());
  }
  // Embed calls: every call got exactly one reply (vectors or a typed error). Only when the log has any.
  std::uint64_t calls = m.embed_calls, unanswered = m.embed_unanswered.size(), twice = m.embed_answered_twice.size();
  for (const auto& p : phases) {
    unanswered = std::max<std::uint64_t>(unanswered, p.metrics.embed_unanswered.size());
    twice = std::max<std::uint64_t>(twice, p.metrics.embed_answered_twice.size());
  }
  if (calls > 0 || unanswered > 0 || twice > 0) {
    std::ostringstream o;
    o << calls << " Embed calls: " << m.embed_ok << " with vectors (" << m.embed_gpu << " gpu, " << m.embed_cpu
      << " cpu), " << m.embed_errors << " typed errors";
    for (const auto& [name, n] : m.embed_errors_by) o << " " << name << "=" << n;
    o << ", " << unanswered << " unanswered, " << twice << " answered twice";
    auto list = [&](const char* what, const std::vector<std::uint64_t>& reqs) {
      if (reqs.empty()) return;
      o << "; " << what << " (req";
      for (std::size_t i = 0; i < reqs.size() && i < 20; ++i) o << " " << reqs[i];
      o << ")";
    };
    list("unanswered", m.embed_unanswered);
    list("answered twice", m.embed_answered_twice);
    add("embed_replies", unanswered == 0 && twice == 0, o.str());
  }
  if (auto r = transcribe_rule(m, phases)) add(r->rule, r->pass, r->detail);
  return v;
}

json to_json(const Verdict& v) {
  json rules = json::array();
  for (const auto& r : v.rules) rules.push_back({{"rule", r.rule}, {"pass", r.pass}, {"detail", r.detail}});
  return {{"pass", v.pass}, {"rules", rules}};
}

}  // namespace tandem::validate
