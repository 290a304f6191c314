// Per model: keep the CPU replica `warm`, `mmap`'d or load it `on-demand`, whichever is cheapest in host memory
// while still meeting the recovery-time budget. See docs/policy.md §11.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/clock.h"
#include "policy/config.h"

namespace tandem::policy {

enum class ReplicaMode { on_demand, mmap, warm };  // cheapest first
std::string_view replica_mode_name(ReplicaMode m) noexcept;

struct ReplicaMeasurements {
  std::optional<Clock::duration> load_time;     // cold load from storage to a usable replica (on-demand)
  std::optional<Clock::duration> page_in_time;  // first request on a mapped, cold replica: faulting pages in (mmap)
  std::optional<Clock::duration> warm_up_time;  // first run's one-off cost (allocations, kernel selection)
  std::uint64_t model_bytes = 0;                // weights that warm mode keeps resident
  std::uint64_t host_budget_bytes = 0;          // host-memory guard budget; warm needs model_bytes ≤ this

  friend bool operator==(const ReplicaMeasurements&, const ReplicaMeasurements&) = default;
};

struct ReplicaModeDecision {
  ReplicaMode mode = ReplicaMode::warm;
  std::string reason;                   // e.g. "on_demand_within_budget", "unmeasured", "budget_unreachable"
  Clock::duration expected_recovery{};  // time from failover to the replica serving
  bool meets_budget = true;

  friend bool operator==(const ReplicaModeDecision&, const ReplicaModeDecision&) = default;
};

class ReplicaModePolicy {
 public:
  explicit ReplicaModePolicy(ReplicaModeConfig cfg = {}) : cfg_(cfg) {}
  // Recovery per mode: warm = 0; mmap = page_in + warm_up; on-demand = load + warm_up. An unmeasured term makes a
  // mode unproven. A mode cheaper than `current` must beat the budget by the switch margin (hysteresis).
  ReplicaModeDecision decide(const ReplicaMeasurements& m, std::optional<ReplicaMode> current = std::nullopt) const;

 private:
  ReplicaModeConfig cfg_;
};

// Holds the current choice and re-decides when measurements change.
class ReplicaModeTracker {
 public:
  explicit ReplicaModeTracker(ReplicaModeConfig cfg = {}) : policy_(cfg) {}
  // Returns the new decision if the mode changed (or on the first call), nullopt otherwise.
  std::optional<ReplicaModeDecision> update(const ReplicaMeasurements& m);
  const std::optional<ReplicaModeDecision>& current() const { return current_; }

 private:
  ReplicaModePolicy policy_;
  std::optional<ReplicaMeasurements> last_;
  std::optional<ReplicaModeDecision> current_;
};

}  // namespace tandem::policy
