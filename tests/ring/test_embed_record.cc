// The embed operation of ring ABI 1.1 (docs/rings.md "Embed record", "Embedded completion"): the new field types
// (float32_list, bytes_list) on the wire and in the parser, the embed opcode in the consumer (same validation as
// submit), embed_from_record (daemon/embed_record.h: types, unknown keys, no inputs → invalid_argument), the embedded
// completion through a real RingClient, and RingClient::embed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "daemon/embed_record.h"
#include "ring/completion_writer.h"
#include "ring/consumer.h"
#include "ring_test_util.h"

namespace tandem::ring {
namespace {

using test::TestSession;

std::vector<std::uint8_t> field(std::uint8_t type, std::string_view key, const std::vector<std::uint8_t>& value) {
  std::vector<std::uint8_t> out = {type, static_cast<std::uint8_t>(key.size()), 0, 0};
  const auto n = static_cast<std::uint32_t>(value.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(n >> (8 * i)));
  out.insert(out.end(), key.begin(), key.end());
  out.insert(out.end(), value.begin(), value.end());
  return out;
}

std::vector<std::uint8_t> f32_bytes(std::initializer_list<float> xs) {
  std::vector<std::uint8_t> out(xs.size() * 4);
  std::memcpy(out.data(), std::data(xs), out.size());
  return out;
}

TEST(EmbedAbi, Numbers) {
  EXPECT_EQ(static_cast<int>(Opcode::embed), 4);
  EXPECT_EQ(static_cast<int>(Kind::embedded), 11);
  EXPECT_EQ(static_cast<int>(FieldType::float32_list), 8);
  EXPECT_EQ(static_cast<int>(FieldType::bytes_list), 9);
  EXPECT_EQ(kAbiMajor, 1);
  EXPECT_EQ(kAbiMinor, 2);  // 1.2 added transcribe/audio and segment/progress/audio_info
  EXPECT_EQ(kind_name(Kind::embedded), "embedded");
  EXPECT_EQ(static_cast<int>(Opcode::transcribe), 5);
  EXPECT_EQ(static_cast<int>(Opcode::audio), 6);
  EXPECT_EQ(kind_name(Kind::segment), "segment");
  EXPECT_EQ(kind_name(Kind::progress), "progress");
  EXPECT_EQ(kind_name(Kind::audio_info), "audio_info");
  EXPECT_EQ(static_cast<int>(Kind::audio_info), 14);
  // The variant follows the wire types: index + 1 == FieldType.
  EXPECT_EQ(FieldValue(std::vector<float>{}).index() + 1, 8u);
  EXPECT_EQ(FieldValue(ByteList{}).index() + 1, 9u);
  EXPECT_EQ(field_type_name(FieldValue(std::vector<float>{})), "float32_list");
  EXPECT_EQ(field_type_name(FieldValue(ByteList{})), "bytes_list");
}

TEST(EmbedRecordWire, Float32ListExactBytes) {
  const auto bytes = RecordWriter().add("v", std::vector<float>{1.0f, -0.5f}).take();
  EXPECT_EQ(bytes, field(8, "v", f32_bytes({1.0f, -0.5f})));
  const auto rows = RecordWriter().add_float32_rows("v", {{1.0f}, {}, {-0.5f}}).take();
  EXPECT_EQ(rows, bytes);
}

TEST(EmbedRecordWire, BytesListExactBytes) {
  const auto bytes = RecordWriter().add("images", ByteList{{0x89, 0x00}, {}, {0xff}}).take();
  const std::vector<std::uint8_t> value = {2, 0, 0, 0, 0x89, 0x00, 0, 0, 0, 0, 1, 0, 0, 0, 0xff};
  EXPECT_EQ(bytes, field(9, "images", value));
}

TEST(EmbedRecordWire, RoundTrips) {
  const std::vector<FieldValue> values = {
      std::vector<float>{}, std::vector<float>{0.0f, -0.0f, std::numeric_limits<float>::denorm_min(),
                                               std::numeric_limits<float>::max(), std::numeric_limits<float>::lowest()},
      ByteList{}, ByteList{{}}, ByteList{{0, 1, 2, 0xff}, {}, std::vector<std::uint8_t>(1000, 0xc3)}};
  for (const auto& v : values) {
    RecordWriter w;
    w.add("k", v);
    auto p = parse_record(w.bytes());
    ASSERT_TRUE(p.ok()) << p.error->message;
    ASSERT_EQ(p.fields.size(), 1u);
    EXPECT_EQ(p.fields[0].value, v);
    // Every truncation is refused (never read past the span).
    for (std::size_t n = 1; n < w.bytes().size(); ++n)
      EXPECT_FALSE(parse_record(std::span(w.bytes().data(), n)).ok()) << n;
  }
}

TEST(EmbedRecordWire, MalformedFloat32List) {
  auto p = parse_record(field(8, "v", {1, 2, 3}));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error->fault, Fault::record);
  EXPECT_NE(p.error->message.find("multiple of 4"), std::string::npos);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    p = parse_record(field(8, "v", f32_bytes({1.0f, bad})));
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.error->fault, Fault::record);
    EXPECT_NE(p.error->message.find("element 1 is not a finite number"), std::string::npos) << p.error->message;
  }
  RecordLimits lim;
  lim.max_list_elements = 2;
  p = parse_record(field(8, "v", f32_bytes({1, 2, 3})), lim);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error->message.find("more than 2 elements"), std::string::npos);
}

TEST(EmbedRecordWire, MalformedBytesList) {
  // Truncated element length, an element running past the value, too many elements. Bytes are never UTF-8 checked.
  auto p = parse_record(field(9, "images", {1, 0}));
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error->message.find("truncated element length"), std::string::npos);
  p = parse_record(field(9, "images", {5, 0, 0, 0, 1, 2}));
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error->message.find("runs past the value"), std::string::npos);
  p = parse_record(field(9, "images", {0xff, 0xff, 0xff, 0xff}));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error->fault, Fault::record);
  RecordLimits lim;
  lim.max_list_elements = 1;
  p = parse_record(field(9, "images", {0, 0, 0, 0, 0, 0, 0, 0}), lim);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error->message.find("more than 1 elements"), std::string::npos);
  p = parse_record(field(9, "images", {2, 0, 0, 0, 0xc3, 0x28}));  // invalid UTF-8 is fine in bytes
  ASSERT_TRUE(p.ok());
  // Unknown types past 9 are still refused.
  p = parse_record(field(10, "x", {}));
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error->message.find("unknown type 10"), std::string::npos);
}

// --- embed_from_record -------------------------------------------------------------------------------------------

Result<daemon::EmbedRecord> from(RecordWriter& w) {
  auto p = parse_record(w.bytes());
  if (!p.ok()) return fail(Errc::format_error, p.error->message);
  return daemon::embed_from_record(p.fields);
}

TEST(EmbedFromRecord, AllFields) {
  RecordWriter w;
  w.add("model", "emb")
      .add("texts", std::vector<std::string>{"a red circle", ""})
      .add("images", ByteList{{1, 2, 3}})
      .add("idempotency_key", "k1")
      .add("allow_cpu", false)
      .add("deadline_ms", std::uint64_t{2500})
      .add("truncate", true);
  auto r = from(w);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->model, "emb");
  EXPECT_EQ(r->texts, (std::vector<std::string>{"a red circle", ""}));
  ASSERT_EQ(r->images.size(), 1u);
  EXPECT_EQ(r->images[0], (std::vector<std::uint8_t>{1, 2, 3}));
  EXPECT_EQ(r->idempotency_key, "k1");
  EXPECT_EQ(r->allow_cpu, false);
  EXPECT_EQ(r->deadline_ms, 2500u);
  EXPECT_EQ(r->truncate, true);
  // The writer is the inverse.
  auto again = parse_record(daemon::embed_record(*r));
  ASSERT_TRUE(again.ok());
  auto r2 = daemon::embed_from_record(again.fields);
  ASSERT_TRUE(r2);
  EXPECT_EQ(r2->texts, r->texts);
  EXPECT_EQ(r2->images, r->images);
  EXPECT_EQ(r2->deadline_ms, r->deadline_ms);
}

TEST(EmbedFromRecord, TokenInputsAreIdsAndTheirLengths) {
  RecordWriter w;
  w.add("tokens", std::vector<std::int32_t>{5, 6, 7, 0}).add("token_lengths", std::vector<std::int32_t>{3, 1});
  auto r = from(w);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->tokens, (std::vector<std::vector<std::int32_t>>{{5, 6, 7}, {0}}));
  EXPECT_TRUE(r->texts.empty());
  auto again = parse_record(daemon::embed_record(*r));  // the writer is the inverse
  ASSERT_TRUE(again.ok());
  auto r2 = daemon::embed_from_record(again.fields);
  ASSERT_TRUE(r2);
  EXPECT_EQ(r2->tokens, r->tokens);
}

TEST(EmbedFromRecord, Minimal) {
  RecordWriter w;
  w.add("texts", std::vector<std::string>{"x"});
  auto r = from(w);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->model, "");
  EXPECT_FALSE(r->allow_cpu || r->truncate || r->deadline_ms || r->idempotency_key);
  RecordWriter w2;
  w2.add("deadline_ms", std::int64_t{7}).add("images", ByteList{{}});
  auto r2 = from(w2);
  ASSERT_TRUE(r2);
  EXPECT_EQ(r2->deadline_ms, 7u);
}

TEST(EmbedFromRecord, TypedErrors) {
  struct Case {
    std::function<void(RecordWriter&)> build;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {[](RecordWriter& w) { w.add("model", "m"); }, "no inputs"},
      {[](RecordWriter& w) { w.add("texts", std::vector<std::string>{}); }, "no inputs"},
      {[](RecordWriter& w) { w.add("texts", "one"); }, "'texts' must be a string_list, got string"},
      {[](RecordWriter& w) { w.add("texts", std::vector<std::string>{"a"}).add("images", std::vector<std::string>{"a"}); },
       "'images' must be a bytes_list, got string_list"},
      {[](RecordWriter& w) { w.add("texts", std::vector<std::string>{"a"}).add("model", std::uint64_t{1}); },
       "'model' must be a string"},
      {[](RecordWriter& w) { w.add("texts", std::vector<std::string>{"a"}).add("allow_cpu", std::uint64_t{1}); },
       "'allow_cpu' must be a boolean"},
      {[](RecordWriter& w) { w.add("texts", std::vector<std::string>{"a"}).add("truncate", "yes"); },
       "'truncate' must be a boolean"},
      {[](RecordWriter& w) { w.add("texts", std::vector<std::string>{"a"}).add("deadline_ms", std::int64_t{-1}); },
       "'deadline_ms' must be >= 0"},
      {[](RecordWriter& w) { w.add("texts", std::vector<std::string>{"a"}).add("deadline_ms", 1.5); },
       "'deadline_ms' must be an unsigned integer"},
      {[](RecordWriter& w) { w.add("texts", std::vector<std::string>{"a"}).add("prompt", "p"); },
       "unknown key 'prompt'"},
      {[](RecordWriter& w) { w.add("texts", std::vector<std::string>{"a"}).add("text0", "p"); },
       "unknown key 'text0'"},
      {[](RecordWriter& w) { w.add("tokens", std::vector<std::int32_t>{1, 2}); }, "'tokens' and 'token_lengths' come together"},
      {[](RecordWriter& w) { w.add("token_lengths", std::vector<std::int32_t>{1}); }, "come together"},
      {[](RecordWriter& w) { w.add("tokens", std::vector<std::string>{"a"}).add("token_lengths", std::vector<std::int32_t>{1}); },
       "'tokens' must be an int32_list, got string_list"},
      {[](RecordWriter& w) { w.add("tokens", std::vector<std::int32_t>{1, 2}).add("token_lengths", std::vector<std::int32_t>{1}); },
       "token_lengths sum to 1, 'tokens' has 2 ids"},
      {[](RecordWriter& w) { w.add("tokens", std::vector<std::int32_t>{1, 2}).add("token_lengths", std::vector<std::int32_t>{3}); },
       "token_lengths[0] is 3"},
      {[](RecordWriter& w) { w.add("tokens", std::vector<std::int32_t>{1, 2}).add("token_lengths", std::vector<std::int32_t>{2, 0}); },
       "token_lengths[1] is 0"},
      {[](RecordWriter& w) { w.add("tokens", std::vector<std::int32_t>{1, -2}).add("token_lengths", std::vector<std::int32_t>{2}); },
       "tokens[1] is negative"},
      {[](RecordWriter& w) { w.add("tokens", std::vector<std::int32_t>{}).add("token_lengths", std::vector<std::int32_t>{}); },
       "no inputs"},
  };
  for (const auto& c : cases) {
    RecordWriter w;
    c.build(w);
    auto r = from(w);
    ASSERT_FALSE(r) << c.needle;
    EXPECT_EQ(r.error().code, Errc::invalid_argument) << c.needle;
    EXPECT_NE(r.error().message.find(c.needle), std::string::npos) << r.error().message;
  }
}

// --- the consumer and the client ---------------------------------------------------------------------------------

SubmissionEntry embed_entry(std::uint64_t user_data, std::uint64_t offset, std::uint32_t length) {
  SubmissionEntry e{};
  e.opcode = static_cast<std::uint8_t>(Opcode::embed);
  e.user_data = user_data;
  e.data_offset = offset;
  e.data_length = length;
  return e;
}

class EmbedConsumerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    s = TestSession::create({8, 8, 4096, 4096});
    consumer = SubmissionConsumer(s->view());
  }
  std::unique_ptr<TestSession> s;
  SubmissionConsumer consumer;
};

TEST_F(EmbedConsumerTest, EmbedBecomesACommand) {
  const auto rec = RecordWriter().add("texts", std::vector<std::string>{"hi"}).add("images", ByteList{{9, 8}}).take();
  s->put_data(64, rec);
  s->put_entry(0, embed_entry(5, 64, static_cast<std::uint32_t>(rec.size())));
  s->set_sq_tail(1);
  auto r = consumer.consume(8);
  ASSERT_EQ(r.fault, Fault::none) << r.detail;
  ASSERT_EQ(r.commands.size(), 1u);
  EXPECT_EQ(r.commands[0].op, Opcode::embed);
  EXPECT_EQ(r.commands[0].user_data, 5u);
  ASSERT_EQ(r.commands[0].record.size(), 2u);
  EXPECT_EQ(r.commands[0].record[1].value, FieldValue(ByteList{{9, 8}}));
}

TEST_F(EmbedConsumerTest, FaultsAsForSubmit) {
  struct Case {
    SubmissionEntry e;
    std::vector<std::uint8_t> data;
    Fault fault;
    std::string needle;
  };
  const auto good = RecordWriter().add("texts", std::vector<std::string>{"hi"}).take();
  const auto len = static_cast<std::uint32_t>(good.size());
  auto with_job = embed_entry(1, 0, len);
  with_job.job_id = 3;
  auto flagged = embed_entry(1, 0, len);
  flagged.flags = 1;
  std::vector<std::uint8_t> bad_utf8 = RecordWriter().add("texts", std::vector<std::string>{"\xc3\x28"}).take();
  std::vector<std::uint8_t> bad_f32 = field(8, "v", {1, 2});
  const std::vector<Case> cases = {
      {embed_entry(1, 0, 0), good, Fault::length, "embed data_length 0"},
      {embed_entry(1, 0, s->layout.max_request_bytes + 1), good, Fault::length, "embed data_length"},
      {embed_entry(1, 4090, len), {}, Fault::offset, "outside the request area"},
      {with_job, good, Fault::reserved, "embed with a job id"},
      {flagged, good, Fault::reserved, "reserved"},
      {embed_entry(1, 0, static_cast<std::uint32_t>(bad_utf8.size())), bad_utf8, Fault::utf8, "UTF-8"},
      {embed_entry(1, 0, static_cast<std::uint32_t>(bad_f32.size())), bad_f32, Fault::record, "multiple of 4"},
  };
  for (const auto& c : cases) {
    SetUp();
    if (!c.data.empty()) s->put_data(0, c.data);
    s->put_entry(0, test::nop_entry(1));
    s->put_entry(1, c.e);
    s->set_sq_tail(2);
    auto r = consumer.consume(8);
    EXPECT_EQ(r.fault, c.fault) << c.needle << ": " << r.detail;
    EXPECT_NE(r.detail.find(c.needle), std::string::npos) << r.detail;
    ASSERT_EQ(r.commands.size(), 1u);  // the nop before it
    EXPECT_EQ(r.consumed, 2u);
  }
}

TEST_F(EmbedConsumerTest, ClientEmbedAndEmbeddedCompletion) {
  auto client = s->client();
  const auto rec = RecordWriter().add("model", "emb").add("texts", std::vector<std::string>{"a", "b"}).take();
  ASSERT_TRUE(client->embed(42, rec));
  EXPECT_FALSE(client->embed(43, {}));
  EXPECT_EQ(client->embed(43, std::vector<std::uint8_t>(s->layout.max_request_bytes + 1, 0)).error().code,
            Errc::invalid_argument);
  auto r = consumer.consume(8);
  ASSERT_EQ(r.fault, Fault::none) << r.detail;
  ASSERT_EQ(r.commands.size(), 1u);
  EXPECT_EQ(r.commands[0].op, Opcode::embed);
  auto req = daemon::embed_from_record(r.commands[0].record);
  ASSERT_TRUE(req) << req.error().message;
  EXPECT_EQ(req->texts.size(), 2u);

  // The answer: one `embedded` completion with count, dim and the vectors.
  CompletionWriter writer(s->view(), 1 << 20);
  const std::vector<std::vector<float>> vectors = {{0.25f, -1.0f, 3.0f}, {0.0f, 1.0f, -0.0f}};
  RecordWriter w;
  w.add("count", std::uint64_t{2}).add("dim", std::uint64_t{3}).add("route", "gpu").add_float32_rows("vectors", vectors);
  ASSERT_EQ(writer.post(record_completion(Kind::embedded, 42, 7, w.take())), Fault::none);
  std::vector<Event> events;
  auto n = client->reap(events);
  ASSERT_TRUE(n);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind(), Kind::embedded);
  EXPECT_EQ(events[0].entry.user_data, 42u);
  EXPECT_EQ(events[0].entry.job_id, 7u);
  auto p = parse_record(events[0].data);
  ASSERT_TRUE(p.ok());
  const auto* v = std::get_if<std::vector<float>>(&p.find("vectors")->value);
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(*v, (std::vector<float>{0.25f, -1.0f, 3.0f, 0.0f, 1.0f, -0.0f}));
}

}  // namespace
}  // namespace tandem::ring
