#include "engine/upload.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>

#include <ATen/ATen.h>

#include "device/host_pages.h"
#include "engine/staging.h"

#if defined(TANDEM_HAVE_TORCH_CUDA) && defined(TANDEM_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#define TANDEM_STAGING_CUDA 1
#endif

namespace tandem::engine {

namespace {

std::mutex g_mu;  // one staging buffer: uploads take turns (a load runs on one worker at a time anyway)
StagingStats g_stats;

#ifdef TANDEM_STAGING_CUDA
constexpr std::uint64_t kHalf = 16ull << 20;      // two halves: 32 MiB page-locked, allocated once per process
constexpr std::uint64_t kMinStaged = 1ull << 20;  // smaller tensors (norms, biases): one plain copy

bool staging_enabled() {
  const char* e = std::getenv("TANDEM_PINNED_STAGING");
  return !(e && std::string_view(e) == "0");
}

// Never destroyed: the pinned blocks and the events would otherwise be freed after the CUDA context at exit.
struct Staging {
  at::Tensor half[2];
  at::cuda::CUDAEvent done[2];
};
Staging& staging() {
  static Staging* s = [] {
    auto* st = new Staging();
    for (auto& h : st->half)
      h = at::empty({static_cast<std::int64_t>(kHalf)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    return st;
  }();
  return *s;
}
#endif

// The simulated accelerator's copy: a group of at least a huge page in one device::HostPages mapping (each tensor
// at a 64-byte offset; unmapped when the last of the tensors is freed); a smaller group, or one whose mapping is
// refused, cloned tensor by tensor (the allocator's path, which throws if host memory is out).
std::vector<at::Tensor> to_host_pages(std::span<const at::Tensor> cpu) {
  std::vector<at::Tensor> src, out;
  std::vector<std::uint64_t> offsets;
  std::uint64_t total = 0;
  for (const at::Tensor& t : cpu) {
    src.push_back(t.contiguous());
    offsets.push_back(total);
    total += (src.back().nbytes() + 63) / 64 * 64;
  }
  if (total >= device::HostPages::kHugePage) {
    if (auto pages = device::HostPages::map(total)) {
      auto held = std::make_shared<device::HostPages>(std::move(pages).value());
      for (std::size_t i = 0; i < src.size(); ++i) {
        auto* to = static_cast<unsigned char*>(held->data()) + offsets[i];
        if (src[i].nbytes() > 0) std::memcpy(to, src[i].data_ptr(), src[i].nbytes());
        out.push_back(at::from_blob(to, src[i].sizes(), [held](void*) mutable { held.reset(); }, src[i].options()));
      }
      return out;
    }
  }
  for (const at::Tensor& t : src) out.push_back(t.clone());
  return out;
}

}  // namespace

std::vector<at::Tensor> to_accelerator(std::span<const at::Tensor> cpu, at::Device dev) {
  if (!dev.is_cuda()) return to_host_pages(cpu);
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : cpu) out.push_back(to_accelerator(t, dev));
  return out;
}

at::Tensor to_accelerator(const at::Tensor& cpu, at::Device dev) {
  if (!dev.is_cuda()) return std::move(to_host_pages(std::span<const at::Tensor>(&cpu, 1)).front());
#ifdef TANDEM_STAGING_CUDA
  const at::Tensor src = cpu.contiguous();
  const std::uint64_t bytes = src.nbytes();
  if (bytes < kMinStaged || !staging_enabled()) return src.to(dev);
  const c10::cuda::CUDAGuard guard(dev);
  at::Tensor dst = at::empty(src.sizes(), src.options().device(dev));
  at::Tensor dst_bytes = dst.reshape({-1}).view(at::kByte);
  const auto* from = static_cast<const unsigned char*>(src.data_ptr());
  const auto t0 = std::chrono::steady_clock::now();
  std::lock_guard lock(g_mu);
  Staging& st = staging();
  const auto stream = at::cuda::getCurrentCUDAStream(dev.index());
  const std::uint64_t chunks = staged_copy(
      bytes, kHalf,
      [&](int h, std::uint64_t off, std::uint64_t n) { std::memcpy(st.half[h].data_ptr(), from + off, n); },
      [&](int h, std::uint64_t off, std::uint64_t n) {
        dst_bytes.narrow(0, static_cast<std::int64_t>(off), static_cast<std::int64_t>(n))
            .copy_(st.half[h].narrow(0, 0, static_cast<std::int64_t>(n)), /*non_blocking=*/true);
        st.done[h].record(stream);
      },
      [&](int h) { st.done[h].synchronize(); });
  ++g_stats.uploads;
  g_stats.bytes += bytes;
  g_stats.chunks += chunks;
  g_stats.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return dst;
#else
  return cpu.to(dev);
#endif
}

StagingStats staging_stats() {
  std::lock_guard lock(g_mu);
  return g_stats;
}

}  // namespace tandem::engine
