// The heap of a benchmark that runs the engine: kept as tandemd keeps it (core/process_heap.h), unless the command
// line says --glibc-heap (glibc's defaults, for the comparison in docs/kernels.md, "The heap kept between forwards").
#pragma once

#include <cstdio>
#include <cstring>

#include "core/process_heap.h"

namespace tandem::bench {

// Takes --glibc-heap out of argv; false (with a message) when the policy cannot be applied.
inline bool setup_heap(int& argc, char** argv) {
  bool glibc = false;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--glibc-heap") == 0) glibc = true;
    else argv[out++] = argv[i];
  }
  argc = out;
  if (glibc) return true;
  if (auto st = core::keep_heap(); !st) {
    std::fprintf(stderr, "%s: %s (run with --glibc-heap to keep the allocator's own policy)\n", argv[0],
                 st.error().message.c_str());
    return false;
  }
  return true;
}

}  // namespace tandem::bench
