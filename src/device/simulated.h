// A simulated accelerator for tests, the demo and the validation campaign on machines without a GPU. Compute runs
// on the CPU (the engine places its tensors in host memory, optionally in bf16); everything the failover logic
// looks at is simulated faithfully: a byte capacity that refuses allocations past it, a foreign load ("another
// program" holding VRAM, changeable at run time), free-memory readings that lag, and injected faults.
#pragma once

#include <array>
#include <deque>

#include "device/device.h"

namespace tandem::device {

struct SimulatedConfig {
  std::string name = "sim0";
  std::uint64_t capacity_bytes = 8ull << 30;
  std::chrono::nanoseconds reading_lag{0};  // memory() reports free memory as it was this long ago
};

class SimulatedDevice final : public Device {
 public:
  SimulatedDevice(SimulatedConfig cfg, std::shared_ptr<const Clock> clock);

  std::string name() const override { return cfg_.name; }
  Kind kind() const override { return Kind::simulated; }
  Result<policy::MemorySnapshot> memory() override;
  Status check(Site site) override;
  Status health_probe(std::chrono::milliseconds deadline) override;
  bool lost() const override;

  // --- knobs (thread-safe) ---
  void set_foreign_bytes(std::uint64_t bytes);
  std::uint64_t foreign_bytes() const;
  void set_reading_lag(std::chrono::nanoseconds lag);
  void fail_next_allocations(int n);        // the next n allocations fail with out_of_memory
  void fail_at_site(Site site, int n = 1);  // the next n allocations at `site` fail with out_of_memory
  void fail_probes(int n);                  // the next n health probes fail (timeout)
  void lose();     // driver reset: every allocation void, accounting zero, work fails with device_lost
  void recover();  // the driver is back: new allocations are admitted again (old ones stay void)
  std::uint64_t capacity() const { return cfg_.capacity_bytes; }

  struct Counters {
    std::uint64_t allocations = 0, refused_capacity = 0, refused_injected = 0, probes = 0, probes_failed = 0,
                  losses = 0, lost_checks = 0;
  };
  Counters counters() const;

 protected:
  Status admit_allocation(std::uint64_t bytes, Site site) override;
  void accounting_changed_locked() override { record_locked(); }

 private:
  std::uint64_t true_free_locked() const;  // needs account_mu_
  void record_locked();                    // appends the current free value to the reading history

  SimulatedConfig cfg_;
  std::shared_ptr<const Clock> clock_;
  std::uint64_t foreign_ = 0;
  bool lost_ = false;
  int fail_next_ = 0;
  int fail_probes_ = 0;
  std::array<int, 6> fail_site_{};
  std::deque<std::pair<Clock::time_point, std::uint64_t>> history_;  // (when, true free bytes)
  Counters counters_;
};

}  // namespace tandem::device
