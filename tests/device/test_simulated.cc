// The simulated accelerator and the device accounting on their own (torch-free).
#include <gtest/gtest.h>

#include "device/simulated.h"

using namespace tandem;
using device::Site;

namespace {
std::shared_ptr<device::SimulatedDevice> make(std::uint64_t cap, std::shared_ptr<ManualClock> clock = nullptr) {
  device::SimulatedConfig c;
  c.capacity_bytes = cap;
  return std::make_shared<device::SimulatedDevice>(c, clock ? clock : std::make_shared<ManualClock>());
}
}  // namespace

TEST(SimulatedDevice, CapacityTable) {
  auto d = make(1000);
  struct Step {
    std::uint64_t bytes;
    bool ok;
    std::uint64_t accounted_after;
  };
  std::vector<device::Allocation> live;
  for (const auto& s : std::vector<Step>{{400, true, 400}, {600, true, 1000}, {1, false, 1000}, {0, true, 1000}}) {
    auto a = d->allocate(s.bytes, Site::kv_pool);
    EXPECT_EQ(a.ok(), s.ok) << s.bytes;
    if (a.ok()) live.push_back(std::move(a).value());
    else EXPECT_EQ(a.error().code, Errc::out_of_memory);
    EXPECT_EQ(d->accounted_bytes(), s.accounted_after);
  }
  live.clear();
  EXPECT_EQ(d->accounted_bytes(), 0u);
  EXPECT_EQ(d->counters().refused_capacity, 1u);
}

TEST(SimulatedDevice, ForeignLoadRefusesAndReportsBothSides) {
  auto d = make(1000);
  d->set_foreign_bytes(700);
  auto a = d->allocate(400, Site::weights);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.error().message.find("foreign"), std::string::npos) << a.error().message;
  EXPECT_TRUE(d->allocate(300, Site::weights).ok());
  d->set_foreign_bytes(5000);  // more than the capacity: free saturates at 0
  EXPECT_EQ(d->memory()->free_bytes, 0u);
}

TEST(SimulatedDevice, InjectedFailuresCountDownPerSite) {
  auto d = make(1 << 20);
  d->fail_next_allocations(2);
  EXPECT_FALSE(d->allocate(1, Site::other).ok());
  EXPECT_FALSE(d->allocate(1, Site::decode).ok());
  EXPECT_TRUE(d->allocate(1, Site::decode).ok());
  d->fail_at_site(Site::decode, 1);
  EXPECT_TRUE(d->allocate(1, Site::prefill).ok()) << "another site is unaffected";
  auto r = d->allocate(1, Site::decode);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("injected"), std::string::npos);
  EXPECT_NE(r.error().message.find("decode"), std::string::npos);
  EXPECT_TRUE(d->allocate(1, Site::decode).ok());
  EXPECT_EQ(d->counters().refused_injected, 3u);
}

TEST(SimulatedDevice, LossVoidsAllocationsAndTheirLaterReleaseIsHarmless) {
  auto d = make(1000);
  auto a = d->allocate(600, Site::weights);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->valid());
  d->lose();
  EXPECT_TRUE(d->lost());
  EXPECT_FALSE(a->valid());
  EXPECT_EQ(d->accounted_bytes(), 0u);
  EXPECT_EQ(d->check(Site::decode).error().code, Errc::device_lost);
  d->recover();
  auto b = d->allocate(900, Site::weights);
  ASSERT_TRUE(b.ok()) << "the lost allocation's bytes were freed by the reset";
  a->reset();  // releasing a void allocation must not subtract from the new epoch's accounting
  EXPECT_EQ(d->accounted_bytes(), 900u);
  EXPECT_TRUE(d->check(Site::decode).ok());
}

TEST(SimulatedDevice, AllocationMovesKeepAccountingExact) {
  auto d = make(1000);
  device::Allocation x;
  {
    auto a = d->allocate(100, Site::other);
    x = std::move(a).value();
  }
  EXPECT_EQ(d->accounted_bytes(), 100u);
  device::Allocation y(std::move(x));
  EXPECT_EQ(x.bytes(), 0u);
  EXPECT_EQ(y.bytes(), 100u);
  y = d->allocate(50, Site::other).value();  // the old 100 is released by the assignment
  EXPECT_EQ(d->accounted_bytes(), 50u);
}

TEST(SimulatedDevice, ParseSite) {
  EXPECT_EQ(*device::parse_site("decode"), Site::decode);
  EXPECT_EQ(device::parse_site("gpu").error().code, Errc::invalid_argument);
}

TEST(CpuDevice, ReadsHostMemory) {
  auto d = std::make_shared<device::CpuDevice>();
  auto m = d->memory();
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_GT(m->total_bytes, 0u);
  EXPECT_LE(m->free_bytes, m->total_bytes);
  EXPECT_TRUE(d->allocate(1ull << 40, Site::other).ok()) << "the host guard, not the device, bounds CPU work";
}
