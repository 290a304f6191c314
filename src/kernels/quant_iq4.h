// Internal to the kernels library: the 4-bit non-linear types' reference code (quant_iq4.cc), called by quant.cc's
// dispatch. iq4_nl: blocks of 32 with one f16 scale; iq4_xs: super-blocks of 256 with an f16 scale and eight 6-bit
// sub-block scales. Both map each 4-bit index through llama.cpp's table kIq4NlValues. See quant.h for the meaning.
#pragma once

#include <cstdint>

#include "kernels/types.h"

namespace tandem::kernels::detail {

// ggml's kvalues_iq4nl: the 16 levels (int8) a 4-bit index stands for.
inline constexpr std::int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                 1,    13,   25,  38,  53,  69,  89,  113};

// As llama-quantize writes them (ggml's quantize_iq4_nl / quantize_iq4_xs without an importance matrix: weights
// x², a search over 15 trial scales per block of 32).
void quantize_iq4_nl(const float* x, BlockIQ4_NL* y, std::int64_t nb);
void quantize_iq4_xs(const float* x, BlockIQ4_XS* y, std::int64_t nb);

void dequantize_iq4_nl(const BlockIQ4_NL* x, float* y, std::int64_t nb);
void dequantize_iq4_xs(const BlockIQ4_XS* x, float* y, std::int64_t nb);

// The 6-bit scale of sub-block ib (0..7) of an iq4_xs block, minus 32 (in [-32, 31]).
// (Out of line on purpose: kernels_avx2.cc, built with -mavx2, must not share inline functions with the rest.)
int iq4_xs_scale(const BlockIQ4_XS& b, int ib);

float vec_dot_iq4_nl(std::int64_t nb, const BlockIQ4_NL* w, const BlockQ8_0* a);
float vec_dot_iq4_xs(std::int64_t nb, const BlockIQ4_XS* w, const BlockQ8_K* a);

}  // namespace tandem::kernels::detail
