// Internal to the kernels library: the 2- and 3-bit k-quants' reference code (quant_k23.cc), called by quant.cc's
// dispatch. q2_K: 16 sub-blocks of 16 with 4-bit scales and mins; q3_K: 16 sub-blocks of 16 with signed 6-bit
// scales, levels in [-4, 3] (two low bits in qs, the third in hmask). See quant.h for the meaning.
#pragma once

#include <cstdint>

#include "kernels/types.h"

namespace tandem::kernels::detail {

// As llama-quantize writes them without an importance matrix (ggml's quantize_row_q2_K_ref / _q3_K_ref).
void quantize_q2_K(const float* x, BlockQ2_K* y, std::int64_t nb);
void quantize_q3_K(const float* x, BlockQ3_K* y, std::int64_t nb);

void dequantize_q2_K(const BlockQ2_K* x, float* y, std::int64_t nb);
void dequantize_q3_K(const BlockQ3_K* x, float* y, std::int64_t nb);

// Level of element k (0..255) of a block: q2_K in [0, 3]; q3_K in [-4, 3].
int q2_K_level(const BlockQ2_K& b, int k);
int q3_K_level(const BlockQ3_K& b, int k);
// The signed 6-bit scale of sub-block j (0..15) of a q3_K block, in [-32, 31].
int q3_K_scale(const BlockQ3_K& b, int j);

float vec_dot_q2_K(std::int64_t nb, const BlockQ2_K* w, const BlockQ8_K* a);
float vec_dot_q3_K(std::int64_t nb, const BlockQ3_K* w, const BlockQ8_K* a);

}  // namespace tandem::kernels::detail
