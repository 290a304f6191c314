// q2_K and q3_K: llama.cpp's block layouts and reference quantizers (ggml-quants.c, quantize_row_q2_K_ref and
// quantize_row_q3_K_ref, what llama-quantize runs without an importance matrix), operation for operation so the bytes
// match; compiled with -ffp-contract=off like quant.cc. Dot products with q8_K activations: exact int32 sums per
// block, one float combination per block.
#include "kernels/quant_k23.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/quant_util.h"

namespace tandem::kernels::detail {
namespace {

// ggml's make_q3_quants with do_rmse: signed levels in [-nmax, nmax-1] from -nmax / max, then up to 5 passes that
// move single levels where that raises (Σ w x l)² / Σ w l² (w = x²). L receives level + nmax (0 for an all-zero
// group). Returns the scale Σ w x l / Σ w l².
float make_q3_quants(int n, int nmax, const float* x, std::int8_t* L) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  const float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<std::int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * static_cast<float>(L[i]);
      if (slx > 0) {
        float sl2 = suml2 - w * static_cast<float>(L[i]) * static_cast<float>(L[i]);
        int new_l = nearest_int(x[i] * sl2 / slx);
        new_l = std::max(-nmax, std::min(nmax - 1, new_l));
        if (new_l != L[i]) {
          slx += w * x[i] * static_cast<float>(new_l);
          sl2 += w * static_cast<float>(new_l) * static_cast<float>(new_l);
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<std::int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (n_changed == 0) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<std::int8_t>(L[i] + nmax);
  return sumlx / suml2;
}

// 2-bit fields: element j + 32 s of a 128-element half lives in bits 2s..2s+1 of byte j of that half's 32 bytes.
void pack_2bit(const std::uint8_t* L, std::uint8_t* qs) {
  for (int j = 0; j < QK_K; j += 128)
    for (int l = 0; l < 32; ++l)
      qs[j / 4 + l] = static_cast<std::uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                                (L[j + l + 96] << 6));
}

inline int two_bits(const std::uint8_t* qs, int k) { return (qs[32 * (k / 128) + k % 32] >> (2 * ((k % 128) / 32))) & 3; }

}  // namespace

int q2_K_level(const BlockQ2_K& b, int k) { return two_bits(b.qs, k); }

int q3_K_level(const BlockQ3_K& b, int k) {
  const int high = (b.hmask[k % 32] >> (k / 32)) & 1;
  return two_bits(b.qs, k) + 4 * high - 4;
}

int q3_K_scale(const BlockQ3_K& b, int j) {
  const int low = j < 8 ? b.scales[j] & 0xF : b.scales[j - 8] >> 4;
  const int high = (b.scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

void quantize_q2_K(const float* x, BlockQ2_K* y, std::int64_t nb) {
  std::uint8_t L[QK_K];
  std::uint8_t Laux[16];
  float weights[16];
  float mins[QK_K / 16];
  float scales[QK_K / 16];
  const float q4scale = 15.f;
  for (std::int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max_scale = 0;  // as the min is deducted, scales are never negative
    float max_min = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
      const float iscale = q4scale / max_scale;
      for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] = static_cast<std::uint8_t>(nearest_int(iscale * scales[j]));
      y[i].d = f32_to_f16(max_scale / q4scale);
    } else {
      for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] = 0;
      y[i].d = f32_to_f16(0.f);
    }
    if (max_min > 0) {
      const float iscale = q4scale / max_min;
      for (int j = 0; j < QK_K / 16; ++j)
        y[i].scales[j] = static_cast<std::uint8_t>(y[i].scales[j] | (nearest_int(iscale * mins[j]) << 4));
      y[i].dmin = f32_to_f16(max_min / q4scale);
    } else {
      y[i].dmin = f32_to_f16(0.f);
    }
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = f16_to_f32(y[i].d) * static_cast<float>(y[i].scales[j] & 0xF);
      if (d == 0.f) continue;
      const float dm = f16_to_f32(y[i].dmin) * static_cast<float>(y[i].scales[j] >> 4);
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int((x[16 * j + ii] + dm) / d);
        L[16 * j + ii] = static_cast<std::uint8_t>(std::max(0, std::min(3, l)));
      }
    }
    pack_2bit(L, y[i].qs);
  }
}

void quantize_q3_K(const float* x, BlockQ3_K* y, std::int64_t nb) {
  std::int8_t L[QK_K];
  float scales[QK_K / 16];
  for (std::int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max_scale = 0;
    float amax = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
      const float scale = std::fabs(scales[j]);
      if (scale > amax) {
        amax = scale;
        max_scale = scales[j];
      }
    }
    std::memset(y[i].scales, 0, sizeof y[i].scales);
    if (max_scale != 0.f) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < QK_K / 16; ++j) {
        // (ggml keeps l in an int8_t: nearest_int's result fits, |iscale * scale_j| <= 32)
        int l = static_cast<std::int8_t>(nearest_int(iscale * scales[j]));
        l = std::max(-32, std::min(31, l)) + 32;
        if (j < 8) y[i].scales[j] = static_cast<std::uint8_t>(l & 0xF);
        else y[i].scales[j - 8] = static_cast<std::uint8_t>(y[i].scales[j - 8] | ((l & 0xF) << 4));
        l >>= 4;
        y[i].scales[j % 4 + 8] = static_cast<std::uint8_t>(y[i].scales[j % 4 + 8] | (l << (2 * (j / 4))));
      }
      y[i].d = f32_to_f16(1 / iscale);
    } else {
      y[i].d = f32_to_f16(0.f);
    }
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = f16_to_f32(y[i].d) * static_cast<float>(q3_K_scale(y[i], j));
      if (d == 0.f) continue;
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int(x[16 * j + ii] / d);
        L[16 * j + ii] = static_cast<std::int8_t>(std::max(-4, std::min(3, l)) + 4);
      }
    }
    std::memset(y[i].hmask, 0, sizeof y[i].hmask);
    // The high bit of the first 32 levels goes to bit 0 of hmask[0..31], of the next 32 to bit 1, and so on.
    std::uint8_t low[QK_K];
    for (int j = 0; j < QK_K; ++j) {
      int v = L[j];
      if (v > 3) {
        y[i].hmask[j % 32] = static_cast<std::uint8_t>(y[i].hmask[j % 32] | (1 << (j / 32)));
        v -= 4;
      }
      low[j] = static_cast<std::uint8_t>(v);
    }
    pack_2bit(low, y[i].qs);
  }
}

void dequantize_q2_K(const BlockQ2_K* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, y += QK_K) {
    const float d = f16_to_f32(x[i].d);
    const float min = f16_to_f32(x[i].dmin);
    for (int k = 0; k < QK_K; ++k) {
      const std::uint8_t sc = x[i].scales[k / 16];
      const float dl = d * static_cast<float>(sc & 0xF);
      const float ml = min * static_cast<float>(sc >> 4);
      y[k] = dl * static_cast<float>(q2_K_level(x[i], k)) - ml;
    }
  }
}

void dequantize_q3_K(const BlockQ3_K* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, y += QK_K) {
    const float d_all = f16_to_f32(x[i].d);
    for (int k = 0; k < QK_K; ++k) {
      const float dl = d_all * static_cast<float>(q3_K_scale(x[i], k / 16));
      y[k] = dl * static_cast<float>(q3_K_level(x[i], k));
    }
  }
}

// q2_K: isum = Σ_j (sc_j & 15) Σ_{k in j} level_k aq_k, msum = Σ_j (sc_j >> 4) bsums_j (both exact int32);
// sumf += (d_w d_a) isum - (dmin_w d_a) msum.
float vec_dot_q2_K(std::int64_t nb, const BlockQ2_K* w, const BlockQ8_K* a) {
  float sumf = 0;
  for (std::int64_t i = 0; i < nb; ++i) {
    std::int32_t isum = 0;
    std::int32_t msum = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
      std::int32_t s = 0;
      for (int k = 16 * j; k < 16 * j + 16; ++k) s += q2_K_level(w[i], k) * a[i].qs[k];
      isum += (w[i].scales[j] & 0xF) * s;
      msum += (w[i].scales[j] >> 4) * a[i].bsums[j];
    }
    const float d = f16_to_f32(w[i].d) * a[i].d;
    const float dmin = f16_to_f32(w[i].dmin) * a[i].d;
    sumf += d * static_cast<float>(isum) - dmin * static_cast<float>(msum);
  }
  return sumf;
}

// q3_K: isum = Σ_j scale_j Σ_{k in j} level_k aq_k, exact int32; sumf += (d_w d_a) isum.
float vec_dot_q3_K(std::int64_t nb, const BlockQ3_K* w, const BlockQ8_K* a) {
  float sumf = 0;
  for (std::int64_t i = 0; i < nb; ++i) {
    std::int32_t isum = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
      std::int32_t s = 0;
      for (int k = 16 * j; k < 16 * j + 16; ++k) s += q3_K_level(w[i], k) * a[i].qs[k];
      isum += q3_K_scale(w[i], j) * s;
    }
    sumf += (f16_to_f32(w[i].d) * a[i].d) * static_cast<float>(isum);
  }
  return sumf;
}

}  // namespace tandem::kernels::detail
