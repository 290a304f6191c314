// The admission ladder's evict rung (docs/residency.md "Foreign pressure") and choose_evictions.
#include <gtest/gtest.h>

#include "admission_fixture.h"

namespace tandem::policy {
namespace {

using testing::AdmissionTest;
using testing::request;
constexpr std::uint64_t G = kGiB;

// Foreign pressure (docs/residency.md): the evict rung gives back idle replicas of other models — the lowest priority
// first, then the least recently used, only as many as the job is missing — rather than reduce, offload or send the
// job to the CPU; never past the cap on evictions per minute.
TEST_F(AdmissionTest, EvictRungGivesBackIdleReplicasLruFirst) {
  struct EvictRow {
    const char* what;
    std::function<void(const AdmissionTest&, AdmissionSnapshot&)> mutate;
    Rung action;
    Reason reason;
    std::vector<std::string> evict;
    std::vector<Reason> skipped;
  };
  using R = Reason;
  // Short by 1 GiB, nothing of ours frees it (foreign), two idle replicas of 2 GiB: "old" used at 5 s, "new" at 10 s.
  auto pressed = [](const AdmissionTest& t, AdmissionSnapshot& s) {
    s.gpu.headroom.headroom = t.need(s) - static_cast<std::int64_t>(G);
    s.gpu.evictable = {{"new", 2 * G, 0, testing::at(10s)}, {"old", 2 * G, 0, testing::at(5s)}};
  };
  const std::vector<EvictRow> rows = {
      {"short by 1 GiB: the least recently used replica", pressed, Rung::evict, R::evicting_idle, {"old"},
       {R::does_not_fit, R::wait_unknown}},
      {"short by 3 GiB: both, least recently used first",
       [&](auto& t, auto& s) { pressed(t, s); s.gpu.headroom.headroom -= static_cast<std::int64_t>(2 * G); },
       Rung::evict, R::evicting_idle, {"old", "new"}, {R::does_not_fit, R::wait_unknown}},
      {"a higher priority keeps the older replica",
       [&](auto& t, auto& s) { pressed(t, s); s.gpu.evictable[1].priority = 1; }, Rung::evict, R::evicting_idle,
       {"new"}, {R::does_not_fit, R::wait_unknown}},
      {"enough already on its way back: wait for it, evict nothing",
       [&](auto& t, auto& s) { pressed(t, s); s.gpu.evicting_bytes = G; }, Rung::evict, R::waiting_for_eviction, {},
       {R::does_not_fit, R::wait_unknown}},
      {"part on its way back: only the rest",
       [&](auto& t, auto& s) {
         pressed(t, s);
         s.gpu.headroom.headroom -= static_cast<std::int64_t>(2 * G);  // short by 3 GiB
         s.gpu.evicting_bytes = G + G / 2;
       },
       Rung::evict, R::evicting_idle, {"old"}, {R::does_not_fit, R::wait_unknown}},
      {"a running job of ours frees it soon: delay comes first",
       [&](auto& t, auto& s) { pressed(t, s); s.gpu.running = {{2 * G, 3s}}; }, Rung::delay, R::waiting_for_memory,
       {}, {R::does_not_fit}},
      {"the cap is reached: the ladder goes on (offload)",
       [&](auto& t, auto& s) { pressed(t, s); s.gpu.evict_budget = 0; }, Rung::offload, R::fits_offloaded, {},
       {R::does_not_fit, R::wait_unknown, R::eviction_capped, R::reduce_not_allowed}},
      {"two needed, one left under the cap",
       [&](auto& t, auto& s) {
         pressed(t, s);
         s.gpu.headroom.headroom -= static_cast<std::int64_t>(2 * G);
         s.gpu.evict_budget = 1;
       },
       Rung::route_cpu, R::routed_cpu, {},
       {R::does_not_fit, R::wait_unknown, R::eviction_capped, R::reduce_not_allowed, R::offload_insufficient}},
      {"idle replicas hold too little",
       [&](auto& t, auto& s) { pressed(t, s); s.gpu.headroom.headroom -= static_cast<std::int64_t>(4 * G); },
       Rung::route_cpu, R::routed_cpu, {},
       {R::does_not_fit, R::wait_unknown, R::eviction_insufficient, R::reduce_not_allowed, R::offload_insufficient}},
      {"behind other queued jobs: only the head evicts",
       [&](auto& t, auto& s) { pressed(t, s); s.gpu.jobs_ahead = 2; }, Rung::route_cpu, R::routed_cpu, {},
       {R::queued_ahead, R::wait_unknown, R::queued_ahead, R::reduce_not_allowed, R::queued_ahead}},
      {"its own replica is loading and the CPU is sooner: no eviction for it",
       [&](auto& t, auto& s) {
         pressed(t, s);
         s.gpu.replica_loading = 2s;
         s.gpu.gpu_run = 100ms;
         s.gpu.cpu_run = 800ms;
       },
       Rung::route_cpu, R::routed_cpu, {},
       {R::replica_loading, R::cpu_sooner, R::replica_loading, R::reduce_not_allowed, R::replica_loading}},
      {"waited past max_delay: no eviction any more",
       [&](auto& t, auto& s) { pressed(t, s); s.gpu.waited = 31s; }, Rung::offload, R::fits_offloaded, {},
       {R::does_not_fit, R::wait_too_long, R::wait_too_long, R::reduce_not_allowed}},
      {"breaker open: nothing starts on the GPU, nothing is given back for it",
       [&](auto& t, auto& s) { pressed(t, s); s.gpu.offload_supported = false; s.gpu.breaker_allows = false; },
       Rung::route_cpu, R::routed_cpu, {},
       {R::breaker_open, R::breaker_open, R::breaker_open, R::reduce_not_allowed, R::offload_unsupported}},
  };
  for (const auto& row : rows) {
    AdmissionSnapshot s = base();
    row.mutate(*this, s);
    Decision d = policy_.decide(s);
    EXPECT_EQ(d.action, row.action) << row.what << ": " << d.detail;
    EXPECT_EQ(d.reason, row.reason) << row.what << ": " << d.detail;
    EXPECT_EQ(d.evict, row.evict) << row.what << ": " << d.detail;
    std::vector<Reason> skipped;
    for (const auto& n : d.skipped) skipped.push_back(n.reason);
    EXPECT_EQ(skipped, row.skipped) << row.what << ": " << d.detail;
  }
  // A ladder without the rung never evicts.
  LadderConfig no_evict;
  no_evict.order = {Rung::admit, Rung::delay, Rung::offload, Rung::route_cpu, Rung::reject};
  AdmissionPolicy p(no_evict, EstimatorConfig{}, HostGuardConfig{32 * G, 1 * G, 4});
  AdmissionSnapshot s = base();
  pressed(*this, s);
  const Decision d = p.decide(s);
  EXPECT_EQ(d.action, Rung::offload) << d.detail;
  EXPECT_TRUE(d.evict.empty());
}

TEST(ChooseEvictions, LowestPriorityThenLeastRecentlyUsedOnlyWhatIsMissing) {
  using testing::at;
  const std::vector<EvictCandidate> c = {
      {"a", 3 * G, 0, at(30s)}, {"b", 1 * G, 0, at(10s)}, {"c", 2 * G, 1, at(1s)}, {"z", 0, 0, at(0s)}};
  EXPECT_EQ(choose_evictions(c, 1), (std::vector<std::string>{"b"})) << "a replica holding nothing frees nothing";
  EXPECT_EQ(choose_evictions(c, 2 * G), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(choose_evictions(c, 5 * G), (std::vector<std::string>{"b", "a", "c"}));
  EXPECT_EQ(choose_evictions(c, 6 * G), (std::vector<std::string>{"b", "a", "c"}));
  EXPECT_FALSE(choose_evictions(c, 6 * G + 1));
  EXPECT_EQ(choose_evictions(c, 0), (std::vector<std::string>{}));
  EXPECT_FALSE(choose_evictions({}, 1));
  // Equal priority and time: by name, so the answer does not depend on the order given.
  EXPECT_EQ(choose_evictions({{"y", G, 0, at(1s)}, {"x", G, 0, at(1s)}}, 1), (std::vector<std::string>{"x"}));
}

}  // namespace
}  // namespace tandem::policy
