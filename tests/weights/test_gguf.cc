// GgufFile / GgufWriter: round trips of every value type and tensor layout, every truncation point of a small file,
// random corruptions of the header region, hand-made hostile files, and llama.cpp's own files from ../shared
// (skipped when absent).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "gguf_test_util.h"
#include "test_util.h"
#include "weights/gguf.h"

namespace tandem::weights {
namespace {

using testing::as_bytes;
using testing::Raw;

Result<GgufFile> parse(const std::string& bytes) { return GgufFile::parse(as_bytes(bytes), "mem.gguf"); }

std::string serialize(const GgufWriter& w) {
  auto r = w.serialize();
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? *r : std::string();
}

GgufValue scalar(GgufType t, double v) {
  switch (t) {
    case GgufType::u8:
    case GgufType::u16:
    case GgufType::u32:
    case GgufType::u64: return GgufValue::of_uint(t, static_cast<std::uint64_t>(v));
    case GgufType::boolean: return GgufValue::of_bool(v != 0);
    case GgufType::f32:
    case GgufType::f64: return GgufValue::of_float(t, v);
    default: return GgufValue::of_int(t, static_cast<std::int64_t>(v));
  }
}

const GgufType kScalarTypes[] = {GgufType::u8,  GgufType::i8,  GgufType::u16, GgufType::i16,
                                 GgufType::u32, GgufType::i32, GgufType::f32, GgufType::boolean,
                                 GgufType::u64, GgufType::i64, GgufType::f64};

TEST(GgufRoundTrip, EveryValueType) {
  GgufWriter w;
  // Scalars at their edges.
  w.set("u8", GgufValue::of_uint(GgufType::u8, 255));
  w.set("i8", GgufValue::of_int(GgufType::i8, -128));
  w.set("u16", GgufValue::of_uint(GgufType::u16, 65535));
  w.set("i16", GgufValue::of_int(GgufType::i16, -32768));
  w.set("u32", GgufValue::of_uint(GgufType::u32, 4294967295u));
  w.set("i32", GgufValue::of_int(GgufType::i32, std::numeric_limits<std::int32_t>::min()));
  w.set("f32", GgufValue::of_float(GgufType::f32, 0.1));
  w.set("bool.t", GgufValue::of_bool(true));
  w.set("bool.f", GgufValue::of_bool(false));
  w.set("str", GgufValue::of_string(std::string("h\xC3\xA9llo\0world", 12)));
  w.set("str.empty", GgufValue::of_string(""));
  w.set("u64", GgufValue::of_uint(GgufType::u64, std::numeric_limits<std::uint64_t>::max()));
  w.set("i64", GgufValue::of_int(GgufType::i64, std::numeric_limits<std::int64_t>::min()));
  w.set("f64", GgufValue::of_float(GgufType::f64, -1.0 / 3.0));
  w.set("f32.inf", GgufValue::of_float(GgufType::f32, -INFINITY));
  // Arrays of every scalar type (values 0, 1, 2 and a negative where signed), strings, empty, nested.
  for (GgufType t : kScalarTypes) {
    std::vector<GgufValue> items;
    for (double v : {0.0, 1.0, 2.0, -3.0}) {
      if (v < 0 && (t == GgufType::u8 || t == GgufType::u16 || t == GgufType::u32 || t == GgufType::u64 ||
                    t == GgufType::boolean)) {
        continue;
      }
      items.push_back(scalar(t, t == GgufType::boolean ? static_cast<double>(static_cast<int>(v) % 2) : v));
    }
    w.set("arr." + std::string(gguf_type_name(t)), GgufValue::of_array(t, items));
  }
  w.set("arr.string", GgufValue::of_strings({"a", "", "\xE2\x96\x81the", std::string(300, 'x')}));
  w.set("arr.empty", GgufValue::of_array(GgufType::u32, {}));
  const GgufValue inner1 = GgufValue::of_i32s(std::vector<std::int32_t>{1, -2, 3});
  const GgufValue inner2 = GgufValue::of_strings({"x", "yz"});
  const GgufValue inner3 = GgufValue::of_array(GgufType::array, {inner1, GgufValue::of_array(GgufType::f64, {})});
  w.set("arr.nested", GgufValue::of_array(GgufType::array, {inner1, inner2, inner3}));

  const std::string bytes = serialize(w);
  EXPECT_EQ(bytes, serialize(w)) << "output must be deterministic";
  auto f = parse(bytes);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->header_bytes().size(), bytes.size());  // no tensors: no padding, no data section

  auto get = [&](const char* k) -> const GgufValue& {
    const GgufValue* v = f->find(k);
    EXPECT_NE(v, nullptr) << k;
    static const GgufValue none;
    return v != nullptr ? *v : none;
  };
  EXPECT_EQ(get("u8").type, GgufType::u8);
  EXPECT_EQ(get("u8").u, 255u);
  EXPECT_EQ(get("i8").i, -128);
  EXPECT_EQ(get("u16").u, 65535u);
  EXPECT_EQ(get("i16").i, -32768);
  EXPECT_EQ(get("u32").u, 4294967295u);
  EXPECT_EQ(get("i32").i, std::numeric_limits<std::int32_t>::min());
  EXPECT_EQ(get("f32").type, GgufType::f32);
  EXPECT_EQ(get("f32").f, static_cast<double>(0.1F));
  EXPECT_EQ(get("bool.t").u, 1u);
  EXPECT_EQ(get("bool.f").u, 0u);
  EXPECT_EQ(get("bool.t").type, GgufType::boolean);
  EXPECT_EQ(get("str").str, std::string("h\xC3\xA9llo\0world", 12));
  EXPECT_EQ(get("str.empty").str, "");
  EXPECT_EQ(get("u64").u, std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(get("u64").as_i64(), std::nullopt);
  EXPECT_EQ(get("i64").i, std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(get("i64").as_u64(), std::nullopt);
  EXPECT_EQ(get("f64").f, -1.0 / 3.0);
  EXPECT_EQ(get("f32.inf").f, -INFINITY);
  EXPECT_EQ(get("u32").as_u64(), std::optional<std::uint64_t>(4294967295u));
  EXPECT_EQ(get("i8").as_f64(), std::optional<double>(-128.0));
  EXPECT_EQ(get("str").as_i64(), std::nullopt);
  for (GgufType t : kScalarTypes) {
    const GgufValue& a = get(("arr." + std::string(gguf_type_name(t))).c_str());
    EXPECT_EQ(a.type, GgufType::array);
    EXPECT_EQ(a.elem_type, t);
    const bool is_signed = t == GgufType::i8 || t == GgufType::i16 || t == GgufType::i32 || t == GgufType::i64 ||
                           t == GgufType::f32 || t == GgufType::f64;
    ASSERT_EQ(a.count, is_signed ? 4u : 3u) << gguf_type_name(t);
    for (std::uint64_t k = 0; k < a.count; ++k) {
      const double want = t == GgufType::boolean ? static_cast<double>(k % 2) : k < 3 ? static_cast<double>(k) : -3.0;
      if (t == GgufType::f32 || t == GgufType::f64) {
        EXPECT_EQ(a.float_at(k), std::optional<double>(want)) << gguf_type_name(t) << " " << k;
        EXPECT_EQ(a.int_at(k), std::nullopt);
      } else {
        EXPECT_EQ(a.int_at(k), std::optional<std::int64_t>(static_cast<std::int64_t>(want)))
            << gguf_type_name(t) << " " << k;
        EXPECT_EQ(a.float_at(k), std::nullopt);
      }
    }
    EXPECT_EQ(a.int_at(a.count), std::nullopt);
  }
  EXPECT_EQ(get("arr.string").strings, (std::vector<std::string>{"a", "", "\xE2\x96\x81the", std::string(300, 'x')}));
  EXPECT_EQ(get("arr.empty").count, 0u);
  const GgufValue& nested = get("arr.nested");
  ASSERT_EQ(nested.elem_type, GgufType::array);
  ASSERT_EQ(nested.arrays.size(), 3u);
  EXPECT_EQ(nested.arrays[0].int_at(1), std::optional<std::int64_t>(-2));
  EXPECT_EQ(nested.arrays[1].strings, (std::vector<std::string>{"x", "yz"}));
  ASSERT_EQ(nested.arrays[2].arrays.size(), 2u);
  EXPECT_EQ(nested.arrays[2].arrays[0].int_at(2), std::optional<std::int64_t>(3));
  EXPECT_EQ(nested.arrays[2].arrays[1].elem_type, GgufType::f64);
  // Metadata keeps file order.
  EXPECT_EQ(f->metadata().front().first, "u8");
  EXPECT_EQ(f->metadata().back().first, "arr.nested");
  // Re-serializing what was read gives the same bytes.
  GgufWriter again;
  for (const auto& [k, v] : f->metadata()) again.set(k, v);
  EXPECT_EQ(serialize(again), bytes);
}

TEST(GgufRoundTrip, TensorsTypesAlignmentAndVersions) {
  for (std::uint32_t alignment : {32u, 64u, 1u}) {
    for (std::uint32_t version : {2u, 3u}) {
      SCOPED_TRACE("alignment " + std::to_string(alignment) + " version " + std::to_string(version));
      GgufWriter w(alignment, version);
      w.set("general.architecture", GgufValue::of_string("llama"));
      struct T {
        const char* name;
        std::uint32_t type;
        std::vector<std::uint64_t> ne;
        std::size_t bytes;
      };
      const std::vector<T> ts = {
          {"f32", 0, {3, 5}, 60},           {"f16", 1, {7}, 14},      {"bf16", 30, {2, 2, 2, 2}, 32},
          {"q8_0", 8, {64, 3}, 2 * 34 * 3}, {"q4_0", 2, {32}, 18},    {"q4_K", 12, {256, 2}, 288},
          {"q5_K", 13, {512}, 352},         {"q6_K", 14, {256}, 210}, {"q2_K", 10, {256}, 84},
          {"iq4_xs", 23, {256}, 136},       {"iq2_xxs", 16, {256}, 66}, {"unknown", 77, {5}, 13},
          {"empty", 0, {0, 4}, 0},
      };
      for (std::size_t k = 0; k < ts.size(); ++k) {
        ASSERT_TRUE(w.add_tensor(ts[k].name, ts[k].type, ts[k].ne, testing::pattern(ts[k].bytes, k)).ok()) << k;
      }
      const std::string bytes = serialize(w);
      auto f = parse(bytes);
      ASSERT_TRUE(f.ok()) << f.error().message;
      EXPECT_EQ(f->version(), version);
      EXPECT_EQ(f->alignment(), alignment);
      EXPECT_EQ(f->find("general.alignment") != nullptr, alignment != 32);
      EXPECT_EQ(f->data_offset() % alignment, 0u);
      ASSERT_EQ(f->tensors().size(), ts.size());
      for (std::size_t k = 0; k < ts.size(); ++k) {
        const GgufTensorInfo& t = f->tensors()[k];
        EXPECT_EQ(t.name, ts[k].name);
        EXPECT_EQ(t.ne, ts[k].ne);
        EXPECT_EQ(t.ggml_type, ts[k].type);
        EXPECT_EQ(t.offset % alignment, 0u);
        const auto want = testing::pattern(ts[k].bytes, k);
        if (ts[k].type == 77) {
          EXPECT_FALSE(t.size_known);
          EXPECT_EQ(t.nbytes, 0u);
          EXPECT_EQ(ggml_type_label(t.ggml_type), "ggml type 77");
          continue;
        }
        EXPECT_EQ(t.nbytes, ts[k].bytes) << t.name;
        const auto got = f->raw_tensor_bytes(t);
        EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end())) << t.name;
        EXPECT_EQ(ggml_type_label(t.ggml_type), t.name == std::string("empty") ? "f32" : t.name);
        auto view = f->tensor_data(t);
        EXPECT_EQ(view.ok(), t.wtype.has_value()) << t.name;
        if (t.name == std::string("iq2_xxs")) {
          EXPECT_ERR(view, Errc::unsupported, "mem.gguf: tensor 'iq2_xxs' has type iq2_xxs");
        }
      }
      EXPECT_EQ(f->find_tensor("q4_K")->wtype, std::optional<kernels::WType>(kernels::WType::q4_K));
      EXPECT_EQ(f->find_tensor("q4_K")->hf_shape(), (std::vector<std::int64_t>{2, 256}));
      EXPECT_EQ(f->find_tensor("bf16")->rows(), 8u);
      EXPECT_EQ(f->find_tensor("nope"), nullptr);
    }
  }
}

TEST(GgufWriter, RejectsInconsistentInput) {
  GgufWriter w;
  EXPECT_ERR(w.add_tensor("a", 8, {33}, testing::pattern(34, 0)), Errc::invalid_argument,
             "not a multiple of the q8_0 block size 32");
  EXPECT_ERR(w.add_tensor("a", 0, {4}, testing::pattern(15, 0)), Errc::invalid_argument, "needs 16 bytes, got 15");
  EXPECT_ERR(w.add_tensor("a", 0, {1, 1, 1, 1, 1}, testing::pattern(4, 0)), Errc::invalid_argument, "5 dims");
  EXPECT_ERR(w.add_tensor("", 0, {1}, testing::pattern(4, 0)), Errc::invalid_argument, "empty tensor name");
  ASSERT_TRUE(w.add_tensor("a", 0, {1}, testing::pattern(4, 0)).ok());
  EXPECT_ERR(w.add_tensor("a", 0, {1}, testing::pattern(4, 0)), Errc::invalid_argument, "added twice");
  EXPECT_ERR(w.add_tensor("b", kernels::WType::f32, {-1}, {}), Errc::invalid_argument, "negative");
  GgufValue bad = GgufValue::of_array(GgufType::u32, {GgufValue::of_uint(GgufType::u32, 1)});
  bad.count = 2;
  w.set("bad", bad);
  EXPECT_ERR(w.serialize(), Errc::invalid_argument, "'bad': inconsistent value");
  EXPECT_TRUE(w.erase("bad"));
  EXPECT_FALSE(w.erase("bad"));
  EXPECT_TRUE(w.serialize().ok());
  EXPECT_ERR(GgufWriter(48).serialize(), Errc::invalid_argument, "alignment 48 is not a power of two");
  GgufWriter wa;
  wa.set("general.alignment", GgufValue::of_uint(GgufType::u64, 64));
  EXPECT_ERR(wa.serialize(), Errc::invalid_argument, "general.alignment must be a u32");
  // An explicit general.alignment sets the alignment.
  GgufWriter w64;
  w64.set("general.alignment", GgufValue::of_uint(GgufType::u32, 64));
  ASSERT_TRUE(w64.add_tensor("t", 0, {3}, testing::pattern(12, 1)).ok());
  auto f = parse(serialize(w64));
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  EXPECT_EQ(f->metadata().size(), 1u);
  // write(): an unwritable path is io_error.
  EXPECT_ERR(w64.write("/nonexistent-dir/x.gguf"), Errc::io_error, "/nonexistent-dir/x.gguf.tmp");
}

// A small file whose last tensor fills its aligned slot exactly, so that every proper prefix is invalid.
std::string small_file() {
  GgufWriter w;
  w.set("general.architecture", GgufValue::of_string("llama"));
  w.set("a.u32", GgufValue::of_uint(GgufType::u32, 7));
  w.set("a.f64", GgufValue::of_float(GgufType::f64, 2.5));
  w.set("a.bool", GgufValue::of_bool(true));
  w.set("a.strs", GgufValue::of_strings({"x", "yy", ""}));
  w.set("a.nested", GgufValue::of_array(GgufType::array, {GgufValue::of_i32s(std::vector<std::int32_t>{1, 2})}));
  EXPECT_TRUE(w.add_tensor("t.q8", 8, {32, 2}, testing::pattern(68, 1)).ok());
  EXPECT_TRUE(w.add_tensor("t.f32", 0, {8}, testing::pattern(32, 2)).ok());
  return serialize(w);
}

TEST(GgufRobustness, EveryTruncationFailsCleanly) {
  const std::string full = small_file();
  ASSERT_TRUE(parse(full).ok());
  for (std::size_t n = 0; n < full.size(); ++n) {
    auto f = parse(full.substr(0, n));
    ASSERT_FALSE(f.ok()) << "prefix of " << n << " bytes opened";
    EXPECT_EQ(f.error().code, Errc::format_error) << n << ": " << f.error().message;
    EXPECT_EQ(f.error().message.rfind("mem.gguf: ", 0), 0u) << f.error().message;
  }
}

TEST(GgufRobustness, EveryTruncationOfAFileOnDiskFailsCleanly) {
  testing::TempDir dir;
  const std::string full = small_file();
  // Every 7th prefix through the mmap path (MappedFile::open, including the empty file).
  for (std::size_t n = 0; n < full.size(); n += 7) {
    testing::write_file(dir / "t.gguf", full.substr(0, n));
    auto f = GgufFile::open(dir / "t.gguf");
    ASSERT_FALSE(f.ok()) << n;
    EXPECT_EQ(f.error().code, Errc::format_error) << f.error().message;
    EXPECT_NE(f.error().message.find(dir / "t.gguf"), std::string::npos);
  }
  testing::write_file(dir / "t.gguf", full);
  EXPECT_TRUE(GgufFile::open(dir / "t.gguf").ok());
  EXPECT_ERR(GgufFile::open(dir / "missing.gguf"), Errc::not_found, "missing.gguf");
  EXPECT_ERR(GgufFile::open(dir.path()), Errc::io_error, "not a regular file");
}

// Checks what a successfully opened file promises.
void expect_consistent(const GgufFile& f) {
  const std::uint64_t size = f.file_size();
  EXPECT_LE(f.header_bytes().size(), size);
  std::set<std::string> names;
  for (const auto& t : f.tensors()) {
    EXPECT_TRUE(names.insert(t.name).second);
    EXPECT_GE(t.ne.size(), 1u);
    EXPECT_LE(t.ne.size(), 4u);
    EXPECT_EQ(t.offset % f.alignment(), 0u);
    const auto b = f.raw_tensor_bytes(t);
    if (!b.empty()) {
      EXPECT_GE(b.data(), f.bytes().data() + f.data_offset());
      EXPECT_LE(b.data() + b.size(), f.bytes().data() + size);
    }
  }
}

TEST(GgufRobustness, RandomHeaderCorruptions) {
  const std::string full = small_file();
  auto clean = parse(full);
  ASSERT_TRUE(clean.ok());
  const std::size_t header = clean->header_bytes().size();
  std::mt19937 rng(20261203);
  int opened = 0, failed = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    std::string b = full;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      const std::size_t at = rng() % header;
      // Mostly small changes (bit flips, near values), sometimes 0xFF bytes (huge lengths / counts).
      switch (rng() % 3) {
        case 0: b[at] = static_cast<char>(b[at] ^ (1 << (rng() % 8))); break;
        case 1: b[at] = static_cast<char>(rng() & 0xFF); break;
        default: b[at] = '\xFF';
      }
    }
    auto f = parse(b);
    if (f.ok()) {
      ++opened;
      expect_consistent(*f);
    } else {
      ++failed;
      EXPECT_TRUE(f.error().code == Errc::format_error || f.error().code == Errc::unsupported)
          << errc_name(f.error().code) << ": " << f.error().message;
      EXPECT_EQ(f.error().message.rfind("mem.gguf: ", 0), 0u) << f.error().message;
    }
  }
  EXPECT_GT(failed, 1000);
  EXPECT_GT(opened, 10);  // flips inside string bytes / values keep the file valid
  RecordProperty("opened", opened);
  RecordProperty("failed", failed);
}

// --- hand-made hostile files --------------------------------------------------------------------------------------

struct Hostile {
  const char* what;
  std::string bytes;
  Errc code;
  const char* needle;
};

// One tensor info entry.
Raw& tensor_info(Raw& r, std::string_view name, std::vector<std::uint64_t> ne, std::uint32_t type,
                 std::uint64_t offset) {
  r.str(name).u32(static_cast<std::uint32_t>(ne.size()));
  for (auto d : ne) r.u64(d);
  return r.u32(type).u64(offset);
}

// A file with the given tensor infos and `data` bytes of data section.
std::string with_tensors(
    const std::vector<std::tuple<std::string, std::vector<std::uint64_t>, std::uint32_t, std::uint64_t>>& ts,
    std::size_t data) {
  Raw r = Raw::header(ts.size(), 0);
  for (const auto& [n, ne, ty, off] : ts) tensor_info(r, n, ne, ty, off);
  return r.pad(32).bytes(data, '\x01').b;
}

TEST(GgufRobustness, HostileFiles) {
  const std::uint64_t kHuge = 1ull << 62;
  std::vector<Hostile> cases;
  cases.push_back({"empty", "", Errc::format_error, "not a GGUF file"});
  cases.push_back({"magic", "GGML" + std::string(20, '\0'), Errc::format_error, "not a GGUF file"});
  cases.push_back({"version 1", Raw::header(0, 0, 1).b, Errc::unsupported, "GGUF version 1 is not supported"});
  cases.push_back({"version 4", Raw::header(0, 0, 4).b, Errc::unsupported, "GGUF version 4"});
  cases.push_back({"big endian", Raw::header(0, 0, 0x03000000u).b, Errc::unsupported, "big-endian"});
  cases.push_back({"huge kv count", Raw::header(0, kHuge).b, Errc::format_error, "metadata count 4611686018427387904"});
  cases.push_back({"huge tensor count", Raw::header(~0ull, 0).b, Errc::format_error, "tensor count"});
  cases.push_back({"key past EOF", Raw::header(0, 1).u64(1000).bytes(20, 'k').b, Errc::format_error,
                   "key length 1000 runs past the end of the file"});
  cases.push_back({"key too long", Raw::header(0, 1).u64(70000).bytes(70000, 'k').b, Errc::format_error,
                   "key length 70000 exceeds the limit of 65535"});
  cases.push_back({"empty key", Raw::header(0, 1).str("").u32(0).bytes(2).b, Errc::format_error, "empty key"});
  cases.push_back({"string past EOF", Raw::header(0, 1).str("k").u32(8).u64(1ull << 40).bytes(30).b, Errc::format_error,
                   "key 'k': string length 1099511627776 exceeds the limit"});
  cases.push_back({"string a bit past EOF", Raw::header(0, 1).str("k").u32(8).u64(100).bytes(30).b, Errc::format_error,
                   "key 'k': string length 100 runs past the end"});
  cases.push_back({"string over 1 MiB", Raw::header(0, 1).str("k").u32(8).u64((1 << 20) + 1).bytes((1 << 20) + 1).b,
                   Errc::format_error, "exceeds the limit of 1048576 bytes"});
  cases.push_back({"unknown value type", Raw::header(0, 1).str("k").u32(13).bytes(8).b, Errc::format_error,
                   "key 'k': unknown value type 13"});
  cases.push_back(
      {"bool 2", Raw::header(0, 1).str("k").u32(7).bytes(1, '\x02').b, Errc::format_error, "bool value is 2"});
  cases.push_back({"bool array 3", Raw::header(0, 1).str("k").u32(9).u32(7).u64(2).bytes(1, '\x01').bytes(1, '\x03').b,
                   Errc::format_error, "bool array element 1 is 3"});
  cases.push_back({"truncated scalar", Raw::header(0, 1).str("k").u32(12).bytes(5).b, Errc::format_error,
                   "file ends inside the value (8 bytes needed, 5 left)"});
  cases.push_back({"huge array", Raw::header(0, 1).str("k").u32(9).u32(4).u64(kHuge).bytes(16).b, Errc::format_error,
                   "array of 4611686018427387904 u32 needs"});
  cases.push_back({"huge string array", Raw::header(0, 1).str("k").u32(9).u32(8).u64(~0ull >> 1).bytes(16).b,
                   Errc::format_error, "string needs at least"});
  cases.push_back({"huge nested array", Raw::header(0, 1).str("k").u32(9).u32(9).u64(kHuge).bytes(16).b,
                   Errc::format_error, "array needs at least"});
  cases.push_back({"bad element type", Raw::header(0, 1).str("k").u32(9).u32(40).u64(0).b, Errc::format_error,
                   "unknown array element type 40"});
  {
    Raw r = Raw::header(0, 1).str("deep").u32(9);
    for (int d = 0; d < 9; ++d) r.u32(9).u64(1);
    r.u32(4).u64(0);
    cases.push_back({"nested 9 deep", r.b, Errc::format_error, "nested deeper than 8 levels"});
  }
  {
    Raw r = Raw::header(0, 1).str("many").u32(9).u32(9).u64(65537);
    for (int k = 0; k < 65537; ++k) r.u32(4).u64(0);
    cases.push_back(
        {"nested budget", r.b, Errc::format_error, "more nested-array elements in the file than the limit"});
  }
  {
    Raw r = Raw::header(0, 1).str("strs").u32(9).u32(8).u64((1ull << 22) + 1);
    r.bytes(((1ull << 22) + 1) * 8);
    cases.push_back(
        {"string budget", r.b, Errc::format_error, "more string-array elements in the file than the limit"});
  }
  cases.push_back({"duplicate key", Raw::header(0, 2).str("k").u32(0).bytes(1).str("k").u32(4).u32(1).b,
                   Errc::format_error, "key 'k' appears twice"});
  cases.push_back({"alignment type", Raw::header(0, 1).str("general.alignment").u32(10).u64(64).b, Errc::format_error,
                   "'general.alignment' must be a u32, got u64"});
  cases.push_back({"alignment 48", Raw::header(0, 1).str("general.alignment").u32(4).u32(48).b, Errc::format_error,
                   "must be a power of two, got 48"});
  cases.push_back({"alignment 0", Raw::header(0, 1).str("general.alignment").u32(4).u32(0).b, Errc::format_error,
                   "must be a power of two, got 0"});
  cases.push_back({"n_dims 5", with_tensors({{"t", {1, 1, 1, 1, 1}, 0, 0}}, 32), Errc::format_error,
                   "tensor 't': n_dims is 5, must be 1 to 4"});
  cases.push_back({"n_dims 0", with_tensors({{"t", {}, 0, 0}}, 32), Errc::format_error, "n_dims is 0"});
  cases.push_back({"dim above int64", with_tensors({{"t", {1ull << 63}, 0, 0}}, 32), Errc::format_error,
                   "dimension 0 is 9223372036854775808, above 2^63 - 1"});
  cases.push_back({"element count overflow", with_tensors({{"t", {1ull << 32, 1ull << 32}, 0, 0}}, 32),
                   Errc::format_error, "element count of dims [4294967296, 4294967296] overflows"});
  cases.push_back({"byte size overflow", with_tensors({{"t", {1ull << 31, 1ull << 31}, 0, 0}}, 32), Errc::format_error,
                   "size of [2147483648, 2147483648] f32 overflows 64 bits"});
  cases.push_back({"row not a block multiple", with_tensors({{"t", {33}, 8, 0}}, 64), Errc::format_error,
                   "row length ne[0] = 33 is not a multiple of the q8_0 block size 32"});
  cases.push_back({"misaligned", with_tensors({{"t", {4}, 0, 4}}, 64), Errc::format_error,
                   "tensor 't': data offset 4 is not a multiple of the alignment 32"});
  cases.push_back({"past the data", with_tensors({{"t", {16}, 0, 32}}, 64), Errc::format_error,
                   "tensor 't': data [32, +64 bytes) runs past the end of the data section (64 bytes)"});
  cases.push_back({"offset far out", with_tensors({{"t", {4}, 0, 1ull << 63}}, 64), Errc::format_error,
                   "runs past the end of the data section"});
  cases.push_back({"overlap", with_tensors({{"a", {16}, 0, 0}, {"b", {8}, 0, 32}}, 96), Errc::format_error,
                   "tensor 'b' bytes [32, 64) overlap tensor 'a' bytes [0, 64)"});
  cases.push_back({"duplicate tensor", with_tensors({{"a", {4}, 0, 0}, {"a", {4}, 0, 32}}, 64), Errc::format_error,
                   "tensor 'a' appears twice"});
  cases.push_back({"empty tensor name", with_tensors({{"", {4}, 0, 0}}, 64), Errc::format_error, "empty tensor name"});
  {
    Raw r = Raw::header(1, 0);
    tensor_info(r, "t", {0}, 0, 0);  // no data section at all: header end not padded
    cases.push_back({"no data section", r.b, Errc::format_error, "the data section would start at offset 64"});
  }
  cases.push_back({"name with control bytes", with_tensors({{"a\nb", {4}, 0, 4}}, 64), Errc::format_error,
                   "tensor 'a\\x0ab': data offset 4"});

  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    auto f = parse(c.bytes);
    EXPECT_ERR(f, c.code, c.needle);
    if (!f.ok()) {
      EXPECT_EQ(f.error().message.rfind("mem.gguf: ", 0), 0u) << f.error().message;
    }
  }
}

TEST(GgufRobustness, ValidEdgeCasesOpen) {
  // Zero-size tensors anywhere, holes between tensors, an unknown type's tensor with any offset in range.
  auto f = parse(with_tensors({{"z", {0, 3}, 0, 0}, {"a", {8}, 0, 0}, {"hole", {8}, 0, 64}, {"u", {5}, 200, 96}}, 128));
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_FALSE(f->find_tensor("u")->size_known);
  EXPECT_TRUE(f->raw_tensor_bytes(*f->find_tensor("z")).empty());
  EXPECT_EQ(f->raw_tensor_bytes(*f->find_tensor("hole")).size(), 32u);
  // A vocabulary-only file (no tensors) may end right after its metadata.
  auto v = parse(Raw::header(0, 1).str("k").u32(4).u32(1).b);
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ(v->find("k")->u, 1u);
  // Version 2.
  EXPECT_TRUE(parse(Raw::header(0, 0, 2).b).ok());
}

// --- llama.cpp's files --------------------------------------------------------------------------------------------

TEST(GgufReal, LlamaCppFilesParseAndOurWriterReproducesThemByteForByte) {
  for (const char* name : {"f16", "Q8_0", "Q4_0", "Q4_K_M"}) {
    SCOPED_TRACE(name);
    const std::string path = testing::shared_dir() + "/models/gguf-tiny/shared256-" + name + ".gguf";
    SKIP_WITHOUT(path);
    auto f = GgufFile::open(path);
    ASSERT_TRUE(f.ok()) << f.error().message;
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->alignment(), 32u);
    EXPECT_EQ(f->tensors().size(), 21u);
    EXPECT_EQ(f->metadata().size(), 25u);
    EXPECT_EQ(f->find("general.architecture")->str, "llama");
    EXPECT_EQ(f->find("tokenizer.ggml.tokens")->strings.size(), 32000u);
    EXPECT_EQ(f->find("tokenizer.ggml.tokens")->strings[15043], "\xE2\x96\x81Hello");
    expect_consistent(*f);
    // Same metadata and tensors through GgufWriter: the same bytes as llama.cpp's writer.
    GgufWriter w;
    for (const auto& [k, v] : f->metadata()) w.set(k, v);
    for (const auto& t : f->tensors()) {
      auto data = f->tensor_data(t);
      ASSERT_TRUE(data.ok()) << data.error().message;
      ASSERT_TRUE(w.add_tensor(t.name, t.ggml_type, t.ne, *data).ok());
    }
    auto out = w.serialize();
    ASSERT_TRUE(out.ok()) << out.error().message;
    const auto orig = f->bytes();
    ASSERT_EQ(out->size(), orig.size());
    EXPECT_EQ(std::memcmp(out->data(), orig.data(), orig.size()), 0);
  }
}

TEST(GgufReal, VocabularyOnlyFilesOpen) {
  for (const char* name : {"llama-spm", "phi-3", "gpt-2", "deepseek-coder"}) {
    const std::string path = testing::shared_dir() + "/models/vocab/ggml-vocab-" + name + ".gguf";
    SKIP_WITHOUT(path);
    auto f = GgufFile::open(path);
    ASSERT_TRUE(f.ok()) << f.error().message;
    EXPECT_TRUE(f->tensors().empty()) << name;
    EXPECT_NE(f->find("tokenizer.ggml.tokens"), nullptr) << name;
  }
}

}  // namespace
}  // namespace tandem::weights
