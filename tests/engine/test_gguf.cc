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

// Q5_0, Q4_1, Q5_1, IQ4_NL, IQ4_XS, Q2_K, Q3_K_S/M/L: llama-quantize (llama.cpp c392e509, built natively) wrote these files from
// shared256-f16.gguf
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
                   "ae75ec3c6658c833dec609b312e6f72c8c7f03a774d2bb7b2ac12772d3c0e384"},
        DigestCase{"IQ4_NL", modelgen::Recipe::iq4_nl, WType::iq4_nl,
                   "c4b632590b5d0eb696d267419c2a5d39ab8a529527db84bfe7359c7c5871eeec"},
        DigestCase{"IQ4_XS", modelgen::Recipe::iq4_xs, WType::iq4_xs,
                   "1e6efd73bfa97cd94ccd863e508394eec85bf44ba11231839f085707952b8b02"},
        DigestCase{"Q2_K", modelgen::Recipe::q2_K, WType::q3_K,  // (Q2_K gives ffn_down q3_K)
                   "fe698e510f4f33db68e39a8361848bf76c50f7c5071be82bab82eedcb1e33d27"},
        DigestCase{"Q3_K_S", modelgen::Recipe::q3_K_S, WType::q3_K,
                   "0fe8bc1d9baf1079cc0ba224c5c2cdb564558827c28834b36ce78438328be22d"},
        DigestCase{"Q3_K_M", modelgen::Recipe::q3_K_M, WType::q4_K,  // (ffn_down q4_K past the first sixteenth)
                   "d6643ad443339de7585598bad5ecfa5f1d672bb80ce94a35f689140f0144e197"},
        DigestCase{"Q3_K_L", modelgen::Recipe::q3_K_L, WType::q5_K,
                   "97e7c037e934691b745525b41dd54827b1cc49b3b4602fceadad6b17bd8742d9"}),
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

// The types added for issue 31 against llama.cpp on the same files (IQ4_NL, IQ4_XS, Q2_K, Q3_K_S/M/L from
// shared256-f16.gguf, byte for byte llama-quantize's, see QuantizeDigest): the log-probabilities of llama.cpp's 5 likeliest first tokens after each
// reference prompt, as tests/engine/llamacpp/reference.mjs printed them (node-llama-cpp 3.22.1, CPU), within 0.25
// (logit_tolerance's quantized bound: both sides quantize the activations, in their own rounding), and the first token
// wherever llama.cpp's top two are more than 0.3 apart.
TEST(GgufModel, Iq4AndK23FilesGiveLlamaCppsLogProbabilities) {
  SKIP_WITHOUT_SHARED();
  struct Ref {
    const char* type;
    std::vector<int> prompt;
    std::vector<std::pair<int, double>> top5;
  };
  const Ref refs[] = {
      {"IQ4_NL", {1, 9038, 2501, 263, 931}, {{8965, -3.1247}, {16443, -3.3098}, {3750, -3.3381}, {31211, -3.3777}, {21915, -3.3866}}},
      {"IQ4_NL", {1, 450, 22796, 6350, 714, 310, 3370}, {{9012, -0.2663}, {26124, -4.1606}, {20232, -4.6512}, {18174, -4.7452}, {4862, -4.9038}}},
      {"IQ4_NL", {1, 822, 18755, 29898, 29876, 1125}, {{28122, -2.9211}, {3161, -3.1262}, {2559, -3.4507}, {16801, -3.6322}, {13570, -4.0946}}},
      {"IQ4_NL", {1, 15043, 3186, 29892, 2748, 2501, 263, 931}, {{23529, -2.7996}, {1185, -3.2354}, {25838, -3.2913}, {22865, -3.6994}, {12929, -4.0812}}},
      {"IQ4_XS", {1, 9038, 2501, 263, 931}, {{21915, -3.1241}, {8965, -3.2761}, {3750, -3.3783}, {1518, -3.5312}, {20921, -3.6403}}},
      {"IQ4_XS", {1, 450, 22796, 6350, 714, 310, 3370}, {{9012, -0.3774}, {26124, -3.9787}, {18174, -4.3595}, {4862, -4.6434}, {20232, -4.8081}}},
      {"IQ4_XS", {1, 822, 18755, 29898, 29876, 1125}, {{28122, -2.7485}, {2559, -3.1987}, {3161, -3.3456}, {16801, -3.8131}, {13030, -3.8806}}},
      {"IQ4_XS", {1, 15043, 3186, 29892, 2748, 2501, 263, 931}, {{23529, -3.3307}, {1185, -3.6207}, {6097, -3.8948}, {19414, -3.9203}, {25838, -4.0177}}},
      {"Q2_K", {1, 9038, 2501, 263, 931}, {{14939, -0.9618}, {29757, -3.3176}, {15543, -3.3560}, {28470, -3.8486}, {16614, -3.9142}}},
      {"Q2_K", {1, 450, 22796, 6350, 714, 310, 3370}, {{9866, -1.8592}, {9012, -2.7053}, {21402, -3.3923}, {2925, -3.6664}, {1372, -3.9988}}},
      {"Q2_K", {1, 822, 18755, 29898, 29876, 1125}, {{23837, -2.7658}, {25477, -3.6376}, {27258, -3.6803}, {18712, -3.7234}, {28764, -3.7307}}},
      {"Q2_K", {1, 15043, 3186, 29892, 2748, 2501, 263, 931}, {{16778, -2.9532}, {9599, -3.4737}, {11798, -3.6478}, {19784, -3.6870}, {7071, -3.9206}}},
      {"Q3_K_S", {1, 9038, 2501, 263, 931}, {{3750, -1.7545}, {4417, -2.7108}, {12929, -2.8211}, {12684, -3.0621}, {23135, -3.5817}}},
      {"Q3_K_S", {1, 450, 22796, 6350, 714, 310, 3370}, {{9012, -1.2697}, {18146, -3.3633}, {11957, -3.7314}, {7258, -3.7672}, {13240, -4.2541}}},
      {"Q3_K_S", {1, 822, 18755, 29898, 29876, 1125}, {{6012, -1.2662}, {1217, -2.7582}, {16740, -2.9603}, {8647, -2.9728}, {19009, -3.4463}}},
      {"Q3_K_S", {1, 15043, 3186, 29892, 2748, 2501, 263, 931}, {{1185, -2.5869}, {16778, -3.0012}, {27033, -3.4236}, {30681, -3.5535}, {20286, -3.5814}}},
      {"Q3_K_M", {1, 9038, 2501, 263, 931}, {{31211, -1.8528}, {3750, -2.3407}, {12929, -2.4457}, {28701, -3.2912}, {21915, -3.3786}}},
      {"Q3_K_M", {1, 450, 22796, 6350, 714, 310, 3370}, {{19258, -1.8443}, {9012, -3.3903}, {18174, -3.4437}, {3987, -3.6802}, {12929, -4.1599}}},
      {"Q3_K_M", {1, 822, 18755, 29898, 29876, 1125}, {{6012, -0.1476}, {8647, -3.5786}, {1217, -4.1215}, {11644, -4.8569}, {1511, -5.8265}}},
      {"Q3_K_M", {1, 15043, 3186, 29892, 2748, 2501, 263, 931}, {{1185, -3.2034}, {20566, -3.2805}, {2363, -3.5264}, {12290, -3.7900}, {21837, -3.8639}}},
      {"Q3_K_L", {1, 9038, 2501, 263, 931}, {{3750, -1.9658}, {12929, -1.9686}, {21915, -2.8347}, {31211, -2.9335}, {4417, -3.5934}}},
      {"Q3_K_L", {1, 450, 22796, 6350, 714, 310, 3370}, {{18174, -2.1112}, {9012, -2.3691}, {19258, -2.8636}, {27646, -3.6556}, {3987, -3.9860}}},
      {"Q3_K_L", {1, 822, 18755, 29898, 29876, 1125}, {{6012, -0.3435}, {8647, -2.7280}, {1217, -2.8165}, {1511, -4.3093}, {16740, -5.1556}}},
      {"Q3_K_L", {1, 15043, 3186, 29892, 2748, 2501, 263, 931}, {{1185, -2.8586}, {21915, -3.3056}, {20566, -3.3157}, {26971, -3.6274}, {12290, -3.6716}}},
  };
  std::map<std::string, std::shared_ptr<engine::Model>> models;
  for (const char* type : {"IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L"}) {
    const std::string path = testing::temp_root() + "/new-type-vs-llamacpp-" + type + ".gguf";
    auto st = modelgen::convert_to_gguf(gguf_tiny("f16"), path, *modelgen::parse_recipe(type), 2);
    ASSERT_TRUE(st.ok()) << st.error().message;
    engine::LoadOptions lo;
    lo.max_context = 64;
    models[type] = load(path, lo);
    ASSERT_TRUE(models[type]);
  }
  for (const Ref& r : refs) {
    SCOPED_TRACE(std::string(r.type) + " prompt of " + std::to_string(r.prompt.size()));
    std::vector<float> logits;
    const auto g = greedy(*models[r.type], r.prompt, 1, &logits);
    ASSERT_FALSE(g.empty());
    double mx = -1e300, z = 0;
    for (float v : logits) mx = std::max(mx, static_cast<double>(v));
    for (float v : logits) z += std::exp(static_cast<double>(v) - mx);
    double worst = 0;
    for (const auto& [id, lp] : r.top5) {
      const double mine = static_cast<double>(logits[static_cast<std::size_t>(id)]) - mx - std::log(z);
      worst = std::max(worst, std::abs(mine - lp));
      EXPECT_NEAR(mine, lp, 0.25) << "token " << id;
    }
    if (r.top5[0].second - r.top5[1].second > 0.3) {
      EXPECT_EQ(g.front(), r.top5[0].first);
    }
    std::printf("[ report ] %s: worst top-5 log-probability difference to llama.cpp %.4f (first token %d, llama.cpp's %d)\n",
                r.type, worst, g.front(), r.top5[0].first);
  }
}

// Every weight type end to end, converted from llama.cpp's f16 file: the CPU kernels and the simulated accelerator
// (ATen over dequantized weights) agree on the first greedy token of every prompt; the agreement over 24 greedy
// steps is reported per type (the GPU-vs-CPU equivalence of two kernel families).
TEST(GgufModel, AcceleratorAndCpuAgreePerWeightType) {
  SKIP_WITHOUT_SHARED();
  const auto refs = read_refs(shared_dir() + "/models/gguf-tiny/shared256-f16.ref.jsonl");
  ASSERT_FALSE(refs.empty());
  for (const char* name :
       {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS",
        "Q2_K"}) {  // (Q2_K holds q3_K tensors too)
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
      } else if (std::string(name) == "IQ4_XS" && c.prompt == "Once upon a time") {
        // A near tie of this file itself: llama.cpp's run of it (Iq4FilesGiveLlamaCppsLogProbabilities) has its top
        // two 0.152 apart (21915, 8965), less than the 0.16 by which quantized activations move a log-probability
        // here; the CPU gives 8965, the accelerator 21915. Either of the two.
        EXPECT_TRUE(a.front() == 21915 || a.front() == 8965) << a.front();
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
