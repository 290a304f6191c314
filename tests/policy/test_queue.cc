#include <gtest/gtest.h>

#include "fixtures.h"

namespace tandem::policy {
namespace {

using testing::at;

QueueEntry entry(JobId id, std::uint32_t prompt, std::uint32_t max_new, Clock::duration accepted) {
  return QueueEntry{id, prompt, max_new, at(accepted)};
}

TEST(Rates, EwmaSmoothingAndIgnoredSamples) {
  ServiceRates r(RateConfig{0.5, 100.0, 10.0});
  EXPECT_DOUBLE_EQ(r.prefill_tps(), 100.0);
  r.observe_prefill(300, 1s);  // 300 tok/s → 0.5 × 300 + 0.5 × 100
  EXPECT_DOUBLE_EQ(r.prefill_tps(), 200.0);
  r.observe_decode(20, 1s);
  EXPECT_DOUBLE_EQ(r.decode_tps(), 15.0);
  r.observe_decode(0, 1s);
  r.observe_decode(10, 0s);
  r.observe_decode(10, -1s);
  EXPECT_DOUBLE_EQ(r.decode_tps(), 15.0);
  EXPECT_EQ(r.service_time(200, 15), 2s);
}

enum class Op { enqueue, start_next, start_direct, finish, cancel };

struct Step {
  Op op;
  QueueEntry e;
  bool ok;
  JobId started;  // start_next: id expected (0 = none)
  std::size_t depth, running;
};

TEST(Queue, PerStepFifoTable) {
  JobQueue q("gpu_queue", QueueConfig{3, 2, 1000, 500});
  const Step steps[] = {
      {Op::enqueue, entry(1, 10, 10, 1s), true, 0, 1, 0},
      {Op::enqueue, entry(2, 10, 10, 2s), true, 0, 2, 0},
      {Op::start_direct, entry(9, 10, 10, 3s), false, 0, 2, 0},  // jobs queued: no bypass
      {Op::enqueue, entry(3, 10, 10, 0s), true, 0, 3, 0},        // accepted earlier (moved from the other queue)
      {Op::enqueue, entry(4, 10, 10, 4s), false, 0, 3, 0},       // full
      {Op::enqueue, entry(2, 10, 10, 5s), false, 0, 3, 0},       // duplicate
      {Op::start_next, {}, true, 3, 2, 1},                       // oldest acceptance first
      {Op::start_next, {}, true, 1, 1, 2},
      {Op::start_next, {}, false, 0, 1, 2},                      // concurrency 2
      {Op::cancel, entry(2, 0, 0, 0s), true, 0, 0, 2},           // cancel while queued
      {Op::cancel, entry(3, 0, 0, 0s), true, 0, 0, 1},           // cancel while running
      {Op::cancel, entry(3, 0, 0, 0s), false, 0, 0, 1},          // twice: nothing
      {Op::start_direct, entry(5, 10, 10, 6s), true, 0, 0, 2},
      {Op::start_direct, entry(6, 10, 10, 6s), false, 0, 0, 2},  // no slot
      {Op::finish, entry(1, 0, 0, 0s), true, 0, 0, 1},
      {Op::finish, entry(1, 0, 0, 0s), false, 0, 0, 1},
      {Op::enqueue, entry(7, 900, 101, 7s), false, 0, 0, 1},     // context 1001 > 1000
      {Op::enqueue, entry(7, 10, 501, 7s), false, 0, 0, 1},      // max_new > 500
  };
  int i = 0;
  for (const auto& s : steps) {
    bool ok = true;
    switch (s.op) {
      case Op::enqueue: ok = q.enqueue(s.e).ok(); break;
      case Op::start_direct: ok = q.start_direct(s.e).ok(); break;
      case Op::start_next: {
        auto got = q.start_next();
        ok = got.has_value();
        if (got) { EXPECT_EQ(got->id, s.started) << "step " << i; }
        break;
      }
      case Op::finish: ok = q.finish(s.e.id) == Removed::running; break;
      case Op::cancel: ok = q.cancel(s.e.id) != Removed::none; break;
    }
    EXPECT_EQ(ok, s.ok) << "step " << i;
    EXPECT_EQ(q.depth(), s.depth) << "step " << i;
    EXPECT_EQ(q.running(), s.running) << "step " << i;
    ++i;
  }
}

TEST(Queue, ErrorsAreTyped) {
  JobQueue q("cpu_queue", QueueConfig{1, 1, 100, 50});
  EXPECT_EQ(q.enqueue(entry(1, 60, 50, 0s)).error().message,
            "prompt + max_new_tokens = 110 exceeds cpu_queue.max_context 100");
  EXPECT_EQ(q.enqueue(entry(1, 10, 51, 0s)).error().code, Errc::invalid_argument);
  ASSERT_TRUE(q.enqueue(entry(1, 10, 10, 0s)).ok());
  EXPECT_EQ(q.enqueue(entry(1, 10, 10, 0s)).error().code, Errc::duplicate);
  EXPECT_EQ(q.enqueue(entry(2, 10, 10, 0s)).error().code, Errc::queue_full);
  EXPECT_EQ(q.start_direct(entry(3, 10, 10, 0s)).error().code, Errc::rejected);
}

TEST(Queue, PositionsOldestAgeAndRemove) {
  JobQueue q("gpu_queue", QueueConfig{10, 1, 1000, 500});
  EXPECT_EQ(q.oldest_age(at(100s)), 0s);
  for (JobId id = 1; id <= 4; ++id) ASSERT_TRUE(q.enqueue(entry(id, 10, 10, std::chrono::seconds(id))).ok());
  EXPECT_EQ(q.position(1), 0u);
  EXPECT_EQ(q.position(4), 3u);
  EXPECT_EQ(q.position(99), std::nullopt);
  EXPECT_EQ(q.oldest_age(at(10s)), 9s);
  EXPECT_EQ(q.oldest_age(at(0s)), 0s);  // clock behind the entry: no negative age
  EXPECT_EQ(q.remove(1), Removed::queued);
  EXPECT_EQ(q.position(4), 2u);
  EXPECT_EQ(q.oldest_age(at(10s)), 8s);
  EXPECT_EQ(q.head()->id, 2u);
  EXPECT_TRUE(q.contains(3));
  EXPECT_FALSE(q.contains(1));
}

// ETA = (work queued ahead + remaining work of running jobs) / concurrency, at the smoothed rates.
TEST(Queue, EtaFromRatesAndWorkAhead) {
  JobQueue q("gpu_queue", QueueConfig{10, 2, 10000, 5000}, RateConfig{1.0, 100.0, 10.0});
  EXPECT_EQ(q.eta_start_for_new(), 0s);                     // idle
  ASSERT_TRUE(q.start_direct(entry(1, 100, 10, 0s)).ok());  // 1s prefill + 1s decode
  EXPECT_EQ(q.eta_start_for_new(), 0s);                     // a slot is still free
  ASSERT_TRUE(q.start_direct(entry(2, 100, 10, 0s)).ok());
  EXPECT_EQ(q.eta_start_for_new(), 2s);                     // (2s + 2s) / 2 slots
  ASSERT_TRUE(q.enqueue(entry(3, 200, 20, 1s)).ok());       // 4s of work
  EXPECT_EQ(q.eta_start(3), 2s);
  EXPECT_EQ(q.eta_start_for_new(), 4s);                     // (2 + 2 + 4) / 2
  EXPECT_EQ(q.eta_done_for_new(100, 10), 6s);
  q.update_progress(1, true, 5);                            // job 1: prefill done, 5 of 10 tokens
  EXPECT_EQ(q.eta_start(3), std::chrono::milliseconds(1250));  // (0.5 + 2) / 2
  q.update_progress(1, true, 3);                            // progress never goes back
  EXPECT_EQ(q.eta_start(3), std::chrono::milliseconds(1250));
  // Faster observed decode shortens the ETA.
  q.rates().observe_decode(20, 1s);
  EXPECT_EQ(q.eta_start(3), std::chrono::milliseconds(875));  // (1s prefill + 15 tokens at 20/s) / 2
  EXPECT_EQ(q.finish(1), Removed::running);
  EXPECT_EQ(q.finish(2), Removed::running);
  EXPECT_EQ(q.eta_start(3), 0s);  // head with a free slot: no slot wait (memory is the ladder's memory wait)
  EXPECT_EQ(q.eta_start(42), std::nullopt);
}

// The running jobs' remaining work, soonest first, and queued jobs' acceptance times: the inputs of the ladder's
// memory wait and of its bound on the time waited (review #1).
TEST(Queue, RunningWorkAndAcceptance) {
  JobQueue q("gpu_queue", QueueConfig{10, 3, 10000, 5000}, RateConfig{1.0, 100.0, 10.0});
  ASSERT_TRUE(q.start_direct(entry(1, 100, 100, 0s)).ok());  // 1 s + 10 s
  ASSERT_TRUE(q.start_direct(entry(2, 200, 20, 0s)).ok());   // 2 s + 2 s
  ASSERT_TRUE(q.enqueue(entry(3, 10, 10, 5s)).ok());
  q.update_progress(1, true, 50);                              // 5 s left
  const std::vector<RunningWork> expect = {{2, 4s}, {1, 5s}};
  const auto got = q.running_work();
  ASSERT_EQ(got.size(), expect.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].id, expect[i].id) << i;
    EXPECT_EQ(got[i].remaining, expect[i].remaining) << i;
  }
  EXPECT_EQ(q.accepted_at(3), at(5s));
  EXPECT_EQ(q.accepted_at(1), std::nullopt);  // running, not queued
  EXPECT_EQ(q.accepted_at(42), std::nullopt);
}

TEST(Queue, TenThousandQueuedKeepsSumsExact) {
  JobQueue q("gpu_queue", QueueConfig{10000, 4, 100000, 50000}, RateConfig{1.0, 1000.0, 100.0});
  for (JobId id = 0; id < 10000; ++id) ASSERT_TRUE(q.enqueue(entry(id, 100, 100, std::chrono::milliseconds(id))).ok());
  EXPECT_TRUE(q.full());
  // 10000 × (0.1s + 1s) / 4 slots.
  EXPECT_EQ(q.eta_start_for_new(), 2750s);
  for (JobId id = 0; id < 10000; id += 2) EXPECT_EQ(q.cancel(id), Removed::queued);
  EXPECT_EQ(q.depth(), 5000u);
  EXPECT_EQ(q.eta_start_for_new(), 1375s);
  EXPECT_EQ(q.head()->id, 1u);
}

}  // namespace
}  // namespace tandem::policy
