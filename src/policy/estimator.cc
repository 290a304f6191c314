#include "policy/estimator.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tandem::policy {

std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? std::numeric_limits<std::uint64_t>::max() : r;
}

std::uint64_t sat_mul(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<std::uint64_t>::max() : r;
}

namespace {

std::uint64_t mul(std::initializer_list<std::uint64_t> xs) {
  std::uint64_t r = 1;
  for (auto x : xs) r = sat_mul(r, x);
  return r;
}

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

std::uint64_t params_to_bytes(std::uint64_t params, std::uint32_t bits) { return ceil_div(sat_mul(params, bits), 8); }

std::uint64_t fragmentation(double fraction, std::uint64_t base) {
  double f = std::ceil(fraction * static_cast<double>(base));
  return f >= 1.8e19 ? std::numeric_limits<std::uint64_t>::max() : static_cast<std::uint64_t>(f);
}

}  // namespace

std::uint64_t MemoryEstimator::layer_params(const ModelShape& m) {
  const std::uint64_t h = m.hidden, q = std::uint64_t{m.heads} * m.head_dim, kv = std::uint64_t{m.kv_heads} * m.head_dim;
  // q, k, v, o projections + gated MLP (gate, up, down) + two RMSNorm weights.
  return sat_add(sat_add(sat_add(mul({h, q}), mul({2, h, kv})), sat_add(mul({q, h}), mul({3, h, m.intermediate}))),
                 2 * h);
}

std::uint64_t MemoryEstimator::weight_params(const ModelShape& m) {
  const std::uint64_t embed = mul({m.vocab, m.hidden});
  const std::uint64_t head = m.tied_embeddings ? 0 : embed;
  return sat_add(sat_add(embed, head), sat_add(mul({m.layers, layer_params(m)}), m.hidden));
}

std::uint64_t MemoryEstimator::weights_bytes(const ModelShape& m) {
  if (m.weights_bytes_override != 0) return m.weights_bytes_override;
  return params_to_bytes(weight_params(m), m.weight_bits);
}

std::uint64_t MemoryEstimator::layer_weights_bytes(const ModelShape& m) {
  if (m.weights_bytes_override != 0) {
    // Measured file size: split it in proportion to parameter counts.
    double share = static_cast<double>(layer_params(m)) / static_cast<double>(std::max<std::uint64_t>(1, weight_params(m)));
    return static_cast<std::uint64_t>(std::ceil(share * static_cast<double>(m.weights_bytes_override)));
  }
  return params_to_bytes(layer_params(m), m.weight_bits);
}

std::uint64_t MemoryEstimator::embedding_bytes(const ModelShape& m) {
  if (m.weights_bytes_override != 0) {
    double share = static_cast<double>(mul({m.vocab, m.hidden})) /
                   static_cast<double>(std::max<std::uint64_t>(1, weight_params(m)));
    return static_cast<std::uint64_t>(std::ceil(share * static_cast<double>(m.weights_bytes_override)));
  }
  return params_to_bytes(mul({m.vocab, m.hidden}), m.weight_bits);
}

std::uint64_t MemoryEstimator::kv_bytes_per_token(const ModelShape& m) {
  return mul({m.layers, m.kv_heads, m.head_dim, 2, m.kv_elem_bytes});
}

std::uint64_t MemoryEstimator::activation_bytes(const ModelShape& m, std::uint64_t n, std::uint64_t ctx,
                                                std::uint32_t act, bool with_logits) {
  ctx = std::max(ctx, n);
  const std::uint64_t hidden_states = mul({2, n, m.hidden, act});  // residual stream + normalized copy
  const std::uint64_t qkv = mul({n, std::uint64_t{m.heads} + 2ull * m.kv_heads, m.head_dim, act});
  const std::uint64_t scores = mul({n, ctx, m.heads, 4});            // scores / softmax in f32
  const std::uint64_t attn_out = mul({n, m.heads, m.head_dim, act});
  const std::uint64_t attention = sat_add(sat_add(qkv, scores), attn_out);
  const std::uint64_t mlp = mul({2, n, m.intermediate, act});         // gate and up projections
  const std::uint64_t logits = with_logits ? mul({n, m.vocab, 4}) : 0;  // f32 logits
  return sat_add(hidden_states, std::max({attention, mlp, logits}));
}

namespace {

MemoryBreakdown finish(const EstimatorConfig& cfg, const ModelShape& m, const RequestShape& r,
                       std::uint64_t weights, std::uint64_t kv_per_token, std::uint32_t layers, bool with_logits) {
  MemoryBreakdown b;
  if (m.fixed_job_bytes != 0) {  // the engine's own figure: no KV blocks, one activation term per sequence
    b.batch = r.batch;
    b.layers = layers;
    b.weights_bytes = weights;
    b.prefill_chunk_tokens = r.prompt_tokens;
    b.prefill_activation_bytes = sat_mul(m.fixed_job_bytes, r.batch);
    b.activation_bytes = sat_add(b.prefill_activation_bytes, m.dequant_workspace_bytes);
    const std::uint64_t base = sat_add(b.weights_bytes, b.activation_bytes);
    b.fragmentation_bytes = fragmentation(cfg.fragmentation_fraction, base);
    b.total_bytes = sat_add(base, b.fragmentation_bytes);
    return b;
  }
  if (m.encoder_only) {  // nothing cached, nothing decoded: one forward of the inputs
    kv_per_token = 0;
    with_logits = false;
  }
  b.batch = r.batch;
  b.layers = layers;
  b.weights_bytes = weights;
  b.kv_bytes_per_token = kv_per_token;
  b.kv_tokens = m.encoder_only ? 0 : r.context_tokens();
  b.kv_blocks = m.encoder_only ? 0 : sat_mul(ceil_div(b.kv_tokens, cfg.kv_block_tokens), r.batch);
  b.kv_bytes = mul({b.kv_blocks, cfg.kv_block_tokens, kv_per_token});
  const std::uint64_t chunk = r.prefill_chunk == 0 ? r.prompt_tokens : std::min(r.prefill_chunk, r.prompt_tokens);
  b.prefill_chunk_tokens = chunk;
  if (layers > 0) {
    b.prefill_activation_bytes =
        sat_mul(MemoryEstimator::activation_bytes(m, chunk, r.prompt_tokens, m.act_elem_bytes, with_logits), r.batch);
    if (!m.encoder_only)
      b.decode_activation_bytes =
          sat_mul(MemoryEstimator::activation_bytes(m, 1, b.kv_tokens, m.act_elem_bytes, with_logits), r.batch);
  }
  b.activation_bytes = std::max(b.prefill_activation_bytes, b.decode_activation_bytes);
  if (layers > 0) b.activation_bytes = sat_add(b.activation_bytes, m.dequant_workspace_bytes);
  const std::uint64_t base = sat_add(sat_add(b.weights_bytes, b.kv_bytes), b.activation_bytes);
  b.fragmentation_bytes = fragmentation(cfg.fragmentation_fraction, base);
  b.total_bytes = sat_add(base, b.fragmentation_bytes);
  return b;
}

}  // namespace

MemoryBreakdown MemoryEstimator::estimate(const ModelShape& m, const RequestShape& r, bool weights_resident) const {
  return finish(cfg_, m, r, weights_resident ? 0 : weights_bytes(m), kv_bytes_per_token(m), m.layers, true);
}

MemoryBreakdown MemoryEstimator::estimate_hybrid(const ModelShape& m, const RequestShape& r, bool weights_resident,
                                                 std::uint32_t gpu_layers) const {
  gpu_layers = std::min(gpu_layers, m.layers);
  if (gpu_layers == m.layers) return estimate(m, r, weights_resident);
  const std::uint64_t weights =
      weights_resident ? 0 : sat_add(embedding_bytes(m), sat_mul(gpu_layers, layer_weights_bytes(m)));
  const std::uint64_t kv_per_token = mul({gpu_layers, m.kv_heads, m.head_dim, 2, m.kv_elem_bytes});
  // Logits are computed on the CPU side of the split.
  return finish(cfg_, m, r, weights, kv_per_token, gpu_layers, false);
}

std::uint32_t MemoryEstimator::layers_that_fit(const ModelShape& m, const RequestShape& r, bool weights_resident,
                                               std::int64_t headroom) const {
  if (headroom <= 0) return 0;
  const auto room = static_cast<std::uint64_t>(headroom);
  std::uint32_t lo = 0, hi = m.layers;  // invariant: answer in [lo, hi]; total is monotone in k
  if (estimate_hybrid(m, r, weights_resident, 0).total_bytes > room) return 0;
  while (lo < hi) {
    std::uint32_t mid = lo + (hi - lo + 1) / 2;
    if (estimate_hybrid(m, r, weights_resident, mid).total_bytes <= room) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace tandem::policy
