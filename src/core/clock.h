// Time is injected: policy code never reads a clock itself, it is handed `Clock::time_point`s.
#pragma once

#include <chrono>

namespace tandem {

class Clock {
 public:
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<std::chrono::steady_clock, duration>;

  virtual ~Clock() = default;
  virtual time_point now() const = 0;
};

class SteadyClock final : public Clock {
 public:
  time_point now() const override { return std::chrono::steady_clock::now(); }
};

// For tests: time moves only when told to.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(time_point start = time_point{}) : now_(start) {}
  time_point now() const override { return now_; }
  void advance(duration d) { now_ += d; }
  void set(time_point t) { now_ = t; }

 private:
  time_point now_;
};

}  // namespace tandem
