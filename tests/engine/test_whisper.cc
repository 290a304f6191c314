// The Whisper model (engine/whisper.h): encoder output and decoder logits against an independent reference in plain
// ATen ops, incremental decoding, rewind, independent sessions, paging, cancellation, bad inputs and malformed files.
// On the accelerators: test_whisper_device.cc.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "engine_test_util.h"
#include "engine/whisper.h"
#include "modelgen/whisper_writer.h"
#include "weights/safetensors.h"
#include "whisper_fixture.h"

namespace tandem::engine {
namespace {

namespace fs = std::filesystem;
using namespace whisper_test;


// One model shared by the CPU tests (written and loaded once).
class WhisperCpu : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(write_model("shared"));
    model_ = new std::shared_ptr<WhisperModel>(load(*dir_));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete dir_;
  }
  static WhisperModel& m() { return **model_; }
  static std::string* dir_;
  static std::shared_ptr<WhisperModel>* model_;
};
std::string* WhisperCpu::dir_ = nullptr;
std::shared_ptr<WhisperModel>* WhisperCpu::model_ = nullptr;

TEST_F(WhisperCpu, ConfigRoundTripAndPresets) {
  const WhisperConfig& c = m().config();
  EXPECT_EQ(c.d_model, 32);
  EXPECT_EQ(c.encoder_layers, 2);
  EXPECT_EQ(c.decoder_heads, 2);
  EXPECT_EQ(c.n_mels, 80);
  EXPECT_EQ(c.source_positions, 1500);
  EXPECT_EQ(c.target_positions, 64);
  EXPECT_EQ(c.vocab, 300);
  EXPECT_EQ(c.decoder_start_id, 297);
  EXPECT_EQ(c.eos_id, 296);
  EXPECT_EQ(m().window_frames(), 3000);
  EXPECT_EQ(m().accelerator(), nullptr);
  EXPECT_EQ(m().fingerprint().rfind("tfp1-", 0), 0U) << m().fingerprint();
  EXPECT_GT(m().session_bytes(), m().session_kv_bytes());
  EXPECT_EQ(m().session_kv_bytes(), 4ull * 2 * 2 * 32 * (1500 + 64));  // cross K/V + 4 blocks of 16 tokens
  // The default pool: max_sessions (4) sessions of 64 tokens in blocks of 16, f32 K and V of d 32 per layer.
  const KvStats kv = m().kv_stats();
  EXPECT_EQ(kv.block_size, 16);
  EXPECT_EQ(kv.total_blocks, 16);
  EXPECT_EQ(kv.bytes_total, 16ull * 16 * 32 * 4 * 2 * 2);
  EXPECT_EQ(m().stats().kv_pool_bytes, kv.bytes_total);
  EXPECT_EQ(m().stats().accel_kv_bytes, 0U);
  auto tiny = modelgen::whisper_preset("whisper-tiny");
  ASSERT_TRUE(tiny.ok());
  // openai/whisper-tiny: 37,760,640 parameters (tied head, both position tables).
  EXPECT_EQ(tiny->parameters(), 37760640U);
  auto large = modelgen::whisper_preset("whisper-large-v3");
  ASSERT_TRUE(large.ok());
  EXPECT_EQ(large->n_mels, 128);
  EXPECT_EQ(large->vocab, 51866);
  EXPECT_FALSE(modelgen::whisper_preset("whisper-huge").ok());
  const std::string gen = read(*dir_ + "/generation_config.json");
  EXPECT_NE(gen.find("\"no_timestamps_token_id\": 299"), std::string::npos) << gen;
  EXPECT_NE(gen.find("\"begin_suppress_tokens\": [220, 296]"), std::string::npos) << gen;
  EXPECT_NE(read(*dir_ + "/preprocessor_config.json").find("\"feature_size\": 80"), std::string::npos);
}

TEST_F(WhisperCpu, EncoderPositionsAreWhispersSinusoids) {
  const Ref ref = reference(*dir_);
  const at::Tensor got = ref.t("model.encoder.embed_positions.weight");
  // whisper/model.py sinusoids(length, channels).
  const double inc = std::log(10000.0) / (32 / 2 - 1);
  const at::Tensor inv = at::exp(-inc * at::arange(16, at::kFloat));
  const at::Tensor st = at::arange(1500, at::kFloat).unsqueeze(1) * inv.unsqueeze(0);
  const at::Tensor want = at::cat({at::sin(st), at::cos(st)}, 1);
  // Arguments reach 1499 (f32 spacing 1.2e-4 there): exp's last bit differs between libm and ATen.
  EXPECT_LT((got - want).abs().max().item<float>(), 2e-4);
  EXPECT_LT((got - want).narrow(0, 0, 16).abs().max().item<float>(), 1e-6);
}

TEST_F(WhisperCpu, MatchesTheReferenceForward) {
  const Ref ref = reference(*dir_);
  const auto mw = mel(m().config(), 0);
  const at::Tensor enc = ref.encoder(mw);
  auto got_enc = m().encoder_output(mw);
  ASSERT_TRUE(got_enc.ok()) << got_enc.error().message;
  const at::Tensor flat = enc.contiguous().view({-1});
  EXPECT_LT(rel_diff(*got_enc, std::vector<float>(flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel())), 1e-5);

  auto s = session(m());
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->encode(mw, nullptr).ok());
  EXPECT_EQ(s->fed(), 0U);
  auto logits = s->decode(kTokens, nullptr);
  ASSERT_TRUE(logits.ok()) << logits.error().message;
  EXPECT_EQ(s->fed(), kTokens.size());
  const at::Tensor want = ref.decoder(enc, kTokens);
  EXPECT_LT(rel_diff(*logits, row(want, static_cast<std::int64_t>(kTokens.size()) - 1)), 1e-5);
}

TEST_F(WhisperCpu, IncrementalDecodeEqualsFeedingAtOnce) {
  const Ref ref = reference(*dir_);
  const auto mw = mel(m().config(), 1);
  const at::Tensor want = ref.decoder(ref.encoder(mw), kTokens);
  auto all = session(m()), one = session(m());
  ASSERT_TRUE(all->encode(mw, nullptr).ok() && one->encode(mw, nullptr).ok());
  auto at_once = all->decode(kTokens, nullptr);
  ASSERT_TRUE(at_once.ok());
  std::vector<float> last;
  for (std::size_t i = 0; i < kTokens.size(); ++i) {
    auto r = one->decode(std::span(kTokens).subspan(i, 1), nullptr);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_LT(rel_diff(*r, row(want, static_cast<std::int64_t>(i))), 1e-5) << "position " << i;
    last = *r;
  }
  EXPECT_EQ(last, *at_once);  // bit-identical on the CPU
  // Chunks of 3 + 7.
  auto chunks = session(m());
  ASSERT_TRUE(chunks->encode(mw, nullptr).ok());
  ASSERT_TRUE(chunks->decode(std::span(kTokens).subspan(0, 3), nullptr).ok());
  EXPECT_EQ(*chunks->decode(std::span(kTokens).subspan(3), nullptr), *at_once);
}

TEST_F(WhisperCpu, RewindThenRedecode) {
  const auto mw = mel(m().config(), 2);
  auto s = session(m());
  ASSERT_TRUE(s->encode(mw, nullptr).ok());
  auto first = s->decode(kTokens, nullptr);
  ASSERT_TRUE(first.ok());
  s->rewind(4);
  EXPECT_EQ(s->fed(), 4U);
  auto again = s->decode(std::span(kTokens).subspan(4), nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *first);
  // A different continuation after the rewind equals a fresh session fed that sequence.
  s->rewind(2);
  const std::vector<std::int32_t> alt{297, 5, 200, 201};
  auto a = s->decode(std::span(alt).subspan(2), nullptr);
  auto fresh = session(m());
  ASSERT_TRUE(fresh->encode(mw, nullptr).ok());
  auto b = fresh->decode(alt, nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *first);
  s->rewind(100);  // clamped
  EXPECT_EQ(s->fed(), 4U);
  // A new encode empties the decoder.
  ASSERT_TRUE(s->encode(mw, nullptr).ok());
  EXPECT_EQ(s->fed(), 0U);
  EXPECT_EQ(*s->decode(kTokens, nullptr), *first);
}

TEST_F(WhisperCpu, InterleavedSessionsDoNotInterfere) {
  const auto m0 = mel(m().config(), 3), m1 = mel(m().config(), 4);
  std::vector<std::vector<float>> alone0, alone1;
  for (auto [mw, out] : {std::pair{&m0, &alone0}, std::pair{&m1, &alone1}}) {
    auto s = session(m());
    ASSERT_TRUE(s->encode(*mw, nullptr).ok());
    for (std::size_t i = 0; i < 5; ++i) out->push_back(*s->decode(std::span(kTokens).subspan(i, 1), nullptr));
  }
  EXPECT_NE(alone0.back(), alone1.back());
  auto a = session(m()), b = session(m());
  ASSERT_TRUE(a->encode(m0, nullptr).ok());
  ASSERT_TRUE(b->encode(m1, nullptr).ok());
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(*b->decode(std::span(kTokens).subspan(i, 1), nullptr), alone1[i]);
    EXPECT_EQ(*a->decode(std::span(kTokens).subspan(i, 1), nullptr), alone0[i]);
  }
}

// --- The decoder's self-attention K/V in the paged pool (kv_pool.h). ---

WhisperLoadOptions paged(int block_size, std::int64_t blocks = 0, int sessions = 4) {
  WhisperLoadOptions o;
  o.kv_block_size = block_size;
  o.kv_blocks = blocks;
  o.max_sessions = sessions;
  return o;
}

// 40 tokens: several blocks of every size below.
std::vector<std::int32_t> long_tokens() {
  std::vector<std::int32_t> t{297};
  for (int i = 1; i < 40; ++i) t.push_back((i * 37) % 290);
  return t;
}

TEST_F(WhisperCpu, PagedDecodeAcrossBlockBoundariesMatchesTheReference) {
  const Ref ref = reference(*dir_);
  const auto mw = mel(m().config(), 9);
  const auto toks = long_tokens();
  const at::Tensor want = ref.decoder(ref.encoder(mw), toks);
  auto base = session(m());  // blocks of 16
  ASSERT_TRUE(base->encode(mw, nullptr).ok());
  const auto at_once = *base->decode(toks, nullptr);
  EXPECT_LT(rel_diff(at_once, row(want, 39)), 1e-5);
  for (int bs : {1, 3, 64}) {
    auto pm = load(*dir_, paged(bs));
    auto one = session(*pm), all = session(*pm), rw = session(*pm);
    ASSERT_TRUE(one->encode(mw, nullptr).ok() && all->encode(mw, nullptr).ok() && rw->encode(mw, nullptr).ok());
    for (std::size_t i = 0; i < toks.size(); ++i) {
      auto r = one->decode(std::span(toks).subspan(i, 1), nullptr);
      ASSERT_TRUE(r.ok()) << r.error().message;
      EXPECT_LT(rel_diff(*r, row(want, static_cast<std::int64_t>(i))), 1e-5) << "block size " << bs << ", position " << i;
      if (i + 1 == toks.size()) {
        EXPECT_EQ(*r, at_once) << bs;  // bit-identical whatever the block size
      }
    }
    EXPECT_EQ(*all->decode(toks, nullptr), at_once) << bs;
    // Rewind into the middle of a block, feed something else, then the original continuation again.
    ASSERT_TRUE(rw->decode(std::span(toks).subspan(0, 20), nullptr).ok());
    rw->rewind(7);
    const std::vector<std::int32_t> other{5, 6, 7, 8, 9, 10, 11, 12};
    auto alt = rw->decode(other, nullptr);
    std::vector<std::int32_t> alt_seq(toks.begin(), toks.begin() + 7);
    alt_seq.insert(alt_seq.end(), other.begin(), other.end());
    EXPECT_LT(rel_diff(*alt, row(ref.decoder(ref.encoder(mw), alt_seq), 14)), 1e-5) << bs;
    rw->rewind(7);
    EXPECT_EQ(*rw->decode(std::span(toks).subspan(7), nullptr), at_once) << bs;
  }
}

TEST_F(WhisperCpu, BlocksGoBackOnRewindEncodeFailureAndSessionEnd) {
  auto pm = load(*dir_, paged(4));
  const auto mw = mel(pm->config(), 0);
  const auto toks = long_tokens();
  EXPECT_EQ(pm->kv_stats().total_blocks, 4 * 16);
  auto used = [&] { return pm->kv_stats().used_blocks; };
  {
    auto s = session(*pm);
    EXPECT_EQ(pm->kv_stats().sequences, 1U);
    EXPECT_EQ(used(), 0);  // blocks are taken as the session decodes
    ASSERT_TRUE(s->encode(mw, nullptr).ok());
    ASSERT_TRUE(s->decode(std::span(toks).subspan(0, 10), nullptr).ok());
    EXPECT_EQ(used(), 3);
    s->rewind(8);
    EXPECT_EQ(used(), 2);
    s->rewind(5);
    EXPECT_EQ(used(), 2);
    s->rewind(4);
    EXPECT_EQ(used(), 1);
    s->rewind(0);
    EXPECT_EQ(used(), 0);
    ASSERT_TRUE(s->decode(std::span(toks).subspan(0, 9), nullptr).ok());
    EXPECT_EQ(used(), 3);
    ASSERT_TRUE(s->encode(mw, nullptr).ok());  // a new window empties the decoder
    EXPECT_EQ(used(), 0);
    ASSERT_TRUE(s->decode(std::span(toks).subspan(0, 4), nullptr).ok());
    // A failed decode gives back the blocks it took (cancelled) or takes none (too long); the earlier ones stay.
    std::atomic<bool> cancel{true};
    EXPECT_EQ(s->decode(std::span(toks).subspan(4, 6), &cancel).error().code, Errc::cancelled);
    EXPECT_EQ(used(), 1);
    EXPECT_EQ(s->fed(), 4U);
    EXPECT_EQ(s->decode(std::vector<std::int32_t>(61, 5), nullptr).error().code, Errc::invalid_argument);
    EXPECT_EQ(used(), 1);
    ASSERT_TRUE(s->decode(std::span(toks).subspan(4, 6), nullptr).ok());
    EXPECT_EQ(used(), 3);
  }
  EXPECT_EQ(used(), 0);  // the session's end returns its blocks
  EXPECT_EQ(pm->kv_stats().sequences, 0U);
}

TEST_F(WhisperCpu, PoolExhaustionIsKvExhaustedAndTheSessionStaysUsable) {
  const auto mw = mel(m().config(), 10), mb = mel(m().config(), 14);
  const auto toks = long_tokens();
  // What a session alone gives for each window (the shared model: same weights and kernels, bit-identical).
  auto alone_for = [&](const std::vector<float>& w) {
    auto ref = session(m());
    EXPECT_TRUE(ref->encode(w, nullptr).ok());
    std::vector<std::vector<float>> out;
    for (std::size_t i = 0; i < 14; ++i) out.push_back(*ref->decode(std::span(toks).subspan(i, 1), nullptr));
    return out;
  };
  const auto alone = alone_for(mw), alone_b = alone_for(mb);

  auto pm = load(*dir_, paged(4, /*blocks=*/5));  // 20 tokens in all
  auto a = session(*pm), b = session(*pm);
  ASSERT_TRUE(a->encode(mw, nullptr).ok() && b->encode(mb, nullptr).ok());
  ASSERT_TRUE(a->decode(std::span(toks).subspan(0, 12), nullptr).ok());  // 3 blocks
  EXPECT_EQ(*b->decode(std::span(toks).subspan(0, 8), nullptr), alone_b[7]);  // 2 blocks: the pool is full
  EXPECT_EQ(pm->kv_stats().used_blocks, 5);
  auto full = b->decode(std::span(toks).subspan(8, 1), nullptr);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error().code, Errc::kv_exhausted) << full.error().message;
  EXPECT_NE(full.error().message.find("KV pool exhausted"), std::string::npos) << full.error().message;
  EXPECT_EQ(b->fed(), 8U);  // unchanged
  EXPECT_EQ(pm->kv_stats().used_blocks, 5);
  // A session made now has no block yet; its first decode is refused too.
  auto c = session(*pm);
  ASSERT_TRUE(c->encode(mw, nullptr).ok());
  EXPECT_EQ(c->decode(std::span(toks).subspan(0, 1), nullptr).error().code, Errc::kv_exhausted);
  // Within its blocks a session still decodes (positions 9..11 of a's third block, kept by the rewind).
  a->rewind(9);
  EXPECT_EQ(pm->kv_stats().used_blocks, 5);
  EXPECT_EQ(*a->decode(std::span(toks).subspan(9, 3), nullptr), alone[11]);
  // A rewind returns blocks; the refused session continues where it was, as if nothing had happened.
  a->rewind(4);
  EXPECT_EQ(pm->kv_stats().used_blocks, 3);
  for (std::size_t i = 8; i < 14; ++i) EXPECT_EQ(*b->decode(std::span(toks).subspan(i, 1), nullptr), alone_b[i]) << i;
  EXPECT_EQ(pm->kv_stats().used_blocks, 5);
  a.reset();  // a session's end frees its blocks for the others
  EXPECT_EQ(*c->decode(std::span(toks).subspan(0, 4), nullptr), alone[3]);
  b.reset();
  c.reset();
  EXPECT_EQ(pm->kv_stats().used_blocks, 0);

  // The default pool holds max_sessions full sessions: that many never see kv_exhausted, one more can.
  auto two = load(*dir_, paged(16, 0, 2));
  std::vector<std::unique_ptr<WhisperSession>> ss;
  for (int i = 0; i < 3; ++i) {
    ss.push_back(session(*two));
    ASSERT_TRUE(ss.back()->encode(mw, nullptr).ok());
  }
  EXPECT_TRUE(ss[0]->decode(std::vector<std::int32_t>(64, 5), nullptr).ok());
  EXPECT_TRUE(ss[1]->decode(std::vector<std::int32_t>(64, 5), nullptr).ok());
  EXPECT_EQ(ss[2]->decode(std::vector<std::int32_t>(1, 5), nullptr).error().code, Errc::kv_exhausted);
}

TEST_F(WhisperCpu, InterleavedPagedSessionsEqualEachAlone) {
  const auto toks = long_tokens();
  const std::vector<std::size_t> chunks{1, 3, 2, 5, 1, 4, 1, 1, 6, 2};  // 26 tokens per session
  std::vector<std::vector<float>> mels{mel(m().config(), 11), mel(m().config(), 12), mel(m().config(), 13)};
  auto pm = load(*dir_, paged(2));
  auto feed = [&](WhisperSession& s, std::size_t& at, std::size_t k) {
    auto r = s.decode(std::span(toks).subspan(at, chunks[k]), nullptr);
    EXPECT_TRUE(r.ok()) << r.error().message;
    at += chunks[k];
    return r.ok() ? *r : std::vector<float>{};
  };
  std::vector<std::vector<std::vector<float>>> alone(3);
  for (std::size_t j = 0; j < 3; ++j) {
    auto s = session(*pm);
    ASSERT_TRUE(s->encode(mels[j], nullptr).ok());
    std::size_t at = 0;
    for (std::size_t k = 0; k < chunks.size(); ++k) alone[j].push_back(feed(*s, at, k));
  }
  EXPECT_NE(alone[0].back(), alone[1].back());
  // Three sessions taking blocks of 2 in turn (their tables interleave in the pool), one rewinding and re-feeding.
  std::vector<std::unique_ptr<WhisperSession>> ss;
  std::vector<std::size_t> at(3, 0);
  for (std::size_t j = 0; j < 3; ++j) {
    ss.push_back(session(*pm));
    ASSERT_TRUE(ss[j]->encode(mels[j], nullptr).ok());
  }
  for (std::size_t k = 0; k < chunks.size(); ++k)
    for (std::size_t j : {2, 0, 1}) {
      EXPECT_EQ(feed(*ss[j], at[j], k), alone[j][k]) << "session " << j << ", chunk " << k;
      if (j == 1 && k == 5) {  // back to the end of chunk 2, then chunks 3..5 again
        ss[1]->rewind(6);
        at[1] = 6;
        for (std::size_t r = 3; r <= 5; ++r) EXPECT_EQ(feed(*ss[1], at[1], r), alone[1][r]) << "re-fed chunk " << r;
      }
    }
  EXPECT_EQ(pm->kv_stats().used_blocks, 3 * 13);
}

TEST_F(WhisperCpu, CancelledBetweenLayers) {
  const auto mw = mel(m().config(), 0);
  auto s = session(m());
  std::atomic<bool> cancel{true};
  auto e = s->encode(mw, &cancel);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code, Errc::cancelled);
  EXPECT_EQ(s->decode(kTokens, nullptr).error().code, Errc::invalid_argument);  // no window after a cancel
  ASSERT_TRUE(s->encode(mw, nullptr).ok());
  auto d = s->decode(kTokens, &cancel);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code, Errc::cancelled);
  EXPECT_EQ(s->fed(), 0U);
}

TEST_F(WhisperCpu, BadInputsAreInvalidArguments) {
  const WhisperConfig& c = m().config();
  auto s = session(m());
  EXPECT_EQ(s->decode(kTokens, nullptr).error().code, Errc::invalid_argument);  // before encode
  EXPECT_EQ(s->encode(std::vector<float>(100), nullptr).error().code, Errc::invalid_argument);
  EXPECT_EQ(s->encode(std::vector<float>(static_cast<std::size_t>(c.n_mels) * c.window_frames() - 1), nullptr).error().code,
            Errc::invalid_argument);
  ASSERT_TRUE(s->encode(mel(c, 0), nullptr).ok());
  EXPECT_EQ(s->decode(std::vector<std::int32_t>{}, nullptr).error().code, Errc::invalid_argument);
  EXPECT_EQ(s->decode(std::vector<std::int32_t>{297, 300}, nullptr).error().code, Errc::invalid_argument);
  EXPECT_EQ(s->decode(std::vector<std::int32_t>{-1}, nullptr).error().code, Errc::invalid_argument);
  EXPECT_EQ(s->fed(), 0U);
  EXPECT_EQ(s->decode(std::vector<std::int32_t>(65, 5), nullptr).error().code, Errc::invalid_argument);
  ASSERT_TRUE(s->decode(std::vector<std::int32_t>(60, 5), nullptr).ok());
  EXPECT_EQ(s->decode(std::vector<std::int32_t>(5, 5), nullptr).error().code, Errc::invalid_argument);
  EXPECT_TRUE(s->decode(std::vector<std::int32_t>(4, 5), nullptr).ok());  // exactly 64
  EXPECT_EQ(s->fed(), 64U);
}

TEST(Whisper, ProjOutAndScaledEmbeddingsFollowTheReference) {
  // A copy of a model with scale_embedding true and an untied proj_out.weight.
  const std::string src = write_model("variant-src");
  const std::string dir = tmp_dir("variant");
  std::string cfg = read(src + "/config.json");
  cfg.replace(cfg.find("\"scale_embedding\": false"), 24, "\"scale_embedding\": true");
  { std::ofstream(dir + "/config.json") << cfg; }
  auto f = weights::SafetensorsFile::open(src + "/model.safetensors");
  ASSERT_TRUE(f.ok());
  std::vector<weights::TensorToWrite> ts;
  for (const auto& t : f->tensors()) ts.push_back({t.name, t.dtype, t.shape, f->bytes(t)});
  std::vector<float> proj(300 * 32);
  for (std::size_t i = 0; i < proj.size(); ++i) proj[i] = 0.05F * std::sin(0.1F * static_cast<float>(i));
  ts.push_back({"proj_out.weight", weights::DType::f32, {300, 32}, std::as_bytes(std::span(proj))});
  ASSERT_TRUE(weights::write_safetensors(dir + "/model.safetensors", ts).ok());
  auto base = load(src), m = load(dir);
  ASSERT_TRUE(base && m);
  EXPECT_TRUE(m->config().scale_embedding);
  EXPECT_NE(m->fingerprint(), base->fingerprint());
  const Ref ref = reference(dir);
  const auto mw = mel(m->config(), 5);
  auto s = session(*m);
  ASSERT_TRUE(s->encode(mw, nullptr).ok());
  auto got = s->decode(kTokens, nullptr);
  ASSERT_TRUE(got.ok());
  EXPECT_LT(rel_diff(*got, row(ref.decoder(ref.encoder(mw), kTokens), 9)), 1e-5);
  auto bs = session(*base);
  ASSERT_TRUE(bs->encode(mw, nullptr).ok());
  EXPECT_GT(rel_diff(*bs->decode(kTokens, nullptr), *got), 1e-2);
}

TEST(Whisper, MalformedConfigsAndTensorsAreTypedErrors) {
  const std::string dir = write_model("malformed");
  const std::string base = read(dir + "/config.json");
  ASSERT_TRUE(weights::parse_whisper_config(base).ok());
  auto expect = [](const std::string& text, Errc code, const std::string& key) {
    test::expect_parse_error([](const std::string& t) { return weights::parse_whisper_config(t); }, text, code, key);
  };
  auto edit = [&](const std::string& from, const std::string& to) { return test::edited(base, from, to); };
  expect("{", Errc::parse_error, "config.json");
  expect(edit("\"activation_function\": \"gelu\"", "\"activation_function\": \"relu\""), Errc::unsupported, "activation_function");
  expect(edit("\"model_type\": \"whisper\"", "\"model_type\": \"llama\""), Errc::unsupported, "model_type");
  expect(edit("\"d_model\": 32,", ""), Errc::format_error, "d_model");
  expect(edit("\"encoder_attention_heads\": 2", "\"encoder_attention_heads\": 3"), Errc::format_error, "encoder_attention_heads");
  expect(edit("\"vocab_size\": 300", "\"vocab_size\": \"300\""), Errc::format_error, "vocab_size");
  expect(edit("\"decoder_start_token_id\": 297", "\"decoder_start_token_id\": 300"), Errc::format_error, "decoder_start_token_id");
  expect(edit("\"scale_embedding\": false", "\"scale_embedding\": 1"), Errc::format_error, "scale_embedding");

  auto f = weights::SafetensorsFile::open(dir + "/model.safetensors");
  ASSERT_TRUE(f.ok());
  auto rewrite = [&](const std::string& name, const std::string& drop, std::vector<std::int64_t> shape) {
    const std::string d = tmp_dir(name);
    test::write_rewritten(*f, dir + "/config.json", d, drop, shape);
    return WhisperModel::load(d, {});
  };
  for (const char* name : {"model.decoder.layers.1.encoder_attn.v_proj.bias", "model.encoder.conv2.weight",
                           "model.decoder.embed_positions.weight"}) {
    auto missing = rewrite("missing", name, {});
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.error().code, Errc::format_error);
    EXPECT_NE(missing.error().message.find(name), std::string::npos) << missing.error().message;
  }
  auto shape = rewrite("shape", "model.encoder.conv1.weight", {32, 40, 3});
  ASSERT_FALSE(shape.ok());
  EXPECT_EQ(shape.error().code, Errc::format_error);
  EXPECT_NE(shape.error().message.find("model.encoder.conv1.weight"), std::string::npos);
  auto none = WhisperModel::load(tmp_dir("empty"), {});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, Errc::not_found);
  WhisperLoadOptions bad;
  bad.threads = 0;
  EXPECT_EQ(WhisperModel::load(dir, bad).error().code, Errc::invalid_argument);
  for (auto edit : {+[](WhisperLoadOptions& o) { o.kv_block_size = 0; }, +[](WhisperLoadOptions& o) { o.kv_block_size = 4097; },
                    +[](WhisperLoadOptions& o) { o.max_sessions = 0; }, +[](WhisperLoadOptions& o) { o.kv_blocks = -1; }}) {
    WhisperLoadOptions o;
    edit(o);
    EXPECT_EQ(WhisperModel::load(dir, o).error().code, Errc::invalid_argument);
  }
}

TEST(Whisper, ThreadCountAndDtypes) {
  const std::string dir = write_model("threads");
  WhisperLoadOptions o2;
  o2.threads = 2;
  auto m1 = load(dir), m2 = load(dir, o2);
  const auto mw = mel(m1->config(), 7);
  auto a = session(*m1), b = session(*m2);
  ASSERT_TRUE(a->encode(mw, nullptr).ok() && b->encode(mw, nullptr).ok());
  EXPECT_EQ(*a->decode(kTokens, nullptr), *b->decode(kTokens, nullptr));  // bit-identical across thread counts
  WhisperLoadOptions ob;
  ob.dtype = ComputeDType::bf16;
  auto mb = load(dir, ob);
  EXPECT_GT(mb->stats().resident_copy_bytes, 0U);
  EXPECT_NE(mb->fingerprint(), m1->fingerprint());
  auto c = session(*mb);
  ASSERT_TRUE(c->encode(mw, nullptr).ok());
  a->rewind(0);
  EXPECT_LT(rel_diff(*c->decode(kTokens, nullptr), *a->decode(kTokens, nullptr)), 0.05);
}

TEST(Whisper, GgufF32IsIdenticalAndQuantizedIsClose) {
  const std::string dir = write_model("gguf");
  auto hf = load(dir);
  const auto mw = mel(hf->config(), 8);
  auto hs = session(*hf);
  ASSERT_TRUE(hs->encode(mw, nullptr).ok());
  const auto want = *hs->decode(kTokens, nullptr);
  const auto want_enc = *hf->encoder_output(mw);
  struct Case { modelgen::Recipe r; double tol; };
  for (const Case& c : {Case{modelgen::Recipe::f32, 0.0}, Case{modelgen::Recipe::f16, 0.02}, Case{modelgen::Recipe::q8_0, 0.05}}) {
    const std::string name = std::string(modelgen::recipe_name(c.r));
    const std::string g = tmp_dir("gguf-" + name) + "/model.gguf";
    auto st = modelgen::convert_whisper_to_gguf(dir, g, c.r);
    ASSERT_TRUE(st.ok()) << st.error().message;
    auto m = load(fs::path(g).parent_path().string());  // a directory holding one .gguf
    ASSERT_TRUE(m) << name;
    EXPECT_EQ(m->config().vocab, hf->config().vocab);
    EXPECT_EQ(m->config().decoder_start_id, hf->config().decoder_start_id);
    EXPECT_EQ(m->config().target_positions, 64);
    auto s = session(*m);
    ASSERT_TRUE(s->encode(mw, nullptr).ok());
    const auto got = *s->decode(kTokens, nullptr);
    if (c.tol == 0) {
      EXPECT_EQ(got, want);
      EXPECT_EQ(*m->encoder_output(mw), want_enc);
    } else {
      EXPECT_LT(m->stats().weight_bytes, hf->stats().weight_bytes) << name;
      EXPECT_LT(rel_diff(got, want), c.tol) << name;
      EXPECT_GT(rel_diff(got, want), 0.0) << name;
    }
  }
  EXPECT_EQ(modelgen::convert_whisper_to_gguf(dir, tmp_dir("gguf-q4") + "/m.gguf", modelgen::Recipe::q4_0).error().code,
            Errc::unsupported);
}

TEST(Whisper, TestModelWithTokenizer) {
  const std::string dir = tmp_dir("with-tokenizer");
  modelgen::WhisperWriteOptions o;
  o.shape = test_shape();
  auto shape = modelgen::write_whisper_test_model(dir, o, modelgen::whisper_test_corpus(), {400, 3});
  ASSERT_TRUE(shape.ok()) << shape.error().message;
  EXPECT_TRUE(fs::exists(dir + "/tokenizer.json"));
  // 400 text tokens at most + eot, sot, 3 languages, 6 task/control tokens, 1501 timestamps.
  EXPECT_GT(shape->vocab, 1501 + 11);
  EXPECT_LE(shape->vocab, 400 + 1501 + 11);
  EXPECT_EQ(shape->decoder_start_id, shape->eos_id + 1);
  EXPECT_EQ(shape->no_timestamps_id, shape->vocab - 1502);
  auto m = load(dir);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->config().vocab, shape->vocab);
  EXPECT_EQ(m->config().decoder_start_id, shape->decoder_start_id);
  auto s = session(*m);
  ASSERT_TRUE(s->encode(mel(m->config(), 0), nullptr).ok());
  const std::vector<std::int32_t> prompt{shape->decoder_start_id, shape->decoder_start_id + 1, shape->vocab - 1503,
                                         shape->no_timestamps_id};
  auto logits = s->decode(prompt, nullptr);
  ASSERT_TRUE(logits.ok()) << logits.error().message;
  EXPECT_EQ(logits->size(), static_cast<std::size_t>(shape->vocab));
}

// Timings (a log line, no assertion): one window's encode and per-token decode on the CPU, 1 and 2 threads.
void log_timings(const std::string& preset) {
  const std::string dir = write_model("timing-" + preset, *modelgen::whisper_preset(preset));
  for (int threads : {1, 2}) {
    WhisperLoadOptions o;
    o.threads = threads;
    auto m = load(dir, o);
    ASSERT_TRUE(m);
    const auto mw = mel(m->config(), 0);
    auto s = session(*m);
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(s->encode(mw, nullptr).ok());
    const auto t1 = std::chrono::steady_clock::now();
    const int n = 32;
    std::int32_t tok = m->config().decoder_start_id;
    for (int i = 0; i < n; ++i) ASSERT_TRUE(s->decode(std::span(&tok, 1), nullptr).ok());
    const auto t2 = std::chrono::steady_clock::now();
    std::printf("[timing] %s threads=%d encode %.1f ms, decode %.2f ms/token, session_bytes %.1f MiB\n", preset.c_str(),
                threads, std::chrono::duration<double, std::milli>(t1 - t0).count(),
                std::chrono::duration<double, std::milli>(t2 - t1).count() / n,
                static_cast<double>(m->session_bytes()) / 1048576.0);
  }
}

TEST(Whisper, TimingsWhisperTest) { log_timings("whisper-test"); }
// Run with --gtest_also_run_disabled_tests (random weights, ~150 MB).
TEST(Whisper, DISABLED_TimingsWhisperTiny) { log_timings("whisper-tiny"); }

}  // namespace
}  // namespace tandem::engine
