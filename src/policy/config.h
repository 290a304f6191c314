// Configuration of every policy, with validation. The daemon loads these from TOML; `validate()` names the
// offending key with its dotted path ("ladder.pressure.elevated_enter_fraction must be in [0,1), got 1.5").
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/result.h"

namespace tandem::policy {

using namespace std::chrono_literals;

inline constexpr std::uint64_t kMiB = 1024ull * 1024ull;
inline constexpr std::uint64_t kGiB = 1024ull * kMiB;
inline constexpr std::uint64_t kPiB = 1024ull * 1024ull * kGiB;

// Safety margin kept free on the device: max(bytes, fraction × total).
struct MarginConfig {
  std::uint64_t bytes = 512 * kMiB;  // [0, 1 PiB]
  double fraction = 0.05;  // [0, 0.5]

  std::uint64_t for_total(std::uint64_t total_bytes) const;
  Status validate(const std::string& path = "margin") const;
};

struct EstimatorConfig {
  std::uint32_t kv_block_tokens = 16;    // tokens per paged-KV block, [1, 4096]
  double fragmentation_fraction = 0.10;  // allowance on top of the other terms, [0, 1]

  Status validate(const std::string& path = "estimator") const;
};

// How far a memory reading is trusted (see docs/policy.md, "Stale readings").
struct HeadroomConfig {
  MarginConfig margin;
  Clock::duration fresh_for = 500ms;      // a reading this young is used as is
  Clock::duration max_age = 5s;           // older than this: observed free counts as 0 (worst case)
  double stale_discount_fraction = 0.05;  // in between: observed free −= this × total, [0, 1]

  Status validate(const std::string& path = "headroom") const;
};

// Pressure levels from the headroom fraction (headroom / total), with hysteresis: a level is entered when the
// fraction drops below `*_enter_fraction` and left only when it rises above `*_exit_fraction`.
struct PressureConfig {
  double elevated_enter_fraction = 0.15;
  double elevated_exit_fraction = 0.20;
  double critical_enter_fraction = 0.05;
  double critical_exit_fraction = 0.08;

  Status validate(const std::string& path = "ladder.pressure") const;
};

// evict: give back idle GPU replicas of other models so that the job fits (docs/residency.md "Foreign pressure").
enum class Rung { admit, delay, evict, reduce, offload, route_cpu, reject };
std::string_view rung_name(Rung r) noexcept;
// Every rung, in the default order (config parsers, Policy.ladder_order and the views list them from here).
inline constexpr Rung kRungs[] = {Rung::admit,   Rung::delay,     Rung::evict, Rung::reduce,
                                  Rung::offload, Rung::route_cpu, Rung::reject};

struct LadderConfig {
  std::vector<Rung> order{std::begin(kRungs), std::end(kRungs)};
  PressureConfig pressure;
  Clock::duration max_delay = 30s;           // delay only while time waited + estimated wait is at most this
  std::uint32_t min_reduced_new_tokens = 64; // reduce never caps max_new_tokens below this; <= both queues' max_new
  std::uint32_t min_prefill_chunk = 128;     // reduce never chunks the prefill below this
  bool offload_enabled = true;
  std::uint32_t min_gpu_layers = 1;          // offload needs at least this many layers on the GPU
  Clock::duration default_retry_after = 5s;  // retry hint when nothing better is known
  Clock::duration max_retry_after = 300s;

  Status validate(const std::string& path = "ladder") const;
};

struct BreakerConfig {
  Clock::duration window = 60s;            // sliding window for counting failures
  std::uint32_t alloc_failure_threshold = 3;
  std::uint32_t probe_failure_threshold = 2;
  Clock::duration cooldown = 10s;          // open → half-open after this (first time)
  double backoff_factor = 2.0;             // cooldown × this after each failed half-open probe, [1, 16]
  Clock::duration max_cooldown = 300s;

  Status validate(const std::string& path = "breaker") const;
};

// One route's queue and step loop (continuous batching: one forward per step for all running sequences).
struct QueueConfig {
  std::uint32_t capacity = 64;         // queued (not running) jobs
  std::uint32_t concurrency = 4;       // running jobs = the step loop's maximum batch (sequences per step)
  std::uint32_t max_context = 8192;    // prompt + max_new_tokens
  std::uint32_t max_new_tokens = 4096;
  // Tokens per step across the batch: each decoding sequence takes one, prompts are prefilled in chunks of what is
  // left. In [concurrency, 2^24]: a full batch of decoders always fits, and a prompt beside the others' decode tokens
  // always gets at least one.
  std::uint32_t step_tokens = 512;

  Status validate(const std::string& path) const;
};

// Service rates per route, smoothed with an EWMA: rate ← alpha × sample + (1 − alpha) × rate. The per-step cost
// model uses the same alpha (its fitted plane alpha / 8) and takes its prior from the two rates (docs/policy.md §6).
struct RateConfig {
  double ewma_alpha = 0.2;            // (0, 1]
  double prior_prefill_tps = 1000.0;  // used until the first observation, > 0
  double prior_decode_tps = 20.0;
  // LoopOccupancy's time constant (s): the ETAs count the step loop's recent occupancy as load that keeps arriving
  // while a job runs (docs/policy.md §6, "Jobs that join later"). [0, 3600]; 0 = off.
  double occupancy_seconds = 10.0;

  Status validate(const std::string& path) const;
};

struct HostGuardConfig {
  // Configured ceiling for CPU-route memory; 0 = no configured cap (the cgroup and MemAvailable terms decide).
  // Otherwise >= 64 MiB.
  std::uint64_t budget_bytes = 0;
  std::uint64_t mem_available_reserve = 1 * kGiB;  // MemAvailable kept for the rest of the system, > 0
  std::uint32_t cpu_act_elem_bytes = 4;            // activations on the CPU are f32

  Status validate(const std::string& path = "host_guard") const;
};

struct ServiceStateConfig {
  Clock::duration recover_after = 10s;  // a better state must hold this long before it is announced

  Status validate(const std::string& path = "service") const;
};

struct ReplicaModeConfig {
  Clock::duration recovery_budget = 10s;  // time allowed from "GPU gone" to "CPU serving", > 0
  double switch_margin = 0.2;              // move to a cheaper mode only if its time ≤ budget × (1 − margin)

  Status validate(const std::string& path = "replica") const;
};

struct FailoverConfig {
  bool allow_migration = true;  // migrate mid-generation jobs at a token checkpoint when it is safe

  Status validate(const std::string& path = "failover") const;
};

struct IdempotencyConfig {
  Clock::duration retention = 24h;  // finished outcomes are kept this long
  std::uint32_t max_keys = 100000;

  Status validate(const std::string& path = "idempotency") const;
};

struct PolicyConfig {
  EstimatorConfig estimator;
  HeadroomConfig headroom;
  LadderConfig ladder;
  BreakerConfig breaker;
  QueueConfig gpu_queue{64, 4, 8192, 4096};
  QueueConfig cpu_queue{16, 1, 4096, 1024};
  RateConfig gpu_rates{0.2, 2000.0, 40.0};
  RateConfig cpu_rates{0.2, 100.0, 5.0};
  HostGuardConfig host_guard;
  ServiceStateConfig service;
  ReplicaModeConfig replica;
  FailoverConfig failover;
  IdempotencyConfig idempotency;

  Status validate() const;
};

}  // namespace tandem::policy
