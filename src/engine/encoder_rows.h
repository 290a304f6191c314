// Row kernels shared by the CLIP and Whisper forwards on the CPU (clip_forward.cc, whisper_forward.cc), and the
// plumbing of their failures (a cancelled pass, a LibTorch error). Plain loops over f32 rows with sums in double:
// each output row is computed from its own inputs by the same sequence of operations whatever the other rows, so a
// row's values do not depend on the batch or on how many rows a call carries. Engine-internal; no torch headers.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "core/result.h"

namespace tandem::engine {

// Thrown out of a forward pass when its cancel flag is set; EncoderModelBase::guarded maps it to Errc::cancelled.
struct Cancelled {};

inline void throw_if_cancelled(const std::atomic<bool>* cancel) {
  if (cancel && cancel->load(std::memory_order_relaxed)) throw Cancelled{};
}

// A LibTorch failure during `op`: out_of_memory when its message says so, internal otherwise.
Error torch_error(const std::string& what, const char* op);

// Layer norm of n rows of d values (mean and variance in double), then the f32 weight and bias.
void layer_norm_rows(const float* x, const float* w, const float* b, std::int64_t n, std::int64_t d, double eps,
                     float* out);

// Exact (erf) GELU, in place.
void gelu_rows(float* x, std::int64_t count);

// y [n, r] += b [r] on every row.
void add_bias_rows(float* y, const float* b, std::int64_t n, std::int64_t r);

// Rows [r0, r1) of one multi-head attention: q [n, d] (row i at position past + i), m keys and values of d floats;
// out [n, d]; scores, softmax and weighted sums in double. causal: query i sees keys j ≤ past + i. Key/value j is row
// j of k, v, or with `slots` (a paged KV pool, kv_pool.h) row slots[j]: the same operations either way.
void attention_rows(const float* q, const float* k, const float* v, float* out, std::int64_t r0, std::int64_t r1,
                    std::int64_t m, std::int64_t d, int heads, bool causal, std::int64_t past,
                    const std::int64_t* slots = nullptr);

}  // namespace tandem::engine
