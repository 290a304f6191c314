#include "validate/report.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

namespace tandem::validate {

namespace {

using nlohmann::json;

std::string fmt(double v, int prec = 1) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(prec);
  o << v;
  return o.str();
}

std::string mib(std::uint64_t b) { return fmt(static_cast<double>(b) / 1048576.0, 1) + " MiB"; }

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

std::string md_cell(const std::string& s) {
  std::string o;
  for (char c : s) o += (c == '|') ? std::string("\\|") : (c == '\n' ? std::string(" ") : std::string(1, c));
  return o;
}

std::string metrics_markdown(const Metrics& m) {
  std::ostringstream o;
  o << "| metric | value |\n| --- | --- |\n";
  o << "| duration | " << fmt(m.duration_s) << " s |\n";
  o << "| submitted (Submit calls) | " << m.submitted << " |\n";
  o << "| accepted (new jobs) | " << m.accepted << " |\n";
  o << "| answered with an existing job (same key) | " << m.existing << " |\n";
  o << "| completed | " << m.completed << " |\n";
  o << "| failed-resumable | " << m.resumable_failed << " |\n";
  o << "| failed (other) | " << m.failed_other << " |\n";
  o << "| cancelled | " << m.cancelled << " |\n";
  o << "| rejected | " << m.rejected;
  if (!m.rejected_by.empty()) {
    o << " (";
    bool first = true;
    for (const auto& [k, v] : m.rejected_by) o << (first ? "" : ", ") << k << " " << v, first = false;
    o << ")";
  }
  o << " |\n";
  if (!m.failed_by.empty()) {
    o << "| failed jobs by reason | ";
    bool first = true;
    for (const auto& [k, v] : m.failed_by) o << (first ? "" : ", ") << md_cell(k) << " " << v, first = false;
    o << " |\n";
  }
  o << "| **accepted but lost** | **" << m.lost.size() << "**";
  for (auto id : m.lost) o << " job " << id;
  o << " |\n";
  o << "| **duplicated side effects** | **" << m.duplicates.size() << "** |\n";
  o << "| routed at admission: GPU / CPU | " << m.gpu_routed << " / " << m.cpu_routed << " |\n";
  o << "| retried on the CPU / migrated | " << m.retried << " / " << m.migrated << " |\n";
  o << "| token gaps (missed signals, recovered by GetJob) | " << m.token_gaps << " |\n";
  o << "| faults injected | " << m.faults;
  if (!m.faults_by.empty()) {
    o << " (";
    bool first = true;
    for (const auto& [k, v] : m.faults_by) o << (first ? "" : ", ") << k << " " << v, first = false;
    o << ")";
  }
  o << " |\n";
  o << "| token equivalence GPU vs CPU (greedy) | ";
  if (m.equivalence_rate)
    o << m.equiv_equal << "/" << m.equiv_valid << " = " << fmt(*m.equivalence_rate * 100.0) << " %"
      << (m.first_divergence ? ", first divergence at token " + std::to_string(*m.first_divergence) : "");
  else
    o << "not measured";
  o << " |\n";
  for (const auto& [route, p] : m.latency)
    o << "| latency " << route << " (n=" << p.n << ") p50 / p95 / p99 | " << fmt(p.p50_ms) << " / " << fmt(p.p95_ms)
      << " / " << fmt(p.p99_ms) << " ms |\n";
  for (const auto& [route, p] : m.ttft)
    o << "| time to first token " << route << " (n=" << p.n << ") p50 / p95 / p99 | " << fmt(p.p50_ms) << " / "
      << fmt(p.p95_ms) << " / " << fmt(p.p99_ms) << " ms |\n";
  for (const auto& [q, d] : m.max_queue_depth)
    o << "| queue " << q << ": max depth / oldest age | " << d << " / " << m.max_oldest_age_ms.at(q) << " ms |\n";
  o << "| daemon peak RSS / host budget | " << mib(m.peak_rss) << " / "
    << (m.host_budget ? mib(m.host_budget) : std::string("unknown")) << " (" << m.rss_samples << " samples) |\n";
  if (m.rss_slope_mib_per_h)
    o << "| RSS trend | " << fmt(*m.rss_slope_mib_per_h, 2) << " MiB/h (first tenth " << fmt(m.rss_first_mib.value_or(0))
      << " MiB, last tenth " << fmt(m.rss_last_mib.value_or(0)) << " MiB)"
      << (m.duration_s < 600 ? "; a run under 10 minutes is too short for a trend (see the soak)" : "") << " |\n";
  for (const auto& r : m.recoveries) {
    o << "| recovery after " << r.fault << " at " << fmt(r.at_s) << " s | ";
    if (r.fault == "kill_daemon")
      o << "restarted tandemd answering after "
        << (r.to_daemon_ready_ms ? fmt(*r.to_daemon_ready_ms) + " ms" : std::string("(not restarted)"))
        << "; first completion " << (r.to_cpu_completion_ms ? fmt(*r.to_cpu_completion_ms) + " ms" : std::string("none"));
    else
      o << "first CPU completion " << (r.to_cpu_completion_ms ? fmt(*r.to_cpu_completion_ms) + " ms" : std::string("none"));
    o << "; breaker " << (r.breaker_opened ? "opened" : "did not open");
    if (r.to_breaker_closed_ms) o << ", closed again after " << fmt(*r.to_breaker_closed_ms) << " ms";
    o << " |\n";
  }
  o << "| breaker opened / closed | " << m.breaker_opened << " / " << m.breaker_closed << " |\n";
  o << "| degraded mode announced before the first degraded result | " << m.degraded_announced_first << " of "
    << m.degraded_results << " (" << m.degraded_job_notice_only
    << " of them only by the job's own routed/migrated update while State stayed normal; "
    << m.degraded_announcements << " DegradedModeChanged(degraded=true) on the monitor connection) |\n";
  if (m.embed_calls > 0)
    o << "| Embed calls: with vectors (GPU / CPU) / typed errors / unanswered | " << m.embed_calls << ": " << m.embed_ok
      << " (" << m.embed_gpu << " / " << m.embed_cpu << ") / " << m.embed_errors << " / " << m.embed_unanswered.size()
      << " |\n";
  if (m.gpu_evictions + m.gpu_restores > 0) {
    auto list = [&](const std::vector<double>& v) {
      if (v.empty()) return std::string("-");
      std::string out;
      for (double x : v) out += (out.empty() ? "" : ", ") + fmt(x) + " ms";
      return out;
    };
    o << "| GPU replicas given back (for foreign pressure) / loaded again / failed loads | " << m.gpu_evictions << " ("
      << m.gpu_pressure_evictions << ") / " << m.gpu_restores << " / " << m.gpu_restore_failures << " |\n";
    o << "| time to free (foreign load up → our bytes down) | " << list(m.time_to_free_ms) << " |\n";
    o << "| time to restore (foreign load down → every replica back) | " << list(m.time_to_restore_ms) << " |\n";
    if (m.ours_before_bytes > 0)
      o << "| our bytes on the device: before / lowest | " << fmt(static_cast<double>(m.ours_before_bytes) / (1 << 20))
        << " MiB / " << fmt(static_cast<double>(m.ours_low_bytes) / (1 << 20)) << " MiB |\n";
  }
  for (const auto& [route, a] : m.eta) {
    char b[160];
    std::snprintf(b, sizeof b, "%.0f%% / %.0f%% (median signed %+.0f%%, median |error| %s ms)", 100 * a.median_rel,
                  100 * a.p90_rel, 100 * a.median_signed_rel, fmt(a.median_abs_ms).c_str());
    o << "| ETA error at placement, route " << route << " (n=" << a.n << ", " << a.stopped_sooner
      << " stopped before their budget, not counted) median / p90 | " << (a.n ? b : "-") << " |\n";
  }
  if (const TranscribeMetrics& t = m.transcribe; t.calls > 0) {
    o << "| Transcribe calls: jobs / refused | " << t.calls << ": " << t.accepted << " / " << t.rejected;
    for (const auto& [k, v] : t.rejected_by) o << " " << md_cell(k) << "=" << v;
    o << " |\n";
    o << "| transcription jobs: completed (GPU / CPU) / failed / cancelled | " << t.completed << " (" << t.gpu << " / "
      << t.cpu << ") / " << t.failed;
    for (const auto& [k, v] : t.failed_by) o << " " << md_cell(k) << "=" << v;
    o << " / " << t.cancelled << " |\n";
    o << "| transcription jobs migrated at a window boundary / retried on the CPU | " << t.migrated << " / " << t.retried
      << " |\n";
    o << "| transcription windows (on the CPU) / segments | " << t.windows << " (" << t.windows_on_cpu << ") / "
      << t.segments << " |\n";
    for (const auto& [route, p] : t.latency)
      o << "| transcription latency " << route << " (n=" << p.n << ") p50 / p95 / max | " << fmt(p.p50_ms) << " / "
        << fmt(p.p95_ms) << " / " << fmt(p.max_ms) << " ms |\n";
    o << "| **transcripts with repeated, lost or inconsistent segments / jobs not terminal** | **" << t.problems.size()
      << "** |\n";
  }
  if (!m.skipped_what.empty()) {
    o << "| skipped | ";
    for (std::size_t i = 0; i < m.skipped_what.size(); ++i) o << (i ? "; " : "") << md_cell(m.skipped_what[i]);
    o << " |\n";
  }
  if (!m.transcribe.problems.empty()) {
    o << "\nTranscription problems:\n\n";
    for (const auto& p : m.transcribe.problems) o << "- `" << p.kind << "`: " << p.detail << "\n";
  }
  if (!m.duplicates.empty()) {
    o << "\nDuplicates:\n\n";
    for (const auto& d : m.duplicates) o << "- `" << d.kind << "`: " << d.detail << "\n";
  }
  if (!m.degraded_violations.empty()) {
    o << "\nDegraded results before the announcement:\n\n";
    for (const auto& v : m.degraded_violations) o << "- " << v.detail << "\n";
  }
  if (!m.lost.empty()) {
    o << "\nLost jobs:\n\n";
    for (auto id : m.lost) o << "- job " << id << ": " << m.lost_why.at(id) << "\n";
  }
  if (!m.pairs.empty()) {
    o << "\nEquivalence pairs:\n\n| group | GPU job | CPU job | result |\n| --- | --- | --- | --- |\n";
    for (const auto& p : m.pairs) {
      o << "| " << md_cell(p.group) << " | " << p.gpu_job << " | " << p.cpu_job << " | ";
      if (!p.valid) o << "not comparable: " << md_cell(p.note);
      else if (p.equal) o << "equal (" << p.gpu_tokens << " tokens)";
      else o << "differ at token " << p.first_divergence.value_or(0) << " (" << p.gpu_tokens << " / " << p.cpu_tokens << ")";
      o << " |\n";
    }
  }
  return o.str();
}

// ---------------------------------------------------------------------------------------------------------------
// SVG

struct Panel {
  double x = 70, y = 40, w = 760, h = 220;
  double xmin = 0, xmax = 1, ymin = 0, ymax = 1;
  double px(double v) const { return x + (xmax > xmin ? (v - xmin) / (xmax - xmin) : 0) * w; }
  double py(double v) const { return y + h - (ymax > ymin ? (v - ymin) / (ymax - ymin) : 0) * h; }
};

double nice_step(double range) {
  if (range <= 0) return 1;
  const double raw = range / 5;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (raw <= m * p) return m * p;
  return 10 * p;
}

void axes(std::ostringstream& o, const Panel& p, const std::string& ylabel, const std::string& xlabel) {
  o << "<rect x='" << p.x << "' y='" << p.y << "' width='" << p.w << "' height='" << p.h
    << "' fill='none' stroke='#888'/>\n";
  const double xs = nice_step(p.xmax - p.xmin);
  for (double v = std::ceil(p.xmin / xs) * xs; v <= p.xmax + 1e-9; v += xs)
    o << "<line x1='" << p.px(v) << "' y1='" << p.y + p.h << "' x2='" << p.px(v) << "' y2='" << p.y + p.h + 4
      << "' stroke='#888'/><text x='" << p.px(v) << "' y='" << p.y + p.h + 16 << "' font-size='10' text-anchor='middle'>"
      << fmt(v, xs < 1 ? 1 : 0) << "</text>\n";
  const double ys = nice_step(p.ymax - p.ymin);
  for (double v = std::ceil(p.ymin / ys) * ys; v <= p.ymax + 1e-9; v += ys)
    o << "<line x1='" << p.x << "' y1='" << p.py(v) << "' x2='" << p.x + p.w << "' y2='" << p.py(v)
      << "' stroke='#eee'/><text x='" << p.x - 4 << "' y='" << p.py(v) + 3 << "' font-size='10' text-anchor='end'>"
      << fmt(v, ys < 1 ? 1 : 0) << "</text>\n";
  o << "<text x='" << p.x - 50 << "' y='" << p.y + p.h / 2 << "' font-size='11' transform='rotate(-90 " << p.x - 50
    << " " << p.y + p.h / 2 << ")' text-anchor='middle'>" << esc(ylabel) << "</text>\n";
  o << "<text x='" << p.x + p.w / 2 << "' y='" << p.y + p.h + 30 << "' font-size='11' text-anchor='middle'>"
    << esc(xlabel) << "</text>\n";
}

void phase_lines(std::ostringstream& o, const Panel& p, const std::vector<PhaseResult>& phases, bool labels) {
  int n = 0;
  for (const auto& ph : phases) {
    const int row = n++ % 3;  // staggered so neighbouring short phases stay readable
    if (ph.start_s < p.xmin || ph.start_s > p.xmax) continue;
    o << "<line x1='" << p.px(ph.start_s) << "' y1='" << p.y << "' x2='" << p.px(ph.start_s) << "' y2='" << p.y + p.h
      << "' stroke='#bbb' stroke-dasharray='3,3'/>\n";
    if (labels)
      o << "<text x='" << p.px(ph.start_s) + 2 << "' y='" << p.y + 10 + 9 * row << "' font-size='8' fill='#777'>" << esc(ph.name)
        << "</text>\n";
  }
}

void polyline(std::ostringstream& o, const Panel& p, const std::vector<std::pair<double, double>>& pts,
              const std::string& color, bool step = true) {
  if (pts.empty()) return;
  o << "<polyline fill='none' stroke='" << color << "' stroke-width='1.5' points='";
  double lasty = pts.front().second;
  for (std::size_t i = 0; i < pts.size(); ++i) {
    if (step && i > 0) o << p.px(pts[i].first) << "," << p.py(lasty) << " ";
    o << p.px(pts[i].first) << "," << p.py(pts[i].second) << " ";
    lasty = pts[i].second;
  }
  o << "'/>\n";
}

void legend(std::ostringstream& o, double x, double y, const std::vector<std::pair<std::string, std::string>>& items) {
  for (const auto& [label, color] : items) {
    o << "<rect x='" << x << "' y='" << y - 8 << "' width='10' height='10' fill='" << color << "'/><text x='" << x + 14
      << "' y='" << y + 1 << "' font-size='10'>" << esc(label) << "</text>\n";
    x += 24 + 6.5 * static_cast<double>(label.size());
  }
}

std::string route_color(const std::string& r) {
  if (r == "gpu") return "#1f77b4";
  if (r == "cpu") return "#d62728";
  if (r == "hybrid") return "#9467bd";
  return "#ff7f0e";  // moved between routes
}

struct Span {
  std::int64_t t0 = 0;
  double end_s = 1;
};
Span span_of(const std::vector<Event>& ev) {
  Span s;
  if (ev.empty()) return s;
  std::int64_t lo = ev.front().t_us, hi = ev.front().t_us;
  for (const auto& e : ev) lo = std::min(lo, e.t_us), hi = std::max(hi, e.t_us);
  s.t0 = lo;
  s.end_s = std::max(1.0, static_cast<double>(hi - lo) / 1e6);
  return s;
}

std::uint64_t ju(const json& d, const char* k) {
  auto it = d.find(k);
  if (it == d.end() || !it->is_number()) return 0;
  return it->is_number_unsigned() ? it->get<std::uint64_t>()
                                  : static_cast<std::uint64_t>(std::max<double>(0, it->get<double>()));
}
std::string js(const json& d, const char* k) {
  auto it = d.find(k);
  return (it != d.end() && it->is_string()) ? it->get<std::string>() : "";
}

std::string svg_head(int w, int h, const std::string& title) {
  std::ostringstream o;
  o << "<?xml version='1.0' encoding='UTF-8'?>\n<svg xmlns='http://www.w3.org/2000/svg' width='" << w << "' height='"
    << h << "' viewBox='0 0 " << w << " " << h << "' font-family='sans-serif'>\n<title>" << esc(title)
    << "</title>\n<rect width='100%' height='100%' fill='white'/>\n<text x='" << w / 2
    << "' y='20' font-size='14' text-anchor='middle'>" << esc(title) << "</text>\n";
  return o.str();
}

}  // namespace

json phase_json(const PhaseResult& p) {
  return {{"index", p.index}, {"name", p.name},       {"completed", p.completed}, {"start_s", p.start_s},
          {"end_s", p.end_s}, {"expect", p.expect},   {"unmet", p.unmet},         {"metrics", to_json(p.metrics)}};
}

std::string phase_markdown(const PhaseResult& p) {
  std::ostringstream o;
  o << "# Phase " << p.index + 1 << ": " << p.name << "\n\n";
  o << "Ran from " << fmt(p.start_s) << " s to " << fmt(p.end_s) << " s of the campaign"
    << (p.completed ? "." : " (did not finish).") << "\n\n";
  if (!p.expect.empty()) {
    o << "Expectations: `" << p.expect.dump() << "` — ";
    if (p.unmet.empty()) o << "all met.\n\n";
    else {
      o << "**not met**:\n\n";
      for (const auto& u : p.unmet) o << "- " << u << "\n";
      o << "\n";
    }
  }
  o << metrics_markdown(p.metrics);
  return o.str();
}

json report_json(const ReportInput& in) {
  json phases = json::array();
  for (const auto& p : in.phases) phases.push_back(phase_json(p));
  return {{"scenario", in.scenario_name}, {"scenario_file", in.scenario_file}, {"mode", in.mode},
          {"verdict", to_json(in.verdict)}, {"overall", to_json(in.overall)}, {"phases", phases},
          {"charts", {"charts/latency_memory.svg", "charts/queues.svg", "charts/host_ram.svg"}}};
}

std::string report_markdown(const ReportInput& in) {
  std::ostringstream o;
  o << "# tandem-validate report: " << in.scenario_name << "\n\n";
  o << "Scenario `" << in.scenario_file << "`, mode " << in.mode << ", " << in.phases.size() << " phases, "
    << fmt(in.overall.duration_s) << " s.\n\n";
  o << "## Verdict: " << (in.verdict.pass ? "PASS" : "FAIL") << "\n\n| rule | result | detail |\n| --- | --- | --- |\n";
  for (const auto& r : in.verdict.rules)
    o << "| " << r.rule << " | " << (r.pass ? "pass" : "**FAIL**") << " | " << md_cell(r.detail) << " |\n";
  o << "\n## Overall\n\n" << metrics_markdown(in.overall);
  o << "\n## Phases\n\n| # | phase | accepted | completed | failed-resumable | cancelled | rejected | lost | duplicates | "
       "CPU-routed | migrated | retried | peak RSS | expectations |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const auto& p : in.phases) {
    const Metrics& m = p.metrics;
    o << "| " << p.index + 1 << " | " << p.name << " | " << m.accepted << " | " << m.completed << " | "
      << m.resumable_failed << " | " << m.cancelled << " | " << m.rejected << " | " << m.lost.size() << " | "
      << m.duplicates.size() << " | " << m.cpu_routed << " | " << m.migrated << " | " << m.retried << " | "
      << (m.rss_samples ? mib(m.peak_rss) : std::string("-")) << " | "
      << (!p.completed ? "did not finish" : p.unmet.empty() ? "met" : "**" + md_cell(p.unmet.front()) + "**") << " |\n";
  }
  o << "\nEach phase's details: `phase-NN-<name>/summary.md` (and `result.json`, `events.jsonl`).\n";
  o << "\n## Charts\n\n"
       "- Latency of each completed job (dots, by route, at its finish time) and the device memory still "
       "available (line), with the route mix of admissions below: ![latency and memory](charts/latency_memory.svg)\n"
       "- Queue depth and oldest waiting age per queue: ![queues](charts/queues.svg)\n"
       "- tandemd's resident memory against the host budget: ![host RAM](charts/host_ram.svg)\n";
  return o.str();
}

std::string chart_latency_memory(const std::vector<Event>& ev, const std::vector<PhaseResult>& phases) {
  const Span sp = span_of(ev);
  auto rel = [&](std::int64_t t) { return static_cast<double>(t - sp.t0) / 1e6; };
  // Completed jobs: finish time, latency, route category (from job_final routes).
  std::map<std::uint64_t, std::int64_t> submit_t, finish_t;
  std::map<std::uint64_t, std::int64_t> req_t;
  std::map<std::uint64_t, std::string> route;
  std::vector<std::pair<double, double>> free_mib;
  std::vector<std::tuple<double, std::string>> admissions;
  double mem_max = 1;
  for (const auto& e : ev) {
    if (e.type == "submit") req_t[ju(e.data, "req")] = e.t_us;
    else if (e.type == "submit_ok" && !(e.data.contains("existing") && e.data["existing"].get<bool>())) {
      auto it = req_t.find(ju(e.data, "req"));
      if (it != req_t.end()) submit_t[e.job] = it->second;
      admissions.emplace_back(rel(e.t_us), js(e.data, "route"));
    } else if (e.type == "update" && js(e.data, "kind") == "finished" && js(e.data, "state") == "completed") {
      if (!finish_t.count(e.job)) finish_t[e.job] = e.t_us;
    } else if (e.type == "job_final" && e.data.contains("routes") && e.data["routes"].is_array()) {
      std::string cat, last;
      for (const auto& r : e.data["routes"])
        if (r.is_string() && r.get<std::string>() != last) cat += (cat.empty() ? "" : ">") + (last = r.get<std::string>());
      route[e.job] = cat;
    } else if (e.type == "sample" && e.data.contains("mem_free")) {
      const double v = static_cast<double>(ju(e.data, "mem_free")) / 1048576.0;
      free_mib.emplace_back(rel(e.t_us), v);
      mem_max = std::max(mem_max, static_cast<double>(ju(e.data, "mem_total")) / 1048576.0);
    }
  }
  std::vector<std::tuple<double, double, std::string>> dots;
  double lat_max = 1;
  for (const auto& [id, t] : finish_t) {
    auto s = submit_t.find(id);
    if (s == submit_t.end()) continue;
    const double lat = static_cast<double>(t - s->second) / 1000.0;
    lat_max = std::max(lat_max, lat);
    dots.emplace_back(rel(t), lat, route.count(id) ? route[id] : "?");
  }
  std::ostringstream o;
  o << svg_head(900, 600, "Latency and route mix against available device memory");
  Panel a;
  a.y = 50;
  a.h = 260;
  a.xmax = sp.end_s;
  a.ymax = lat_max * 1.05;
  axes(o, a, "job latency, submit to finished (ms)", "time since start (s)");
  phase_lines(o, a, phases, true);
  // Memory on the same panel, scaled to the right axis.
  Panel mem = a;
  mem.ymax = mem_max;
  polyline(o, mem, free_mib, "#2ca02c");
  for (double v = 0; v <= mem_max + 1e-9; v += nice_step(mem_max))
    o << "<text x='" << a.x + a.w + 4 << "' y='" << mem.py(v) + 3 << "' font-size='10' fill='#2ca02c'>" << fmt(v, 0)
      << "</text>\n";
  o << "<text x='" << a.x + a.w + 50 << "' y='" << a.y + a.h / 2 << "' font-size='11' fill='#2ca02c' transform='rotate(90 "
    << a.x + a.w + 50 << " " << a.y + a.h / 2 << ")' text-anchor='middle'>available device memory (MiB)</text>\n";
  for (const auto& [x, y, r] : dots)
    o << "<circle cx='" << a.px(x) << "' cy='" << a.py(y) << "' r='3' fill='" << route_color(r) << "' fill-opacity='0.8'/>\n";
  legend(o, a.x, a.y - 8, {{"gpu", route_color("gpu")}, {"cpu", route_color("cpu")}, {"moved gpu>cpu", route_color("gpu>cpu")},
                           {"available memory", "#2ca02c"}});
  // Route mix of admissions per time bucket.
  Panel b;
  b.y = 370;
  b.h = 180;
  b.xmax = sp.end_s;
  const int buckets = 40;
  std::vector<int> g(buckets, 0), c(buckets, 0);
  for (const auto& [t, r] : admissions) {
    int i = std::clamp(static_cast<int>(t / sp.end_s * buckets), 0, buckets - 1);
    (r == "cpu" ? c : g)[i]++;
  }
  int most = 1;
  for (int i = 0; i < buckets; ++i) most = std::max(most, g[i] + c[i]);
  b.ymax = most;
  axes(o, b, "admissions per bucket", "time since start (s)");
  phase_lines(o, b, phases, false);
  const double bw = b.w / buckets;
  for (int i = 0; i < buckets; ++i) {
    const double x = b.x + i * bw + 1;
    if (g[i]) o << "<rect x='" << x << "' y='" << b.py(g[i]) << "' width='" << bw - 2 << "' height='" << b.y + b.h - b.py(g[i]) << "' fill='" << route_color("gpu") << "'/>\n";
    if (c[i]) o << "<rect x='" << x << "' y='" << b.py(g[i] + c[i]) << "' width='" << bw - 2 << "' height='" << b.py(g[i]) - b.py(g[i] + c[i]) << "' fill='" << route_color("cpu") << "'/>\n";
  }
  legend(o, b.x, b.y - 8, {{"admitted to the GPU", route_color("gpu")}, {"routed to the CPU", route_color("cpu")}});
  o << "</svg>\n";
  return o.str();
}

std::string chart_queues(const std::vector<Event>& ev, const std::vector<PhaseResult>& phases) {
  const Span sp = span_of(ev);
  std::map<std::string, std::vector<std::pair<double, double>>> depth, age;
  double dmax = 1, amax = 1;
  for (const auto& e : ev) {
    if (e.type != "sample" || !e.data.contains("queues") || !e.data["queues"].is_array()) continue;
    const double t = static_cast<double>(e.t_us - sp.t0) / 1e6;
    for (const auto& q : e.data["queues"]) {
      const std::string n = js(q, "name");
      depth[n].emplace_back(t, static_cast<double>(ju(q, "depth")));
      age[n].emplace_back(t, static_cast<double>(ju(q, "oldest_age_ms")));
      dmax = std::max(dmax, static_cast<double>(ju(q, "depth")));
      amax = std::max(amax, static_cast<double>(ju(q, "oldest_age_ms")));
    }
  }
  std::ostringstream o;
  o << svg_head(900, 560, "Queue depth and oldest waiting age");
  Panel a;
  a.y = 50;
  a.h = 200;
  a.xmax = sp.end_s;
  a.ymax = dmax * 1.1;
  axes(o, a, "queued jobs", "time since start (s)");
  phase_lines(o, a, phases, true);
  Panel b = a;
  b.y = 320;
  b.ymax = amax * 1.1;
  axes(o, b, "oldest waiting job (ms)", "time since start (s)");
  phase_lines(o, b, phases, false);
  std::vector<std::pair<std::string, std::string>> items;
  for (const auto& [n, pts] : depth) {
    const std::string color = route_color(n);
    polyline(o, a, pts, color);
    polyline(o, b, age[n], color);
    items.emplace_back(n + " queue", color);
  }
  legend(o, a.x, a.y - 8, items);
  o << "</svg>\n";
  return o.str();
}

std::string chart_host_ram(const std::vector<Event>& ev, const std::vector<PhaseResult>& phases) {
  const Span sp = span_of(ev);
  std::vector<std::pair<double, double>> rss, budget;
  double ymax = 1;
  for (const auto& e : ev) {
    if (e.type != "sample") continue;
    const double t = static_cast<double>(e.t_us - sp.t0) / 1e6;
    std::uint64_t r = ju(e.data, "rss");
    if (r == 0) r = ju(e.data, "daemon_rss");
    if (r) rss.emplace_back(t, static_cast<double>(r) / 1048576.0), ymax = std::max(ymax, static_cast<double>(r) / 1048576.0);
    if (std::uint64_t b = ju(e.data, "host_budget"))
      budget.emplace_back(t, static_cast<double>(b) / 1048576.0), ymax = std::max(ymax, static_cast<double>(b) / 1048576.0);
  }
  std::ostringstream o;
  o << svg_head(900, 340, "tandemd resident memory (VmRSS) against the host budget");
  Panel a;
  a.y = 50;
  a.h = 230;
  a.xmax = sp.end_s;
  a.ymax = ymax * 1.1;
  axes(o, a, "MiB", "time since start (s)");
  phase_lines(o, a, phases, true);
  polyline(o, a, budget, "#d62728");
  polyline(o, a, rss, "#1f77b4", false);
  legend(o, a.x, a.y - 8, {{"daemon RSS", "#1f77b4"}, {"host budget", "#d62728"}});
  o << "</svg>\n";
  return o.str();
}

Status write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc | std::ios::binary);
    if (!f) return fail(Errc::io_error, tmp + ": cannot write: " + std::strerror(errno));
    f << text;
    f.flush();
    if (!f) return fail(Errc::io_error, tmp + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return fail(Errc::io_error, path + ": rename failed: " + std::strerror(errno));
  return {};
}

Status write_phase(const std::string& dir, const PhaseResult& p) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    return fail(Errc::io_error, dir + ": mkdir: " + std::strerror(errno));
  if (auto s = write_text(dir + "/result.json", phase_json(p).dump(2) + "\n"); !s) return s;
  return write_text(dir + "/summary.md", phase_markdown(p));
}

Status write_report(const std::string& out, const ReportInput& in) {
  const std::string charts = out + "/charts";
  if (::mkdir(charts.c_str(), 0755) != 0 && errno != EEXIST)
    return fail(Errc::io_error, charts + ": mkdir: " + std::strerror(errno));
  if (auto s = write_text(charts + "/latency_memory.svg", chart_latency_memory(in.events, in.phases)); !s) return s;
  if (auto s = write_text(charts + "/queues.svg", chart_queues(in.events, in.phases)); !s) return s;
  if (auto s = write_text(charts + "/host_ram.svg", chart_host_ram(in.events, in.phases)); !s) return s;
  if (auto s = write_text(out + "/report.json", report_json(in).dump(2) + "\n"); !s) return s;
  return write_text(out + "/report.md", report_markdown(in));
}

}  // namespace tandem::validate
