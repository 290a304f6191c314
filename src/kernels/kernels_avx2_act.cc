// The AVX2 activation quantizers (f32 copies, f16, bf16, q8_0, q8_1, q8_K rows as the reference prepares them), split
// out of kernels_avx2.cc and built with the same flags; its table points at them (kernels_avx2_act.h).
// ODR note: as kernels_avx2.cc, this file includes no standard-library header that would emit out-of-line inline
// functions, so no AVX2-compiled copy of a shared inline function can be picked by the linker for older CPUs.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/kernels_avx2_act.h"
#include "kernels/types.h"

#define TANDEM_UNROLL _Pragma("GCC unroll 16")

namespace tandem::kernels::detail {
namespace {

inline __m256 abs_ps(__m256 v) { return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF))); }

// Largest |x| over n floats (n a multiple of 8), NaN ignored like std::max(amax, |x|) and `if (ax > amax)`:
// _mm256_max_ps(a, b) returns b when a is NaN.
inline float abs_max(const float* x, int n) {
  __m256 m = _mm256_setzero_ps();
  for (int k = 0; k < n; k += 8) m = _mm256_max_ps(abs_ps(_mm256_loadu_ps(x + k)), m);
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 4 x 8 int32 in [-128, 127] -> 32 int8 in element order.
inline __m256i pack_i32_to_i8(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
  const __m256i p16a = _mm256_packs_epi32(i0, i1);
  const __m256i p16b = _mm256_packs_epi32(i2, i3);
  const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
  return _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Eight floats as f16 bits as f32_to_f16 gives them: F16C's rounding (to nearest even, overflow to infinity), a NaN
// as sign | 0x7E00 (F16C would keep part of its payload).
inline __m128i f16_bits8(__m256 v) {
  __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  if (_mm256_movemask_ps(nan) != 0) {
    const __m128i sign = _mm_and_si128(h, _mm_set1_epi16(static_cast<short>(0x8000)));
    const __m128i qnan = _mm_or_si128(sign, _mm_set1_epi16(0x7E00));
    const __m256i n32 = _mm256_castps_si256(nan);
    const __m128i n16 = _mm_packs_epi32(_mm256_castsi256_si128(n32), _mm256_extracti128_si256(n32, 1));
    h = _mm_blendv_epi8(h, qnan, n16);
  }
  return h;
}

}  // namespace

// ---- activation quantizers ------------------------------------------------------------------------------------

void store_f32(const float* x, void* out, std::int64_t cols) {
  std::memcpy(out, x, static_cast<std::size_t>(cols) * sizeof(float));
}

// f32 -> f16, round to nearest even (F16C; NaN becomes sign | 0x7E00 as f32_to_f16 does), widened back to f32: the
// f16 weights' activation format (their tiles then widen only the weights).
void quantize_f16(const float* x, void* out, std::int64_t cols) {
  auto* y = static_cast<float*>(out);
  std::int64_t k = 0;
  for (; k + 8 <= cols; k += 8) _mm256_storeu_ps(y + k, _mm256_cvtph_ps(f16_bits8(_mm256_loadu_ps(x + k))));
  for (; k < cols; ++k) y[k] = f16_to_f32(f32_to_f16(x[k]));
}

// kernels.h f32_to_f16_row: F16C's rounding (to nearest even) with quantize_f16's NaN.
void to_f16_row(const float* x, std::uint16_t* out, std::int64_t n) {
  std::int64_t k = 0;
  for (; k + 8 <= n; k += 8) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), f16_bits8(_mm256_loadu_ps(x + k)));
  for (; k < n; ++k) out[k] = f32_to_f16(x[k]);
}

// f32 -> bf16 as f32_to_bf16: round to nearest even, NaN keeps its upper half with the quiet bit set.
void quantize_bf16(const float* x, void* out, std::int64_t cols) {
  auto* y = static_cast<std::uint16_t*>(out);
  std::int64_t k = 0;
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = _mm256_set1_epi32(0x7F800000);
  for (; k + 16 <= cols; k += 16) {
    __m256i r[2];
    TANDEM_UNROLL
    for (int h = 0; h < 2; ++h) {
      const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + k + 8 * h));
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
      const __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF));
      const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
      const __m256i nanv = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
      const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
      r[h] = _mm256_blendv_epi8(rounded, nanv, is_nan);
    }
    // packus works per 128-bit lane: [r0 lo, r1 lo, r0 hi, r1 hi] -> reorder the 64-bit quarters.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + k), packed);
  }
  for (; k < cols; ++k) y[k] = f32_to_bf16(x[k]);
}

// q8_0 as quantize_act_ref: d = f16(amax / 127), id = 127 / amax, q = x * id rounded to nearest even (cvtps in the
// default MXCSR mode), as llama.cpp's x86 quantize_row_q8_0.
void quantize_q8_0(const float* x, void* out, std::int64_t cols) {
  auto* y = static_cast<BlockQ8_0*>(out);
  const std::int64_t nb = cols / QK8_0;
  for (std::int64_t i = 0; i < nb; ++i, x += QK8_0) {
    const float amax = abs_max(x, QK8_0);
    y[i].d = f32_to_f16(amax / 127.f);
    const float id = amax != 0.f ? 127.f / amax : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    TANDEM_UNROLL
    for (int v = 0; v < 4; ++v) q[v] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * v), vid));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs), pack_i32_to_i8(q[0], q[1], q[2], q[3]));
  }
}

// q8_1 as quantize_act_ref: q8_0's levels and scale, and s = f16(d · Σ q) with d = amax / 127 before rounding.
void quantize_q8_1(const float* x, void* out, std::int64_t cols) {
  auto* y = static_cast<BlockQ8_1*>(out);
  const std::int64_t nb = cols / QK8_1;
  for (std::int64_t i = 0; i < nb; ++i, x += QK8_1) {
    const float amax = abs_max(x, QK8_1);
    const float d = amax / 127.f;
    y[i].d = f32_to_f16(d);
    const float id = amax != 0.f ? 127.f / amax : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    TANDEM_UNROLL
    for (int v = 0; v < 4; ++v) q[v] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * v), vid));
    const __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    alignas(32) std::int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s8);
    int sum = 0;
    for (int l = 0; l < 8; ++l) sum += lanes[l];
    y[i].s = f32_to_f16(d * static_cast<float>(sum));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs), pack_i32_to_i8(q[0], q[1], q[2], q[3]));
  }
}

// q8_K as quantize_act_ref: max = the first element of largest |x|, iscale = -127 / max, q = min(127,
// nearest-even(iscale * x)), bsums over 16s, d = 1 / iscale; an all-zero block is all zero bytes.
void quantize_q8_K(const float* x, void* out, std::int64_t cols) {
  auto* y = static_cast<BlockQ8_K*>(out);
  const std::int64_t nb = cols / QK_K;
  for (std::int64_t i = 0; i < nb; ++i, x += QK_K) {
    const float amax = abs_max(x, QK_K);
    if (amax == 0.f) {
      std::memset(&y[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    const __m256 vamax = _mm256_set1_ps(amax);
    int first = 0;
    for (int k = 0; k < QK_K; k += 8) {
      const int m = _mm256_movemask_ps(_mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + k)), vamax, _CMP_EQ_OQ));
      if (m != 0) {
        first = k + __builtin_ctz(static_cast<unsigned>(m));
        break;
      }
    }
    const float iscale = -127.f / x[first];
    const __m256 vis = _mm256_set1_ps(iscale);
    const __m256i cap = _mm256_set1_epi32(127);
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i ones16 = _mm256_set1_epi16(1);
    for (int k = 0; k < QK_K; k += 32) {
      __m256i q[4];
      TANDEM_UNROLL
      for (int v = 0; v < 4; ++v) {
        // cvtps rounds to nearest even in the default MXCSR mode, as nearest_int's magic-number addition does.
        q[v] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vis, _mm256_loadu_ps(x + k + 8 * v))), cap);
      }
      const __m256i q8 = pack_i32_to_i8(q[0], q[1], q[2], q[3]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs + k), q8);
      // Sums of 16: pairs (maddubs by 1), quads (madd by 1), then within each 128-bit lane.
      __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q8), ones16);
      s = _mm256_hadd_epi32(s, s);
      s = _mm256_hadd_epi32(s, s);
      y[i].bsums[k / 16] = static_cast<std::int16_t>(_mm256_extract_epi32(s, 0));
      y[i].bsums[k / 16 + 1] = static_cast<std::int16_t>(_mm256_extract_epi32(s, 4));
    }
    y[i].d = 1 / iscale;
  }
}

}  // namespace tandem::kernels::detail
