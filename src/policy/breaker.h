// GPU circuit breaker: closed → open → half-open (one probe) → closed, or open again with exponential backoff.
// Time is passed in; every transition is recorded with its reason.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "core/clock.h"
#include "policy/config.h"

namespace tandem::policy {

enum class BreakerState { closed, open, half_open };
std::string_view breaker_state_name(BreakerState s) noexcept;

enum class BreakerEvent {
  alloc_failure,    // a device allocation was refused (counted in the window)
  driver_reset,     // the device was reset / lost: trips immediately
  probe_failed,     // a health probe failed (closed: counted in the window; half-open: reopen, if it is THE probe)
  probe_succeeded,  // a health probe passed (half-open: close, if it is THE probe)
  job_succeeded,    // informational; does not close an open breaker
};

// Identifies the half-open probe handed out by try_acquire_probe (a generation counter, never 0). Probe results
// carry it; kNoProbe marks a routine health check while closed.
using ProbeId = std::uint64_t;
inline constexpr ProbeId kNoProbe = 0;
std::string_view breaker_event_name(BreakerEvent e) noexcept;

struct BreakerTransition {
  BreakerState from = BreakerState::closed;
  BreakerState to = BreakerState::closed;
  std::string reason;  // machine-readable first word: "alloc_failures", "driver_reset", "cooldown_elapsed", ...
  Clock::time_point at{};

  friend bool operator==(const BreakerTransition&, const BreakerTransition&) = default;
};

class CircuitBreaker {
 public:
  explicit CircuitBreaker(BreakerConfig cfg = {}) : cfg_(cfg), cooldown_(cfg.cooldown) {}

  // Feed an event observed at `now`. Returns the state after it. In half-open, probe_succeeded / probe_failed count
  // only when `probe` is the id of the probe in flight; any other result (unsolicited, kNoProbe, or a stale probe
  // of an earlier half-open period) is ignored. While closed, a probe_failed with kNoProbe (routine health check)
  // counts in the window and one with a stale id is ignored.
  BreakerState record(BreakerEvent e, Clock::time_point now, ProbeId probe = kNoProbe);
  // Advance time: open → half-open once the cooldown has elapsed. Returns the state.
  BreakerState poll(Clock::time_point now);
  // In half-open, hands out the single probe slot: its id once, then nullopt until the breaker leaves half-open.
  // The probe's result comes back via record(..., id).
  std::optional<ProbeId> try_acquire_probe(Clock::time_point now);
  // Operator override: back to closed, window and backoff cleared.
  void reset(Clock::time_point now, std::string reason = "manual_reset");

  BreakerState state() const { return state_; }
  bool allows_gpu() const { return state_ == BreakerState::closed; }
  bool probe_in_flight() const { return probe_.has_value(); }
  std::optional<ProbeId> probe() const { return probe_; }
  std::uint64_t ignored_probe_results() const { return ignored_probe_results_; }  // stale / unsolicited results
  // Time until half-open (0 unless open).
  Clock::duration retry_in(Clock::time_point now) const;
  Clock::duration current_cooldown() const { return cooldown_; }
  std::uint32_t alloc_failures_in_window() const { return static_cast<std::uint32_t>(alloc_failures_.size()); }
  std::uint32_t probe_failures_in_window() const { return static_cast<std::uint32_t>(probe_failures_.size()); }

  // The most recent transitions (at most 256 kept).
  const std::vector<BreakerTransition>& history() const { return history_; }
  // New transitions since the last drain (for log lines / D-Bus signals); at most 1024 are kept undrained.
  std::vector<BreakerTransition> drain_transitions();

 private:
  void prune(Clock::time_point now);
  void go(BreakerState to, std::string reason, Clock::time_point now);
  void open(std::string reason, Clock::time_point now, bool backoff);

  BreakerConfig cfg_;
  BreakerState state_ = BreakerState::closed;
  Clock::duration cooldown_;
  Clock::time_point opened_at_{};
  std::optional<ProbeId> probe_;     // the probe in flight (half-open only)
  ProbeId last_probe_ = kNoProbe;    // generation counter
  std::uint64_t ignored_probe_results_ = 0;
  std::deque<Clock::time_point> alloc_failures_;
  std::deque<Clock::time_point> probe_failures_;
  static constexpr std::size_t kHistoryLimit = 256;
  std::vector<BreakerTransition> history_;  // the most recent transitions (bounded)
  std::vector<BreakerTransition> pending_;  // not yet drained (oldest dropped beyond 1024)
};

}  // namespace tandem::policy
