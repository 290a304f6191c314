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

enum class HostBound { configured, cgroup, mem_available };
std::string_view host_bound_name(HostBound b) noexcept;

struct HostBudget {
  std::uint64_t bytes = 0;
  HostBound bound = HostBound::configured;  // which term was the smallest
};

// A CPU job's host memory: KV cache on the host + activations; the mmap'd weights are per model, counted once.
struct HostJobEstimate {
  std::string model;
  std::uint64_t mapped_weights_bytes = 0;
  std::uint64_t kv_bytes = 0;
  std::uint64_t activation_bytes = 0;
  std::uint64_t job_bytes() const { return kv_bytes + activation_bytes; }
};

HostJobEstimate estimate_host_job(const ModelShape& m, const RequestShape& r, const EstimatorConfig& est,
                                  const HostGuardConfig& cfg);

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

  // budget = min(configured, cgroup.max − cgroup.current + ours, MemAvailable − reserve + ours), where `ours` is
  // what our admitted CPU jobs have materialized (already inside the observed numbers, so added back once).
  HostBudget budget(const HostReading& r) const;
  // fits: committed + need ≤ budget. wait: it would fit once the other CPU jobs finish. never: it cannot fit.
  HostCheck check(const HostJobEstimate& e, const HostReading& r) const;

  // Count the job (and its model's mapping, once). Errc::host_memory unless check() says fits. Idempotent per job.
  Result<HostCheck> admit(JobId job, const HostJobEstimate& e, const HostReading& r);
  // The job's memory is now in the observed numbers. Errc::not_found if it was never admitted; idempotent.
  Status materialize(JobId job);
  // Drop the job; the model mapping is dropped with its last job. Returns false if unknown.
  bool release(JobId job);

  std::uint64_t committed_bytes() const { return committed_; }
  std::uint64_t materialized_bytes() const { return materialized_; }
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
};

}  // namespace tandem::policy
