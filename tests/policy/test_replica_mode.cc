#include <gtest/gtest.h>

#include "fixtures.h"

namespace tandem::policy {
namespace {

constexpr std::uint64_t G = kGiB;

ReplicaMeasurements meas(std::optional<Clock::duration> load, std::optional<Clock::duration> page_in,
                         std::optional<Clock::duration> warm_up, std::uint64_t model = 4 * G,
                         std::uint64_t budget = 16 * G) {
  return ReplicaMeasurements{load, page_in, warm_up, model, budget};
}

TEST(ReplicaMode, DecisionTable) {
  struct Row {
    const char* what;
    ReplicaMeasurements m;
    std::optional<ReplicaMode> current;
    ReplicaMode mode;
    bool meets;
    Clock::duration recovery;
  };
  using M = ReplicaMode;
  const Row rows[] = {
      {"unmeasured -> warm", meas(std::nullopt, std::nullopt, std::nullopt), std::nullopt, M::warm, true, 0s},
      {"fast load -> on-demand", meas(3s, 1s, 2s), std::nullopt, M::on_demand, true, 5s},
      {"slow load, fast page-in -> mmap", meas(30s, 4s, 2s), std::nullopt, M::mmap, true, 6s},
      {"both slow -> warm", meas(30s, 12s, 2s), std::nullopt, M::warm, true, 0s},
      {"exactly the budget -> on-demand", meas(8s, 1s, 2s), std::nullopt, M::on_demand, true, 10s},
      {"cheaper than current needs margin", meas(8s, 1s, 2s), M::mmap, M::mmap, true, 3s},
      {"cheaper than current within margin", meas(5s, 1s, 2s), M::mmap, M::on_demand, true, 7s},
      {"warm exceeds host budget -> mmap, says so", meas(30s, 12s, 2s, 20 * G), std::nullopt, M::mmap, false, 14s},
      {"warm exceeds host budget, only load measured", meas(30s, std::nullopt, 2s, 20 * G), std::nullopt,
       M::on_demand, false, 32s},
      // Review #5: the fastest measured alternative, not mmap by default.
      {"warm exceeds host budget, both over budget, on-demand faster", meas(20s, 30s, 2s, 20 * G), std::nullopt,
       M::on_demand, false, 22s},
      {"warm exceeds host budget, both over budget, mmap faster", meas(30s, 20s, 2s, 20 * G), std::nullopt, M::mmap,
       false, 22s},
      {"warm exceeds host budget, nothing measured", meas(std::nullopt, std::nullopt, std::nullopt, 20 * G),
       std::nullopt, M::mmap, false, 0s},
  };
  ReplicaModePolicy p(ReplicaModeConfig{10s, 0.2});
  for (const auto& r : rows) {
    ReplicaModeDecision d = p.decide(r.m, r.current);
    EXPECT_EQ(d.mode, r.mode) << r.what << ": " << d.reason;
    EXPECT_EQ(d.meets_budget, r.meets) << r.what;
    EXPECT_EQ(d.expected_recovery, r.recovery) << r.what;
    EXPECT_FALSE(d.reason.empty());
  }
}

TEST(ReplicaMode, TrackerRedecidesOnlyWhenMeasurementsChange) {
  ReplicaModeTracker t(ReplicaModeConfig{10s, 0.2});
  auto first = t.update(meas(std::nullopt, std::nullopt, std::nullopt));
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->mode, ReplicaMode::warm);
  EXPECT_EQ(first->reason, "unmeasured: warm until load and warm-up times are known");
  EXPECT_FALSE(t.update(meas(std::nullopt, std::nullopt, std::nullopt)).has_value());
  auto measured = t.update(meas(20s, 5s, 1s));  // mmap: 6 s ≤ 8 s (margin from warm)
  ASSERT_TRUE(measured.has_value());
  EXPECT_EQ(measured->mode, ReplicaMode::mmap);
  EXPECT_FALSE(t.update(meas(20s, 6s, 1s)).has_value());  // 7 s: still mmap, no change announced
  EXPECT_EQ(t.current()->expected_recovery, 7s);
  auto slower = t.update(meas(20s, 11s, 1s));             // 12 s > budget: back to warm at once
  ASSERT_TRUE(slower.has_value());
  EXPECT_EQ(slower->mode, ReplicaMode::warm);
  EXPECT_FALSE(t.update(meas(20s, 8s, 1s)).has_value());  // 9 s: within budget, not within the margin
  EXPECT_TRUE(t.update(meas(20s, 6s, 1s)).has_value());   // 7 s ≤ 8 s: mmap again
}

}  // namespace
}  // namespace tandem::policy
