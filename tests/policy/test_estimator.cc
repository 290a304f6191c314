#include <gtest/gtest.h>

#include "fixtures.h"

namespace tandem::policy {
namespace {

using testing::llama7b;
using testing::request;
using testing::tiny_model;

TEST(Estimator, Llama7bParameterCountAndKvPerToken) {
  EXPECT_EQ(MemoryEstimator::weight_params(llama7b()), 6'738'415'616ull);
  EXPECT_EQ(MemoryEstimator::weights_bytes(llama7b()), 2 * 6'738'415'616ull);
  EXPECT_EQ(MemoryEstimator::kv_bytes_per_token(llama7b()), 512ull * 1024);  // 0.5 MiB fp16
}

TEST(Estimator, TiedEmbeddingsAndQuantizationChangeWeights) {
  ModelShape m = tiny_model();
  EXPECT_EQ(MemoryEstimator::weight_params(m), 1704u);
  m.tied_embeddings = true;
  EXPECT_EQ(MemoryEstimator::weight_params(m), 1704u - 256u);
  m.weight_bits = 4;
  EXPECT_EQ(MemoryEstimator::weights_bytes(m), (1448u * 4 + 7) / 8);
  m.weights_bytes_override = 12345;
  EXPECT_EQ(MemoryEstimator::weights_bytes(m), 12345u);
}

// Every term of the tiny model, computed by hand in docs/policy.md's formulas.
TEST(Estimator, TinyModelBreakdownByHand) {
  MemoryEstimator est(EstimatorConfig{16, 0.10});
  MemoryBreakdown b = est.estimate(tiny_model(), request(10, 7), /*weights_resident=*/false);
  EXPECT_EQ(b.weights_bytes, 3408u);
  EXPECT_EQ(b.kv_bytes_per_token, 32u);  // 2 layers × 1 kv head × 4 × 2 (k,v) × 2 bytes
  EXPECT_EQ(b.kv_tokens, 17u);
  EXPECT_EQ(b.kv_blocks, 2u);            // ceil(17 / 16)
  EXPECT_EQ(b.kv_bytes, 1024u);          // 2 × 16 × 32
  EXPECT_EQ(b.prefill_chunk_tokens, 10u);
  EXPECT_EQ(b.prefill_activation_bytes, 1600u);  // 320 hidden + max(1280 attn, 640 mlp, 1280 logits)
  EXPECT_EQ(b.decode_activation_bytes, 216u);    // 32 hidden + 184 attention
  EXPECT_EQ(b.activation_bytes, 1600u);
  EXPECT_EQ(b.fragmentation_bytes, 604u);        // ceil(0.1 × 6032)
  EXPECT_EQ(b.total_bytes, 6636u);
  EXPECT_EQ(b.job_bytes(), 6636u - 3408u);

  MemoryBreakdown resident = est.estimate(tiny_model(), request(10, 7), true);
  EXPECT_EQ(resident.weights_bytes, 0u);
  EXPECT_EQ(resident.total_bytes, 2624u + 263u);
}

// An encoder (embedding model): no KV cache, no decode step, no logits — only one forward of each input.
TEST(Estimator, EncoderOnlyHasActivationsOnly) {
  MemoryEstimator est(EstimatorConfig{16, 0.10});
  ModelShape m = tiny_model();
  m.encoder_only = true;
  RequestShape r = request(10, 1);
  r.batch = 3;
  MemoryBreakdown b = est.estimate(m, r, /*weights_resident=*/false);
  EXPECT_EQ(b.kv_bytes_per_token, 0u);
  EXPECT_EQ(b.kv_tokens, 0u);
  EXPECT_EQ(b.kv_blocks, 0u);
  EXPECT_EQ(b.kv_bytes, 0u);
  EXPECT_EQ(b.decode_activation_bytes, 0u);
  EXPECT_EQ(b.prefill_activation_bytes, 4800u);  // 3 × (320 hidden + max(1280 attention, 640 mlp)); no logits
  EXPECT_EQ(b.fragmentation_bytes, 821u);        // ceil(0.1 × (3408 + 4800))
  EXPECT_EQ(b.total_bytes, 3408u + 4800u + 821u);
  // Without the flag the same request would reserve KV blocks and logits.
  m.encoder_only = false;
  EXPECT_GT(est.estimate(m, r, false).kv_bytes, 0u);
}

// A speech model: the engine's measured per-job bytes replace the KV and activation terms (times the batch).
TEST(Estimator, FixedJobBytesReplaceKvAndActivations) {
  MemoryEstimator est(EstimatorConfig{16, 0.10});
  ModelShape m = tiny_model();
  m.fixed_job_bytes = 10000;
  m.dequant_workspace_bytes = 50;
  RequestShape r = request(1500, 448);
  MemoryBreakdown b = est.estimate(m, r, /*weights_resident=*/false);
  EXPECT_EQ(b.kv_bytes, 0u);
  EXPECT_EQ(b.kv_blocks, 0u);
  EXPECT_EQ(b.prefill_activation_bytes, 10000u);
  EXPECT_EQ(b.activation_bytes, 10050u);
  EXPECT_EQ(b.fragmentation_bytes, 1346u);  // ceil(0.1 × (3408 + 10050))
  EXPECT_EQ(b.total_bytes, 3408u + 10050u + 1346u);
  r.batch = 2;
  EXPECT_EQ(est.estimate(m, r, true).activation_bytes, 20050u);
  // The request's size does not change it.
  EXPECT_EQ(est.estimate(m, request(1, 1), true).total_bytes, est.estimate(m, request(4000, 96), true).total_bytes);
}

struct KvRow {
  std::uint32_t prompt, max_new, batch, block;
  std::uint64_t blocks;
};

TEST(Estimator, KvBlocksRoundUpPerSequence) {
  const KvRow rows[] = {
      {1, 1, 1, 16, 1},  {8, 8, 1, 16, 1},   {8, 9, 1, 16, 2},  {16, 16, 1, 16, 2},
      {10, 7, 3, 16, 6}, {100, 0 + 1, 1, 1, 101}, {4000, 96, 2, 256, 32},
  };
  for (const auto& r : rows) {
    MemoryEstimator est(EstimatorConfig{r.block, 0.0});
    RequestShape q = request(r.prompt, r.max_new);
    q.batch = r.batch;
    MemoryBreakdown b = est.estimate(tiny_model(), q, true);
    EXPECT_EQ(b.kv_blocks, r.blocks) << r.prompt << "+" << r.max_new << " x" << r.batch << " / " << r.block;
    EXPECT_EQ(b.kv_bytes, r.blocks * r.block * 32u);
  }
}

TEST(Estimator, ChunkedPrefillLowersPeakAndBatchScalesIt) {
  MemoryEstimator est(EstimatorConfig{16, 0.0});
  ModelShape m = llama7b();
  RequestShape whole = request(4096, 128);
  RequestShape chunked = whole;
  chunked.prefill_chunk = 512;
  auto a = est.estimate(m, whole, true), b = est.estimate(m, chunked, true);
  EXPECT_EQ(b.prefill_chunk_tokens, 512u);
  EXPECT_LT(b.prefill_activation_bytes, a.prefill_activation_bytes);
  EXPECT_EQ(a.kv_bytes, b.kv_bytes);
  RequestShape batch2 = whole;
  batch2.batch = 2;
  auto c = est.estimate(m, batch2, true);
  EXPECT_EQ(c.kv_bytes, 2 * a.kv_bytes);
  EXPECT_EQ(c.activation_bytes, 2 * a.activation_bytes);
  // Chunk larger than the prompt is the prompt.
  RequestShape big = request(100, 10);
  big.prefill_chunk = 1000;
  EXPECT_EQ(est.estimate(m, big, true).prefill_chunk_tokens, 100u);
}

TEST(Estimator, DecodeDominatesForLongGenerations) {
  MemoryEstimator est(EstimatorConfig{16, 0.0});
  ModelShape m = tiny_model();
  RequestShape r = request(1, 100000);  // scores: 1 × 100001 × heads × 4 ≫ prefill of one token
  auto b = est.estimate(m, r, true);
  EXPECT_GT(b.decode_activation_bytes, b.prefill_activation_bytes);
  EXPECT_EQ(b.activation_bytes, b.decode_activation_bytes);
}

TEST(Estimator, HybridSplitIsMonotoneAndLayersThatFitIsExact) {
  MemoryEstimator est;
  ModelShape m = llama7b();
  RequestShape r = request(2048, 512);
  std::uint64_t prev = 0;
  for (std::uint32_t k = 0; k <= m.layers; ++k) {
    auto b = est.estimate_hybrid(m, r, false, k);
    EXPECT_GE(b.total_bytes, prev) << k;
    prev = b.total_bytes;
  }
  EXPECT_EQ(est.estimate_hybrid(m, r, false, m.layers), est.estimate(m, r, false));
  for (std::uint32_t k : {1u, 7u, 16u, 31u}) {
    const auto need = static_cast<std::int64_t>(est.estimate_hybrid(m, r, false, k).total_bytes);
    EXPECT_EQ(est.layers_that_fit(m, r, false, need), k);
    EXPECT_EQ(est.layers_that_fit(m, r, false, need - 1), k - 1);
  }
  EXPECT_EQ(est.layers_that_fit(m, r, false, 0), 0u);
  EXPECT_EQ(est.layers_that_fit(m, r, false, -5), 0u);
  EXPECT_EQ(est.layers_that_fit(m, r, false, INT64_MAX), m.layers);
}

TEST(Estimator, SaturatesInsteadOfWrapping) {
  EXPECT_EQ(sat_mul(1ull << 40, 1ull << 40), UINT64_MAX);
  EXPECT_EQ(sat_add(UINT64_MAX - 1, 5), UINT64_MAX);
  EXPECT_EQ(sat_mul(3, 4), 12u);
}

struct ShapeRow {
  const char* what;
  void (*mutate)(ModelShape&);
  const char* message;
};

TEST(Estimator, ModelShapeValidationNamesTheField) {
  const ShapeRow rows[] = {
      {"layers 0", [](ModelShape& m) { m.layers = 0; }, "model.layers must be in [1,1024], got 0"},
      {"kv > heads", [](ModelShape& m) { m.kv_heads = 3; }, "model.kv_heads must be in [1,2], got 3"},
      {"kv not divisor", [](ModelShape& m) { m.heads = 3; m.kv_heads = 2; }, "model.kv_heads must divide model.heads (3), got 2"},
      {"bits", [](ModelShape& m) { m.weight_bits = 5; }, "model.weight_bits must be 4, 8, 16 or 32, got 5"},
      {"kv elem", [](ModelShape& m) { m.kv_elem_bytes = 3; }, "model.kv_elem_bytes must be 1, 2 or 4, got 3"},
      {"act elem", [](ModelShape& m) { m.act_elem_bytes = 1; }, "model.act_elem_bytes must be 2 or 4, got 1"},
      {"vocab", [](ModelShape& m) { m.vocab = 0; }, "model.vocab must be in [1,16777216], got 0"},
  };
  for (const auto& row : rows) {
    ModelShape m = tiny_model();
    row.mutate(m);
    Status s = m.validate();
    ASSERT_FALSE(s.ok()) << row.what;
    EXPECT_EQ(s.error().code, Errc::invalid_argument);
    EXPECT_EQ(s.error().message, row.message) << row.what;
  }
  EXPECT_TRUE(tiny_model().validate().ok());
  EXPECT_TRUE(llama7b().validate().ok());
}

TEST(Estimator, RequestValidation) {
  EXPECT_TRUE(request(1, 1).validate().ok());
  EXPECT_EQ(request(0, 1).validate().error().message, "request.prompt_tokens must be in [1,4194304], got 0");
  EXPECT_EQ(request(1, 0).validate().error().message, "request.max_new_tokens must be in [1,4194304], got 0");
  RequestShape r = request(1, 1);
  r.batch = 0;
  EXPECT_EQ(r.validate().error().message, "request.batch must be in [1,1024], got 0");
}

}  // namespace
}  // namespace tandem::policy
