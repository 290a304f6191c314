#include "policy/breaker.h"

#include <algorithm>
#include <cmath>

#include "policy/format.h"

namespace tandem::policy {

std::string_view breaker_state_name(BreakerState s) noexcept {
  switch (s) {
    case BreakerState::closed: return "closed";
    case BreakerState::open: return "open";
    case BreakerState::half_open: return "half_open";
  }
  return "open";
}

std::string_view breaker_event_name(BreakerEvent e) noexcept {
  switch (e) {
    case BreakerEvent::alloc_failure: return "alloc_failure";
    case BreakerEvent::driver_reset: return "driver_reset";
    case BreakerEvent::probe_failed: return "probe_failed";
    case BreakerEvent::probe_succeeded: return "probe_succeeded";
    case BreakerEvent::job_succeeded: return "job_succeeded";
  }
  return "alloc_failure";
}

void CircuitBreaker::prune(Clock::time_point now) {
  auto old = [&](std::deque<Clock::time_point>& q) {
    while (!q.empty() && now - q.front() >= cfg_.window) q.pop_front();
  };
  old(alloc_failures_);
  old(probe_failures_);
}

void CircuitBreaker::go(BreakerState to, std::string reason, Clock::time_point now) {
  BreakerTransition t{state_, to, std::move(reason), now};
  if (history_.size() >= kHistoryLimit) history_.erase(history_.begin(), history_.begin() + kHistoryLimit / 2);
  history_.push_back(t);
  if (pending_.size() >= kHistoryLimit * 4) pending_.erase(pending_.begin(), pending_.begin() + kHistoryLimit);
  pending_.push_back(std::move(t));
  state_ = to;
}

void CircuitBreaker::open(std::string reason, Clock::time_point now, bool backoff) {
  if (backoff) {
    auto next = std::chrono::duration<double, std::nano>(cooldown_) * cfg_.backoff_factor;
    cooldown_ = next >= std::chrono::duration<double, std::nano>(cfg_.max_cooldown)
                    ? cfg_.max_cooldown
                    : std::chrono::duration_cast<Clock::duration>(next);
  }
  opened_at_ = now;
  probe_.reset();
  alloc_failures_.clear();
  probe_failures_.clear();
  go(BreakerState::open, std::move(reason) + "; cooldown " + format_duration(cooldown_), now);
}

BreakerState CircuitBreaker::record(BreakerEvent e, Clock::time_point now, ProbeId probe) {
  poll(now);
  prune(now);
  if (e == BreakerEvent::probe_failed || e == BreakerEvent::probe_succeeded) {
    // Half-open: only THE probe's result counts. Closed: a stale half-open probe's result is ignored (routine
    // health checks carry kNoProbe). Open: probe results carry no information the cooldown does not already hold.
    const bool the_probe = probe_ && probe == *probe_;
    const bool counts = state_ == BreakerState::half_open ? the_probe
                        : state_ == BreakerState::closed  ? probe == kNoProbe
                                                          : false;
    if (!counts) {
      if (probe != kNoProbe || state_ == BreakerState::half_open) ++ignored_probe_results_;
      return state_;
    }
  }
  switch (e) {
    case BreakerEvent::driver_reset:
      if (state_ == BreakerState::open) {
        opened_at_ = now;  // restart the cooldown: the device is not back yet
      } else {
        open("driver_reset", now, state_ == BreakerState::half_open);
      }
      break;
    case BreakerEvent::alloc_failure:
      if (state_ == BreakerState::half_open) {
        open("alloc_failure in half_open", now, true);
      } else if (state_ == BreakerState::closed) {
        alloc_failures_.push_back(now);
        if (alloc_failures_.size() >= cfg_.alloc_failure_threshold) {
          open("alloc_failures: " + std::to_string(alloc_failures_.size()) + " in " + format_duration(cfg_.window),
               now, false);
        }
      }
      break;
    case BreakerEvent::probe_failed:
      if (state_ == BreakerState::half_open) {
        open("probe_failed in half_open", now, true);
      } else if (state_ == BreakerState::closed) {
        probe_failures_.push_back(now);
        if (probe_failures_.size() >= cfg_.probe_failure_threshold) {
          open("probe_failures: " + std::to_string(probe_failures_.size()) + " in " + format_duration(cfg_.window),
               now, false);
        }
      }
      break;
    case BreakerEvent::probe_succeeded:
      if (state_ == BreakerState::half_open) {
        probe_.reset();
        cooldown_ = cfg_.cooldown;
        go(BreakerState::closed, "probe_succeeded", now);
      }
      break;
    case BreakerEvent::job_succeeded:
      break;
  }
  return state_;
}

BreakerState CircuitBreaker::poll(Clock::time_point now) {
  if (state_ == BreakerState::open && now - opened_at_ >= cooldown_) {
    probe_.reset();
    go(BreakerState::half_open, "cooldown_elapsed", now);
  }
  return state_;
}

std::optional<ProbeId> CircuitBreaker::try_acquire_probe(Clock::time_point now) {
  poll(now);
  if (state_ != BreakerState::half_open || probe_) return std::nullopt;
  probe_ = ++last_probe_;
  return probe_;
}

void CircuitBreaker::reset(Clock::time_point now, std::string reason) {
  alloc_failures_.clear();
  probe_failures_.clear();
  cooldown_ = cfg_.cooldown;
  probe_.reset();
  if (state_ != BreakerState::closed) go(BreakerState::closed, std::move(reason), now);
}

Clock::duration CircuitBreaker::retry_in(Clock::time_point now) const {
  if (state_ != BreakerState::open) return Clock::duration::zero();
  auto elapsed = now - opened_at_;
  return elapsed >= cooldown_ ? Clock::duration::zero() : cooldown_ - elapsed;
}

std::vector<BreakerTransition> CircuitBreaker::drain_transitions() {
  std::vector<BreakerTransition> out;
  out.swap(pending_);
  return out;
}

}  // namespace tandem::policy
