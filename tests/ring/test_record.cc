// Records (src/ring/record.cc): the wire format, round trips of every FieldType, and a table of malformed inputs,
// each with the Fault it must give (record framing/syntax vs utf8).
#include "ring/record.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace tandem::ring {
namespace {

using Bytes = std::vector<std::uint8_t>;

// A field built by hand: type, key, value bytes; `reserved` goes into the u16 after the key length.
Bytes field(std::uint8_t type, const std::string& key, const Bytes& value, std::uint16_t reserved = 0,
            std::size_t key_len_override = SIZE_MAX, std::size_t value_len_override = SIZE_MAX) {
  Bytes b;
  b.push_back(type);
  b.push_back(static_cast<std::uint8_t>(key_len_override == SIZE_MAX ? key.size() : key_len_override));
  b.push_back(static_cast<std::uint8_t>(reserved & 0xff));
  b.push_back(static_cast<std::uint8_t>(reserved >> 8));
  const auto vl = static_cast<std::uint32_t>(value_len_override == SIZE_MAX ? value.size() : value_len_override);
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<std::uint8_t>(vl >> (8 * i)));
  b.insert(b.end(), key.begin(), key.end());
  b.insert(b.end(), value.begin(), value.end());
  return b;
}

template <class T>
Bytes le(T v) {
  Bytes b(sizeof v);
  std::memcpy(b.data(), &v, sizeof v);
  return b;
}

Bytes str(const std::string& s) { return Bytes(s.begin(), s.end()); }

Bytes list(const std::vector<std::string>& xs) {
  Bytes b;
  for (const auto& s : xs) {
    auto n = le<std::uint32_t>(static_cast<std::uint32_t>(s.size()));
    b.insert(b.end(), n.begin(), n.end());
    b.insert(b.end(), s.begin(), s.end());
  }
  return b;
}

Bytes cat(std::initializer_list<Bytes> parts) {
  Bytes b;
  for (const auto& p : parts) b.insert(b.end(), p.begin(), p.end());
  return b;
}

constexpr auto kBool = static_cast<std::uint8_t>(FieldType::boolean);
constexpr auto kU64 = static_cast<std::uint8_t>(FieldType::uint64);
constexpr auto kI64 = static_cast<std::uint8_t>(FieldType::int64);
constexpr auto kF64 = static_cast<std::uint8_t>(FieldType::float64);
constexpr auto kStr = static_cast<std::uint8_t>(FieldType::string);
constexpr auto kList = static_cast<std::uint8_t>(FieldType::string_list);
constexpr auto kI32 = static_cast<std::uint8_t>(FieldType::int32_list);

// --- wire format ---------------------------------------------------------------------------------------------------

TEST(RecordWire, WriterProducesTheDocumentedBytes) {
  const Bytes got = RecordWriter().add("a", true).add("n", std::uint64_t{0x0102030405060708}).take();
  const Bytes want = cat({field(kBool, "a", {1}), field(kU64, "n", {8, 7, 6, 5, 4, 3, 2, 1})});
  EXPECT_EQ(got, want);
  // Field header: type, key length, reserved u16 = 0, value length u32 LE, then key and value, no padding.
  ASSERT_GE(got.size(), 10u);
  EXPECT_EQ(got[0], kBool);
  EXPECT_EQ(got[1], 1);
  EXPECT_EQ(got[2], 0);
  EXPECT_EQ(got[3], 0);
  EXPECT_EQ(got[4], 1);
  EXPECT_EQ(got[8], 'a');
  EXPECT_EQ(got[9], 1);
  EXPECT_EQ(got.size(), 2 * kFieldHeaderSize + 1 + 1 + 1 + 8);
}

TEST(RecordWire, EmptyRecordIsValidAndHasNoFields) {
  auto r = parse_record({});
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.fields.empty());
}

// --- round trips ---------------------------------------------------------------------------------------------------

struct RoundTrip {
  const char* name;
  FieldValue value;
};

void PrintTo(const RoundTrip& r, std::ostream* os) { *os << r.name; }

class RecordRoundTrip : public ::testing::TestWithParam<RoundTrip> {};

TEST_P(RecordRoundTrip, ParsesBackToTheSameValue) {
  const auto& p = GetParam();
  RecordWriter w;
  w.add("k", p.value);
  auto r = parse_record(w.bytes());
  ASSERT_TRUE(r.ok()) << r.error->message;
  ASSERT_EQ(r.fields.size(), 1u);
  EXPECT_EQ(r.fields[0].key, "k");
  ASSERT_EQ(r.fields[0].value.index(), p.value.index());
  if (const auto* d = std::get_if<double>(&p.value)) {
    // Bit-exact (distinguishes -0.0 from 0.0).
    const double got = std::get<double>(r.fields[0].value);
    EXPECT_EQ(std::memcmp(&got, d, sizeof got), 0);
  } else {
    EXPECT_EQ(r.fields[0].value, p.value);
  }
  EXPECT_EQ(field_type_name(r.fields[0].value), field_type_name(p.value));
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, RecordRoundTrip,
    ::testing::Values(
        RoundTrip{"bool_true", FieldValue{true}}, RoundTrip{"bool_false", FieldValue{false}},
        RoundTrip{"u64_zero", FieldValue{std::uint64_t{0}}},
        RoundTrip{"u64_max", FieldValue{std::numeric_limits<std::uint64_t>::max()}},
        RoundTrip{"i64_min", FieldValue{std::numeric_limits<std::int64_t>::min()}},
        RoundTrip{"i64_minus_one", FieldValue{std::int64_t{-1}}},
        RoundTrip{"i64_max", FieldValue{std::numeric_limits<std::int64_t>::max()}},
        RoundTrip{"f64_zero", FieldValue{0.0}}, RoundTrip{"f64_negzero", FieldValue{-0.0}},
        RoundTrip{"f64_fraction", FieldValue{0.7}},
        RoundTrip{"f64_max", FieldValue{std::numeric_limits<double>::max()}},
        RoundTrip{"f64_lowest", FieldValue{std::numeric_limits<double>::lowest()}},
        RoundTrip{"f64_denormal", FieldValue{std::numeric_limits<double>::denorm_min()}},
        RoundTrip{"str_empty", FieldValue{std::string()}}, RoundTrip{"str_ascii", FieldValue{std::string("hello")}},
        RoundTrip{"str_utf8", FieldValue{std::string("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80")}},
        RoundTrip{"str_nul", FieldValue{std::string("a\0b", 3)}},
        RoundTrip{"list_empty", FieldValue{std::vector<std::string>{}}},
        RoundTrip{"list_one_empty", FieldValue{std::vector<std::string>{""}}},
        RoundTrip{"list_many", FieldValue{std::vector<std::string>{"user", "hi \xc3\xa9", "", "assistant"}}},
        RoundTrip{"i32_empty", FieldValue{std::vector<std::int32_t>{}}},
        RoundTrip{"i32_values", FieldValue{std::vector<std::int32_t>{0, -1, std::numeric_limits<std::int32_t>::min(),
                                                                     std::numeric_limits<std::int32_t>::max(), 7}}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(RecordRoundTrip, ManyFieldsKeepWireOrderAndFindWorks) {
  RecordWriter w;
  w.add("model", "m").add("prompt", "p").add("max_tokens", std::uint64_t{5}).add("temperature", 0.5)
      .add("stop", std::vector<std::string>{"\n"}).add("resume_tokens", std::vector<std::int32_t>{1, 2})
      .add("stream", true).add("seed", std::int64_t{-3});
  auto r = parse_record(w.bytes());
  ASSERT_TRUE(r.ok()) << r.error->message;
  ASSERT_EQ(r.fields.size(), 8u);
  const char* keys[] = {"model", "prompt", "max_tokens", "temperature", "stop", "resume_tokens", "stream", "seed"};
  for (std::size_t i = 0; i < 8; ++i) EXPECT_EQ(r.fields[i].key, keys[i]);
  ASSERT_NE(r.find("temperature"), nullptr);
  EXPECT_EQ(std::get<double>(r.find("temperature")->value), 0.5);
  EXPECT_EQ(r.find("nope"), nullptr);
}

TEST(RecordRoundTrip, LongestKeyAndAllKeyCharacters) {
  const std::string k64(64, 'z');
  const std::string chars = "abcdefghijklmnopqrstuvwxyz0123456789_";
  auto r = parse_record(RecordWriter().add(k64, true).add(chars, false).bytes());
  ASSERT_TRUE(r.ok()) << r.error->message;
  EXPECT_EQ(r.fields[0].key, k64);
  EXPECT_EQ(r.fields[1].key, chars);
}

// Every prefix of a valid record either ends on a field boundary (valid, fewer fields) or is a record fault; the
// parser never reads past the span (the fuzz build runs this under ASan too).
TEST(RecordRoundTrip, EveryTruncationIsDetected) {
  RecordWriter w;
  w.add("a", true).add("bb", std::string_view("xyz")).add("c", std::vector<std::string>{"p", "q"})
      .add("d", std::vector<std::int32_t>{1, 2, 3}).add("e", 1.25);
  const Bytes all = w.take();
  std::vector<std::size_t> boundaries{0};
  {
    std::size_t pos = 0;
    while (pos < all.size()) {
      std::uint32_t vl;
      std::memcpy(&vl, all.data() + pos + 4, 4);
      pos += kFieldHeaderSize + all[pos + 1] + vl;
      boundaries.push_back(pos);
    }
  }
  ASSERT_EQ(boundaries.size(), 6u);
  for (std::size_t n = 0; n <= all.size(); ++n) {
    Bytes prefix(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n));  // exact-size heap copy
    auto r = parse_record(prefix);
    const auto it = std::find(boundaries.begin(), boundaries.end(), n);
    if (it != boundaries.end()) {
      ASSERT_TRUE(r.ok()) << "prefix " << n << ": " << r.error->message;
      EXPECT_EQ(r.fields.size(), static_cast<std::size_t>(it - boundaries.begin()));
    } else {
      ASSERT_FALSE(r.ok()) << "prefix " << n;
      EXPECT_EQ(r.error->fault, Fault::record) << "prefix " << n;
      EXPECT_TRUE(r.fields.empty());
    }
  }
}

// --- malformed -----------------------------------------------------------------------------------------------------

struct Malformed {
  const char* name;
  Bytes bytes;
  Fault fault;
  RecordLimits limits = {};
};

void PrintTo(const Malformed& m, std::ostream* os) { *os << m.name; }

class RecordMalformed : public ::testing::TestWithParam<Malformed> {};

TEST_P(RecordMalformed, IsRejectedWithTheRightFault) {
  const auto& p = GetParam();
  auto r = parse_record(p.bytes, p.limits);
  ASSERT_FALSE(r.ok()) << p.name << " parsed";
  EXPECT_EQ(r.error->fault, p.fault) << p.name << ": " << r.error->message;
  EXPECT_FALSE(r.error->message.empty());
  EXPECT_TRUE(r.fields.empty()) << "a failed parse returns no fields";
  // The same bad field after a valid one fails the same way.
  auto r2 = parse_record(cat({field(kBool, "zz_first", {1}), p.bytes}), p.limits);
  if (p.limits.max_fields > 1) {
    ASSERT_FALSE(r2.ok()) << p.name;
    EXPECT_EQ(r2.error->fault, p.fault) << p.name;
  }
}

const Bytes kGood = field(kBool, "ok", {1});
const Bytes kNaN = le(std::numeric_limits<double>::quiet_NaN());
const Bytes kSNaN = le(std::numeric_limits<double>::signaling_NaN());
const Bytes kInf = le(std::numeric_limits<double>::infinity());
const Bytes kNegInf = le(-std::numeric_limits<double>::infinity());

RecordLimits limits(std::size_t fields, std::size_t elements) {
  RecordLimits l;
  l.max_fields = fields;
  l.max_list_elements = elements;
  return l;
}

INSTANTIATE_TEST_SUITE_P(
    Table, RecordMalformed,
    ::testing::Values(
        // framing
        Malformed{"truncated_header_1", Bytes{kBool}, Fault::record},
        Malformed{"truncated_header_7", Bytes(kGood.begin(), kGood.begin() + 7), Fault::record},
        Malformed{"key_past_end", Bytes(kGood.begin(), kGood.begin() + 9), Fault::record},
        Malformed{"value_past_end", field(kU64, "n", le<std::uint64_t>(1), 0, SIZE_MAX, 9), Fault::record},
        Malformed{"value_length_huge", field(kStr, "s", str("abc"), 0, SIZE_MAX, 0xffffffffu), Fault::record},
        Malformed{"reserved_low", field(kBool, "b", {1}, 0x0001), Fault::record},
        Malformed{"reserved_high", field(kBool, "b", {1}, 0x8000), Fault::record},
        Malformed{"unknown_type_0", field(0, "x", {}), Fault::record},
        Malformed{"unknown_type_8", field(8, "x", {1}), Fault::record},
        Malformed{"unknown_type_255", field(255, "x", {}), Fault::record},
        // keys
        Malformed{"key_empty", field(kBool, "", {1}), Fault::record},
        Malformed{"key_65", field(kBool, std::string(65, 'a'), {1}), Fault::record},
        Malformed{"key_upper", field(kBool, "Model", {1}), Fault::record},
        Malformed{"key_dash", field(kBool, "max-tokens", {1}), Fault::record},
        Malformed{"key_space", field(kBool, "a b", {1}), Fault::record},
        Malformed{"key_nul", field(kBool, std::string("a\0", 2), {1}), Fault::record},
        Malformed{"key_utf8", field(kBool, "\xc3\xa9", {1}), Fault::record},
        Malformed{"duplicate_key", cat({field(kBool, "d", {1}), field(kU64, "d", le<std::uint64_t>(2))}),
                  Fault::record},
        // sizes and values
        Malformed{"bool_size_0", field(kBool, "b", {}), Fault::record},
        Malformed{"bool_size_2", field(kBool, "b", {1, 0}), Fault::record},
        Malformed{"bool_value_2", field(kBool, "b", {2}), Fault::record},
        Malformed{"bool_value_255", field(kBool, "b", {255}), Fault::record},
        Malformed{"u64_size_7", field(kU64, "n", Bytes(7, 0)), Fault::record},
        Malformed{"u64_size_9", field(kU64, "n", Bytes(9, 0)), Fault::record},
        Malformed{"i64_size_4", field(kI64, "n", Bytes(4, 0)), Fault::record},
        Malformed{"f64_size_4", field(kF64, "x", le(1.0f)), Fault::record},
        Malformed{"f64_nan", field(kF64, "x", kNaN), Fault::record},
        Malformed{"f64_snan", field(kF64, "x", kSNaN), Fault::record},
        Malformed{"f64_inf", field(kF64, "x", kInf), Fault::record},
        Malformed{"f64_neg_inf", field(kF64, "x", kNegInf), Fault::record},
        Malformed{"i32_list_size_6", field(kI32, "t", Bytes(6, 0)), Fault::record},
        Malformed{"i32_list_size_1", field(kI32, "t", Bytes(1, 0)), Fault::record},
        // UTF-8
        Malformed{"str_ff", field(kStr, "s", str("a\xff")), Fault::utf8},
        Malformed{"str_overlong", field(kStr, "s", str("\xc0\xaf")), Fault::utf8},
        Malformed{"str_surrogate", field(kStr, "s", str("\xed\xa0\x80")), Fault::utf8},
        Malformed{"str_truncated_seq", field(kStr, "s", str("ab\xe2\x82")), Fault::utf8},
        Malformed{"str_above_10ffff", field(kStr, "s", str("\xf4\x90\x80\x80")), Fault::utf8},
        Malformed{"str_lone_continuation", field(kStr, "s", str("\x80")), Fault::utf8},
        Malformed{"list_bad_utf8_first", field(kList, "l", list({"\xfe", "ok"})), Fault::utf8},
        Malformed{"list_bad_utf8_last", field(kList, "l", list({"ok", "\xc3"})), Fault::utf8},
        // list framing
        Malformed{"list_truncated_length", field(kList, "l", cat({list({"a"}), Bytes{1, 0, 0}})), Fault::record},
        Malformed{"list_element_overruns", field(kList, "l", cat({le<std::uint32_t>(5), str("abc")})),
                  Fault::record},
        Malformed{"list_element_overruns_huge", field(kList, "l", cat({le<std::uint32_t>(0xffffffffu), str("a")})),
                  Fault::record},
        // limits
        Malformed{"too_many_fields",
                  cat({field(kBool, "a", {1}), field(kBool, "b", {1}), field(kBool, "c", {1})}), Fault::record,
                  limits(2, 100)},
        Malformed{"too_many_list_elements", field(kList, "l", list({"a", "b", "c"})), Fault::record,
                  limits(10, 2)},
        Malformed{"too_many_empty_list_elements", field(kList, "l", list({"", "", ""})), Fault::record,
                  limits(10, 2)},
        Malformed{"too_many_i32", field(kI32, "t", Bytes(12, 0)), Fault::record, limits(10, 2)}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(RecordLimitsExact, AtTheLimitIsAccepted) {
  auto l = limits(2, 2);
  EXPECT_TRUE(parse_record(cat({field(kBool, "a", {1}), field(kBool, "b", {1})}), l).ok());
  EXPECT_TRUE(parse_record(field(kList, "l", list({"a", "b"})), l).ok());
  EXPECT_TRUE(parse_record(field(kI32, "t", Bytes(8, 0)), l).ok());
}

TEST(RecordLimitsExact, DefaultFieldLimitIs128) {
  RecordWriter w;
  for (int i = 0; i < 128; ++i) w.add("k" + std::to_string(i), true);
  EXPECT_TRUE(parse_record(w.bytes()).ok());
  w.add("k128", true);
  auto r = parse_record(w.bytes());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error->fault, Fault::record);
}

TEST(RecordKeys, ValidKey) {
  EXPECT_TRUE(valid_key("a"));
  EXPECT_TRUE(valid_key("max_tokens"));
  EXPECT_TRUE(valid_key("_0"));
  EXPECT_TRUE(valid_key(std::string(64, 'x')));
  EXPECT_FALSE(valid_key(""));
  EXPECT_FALSE(valid_key(std::string(65, 'x')));
  EXPECT_FALSE(valid_key("A"));
  EXPECT_FALSE(valid_key("a.b"));
  EXPECT_FALSE(valid_key("a/b"));
}

}  // namespace
}  // namespace tandem::ring
