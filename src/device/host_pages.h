// The simulated accelerator's "device memory" (docs/residency.md, "Restoring fast"): host memory mapped the way a
// GPU's allocator holds its own — in 2 MiB pages, backed before the bytes are written instead of one 4 KiB page
// fault at a time on first touch — and unmapped, so given back to the host, when it is freed. A restore on the
// simulated device then costs about the copy of the bytes, as on a GPU, instead of ~100,000 page faults per 450 MiB
// (under a virtualized kernel each one an exit: 10x the copy). Torch-free; the engine wraps it in tensors
// (engine/upload.cc).
#pragma once

#include <cstdint>

#include "core/result.h"

namespace tandem::device {

class HostPages {
 public:
  static constexpr std::uint64_t kHugePage = 2ull << 20;  // x86-64's transparent huge page

  // `bytes` (> 0) of zeroed memory at a 2 MiB boundary and in whole 2 MiB pages (the rest of the last one is mapped
  // too: a tail of 4 KiB pages would cost, under a virtualized kernel, an exit per page when first written — 0.8 GB/s
  // against 16 on the EPYC VM this was measured on), advised for transparent huge pages (MADV_HUGEPAGE) and backed
  // before it returns (MADV_POPULATE_WRITE: the kernel allocates and zeroes every page in one call). Where the kernel
  // takes no huge-page advice (THP off) or cannot back a range in one call (before Linux 5.14) the memory is still
  // valid and zeroed, only faulted in on first touch: huge() / backed() say which. Errors: out_of_memory (the mapping
  // or its backing refused; nothing stays mapped), invalid_argument (0 bytes, or past the address space).
  static Result<HostPages> map(std::uint64_t bytes);

  HostPages() = default;
  HostPages(HostPages&& o) noexcept;
  HostPages& operator=(HostPages&& o) noexcept;
  HostPages(const HostPages&) = delete;
  HostPages& operator=(const HostPages&) = delete;
  ~HostPages();

  void* data() const { return base_; }
  std::uint64_t size() const { return bytes_; }         // as asked
  std::uint64_t mapped_bytes() const { return len_; }  // rounded up to whole 2 MiB pages
  bool huge() const { return huge_; }
  bool backed() const { return backed_; }  // every page backed by map() (false: on first touch)

 private:
  void unmap() noexcept;

  void* base_ = nullptr;
  std::uint64_t bytes_ = 0, len_ = 0;
  bool huge_ = false, backed_ = false;
};

}  // namespace tandem::device
