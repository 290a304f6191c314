// CompletionWriter (src/ring/completion_writer.cc): writes, CQ / response-area full → backlog, flush after the
// client's head moves, token merging, over-limit token drop (kCqeGap, overflow counter and flag), control completions
// never dropped, invalid client head → Fault::cq_index, the wake-up decision.
#include "ring/completion_writer.h"

#include <gtest/gtest.h>

#include <random>

#include "ring_test_util.h"

namespace tandem::ring {
namespace {

using test::TestSession;

struct Seen {
  CompletionEntry entry;
  std::vector<std::uint8_t> data;
  std::vector<std::int32_t> ids() const {
    std::vector<std::int32_t> v(entry.count);
    if (entry.count) std::memcpy(v.data(), data.data(), entry.count * 4u);
    return v;
  }
  std::string text() const {
    return std::string(reinterpret_cast<const char*>(data.data()) + entry.count * 4u, entry.text_length);
  }
};

class WriterTest : public ::testing::Test {
 protected:
  void make(std::uint64_t max_backlog = 1 << 20, std::uint64_t response_bytes = 4096) {
    s = TestSession::create({8, 8, 4096, response_bytes});
    w = CompletionWriter(s->view(), max_backlog);
  }
  void SetUp() override { make(); }

  // The client's side, by hand: copy out [head, tail), publish the head.
  std::vector<Seen> reap(std::uint32_t max = ~0u) {
    std::vector<Seen> out;
    const std::uint32_t tail = load_acquire(&s->cq()->tail);
    const std::uint32_t mask = s->layout.cq_entries - 1;
    while (head != tail && out.size() < max) {
      Seen e;
      std::memcpy(&e.entry, s->view().cqes() + (head & mask), sizeof e.entry);
      EXPECT_LE(e.entry.data_offset + e.entry.data_length, s->layout.response_data_size);
      const auto* p = s->view().response_data() + e.entry.data_offset;
      e.data.assign(p, p + e.entry.data_length);
      out.push_back(std::move(e));
      ++head;
    }
    s->set_cq_head(head);
    return out;
  }
  std::uint32_t shared_tail() const { return load_acquire(&s->cq()->tail); }
  std::uint32_t daemon_flags() const { return load_acquire(&s->cq()->daemon_flags); }
  void fill_cq() {
    for (std::uint32_t i = 0; i < s->layout.cq_entries; ++i)
      ASSERT_EQ(w.post(record_completion(Kind::nop, 900 + i, 0, {})), Fault::none);
    ASSERT_EQ(shared_tail() - head, s->layout.cq_entries);
    ASSERT_FALSE(w.backlogged());
  }
  static std::vector<std::uint8_t> rec(std::size_t bytes) {
    std::string v(bytes - kFieldHeaderSize - 1, 'r');
    return RecordWriter().add("x", std::string_view(v)).take();
  }

  std::unique_ptr<TestSession> s;
  CompletionWriter w;
  std::uint32_t head = 0;
};

TEST_F(WriterTest, WritesARecordCompletion) {
  const auto r = RecordWriter().add("job_id", std::uint64_t{100}).add("queue", "q").take();
  ASSERT_EQ(w.post(record_completion(Kind::accepted, 7, 100, r)), Fault::none);
  EXPECT_EQ(shared_tail(), 1u);
  EXPECT_EQ(w.tail(), 1u);
  auto seen = reap();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].entry.user_data, 7u);
  EXPECT_EQ(seen[0].entry.job_id, 100u);
  EXPECT_EQ(seen[0].entry.kind, static_cast<std::uint8_t>(Kind::accepted));
  EXPECT_EQ(seen[0].entry.flags, 0);
  EXPECT_EQ(seen[0].entry.error, 0);
  EXPECT_EQ(seen[0].data, r);
  for (auto b : seen[0].entry.reserved) EXPECT_EQ(b, 0);
  EXPECT_EQ(w.stats().posted, 1u);
  EXPECT_EQ(w.stats().written, 1u);
  EXPECT_EQ(daemon_flags(), 0u);
}

TEST_F(WriterTest, ErrorCompletionCarriesTheCode) {
  ASSERT_EQ(w.post(record_completion(Kind::error, 3, 0, RecordWriter().add("error", "QueueFull").take(),
                                     ErrorCode::queue_full)),
            Fault::none);
  auto seen = reap();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].entry.error, static_cast<std::uint16_t>(ErrorCode::queue_full));
}

TEST_F(WriterTest, TokenPayloadIsIdsThenText) {
  ASSERT_EQ(w.post(token_completion(1, 2, 10, {5, -6, 7}, "abc")), Fault::none);
  auto seen = reap();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].entry.step, 10u);
  EXPECT_EQ(seen[0].entry.count, 3u);
  EXPECT_EQ(seen[0].entry.text_length, 3u);
  EXPECT_EQ(seen[0].entry.data_length, 15u);
  EXPECT_EQ(seen[0].ids(), (std::vector<std::int32_t>{5, -6, 7}));
  EXPECT_EQ(seen[0].text(), "abc");
}

TEST_F(WriterTest, NoPayloadHasZeroLengthAndOffset) {
  ASSERT_EQ(w.post(record_completion(Kind::nop, 1, 0, {})), Fault::none);
  auto seen = reap();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].entry.data_length, 0u);
  EXPECT_EQ(seen[0].entry.data_offset, 0u);
}

TEST_F(WriterTest, FullCqGoesToTheBacklogAndFlushesWhenTheHeadMoves) {
  fill_cq();
  ASSERT_EQ(w.post(record_completion(Kind::nop, 1, 0, {})), Fault::none);
  ASSERT_EQ(w.post(record_completion(Kind::finished, 2, 5, rec(40))), Fault::none);
  EXPECT_EQ(shared_tail(), 8u);
  EXPECT_TRUE(w.backlogged());
  EXPECT_EQ(w.backlog_entries(), 2u);
  EXPECT_EQ(w.backlog_bytes(), 40u);
  EXPECT_EQ(daemon_flags() & kCqBacklog, kCqBacklog);
  EXPECT_EQ(s->cq()->backlog_entries, 2u);
  // Nothing moves until the client consumes.
  ASSERT_EQ(w.flush(), Fault::none);
  EXPECT_EQ(shared_tail(), 8u);
  auto first = reap(3);
  ASSERT_EQ(first.size(), 3u);
  ASSERT_EQ(w.flush(), Fault::none);
  EXPECT_EQ(shared_tail(), 10u);
  EXPECT_FALSE(w.backlogged());
  EXPECT_EQ(daemon_flags() & kCqBacklog, 0u);
  EXPECT_EQ(s->cq()->backlog_entries, 0u);
  auto rest = reap();
  ASSERT_EQ(rest.size(), 7u);
  EXPECT_EQ(rest[5].entry.user_data, 1u);
  EXPECT_EQ(rest[6].entry.user_data, 2u);
  EXPECT_EQ(rest[6].data, rec(40));
}

TEST_F(WriterTest, FullResponseAreaGoesToTheBacklog) {
  ASSERT_EQ(w.post(record_completion(Kind::accepted, 1, 1, rec(1500))), Fault::none);
  ASSERT_EQ(w.post(record_completion(Kind::accepted, 2, 2, rec(1500))), Fault::none);
  ASSERT_EQ(w.post(record_completion(Kind::accepted, 3, 3, rec(1500))), Fault::none);  // 4500 > 4096
  EXPECT_EQ(shared_tail(), 2u);
  EXPECT_TRUE(w.backlogged());
  // A completion without data would fit in the CQ, but order is kept: it waits behind.
  ASSERT_EQ(w.post(record_completion(Kind::nop, 4, 0, {})), Fault::none);
  EXPECT_EQ(shared_tail(), 2u);
  auto a = reap(1);
  ASSERT_EQ(w.flush(), Fault::none);
  EXPECT_EQ(shared_tail(), 4u);  // the third record wrapped to offset 0, then the nop
  auto b = reap();
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[1].entry.user_data, 3u);
  EXPECT_EQ(b[1].entry.data_offset, 0u);
  EXPECT_EQ(b[1].data, rec(1500));
  EXPECT_EQ(b[2].entry.user_data, 4u);
}

TEST_F(WriterTest, TokenBatchesOfOneJobMergeInTheBacklog) {
  fill_cq();
  ASSERT_EQ(w.post(token_completion(9, 1, 0, {1, 2}, "a")), Fault::none);
  ASSERT_EQ(w.post(token_completion(9, 1, 2, {3}, "bc")), Fault::none);
  ASSERT_EQ(w.post(token_completion(9, 1, 3, {4, 5, 6}, "")), Fault::none);
  EXPECT_EQ(w.backlog_entries(), 1u);
  EXPECT_EQ(w.stats().merged, 2u);
  EXPECT_EQ(w.backlog_bytes(), 6u * 4 + 3);
  reap();
  ASSERT_EQ(w.flush(), Fault::none);
  auto seen = reap();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].entry.step, 0u);
  EXPECT_EQ(seen[0].entry.count, 6u);
  EXPECT_EQ(seen[0].ids(), (std::vector<std::int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(seen[0].text(), "abc");
  EXPECT_EQ(seen[0].entry.flags, 0);
}

TEST_F(WriterTest, NoMergeAcrossJobsStepsOrKinds) {
  fill_cq();
  ASSERT_EQ(w.post(token_completion(9, 1, 0, {1}, "")), Fault::none);
  ASSERT_EQ(w.post(token_completion(9, 2, 0, {1}, "")), Fault::none);  // other job
  ASSERT_EQ(w.post(token_completion(9, 1, 1, {2}, "")), Fault::none);  // job 1 again, but not the last entry
  ASSERT_EQ(w.post(token_completion(9, 1, 5, {3}, "")), Fault::none);  // not contiguous
  ASSERT_EQ(w.post(record_completion(Kind::finished, 9, 1, {})), Fault::none);
  ASSERT_EQ(w.post(token_completion(9, 1, 6, {4}, "")), Fault::none);  // after a non-token entry
  EXPECT_EQ(w.backlog_entries(), 6u);
  EXPECT_EQ(w.stats().merged, 0u);
}

TEST_F(WriterTest, MergedBatchesStayBounded) {
  fill_cq();
  const std::string text(200, 't');
  for (std::uint32_t i = 0; i < 20; ++i) ASSERT_EQ(w.post(token_completion(9, 1, i, {int(i)}, text)), Fault::none);
  EXPECT_GT(w.backlog_entries(), 1u);
  EXPECT_GT(w.stats().merged, 0u);
  reap();
  std::uint32_t next = 0;
  std::string all;
  while (next < 20) {
    ASSERT_EQ(w.flush(), Fault::none);
    auto seen = reap();
    ASSERT_FALSE(seen.empty());
    for (const auto& e : seen) {
      EXPECT_LE(e.data.size(), s->layout.response_data_size / 4) << "a merged batch is at most a quarter of the area";
      EXPECT_EQ(e.entry.step, next);
      next += e.entry.count;
      all += e.text();
    }
  }
  EXPECT_EQ(all.size(), 20 * text.size());
}

TEST_F(WriterTest, OverLimitTokensAreDroppedAndTheNextBatchSaysGap) {
  make(/*max_backlog=*/100);
  fill_cq();
  const std::string text(50, 'x');
  ASSERT_EQ(w.post(token_completion(1, 1, 0, {1, 2}, text)), Fault::none);  // 58 bytes: queued
  ASSERT_EQ(w.post(token_completion(2, 2, 0, {1, 2}, text)), Fault::none);  // 116 > 100: dropped
  EXPECT_EQ(w.backlog_entries(), 1u);
  EXPECT_EQ(w.stats().dropped_tokens, 2u);
  EXPECT_EQ(s->cq()->overflow_tokens, 2u);
  EXPECT_EQ(daemon_flags() & kCqOverflowed, kCqOverflowed);
  ASSERT_EQ(w.post(token_completion(2, 2, 2, {3}, text)), Fault::none);  // still over: dropped too
  EXPECT_EQ(w.stats().dropped_tokens, 3u);
  // Control completions are never dropped, whatever the backlog holds.
  ASSERT_EQ(w.post(record_completion(Kind::routed, 2, 2, rec(200))), Fault::none);
  EXPECT_EQ(w.backlog_entries(), 2u);
  reap();
  ASSERT_EQ(w.flush(), Fault::none);
  EXPECT_FALSE(w.backlogged());
  auto drained = reap();
  ASSERT_EQ(drained.size(), 2u);
  EXPECT_EQ(drained[0].entry.job_id, 1u);
  EXPECT_EQ(drained[0].entry.flags & kCqeGap, 0);
  EXPECT_EQ(drained[1].entry.kind, static_cast<std::uint8_t>(Kind::routed));
  // Job 2's next batch says tokens before it are missing; the one after does not.
  ASSERT_EQ(w.post(token_completion(2, 2, 3, {4}, "y")), Fault::none);
  ASSERT_EQ(w.post(token_completion(2, 2, 4, {5}, "z")), Fault::none);
  auto after = reap();
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[0].entry.step, 3u);
  EXPECT_EQ(after[0].entry.flags & kCqeGap, kCqeGap);
  EXPECT_EQ(after[1].entry.flags & kCqeGap, 0);
  // Job 1 never lost anything: no gap on its batches.
  ASSERT_EQ(w.post(token_completion(1, 1, 2, {3}, "")), Fault::none);
  auto j1 = reap();
  ASSERT_EQ(j1.size(), 1u);
  EXPECT_EQ(j1[0].entry.flags & kCqeGap, 0);
  // The overflow flag and counter stay.
  EXPECT_EQ(daemon_flags() & kCqOverflowed, kCqOverflowed);
  EXPECT_EQ(s->cq()->overflow_tokens, 3u);
}

TEST_F(WriterTest, GapBatchGoingToTheBacklogKeepsTheFlagAndIsNotMerged) {
  make(/*max_backlog=*/130);
  fill_cq();
  ASSERT_EQ(w.post(token_completion(1, 1, 0, {1}, std::string(90, 'a'))), Fault::none);  // 94 bytes queued
  ASSERT_EQ(w.post(token_completion(2, 2, 0, {1}, "b")), Fault::none);                  // 99: queued
  ASSERT_EQ(w.post(token_completion(2, 2, 1, {2}, std::string(20, 'c'))), Fault::none); // merge: 123, within limit
  ASSERT_EQ(w.post(token_completion(3, 3, 0, {1}, "dddd")), Fault::none);               // 131 > 130: dropped
  ASSERT_EQ(w.stats().dropped_tokens, 1u);
  reap();
  ASSERT_EQ(w.flush(), Fault::none);
  reap();
  ASSERT_FALSE(w.backlogged());
  fill_cq();
  ASSERT_EQ(w.post(token_completion(3, 3, 1, {2}, "e")), Fault::none);  // backlog: gap flag kept
  ASSERT_EQ(w.post(token_completion(3, 3, 2, {3}, "f")), Fault::none);  // may merge with it
  reap();
  ASSERT_EQ(w.flush(), Fault::none);
  auto seen = reap();
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen[0].entry.job_id, 3u);
  EXPECT_EQ(seen[0].entry.step, 1u);
  EXPECT_EQ(seen[0].entry.flags & kCqeGap, kCqeGap);
}

TEST_F(WriterTest, ControlCompletionsAreNeverDropped) {
  make(/*max_backlog=*/0);
  fill_cq();
  for (std::uint64_t i = 0; i < 40; ++i) {
    const Kind k = i % 4 == 0 ? Kind::accepted : i % 4 == 1 ? Kind::started : i % 4 == 2 ? Kind::error : Kind::finished;
    ASSERT_EQ(w.post(record_completion(k, i, i, rec(64))), Fault::none);
  }
  EXPECT_EQ(w.backlog_entries(), 40u);
  EXPECT_EQ(w.stats().dropped_tokens, 0u);
  ASSERT_EQ(w.post(token_completion(99, 99, 0, {1}, "")), Fault::none);  // tokens with a zero limit: dropped
  EXPECT_EQ(w.stats().dropped_tokens, 1u);
  reap();
  std::uint64_t next = 0;
  while (w.backlogged()) {
    ASSERT_EQ(w.flush(), Fault::none);
    for (const auto& e : reap()) {
      EXPECT_EQ(e.entry.user_data, next);
      EXPECT_EQ(e.data, rec(64));
      ++next;
    }
  }
  EXPECT_EQ(next, 40u);
}

TEST_F(WriterTest, FinishedClearsAJobsGap) {
  make(/*max_backlog=*/0);
  fill_cq();
  ASSERT_EQ(w.post(token_completion(1, 1, 0, {1}, "")), Fault::none);  // dropped
  ASSERT_EQ(w.post(record_completion(Kind::finished, 1, 1, {})), Fault::none);
  reap();
  ASSERT_EQ(w.flush(), Fault::none);
  reap();
  // A job id reused after finished (a resumed job) starts clean.
  ASSERT_EQ(w.post(token_completion(1, 1, 0, {1}, "")), Fault::none);
  auto seen = reap();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].entry.flags & kCqeGap, 0);
}

TEST_F(WriterTest, PayloadLargerThanHalfTheAreaIsNotWritten) {
  ASSERT_EQ(w.post(token_completion(1, 1, 0, std::vector<std::int32_t>(600, 1), "")), Fault::none);  // 2400 > 2048
  EXPECT_EQ(shared_tail(), 0u);
  EXPECT_EQ(w.stats().dropped_tokens, 600u);
  ASSERT_EQ(w.post(token_completion(1, 1, 600, {2}, "")), Fault::none);
  ASSERT_EQ(w.post(record_completion(Kind::finished, 1, 1, rec(3000))), Fault::none);
  auto seen = reap();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].entry.flags & kCqeGap, kCqeGap);
  EXPECT_EQ(seen[1].entry.kind, static_cast<std::uint8_t>(Kind::finished));
  EXPECT_EQ(seen[1].entry.data_length, 0u) << "oversized record: entry kept, payload dropped";
}

TEST_F(WriterTest, InvalidClientHeadIsCqIndex) {
  ASSERT_EQ(w.post(record_completion(Kind::nop, 1, 0, {})), Fault::none);
  ASSERT_EQ(w.post(record_completion(Kind::nop, 2, 0, {})), Fault::none);
  s->set_cq_head(3);  // past our tail
  EXPECT_EQ(w.flush(), Fault::cq_index);
  EXPECT_EQ(w.post(record_completion(Kind::nop, 3, 0, {})), Fault::cq_index);
  s->set_cq_head(2);  // == tail: valid
  EXPECT_EQ(w.flush(), Fault::none);
  s->set_cq_head(1);  // backwards
  EXPECT_EQ(w.flush(), Fault::cq_index);
  s->set_cq_head(0xffffffffu);
  EXPECT_EQ(w.flush(), Fault::cq_index);
  s->set_cq_head(2);
  EXPECT_EQ(w.flush(), Fault::none);
}

TEST_F(WriterTest, WakeupOnlyWhenWrittenAndAsked) {
  EXPECT_FALSE(w.take_wakeup());  // nothing written
  ASSERT_EQ(w.post(record_completion(Kind::nop, 1, 0, {})), Fault::none);
  EXPECT_FALSE(w.take_wakeup());  // written, but the client does not sleep
  fetch_or(&s->cq()->client_flags, kCqNeedWakeup);
  EXPECT_FALSE(w.take_wakeup());  // asked, but nothing new since the last call
  ASSERT_EQ(w.post(record_completion(Kind::nop, 2, 0, {})), Fault::none);
  EXPECT_TRUE(w.take_wakeup());
  EXPECT_FALSE(w.take_wakeup());
  reap();
  fill_cq();
  EXPECT_TRUE(w.take_wakeup());
  ASSERT_FALSE(w.backlogged());
  ASSERT_EQ(w.post(record_completion(Kind::nop, 3, 0, {})), Fault::none);  // backlog only: nothing written
  EXPECT_FALSE(w.take_wakeup());
  reap();
  ASSERT_EQ(w.flush(), Fault::none);  // the flush writes: wake the sleeper
  EXPECT_TRUE(w.take_wakeup());
}

TEST_F(WriterTest, DefaultConstructedIsInert) {
  CompletionWriter none;
  EXPECT_EQ(none.post(record_completion(Kind::nop, 1, 0, {})), Fault::none);
  EXPECT_EQ(none.flush(), Fault::none);
  EXPECT_FALSE(none.take_wakeup());
}

// Many completions of random sizes with a reader consuming random amounts: everything arrives once, in order,
// intact, across many wraps of the CQ and the response area.
TEST_F(WriterTest, RandomStreamArrivesIntact) {
  make(1 << 20, 8192);
  std::mt19937 rng(11);
  std::uint64_t posted = 0, received = 0;
  std::uint32_t next_step = 0;
  std::vector<std::int32_t> got_ids;
  auto check = [&](const std::vector<Seen>& seen) {
    for (const auto& e : seen) {
      EXPECT_EQ(e.entry.user_data, e.entry.kind == static_cast<std::uint8_t>(Kind::tokens) ? 1u : received);
      if (e.entry.kind == static_cast<std::uint8_t>(Kind::tokens)) {
        EXPECT_EQ(e.entry.step, next_step);
        EXPECT_EQ(e.entry.flags, 0);
        next_step += e.entry.count;
        auto ids = e.ids();
        got_ids.insert(got_ids.end(), ids.begin(), ids.end());
        ++received;  // merged batches count once; `posted` below counts what we expect to see per entry
      } else {
        const std::size_t n = e.entry.user_data % 700 + kFieldHeaderSize + 2;
        EXPECT_EQ(e.data, rec(n));
        ++received;
      }
    }
  };
  // Records only first (no merging): exact count.
  for (int i = 0; i < 5000; ++i) {
    if (rng() % 2) {
      const std::size_t n = posted % 700 + kFieldHeaderSize + 2;
      ASSERT_EQ(w.post(record_completion(Kind::routed, posted, 1, rec(n))), Fault::none);
      ++posted;
    } else {
      check(reap(rng() % 10));
      ASSERT_EQ(w.flush(), Fault::none);
    }
  }
  while (received < posted) {
    ASSERT_EQ(w.flush(), Fault::none);
    check(reap());
  }
  EXPECT_EQ(received, posted);
  // Then one job's tokens (merging allowed, nothing dropped: the limit is large): the id stream is exact.
  std::vector<std::int32_t> want;
  std::uint32_t step = 0;
  for (int i = 0; i < 5000; ++i) {
    if (rng() % 3) {
      std::vector<std::int32_t> ids(rng() % 8 + 1);
      for (auto& id : ids) id = static_cast<std::int32_t>(want.size() + (&id - ids.data()));
      want.insert(want.end(), ids.begin(), ids.end());
      ASSERT_EQ(w.post(token_completion(1, 1, step, ids, "")), Fault::none);
      step += static_cast<std::uint32_t>(ids.size());
    } else {
      check(reap(rng() % 4));
      ASSERT_EQ(w.flush(), Fault::none);
    }
  }
  while (next_step < step) {
    ASSERT_EQ(w.flush(), Fault::none);
    check(reap());
  }
  EXPECT_EQ(got_ids, want);
  EXPECT_EQ(w.stats().dropped_tokens, 0u);
}

}  // namespace
}  // namespace tandem::ring
