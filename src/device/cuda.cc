#include "device/cuda.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <thread>

#include "core/text.h"

namespace tandem::device {

namespace {


// Restores the calling thread's current device on scope exit, so the device never changes a thread's CUDA state
// behind the engine's back.
class DeviceScope {
 public:
  explicit DeviceScope(int index) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    err_ = previous_ == index ? cudaSuccess : cudaSetDevice(index);
  }
  ~DeviceScope() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  cudaError_t error() const { return err_; }

 private:
  int previous_ = -1;
  cudaError_t err_ = cudaSuccess;
};

}  // namespace

std::string cuda_error_text(int cuda_error) {
  const auto e = static_cast<cudaError_t>(cuda_error);
  if (e == cudaSuccess) return "cudaSuccess";
  const char* name = cudaGetErrorName(e);
  const char* text = cudaGetErrorString(e);
  std::string out = name ? name : ("cudaError " + std::to_string(cuda_error));
  if (text && *text) out += std::string(" (") + text + ")";
  return out;
}

bool cuda_error_means_no_device(int cuda_error) {
  switch (static_cast<cudaError_t>(cuda_error)) {
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorInitializationError:
    case cudaErrorStubLibrary:
    case cudaErrorInsufficientDriver:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorSystemNotReady:
    case cudaErrorDevicesUnavailable:
    case cudaErrorDeviceNotLicensed:
    case cudaErrorOperatingSystem:
      return true;
    default:
      return false;
  }
}

CudaErrorClass classify_cuda_error(int cuda_error) {
  switch (static_cast<cudaError_t>(cuda_error)) {
    // No usable GPU / driver on this machine (open() reports these; at run time they mean the driver went away).
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorInitializationError:
    case cudaErrorStubLibrary:
    case cudaErrorSystemNotReady:
    case cudaErrorDeviceNotLicensed:
    case cudaErrorOperatingSystem:
      return {Errc::not_found, false};
    case cudaErrorInsufficientDriver:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return {Errc::unsupported, false};
    case cudaErrorMemoryAllocation:
      return {Errc::out_of_memory, false};
    case cudaErrorTimeout:
      return {Errc::timeout, false};
    // Sticky: the context is corrupted (or the device went away); the process must recreate it (in practice: be
    // restarted) before it can use the GPU again.
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorContained:
    case cudaErrorExternalDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorContextIsDestroyed:
    case cudaErrorCudartUnloading:
    case cudaErrorPriorLaunchFailure:
    case cudaErrorMpsConnectionFailed:
    case cudaErrorMpsRpcFailure:
    case cudaErrorMpsServerNotReady:
    case cudaErrorMpsClientTerminated:
    case cudaErrorUnknown:
      return {Errc::device_lost, true};
    default:
      return {Errc::internal, false};
  }
}

Result<std::shared_ptr<CudaDevice>> CudaDevice::open(int index, std::shared_ptr<const Clock> clock) {
  if (index < 0) return fail(Errc::invalid_argument, "CUDA device index " + std::to_string(index) + " is negative");
  if (!clock) return fail(Errc::invalid_argument, "CudaDevice::open: no clock");
  auto no_device = [](cudaError_t e, const std::string& what) {
    const auto c = classify_cuda_error(e);
    const Errc code = c.code == Errc::unsupported ? Errc::unsupported : Errc::not_found;
    return fail(code, "no CUDA device: " + cuda_error_text(e) + what);
  };
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    if (cuda_error_means_no_device(e)) return no_device(e, "");
    const auto c = classify_cuda_error(e);
    return fail(c.code, "cudaGetDeviceCount: " + cuda_error_text(e));
  }
  if (count == 0) return fail(Errc::not_found, "no CUDA device: the driver reports 0 devices");
  if (index >= count)
    return fail(Errc::not_found, "no CUDA device " + std::to_string(index) + ": the driver reports " +
                                     std::to_string(count) + " device(s)");
  cudaDeviceProp prop{};
  std::size_t free = 0, total = 0;
  {
    DeviceScope scope(index);
    e = scope.error();
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, index);
    // Creates the primary context: fails here, not later, when the GPU is exclusive to another process.
    if (e == cudaSuccess) e = cudaMemGetInfo(&free, &total);
  }
  if (e != cudaSuccess) {
    if (cuda_error_means_no_device(e)) return no_device(e, " (device " + std::to_string(index) + ")");
    return fail(classify_cuda_error(e).code, "cuda:" + std::to_string(index) + ": " + cuda_error_text(e));
  }
  prop.name[sizeof prop.name - 1] = '\0';
  std::string name = "cuda:" + std::to_string(index) + " (" + prop.name + ")";
  return std::shared_ptr<CudaDevice>(new CudaDevice(index, std::move(name), total, std::move(clock)));
}

CudaDevice::CudaDevice(int index, std::string name, std::uint64_t total, std::shared_ptr<const Clock> clock)
    : index_(index), name_(std::move(name)), total_(total), clock_(std::move(clock)) {}

void CudaDevice::mark_lost_locked(const std::string& why) {
  if (lost_) return;
  lost_ = true;
  lost_why_ = why;
  void_all_allocations();
}

Status CudaDevice::cuda_failure(int err, const std::string& what, bool locked) {
  const auto c = classify_cuda_error(err);
  const std::string msg = name_ + ": " + what + ": " + cuda_error_text(err);
  if (c.sticky) {
    if (locked) {
      mark_lost_locked(msg);
    } else {
      std::lock_guard lock(account_mu_);
      mark_lost_locked(msg);
    }
    return fail(Errc::device_lost, msg + "; device lost, all its allocations are void");
  }
  // A driver that went away at run time is a lost device too, not "no device" (the device existed at open()).
  if (c.code == Errc::not_found || c.code == Errc::unsupported) return fail(Errc::device_lost, msg);
  return fail(c.code, msg);
}

bool CudaDevice::lost() const {
  std::lock_guard lock(account_mu_);
  return lost_;
}

std::uint64_t CudaDevice::probes_leaked() const {
  std::lock_guard lock(account_mu_);
  return probes_leaked_;
}

void CudaDevice::set_cache_release(std::function<void()> fn) {
  std::lock_guard lock(stats_mu_);
  cache_release_ = std::move(fn);
}

void CudaDevice::release_cached() {
  std::function<void()> fn;
  {
    std::lock_guard lock(stats_mu_);
    fn = cache_release_;
  }
  if (fn && !lost()) {
    DeviceScope scope(index_);
    if (scope.error() == cudaSuccess) fn();
  }
}

void CudaDevice::set_allocator_stats(AllocatorStats stats) {
  std::lock_guard lock(stats_mu_);
  stats_ = std::move(stats);
}

Result<policy::MemorySnapshot> CudaDevice::memory() {
  {
    std::lock_guard lock(account_mu_);
    if (lost_) return fail(Errc::device_lost, name_ + ": device lost (" + lost_why_ + "); no memory reading");
  }
  std::size_t free = 0, total = 0;
  cudaError_t e;
  {
    DeviceScope scope(index_);
    e = scope.error();
    if (e == cudaSuccess) e = cudaMemGetInfo(&free, &total);
  }
  if (e != cudaSuccess) return fail(cuda_failure(e, "cudaMemGetInfo", false).error());
  AllocatorStats stats;
  {
    std::lock_guard lock(stats_mu_);
    stats = stats_;
  }
  policy::MemorySnapshot s;
  s.total_bytes = total;
  s.free_bytes = free;
  if (stats) {
    const auto [reserved, allocated] = stats();
    s.reserved_bytes = reserved;
    s.allocated_bytes = allocated;
  } else {
    std::lock_guard lock(account_mu_);
    s.reserved_bytes = s.allocated_bytes = accounted_;
  }
  s.taken_at = clock_->now();
  return s;
}

Status CudaDevice::admit_allocation(std::uint64_t bytes, Site site) {
  // account_mu_ is held (Device::allocate).
  if (lost_) return fail(Errc::device_lost, name_ + ": device lost (" + lost_why_ + ")");
  std::size_t free = 0, total = 0;
  cudaError_t e;
  {
    DeviceScope scope(index_);
    e = scope.error();
    if (e == cudaSuccess) e = cudaMemGetInfo(&free, &total);
  }
  if (e != cudaSuccess) return cuda_failure(e, "cudaMemGetInfo before an allocation", true);
  // Bytes the caching allocator holds but no tensor uses are reusable by this process without the driver.
  std::uint64_t cached = 0;
  {
    std::lock_guard lock(stats_mu_);
    if (stats_) {
      const auto [reserved, allocated] = stats_();
      cached = reserved > allocated ? reserved - allocated : 0;
    }
  }
  const std::uint64_t usable = static_cast<std::uint64_t>(free) + cached;
  if (bytes > usable)
    return fail(Errc::out_of_memory, name_ + ": out of memory at " + std::string(site_name(site)) + ": asked " +
                                         format_mib(bytes) + ", " + format_mib(free) + " free of " + format_mib(total) +
                                         (cached ? " + " + format_mib(cached) + " cached by the allocator" : std::string()) +
                                         " (" + format_mib(accounted_) + " accounted to this process)");
  return {};
}

Status CudaDevice::check(Site site) {
  {
    std::lock_guard lock(account_mu_);
    if (lost_)
      return fail(Errc::device_lost,
                  name_ + ": device lost (" + lost_why_ + ") during " + std::string(site_name(site)));
  }
  cudaError_t e;
  {
    DeviceScope scope(index_);
    e = scope.error();
    // A launch error of this thread, consumed so that a non-sticky one is reported once.
    if (e == cudaSuccess) e = cudaGetLastError();
    // An asynchronous fault surfaces at the next API call; querying the legacy stream does not block.
    if (e == cudaSuccess) {
      e = cudaStreamQuery(nullptr);
      if (e == cudaErrorNotReady) e = cudaSuccess;
    }
  }
  if (e != cudaSuccess) return cuda_failure(e, "check at " + std::string(site_name(site)), false);
  return {};
}

Status CudaDevice::health_probe(std::chrono::milliseconds deadline) {
  using SteadyTime = std::chrono::steady_clock;
  const auto until = SteadyTime::now() + deadline;
  {
    std::lock_guard lock(account_mu_);
    if (lost_) return fail(Errc::device_lost, name_ + ": health probe: device lost (" + lost_why_ + ")");
  }
  constexpr std::size_t kProbeBytes = 64 * 1024;
  DeviceScope scope(index_);
  if (scope.error() != cudaSuccess) return cuda_failure(scope.error(), "health probe: cudaSetDevice", false);

  void* buf = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;
  auto cleanup = [&](bool work_done) {
    if (event) (void)cudaEventDestroy(event);
    if (stream) (void)cudaStreamDestroy(stream);  // returns at once; resources go when the work is done
    // cudaFree synchronizes the device: only free when the probe's work is known to be finished (or never ran).
    if (buf) {
      if (work_done) {
        (void)cudaFree(buf);
      } else {
        std::lock_guard lock(account_mu_);
        ++probes_leaked_;
      }
    }
  };
  auto failed = [&](cudaError_t err, const char* what, bool work_done) -> Status {
    cleanup(work_done);
    return cuda_failure(err, std::string("health probe: ") + what, false);
  };

  cudaError_t e = cudaMalloc(&buf, kProbeBytes);
  if (e != cudaSuccess) {
    buf = nullptr;
    return failed(e, "cudaMalloc", true);
  }
  if ((e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) != cudaSuccess) {
    stream = nullptr;
    return failed(e, "cudaStreamCreateWithFlags", true);
  }
  if ((e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming)) != cudaSuccess) {
    event = nullptr;
    return failed(e, "cudaEventCreateWithFlags", true);
  }
  if ((e = cudaMemsetAsync(buf, 0xA5, kProbeBytes, stream)) != cudaSuccess) return failed(e, "cudaMemsetAsync", true);
  if ((e = cudaEventRecord(event, stream)) != cudaSuccess) return failed(e, "cudaEventRecord", false);

  auto pause = std::chrono::microseconds(20);
  for (;;) {
    e = cudaEventQuery(event);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) return failed(e, "cudaEventQuery", false);
    const auto now = SteadyTime::now();
    if (now >= until) {
      cleanup(false);
      return fail(Errc::timeout, name_ + ": health probe: a " + std::to_string(kProbeBytes / 1024) +
                                     " KiB memset did not finish within " + std::to_string(deadline.count()) + " ms");
    }
    std::this_thread::sleep_for(std::min<SteadyTime::duration>(pause, until - now));
    if (pause < std::chrono::milliseconds(1)) pause *= 2;
  }
  cleanup(true);
  return {};
}

}  // namespace tandem::device
