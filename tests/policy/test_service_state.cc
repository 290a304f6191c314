#include <gtest/gtest.h>

#include "fixtures.h"

namespace tandem::policy {
namespace {

using testing::at;
using L = ServiceLevel;

ServiceInputs in(Pressure p = Pressure::normal, BreakerState b = BreakerState::closed, bool cpu = true,
                 std::string fallback = "") {
  ServiceInputs i;
  i.pressure = p;
  i.breaker = b;
  i.cpu_available = cpu;
  i.fallback_model = std::move(fallback);
  i.limits = Limits{8192, 4096, 4096, 1024};
  return i;
}

TEST(ServiceState, DeriveTable) {
  struct Row {
    ServiceInputs inputs;
    L level;
    const char* reason;
  };
  ServiceInputs absent = in();
  absent.gpu_present = false;
  ServiceInputs held = in();
  held.gpu_held = true;
  ServiceInputs given_back = in(Pressure::elevated);
  given_back.gpu_given_back = true;
  ServiceInputs held_and_given_back = given_back;
  held_and_given_back.gpu_held = true;
  // Review gap: a reading too old to trust yields worst-case pressure; it is announced as a stale reading, not as
  // memory-critical.
  auto reading = [](Pressure p, ReadingTrust t) {
    ServiceInputs i = in(p);
    i.reading = t;
    return i;
  };
  const Row rows[] = {
      {in(), L::normal, ""},
      {reading(Pressure::critical, ReadingTrust::expired), L::pressure, "memory-reading-stale"},
      {reading(Pressure::normal, ReadingTrust::expired), L::pressure, "memory-reading-stale"},
      {reading(Pressure::critical, ReadingTrust::stale), L::pressure, "memory-reading-stale"},
      {reading(Pressure::normal, ReadingTrust::stale), L::normal, ""},
      {reading(Pressure::critical, ReadingTrust::fresh), L::pressure, "memory-critical"},
      {in(Pressure::elevated), L::pressure, "memory-pressure"},
      {in(Pressure::critical), L::pressure, "memory-critical"},
      {in(Pressure::normal, BreakerState::open), L::degraded, "gpu-breaker-open"},
      {in(Pressure::normal, BreakerState::half_open), L::degraded, "gpu-breaker-half-open"},
      {in(Pressure::normal, BreakerState::open, false), L::unavailable, "gpu-breaker-open"},
      {in(Pressure::critical, BreakerState::closed, true, "small-1b"), L::degraded, "fallback-model"},
      {absent, L::degraded, "gpu-absent"},
      {held, L::degraded, "gpu-held"},
      {given_back, L::degraded, "gpu-given-back"},
      {held_and_given_back, L::degraded, "gpu-held"},
  };
  for (const auto& r : rows) {
    ServiceStatus s = ServiceStateTracker::derive(r.inputs);
    EXPECT_EQ(s.level, r.level) << r.reason;
    EXPECT_EQ(s.reason, r.reason);
  }
}

// Worse states apply at once; better ones after 10 s of holding.
TEST(ServiceState, PerStepHysteresisTable) {
  struct Step {
    Clock::duration t;
    ServiceInputs inputs;
    L expect;
    std::size_t changes;  // drained after this step
  };
  const Step steps[] = {
      {0s, in(), L::normal, 1},                                     // limits first announced
      {1s, in(Pressure::elevated), L::pressure, 1},
      {2s, in(), L::pressure, 0},                                   // better: wait
      {5s, in(Pressure::elevated), L::pressure, 0},                 // back: timer reset
      {6s, in(), L::pressure, 0},
      {15s, in(), L::pressure, 0},                                  // 9 s
      {16s, in(), L::normal, 1},                                    // 10 s
      {17s, in(Pressure::normal, BreakerState::open), L::degraded, 1},
      {18s, in(Pressure::normal, BreakerState::open, false), L::unavailable, 1},
      {19s, in(Pressure::normal, BreakerState::half_open), L::unavailable, 0},
      {29s, in(Pressure::normal, BreakerState::half_open), L::degraded, 1},  // better, after 10 s
      {30s, in(), L::degraded, 0},
      {31s, in(Pressure::elevated), L::degraded, 0},                // still better than degraded: keeps timer
      {40s, in(Pressure::elevated), L::pressure, 1},                // 10 s since 30 s
  };
  ServiceStateTracker t(ServiceStateConfig{10s});
  int i = 0;
  for (const auto& s : steps) {
    EXPECT_EQ(t.update(s.inputs, at(s.t)).level, s.expect) << "step " << i;
    EXPECT_EQ(t.drain_changes().size(), s.changes) << "step " << i;
    ++i;
  }
}

TEST(ServiceState, ChangeFeedCarriesFromToReasonAndLimits) {
  ServiceStateTracker t(ServiceStateConfig{0s});
  t.update(in(Pressure::normal, BreakerState::open), at(1s));
  ServiceInputs tighter = in(Pressure::normal, BreakerState::open);
  tighter.limits.cpu_max_context = 2048;
  t.update(tighter, at(2s));  // same level, new limits: announced at once
  t.update(tighter, at(3s));  // nothing new
  auto changes = t.drain_changes();
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].from.level, L::normal);
  EXPECT_EQ(changes[0].to.reason, "gpu-breaker-open");
  EXPECT_EQ(changes[0].at, at(1s));
  EXPECT_EQ(changes[1].to.limits.cpu_max_context, 2048u);
  EXPECT_TRUE(t.drain_changes().empty());
}

TEST(ServiceState, FlappingInputsDoNotFlapTheState) {
  ServiceStateTracker t(ServiceStateConfig{10s});
  std::size_t changes = 0;
  for (int i = 0; i < 600; ++i) {  // breaker flips every second for 10 minutes
    t.update(in(Pressure::normal, i % 2 ? BreakerState::closed : BreakerState::open), at(std::chrono::seconds(i)));
    changes += t.drain_changes().size();
  }
  EXPECT_EQ(changes, 1u);  // degraded once, never back until the GPU holds for 10 s
  EXPECT_EQ(t.current().level, L::degraded);
  for (int i = 600; i < 611; ++i) t.update(in(), at(std::chrono::seconds(i)));
  EXPECT_EQ(t.current().level, L::normal);
  EXPECT_EQ(t.current().reason, "");
}

}  // namespace
}  // namespace tandem::policy
