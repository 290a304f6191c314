// The tandemd service core: jobs, admission, the two route queues with their worker threads, failover, the breaker
// and its probes, GPU holds, degraded mode and the durable journal — everything except the bus. Torch-free and
// D-Bus-free (the engine sits behind Backend, the bus behind ServiceObserver), so it is unit-tested with a scripted
// backend and a simulated accelerator.
//
// Threading: every public method runs on the daemon's one event-loop thread. Route workers (GPU and CPU pools, one
// maintenance thread for probes and reloads) only run Backend::run / health probes / reloads and post WorkerEvents;
// the loop applies them in process_events(). `wake` is called from any thread when an event is posted.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/result.h"
#include "daemon/backend.h"
#include "daemon/config.h"
#include "daemon/device_readings.h"
#include "daemon/gpu_holds.h"
#include "daemon/residency.h"
#include "daemon/journal.h"
#include "daemon/model_catalog.h"
#include "daemon/transcribe_request.h"
#include "daemon/submit_options.h"
#include "daemon/values.h"
#include "policy/policy.h"

namespace tandem::daemon {

using policy::JobId;

// Who calls, as the bus layer established it from the caller's credentials.
struct Caller {
  std::string bus_name;   // unique name (":1.42"); job updates go there unless reply_to is set
  std::uint32_t uid = 0;
  bool may_submit = false;
  bool admin = false;
  std::string reply_to;   // "" = bus_name; "ring:<session>" sends the job's updates to that ring session
};

struct SubmitRequest {
  std::string model;  // "" = default
  std::string prompt;
  std::vector<gen::Message> messages;
  SubmitOptions options;
};

// The kinds of job the scheduler runs: each is a Workload (service_internal.h) — its request, estimate, run,
// failover and result; admission, queues, the ledger, the breaker, the host guard, the journal, holds and degraded
// mode are the same for all (docs/architecture.md, "The service core").
enum class WorkloadKind : std::uint8_t { generate, embed, transcribe };
inline const char* workload_kind_name(WorkloadKind k) {
  switch (k) {
    case WorkloadKind::embed: return "embed";
    case WorkloadKind::transcribe: return "transcribe";
    case WorkloadKind::generate: break;
  }
  return "generate";
}

struct EmbedOptions {
  std::optional<std::string> idempotency_key;
  std::optional<bool> allow_cpu;            // default true
  std::optional<std::uint64_t> deadline_ms;
  std::optional<bool> truncate;             // default true: texts longer than the model's context are cut
};

// An Embed call: texts, then token-id inputs, then images (the bytes of JPEG/PNG files; front ends read fds into
// these).
struct EmbedRequest {
  std::string model;  // "" = [embedding] default_model, else the first embedding model
  std::vector<std::string> texts;
  // Texts already tokenized: the model's vocabulary ids without its special tokens (the OpenAI API's token-array
  // input); the model's BOS/EOS are added as for a text.
  std::vector<std::vector<std::int64_t>> tokens;
  std::vector<std::shared_ptr<const std::vector<std::uint8_t>>> images;
  // The caller's name of each image in error messages ("image_fds[0]" for an fd read in by the D-Bus front end);
  // missing entries are "images[i]".
  std::vector<std::string> image_names;
  EmbedOptions options;
};

struct EmbedReply {
  std::vector<std::vector<float>> vectors;  // one L2-normalised vector per input, in input order
  Dict result;  // job_id, model, route, dim, inputs, texts, images, truncated, attempts, degraded, fingerprint,
                // queued_ms, run_ms, existing
};
// Called once, on the loop thread: at once when the call is refused, else when its job ends.
using EmbedDone = std::function<void(Result<EmbedReply>)>;

// Front-end callbacks, all on the loop thread.
class ServiceObserver {
 public:
  virtual ~ServiceObserver() = default;
  // A job update for its submitter only (unicast).
  virtual void job_update(const std::string& destination, JobId id, const std::string& kind, const Dict& data) = 0;
  virtual void degraded_changed(bool degraded, const std::string& reason, const Dict& details) = 0;
  virtual void properties_changed(const std::vector<std::string>& names) = 0;
  // The served model set changed (a configuration reload added, removed or replaced models; docs/residency.md):
  // `added` serve from now on, `removed` no longer do (a replaced model is in both, removed first).
  virtual void models_changed(const std::vector<std::string>& added, const std::vector<std::string>& removed) {
    (void)added, (void)removed;
  }
};

// Fixed worker threads running posted tasks (one pool per route).
class TaskPool {
 public:
  TaskPool(std::string name, unsigned threads);
  ~TaskPool();
  void post(std::function<void()> task);
  void stop();  // finishes queued tasks, joins
 private:
  void loop();
  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

enum class QueueId;  // the queue a job is in (service_internal.h)

class Service {
 public:
  // Opens the journal (jobs left non-terminal by a crash become failed-resumable with their checkpoint), rebuilds
  // the idempotency keys, starts the workers. Errors: those of JobJournal::open, invalid config.
  static Result<std::unique_ptr<Service>> create(DaemonConfig cfg, std::shared_ptr<Backend> backend,
                                                 std::shared_ptr<const Clock> clock, ServiceObserver* observer,
                                                 std::function<void()> wake);
  ~Service();

  // --- methods (errors are typed; see docs/dbus.md for the mapping) ---
  Result<Dict> submit(const Caller& c, const SubmitRequest& req);  // placement, with "job_id"
  Result<Dict> plan(const Caller& c, const SubmitRequest& req);
  // An embedding job (docs/embeddings.md): validated, admitted, journaled and queued like Submit's; `done` gets
  // the vectors when it completes, or the typed error (also for a refused request, at once).
  void embed(const Caller& c, EmbedRequest req, EmbedDone done);
  // A transcription job (docs/transcription.md): validated (the audio's header is read here; its samples on the
  // worker), admitted, journaled and queued like Submit's; returns the placement with "job_id". Segments go to the
  // caller as JobUpdate "segment" signals, window by window; GetJob has the transcript.
  Result<Dict> transcribe(const Caller& c, const TranscribeRequest& req);
  // The next chunk of a streamed transcription's PCM (`offset`: bytes sent before it; `end`: the last chunk).
  // Errors: not_found (no such job), permission_denied (not the caller's), illegal_transition (not a stream, or the
  // job has ended), and audio::PcmStream::append's: invalid_argument (offset, frames, samples, duration),
  // queue_full (the stream is too far ahead of its transcription; retry_after_ms in the message).
  Status append_audio(const Caller& c, JobId id, std::uint64_t offset, std::span<const std::uint8_t> pcm, bool end);
  // The producer of a stream is gone (its ring session ended): the stream ends where it is and the job finishes
  // over what arrived (finish_reason "stream_closed"). No effect on other jobs or a stream already ended.
  void close_audio_stream(JobId id);
  Result<std::string> cancel(const Caller& c, JobId id);
  Result<Dict> get_job(const Caller& c, JobId id) const;
  Result<Dict> resume(const Caller& c, JobId id, const SubmitOptions& overrides);
  Result<std::string> hold_gpu(const Caller& c, const std::string& reason, const std::string& app_id);
  Status release_gpu(const Caller& c, const std::string& cookie);
  std::vector<Dict> list_models() const;
  // LoadModel / UnloadModel (admin; docs/residency.md): gives `model`'s replica on `device` back, or loads it again.
  // Only the GPU replica moves ("gpu"; the CPU replica is the fallback and stays). Returns at once with the
  // replica's state (unload: draining; load: loading, or loaded when a drain was undone): the model object's Replicas
  // and ListModels show the rest. Errors: permission_denied, not_found (no such
  // model), invalid_argument (device not gpu | cpu), unsupported (cpu, or a model without a GPU replica),
  // illegal_transition (already given back / loaded; a GPU hold is on), unavailable (the accelerator is lost).
  Result<Dict> unload_model(const Caller& c, const std::string& model, const std::string& device);
  Result<Dict> load_model(const Caller& c, const std::string& model, const std::string& device);
  // The holder's bus name vanished (NameOwnerChanged): its holds go. Its jobs keep running to a terminal state.
  void client_vanished(const std::string& bus_name);
  // A reply channel (a ring session) went away: its jobs keep running, their updates go nowhere (GetJob has them).
  void channel_closed(const std::string& reply_to);

  // --- properties ---
  std::string state() const;
  std::string degraded_reason() const;
  std::string breaker_state() const;
  std::string fallback_model() const;
  Dict policy_view() const;
  Status set_policy(const Caller& c, const Dict& changes);
  Dict memory_view() const;
  Dict host_memory_view() const;
  struct QueueRow { std::string name; std::uint32_t depth, capacity, running, concurrency; std::uint64_t oldest_age_ms; };
  std::vector<QueueRow> queues_view() const;
  std::map<std::string, std::uint32_t> limits_view() const;
  struct HoldRow { std::string cookie, app_id, reason; std::int64_t since_unix_ms; };
  std::vector<HoldRow> holds_view() const;
  Dict model_view(const std::string& name) const;  // for the per-model objects
  // The backend's replicas with the residency's state over the GPU one (draining, loading, why it was given back).
  std::vector<ReplicaInfo> replicas(const std::string& name) const;
  const Residency& residency() const { return residency_; }
  const DaemonConfig& config() const { return cfg_; }

  // --- group commit (docs/journal.md, "Sync points and group commit") ---
  // On (tandemd sets it): accepted and outcome records are only written, and the loop calls commit() once per
  // iteration. Until the commit that covers its accept, a new job is not dispatched and its updates are held; a
  // terminal update waits for the commit of its outcome; front ends hold their answers with after_commit(). Off
  // (the default): every accepted/outcome record is committed before the call that wrote it returns.
  void set_group_commit(bool on) { group_commit_ = on; }
  // One journal commit (one fdatasync) for everything written since the last, then, in order: the after_commit
  // callbacks, the held job updates, the queue pump (newly durable jobs may run). If the sync fails: every job
  // accepted since the last commit is withdrawn (it never ran and was never announced; its idempotency key is free
  // again), the callbacks and the return value carry Errc::internal ("could not journal the job (...); it was not
  // accepted"), and outcomes the failure undid are written again at the next commit (their updates stay held).
  Status commit();
  // Runs `then` with the status of the commit that covers everything journaled so far: at the next commit(), or at
  // once (ok) when nothing is pending. Callbacks run on the loop thread, in registration order.
  void after_commit(std::function<void(const Status&)> then);
  bool commit_pending() const;

  // --- loop ---
  void tick();            // periodic: device and host readings, breaker, probes, deadlines, queues
  void process_events();  // applies what the workers posted
  // Emits PropertiesChanged for what changed since the last call (one batch). Call after each loop iteration.
  void flush_changes();
  std::string status_line() const;  // for sd_notify STATUS=
  // How long the loop may wait for the next tick(): [device] idle_poll_interval_ms while idle(), else
  // poll_interval_ms. Admission does not depend on it: Submit, Plan and Resume take a fresh reading first.
  Clock::duration poll_interval() const;
  // Nothing to watch between calls: no unfinished job, normal pressure, the breaker closed, the device present,
  // no probe or reload in flight, not draining.
  bool idle() const;

  // --- shutdown (SIGTERM) ---
  void begin_drain();   // stop accepting; queued jobs end failed-resumable ("daemon_stopping")
  bool drained() const; // no job running
  void abort_running(); // drain timeout: running jobs end failed-resumable with their checkpoint
  void sync_journal();  // before a forced exit: what was appended is on disk (in-flight jobs recover on restart)
  // SIGHUP: applies what can change at run time — policy knobs, limits, the default models and the [[model]] list
  // (models added are loaded on a worker and serve once loaded; removed ones refuse new jobs and go once their jobs
  // finished; changed ones are replaced that way; keep_alive / priority apply at once). Errors: the policy knobs'
  // (the model list is applied anyway).
  Status reload(const DaemonConfig& cfg);
  const ModelCatalog& catalog() const { return catalog_; }

  // --- testing interface ---
  Status testing_foreign_load(std::uint64_t bytes);
  Status testing_fail_allocations(std::uint32_t n, const std::string& site);
  Status testing_fail_probes(std::uint32_t n);
  Status testing_reading_lag(std::uint64_t ms);
  Status testing_lose_device();
  Status testing_recover_device();
  // The next `n` journal syncs fail with EIO (exercises the failed-commit path; needs [journal] fsync = true).
  void testing_fail_journal_syncs(std::uint32_t n) { fail_journal_syncs_ = n; }
  // The daemon kills itself (SIGKILL) in the `n`-th commit that has accepts pending, after their records were
  // written and before the fdatasync (tandemd --testing with TANDEM_TESTING_CRASH_AT_COMMIT=n; it_restart.sh).
  void testing_crash_at_commit(std::uint32_t n) { crash_at_commit_ = n; }
  // The next `n` journal appends (accepted, transition, checkpoint, outcome records) fail with EIO before writing
  // anything (JobJournal::testing_fail_writes; docs/journal.md, "Failed writes").
  void testing_fail_journal_writes(std::uint32_t n);
  std::map<std::string, std::uint64_t> counters() const;

  // Journal replay figures (for the start-up log line).
  const JobJournal::ReplayStats& replay_stats() const { return journal_->replay_stats(); }

 private:
  struct JobRecord;
  struct WorkerEvent;
  class Sink;
  // The per-kind parts of a job (service_internal.h): GenerateWorkload (service_generate.cc), EmbedWorkload
  // (service_embed.cc).
  class Workload;
  class GenerateWorkload;
  class EmbedWorkload;
  struct EmbedWork;
  class TranscribeWorkload;
  struct TranscribeWork;
  class TranscribeSinkImpl;
  Workload& workload(const JobRecord& j) const;

  Service(DaemonConfig cfg, std::shared_ptr<Backend> backend, std::shared_ptr<const Clock> clock,
          ServiceObserver* observer, std::function<void()> wake);
  Status restore();
  void start_workers();

  // Request handling.
  struct Prepared;
  Result<Prepared> prepare(const Caller& c, const SubmitRequest& req, bool for_plan);
  Result<Prepared> prepare_embed(const Caller& c, const EmbedRequest& req);
  Dict embed_result(const JobRecord& j) const;
  std::string default_embedding_model() const;  // "" = none configured
  Result<Prepared> prepare_transcribe(const Caller& c, const TranscribeRequest& req);
  std::string default_speech_model() const;     // "" = none configured
  void on_transcribe_event(JobRecord& j, WorkerEvent& ev);
  std::string default_llm() const;              // [default_model], else the first LLM
  policy::Decision decide(const Prepared& p, std::optional<JobId> self, Clock::duration waited);
  policy::AdmissionSnapshot snapshot(const ModelInfo& m, const policy::RequestShape& r, std::optional<JobId> self,
                                     Clock::duration waited) const;
  Dict placement(const JobRecord& j) const;
  Dict job_dict(const JobRecord& j) const;
  Result<Dict> accept(const Caller& c, Prepared p, const policy::Decision& d, std::optional<JobId> resumed_from);

  // Scheduling.
  void pump();
  void dispatch(JobRecord& j, const policy::Route& route);
  void to_cpu_queue(JobRecord& j, const std::string& why);
  void end_job(JobRecord& j, policy::JobPhase phase, const std::string& reason, Errc code,
               const std::string& message, Clock::duration retry_after);
  void release_resources(JobRecord& j);
  void on_run_finished(JobRecord& j, const RunResult& r);
  void on_gpu_failure(JobRecord& j, const RunResult& r);
  // Moves a job whose GPU run ended (a fault, or a preemption by an eviction) to the CPU by the failover rule: retry
  // before the first token, migrate at the checkpoint, else fail resumable. `cause` names why in its events.
  void move_off_gpu(JobRecord& j, const std::string& cause, const std::string& message);
  bool cpu_can_serve(const JobRecord& j) const;

  // Readings and state.
  void refresh_readings();
  void update_service_state();
  void breaker_event(policy::BreakerEvent e, policy::ProbeId probe = policy::kNoProbe);
  void maybe_probe();
  void check_deadlines();
  void post(WorkerEvent ev);
  void emit(const JobRecord& j, const std::string& kind, const Dict& data);
  // Journal writes (docs/journal.md, "Failed writes"): a failure is counted (journal_write_errors) and logged
  // (rate-limited); none of them fails the job.
  void journal_transition(JobRecord& j, const std::string& reason);  // not written: again before the next record
  void journal_checkpoint(JobRecord& j);  // not written: journaled_tokens stays, the next one writes every token
  void journal_outcome(JobRecord& j);  // the job's outcome record (committed at once without group commit); not
                                       // written: the job's updates are held, commit() writes it again
  Status write_unwritten_transition(JobRecord& j);
  void journal_write_failed(std::string_view what, JobId id, const Status& st);
  void resync_journaled_tokens();      // after a failed commit undid checkpoints: what the journal holds again
  void withdraw(JobRecord& j);         // a failed commit: the job was never accepted
  void release_held();                 // held updates whose records are durable now, in order
  JobRecord* find(JobId id);
  const JobRecord* find(JobId id) const;
  policy::JobQueue* queue_of(QueueId q);  // nullptr for QueueId::none
  const policy::JobQueue* queue_of(QueueId q) const;
  void leave_queue(const JobRecord& j);   // out of its queue (if any); j.queue is left as it is
  Status check_owner(const Caller& c, const JobRecord& j) const;
  std::int64_t unix_ms() const;
  bool gpu_usable(const std::string& model) const;
  // The GPU replica of `m` is being loaded back: about how long until it is ready (nullopt: it is not loading, or
  // the device is lost or held).
  std::optional<Clock::duration> replica_loading_eta(const ModelInfo& m, Clock::time_point now) const;
  // GPU residency (service_control.cc, over Residency): advances the drains (frees replicas whose last GPU job ended,
  // moves jobs off a replica whose drain time passed), brings back what the holds gave back, loads one replica.
  void residency_step();
  void restore_after_holds();
  // A job for `model` arrived: a replica given back for idleness (keep_alive) starts loading again (the job then
  // waits for it or starts on the CPU, whichever finishes sooner).
  void wake_replica(const std::string& model);
  Dict residency_reply(const std::string& model) const;
  void start_gpu_load(const std::string& model);
  bool gpu_busy(const std::string& model) const;  // a run of `model` is on the GPU (or offloaded)
  // The models a GPU job runs on (also offloaded) or waits for in the GPU queue: their replicas are not idle.
  std::set<std::string> gpu_wanted_models() const;
  // The warm-ups of replicas just loaded (the backend's at start, a model's added at run time): an embedding or
  // speech model's per-unit times, and the per-route step rates from the default LLM's — or from any LLM's while a
  // route has only its priors (docs/policy.md §6, "Measured at load").
  void apply_warmups(const std::vector<WarmupReport>& warmups);
  // A queue entry for `j` on the queue of `route` (accepted at `accepted`): a fixed-duration one when its workload
  // knows its time there (Workload::fixed_time), else by its token shape.
  policy::QueueEntry queue_entry(const JobRecord& j, policy::Device route, Clock::time_point accepted) const;
  // Jobs whose finish, simulated again now, moved from the one last announced by at least max(250 ms, 20 % of the
  // longer of the two remaining times) get an "eta" update (docs/dbus.md): a job placed at the start of a burst
  // hears when the jobs placed after it slow it down. After each admission, move and end (etas_dirty_).
  void reannounce_etas();
  bool etas_dirty_ = false;
  // Each queue's expected background load (JobQueue::set_background) from its route's occupancy now; called by
  // refresh_readings, before every admission.
  void refresh_backgrounds();
  // The unfinished part of a fixed-duration job changed (a window done): its queue's simulation follows.
  void update_fixed_time(const JobRecord& j);
  // Whether `route`'s estimates are measured (a warm-up or an observed run), not the configured priors' guess; and
  // the CPU route's expected slowdown (GPU decode rate / CPU decode rate; 0 = unknown: either is still a prior).
  bool eta_known(policy::Device route) const;
  // A job's: its route's rates (generate), or its units' measured times (embed, transcribe).
  bool eta_known(const JobRecord& j) const;
  double expected_slowdown() const;
  // The runtime model set (service_control.cc, over ModelCatalog): the new configuration's [[model]] list, loading
  // one model's replicas on the models worker, what a finished load becomes, removing the models whose jobs ended,
  // and the one admission check every request kind makes.
  void reconfigure_models(const DaemonConfig& cfg);
  void start_model_load(const ModelConfig& mc);
  void on_model_prepared(WorkerEvent& ev);
  void remove_finished_models();
  std::uint32_t jobs_naming(const std::string& model) const;  // unfinished jobs requesting it or routed to it
  bool model_busy(const std::string& model) const;  // an active job names it, or its GPU replica is moving
  void apply_residency_settings(const ModelConfig& mc);
  Result<const ModelInfo*> serving_model(const std::string& name) const;
  // Foreign pressure (the evict rung, docs/residency.md): the idle GPU replicas of models other than `except`, the
  // bytes of replicas being given back now, carrying out a decision's evictions, giving back idle replicas while
  // others' usage keeps the device in critical pressure, and bringing them back once there is room again.
  std::vector<policy::EvictCandidate> evict_candidates(const std::string& except) const;
  std::uint64_t evicting_bytes() const;
  void evict_for(const policy::Decision& d, const std::string& for_model);
  void relieve_pressure(Clock::time_point now);
  void recover_from_pressure(Clock::time_point now);
  std::uint64_t replica_bytes(const std::string& model) const;  // what its GPU replica holds when loaded
  std::uint32_t active_jobs_of(const std::string& bus_name) const;
  void prune_finished();

  DaemonConfig cfg_;
  std::shared_ptr<Backend> backend_;
  std::unique_ptr<Workload> generate_wl_, embed_wl_, transcribe_wl_;
  std::shared_ptr<const Clock> clock_;
  ServiceObserver* observer_;
  std::function<void()> wake_;

  std::unique_ptr<JobJournal> journal_;
  policy::AdmissionPolicy admission_;
  policy::CircuitBreaker breaker_;
  policy::JobQueue gpu_queue_;
  policy::JobQueue cpu_queue_;
  policy::UnitTimes unit_times_;  // embedding and speech models' measured times per text, image and window
  // Each route's step-loop occupancy: the load its ETAs expect to keep arriving (refresh_backgrounds).
  policy::LoopOccupancy gpu_occupancy_, cpu_occupancy_;
  policy::ReservationLedger ledger_;
  policy::HostMemoryGuard host_guard_;
  policy::ServiceStateTracker state_;
  policy::FailoverPolicy failover_;
  policy::IdempotencyRegistry idempotency_;

  // Readings.
  DeviceReadings readings_;
  bool reload_in_flight_ = false;
  bool probe_in_flight_ = false;
  bool last_probe_failed_ = false;  // the latest health probe failed: not idle, so the next probes come at the normal pace
  Clock::time_point last_probe_{};
  std::int64_t degraded_since_unix_ms_ = 0;

  std::map<JobId, std::unique_ptr<JobRecord>> jobs_;
  std::set<JobId> active_;  // not terminal (accepted, queued, running, retrying, migrating): the loops that run per
                            // request or event walk these, not the up to [journal] max_jobs finished ones
  JobId next_id_ = 1;
  GpuHolds holds_;
  Residency residency_;
  ModelCatalog catalog_;

  bool draining_ = false;

  // Group commit.
  struct HeldUpdate {
    JobId job;
    std::string kind;
    Dict data;
  };
  bool group_commit_ = false;
  bool committing_ = false;
  std::vector<JobId> pending_accepts_;   // accepted since the last commit
  std::vector<JobId> pending_outcomes_;  // outcomes written since the last commit
  std::vector<JobId> outcome_retry_;     // outcomes not durable (a failed write or commit): written again at a commit
  Clock::time_point outcome_retry_at_{}; // not before (a retry that failed again waits a poll interval)
  std::chrono::steady_clock::time_point journal_error_logged_{};  // rate limit of the journal_write_failed lines
  std::uint64_t journal_errors_unlogged_ = 0;
  std::vector<std::function<void(const Status&)>> waiters_;
  std::deque<HeldUpdate> held_updates_;
  std::uint32_t fail_journal_syncs_ = 0;
  std::uint32_t crash_at_commit_ = 0;
  std::map<std::string, std::uint64_t> counters_;

  // Change detection for PropertiesChanged.
  std::map<std::string, std::string> published_;

  // Worker side.
  std::mutex events_mu_;
  std::deque<WorkerEvent> events_;
  std::unique_ptr<TaskPool> gpu_pool_, cpu_pool_, maint_pool_, models_pool_;
};

}  // namespace tandem::daemon
