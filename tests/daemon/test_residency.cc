// Residency (src/daemon/residency.cc): the GPU replicas' lifecycle as the service drives it — evict, drain, preempt
// after the drain time, free, restore (also while a free is under way), explicit loads, counters and typed errors.
#include "daemon/residency.h"

#include <set>

#include <gtest/gtest.h>

namespace tandem::daemon {
namespace {

using namespace std::chrono_literals;

Clock::time_point at(int ms) { return Clock::time_point{} + std::chrono::milliseconds(ms); }

struct Fixture : ::testing::Test {
  Residency r{ResidencyConfig{5s}};
  std::set<std::string> busy;
  Residency::DrainStep drain(int ms) {
    return r.drain([&](const std::string& m) { return busy.count(m) != 0; }, at(ms));
  }
  ReplicaState state(const std::string& m) { return r.find(m)->state; }
  void SetUp() override {
    r.add("chat", at(0));
    r.add("clip", at(0));
  }
};

TEST(ReplicaStateNames, RoundTripAndReasons) {
  for (auto s : {ReplicaState::loaded, ReplicaState::unloaded, ReplicaState::draining, ReplicaState::evicted,
                 ReplicaState::loading, ReplicaState::lost, ReplicaState::failed})
    EXPECT_EQ(parse_replica_state(replica_state_name(s)), s);
  EXPECT_FALSE(parse_replica_state("resident"));
  EXPECT_EQ(evict_reason_name(EvictReason::hold), "hold");
  EXPECT_EQ(evict_reason_name(EvictReason::pressure), "pressure");
  EXPECT_EQ(evict_reason_name(EvictReason::idle), "idle");
  EXPECT_EQ(evict_reason_name(EvictReason::request), "request");
  EXPECT_EQ(evict_reason_name(EvictReason::none), "");
}

TEST_F(Fixture, UntrackedModelsAreTheBackendsToAnswer) {
  EXPECT_TRUE(r.usable("cpu-only"));
  EXPECT_FALSE(r.given_back("cpu-only"));
  EXPECT_EQ(r.evict("cpu-only", EvictReason::request, at(0)).error().code, Errc::not_found);
  EXPECT_EQ(r.restore("cpu-only", at(0)).error().code, Errc::not_found);
}

TEST_F(Fixture, IdleReplicaIsFreedAtOnceAndRestored) {
  EXPECT_EQ(r.evict_all(EvictReason::hold, at(10)), (std::vector<std::string>{"chat", "clip"}));
  EXPECT_FALSE(r.usable("chat"));
  EXPECT_TRUE(r.any_given_back());
  auto step = drain(10);
  EXPECT_EQ(step.free, (std::vector<std::string>{"chat", "clip"}));
  EXPECT_TRUE(step.preempt.empty());
  EXPECT_TRUE(drain(11).free.empty()) << "a free is handed out once";
  EXPECT_FALSE(r.freed("chat", 100, at(30)));
  EXPECT_FALSE(r.freed("clip", 20, at(40)));
  EXPECT_EQ(state("chat"), ReplicaState::evicted);
  EXPECT_EQ(r.find("chat")->reason, EvictReason::hold);
  EXPECT_EQ(r.find("chat")->given_back_bytes, 100u);
  EXPECT_EQ(r.find("chat")->last_free, 20ms);
  EXPECT_EQ(r.counters().evictions, 2u);
  EXPECT_EQ(r.counters().bytes_given_back, 120u);

  auto back = r.restore_all(EvictReason::hold, at(100));
  EXPECT_EQ(back.load, (std::vector<std::string>{"chat", "clip"}));
  EXPECT_TRUE(back.kept.empty());
  EXPECT_EQ(state("chat"), ReplicaState::loading);
  EXPECT_FALSE(r.usable("chat"));
  r.loaded("chat", {}, 250ms, at(350));
  r.loaded("clip", fail(Errc::out_of_memory, "no room"), 10ms, at(110));
  EXPECT_EQ(state("chat"), ReplicaState::loaded);
  EXPECT_TRUE(r.usable("chat"));
  EXPECT_EQ(r.find("chat")->reason, EvictReason::none);
  EXPECT_EQ(r.find("chat")->last_load, 250ms);
  EXPECT_EQ(state("clip"), ReplicaState::failed);
  EXPECT_EQ(r.find("clip")->error, "no room");
  EXPECT_EQ(r.counters().restores, 1u);
  EXPECT_EQ(r.counters().restore_failures, 1u);
  // A failed restore can be asked again.
  EXPECT_EQ(r.restore("clip", at(200)).value(), true);
  EXPECT_EQ(state("clip"), ReplicaState::loading);
}

TEST_F(Fixture, BusyReplicaDrainsThenPreemptsOnceAfterTheDrainTime) {
  busy = {"chat"};
  ASSERT_TRUE(r.evict("chat", EvictReason::hold, at(0)));
  EXPECT_TRUE(drain(4999).free.empty());
  EXPECT_TRUE(drain(4999).preempt.empty());
  auto step = drain(5000);
  EXPECT_EQ(step.preempt, (std::vector<std::string>{"chat"}));
  EXPECT_TRUE(drain(6000).preempt.empty()) << "preempted once";
  EXPECT_EQ(r.counters().preemptions, 1u);
  busy.clear();  // the moved jobs left the GPU
  EXPECT_EQ(drain(6100).free, (std::vector<std::string>{"chat"}));
  r.freed("chat", 7, at(6200));
  EXPECT_EQ(r.find("chat")->last_free, 6200ms);
}

TEST_F(Fixture, ReleaseBeforeTheFreeKeepsTheReplica) {
  busy = {"chat"};
  ASSERT_TRUE(r.evict("chat", EvictReason::hold, at(0)));
  auto back = r.restore_all(EvictReason::hold, at(100));
  EXPECT_EQ(back.kept, (std::vector<std::string>{"chat"}));
  EXPECT_TRUE(back.load.empty());
  EXPECT_TRUE(r.usable("chat"));
  EXPECT_EQ(r.counters().evictions, 0u);
}

TEST_F(Fixture, RestoreDuringTheFreeLoadsRightAfter) {
  ASSERT_TRUE(r.evict("chat", EvictReason::hold, at(0)));
  ASSERT_EQ(drain(0).free.size(), 1u);
  auto back = r.restore_all(EvictReason::none, at(1));
  EXPECT_TRUE(back.kept.empty());
  EXPECT_TRUE(back.load.empty());
  EXPECT_TRUE(r.freed("chat", 10, at(2))) << "the caller loads it now";
  EXPECT_EQ(state("chat"), ReplicaState::loading);
  EXPECT_EQ(r.counters().evictions, 1u);
}

TEST_F(Fixture, RestoreByReasonLeavesOthersOut) {
  ASSERT_TRUE(r.evict("chat", EvictReason::hold, at(0)));
  ASSERT_TRUE(r.evict("clip", EvictReason::request, at(0)));
  drain(0);
  r.freed("chat", 1, at(1));
  r.freed("clip", 1, at(1));
  auto back = r.restore_all(EvictReason::hold, at(2));
  EXPECT_EQ(back.load, (std::vector<std::string>{"chat"}));
  EXPECT_EQ(state("clip"), ReplicaState::evicted) << "unloaded on request: stays out after the hold";
}

// Transitions the lifecycle refuses, with the state they name.
TEST_F(Fixture, IllegalTransitionsAreTyped) {
  struct Case {
    const char* what;
    std::function<Status()> call;
    const char* names;
  };
  ASSERT_TRUE(r.evict("chat", EvictReason::hold, at(0)));
  const std::vector<Case> cases = {
      {"evict a draining replica", [&] { return r.evict("chat", EvictReason::request, at(1)); }, "draining"},
      {"restore a loaded replica", [&]() -> Status {
         auto x = r.restore("clip", at(1));
         if (!x) return fail(std::move(x).error());
         return {};
       }, "loaded"},
  };
  for (const auto& c : cases) {
    auto st = c.call();
    ASSERT_FALSE(st) << c.what;
    EXPECT_EQ(st.error().code, Errc::illegal_transition) << c.what;
    EXPECT_NE(st.error().message.find(c.names), std::string::npos) << c.what << ": " << st.error().message;
  }
  drain(0);
  r.freed("chat", 1, at(1));
  ASSERT_TRUE(r.restore("chat", at(2)).value());
  auto again = r.restore("chat", at(3));
  ASSERT_FALSE(again);
  EXPECT_NE(again.error().message.find("loading"), std::string::npos);
  // Events for a replica not in the state they answer are ignored.
  EXPECT_FALSE(r.freed("clip", 5, at(4)));
  r.loaded("clip", {}, 1ms, at(4));
  EXPECT_EQ(state("clip"), ReplicaState::loaded);
  EXPECT_EQ(r.counters().restores, 0u);
}

// keep_alive: never by default; 0 = as soon as no GPU run is on it; N = after N without a run (from the last use).
TEST_F(Fixture, KeepAliveGivesIdleReplicasBack) {
  auto idle = [&](int ms) { return r.evict_idle([&](const std::string& m) { return busy.count(m) != 0; }, at(ms)); };
  EXPECT_TRUE(idle(3'600'000).empty()) << "no keep_alive: for ever";
  r.set_keep_alive("chat", 10s);
  r.set_keep_alive("clip", 0s);
  r.used("chat", at(1000));
  busy = {"clip"};
  EXPECT_TRUE(idle(1000).empty()) << "clip runs a job; chat was just used";
  busy.clear();
  EXPECT_EQ(idle(1001), (std::vector<std::string>{"clip"}));
  EXPECT_EQ(r.find("clip")->reason, EvictReason::idle);
  EXPECT_TRUE(idle(10'999).empty());
  EXPECT_EQ(idle(11'000), (std::vector<std::string>{"chat"}));
  // Back after a restore, its idle time counts from the load.
  drain(11'000);
  r.freed("chat", 1, at(11'001));
  ASSERT_TRUE(r.restore("chat", at(20'000)).value());
  r.loaded("chat", {}, 5ms, at(20'005));
  EXPECT_TRUE(idle(30'004).empty());
  EXPECT_EQ(idle(30'005), (std::vector<std::string>{"chat"}));
}

// A hold that comes while a replica loads gives it back once loaded; a release before that withdraws it; a hold
// during a free whose restore was pending keeps it given back.
TEST_F(Fixture, HoldsDuringLoadsAndFreesWin) {
  ASSERT_TRUE(r.evict("chat", EvictReason::hold, at(0)));
  drain(0);
  r.freed("chat", 1, at(1));
  ASSERT_EQ(r.restore_all(EvictReason::hold, at(2)).load, (std::vector<std::string>{"chat"}));
  EXPECT_TRUE(r.evict_all(EvictReason::hold, at(3)) == (std::vector<std::string>{"clip"})) << "chat is loading";
  EXPECT_TRUE(r.loaded("chat", {}, 100ms, at(100))) << "loaded, then given back at once";
  EXPECT_EQ(state("chat"), ReplicaState::draining);
  EXPECT_EQ(r.find("chat")->reason, EvictReason::hold);
  // A release during the next load withdraws the pending eviction.
  drain(100);
  r.freed("chat", 1, at(101));
  r.freed("clip", 1, at(101));
  r.restore_all(EvictReason::hold, at(102));
  r.evict_all(EvictReason::hold, at(103));
  r.restore_all(EvictReason::hold, at(104));
  EXPECT_FALSE(r.loaded("chat", {}, 100ms, at(200)));
  EXPECT_EQ(state("chat"), ReplicaState::loaded);
  // A release during a free, then a hold again before the free ends: it stays given back.
  ASSERT_TRUE(r.evict("chat", EvictReason::hold, at(300)));
  ASSERT_EQ(drain(300).free.size(), 1u);
  r.restore_all(EvictReason::hold, at(301));
  EXPECT_TRUE(r.find("chat")->restore_pending);
  r.evict_all(EvictReason::hold, at(302));
  EXPECT_FALSE(r.freed("chat", 1, at(303))) << "no load after the free";
  EXPECT_EQ(state("chat"), ReplicaState::evicted);
}

TEST_F(Fixture, AFailedLoadAtStartIsFailedAndAFailedLoadKeepsTheLastGoodTime) {
  Residency fresh;
  fresh.add("chat", at(0), /*loaded=*/false);
  EXPECT_EQ(fresh.find("chat")->state, ReplicaState::failed);
  EXPECT_TRUE(fresh.usable("chat")) << "failed: the backend's answer decides";
  EXPECT_TRUE(fresh.restore("chat", at(1)).value()) << "LoadModel retries it";
  fresh.loaded("chat", {}, 300ms, at(301));
  ASSERT_TRUE(fresh.evict("chat", EvictReason::request, at(400)));
  fresh.drain([](const std::string&) { return false; }, at(400));
  fresh.freed("chat", 1, at(401));
  ASSERT_TRUE(fresh.restore("chat", at(500)).value());
  fresh.loaded("chat", fail(Errc::out_of_memory, "no room"), 2ms, at(502));
  EXPECT_EQ(fresh.find("chat")->last_load, 300ms) << "a fast failure is not a load time";
}

// Gives `m` back for `why` at `ms`: drained and freed at once (no job on it, no restore asked).
void give_back(Residency& r, const std::string& m, EvictReason why, int ms) {
  ASSERT_TRUE(r.evict(m, why, at(ms)));
  EXPECT_FALSE(r.freed(m, 100, at(ms)));
}

// Foreign pressure: at most max_pressure_evictions_per_minute begin in any minute (other reasons do not count).
TEST(ResidencyPressure, TheCapCountsPressureEvictionsOverASlidingMinute) {
  ResidencyConfig cfg{5s};
  cfg.max_pressure_evictions_per_minute = 2;
  Residency r(cfg);
  for (const char* m : {"a", "b", "c", "d"}) r.add(m, at(0));
  EXPECT_EQ(r.pressure_budget(at(0)), 2u);
  ASSERT_TRUE(r.evict("a", EvictReason::pressure, at(1000)));
  ASSERT_TRUE(r.evict("b", EvictReason::idle, at(2000)));
  EXPECT_EQ(r.pressure_budget(at(2000)), 1u) << "an idle eviction is not capped";
  ASSERT_TRUE(r.evict("c", EvictReason::pressure, at(30000)));
  EXPECT_EQ(r.pressure_budget(at(30000)), 0u);
  EXPECT_EQ(r.pressure_budget(at(60999)), 0u);
  EXPECT_EQ(r.pressure_budget(at(61000)), 1u) << "the first left the window";
  EXPECT_EQ(r.pressure_budget(at(90000)), 2u);
  EXPECT_EQ(r.counters().pressure_evictions, 2u);
  cfg.max_pressure_evictions_per_minute = 0;
  Residency never(cfg);
  EXPECT_EQ(never.pressure_budget(at(0)), 0u);
}

// A replica given back for pressure comes back once there was room for it for recover_after without a break: the
// highest priority first, then the most recently used, as many as fit together; hold/idle/request ones stay out.
TEST(ResidencyPressure, RecoverWaitsForAnUnbrokenCalmThenLoadsWhatFits) {
  ResidencyConfig cfg{0s};
  cfg.recover_after = 10s;
  Residency r(cfg);
  for (const char* m : {"a", "b", "c", "held"}) r.add(m, at(0));
  r.used("a", at(100));
  r.used("b", at(200));
  r.set_priority("c", 5);
  for (const char* m : {"a", "b", "c"}) {
    give_back(r, m, EvictReason::pressure, 1000);
  }
  give_back(r, "held", EvictReason::hold, 1000);
  ASSERT_EQ(r.find("a")->state, ReplicaState::evicted);
  std::size_t room_for = 0;  // how many replicas the device takes together
  std::vector<std::vector<std::string>> asked;
  auto room = [&](const std::vector<std::string>& ms) {
    asked.push_back(ms);
    return ms.size() <= room_for;
  };
  EXPECT_TRUE(r.recover(room, at(2000)).empty()) << "no room";
  room_for = 2;
  EXPECT_TRUE(r.recover(room, at(3000)).empty()) << "the calm begins";
  EXPECT_TRUE(r.recover(room, at(12999)).empty());
  room_for = 0;
  EXPECT_TRUE(r.recover(room, at(13000)).empty()) << "a break";
  room_for = 2;
  EXPECT_TRUE(r.recover(room, at(14000)).empty()) << "the calm begins again";
  EXPECT_TRUE(r.recover(room, at(23999)).empty());
  asked.clear();
  const auto load = r.recover(room, at(24000));
  EXPECT_EQ(load, (std::vector<std::string>{"c", "b"})) << "priority, then the most recently used; two fit";
  EXPECT_EQ(r.find("c")->state, ReplicaState::loading);
  EXPECT_EQ(r.find("a")->state, ReplicaState::evicted);
  EXPECT_EQ(r.find("held")->state, ReplicaState::evicted) << "a held replica comes back with the hold's release";
  EXPECT_TRUE(r.recover(room, at(24001)).empty()) << "the wait starts again";
  EXPECT_TRUE(r.loaded("c", {}, 5ms, at(25000)) == false);
  EXPECT_EQ(r.find("c")->state, ReplicaState::loaded);
  EXPECT_EQ(r.find("c")->reason, EvictReason::none);
  EXPECT_EQ(r.recover(room, at(34001)), (std::vector<std::string>{"a"}));
}

// A replica given back for pressure whose load fails (the other program took the memory back meanwhile) stays given
// back for pressure and is tried again after another unbroken recover_after; a replica given back for another reason
// whose load fails is failed (LoadModel retries it).
TEST(ResidencyPressure, AFailedRestoreAfterPressureIsTriedAgainAfterTheCalm) {
  ResidencyConfig cfg{0s};
  cfg.recover_after = 10s;
  Residency r(cfg);
  r.add("a", at(0));
  r.add("b", at(0));
  give_back(r, "a", EvictReason::pressure, 0);
  give_back(r, "b", EvictReason::request, 0);
  auto room = [](const std::vector<std::string>&) { return true; };
  EXPECT_TRUE(r.recover(room, at(1000)).empty());
  ASSERT_EQ(r.recover(room, at(11000)), (std::vector<std::string>{"a"}));
  EXPECT_FALSE(r.loaded("a", fail(Errc::out_of_memory, "no room"), 1s, at(12000)));
  EXPECT_EQ(r.find("a")->state, ReplicaState::evicted);
  EXPECT_EQ(r.find("a")->reason, EvictReason::pressure);
  EXPECT_EQ(r.find("a")->error, "no room");
  EXPECT_EQ(r.counters().restore_failures, 1u);
  EXPECT_TRUE(r.recover(room, at(13000)).empty()) << "the calm starts again";
  EXPECT_TRUE(r.recover(room, at(22999)).empty());
  EXPECT_EQ(r.recover(room, at(23000)), (std::vector<std::string>{"a"}));
  EXPECT_FALSE(r.loaded("a", {}, 1s, at(24000)));
  EXPECT_EQ(r.find("a")->state, ReplicaState::loaded);
  EXPECT_EQ(r.counters().load_ms_total, 1000u) << "only the load that succeeded counts";
  // A new pressure eviction restarts the calm of the others.
  give_back(r, "a", EvictReason::pressure, 30000);
  EXPECT_TRUE(r.recover(room, at(31000)).empty());
  r.add("c", at(0));
  give_back(r, "c", EvictReason::pressure, 39000);
  EXPECT_TRUE(r.recover(room, at(41000)).empty()) << "c's eviction restarted the wait begun at 31 s";
  EXPECT_EQ(r.recover(room, at(51000)), (std::vector<std::string>{"a", "c"})) << "a was used more recently (its load)";
  // Given back on request: a failed load is failed.
  ASSERT_TRUE(r.restore("b", at(60000)));
  EXPECT_FALSE(r.loaded("b", fail(Errc::out_of_memory, "no room"), 1s, at(61000)));
  EXPECT_EQ(r.find("b")->state, ReplicaState::failed);
}

// A replica given back for pressure whose keep_alive runs out while it is away is not loaded again when the room
// comes back: it would only be given back for idleness; it stays out as an idle one (a job wakes it).
TEST(ResidencyPressure, KeepAliveThatRanOutWhileAwayStaysOutAsIdle) {
  ResidencyConfig cfg{0s};
  cfg.recover_after = 10s;
  Residency r(cfg);
  r.add("short", at(0));
  r.add("forever", at(0));
  r.set_keep_alive("short", 60s);
  for (const char* m : {"short", "forever"}) {
    give_back(r, m, EvictReason::pressure, 1000);
  }
  auto room = [](const std::vector<std::string>&) { return true; };
  EXPECT_TRUE(r.recover(room, at(55000)).empty());
  EXPECT_EQ(r.recover(room, at(65000)), (std::vector<std::string>{"forever"}));
  EXPECT_EQ(r.find("short")->state, ReplicaState::evicted);
  EXPECT_EQ(r.find("short")->reason, EvictReason::idle);
}

}  // namespace
}  // namespace tandem::daemon
