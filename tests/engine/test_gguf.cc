// The engine on GGUF files and quantized weights: the ATen dequantization used on accelerators equals the kernels'
// bit for bit; a GGUF written from a HF model computes what the HF model computes (Q/K permutation + interleaved
// RoPE); llama.cpp's own files (../shared/models/gguf-tiny) give llama.cpp's first token on every prompt, logits
// close to its top-5, and greedy agreement over 24 steps (reported); a quantized model runs on the simulated
// accelerator and in a hybrid split with the same meaning.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/sha256.h"
#include "device/simulated.h"
#include "engine/dequant.h"
#include "kernels/quant.h"
#include "model_fixture.h"
#include "modelgen/gguf_convert.h"

namespace tandem {
namespace {

using kernels::WType;
using testing::load;
using testing::make_model;

std::string shared_dir() {
  if (const char* e = std::getenv("TANDEM_SHARED_DIR")) return e;
  return std::string(TANDEM_SOURCE_DIR) + "/../shared";
}

std::string gguf_tiny(const std::string& type) {
  return shared_dir() + "/models/gguf-tiny/shared256-" + type + ".gguf";
}

bool have_shared() { return std::filesystem::exists(gguf_tiny("f16")); }

#define SKIP_WITHOUT_SHARED()                                                                                  \
  if (!have_shared()) GTEST_SKIP() << "../shared/models/gguf-tiny is absent (a plain clone): llama.cpp's GGUF " \
                                      "files are needed for this comparison"

TEST(Dequant, AtenEqualsTheKernelsBitForBitForEveryType) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::int64_t rows = 7, cols = 512;
  for (WType t : kernels::kAllWTypes) {
    std::vector<float> x(static_cast<std::size_t>(rows * cols));
    for (auto& v : x) v = nd(rng) * (t == WType::q4_0 ? 3.0f : 0.5f);
    x[3] = 0;  // a zero and an outlier in the first block
    x[9] = 40.0f;
    const std::size_t rb = kernels::row_bytes(t, cols);
    std::vector<std::byte> blocks(rb * rows);
    for (std::int64_t r = 0; r < rows; ++r)
      kernels::quantize_row(t, x.data() + r * cols, blocks.data() + r * rb, cols);
    std::vector<float> ref(x.size());
    for (std::int64_t r = 0; r < rows; ++r)
      kernels::dequantize_row(t, blocks.data() + r * rb, ref.data() + r * cols, cols);
    at::Tensor stored;
    if (t == WType::f32 || t == WType::f16 || t == WType::bf16) {
      const auto st = t == WType::f32 ? at::kFloat : t == WType::f16 ? at::kHalf : at::kBFloat16;
      stored = at::from_blob(blocks.data(), {rows, cols}, at::TensorOptions().dtype(st)).clone();
    } else {
      stored = at::from_blob(blocks.data(), {rows, static_cast<std::int64_t>(rb)}, at::TensorOptions().dtype(at::kByte))
                   .clone();
    }
    const at::Tensor y = engine::dequantize_aten(stored, t, cols, at::kFloat).contiguous();
    ASSERT_EQ(y.numel(), rows * cols) << kernels::wtype_name(t);
    EXPECT_EQ(std::memcmp(y.data_ptr<float>(), ref.data(), ref.size() * sizeof(float)), 0)
        << kernels::wtype_name(t) << ": ATen dequantization differs from kernels::dequantize_row";
  }
}

// Greedy continuation of `prompt` for `steps` tokens; also returns the first step's logits.
std::vector<int> greedy(engine::Model& m, const std::vector<int>& prompt, int steps, std::vector<float>* first) {
  auto seq = m.new_sequence();
  EXPECT_TRUE(seq.ok());
  std::vector<int> out;
  auto logits = m.forward(**seq, prompt);
  EXPECT_TRUE(logits.ok()) << (logits.ok() ? "" : logits.error().message);
  if (!logits.ok()) return out;
  if (first) *first = *logits;
  for (int s = 0; s < steps; ++s) {
    const auto& l = *logits;
    const int next = static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin());
    out.push_back(next);
    if (s + 1 == steps) break;
    logits = m.forward(**seq, std::vector<int>{next});
    if (!logits.ok()) break;
  }
  return out;
}

TEST(GgufModel, AGgufWrittenFromAHfModelComputesTheSameLogits) {
  const std::string hf = make_model("gguf-src", "test");
  const std::string out = testing::temp_root() + "/gguf-src-f32.gguf";
  auto st = modelgen::convert_to_gguf(hf, out, modelgen::Recipe::f32);
  ASSERT_TRUE(st.ok()) << st.error().message;
  auto a = load(hf);
  auto b = load(out);
  ASSERT_TRUE(a && b);
  EXPECT_FALSE(a->config().rope_interleaved);
  EXPECT_TRUE(b->config().rope_interleaved) << "GGUF llama files use ggml's interleaved RoPE";
  const std::vector<int> ids = {1, 15043, 3186, 29892, 2748, 2501, 263, 931};
  EXPECT_EQ(a->encode_text("Hello world, once upon a time"), b->encode_text("Hello world, once upon a time"));
  std::vector<float> la, lb;
  const auto ga = greedy(*a, ids, 12, &la), gb = greedy(*b, ids, 12, &lb);
  EXPECT_LT(testing::max_abs_diff(la, lb), 1e-4f);
  EXPECT_EQ(ga, gb);
}

struct RefCase {
  std::string prompt;
  std::vector<int> prompt_ids;
  std::vector<std::pair<int, float>> top5;
  std::vector<int> greedy_ids;
};

std::vector<RefCase> read_refs(const std::string& path) {
  std::vector<RefCase> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    RefCase c;
    c.prompt = j.at("prompt").get<std::string>();
    c.prompt_ids = j.at("prompt_ids").get<std::vector<int>>();
    for (const auto& p : j.at("top5_step0")) c.top5.emplace_back(p.at(0).get<int>(), p.at(1).get<float>());
    c.greedy_ids = j.at("greedy_ids").get<std::vector<int>>();
    out.push_back(std::move(c));
  }
  return out;
}

// Tolerances for step-0 logits (about 12-15 here) against llama.cpp's AVX-512 CPU path: f16 weights differ only by
// summation order (measured worst 0.010); quantized ones also by the rounding of the activation blocks, which
// llama.cpp's x86 code does its own way (id = 127 / amax, ties to even) and which a random-weight model amplifies
// (measured worst 0.14 before matching it).
float logit_tolerance(const std::string& type) { return type == "f16" ? 0.02f : 0.25f; }

class LlamaCppFiles : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaCppFiles, FirstTokenEqualsLlamaCppAndTop5LogitsAreClose) {
  SKIP_WITHOUT_SHARED();
  const std::string type = GetParam();
  auto m = load(gguf_tiny(type));
  ASSERT_TRUE(m);
  const auto refs = read_refs(gguf_tiny(type).substr(0, gguf_tiny(type).size() - 5) + ".ref.jsonl");
  ASSERT_FALSE(refs.empty());
  int agree = 0, total = 0;
  float worst = 0;
  for (const auto& c : refs) {
    EXPECT_EQ(m->encode_text(c.prompt), c.prompt_ids) << c.prompt;
    std::vector<float> logits;
    const auto g = greedy(*m, c.prompt_ids, static_cast<int>(c.greedy_ids.size()), &logits);
    ASSERT_FALSE(logits.empty());
    EXPECT_EQ(g.front(), c.greedy_ids.front()) << type << " '" << c.prompt << "': first token differs from llama.cpp";
    for (const auto& [id, v] : c.top5) {
      worst = std::max(worst, std::abs(logits[static_cast<std::size_t>(id)] - v));
      EXPECT_NEAR(logits[static_cast<std::size_t>(id)], v, logit_tolerance(type)) << type << " '" << c.prompt << "' id " << id;
    }
    for (std::size_t i = 0; i < g.size() && i < c.greedy_ids.size() && g[i] == c.greedy_ids[i]; ++i) ++agree;
    total += static_cast<int>(c.greedy_ids.size());
  }
  std::printf("[ report ] %s: greedy prefix agreement with llama.cpp %d / %d tokens; worst top-5 logit diff %.4f\n",
              type.c_str(), agree, total, worst);
  RecordProperty("greedy_agreement", std::to_string(agree) + "/" + std::to_string(total));
}

INSTANTIATE_TEST_SUITE_P(Types, LlamaCppFiles, ::testing::Values("f16", "Q8_0", "Q4_0", "Q4_K_M"));

TEST(GgufModel, QuantizedModelRunsOnTheSimulatedAcceleratorAndInAHybridSplit) {
  SKIP_WITHOUT_SHARED();
  const std::string path = gguf_tiny("Q4_K_M");
  engine::LoadOptions clo;
  clo.max_context = 256;
  auto cpu = load(path, clo);
  ASSERT_TRUE(cpu);
  const std::vector<int> ids = {1, 9038, 2501, 263, 931};
  std::vector<float> lc;
  const auto gc = greedy(*cpu, ids, 8, &lc);
  for (int k : {-1, 1}) {
    device::SimulatedConfig sc;
    sc.capacity_bytes = 256ull << 20;
    auto dev = std::make_shared<device::SimulatedDevice>(sc, std::make_shared<SteadyClock>());
    engine::LoadOptions lo;
    lo.accelerator = dev;
    lo.accel_layers = k;
    lo.max_context = 256;
    auto g = load(path, lo);
    ASSERT_TRUE(g);
    EXPECT_EQ(g->fingerprint().digest, cpu->fingerprint().digest) << "same file, same meaning: same fingerprint";
    // Weights are placed at their stored (quantized) size.
    EXPECT_LT(g->load_stats().accel_weight_bytes, 16ull << 20);
    std::vector<float> lg;
    const auto gg = greedy(*g, ids, 8, &lg);
    // Two kernel families (q8_K activations on the CPU, f32 activations over dequantized weights here): measured
    // worst 0.39 on logits of about 12-15.
    EXPECT_LT(testing::max_abs_diff(lc, lg), 0.75f) << "k=" << k;
    EXPECT_EQ(gg.front(), gc.front()) << "k=" << k;
  }
}

TEST(GgufModel, QuantizeRecipeMatchesLlamaCppTypesForQ4KM) {
  SKIP_WITHOUT_SHARED();
  const std::string out = testing::temp_root() + "/q4km.gguf";
  auto st = modelgen::convert_to_gguf(gguf_tiny("f16"), out, modelgen::Recipe::q4_K_M);
  ASSERT_TRUE(st.ok()) << st.error().message;
  std::map<std::string, WType> types(st->types.begin(), st->types.end());
  EXPECT_EQ(types["output.weight"], WType::q6_K);
  EXPECT_EQ(types["blk.1.attn_v.weight"], WType::q6_K);
  EXPECT_EQ(types["blk.1.ffn_down.weight"], WType::q6_K);
  EXPECT_EQ(types["blk.0.ffn_down.weight"], WType::q4_K);
  EXPECT_EQ(types["token_embd.weight"], WType::q4_K);
  EXPECT_EQ(types["blk.0.attn_norm.weight"], WType::f32);
}

// The whole file, byte for byte, as llama-quantize wrote it from the same f16 file.
class QuantizeBytes : public ::testing::TestWithParam<std::pair<std::string, modelgen::Recipe>> {};

TEST_P(QuantizeBytes, TandemQuantizeWritesLlamaQuantizesFile) {
  SKIP_WITHOUT_SHARED();
  const auto& [name, recipe] = GetParam();
  const std::string out = testing::temp_root() + "/requant-" + name + ".gguf";
  auto st = modelgen::convert_to_gguf(gguf_tiny("f16"), out, recipe, 2);
  ASSERT_TRUE(st.ok()) << st.error().message;
  auto slurp = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::string a = slurp(out), b = slurp(gguf_tiny(name));
  ASSERT_EQ(a.size(), b.size()) << name;
  std::size_t first = 0;
  while (first < a.size() && a[first] == b[first]) ++first;
  EXPECT_EQ(first, a.size()) << name << ": first differing byte at offset " << first;
}

// Q5_0, Q4_1, Q5_1: llama-quantize (llama.cpp c392e509, built natively) wrote these files from shared256-f16.gguf
// with these SHA-256 digests; the shared directory has no such files, so the digests stand for them.
struct DigestCase {
  const char* name;
  modelgen::Recipe recipe;
  WType type;
  const char* sha256;
};
class QuantizeDigest : public ::testing::TestWithParam<DigestCase> {};

TEST_P(QuantizeDigest, IsLlamaQuantizesFile) {
  SKIP_WITHOUT_SHARED();
  const DigestCase& c = GetParam();
  const std::string out = testing::temp_root() + "/requant-" + c.name + ".gguf";
  auto st = modelgen::convert_to_gguf(gguf_tiny("f16"), out, c.recipe, 2);
  ASSERT_TRUE(st.ok()) << st.error().message;
  std::map<std::string, WType> types(st->types.begin(), st->types.end());
  EXPECT_EQ(types["blk.0.ffn_down.weight"], c.type);
  EXPECT_EQ(types["output.weight"], WType::q6_K);
  std::ifstream f(out, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(Sha256::hex(Sha256::of(bytes)), c.sha256);
}

INSTANTIATE_TEST_SUITE_P(
    Recipes, QuantizeDigest,
    ::testing::Values(
        DigestCase{"Q5_0", modelgen::Recipe::q5_0, WType::q5_0,
                   "89b3a79ae3e40142fc6dd628e4b78e34188c40fbe8ef33f22d08085dcf3c4d39"},
        DigestCase{"Q4_1", modelgen::Recipe::q4_1, WType::q4_1,
                   "28e4d7af9dc9130a35f4f58eb07bdec1f1b66fe48175010db0acf99e025da6d9"},
        DigestCase{"Q5_1", modelgen::Recipe::q5_1, WType::q5_1,
                   "ae75ec3c6658c833dec609b312e6f72c8c7f03a774d2bb7b2ac12772d3c0e384"}),
    [](const auto& i) { return std::string(i.param.name); });

INSTANTIATE_TEST_SUITE_P(Recipes, QuantizeBytes,
                         ::testing::Values(std::pair{std::string("Q8_0"), modelgen::Recipe::q8_0},
                                           std::pair{std::string("Q4_0"), modelgen::Recipe::q4_0},
                                           std::pair{std::string("Q4_K_M"), modelgen::Recipe::q4_K_M}),
                         [](const auto& i) { return i.param.first; });

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Every weight type end to end, converted from llama.cpp's f16 file: the CPU kernels and the simulated accelerator
// (ATen over dequantized weights) agree on the first greedy token of every prompt; the agreement over 24 greedy
// steps is reported per type (the GPU-vs-CPU equivalence of two kernel families).
TEST(GgufModel, AcceleratorAndCpuAgreePerWeightType) {
  SKIP_WITHOUT_SHARED();
  const auto refs = read_refs(shared_dir() + "/models/gguf-tiny/shared256-f16.ref.jsonl");
  ASSERT_FALSE(refs.empty());
  for (const char* name : {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K_M", "Q5_K_M", "Q6_K"}) {
    const std::string path = testing::temp_root() + "/per-type-" + name + ".gguf";
    auto r = modelgen::parse_recipe(name);
    ASSERT_TRUE(r.ok());
    auto st = modelgen::convert_to_gguf(gguf_tiny("f16"), path, *r, 2);
    ASSERT_TRUE(st.ok()) << name << ": " << st.error().message;
    engine::LoadOptions lo;
    lo.max_context = 128;
    auto cpu = load(path, lo);
    device::SimulatedConfig sc;
    sc.capacity_bytes = 512ull << 20;
    lo.accelerator = std::make_shared<device::SimulatedDevice>(sc, std::make_shared<SteadyClock>());
    auto gpu = load(path, lo);
    ASSERT_TRUE(cpu && gpu) << name;
    int agree = 0, total = 0;
    for (const auto& c : refs) {
      const auto a = greedy(*cpu, c.prompt_ids, 24, nullptr), b = greedy(*gpu, c.prompt_ids, 24, nullptr);
      ASSERT_FALSE(a.empty() || b.empty()) << name;
      // A near tie in llama.cpp's f16 reference (top two within 0.1: "Hello world, once upon a time", 0.047) may flip
      // between the CPU's quantized activations and the accelerator's f32 ones under a 4-bit type: counted, not a
      // failure.
      const bool near_tie = c.top5.size() >= 2 && c.top5[0].second - c.top5[1].second < 0.1f;
      // Where the CPU's quantized activations move the first token away from the accelerator's, llama.cpp's CPU run
      // of the same file (llama-cli, greedy, c392e509) is the judge: Q4_1 on "The GPU ran out of memory" gives
      // 18174 ("uerte") there too, not the f16 file's 9012.
      if (std::string(name) == "Q4_1" && c.prompt == "The GPU ran out of memory") {
        EXPECT_EQ(a.front(), 18174) << "llama.cpp's CPU token on this Q4_1 file";
      } else if (!near_tie) {
        EXPECT_EQ(a.front(), b.front()) << name << " '" << c.prompt << "'";
      }
      for (std::size_t i = 0; i < a.size() && i < b.size() && a[i] == b[i]; ++i) ++agree;
      total += 24;
    }
    std::printf("[ report ] %-6s simulated accelerator vs CPU: greedy prefix agreement %d / %d tokens\n", name, agree,
                total);
  }
}

}  // namespace
}  // namespace tandem
