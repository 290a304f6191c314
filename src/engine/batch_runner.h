// Continuous batching: one thread per model replica runs a step loop over every generation submitted to it. Each
// step is one Model::forward_batch: one token for every decoding sequence plus prompt chunks of new ones, within a
// per-step token budget, so a long prompt is prefilled a chunk per step while the others keep decoding. Sequences
// join and leave between steps. Sampling, stops, checkpoints and cancellation stay per generation. A failure of a
// step (device lost, an allocation refused) ends every member with that error; each caller then applies its own
// failover. Torch-free (it drives Model's plain-vector API). docs/batching.md.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/result.h"
#include "engine/generation.h"
#include "engine/model.h"

namespace tandem::engine {

struct BatchLimits {
  int max_batch = 4;      // sequences per step (the route's concurrency)
  int step_tokens = 512;  // tokens per step: decode tokens + prefill chunks
  // Prompt chunk of a request that sets no prefill_chunk of its own: 0 = step_tokens - max_batch + 1 (at least
  // 1), so one chunk always fits next to the other sequences' decode tokens.
  int prefill_chunk = 0;
  Status validate() const;
  int chunk_for(const GenerateRequest& r) const;  // the chunk a generation's prompt is cut into
};

// What one step did (for the caller's step-cost model and ETAs).
struct StepStats {
  int batch = 0;           // sequences in the forward
  int tokens = 0;          // tokens in the forward
  int prefill_tokens = 0;  // of which prompt / checkpoint tokens
  double ms = 0;           // wall time of the forward
  // What the previous step took after its forward (sampling, delivering its tokens and ends) before this step
  // could start: the rest of what a step costs the loop, measured one step late (0 for the runner's first step).
  double after_ms = 0;
};

class BatchRunner {
 public:
  // Called on the runner's thread, in this order: prefilled once (unless it failed before), token per sampled
  // token (TokenEvent::token -1: trailing text without a token), finished last (exactly once).
  struct Callbacks {
    std::function<void(std::uint32_t prompt_tokens, double ms)> prefilled;
    std::function<void(const TokenEvent&)> token;
    std::function<void(FinishReason reason, const Status& status)> finished;
  };

  BatchRunner(std::shared_ptr<Model> model, BatchLimits limits, std::function<void(const StepStats&)> on_step = {});
  ~BatchRunner();  // cancels what is still running (finished callbacks with FinishReason::cancelled) and joins
  BatchRunner(const BatchRunner&) = delete;
  BatchRunner& operator=(const BatchRunner&) = delete;

  // Queues a generation (created on this runner's model). It joins the batch at the next step with a free slot
  // (FIFO). `cancel` (may be null) is polled before every step; it must outlive the finished callback.
  Status submit(std::unique_ptr<Generation> g, Callbacks cb, const std::atomic<bool>* cancel = nullptr);

  const std::shared_ptr<Model>& model() const { return model_; }
  const BatchLimits& limits() const { return limits_; }
  std::size_t active() const;  // running + waiting
  std::uint64_t steps() const { return steps_.load(); }

 private:
  struct Member {
    std::unique_ptr<Generation> gen;
    Callbacks cb;
    const std::atomic<bool>* cancel = nullptr;
    int chunk = 0;
    double prefill_ms = 0;
    bool announced = false;  // prefilled callback sent
  };
  void loop();
  void step(std::vector<Member>& running);
  void end(Member& m, const Status& st);

  std::shared_ptr<Model> model_;
  BatchLimits limits_;
  std::function<void(const StepStats&)> on_step_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Member> waiting_;
  std::size_t running_count_ = 0;
  bool stopping_ = false;
  std::atomic<std::uint64_t> steps_{0};
  double last_after_ms_ = 0;  // the runner thread's: StepStats::after_ms of the next step
  std::thread thread_;
};

}  // namespace tandem::engine
