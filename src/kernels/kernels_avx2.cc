// AVX2 + FMA + F16C kernels (the only file compiled with -mavx2 -mfma -mf16c; kernels.cc calls into it only after
// checking the CPU). Integer dot products use the int8 pattern of llama.cpp's x86 kernels: _mm256_maddubs_epi16
// (unsigned x signed bytes -> int16 pairs, no saturation for the ranges below) then _mm256_madd_epi16 (-> int32).
// Every integer partial sum is exact; only the float combination order differs from the reference (quant.h).
//
// Tiles are templates over R weight rows x C activation rows. The code for one (row, activation) pair is the same
// for every R and C, so one output element sees the same operations in the same order in a 1 x 1 decode tile and
// in a 4 x 3 prefill tile: batching and thread splits never change a result.
//
// ODR note: this file includes no standard-library header that would emit out-of-line inline functions, so no
// AVX2-compiled copy of a shared inline function can be picked by the linker for code running on an older CPU.
// The tiles of the 256-element super-block types (k-quants, iq4_xs) are in kernels_avx2_k.cc, the helpers both
// files use in kernels_avx2_common.h, the activation quantizers in kernels_avx2_act.cc.
#include "kernels/kernels_avx2_act.h"
#include "kernels/kernels_avx2_common.h"
#include "kernels/kernels_avx2_k.h"

namespace tandem::kernels::detail {
namespace {

// ---- f32 / f16 / bf16 -----------------------------------------------------------------------------------------

// A source gives kHalves vectors of 8 floats per step of 8 * kHalves elements. Which element lands in which lane
// is the source's business; weights and activations are loaded alike, so the products pair up.
struct F32Src {
  using T = float;
  static constexpr int kHalves = 1;
  static __m256 load(const float* p, int) { return _mm256_loadu_ps(p); }
};
struct F16Src {
  using T = std::uint16_t;
  static constexpr int kHalves = 1;
  static __m256 load(const std::uint16_t* p, int) { return _mm256_cvtph_ps(load128(p)); }
};
// bf16: 16 elements per step; interleaving zeros below each 16-bit value widens it to f32 in one instruction per
// 8 elements (half 0: elements 0-3 and 8-11, half 1: 4-7 and 12-15).
struct BF16Src {
  using T = std::uint16_t;
  static constexpr int kHalves = 2;
  static __m256 load(const std::uint16_t* p, int half) {
    const __m256i v = load256(p);
    const __m256i z = _mm256_setzero_si256();
    return _mm256_castsi256_ps(half == 0 ? _mm256_unpacklo_epi16(z, v) : _mm256_unpackhi_epi16(z, v));
  }
};

// One accumulator chain of 8 lanes per output element: acc = fma(w, x, acc) over the steps of kStep elements in
// order (the source's halves in order within a step), a zero-padded last step for cols % kStep, then hsum8. ASrc
// loads the activations (f16 weights: f32 activations, put in the same lanes as the weights' elements).
template <class Src, int R, int C, class ASrc = Src>
struct FloatTile {
  using T = typename Src::T;
  using TA = typename ASrc::T;
  static_assert(ASrc::kHalves == Src::kHalves, "weights and activations step alike");
  static constexpr int kStep = 8 * Src::kHalves;
  static constexpr int kLine = 64 / sizeof(T);  // elements per cache line: 1, 2 or 4 steps

  static inline void step(const T* const* wr, const TA* const* ac, std::int64_t k, __m256 (&acc)[R][C]) {
    TANDEM_UNROLL
    for (int h = 0; h < Src::kHalves; ++h) {
      __m256 xv[C];
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) xv[c] = ASrc::load(ac[c] + k, h);
      TANDEM_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m256 wv = Src::load(wr[r] + k, h);
        TANDEM_UNROLL
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
      }
    }
  }

  static void run(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                  std::int64_t cols, float* y, std::int64_t ldy) {
    const T* wr[R];
    const TA* ac[C];
    TANDEM_UNROLL
    for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const T*>(w + r * wrb);
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) ac[c] = reinterpret_cast<const TA*>(a + c * arb);
    __m256 acc[R][C];
    TANDEM_UNROLL
    for (int r = 0; r < R; ++r) {
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    }
    std::int64_t k = 0;
    const std::size_t pf = prefetch_offset(R, wrb);
    for (; k + kLine <= cols; k += kLine) {
      TANDEM_UNROLL
      for (int r = 0; r < R; ++r) prefetch(wr[r] + k, pf);  // one prefetch per row and cache line
      TANDEM_UNROLL
      for (int i = 0; i < kLine; i += kStep) step(wr, ac, k + i, acc);
    }
    for (; k + kStep <= cols; k += kStep) step(wr, ac, k, acc);
    if (k < cols) {
      T wt[R][kStep];
      TA at[C][kStep];
      const T* wp[R];
      const TA* ap[C];
      std::memset(wt, 0, sizeof(wt));
      std::memset(at, 0, sizeof(at));
      const auto left = static_cast<std::size_t>(cols - k);
      TANDEM_UNROLL
      for (int r = 0; r < R; ++r) {
        std::memcpy(wt[r], wr[r] + k, left * sizeof(T));
        wp[r] = wt[r];
      }
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) {
        std::memcpy(at[c], ac[c] + k, left * sizeof(TA));
        ap[c] = at[c];
      }
      step(wp, ap, 0, acc);
    }
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) {
      TANDEM_UNROLL
      for (int r = 0; r < R; ++r) y[c * ldy + r] = hsum8(acc[r][c]);
    }
  }
};

template <int R, int C>
using F32Tile = FloatTile<F32Src, R, C>;
template <int R, int C>
using F16Tile = FloatTile<F16Src, R, C, F32Src>;
template <int R, int C>
using BF16Tile = FloatTile<BF16Src, R, C>;

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
    TANDEM_UNROLL
    for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const Block*>(w + r * wrb);
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) ac[c] = reinterpret_cast<const BlockQ8_0*>(a + c * arb);
    __m256 acc[R][C];
    TANDEM_UNROLL
    for (int r = 0; r < R; ++r) {
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    }
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
};

template <class L, int R, int C>
struct Q81ActTile {
  using Block = typename L::Block;

  static void run(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                  std::int64_t cols, float* y, std::int64_t ldy) {
    const Block* wr[R];
    const BlockQ8_1* ac[C];
    TANDEM_UNROLL
    for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const Block*>(w + r * wrb);
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) ac[c] = reinterpret_cast<const BlockQ8_1*>(a + c * arb);
    __m256 acc[R][C];
    float mins[R][C];
    TANDEM_UNROLL
    for (int r = 0; r < R; ++r) {
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) {
        acc[r][c] = _mm256_setzero_ps();
        mins[r][c] = 0.f;
      }
    }
    const std::int64_t nb = cols / QK8_1;
    const std::size_t pf = prefetch_offset(R, wrb);
    const __m256i ones = _mm256_set1_epi16(1);
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
          const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, av[c]), ones));
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

// ---- the table ------------------------------------------------------------------------------------------------

KernelTable make_avx2_table() {
  KernelTable t;
  t.isa = Isa::avx2;
  t.types[static_cast<int>(WType::f32)] = entry<F32Tile, kFloat>(store_f32);
  t.types[static_cast<int>(WType::f16)] = entry<F16Tile, kFloat>(quantize_f16);
  t.types[static_cast<int>(WType::bf16)] = entry<BF16Tile, kFloat>(quantize_bf16);
  t.types[static_cast<int>(WType::q8_0)] = entry<Q8_0Tile, kQ8_0>(quantize_q8_0);
  t.types[static_cast<int>(WType::q4_0)] = entry<Q4_0Tile, kQ4_0>(quantize_q8_0);
  t.types[static_cast<int>(WType::q5_0)] = entry<Q5_0Tile, kQ4_0>(quantize_q8_0);
  t.types[static_cast<int>(WType::q4_1)] = entry<Q4_1Tile, kQ4_0>(quantize_q8_1);
  t.types[static_cast<int>(WType::q5_1)] = entry<Q5_1Tile, kQ4_0>(quantize_q8_1);
  t.types[static_cast<int>(WType::iq4_nl)] = entry<IQ4NLTile, kQ4_0>(quantize_q8_0);
  t.attention = attention_256<float>;
  t.attention_f16 = attention_256<std::uint16_t>;
  for (WType k : {WType::q4_K, WType::q5_K, WType::q6_K, WType::q2_K, WType::q3_K, WType::iq4_xs})
    t.types[static_cast<int>(k)] = avx2_superblock_kernels(k);
  return t;
}

}  // namespace

const KernelTable& avx2_table() {
  static const KernelTable table = make_avx2_table();
  return table;
}

}  // namespace tandem::kernels::detail
