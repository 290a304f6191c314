// Reference (scalar) quantization, dequantization and dot products for every WType. These define the meaning;
// the SIMD kernels (kernels.h) must give the same integers and the same floats up to summation order.
// Torch-free. All functions take counts that are multiples of the type's block size (checked by callers).
#pragma once

#include <cstdint>

#include "kernels/types.h"

namespace tandem::kernels {

// Weights: quantize `n` floats (a multiple of the block size) into blocks of type t, exactly as llama.cpp's
// reference quantizer without an importance matrix (quantize_row_*_ref), so the bytes equal llama-quantize's.
// For f32/f16/bf16 this is a conversion.
void quantize_row(WType t, const float* x, void* out, std::int64_t n);
// Blocks of type t back to floats.
void dequantize_row(WType t, const void* in, float* y, std::int64_t n);

// Activations: prepare an f32 row for dot products with weights of type t (q8_0 blocks for q4_0/q5_0/q8_0, q8_1
// for q4_1/q5_1, q8_K for the
// k-quants, f16 / bf16 / f32 copies for the float types). Writes act_row_bytes(t, n) bytes.
void quantize_act_ref(WType t, const float* x, void* out, std::int64_t n);

// Dot product of one weight row (type t) with one prepared activation row, scalar reference.
float vec_dot_ref(WType t, std::int64_t n, const void* w_row, const void* act_row);

}  // namespace tandem::kernels
