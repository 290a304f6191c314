// Row-wise activation kernels of the transformer's CPU layers: RMSNorm, SiLU(gate) × up, GELU-tanh(gate) × up,
// soft-capping and the rotary embedding.
// Built with -ffp-contract=off (RMSNorm, SiLU and the rotation at each path's vector width: rows_lanes.h,
// silu_lanes.h): every output element is computed by the same sequence of IEEE operations from its own row (and,
// for the rotary tables, its own position) only, whatever the number of rows, the row's index or the CPU's path. With the row-independent matmuls (kernels.h), this is what makes a
// sequence's logits bit-identical whether it runs alone or in a batch with others (docs/batching.md).
#pragma once

#include <cstdint>

namespace tandem::kernels {

// out[i][j] = x[i][j] / sqrt(mean_j(x[i][j]²) + eps) * w[j] for i < n, j < d. The sum of squares runs in a fixed
// order (8 interleaved partial sums, combined pairwise), in double. `out` may alias `x`.
void rmsnorm_rows(const float* x, const float* w, std::int64_t n, std::int64_t d, float eps, float* out);

// out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i] for i < count, exp within ~2 ulp (a
// polynomial, exp of the argument clamped to [-87.3, 88.3]: for gate below -88.3 the result is gate · up · 4.7e-39
// instead of ±0). `out` may alias either.
void silu_mul(const float* gate, const float* up, std::int64_t count, float* out);

// out[i] = gelu_tanh(gate[i]) * up[i] = 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))·up[i] (PyTorch's
// gelu(approximate="tanh"), Gemma's gelu_pytorch_tanh) for i < count. `out` may alias either.
void gelu_tanh_mul(const float* gate, const float* up, std::int64_t count, float* out);

// x[i] = cap · tanh(x[i] / cap) for i < count (Gemma 2's soft-capping of attention scores and logits).
void softcap_rows(float* x, std::int64_t count, float cap);

// cos/sin tables for n positions: cos[i][p] = cos(pos[i] · inv_freq[p]) · scale (same for sin), p < half. The
// angle is the f32 product (as an outer product in f32 would give it), its cosine computed in double.
void rope_table(const std::int64_t* pos, std::int64_t n, const float* inv_freq, std::int64_t half, float scale,
                float* cos_out, float* sin_out);

// Rotates x[n][heads][2·half] in place by the angles of row i's table entry: pairs (p, p + half) (the HF
// "rotate_half" layout) or (2p, 2p + 1) (`interleaved`, GGUF's).
void rope_rows(float* x, std::int64_t n, std::int64_t heads, std::int64_t half, const float* cos_tab,
               const float* sin_tab, bool interleaved);

}  // namespace tandem::kernels
