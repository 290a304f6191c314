// DeviceReadings (src/daemon/device_readings.h) on the simulated device: headroom and pressure against the ledger
// as another program's load comes and goes (with the pressure hysteresis), the device found lost once, the host.
#include "daemon/device_readings.h"

#include <gtest/gtest.h>

#include <memory>

#include "device/simulated.h"

namespace tandem::daemon {
namespace {

using policy::Pressure;
constexpr std::uint64_t kMiB = 1024ull * 1024;
constexpr std::uint64_t kGiB = 1024 * kMiB;

class DeviceReadingsTest : public ::testing::Test {
 protected:
  std::shared_ptr<ManualClock> clock = std::make_shared<ManualClock>();
  device::SimulatedDevice dev{device::SimulatedConfig{"sim0", 8 * kGiB, {}}, clock};
  policy::ReservationLedger ledger;
  policy::HeadroomConfig cfg;  // margin max(512 MiB, 5 %) = 512 MiB of 8 GiB
  DeviceReadings r{policy::PressureConfig{}};

  Pressure read_with_foreign(std::uint64_t bytes) {
    dev.set_foreign_bytes(bytes);
    clock->advance(std::chrono::milliseconds(10));
    EXPECT_FALSE(r.read_device(dev, ledger, cfg, clock->now()));
    return r.pressure();
  }
};

TEST_F(DeviceReadingsTest, NothingIsReadBeforeTheFirstReading) {
  EXPECT_FALSE(r.snapshot());
  EXPECT_EQ(r.pressure(), Pressure::normal);
  EXPECT_FALSE(r.device_lost());
}

TEST_F(DeviceReadingsTest, HeadroomCountsTheLedgerAndOtherProgramsWithHysteresis) {
  EXPECT_EQ(read_with_foreign(0), Pressure::normal);
  ASSERT_TRUE(r.snapshot());
  EXPECT_EQ(r.snapshot()->total_bytes, 8 * kGiB);
  EXPECT_EQ(r.headroom().headroom, static_cast<std::int64_t>(8 * kGiB - 512 * kMiB));
  // Our own weights count through the ledger (predicted view), before anything is allocated.
  ASSERT_TRUE(ledger.set_resident("m", 2 * kGiB));
  clock->advance(std::chrono::milliseconds(10));
  ASSERT_FALSE(r.read_device(dev, ledger, cfg, clock->now()));
  EXPECT_EQ(r.headroom().headroom, static_cast<std::int64_t>(6 * kGiB - 512 * kMiB));
  ASSERT_TRUE(ledger.set_resident("m", 0));
  // Another program takes 7.2 GiB: 0.3 GiB of headroom (3.75 %) is critical; 0.5 GiB (6.25 %) stays critical
  // (leaves it above 8 %), 1 GiB (12.5 %) is elevated, all of it back is normal.
  const struct {
    std::uint64_t foreign;
    Pressure want;
  } steps[] = {{7 * kGiB + 205 * kMiB, Pressure::critical},
               {7 * kGiB, Pressure::critical},
               {6 * kGiB + 512 * kMiB, Pressure::elevated},
               {0, Pressure::normal}};
  for (const auto& s : steps) EXPECT_EQ(read_with_foreign(s.foreign), s.want) << s.foreign / kMiB << " MiB foreign";
}

TEST_F(DeviceReadingsTest, ALostDeviceIsReportedOnceUntilItRecovers) {
  read_with_foreign(0);
  dev.lose();
  auto why = r.read_device(dev, ledger, cfg, clock->now());
  ASSERT_TRUE(why) << "the first reading after the loss says so";
  EXPECT_TRUE(r.device_lost());
  EXPECT_FALSE(r.read_device(dev, ledger, cfg, clock->now())) << "only once";
  EXPECT_FALSE(r.mark_lost()) << "a run's device_lost after the reading's: not new";
  ASSERT_TRUE(r.snapshot()) << "the last good reading is kept";
  dev.recover();
  r.mark_recovered();
  EXPECT_FALSE(r.device_lost());
  EXPECT_TRUE(r.mark_lost()) << "a run that fails with device_lost first";
  EXPECT_TRUE(r.device_lost());
}

TEST_F(DeviceReadingsTest, TheHostIsRead) {
  r.read_host();
  EXPECT_TRUE(r.host().mem_available.has_value()) << "/proc/meminfo has MemAvailable";
}

}  // namespace
}  // namespace tandem::daemon
