#include "kernels/rows.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace tandem::kernels {
namespace {

// exp(x) as plain IEEE single operations — Cephes' expf: x = n·ln 2 + r with n = round(x·log2 e) (the add of
// 1.5·2^23 rounds to nearest even), ln 2 in two parts, a degree-6 polynomial in r, 2^n built in the exponent bits —
// with x clamped to [-87.3, 88.3] (2^n then stays a normal number: exp(-87.3) = 1.2e-38, exp(88.3) = 2.2e38).
// About 2 ulp from the true value. For a float or a GCC vector of floats (V4: 4 lanes, one SSE register of the
// baseline x86-64 this file is built for; each lane the float's operations): no libm call, no branch and no FMA
// (this file is built with -ffp-contract=off), so a lane gives the same bits as the float alone on any machine.
using V4 = float __attribute__((vector_size(16)));
using I4 = std::int32_t __attribute__((vector_size(16)));
template <class F>
inline F splat(float v) {
  if constexpr (std::is_same_v<F, float>) return v;
  else return F{v, v, v, v};
}
template <class F, class I>
inline F exp_poly(F x) {
  const F lo = splat<F>(-87.3F), hi = splat<F>(88.3F);
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  constexpr float kRound = 12582912.0F;  // 1.5 · 2^23
  const F t = x * 1.44269504088896341F + kRound;
  const F n = t - kRound;
  const I ni = std::bit_cast<I>(t) - std::bit_cast<std::int32_t>(kRound);
  F r = x - n * 0.693359375F;
  r = r - n * -2.12194440e-4F;
  F y = r * 1.9875691500E-4F + 1.3981999507E-3F;
  y = y * r + 8.3334519073E-3F;
  y = y * r + 4.1665795894E-2F;
  y = y * r + 1.6666665459E-1F;
  y = y * r + 5.0000001201E-1F;
  y = y * (r * r) + (r + 1.0F);
  return y * std::bit_cast<F>((ni + 127) << 23);
}

}  // namespace

void rmsnorm_rows(const float* x, const float* w, std::int64_t n, std::int64_t d, float eps, float* out) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float* xr = x + i * d;
    double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::int64_t j = 0;
    for (; j + 8 <= d; j += 8)
      for (int l = 0; l < 8; ++l) part[l] += static_cast<double>(xr[j + l]) * static_cast<double>(xr[j + l]);
    for (int l = 0; j < d; ++j, ++l) part[l] += static_cast<double>(xr[j]) * static_cast<double>(xr[j]);
    const double sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    const auto r = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(d) + static_cast<double>(eps)));
    float* o = out + i * d;
    for (j = 0; j < d; ++j) o[j] = (xr[j] * r) * w[j];
  }
}

void silu_mul(const float* gate, const float* up, std::int64_t count, float* out) {
  // 4 elements at a time (the same operations per lane as the rest's one by one).
  std::int64_t i = 0;
  for (; i + 4 <= count; i += 4) {
    V4 g, u;
    std::memcpy(&g, gate + i, sizeof g);
    std::memcpy(&u, up + i, sizeof u);
    const V4 o = g / (1.0F + exp_poly<V4, I4>(-g)) * u;
    std::memcpy(out + i, &o, sizeof o);
  }
  for (; i < count; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0F + exp_poly<float, std::int32_t>(-g)) * up[i];
  }
}

void gelu_tanh_mul(const float* gate, const float* up, std::int64_t count, float* out) {
  constexpr float kSqrt2OverPi = 0.7978845608028654F;
  for (std::int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    out[i] = 0.5F * g * (1.0F + std::tanh(kSqrt2OverPi * (g + 0.044715F * g * g * g))) * up[i];
  }
}

void softcap_rows(float* x, std::int64_t count, float cap) {
  for (std::int64_t i = 0; i < count; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

void rope_table(const std::int64_t* pos, std::int64_t n, const float* inv_freq, std::int64_t half, float scale,
                float* cos_out, float* sin_out) {
  for (std::int64_t i = 0; i < n; ++i) {
    const auto p = static_cast<float>(pos[i]);
    for (std::int64_t k = 0; k < half; ++k) {
      const double a = static_cast<double>(p * inv_freq[k]);
      cos_out[i * half + k] = static_cast<float>(std::cos(a)) * scale;
      sin_out[i * half + k] = static_cast<float>(std::sin(a)) * scale;
    }
  }
}

void rope_rows(float* x, std::int64_t n, std::int64_t heads, std::int64_t half, const float* cos_tab,
               const float* sin_tab, bool interleaved) {
  const std::int64_t hd = 2 * half;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* c = cos_tab + i * half;
    const float* s = sin_tab + i * half;
    for (std::int64_t h = 0; h < heads; ++h) {
      float* v = x + (i * heads + h) * hd;
      for (std::int64_t k = 0; k < half; ++k) {
        float* a = interleaved ? v + 2 * k : v + k;
        float* b = interleaved ? v + 2 * k + 1 : v + k + half;
        const float x1 = *a, x2 = *b;
        *a = x1 * c[k] - x2 * s[k];
        *b = x2 * c[k] + x1 * s[k];
      }
    }
  }
}

}  // namespace tandem::kernels
