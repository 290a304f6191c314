// RMSNorm and the rotary embedding on GCC vectors (kernels/rows.h rmsnorm_rows, rope_rows), included by the file of
// each path like silu_lanes.h: kernels.cc (4 lanes), kernels_avx2.cc (8), kernels_avx512.cc (16), all built with
// -ffp-contract=off. Each lane runs the operations a float alone would, in the same order (RMSNorm's 8 partial sums
// in double are 8 lanes of one vector at every width), so each element is the same bits on every path (test_rows.cc).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/silu_lanes.h"

namespace tandem::kernels::detail {
namespace {

template <int N>
inline void rmsnorm_lanes(const float* x, const float* w, std::int64_t n, std::int64_t d, float eps, float* out) {
  using F8 = float __attribute__((vector_size(32)));
  using D8 = double __attribute__((vector_size(64)));
  using V = typename Lanes<N>::F;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* xr = x + i * d;
    // Partial sum l takes the elements j ≡ l (mod 8), in order: lane l of `part`.
    D8 part = {0, 0, 0, 0, 0, 0, 0, 0};
    std::int64_t j = 0;
    for (; j + 8 <= d; j += 8) {
      F8 f;
      std::memcpy(&f, xr + j, sizeof f);
      const D8 v = __builtin_convertvector(f, D8);
      part += v * v;
    }
    double p[8];
    std::memcpy(p, &part, sizeof p);
    for (int l = 0; j < d; ++j, ++l) p[l] += static_cast<double>(xr[j]) * static_cast<double>(xr[j]);
    const double sum = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
    const auto r = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(d) + static_cast<double>(eps)));
    float* o = out + i * d;
    for (j = 0; j + N <= d; j += N) {
      V xv, wv;
      std::memcpy(&xv, xr + j, sizeof xv);
      std::memcpy(&wv, w + j, sizeof wv);
      const V ov = (xv * r) * wv;
      std::memcpy(o + j, &ov, sizeof ov);
    }
    for (; j < d; ++j) o[j] = (xr[j] * r) * w[j];
  }
}

// Pairs (p, p + half), N angles at a time; the interleaved layout (2p, 2p + 1) one pair at a time.
template <int N>
inline void rope_lanes(float* x, std::int64_t n, std::int64_t heads, std::int64_t half, const float* cos_tab,
                       const float* sin_tab, bool interleaved) {
  using V = typename Lanes<N>::F;
  const std::int64_t hd = 2 * half;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* c = cos_tab + i * half;
    const float* s = sin_tab + i * half;
    for (std::int64_t h = 0; h < heads; ++h) {
      float* v = x + (i * heads + h) * hd;
      std::int64_t k = 0;
      if (!interleaved) {
        for (; k + N <= half; k += N) {
          V a, b, cv, sv;
          std::memcpy(&a, v + k, sizeof a);
          std::memcpy(&b, v + k + half, sizeof b);
          std::memcpy(&cv, c + k, sizeof cv);
          std::memcpy(&sv, s + k, sizeof sv);
          const V na = a * cv - b * sv, nb = b * cv + a * sv;
          std::memcpy(v + k, &na, sizeof na);
          std::memcpy(v + k + half, &nb, sizeof nb);
        }
      }
      for (; k < half; ++k) {
        float* a = interleaved ? v + 2 * k : v + k;
        float* b = interleaved ? v + 2 * k + 1 : v + k + half;
        const float x1 = *a, x2 = *b;
        *a = x1 * c[k] - x2 * s[k];
        *b = x2 * c[k] + x1 * s[k];
      }
    }
  }
}

}  // namespace
}  // namespace tandem::kernels::detail
