// The accelerator as the engine and the policy core see it: identity, memory readings (in the policy core's
// MemorySnapshot form), accounted allocation of the engine's large buffers with a typed out-of-memory result, a
// health probe with a deadline, and a "device lost" state. Torch-free: implementations that need LibTorch or the
// CUDA runtime keep those includes in their .cc files.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "core/clock.h"
#include "core/result.h"
#include "policy/types.h"

namespace tandem::device {

enum class Kind : std::uint8_t { cpu, simulated, cuda };
std::string_view kind_name(Kind k);

// Where in the engine an allocation happens; fault injection can target one site.
enum class Site : std::uint8_t { weights, kv_pool, prefill, decode, probe, other };
std::string_view site_name(Site s);
Result<Site> parse_site(std::string_view s);

class Device;

// One accounted allocation. Returns its bytes to the device when destroyed, unless the device was lost (a driver
// reset frees everything at once) since the allocation was made.
class Allocation {
 public:
  Allocation() = default;
  Allocation(Allocation&& o) noexcept;
  Allocation& operator=(Allocation&& o) noexcept;
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  ~Allocation();

  std::uint64_t bytes() const { return bytes_; }
  Site site() const { return site_; }
  bool valid() const;  // false once the device was lost after this allocation
  void reset();

 private:
  friend class Device;
  Allocation(std::shared_ptr<Device> d, std::uint64_t bytes, Site site, std::uint64_t epoch)
      : device_(std::move(d)), bytes_(bytes), site_(site), epoch_(epoch) {}
  std::shared_ptr<Device> device_;
  std::uint64_t bytes_ = 0;
  Site site_ = Site::other;
  std::uint64_t epoch_ = 0;
};

class Device : public std::enable_shared_from_this<Device> {
 public:
  virtual ~Device() = default;

  virtual std::string name() const = 0;
  virtual Kind kind() const = 0;
  // The LibTorch device index tensors for this device live on (-1: host memory).
  virtual int torch_index() const { return -1; }

  // A reading of device memory: total, free as the driver reports it (all processes; may lag), and what this
  // process holds (reserved) and uses (allocated). Errors: device_lost.
  virtual Result<policy::MemorySnapshot> memory() = 0;

  // Accounts `bytes` for an engine buffer at `site`. out_of_memory when the device cannot hold them (the message
  // says how much was asked and how much is free), device_lost when the device is gone. The caller creates the
  // tensors only after this succeeded and keeps the Allocation alive as long as the tensors.
  Result<Allocation> allocate(std::uint64_t bytes, Site site);

  // Called by the engine at safe points of a forward (before prefill, each decode step): reports device loss or
  // an injected fault at that site. Cheap.
  virtual Status check(Site site) = 0;

  // A small allocation and a bit of device work that must finish before `deadline` (CUDA); simulated: a scripted
  // result. Errors: timeout, device_lost, internal.
  virtual Status health_probe(std::chrono::milliseconds deadline) = 0;

  virtual bool lost() const = 0;

  // Returns to the driver what this process keeps cached for reuse (LibTorch's caching allocator on CUDA), so that
  // the device's free bytes show what an eviction released (docs/residency.md). Default: nothing is cached.
  virtual void release_cached() {}

  // Bytes currently accounted to this process's live allocations.
  std::uint64_t accounted_bytes() const;
  std::uint64_t epoch() const;  // bumped by every loss; allocations from older epochs are void

 protected:
  // Implementations decide whether `bytes` fit and may perform a real allocation check; they are called with the
  // accounting lock held and must not call back into allocate().
  virtual Status admit_allocation(std::uint64_t bytes, Site site) = 0;
  // Called with the accounting lock held after accounted_ changed (allocation, release, loss).
  virtual void accounting_changed_locked() {}
  // Marks every allocation made so far void (device lost / reset) and zeroes the accounting.
  void void_all_allocations();

  mutable std::mutex account_mu_;
  std::uint64_t accounted_ = 0;
  std::uint64_t epoch_ = 1;

 private:
  friend class Allocation;
  void release(std::uint64_t bytes, std::uint64_t epoch);
};

// The host as a device: allocations are always admitted (the host-memory guard in the policy core bounds CPU work),
// memory() reports MemTotal / MemAvailable.
class CpuDevice final : public Device {
 public:
  std::string name() const override { return "cpu"; }
  Kind kind() const override { return Kind::cpu; }
  Result<policy::MemorySnapshot> memory() override;
  Status check(Site) override { return {}; }
  Status health_probe(std::chrono::milliseconds) override { return {}; }
  bool lost() const override { return false; }

 protected:
  Status admit_allocation(std::uint64_t, Site) override { return {}; }
};

}  // namespace tandem::device
