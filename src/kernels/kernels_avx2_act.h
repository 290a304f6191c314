// Internal to the kernels library: the AVX2 activation quantizers (kernels_avx2_act.cc), one row of `cols` floats
// into the activation format of a weight type (QuantizeActFn), for the AVX2 table (kernels_avx2.cc). Call only
// when the CPU has AVX2, FMA and F16C.
#pragma once

#include <cstdint>

namespace tandem::kernels::detail {

void store_f32(const float* x, void* out, std::int64_t cols);
void quantize_f16(const float* x, void* out, std::int64_t cols);
void quantize_bf16(const float* x, void* out, std::int64_t cols);
void to_f16_row(const float* x, std::uint16_t* out, std::int64_t n);
void quantize_q8_0(const float* x, void* out, std::int64_t cols);
void quantize_q8_1(const float* x, void* out, std::int64_t cols);
void quantize_q8_K(const float* x, void* out, std::int64_t cols);

}  // namespace tandem::kernels::detail
