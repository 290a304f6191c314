// Plain-data inputs of the policy library: model and request shapes, a device memory reading, routes.
// The engine and daemon fill these in; policy never depends on them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/clock.h"
#include "core/result.h"

namespace tandem::policy {

using JobId = std::uint64_t;

// Shape of a decoder-only transformer (Llama-style: gated MLP, grouped-query attention).
struct ModelShape {
  std::string name;                  // model id, used to count shared weights once (ledger, host guard)
  std::uint32_t layers = 0;
  std::uint32_t hidden = 0;          // d_model
  std::uint32_t intermediate = 0;    // MLP inner width
  std::uint32_t heads = 0;           // query heads
  std::uint32_t kv_heads = 0;        // key/value heads (GQA); == heads for MHA
  std::uint32_t head_dim = 0;
  std::uint32_t vocab = 0;
  std::uint32_t weight_bits = 16;    // bits per weight element (4, 8, 16, 32); quantization scales not counted
  std::uint32_t kv_elem_bytes = 2;   // bytes per KV cache element (on the accelerator)
  std::uint32_t cpu_kv_elem_bytes = 2;  // bytes per KV cache element of the CPU layers (engine KvCacheType; f16)
  std::uint32_t act_elem_bytes = 2;  // bytes per activation element
  bool tied_embeddings = false;      // lm_head shares the embedding matrix
  std::uint64_t weights_bytes_override = 0;  // measured size of the weight files; 0 = compute from the shape
  // Temporary bytes to expand one stored (quantized or converted) weight matrix before its matmul on the
  // accelerator; added to every forward's activations. 0 when weights are used as stored.
  std::uint64_t dequant_workspace_bytes = 0;
  // An encoder (an embedding model): one forward of prompt_tokens per input and nothing kept between forwards — no
  // KV cache, no logits, no decode. Its requests carry max_new_tokens 1 (the one forward) and batch = inputs.
  bool encoder_only = false;
  // A model whose job needs a known, request-independent amount of device memory (a speech model: one window's
  // encoder workspace + the cross-attention K/V + the decoder's self-attention cache, engine::WhisperModel::
  // session_bytes): when non-zero it is a job's whole KV + activation term (per sequence, times batch), measured by
  // the engine instead of derived from the shape. 0 = derive it.
  std::uint64_t fixed_job_bytes = 0;

  Status validate() const;
};

// One generation request as admission sees it.
struct RequestShape {
  std::uint32_t prompt_tokens = 0;
  std::uint32_t max_new_tokens = 0;
  std::uint32_t batch = 1;            // sequences generated together (n > 1 samples)
  std::uint32_t prefill_chunk = 0;    // tokens per prefill step; 0 = whole prompt in one step
  bool allow_reduce = false;          // the client accepts a lower max_new_tokens / a chunked prefill
  bool allow_cpu = true;              // the client accepts the CPU route
  bool allow_fallback_model = false;  // the client accepts a different (smaller) model
  bool side_effects = false;          // the client acts on tokens: never migrate mid-generation

  Status validate() const;
  std::uint64_t context_tokens() const { return std::uint64_t{prompt_tokens} + max_new_tokens; }
};

// One reading of the accelerator's memory (CUDA: cudaMemGetInfo + the caching allocator's counters).
struct MemorySnapshot {
  std::uint64_t total_bytes = 0;
  std::uint64_t free_bytes = 0;       // free as the driver reports it (all processes)
  std::uint64_t reserved_bytes = 0;   // held by this process's caching allocator
  std::uint64_t allocated_bytes = 0;  // of reserved, in live tensors
  Clock::time_point taken_at{};

  Status validate() const;
};

// Where a job runs.
enum class Device { gpu, hybrid, cpu };
std::string_view device_name(Device d) noexcept;

struct Route {
  Device device = Device::gpu;
  std::uint32_t gpu_layers = 0;  // hybrid: first N layers on the GPU
  bool fallback_model = false;   // served by a different model than requested (announced as degraded)
  std::string model;             // the model that serves the job

  friend bool operator==(const Route&, const Route&) = default;
};

}  // namespace tandem::policy
