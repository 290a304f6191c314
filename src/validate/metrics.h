// Measurements of a validation run, computed from its events only (docs/validate.md, "Metrics" gives each exact
// definition), and the verdict rules. Pure functions: the unit tests feed recorded logs (tests/validate/data).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "validate/events.h"

namespace tandem::validate {

struct Percentiles {
  std::size_t n = 0;
  double p50_ms = 0, p95_ms = 0, p99_ms = 0, max_ms = 0;
};
Percentiles percentiles(std::vector<double> ms);  // nearest-rank
// "gpu", "cpu", "gpu>cpu": the distinct consecutive routes a job ran on ("none" for none).
std::string route_category(const std::vector<std::string>& routes);

// ETA accuracy of one final route (metrics_eta.cc): |eta − actual| / actual over the jobs that ran their whole token
// budget; actual = the accepted reply → the first `finished` update.
struct EtaAccuracy {
  std::size_t n = 0;
  double median_rel = 0, p90_rel = 0;
  double median_signed_rel = 0;  // (eta − actual) / actual: > 0 the estimates were too long
  double median_abs_ms = 0;
  std::uint64_t stopped_sooner = 0;  // completed jobs left out: EOS / stop string / context before the budget
};

struct Duplicate {
  std::string kind;  // executed_twice | delivered_twice | key_second_job | finished_twice | tokens_redelivered
  std::string key;   // idempotency key, when the duplicate is about one
  std::vector<std::uint64_t> jobs;
  std::string detail;
};

struct EquivalencePair {
  std::string group;
  std::uint64_t gpu_job = 0, cpu_job = 0;
  bool valid = false;      // both ran to completion on the intended route
  bool equal = false;
  std::optional<std::size_t> first_divergence;  // token index
  std::size_t gpu_tokens = 0, cpu_tokens = 0;
  std::string note;
};

struct Recovery {
  std::string fault;  // kind
  double at_s = 0;    // seconds since the start of the log
  std::optional<double> to_cpu_completion_ms;   // fault -> first job completed on the CPU
  std::optional<double> to_breaker_closed_ms;   // fault -> breaker closed again (after it opened)
  std::optional<double> to_daemon_ready_ms;     // kill_daemon: SIGKILL -> the restarted tandemd answers
  bool breaker_opened = false;
};

struct Violation {  // a degraded result that reached a client before degraded mode was announced to it
  std::uint64_t job = 0;
  std::int32_t client = -1;
  std::string detail;
};

// Transcription jobs (kind = "transcribe" workloads; metrics_transcribe.cc, docs/validate.md "Transcription
// workloads"): from the transcribe_call / _accepted / _rejected / _final events and the jobs' "update" events.
struct TranscriptProblem {
  std::uint64_t job = 0;
  std::uint64_t req = 0;
  std::string kind;    // not_terminal | finished_twice | state_mismatch | text_mismatch | segment_order |
                       // segment_repeated | segment_lost | segment_extra | segment_text | bad_segments |
                       // migration_windows
  std::string detail;
};
struct TranscribeMetrics {
  std::uint64_t calls = 0;     // Transcribe calls
  std::uint64_t accepted = 0;  // answered with a job (new)
  std::uint64_t existing = 0;  // answered with an existing job (idempotency key)
  std::uint64_t rejected = 0;  // refused at the call with a typed error
  std::map<std::string, std::uint64_t> rejected_by;  // error name -> count
  std::uint64_t completed = 0, failed = 0, cancelled = 0;
  std::map<std::string, std::uint64_t> failed_by;  // error_code (or reason) -> count
  // completed jobs by where their windows ran: gpu (all), cpu (some or all on the CPU: routed there, retried before
  // the first window, or migrated at a window boundary); migrated / retried: any final state, from the history
  std::uint64_t gpu = 0, cpu = 0, migrated = 0, retried = 0;
  std::uint64_t windows = 0, windows_on_cpu = 0, segments = 0;  // completed jobs, summed
  std::vector<std::uint64_t> unanswered;      // call reqs with neither a job nor an error
  std::vector<std::uint64_t> answered_twice;  // call reqs answered more than once
  std::vector<TranscriptProblem> problems;    // what the rule transcribe_outcomes fails on
  std::map<std::string, Percentiles> latency;  // call -> finished, per route category of completed jobs
};

struct Metrics {
  std::uint64_t submitted = 0;  // Submit calls
  std::uint64_t accepted = 0;   // distinct new jobs (Submit with existing=false, Resume, child clients)
  std::uint64_t existing = 0;   // Submit answered with an existing job (same idempotency key)
  std::uint64_t completed = 0, resumable_failed = 0, failed_other = 0, cancelled = 0;
  std::uint64_t rejected = 0;
  std::map<std::string, std::uint64_t> rejected_by;  // error name -> count
  std::map<std::string, std::uint64_t> failed_by;    // job reason -> count (failed jobs)
  std::vector<std::uint64_t> lost;                   // accepted, never seen terminal
  std::map<std::uint64_t, std::string> lost_why;
  std::vector<Duplicate> duplicates;
  std::uint64_t token_gaps = 0;  // a tokens update skipped steps (a lost signal; GetJob has the text)
  std::uint64_t cpu_routed = 0, gpu_routed = 0;  // placement route at admission
  std::uint64_t migrated = 0, retried = 0;
  std::uint64_t cancel_requests = 0;
  std::uint64_t faults = 0;
  std::map<std::string, std::uint64_t> faults_by;
  std::uint64_t skipped = 0;
  std::vector<std::string> skipped_what;
  // token equivalence (greedy, GPU route vs CPU route)
  std::vector<EquivalencePair> pairs;
  std::uint64_t equiv_valid = 0, equiv_equal = 0;
  std::optional<double> equivalence_rate;
  std::optional<std::size_t> first_divergence;  // smallest over unequal pairs
  // latency (submit -> finished) and time to first token, per final route: gpu | cpu | gpu>cpu
  std::map<std::string, Percentiles> latency;
  std::map<std::string, Percentiles> ttft;
  // queues
  std::map<std::string, std::uint64_t> max_queue_depth;
  std::map<std::string, std::uint64_t> max_oldest_age_ms;
  // host RAM
  std::uint64_t rss_samples = 0;
  std::uint64_t peak_rss = 0;
  std::uint64_t host_budget = 0;  // smallest non-zero budget seen
  std::optional<double> rss_slope_mib_per_h;  // least squares over the samples (soak trend)
  std::optional<double> rss_first_mib, rss_last_mib;  // mean of the first / last tenth of the samples
  // recovery
  std::vector<Recovery> recoveries;
  // degraded mode
  std::uint64_t degraded_announcements = 0;  // DegradedModeChanged(degraded=true) received (all clients)
  std::uint64_t degraded_results = 0;        // (job, client) pairs where a degraded job's result reached a client
  std::uint64_t degraded_announced_first = 0;  // the service state or the job's own update said so first
  std::uint64_t degraded_job_notice_only = 0;  // ...of which only the job's routed/migrated update (State was normal)
  std::vector<Violation> degraded_violations;
  std::uint64_t breaker_opened = 0, breaker_closed = 0;
  // Embed calls (kind = "embed" workloads): each embed_call must get exactly one embed_ok or embed_error.
  std::uint64_t embed_calls = 0, embed_ok = 0, embed_errors = 0, embed_gpu = 0, embed_cpu = 0, embed_inputs = 0;
  std::map<std::string, std::uint64_t> embed_errors_by;  // error name -> count
  std::vector<std::uint64_t> embed_unanswered;           // req ids with no answer
  std::vector<std::uint64_t> embed_answered_twice;       // req ids with more than one answer
  TranscribeMetrics transcribe;
  // GPU residency (docs/residency.md), from the samples: replicas given back and loaded again within the events,
  // and, around the memory steps that raised and lowered the foreign load, how long until our bytes on the device
  // dropped (time to free) and until they were back to what they were before the rise (time to restore).
  std::uint64_t gpu_evictions = 0, gpu_pressure_evictions = 0, gpu_restores = 0, gpu_restore_failures = 0;
  std::vector<double> time_to_free_ms, time_to_restore_ms;
  std::uint64_t ours_before_bytes = 0, ours_low_bytes = 0;  // our device bytes before the first rise; the lowest after
  // ETA accuracy per final route (gpu | cpu | gpu>cpu ...), from the placements' eta_ms (metrics_eta.cc).
  std::map<std::string, EtaAccuracy> eta;
  double duration_s = 0;
};


// events: one phase's events or a whole run's (sorted by time). Every number is derived from them.
Metrics compute_metrics(const std::vector<Event>& events);
nlohmann::json to_json(const Metrics& m);

// Verdict rules. Each rule names itself; `failures` has one line per failed rule ("FAIL lost_jobs: ...").
struct RuleResult {
  std::string rule;  // lost_jobs | duplicate_side_effects | host_ram_budget | degraded_announced | phase_expectations
                     // | embed_replies (only when the log has Embed calls)
                     // | transcribe_outcomes (only when the log has Transcribe calls)
  bool pass = true;
  std::string detail;
};
struct Verdict {
  bool pass = true;
  std::vector<RuleResult> rules;
  std::vector<std::string> failure_lines() const;
};

// Expectations come from the phase_start events' "expect" objects; phase_metrics[i] belongs to phase i.
struct PhaseResult {
  std::int32_t index = 0;
  std::string name;
  nlohmann::json expect = nlohmann::json::object();
  Metrics metrics;
  std::vector<std::string> unmet;  // expectations not met
  bool completed = false;          // the phase_end event is there
  double start_s = 0, end_s = 0;   // relative to the log's first event
};

std::vector<std::string> check_expectations(const nlohmann::json& expect, const Metrics& m);
// Splits a run's events into phases (by the phase field and the phase_start events) and computes each.
std::vector<PhaseResult> compute_phases(const std::vector<Event>& events);
Verdict judge(const Metrics& overall, const std::vector<PhaseResult>& phases);
nlohmann::json to_json(const Verdict& v);

// metrics_residency.cc: fills the GPU residency figures of `m` from the samples and memory steps (sorted by time);
// compute_metrics calls it.
void compute_residency_metrics(const std::vector<Event>& sorted_events, Metrics& m);

// metrics_eta.cc: fills m.eta from the placements' eta_ms, the finished updates and the jobs' final states (events
// sorted by time); compute_metrics calls it. to_json_eta: its JSON (per route: n, median/p90 relative error, ...).
void compute_eta_metrics(const std::vector<Event>& sorted_events, Metrics& m);
nlohmann::json to_json_eta(const Metrics& m);

// metrics_transcribe.cc: fills m.transcribe from the events (sorted by time); compute_metrics calls it.
void compute_transcribe_metrics(const std::vector<Event>& sorted_events, Metrics& m);
nlohmann::json to_json(const TranscribeMetrics& t);
// The rule transcribe_outcomes (only when the log has Transcribe calls): every call answered exactly once, every
// accepted job terminal exactly once, a job's text = the concatenation of its segments, and the segments streamed to
// the caller = GetJob's segments_json (none repeated, none lost, across a GPU fault too).
std::optional<RuleResult> transcribe_rule(const Metrics& overall, const std::vector<PhaseResult>& phases);

}  // namespace tandem::validate
