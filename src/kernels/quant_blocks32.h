// Internal to the kernels library: the 32-element block types' reference code (quant_blocks32.cc), called by
// quant.cc's dispatch (quantize_row, dequantize_row, quantize_act_ref, vec_dot_ref). See quant.h for the meaning.
#pragma once

#include <cstdint>

#include "kernels/types.h"

namespace tandem::kernels::detail {

void quantize_q8_0(const float* x, BlockQ8_0* y, std::int64_t nb);
void quantize_act_q8_0(const float* x, BlockQ8_0* y, std::int64_t nb);  // activations: llama.cpp's x86 rounding
void quantize_q4_0(const float* x, BlockQ4_0* y, std::int64_t nb);
void quantize_q5_0(const float* x, BlockQ5_0* y, std::int64_t nb);
void quantize_q4_1(const float* x, BlockQ4_1* y, std::int64_t nb);
void quantize_q5_1(const float* x, BlockQ5_1* y, std::int64_t nb);
void quantize_act_q8_1(const float* x, BlockQ8_1* y, std::int64_t nb);

void dequantize_q8_0(const BlockQ8_0* x, float* y, std::int64_t nb);
void dequantize_q4_0(const BlockQ4_0* x, float* y, std::int64_t nb);
void dequantize_q5_0(const BlockQ5_0* x, float* y, std::int64_t nb);
void dequantize_q4_1(const BlockQ4_1* x, float* y, std::int64_t nb);
void dequantize_q5_1(const BlockQ5_1* x, float* y, std::int64_t nb);

float vec_dot_q8_0(std::int64_t nb, const BlockQ8_0* w, const BlockQ8_0* a);
float vec_dot_q4_0(std::int64_t nb, const BlockQ4_0* w, const BlockQ8_0* a);
float vec_dot_q5_0(std::int64_t nb, const BlockQ5_0* w, const BlockQ8_0* a);
float vec_dot_q4_1(std::int64_t nb, const BlockQ4_1* w, const BlockQ8_1* a);
float vec_dot_q5_1(std::int64_t nb, const BlockQ5_1* w, const BlockQ8_1* a);

}  // namespace tandem::kernels::detail
