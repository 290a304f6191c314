// The engine's intra-op worker pool, without LibTorch (built from worker_pool.cc alone; also run under TSan).
#include <gtest/gtest.h>

#include <atomic>
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
