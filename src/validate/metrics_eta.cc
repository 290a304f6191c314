// ETA accuracy (docs/validate.md "ETA accuracy"): for every job Submit accepted with an `eta_ms` (the placement's
// estimate of the time until the job is done) that then ran its whole token budget, the estimate against the time
// from the accepted reply to the first `finished` update any client saw. Jobs that stopped sooner (EOS, a stop
// string, the context) are counted apart: the estimate assumes the whole budget, so they would only show that.
// Transcriptions the same way, under "transcribe <route>": those placed with a measured ETA (eta_known) that ran to
// the end of their audio (every window they have; a silent window is skipped, and counts in the figure). Pure.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "validate/event_fields.h"
#include "validate/metrics.h"

namespace tandem::validate {

namespace {

using nlohmann::json;

struct Placed {
  std::int64_t accepted_t = 0;
  std::uint64_t eta_ms = 0;
  std::optional<std::int64_t> finished_t;
  std::string state, finish_reason, routes;
  bool transcribe = false;
};

// Nearest rank, q in (0, 1].
double rank(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  std::size_t r = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  r = std::clamp<std::size_t>(r, 1, v.size());
  return v[r - 1];
}

}  // namespace

void compute_eta_metrics(const std::vector<Event>& events, Metrics& m) {
  std::map<std::uint64_t, Placed> jobs;
  for (const auto& e : events) {
    const json& d = e.data;
    if (e.type == "submit_ok") {
      const auto eta = field_u64(d, "eta_ms");
      if (!eta || (d.contains("existing") && d["existing"].is_boolean() && d["existing"].get<bool>())) continue;
      if (jobs.count(e.job)) continue;  // the first acceptance is the placement
      Placed p;
      p.accepted_t = e.t_us;
      p.eta_ms = *eta;
      jobs[e.job] = p;
    } else if (e.type == "transcribe_accepted") {
      const auto eta = field_u64(d, "eta_ms");
      const bool known = d.contains("eta_known") && d["eta_known"].is_boolean() && d["eta_known"].get<bool>();
      if (!eta || !known || (d.contains("existing") && d["existing"].is_boolean() && d["existing"].get<bool>()))
        continue;
      if (jobs.count(e.job)) continue;
      Placed p;
      p.accepted_t = e.t_us;
      p.eta_ms = *eta;
      p.transcribe = true;
      jobs[e.job] = p;
    } else if (e.type == "update" && field_str(d, "kind") == "finished") {
      if (auto it = jobs.find(e.job); it != jobs.end() && !it->second.finished_t) it->second.finished_t = e.t_us;
    } else if (e.type == "transcribe_final" || e.type == "job_final") {
      // A transcription's outcome is its transcribe_final; a Submit job's, the runner's job_final.
      auto it = jobs.find(e.job);
      if (it == jobs.end() || it->second.transcribe != (e.type == "transcribe_final")) continue;
      it->second.state = field_str(d, "state");
      it->second.finish_reason = field_str(d, "finish_reason");
      std::vector<std::string> routes;
      if (auto r = d.find("routes"); r != d.end() && r->is_array())
        for (const auto& x : *r)
          if (x.is_string()) routes.push_back(x.get<std::string>());
      it->second.routes = (it->second.transcribe ? "transcribe " : "") + route_category(routes);
    }
  }
  std::map<std::string, std::vector<double>> rel, signed_rel, abs_ms;
  std::map<std::string, std::uint64_t> stopped_sooner;
  for (const auto& [id, p] : jobs) {
    if (p.state != "completed" || !p.finished_t) continue;
    if (p.finish_reason != (p.transcribe ? "end_of_audio" : "max_tokens")) {
      ++stopped_sooner[p.routes];
      continue;
    }
    const double actual = static_cast<double>(*p.finished_t - p.accepted_t) / 1000.0;
    if (actual <= 0) continue;
    const double err = static_cast<double>(p.eta_ms) - actual;  // > 0: the estimate was too long
    rel[p.routes].push_back(std::abs(err) / actual);
    signed_rel[p.routes].push_back(err / actual);
    abs_ms[p.routes].push_back(std::abs(err));
  }
  m.eta.clear();
  for (auto& [route, v] : rel) {
    EtaAccuracy a;
    a.n = v.size();
    a.median_rel = rank(v, 0.5);
    a.p90_rel = rank(v, 0.9);
    a.median_signed_rel = rank(signed_rel[route], 0.5);
    a.median_abs_ms = rank(abs_ms[route], 0.5);
    a.stopped_sooner = stopped_sooner[route];
    m.eta[route] = a;
  }
  for (const auto& [route, n] : stopped_sooner)
    if (!m.eta.count(route)) m.eta[route].stopped_sooner = n;
}

json to_json_eta(const Metrics& m) {
  json j = json::object();
  for (const auto& [route, a] : m.eta)
    j[route] = {{"n", a.n},
                {"median_rel_error", a.median_rel},
                {"p90_rel_error", a.p90_rel},
                {"median_signed_rel_error", a.median_signed_rel},
                {"median_abs_error_ms", a.median_abs_ms},
                {"stopped_sooner", a.stopped_sooner}};
  return j;
}

}  // namespace tandem::validate
