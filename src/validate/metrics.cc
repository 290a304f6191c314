#include "validate/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <sstream>

namespace tandem::validate {

namespace {

using nlohmann::json;

std::string s_of(const json& d, const char* k) {
  auto it = d.find(k);
  return (it != d.end() && it->is_string()) ? it->get<std::string>() : std::string();
}
std::uint64_t u_of(const json& d, const char* k, std::uint64_t dflt = 0) {
  auto it = d.find(k);
  if (it == d.end() || !it->is_number()) return dflt;
  if (it->is_number_unsigned()) return it->get<std::uint64_t>();
  if (it->is_number_integer()) return static_cast<std::uint64_t>(std::max<std::int64_t>(0, it->get<std::int64_t>()));
  return static_cast<std::uint64_t>(std::max(0.0, it->get<double>()));
}
bool b_of(const json& d, const char* k) {
  auto it = d.find(k);
  return it != d.end() && it->is_boolean() && it->get<bool>();
}
std::vector<std::int64_t> ints_of(const json& d, const char* k) {
  std::vector<std::int64_t> out;
  auto it = d.find(k);
  if (it == d.end() || !it->is_array()) return out;
  for (const auto& v : *it)
    if (v.is_number_integer()) out.push_back(v.get<std::int64_t>());
  return out;
}
std::vector<std::string> strs_of(const json& d, const char* k) {
  std::vector<std::string> out;
  auto it = d.find(k);
  if (it == d.end() || !it->is_array()) return out;
  for (const auto& v : *it)
    if (v.is_string()) out.push_back(v.get<std::string>());
  return out;
}

bool terminal(const std::string& s) { return s == "completed" || s == "failed" || s == "cancelled"; }

struct JobView {
  std::uint64_t id = 0;
  std::string key;
  bool side_effects = false;
  bool is_new = false;  // accepted by this log's Submit (existing=false), a Resume, or a child client
  std::optional<std::uint64_t> resumed_from;
  std::optional<std::int64_t> submit_t;
  std::optional<json> final;
  bool started = false;
  std::optional<std::int64_t> first_token_t, finished_t;
  bool completed_update = false;
  std::string equiv;  // equivalence tag
};

}  // namespace

std::string route_category(const std::vector<std::string>& routes) {
  std::string out;
  std::string last;
  for (const auto& r : routes) {
    if (r == last) continue;
    out += (out.empty() ? "" : ">") + r;
    last = r;
  }
  return out.empty() ? "none" : out;
}

Percentiles percentiles(std::vector<double> ms) {
  Percentiles p;
  p.n = ms.size();
  if (ms.empty()) return p;
  std::sort(ms.begin(), ms.end());
  auto rank = [&](double q) {
    std::size_t r = static_cast<std::size_t>(std::ceil(q * static_cast<double>(ms.size())));
    r = std::clamp<std::size_t>(r, 1, ms.size());
    return ms[r - 1];
  };
  p.p50_ms = rank(0.50);
  p.p95_ms = rank(0.95);
  p.p99_ms = rank(0.99);
  p.max_ms = ms.back();
  return p;
}

Metrics compute_metrics(const std::vector<Event>& events_in) {
  std::vector<Event> events = events_in;
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.t_us != b.t_us ? a.t_us < b.t_us : a.seq < b.seq;
  });
  Metrics m;
  if (events.empty()) return m;
  const std::int64_t t0 = events.front().t_us;
  m.duration_s = static_cast<double>(events.back().t_us - t0) / 1e6;

  std::map<std::uint64_t, JobView> jobs;
  std::map<std::uint64_t, std::int64_t> req_t;   // submit request id -> time
  std::map<std::uint64_t, json> req_data;
  std::map<std::string, std::vector<std::uint64_t>> key_jobs;  // key -> new jobs, in acceptance order
  struct ClientJob {
    std::uint64_t delivered = 0;
    bool have_tokens = false;
    int finished = 0;
    bool degraded = false;      // the job runs on a degraded route (its own flag, or moved off the GPU)
    bool job_notice = false;    // the job's own routed(degraded=true) / migrated update came first
    std::string route;          // route of the last routed update
    bool result_checked = false;
  };
  std::map<std::pair<std::int32_t, std::uint64_t>, ClientJob> cj;
  std::map<std::int32_t, bool> known_degraded;
  std::vector<std::pair<std::int64_t, std::string>> breaker;  // (t, state)
  std::vector<std::pair<std::int64_t, std::uint64_t>> rss;     // (t, bytes)
  std::vector<Event> faults;
  std::vector<std::int64_t> daemon_started;
  std::vector<json> equiv_pairs;
  std::vector<std::pair<std::int64_t, std::uint64_t>> cpu_completions, any_completions;  // (t, job)

  auto job = [&](std::uint64_t id) -> JobView& {
    JobView& j = jobs[id];
    j.id = id;
    return j;
  };

  std::map<std::uint64_t, int> embed_answers;  // req -> answers
  for (const Event& e : events) {
    const json& d = e.data;
    if (e.type == "embed_call") {
      ++m.embed_calls;
      embed_answers.emplace(u_of(d, "req"), 0);
    } else if (e.type == "embed_ok" || e.type == "embed_error") {
      ++embed_answers[u_of(d, "req")];
      if (e.type == "embed_ok") {
        ++m.embed_ok;
        m.embed_inputs += u_of(d, "count");
        const std::string route = s_of(d, "route");
        if (route == "gpu") ++m.embed_gpu;
        if (route == "cpu") ++m.embed_cpu;
      } else {
        ++m.embed_errors;
        ++m.embed_errors_by[s_of(d, "error")];
      }
    } else if (e.type == "submit") {
      ++m.submitted;
      req_t[u_of(d, "req")] = e.t_us;
      req_data[u_of(d, "req")] = d;
    } else if (e.type == "submit_ok" || e.type == "resume_ok") {
      JobView& j = job(e.job);
      const std::string key = s_of(d, "key");
      const bool existing = b_of(d, "existing");
      auto rt = req_t.find(u_of(d, "req"));
      if (existing) {
        ++m.existing;
        if (!key.empty()) {
          auto& list = key_jobs[key];
          if (!list.empty() && std::find(list.begin(), list.end(), e.job) == list.end())
            m.duplicates.push_back({"key_second_job", key, {list.front(), e.job},
                                    "a resubmission of key '" + key + "' was answered with job " +
                                        std::to_string(e.job) + ", not the key's job " + std::to_string(list.back())});
        }
        continue;
      }
      if (!j.is_new) {
        j.is_new = true;
        ++m.accepted;
        if (rt != req_t.end()) j.submit_t = rt->second;
        j.key = key;
        j.side_effects = b_of(d, "side_effects") ||
                         (req_data.count(u_of(d, "req")) && b_of(req_data[u_of(d, "req")], "side_effects"));
        j.equiv = s_of(d, "equiv");
        if (e.type == "resume_ok") j.resumed_from = u_of(d, "from_job");
        if (!key.empty()) key_jobs[key].push_back(e.job);
        const std::string route = s_of(d, "route");
        if (route == "cpu") ++m.cpu_routed;
        else if (route == "gpu" || route == "hybrid") ++m.gpu_routed;
      }
    } else if (e.type == "submit_rejected") {
      ++m.rejected;
      std::string name = s_of(d, "error");
      ++m.rejected_by[name.empty() ? "unknown" : name];
    } else if (e.type == "update") {
      JobView& j = job(e.job);
      ClientJob& c = cj[{e.client, e.job}];
      const std::string kind = s_of(d, "kind");
      if (kind == "routed") {
        const std::string route = s_of(d, "route");
        if (b_of(d, "degraded")) c.degraded = c.job_notice = true;
        if (route == "cpu" && c.route == "gpu") c.degraded = true;  // moved off the GPU, flagged or not
        c.route = route;
      }
      if (kind == "started" && s_of(d, "route") == "cpu" && c.route == "gpu") c.degraded = true;
      if (kind == "migrated") c.degraded = c.job_notice = true;
      if (kind == "started") j.started = true;
      if (kind == "tokens" || kind == "finished") {
        if (c.degraded && !c.result_checked) {
          c.result_checked = true;
          ++m.degraded_results;
          if (known_degraded[e.client]) {
            ++m.degraded_announced_first;
          } else if (c.job_notice) {
            ++m.degraded_announced_first;
            ++m.degraded_job_notice_only;
          } else {
            std::ostringstream o;
            o << "job " << e.job << ": its first degraded " << kind << " update reached client " << e.client
              << " at +" << (e.t_us - t0) / 1000 << " ms; before it, that connection had seen neither "
              << "DegradedModeChanged(degraded=true) / State != normal nor a routed(degraded=true) or migrated "
              << "update for the job";
            m.degraded_violations.push_back({e.job, e.client, o.str()});
          }
        }
      }
      if (kind == "tokens") {
        const std::uint64_t step = u_of(d, "step");
        const std::uint64_t n = ints_of(d, "tokens").size() > 0 ? ints_of(d, "tokens").size() : u_of(d, "n");
        if (!j.first_token_t) j.first_token_t = e.t_us;
        const bool resumed = j.resumed_from.has_value();
        if (c.have_tokens || !resumed) {
          if (step < c.delivered) {
            std::ostringstream o;
            o << "job " << e.job << ": tokens from step " << step << " delivered again to client " << e.client
              << " (already had " << c.delivered << ")";
            m.duplicates.push_back({"tokens_redelivered", j.key, {e.job}, o.str()});
          } else if (step > c.delivered) {
            ++m.token_gaps;
          }
        }
        c.have_tokens = true;
        c.delivered = std::max(c.delivered, step + n);
      }
      if (kind == "finished") {
        ++c.finished;
        if (c.finished == 2)
          m.duplicates.push_back({"finished_twice", j.key, {e.job},
                                  "job " + std::to_string(e.job) + ": a second 'finished' update reached client " +
                                      std::to_string(e.client)});
        if (!j.finished_t) j.finished_t = e.t_us;
        if (s_of(d, "state") == "completed") j.completed_update = true;
      }
    } else if (e.type == "degraded_changed") {
      known_degraded[e.client] = b_of(d, "degraded");
      if (b_of(d, "degraded") && e.client == -1) ++m.degraded_announcements;  // the monitor's connection
    } else if (e.type == "state_seen") {
      const std::string st = s_of(d, "state");
      if (!st.empty()) known_degraded[e.client] = st != "normal";
    } else if (e.type == "sample") {
      const std::string b = s_of(d, "breaker");
      if (!b.empty()) breaker.emplace_back(e.t_us, b);
      std::uint64_t r = u_of(d, "rss");
      if (r == 0) r = u_of(d, "daemon_rss");
      if (r > 0) {
        rss.emplace_back(e.t_us, r);
        m.peak_rss = std::max(m.peak_rss, r);
      }
      const std::uint64_t budget = u_of(d, "host_budget");
      if (budget > 0 && (m.host_budget == 0 || budget < m.host_budget)) m.host_budget = budget;
      if (d.contains("queues") && d["queues"].is_array())
        for (const auto& q : d["queues"]) {
          const std::string name = s_of(q, "name");
          m.max_queue_depth[name] = std::max(m.max_queue_depth[name], u_of(q, "depth"));
          m.max_oldest_age_ms[name] = std::max(m.max_oldest_age_ms[name], u_of(q, "oldest_age_ms"));
        }
    } else if (e.type == "breaker") {
      breaker.emplace_back(e.t_us, s_of(d, "state"));
    } else if (e.type == "fault") {
      ++m.faults;
      ++m.faults_by[s_of(d, "kind")];
      faults.push_back(e);
    } else if (e.type == "daemon_started") {
      daemon_started.push_back(e.t_us);
    } else if (e.type == "cancel") {
      ++m.cancel_requests;
    } else if (e.type == "skipped") {
      ++m.skipped;
      m.skipped_what.push_back(s_of(d, "what") + ": " + s_of(d, "why"));
    } else if (e.type == "equiv_pair") {
      equiv_pairs.push_back(d);
    } else if (e.type == "job_final") {
      JobView& j = job(e.job);
      if (!j.final || terminal(s_of(d, "state"))) j.final = d;
    }
  }

  // Job outcomes, lost jobs, migrations and retries.
  for (auto& [id, j] : jobs) {
    if (!j.is_new) continue;
    const json* f = j.final ? &*j.final : nullptr;
    const std::string st = f ? s_of(*f, "state") : "";
    if (!terminal(st)) {
      m.lost.push_back(id);
      m.lost_why[id] = !f ? "no GetJob answer recorded for it"
                          : (s_of(*f, "error").empty() ? "still '" + st + "' after the drain"
                                                        : "GetJob failed: " + s_of(*f, "error"));
      continue;
    }
    if (st == "completed") ++m.completed;
    else if (st == "cancelled") ++m.cancelled;
    else if (s_of(*f, "error_code") == "Resumable") ++m.resumable_failed;
    else ++m.failed_other;
    if (st == "failed") ++m.failed_by[s_of(*f, "reason")];
    const auto hist = strs_of(*f, "history");
    if (std::find(hist.begin(), hist.end(), "migrating") != hist.end()) ++m.migrated;
    if (std::find(hist.begin(), hist.end(), "retrying") != hist.end()) ++m.retried;
  }
  {
    std::map<std::string, std::vector<double>> lat, ttft;
    for (auto& [id, j] : jobs) {
      if (!j.is_new || !j.final || s_of(*j.final, "state") != "completed" || !j.submit_t) continue;
      const std::string cat = route_category(strs_of(*j.final, "routes"));
      if (j.finished_t) lat[cat].push_back(static_cast<double>(*j.finished_t - *j.submit_t) / 1000.0);
      if (j.first_token_t) ttft[cat].push_back(static_cast<double>(*j.first_token_t - *j.submit_t) / 1000.0);
      if (j.finished_t) {
        any_completions.emplace_back(*j.finished_t, id);
        if (cat.size() >= 3 && cat.compare(cat.size() - 3, 3, "cpu") == 0) cpu_completions.emplace_back(*j.finished_t, id);
      }
    }
    for (auto& [k, v] : lat) m.latency[k] = percentiles(v);
    for (auto& [k, v] : ttft) m.ttft[k] = percentiles(v);
    std::sort(any_completions.begin(), any_completions.end());
    std::sort(cpu_completions.begin(), cpu_completions.end());
  }

  // Duplicates per idempotency key: independent executions (resume chains count once) and delivered results.
  for (const auto& [key, list] : key_jobs) {
    std::vector<std::uint64_t> roots_executed, completed;
    for (std::uint64_t id : list) {
      const JobView& j = jobs[id];
      const json* f = j.final ? &*j.final : nullptr;
      bool continuation = false;
      if (j.resumed_from) {
        auto it = jobs.find(*j.resumed_from);
        continuation = it != jobs.end() && it->second.final && s_of(*it->second.final, "state") == "failed" &&
                       std::find(list.begin(), list.end(), *j.resumed_from) != list.end();
      }
      const bool executed = j.started || (f && (u_of(*f, "attempts") > 0 || !strs_of(*f, "routes").empty()));
      if (executed && !continuation) roots_executed.push_back(id);
      if (f && s_of(*f, "state") == "completed") completed.push_back(id);
    }
    if (roots_executed.size() > 1) {
      std::ostringstream o;
      o << "key '" << key << "' was executed by " << roots_executed.size() << " independent jobs:";
      for (auto id : roots_executed) o << " " << id;
      m.duplicates.push_back({"executed_twice", key, roots_executed, o.str()});
    }
    if (completed.size() > 1) {
      std::ostringstream o;
      o << "key '" << key << "' delivered " << completed.size() << " completed results:";
      for (auto id : completed) o << " " << id;
      m.duplicates.push_back({"delivered_twice", key, completed, o.str()});
    }
  }

  // Token equivalence.
  for (const json& p : equiv_pairs) {
    EquivalencePair ep;
    ep.group = s_of(p, "group");
    ep.gpu_job = u_of(p, "gpu_job");
    ep.cpu_job = u_of(p, "cpu_job");
    auto fg = jobs.find(ep.gpu_job), fc = jobs.find(ep.cpu_job);
    if (fg == jobs.end() || fc == jobs.end() || !fg->second.final || !fc->second.final) {
      ep.note = "a job of the pair has no final state";
    } else {
      const json& g = *fg->second.final;
      const json& c = *fc->second.final;
      const auto rg = strs_of(g, "routes"), rc = strs_of(c, "routes");
      if (s_of(g, "state") != "completed" || s_of(c, "state") != "completed") {
        ep.note = "not both completed";
      } else if (route_category(rg) != "gpu" || route_category(rc) != "cpu") {
        ep.note = "routes were " + route_category(rg) + " / " + route_category(rc) + ", want gpu / cpu";
      } else {
        ep.valid = true;
        const auto tg = ints_of(g, "tokens"), tc = ints_of(c, "tokens");
        ep.gpu_tokens = tg.size();
        ep.cpu_tokens = tc.size();
        const std::size_t n = std::min(tg.size(), tc.size());
        for (std::size_t i = 0; i < n; ++i)
          if (tg[i] != tc[i]) {
            ep.first_divergence = i;
            break;
          }
        if (!ep.first_divergence && tg.size() != tc.size()) ep.first_divergence = n;
        ep.equal = !ep.first_divergence;
      }
    }
    if (ep.valid) {
      ++m.equiv_valid;
      if (ep.equal) ++m.equiv_equal;
      if (ep.first_divergence && (!m.first_divergence || *ep.first_divergence < *m.first_divergence))
        m.first_divergence = ep.first_divergence;
    }
    m.pairs.push_back(ep);
  }
  if (m.equiv_valid > 0) m.equivalence_rate = static_cast<double>(m.equiv_equal) / static_cast<double>(m.equiv_valid);

  // Breaker transitions (from PropertiesChanged and samples; repeated states collapse).
  std::stable_sort(breaker.begin(), breaker.end(), [](auto& a, auto& b) { return a.first < b.first; });
  {
    std::string last = "closed";
    std::vector<std::pair<std::int64_t, std::string>> changes;
    for (const auto& [t, s] : breaker)
      if (s != last) {
        changes.emplace_back(t, s);
        if (s == "open" && last == "closed") ++m.breaker_opened;
        if (s == "closed") ++m.breaker_closed;
        last = s;
      }
    breaker = changes;
  }

  // Recovery per fault. The breaker must open between this fault and the next one (or the end) to count as
  // this fault's doing; its closing may come later.
  for (std::size_t fi = 0; fi < faults.size(); ++fi) {
    const Event& f = faults[fi];
    const std::int64_t next_fault = fi + 1 < faults.size() ? faults[fi + 1].t_us : std::numeric_limits<std::int64_t>::max();
    const std::string kind = s_of(f.data, "kind");
    if (kind != "lose_device" && kind != "fail_allocations" && kind != "fail_probes" && kind != "kill_daemon") continue;
    Recovery r;
    r.fault = kind;
    r.at_s = static_cast<double>(f.t_us - t0) / 1e6;
    for (const auto& [t, id] : cpu_completions)  // before the next fault: after it, the next fault owns it
      if (t > f.t_us && t < next_fault) {
        r.to_cpu_completion_ms = static_cast<double>(t - f.t_us) / 1000.0;
        break;
      }
    if (kind == "kill_daemon")
      for (std::int64_t t : daemon_started)
        if (t > f.t_us) {
          r.to_daemon_ready_ms = static_cast<double>(t - f.t_us) / 1000.0;
          break;
        }
    if (kind == "kill_daemon")
      for (const auto& [t, id] : any_completions)
        if (t > f.t_us && t < next_fault) {
          r.to_cpu_completion_ms = static_cast<double>(t - f.t_us) / 1000.0;  // first completion on any route
          break;
        }
    bool opened = false;
    for (const auto& [t, s] : breaker) {
      if (t < f.t_us) continue;
      if (!opened && t >= next_fault) break;
      if (s == "open" || s == "half_open") opened = true;
      if (opened && s == "closed") {
        r.to_breaker_closed_ms = static_cast<double>(t - f.t_us) / 1000.0;
        break;
      }
    }
    r.breaker_opened = opened;
    m.recoveries.push_back(r);
  }

  // Host RAM trend.
  m.rss_samples = rss.size();
  if (rss.size() >= 2) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    const double n = static_cast<double>(rss.size());
    for (const auto& [t, b] : rss) {
      const double x = static_cast<double>(t - rss.front().first) / 3.6e9;  // hours
      const double y = static_cast<double>(b) / 1048576.0;
      sx += x, sy += y, sxx += x * x, sxy += x * y;
    }
    const double den = n * sxx - sx * sx;
    if (den > 0) m.rss_slope_mib_per_h = (n * sxy - sx * sy) / den;
    const std::size_t tenth = std::max<std::size_t>(1, rss.size() / 10);
    double a = 0, b = 0;
    for (std::size_t i = 0; i < tenth; ++i) {
      a += static_cast<double>(rss[i].second);
      b += static_cast<double>(rss[rss.size() - 1 - i].second);
    }
    m.rss_first_mib = a / static_cast<double>(tenth) / 1048576.0;
    m.rss_last_mib = b / static_cast<double>(tenth) / 1048576.0;
  }
  for (const auto& [req, n] : embed_answers) {
    if (n == 0) m.embed_unanswered.push_back(req);
    if (n > 1) m.embed_answered_twice.push_back(req);
  }
  compute_transcribe_metrics(events, m);
  compute_residency_metrics(events, m);
  compute_eta_metrics(events, m);
  return m;
}

json to_json(const Metrics& m) {
  json j;
  j["duration_s"] = m.duration_s;
  j["submitted"] = m.submitted;
  j["accepted"] = m.accepted;
  j["existing"] = m.existing;
  j["completed"] = m.completed;
  j["resumable_failed"] = m.resumable_failed;
  j["failed_other"] = m.failed_other;
  j["cancelled"] = m.cancelled;
  j["rejected"] = m.rejected;
  j["rejected_by"] = m.rejected_by;
  j["failed_by"] = m.failed_by;
  j["lost"] = m.lost;
  json why = json::object();
  for (const auto& [id, w] : m.lost_why) why[std::to_string(id)] = w;
  j["lost_why"] = why;
  json dups = json::array();
  for (const auto& d : m.duplicates) dups.push_back({{"kind", d.kind}, {"key", d.key}, {"jobs", d.jobs}, {"detail", d.detail}});
  j["duplicates"] = dups;
  j["token_gaps"] = m.token_gaps;
  j["cpu_routed"] = m.cpu_routed;
  j["gpu_routed"] = m.gpu_routed;
  j["migrated"] = m.migrated;
  j["retried"] = m.retried;
  j["cancel_requests"] = m.cancel_requests;
  j["faults"] = m.faults;
  j["faults_by"] = m.faults_by;
  j["skipped"] = m.skipped_what;
  json pairs = json::array();
  for (const auto& p : m.pairs) {
    json x{{"group", p.group}, {"gpu_job", p.gpu_job}, {"cpu_job", p.cpu_job}, {"valid", p.valid},
           {"equal", p.equal}, {"gpu_tokens", p.gpu_tokens}, {"cpu_tokens", p.cpu_tokens}};
    if (p.first_divergence) x["first_divergence"] = *p.first_divergence;
    if (!p.note.empty()) x["note"] = p.note;
    pairs.push_back(x);
  }
  j["equivalence"] = {{"pairs", pairs}, {"valid", m.equiv_valid}, {"equal", m.equiv_equal}};
  if (m.equivalence_rate) j["equivalence"]["rate"] = *m.equivalence_rate;
  if (m.first_divergence) j["equivalence"]["first_divergence"] = *m.first_divergence;
  auto pct = [](const std::map<std::string, Percentiles>& in) {
    json o = json::object();
    for (const auto& [k, p] : in)
      o[k] = {{"n", p.n}, {"p50_ms", p.p50_ms}, {"p95_ms", p.p95_ms}, {"p99_ms", p.p99_ms}, {"max_ms", p.max_ms}};
    return o;
  };
  j["latency"] = pct(m.latency);
  j["ttft"] = pct(m.ttft);
  j["max_queue_depth"] = m.max_queue_depth;
  j["max_oldest_age_ms"] = m.max_oldest_age_ms;
  j["host_ram"] = {{"samples", m.rss_samples}, {"peak_rss", m.peak_rss}, {"budget", m.host_budget}};
  if (m.rss_slope_mib_per_h) j["host_ram"]["slope_mib_per_h"] = *m.rss_slope_mib_per_h;
  if (m.rss_first_mib) j["host_ram"]["first_tenth_mib"] = *m.rss_first_mib;
  if (m.rss_last_mib) j["host_ram"]["last_tenth_mib"] = *m.rss_last_mib;
  json rec = json::array();
  for (const auto& r : m.recoveries) {
    json x{{"fault", r.fault}, {"at_s", r.at_s}, {"breaker_opened", r.breaker_opened}};
    if (r.to_cpu_completion_ms) x[r.fault == "kill_daemon" ? "to_first_completion_ms" : "to_cpu_completion_ms"] = *r.to_cpu_completion_ms;
    if (r.to_breaker_closed_ms) x["to_breaker_closed_ms"] = *r.to_breaker_closed_ms;
    if (r.to_daemon_ready_ms) x["to_daemon_ready_ms"] = *r.to_daemon_ready_ms;
    rec.push_back(x);
  }
  j["recovery"] = rec;
  json viol = json::array();
  for (const auto& v : m.degraded_violations) viol.push_back({{"job", v.job}, {"client", v.client}, {"detail", v.detail}});
  j["degraded"] = {{"announcements", m.degraded_announcements},
                   {"degraded_results", m.degraded_results},
                   {"announced_first", m.degraded_announced_first},
                   {"announced_by_job_update_only", m.degraded_job_notice_only},
                   {"violations", viol}};
  j["breaker"] = {{"opened", m.breaker_opened}, {"closed", m.breaker_closed}};
  if (m.embed_calls > 0)
    j["embed"] = {{"calls", m.embed_calls},           {"ok", m.embed_ok},
                  {"errors", m.embed_errors},         {"errors_by", m.embed_errors_by},
                  {"gpu", m.embed_gpu},               {"cpu", m.embed_cpu},
                  {"inputs", m.embed_inputs},         {"unanswered", m.embed_unanswered},
                  {"answered_twice", m.embed_answered_twice}};
  if (m.transcribe.calls > 0) j["transcribe"] = to_json(m.transcribe);
  if (m.gpu_evictions + m.gpu_restores > 0)
    j["residency"] = {{"evictions", m.gpu_evictions},        {"pressure_evictions", m.gpu_pressure_evictions},
                      {"restores", m.gpu_restores},          {"restore_failures", m.gpu_restore_failures},
                      {"time_to_free_ms", m.time_to_free_ms}, {"time_to_restore_ms", m.time_to_restore_ms},
                      {"ours_before_bytes", m.ours_before_bytes}, {"ours_low_bytes", m.ours_low_bytes}};
  if (!m.eta.empty()) j["eta"] = to_json_eta(m);
  return j;
}

std::vector<std::string> check_expectations(const json& x, const Metrics& m) {
  std::vector<std::string> unmet;
  auto min = [&](const char* key, std::uint64_t have, const char* what) {
    if (!x.contains(key)) return;
    const std::uint64_t want = u_of(x, key);
    if (have < want)
      unmet.push_back(std::string(key) + ": want >= " + std::to_string(want) + " " + what + ", got " + std::to_string(have));
  };
  min("min_completed", m.completed, "completed jobs");
  min("min_cpu_routed", m.cpu_routed, "jobs routed to the CPU at admission");
  min("min_migrated", m.migrated, "migrated jobs");
  min("min_retried", m.retried, "retried jobs");
  min("min_cancelled", m.cancelled, "cancelled jobs");
  min("min_resumable_failed", m.resumable_failed, "failed-resumable jobs");
  min("min_rejected", m.rejected, "rejected submissions");
  min("min_embed_ok", m.embed_ok, "Embed calls answered with vectors");
  min("min_embed_gpu", m.embed_gpu, "Embed calls run on the GPU");
  min("min_embed_cpu", m.embed_cpu, "Embed calls run on the CPU");
  min("min_transcribe_ok", m.transcribe.completed, "completed transcription jobs");
  min("min_transcribe_gpu", m.transcribe.gpu, "transcription jobs completed wholly on the GPU");
  min("min_transcribe_cpu", m.transcribe.cpu, "transcription jobs completed with windows on the CPU");
  min("min_transcribe_migrated", m.transcribe.migrated, "transcription jobs migrated at a window boundary");
  min("min_pressure_evictions", m.gpu_pressure_evictions, "GPU replicas given back for foreign pressure");
  min("min_gpu_restores", m.gpu_restores, "GPU replicas loaded again");
  if (x.contains("max_pressure_evictions") && m.gpu_pressure_evictions > u_of(x, "max_pressure_evictions"))
    unmet.push_back("max_pressure_evictions: want <= " + std::to_string(u_of(x, "max_pressure_evictions")) +
                    " GPU replicas given back for foreign pressure, got " + std::to_string(m.gpu_pressure_evictions));
  if (x.contains("restored_by_end") && x["restored_by_end"].is_boolean() && x["restored_by_end"].get<bool>() &&
      m.gpu_restores < m.gpu_evictions)
    unmet.push_back("restored_by_end: " + std::to_string(m.gpu_evictions) + " GPU replica(s) given back, only " +
                    std::to_string(m.gpu_restores) + " loaded again by the end of the phase");
  if (x.contains("min_eta_jobs") || x.contains("max_eta_p90_error")) {
    std::size_t n = 0;
    for (const auto& [route, a] : m.eta) n += a.n;
    if (x.contains("min_eta_jobs") && n < u_of(x, "min_eta_jobs"))
      unmet.push_back("min_eta_jobs: want >= " + std::to_string(u_of(x, "min_eta_jobs")) + " jobs with an ETA that ran "
                      "their whole budget, got " + std::to_string(n));
    if (x.contains("max_eta_p90_error") && x["max_eta_p90_error"].is_number()) {
      const double bound = x["max_eta_p90_error"].get<double>();
      for (const auto& [route, a] : m.eta)
        if (a.n > 0 && a.p90_rel > bound) {
          char b[200];
          std::snprintf(b, sizeof b, "max_eta_p90_error: route %s: p90 |eta - actual| / actual = %.2f over %zu job(s), "
                        "want <= %.2f (median %.2f, median signed %+.2f)", route.c_str(), a.p90_rel, a.n, bound,
                        a.median_rel, a.median_signed_rel);
          unmet.push_back(b);
        }
    }
  }
  if (x.contains("breaker_cycle") && x["breaker_cycle"].is_boolean() && x["breaker_cycle"].get<bool>()) {
    bool cycle = false;
    for (const auto& r : m.recoveries) cycle = cycle || (r.breaker_opened && r.to_breaker_closed_ms);
    if (!cycle && !(m.breaker_opened > 0 && m.breaker_closed > 0))
      unmet.push_back("breaker_cycle: the breaker did not open and close again (opened " +
                      std::to_string(m.breaker_opened) + ", closed " + std::to_string(m.breaker_closed) + ")");
  }
  if (x.contains("min_equivalence_rate") && x["min_equivalence_rate"].is_number()) {
    const double want = x["min_equivalence_rate"].get<double>();
    if (!m.equivalence_rate || *m.equivalence_rate < want) {
      std::ostringstream o;
      o << "min_equivalence_rate: want >= " << want << ", got "
        << (m.equivalence_rate ? std::to_string(*m.equivalence_rate) : std::string("no valid pair"));
      unmet.push_back(o.str());
    }
  }
  if (x.contains("degraded_seen") && x["degraded_seen"].is_boolean() && x["degraded_seen"].get<bool>() &&
      m.degraded_announcements == 0)
    unmet.push_back("degraded_seen: no DegradedModeChanged(degraded=true) was received");
  return unmet;
}

std::vector<PhaseResult> compute_phases(const std::vector<Event>& events) {
  std::map<std::int32_t, PhaseResult> by;
  std::map<std::int32_t, std::vector<Event>> ev;
  const std::int64_t t0 = events.empty() ? 0 : std::min_element(events.begin(), events.end(), [](auto& a, auto& b) {
                                                 return a.t_us < b.t_us;
                                               })->t_us;
  for (const Event& e : events) {
    if (e.phase < 0) continue;
    ev[e.phase].push_back(e);
    PhaseResult& p = by[e.phase];
    p.index = e.phase;
    if (e.type == "phase_start") {
      p.name = s_of(e.data, "name");
      if (e.data.contains("expect") && e.data["expect"].is_object()) p.expect = e.data["expect"];
      p.start_s = static_cast<double>(e.t_us - t0) / 1e6;
    } else if (e.type == "phase_end") {
      p.completed = true;
      p.end_s = static_cast<double>(e.t_us - t0) / 1e6;
    }
  }
  std::vector<PhaseResult> out;
  for (auto& [i, p] : by) {
    p.metrics = compute_metrics(ev[i]);
    p.unmet = check_expectations(p.expect, p.metrics);
    if (p.name.empty()) p.name = "phase" + std::to_string(i);
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<std::string> Verdict::failure_lines() const {
  std::vector<std::string> out;
  for (const auto& r : rules)
    if (!r.pass) out.push_back("FAIL " + r.rule + ": " + r.detail);
  return out;
}

}  // namespace tandem::validate
