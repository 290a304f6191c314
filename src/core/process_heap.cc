#include "core/process_heap.h"

#include <malloc.h>

#include <string>

namespace tandem::core {

Status HeapPolicy::validate() const {
  constexpr std::size_t lo = std::size_t{128} << 10, hi = std::size_t{1} << 30;
  if (mmap_threshold < lo || mmap_threshold > hi)
    return fail(Errc::invalid_argument, "heap: mmap threshold " + std::to_string(mmap_threshold) +
                                            " is outside [128 KiB, 1 GiB]");
  if (trim_threshold < lo || trim_threshold > hi)
    return fail(Errc::invalid_argument, "heap: trim threshold " + std::to_string(trim_threshold) +
                                            " is outside [128 KiB, 1 GiB]");
  if (trim_threshold < mmap_threshold)
    return fail(Errc::invalid_argument, "heap: the trim threshold is below the mmap threshold");
  return {};
}

Status keep_heap(const HeapPolicy& policy) {
  if (auto st = policy.validate(); !st) return st;
  // mallopt returns 1 on success and 0 when it refuses: glibc for a value out of its range (validate() keeps ours
  // inside), a replacement allocator (the sanitizers' among them) for every call.
  if (::mallopt(M_MMAP_THRESHOLD, static_cast<int>(policy.mmap_threshold)) != 1)
    return fail(Errc::unsupported, "heap: the allocator refused mallopt(M_MMAP_THRESHOLD, " +
                                       std::to_string(policy.mmap_threshold) + ") (not glibc's malloc?)");
  if (::mallopt(M_TRIM_THRESHOLD, static_cast<int>(policy.trim_threshold)) != 1)
    return fail(Errc::unsupported, "heap: the allocator refused mallopt(M_TRIM_THRESHOLD, " +
                                       std::to_string(policy.trim_threshold) + ") (not glibc's malloc?)");
  return {};
}

HeapFigures heap_figures() {
  const struct mallinfo2 mi = ::mallinfo2();
  HeapFigures f;
  f.in_use = mi.uordblks;
  f.free = mi.fordblks;
  f.mmapped = mi.hblkhd;
  return f;
}

bool release_heap() { return ::malloc_trim(0) == 1; }

bool HeapReleaser::due(bool idle, Clock::time_point now) {
  if (!idle) {
    used_ = true;
    idle_known_ = false;
    return false;
  }
  if (!used_) return false;
  if (!idle_known_) {
    idle_known_ = true;
    idle_since_ = now;
  }
  if (now - idle_since_ < linger_) return false;
  used_ = false;
  idle_known_ = false;
  return true;
}

}  // namespace tandem::core
