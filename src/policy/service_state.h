// The service state clients see: normal / pressure / degraded / unavailable, a reason ("" when normal), the fallback
// model in use and the limits in force. Worse states are announced at once; better ones only after they have held
// for `recover_after` (no flapping). Changes are queued for the caller to drain (D-Bus signal, sd_notify, log).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/clock.h"
#include "policy/breaker.h"
#include "policy/config.h"
#include "policy/headroom.h"

namespace tandem::policy {

enum class ServiceLevel { normal, pressure, degraded, unavailable };  // in order of severity
std::string_view service_level_name(ServiceLevel l) noexcept;

struct Limits {
  std::uint32_t gpu_max_context = 0;
  std::uint32_t gpu_max_new_tokens = 0;
  std::uint32_t cpu_max_context = 0;
  std::uint32_t cpu_max_new_tokens = 0;

  friend bool operator==(const Limits&, const Limits&) = default;
};

struct ServiceInputs {
  Pressure pressure = Pressure::normal;
  BreakerState breaker = BreakerState::closed;
  bool gpu_present = true;
  bool gpu_held = false;          // an application holds the GPU (HoldGpu)
  bool cpu_available = true;      // a CPU replica or fallback model can serve
  std::string fallback_model;     // "" = none in use
  Limits limits;
  ReadingTrust reading = ReadingTrust::fresh;  // trust of the device reading `pressure` was derived from
  bool gpu_given_back = false;    // GPU replicas are out for others' memory use (foreign pressure)
};

struct ServiceStatus {
  ServiceLevel level = ServiceLevel::normal;
  std::string reason;             // "" when normal; otherwise a token such as "gpu-breaker-open"
  std::string fallback_model;
  Limits limits;

  friend bool operator==(const ServiceStatus&, const ServiceStatus&) = default;
};

struct ServiceChange {
  ServiceStatus from;
  ServiceStatus to;
  Clock::time_point at{};
};

class ServiceStateTracker {
 public:
  explicit ServiceStateTracker(ServiceStateConfig cfg = {}, ServiceStatus initial = {}) : cfg_(cfg), current_(std::move(initial)) {}

  // The state the inputs call for, without hysteresis.
  static ServiceStatus derive(const ServiceInputs& in);
  const ServiceStatus& update(const ServiceInputs& in, Clock::time_point now);
  const ServiceStatus& current() const { return current_; }
  // A better state is waiting out recover_after (it is announced at an update once that passed).
  bool improving() const { return better_since_.has_value(); }
  std::vector<ServiceChange> drain_changes();

 private:
  void apply(ServiceStatus s, Clock::time_point now);

  ServiceStateConfig cfg_;
  ServiceStatus current_;
  std::optional<Clock::time_point> better_since_;
  std::vector<ServiceChange> pending_;
};

}  // namespace tandem::policy
