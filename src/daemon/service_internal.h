// Daemon-internal: the Service's private records (Prepared, JobRecord, WorkerEvent, Sink) and the small helpers
// its translation units share. Included only by the service*.cc files (service.cc: construction, restore, workers,
// worker events, small helpers; service_admission.cc: requests and admission; service_schedule.cc: queues, dispatch,
// run outcomes and failover; service_health.cc: readings, breaker, probes, state, deadlines, tick; service_views.cc:
// job and property views; service_control.cc: cancel, resume, holds, shutdown, reload, testing hooks, counters).
// Not part of the daemon's interface (service.h is).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/sha256.h"
#include "core/text.h"
#include "daemon/log.h"
#include "daemon/service.h"

namespace tandem::daemon {

using namespace std::chrono_literals;
using policy::BreakerEvent;
using policy::Decision;
using policy::JobPhase;
using policy::Rung;
using nlohmann::json;

// Helpers shared by the service's translation units.

inline std::uint64_t to_ms(Clock::duration d) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  return ms < 0 ? 0 : static_cast<std::uint64_t>(ms);
}

inline std::string route_name(const policy::Route& r) { return std::string(policy::device_name(r.device)); }

inline json route_json(const policy::Route& r) {
  return json{{"device", route_name(r)}, {"gpu_layers", r.gpu_layers}, {"fallback_model", r.fallback_model},
              {"model", r.model}};
}

// Wire name of a job phase (views, journal records, history rows, logs).
inline std::string phase_name(JobPhase p) { return std::string(policy::job_phase_name(p)); }
// The phase a wire name (a journal record) names; Errc::format_error for a name that is none of the seven.
inline Result<JobPhase> parse_job_phase(std::string_view name) {
  for (JobPhase p : {JobPhase::queued, JobPhase::running, JobPhase::retrying, JobPhase::migrating,
                     JobPhase::completed, JobPhase::failed, JobPhase::cancelled})
    if (policy::job_phase_name(p) == name) return p;
  return fail(Errc::format_error, "unknown job phase '" + std::string(name.substr(0, 64)) + "'");
}

// The queue a job waits (or runs) in. Wire names (placement's "queue", updates): "gpu", "cpu", "" (none).
enum class QueueId { none, gpu, cpu };
inline std::string queue_name(QueueId q) {
  switch (q) {
    case QueueId::gpu: return "gpu";
    case QueueId::cpu: return "cpu";
    case QueueId::none: break;
  }
  return "";
}

// Why a running job's cancel flag was raised; decides how its run's end is read (on_run_finished).
enum class StopCause { none, cancelled, deadline, shutdown, evict };
inline std::string_view stop_cause_name(StopCause c) {
  switch (c) {
    case StopCause::cancelled: return "cancelled";
    case StopCause::deadline: return "deadline";
    case StopCause::shutdown: return "shutdown";
    case StopCause::evict: return "evict";
    case StopCause::none: break;
  }
  return "none";
}

// Wire names of the ladder's actions.
inline std::string action_name(Rung r) { return std::string(policy::rung_name(r)); }

inline Failure rejected_error(const Decision& d) {
  const auto retry = to_ms(d.retry_after);
  if (d.permanent) return fail(Errc::invalid_argument, d.detail.empty() ? std::string(policy::reason_name(d.reason)) : d.detail);
  Errc code = Errc::rejected;
  if (d.reason == policy::Reason::cpu_queue_full || d.reason == policy::Reason::gpu_queue_full) code = Errc::queue_full;
  if (d.reason == policy::Reason::host_memory) code = Errc::host_memory;
  std::string msg = "rejected (" + std::string(policy::reason_name(d.reason)) + "): " + d.detail;
  msg += "; retry_after_ms=" + std::to_string(retry);
  return fail(code, msg);
}

// Idempotency keys are per user: two users' "key-1" never name the same job. Stored (journal, registry) scoped.
inline std::string scoped_key(std::uint32_t uid, const std::string& key) { return std::to_string(uid) + "/" + key; }
// The idempotency outcome a withdrawn job (a failed group commit) leaves on its key: the key is free for a new job.
inline constexpr const char* kNotAccepted = "journal_commit_failed";

// The SHA-256 of an input's bytes as hex: how the journal names images and audio it does not keep.
inline std::string bytes_sha256(const std::vector<std::uint8_t>& bytes) {
  return Sha256::hex(Sha256::of(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
}

inline std::string user_key(const std::string& scoped) {
  const auto slash = scoped.find('/');
  return slash == std::string::npos ? scoped : scoped.substr(slash + 1);
}

// ---------------------------------------------------------------------------------------------------------------
// Records

// A validated request, ready for admission.
// An embedding job's own state (kind embed): its inputs until it ends, the vectors, the callers waiting for them.
struct Service::EmbedWork {
  std::vector<std::vector<TokenId>> texts;                                 // tokenized, [BOS] ... [EOS]
  std::vector<std::shared_ptr<const std::vector<std::uint8_t>>> images;    // file bytes (decoded on the worker)
  std::vector<std::string> image_names;     // the caller's name of each image (messages)
  std::uint32_t n_texts = 0, n_images = 0;  // the inputs (kept when the inputs are dropped at the end)
  std::uint32_t truncated = 0;              // texts cut to the model's context
  std::uint64_t tokens = 0;                 // text-tower tokens, BOS/EOS included, after truncation
  std::uint32_t dim = 0;
  std::vector<std::vector<float>> vectors;  // when completed (kept only for jobs with an idempotency key)
  std::vector<EmbedDone> waiters;           // the Embed calls answered when the job ends
  Clock::duration queued{}, run_time{};
};

// A transcription job's own state (kind transcribe): the audio until it ends, where it stands (the checkpoint: the
// last finished window), the segments delivered so far.
struct Service::TranscribeWork {
  std::shared_ptr<const std::vector<std::uint8_t>> audio;  // file bytes (decoded on the worker, each run)
  std::shared_ptr<audio::PcmStream> stream;                 // or a live stream (its samples from the last window on)
  std::string audio_name;
  std::uint64_t audio_bytes = 0;
  std::string format;                  // from the header (probe)
  double audio_seconds = 0;            // from the header; exact once a run decoded it
  speech::TranscribeOptions options;
  speech::Checkpoint checkpoint;       // the next window to run; a GPU fault continues here on the CPU
  std::vector<speech::Segment> segments;
  std::uint32_t windows_total = 1;     // estimate (seeks follow timestamps)
  std::uint32_t windows_skipped = 0;   // silent windows (no_speech)
  std::uint32_t fallbacks = 0;         // windows decoded above the first temperature
  std::uint32_t windows_on_cpu = 0;
  Clock::duration run_time{};          // summed window time (for the real-time factor and the ETA)
  Clock::duration queued{};
};

struct Service::Prepared {
  WorkloadKind kind = WorkloadKind::generate;
  std::shared_ptr<EmbedWork> embed;  // kind embed
  std::shared_ptr<TranscribeWork> transcribe;  // kind transcribe
  bool reclaim_key = false;          // embed: the key's earlier job ended without answer to give: run again
  SubmitRequest req;
  const ModelInfo* model = nullptr;
  std::vector<TokenId> prompt;
  gen::SamplingParams sampling;
  std::uint32_t max_new_tokens = 0;
  std::vector<std::string> stop;
  std::uint32_t prefill_chunk = 0;
  std::vector<TokenId> resume;
  policy::RequestShape shape;
  std::uint64_t digest = 0;
  json request_json;
};

struct Service::JobRecord {
  JobId id = 0;
  WorkloadKind kind = WorkloadKind::generate;
  std::shared_ptr<EmbedWork> embed;  // kind embed (the generate kind's state is the fields below: prompts..text)
  std::shared_ptr<TranscribeWork> transcribe;  // kind transcribe (text: the transcript so far)
  std::optional<policy::Job> fsm;   // absent for jobs restored terminal from the journal
  JobPhase phase = JobPhase::queued;  // mirrors fsm (or the journal for restored jobs); names only at the edges
  std::string reason;
  SubmitRequest req;
  json request_json;
  std::string owner;                // bus name of the submitter ("" after a restart)
  std::string reply_to;             // where updates go when not the owner's bus name (a ring session), "" = owner
  bool muted = false;               // its reply channel closed: no updates (the owner's limit still counts it)
  std::uint32_t uid = 0;
  std::string model;                // requested (resolved)
  std::map<std::string, std::vector<TokenId>> prompts;  // tokenized per serving model
  gen::SamplingParams sampling;
  std::uint32_t max_new_tokens = 0;
  std::vector<std::string> stop;
  std::uint32_t prefill_chunk = 0;
  std::vector<TokenId> resume;      // tokens given by the client (checkpoint it resumed from)
  std::vector<TokenId> tokens;      // generated so far, resume tokens included
  std::string text;                 // text delivered by this job's runs
  std::uint32_t journaled_tokens = 0;
  policy::RequestShape shape;
  std::uint64_t digest = 0;
  std::string key;
  bool side_effects = false;
  bool stream = true;
  policy::Route route;              // current or planned
  std::vector<std::string> routes;  // every route started
  std::vector<HistoryRow> history;
  QueueId queue = QueueId::none;    // its queue (kept while it runs from it; none once it ended or left it)
  bool running = false;
  std::uint64_t attempt = 0;        // run attempt counter (stale events are ignored)
  std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);
  StopCause stop_cause = StopCause::none;  // why `cancel` was raised (none: not raised)
  Decision decision;
  bool degraded = false;
  std::int64_t accepted_unix_ms = 0, finished_unix_ms = 0;
  Clock::time_point accepted_at{};
  std::optional<Clock::time_point> deadline;
  std::string finish_reason, error_code, error_message;
  std::uint64_t retry_after_ms = 0;
  std::uint64_t gpu_reserved = 0;
  bool host_admitted = false;
  std::optional<policy::HostJobEstimate> host;
  Clock::time_point run_started{};
  // When the job was last announced to finish (its placement's eta_ms, then each "eta" update): re-announced when
  // the load moves it (Service::reannounce_etas).
  std::optional<Clock::time_point> announced_finish;
  std::uint32_t run_new_tokens = 0;
  std::uint32_t attempts_restored = 0;  // restored jobs: attempts the journal recorded
  bool host_materialized = false;
  std::optional<JobId> resumed_by;      // Resume already created this successor (never a second run)
  // Group commit: the journal sequence number its updates wait for (its accepted record, later its outcome), and
  // whether its accept is not durable yet (then it is not dispatched and GetJob does not show it).
  std::uint64_t durable_at = 0;
  bool accept_pending = false;
  std::optional<policy::Route> deferred_route;  // started in its queue while its accept was pending: dispatched then
  // Journal writes that failed (docs/journal.md, "Failed writes"). The latest transition record not written yet:
  // written again before the job's next checkpoint or outcome (the journal never holds tokens without the route that
  // produced them). The outcome record not written (or undone by a failed commit and not written again): the job's
  // updates are held and commit() writes the outcome again.
  struct UnwrittenTransition {
    std::string phase, reason, route_json;
    std::int64_t at_unix_ms = 0;
    std::uint32_t attempts = 0;
  };
  std::optional<UnwrittenTransition> unwritten_transition;
  bool outcome_unwritten = false;

  bool terminal() const { return policy::is_terminal(phase); }
  // The model that runs it: the route's (a fallback model) once routed, else the one requested.
  const std::string& serving_model_name() const { return route.model.empty() ? model : route.model; }
};

struct Service::WorkerEvent {
  enum Kind { prefilled, tokens, finished, probe_done, reload_done, step, audio_decoded, window, gpu_freed, gpu_loaded,
              model_prepared }
  kind = tokens;
  JobId job = 0;
  std::uint64_t attempt = 0;
  std::vector<TokenId> ids;
  std::string text;
  std::uint32_t prefill_tokens = 0;
  Clock::duration took{};
  RunResult result;
  Status status;
  policy::ProbeId probe = policy::kNoProbe;
  StepReport step_report;  // kind step: one step of a route's step loop (continuous batching)
  // kind audio_decoded: the audio's length and the windows estimate; kind window: one finished window.
  double audio_seconds = 0;
  std::uint32_t windows_total = 0;
  std::shared_ptr<speech::WindowResult> window_result;
  // kind gpu_freed / gpu_loaded: the model whose GPU replica was given back (the bytes it held) or loaded.
  std::string model;
  std::uint64_t bytes = 0;
  // kind model_prepared: a model's replicas loaded for the runtime model set (status: the load's), not serving yet.
  std::shared_ptr<std::unique_ptr<PreparedModel>> prepared;
};

// Collects a run's tokens on the worker thread and posts them in batches (at most one post per flush interval).
class Service::Sink final : public RunSink {
 public:
  Sink(Service* s, JobId id, std::uint64_t attempt, Clock::duration flush)
      : s_(s), id_(id), attempt_(attempt), flush_(flush) {}
  void prefilled(std::uint32_t tokens, Clock::duration took) override {
    WorkerEvent ev;
    ev.kind = WorkerEvent::prefilled;
    ev.job = id_;
    ev.attempt = attempt_;
    ev.prefill_tokens = tokens;
    ev.took = took;
    s_->post(std::move(ev));
    last_ = std::chrono::steady_clock::now();
  }
  void token(TokenId id, const std::string& text) override {
    if (id >= 0) ids_.push_back(id);
    text_ += text;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ >= flush_) flush(now);
  }
  void flush(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) {
    last_ = now;
    if (ids_.empty() && text_.empty()) return;
    WorkerEvent ev;
    ev.kind = WorkerEvent::tokens;
    ev.job = id_;
    ev.attempt = attempt_;
    ev.ids = std::move(ids_);
    ev.text = std::move(text_);
    ids_.clear();
    text_.clear();
    s_->post(std::move(ev));
  }

 private:
  Service* s_;
  JobId id_;
  std::uint64_t attempt_;
  Clock::duration flush_;
  std::chrono::steady_clock::time_point last_{};
  std::vector<TokenId> ids_;
  std::string text_;
};

// ---------------------------------------------------------------------------------------------------------------
// Workloads: what a kind of job does on top of the kind-agnostic core. The core (admission, queues, ledger, host
// guard, breaker, journal records, holds, degraded mode, group commit) calls these at four points of a job's life:
// when a route starts it, when a run succeeds, when a GPU run fails (after the breaker has counted it), and when it
// ends; views ask them for their part of GetJob. Nested in Service, they see its state (one translation unit each).
class Service::Workload {
 public:
  virtual ~Workload() = default;
  virtual WorkloadKind kind() const = 0;
  // Starts a run of `j` on j.route (already set; the FSM says running): posts it to that route's pool. False: the
  // job could not start and was ended here (e.g. a fallback model could not tokenize its prompt).
  virtual bool start(Service& s, JobRecord& j) = 0;
  // A run returned ok (not cancelled): check and keep its result before the job completes. An error (a result of
  // the wrong shape) fails the job with it instead: a caller never gets a short or malformed answer.
  virtual Status completed(Service& s, JobRecord& j, const RunResult& r) = 0;
  // Whether a failed job can be resumed (Resume). False: a failure that would be `Resumable` is `Unavailable`, and
  // the caller simply calls again.
  virtual bool resumable() const = 0;
  // A GPU run failed with an accelerator fault: retry on the CPU, migrate at the checkpoint, or fail resumable.
  virtual policy::FailoverDecision failover(const Service& s, const JobRecord& j) const = 0;
  // What the job has delivered to its caller (the job FSM's progress: migrating needs some, retrying none):
  // generated tokens (resumed ones excluded) by default; finished windows for a transcription.
  virtual std::uint32_t delivered(const JobRecord& j) const {
    return static_cast<std::uint32_t>(j.tokens.size() - j.resume.size());
  }
  // The time the job still needs on `route` when it is not a step-loop job (QueueEntry::fixed: its units left at
  // their measured times, policy::UnitTimes); nullopt for a step-loop job, or when a time is not known yet (the job
  // is then queued by its token shape, and its ETA is shown as unknown).
  virtual std::optional<Clock::duration> fixed_time(const Service& s, const JobRecord& j, policy::Device route) const {
    (void)s, (void)j, (void)route;
    return std::nullopt;
  }
  // The job reached a terminal state (its outcome is journaled, its resources released).
  virtual void ended(Service& s, JobRecord& j, JobPhase phase, Errc code, const std::string& message) = 0;
  // The kind's fields of the "finished" update and of GetJob.
  virtual void outcome(const JobRecord& j, Dict& finished) const = 0;
  virtual void view(const JobRecord& j, Dict& d) const = 0;
};

// Text generation (Submit/Resume): the prompt tokenized per serving model, the step loop's run with token events,
// token checkpoints, failover by the FailoverPolicy (retry before the first token, migrate at the checkpoint).
class Service::GenerateWorkload final : public Workload {
 public:
  WorkloadKind kind() const override { return WorkloadKind::generate; }
  bool start(Service& s, JobRecord& j) override;
  Status completed(Service& s, JobRecord& j, const RunResult& r) override;
  bool resumable() const override { return true; }
  policy::FailoverDecision failover(const Service& s, const JobRecord& j) const override;
  void ended(Service& s, JobRecord& j, JobPhase phase, Errc code, const std::string& message) override;
  void outcome(const JobRecord& j, Dict& finished) const override;
  void view(const JobRecord& j, Dict& d) const override;
};

// Embeddings (Embed): one run of both towers over the inputs; idempotent, so a GPU failure always re-runs it on
// the CPU; the reply goes to every waiting Embed call when it ends.
class Service::EmbedWorkload final : public Workload {
 public:
  WorkloadKind kind() const override { return WorkloadKind::embed; }
  bool start(Service& s, JobRecord& j) override;
  Status completed(Service& s, JobRecord& j, const RunResult& r) override;
  bool resumable() const override { return false; }
  policy::FailoverDecision failover(const Service& s, const JobRecord& j) const override;
  std::optional<Clock::duration> fixed_time(const Service& s, const JobRecord& j, policy::Device route) const override;
  void ended(Service& s, JobRecord& j, JobPhase phase, Errc code, const std::string& message) override;
  void outcome(const JobRecord& j, Dict& finished) const override;
  void view(const JobRecord& j, Dict& d) const override;
};

// Transcription (Transcribe): a Whisper window loop on one route. Its checkpoint is the last finished window, so a
// GPU failure mid-file continues on the CPU at that window boundary (nothing repeated, nothing lost); segments go
// to the caller window by window.
class Service::TranscribeWorkload final : public Workload {
 public:
  WorkloadKind kind() const override { return WorkloadKind::transcribe; }
  bool start(Service& s, JobRecord& j) override;
  Status completed(Service& s, JobRecord& j, const RunResult& r) override;
  bool resumable() const override { return false; }
  policy::FailoverDecision failover(const Service& s, const JobRecord& j) const override;
  std::uint32_t delivered(const JobRecord& j) const override;
  std::optional<Clock::duration> fixed_time(const Service& s, const JobRecord& j, policy::Device route) const override;
  void ended(Service& s, JobRecord& j, JobPhase phase, Errc code, const std::string& message) override;
  void outcome(const JobRecord& j, Dict& finished) const override;
  void view(const JobRecord& j, Dict& d) const override;
};

}  // namespace tandem::daemon
