// SiLU(gate) × up on GCC vectors of N floats (kernels/rows.h silu_mul), included by the file of each path:
// kernels.cc (4 lanes, the x86-64 baseline: the scalar path), kernels_avx2.cc (8), kernels_avx512.cc (16), all
// built with -ffp-contract=off. Every lane runs the same IEEE operations as a float alone (no FMA, no libm, no
// branch), so each element's result is the same bits on every path, at any offset and count (test_rows.cc).
#pragma once

#include <cstdint>
#include <cstring>

namespace tandem::kernels::detail {
// Internal linkage and no standard-library function: each path's file keeps its own copies, built with its own flags
// (the ODR note in kernels_avx2.cc: the linker must not pick an AVX-512 copy of the scalar tail for the baseline path).
namespace {

// GCC vectors of N floats and int32s (written out per N: GCC drops a vector_size that depends on a template
// parameter of an alias template).
template <int N>
struct Lanes;
template <>
struct Lanes<4> {
  using F = float __attribute__((vector_size(16)));
  using I = std::int32_t __attribute__((vector_size(16)));
};
template <>
struct Lanes<8> {
  using F = float __attribute__((vector_size(32)));
  using I = std::int32_t __attribute__((vector_size(32)));
};
template <>
struct Lanes<16> {
  using F = float __attribute__((vector_size(64)));
  using I = std::int32_t __attribute__((vector_size(64)));
};

// exp(x) as plain IEEE single operations — Cephes' expf: x = n·ln 2 + r with n = round(x·log2 e) (the add of
// 1.5·2^23 rounds to nearest even), ln 2 in two parts, a degree-6 polynomial in r, 2^n built in the exponent bits —
// with x clamped to [-87.3, 88.3] (2^n then stays a normal number: exp(-87.3) = 1.2e-38, exp(88.3) = 2.2e38).
// About 2 ulp from the true value. F is float or Lanes<N>::F (each lane the float's operations), I the matching
// int32 type.
template <class F, class I>
inline F exp_poly(F x) {
  x = x < -87.3F ? F{} + -87.3F : x;
  x = x > 88.3F ? F{} + 88.3F : x;
  constexpr float kRound = 12582912.0F;  // 1.5 · 2^23
  const F t = x * 1.44269504088896341F + kRound;
  const F n = t - kRound;
  const I ni = __builtin_bit_cast(I, t) - __builtin_bit_cast(std::int32_t, kRound);
  F r = x - n * 0.693359375F;
  r = r - n * -2.12194440e-4F;
  F y = r * 1.9875691500E-4F + 1.3981999507E-3F;
  y = y * r + 8.3334519073E-3F;
  y = y * r + 4.1665795894E-2F;
  y = y * r + 1.6666665459E-1F;
  y = y * r + 5.0000001201E-1F;
  y = y * (r * r) + (r + 1.0F);
  return y * __builtin_bit_cast(F, (ni + 127) << 23);
}

// out[i] = gate[i] / (1 + exp(-gate[i])) * up[i]: N elements at a time, the rest one by one (the same operations).
template <int N>
inline void silu_mul_lanes(const float* gate, const float* up, std::int64_t count, float* out) {
  using V = typename Lanes<N>::F;
  static_assert(sizeof(V) == 4 * N);
  std::int64_t i = 0;
  for (; i + N <= count; i += N) {
    V g, u;
    std::memcpy(&g, gate + i, sizeof g);
    std::memcpy(&u, up + i, sizeof u);
    const V o = g / (1.0F + exp_poly<V, typename Lanes<N>::I>(-g)) * u;
    std::memcpy(out + i, &o, sizeof o);
  }
  for (; i < count; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0F + exp_poly<float, std::int32_t>(-g)) * up[i];
  }
}

}  // namespace
}  // namespace tandem::kernels::detail
