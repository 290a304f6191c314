#include "device/host_pages.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14 (uapi/asm-generic/mman-common.h); older headers lack the name
#endif

namespace tandem::device {

Result<HostPages> HostPages::map(std::uint64_t bytes) {
  if (bytes == 0) return fail(Errc::invalid_argument, "host pages: 0 bytes");
  if (bytes > (std::uint64_t{1} << 47))
    return fail(Errc::invalid_argument, "host pages: " + std::to_string(bytes) + " bytes is past the address space");
  const std::uint64_t len = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  // One huge page more than needed, then the unaligned head and the tail cut off: the memory starts at a 2 MiB
  // boundary, so every 2 MiB of it can be one huge page.
  const std::uint64_t span = len + kHugePage;
  void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    return fail(Errc::out_of_memory, "host pages: mapping " + std::to_string(bytes) + " bytes: " + std::strerror(e));
  }
  const auto start = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) ::munmap(p, aligned - start);
  const std::uint64_t tail = (start + span) - (aligned + len);
  if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + len), tail);

  HostPages h;
  h.base_ = reinterpret_cast<void*>(aligned);
  h.bytes_ = bytes;
  h.len_ = len;
  h.huge_ = ::madvise(h.base_, len, MADV_HUGEPAGE) == 0;
  if (::madvise(h.base_, len, MADV_POPULATE_WRITE) == 0) {
    h.backed_ = true;
  } else if (errno != EINVAL) {  // EINVAL: a kernel before 5.14 — the pages come on first touch instead
    const int e = errno;
    return fail(Errc::out_of_memory, "host pages: backing " + std::to_string(bytes) + " bytes: " + std::strerror(e));
  }  // (h unmaps on the error path)
  return h;
}

HostPages::HostPages(HostPages&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      len_(std::exchange(o.len_, 0)),
      huge_(std::exchange(o.huge_, false)),
      backed_(std::exchange(o.backed_, false)) {}

HostPages& HostPages::operator=(HostPages&& o) noexcept {
  if (this != &o) {
    unmap();
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    len_ = std::exchange(o.len_, 0);
    huge_ = std::exchange(o.huge_, false);
    backed_ = std::exchange(o.backed_, false);
  }
  return *this;
}

HostPages::~HostPages() { unmap(); }

void HostPages::unmap() noexcept {
  if (base_) ::munmap(base_, len_);
  base_ = nullptr;
  bytes_ = len_ = 0;
}

}  // namespace tandem::device
