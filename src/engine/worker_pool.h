// A small fixed pool that splits one operation into N chunks (the caller runs chunk 0). Used for the engine's
// intra-op parallelism instead of OpenMP/OpenBLAS threads: those spin-wait, and on a host shared with other work
// (a compiler, a game) a spinning peer thread made 2-thread decode ~10x slower than 1 thread (measured). Idle
// workers here sleep on a condition variable after a short spin, so a busy host costs latency, not throughput.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
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

  // Runs fn(begin, end) over [0, n) cut into size() contiguous ranges whose bounds are multiples of `grain` (a
  // range may be empty; the last takes the rest), range 0 on the calling thread; all of it on the caller when n is
  // below 2 * grain or the pool has one thread. For row operations whose rows do not depend on each other: the
  // result is the same whatever the cut. An exception thrown by fn is rethrown here once every range has ended.
  template <class F>
  void split(std::int64_t n, std::int64_t grain, F&& fn) {
    const int t = size();
    if (t == 1 || n < 2 * grain) {
      if (n > 0) fn(std::int64_t{0}, n);
      return;
    }
    const std::int64_t units = (n + grain - 1) / grain;
    std::vector<std::exception_ptr> failed(static_cast<std::size_t>(t));
    run([&](int i) {
      const std::int64_t b = units * i / t * grain, e = i + 1 == t ? n : units * (i + 1) / t * grain;
      try {
        if (b < e) fn(b, e < n ? e : n);
      } catch (...) {
        failed[static_cast<std::size_t>(i)] = std::current_exception();
      }
    });
    for (const auto& f : failed)
      if (f) std::rethrow_exception(f);
  }

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
