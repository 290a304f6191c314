// Byte equality of the reference quantizers with llama-quantize's files in ../shared/models/gguf-tiny (skipped with
// a message when that directory is absent). Split out of test_quant.cc; linked into the same test program.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "gguf_scan.h"
#include "kernels/quant.h"
#include "kernels/types.h"

namespace tandem::kernels {
namespace {

using Bytes = std::vector<std::uint8_t>;

std::string tname(WType t) { return std::string(wtype_name(t)); }

// ---- byte equality with llama.cpp ------------------------------------------------------------------------------

std::string shared_dir() {
  if (const char* env = std::getenv("TANDEM_SHARED_DIR"); env != nullptr && *env != '\0') return env;
  return TANDEM_SOURCE_DIR "/../shared";
}

// For every 2-D weight tensor of the f16 file, quantize_row(its floats) must equal the bytes llama-quantize wrote
// for the same tensor in `file` (in whatever type it has there). Returns compared tensors per type.
std::map<WType, int> compare_with_llama(const std::string& file) {
  std::map<WType, int> compared;
  const std::string dir = shared_dir() + "/models/gguf-tiny/";
  const test::GgufFile src = test::scan_gguf(dir + "shared256-f16.gguf");
  const test::GgufFile dst = test::scan_gguf(dir + file);
  EXPECT_EQ(src.error, "");
  EXPECT_EQ(dst.error, "");
  if (!src.error.empty() || !dst.error.empty()) return compared;
  for (const test::GgufTensor& s : src.tensors) {
    if (s.dims.size() != 2) continue;
    SCOPED_TRACE(file + ": " + s.name);
    const test::GgufTensor* d = dst.find(s.name);
    EXPECT_NE(d, nullptr);
    if (d == nullptr) continue;
    const auto st = wtype_from_ggml(static_cast<int>(s.ggml_type));
    const auto dt = wtype_from_ggml(static_cast<int>(d->ggml_type));
    EXPECT_TRUE(st && dt) << "ggml types " << s.ggml_type << " -> " << d->ggml_type;
    if (!st || !dt) continue;
    EXPECT_EQ(d->dims, s.dims);
    const auto cols = static_cast<std::int64_t>(s.dims[0]);
    const auto rows = static_cast<std::int64_t>(s.dims[1]);
    const std::size_t srow = row_bytes(*st, cols);
    const std::size_t drow = row_bytes(*dt, cols);
    EXPECT_GT(drow, 0u);
    const std::uint8_t* sp = src.data(s, srow * rows);
    const std::uint8_t* dp = dst.data(*d, drow * rows);
    EXPECT_NE(sp, nullptr);
    EXPECT_NE(dp, nullptr);
    if (sp == nullptr || dp == nullptr || drow == 0) continue;
    std::vector<float> f(cols);
    Bytes q(drow);
    std::int64_t bad_rows = 0;
    std::int64_t first_bad = -1;
    for (std::int64_t r = 0; r < rows; ++r) {
      dequantize_row(*st, sp + r * srow, f.data(), cols);  // f16 -> f32 exactly, as llama-quantize does
      quantize_row(*dt, f.data(), q.data(), cols);
      if (std::memcmp(q.data(), dp + r * drow, drow) != 0) {
        if (first_bad < 0) first_bad = r;
        ++bad_rows;
      }
    }
    EXPECT_EQ(bad_rows, 0) << tname(*dt) << ": " << bad_rows << " of " << rows << " rows differ, first " << first_bad;
    ++compared[*dt];
  }
  return compared;
}

class LlamaCppBytes : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(shared_dir() + "/models/gguf-tiny/shared256-f16.gguf")) {
      GTEST_SKIP() << "llama.cpp reference files not found under " << shared_dir()
                   << "/models/gguf-tiny (set TANDEM_SHARED_DIR to the shared directory)";
    }
  }
};

TEST_F(LlamaCppBytes, Q8_0File) {
  const auto c = compare_with_llama("shared256-Q8_0.gguf");
  EXPECT_EQ(c.count(WType::q8_0) ? c.at(WType::q8_0) : 0, 16);  // every 2-D tensor, output.weight included
}

TEST_F(LlamaCppBytes, Q4_0File) {
  const auto c = compare_with_llama("shared256-Q4_0.gguf");
  EXPECT_EQ(c.count(WType::q4_0) ? c.at(WType::q4_0) : 0, 15);
  EXPECT_EQ(c.count(WType::q6_K) ? c.at(WType::q6_K) : 0, 1);  // llama-quantize keeps output.weight at q6_K
}

TEST_F(LlamaCppBytes, Q4_K_MFile) {
  const auto c = compare_with_llama("shared256-Q4_K_M.gguf");
  EXPECT_EQ(c.count(WType::q4_K) ? c.at(WType::q4_K) : 0, 13);
  EXPECT_EQ(c.count(WType::q6_K) ? c.at(WType::q6_K) : 0, 3);  // output, blk.1 attn_v and ffn_down
}

}  // namespace
}  // namespace tandem::kernels
