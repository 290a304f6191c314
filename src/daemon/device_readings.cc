#include "daemon/device_readings.h"

#include "daemon/host_reading.h"

namespace tandem::daemon {

std::optional<std::string> DeviceReadings::read_device(device::Device& acc, const policy::ReservationLedger& ledger,
                                                       const policy::HeadroomConfig& cfg, Clock::time_point now) {
  std::optional<std::string> lost;
  auto snap = acc.memory();
  if (snap) {
    snapshot_ = *snap;
  } else if (snap.error().code == Errc::device_lost && !device_lost_) {
    device_lost_ = true;
    lost = snap.error().message;
  }
  if (acc.lost() && !device_lost_) {
    device_lost_ = true;
    lost = std::string{};
  }
  if (snapshot_) {
    headroom_ = policy::compute_headroom(*snapshot_, ledger, cfg, now);
    pressure_ = pressure_tracker_.update(headroom_.fraction());
  }
  return lost;
}

void DeviceReadings::read_host() {
  if (auto hr = read_host_memory(); hr) host_ = *hr;
}

bool DeviceReadings::mark_lost() {
  if (device_lost_) return false;
  device_lost_ = true;
  return true;
}

}  // namespace tandem::daemon
