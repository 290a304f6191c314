#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "engine/generation.h"
#include "model_fixture.h"

using namespace tandem;
using namespace tandem::testing;

namespace {

struct Run {
  std::vector<engine::TokenId> tokens;
  std::vector<engine::TokenEvent> events;
  std::string text;
  engine::FinishReason reason = engine::FinishReason::running;
};

Run run(std::shared_ptr<engine::Model> m, engine::GenerateRequest req) {
  Run r;
  auto g = engine::generate(std::move(m), std::move(req), [&](const engine::TokenEvent& ev) {
    r.events.push_back(ev);
    return true;
  });
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message);
  if (!g.ok()) return r;
  r.tokens = (*g)->tokens();
  r.text = (*g)->text();
  r.reason = (*g)->finish_reason();
  return r;
}

engine::GenerateRequest sampled_request(const engine::Model& m, int n = 24) {
  engine::GenerateRequest req;
  req.prompt = m.encode_text("Once upon a time, in a small village,");
  req.max_new_tokens = n;
  req.stop_at_eos = false;
  req.sampling.temperature = 0.9;
  req.sampling.top_k = 50;
  req.sampling.top_p = 0.95;
  req.sampling.repetition_penalty = 1.1;
  req.sampling.seed = 1234;
  return req;
}

}  // namespace

TEST(Generation, SameSeedSameTokensOtherSeedOtherTokens) {
  auto m = load(make_model("f32"));
  const auto a = run(m, sampled_request(*m));
  const auto b = run(m, sampled_request(*m));
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.tokens.size(), 24u);
  EXPECT_EQ(a.reason, engine::FinishReason::max_tokens);
  auto req = sampled_request(*m);
  req.sampling.seed = 4321;
  EXPECT_NE(run(m, req).tokens, a.tokens);
}

TEST(Generation, CheckpointResumeContinuesIdentically) {
  const std::string dir = make_model("f32");
  auto m = load(dir);
  const auto full = run(m, sampled_request(*m));
  ASSERT_EQ(full.tokens.size(), 24u);
  // Resume on another replica of the same files with a different KV block size (another process would do the same).
  engine::LoadOptions lo;
  lo.kv_block_size = 5;
  auto other = load(dir, lo);
  for (std::size_t n : {0u, 1u, 5u, 13u, 23u, 24u}) {
    auto req = sampled_request(*other);
    req.resume_tokens.assign(full.tokens.begin(), full.tokens.begin() + static_cast<long>(n));
    const auto resumed = run(other, req);
    EXPECT_EQ(resumed.tokens, full.tokens) << "resumed after " << n;
    std::string before;
    for (const auto& ev : full.events)
      if (ev.step < n) before += ev.text;
    EXPECT_EQ(before + resumed.text, full.text) << "text after resuming at " << n;
    for (const auto& ev : resumed.events) EXPECT_GE(ev.step, n);
  }
  EXPECT_EQ(other->kv_stats().used_blocks, 0);
}

TEST(Generation, StreamedTextEqualsFullDecode) {
  auto m = load(make_model("f32"));
  auto req = sampled_request(*m, 40);
  const auto r = run(m, req);
  std::string streamed;
  for (const auto& ev : r.events) streamed += ev.text;
  EXPECT_EQ(streamed, r.text);
  // The generated text continues the prompt's: decode(prompt + tokens) = decode(prompt) + text.
  std::vector<engine::TokenId> all = req.prompt;
  all.insert(all.end(), r.tokens.begin(), r.tokens.end());
  EXPECT_EQ(m->tokenizer().decode(req.prompt) + r.text, m->tokenizer().decode(all));
}

TEST(Generation, StopStringAcrossTokensIsNeverEmitted) {
  auto m = load(make_model("f32"));
  auto req = sampled_request(*m, 40);
  const auto r = run(m, req);
  // A stop string made of the end of one token's text and the start of the next one's.
  std::string stop;
  for (std::size_t i = 5; i + 1 < r.events.size() && stop.empty(); ++i) {
    const auto& a = r.events[i].text;
    const auto& b = r.events[i + 1].text;
    if (a.size() >= 2 && b.size() >= 2) stop = a.substr(a.size() - 2) + b.substr(0, 2);
  }
  ASSERT_FALSE(stop.empty());
  req.stop_strings = {stop};
  const auto s = run(m, req);
  EXPECT_EQ(s.reason, engine::FinishReason::stop_string);
  EXPECT_EQ(s.text, r.text.substr(0, r.text.find(stop)));
  std::string streamed;
  for (const auto& ev : s.events) streamed += ev.text;
  EXPECT_EQ(streamed, s.text);
  EXPECT_EQ(streamed.find(stop), std::string::npos);
}

TEST(Generation, ChunkedPrefillIsExactOnTheCpu) {
  // On the CPU every row of a chunk goes through row-independent kernels, its attention through the decode row's
  // (docs/engine.md), so any chunking gives the same tokens and the same logits bit for bit (on an accelerator:
  // within rounding; test_batch.cc has every position's logits).
  auto m = load(make_model("f32"));
  auto req = sampled_request(*m);
  req.sampling = {};
  const auto whole = run(m, req);
  for (int chunk : {1, 3, 7}) {
    req.prefill_chunk = chunk;
    EXPECT_EQ(run(m, req).tokens, whole.tokens) << chunk;
  }
  auto s1 = m->new_sequence();
  auto s2 = m->new_sequence();
  auto a = m->forward(**s1, req.prompt);
  std::vector<float> b;
  for (auto t : req.prompt) b = *m->forward(**s2, std::span(&t, 1));
  EXPECT_EQ(*a, b);
}

TEST(Generation, ExactResumeAtTemperatureOneManySeedsAndPoints) {
  // No top-k: all 32000 candidates are sorted, so any rounding difference between the original decode and the
  // resume would show up as a different draw.
  auto m = load(make_model("f32"));
  for (std::uint64_t seed : {1u, 7u, 42u, 99u, 1234u}) {
    auto req = sampled_request(*m, 40);
    req.sampling = {};
    req.sampling.temperature = 1.0;
    req.sampling.seed = seed;
    const auto full = run(m, req);
    for (std::size_t k : {1u, 5u, 17u, 33u, 39u}) {
      auto r = req;
      r.resume_tokens.assign(full.tokens.begin(), full.tokens.begin() + static_cast<long>(k));
      EXPECT_EQ(run(m, r).tokens, full.tokens) << "seed " << seed << " resumed at " << k;
    }
  }
}

TEST(Generation, CheckpointsUpToTheEndOfTheContextResume) {
  engine::LoadOptions lo;
  lo.max_context = 16;
  auto m = load(make_model("f32"), lo);
  auto req = sampled_request(*m, 16);
  const auto full = run(m, req);
  ASSERT_EQ(full.reason, engine::FinishReason::context_full);
  ASSERT_EQ(full.tokens.size() + req.prompt.size(), 17u);
  for (std::size_t back : {0u, 1u, 2u}) {
    auto r = req;
    r.resume_tokens.assign(full.tokens.begin(), full.tokens.end() - static_cast<long>(back));
    const auto res = run(m, r);
    EXPECT_EQ(res.tokens, full.tokens) << back;
    EXPECT_EQ(res.reason, engine::FinishReason::context_full) << back;
  }
  auto too_long = req;
  too_long.resume_tokens = full.tokens;
  too_long.resume_tokens.push_back(5);
  EXPECT_EQ(engine::Generation::create(m, too_long).error().code, Errc::invalid_argument);
}

TEST(Generation, CancelReleasesEveryBlock) {
  auto m = load(make_model("f32"));
  int seen = 0;
  auto g = engine::generate(m, sampled_request(*m), [&](const engine::TokenEvent&) { return ++seen < 3; });
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)->finish_reason(), engine::FinishReason::cancelled);
  EXPECT_EQ((*g)->tokens().size(), 3u);
  EXPECT_EQ(m->kv_stats().used_blocks, 0);
  // Cancel before prefill too.
  auto g2 = engine::Generation::create(m, sampled_request(*m));
  ASSERT_TRUE(g2.ok());
  (*g2)->cancel();
  EXPECT_TRUE((*g2)->finished());
  EXPECT_EQ((*g2)->step().error().code, Errc::illegal_transition);
  EXPECT_EQ(m->kv_stats().used_blocks, 0);
}

TEST(Generation, KvExhaustionDuringDecodeIsTypedAndReleases) {
  engine::LoadOptions lo;
  lo.kv_block_size = 4;
  lo.kv_blocks = 5;  // 20 tokens
  auto m = load(make_model("f32"), lo);
  auto req = sampled_request(*m, 30);
  ASSERT_LT(req.prompt.size(), 20u);
  auto g = engine::Generation::create(m, req);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE((*g)->prefill().ok());
  Error err;
  int produced = 0;
  while (!(*g)->finished()) {
    auto ev = (*g)->step();
    if (!ev.ok()) {
      err = ev.error();
      break;
    }
    ++produced;
  }
  EXPECT_EQ(err.code, Errc::kv_exhausted) << err.message;
  EXPECT_EQ((*g)->finish_reason(), engine::FinishReason::error);
  EXPECT_EQ(static_cast<std::size_t>(produced) + req.prompt.size(), 20u);
  EXPECT_EQ(m->kv_stats().used_blocks, 0);
  // The tokens so far are a checkpoint: with a bigger pool the request resumes and matches an uninterrupted run.
  auto big = load(make_model("f32"));
  auto resume = sampled_request(*big, 30);
  resume.resume_tokens = (*g)->tokens();
  EXPECT_EQ(run(big, resume).tokens, run(big, sampled_request(*big, 30)).tokens);
}

TEST(Generation, ContextFullEndsCleanly) {
  engine::LoadOptions lo;
  lo.max_context = 16;
  auto m = load(make_model("f32"), lo);
  auto req = sampled_request(*m, 16);
  const auto r = run(m, req);
  EXPECT_EQ(r.reason, engine::FinishReason::context_full);
  EXPECT_EQ(r.tokens.size() + req.prompt.size(), 17u);  // the last sampled token needs no cache slot
}

TEST(Generation, RequestValidation) {
  auto m = load(make_model("f32"));
  struct Case {
    std::string what;
    std::function<void(engine::GenerateRequest&)> mutate;
  };
  const std::vector<Case> cases{
      {"empty prompt", [](auto& r) { r.prompt.clear(); }},
      {"zero max tokens", [](auto& r) { r.max_new_tokens = 0; }},
      {"huge max tokens", [](auto& r) { r.max_new_tokens = 1 << 20; }},
      {"bad temperature", [](auto& r) { r.sampling.temperature = -1; }},
      {"bad top_p", [](auto& r) { r.sampling.top_p = 2; }},
      {"too many stops", [](auto& r) { r.stop_strings.assign(17, "x"); }},
      {"long stop", [](auto& r) { r.stop_strings = {std::string(300, 'x')}; }},
      {"checkpoint longer than max", [](auto& r) { r.resume_tokens.assign(30, 5); }},
      {"checkpoint token out of vocab", [](auto& r) { r.resume_tokens = {40000}; }},
      {"negative chunk", [](auto& r) { r.prefill_chunk = -1; }},
  };
  for (const auto& c : cases) {
    auto req = sampled_request(*m);
    c.mutate(req);
    auto g = engine::Generation::create(m, req);
    ASSERT_FALSE(g.ok()) << c.what;
    EXPECT_EQ(g.error().code, Errc::invalid_argument) << c.what;
  }
  EXPECT_EQ(m->kv_stats().sequences, 0u);
}

// A model whose residual dimension 0 is a constant 1 and whose LM head reads only that dimension, with a positive
// weight for EOS (id 2): greedy decoding must emit EOS first.
TEST(Generation, EosEndsTheGenerationAndIsNotEmitted) {
  modelgen::Options o;
  o.shape = *modelgen::preset("test");
  o.tokenizer_model = tokenizer_path();
  const int H = o.shape.hidden;
  o.source = [H](const std::string& name, std::vector<float>& v) {
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.02f * static_cast<float>(std::sin(0.37 * static_cast<double>(i) + static_cast<double>(name.size())));
    if (name.find("norm") != std::string::npos) std::fill(v.begin(), v.end(), 1.0f);
    if (name == "model.embed_tokens.weight")
      for (std::size_t r = 0; r < v.size() / static_cast<std::size_t>(H); ++r) v[r * static_cast<std::size_t>(H)] = 1.0f;
    if (name.find("o_proj") != std::string::npos || name.find("down_proj") != std::string::npos)  // [H, k]
      std::fill(v.begin(), v.begin() + static_cast<long>(v.size() / static_cast<std::size_t>(H)), 0.0f);  // row 0
    if (name == "lm_head.weight") {
      std::fill(v.begin(), v.end(), 0.0f);
      v[2 * static_cast<std::size_t>(H)] = 5.0f;  // logit(EOS) = 5 * h0 > 0, every other logit 0
    }
  };
  const std::string dir = temp_root() + "/eos-model";
  ASSERT_TRUE(modelgen::write_model(dir, o).ok());
  auto m = load(dir);
  engine::GenerateRequest req;
  req.prompt = m->encode_text("Hello");
  req.max_new_tokens = 5;
  auto r = run(m, req);
  EXPECT_EQ(r.reason, engine::FinishReason::eos);
  EXPECT_EQ(r.tokens, std::vector<engine::TokenId>{2});
  EXPECT_EQ(r.text, "");
  req.stop_at_eos = false;
  r = run(m, req);
  EXPECT_EQ(r.reason, engine::FinishReason::max_tokens);
  EXPECT_EQ(r.tokens, std::vector<engine::TokenId>(5, 2));
  EXPECT_EQ(r.text, "");  // a control token has no text
}

// A model copy whose EOS set includes the token greedy decoding produces at step 6, and a stop string whose first
// character ends step 5's text: at EOS, the held-back character must still reach the client.
TEST(Generation, TextHeldBackForAStopStringIsReleasedAtEos) {
  const std::string src = make_model("f32");
  auto m = load(src);
  engine::GenerateRequest req;
  req.prompt = m->encode_text("Once upon a time");
  req.max_new_tokens = 12;
  req.stop_at_eos = false;
  const auto plain = run(m, req);
  ASSERT_GE(plain.events.size(), 7u);
  const engine::TokenId eos_tok = plain.tokens[6];
  std::string upto;
  for (int i = 0; i < 6; ++i) upto += plain.events[static_cast<std::size_t>(i)].text;
  ASSERT_FALSE(upto.empty());
  const std::string dir = temp_root() + "/eos-at-6";
  std::filesystem::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.model", "tokenizer_config.json"})
    std::filesystem::copy_file(src + "/" + f, dir + "/" + f, std::filesystem::copy_options::overwrite_existing);
  std::ofstream(dir + "/generation_config.json") << "{\"bos_token_id\": 1, \"eos_token_id\": [2, " << eos_tok << "]}";
  auto m2 = load(dir);
  auto req2 = req;
  req2.stop_at_eos = true;
  req2.stop_strings = {upto.substr(upto.size() - 1) + "\x01QQ"};  // never completes; its first byte is held
  const auto r = run(m2, req2);
  EXPECT_EQ(r.reason, engine::FinishReason::eos);
  EXPECT_EQ(r.tokens.size(), 7u);
  std::string streamed;
  for (const auto& ev : r.events) streamed += ev.text;
  EXPECT_EQ(streamed, upto);
  EXPECT_EQ(r.text, upto);
  // A checkpoint that already holds everything (ends with EOS) finishes in prefill and still delivers its text.
  auto req3 = req2;
  req3.resume_tokens.assign(r.tokens.begin(), r.tokens.begin() + 3);
  const auto r3 = run(m2, req3);
  EXPECT_EQ(r3.tokens, r.tokens);
}
