// What the service last read of memory: the accelerator's snapshot, the headroom it leaves against what Tandem
// accounts (the ledger), the pressure level (with its hysteresis), whether the device is lost, and the host's
// memory. A concern of its own, out of Service: admission, the service level, the views and the residency work read
// it; Service refreshes it before each admission and on each tick. Torch-free and D-Bus-free; tested on the
// simulated device. It logs nothing: read_device() says when the device was found lost, and the caller logs and
// feeds the breaker.
#pragma once

#include <optional>
#include <string>

#include "core/clock.h"
#include "device/device.h"
#include "policy/headroom.h"
#include "policy/host_guard.h"
#include "policy/ledger.h"

namespace tandem::daemon {

class DeviceReadings {
 public:
  explicit DeviceReadings(policy::PressureConfig pressure) : pressure_tracker_(pressure) {}

  // Reads the accelerator: its memory snapshot (kept from the last good reading when one fails), then headroom and
  // pressure against `ledger` with `cfg`. Returns why, the first time the device reads as lost (memory() failing
  // with device_lost, or lost()); nullopt otherwise.
  std::optional<std::string> read_device(device::Device& acc, const policy::ReservationLedger& ledger,
                                         const policy::HeadroomConfig& cfg, Clock::time_point now);
  // Reads the host's memory (/proc/meminfo, the cgroup); keeps the last reading when they cannot be read.
  void read_host();

  // A run failed with device_lost: true the first time (the caller logs it). mark_recovered(): the GPU replicas
  // were reloaded after a successful probe.
  bool mark_lost();
  void mark_recovered() { device_lost_ = false; }

  bool device_lost() const { return device_lost_; }
  const std::optional<policy::MemorySnapshot>& snapshot() const { return snapshot_; }
  const policy::Headroom& headroom() const { return headroom_; }
  policy::Pressure pressure() const { return pressure_; }
  const policy::HostReading& host() const { return host_; }

 private:
  std::optional<policy::MemorySnapshot> snapshot_;
  policy::Headroom headroom_;
  policy::PressureTracker pressure_tracker_;
  policy::Pressure pressure_ = policy::Pressure::normal;
  policy::HostReading host_;
  bool device_lost_ = false;
};

}  // namespace tandem::daemon
