#include <gtest/gtest.h>

#include <chrono>

#include "policy/unit_times.h"

namespace tandem::policy {
namespace {

using namespace std::chrono_literals;

TEST(UnitTimes, MeasuredThenObserved) {
  UnitTimes t(0.5);
  EXPECT_EQ(t.per_unit("clip", Device::cpu, WorkUnit::image), std::nullopt);
  EXPECT_EQ(t.estimate("clip", Device::cpu, WorkUnit::image, 4), std::nullopt);
  t.set_measured("clip", Device::cpu, WorkUnit::image, 40ms);
  EXPECT_EQ(t.per_unit("clip", Device::cpu, WorkUnit::image), 40ms);
  EXPECT_EQ(t.estimate("clip", Device::cpu, WorkUnit::image, 4), 160ms);
  // Keys apart: another unit, route or model is still unknown.
  EXPECT_EQ(t.per_unit("clip", Device::cpu, WorkUnit::text), std::nullopt);
  EXPECT_EQ(t.per_unit("clip", Device::gpu, WorkUnit::image), std::nullopt);
  EXPECT_EQ(t.per_unit("other", Device::cpu, WorkUnit::image), std::nullopt);
  // A run of 2 images in 120 ms (60 ms each) moves the figure halfway (alpha 0.5).
  t.observe("clip", Device::cpu, WorkUnit::image, 2, 120ms);
  EXPECT_EQ(t.per_unit("clip", Device::cpu, WorkUnit::image), 50ms);
  // A new warm-up replaces it.
  t.set_measured("clip", Device::cpu, WorkUnit::image, 30ms);
  EXPECT_EQ(t.per_unit("clip", Device::cpu, WorkUnit::image), 30ms);
  // The first observation of a key is taken as it is.
  t.observe("asr", Device::gpu, WorkUnit::window, 3, 900ms);
  EXPECT_EQ(t.per_unit("asr", Device::gpu, WorkUnit::window), 300ms);
  EXPECT_EQ(t.size(), 2u);
}

TEST(UnitTimes, IgnoredSamples) {
  struct Row {
    const char* what;
    std::uint64_t units;
    Clock::duration took;
  };
  const Row rows[] = {{"no units", 0, 10ms}, {"no time", 3, 0ms}, {"negative time", 3, -5ms}};
  for (const auto& r : rows) {
    UnitTimes t;
    t.observe("m", Device::cpu, WorkUnit::text, r.units, r.took);
    EXPECT_EQ(t.size(), 0u) << r.what;
    t.set_measured("m", Device::cpu, WorkUnit::text, 20ms);
    t.observe("m", Device::cpu, WorkUnit::text, r.units, r.took);
    EXPECT_EQ(t.per_unit("m", Device::cpu, WorkUnit::text), 20ms) << r.what;
  }
  UnitTimes t;
  t.set_measured("m", Device::cpu, WorkUnit::text, 20ms);
  t.set_measured("m", Device::cpu, WorkUnit::text, 0ms);  // ≤ 0: ignored
  t.set_measured("m", Device::cpu, WorkUnit::text, -1ms);
  EXPECT_EQ(t.per_unit("m", Device::cpu, WorkUnit::text), 20ms);
}

TEST(UnitTimes, ForgetAModelAndSaturate) {
  UnitTimes t;
  t.set_measured("a", Device::cpu, WorkUnit::text, 1ms);
  t.set_measured("a", Device::gpu, WorkUnit::image, 1ms);
  t.set_measured("b", Device::cpu, WorkUnit::window, 1s);
  t.forget("a");
  EXPECT_EQ(t.size(), 1u);
  EXPECT_EQ(t.per_unit("b", Device::cpu, WorkUnit::window), 1s);
  const auto huge = t.estimate("b", Device::cpu, WorkUnit::window, ~std::uint64_t{0});
  ASSERT_TRUE(huge.has_value());
  EXPECT_GT(*huge, Clock::duration::zero());  // saturates instead of wrapping
  EXPECT_EQ(work_unit_name(WorkUnit::window), "window");
}

}  // namespace
}  // namespace tandem::policy
