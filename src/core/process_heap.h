// The C library's heap, kept warm for the engine's forwards and given back when the daemon goes idle.
//
// glibc starts with a 128 KiB mmap threshold and trims the top of an arena as soon as more than twice that threshold
// is free (the threshold then grows to the largest block it unmapped, at most 32 MiB). A forward's activations are
// hundreds of KiB to tens of MiB that all die at the end of the forward: glibc unmaps or trims them, and the next
// forward faults every one of their pages in again, zeroed. On a virtual machine a page fault is a hypervisor exit;
// on the AMD EPYC VM these figures come from, a one-thread BF16 prefill of 128 tokens spent 25-35 % of its time there
// (docs/kernels.md, "The allocator's churn"). llama.cpp allocates its compute buffer once per context.
//
// keep_heap() fixes the two thresholds where glibc's own scheme ends up at most (mmap 32 MiB, trim 64 MiB): a
// forward's buffers come from an arena and stay mapped from one forward to the next. What that keeps is free heap,
// counted in the process's RSS; HeapReleaser says when an idle daemon hands it back (release_heap: malloc_trim).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "core/result.h"

namespace tandem::core {

struct HeapPolicy {
  std::size_t mmap_threshold = std::size_t{32} << 20;  // blocks at least this big get their own mapping
  std::size_t trim_threshold = std::size_t{64} << 20;  // free bytes at an arena's top kept mapped
  Status validate() const;  // both in [128 KiB, 1 GiB], trim >= mmap
};

// Applies the policy to the whole process (mallopt). Call once, before the models load: it also turns off glibc's
// growing mmap threshold for every later allocation. Errc::unsupported when the allocator is not glibc's (a sanitizer
// build's refuses mallopt): the process then runs on that allocator's own policy.
Status keep_heap(const HeapPolicy& policy = {});

// What the heap holds now (mallinfo2, every arena).
struct HeapFigures {
  std::uint64_t in_use = 0;   // allocated blocks in the arenas
  std::uint64_t free = 0;     // free blocks in the arenas (mapped or not: glibc does not say)
  std::uint64_t mmapped = 0;  // blocks with their own mapping
};
HeapFigures heap_figures();

// Gives the free pages of every arena back to the kernel (malloc_trim(0)). Takes each arena's lock in turn: call it
// when no forward runs. Returns whether glibc released anything.
bool release_heap();

// When to call release_heap(): once the process has been idle for `linger` after some activity (not again until
// there has been activity since). The start counts as activity: what loading the models left free goes back too.
// Pure policy over the caller's clock.
class HeapReleaser {
 public:
  using Clock = std::chrono::steady_clock;
  explicit HeapReleaser(std::chrono::milliseconds linger) : linger_(linger) {}
  // Called from the loop: `idle` whether nothing runs now. True when the heap should be released now.
  bool due(bool idle, Clock::time_point now);

 private:
  std::chrono::milliseconds linger_;
  bool used_ = true;                 // busy at some point since the last release (or the start)
  bool idle_known_ = false;          // idle_since_ is valid
  Clock::time_point idle_since_{};
};

}  // namespace tandem::core
