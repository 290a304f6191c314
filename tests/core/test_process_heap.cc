#include "core/process_heap.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

namespace tandem::core {
namespace {

using namespace std::chrono_literals;
using Clock = HeapReleaser::Clock;

TEST(HeapPolicy, ValidatesItsBounds) {
  struct Row {
    std::size_t mmap, trim;
    bool ok;
  };
  const Row rows[] = {
      {32u << 20, 64u << 20, true},   // the default
      {128u << 10, 128u << 10, true}, // the lowest
      {1u << 30, 1u << 30, true},     // the highest
      {64u << 10, 64u << 20, false},  // mmap below 128 KiB
      {32u << 20, 2u << 30, false},   // trim above 1 GiB
      {64u << 20, 32u << 20, false},  // trim below mmap
  };
  for (const Row& r : rows) {
    HeapPolicy p{r.mmap, r.trim};
    const Status st = p.validate();
    EXPECT_EQ(st.ok(), r.ok) << r.mmap << " / " << r.trim;
    if (!r.ok) {
      EXPECT_EQ(st.error().code, Errc::invalid_argument);
    }
  }
  HeapPolicy bad{64u << 10, 64u << 20};
  const Status st = keep_heap(bad);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, Errc::invalid_argument);
}

// One row per loop call: (ms since the start, idle now) -> due.
TEST(HeapReleaser, ReleasesOnceAfterTheLingerOfEachIdlePeriod) {
  struct Row {
    int ms;
    bool idle;
    bool due;
  };
  const Row rows[] = {
      {0, true, false},      // the start counts as activity: the linger starts now
      {999, true, false},    // not yet
      {1000, true, true},    // what loading left free goes back
      {5000, true, false},   // nothing ran since: not again
      {6000, false, false},  // busy
      {6500, false, false},
      {6600, true, false},   // idle again: the linger starts over
      {7000, false, false},  // busy before it ran out
      {7100, true, false},
      {8099, true, false},
      {8100, true, true},    // a second after the last activity
      {9200, true, false},
  };
  HeapReleaser r(1000ms);
  const Clock::time_point t0{};
  for (const Row& row : rows)
    EXPECT_EQ(r.due(row.idle, t0 + std::chrono::milliseconds(row.ms)), row.due) << "at " << row.ms << " ms";
}

std::uint64_t rss_bytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<std::uint64_t>(resident) * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

// The policy's point, measured on this process: a forward-sized block freed and taken again stays mapped (no fresh
// pages), and release_heap() gives the free pages back.
TEST(ProcessHeap, KeepsFreedBlocksMappedUntilReleased) {
  if (const Status st = keep_heap(); !st) {
    ASSERT_EQ(st.error().code, Errc::unsupported) << st.error().message;
    GTEST_SKIP() << "did not run: " << st.error().message;
  }
  constexpr std::size_t kBlock = 8u << 20;  // below the 32 MiB mmap threshold, above glibc's starting 128 KiB
  char* first = static_cast<char*>(std::malloc(kBlock));
  ASSERT_NE(first, nullptr);
  std::memset(first, 1, kBlock);
  EXPECT_LT(heap_figures().mmapped, kBlock) << "an 8 MiB block came from its own mapping";
  const std::uint64_t rss_held = rss_bytes();
  std::free(first);
  const std::uint64_t rss_freed = rss_bytes();
  EXPECT_GE(heap_figures().free, kBlock);
  // Kept: at most a few pages went (glibc may give back less than a page's worth of bookkeeping).
  EXPECT_GE(rss_freed + (1u << 20), rss_held) << "the freed block was given back to the kernel at once";
  char* again = static_cast<char*>(std::malloc(kBlock));
  ASSERT_NE(again, nullptr);
  std::memset(again, 2, kBlock);
  EXPECT_LE(rss_bytes(), rss_held + (1u << 20)) << "taking the block again mapped fresh pages";
  std::free(again);
  ASSERT_TRUE(release_heap());
  EXPECT_LE(rss_bytes() + kBlock / 2, rss_freed) << "release_heap() did not give the free pages back";
}

}  // namespace
}  // namespace tandem::core
