#include <gtest/gtest.h>

#include "fixtures.h"

namespace tandem::policy {
namespace {

using testing::at;

BreakerConfig cfg() {
  BreakerConfig c;
  c.window = 60s;
  c.alloc_failure_threshold = 3;
  c.probe_failure_threshold = 2;
  c.cooldown = 10s;
  c.backoff_factor = 2.0;
  c.max_cooldown = 35s;
  return c;
}

// event: a result without a probe id (routine health check); probe_result: carries the id of the last probe handed
// out; stale_result: carries the id of the probe handed out before that one.
enum class Do { event, poll, probe, reset, probe_result, stale_result };

struct Step {
  Clock::duration t;
  Do what;
  BreakerEvent event;  // for Do::event
  BreakerState expect;
  bool probe_granted;  // for Do::probe
};

using E = BreakerEvent;
using S = BreakerState;

void run(const std::vector<Step>& steps, CircuitBreaker& b) {
  int i = 0;
  ManualClock clock;
  ProbeId last = kNoProbe, previous = kNoProbe;
  for (const auto& s : steps) {
    ASSERT_GE(at(s.t), clock.now()) << "table steps must move forward in time";
    clock.set(at(s.t));
    switch (s.what) {
      case Do::event: EXPECT_EQ(b.record(s.event, clock.now()), s.expect) << "step " << i; break;
      case Do::probe_result: EXPECT_EQ(b.record(s.event, clock.now(), last), s.expect) << "step " << i; break;
      case Do::stale_result: EXPECT_EQ(b.record(s.event, clock.now(), previous), s.expect) << "step " << i; break;
      case Do::poll: EXPECT_EQ(b.poll(clock.now()), s.expect) << "step " << i; break;
      case Do::probe: {
        std::optional<ProbeId> id = b.try_acquire_probe(clock.now());
        EXPECT_EQ(id.has_value(), s.probe_granted) << "step " << i;
        if (id) {
          EXPECT_NE(*id, kNoProbe);
          EXPECT_NE(*id, last) << "step " << i << ": every probe gets a new id";
          previous = last;
          last = *id;
        }
        EXPECT_EQ(b.state(), s.expect) << "step " << i;
        break;
      }
      case Do::reset:
        b.reset(clock.now());
        EXPECT_EQ(b.state(), s.expect) << "step " << i;
        break;
    }
    ++i;
  }
}

TEST(Breaker, AllocFailuresInWindowTripAndOldOnesExpire) {
  CircuitBreaker b(cfg());
  run({
          {0s, Do::event, E::alloc_failure, S::closed, false},
          {30s, Do::event, E::alloc_failure, S::closed, false},
          {61s, Do::event, E::alloc_failure, S::closed, false},  // the first one left the window
          {62s, Do::event, E::job_succeeded, S::closed, false},
          {70s, Do::event, E::alloc_failure, S::open, false},    // 30s, 61s, 70s
          {75s, Do::poll, E::alloc_failure, S::open, false},
          {79s, Do::probe, E::alloc_failure, S::open, false},    // cooldown not elapsed
          {80s, Do::poll, E::alloc_failure, S::half_open, false},
          {80s, Do::probe, E::alloc_failure, S::half_open, true},
          {81s, Do::probe, E::alloc_failure, S::half_open, false},  // only one probe
          {82s, Do::probe_result, E::probe_succeeded, S::closed, false},
      },
      b);
  ASSERT_EQ(b.history().size(), 3u);
  EXPECT_EQ(b.history()[0].to, S::open);
  EXPECT_EQ(b.history()[0].reason, "alloc_failures: 3 in 60s; cooldown 10s");
  EXPECT_EQ(b.history()[0].at, at(70s));
  EXPECT_EQ(b.history()[1].reason, "cooldown_elapsed");
  EXPECT_EQ(b.history()[2].reason, "probe_succeeded");
  EXPECT_EQ(b.current_cooldown(), 10s);
}

TEST(Breaker, DriverResetTripsImmediatelyAndFailedProbesBackOff) {
  CircuitBreaker b(cfg());
  run({
          {0s, Do::event, E::driver_reset, S::open, false},
          {10s, Do::probe, E::alloc_failure, S::half_open, true},
          {11s, Do::probe_result, E::probe_failed, S::open, false},  // cooldown 20s now
          {30s, Do::poll, E::alloc_failure, S::open, false},
          {31s, Do::poll, E::alloc_failure, S::half_open, false},
          {31s, Do::probe, E::alloc_failure, S::half_open, true},
          {32s, Do::event, E::alloc_failure, S::open, false},     // a failure in half-open reopens: 35s (capped)
          {66s, Do::poll, E::alloc_failure, S::open, false},
          {67s, Do::poll, E::alloc_failure, S::half_open, false},
          {67s, Do::probe, E::alloc_failure, S::half_open, true},
          {68s, Do::probe_result, E::probe_failed, S::open, false},  // stays at the 35s cap
          {103s, Do::probe, E::alloc_failure, S::half_open, true},
          {104s, Do::probe_result, E::probe_succeeded, S::closed, false},
      },
      b);
  EXPECT_EQ(b.current_cooldown(), 10s);  // a success resets the backoff
}

TEST(Breaker, ProbeFailuresWhileClosedTrip) {
  CircuitBreaker b(cfg());
  run({
          {0s, Do::event, E::probe_failed, S::closed, false},
          {5s, Do::event, E::probe_succeeded, S::closed, false},  // no effect while closed
          {6s, Do::event, E::probe_failed, S::open, false},
      },
      b);
  EXPECT_EQ(b.history().back().reason, "probe_failures: 2 in 60s; cooldown 10s");
}

TEST(Breaker, DriverResetWhileOpenRestartsTheCooldown) {
  CircuitBreaker b(cfg());
  run({
          {0s, Do::event, E::driver_reset, S::open, false},
          {8s, Do::event, E::driver_reset, S::open, false},
          {17s, Do::poll, E::alloc_failure, S::open, false},
          {18s, Do::poll, E::alloc_failure, S::half_open, false},
      },
      b);
  EXPECT_EQ(b.history().size(), 2u);  // the second reset is not a transition
}

TEST(Breaker, ManualResetClearsWindowAndBackoff) {
  CircuitBreaker b(cfg());
  run({
          {0s, Do::event, E::alloc_failure, S::closed, false},
          {1s, Do::event, E::alloc_failure, S::closed, false},
          {2s, Do::reset, E::alloc_failure, S::closed, false},   // already closed: window cleared, no transition
          {3s, Do::event, E::alloc_failure, S::closed, false},   // would have been the 3rd
          {4s, Do::event, E::driver_reset, S::open, false},
          {14s, Do::probe, E::alloc_failure, S::half_open, true},
          {15s, Do::probe_result, E::probe_failed, S::open, false},
          {16s, Do::reset, E::alloc_failure, S::closed, false},
      },
      b);
  EXPECT_EQ(b.current_cooldown(), 10s);
  EXPECT_EQ(b.history().back().reason, "manual_reset");
  EXPECT_EQ(b.alloc_failures_in_window(), 0u);
}

// Review #2: exactly one probe. In half-open only the result of the probe in flight (by id) closes or reopens the
// breaker; an unsolicited result or a stale probe from an earlier half-open period is ignored, and a stale result
// arriving once closed is not counted as a health-check failure either.
TEST(Breaker, OnlyTheProbeInFlightCounts) {
  CircuitBreaker b(cfg());
  run({
          {0s, Do::event, E::driver_reset, S::open, false},
          {10s, Do::poll, E::alloc_failure, S::half_open, false},
          {10s, Do::event, E::probe_succeeded, S::half_open, false},        // unsolicited: ignored
          {10s, Do::probe, E::alloc_failure, S::half_open, true},           // probe #1
          {11s, Do::event, E::probe_succeeded, S::half_open, false},        // no id: ignored
          {11s, Do::probe, E::alloc_failure, S::half_open, false},          // still one probe only
          {12s, Do::probe_result, E::probe_failed, S::open, false},         // #1 failed: reopen, cooldown 20s
          {32s, Do::poll, E::alloc_failure, S::half_open, false},
          {32s, Do::probe, E::alloc_failure, S::half_open, true},           // probe #2
          {33s, Do::stale_result, E::probe_succeeded, S::half_open, false}, // late #1: ignored
          {33s, Do::stale_result, E::probe_failed, S::half_open, false},    // late #1: ignored
          {34s, Do::probe_result, E::probe_succeeded, S::closed, false},    // #2 passed
          {34s, Do::probe_result, E::probe_failed, S::closed, false},       // #2 again, after closing: ignored
          {35s, Do::stale_result, E::probe_failed, S::closed, false},       // late #1 while closed: ignored
          {36s, Do::event, E::probe_failed, S::closed, false},              // a routine health check counts: 1 of 2
      },
      b);
  EXPECT_EQ(b.probe_failures_in_window(), 1u);
  EXPECT_EQ(b.ignored_probe_results(), 6u);
  EXPECT_FALSE(b.probe_in_flight());
  ASSERT_EQ(b.history().size(), 5u);  // open, half-open, open, half-open, closed
  EXPECT_EQ(b.history().back().reason, "probe_succeeded");
}

TEST(Breaker, RetryInAndAllowsGpu) {
  CircuitBreaker b(cfg());
  EXPECT_TRUE(b.allows_gpu());
  EXPECT_EQ(b.retry_in(at(0s)), 0s);
  b.record(E::driver_reset, at(100s));
  EXPECT_FALSE(b.allows_gpu());
  EXPECT_EQ(b.retry_in(at(104s)), 6s);
  EXPECT_EQ(b.retry_in(at(200s)), 0s);
  b.poll(at(110s));
  EXPECT_FALSE(b.allows_gpu());  // half-open: only the probe runs on the GPU
}

TEST(Breaker, DrainReturnsEachTransitionOnce) {
  CircuitBreaker b(cfg());
  b.record(E::driver_reset, at(0s));
  b.poll(at(10s));
  auto first = b.drain_transitions();
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].from, S::closed);
  EXPECT_EQ(first[1].to, S::half_open);
  EXPECT_TRUE(b.drain_transitions().empty());
  std::optional<ProbeId> probe = b.try_acquire_probe(at(11s));
  ASSERT_TRUE(probe.has_value());
  b.record(E::probe_succeeded, at(11s), *probe);
  EXPECT_EQ(b.drain_transitions().size(), 1u);
}

TEST(Breaker, HistoryIsBounded) {
  CircuitBreaker b(cfg());
  Clock::duration t = 0s;
  for (int i = 0; i < 1000; ++i) {
    b.record(E::driver_reset, at(t));
    b.reset(at(t + 1s));
    t += 2s;
  }
  EXPECT_LE(b.history().size(), 256u);
  EXPECT_EQ(b.history().back().reason, "manual_reset");
  auto drained = b.drain_transitions();  // 2000 transitions, never drained: the oldest were dropped
  EXPECT_LE(drained.size(), 1024u);
  EXPECT_GE(drained.size(), 768u);
  EXPECT_EQ(drained.back().reason, "manual_reset");
  EXPECT_EQ(drained.back().at, at(1999s));
}

}  // namespace
}  // namespace tandem::policy
