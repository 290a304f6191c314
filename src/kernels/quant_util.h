// Internal to the kernels library: small numeric helpers the reference quantizers share (quant.cc, quant_iq4.cc).
#pragma once

#include <bit>
#include <cstdint>

namespace tandem::kernels::detail {

// ggml's GROUP_MAX_EPS: a group whose largest magnitude is below this quantizes to zeros.
inline constexpr float kGroupMaxEps = 1e-15f;

// Round to nearest, ties to even, via the float adder: adding 1.5 * 2^23 leaves the rounded integer in the low
// mantissa bits. Valid for |f| <= 4194303 (all callers stay far inside); identical to ggml's nearest_int.
inline int nearest_int(float f) {
  const float v = f + 12582912.f;
  const std::int32_t i = std::bit_cast<std::int32_t>(v);
  return (i & 0x007FFFFF) - 0x00400000;
}

// ggml's make_qkx2_quants (quant.cc): unsigned levels [0, nmax] of n values with an offset, x ~ scale * L - the_min,
// searched over nstep + 1 inverse scales by weighted squared (or, use_mad, absolute) error. Returns the scale.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, std::uint8_t* L, float* the_min,
                       std::uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad);

}  // namespace tandem::kernels::detail
