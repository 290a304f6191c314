#include "policy/replica_mode.h"

#include "policy/format.h"

namespace tandem::policy {

std::string_view replica_mode_name(ReplicaMode m) noexcept {
  switch (m) {
    case ReplicaMode::on_demand: return "on-demand";
    case ReplicaMode::mmap: return "mmap";
    case ReplicaMode::warm: return "warm";
  }
  return "warm";
}

ReplicaModeDecision ReplicaModePolicy::decide(const ReplicaMeasurements& m, std::optional<ReplicaMode> current) const {
  const auto warm_up = m.warm_up_time;
  std::optional<Clock::duration> recovery[3];
  if (m.load_time && warm_up) recovery[0] = *m.load_time + *warm_up;
  if (m.page_in_time && warm_up) recovery[1] = *m.page_in_time + *warm_up;
  recovery[2] = Clock::duration::zero();
  const bool warm_fits_host = m.model_bytes <= m.host_budget_bytes;

  auto limit_for = [&](ReplicaMode mode) {
    // Moving to a cheaper mode than the current one needs a margin; staying or moving up does not.
    if (current && mode < *current) {
      auto scaled = std::chrono::duration<double, std::nano>(cfg_.recovery_budget) * (1.0 - cfg_.switch_margin);
      return std::chrono::duration_cast<Clock::duration>(scaled);
    }
    return cfg_.recovery_budget;
  };

  for (ReplicaMode mode : {ReplicaMode::on_demand, ReplicaMode::mmap}) {
    const auto& r = recovery[static_cast<int>(mode)];
    if (r && *r <= limit_for(mode)) {
      return {mode, std::string(replica_mode_name(mode)) + "_within_budget: " + format_duration(*r) + " <= " +
                        format_duration(limit_for(mode)),
              *r, true};
    }
  }
  if (warm_fits_host) {
    const bool measured = recovery[0] || recovery[1];
    return {ReplicaMode::warm,
            measured ? "warm_needed: cheaper modes exceed the budget of " + format_duration(cfg_.recovery_budget)
                     : std::string("unmeasured: warm until load and warm-up times are known"),
            Clock::duration::zero(), true};
  }
  // Warm does not fit in host memory: take the fastest measured alternative (mmap on a tie: it keeps the pages
  // mapped) and say the budget is not met.
  std::optional<ReplicaMode> fastest;
  if (recovery[1]) fastest = ReplicaMode::mmap;
  if (recovery[0] && (!recovery[1] || *recovery[0] < *recovery[1])) fastest = ReplicaMode::on_demand;
  if (fastest) {
    const Clock::duration r = *recovery[static_cast<int>(*fastest)];
    return {*fastest,
            "budget_unreachable: warm exceeds host budget; " + std::string(replica_mode_name(*fastest)) +
                " recovers in " + format_duration(r),
            r, false};
  }
  return {ReplicaMode::mmap, "budget_unreachable: warm exceeds host budget and nothing is measured yet",
          Clock::duration::zero(), false};
}

std::optional<ReplicaModeDecision> ReplicaModeTracker::update(const ReplicaMeasurements& m) {
  if (last_ && *last_ == m && current_) return std::nullopt;
  last_ = m;
  ReplicaModeDecision d = policy_.decide(m, current_ ? std::optional<ReplicaMode>(current_->mode) : std::nullopt);
  if (current_ && current_->mode == d.mode) {
    current_ = std::move(d);  // refresh figures and reason, no change to announce
    return std::nullopt;
  }
  current_ = d;
  return d;
}

}  // namespace tandem::policy
