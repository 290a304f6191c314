#include "policy/service_state.h"

namespace tandem::policy {

std::string_view service_level_name(ServiceLevel l) noexcept {
  switch (l) {
    case ServiceLevel::normal: return "normal";
    case ServiceLevel::pressure: return "pressure";
    case ServiceLevel::degraded: return "degraded";
    case ServiceLevel::unavailable: return "unavailable";
  }
  return "unavailable";
}

ServiceStatus ServiceStateTracker::derive(const ServiceInputs& in) {
  ServiceStatus s;
  s.limits = in.limits;
  s.fallback_model = in.fallback_model;
  std::string gpu_down;
  if (!in.gpu_present) {
    gpu_down = "gpu-absent";
  } else if (in.breaker == BreakerState::open) {
    gpu_down = "gpu-breaker-open";
  } else if (in.breaker == BreakerState::half_open) {
    gpu_down = "gpu-breaker-half-open";
  } else if (in.gpu_held) {
    gpu_down = "gpu-held";
  } else if (in.gpu_given_back) {
    gpu_down = "gpu-given-back";  // their work runs on the CPU until the replicas come back
  }
  if (!gpu_down.empty()) {
    s.level = in.cpu_available ? ServiceLevel::degraded : ServiceLevel::unavailable;
    s.reason = gpu_down;
  } else if (!in.fallback_model.empty()) {
    s.level = ServiceLevel::degraded;
    s.reason = "fallback-model";
  } else if (in.reading == ReadingTrust::expired ||
             (in.reading == ReadingTrust::stale && in.pressure != Pressure::normal)) {
    // An expired reading counts as no free memory and a stale one is discounted: the pressure it yields says more
    // about the reading than about memory, so it is announced as such, not as memory-critical.
    s.level = ServiceLevel::pressure;
    s.reason = "memory-reading-stale";
  } else if (in.pressure == Pressure::critical) {
    s.level = ServiceLevel::pressure;
    s.reason = "memory-critical";
  } else if (in.pressure == Pressure::elevated) {
    s.level = ServiceLevel::pressure;
    s.reason = "memory-pressure";
  }
  return s;
}

void ServiceStateTracker::apply(ServiceStatus s, Clock::time_point now) {
  better_since_.reset();
  if (s == current_) return;
  pending_.push_back(ServiceChange{current_, s, now});
  current_ = std::move(s);
}

const ServiceStatus& ServiceStateTracker::update(const ServiceInputs& in, Clock::time_point now) {
  ServiceStatus want = derive(in);
  if (want.level >= current_.level) {
    apply(std::move(want), now);  // worse, or the same level with new details: announce at once
  } else {
    if (!better_since_) better_since_ = now;
    if (now - *better_since_ >= cfg_.recover_after) apply(std::move(want), now);
  }
  return current_;
}

std::vector<ServiceChange> ServiceStateTracker::drain_changes() {
  std::vector<ServiceChange> out;
  out.swap(pending_);
  return out;
}

}  // namespace tandem::policy
