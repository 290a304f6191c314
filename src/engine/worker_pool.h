// A small fixed pool that splits one operation into N chunks (the caller runs chunk 0). Used for the engine's
// intra-op parallelism instead of OpenMP/OpenBLAS threads: those spin-wait, and on a host shared with other work
// (a compiler, a game) a spinning peer thread made 2-thread decode ~10x slower than 1 thread (measured). Idle
// workers here sleep on a condition variable after a short spin, so a busy host costs latency, not throughput.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem::engine {

class WorkerPool {
 public:
  // `threads` total, including the caller: threads - 1 workers are started. `init` runs once on each worker.
  explicit WorkerPool(int threads, std::function<void()> init = {});
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Runs fn(0) .. fn(size()-1), chunk 0 on the calling thread; returns when all are done. Not reentrant: one
  // run() at a time per pool (callers serialize; the engine holds the model's compute lock).
  void run(const std::function<void(int)>& fn);

 private:
  void loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  std::uint64_t generation_ = 0;
  std::atomic<std::uint64_t> published_{0};
  std::atomic<int> remaining_{0};
  bool stop_ = false;
};

}  // namespace tandem::engine
