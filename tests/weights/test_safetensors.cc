// safetensors: writer round trip, mmap, and every header violation as a typed error naming file and tensor.
#include <random>

#include "test_util.h"

namespace tandem::weights::testing {
namespace {

std::vector<std::byte> bytes_of(std::initializer_list<float> v) {
  std::vector<std::byte> out(v.size() * sizeof(float));
  std::memcpy(out.data(), std::data(v), out.size());
  return out;
}

TEST(DType, NamesSizesAndParsing) {
  for (DType d : {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i64, DType::i32, DType::i16, DType::i8,
                  DType::u8, DType::boolean}) {
    auto back = parse_dtype(dtype_name(d));
    ASSERT_TRUE(back.ok()) << dtype_name(d);
    EXPECT_EQ(*back, d);
    EXPECT_GT(dtype_size(d), 0u);
  }
  EXPECT_EQ(dtype_name(DType::bf16), "BF16");
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  auto bad = parse_dtype("F8_E4M3");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, Errc::unsupported);
  EXPECT_FALSE(parse_dtype("f32").ok());  // spelling is case-sensitive
}

TEST(Safetensors, WriteThenOpenRoundTrip) {
  TempDir d;
  const auto a = bytes_of({1.f, 2.f, 3.f, 4.f, 5.f, 6.f});
  const auto b = bytes_of({7.f});
  std::vector<std::byte> c(3 * 2);
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = static_cast<std::byte>(i + 100);
  ASSERT_TRUE(write_safetensors(d / "x.safetensors",
                                {{"zeta", DType::f32, {2, 3}, a},
                                 {"alpha", DType::f32, {}, b},
                                 {"mid", DType::bf16, {3}, c},
                                 {"empty", DType::f16, {0, 5}, {}}},
                                {{"format", "pt"}})
                  .ok());
  const std::string raw = read_file(d / "x.safetensors");
  std::uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ(n % 8, 0u) << "header is padded to a multiple of 8";
  EXPECT_EQ(raw.size(), 8 + n + a.size() + b.size() + c.size());

  auto f = SafetensorsFile::open(d / "x.safetensors");
  ASSERT_TRUE(f.ok()) << f.error().message;
  ASSERT_EQ(f->tensors().size(), 4u);
  EXPECT_EQ(f->tensors()[0].name, "alpha");  // sorted by name
  EXPECT_EQ(f->metadata().at("format"), "pt");
  const TensorInfo* z = f->find("zeta");
  ASSERT_NE(z, nullptr);
  EXPECT_EQ(z->shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(z->numel(), 6u);
  EXPECT_EQ(z->nbytes(), 24u);
  auto zb = f->bytes(*z);
  ASSERT_EQ(zb.size(), a.size());
  EXPECT_EQ(std::memcmp(zb.data(), a.data(), a.size()), 0);
  const TensorInfo* al = f->find("alpha");
  ASSERT_NE(al, nullptr);
  EXPECT_EQ(al->numel(), 1u);  // scalar
  EXPECT_EQ(std::memcmp(f->bytes(*al).data(), b.data(), 4), 0);
  const TensorInfo* m = f->find("mid");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->dtype, DType::bf16);
  EXPECT_EQ(std::memcmp(f->bytes(*m).data(), c.data(), c.size()), 0);
  const TensorInfo* e = f->find("empty");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->numel(), 0u);
  EXPECT_TRUE(f->bytes(*e).empty());
  EXPECT_EQ(f->find("nope"), nullptr);
  EXPECT_EQ(f->header_bytes().size(), n);
  EXPECT_EQ(static_cast<char>(f->header_bytes()[0]), '{');
  EXPECT_EQ(f->path(), d / "x.safetensors");
}

TEST(Safetensors, WriterRejectsSizeMismatch) {
  TempDir d;
  const auto a = bytes_of({1.f, 2.f});
  auto s = write_safetensors(d / "x.safetensors", {{"t", DType::f32, {3}, a}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::invalid_argument);
}

TEST(MappedFile, OpenPrefaultAdviseMove) {
  TempDir d;
  std::string content(3 * 4096 + 17, 'q');
  write_file(d / "f", content);
  auto f = MappedFile::open(d / "f");
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->size(), content.size());
  EXPECT_EQ(f->prefault(), content.size());
  f->advise_willneed();
  MappedFile g = std::move(*f);
  EXPECT_EQ(g.size(), content.size());
  EXPECT_EQ(static_cast<char>(g.data()[100]), 'q');
  EXPECT_EQ(f->data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty

  write_file(d / "empty", "");
  auto e = MappedFile::open(d / "empty");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->size(), 0u);
  EXPECT_EQ(e->prefault(), 0u);
  e->advise_willneed();

  EXPECT_ERR(MappedFile::open(d / "missing"), Errc::not_found, "missing");
  EXPECT_ERR(MappedFile::open(d.path()), Errc::io_error, d.path());
}

// --- malformed files ----------------------------------------------------------------------------------------------

class Malformed : public ::testing::Test {
 protected:
  std::string put(const std::string& bytes) {
    const std::string p = dir_ / "bad.safetensors";
    write_file(p, bytes);
    return p;
  }
  Result<SafetensorsFile> open_raw(const std::string& header, std::size_t data_bytes) {
    return SafetensorsFile::open(put(raw_safetensors(header, data_bytes)));
  }
  TempDir dir_;
};

TEST_F(Malformed, EmptyFile) { EXPECT_ERR(SafetensorsFile::open(put("")), Errc::format_error, "bad.safetensors"); }

TEST_F(Malformed, ShorterThanLengthField) {
  EXPECT_ERR(SafetensorsFile::open(put(std::string("\x08\0\0", 3))), Errc::format_error, "bad.safetensors");
}

TEST_F(Malformed, TruncatedFile) {
  TempDir d;
  ASSERT_TRUE(write_safetensors(d / "ok.safetensors", {{"t", DType::f32, {4}, bytes_of({1, 2, 3, 4})}}).ok());
  std::string raw = read_file(d / "ok.safetensors");
  raw.resize(raw.size() - 3);  // cut into the data section
  EXPECT_ERR(SafetensorsFile::open(put(raw)), Errc::format_error, "'t'");
  EXPECT_ERR(SafetensorsFile::open(put(raw)), Errc::format_error, "bad.safetensors");
  raw.resize(20);  // cut into the header
  EXPECT_ERR(SafetensorsFile::open(put(raw)), Errc::format_error, "bad.safetensors");
}

TEST_F(Malformed, HeaderLengthPastEof) {
  const std::string h = R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  EXPECT_ERR(SafetensorsFile::open(put(raw_safetensors(h, 4, h.size() + 5, true))), Errc::format_error, "past the end");
}

TEST_F(Malformed, HeaderLengthHuge) {
  const std::string h = "{}";
  auto r = SafetensorsFile::open(put(raw_safetensors(h, 0, 1ull << 40, true)));
  EXPECT_ERR(r, Errc::format_error, "exceeds the limit");
  EXPECT_ERR(SafetensorsFile::open(put(raw_safetensors(h, 0, ~0ull, true))), Errc::format_error, "bad.safetensors");
}

TEST_F(Malformed, NotJson) {
  EXPECT_ERR(open_raw("{\"t\": nope}     ", 0), Errc::parse_error, "bad.safetensors");
  EXPECT_ERR(open_raw("\xff\xfe garbage", 0), Errc::parse_error, "bad.safetensors");
  EXPECT_ERR(open_raw(R"({"t\xff":{}})", 0), Errc::parse_error, "bad.safetensors");  // invalid UTF-8
}

TEST_F(Malformed, DeepNestingRejectedCheaply) {
  std::string h = "{\"t\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_ERR(open_raw(h, 0), Errc::parse_error, "nesting");
}

TEST_F(Malformed, JsonNotAnObject) {
  EXPECT_ERR(open_raw("[1, 2, 3]", 0), Errc::format_error, "must be a JSON object");
  EXPECT_ERR(open_raw("\"str\"", 0), Errc::format_error, "bad.safetensors");
}

TEST_F(Malformed, EntryNotAnObjectOrMissingKeys) {
  EXPECT_ERR(open_raw(R"({"w": 5})", 0), Errc::format_error, "'w'");
  EXPECT_ERR(open_raw(R"({"w": {"shape":[1],"data_offsets":[0,4]}})", 4), Errc::format_error, "'w'");
  EXPECT_ERR(open_raw(R"({"w": {"dtype":"F32","data_offsets":[0,4]}})", 4), Errc::format_error, "shape");
  EXPECT_ERR(open_raw(R"({"w": {"dtype":"F32","shape":[1]}})", 4), Errc::format_error, "data_offsets");
  EXPECT_ERR(open_raw(R"({"w": {"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4), Errc::format_error, "'w'");
}

TEST_F(Malformed, UnknownDtype) {
  auto r = open_raw(R"({"w": {"dtype":"F8_E5M2","shape":[4],"data_offsets":[0,4]}})", 4);
  EXPECT_ERR(r, Errc::unsupported, "'w'");
  EXPECT_ERR(r, Errc::unsupported, "bad.safetensors");
  EXPECT_ERR(r, Errc::unsupported, "F8_E5M2");
}

TEST_F(Malformed, ShapeTimesSizeNotRange) {
  auto r = open_raw(R"({"w": {"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24);
  EXPECT_ERR(r, Errc::format_error, "'w'");
  EXPECT_ERR(r, Errc::format_error, "[2, 3]");
}

TEST_F(Malformed, ShapeProductOverflow) {
  auto r = open_raw(R"({"w": {"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})", 0);
  EXPECT_ERR(r, Errc::format_error, "overflows");
  // One zero dimension makes the product 0 even if the others are huge.
  EXPECT_TRUE(open_raw(R"({"w": {"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})", 0).ok());
}

TEST_F(Malformed, OverlappingRanges) {
  auto r = open_raw(R"({"a": {"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                        "b": {"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                    12);
  EXPECT_ERR(r, Errc::format_error, "overlap");
  EXPECT_ERR(r, Errc::format_error, "'a'");
  EXPECT_ERR(r, Errc::format_error, "'b'");
  // Identical ranges overlap too; adjacent ones and empty tensors do not.
  EXPECT_ERR(open_raw(R"({"a": {"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                          "b": {"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
                      8),
             Errc::format_error, "overlap");
  EXPECT_TRUE(open_raw(R"({"a": {"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                           "b": {"dtype":"F32","shape":[2],"data_offsets":[8,16]},
                           "e": {"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                       16)
                  .ok());
}

TEST_F(Malformed, RangePastEnd) {
  EXPECT_ERR(open_raw(R"({"w": {"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12), Errc::format_error, "'w'");
  EXPECT_ERR(open_raw(R"({"w": {"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 12), Errc::format_error, "begin");
  EXPECT_ERR(open_raw(R"({"w": {"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 12), Errc::format_error, "'w'");
  EXPECT_ERR(open_raw(R"({"w": {"dtype":"F32","shape":[1],"data_offsets":[0]}})", 12), Errc::format_error, "'w'");
  EXPECT_ERR(open_raw(R"({"w": {"dtype":"F32","shape":[1],"data_offsets":[0.0,4.0]}})", 12), Errc::format_error, "'w'");
  EXPECT_ERR(open_raw(R"({"w": {"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,0]}})", 12),
             Errc::format_error, "'w'");
}

TEST_F(Malformed, NegativeOrNonIntegerDim) {
  EXPECT_ERR(open_raw(R"({"w": {"dtype":"F32","shape":[-1,4],"data_offsets":[0,0]}})", 0), Errc::format_error, "'w'");
  EXPECT_ERR(open_raw(R"({"w": {"dtype":"F32","shape":[-1,4],"data_offsets":[0,0]}})", 0), Errc::format_error,
             "negative");
  EXPECT_ERR(open_raw(R"({"w": {"dtype":"F32","shape":[1.5],"data_offsets":[0,0]}})", 0), Errc::format_error, "'w'");
  EXPECT_ERR(open_raw(R"({"w": {"dtype":"F32","shape":["4"],"data_offsets":[0,16]}})", 16), Errc::format_error, "'w'");
  EXPECT_ERR(open_raw(R"({"w": {"dtype":"F32","shape":4,"data_offsets":[0,16]}})", 16), Errc::format_error, "'w'");
}

TEST_F(Malformed, Metadata) {
  EXPECT_TRUE(open_raw(R"({"__metadata__": {"format": "pt"}})", 0).ok());
  EXPECT_ERR(open_raw(R"({"__metadata__": {"format": 1}})", 0), Errc::format_error, "__metadata__");
  EXPECT_ERR(open_raw(R"({"__metadata__": ["pt"]})", 0), Errc::format_error, "__metadata__");
}

TEST_F(Malformed, DuplicateTensorName) {
  EXPECT_ERR(open_raw(R"({"w": {"dtype":"F32","shape":[1],"data_offsets":[0,4]},
                          "w": {"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                      8),
             Errc::format_error, "'w'");
}

TEST_F(Malformed, ControlCharactersInNamesAreEscapedInMessages) {
  auto r = open_raw(R"({"a\u0000\nb": {"dtype":"X","shape":[1],"data_offsets":[0,4]}})", 4);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::unsupported);
  EXPECT_NE(r.error().message.find("'a\\x00\\x0ab'"), std::string::npos) << r.error().message;
}

TEST_F(Malformed, NotARegularFile) {
  EXPECT_ERR(SafetensorsFile::open(dir_.path()), Errc::io_error, dir_.path());
  ASSERT_EQ(::mkfifo((dir_ / "fifo").c_str(), 0600), 0);
  EXPECT_ERR(SafetensorsFile::open(dir_ / "fifo"), Errc::io_error, "fifo");  // must not block
}

// --- robustness ---------------------------------------------------------------------------------------------------

// Random corruption of a valid file's length field and header (fixed seed): open() returns a result, never crashes,
// and whatever opens only hands out in-bounds views. Run under ASan+UBSan as well (see docs/model-format.md).
TEST(SafetensorsRobustness, RandomHeaderCorruption) {
  TempDir d;
  const auto a = bytes_of({1, 2, 3, 4, 5, 6, 7, 8});
  const auto b = bytes_of({9, 10});
  std::vector<std::byte> c(6, std::byte{3});
  ASSERT_TRUE(
      write_safetensors(
          d / "ok.safetensors",
          {{"model.layers.0.w", DType::f32, {2, 4}, a}, {"b", DType::f32, {2}, b}, {"c", DType::bf16, {1, 3}, c}},
          {{"format", "pt"}})
          .ok());
  const std::string good = read_file(d / "ok.safetensors");
  std::uint64_t hlen = 0;
  std::memcpy(&hlen, good.data(), 8);
  const std::string path = d / "fuzz.safetensors";
  const char interesting[] = {'{', '}', '[', ']', '"', ':', ',', '-', '0', '9', 'e', '.', '\\', ' ', '\0', '\xff'};

  std::mt19937_64 rng(20240611);
  int opened = 0, failed = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string v = good;
    const int kind = static_cast<int>(rng() % 6);
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && v.size() > 8; ++e) {
      const std::size_t span = std::min<std::size_t>(hlen, v.size() - 8);
      const std::size_t pos = 8 + rng() % span;  // inside the header
      switch (kind) {
        case 0:
          v[pos] = static_cast<char>(v[pos] ^ (1 << (rng() % 8)));
          break;
        case 1:
          v[pos] = interesting[rng() % sizeof interesting];
          break;
        case 2:
          v[pos] = static_cast<char>(rng() % 10 + '0');
          break;  // perturb digits / names
        case 3:
          v[rng() % 8] = static_cast<char>(rng());
          break;  // the length field
        case 4:
          v.resize(rng() % (v.size() + 1));
          break;  // truncate anywhere
        default:
          v.erase(pos, 1);
          break;  // shift the rest of the file
      }
    }
    write_file(path, v);
    auto f = SafetensorsFile::open(path);
    if (!f.ok()) {
      ++failed;
      EXPECT_FALSE(f.error().message.empty());
      EXPECT_NE(f.error().message.find("fuzz.safetensors"), std::string::npos) << f.error().message;
      continue;
    }
    ++opened;
    const std::byte* lo = f->file().data();
    const std::byte* hi = lo + f->file().size();
    for (const auto& t : f->tensors()) {
      auto s = f->bytes(t);
      ASSERT_EQ(s.size(), t.numel() * dtype_size(t.dtype));
      if (!s.empty()) {
        ASSERT_GE(s.data(), lo + 8 + f->header_bytes().size());
        ASSERT_LE(s.data() + s.size(), hi);
      }
    }
  }
  EXPECT_GT(failed, 1000);
  EXPECT_GT(opened, 0);  // some corruptions (e.g. in padding) are harmless
}

}  // namespace
}  // namespace tandem::weights::testing
