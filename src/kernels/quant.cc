// Reference quantization, dequantization and dot products. The quantizers follow llama.cpp's reference
// quantizers without an importance matrix (ggml-quants.c: quantize_row_*_ref) operation for operation, so the
// output bytes equal llama-quantize's: every float expression keeps llama.cpp's operand order and rounding
// (nearest_int's magic-number rounding, roundf for q8_0, truncation for q4_0, f16 round trips of scales), and this
// file is compiled with -ffp-contract=off. docs/kernels.md ("Quantization semantics") states the meaning.
#include "kernels/quant.h"

#include "kernels/quant_blocks32.h"
#include "kernels/quant_iq4.h"
#include "kernels/quant_k23.h"
#include "kernels/quant_util.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace tandem::kernels {
using namespace detail;  // the 32-element block types (quant_blocks32.cc)
namespace {

inline float fp16_round(float f) { return f16_to_f32(f32_to_f16(f)); }

// 6-bit scale and min of sub-block j (0..7) of a q4_K / q5_K block (ggml's get_scale_min_k4).
inline void get_scale_min_k4(int j, const std::uint8_t* q, std::uint8_t* sc, std::uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<std::uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<std::uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// ---- quantizer helpers (ggml's make_qx_quants with rmse_type 1 and no weights; make_qkx2_quants) -------------

// Signed symmetric levels in [-nmax, nmax-1] for n values, weighted least squares with weights x^2, trying 18
// scale perturbations around -nmax / max. L receives level + nmax. Returns the scale.
float make_qx_quants_rmse1(int n, int nmax, const float* x, std::int8_t* L) {
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
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<std::int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  float scale = suml2 != 0.f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    sumlx = 0;
    suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * static_cast<float>(l);
      suml2 += w * static_cast<float>(l) * static_cast<float>(l);
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = static_cast<std::int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

}  // namespace

// Unsigned levels [0, nmax] with an offset: x ~ scale * L - the_min. Starts from the min/max fit, then tries
// nstep + 1 inverse scales (rmin + rdelta * is + nmax) / (max - min), each refined by weighted least squares for
// scale and min, keeping the one with the smallest weighted error (squared, or absolute with use_mad). Returns the
// scale; *the_min >= 0 is the (negated) offset.
float detail::make_qkx2_quants(int n, int nmax, const float* x, const float* weights, std::uint8_t* L,
                               float* the_min, std::uint8_t* Laux, float rmin, float rdelta, int nstep,
                               bool use_mad) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<std::uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * static_cast<float>(L[i]) + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0;
    float sum_l2 = 0;
    float sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      Laux[i] = static_cast<std::uint8_t>(l);
      const float w = weights[i];
      const float fl = static_cast<float>(l);
      sum_l += w * fl;
      sum_l2 += w * fl * fl;
      sum_xl += w * fl * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * static_cast<float>(Laux[i]) + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

namespace {

// ---- k-quant quantizers (the 32-element types: quant_blocks32.cc) ---------------------------------------------

// q4_K and q5_K share the scale search: per 32-element sub-block make_qkx2_quants, then 6-bit scales and mins
// relative to the block maxima, then a requantization against the f16-rounded block scales.
template <int kNmax>
void quantize_k_scales_mins(const float* x, std::uint8_t* scales_out, f16_bits* d_out, f16_bits* dmin_out,
                            std::uint8_t* L, float rmin, float rdelta, int nstep) {
  std::uint8_t Laux[32];
  float weights[32];
  float mins[QK_K / 32];
  float scales[QK_K / 32];
  float max_scale = 0;
  float max_min = 0;
  for (int j = 0; j < QK_K / 32; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, kNmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, rdelta, nstep,
                                 false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  for (int j = 0; j < QK_K / 32; ++j) {
    // uint8_t conversion first (as ggml), then the cap at 63.
    std::uint8_t ls = static_cast<std::uint8_t>(nearest_int(inv_scale * scales[j]));
    std::uint8_t lm = static_cast<std::uint8_t>(nearest_int(inv_min * mins[j]));
    ls = std::min<std::uint8_t>(63, ls);
    lm = std::min<std::uint8_t>(63, lm);
    if (j < 4) {
      scales_out[j] = ls;
      scales_out[j + 4] = lm;
    } else {
      scales_out[j + 4] = static_cast<std::uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      scales_out[j - 4] = static_cast<std::uint8_t>(scales_out[j - 4] | ((ls >> 4) << 6));
      scales_out[j] = static_cast<std::uint8_t>(scales_out[j] | ((lm >> 4) << 6));
    }
  }
  *d_out = f32_to_f16(max_scale / 63.f);
  *dmin_out = f32_to_f16(max_min / 63.f);
  for (int j = 0; j < QK_K / 32; ++j) {
    std::uint8_t sc;
    std::uint8_t m;
    get_scale_min_k4(j, scales_out, &sc, &m);
    const float d = f16_to_f32(*d_out) * static_cast<float>(sc);
    if (d == 0.f) continue;  // keeps make_qkx2_quants' levels, as ggml does
    const float dm = f16_to_f32(*dmin_out) * static_cast<float>(m);
    for (int ii = 0; ii < 32; ++ii) {
      const int l = nearest_int((x[32 * j + ii] + dm) / d);
      L[32 * j + ii] = static_cast<std::uint8_t>(std::max(0, std::min(kNmax, l)));
    }
  }
}

void quantize_q4_K(const float* x, BlockQ4_K* y, std::int64_t nb) {
  std::uint8_t L[QK_K];
  for (std::int64_t i = 0; i < nb; ++i, x += QK_K) {
    std::memset(y[i].scales, 0, sizeof(y[i].scales));
    quantize_k_scales_mins<15>(x, y[i].scales, &y[i].d, &y[i].dmin, L, -1.f, 0.1f, 20);
    std::uint8_t* q = y[i].qs;
    for (int j = 0; j < QK_K; j += 64, q += 32) {
      for (int l = 0; l < 32; ++l) q[l] = static_cast<std::uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    }
  }
}

void quantize_q5_K(const float* x, BlockQ5_K* y, std::int64_t nb) {
  std::uint8_t L[QK_K];
  for (std::int64_t i = 0; i < nb; ++i, x += QK_K) {
    std::memset(y[i].scales, 0, sizeof(y[i].scales));
    quantize_k_scales_mins<31>(x, y[i].scales, &y[i].d, &y[i].dmin, L, -0.5f, 0.1f, 15);
    std::uint8_t* qh = y[i].qh;
    std::uint8_t* ql = y[i].qs;
    std::memset(qh, 0, QK_K / 8);
    std::uint8_t m1 = 1;
    std::uint8_t m2 = 2;
    for (int n = 0; n < QK_K; n += 64, ql += 32) {
      for (int j = 0; j < 32; ++j) {
        int l1 = L[n + j];
        if (l1 > 15) {
          l1 -= 16;
          qh[j] |= m1;
        }
        int l2 = L[n + j + 32];
        if (l2 > 15) {
          l2 -= 16;
          qh[j] |= m2;
        }
        ql[j] = static_cast<std::uint8_t>(l1 | (l2 << 4));
      }
      m1 = static_cast<std::uint8_t>(m1 << 2);
      m2 = static_cast<std::uint8_t>(m2 << 2);
    }
  }
}

void quantize_q6_K(const float* x, BlockQ6_K* y, std::int64_t nb) {
  std::int8_t L[QK_K];
  float scales[QK_K / 16];
  for (std::int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max_scale = 0;
    float max_abs_scale = 0;
    for (int ib = 0; ib < QK_K / 16; ++ib) {
      const float scale = make_qx_quants_rmse1(16, 32, x + 16 * ib, L + 16 * ib);
      scales[ib] = scale;
      const float abs_scale = std::fabs(scale);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = scale;
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y[i], 0, sizeof(BlockQ6_K));
      y[i].d = f32_to_f16(0.f);
      continue;
    }
    const float iscale = -128.f / max_scale;
    y[i].d = f32_to_f16(1 / iscale);
    for (int ib = 0; ib < QK_K / 16; ++ib) {
      y[i].scales[ib] = static_cast<std::int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
    }
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = f16_to_f32(y[i].d) * static_cast<float>(y[i].scales[j]);
      if (d == 0.f) continue;  // keeps make_qx_quants' levels, as ggml does
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int(x[16 * j + ii] / d);
        l = std::max(-32, std::min(31, l));
        L[16 * j + ii] = static_cast<std::int8_t>(l + 32);
      }
    }
    std::uint8_t* ql = y[i].ql;
    std::uint8_t* qh = y[i].qh;
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const int q1 = L[j + l + 0] & 0xF;
        const int q2 = L[j + l + 32] & 0xF;
        const int q3 = L[j + l + 64] & 0xF;
        const int q4 = L[j + l + 96] & 0xF;
        ql[l + 0] = static_cast<std::uint8_t>(q1 | (q3 << 4));
        ql[l + 32] = static_cast<std::uint8_t>(q2 | (q4 << 4));
        qh[l] = static_cast<std::uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                          ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
      }
    }
  }
}

// q8_K activations: symmetric 8-bit with scale max / -127 as an f32, plus sums of 16-element groups.
void quantize_q8_K(const float* x, BlockQ8_K* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max = 0;
    float amax = 0;
    for (int j = 0; j < QK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0.f) {
      // ggml leaves bsums unwritten here; we define them as zero.
      std::memset(&y[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < QK_K; ++j) {
      y[i].qs[j] = static_cast<std::int8_t>(std::min(127, nearest_int(iscale * x[j])));
    }
    for (int j = 0; j < QK_K / 16; ++j) {
      int sum = 0;
      for (int ii = 0; ii < 16; ++ii) sum += y[i].qs[j * 16 + ii];
      y[i].bsums[j] = static_cast<std::int16_t>(sum);
    }
    y[i].d = 1 / iscale;
  }
}

// ---- dequantizers (same operation order as ggml's dequantize_row_*) -----------------------------------------

void dequantize_q4_K(const BlockQ4_K* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i) {
    const std::uint8_t* q = x[i].qs;
    const float d = f16_to_f32(x[i].d);
    const float min = f16_to_f32(x[i].dmin);
    for (int j = 0, is = 0; j < QK_K; j += 64, q += 32, is += 2) {
      std::uint8_t sc;
      std::uint8_t m;
      get_scale_min_k4(is, x[i].scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = min * m;
      get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void dequantize_q5_K(const BlockQ5_K* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i) {
    const std::uint8_t* ql = x[i].qs;
    const std::uint8_t* qh = x[i].qh;
    const float d = f16_to_f32(x[i].d);
    const float min = f16_to_f32(x[i].dmin);
    std::uint8_t u1 = 1;
    std::uint8_t u2 = 2;
    for (int j = 0, is = 0; j < QK_K; j += 64, ql += 32, is += 2) {
      std::uint8_t sc;
      std::uint8_t m;
      get_scale_min_k4(is, x[i].scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = min * m;
      get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      u1 = static_cast<std::uint8_t>(u1 << 2);
      u2 = static_cast<std::uint8_t>(u2 << 2);
    }
  }
}

// The signed 6-bit quant of element k (0..255) of a q6_K block, in [-32, 31].
inline int q6_K_quant(const BlockQ6_K& b, int k) {
  const int half = k / 128;  // 128-element halves: ql[64 * half ..], qh[32 * half ..]
  const int r = k % 128;
  const int l = r % 32;
  const int quarter = r / 32;  // 0: ql low, 32-row; 1: ql+32 low; 2: ql high; 3: ql+32 high
  const std::uint8_t ql = b.ql[64 * half + l + (quarter & 1) * 32];
  const int low = (quarter < 2) ? (ql & 0xF) : (ql >> 4);
  const int high = (b.qh[32 * half + l] >> (2 * quarter)) & 3;
  return (low | (high << 4)) - 32;
}

void dequantize_q6_K(const BlockQ6_K* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, y += QK_K) {
    const float d = f16_to_f32(x[i].d);
    for (int k = 0; k < QK_K; ++k) {
      // ggml: d * sc * q, evaluated left to right.
      y[k] = d * static_cast<float>(x[i].scales[k / 16]) * static_cast<float>(q6_K_quant(x[i], k));
    }
  }
}

// ---- dot products --------------------------------------------------------------------------------------------

// q4_K / q5_K: element k's level (0..15 / 0..31) from the quant bytes.
inline int q4_K_level(const BlockQ4_K& b, int k) {
  const std::uint8_t byte = b.qs[32 * (k / 64) + k % 32];
  return (k % 64) < 32 ? (byte & 0xF) : (byte >> 4);
}
inline int q5_K_level(const BlockQ5_K& b, int k) {
  const std::uint8_t byte = b.qs[32 * (k / 64) + k % 32];
  const int low = (k % 64) < 32 ? (byte & 0xF) : (byte >> 4);
  const int high = (b.qh[k % 32] >> (k / 32)) & 1;
  return low | (high << 4);
}

// sum_k w_k a_k over one super-block, with w_k = d * sc_j * q_k - dmin * m_j (j = k / 32) and a_k = da * qa_k:
//   d * da * sum_j sc_j * (sum_{k in j} q_k qa_k)  -  dmin * da * sum_j m_j * (bsums[2j] + bsums[2j+1]).
// Both integer sums are exact in int32.
template <typename Block, int (*level)(const Block&, int)>
float vec_dot_k_minned(std::int64_t nb, const Block* w, const BlockQ8_K* a) {
  float sumf = 0;
  for (std::int64_t i = 0; i < nb; ++i) {
    std::int32_t isum = 0;
    std::int32_t msum = 0;
    for (int j = 0; j < QK_K / 32; ++j) {
      std::uint8_t sc;
      std::uint8_t m;
      get_scale_min_k4(j, w[i].scales, &sc, &m);
      std::int32_t s = 0;
      for (int k = 32 * j; k < 32 * j + 32; ++k) s += level(w[i], k) * a[i].qs[k];
      isum += sc * s;
      msum += m * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
    }
    const float d = f16_to_f32(w[i].d) * a[i].d;
    const float dmin = f16_to_f32(w[i].dmin) * a[i].d;
    sumf += d * static_cast<float>(isum) - dmin * static_cast<float>(msum);
  }
  return sumf;
}

float vec_dot_q6_K(std::int64_t nb, const BlockQ6_K* w, const BlockQ8_K* a) {
  float sumf = 0;
  for (std::int64_t i = 0; i < nb; ++i) {
    std::int32_t isum = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
      std::int32_t s = 0;
      for (int k = 16 * j; k < 16 * j + 16; ++k) s += q6_K_quant(w[i], k) * a[i].qs[k];
      isum += w[i].scales[j] * s;
    }
    sumf += (f16_to_f32(w[i].d) * a[i].d) * static_cast<float>(isum);
  }
  return sumf;
}

// Float types: each product rounded to f32 (exact for f16 x f16 and bf16 x bf16 in the normal range), summed in
// double, the total rounded to f32 once: ggml's scalar ggml_vec_dot_f16 / _bf16 / _f32.
inline float f32_identity(float f) { return f; }

// (f16 weights take their activations as f16-rounded values held as f32: the same products.)
template <typename T, float (*to_f32)(T), typename A = T, float (*act_f32)(A) = to_f32>
float vec_dot_float(std::int64_t n, const T* w, const A* a) {
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += static_cast<double>(to_f32(w[i]) * act_f32(a[i]));
  return static_cast<float>(sum);
}

}  // namespace

void quantize_row(WType t, const float* x, void* out, std::int64_t n) {
  const std::int64_t nb = n / traits(t).block_elems;
  switch (t) {
    case WType::f32: std::memcpy(out, x, static_cast<std::size_t>(n) * sizeof(float)); return;
    case WType::f16: {
      auto* y = static_cast<f16_bits*>(out);
      for (std::int64_t i = 0; i < n; ++i) y[i] = f32_to_f16(x[i]);
      return;
    }
    case WType::bf16: {
      auto* y = static_cast<bf16_bits*>(out);
      for (std::int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
      return;
    }
    case WType::q8_0: quantize_q8_0(x, static_cast<BlockQ8_0*>(out), nb); return;
    case WType::q4_0: quantize_q4_0(x, static_cast<BlockQ4_0*>(out), nb); return;
    case WType::q4_K: quantize_q4_K(x, static_cast<BlockQ4_K*>(out), nb); return;
    case WType::q5_K: quantize_q5_K(x, static_cast<BlockQ5_K*>(out), nb); return;
    case WType::q6_K: quantize_q6_K(x, static_cast<BlockQ6_K*>(out), nb); return;
    case WType::q5_0: quantize_q5_0(x, static_cast<BlockQ5_0*>(out), nb); return;
    case WType::q4_1: quantize_q4_1(x, static_cast<BlockQ4_1*>(out), nb); return;
    case WType::q5_1: quantize_q5_1(x, static_cast<BlockQ5_1*>(out), nb); return;
    case WType::iq4_nl: quantize_iq4_nl(x, static_cast<BlockIQ4_NL*>(out), nb); return;
    case WType::iq4_xs: quantize_iq4_xs(x, static_cast<BlockIQ4_XS*>(out), nb); return;
    case WType::q2_K: quantize_q2_K(x, static_cast<BlockQ2_K*>(out), nb); return;
    case WType::q3_K: quantize_q3_K(x, static_cast<BlockQ3_K*>(out), nb); return;
  }
}

void dequantize_row(WType t, const void* in, float* y, std::int64_t n) {
  const std::int64_t nb = n / traits(t).block_elems;
  switch (t) {
    case WType::f32: std::memcpy(y, in, static_cast<std::size_t>(n) * sizeof(float)); return;
    case WType::f16: {
      const auto* x = static_cast<const f16_bits*>(in);
      for (std::int64_t i = 0; i < n; ++i) y[i] = f16_to_f32(x[i]);
      return;
    }
    case WType::bf16: {
      const auto* x = static_cast<const bf16_bits*>(in);
      for (std::int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(x[i]);
      return;
    }
    case WType::q8_0: dequantize_q8_0(static_cast<const BlockQ8_0*>(in), y, nb); return;
    case WType::q4_0: dequantize_q4_0(static_cast<const BlockQ4_0*>(in), y, nb); return;
    case WType::q4_K: dequantize_q4_K(static_cast<const BlockQ4_K*>(in), y, nb); return;
    case WType::q5_K: dequantize_q5_K(static_cast<const BlockQ5_K*>(in), y, nb); return;
    case WType::q6_K: dequantize_q6_K(static_cast<const BlockQ6_K*>(in), y, nb); return;
    case WType::q5_0: dequantize_q5_0(static_cast<const BlockQ5_0*>(in), y, nb); return;
    case WType::q4_1: dequantize_q4_1(static_cast<const BlockQ4_1*>(in), y, nb); return;
    case WType::q5_1: dequantize_q5_1(static_cast<const BlockQ5_1*>(in), y, nb); return;
    case WType::iq4_nl: dequantize_iq4_nl(static_cast<const BlockIQ4_NL*>(in), y, nb); return;
    case WType::iq4_xs: dequantize_iq4_xs(static_cast<const BlockIQ4_XS*>(in), y, nb); return;
    case WType::q2_K: dequantize_q2_K(static_cast<const BlockQ2_K*>(in), y, nb); return;
    case WType::q3_K: dequantize_q3_K(static_cast<const BlockQ3_K*>(in), y, nb); return;
  }
}

void quantize_act_ref(WType t, const float* x, void* out, std::int64_t n) {
  switch (traits(t).act) {
    case AType::f32: quantize_row(WType::f32, x, out, n); return;
    case AType::f16: {  // rounded to f16, held as f32
      auto* y = static_cast<float*>(out);
      for (std::int64_t i = 0; i < n; ++i) y[i] = f16_to_f32(f32_to_f16(x[i]));
      return;
    }
    case AType::bf16: quantize_row(WType::bf16, x, out, n); return;
    case AType::q8_0: quantize_act_q8_0(x, static_cast<BlockQ8_0*>(out), n / QK8_0); return;
    case AType::q8_K: quantize_q8_K(x, static_cast<BlockQ8_K*>(out), n / QK_K); return;
    case AType::q8_1: quantize_act_q8_1(x, static_cast<BlockQ8_1*>(out), n / QK8_1); return;
  }
}

float vec_dot_ref(WType t, std::int64_t n, const void* w_row, const void* act_row) {
  switch (t) {
    case WType::f32:
      return vec_dot_float<float, f32_identity>(n, static_cast<const float*>(w_row),
                                                static_cast<const float*>(act_row));
    case WType::f16:
      return vec_dot_float<f16_bits, f16_to_f32, float, f32_identity>(n, static_cast<const f16_bits*>(w_row),
                                                                       static_cast<const float*>(act_row));
    case WType::bf16:
      return vec_dot_float<bf16_bits, bf16_to_f32>(n, static_cast<const bf16_bits*>(w_row),
                                                   static_cast<const bf16_bits*>(act_row));
    case WType::q8_0:
      return vec_dot_q8_0(n / QK8_0, static_cast<const BlockQ8_0*>(w_row), static_cast<const BlockQ8_0*>(act_row));
    case WType::q4_0:
      return vec_dot_q4_0(n / QK4_0, static_cast<const BlockQ4_0*>(w_row), static_cast<const BlockQ8_0*>(act_row));
    case WType::q4_K:
      return vec_dot_k_minned<BlockQ4_K, q4_K_level>(n / QK_K, static_cast<const BlockQ4_K*>(w_row),
                                                     static_cast<const BlockQ8_K*>(act_row));
    case WType::q5_K:
      return vec_dot_k_minned<BlockQ5_K, q5_K_level>(n / QK_K, static_cast<const BlockQ5_K*>(w_row),
                                                     static_cast<const BlockQ8_K*>(act_row));
    case WType::q6_K:
      return vec_dot_q6_K(n / QK_K, static_cast<const BlockQ6_K*>(w_row), static_cast<const BlockQ8_K*>(act_row));
    case WType::q5_0:
      return vec_dot_q5_0(n / QK5_0, static_cast<const BlockQ5_0*>(w_row), static_cast<const BlockQ8_0*>(act_row));
    case WType::q4_1:
      return vec_dot_q4_1(n / QK4_1, static_cast<const BlockQ4_1*>(w_row), static_cast<const BlockQ8_1*>(act_row));
    case WType::q5_1:
      return vec_dot_q5_1(n / QK5_1, static_cast<const BlockQ5_1*>(w_row), static_cast<const BlockQ8_1*>(act_row));
    case WType::iq4_nl:
      return vec_dot_iq4_nl(n / QK4_NL, static_cast<const BlockIQ4_NL*>(w_row), static_cast<const BlockQ8_0*>(act_row));
    case WType::iq4_xs:
      return vec_dot_iq4_xs(n / QK_K, static_cast<const BlockIQ4_XS*>(w_row), static_cast<const BlockQ8_K*>(act_row));
    case WType::q2_K:
      return vec_dot_q2_K(n / QK_K, static_cast<const BlockQ2_K*>(w_row), static_cast<const BlockQ8_K*>(act_row));
    case WType::q3_K:
      return vec_dot_q3_K(n / QK_K, static_cast<const BlockQ3_K*>(w_row), static_cast<const BlockQ8_K*>(act_row));
  }
  return 0.f;
}

}  // namespace tandem::kernels
