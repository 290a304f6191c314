// The seven architectures (Llama 3.x, Qwen2, Qwen3, Mistral, Phi-3, Gemma 2, Gemma 3) end to end: the engine's forward
// (paged and reference) against a plain double-precision transformer written here from the Hugging Face definitions;
// the RoPE frequencies against the llama3 / LongRoPE formulas; the HF directory and its GGUF give the same greedy
// tokens, and llama.cpp's log-probabilities; Phi-3's fused projections equal an unfused Llama with the same rows;
// Qwen2's biases are used; Mistral's window hides what lies beyond it; the simulated accelerator agrees with the CPU.
// Malformed configs and GGUF files: test_architectures_errors.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "device/simulated.h"
#include "architectures_fixture.h"
#include "model_fixture.h"
#include "modelgen/gguf_convert.h"
#include "weights/gguf.h"
#include "weights/gguf_model.h"

namespace tandem {
namespace {

using testing::gguf_of;
using testing::greedy;

using testing::load;
using testing::make_model;
using testing::max_abs_diff;
using json = nlohmann::json;

const char* const kPresets[] = {"llama3", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3"};

std::vector<int> prompt(int n, int salt = 0) {
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back(3 + (i * 7919 + salt * 104729 + 17) % 31990);
  return ids;
}

// --- a plain transformer in double precision, from the Hugging Face modeling code -------------------------------

// Over an f32 Hugging Face directory (fused Phi-3 tensors read through ModelDir's row views). The rotary inverse
// frequencies and the cos/sin factor come from the model under test (checked against their formulas apart), except
// for Gemma, whose two tables (global: rope_theta / linear factor; local: rope_local_base_freq) are computed here.
// Gemma (transformers' Gemma2/Gemma3 modeling): embeddings × sqrt(hidden), norms × (1 + w), post-norms of the
// attention and MLP outputs, pre_feedforward_layernorm before the MLP, GELU-tanh, scores × query_pre_attn_scalar^-½
// then soft-capped, the window only on sliding layers, logits soft-capped.
class PlainTransformer {
 public:
  PlainTransformer(const weights::ModelDir& d, std::vector<float> inv_freq, double mscale)
      : d_(d), c_(d.config()), inv_(std::move(inv_freq)), mscale_(mscale) {}

  // Logits of every position, [n][vocab].
  std::vector<std::vector<double>> logits(const std::vector<int>& ids) const {
    const int n = static_cast<int>(ids.size()), H = c_.hidden_size, hd = c_.head_dim, nh = c_.num_heads,
              nkv = c_.num_kv_heads, half = hd / 2;
    std::vector<std::vector<double>> x(static_cast<std::size_t>(n));
    const float* emb = t("model.embed_tokens.weight");
    const bool gemma = c_.post_norms;
    for (int i = 0; i < n; ++i) {
      x[i].assign(emb + std::size_t(ids[i]) * H, emb + std::size_t(ids[i] + 1) * H);
      if (gemma)
        for (double& e : x[i]) e *= std::sqrt(static_cast<double>(H));
    }
    auto cap = [](double v, const std::optional<double>& c) { return c ? *c * std::tanh(v / *c) : v; };
    for (int l = 0; l < c_.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const bool slides = c_.sliding_window && (c_.sliding_layers.empty() || c_.sliding_layers[std::size_t(l)]);
      std::vector<double> inv(inv_.begin(), inv_.end());
      if (gemma) {
        const bool local = slides && c_.rope_local_theta;
        for (int j = 0; j < half; ++j) {
          inv[std::size_t(j)] = 1.0 / std::pow(local ? *c_.rope_local_theta : c_.rope_theta, 2.0 * j / hd);
          if (!local && c_.rope_scaling == weights::RopeScaling::linear) inv[std::size_t(j)] /= c_.rope_factor;
        }
      }
      std::vector<std::vector<double>> q(n), k(n), v(n);
      for (int i = 0; i < n; ++i) {
        const auto h = rms(x[i], p + "input_layernorm.weight");
        q[i] = mv(p + "self_attn.q_proj.weight", h);
        k[i] = mv(p + "self_attn.k_proj.weight", h);
        v[i] = mv(p + "self_attn.v_proj.weight", h);
        if (c_.qkv_bias) {
          add(q[i], p + "self_attn.q_proj.bias");
          add(k[i], p + "self_attn.k_proj.bias");
          add(v[i], p + "self_attn.v_proj.bias");
        }
        if (c_.qk_norm) {  // Qwen3Attention: q_norm / k_norm (Qwen3RMSNorm over head_dim) on each head, before RoPE
          auto head_rms = [&](std::vector<double>& a, int heads, const std::string& name) {
            const float* w = t(name);
            for (int hh = 0; hh < heads; ++hh) {
              double ss = 0;
              for (int e = 0; e < hd; ++e) ss += a[std::size_t(hh * hd + e)] * a[std::size_t(hh * hd + e)];
              const double r = 1.0 / std::sqrt(ss / hd + c_.rms_norm_eps);
              for (int e = 0; e < hd; ++e) a[std::size_t(hh * hd + e)] *= r * (gemma ? 1.0 + w[e] : w[e]);
            }
          };
          head_rms(q[i], nh, p + "self_attn.q_norm.weight");
          head_rms(k[i], nkv, p + "self_attn.k_norm.weight");
        }
        auto rope = [&](std::vector<double>& a, int heads) {  // rotate_half pairing (i, i + hd/2)
          for (int hh = 0; hh < heads; ++hh)
            for (int j = 0; j < half; ++j) {
              const double ang = static_cast<double>(i) * (gemma ? inv[std::size_t(j)] : static_cast<double>(inv_[j]));
              const double cs = std::cos(ang) * mscale_, sn = std::sin(ang) * mscale_;
              double& x1 = a[std::size_t(hh * hd + j)];
              double& x2 = a[std::size_t(hh * hd + j + half)];
              const double a1 = x1 * cs - x2 * sn, a2 = x2 * cs + x1 * sn;
              x1 = a1;
              x2 = a2;
            }
        };
        rope(q[i], nh);
        rope(k[i], nkv);
      }
      const int W = slides ? c_.sliding_window.value_or(0) : 0;
      const double scale = gemma ? c_.attn_scale : 1.0 / std::sqrt(static_cast<double>(hd));
      for (int i = 0; i < n; ++i) {
        std::vector<double> att(std::size_t(nh) * hd, 0.0);
        for (int hh = 0; hh < nh; ++hh) {
          const int g = hh / (nh / nkv);
          std::vector<double> s;
          double mx = -1e300;
          const int j0 = W > 0 ? std::max(0, i - W + 1) : 0;  // keys j with i - W < j <= i
          for (int j = j0; j <= i; ++j) {
            double dot = 0;
            for (int e = 0; e < hd; ++e) dot += q[i][std::size_t(hh * hd + e)] * k[j][std::size_t(g * hd + e)];
            s.push_back(cap(dot * scale, c_.attn_softcap));
            mx = std::max(mx, s.back());
          }
          double z = 0;
          for (double& e : s) z += (e = std::exp(e - mx));
          for (int j = j0; j <= i; ++j)
            for (int e = 0; e < hd; ++e)
              att[std::size_t(hh * hd + e)] += s[std::size_t(j - j0)] / z * v[j][std::size_t(g * hd + e)];
        }
        auto o = mv(p + "self_attn.o_proj.weight", att);
        if (gemma) o = rms(o, p + "post_attention_layernorm.weight");
        for (int e = 0; e < H; ++e) x[i][e] += o[e];
        const auto h2 = rms(x[i], p + (gemma ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight"));
        auto gate = mv(p + "mlp.gate_proj.weight", h2);
        const auto up = mv(p + "mlp.up_proj.weight", h2);
        for (std::size_t e = 0; e < gate.size(); ++e) {
          const double g = gate[e];
          gate[e] = (gemma ? 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)))
                           : g / (1.0 + std::exp(-g))) *
                    up[e];
        }
        auto down = mv(p + "mlp.down_proj.weight", gate);
        if (gemma) down = rms(down, p + "post_feedforward_layernorm.weight");
        for (int e = 0; e < H; ++e) x[i][e] += down[e];
      }
    }
    std::vector<std::vector<double>> out;
    const std::string head = c_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    for (int i = 0; i < n; ++i) {
      out.push_back(mv(head, rms(x[i], "model.norm.weight")));
      for (double& e : out.back()) e = cap(e, c_.final_softcap);
    }
    return out;
  }

 private:
  const float* t(const std::string& name) const {
    const weights::TensorView* tv = d_.tensor(name);
    EXPECT_TRUE(tv != nullptr && tv->dtype == weights::DType::f32) << name;
    return reinterpret_cast<const float*>(tv->data.data());
  }
  std::vector<double> mv(const std::string& name, const std::vector<double>& x) const {
    const weights::TensorView* tv = d_.tensor(name);
    const auto rows = static_cast<std::size_t>(tv->shape[0]), cols = static_cast<std::size_t>(tv->shape[1]);
    EXPECT_EQ(cols, x.size()) << name;
    const float* w = t(name);
    std::vector<double> y(rows, 0.0);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t k = 0; k < cols; ++k) y[r] += static_cast<double>(w[r * cols + k]) * x[k];
    return y;
  }
  void add(std::vector<double>& y, const std::string& name) const {
    const float* b = t(name);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] += b[i];
  }
  std::vector<double> rms(const std::vector<double>& x, const std::string& name) const {
    double ss = 0;
    for (double e : x) ss += e * e;
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + c_.rms_norm_eps);
    const float* w = t(name);
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * (c_.norm_add_one ? 1.0 + w[i] : w[i]);
    return y;
  }

  const weights::ModelDir& d_;
  const weights::ModelConfig& c_;
  std::vector<float> inv_;
  double mscale_;
};

double max_diff(const std::vector<float>& a, std::size_t off, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < b.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[off + i]) - b[i]));
  return m;
}

// --- the forward against the plain transformer ---------------------------------------------------------------

TEST(Architectures, PagedAndReferenceForwardsEqualAPlainTransformerForEachArchitecture) {
  for (const char* preset : kPresets) {
    SCOPED_TRACE(preset);
    const std::string dir = make_model(std::string("arch-") + preset, preset);
    auto m = load(dir);
    ASSERT_TRUE(m);
    const auto ids = prompt(48);  // crosses Mistral's window of 32
    const PlainTransformer plain(m->files(), m->rope_inv_freq(), m->rope_attention_factor());
    const auto want = plain.logits(ids);
    const std::size_t V = static_cast<std::size_t>(m->config().vocab_size);
    auto ref = m->forward_reference(ids);
    ASSERT_TRUE(ref.ok()) << ref.error().message;
    for (std::size_t i = 0; i < ids.size(); ++i) EXPECT_LT(max_diff(*ref, i * V, want[i]), 2e-4) << "position " << i;
    // Paged: a prefill of 20, then one token at a time.
    auto seq = m->new_sequence();
    ASSERT_TRUE(seq.ok());
    auto pre = m->forward(**seq, std::span(ids).first(20), true);
    ASSERT_TRUE(pre.ok()) << pre.error().message;
    for (std::size_t i = 0; i < 20; ++i) EXPECT_LT(max_diff(*pre, i * V, want[i]), 2e-4) << "prefill " << i;
    for (std::size_t i = 20; i < ids.size(); ++i) {
      auto l = m->forward(**seq, std::span(ids).subspan(i, 1));
      ASSERT_TRUE(l.ok()) << l.error().message;
      EXPECT_LT(max_diff(*l, 0, want[i]), 2e-4) << "decode " << i;
    }
  }
}

// --- RoPE frequencies by hand ------------------------------------------------------------------------------------

TEST(Architectures, Llama3RopeFrequenciesFollowTheLlama3Formula) {
  auto m = load(make_model("arch-llama3", "llama3"));
  ASSERT_TRUE(m);
  const auto& c = m->config();
  EXPECT_EQ(c.rope_scaling, weights::RopeScaling::llama3);
  EXPECT_TRUE(c.tie_word_embeddings);
  const auto inv = m->rope_inv_freq();
  ASSERT_EQ(inv.size(), 8u);  // head_dim 16
  int kept = 0, divided = 0, smoothed = 0;
  for (std::size_t i = 0; i < inv.size(); ++i) {
    // transformers' _compute_llama3_parameters with factor 32, low 1, high 4, original 8192, theta 500000.
    const double base = 1.0 / std::pow(500000.0, 2.0 * static_cast<double>(i) / 16.0);
    const double wl = 2.0 * M_PI / base;
    double want = base;
    if (wl < 8192.0 / 4.0) {
      ++kept;
    } else if (wl > 8192.0 / 1.0) {
      want = base / 32.0;
      ++divided;
    } else {
      const double smooth = (8192.0 / wl - 1.0) / (4.0 - 1.0);
      want = (1.0 - smooth) * base / 32.0 + smooth * base;
      ++smoothed;
    }
    EXPECT_NEAR(inv[i], want, 1e-6 * want) << "pair " << i;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smoothed, 0) << "the preset should exercise all three llama3 bands";
  EXPECT_EQ(m->rope_attention_factor(), 1.0F);
}

TEST(Architectures, Phi3LongRopeUsesTheLongFactorsBeyondTheOriginalContextAndHfAttentionFactor) {
  const std::string dir = make_model("arch-phi3", "phi3");
  // The preset: original 64 of 512 positions, short factor 1 + 0.1 i, long factor 1 + 0.75 i, theta 10000.
  const double attn = std::sqrt(1.0 + std::log(512.0 / 64.0) / std::log(64.0));
  for (const int ctx : {0, 64, 65}) {
    engine::LoadOptions lo;
    lo.max_context = ctx;
    auto m = load(dir, lo);
    ASSERT_TRUE(m);
    const bool want_long = (ctx == 0 ? 512 : ctx) > 64;
    const auto inv = m->rope_inv_freq();
    ASSERT_EQ(inv.size(), 8u);
    for (std::size_t i = 0; i < inv.size(); ++i) {
      const double f = want_long ? 1.0 + 0.75 * static_cast<double>(i) : 1.0 + 0.1 * static_cast<double>(i);
      const double want = 1.0 / (f * std::pow(10000.0, 2.0 * static_cast<double>(i) / 16.0));
      EXPECT_NEAR(inv[i], want, 1e-6 * want) << "ctx " << ctx << " pair " << i;
    }
    EXPECT_NEAR(m->rope_attention_factor(), attn, 1e-6) << "ctx " << ctx;
  }
  engine::LoadOptions a, b;
  a.max_context = 64;
  b.max_context = 65;
  EXPECT_NE(load(dir, a)->fingerprint().digest, load(dir, b)->fingerprint().digest)
      << "the factor set in use decides the outputs, so it is part of the fingerprint";
}

// --- HF directory == its GGUF ------------------------------------------------------------------------------------

TEST(Architectures, HfDirectoryAndItsGgufGiveIdenticalGreedyTokens) {
  for (const char* preset : kPresets) {
    SCOPED_TRACE(preset);
    auto a = load(make_model(std::string("arch-") + preset, preset));
    auto b = load(gguf_of(preset));
    ASSERT_TRUE(a && b);
    const bool llama_arch = std::string(preset) == "llama3" || std::string(preset) == "mistral";
    EXPECT_EQ(b->config().rope_interleaved, llama_arch)
        << "llama.cpp permutes Q/K rows only for its llama architecture (Mistral included)";
    EXPECT_EQ(a->config().qkv_bias, b->config().qkv_bias);
    EXPECT_EQ(a->config().fused_projections, b->config().fused_projections);
    EXPECT_EQ(a->config().sliding_window, b->config().sliding_window);
    EXPECT_EQ(a->config().tie_word_embeddings, b->config().tie_word_embeddings);
    EXPECT_EQ(a->rope_attention_factor(), b->rope_attention_factor());
    for (std::size_t i = 0; i < a->rope_inv_freq().size(); ++i)
      EXPECT_NEAR(a->rope_inv_freq()[i], b->rope_inv_freq()[i], 1e-6 * a->rope_inv_freq()[i]) << i;
    const auto ids = prompt(40, 1);
    std::vector<float> la, lb;
    const auto ga = greedy(*a, ids, 24, &la), gb = greedy(*b, ids, 24, &lb);
    EXPECT_LT(max_abs_diff(la, lb), 1e-4f);
    EXPECT_EQ(ga, gb);
  }
}

// Most checkpoints are stored in f16 or bf16. llama.cpp's converter writes every vector (norms, biases) F32 whatever
// the source holds, and its CPU backend aborts on an f16 norm ("only f32 src1 supported"): Tandem's files do the same,
// from every source dtype and with every recipe, and still give the HF directory's tokens (f16 -> f32 is exact).
// llama.cpp on the very files gguf_of() writes (f32; the writer is deterministic): the log-probabilities of its 5
// likeliest first tokens after prompt(16, 3), and its 12 greedy tokens, as tests/engine/llamacpp/reference.mjs printed
// them with node-llama-cpp 3.22.1 (a llama.cpp that knows qwen3 and gemma3; the native c392e509 snapshot knows
// neither, but runs gemma2). Gemma 2's references come from files with its preset's small soft caps, which the file
// carries (gemma2.attn_logit_softcapping / final_logit_softcapping) and llama.cpp applies. Phi-3 is
// absent: llama.cpp refuses the preset's vocabulary (no <|endoftext|>, see tests/tools/llamacpp_runs_our_files.sh).
// Tolerance 2e-3 on a log-probability: both compute in f32, in different summation orders.
TEST(Architectures, GgufLogProbabilitiesAndGreedyTokensEqualLlamaCppsForEachArchitecture) {
  struct Ref {
    const char* preset;
    std::vector<std::pair<int, double>> top5;
    std::vector<int> greedy;
  };
  const Ref refs[] = {
      {"llama3",
       {{17122, -9.310033148097057}, {31942, -9.716843453401122}, {21088, -9.76074366902933},
        {21297, -9.764465098619002}, {1642, -9.803977979280855}},
       std::vector<int>(12, 17122)},
      {"qwen2",
       {{5652, -9.795958465889887}, {13882, -9.797222974808827}, {29031, -9.800303907946564},
        {28457, -9.80809977976561}, {26490, -9.809017826527922}},
       std::vector<int>(12, 5652)},
      {"qwen3",
       {{17122, -9.54223944261967}, {269, -9.710351637742692}, {20363, -9.746497581887152},
        {2717, -9.788225643488856}, {19476, -9.808740219393716}},
       std::vector<int>(12, 17122)},
      {"mistral",
       {{829, -9.691657505372334}, {28493, -9.760387325935655}, {11095, -9.787415296907785},
        {878, -9.789909293327334}, {4458, -9.795219396980482}},
       {829, 10290, 24616, 17482, 4492, 5031, 3454, 26793, 24909, 18713, 24289, 13723}},
      {"gemma2",
       {{7687, -9.800475863696867}, {763, -9.808248605697951}, {31230, -9.816546701261487},
        {10187, -9.82593679210617}, {9377, -9.827032047050023}},
       {7687, 487, 20656, 20656, 20656, 13562, 19611, 19611, 19611, 4636, 4636, 4636}},
      {"gemma3",
       {{31533, -9.662836850088475}, {24825, -9.73543865391567}, {12213, -9.756673599232347},
        {25306, -9.771242564808889}, {24018, -9.789011794302946}},
       {31533, 30394, 14172, 26775, 27475, 30394, 30394, 30394, 25563, 18486, 3510, 3510}},
  };
  const auto ids = prompt(16, 3);
  for (const Ref& r : refs) {
    SCOPED_TRACE(r.preset);
    auto m = load(gguf_of(r.preset));
    ASSERT_TRUE(m);
    std::vector<float> logits;
    const auto g = greedy(*m, ids, static_cast<int>(r.greedy.size()), &logits);
    const std::size_t V = static_cast<std::size_t>(m->config().vocab_size);
    ASSERT_GE(logits.size(), V);
    double mx = -1e300, z = 0;
    for (std::size_t i = 0; i < V; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
    for (std::size_t i = 0; i < V; ++i) z += std::exp(static_cast<double>(logits[i]) - mx);
    double worst = 0;
    for (const auto& [id, lp] : r.top5) {
      const double mine = static_cast<double>(logits[static_cast<std::size_t>(id)]) - mx - std::log(z);
      worst = std::max(worst, std::abs(mine - lp));
      EXPECT_NEAR(mine, lp, 2e-3) << "token " << id;
    }
    EXPECT_EQ(g, r.greedy);
    std::printf("[ report ] %s: worst top-5 log-probability difference to llama.cpp %.2e\n", r.preset, worst);
  }
}

TEST(Architectures, GgufFromF16AndBf16DirectoriesKeepsEveryVectorF32AsLlamaCppsConverterDoes) {
  struct Case {
    weights::DType dtype;
    const char* tag;
    modelgen::Recipe recipe;
    std::uint32_t matrix_ggml;  // what the matrices are written as
  };
  const Case cases[] = {{weights::DType::f16, "f16", modelgen::Recipe::f16, 1},
                        {weights::DType::bf16, "bf16", modelgen::Recipe::bf16, 30},
                        {weights::DType::bf16, "bf16", modelgen::Recipe::q8_0, 8}};
  for (const char* preset : kPresets) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(preset) + " " + c.tag + " -> " + std::string(modelgen::recipe_name(c.recipe)));
      const std::string hf = make_model(std::string("arch16-") + preset + "-" + c.tag, preset, c.dtype);
      const std::string out = testing::temp_root() + "/arch16-" + preset + "-" + c.tag + "-" +
                              std::string(modelgen::recipe_name(c.recipe)) + ".gguf";
      auto st = modelgen::convert_to_gguf(hf, out, c.recipe);
      ASSERT_TRUE(st.ok()) << st.error().message;
      auto f = weights::GgufFile::open(out);
      ASSERT_TRUE(f.ok()) << f.error().message;
      int vectors = 0, matrices = 0;
      for (const auto& t : f->tensors()) {
        if (t.ne.size() == 1) {
          ++vectors;
          EXPECT_EQ(t.ggml_type, 0u) << t.name << " is " << weights::ggml_type_label(t.ggml_type) << ", not F32";
        } else if (t.name != "token_embd.weight" && t.name != "output.weight") {
          ++matrices;
          EXPECT_EQ(t.ggml_type, c.matrix_ggml) << t.name << " is " << weights::ggml_type_label(t.ggml_type);
        }
      }
      EXPECT_GE(vectors, 5);  // two norms per layer (two layers at least) and the final one
      EXPECT_GT(matrices, 0);
      if (c.recipe == modelgen::Recipe::q8_0) continue;  // (a lossy recipe: not the directory's tokens)
      auto a = load(hf);
      auto b = load(out);
      ASSERT_TRUE(a && b);
      const auto ids = prompt(24, 2);
      std::vector<float> la, lb;
      const auto ga = greedy(*a, ids, 12, &la), gb = greedy(*b, ids, 12, &lb);
      EXPECT_LT(max_abs_diff(la, lb), 1e-4f);
      EXPECT_EQ(ga, gb);
    }
  }
}

TEST(Architectures, Phi3QuantizedGgufSplitsItsFusedBlocksAndAgreesOnCpuAndAccelerator) {
  const std::string q8 = gguf_of("phi3", modelgen::Recipe::q8_0);
  auto m = load(q8);
  ASSERT_TRUE(m);
  const weights::TensorView* qkv = m->files().tensor("model.layers.0.self_attn.qkv_proj.weight");
  const weights::TensorView* k = m->files().tensor("model.layers.0.self_attn.k_proj.weight");
  ASSERT_TRUE(qkv && k);
  EXPECT_EQ(qkv->type, kernels::WType::q8_0);
  EXPECT_EQ(k->type, kernels::WType::q8_0);
  EXPECT_EQ(k->data.data(), qkv->data.data() + kernels::row_bytes(kernels::WType::q8_0, 64) * 64)
      << "k_proj is a zero-copy view of rows [64, 96) of the fused blocks";
  const auto ids = prompt(24, 2);
  auto cpu = m->forward_reference(ids);
  ASSERT_TRUE(cpu.ok());
  // Quantized close to the f32 model.
  auto f32 = load(gguf_of("phi3"))->forward_reference(ids);
  ASSERT_TRUE(f32.ok());
  EXPECT_LT(max_abs_diff(*cpu, *f32), 0.05f);
  device::SimulatedConfig sc;
  sc.capacity_bytes = 1ull << 30;
  engine::LoadOptions lo;
  lo.accelerator = std::make_shared<device::SimulatedDevice>(sc, std::make_shared<SteadyClock>());
  auto acc = load(q8, lo);
  ASSERT_TRUE(acc);
  auto on_acc = acc->forward_reference(ids);
  ASSERT_TRUE(on_acc.ok()) << on_acc.error().message;
  // Two kernel families: q8_0 activations on the CPU (llama.cpp's), f32 activations over the expanded blocks here.
  EXPECT_LT(max_abs_diff(*cpu, *on_acc), 0.02f);
  EXPECT_LT(max_abs_diff(*f32, *on_acc), 0.05f);
}

TEST(Architectures, SimulatedAcceleratorAgreesWithTheCpuForEachArchitecture) {
  for (const char* preset : kPresets) {
    SCOPED_TRACE(preset);
    const std::string dir = make_model(std::string("arch-") + preset, preset);
    auto cpu = load(dir);
    for (const int layers : {1, -1}) {
      device::SimulatedConfig sc;
      sc.capacity_bytes = 1ull << 30;
      engine::LoadOptions lo;
      lo.accelerator = std::make_shared<device::SimulatedDevice>(sc, std::make_shared<SteadyClock>());
      lo.accel_layers = layers;
      auto acc = load(dir, lo);
      ASSERT_TRUE(cpu && acc);
      const auto ids = prompt(40, 3);
      std::vector<float> la, lb;
      const auto ga = greedy(*cpu, ids, 12, &la), gb = greedy(*acc, ids, 12, &lb);
      EXPECT_LT(max_abs_diff(la, lb), 1e-4f) << "accel layers " << layers;
      EXPECT_EQ(ga, gb) << "accel layers " << layers;
      EXPECT_EQ(cpu->fingerprint().digest, acc->fingerprint().digest);
    }
  }
}

// --- Phi-3 fused == Llama unfused; Qwen2 biases ------------------------------------------------------------------

// Writes a model of `shape` whose tensors come from `map` (name → values).
std::string write_from(const std::string& name, modelgen::Shape shape,
                       const std::function<void(const std::string&, std::vector<float>&)>& map) {
  modelgen::Options o;
  o.shape = std::move(shape);
  o.tokenizer_model = testing::tokenizer_path();
  o.source = map;
  const std::string dir = testing::temp_root() + "/" + name;
  auto s = modelgen::write_model(dir, o);
  EXPECT_TRUE(s.ok()) << s.error().message;
  return dir;
}

void copy_tensor(const weights::ModelDir& d, const std::string& name, std::vector<float>& out) {
  const weights::TensorView* t = d.tensor(name);
  ASSERT_TRUE(t != nullptr) << name;
  ASSERT_EQ(t->data.size(), out.size() * sizeof(float)) << name;
  std::memcpy(out.data(), t->data.data(), t->data.size());
}

// Every tensor of the model written copied from `src` under the same name.
std::function<void(const std::string&, std::vector<float>&)> copy_from(const weights::ModelDir& src) {
  return [&src](const std::string& n, std::vector<float>& out) { copy_tensor(src, n, out); };
}

TEST(Architectures, Phi3FusedProjectionsEqualAnUnfusedLlamaWithTheSameRows) {
  modelgen::Shape phi = *modelgen::preset("phi3");
  phi.rope_scaling.clear();  // the same RoPE as the Llama below
  modelgen::Options o;
  o.shape = phi;
  o.tokenizer_model = testing::tokenizer_path();
  o.seed = 11;
  const std::string phi_dir = testing::temp_root() + "/arch-phi3-plain";
  ASSERT_TRUE(modelgen::write_model(phi_dir, o).ok());
  auto fused = load(phi_dir);
  ASSERT_TRUE(fused);
  modelgen::Shape llama = *modelgen::preset("test");
  ASSERT_EQ(llama.hidden, phi.hidden);
  ASSERT_EQ(llama.tied, phi.tied);
  const weights::ModelDir& src = fused->files();
  // Every unfused name is a view in the Phi-3 directory (q/k/v_proj, gate/up_proj): copy its rows.
  const std::string llama_dir = write_from("arch-phi3-as-llama", llama, copy_from(src));
  auto unfused = load(llama_dir);
  ASSERT_TRUE(unfused);
  EXPECT_FALSE(unfused->config().fused_projections);
  const auto ids = prompt(20, 4);
  auto a = fused->forward_reference(ids), b = unfused->forward_reference(ids);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(max_abs_diff(*a, *b), 0.0f) << "the same rows through the same kernels";
}

TEST(Architectures, Qwen2BiasesAreAddedToQKAndVAndZeroBiasesEqualALlama) {
  auto qwen = load(make_model("arch-qwen2", "qwen2"));
  ASSERT_TRUE(qwen);
  const weights::ModelDir& src = qwen->files();
  modelgen::Shape zero_shape = *modelgen::preset("qwen2");
  const std::string zero_dir =
      write_from("arch-qwen2-zero-bias", zero_shape, [&](const std::string& n, std::vector<float>& out) {
        if (n.ends_with(".bias")) std::fill(out.begin(), out.end(), 0.0F);
        else copy_tensor(src, n, out);
      });
  modelgen::Shape llama_shape = zero_shape;
  llama_shape.architecture = "LlamaForCausalLM";
  const std::string llama_dir = write_from("arch-qwen2-as-llama", llama_shape, copy_from(src));
  auto zero = load(zero_dir), llama = load(llama_dir);
  ASSERT_TRUE(zero && llama);
  const auto ids = prompt(16, 5);
  auto with = qwen->forward_reference(ids), without = zero->forward_reference(ids), l = llama->forward_reference(ids);
  ASSERT_TRUE(with.ok() && without.ok() && l.ok());
  EXPECT_GT(max_abs_diff(*with, *without), 1e-3f) << "non-zero biases must move the logits";
  EXPECT_EQ(max_abs_diff(*without, *l), 0.0f) << "zero biases: a Llama with the same weights";
}

// --- Mistral's sliding window ------------------------------------------------------------------------------------

TEST(Architectures, MistralWindowHidesTokensBeyondTheReceptiveFieldAndNotWithin) {
  const std::string dir = make_model("arch-mistral", "mistral");
  auto m = load(dir);
  ASSERT_TRUE(m);
  ASSERT_EQ(m->config().sliding_window, std::optional<int>(32));
  EXPECT_EQ(m->max_context(), 512) << "the window no longer caps the context";
  // Two layers of window 32: the last position (79) sees layer-1 states 48..79, which saw tokens 17..79.
  const auto base = prompt(80, 6);
  auto last_logits = [&](engine::Model& mm, const std::vector<int>& ids) {
    auto seq = mm.new_sequence();
    auto pre = mm.forward(**seq, std::span(ids).first(50));  // a prefill, then decode steps across the window
    EXPECT_TRUE(pre.ok());
    std::vector<float> l;
    for (std::size_t i = 50; i < ids.size(); ++i) l = *mm.forward(**seq, std::span(ids).subspan(i, 1));
    return l;
  };
  const auto ref = last_logits(*m, base);
  auto changed = [&](engine::Model& mm, int pos) {
    auto ids = base;
    ids[static_cast<std::size_t>(pos)] = 3 + (ids[static_cast<std::size_t>(pos)] + 12345) % 31990;
    return max_abs_diff(ref, last_logits(mm, ids));
  };
  EXPECT_EQ(changed(*m, 0), 0.0f);
  EXPECT_EQ(changed(*m, 16), 0.0f) << "token 16 lies beyond the two windows";
  EXPECT_GT(changed(*m, 17), 0.0f) << "token 17 reaches position 79 through position 48";
  EXPECT_GT(changed(*m, 74), 0.0f);
  // Without the window (the same weights as a Llama) token 16 does matter.
  modelgen::Shape llama_shape = *modelgen::preset("mistral");
  llama_shape.architecture = "LlamaForCausalLM";
  llama_shape.sliding_window = 0;
  const weights::ModelDir& src = m->files();
  auto full = load(write_from("arch-mistral-as-llama", llama_shape, copy_from(src)));
  ASSERT_TRUE(full);
  const auto full_ref = last_logits(*full, base);
  auto ids = base;
  ids[16] = 3 + (ids[16] + 12345) % 31990;
  EXPECT_GT(max_abs_diff(full_ref, last_logits(*full, ids)), 0.0f);
  // Within the window the two agree: the first 32 positions see the same keys.
  auto a = m->forward_reference(std::span(base).first(32)), b = full->forward_reference(std::span(base).first(32));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(max_abs_diff(*a, *b), 0.0f);
}

// --- BPE vocabularies (llama3, qwen2, qwen3 presets) -----------------------------------------------------------------

TEST(Architectures, BpePresetsWriteTokenizerJsonAndGgufGpt2AndBothEncodeAndGenerateAlike) {
  for (const char* preset : {"llama3", "qwen2", "qwen3"}) {
    SCOPED_TRACE(preset);
    modelgen::Options o;
    o.shape = *modelgen::preset(preset);
    o.bpe = modelgen::preset_bpe_vocab(preset);
    ASSERT_TRUE(o.bpe);
    const std::string hf = testing::temp_root() + "/arch-bpe-" + preset;
    ASSERT_TRUE(modelgen::write_model(hf, o).ok());
    EXPECT_TRUE(std::filesystem::exists(hf + "/tokenizer.json"));
    EXPECT_FALSE(std::filesystem::exists(hf + "/tokenizer.model"));
    const std::string gguf = hf + ".gguf";
    auto st = modelgen::convert_to_gguf(hf, gguf, modelgen::Recipe::f32, 1, o.bpe.get());
    ASSERT_TRUE(st.ok()) << st.error().message;
    auto a = load(hf), b = load(gguf);
    ASSERT_TRUE(a && b);
    const std::string text = "Hello world, once upon a time: 42 cats!";
    const auto ia = a->encode_text(text), ib = b->encode_text(text);
    EXPECT_EQ(ia, ib);
    EXPECT_GT(ia.size(), 3u);
    EXPECT_EQ(a->tokenizer().decode(std::vector<int>(ia.begin() + (a->add_bos() ? 1 : 0), ia.end())), text);
    EXPECT_EQ(a->add_bos(), std::string(preset) == "llama3") << "Llama 3 adds <|begin_of_text|>, Qwen2 nothing";
    for (auto* m : {a.get(), b.get()}) {
      const auto ids = m->eos_ids();
      EXPECT_NE(std::find(ids.begin(), ids.end(), o.bpe->eot), ids.end()) << "stops on the end-of-turn token";
    }
    std::vector<float> la, lb;
    EXPECT_EQ(greedy(*a, ia, 16, &la), greedy(*b, ib, 16, &lb));
    EXPECT_LT(max_abs_diff(la, lb), 1e-4f);
  }
}

}  // namespace
}  // namespace tandem
