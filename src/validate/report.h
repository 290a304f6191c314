// Report writers: per-phase result.json + summary.md, the campaign's report.md + report.json, and hand-written SVG
// charts (no plotting library): latency and route mix against available device memory over time, queue depth and
// oldest age, daemon RSS against the host budget. Readable without the tool (docs/validate.md, "Reading the report").
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/result.h"
#include "validate/events.h"
#include "validate/metrics.h"

namespace tandem::validate {

struct ReportInput {
  std::string scenario_name;
  std::string scenario_file;
  std::string mode;  // spawn | attach | analyze
  std::vector<Event> events;        // the whole run
  std::vector<PhaseResult> phases;
  Metrics overall;
  Verdict verdict;
};

nlohmann::json phase_json(const PhaseResult& p);
std::string phase_markdown(const PhaseResult& p);
nlohmann::json report_json(const ReportInput& in);
std::string report_markdown(const ReportInput& in);

// SVG documents (complete, standalone).
std::string chart_latency_memory(const std::vector<Event>& events, const std::vector<PhaseResult>& phases);
std::string chart_queues(const std::vector<Event>& events, const std::vector<PhaseResult>& phases);
std::string chart_host_ram(const std::vector<Event>& events, const std::vector<PhaseResult>& phases);

Status write_text(const std::string& path, const std::string& text);
// Writes <dir>/result.json and <dir>/summary.md.
Status write_phase(const std::string& dir, const PhaseResult& p);
// Writes <out>/report.md, <out>/report.json and <out>/charts/*.svg.
Status write_report(const std::string& out, const ReportInput& in);

}  // namespace tandem::validate
