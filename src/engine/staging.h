// A copy through two staging halves that take turns (docs/residency.md, "Restoring fast"): torch-free, so the order
// of its steps is tested without a GPU (tests/engine/test_staging.cc). engine/upload.cc runs it on CUDA with two
// page-locked halves and asynchronous host-to-device copies, so that reading the next chunk out of the mapped model
// file overlaps the DMA of the previous one, and the bytes cross the bus from pinned memory (the driver's pageable
// path bounces them through its own small buffers).
#pragma once

#include <algorithm>
#include <cstdint>

namespace tandem::engine {

// Copies `bytes` bytes in chunks of at most `chunk` (> 0): for chunk k, half h = k % 2:
//   wait(h)              — the transfer that last used half h has finished (no-op the first time);
//   fill(h, offset, n)   — the source's bytes [offset, offset + n) into half h;
//   send(h, offset, n)   — start moving half h's n bytes to the destination at offset (may return before done).
// Then wait(0) and wait(1): when staged_copy returns, every byte has arrived. Returns the number of chunks.
template <class Fill, class Send, class Wait>
std::uint64_t staged_copy(std::uint64_t bytes, std::uint64_t chunk, Fill&& fill, Send&& send, Wait&& wait) {
  if (chunk == 0) chunk = 1;
  std::uint64_t chunks = 0;
  for (std::uint64_t off = 0; off < bytes; off += chunk, ++chunks) {
    const int h = static_cast<int>(chunks % 2);
    const std::uint64_t n = std::min(chunk, bytes - off);
    wait(h);
    fill(h, off, n);
    send(h, off, n);
  }
  wait(0);
  wait(1);
  return chunks;
}

}  // namespace tandem::engine
