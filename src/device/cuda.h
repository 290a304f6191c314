// A CUDA GPU as a Device, through the CUDA runtime API only (no LibTorch here; the engine plugs LibTorch's
// caching-allocator statistics in with set_allocator_stats()). Compiled only when meson finds the CUDA runtime
// (TANDEM_HAVE_CUDA=1 in tandem_device_dep's compile args). See docs/cuda.md.
//
// This header does not include cuda_runtime_api.h: CUDA error codes cross it as plain ints (cudaError_t values).
#pragma once

#include <functional>
#include <utility>

#include "device/device.h"

namespace tandem::device {

// How Tandem treats one cudaError_t value (see the table in docs/cuda.md).
struct CudaErrorClass {
  Errc code = Errc::internal;  // not_found / unsupported (no usable GPU or driver), out_of_memory, device_lost,
                               // timeout, internal
  bool sticky = false;         // the CUDA context is corrupted: every later call fails; the device is lost
};
CudaErrorClass classify_cuda_error(int cuda_error);
// "cudaErrorNoDevice (no CUDA-capable device is detected)"; "cudaSuccess" for 0.
std::string cuda_error_text(int cuda_error);
// True for the errors that mean "there is no usable GPU or driver on this machine" (code not_found / unsupported).
bool cuda_error_means_no_device(int cuda_error);

class CudaDevice final : public Device {
 public:
  // (reserved, allocated) bytes of this process on the device, e.g. from LibTorch's caching allocator.
  using AllocatorStats = std::function<std::pair<std::uint64_t, std::uint64_t>()>;

  // Opens device `index`. Errors: invalid_argument (index < 0), not_found ("no CUDA device: cudaErrorNoDevice ...",
  // also for a missing driver or an index past the device count), unsupported (driver too old for this runtime),
  // device_lost / internal for other CUDA failures. Never crashes on a machine without a GPU.
  static Result<std::shared_ptr<CudaDevice>> open(int index, std::shared_ptr<const Clock> clock);

  std::string name() const override { return name_; }
  Kind kind() const override { return Kind::cuda; }
  int torch_index() const override { return index_; }

  // total and free from cudaMemGetInfo (free is device-wide, all processes); reserved/allocated from the
  // allocator-stats hook, else both equal to the accounted bytes. Errors: device_lost.
  Result<policy::MemorySnapshot> memory() override;
  // Reports a pending CUDA error of this thread (cudaGetLastError) and sticky context errors (a query of the
  // legacy stream surfaces them). Sticky errors mark the device lost and void every allocation.
  Status check(Site site) override;
  // cudaMalloc of a small buffer, cudaMemsetAsync on a non-blocking stream, an event polled until `deadline`
  // (measured on the steady clock, not the injected one). Errors: timeout, device_lost, internal. A blocking
  // driver call (a hung driver) cannot be interrupted: the deadline bounds the wait for the device work only.
  Status health_probe(std::chrono::milliseconds deadline) override;
  bool lost() const override;

  // Thread-safe; pass an empty function to remove the hook. memory() calls it without device locks; admission
  // calls it with the accounting lock held, so it must not call back into this device.
  void set_allocator_stats(AllocatorStats stats);
  // The hook release_cached() calls (LibTorch's emptyCache, set by the engine where it links CUDA LibTorch).
  void set_cache_release(std::function<void()> fn);
  void release_cached() override;

  std::uint64_t total_bytes() const { return total_; }
  // Health probes that timed out: each left its small buffer allocated (freeing it would block on the hung work).
  std::uint64_t probes_leaked() const;

 protected:
  // out_of_memory when bytes > free as reported now (cudaMemGetInfo, taken with the accounting lock held so that
  // concurrent admissions are serialized) plus, with the allocator hook, the allocator's cached bytes (reserved -
  // allocated: reusable without the driver); device_lost after a loss.
  Status admit_allocation(std::uint64_t bytes, Site site) override;

 private:
  CudaDevice(int index, std::string name, std::uint64_t total, std::shared_ptr<const Clock> clock);

  // Turns a CUDA error into a Status for `what`; a sticky one marks the device lost (takes account_mu_ unless
  // `locked`).
  Status cuda_failure(int err, const std::string& what, bool locked);
  void mark_lost_locked(const std::string& why);

  const int index_;
  const std::string name_;
  const std::uint64_t total_;
  std::shared_ptr<const Clock> clock_;

  bool lost_ = false;       // guarded by account_mu_
  std::string lost_why_;    // guarded by account_mu_
  std::uint64_t probes_leaked_ = 0;  // guarded by account_mu_

  mutable std::mutex stats_mu_;
  AllocatorStats stats_;  // guarded by stats_mu_
  std::function<void()> cache_release_;  // guarded by stats_mu_
};

}  // namespace tandem::device
