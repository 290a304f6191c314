// The AVX2 tiles of the 32-element block types (q8_0, q4_0, q5_0, iq4_nl with q8_0 activations; q4_1, q5_1 with
// q8_1 activations): each type's levels ("Levels": a block's row and activation vectors and their exact int32 dot
// product, 8 lanes of 4 products) and the tiles over them. Shared by kernels_avx2.cc (maddubs + madd, the AVX2 table)
// and kernels_avxvnni.cc (the same tiles with AVX-VNNI's vpdpbusd for the dot products). Like
// kernels_avx2_common.h, everything is in an anonymous namespace and may be included only by files built with the
// AVX2 flags.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/kernels_avx2_common.h"
#include "kernels/types.h"

namespace tandem::kernels::detail {
namespace {

// ---- q8_0 / q4_0 weights x q8_0 activations -------------------------------------------------------------------

// Per block and (row, activation): 8 exact int32 lanes, each the sum of 4 products; acc = fma(d_w * d_a,
// float(lanes), acc); hsum8 at the end. Each f16 scale is broadcast and converted in one step (vpbroadcastw +
// vcvtph2ps gives it in all 8 lanes), so d_w * d_a is one vector multiply, the reference's f32 product.

// q8_0 levels in [-128, 127] (the sign trick: |w| unsigned times sign(w) * a).
struct Q8_0Levels {
  using Block = BlockQ8_0;
  struct Row {
    __m256i w;
    __m256i aw;
  };
  struct Act {
    __m256i a;
  };
  static Row row(const BlockQ8_0& b) {
    const __m256i w = load256(b.qs);
    return {w, _mm256_sign_epi8(w, w)};
  }
  static Act act(const BlockQ8_0& b) { return {load256(b.qs)}; }
  static __m256i dot(const Row& w, const Act& a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w.aw, _mm256_sign_epi8(a.a, w.w)), _mm256_set1_epi16(1));
  }
};

// q4_0 levels u in [0, 15] (element j < 16: low nibble of qs[j]; j >= 16: high nibble of qs[j - 16]), value u - 8:
// sum (u - 8) a = maddubs(u, a) - maddubs(8, a) in int16 pairs (|.| <= 3810 and 2032), then pairs to int32.
struct Q4_0Levels {
  using Block = BlockQ4_0;
  struct Row {
    __m256i u;
  };
  struct Act {
    __m256i a;
    __m256i a8;  // 8 * (a[2i] + a[2i+1]) as int16
  };
  static Row row(const BlockQ4_0& b) {
    const __m256i both = _mm256_broadcastsi128_si256(load128(b.qs));
    const __m256i shifted = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return {_mm256_and_si256(shifted, _mm256_set1_epi8(0x0F))};
  }
  static Act act(const BlockQ8_0& b) {
    const __m256i a = load256(b.qs);
    return {a, _mm256_maddubs_epi16(_mm256_set1_epi8(8), a)};
  }
  static __m256i dot(const Row& w, const Act& a) {
    const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(w.u, a.a), a.a8);
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
  }
};


// Bit k of a 32-bit qh as 0x10 in byte k (the fifth bit of element k): byte k takes qh's byte k / 8 (each 128-bit
// lane holds all four), then its bit k % 8.
inline __m256i fifth_bits(const std::uint8_t* qh_bytes) {
  std::uint32_t qh;
  std::memcpy(&qh, qh_bytes, sizeof qh);
  const __m256i sel = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(qh)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(sel, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// q5_0 levels u in [0, 31]: q4_0's nibbles with the fifth bit of element k from bit k of qh (byte k of the vector is
// element k), value u - 16: sum (u - 16) a = maddubs(u, a) - maddubs(16, a) (|.| <= 7936 and 4096 in int16).
struct Q5_0Levels {
  using Block = BlockQ5_0;
  struct Row {
    __m256i u;
  };
  struct Act {
    __m256i a;
    __m256i a16;  // 16 * (a[2i] + a[2i+1]) as int16
  };
  static Row row(const BlockQ5_0& b) { return {_mm256_or_si256(nibbles(b.qs), fifth_bits(b.qh))}; }
  static Act act(const BlockQ8_0& b) {
    const __m256i a = load256(b.qs);
    return {a, _mm256_maddubs_epi16(_mm256_set1_epi8(16), a)};
  }
  static __m256i dot(const Row& w, const Act& a) {
    const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(w.u, a.a), a.a16);
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
  }
};

// iq4_nl levels: each nibble looked up in llama.cpp's table of 16 int8 levels (one pshufb per 128-bit lane), then
// multiplied as q8_0's (the sign trick; |pair sum| <= 2 * 127 * 127 in int16).
struct IQ4NLLevels {
  using Block = BlockIQ4_NL;
  using Row = Q8_0Levels::Row;
  using Act = Q8_0Levels::Act;
  static Row row(const BlockIQ4_NL& b) {
    const __m256i w = _mm256_shuffle_epi8(iq4_table(), nibbles(b.qs));
    return {w, _mm256_sign_epi8(w, w)};
  }
  static Act act(const BlockQ8_0& b) { return Q8_0Levels::act(b); }
  static __m256i dot(const Row& w, const Act& a) { return Q8_0Levels::dot(w, a); }
};

template <class L, int R, int C>
struct Q8ActTile {
  using Block = typename L::Block;

  static void run(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                  std::int64_t cols, float* y, std::int64_t ldy) {
    const Block* wr[R];
    const BlockQ8_0* ac[C];
    row_ptrs(wr, w, wrb);
    row_ptrs(ac, a, arb);
    __m256 acc[R][C];
    zero_acc(acc);
    const std::int64_t nb = cols / QK8_0;
    const std::size_t pf = prefetch_offset(R, wrb);
    for (std::int64_t ib = 0; ib < nb; ++ib) {
      typename L::Act av[C];
      __m256 da[C];
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) {
        av[c] = L::act(ac[c][ib]);
        da[c] = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(ac[c][ib].d)));
      }
      TANDEM_UNROLL
      for (int r = 0; r < R; ++r) {
        prefetch(&wr[r][ib], pf);
        const typename L::Row wv = L::row(wr[r][ib]);
        const __m256 dw = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(wr[r][ib].d)));
        TANDEM_UNROLL
        for (int c = 0; c < C; ++c) {
          const __m256 p = _mm256_cvtepi32_ps(L::dot(wv, av[c]));
          acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da[c]), p, acc[r][c]);
        }
      }
    }
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) {
      TANDEM_UNROLL
      for (int r = 0; r < R; ++r) y[c * ldy + r] = hsum8(acc[r][c]);
    }
  }
};

template <int R, int C>
using Q8_0Tile = Q8ActTile<Q8_0Levels, R, C>;
template <int R, int C>
using Q4_0Tile = Q8ActTile<Q4_0Levels, R, C>;
template <int R, int C>
using Q5_0Tile = Q8ActTile<Q5_0Levels, R, C>;
template <int R, int C>
using IQ4NLTile = Q8ActTile<IQ4NLLevels, R, C>;

// ---- q4_1 / q5_1 weights x q8_1 activations ---------------------------------------------------------------------

// Unsigned levels u (q4_1: [0, 15]; q5_1: [0, 31], the fifth bits as q5_0's): sum u a = madd(maddubs(u, a), 1), exact
// (pairs <= 2 · 31 · 128 in int16). Per block acc = fma(d_w * d_a, float(lanes), acc), and the min term m_w * s_a
// in a scalar accumulator per (row, activation), in block order; y = hsum8(acc) + that sum.
template <class B, bool kFive>
struct MinnedLevels {
  using Block = B;
  static __m256i row(const B& b) {
    if constexpr (kFive) return _mm256_or_si256(nibbles(b.qs), fifth_bits(b.qh));
    else return nibbles(b.qs);
  }
  static __m256i dot(__m256i u, __m256i a) { return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1)); }
};

template <class L, int R, int C>
struct Q81ActTile {
  using Block = typename L::Block;

  static void run(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                  std::int64_t cols, float* y, std::int64_t ldy) {
    const Block* wr[R];
    const BlockQ8_1* ac[C];
    row_ptrs(wr, w, wrb);
    row_ptrs(ac, a, arb);
    __m256 acc[R][C];
    zero_acc(acc);
    float mins[R][C] = {};
    const std::int64_t nb = cols / QK8_1;
    const std::size_t pf = prefetch_offset(R, wrb);
    for (std::int64_t ib = 0; ib < nb; ++ib) {
      __m256i av[C];
      __m256 da[C];
      float sa[C];
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) {
        av[c] = load256(ac[c][ib].qs);
        da[c] = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(ac[c][ib].d)));
        sa[c] = h2f(ac[c][ib].s);
      }
      TANDEM_UNROLL
      for (int r = 0; r < R; ++r) {
        prefetch(&wr[r][ib], pf);
        const __m256i u = L::row(wr[r][ib]);
        const __m256 dw = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(wr[r][ib].d)));
        const float mw = h2f(wr[r][ib].m);
        TANDEM_UNROLL
        for (int c = 0; c < C; ++c) {
          const __m256 p = _mm256_cvtepi32_ps(L::dot(u, av[c]));
          acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da[c]), p, acc[r][c]);
          mins[r][c] += mw * sa[c];
        }
      }
    }
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) {
      TANDEM_UNROLL
      for (int r = 0; r < R; ++r) y[c * ldy + r] = hsum8(acc[r][c]) + mins[r][c];
    }
  }
};

template <int R, int C>
using Q4_1Tile = Q81ActTile<MinnedLevels<BlockQ4_1, false>, R, C>;
template <int R, int C>
using Q5_1Tile = Q81ActTile<MinnedLevels<BlockQ5_1, true>, R, C>;

}  // namespace
}  // namespace tandem::kernels::detail
