// request_from_record (src/daemon/submit_options.cc): a parsed ring submit record → the submit request. Field names,
// accepted types and ranges are those of apply_option (shared with the D-Bus front end).
#include "daemon/submit_options.h"

#include <gtest/gtest.h>

#include "ring/record.h"

namespace tandem::daemon {
namespace {

using ring::RecordWriter;

Result<RecordRequest> from(const RecordWriter& w) {
  auto parsed = ring::parse_record(w.bytes());
  EXPECT_TRUE(parsed.ok()) << parsed.error->message;
  return request_from_record(parsed.fields);
}

void expect_invalid(const RecordWriter& w, const std::string& mentions) {
  auto r = from(w);
  ASSERT_FALSE(r.ok()) << "accepted; expected an error mentioning " << mentions;
  EXPECT_EQ(r.error().code, Errc::invalid_argument);
  EXPECT_NE(r.error().message.find(mentions), std::string::npos) << r.error().message;
}

TEST(SubmitRecord, PromptAndEveryOptionType) {
  RecordWriter w;
  w.add("model", "tiny").add("prompt", "Hello").add("max_tokens", std::uint64_t{16}).add("temperature", 0.5)
      .add("top_k", std::int64_t{40}).add("top_p", std::uint64_t{1}).add("seed", std::uint64_t{1} << 63)
      .add("stop", std::vector<std::string>{"\n", "END"}).add("idempotency_key", "k")
      .add("side_effects", false).add("allow_cpu", true).add("allow_reduce", true).add("allow_fallback_model", false)
      .add("deadline_ms", std::uint64_t{1000}).add("prefill_chunk", std::uint64_t{256})
      .add("resume_tokens", std::vector<std::int32_t>{1, 2}).add("stream", true).add("enable_thinking", false);
  auto r = from(w);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->model, "tiny");
  EXPECT_EQ(r->prompt, "Hello");
  EXPECT_TRUE(r->messages.empty());
  const auto& o = r->options;
  EXPECT_EQ(o.max_tokens, 16u);
  EXPECT_EQ(o.temperature, 0.5);
  EXPECT_EQ(o.top_k, 40u);
  EXPECT_EQ(o.top_p, 1.0);
  EXPECT_EQ(o.seed, std::uint64_t{1} << 63);
  EXPECT_EQ(o.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_EQ(o.idempotency_key, "k");
  EXPECT_EQ(o.side_effects, false);
  EXPECT_EQ(o.allow_cpu, true);
  EXPECT_EQ(o.allow_reduce, true);
  EXPECT_EQ(o.enable_thinking, std::optional<bool>(false));
  EXPECT_EQ(o.template_flags(), (std::map<std::string, bool>{{"enable_thinking", false}}));
  EXPECT_EQ(o.allow_fallback_model, false);
  EXPECT_EQ(o.deadline_ms, 1000u);
  EXPECT_EQ(o.prefill_chunk, 256u);
  EXPECT_EQ(o.resume_tokens, (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(o.stream, true);
  EXPECT_FALSE(o.repetition_penalty.has_value());
}

TEST(SubmitRecord, MessagesArePairs) {
  auto r = from(RecordWriter().add("model", "m").add("messages", std::vector<std::string>{"system", "s", "user", "u"}));
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->messages.size(), 2u);
  EXPECT_EQ(r->messages[1].first, "user");
  EXPECT_EQ(r->messages[1].second, "u");
  expect_invalid(RecordWriter().add("messages", std::vector<std::string>{"user"}), "odd");
  expect_invalid(RecordWriter().add("messages", "user: hi"), "messages");
}

TEST(SubmitRecord, Errors) {
  expect_invalid(RecordWriter().add("model", std::uint64_t{1}), "model");
  expect_invalid(RecordWriter().add("prompt", true), "prompt");
  expect_invalid(RecordWriter().add("no_such_option", true), "no_such_option");
  expect_invalid(RecordWriter().add("max_tokens", std::int64_t{-1}), "max_tokens");
  expect_invalid(RecordWriter().add("max_tokens", std::uint64_t{(1u << 20) + 1}), "max_tokens");
  expect_invalid(RecordWriter().add("max_tokens", 16.0), "max_tokens");
  expect_invalid(RecordWriter().add("top_k", std::uint64_t{1000001}), "top_k");
  expect_invalid(RecordWriter().add("temperature", "hot"), "temperature");
  expect_invalid(RecordWriter().add("stream", std::uint64_t{1}), "stream");
  expect_invalid(RecordWriter().add("stop", "\n"), "stop");
  expect_invalid(RecordWriter().add("resume_tokens", std::vector<std::string>{"1"}), "resume_tokens");
  expect_invalid(RecordWriter().add("idempotency_key", std::string_view(std::string(257, 'k'))), "idempotency_key");
  expect_invalid(RecordWriter().add("deadline_ms", std::uint64_t{7ull * 24 * 3600 * 1000 + 1}), "deadline_ms");
}

TEST(SubmitRecord, LimitsAreInclusive) {
  auto r = from(RecordWriter().add("max_tokens", std::uint64_t{1u << 20}).add("top_k", std::uint64_t{1000000})
                    .add("idempotency_key", std::string_view(std::string(256, 'k')))
                    .add("deadline_ms", std::uint64_t{7ull * 24 * 3600 * 1000}));
  EXPECT_TRUE(r.ok()) << r.error().message;
}

}  // namespace
}  // namespace tandem::daemon
