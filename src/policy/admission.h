// The pressure ladder: one admission decision per job, as a pure function of a snapshot. A dry-run Plan returns the
// same Decision. Rungs are tried in the configured order; the first viable one wins; every skipped rung is noted
// with its reason. See docs/policy.md §4.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/clock.h"
#include "policy/breaker.h"
#include "policy/config.h"
#include "policy/estimator.h"
#include "policy/headroom.h"
#include "policy/host_guard.h"
#include "policy/ledger.h"
#include "policy/queue.h"
#include "policy/types.h"

namespace tandem::policy {

// Machine-readable reason of a decision or of a skipped rung (stable snake_case names via reason_name()).
enum class Reason {
  // chosen rungs
  fits, waiting_for_memory, waiting_for_slot, waiting_for_fresh_reading, queued_behind, waiting_for_replica,
  fits_reduced, fits_offloaded, routed_cpu, routed_fallback,
  // why a rung was skipped (the reject's reason is the first of these)
  invalid_request, gpu_absent, breaker_open, reading_expired, exceeds_gpu_limits, critical_pressure, does_not_fit,
  queued_ahead, no_free_slot, exceeds_device, gpu_queue_full, wait_too_long, wait_unknown, reduce_not_allowed,
  reduce_insufficient, offload_disabled, offload_unsupported, offload_insufficient, cpu_not_allowed,
  cpu_unavailable, cpu_incompatible, exceeds_cpu_limits, cpu_queue_full, host_memory, host_guard_missing,
  replica_loading, cpu_sooner,
  // the evict rung (docs/residency.md "Foreign pressure"): chosen, and why it was skipped
  evicting_idle, waiting_for_eviction, memory_not_short, no_idle_replica, eviction_insufficient, eviction_capped,
  no_rung,
};
std::string_view reason_name(Reason r) noexcept;

// One of our running GPU jobs: the bytes its reservation frees when it ends, and when that is at the latest.
struct RunningGpuJob {
  std::uint64_t bytes = 0;
  Clock::duration remaining{};

  friend bool operator==(const RunningGpuJob&, const RunningGpuJob&) = default;
};

// An idle GPU replica of another model that the `evict` rung may give back: no job runs on it or waits for it.
struct EvictCandidate {
  std::string model;
  std::uint64_t bytes = 0;        // what giving it back returns (its weights on the device)
  int priority = 0;               // [[model]] priority: the lower goes first
  Clock::time_point last_used{};  // its last GPU run: within a priority, the least recently used goes first

  friend bool operator==(const EvictCandidate&, const EvictCandidate&) = default;
};

// The replicas to give back, in order, so that at least `missing` bytes come back: the lowest priority first, then
// the least recently used; only as many as needed. nullopt when all of them together free less than `missing`.
std::optional<std::vector<std::string>> choose_evictions(std::vector<EvictCandidate> candidates, std::uint64_t missing);

struct GpuView {
  bool present = true;
  bool breaker_allows = true;            // CircuitBreaker::allows_gpu()
  Clock::duration breaker_retry_in{};    // time until half-open while open
  Headroom headroom;
  Pressure pressure = Pressure::normal;
  bool weights_resident = false;         // this model's weights are on the GPU already
  bool offload_supported = false;        // the engine can run a layer split for this model
  std::size_t jobs_ahead = 0;            // queued GPU jobs ahead of this one (FIFO: nothing overtakes them)
  bool slot_free = true;                 // a GPU concurrency slot is free
  bool queue_full = false;
  Clock::duration queue_wait{};          // estimated wait for a concurrency slot (slots only, not memory)
  std::vector<RunningGpuJob> running;    // our running GPU jobs (for the memory wait of `delay`)
  Clock::duration waited{};              // how long this job has waited since acceptance (0 for a new one)
  // This model's GPU replica is being loaded back (docs/residency.md): ready in about this long. Nothing starts on
  // it before; `delay` may wait for it — unless the CPU route is allowed and would finish the job sooner:
  // cpu_queue_wait + cpu_run < load + gpu_run (the job's estimated run time on each route; 0 = unknown: wait).
  std::optional<Clock::duration> replica_loading;
  Clock::duration gpu_run{};
  Clock::duration cpu_run{};
  std::uint32_t max_context = 0;         // GPU queue limits
  std::uint32_t max_new_tokens = 0;
  // The step loop this job joins (continuous batching; docs/policy.md §4 "The real batch"). step_tokens = the
  // loop's token budget per step (QueueConfig::step_tokens), 0 = no step loop: the prompt's prefill is one forward
  // (or `prefill_chunk`), as before. running_sequences = the sequences in the loop before this job joins (each
  // takes one token of every step while it decodes). With step_tokens > 0 the job's prefill chunk is capped at
  // max(1, step_tokens − running_sequences), the estimate uses that chunk, and Decision::prefill_chunk carries it:
  // the loop must never give the job a bigger chunk (its reservation assumes it).
  std::uint32_t running_sequences = 0;
  std::uint32_t step_tokens = 0;
  // Foreign pressure (the `evict` rung): the idle replicas of other models it may give back, the bytes of replicas
  // already being given back (they return without another eviction), and how many evictions the cap still allows.
  std::vector<EvictCandidate> evictable;
  std::uint64_t evicting_bytes = 0;
  std::uint32_t evict_budget = 0;
};

struct CpuView {
  bool replica_present = false;          // a CPU replica of the requested model is loaded (or loadable)
  bool fingerprint_compatible = false;   // its fingerprint matches the GPU replica's
  std::optional<ModelShape> fallback;    // a smaller model the CPU can serve instead
  bool queue_full = false;
  Clock::duration queue_wait{};
  std::uint32_t max_context = 0;         // CPU queue limits
  std::uint32_t max_new_tokens = 0;
  std::uint32_t running_sequences = 0;   // the CPU step loop, as in GpuView (caps the host estimate's chunk)
  std::uint32_t step_tokens = 0;
  const HostMemoryGuard* host = nullptr; // mechanism passed in, not owned (required for route_cpu)
  HostReading host_reading;
};

struct AdmissionSnapshot {
  ModelShape model;
  RequestShape request;
  GpuView gpu;
  CpuView cpu;
};

struct RungNote {
  Rung rung = Rung::reject;
  Reason reason = Reason::no_rung;

  friend bool operator==(const RungNote&, const RungNote&) = default;
};

struct Decision {
  Rung action = Rung::reject;
  Reason reason = Reason::no_rung;
  std::string detail;                  // one line for humans and logs
  MemoryBreakdown breakdown;           // GPU estimate of the chosen plan (for route_cpu/reject: the unreduced one)
  Headroom headroom;
  Pressure pressure = Pressure::normal;
  std::uint32_t max_new_tokens = 0;    // possibly reduced
  std::uint32_t prefill_chunk = 0;     // possibly reduced or capped by the step budget (0 = whole prompt)
  Route route;                         // device, GPU layers, model (fallback or not)
  std::optional<HostJobEstimate> host; // route_cpu: host-memory estimate; offload: the host part of the split
  bool waits_for_host_memory = false;  // route_cpu: queued until the host guard has room
  Clock::duration eta{};               // delay: max(slot wait, memory wait); route_cpu: CPU queue wait
  Clock::duration retry_after{};       // reject: when retrying may succeed (0 when permanent)
  bool permanent = false;              // reject: resubmitting the same request cannot succeed (see to_error)
  std::vector<RungNote> skipped;       // rungs tried before the chosen one, with why
  std::vector<std::string> evict;      // evict: the idle replicas to give back now (empty: enough is on its way back)

  bool accepted() const { return action != Rung::reject; }
  // A reject as an error value for the caller to hand back: Errc::rejected (resumable, "retry after ...") or, when
  // `permanent`, Errc::invalid_argument without a retry hint.
  Error to_error() const;
};

class AdmissionPolicy {
 public:
  AdmissionPolicy(LadderConfig ladder = {}, EstimatorConfig estimator = {}, HostGuardConfig host = {})
      : ladder_(std::move(ladder)), estimator_(estimator), host_cfg_(host) {}

  Decision decide(const AdmissionSnapshot& s) const;

  const MemoryEstimator& estimator() const { return estimator_; }
  const LadderConfig& ladder() const { return ladder_; }

 private:
  LadderConfig ladder_;
  MemoryEstimator estimator_;
  HostGuardConfig host_cfg_;
};

// Convenience: views from the mechanism objects. `self` = the job being decided if it is already queued there.
// `GpuView::present` stays true: set it to false yourself when the device is gone. `ledger` gives the bytes of the
// running GPU jobs (GpuView::running). running_sequences is the queue's running(); step_tokens stays 0 (no step
// loop): set it to the queue's config().step_tokens once the loop honours Decision::prefill_chunk for every job.
GpuView make_gpu_view(const Headroom& h, Pressure p, const CircuitBreaker& breaker, const JobQueue& gpu_queue,
                      const ReservationLedger& ledger, Clock::time_point now, bool weights_resident,
                      bool offload_supported, std::optional<JobId> self = std::nullopt);
CpuView make_cpu_view(const JobQueue& cpu_queue, const HostMemoryGuard& host, const HostReading& reading,
                      bool replica_present, bool fingerprint_compatible, std::optional<ModelShape> fallback,
                      std::optional<JobId> self = std::nullopt);

}  // namespace tandem::policy
