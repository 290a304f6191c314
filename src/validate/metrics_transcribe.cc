// Transcription metrics and the rule transcribe_outcomes (docs/validate.md "Transcription workloads"). Pure: from the
// events runner_transcribe.cc records (transcribe_call, transcribe_accepted, transcribe_rejected, transcribe_final)
// and the jobs' "update" events (segment, finished).
#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "validate/metrics.h"

namespace tandem::validate {

namespace {

using nlohmann::json;

std::string str(const json& d, const char* k) {
  auto it = d.find(k);
  return (it != d.end() && it->is_string()) ? it->get<std::string>() : std::string();
}
std::uint64_t u64(const json& d, const char* k, std::uint64_t dflt = 0) {
  auto it = d.find(k);
  if (it == d.end() || !it->is_number()) return dflt;
  if (it->is_number_unsigned()) return it->get<std::uint64_t>();
  if (it->is_number_integer()) return static_cast<std::uint64_t>(std::max<std::int64_t>(0, it->get<std::int64_t>()));
  return static_cast<std::uint64_t>(std::max(0.0, it->get<double>()));
}
std::vector<std::string> strs(const json& d, const char* k) {
  std::vector<std::string> out;
  auto it = d.find(k);
  if (it == d.end() || !it->is_array()) return out;
  for (const auto& v : *it)
    if (v.is_string()) out.push_back(v.get<std::string>());
  return out;
}
bool terminal(const std::string& s) { return s == "completed" || s == "failed" || s == "cancelled"; }
bool has(const std::vector<std::string>& v, const char* x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// "gpu", "cpu", "gpu>cpu": the distinct consecutive routes.
std::string category(const std::vector<std::string>& routes) {
  std::string out, last;
  for (const auto& r : routes) {
    if (r == last) continue;
    out += (out.empty() ? "" : ">") + r;
    last = r;
  }
  return out.empty() ? "none" : out;
}

std::string clip(const std::string& s, std::size_t n = 80) { return s.size() <= n ? s : s.substr(0, n) + "..."; }

struct Call {
  std::int64_t t = 0;
  std::int32_t client = -1;
  int answers = 0;
  std::uint64_t job = 0;
  bool existing = false;
  std::optional<json> final;
};

struct Streamed {  // what one client received for one job
  std::vector<std::pair<std::uint64_t, std::string>> segments;  // (index, text) in arrival order
  std::vector<std::string> finished_states;
  std::optional<std::int64_t> finished_t;
};

}  // namespace

void compute_transcribe_metrics(const std::vector<Event>& events, Metrics& m) {
  TranscribeMetrics& t = m.transcribe;
  std::map<std::uint64_t, Call> calls;  // req -> call
  std::map<std::pair<std::int32_t, std::uint64_t>, Streamed> streamed;
  for (const Event& e : events) {
    const json& d = e.data;
    if (e.type == "transcribe_call") {
      ++t.calls;
      Call& c = calls[u64(d, "req")];
      c.t = e.t_us;
      c.client = e.client;
    } else if (e.type == "transcribe_accepted" || e.type == "transcribe_rejected") {
      Call& c = calls[u64(d, "req")];
      ++c.answers;
      if (e.type == "transcribe_rejected") {
        ++t.rejected;
        const std::string name = str(d, "error");
        ++t.rejected_by[name.empty() ? "unknown" : name];
      } else {
        c.job = e.job;
        c.existing = d.contains("existing") && d["existing"].is_boolean() && d["existing"].get<bool>();
        ++(c.existing ? t.existing : t.accepted);
      }
    } else if (e.type == "transcribe_final") {
      calls[u64(d, "req")].final = d;
    } else if (e.type == "update") {
      const std::string kind = str(d, "kind");
      if (kind != "segment" && kind != "finished") continue;
      Streamed& s = streamed[{e.client, e.job}];
      if (kind == "segment") {
        s.segments.emplace_back(u64(d, "index"), str(d, "text"));
      } else {
        s.finished_states.push_back(str(d, "state"));
        if (!s.finished_t) s.finished_t = e.t_us;
      }
    }
  }

  std::map<std::string, std::vector<double>> lat;
  for (const auto& [req, c] : calls) {
    if (c.answers == 0) t.unanswered.push_back(req);
    if (c.answers > 1) t.answered_twice.push_back(req);
    if (c.job == 0) continue;
    auto problem = [&](const char* kind, const std::string& detail) {
      t.problems.push_back({c.job, req, kind, "job " + std::to_string(c.job) + " (req " + std::to_string(req) + "): " + detail});
    };
    const json* f = c.final ? &*c.final : nullptr;
    const std::string st = f ? str(*f, "state") : "";
    if (!terminal(st)) {
      problem("not_terminal", !f ? "no GetJob answer recorded for it"
                                 : (str(*f, "error").empty() ? "still '" + st + "' after the drain"
                                                             : "GetJob failed: " + str(*f, "error")));
      continue;
    }
    const auto sit = streamed.find({c.client, c.job});
    const Streamed* s = sit != streamed.end() ? &sit->second : nullptr;
    if (s && s->finished_states.size() > 1)
      problem("finished_twice", std::to_string(s->finished_states.size()) + " 'finished' updates reached client " +
                                    std::to_string(c.client));
    if (s && !s->finished_states.empty() && s->finished_states.front() != st)
      problem("state_mismatch", "its 'finished' update said '" + s->finished_states.front() + "', GetJob says '" + st + "'");
    if (c.existing) continue;  // an idempotent hit: the job is counted (and checked) under the call that made it

    const auto routes = strs(*f, "routes");
    const auto hist = strs(*f, "history");
    if (has(hist, "migrating")) ++t.migrated;
    if (has(hist, "retrying")) ++t.retried;
    if (st == "completed") ++t.completed;
    if (st == "cancelled") ++t.cancelled;
    if (st == "failed") {
      ++t.failed;
      std::string why = str(*f, "error_code");
      if (why.empty()) why = str(*f, "reason");
      ++t.failed_by[why.empty() ? "unknown" : why];
    }

    // The transcript: GetJob's text is its segments' texts, in order, each index once.
    std::vector<std::pair<std::uint64_t, std::string>> segs;
    if (f->contains("segments") && (*f)["segments"].is_array())
      for (const auto& x : (*f)["segments"]) segs.emplace_back(u64(x, "index"), str(x, "text"));
    if (!str(*f, "segments_error").empty()) problem("bad_segments", "segments_json: " + str(*f, "segments_error"));
    std::string joined;
    for (const auto& [i, text] : segs) joined += text;
    if (joined != str(*f, "text"))
      problem("text_mismatch", "text '" + clip(str(*f, "text")) + "' is not the concatenation of its " +
                                   std::to_string(segs.size()) + " segments '" + clip(joined) + "'");
    for (std::size_t i = 0; i < segs.size(); ++i)
      if (segs[i].first != i) {
        problem("segment_order", "segments_json has index " + std::to_string(segs[i].first) + " at position " +
                                     std::to_string(i) + " (repeated or missing segments)");
        break;
      }
    if (st != "completed") continue;

    // What was streamed to the caller: each of GetJob's segments exactly once, with the same text.
    if (s && !s->finished_states.empty()) {
      std::map<std::uint64_t, std::string> by_index;
      for (const auto& [i, text] : segs) by_index.emplace(i, text);
      std::map<std::uint64_t, int> seen;
      for (const auto& [i, text] : s->segments) {
        if (++seen[i] == 2) problem("segment_repeated", "segment " + std::to_string(i) + " was streamed more than once");
        if (seen[i] != 1) continue;
        auto it = by_index.find(i);
        if (it == by_index.end())
          problem("segment_extra", "segment " + std::to_string(i) + " '" + clip(text) + "' was streamed, GetJob does not have it");
        else if (it->second != text)
          problem("segment_text", "streamed segment " + std::to_string(i) + " '" + clip(text) + "' differs from GetJob's '" +
                                      clip(it->second) + "'");
      }
      for (const auto& [i, text] : by_index)
        if (!seen.count(i)) problem("segment_lost", "segment " + std::to_string(i) + " was never streamed to the caller");
    }
    const std::uint64_t done = u64(*f, "windows_done"), on_cpu = u64(*f, "windows_on_cpu");
    if (has(hist, "migrating") && (on_cpu == 0 || on_cpu >= done))
      problem("migration_windows", "migrated, but " + std::to_string(on_cpu) + " of its " + std::to_string(done) +
                                       " windows ran on the CPU (a window boundary needs some on each side)");
    const std::string cat = category(routes);
    if (cat == "gpu") ++t.gpu;
    if (cat.size() >= 3 && cat.compare(cat.size() - 3, 3, "cpu") == 0) ++t.cpu;
    t.windows += done;
    t.windows_on_cpu += on_cpu;
    t.segments += segs.size();
    if (s && s->finished_t) lat[cat].push_back(static_cast<double>(*s->finished_t - c.t) / 1000.0);
  }
  for (auto& [k, v] : lat) t.latency[k] = percentiles(v);
}

json to_json(const TranscribeMetrics& t) {
  json problems = json::array();
  for (const auto& p : t.problems)
    problems.push_back({{"job", p.job}, {"req", p.req}, {"kind", p.kind}, {"detail", p.detail}});
  json lat = json::object();
  for (const auto& [k, p] : t.latency)
    lat[k] = {{"n", p.n}, {"p50_ms", p.p50_ms}, {"p95_ms", p.p95_ms}, {"p99_ms", p.p99_ms}, {"max_ms", p.max_ms}};
  return {{"calls", t.calls},         {"accepted", t.accepted},
          {"existing", t.existing},   {"rejected", t.rejected},
          {"rejected_by", t.rejected_by}, {"completed", t.completed},
          {"failed", t.failed},       {"failed_by", t.failed_by},
          {"cancelled", t.cancelled}, {"gpu", t.gpu},
          {"cpu", t.cpu},             {"migrated", t.migrated},
          {"retried", t.retried},     {"windows", t.windows},
          {"windows_on_cpu", t.windows_on_cpu}, {"segments", t.segments},
          {"unanswered", t.unanswered}, {"answered_twice", t.answered_twice},
          {"problems", problems},     {"latency", lat}};
}

std::optional<RuleResult> transcribe_rule(const Metrics& m, const std::vector<PhaseResult>& phases) {
  const TranscribeMetrics& t = m.transcribe;
  std::uint64_t calls = t.calls;
  for (const auto& p : phases) calls = std::max(calls, p.metrics.transcribe.calls);
  if (calls == 0) return std::nullopt;
  // The whole log is the truth (a job's events stay in its phase: the phase drains its jobs before it ends).
  std::ostringstream o;
  o << t.calls << " Transcribe calls: " << t.accepted << " jobs (" << t.completed << " completed: " << t.gpu << " gpu, "
    << t.cpu << " cpu; " << t.migrated << " migrated, " << t.retried << " retried; " << t.failed << " failed";
  for (const auto& [name, n] : t.failed_by) o << " " << name << "=" << n;
  o << ", " << t.cancelled << " cancelled), " << t.rejected << " refused";
  for (const auto& [name, n] : t.rejected_by) o << " " << name << "=" << n;
  o << "; " << t.windows << " windows (" << t.windows_on_cpu << " on the CPU), " << t.segments << " segments";
  const bool pass = t.unanswered.empty() && t.answered_twice.empty() && t.problems.empty();
  auto list = [&](const char* what, const std::vector<std::uint64_t>& reqs) {
    if (reqs.empty()) return;
    o << "; " << what << " (req";
    for (std::size_t i = 0; i < reqs.size() && i < 20; ++i) o << " " << reqs[i];
    o << ")";
  };
  list("unanswered", t.unanswered);
  list("answered twice", t.answered_twice);
  for (std::size_t i = 0; i < t.problems.size() && i < 10; ++i)
    o << "; [" << t.problems[i].kind << "] " << t.problems[i].detail;
  if (t.problems.size() > 10) o << "; ... " << t.problems.size() - 10 << " more";
  return RuleResult{"transcribe_outcomes", pass, o.str()};
}

}  // namespace tandem::validate
