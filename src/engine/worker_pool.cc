#include "engine/worker_pool.h"

#include <chrono>

namespace tandem::engine {

namespace {
// Polling before sleeping. The caller waits briefly for the last chunk; workers poll for the next job for up to
// kWorkerSpin, which covers the gaps between the matrix products of one decode step (elementwise work, tens of
// microseconds) so they are not put to sleep and woken ~85 times per token. Between tokens they sleep.
constexpr int kSpin = 4000;
constexpr auto kWorkerSpin = std::chrono::microseconds(300);
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

WorkerPool::WorkerPool(int threads, std::function<void()> init) {
  try {
    for (int i = 1; i < threads; ++i)
      workers_.emplace_back([this, i, init] {
        if (init) init();
        loop(i);
      });
  } catch (...) {
    // A thread could not be started: stop and join the ones that were, then report (never destroy a joinable
    // std::thread).
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      ++generation_;
      published_.store(generation_, std::memory_order_release);
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
    throw;
  }
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    ++generation_;
    published_.store(generation_, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void WorkerPool::run(const std::function<void(int)>& fn) {
  if (workers_.empty()) {
    fn(0);
    return;
  }
  {
    std::lock_guard lock(mu_);
    job_ = &fn;
    remaining_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    ++generation_;
    published_.store(generation_, std::memory_order_release);
  }
  wake_.notify_all();
  fn(0);
  for (int i = 0; i < kSpin && remaining_.load(std::memory_order_acquire) != 0; ++i) cpu_relax();
  if (remaining_.load(std::memory_order_acquire) != 0) {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return remaining_.load(std::memory_order_acquire) == 0; });
  }
}

void WorkerPool::loop(int index) {
  std::uint64_t seen = 0;
  for (;;) {
    const auto spin_until = std::chrono::steady_clock::now() + kWorkerSpin;
    for (int i = 0; published_.load(std::memory_order_acquire) == seen; ++i) {
      cpu_relax();
      if ((i & 63) == 0 && std::chrono::steady_clock::now() > spin_until) break;
    }
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (stop_) return;
      job = job_;
    }
    (*job)(index);
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard lock(mu_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace tandem::engine
