// The 32-element block types — q8_0, q4_0, q5_0, q4_1, q5_1 weights and the q8_0 / q8_1 activations: reference
// quantizers (llama.cpp's quantize_row_*_ref operation for operation), dequantizers and dot products. Split out of
// quant.cc, whose dispatch calls them (the k-quants stay there); compiled with the same -ffp-contract=off.
#include "kernels/quant_blocks32.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace tandem::kernels::detail {

// ---- quantizers ----------------------------------------------------------------------------------------------

void quantize_q8_0(const float* x, BlockQ8_0* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, x += QK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    for (int j = 0; j < QK8_0; ++j) y[i].qs[j] = static_cast<std::int8_t>(static_cast<int>(std::round(x[j] * id)));
  }
}

// q8_0 *activations* as llama.cpp's x86 CPU backend prepares them (its quantize_row_q8_0, which its AVX2 and
// AVX-512 builds both run), not as its _ref: id = 127 / amax rather than 1 / (amax / 127), and ties to even. The
// stored scale is the same f16(amax / 127). Weights keep quantize_q8_0 above (what llama-quantize writes).
void quantize_act_q8_0(const float* x, BlockQ8_0* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, x += QK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    y[i].d = f32_to_f16(amax / 127.f);
    const float id = amax != 0.f ? 127.f / amax : 0.0f;
    for (int j = 0; j < QK8_0; ++j)
      y[i].qs[j] = static_cast<std::int8_t>(static_cast<int>(std::nearbyint(x[j] * id)));  // default mode: to even
  }
}

void quantize_q4_0(const float* x, BlockQ4_0* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, x += QK4_0) {
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < QK4_0; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8;
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      // Truncation toward zero of x/d + 8.5 (ggml's (int8_t) cast), i.e. round half up, capped at 15.
      const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
      const int q1 = std::min(15, static_cast<int>(x[j + QK4_0 / 2] * id + 8.5f));
      y[i].qs[j] = static_cast<std::uint8_t>(q0 | (q1 << 4));
    }
  }
}

// q5_0 (quantize_row_q5_0_ref): as q4_0 with 32 levels, d = max / -16, the fifth bits gathered in qh.
void quantize_q5_0(const float* x, BlockQ5_0* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, x += QK5_0) {
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < QK5_0; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -16;
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    std::uint32_t qh = 0;
    for (int j = 0; j < QK5_0 / 2; ++j) {
      // Truncation toward zero of x/d + 16.5 (ggml's (int8_t) cast), capped at 31.
      const int q0 = std::min(31, static_cast<int>(x[j] * id + 16.5f));
      const int q1 = std::min(31, static_cast<int>(x[j + QK5_0 / 2] * id + 16.5f));
      y[i].qs[j] = static_cast<std::uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= static_cast<std::uint32_t>((q0 & 0x10) >> 4) << j;
      qh |= static_cast<std::uint32_t>((q1 & 0x10) >> 4) << (j + QK5_0 / 2);
    }
    std::memcpy(y[i].qh, &qh, sizeof qh);
  }
}

// q4_1 / q5_1 (quantize_row_q4_1_ref / _q5_1_ref): per 32, d = (max - min) / (levels - 1), m = min, level =
// trunc((x - min) / d + 0.5) (capped at 15 for q4_1, as ggml's MIN; q5_1's cannot exceed 31).
template <class Block, int kLevels>
void quantize_minned(const float* x, Block* y, std::int64_t nb) {
  constexpr bool five = kLevels == 32;
  for (std::int64_t i = 0; i < nb; ++i, x += 32) {
    float min = std::numeric_limits<float>::max();
    float max = -std::numeric_limits<float>::max();
    for (int j = 0; j < 32; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / (kLevels - 1);
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    y[i].m = f32_to_f16(min);
    std::uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      int q0 = static_cast<int>((x[j] - min) * id + 0.5f);
      int q1 = static_cast<int>((x[j + 16] - min) * id + 0.5f);
      if constexpr (!five) {
        q0 = std::min(15, q0);
        q1 = std::min(15, q1);
        y[i].qs[j] = static_cast<std::uint8_t>(q0 | (q1 << 4));
      } else {
        y[i].qs[j] = static_cast<std::uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
        qh |= static_cast<std::uint32_t>((q0 & 0x10) >> 4) << j;
        qh |= static_cast<std::uint32_t>((q1 & 0x10) >> 4) << (j + 16);
      }
    }
    if constexpr (five) std::memcpy(y[i].qh, &qh, sizeof qh);
  }
}

// q8_1 *activations* as llama.cpp's x86 CPU backend prepares them (quantize_row_q8_1): q8_0's activation rounding
// (id = 127 / amax, ties to even), and s = f16(d · Σ qs) with d = amax / 127 before its f16 rounding.
void quantize_act_q8_1(const float* x, BlockQ8_1* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, x += QK8_1) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_1; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.f;
    y[i].d = f32_to_f16(d);
    const float id = amax != 0.f ? 127.f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < QK8_1; ++j) {
      y[i].qs[j] = static_cast<std::int8_t>(static_cast<int>(std::nearbyint(x[j] * id)));
      sum += y[i].qs[j];
    }
    y[i].s = f32_to_f16(d * static_cast<float>(sum));
  }
}

// ---- dequantizers (same operation order as ggml's dequantize_row_*) -----------------------------------------

void dequantize_q8_0(const BlockQ8_0* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, y += QK8_0) {
    const float d = f16_to_f32(x[i].d);
    for (int j = 0; j < QK8_0; ++j) y[j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

void dequantize_q4_0(const BlockQ4_0* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, y += QK4_0) {
    const float d = f16_to_f32(x[i].d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      y[j] = static_cast<float>((x[i].qs[j] & 0x0F) - 8) * d;
      y[j + QK4_0 / 2] = static_cast<float>((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

// q5_0 level (0..31) of element j of a block.
inline int q5_0_level(const BlockQ5_0& b, int j) {
  std::uint32_t qh;
  std::memcpy(&qh, b.qh, sizeof qh);
  const int low = j < QK5_0 / 2 ? (b.qs[j] & 0x0F) : (b.qs[j - QK5_0 / 2] >> 4);
  return low | static_cast<int>(((qh >> j) & 1u) << 4);
}

void dequantize_q5_0(const BlockQ5_0* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, y += QK5_0) {
    const float d = f16_to_f32(x[i].d);
    for (int j = 0; j < QK5_0; ++j) y[j] = static_cast<float>(q5_0_level(x[i], j) - 16) * d;
  }
}

// q4_1 / q5_1 level (0..15 / 0..31) of element j of a block.
inline int q4_1_level(const BlockQ4_1& b, int j) { return j < 16 ? (b.qs[j] & 0x0F) : (b.qs[j - 16] >> 4); }
inline int q5_1_level(const BlockQ5_1& b, int j) {
  std::uint32_t qh;
  std::memcpy(&qh, b.qh, sizeof qh);
  const int low = j < 16 ? (b.qs[j] & 0x0F) : (b.qs[j - 16] >> 4);
  return low | static_cast<int>(((qh >> j) & 1u) << 4);
}

template <class Block, int (*Level)(const Block&, int)>
void dequantize_minned(const Block* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = f16_to_f32(x[i].d);
    const float m = f16_to_f32(x[i].m);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(Level(x[i], j)) * d + m;
  }
}

// ---- dot products --------------------------------------------------------------------------------------------

float vec_dot_q8_0(std::int64_t nb, const BlockQ8_0* w, const BlockQ8_0* a) {
  float sumf = 0;
  for (std::int64_t i = 0; i < nb; ++i) {
    std::int32_t sumi = 0;
    for (int j = 0; j < QK8_0; ++j) sumi += static_cast<std::int32_t>(w[i].qs[j]) * a[i].qs[j];
    sumf += static_cast<float>(sumi) * (f16_to_f32(w[i].d) * f16_to_f32(a[i].d));
  }
  return sumf;
}

float vec_dot_q4_0(std::int64_t nb, const BlockQ4_0* w, const BlockQ8_0* a) {
  float sumf = 0;
  for (std::int64_t i = 0; i < nb; ++i) {
    std::int32_t sumi = 0;
    for (int j = 0; j < QK4_0 / 2; ++j) {
      sumi += ((w[i].qs[j] & 0x0F) - 8) * a[i].qs[j];
      sumi += ((w[i].qs[j] >> 4) - 8) * a[i].qs[j + QK4_0 / 2];
    }
    sumf += static_cast<float>(sumi) * (f16_to_f32(w[i].d) * f16_to_f32(a[i].d));
  }
  return sumf;
}

float vec_dot_q5_0(std::int64_t nb, const BlockQ5_0* w, const BlockQ8_0* a) {
  float sumf = 0;
  for (std::int64_t i = 0; i < nb; ++i) {
    std::int32_t sumi = 0;
    for (int j = 0; j < QK5_0; ++j) sumi += (q5_0_level(w[i], j) - 16) * a[i].qs[j];
    sumf += static_cast<float>(sumi) * (f16_to_f32(w[i].d) * f16_to_f32(a[i].d));
  }
  return sumf;
}

// q4_1 / q5_1 · q8_1: per block sumf += float(Σ q_w q_a) * (d_w * d_a) + m_w * s_a.
template <class Block, int (*Level)(const Block&, int)>
float vec_dot_minned(std::int64_t nb, const Block* w, const BlockQ8_1* a) {
  float sumf = 0;
  for (std::int64_t i = 0; i < nb; ++i) {
    std::int32_t sumi = 0;
    for (int j = 0; j < 32; ++j) sumi += Level(w[i], j) * a[i].qs[j];
    sumf += static_cast<float>(sumi) * (f16_to_f32(w[i].d) * f16_to_f32(a[i].d)) +
            f16_to_f32(w[i].m) * f16_to_f32(a[i].s);
  }
  return sumf;
}

void quantize_q4_1(const float* x, BlockQ4_1* y, std::int64_t nb) { quantize_minned<BlockQ4_1, 16>(x, y, nb); }
void quantize_q5_1(const float* x, BlockQ5_1* y, std::int64_t nb) { quantize_minned<BlockQ5_1, 32>(x, y, nb); }
void dequantize_q4_1(const BlockQ4_1* x, float* y, std::int64_t nb) {
  dequantize_minned<BlockQ4_1, q4_1_level>(x, y, nb);
}
void dequantize_q5_1(const BlockQ5_1* x, float* y, std::int64_t nb) {
  dequantize_minned<BlockQ5_1, q5_1_level>(x, y, nb);
}
float vec_dot_q4_1(std::int64_t nb, const BlockQ4_1* w, const BlockQ8_1* a) {
  return vec_dot_minned<BlockQ4_1, q4_1_level>(nb, w, a);
}
float vec_dot_q5_1(std::int64_t nb, const BlockQ5_1* w, const BlockQ8_1* a) {
  return vec_dot_minned<BlockQ5_1, q5_1_level>(nb, w, a);
}

}  // namespace tandem::kernels::detail
