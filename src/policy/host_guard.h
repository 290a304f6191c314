// Host-memory guard: CPU routing may never exhaust system RAM. Takes parsed numbers (see procfs.h), reads nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

#include "core/result.h"
#include "policy/config.h"
#include "policy/types.h"

namespace tandem::policy {

// One reading of the host's memory state; absent fields are simply not used.
struct HostReading {
  std::optional<std::uint64_t> mem_available;   // /proc/meminfo MemAvailable, bytes
  std::optional<std::uint64_t> cgroup_max;      // cgroup v2 memory.max; nullopt = "max" or no cgroup
  std::optional<std::uint64_t> cgroup_current;  // cgroup v2 memory.current
};

// no_reading: no configured cap and no cgroup/MemAvailable reading: the budget is 0 (fail closed).
enum class HostBound { configured, cgroup, mem_available, no_reading };
std::string_view host_bound_name(HostBound b) noexcept;

struct HostBudget {
  std::uint64_t bytes = 0;
  HostBound bound = HostBound::configured;  // which term was the smallest
};

// A CPU job's host memory: KV cache on the host + activations (anonymous memory); the mmap'd weights (clean file
// pages) are per model, counted once.
struct HostJobEstimate {
  std::string model;
  std::uint64_t mapped_weights_bytes = 0;
  std::uint64_t kv_bytes = 0;
  std::uint64_t activation_bytes = 0;
  std::uint64_t job_bytes() const;  // kv + activations, saturating

  friend bool operator==(const HostJobEstimate&, const HostJobEstimate&) = default;
};

HostJobEstimate estimate_host_job(const ModelShape& m, const RequestShape& r, const EstimatorConfig& est,
                                  const HostGuardConfig& cfg);
// The host side of a hybrid (offload) split with the first `gpu_layers` layers on the GPU: the weights of layers
// gpu_layers..L plus the final norm and lm_head (mapped), those layers' KV, and f32 activations with the logits.
HostJobEstimate estimate_host_hybrid(const ModelShape& m, const RequestShape& r, std::uint32_t gpu_layers,
                                     const EstimatorConfig& est, const HostGuardConfig& cfg);

enum class HostFit { fits, wait, never };
std::string_view host_fit_name(HostFit f) noexcept;

struct HostCheck {
  HostFit fit = HostFit::never;
  std::uint64_t need_bytes = 0;       // job + its model's mapping if not yet counted
  std::uint64_t committed_bytes = 0;  // already counted before this job
  HostBudget budget;
};

class HostMemoryGuard {
 public:
  explicit HostMemoryGuard(HostGuardConfig cfg = {}) : cfg_(cfg) {}

  // budget = min(configured (if not 0), cgroup.max − cgroup.current + ours, MemAvailable − reserve + ours_anon),
  // where `ours` is what our admitted jobs have materialized (already inside the observed numbers, so added back
  // once): KV/activations and mapped weights for the cgroup term (memory.current charges page cache), only the
  // anonymous KV/activations for MemAvailable (clean mapped pages are already counted as available there).
  // No term at all: 0 (HostBound::no_reading).
  HostBudget budget(const HostReading& r) const;
  // fits: committed + need ≤ budget. wait: it would fit once the other CPU jobs finish. never: it cannot fit.
  HostCheck check(const HostJobEstimate& e, const HostReading& r) const;

  // Count the job (and its model's mapping, once: the largest mapping any of its jobs asked for). Errc::host_memory
  // unless check() says fits (or if a total would overflow). Idempotent per job.
  Result<HostCheck> admit(JobId job, const HostJobEstimate& e, const HostReading& r);
  // The job's memory is now in the observed numbers. Errc::not_found if it was never admitted; idempotent.
  Status materialize(JobId job);
  // Drop the job; the model mapping is dropped with its last job. Returns false if unknown.
  bool release(JobId job);

  std::uint64_t committed_bytes() const { return committed_; }
  std::uint64_t materialized_bytes() const { return materialized_; }            // anonymous + mapped
  std::uint64_t materialized_anon_bytes() const { return materialized_anon_; }  // KV + activations only
  std::size_t jobs() const { return jobs_.size(); }

 private:
  struct Entry {
    std::string model;
    std::uint64_t bytes = 0;
    bool materialized = false;
  };
  struct Mapping {
    std::uint64_t bytes = 0;
    std::uint32_t jobs = 0;
    std::uint32_t materialized_jobs = 0;
  };

  HostGuardConfig cfg_;
  std::unordered_map<JobId, Entry> jobs_;
  std::unordered_map<std::string, Mapping> models_;
  std::uint64_t committed_ = 0;
  std::uint64_t materialized_ = 0;
  std::uint64_t materialized_anon_ = 0;
};

}  // namespace tandem::policy
