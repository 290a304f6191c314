// staged_copy (src/engine/staging.h): the double-buffered copy under the CUDA upload — every byte arrives once, in
// place, for sizes around the chunk; a half is never refilled before its previous transfer was waited for; the last
// transfers are waited for before it returns. The "device" here is a buffer whose transfers complete only when waited
// for, so a refill too early would overwrite bytes not yet sent (and the comparison would fail).
#include "engine/staging.h"

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace tandem::engine {
namespace {

struct FakeDevice {
  std::vector<unsigned char> src, dst;
  std::vector<unsigned char> half[2];
  struct Pending {
    std::uint64_t off = 0, n = 0;
  };
  std::optional<Pending> pending[2];  // sent, not yet complete: its bytes land when waited for
  std::vector<std::string> log;
  int refills_while_pending = 0;

  void wait(int h) {
    log.push_back("wait" + std::to_string(h));
    if (!pending[h]) return;
    std::memcpy(dst.data() + pending[h]->off, half[h].data(), pending[h]->n);  // the DMA reads the half now
    pending[h].reset();
  }
  void fill(int h, std::uint64_t off, std::uint64_t n) {
    log.push_back("fill" + std::to_string(h));
    if (pending[h]) ++refills_while_pending;
    half[h].assign(src.begin() + static_cast<std::ptrdiff_t>(off), src.begin() + static_cast<std::ptrdiff_t>(off + n));
  }
  void send(int h, std::uint64_t off, std::uint64_t n) {
    log.push_back("send" + std::to_string(h));
    pending[h] = Pending{off, n};
  }
};

std::uint64_t copy(FakeDevice& d, std::uint64_t chunk) {
  return staged_copy(
      d.src.size(), chunk, [&](int h, std::uint64_t o, std::uint64_t n) { d.fill(h, o, n); },
      [&](int h, std::uint64_t o, std::uint64_t n) { d.send(h, o, n); }, [&](int h) { d.wait(h); });
}

TEST(StagedCopy, EveryByteArrivesForSizesAroundTheChunk) {
  for (std::uint64_t size : {0ull, 1ull, 63ull, 64ull, 65ull, 127ull, 128ull, 129ull, 1000ull, 4096ull}) {
    FakeDevice d;
    d.src.resize(size);
    for (std::size_t i = 0; i < size; ++i) d.src[i] = static_cast<unsigned char>((i * 131 + 7) & 0xff);
    d.dst.assign(size, 0);
    const std::uint64_t chunks = copy(d, 64);
    EXPECT_EQ(chunks, (size + 63) / 64) << size;
    EXPECT_EQ(d.dst, d.src) << "size " << size;
    EXPECT_EQ(d.refills_while_pending, 0) << size;
    EXPECT_FALSE(d.pending[0] || d.pending[1]) << "returned with a transfer in flight, size " << size;
  }
}

TEST(StagedCopy, HalvesTakeTurnsAndAreWaitedForBeforeReuse) {
  FakeDevice d;
  d.src.assign(200, 1);
  d.dst.assign(200, 0);
  copy(d, 64);  // chunks of 64, 64, 64, 8
  const std::vector<std::string> want = {"wait0", "fill0", "send0", "wait1", "fill1", "send1", "wait0", "fill0",
                                         "send0", "wait1", "fill1", "send1", "wait0",  "wait1"};
  EXPECT_EQ(d.log, want);
}

TEST(StagedCopy, AZeroChunkStillCopies) {
  FakeDevice d;
  d.src = {1, 2, 3};
  d.dst.assign(3, 0);
  EXPECT_EQ(copy(d, 0), 3u);
  EXPECT_EQ(d.dst, d.src);
}

}  // namespace
}  // namespace tandem::engine
