// Peak device-memory prediction for one request, as a breakdown of documented terms (docs/policy.md §1).
#pragma once

#include <cstdint>

#include "policy/config.h"
#include "policy/types.h"

namespace tandem::policy {

struct MemoryBreakdown {
  std::uint64_t weights_bytes = 0;             // 0 when the weights are already resident
  std::uint64_t kv_bytes_per_token = 0;        // one sequence, layers on this device
  std::uint64_t kv_tokens = 0;                 // prompt + max_new_tokens, per sequence
  std::uint64_t kv_blocks = 0;                 // ceil(kv_tokens / block_tokens) × batch
  std::uint64_t kv_bytes = 0;                  // kv_blocks × block_tokens × kv_bytes_per_token
  std::uint64_t prefill_chunk_tokens = 0;      // n of the prefill activation term
  std::uint64_t prefill_activation_bytes = 0;  // whole batch
  std::uint64_t decode_activation_bytes = 0;   // whole batch
  std::uint64_t activation_bytes = 0;          // max(prefill, decode)
  std::uint32_t batch = 1;
  std::uint32_t layers = 0;                    // layers on this device (hybrid: the GPU part)
  std::uint64_t fragmentation_bytes = 0;
  std::uint64_t total_bytes = 0;

  // The part that a job reserves in the ledger (weights are accounted per model, not per job).
  std::uint64_t job_bytes() const { return total_bytes - weights_bytes; }
  friend bool operator==(const MemoryBreakdown&, const MemoryBreakdown&) = default;
};

class MemoryEstimator {
 public:
  explicit MemoryEstimator(EstimatorConfig cfg = {}) : cfg_(cfg) {}

  static std::uint64_t weight_params(const ModelShape& m);
  static std::uint64_t layer_params(const ModelShape& m);
  static std::uint64_t weights_bytes(const ModelShape& m);        // whole model
  static std::uint64_t layer_weights_bytes(const ModelShape& m);  // one transformer layer
  static std::uint64_t embedding_bytes(const ModelShape& m);      // token embedding only
  static std::uint64_t kv_bytes_per_token(const ModelShape& m);   // layers × kv_heads × head_dim × 2 × elem

  // Activation peak of one sequence processing `n` new tokens against `ctx` tokens of context.
  static std::uint64_t activation_bytes(const ModelShape& m, std::uint64_t n, std::uint64_t ctx,
                                        std::uint32_t act_elem_bytes, bool with_logits = true);

  // Whole model on this device.
  MemoryBreakdown estimate(const ModelShape& m, const RequestShape& r, bool weights_resident) const;
  // Hybrid split: embedding + first `gpu_layers` layers (weights and KV) on the GPU; norm + lm_head on the CPU.
  MemoryBreakdown estimate_hybrid(const ModelShape& m, const RequestShape& r, bool weights_resident,
                                  std::uint32_t gpu_layers) const;
  // Largest k in [0, layers] with estimate_hybrid(k).total ≤ headroom (0 if none; callers check min layers).
  std::uint32_t layers_that_fit(const ModelShape& m, const RequestShape& r, bool weights_resident,
                                std::int64_t headroom) const;

  const EstimatorConfig& config() const { return cfg_; }

 private:
  EstimatorConfig cfg_;
};

// Saturating arithmetic: estimates never wrap around.
std::uint64_t sat_add(std::uint64_t a, std::uint64_t b);
std::uint64_t sat_mul(std::uint64_t a, std::uint64_t b);

}  // namespace tandem::policy
