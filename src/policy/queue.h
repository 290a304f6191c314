// Bounded job queues (one for the GPU, one for the CPU), each with its own concurrency (the step loop's maximum
// batch) and limits, and ETAs from a simulation of the step loop at the measured per-step costs. Fairness rule:
// strict FIFO by acceptance time (ties by job id); a job moved between queues keeps its acceptance time; nothing
// overtakes the head. See docs/policy.md §6.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/result.h"
#include "policy/config.h"
#include "policy/types.h"

namespace tandem::policy {

// Step-cost model of one route's step loop (continuous batching: every step is one forward of all running
// sequences). A step of `batch` sequences processing `tokens` tokens in total costs about
//   step(batch, tokens) = (fixed + per_token · tokens + per_seq · batch) · ratio(batch)
// where `fixed` is what every forward pays once (reading the weights), `per_token` the compute per token and
// `per_seq` what each sequence adds (its attention over its own KV, sampling), so the time per token falls as the
// batch grows. The three coefficients are an exponentially weighted least-squares fit over the observed steps
// (weight α/8 per step: the fit needs spread in tokens and batch, which prefill steps and batch changes bring only
// now and then), shrunk toward the prior by 0.01 of pseudo-variance each (token², sequence²), so that steps of
// one shape alone still give a plane. ratio(b) corrects what the plane misses for a batch size: an EWMA (α) per
// batch size of observed time / plane (multiplicative, so the noise of long prefill steps does not swamp short
// decode steps); 1 before that size is seen, then an unseen size interpolates the ratios of its nearest seen
// neighbours linearly in b, or takes the nearest one beyond them.
// Prior (before any step is observed): per_token = 1 / prefill_tps, per_seq = 0, fixed = max(0, 1 / decode_tps −
// 1 / prefill_tps) — one decode step of one sequence takes 1 / decode_tps — from the current per-stream rates.
// See docs/policy.md §6.
struct StepLine {
  double fixed_s = 0;      // seconds per step
  double per_token_s = 0;  // seconds per token in the step
  double per_seq_s = 0;    // seconds per sequence in the step

  double at(double batch, double tokens) const { return fixed_s + per_token_s * tokens + per_seq_s * batch; }
};

// EWMA-smoothed service rates of one route: the per-stream prefill/decode tokens/s (observe_prefill/observe_decode;
// they also set the step model's prior) and the step-cost model (observe_step) that the ETAs use.
class ServiceRates {
 public:
  explicit ServiceRates(RateConfig cfg = {})
      : cfg_(cfg), prefill_tps_(cfg.prior_prefill_tps), decode_tps_(cfg.prior_decode_tps) {}

  // Samples with no tokens or no time are ignored (they carry no rate).
  void observe_prefill(std::uint64_t tokens, Clock::duration took);
  void observe_decode(std::uint64_t tokens, Clock::duration took);
  // Rates measured when a replica loaded (its warm-up run, docs/policy.md §6): they replace the configured priors
  // outright — the EWMAs and the step model's prior continue from them. Values <= 0 leave that rate as it is.
  void set_measured(double prefill_tps, double decode_tps);
  bool measured() const { return measured_; }
  // Nothing measured yet — no warm-up (set_measured) and no run observed — so every estimate of this route is the
  // configured priors' guess: shown as "estimate unavailable" rather than as a number (docs/policy.md §6).
  bool from_priors() const { return !measured_ && !observed_; }
  // One forward of `batch` sequences processing `tokens` tokens in total (decoding sequences one each, a prefill
  // chunk its length). Ignored when batch, tokens or took is 0 (or took negative). Batches above kMaxBatch count as
  // kMaxBatch.
  void observe_step(std::uint32_t batch, std::uint32_t tokens, Clock::duration took);

  double prefill_tps() const { return prefill_tps_; }
  double decode_tps() const { return decode_tps_; }
  // A job's time alone at the per-stream rates (not used for ETAs any more; kept for callers).
  Clock::duration service_time(std::uint64_t prompt_tokens, std::uint64_t new_tokens) const;

  // Estimated duration of one step (≥ 1 µs); step_seconds is the same in seconds (the simulation's unit).
  Clock::duration step_time(std::uint32_t batch, std::uint32_t tokens) const;
  double step_seconds(std::uint32_t batch, std::uint32_t tokens) const;
  StepLine prior_line() const;  // from the current per-stream rates
  StepLine line() const;        // the fitted plane (the prior until a step is observed)
  std::uint64_t steps_observed() const { return steps_; }

  static constexpr std::uint32_t kMaxBatch = 4096;  // QueueConfig::concurrency's bound

 private:
  double ratio(std::uint32_t batch) const;

  RateConfig cfg_;
  double prefill_tps_;
  double decode_tps_;
  bool measured_ = false;  // set_measured was called: the rates are no longer the configured priors
  bool observed_ = false;  // a prefill, decode or step was observed
  // Exponentially weighted sums of the fit (x = tokens, b = batch, y = seconds): weight, Σx, Σb, Σy, Σx², Σxb,
  // Σb², Σxy, Σby.
  double w_ = 0, sx_ = 0, sb_ = 0, sy_ = 0, sxx_ = 0, sxb_ = 0, sbb_ = 0, sxy_ = 0, sby_ = 0;
  std::map<std::uint32_t, double> buckets_;  // batch size → EWMA of observed / plane; at most kMaxBatch entries
  std::uint64_t steps_ = 0;
};

// The step loop's recent occupancy: a time-weighted average of the number of sequences it steps, with time
// constant tau over busy and idle time alike (idle counts as 0, applied lazily: at() decays to the moment asked).
// The ETA simulation takes it as the load that will keep arriving while a job runs (LoopPlan::background): a job
// placed at the start of a burst shares its steps with the jobs placed after it, which its placement cannot see
// (docs/policy.md §6, "Jobs that join later").
class LoopOccupancy {
 public:
  // tau ≤ 0: off (at() is always 0).
  explicit LoopOccupancy(Clock::duration tau = std::chrono::seconds(10)) : tau_(tau) {}
  // `batch` sequences were stepped for `took`, ending at `end`. Steps out of order (an end before the last one's)
  // count as ending at the last one.
  void observe_step(std::uint32_t batch, Clock::duration took, Clock::time_point end);
  double at(Clock::time_point now) const;
  void set_tau(Clock::duration tau) { tau_ = tau; }

 private:
  Clock::duration tau_;
  double value_ = 0;
  Clock::time_point last_{};
  bool any_ = false;
};

// One sequence of a simulated step loop: what it still has to do. new_left is max_new − generated: at the latest
// (EOS ends a job sooner).
// A job with a fixed duration (fixed_s > 0: an embedding job's inputs, a transcription's windows, at their measured
// times — docs/policy.md §6) is not part of the step loop: it holds a slot for that long and runs on its own thread,
// after the fixed jobs of the same lane that joined before it (a replica runs one such job at a time); its token
// counts are then ignored.
struct LoopJob {
  JobId id = 0;
  std::uint32_t prompt_left = 0;  // prompt tokens not yet prefilled
  std::uint32_t new_left = 0;     // new tokens not yet generated
  std::uint32_t chunk_cap = 0;    // most prompt tokens per step (Decision::prefill_chunk); 0 = the budget decides
  double fixed_s = 0;             // > 0: a fixed-duration job of that many seconds (left)
  std::uint32_t lane = 0;         // fixed jobs of one lane run one after another
};

// Where a simulation may stop early (the rest of the timeline is then not computed).
struct LoopStop {
  enum class Kind { none, queued_started, queued_finished, running_finished, all_running_finished };
  Kind kind = Kind::none;
  std::size_t index = 0;  // into LoopPlan::queued / LoopPlan::running
};

struct LoopPlan {
  std::vector<LoopJob> running;  // in the loop now, in start order (the prefill budget goes to the oldest first)
  std::vector<LoopJob> queued;   // FIFO; each joins when a slot is free
  std::uint32_t max_batch = 1;   // QueueConfig::concurrency (values < 1 count as 1)
  std::uint32_t step_tokens = 1; // QueueConfig::step_tokens (values < 1 count as 1)
  // Sequences expected in the loop meanwhile (LoopOccupancy): every step is costed as if it had at least
  // round(background) sequences — the ones simulated, plus decoding sequences of jobs not placed yet, one token
  // each — up to max_batch. They take no slot: queued jobs join as before.
  double background = 0;
  LoopStop stop;
};

// Times from now; Clock::duration::max() where the simulation stopped before the event.
struct LoopTimeline {
  std::vector<Clock::duration> queued_start;
  std::vector<Clock::duration> queued_finish;
  std::vector<Clock::duration> running_finish;
  std::size_t phases = 0;  // runs of identical steps simulated: the cost (a few per job, see docs/policy.md §6)
  std::uint64_t steps = 0; // steps simulated
};

// Simulates the step loop: every step, each decoding sequence adds one token; the budget left (step_tokens − the
// decoding sequences) goes to the prefilling sequences oldest first, each a chunk of at most what it has left (and
// its chunk_cap); the
// step that completes a prompt also yields its first new token; a sequence leaves after its last token and a queued
// job joins (FIFO) at the next step. Each step costs rates.step_seconds(batch, tokens), batch = the sequences that
// processed a token. Runs of identical steps between events are advanced at once, so the cost is O(jobs · (log jobs
// + prefilling sequences served per step)), whatever the token counts. A fixed-duration job (LoopJob::fixed_s)
// joins like the others, finishes fixed_s after its lane is free and frees its slot at the next step boundary (at
// once when no sequence is stepping).
LoopTimeline simulate_step_loop(const LoopPlan& plan, const ServiceRates& rates);

struct QueueEntry {
  JobId id = 0;
  std::uint32_t prompt_tokens = 0;
  std::uint32_t max_new_tokens = 0;
  Clock::time_point accepted_at{};  // orders the queue; keep it when moving a job between queues
  // > 0: not a step-loop job but one of this duration (LoopJob::fixed_s), in `lane` (e.g. per model).
  Clock::duration fixed{};
  std::uint32_t lane = 0;
};

enum class Removed { none, queued, running };

// A running job and when it finishes at the latest, by the step-loop simulation (max_new is an upper bound: EOS
// ends it sooner).
struct RunningWork {
  JobId id = 0;
  Clock::duration remaining{};
};

struct QueuedEta {
  JobId id = 0;
  Clock::duration start{};  // time until it joins the step loop
};

class JobQueue {
 public:
  JobQueue(std::string name, QueueConfig cfg, RateConfig rates = {});

  // Checks the limits: Errc::invalid_argument (over max_context / max_new_tokens), Errc::duplicate, Errc::queue_full.
  Status check_limits(std::uint32_t prompt_tokens, std::uint32_t max_new_tokens) const;
  Status enqueue(const QueueEntry& e);
  // Moves the head to running if a concurrency slot is free.
  std::optional<QueueEntry> start_next();
  // Runs a job without queueing (admitted at once). Only when nothing is queued (FIFO) and a slot is free.
  Status start_direct(const QueueEntry& e);
  // Token progress of a running job (for ETAs); monotone, values beyond the job's sizes are capped.
  // prefill_done = the whole prompt is in the KV cache; generated = new tokens so far.
  void update_progress(JobId id, bool prefill_done, std::uint32_t tokens_generated);
  // Chunked prefill: `prefilled` prompt tokens are in the KV cache so far.
  void update_prefill(JobId id, std::uint32_t prefilled);
  // The most prompt tokens the loop gives a running job per step (Decision::prefill_chunk; 0 = the budget decides).
  void set_prefill_chunk(JobId id, std::uint32_t chunk);
  // A fixed-duration job's time left (e.g. its windows left × the time per window), queued or running; no effect on
  // a step-loop job (fixed 0) or an unknown one.
  void set_fixed_left(JobId id, Clock::duration left);
  // The load expected to join while jobs run (LoopPlan::background; 0 = none): the service sets the route's
  // LoopOccupancy before it asks for ETAs.
  void set_background(double sequences) { background_ = sequences > 0 ? sequences : 0; }
  double background() const { return background_; }
  Removed finish(JobId id);  // a running job ended
  Removed cancel(JobId id);  // removes the job in any state (same as remove; named for the caller's intent)
  Removed remove(JobId id);  // e.g. moving a queued job to the other queue

  std::size_t depth() const { return queued_.size(); }
  std::size_t running() const { return running_.size(); }
  bool full() const { return queued_.size() >= cfg_.capacity; }
  bool has_free_slot() const { return running_.size() < cfg_.concurrency; }
  bool contains(JobId id) const { return index_.count(id) != 0 || running_.count(id) != 0; }
  const QueueEntry* head() const { return queued_.empty() ? nullptr : &queued_.begin()->second; }
  std::optional<std::size_t> position(JobId id) const;  // 0 = head; O(position)
  Clock::duration oldest_age(Clock::time_point now) const;

  // ETAs by simulating the step loop (simulate_step_loop) from the running jobs' progress and the queue in FIFO
  // order, every job to its max_new_tokens: "at the latest" under the step model. Slots and steps only: whether
  // the device has memory for a job is the admission policy's part (GpuView::running, docs/policy.md §4).
  // Time until a job appended now would join the loop, and until it would finish. O(jobs · log jobs).
  Clock::duration eta_start_for_new() const;
  Clock::duration eta_done_for_new(std::uint32_t prompt_tokens, std::uint32_t max_new_tokens) const;
  // Time until a queued job joins the loop; nullopt if not queued. O((running + position) · log).
  std::optional<Clock::duration> eta_start(JobId id) const;
  // Time until a queued or running job finishes (at the latest); nullopt if neither. O(jobs · log jobs).
  std::optional<Clock::duration> eta_done(JobId id) const;
  // Every queued job's start ETA in FIFO order, from one simulation (for listings: eta_start per job is O(n²)).
  std::vector<QueuedEta> eta_starts() const;
  // Every running job with the time until it finishes, soonest first (queued jobs joining as slots free are
  // simulated too: they share the steps). O(jobs · log jobs).
  std::vector<RunningWork> running_work() const;
  // Every running and queued job with the time until it finishes (at the latest), from one simulation: for
  // re-announcing ETAs when the load changes. O(jobs · log jobs).
  std::vector<RunningWork> finish_etas() const;
  // Acceptance time of a queued job; nullopt if it is not queued.
  std::optional<Clock::time_point> accepted_at(JobId id) const;

  ServiceRates& rates() { return rates_; }
  const ServiceRates& rates() const { return rates_; }
  const QueueConfig& config() const { return cfg_; }
  const std::string& name() const { return name_; }

 private:
  using Key = std::pair<Clock::time_point, JobId>;
  struct Running {
    std::uint32_t prompt_tokens = 0;
    std::uint32_t max_new_tokens = 0;
    std::uint32_t prefilled = 0;
    std::uint32_t generated = 0;
    std::uint32_t chunk_cap = 0;
    std::uint64_t order = 0;  // start order: the prefill budget goes to the oldest first
    Clock::duration fixed{};  // > 0: a fixed-duration job, this much left
    std::uint32_t lane = 0;
  };
  // The plan of the current state: running jobs in start order, the first `queued_limit` queued jobs.
  LoopPlan plan(std::size_t queued_limit) const;
  void add_running(const QueueEntry& e);

  std::string name_;
  QueueConfig cfg_;
  ServiceRates rates_;
  std::map<Key, QueueEntry> queued_;
  std::unordered_map<JobId, Key> index_;
  std::unordered_map<JobId, Running> running_;
  std::uint64_t next_order_ = 0;
  double background_ = 0;
};

}  // namespace tandem::policy
