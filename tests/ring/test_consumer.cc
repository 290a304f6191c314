// SubmissionConsumer (src/ring/consumer.cc) over a real memfd mapping with hand-built entries: valid commands, every
// Fault kind, valid entries before a bad one, head publication, copies out of shared memory, slot wrap-around.
#include "ring/consumer.h"

#include <gtest/gtest.h>

#include <functional>

#include "ring_test_util.h"

namespace tandem::ring {
namespace {

using test::cancel_entry;
using test::nop_entry;
using test::simple_request;
using test::submit_entry;
using test::TestSession;

class ConsumerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    s = TestSession::create({8, 8, 4096, 4096});
    consumer = SubmissionConsumer(s->view());
  }
  std::uint32_t shared_head() const { return load_acquire(&s->sq()->head); }
  std::unique_ptr<TestSession> s;
  SubmissionConsumer consumer;
};

TEST_F(ConsumerTest, NothingPending) {
  EXPECT_FALSE(consumer.pending());
  auto r = consumer.consume(100);
  EXPECT_EQ(r.fault, Fault::none);
  EXPECT_TRUE(r.commands.empty());
  EXPECT_EQ(r.consumed, 0u);
  EXPECT_EQ(shared_head(), 0u);
}

TEST_F(ConsumerTest, DefaultConstructedIsInert) {
  SubmissionConsumer none;
  EXPECT_FALSE(none.pending());
  EXPECT_EQ(none.consume(8).consumed, 0u);
}

TEST_F(ConsumerTest, ValidEntriesBecomeCommandsInOrder) {
  const auto rec = simple_request("hello", 7);
  s->put_data(100, rec);
  s->put_entry(0, nop_entry(11));
  s->put_entry(1, submit_entry(12, 100, static_cast<std::uint32_t>(rec.size())));
  s->put_entry(2, cancel_entry(13, 99));
  s->set_sq_tail(3);
  EXPECT_TRUE(consumer.pending());
  auto r = consumer.consume(100);
  ASSERT_EQ(r.fault, Fault::none) << r.detail;
  ASSERT_EQ(r.commands.size(), 3u);
  EXPECT_EQ(r.consumed, 3u);
  EXPECT_EQ(r.commands[0].op, Opcode::nop);
  EXPECT_EQ(r.commands[0].user_data, 11u);
  EXPECT_EQ(r.commands[1].op, Opcode::submit);
  EXPECT_EQ(r.commands[1].user_data, 12u);
  ASSERT_EQ(r.commands[1].record.size(), 3u);
  EXPECT_EQ(r.commands[1].record[1].key, "prompt");
  EXPECT_EQ(std::get<std::string>(r.commands[1].record[1].value), "hello");
  EXPECT_EQ(r.commands[2].op, Opcode::cancel);
  EXPECT_EQ(r.commands[2].job_id, 99u);
  EXPECT_EQ(consumer.head(), 3u);
  EXPECT_EQ(shared_head(), 3u);
  EXPECT_EQ(s->sq()->entries_consumed, 3u);
  EXPECT_FALSE(consumer.pending());
}

TEST_F(ConsumerTest, MaxBoundsOnePass) {
  for (std::uint32_t i = 0; i < 5; ++i) s->put_entry(i, nop_entry(i));
  s->set_sq_tail(5);
  auto a = consumer.consume(2);
  EXPECT_EQ(a.commands.size(), 2u);
  EXPECT_EQ(shared_head(), 2u);
  EXPECT_TRUE(consumer.pending());
  auto b = consumer.consume(100);
  ASSERT_EQ(b.commands.size(), 3u);
  EXPECT_EQ(b.commands[0].user_data, 2u);
  EXPECT_EQ(shared_head(), 5u);
  EXPECT_EQ(s->sq()->entries_consumed, 5u);
}

TEST_F(ConsumerTest, SlotsWrapAroundOverManyRounds) {
  std::uint32_t tail = 0;
  for (int round = 0; round < 50; ++round) {
    const std::uint32_t n = 1 + round % 8;
    for (std::uint32_t i = 0; i < n; ++i) s->put_entry(tail + i, nop_entry(1000 + tail + i));
    tail += n;
    s->set_sq_tail(tail);
    auto r = consumer.consume(100);
    ASSERT_EQ(r.fault, Fault::none) << r.detail;
    ASSERT_EQ(r.commands.size(), n);
    for (std::uint32_t i = 0; i < n; ++i) EXPECT_EQ(r.commands[i].user_data, 1000 + tail - n + i);
    EXPECT_EQ(shared_head(), tail);
  }
}

TEST_F(ConsumerTest, CommandsAreCopiesNotViewsOfSharedMemory) {
  const auto rec = simple_request("original");
  s->put_data(0, rec);
  s->put_entry(0, submit_entry(5, 0, static_cast<std::uint32_t>(rec.size())));
  s->set_sq_tail(1);
  auto r = consumer.consume(8);
  ASSERT_EQ(r.commands.size(), 1u);
  // Once the head is published the client may reuse the slot and the bytes: the command must not change.
  std::memset(s->view().request_data(), 0xff, s->layout.request_data_size);
  std::memset(s->view().sqes(), 0xff, s->layout.sq_entries * kEntrySize);
  EXPECT_EQ(r.commands[0].user_data, 5u);
  EXPECT_EQ(std::get<std::string>(r.commands[0].record[1].value), "original");
}

TEST_F(ConsumerTest, SubmitAtTheEdgesOfTheRequestArea) {
  // max_request_bytes (half the area) at the very end of the area.
  const std::uint32_t max = s->layout.max_request_bytes;
  RecordWriter w;
  const std::string big(max - kFieldHeaderSize - 6, 'x');
  w.add("prompt", std::string_view(big));
  ASSERT_EQ(w.bytes().size(), max);
  s->put_data(s->layout.request_data_size - max, w.bytes());
  s->put_entry(0, submit_entry(1, s->layout.request_data_size - max, max));
  s->set_sq_tail(1);
  auto r = consumer.consume(8);
  ASSERT_EQ(r.fault, Fault::none) << r.detail;
  ASSERT_EQ(r.commands.size(), 1u);
}

TEST_F(ConsumerTest, RecordLimitsApply) {
  SubmissionConsumer strict(s->view(), RecordLimits{2, 16});
  const auto rec = simple_request("p");  // 3 fields
  s->put_data(0, rec);
  s->put_entry(0, submit_entry(1, 0, static_cast<std::uint32_t>(rec.size())));
  s->set_sq_tail(1);
  EXPECT_EQ(strict.consume(8).fault, Fault::record);
}

// --- faults --------------------------------------------------------------------------------------------------------

TEST_F(ConsumerTest, TailAheadOfCapacityIsSqIndex) {
  s->set_sq_tail(9);
  auto r = consumer.consume(100);
  EXPECT_EQ(r.fault, Fault::sq_index);
  EXPECT_EQ(r.consumed, 0u);
  EXPECT_TRUE(r.commands.empty());
  EXPECT_FALSE(r.detail.empty());
  EXPECT_EQ(shared_head(), 0u);  // nothing read, nothing published
  // Exactly full is fine.
  for (std::uint32_t i = 0; i < 8; ++i) s->put_entry(i, nop_entry(i));
  s->set_sq_tail(8);
  EXPECT_EQ(consumer.consume(100).commands.size(), 8u);
}

TEST_F(ConsumerTest, TailBehindHeadIsSqIndex) {
  for (std::uint32_t i = 0; i < 4; ++i) s->put_entry(i, nop_entry(i));
  s->set_sq_tail(4);
  ASSERT_EQ(consumer.consume(100).commands.size(), 4u);
  s->set_sq_tail(2);  // moved backwards
  EXPECT_EQ(consumer.consume(100).fault, Fault::sq_index);
  s->set_sq_tail(0xffffffffu);
  EXPECT_EQ(consumer.consume(100).fault, Fault::sq_index);
}

struct BadEntry {
  const char* name;
  Fault fault;
  // Builds the bad entry (and its data) at index 2, after two valid nops.
  std::function<SubmissionEntry(TestSession&)> make;
};

void PrintTo(const BadEntry& b, std::ostream* os) { *os << b.name; }

class ConsumerFault : public ConsumerTest, public ::testing::WithParamInterface<BadEntry> {};

SubmissionEntry with_data(TestSession& s, std::uint64_t off, const std::vector<std::uint8_t>& bytes) {
  s.put_data(off, bytes);
  return submit_entry(3, off, static_cast<std::uint32_t>(bytes.size()));
}

TEST_P(ConsumerFault, ValidEntriesBeforeTheBadOneAreReturned) {
  const auto& p = GetParam();
  s->put_entry(0, nop_entry(1));
  s->put_entry(1, nop_entry(2));
  s->put_entry(2, p.make(*s));
  s->put_entry(3, nop_entry(4));  // after the fault: never read
  s->set_sq_tail(4);
  auto r = consumer.consume(100);
  EXPECT_EQ(r.fault, p.fault) << p.name << ": " << fault_name(r.fault) << " " << r.detail;
  EXPECT_FALSE(r.detail.empty());
  EXPECT_NE(r.detail.find("entry 2"), std::string::npos) << r.detail;
  ASSERT_EQ(r.commands.size(), 2u) << p.name;
  EXPECT_EQ(r.commands[0].user_data, 1u);
  EXPECT_EQ(r.commands[1].user_data, 2u);
  EXPECT_EQ(r.consumed, 3u) << "the faulty entry is counted, the one after it is not read";
  // The valid entries' slots are released to the client.
  EXPECT_GE(shared_head(), 2u);
  EXPECT_EQ(consumer.head(), shared_head());
}

// ConsumeResult::consumed says the faulty entry is "taken off the ring"; the published head and entries_consumed
// must agree with it whatever the fault kind.
TEST_P(ConsumerFault, HeadCountsTheFaultyEntryLikeConsumed) {
  const auto& p = GetParam();
  s->put_entry(0, nop_entry(1));
  s->put_entry(1, p.make(*s));
  s->set_sq_tail(2);
  auto r = consumer.consume(100);
  ASSERT_EQ(r.fault, p.fault);
  EXPECT_EQ(shared_head(), r.consumed) << p.name;
  EXPECT_EQ(consumer.head(), r.consumed) << p.name;
  EXPECT_EQ(s->sq()->entries_consumed, r.consumed) << p.name;
}

SubmissionEntry tweak(SubmissionEntry e, const std::function<void(SubmissionEntry&)>& f) {
  f(e);
  return e;
}

INSTANTIATE_TEST_SUITE_P(
    Table, ConsumerFault,
    ::testing::Values(
        BadEntry{"flags", Fault::reserved,
                 [](TestSession&) { return tweak(nop_entry(3), [](auto& e) { e.flags = 1; }); }},
        BadEntry{"reserved0", Fault::reserved,
                 [](TestSession&) { return tweak(nop_entry(3), [](auto& e) { e.reserved0 = 0x100; }); }},
        BadEntry{"reserved_tail", Fault::reserved,
                 [](TestSession&) { return tweak(nop_entry(3), [](auto& e) { e.reserved[31] = 1; }); }},
        BadEntry{"nop_with_job", Fault::reserved, [](TestSession&) { return tweak(nop_entry(3), [](auto& e) { e.job_id = 5; }); }},
        BadEntry{"submit_with_job", Fault::reserved,
                 [](TestSession& s) { return tweak(with_data(s, 0, simple_request("x")), [](auto& e) { e.job_id = 5; }); }},
        BadEntry{"opcode_0", Fault::opcode, [](TestSession&) { return tweak(nop_entry(3), [](auto& e) { e.opcode = 0; }); }},
        BadEntry{"opcode_7", Fault::opcode, [](TestSession&) { return tweak(nop_entry(3), [](auto& e) { e.opcode = 7; }); }},  // 4 embed (1.1), 5 transcribe, 6 audio (1.2)
        BadEntry{"transcribe_with_job", Fault::reserved,
                 [](TestSession& s) {
                   return tweak(with_data(s, 0, simple_request("x")), [](auto& e) { e.opcode = 5; e.job_id = 5; });
                 }},
        BadEntry{"audio_without_job", Fault::reserved,
                 [](TestSession& s) { return tweak(with_data(s, 0, simple_request("x")), [](auto& e) { e.opcode = 6; }); }},
        BadEntry{"transcribe_without_data", Fault::length,
                 [](TestSession&) { return tweak(nop_entry(3), [](auto& e) { e.opcode = 5; }); }},
        BadEntry{"audio_without_data", Fault::length,
                 [](TestSession&) { return tweak(nop_entry(3), [](auto& e) { e.opcode = 6; e.job_id = 9; }); }},
        BadEntry{"opcode_255", Fault::opcode,
                 [](TestSession&) { return tweak(nop_entry(3), [](auto& e) { e.opcode = 255; }); }},
        BadEntry{"nop_with_length", Fault::length,
                 [](TestSession&) { return tweak(nop_entry(3), [](auto& e) { e.data_length = 1; }); }},
        BadEntry{"cancel_with_offset", Fault::length,
                 [](TestSession&) { return tweak(cancel_entry(3, 1), [](auto& e) { e.data_offset = 64; }); }},
        BadEntry{"submit_length_0", Fault::length, [](TestSession&) { return submit_entry(3, 0, 0); }},
        BadEntry{"submit_length_over_max", Fault::length,
                 [](TestSession& s) { return submit_entry(3, 0, s.layout.max_request_bytes + 1); }},
        BadEntry{"submit_length_huge", Fault::length, [](TestSession&) { return submit_entry(3, 0, 0xffffffffu); }},
        BadEntry{"offset_past_end", Fault::offset,
                 [](TestSession& s) { return submit_entry(3, s.layout.request_data_size - 10, 11); }},
        BadEntry{"offset_at_end", Fault::offset,
                 [](TestSession& s) { return submit_entry(3, s.layout.request_data_size, 1); }},
        BadEntry{"offset_wraps", Fault::offset, [](TestSession&) { return submit_entry(3, ~std::uint64_t{0}, 16); }},
        BadEntry{"record_bad_key", Fault::record,
                 [](TestSession& s) {
                   std::vector<std::uint8_t> b{static_cast<std::uint8_t>(FieldType::boolean), 1, 0, 0, 1, 0, 0, 0, 'K', 1};
                   return with_data(s, 512, b);
                 }},
        BadEntry{"record_truncated", Fault::record,
                 [](TestSession& s) {
                   auto b = simple_request("abc");
                   b.pop_back();
                   return with_data(s, 512, b);
                 }},
        BadEntry{"utf8", Fault::utf8,
                 [](TestSession& s) { return with_data(s, 1024, RecordWriter().add("prompt", "ok\xc3(").take()); }},
        BadEntry{"utf8_in_list", Fault::utf8,
                 [](TestSession& s) {
                   return with_data(s, 1024,
                                    RecordWriter().add("messages", std::vector<std::string>{"user", "\xff"}).take());
                 }}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tandem::ring
