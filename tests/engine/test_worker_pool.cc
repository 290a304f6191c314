// The engine's intra-op worker pool, without LibTorch (built from worker_pool.cc alone; also run under TSan).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <cstdint>
#include <thread>
#include <vector>

#include "engine/worker_pool.h"

using tandem::engine::WorkerPool;

TEST(WorkerPool, EveryChunkRunsExactlyOncePerRun) {
  for (int threads : {1, 2, 3, 8}) {
    WorkerPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    std::vector<std::atomic<int>> hits(static_cast<std::size_t>(threads));
    for (int run = 0; run < 300; ++run) {
      pool.run([&](int i) { hits[static_cast<std::size_t>(i)].fetch_add(1, std::memory_order_relaxed); });
      for (int i = 0; i < threads; ++i) ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), run + 1) << threads;
    }
  }
}

// split() covers [0, n) exactly once with ranges on multiples of the grain (the last one ends at n), and keeps small
// jobs on the caller.
TEST(WorkerPool, SplitCoversEveryIndexOnceOnGrainBounds) {
  for (int threads : {1, 2, 3, 4}) {
    WorkerPool pool(threads);
    for (std::int64_t n : {0, 1, 7, 15, 16, 17, 31, 32, 100, 1000, 4097}) {
      for (std::int64_t grain : {1, 8, 16}) {
        std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
        std::atomic<int> ranges{0}, off_caller{0};
        const auto caller = std::this_thread::get_id();
        pool.split(n, grain, [&](std::int64_t b, std::int64_t e) {
          ASSERT_LT(b, e);
          ASSERT_LE(e, n);
          ASSERT_EQ(b % grain, 0);
          if (e != n) ASSERT_EQ(e % grain, 0);
          for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1);
          ranges.fetch_add(1);
          if (std::this_thread::get_id() != caller) off_caller.fetch_add(1);
        });
        for (std::int64_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1) << threads << " " << n << " " << grain << " " << i;
        ASSERT_LE(ranges.load(), threads);
        if (n < 2 * grain || threads == 1) {
          EXPECT_EQ(off_caller.load(), 0) << "a small job stays on the caller";
          EXPECT_EQ(ranges.load(), n > 0 ? 1 : 0);
        }
      }
    }
  }
}

// An exception in any range comes back to the caller after every range has ended; the pool keeps working.
TEST(WorkerPool, SplitRethrowsAfterEveryRangeEnds) {
  WorkerPool pool(3);
  for (int thrower = 0; thrower < 3; ++thrower) {
    std::atomic<int> ended{0};
    EXPECT_THROW(pool.split(300, 1,
                            [&](std::int64_t b, std::int64_t) {
                              const int range = static_cast<int>(b / 100);
                              if (range == thrower) throw std::runtime_error("range failed");
                              std::this_thread::sleep_for(std::chrono::milliseconds(20));
                              ended.fetch_add(1);
                            }),
                 std::runtime_error);
    EXPECT_EQ(ended.load(), 2) << "the other ranges ran to their end first";
  }
  std::atomic<std::int64_t> sum{0};
  pool.split(300, 1, [&](std::int64_t b, std::int64_t e) { sum.fetch_add(e - b); });
  EXPECT_EQ(sum.load(), 300);
}

TEST(WorkerPool, ChunkZeroRunsOnTheCaller) {
  WorkerPool pool(3);
  std::thread::id chunk0;
  std::vector<std::thread::id> others(3);
  pool.run([&](int i) {
    if (i == 0) chunk0 = std::this_thread::get_id();
    others[static_cast<std::size_t>(i)] = std::this_thread::get_id();
  });
  EXPECT_EQ(chunk0, std::this_thread::get_id());
  EXPECT_NE(others[1], std::this_thread::get_id());
  EXPECT_NE(others[1], others[2]);
}

TEST(WorkerPool, ResultsWrittenByWorkersAreVisibleAfterRun) {
  WorkerPool pool(4);
  std::vector<long> out(4 * 1000);
  for (int round = 0; round < 50; ++round) {
    pool.run([&](int i) {
      for (int k = 0; k < 1000; ++k) out[static_cast<std::size_t>(i * 1000 + k)] = round * 7 + i + k;
    });
    for (int i = 0; i < 4; ++i)
      for (int k = 0; k < 1000; k += 97) ASSERT_EQ(out[static_cast<std::size_t>(i * 1000 + k)], round * 7 + i + k);
  }
}

TEST(WorkerPool, SleepsBetweenBurstsAndWakesAgain) {
  WorkerPool pool(2);
  std::atomic<int> n{0};
  for (int burst = 0; burst < 5; ++burst) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // longer than the workers' spin: they sleep
    pool.run([&](int) { n.fetch_add(1); });
  }
  EXPECT_EQ(n.load(), 10);
}

TEST(WorkerPool, InitRunsOnEveryWorkerAndDestructionJoins) {
  std::atomic<int> inits{0};
  {
    WorkerPool pool(5, [&] { inits.fetch_add(1); });
    pool.run([](int) {});
    EXPECT_EQ(inits.load(), 4);
  }
  WorkerPool idle(3);  // destroyed without ever running: must not hang
}
