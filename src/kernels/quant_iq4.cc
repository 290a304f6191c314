// iq4_nl and iq4_xs: llama.cpp's block layouts and its quantizer (ggml-quants.c, quantize_row_iq4_nl_impl with
// ntry = 7 and no importance matrix, as llama-quantize calls it), operation for operation so the bytes match;
// compiled with -ffp-contract=off like quant.cc. Dot products: exact int32 sums per block (per sub-block for
// iq4_xs, times its scale), then one float multiply by d_w * d_a per block.
#include "kernels/quant_iq4.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/quant_util.h"

namespace tandem::kernels::detail {
namespace {

// ggml's best_index_int8: the index of the level nearest x (ties to the lower level's side as ggml decides them).
int best_index(const std::int8_t* val, float x) {
  constexpr int n = 16;
  if (x <= val[0]) return 0;
  if (x >= val[n - 1]) return n - 1;
  int ml = 0;
  int mu = n - 1;
  while (mu - ml > 1) {
    const int mav = (ml + mu) / 2;
    if (x < val[mav]) mu = mav;
    else ml = mav;
  }
  return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

// One super-block of `sb` elements in blocks of 32 (sb = 32: iq4_nl; sb = 256: iq4_xs). Writes the f16 scale,
// the packed indices and, for iq4_xs, the sub-block scales. L holds sb indices, scales sb / 32 floats.
void quantize_super_block(int sb, const float* x, f16_bits* dh, std::uint8_t* q4, std::uint16_t* scales_h,
                          std::uint8_t* scales_l, float* scales, std::uint8_t* L) {
  constexpr int kBlock = 32;
  constexpr int kTries = 7;
  const std::int8_t* values = kIq4NlValues;
  float weight[kBlock];
  std::memset(q4, 0, static_cast<std::size_t>(sb / 2));
  *dh = f32_to_f16(0.f);

  float max_scale = 0;
  float amax_scale = 0;
  for (int ib = 0; ib < sb / kBlock; ++ib) {
    const float* xb = x + ib * kBlock;
    std::uint8_t* Lb = L + ib * kBlock;
    for (int j = 0; j < kBlock; ++j) weight[j] = xb[j] * xb[j];
    float amax = 0;
    float max = 0;
    for (int j = 0; j < kBlock; ++j) {
      const float ax = std::fabs(xb[j]);
      if (ax > amax) {
        amax = ax;
        max = xb[j];
      }
    }
    if (amax < kGroupMaxEps) {
      scales[ib] = 0;
      continue;
    }
    float d = -max / values[0];  // (ntry > 0)
    float id = 1 / d;
    float sumqx = 0;
    float sumq2 = 0;
    for (int j = 0; j < kBlock; ++j) {
      const float al = id * xb[j];
      const int l = best_index(values, al);
      Lb[j] = static_cast<std::uint8_t>(l);
      const float q = values[l];
      const float w = weight[j];
      sumqx += w * q * xb[j];
      sumq2 += w * q * q;
    }
    d = sumqx / sumq2;
    float best = d * sumqx;
    for (int itry = -kTries; itry <= kTries; ++itry) {
      id = (itry + values[0]) / max;
      sumqx = sumq2 = 0;
      for (int j = 0; j < kBlock; ++j) {
        const float al = id * xb[j];
        const int l = best_index(values, al);
        const float q = values[l];
        const float w = weight[j];
        sumqx += w * q * xb[j];
        sumq2 += w * q * q;
      }
      if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
        d = sumqx / sumq2;
        best = d * sumqx;
      }
    }
    scales[ib] = d;
    const float abs_d = std::fabs(d);
    if (abs_d > amax_scale) {
      amax_scale = abs_d;
      max_scale = d;
    }
  }

  if (sb / kBlock > 1) {
    *scales_h = 0;
    const float d = -max_scale / 32;
    *dh = f32_to_f16(d);
    const float id = d != 0.f ? 1 / d : 0.f;
    for (int ib = 0; ib < sb / kBlock; ++ib) {
      int l = nearest_int(id * scales[ib]);
      l = std::max(-32, std::min(31, l));
      const float dl = d * l;
      const float idl = dl != 0.f ? 1 / dl : 0.f;
      std::uint8_t* Lb = L + ib * kBlock;
      const float* xb = x + ib * kBlock;
      for (int j = 0; j < kBlock; ++j) Lb[j] = static_cast<std::uint8_t>(best_index(values, idl * xb[j]));
      l += 32;
      const auto l_l = static_cast<std::uint8_t>(l & 0xf);
      const auto l_h = static_cast<std::uint8_t>(l >> 4);
      if (ib % 2 == 0) scales_l[ib / 2] = l_l;
      else scales_l[ib / 2] |= static_cast<std::uint8_t>(l_l << 4);
      *scales_h |= static_cast<std::uint16_t>(l_h << 2 * (ib % 8));
    }
  } else {
    *dh = f32_to_f16(scales[0]);
    const float id = scales[0] != 0.f ? 1 / scales[0] : 0;
    for (int j = 0; j < sb; ++j) L[j] = static_cast<std::uint8_t>(best_index(values, id * x[j]));
  }

  for (int i = 0; i < sb / 32; ++i)
    for (int j = 0; j < 16; ++j) q4[16 * i + j] = static_cast<std::uint8_t>(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

}  // namespace

int iq4_xs_scale(const BlockIQ4_XS& b, int ib) {
  const int lo = (b.scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf;
  const int hi = (b.scales_h >> 2 * ib) & 3;
  return (lo | (hi << 4)) - 32;
}

void quantize_iq4_nl(const float* x, BlockIQ4_NL* y, std::int64_t nb) {
  std::uint8_t L[QK4_NL];
  float scale = 0;
  std::uint16_t unused_h = 0;
  for (std::int64_t i = 0; i < nb; ++i, x += QK4_NL)
    quantize_super_block(QK4_NL, x, &y[i].d, y[i].qs, &unused_h, nullptr, &scale, L);
}

void quantize_iq4_xs(const float* x, BlockIQ4_XS* y, std::int64_t nb) {
  std::uint8_t L[QK_K];
  float scales[QK_K / 32];
  for (std::int64_t i = 0; i < nb; ++i, x += QK_K) {
    std::uint16_t h = 0;
    quantize_super_block(QK_K, x, &y[i].d, y[i].qs, &h, y[i].scales_l, scales, L);
    y[i].scales_h = h;
  }
}

void dequantize_iq4_nl(const BlockIQ4_NL* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, y += QK4_NL) {
    const float d = f16_to_f32(x[i].d);
    for (int j = 0; j < QK4_NL / 2; ++j) {
      y[j] = d * kIq4NlValues[x[i].qs[j] & 0xf];
      y[j + QK4_NL / 2] = d * kIq4NlValues[x[i].qs[j] >> 4];
    }
  }
}

void dequantize_iq4_xs(const BlockIQ4_XS* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(x[i].d);
    for (int ib = 0; ib < QK_K / 32; ++ib, y += 32) {
      const float dl = d * static_cast<float>(iq4_xs_scale(x[i], ib));
      const std::uint8_t* qs = x[i].qs + 16 * ib;
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * kIq4NlValues[qs[j] & 0xf];
        y[j + 16] = dl * kIq4NlValues[qs[j] >> 4];
      }
    }
  }
}

float vec_dot_iq4_nl(std::int64_t nb, const BlockIQ4_NL* w, const BlockQ8_0* a) {
  float sumf = 0;
  for (std::int64_t i = 0; i < nb; ++i) {
    std::int32_t sumi = 0;
    for (int j = 0; j < QK4_NL / 2; ++j) {
      sumi += kIq4NlValues[w[i].qs[j] & 0xf] * a[i].qs[j];
      sumi += kIq4NlValues[w[i].qs[j] >> 4] * a[i].qs[j + QK4_NL / 2];
    }
    sumf += static_cast<float>(sumi) * (f16_to_f32(w[i].d) * f16_to_f32(a[i].d));
  }
  return sumf;
}

// Per super-block: isum = sum_ib (scale_ib - 32) * sum_{k in ib} level_k * a_k, exact in int32 (|isum| <= 8 * 32 *
// 32 * 127 * 127); sumf += (d_w * d_a) * isum.
float vec_dot_iq4_xs(std::int64_t nb, const BlockIQ4_XS* w, const BlockQ8_K* a) {
  float sumf = 0;
  for (std::int64_t i = 0; i < nb; ++i) {
    std::int32_t isum = 0;
    for (int ib = 0; ib < QK_K / 32; ++ib) {
      const std::uint8_t* qs = w[i].qs + 16 * ib;
      const std::int8_t* q8 = a[i].qs + 32 * ib;
      std::int32_t s = 0;
      for (int j = 0; j < 16; ++j) {
        s += kIq4NlValues[qs[j] & 0xf] * q8[j];
        s += kIq4NlValues[qs[j] >> 4] * q8[j + 16];
      }
      isum += iq4_xs_scale(w[i], ib) * s;
    }
    sumf += (f16_to_f32(w[i].d) * a[i].d) * static_cast<float>(isum);
  }
  return sumf;
}

}  // namespace tandem::kernels::detail
