// Continuous batching: Model::forward_batch and the BatchRunner. The guarantee under test: a sequence's logits, and
// so its sampled tokens, do not depend on which other sequences shared its steps (row-independent kernels,
// per-item attention, prompt chunks cut the same way whatever the batch) — on f32 and on a quantized type (q8_0,
// through GGUF), greedy and seeded sampling, and on the simulated accelerator. Also: the step budget keeps the
// others decoding during a long prefill, cancellation, a per-item error, a failed step.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>

#include "device/simulated.h"
#include "engine/batch_runner.h"
#include "engine/generation.h"
#include "model_fixture.h"
#include "modelgen/gguf_convert.h"

namespace tandem {
namespace {

using namespace tandem::testing;

std::string q8_model() {
  static const std::string path = [] {
    const std::string out = temp_root() + "/batch-q8_0.gguf";
    auto st = modelgen::convert_to_gguf(make_model("batch-f32"), out, modelgen::Recipe::q8_0, 1);
    EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message);
    return out;
  }();
  return path;
}

engine::LoadOptions opts(int threads, int sequences = 8) {
  engine::LoadOptions lo;
  lo.threads = threads;
  lo.max_sequences = sequences;
  lo.max_context = 256;
  return lo;
}

std::vector<std::vector<engine::TokenId>> prompts(const engine::Model& m) {
  return {m.encode_text("The GPU ran out of memory while"), m.encode_text("Once upon a time"),
          m.encode_text("A long prompt about the weather in the mountains, where it rains and snows and the wind "
                        "never stops blowing over the high passes all year long"),
          m.encode_text("Hello"), m.encode_text("Tandem fails over to the CPU")};
}

// --- forward_batch: bit-identical logits ---------------------------------------------------------------------------

struct BatchCase {
  std::string name;
  bool quantized;
  int threads;
  const char* preset = "test";  // f32 models: the architecture (Gemma: GELU-tanh, post-norms, soft caps, two RoPE bases)
  engine::KvCacheType kv = engine::KvCacheType::f32;  // the CPU layers' KV cache
};

std::string f32_model(const char* preset) {
  return std::string(preset) == "test" ? make_model("batch-f32") : make_model(std::string("batch-") + preset, preset);
}

class ForwardBatch : public ::testing::TestWithParam<BatchCase> {};

TEST_P(ForwardBatch, EachItemsLogitsEqualItsForwardAlone) {
  const auto& p = GetParam();
  engine::LoadOptions lo = opts(p.threads);
  lo.cpu_kv = p.kv;
  auto m = load(p.quantized ? q8_model() : f32_model(p.preset), lo);
  ASSERT_TRUE(m);
  const auto ps = prompts(*m);
  // Alone: each prompt as one prefill, then 3 decode steps feeding fixed tokens.
  const std::vector<engine::TokenId> feed{5, 17, 301};
  std::vector<std::vector<std::vector<float>>> alone(ps.size());
  for (std::size_t i = 0; i < ps.size(); ++i) {
    auto seq = m->new_sequence();
    ASSERT_TRUE(seq.ok());
    auto l = m->forward(**seq, ps[i]);
    ASSERT_TRUE(l.ok());
    alone[i].push_back(*l);
    for (auto t : feed) {
      l = m->forward(**seq, std::vector<engine::TokenId>{t});
      ASSERT_TRUE(l.ok());
      alone[i].push_back(*l);
    }
  }
  // Batched, staggered: sequence i starts at step i, so prefills and decodes are mixed in every step.
  std::vector<std::unique_ptr<engine::Sequence>> seqs;
  for (std::size_t i = 0; i < ps.size(); ++i) seqs.push_back(std::move(m->new_sequence()).value());
  std::vector<std::size_t> done(ps.size(), 0);
  for (std::size_t step = 0; step < ps.size() + feed.size() + 1; ++step) {
    std::vector<engine::Model::BatchItem> items;
    std::vector<std::size_t> who;
    for (std::size_t i = 0; i < ps.size() && i <= step; ++i) {
      if (done[i] > feed.size()) continue;
      if (done[i] == 0)
        items.push_back({seqs[i].get(), ps[i], false});
      else
        items.push_back({seqs[i].get(), std::span(&feed[done[i] - 1], 1), false});
      who.push_back(i);
    }
    if (items.empty()) continue;
    auto out = m->forward_batch(items);
    ASSERT_TRUE(out.ok()) << out.error().message;
    for (std::size_t k = 0; k < items.size(); ++k) {
      const std::size_t i = who[k];
      ASSERT_TRUE((*out)[k].ok()) << (*out)[k].error().message;
      EXPECT_EQ(*(*out)[k], alone[i][done[i]]) << p.name << ": sequence " << i << ", forward " << done[i]
                                              << " in a batch of " << items.size();
      ++done[i];
    }
  }
}

// A prompt's logits do not depend on how it is cut: on the CPU every row of a chunk takes its attention through the
// decode row's kernel (Model::Impl::attention_rows), and the matmuls and row operations are row-independent, so the
// prompt in one forward, in chunks of 7, and token by token give every position the same logits bit for bit — and
// so do 1 and 2 threads (the 2-thread cases compare against a 1-thread replica of the same file).
TEST_P(ForwardBatch, APromptsLogitsDoNotDependOnItsChunks) {
  const auto& p = GetParam();
  engine::LoadOptions lo = opts(p.threads);
  lo.cpu_kv = p.kv;
  const std::string file = p.quantized ? q8_model() : f32_model(p.preset);
  auto m = load(file, lo);
  ASSERT_TRUE(m);
  const auto prompt = prompts(*m)[2];
  ASSERT_GE(prompt.size(), 20U);
  const auto vocab = static_cast<std::size_t>(m->config().vocab_size);
  auto whole_seq = m->new_sequence();
  ASSERT_TRUE(whole_seq.ok());
  const auto whole = m->forward(**whole_seq, prompt, true);
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  ASSERT_EQ(whole->size(), prompt.size() * vocab);
  const auto at = [&](std::size_t pos) {
    return std::vector<float>(whole->begin() + static_cast<long>(pos * vocab),
                              whole->begin() + static_cast<long>((pos + 1) * vocab));
  };
  for (std::size_t chunk : {std::size_t{7}, std::size_t{1}}) {
    auto seq = m->new_sequence();
    ASSERT_TRUE(seq.ok());
    for (std::size_t b = 0; b < prompt.size(); b += chunk) {
      const std::size_t n = std::min(chunk, prompt.size() - b);
      const auto l = m->forward(**seq, std::span(prompt).subspan(b, n), true);
      ASSERT_TRUE(l.ok()) << l.error().message;
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_TRUE(std::equal(l->begin() + static_cast<long>(i * vocab), l->begin() + static_cast<long>((i + 1) * vocab),
                               at(b + i).begin()))
            << p.name << ": position " << b + i << " in chunks of " << chunk << " differs from the whole prompt's";
    }
  }
  if (p.threads > 1) {
    engine::LoadOptions one = lo;
    one.threads = 1;
    auto m1 = load(file, one);
    ASSERT_TRUE(m1);
    auto seq = m1->new_sequence();
    ASSERT_TRUE(seq.ok());
    const auto l = m1->forward(**seq, prompt, true);
    ASSERT_TRUE(l.ok());
    EXPECT_TRUE(*l == *whole) << p.name << ": 1 thread and " << p.threads << " give different logits";
  }
}

INSTANTIATE_TEST_SUITE_P(Types, ForwardBatch,
                         ::testing::Values(BatchCase{"f32_1thread", false, 1}, BatchCase{"f32_2threads", false, 2},
                                           BatchCase{"q8_0_1thread", true, 1}, BatchCase{"q8_0_2threads", true, 2},
                                           BatchCase{"gemma2_f32", false, 2, "gemma2"},
                                           BatchCase{"gemma3_f32", false, 2, "gemma3"},
                                           BatchCase{"f32_kv_f16", false, 1, "test", engine::KvCacheType::f16},
                                           BatchCase{"q8_0_2threads_kv_f16", true, 2, "test", engine::KvCacheType::f16}),
                         [](const auto& i) { return i.param.name; });

TEST(ForwardBatch, AllLogitsItemsAndPerItemErrors) {
  engine::LoadOptions lo = opts(1);
  lo.kv_blocks = 3;  // 48 positions in all
  lo.kv_block_size = 16;
  auto m = load(make_model("batch-f32"), lo);
  ASSERT_TRUE(m);
  const auto a = m->encode_text("Once upon a time");
  std::vector<engine::TokenId> big(40, 100);  // needs 3 blocks: more than what is left once `a` holds one
  std::vector<engine::TokenId> bad{1, m->config().vocab_size + 5};
  auto s1 = std::move(m->new_sequence()).value();
  auto s2 = std::move(m->new_sequence()).value();
  auto s3 = std::move(m->new_sequence()).value();
  std::vector<engine::Model::BatchItem> items{{s1.get(), a, true}, {s2.get(), big, false}, {s3.get(), bad, false}};
  auto out = m->forward_batch(items);
  ASSERT_TRUE(out.ok()) << out.error().message;
  ASSERT_TRUE((*out)[0].ok());
  EXPECT_EQ((*out)[0]->size(), a.size() * static_cast<std::size_t>(m->config().vocab_size));
  ASSERT_FALSE((*out)[1].ok());
  EXPECT_EQ((*out)[1].error().code, Errc::kv_exhausted);
  ASSERT_FALSE((*out)[2].ok());
  EXPECT_EQ((*out)[2].error().code, Errc::invalid_argument);
  EXPECT_EQ(s1->length(), static_cast<std::int64_t>(a.size()));
  EXPECT_EQ(s2->length(), 0);
  EXPECT_EQ(s3->length(), 0);
  // all_logits rows equal the reference forward of the same tokens
  auto ref = m->forward_reference(a);
  ASSERT_TRUE(ref.ok());
  EXPECT_LT(max_abs_diff(*ref, *(*out)[0]), 1e-4F);
  // the same sequence twice in one batch is refused for the second
  const std::vector<engine::TokenId> one{7};
  std::vector<engine::Model::BatchItem> twice{{s1.get(), one, false}, {s1.get(), one, false}};
  out = m->forward_batch(twice);
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE((*out)[0].ok());
  ASSERT_FALSE((*out)[1].ok());
  EXPECT_EQ((*out)[1].error().code, Errc::invalid_argument);
}

// --- BatchRunner ---------------------------------------------------------------------------------------------------

struct Outcome {
  std::vector<engine::TokenId> tokens;
  std::string text;
  engine::FinishReason reason = engine::FinishReason::running;
  Status status;
  bool prefilled = false;
  bool done = false;
};

class Collector {
 public:
  engine::BatchRunner::Callbacks callbacks(Outcome* o) {
    engine::BatchRunner::Callbacks cb;
    cb.prefilled = [o](std::uint32_t, double) { o->prefilled = true; };
    cb.token = [o](const engine::TokenEvent& ev) {
      if (ev.token >= 0) o->tokens.push_back(ev.token);
      o->text += ev.text;
    };
    cb.finished = [this, o](engine::FinishReason r, const Status& st) {
      std::lock_guard lock(mu_);
      o->reason = r;
      o->status = st;
      o->done = true;
      cv_.notify_all();
    };
    return cb;
  }
  void wait(const std::vector<Outcome>& os) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] {
      for (const auto& o : os)
        if (!o.done) return false;
      return true;
    });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};

engine::GenerateRequest request(const std::vector<engine::TokenId>& prompt, int i, bool sampled, int n = 24) {
  engine::GenerateRequest r;
  r.prompt = prompt;
  r.max_new_tokens = n + i;
  r.stop_at_eos = false;
  if (sampled) {
    r.sampling.temperature = 0.9;
    r.sampling.top_k = 40;
    r.sampling.seed = 1000 + static_cast<std::uint64_t>(i);
  }
  return r;
}

// Runs every request through a runner with `max_batch` (all submitted at once) and returns the outcomes.
std::vector<Outcome> run_all(const std::shared_ptr<engine::Model>& m, const std::vector<engine::GenerateRequest>& reqs,
                             engine::BatchLimits lim, std::vector<engine::StepStats>* steps = nullptr) {
  std::vector<Outcome> out(reqs.size());
  Collector c;
  std::mutex smu;
  engine::BatchRunner runner(m, lim, [&](const engine::StepStats& s) {
    std::lock_guard lock(smu);
    if (steps) steps->push_back(s);
  });
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    auto g = engine::Generation::create(m, reqs[i]);
    EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message);
    if (!g.ok()) return out;
    EXPECT_TRUE(runner.submit(std::move(g).value(), c.callbacks(&out[i])).ok());
  }
  c.wait(out);
  return out;
}

// The requests batched (max_batch 8, budget 20, chunks of 8: prefills share steps with decodes) give each request
// exactly the tokens it gets alone through a runner of max_batch 1.
void expect_batched_equal_alone(const std::shared_ptr<engine::Model>& m, const std::vector<engine::GenerateRequest>& reqs) {
  engine::BatchLimits lim;
  lim.max_batch = 8;
  lim.step_tokens = 20;
  lim.prefill_chunk = 8;
  const auto batched = run_all(m, reqs, lim);
  engine::BatchLimits solo = lim;
  solo.max_batch = 1;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(batched[i].status.ok()) << batched[i].status.error().message;
    EXPECT_EQ(batched[i].tokens, run_all(m, {reqs[i]}, solo)[0].tokens) << "request " << i;
  }
}

struct RunnerCase {
  std::string name;
  bool quantized;
  bool sampled;
};

class RunnerTokens : public ::testing::TestWithParam<RunnerCase> {};

TEST_P(RunnerTokens, BatchedTokensEqualEachAloneAndTheUnbatchedLoop) {
  const auto& p = GetParam();
  auto m = load(p.quantized ? q8_model() : make_model("batch-f32"), opts(2));
  ASSERT_TRUE(m);
  const auto ps = prompts(*m);
  std::vector<engine::GenerateRequest> reqs;
  for (std::size_t i = 0; i < ps.size(); ++i) reqs.push_back(request(ps[i], static_cast<int>(i), p.sampled));
  engine::BatchLimits lim;
  lim.max_batch = 8;
  lim.step_tokens = 20;
  lim.prefill_chunk = 8;  // the long prompt takes several steps, sharing them with the others' decode
  std::vector<engine::StepStats> steps;
  const auto batched = run_all(m, reqs, lim, &steps);
  int max_batch_seen = 0, mixed = 0;
  for (const auto& s : steps) {
    max_batch_seen = std::max(max_batch_seen, s.batch);
    if (s.prefill_tokens > 0 && s.prefill_tokens < s.tokens) ++mixed;
    EXPECT_LE(s.tokens, lim.step_tokens);
  }
  EXPECT_EQ(max_batch_seen, static_cast<int>(ps.size()));
  EXPECT_GT(mixed, 0) << "no step mixed a prompt chunk with decode tokens";
  engine::BatchLimits solo = lim;
  solo.max_batch = 1;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(batched[i].status.ok()) << batched[i].status.error().message;
    EXPECT_EQ(batched[i].reason, engine::FinishReason::max_tokens);
    EXPECT_EQ(static_cast<int>(batched[i].tokens.size()), reqs[i].max_new_tokens);
    const auto alone = run_all(m, {reqs[i]}, solo);
    EXPECT_EQ(batched[i].tokens, alone[0].tokens) << p.name << ": request " << i;
    EXPECT_EQ(batched[i].text, alone[0].text);
    // The unbatched loop (Generation::prefill + step) with the same chunks gives the same tokens too.
    engine::GenerateRequest r = reqs[i];
    r.prefill_chunk = lim.prefill_chunk;
    auto g = engine::generate(m, r);
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(batched[i].tokens, (*g)->tokens()) << p.name << ": request " << i << " vs generate()";
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, RunnerTokens,
                         ::testing::Values(RunnerCase{"f32_greedy", false, false}, RunnerCase{"f32_seeded", false, true},
                                           RunnerCase{"q8_0_greedy", true, false},
                                           RunnerCase{"q8_0_seeded", true, true}),
                         [](const auto& i) { return i.param.name; });

TEST(BatchRunner, ALongPrefillIsChunkedAndTheOthersKeepDecoding) {
  auto m = load(make_model("batch-f32"), opts(1));
  ASSERT_TRUE(m);
  engine::BatchLimits lim;
  lim.max_batch = 4;
  lim.step_tokens = 16;  // chunks of 13 (16 - 4 + 1)
  std::vector<engine::GenerateRequest> reqs;
  for (int i = 0; i < 3; ++i) reqs.push_back(request(m->encode_text("Hello"), i, false, 40));
  std::vector<engine::TokenId> long_prompt(150);
  for (std::size_t i = 0; i < long_prompt.size(); ++i) long_prompt[i] = static_cast<engine::TokenId>(100 + i);
  reqs.push_back(request(long_prompt, 0, false, 4));
  std::vector<engine::StepStats> steps;
  const auto out = run_all(m, reqs, lim, &steps);
  for (const auto& o : out) EXPECT_TRUE(o.status.ok());
  // While the long prompt was prefilling (chunks of at most 13), the three short ones decoded in every step.
  int chunk_steps = 0;
  for (const auto& s : steps) {
    EXPECT_LE(s.tokens, lim.step_tokens);
    if (s.prefill_tokens >= 10) {
      ++chunk_steps;
      EXPECT_LE(s.prefill_tokens, 13);
      EXPECT_EQ(s.batch, 4) << "a prompt chunk ran without the decoding sequences";
    }
  }
  EXPECT_GE(chunk_steps, 150 / 13);
}

TEST(BatchRunner, CancelOneTheOthersFinish) {
  auto m = load(make_model("batch-f32"), opts(1));
  ASSERT_TRUE(m);
  engine::BatchLimits lim;
  lim.max_batch = 2;  // the third waits for a slot and is cancelled before it gets one
  std::vector<Outcome> out(3);
  std::atomic<bool> cancel0{false}, cancel2{true}, never{false};
  Collector c;
  {
    engine::BatchRunner runner(m, lim);
    auto cb0 = c.callbacks(&out[0]);
    auto inner = cb0.token;
    cb0.token = [&, inner](const engine::TokenEvent& ev) {
      inner(ev);
      if (out[0].tokens.size() == 3) cancel0 = true;
    };
    ASSERT_TRUE(runner.submit(std::move(engine::Generation::create(m, request(m->encode_text("Hi"), 0, false, 60))).value(),
                              cb0, &cancel0).ok());
    ASSERT_TRUE(runner.submit(std::move(engine::Generation::create(m, request(m->encode_text("Ho"), 0, false, 10))).value(),
                              c.callbacks(&out[1]), &never).ok());
    ASSERT_TRUE(runner.submit(std::move(engine::Generation::create(m, request(m->encode_text("Ha"), 0, false, 10))).value(),
                              c.callbacks(&out[2]), &cancel2).ok());
    c.wait(out);
  }
  EXPECT_EQ(out[0].reason, engine::FinishReason::cancelled);
  EXPECT_LE(out[0].tokens.size(), 5U);
  EXPECT_EQ(out[1].reason, engine::FinishReason::max_tokens);
  EXPECT_EQ(out[1].tokens.size(), 10U);
  EXPECT_EQ(out[2].reason, engine::FinishReason::cancelled);
  EXPECT_TRUE(out[2].tokens.empty());
  EXPECT_EQ(m->kv_stats().used_blocks, 0);
}

TEST(BatchRunner, DestroyingTheRunnerCancelsWhatRuns) {
  auto m = load(make_model("batch-f32"), opts(1));
  ASSERT_TRUE(m);
  std::vector<Outcome> out(2);
  Collector c;
  {
    engine::BatchRunner runner(m, {});
    for (auto& o : out)
      ASSERT_TRUE(runner.submit(std::move(engine::Generation::create(m, request(m->encode_text("Hi"), 0, false, 200))).value(),
                                c.callbacks(&o)).ok());
  }
  for (const auto& o : out) {
    EXPECT_TRUE(o.done);
    EXPECT_TRUE(o.reason == engine::FinishReason::cancelled || o.reason == engine::FinishReason::max_tokens);
  }
  EXPECT_EQ(m->kv_stats().used_blocks, 0);
}

// --- on the simulated accelerator ----------------------------------------------------------------------------------

std::shared_ptr<device::SimulatedDevice> sim() {
  device::SimulatedConfig c;
  c.capacity_bytes = 1ull << 30;
  return std::make_shared<device::SimulatedDevice>(c, std::make_shared<SteadyClock>());
}

TEST(BatchRunnerAccelerator, BatchedTokensEqualAloneOnTheSimulatedDevice) {
  auto dev = sim();
  engine::LoadOptions lo = opts(1);
  lo.accelerator = dev;
  auto m = load(make_model("batch-f32"), lo);
  ASSERT_TRUE(m);
  const auto ps = prompts(*m);
  std::vector<engine::GenerateRequest> reqs;
  for (std::size_t i = 0; i < ps.size(); ++i) reqs.push_back(request(ps[i], static_cast<int>(i), i % 2 == 1));
  expect_batched_equal_alone(m, reqs);
}

TEST(BatchRunnerAccelerator, AFailedStepEndsEveryMemberWithTheDeviceError) {
  auto dev = sim();
  engine::LoadOptions lo = opts(1);
  lo.accelerator = dev;
  auto m = load(make_model("batch-f32"), lo);
  ASSERT_TRUE(m);
  std::vector<Outcome> out(3);
  Collector c;
  engine::BatchRunner runner(m, {});
  std::atomic<bool> go{false};
  for (int i = 0; i < 3; ++i) {
    auto cb = c.callbacks(&out[static_cast<std::size_t>(i)]);
    if (i == 0) {
      auto inner = cb.token;
      cb.token = [&, inner](const engine::TokenEvent& ev) {
        inner(ev);
        if (out[0].tokens.size() == 4) dev->lose();  // the driver resets while the batch runs
      };
    }
    ASSERT_TRUE(runner.submit(std::move(engine::Generation::create(m, request(m->encode_text("Hi"), i, false, 50))).value(),
                              cb).ok());
  }
  c.wait(out);
  for (const auto& o : out) {
    EXPECT_EQ(o.reason, engine::FinishReason::error);
    ASSERT_FALSE(o.status.ok());
    EXPECT_EQ(o.status.error().code, Errc::device_lost);
    EXPECT_LT(o.tokens.size(), 50U);
  }
}

// --- offload: a sequence that runs its first k layers on the accelerator and the rest on the CPU -------------------

TEST(Offload, AnOffloadedSequenceComputesExactlyWhatTheHybridReplicaWithThatSplitDoes) {
  for (const char* preset : {"test", "gemma3"}) {
    SCOPED_TRACE(preset);
    auto dev = sim();
    engine::LoadOptions lo = opts(1);
    lo.accelerator = dev;
    auto full = load(f32_model(preset), lo);
    ASSERT_TRUE(full);
    const int layers = full->config().num_layers;
    const auto prompt = full->encode_text("The GPU ran out of memory while");
    for (int k = 1; k <= layers; ++k) {
      engine::LoadOptions hl = lo;
      hl.accel_layers = k;
      auto hybrid = load(f32_model(preset), hl);
      ASSERT_TRUE(hybrid);
      engine::GenerateRequest r = request(prompt, 0, false, 40);  // 40 tokens: the host K/V grows twice
      auto want = engine::generate(hybrid, r);
      ASSERT_TRUE(want.ok()) << want.error().message;
      r.gpu_layers = k;
      auto got = engine::generate(full, r);
      ASSERT_TRUE(got.ok()) << got.error().message;
      EXPECT_EQ((*got)->tokens(), (*want)->tokens()) << "gpu_layers " << k;
      // The logits themselves, bit for bit; and for k < layers they differ from the all-accelerator ones (ATen's
      // matmul there, Tandem's kernels on the CPU), so the split really happened.
      auto hs = std::move(hybrid->new_sequence()).value();
      auto os = std::move(full->new_sequence(k)).value();
      auto ps = std::move(full->new_sequence()).value();
      auto lh = hybrid->forward(*hs, prompt), lo2 = full->forward(*os, prompt), lp = full->forward(*ps, prompt);
      ASSERT_TRUE(lh.ok() && lo2.ok() && lp.ok());
      EXPECT_EQ(*lo2, *lh) << "gpu_layers " << k;
      if (k < layers) {
        EXPECT_NE(*lo2, *lp) << "gpu_layers " << k << ": offloaded logits equal the all-accelerator ones";
      }
    }
    EXPECT_EQ(full->kv_stats().used_blocks, 0);
  }
}

TEST(Offload, OffloadedAndPlainSequencesShareStepsAndEachGetsItsOwnTokens) {
  auto dev = sim();
  engine::LoadOptions lo = opts(1);
  lo.accelerator = dev;
  auto m = load(make_model("batch-f32"), lo);
  ASSERT_TRUE(m);
  const auto ps = prompts(*m);
  std::vector<engine::GenerateRequest> reqs;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    reqs.push_back(request(ps[i], static_cast<int>(i), i == 1));
    if (i % 2 == 0) reqs.back().gpu_layers = 1 + static_cast<int>(i) % m->config().num_layers;  // some offloaded
  }
  expect_batched_equal_alone(m, reqs);
}

TEST(Offload, RefusedWithoutAnAcceleratorOrOutsideTheLayers) {
  auto cpu = load(make_model("batch-f32"), opts(1));
  ASSERT_TRUE(cpu);
  auto s = cpu->new_sequence(1);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::invalid_argument);
  engine::LoadOptions lo = opts(1);
  lo.accelerator = sim();
  auto m = load(make_model("batch-f32"), lo);
  ASSERT_TRUE(m);
  for (int bad : {0, m->config().num_layers + 1}) {
    auto t = m->new_sequence(bad);
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_EQ(t.error().code, Errc::invalid_argument);
  }
  EXPECT_TRUE(m->new_sequence(m->config().num_layers).ok());
}

}  // namespace
}  // namespace tandem
