// Weights to the accelerator (docs/residency.md, "Restoring fast"): the one place a replica's tensors are copied
// from the mapped model file to the device, at start and at every restore.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tandem::engine {

// `cpu` (usually a view of the mmap'd file, in the page cache when the CPU replica is warm) copied to `dev`. On CUDA
// tensors of 1 MiB and more go through one reused page-locked staging buffer, two 16 MiB halves taking turns
// (staged_copy): the next chunk is read out of the mapping while the previous one crosses the bus, from pinned
// memory. TANDEM_PINNED_STAGING=0 in the environment turns it off (the driver's pageable copy), to compare. On other
// devices (the simulated accelerator keeps its "device" memory on the host): copied into device::HostPages — huge
// pages backed at once, as a GPU's memory is there before the copy — when 2 MiB or more, else cloned.
at::Tensor to_accelerator(const at::Tensor& cpu, at::Device dev);

// The same for several tensors (a layer's matrices): on CUDA one by one; on other devices all in one HostPages
// mapping when they total 2 MiB or more (its whole-huge-page rounding paid once per group, not per tensor).
std::vector<at::Tensor> to_accelerator(std::span<const at::Tensor> cpu, at::Device dev);

// What the staging buffer has carried in this process (for logs and benchmarks).
struct StagingStats {
  std::uint64_t uploads = 0;  // tensors staged
  std::uint64_t bytes = 0;
  std::uint64_t chunks = 0;
  double seconds = 0;         // wall time of the staged uploads
};
StagingStats staging_stats();

}  // namespace tandem::engine
