// The LibTorch forward pass against an independent scalar implementation of HF LlamaModel semantics, and the paged
// KV cache against the cache-free forward.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <thread>

#include <ATen/ATen.h>

#include "engine/kv_pool.h"
#include "model_fixture.h"

using namespace tandem;
using namespace tandem::testing;

namespace {

// Scalar double-precision Llama forward (HF conventions: rotate_half RoPE, q head h uses kv head h / (H / KVH)).
std::vector<double> naive_forward(const weights::ModelDir& d, const std::vector<int>& ids) {
  const auto& c = d.config();
  const int H = c.hidden_size, NH = c.num_heads, NKV = c.num_kv_heads, HD = c.head_dim, I = c.intermediate_size,
            V = c.vocab_size, T = static_cast<int>(ids.size());
  auto W = [&](const std::string& n) {
    const auto* t = d.tensor(n);
    std::vector<float> v(t->data.size() / 4);
    std::memcpy(v.data(), t->data.data(), t->data.size());
    return v;
  };
  auto matvec = [](const std::vector<float>& w, const std::vector<double>& x, int rows) {
    const int cols = static_cast<int>(x.size());
    std::vector<double> y(static_cast<std::size_t>(rows), 0.0);
    for (int r = 0; r < rows; ++r)
      for (int k = 0; k < cols; ++k) y[r] += static_cast<double>(w[static_cast<std::size_t>(r) * cols + k]) * x[k];
    return y;
  };
  auto rms = [&](const std::vector<double>& x, const std::vector<float>& w) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double r = 1.0 / std::sqrt(ss / x.size() + c.rms_norm_eps);
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w[i];
    return y;
  };
  auto rope = [&](std::vector<double>& v, int heads, int pos) {
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < HD / 2; ++i) {
        const double f = 1.0 / std::pow(c.rope_theta, 2.0 * i / HD), a = pos * f;
        double& x1 = v[static_cast<std::size_t>(h * HD + i)];
        double& x2 = v[static_cast<std::size_t>(h * HD + i + HD / 2)];
        const double n1 = x1 * std::cos(a) - x2 * std::sin(a), n2 = x2 * std::cos(a) + x1 * std::sin(a);
        x1 = n1;
        x2 = n2;
      }
  };
  const auto emb = W("model.embed_tokens.weight");
  std::vector<std::vector<double>> x(static_cast<std::size_t>(T), std::vector<double>(static_cast<std::size_t>(H)));
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < H; ++i) x[t][i] = emb[static_cast<std::size_t>(ids[t]) * H + i];
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const auto wq = W(p + "self_attn.q_proj.weight"), wk = W(p + "self_attn.k_proj.weight"),
               wv = W(p + "self_attn.v_proj.weight"), wo = W(p + "self_attn.o_proj.weight"),
               n1 = W(p + "input_layernorm.weight"), n2 = W(p + "post_attention_layernorm.weight"),
               wg = W(p + "mlp.gate_proj.weight"), wu = W(p + "mlp.up_proj.weight"), wd = W(p + "mlp.down_proj.weight");
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (int t = 0; t < T; ++t) {
      const auto h = rms(x[t], n1);
      q[t] = matvec(wq, h, NH * HD);
      k[t] = matvec(wk, h, NKV * HD);
      v[t] = matvec(wv, h, NKV * HD);
      rope(q[t], NH, t);
      rope(k[t], NKV, t);
    }
    for (int t = 0; t < T; ++t) {
      std::vector<double> out(static_cast<std::size_t>(NH * HD), 0.0);
      for (int hh = 0; hh < NH; ++hh) {
        const int kv = hh / (NH / NKV);
        std::vector<double> s(static_cast<std::size_t>(t + 1));
        double mx = -1e300;
        for (int u = 0; u <= t; ++u) {
          double dot = 0;
          for (int i = 0; i < HD; ++i) dot += q[t][hh * HD + i] * k[u][kv * HD + i];
          s[u] = dot / std::sqrt(static_cast<double>(HD));
          mx = std::max(mx, s[u]);
        }
        double sum = 0;
        for (auto& e : s) sum += (e = std::exp(e - mx));
        for (int u = 0; u <= t; ++u)
          for (int i = 0; i < HD; ++i) out[hh * HD + i] += s[u] / sum * v[u][kv * HD + i];
      }
      const auto o = matvec(wo, out, H);
      for (int i = 0; i < H; ++i) x[t][i] += o[i];
      const auto h2 = rms(x[t], n2);
      auto g = matvec(wg, h2, I);
      const auto up = matvec(wu, h2, I);
      for (int i = 0; i < I; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * up[i];
      const auto dn = matvec(wd, g, H);
      for (int i = 0; i < H; ++i) x[t][i] += dn[i];
    }
  }
  const auto fn = W("model.norm.weight");
  const auto head = W(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  std::vector<double> logits;
  for (int t = 0; t < T; ++t) {
    const auto y = matvec(head, rms(x[t], fn), V);
    logits.insert(logits.end(), y.begin(), y.end());
  }
  return logits;
}

const std::vector<engine::TokenId> kPrompt{1, 15043, 3186, 29892, 2748, 2501, 263, 931};

}  // namespace

TEST(Model, ReferenceForwardMatchesScalarHfSemantics) {
  auto m = load(make_model("f32"));
  ASSERT_TRUE(m);
  auto ours = m->forward_reference(kPrompt);
  ASSERT_TRUE(ours.ok()) << ours.error().message;
  std::vector<int> ids(kPrompt.begin(), kPrompt.end());
  const auto want = naive_forward(m->files(), ids);
  ASSERT_EQ(ours->size(), want.size());
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(want[i] - (*ours)[i]));
  EXPECT_LT(worst, 1e-4) << "f32 LibTorch vs double scalar reference";
}

TEST(Model, PagedIncrementalDecodeEqualsFullForwardAcrossBlockSizes) {
  const std::string dir = make_model("f32");
  // 40 tokens: crosses block boundaries for every block size below.
  std::vector<engine::TokenId> toks;
  for (int i = 0; i < 40; ++i) toks.push_back(static_cast<engine::TokenId>(100 + 37 * i % 31000));
  auto ref_model = load(dir);
  auto ref = ref_model->forward_reference(toks);
  ASSERT_TRUE(ref.ok());
  const std::size_t V = static_cast<std::size_t>(ref_model->config().vocab_size);
  for (int bs : {1, 3, 16, 64}) {
    engine::LoadOptions lo;
    lo.kv_block_size = bs;
    auto m = load(dir, lo);
    auto seq = m->new_sequence();
    ASSERT_TRUE(seq.ok());
    // prefill 7 tokens (all logits), then one token at a time
    auto first = m->forward(**seq, std::span(toks).first(7), /*all_logits=*/true);
    ASSERT_TRUE(first.ok()) << first.error().message;
    EXPECT_LT(max_abs_diff(*first, *ref, 0, 0, 7 * V), 2e-5) << "prefill, block size " << bs;
    float worst = 0;
    for (std::size_t t = 7; t < toks.size(); ++t) {
      auto l = m->forward(**seq, std::span(toks).subspan(t, 1));
      ASSERT_TRUE(l.ok()) << l.error().message;
      worst = std::max(worst, max_abs_diff(*l, *ref, 0, t * V, V));
    }
    EXPECT_LT(worst, 2e-5) << "decode, block size " << bs;
    EXPECT_EQ((*seq)->length(), 40);
    EXPECT_EQ(m->kv_stats().used_blocks, (40 + bs - 1) / bs);
  }
}

TEST(Model, ShardedAndUnshardedAgree) {
  auto a = load(make_model("f32"));
  auto b = load(make_model("f32-sharded", "test", weights::DType::f32, 3));
  auto la = a->forward_reference(kPrompt), lb = b->forward_reference(kPrompt);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(max_abs_diff(*la, *lb), 0.0f);
  EXPECT_EQ(a->files().shards().size(), 1u);
  EXPECT_EQ(b->files().shards().size(), 3u);
  EXPECT_EQ(a->load_stats().resident_copy_bytes, 0u) << "f32 weights must be zero-copy";
}

TEST(Model, Bf16AndF16FilesAndComputeDtypes) {
  auto f32 = load(make_model("f32"));
  auto ref = f32->forward_reference(kPrompt);
  struct Case {
    std::string name;
    weights::DType file;
    engine::ComputeDType compute;
    float tol;
  };
  for (const auto& c : std::vector<Case>{{"bf16", weights::DType::bf16, engine::ComputeDType::f32, 0.05f},
                                         {"f16", weights::DType::f16, engine::ComputeDType::f32, 0.01f},
                                         {"bf16", weights::DType::bf16, engine::ComputeDType::bf16, 0.15f}}) {
    engine::LoadOptions lo;
    lo.dtype = c.compute;
    auto m = load(make_model(c.name, "test", c.file), lo);
    ASSERT_TRUE(m);
    auto l = m->forward_reference(kPrompt);
    ASSERT_TRUE(l.ok()) << l.error().message;
    EXPECT_LT(max_abs_diff(*l, *ref), c.tol) << c.name << " compute " << engine::compute_dtype_name(c.compute);
    if (c.compute == engine::ComputeDType::bf16) EXPECT_EQ(m->load_stats().resident_copy_bytes, 0u);
    else EXPECT_GT(m->load_stats().resident_copy_bytes, 0u);
  }
}

TEST(Model, FingerprintSameFilesSameSettingsAndExplainsDifferences) {
  const std::string dir = make_model("f32");
  auto a = load(dir), b = load(dir);
  EXPECT_EQ(a->fingerprint().digest, b->fingerprint().digest);
  engine::LoadOptions lo;
  lo.dtype = engine::ComputeDType::f32;  // `auto` on an f32 file holds f32: the same replica
  EXPECT_EQ(load(dir, lo)->fingerprint().digest, a->fingerprint().digest);
  lo.dtype = engine::ComputeDType::bf16;
  auto c = load(dir, lo);
  EXPECT_EQ(a->fingerprint().diff(c->fingerprint()), (std::vector<std::string>{"weights_types", "accel_activations"}));
  lo = {};
  lo.template_name = "chatml";
  auto d = load(dir, lo);
  EXPECT_EQ(a->fingerprint().diff(d->fingerprint()), (std::vector<std::string>{"template", "stop_rules"}));
  auto e = load(make_model("f32-seed8", "test", weights::DType::f32, 1, 8));
  EXPECT_EQ(a->fingerprint().diff(e->fingerprint()), std::vector<std::string>{"weights"});
  // Block size and threads do not change results, so they are not part of the fingerprint.
  lo = {};
  lo.kv_block_size = 3;
  lo.threads = 2;
  EXPECT_EQ(load(dir, lo)->fingerprint().digest, a->fingerprint().digest);
}

TEST(Model, TemplateFromTokenizerConfig) {
  // The model's own chat_template is rendered (tests/engine/test_model_text.cc covers it in depth); ChatML writes
  // no BOS, as apply_chat_template.
  auto m = load(make_model("chatml", "test", weights::DType::f32, 1, 7,
                           "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
                           "'<|im_end|>\\n' }}{% endfor %}{{ '<|im_start|>assistant\\n' }}"));
  EXPECT_EQ(m->prompt_template(), gen::TemplateKind::model);
  auto ids = m->encode_chat({{"user", "Hi"}});
  ASSERT_TRUE(ids.ok()) << ids.error().message;
  EXPECT_NE(ids->front(), 1);
  EXPECT_EQ(*ids, m->tokenizer().encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
}

TEST(Model, ForwardErrorsAreTypedAndLeaveTheSequenceUsable) {
  engine::LoadOptions lo;
  lo.max_context = 32;
  lo.kv_block_size = 8;
  auto m = load(make_model("f32"), lo);
  auto seq = m->new_sequence();
  ASSERT_TRUE(seq.ok());
  const std::vector<engine::TokenId> bad{1, 32000};
  EXPECT_EQ(m->forward(**seq, bad).error().code, Errc::invalid_argument);
  const std::vector<engine::TokenId> neg{-5};
  EXPECT_EQ(m->forward(**seq, neg).error().code, Errc::invalid_argument);
  EXPECT_EQ(m->forward(**seq, std::span<const engine::TokenId>{}).error().code, Errc::invalid_argument);
  std::vector<engine::TokenId> many(33, 5);
  EXPECT_EQ(m->forward(**seq, many).error().code, Errc::invalid_argument);  // context overflow
  EXPECT_EQ((*seq)->length(), 0);
  std::vector<engine::TokenId> ok(32, 5);
  EXPECT_TRUE(m->forward(**seq, ok).ok());
  EXPECT_EQ((*seq)->length(), 32);
}

TEST(Model, KvPoolExhaustionIsTypedAndReleaseReturnsBlocks) {
  engine::LoadOptions lo;
  lo.kv_block_size = 4;
  lo.kv_blocks = 5;  // 20 tokens in total
  auto m = load(make_model("f32"), lo);
  auto s1 = m->new_sequence();
  auto s2 = m->new_sequence();
  ASSERT_TRUE(s1.ok() && s2.ok());
  std::vector<engine::TokenId> t12(12, 9), t9(9, 9);
  ASSERT_TRUE(m->forward(**s1, t12).ok());      // 3 blocks
  auto r = m->forward(**s2, t9);                // needs 3, 2 free
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::kv_exhausted);
  EXPECT_EQ((*s2)->length(), 0);
  EXPECT_EQ(m->kv_stats().used_blocks, 3);
  EXPECT_EQ(m->kv_stats().sequences, 2u);
  (*s1)->release();
  EXPECT_EQ(m->kv_stats().used_blocks, 0);
  EXPECT_EQ(m->kv_stats().sequences, 1u);
  EXPECT_EQ(m->forward(**s1, t9).error().code, Errc::invalid_argument);  // released: unusable
  EXPECT_TRUE(m->forward(**s2, t9).ok());
  s2->reset();  // destroying a sequence releases its blocks
  EXPECT_EQ(m->kv_stats().used_blocks, 0);
  EXPECT_EQ(m->kv_stats().sequences, 0u);
  s1->reset();  // destroying a released sequence is harmless
}

// The pool's storage on the CPU: rows written to their slots (a row copy each) read back from them; a slot outside
// the pool is refused (a c10::Error, which the forward maps to a typed error) and writes nothing.
TEST(Model, KvPoolWritesRowsToTheirSlots) {
  engine::KvPool pool(4, 4);  // 16 slots
  ASSERT_TRUE(pool.add_layer({2, 3}, at::kFloat, at::Device(at::kCPU), nullptr).ok());
  pool.k(0).fill_(-1.F);
  pool.v(0).fill_(-1.F);
  const at::Tensor k = at::arange(12, at::kFloat).view({2, 2, 3}), v = k + 100.F;
  const at::Tensor slots = at::tensor(std::vector<std::int64_t>{5, 1}, at::kLong);
  pool.write(0, slots, k, v);
  const auto [rk, rv] = pool.read(0, slots);
  EXPECT_TRUE(at::equal(rk, k));
  EXPECT_TRUE(at::equal(rv, v));
  EXPECT_EQ(pool.k(0)[0][0][0].item<float>(), -1.F);  // untouched
  const at::Tensor bad = at::tensor(std::vector<std::int64_t>{16}, at::kLong);
  EXPECT_THROW(pool.write(0, bad, k.narrow(0, 0, 1), v.narrow(0, 0, 1)), c10::Error);
  EXPECT_THROW(pool.write(0, slots, k.narrow(0, 0, 1), v.narrow(0, 0, 1)), c10::Error);  // 1 row for 2 slots
}

// An f16 pool takes f32 rows rounded to nearest even (as ATen's conversion): what is read back is the f16 value.
TEST(Model, KvPoolRoundsF32RowsIntoAnF16Pool) {
  engine::KvPool pool(4, 4);
  ASSERT_TRUE(pool.add_layer({2, 3}, at::kHalf, at::Device(at::kCPU), nullptr).ok());
  // 1 + 2^-11 is a tie between two f16 values (1 and 1 + 2^-10): to even, 1; 1 + 3 * 2^-11 rounds up to 1 + 2^-9.
  const at::Tensor k = at::tensor(std::vector<float>{1.F + 0x1p-11F, 1.F + 3 * 0x1p-11F, -2.5F, 65504.F, 1e-8F, 0.1F,
                                                     3.F, 4.F, 5.F, 6.F, 7.F, 8.F})
                           .view({2, 2, 3});
  const at::Tensor v = -k;
  const at::Tensor slots = at::tensor(std::vector<std::int64_t>{7, 2}, at::kLong);
  pool.write(0, slots, k, v);
  const auto [rk, rv] = pool.read(0, slots);
  EXPECT_EQ(rk.scalar_type(), at::kHalf);
  EXPECT_TRUE(at::equal(rk, k.to(at::kHalf)));
  EXPECT_TRUE(at::equal(rv, v.to(at::kHalf)));
  EXPECT_EQ(rk[0][0][0].item<float>(), 1.F);
  EXPECT_EQ(rk[0][0][1].item<float>(), 1.F + 0x1p-9F);
  EXPECT_EQ(pool.layer_bytes(6, at::kHalf) * 2, pool.layer_bytes(6, at::kFloat));
  // Contiguous f32 rows go straight into their slots (kernels::f32_to_f16_row); other rows through ATen's
  // conversion: the same bits, here over values spread across f16's range (subnormals, overflow to infinity).
  const at::Tensor wide = at::randn({2, 2, 3}, at::TensorOptions().dtype(at::kFloat)) *
                          at::tensor(std::vector<float>{1e-6F, 1e-3F, 1.F, 1e3F, 7e4F, 3e-8F}).view({1, 2, 3});
  const at::Tensor strided = at::empty({2, 3, 2}, at::kFloat).transpose(1, 2);
  strided.copy_(wide);
  ASSERT_FALSE(strided.is_contiguous());
  const at::Tensor s1 = at::tensor(std::vector<std::int64_t>{0, 1}, at::kLong), s2 = at::tensor(std::vector<std::int64_t>{3, 4}, at::kLong);
  pool.write(0, s1, wide, wide);
  pool.write(0, s2, strided, strided);
  EXPECT_TRUE(at::equal(pool.read(0, s1).first, pool.read(0, s2).first));
  EXPECT_TRUE(at::equal(pool.read(0, s1).first, wide.to(at::kHalf)));
}

// The daemon's default KV cache (f16) against f32: the pool half the bytes, logits of a prefill and of decode steps
// within 2e-3 of f32's (the rounding of K and V to f16, 2^-11 relative), and a fingerprint of its own.
TEST(Model, F16KvCacheHalvesThePoolAndStaysCloseToF32) {
  const std::string dir = make_model("f32");
  std::vector<engine::TokenId> toks;
  for (int i = 0; i < 30; ++i) toks.push_back(static_cast<engine::TokenId>(150 + 53 * i % 30000));
  engine::LoadOptions lo;
  lo.threads = 2;
  auto m32 = load(dir, lo);
  lo.cpu_kv = engine::KvCacheType::f16;
  auto m16 = load(dir, lo);
  ASSERT_TRUE(m32 && m16);
  EXPECT_EQ(m16->load_stats().kv_pool_bytes * 2, m32->load_stats().kv_pool_bytes);
  EXPECT_NE(m16->fingerprint(), m32->fingerprint());
  auto s32 = m32->new_sequence();
  auto s16 = m16->new_sequence();
  auto p32 = m32->forward(**s32, std::span(toks).first(10), true);
  auto p16 = m16->forward(**s16, std::span(toks).first(10), true);
  ASSERT_TRUE(p32.ok() && p16.ok());
  EXPECT_LT(max_abs_diff(*p16, *p32), 2e-3) << "prefill";
  EXPECT_GT(max_abs_diff(*p16, *p32), 0.F) << "the f16 pool is in use";
  for (std::size_t t = 10; t < toks.size(); ++t) {
    auto l32 = m32->forward(**s32, std::span(toks).subspan(t, 1));
    auto l16 = m16->forward(**s16, std::span(toks).subspan(t, 1));
    ASSERT_TRUE(l32.ok() && l16.ok());
    EXPECT_LT(max_abs_diff(*l16, *l32), 2e-3) << "decode " << t;
  }
}

TEST(Model, LoadErrorsAreTyped) {
  EXPECT_EQ(engine::Model::load("/nonexistent/model", {}).error().code, Errc::not_found);
  engine::LoadOptions lo;
  lo.threads = 0;
  EXPECT_EQ(engine::Model::load(make_model("f32"), lo).error().code, Errc::invalid_argument);
  lo = {};
  lo.template_name = "jinja";
  EXPECT_EQ(engine::Model::load(make_model("f32"), lo).error().code, Errc::invalid_argument);
  // A corrupt tokenizer.model fails the load, naming the file.
  const std::string dir = temp_root() + "/badtok";
  std::filesystem::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "generation_config.json", "tokenizer_config.json"})
    std::filesystem::copy_file(make_model("f32") + "/" + f, dir + "/" + f,
                               std::filesystem::copy_options::overwrite_existing);
  {
    std::ofstream(dir + "/tokenizer.model") << "not a protobuf at all";
  }
  auto r = engine::Model::load(dir, {});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.error().code == Errc::parse_error || r.error().code == Errc::format_error) << r.error().message;
}

TEST(Model, WorkerPoolSplitGivesTheSameLogits) {
  const std::string dir = make_model("f32");
  std::vector<engine::TokenId> toks;
  for (int i = 0; i < 20; ++i) toks.push_back(static_cast<engine::TokenId>(200 + 91 * i % 30000));
  auto one = load(dir);
  auto ref_seq = one->new_sequence();
  auto ref_prefill = one->forward(**ref_seq, std::span(toks).first(12), true);
  ASSERT_TRUE(ref_prefill.ok());
  std::vector<std::vector<float>> ref_decode;
  for (std::size_t t = 12; t < toks.size(); ++t) ref_decode.push_back(*one->forward(**ref_seq, std::span(toks).subspan(t, 1)));
  for (int threads : {2, 3}) {
    engine::LoadOptions lo;
    lo.threads = threads;
    auto m = load(dir, lo);
    auto seq = m->new_sequence();
    auto pre = m->forward(**seq, std::span(toks).first(12), true);
    ASSERT_TRUE(pre.ok());
    EXPECT_LT(max_abs_diff(*pre, *ref_prefill), 1e-5) << threads << " threads, prefill";
    for (std::size_t t = 12; t < toks.size(); ++t) {
      auto l = m->forward(**seq, std::span(toks).subspan(t, 1));
      ASSERT_TRUE(l.ok());
      EXPECT_LT(max_abs_diff(*l, ref_decode[t - 12]), 1e-5) << threads << " threads, decode " << t;
    }
  }
}

TEST(Model, ConcurrentSequencesOnOneModelMatchSequentialRuns) {
  engine::LoadOptions lo;
  lo.max_sequences = 4;
  lo.threads = 2;
  auto m = load(make_model("f32"), lo);
  auto run_seq = [&](int salt) {
    std::vector<engine::TokenId> toks;
    for (int i = 0; i < 24; ++i) toks.push_back(static_cast<engine::TokenId>(300 + salt * 13 + 7 * i));
    auto seq = m->new_sequence();
    std::vector<float> last;
    for (auto t : toks) last = *m->forward(**seq, std::span(&t, 1));
    return last;
  };
  std::vector<std::vector<float>> seq_results;
  for (int s = 0; s < 4; ++s) seq_results.push_back(run_seq(s));
  std::vector<std::vector<float>> par_results(4);
  std::vector<std::thread> threads;
  for (int s = 0; s < 4; ++s) threads.emplace_back([&, s] { par_results[static_cast<std::size_t>(s)] = run_seq(s); });
  for (auto& t : threads) t.join();
  for (int s = 0; s < 4; ++s) EXPECT_EQ(par_results[static_cast<std::size_t>(s)], seq_results[static_cast<std::size_t>(s)]);
  EXPECT_EQ(m->kv_stats().used_blocks, 0);
}

// Cancel from another thread: releasing a sequence while forwards run on it must never let its blocks be written
// after they went to another sequence. Sequence B's logits must equal a run on a model nobody else touches.
TEST(Model, ReleaseFromAnotherThreadNeverCorruptsAnotherSequence) {
  const std::string dir = make_model("f32");
  engine::LoadOptions lo;
  lo.kv_block_size = 4;
  lo.kv_blocks = 12;  // tight: freed blocks are reused at once
  lo.max_context = 64;
  auto quiet = load(dir, lo);
  std::vector<engine::TokenId> toks_b;
  for (int i = 0; i < 24; ++i) toks_b.push_back(static_cast<engine::TokenId>(500 + 11 * i));
  std::vector<float> want;
  {
    auto s = quiet->new_sequence();
    for (auto t : toks_b) want = *quiet->forward(**s, std::span(&t, 1));
  }
  auto m = load(dir, lo);
  for (int round = 0; round < 20; ++round) {
    auto a = m->new_sequence();
    ASSERT_TRUE(a.ok());
    engine::Sequence* seq_a = a->get();
    std::atomic<bool> stop{false};
    std::thread writer([&] {
      std::vector<engine::TokenId> t(4, 77);
      while (!stop.load()) {
        auto r = m->forward(*seq_a, t);
        if (!r.ok()) break;  // released (invalid_argument) or full
      }
    });
    std::this_thread::sleep_for(std::chrono::microseconds(200 * (round % 5)));
    seq_a->release();  // from this thread, while the writer may be mid-forward
    auto b = m->new_sequence();
    ASSERT_TRUE(b.ok());
    std::vector<float> got;
    for (auto t : toks_b) {
      auto r = m->forward(**b, std::span(&t, 1));
      ASSERT_TRUE(r.ok()) << r.error().message;
      got = std::move(r).value();
    }
    stop = true;
    writer.join();
    EXPECT_EQ(got, want) << "round " << round;
  }
  EXPECT_EQ(m->kv_stats().used_blocks, 0);
}
