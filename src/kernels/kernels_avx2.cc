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
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/dispatch.h"
#include "kernels/kernels_avx2_act.h"
#include "kernels/quant_iq4.h"  // (for kIq4NlValues, data; its functions are not called here, see the ODR note)
#include "kernels/types.h"

// Loops over tile rows, tile activations and sub-blocks are short and fixed; unrolling them lets the accumulator
// arrays live in registers.
#define TANDEM_UNROLL _Pragma("GCC unroll 16")

namespace tandem::kernels::detail {
namespace {

using RunFn = void (*)(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                       std::int64_t cols, float* y, std::int64_t ldy);

// Picks the instantiation K<nr, nc> for a tile of nr x nc (1 <= nr <= MaxR, 1 <= nc <= MaxC).
template <template <int, int> class K, int MaxR, int MaxC>
struct Tiles {
  struct Fns {
    RunFn f[MaxR * MaxC];
  };
  template <int... I>
  static constexpr Fns make(std::integer_sequence<int, I...>) {
    return {{&K<I / MaxC + 1, I % MaxC + 1>::run...}};
  }
  static constexpr Fns kFns = make(std::make_integer_sequence<int, MaxR * MaxC>{});

  static void tile(const std::uint8_t* w, std::size_t wrb, int nr, const std::uint8_t* a, std::size_t arb, int nc,
                   std::int64_t cols, float* y, std::int64_t ldy) {
    kFns.f[(nr - 1) * MaxC + (nc - 1)](w, wrb, a, arb, cols, y, ldy);
  }
};

// ---- helpers -------------------------------------------------------------------------------------------------

// Fixed-order horizontal sums: 8 -> 4 (low + high half) -> 2 -> 1.
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float h2f(std::uint16_t h) { return _cvtsh_ss(h); }

// Software prefetch for the weight rows: a tile reads R rows side by side, which the hardware prefetchers follow
// poorly when rows are short. Each load of row r also prefetches the same offset some whole tiles ahead, at least
// kPrefetchBytes further on in memory (prefetches past the matrix's end are harmless; they never fault).
constexpr std::size_t kPrefetchBytes = 4096;
inline std::size_t prefetch_offset(int rows, std::size_t wrb) {
  const std::size_t tile = static_cast<std::size_t>(rows) * wrb;
  return tile * ((kPrefetchBytes + tile - 1) / tile);
}
inline void prefetch(const void* p, std::size_t off) {
  // The address may lie past the matrix: form it as an integer, not by pointer arithmetic.
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(p) + off), _MM_HINT_T0);
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

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
// order (the source's halves in order within a step), a zero-padded last step for cols % kStep, then hsum8.
template <class Src, int R, int C>
struct FloatTile {
  using T = typename Src::T;
  static constexpr int kStep = 8 * Src::kHalves;
  static constexpr int kLine = 64 / sizeof(T);  // elements per cache line: 1, 2 or 4 steps

  static inline void step(const T* const* wr, const T* const* ac, std::int64_t k, __m256 (&acc)[R][C]) {
    TANDEM_UNROLL
    for (int h = 0; h < Src::kHalves; ++h) {
      __m256 xv[C];
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) xv[c] = Src::load(ac[c] + k, h);
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
    const T* ac[C];
    TANDEM_UNROLL
    for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const T*>(w + r * wrb);
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) ac[c] = reinterpret_cast<const T*>(a + c * arb);
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
      T at[C][kStep];
      const T* wp[R];
      const T* ap[C];
      std::memset(wt, 0, sizeof(wt));
      std::memset(at, 0, sizeof(at));
      const std::size_t bytes = static_cast<std::size_t>(cols - k) * sizeof(T);
      TANDEM_UNROLL
      for (int r = 0; r < R; ++r) {
        std::memcpy(wt[r], wr[r] + k, bytes);
        wp[r] = wt[r];
      }
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) {
        std::memcpy(at[c], ac[c] + k, bytes);
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
using F16Tile = FloatTile<F16Src, R, C>;
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

// The 32 nibbles of a 16-byte quant array as bytes in element order (element j < 16: low nibble of qs[j]; j >= 16:
// high nibble of qs[j - 16]).
inline __m256i nibbles(const std::uint8_t* qs) {
  const __m256i both = _mm256_broadcastsi128_si256(load128(qs));
  const __m256i shifted = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
  return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
}

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
inline __m256i iq4_table() {
  return _mm256_broadcastsi128_si256(load128(kIq4NlValues));
}
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

// ---- k-quants x q8_K -----------------------------------------------------------------------------------------

// Broadcasts int16 element i of each 128-bit lane to the whole lane (pshufb control bytes 2i, 2i+1).
inline __m256i bcast16(__m256i v, int i) {
  return _mm256_shuffle_epi8(v, _mm256_set1_epi16(static_cast<short>((2 * i) | ((2 * i + 1) << 8))));
}

// q4_K / q5_K: the 12 packed bytes (get_scale_min_k4: j < 4: sc = q[j] & 63, m = q[j+4] & 63; j >= 4:
// sc = (q[j+4] & 15) | (q[j-4] >> 6) << 4, m = (q[j+4] >> 4) | (q[j] >> 6) << 4) as int16 vectors: the 8 scales in
// both 128-bit lanes (for bcast16), and the 8 mins each twice, [m0 m0 m1 m1 .. m7 m7], to meet the 16 bsums.
struct K4Scales {
  __m256i sc;
  __m256i mins2;
};
inline K4Scales k4_scales(const std::uint8_t* q) {
  std::uint32_t u[3];
  std::memcpy(u, q, 12);
  const std::uint64_t sc03 = u[0] & 0x3F3F3F3Fu;
  const std::uint64_t sc47 = (u[2] & 0x0F0F0F0Fu) | (((u[0] >> 6) & 0x03030303u) << 4);
  const std::uint64_t m03 = u[1] & 0x3F3F3F3Fu;
  const std::uint64_t m47 = ((u[2] >> 4) & 0x0F0F0F0Fu) | (((u[1] >> 6) & 0x03030303u) << 4);
  const __m128i sm8 = _mm_set_epi64x(static_cast<long long>(m03 | (m47 << 32)),
                                     static_cast<long long>(sc03 | (sc47 << 32)));  // sc0..7, m0..7
  return {_mm256_cvtepu8_epi16(_mm_unpacklo_epi64(sm8, sm8)), _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm8, sm8))};
}

// [d, dmin] of a q4_K / q5_K block (adjacent f16 values) as floats in lanes 0 and 1.
template <class Block>
inline __m128 k4_d_dmin(const Block& b) {
  std::uint32_t both;
  std::memcpy(&both, &b.d, 4);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(both)));
}

// 32 levels of sub-blocks 2j (lo) and 2j+1 (hi) of a q4_K / q5_K block, bytes in [0, 15] / [0, 31].
struct Q4KLevels {
  using Block = BlockQ4_K;
  const BlockQ4_K& b;
  void get(int j, __m256i* lo, __m256i* hi) const {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i bits = load256(b.qs + 32 * j);
    *lo = _mm256_and_si256(bits, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
  }
};
struct Q5KLevels {
  using Block = BlockQ5_K;
  const BlockQ5_K& b;
  void get(int j, __m256i* lo, __m256i* hi) const {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i one = _mm256_set1_epi8(1);
    const __m256i bits = load256(b.qs + 32 * j);
    const __m256i hb = load256(b.qh);
    // Fifth bit of element l of sub-block s is bit s of qh[l]; 16-bit shifts are safe after the byte mask.
    const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j), one), 4);
    const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j + 1), one), 4);
    *lo = _mm256_or_si256(_mm256_and_si256(bits, m4), h0);
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), h1);
  }
};

// Per super-block and activation row: int32 lanes sum_j sc_j * sum_k q_k a_k (maddubs, then madd by the scale)
// and sum_j m_j * bsum_j (one madd of the bsums by the doubled mins); then acc = fma(d_w * d_a, float(lanes), acc)
// and acc = fnma(dmin_w * d_a, float(mins), acc). The element is hsum8(acc).
template <class L, int R, int C>
struct KMinnedTile {
  using Block = typename L::Block;

  static void run(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                  std::int64_t cols, float* y, std::int64_t ldy) {
    const BlockQ8_K* ac[C];
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) ac[c] = reinterpret_cast<const BlockQ8_K*>(a + c * arb);
    const std::int64_t nb = cols / QK_K;
    const std::size_t pf = prefetch_offset(R, wrb);
    TANDEM_UNROLL
    for (int r = 0; r < R; ++r) {
      const Block* wr = reinterpret_cast<const Block*>(w + r * wrb);
      __m256 acc[C];
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
      for (std::int64_t i = 0; i < nb; ++i) {
        const Block& b = wr[i];
        TANDEM_UNROLL
        for (std::size_t off = 0; off < sizeof(Block); off += 64) prefetch(reinterpret_cast<const char*>(&b) + off, pf);
        const K4Scales s = k4_scales(b.scales);
        __m256i sumi[C];
        TANDEM_UNROLL
        for (int c = 0; c < C; ++c) sumi[c] = _mm256_setzero_si256();
        const L levels{b};
        TANDEM_UNROLL
        for (int j = 0; j < QK_K / 64; ++j) {
          __m256i lo;
          __m256i hi;
          levels.get(j, &lo, &hi);
          const __m256i sc_lo = bcast16(s.sc, 2 * j);
          const __m256i sc_hi = bcast16(s.sc, 2 * j + 1);
          TANDEM_UNROLL
          for (int c = 0; c < C; ++c) {
            const __m256i plo = _mm256_madd_epi16(sc_lo, _mm256_maddubs_epi16(lo, load256(ac[c][i].qs + 64 * j)));
            const __m256i phi =
                _mm256_madd_epi16(sc_hi, _mm256_maddubs_epi16(hi, load256(ac[c][i].qs + 64 * j + 32)));
            sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(plo, phi));
          }
        }
        const __m128 dd = k4_d_dmin(b);
        TANDEM_UNROLL
        for (int c = 0; c < C; ++c) {
          const __m128 scaled = _mm_mul_ps(dd, _mm_set1_ps(ac[c][i].d));  // [d_w * d_a, dmin_w * d_a]
          const __m256i mins = _mm256_madd_epi16(load256(ac[c][i].bsums), s.mins2);
          acc[c] = _mm256_fmadd_ps(_mm256_broadcastss_ps(scaled), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
          acc[c] = _mm256_fnmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(scaled)), _mm256_cvtepi32_ps(mins), acc[c]);
        }
      }
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) y[c * ldy + r] = hsum8(acc[c]);
    }
  }
};

template <int R, int C>
using Q4KTile = KMinnedTile<Q4KLevels, R, C>;
template <int R, int C>
using Q5KTile = KMinnedTile<Q5KLevels, R, C>;

// q6_K: levels q in [0, 63] (the stored level + 32); sum_s sc_s * sum_k (q_k - 32) a_k is computed as
// sum_s sc_s * sum_k q_k a_k  -  32 * sum_s sc_s * bsums_s, all in exact int32 lanes.
template <int R, int C>
struct Q6KTile {
  static void run(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                  std::int64_t cols, float* y, std::int64_t ldy) {
    const BlockQ8_K* ac[C];
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) ac[c] = reinterpret_cast<const BlockQ8_K*>(a + c * arb);
    const std::int64_t nb = cols / QK_K;
    const std::size_t pf = prefetch_offset(R, wrb);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    TANDEM_UNROLL
    for (int r = 0; r < R; ++r) {
      const BlockQ6_K* wr = reinterpret_cast<const BlockQ6_K*>(w + r * wrb);
      __m256 acc[C];
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
      for (std::int64_t i = 0; i < nb; ++i) {
        const BlockQ6_K& b = wr[i];
        TANDEM_UNROLL
        for (std::size_t off = 0; off < sizeof(BlockQ6_K); off += 64) {
          prefetch(reinterpret_cast<const char*>(&b) + off, pf);
        }
        const __m128i sc8 = load128(b.scales);
        __m256i sumi[C];
        TANDEM_UNROLL
        for (int c = 0; c < C; ++c) {
          const __m256i bsc = _mm256_madd_epi16(load256(ac[c][i].bsums), _mm256_cvtepi8_epi16(sc8));
          sumi[c] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(bsc, 5));
        }
        TANDEM_UNROLL
        for (int half = 0; half < 2; ++half) {
          const __m256i ql0 = load256(b.ql + 64 * half);
          const __m256i ql1 = load256(b.ql + 64 * half + 32);
          const __m256i qh = load256(b.qh + 32 * half);
          __m256i q[4];
          q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4),
                                 _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)), 4));
          q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                 _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C)), 2));
          q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                 _mm256_and_si256(qh, _mm256_set1_epi8(0x30)));
          q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                 _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(static_cast<char>(0xC0))), 2));
          TANDEM_UNROLL
          for (int g = 0; g < 4; ++g) {
            // Sub-blocks 2s and 2s+1 (s = 4 * half + g): scale s*2 for the low 16 elements, s*2+1 for the high.
            const int s = 2 * (4 * half + g);
            const __m128i ctl = _mm_set_epi64x(0x0101010101010101LL * (s + 1), 0x0101010101010101LL * s);
            const __m256i scale = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, ctl));
            TANDEM_UNROLL
            for (int c = 0; c < C; ++c) {
              const __m256i p16 = _mm256_maddubs_epi16(q[g], load256(ac[c][i].qs + 128 * half + 32 * g));
              sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(scale, p16));
            }
          }
        }
        const float dw = h2f(b.d);
        TANDEM_UNROLL
        for (int c = 0; c < C; ++c) {
          acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * ac[c][i].d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        }
      }
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) y[c * ldy + r] = hsum8(acc[c]);
    }
  }
};

// ---- q2_K / q3_K x q8_K: 16 sub-blocks of 16 -------------------------------------------------------------------

// For sub-block pair (2p, 2p + 1), p = 4h + s: the int16 vector whose low 128-bit lane is scale 2p and high lane
// scale 2p + 1 (a maddubs result over the 32 elements of those two sub-blocks pairs up with it lane by lane).
inline __m256i pair_scales(__m128i sc8, int p) {
  const __m128i ctl = _mm_set_epi64x(0x0101010101010101LL * (2 * p + 1), 0x0101010101010101LL * (2 * p));
  return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, ctl));
}

// Levels of elements 128 h + 32 s + l (l < 32) of a q2_K / q3_K block: bits 2s..2s+1 of the half's 32 qs bytes.
inline __m256i two_bit_field(__m256i q, int s) {
  return _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), _mm256_set1_epi8(0x03));
}

// q2_K: per super-block and activation row, int32 lanes Σ_j sc_j Σ_k q_k a_k (levels 0..3 unsigned, maddubs, madd
// by the pair's scales) and Σ_j m_j bsums_j (one madd); acc = fma(d_w d_a, lanes, acc), then
// acc = fnma(dmin_w d_a, mins, acc), as q4_K's tile.
template <int R, int C>
struct Q2KTile {
  static void run(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                  std::int64_t cols, float* y, std::int64_t ldy) {
    const BlockQ8_K* ac[C];
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) ac[c] = reinterpret_cast<const BlockQ8_K*>(a + c * arb);
    const std::int64_t nb = cols / QK_K;
    const std::size_t pf = prefetch_offset(R, wrb);
    TANDEM_UNROLL
    for (int r = 0; r < R; ++r) {
      const BlockQ2_K* wr = reinterpret_cast<const BlockQ2_K*>(w + r * wrb);
      __m256 acc[C];
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
      for (std::int64_t i = 0; i < nb; ++i) {
        const BlockQ2_K& b = wr[i];
        TANDEM_UNROLL
        for (std::size_t off = 0; off < sizeof(BlockQ2_K); off += 64) prefetch(reinterpret_cast<const char*>(&b) + off, pf);
        const __m128i packed = load128(b.scales);
        const __m128i sc8 = _mm_and_si128(packed, _mm_set1_epi8(0x0F));
        const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0F)));
        __m256i sumi[C];
        TANDEM_UNROLL
        for (int c = 0; c < C; ++c) sumi[c] = _mm256_setzero_si256();
        TANDEM_UNROLL
        for (int h = 0; h < 2; ++h) {
          const __m256i q = load256(b.qs + 32 * h);
          TANDEM_UNROLL
          for (int s = 0; s < 4; ++s) {
            const __m256i lev = two_bit_field(q, s);
            const __m256i scale = pair_scales(sc8, 4 * h + s);
            TANDEM_UNROLL
            for (int c = 0; c < C; ++c) {
              const __m256i p16 = _mm256_maddubs_epi16(lev, load256(ac[c][i].qs + 128 * h + 32 * s));
              sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(scale, p16));
            }
          }
        }
        const float dw = h2f(b.d);
        const float mw = h2f(b.dmin);
        TANDEM_UNROLL
        for (int c = 0; c < C; ++c) {
          const __m256i mins = _mm256_madd_epi16(load256(ac[c][i].bsums), mins16);
          acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * ac[c][i].d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
          acc[c] = _mm256_fnmadd_ps(_mm256_set1_ps(mw * ac[c][i].d), _mm256_cvtepi32_ps(mins), acc[c]);
        }
      }
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) y[c * ldy + r] = hsum8(acc[c]);
    }
  }
};

// The 16 signed 6-bit scales of a q3_K block (minus 32) as int8 (quant_k23's q3_K_scale, written again here so
// that no function is shared with the files built without AVX2).
inline __m128i q3_K_scales(const BlockQ3_K& b) {
  alignas(16) std::int8_t sc[16];
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? b.scales[j] & 0xF : b.scales[j - 8] >> 4;
    const int high = (b.scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    sc[j] = static_cast<std::int8_t>((low | (high << 4)) - 32);
  }
  return _mm_load_si128(reinterpret_cast<const __m128i*>(sc));
}

// q3_K: levels u = low2 + 4 * bit in [0, 7] stand for u - 4: Σ_j sc_j Σ_k (u_k - 4) a_k is computed as
// Σ_j sc_j Σ_k u_k a_k - 4 Σ_j sc_j bsums_j, all in exact int32 lanes (as q6_K's -32); acc = fma(d_w d_a, lanes, acc).
template <int R, int C>
struct Q3KTile {
  static void run(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                  std::int64_t cols, float* y, std::int64_t ldy) {
    const BlockQ8_K* ac[C];
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) ac[c] = reinterpret_cast<const BlockQ8_K*>(a + c * arb);
    const std::int64_t nb = cols / QK_K;
    const std::size_t pf = prefetch_offset(R, wrb);
    TANDEM_UNROLL
    for (int r = 0; r < R; ++r) {
      const BlockQ3_K* wr = reinterpret_cast<const BlockQ3_K*>(w + r * wrb);
      __m256 acc[C];
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
      for (std::int64_t i = 0; i < nb; ++i) {
        const BlockQ3_K& b = wr[i];
        TANDEM_UNROLL
        for (std::size_t off = 0; off < sizeof(BlockQ3_K); off += 64) prefetch(reinterpret_cast<const char*>(&b) + off, pf);
        const __m128i sc8 = q3_K_scales(b);
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        __m256i sumi[C];
        TANDEM_UNROLL
        for (int c = 0; c < C; ++c) {
          const __m256i bsc = _mm256_madd_epi16(load256(ac[c][i].bsums), sc16);
          sumi[c] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(bsc, 2));
        }
        const __m256i hm = load256(b.hmask);
        TANDEM_UNROLL
        for (int h = 0; h < 2; ++h) {
          const __m256i q = load256(b.qs + 32 * h);
          TANDEM_UNROLL
          for (int s = 0; s < 4; ++s) {
            // The third bit of element 128 h + 32 s + l is bit 4 h + s of hmask[l]; as 4 in that byte.
            const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + s), _mm256_set1_epi8(0x01));
            const __m256i u = _mm256_or_si256(two_bit_field(q, s), _mm256_slli_epi16(bit, 2));
            const __m256i scale = pair_scales(sc8, 4 * h + s);
            TANDEM_UNROLL
            for (int c = 0; c < C; ++c) {
              const __m256i p16 = _mm256_maddubs_epi16(u, load256(ac[c][i].qs + 128 * h + 32 * s));
              sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(scale, p16));
            }
          }
        }
        const float dw = h2f(b.d);
        TANDEM_UNROLL
        for (int c = 0; c < C; ++c) {
          acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * ac[c][i].d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        }
      }
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) y[c * ldy + r] = hsum8(acc[c]);
    }
  }
};

// The 8 sub-block scales of an iq4_xs block minus 32, as int16 (quant_iq4.h's iq4_xs_scale, written again here so
// that no function is shared with the files built without AVX2).
inline void iq4_xs_scales(const BlockIQ4_XS& b, short* out) {
  for (int ib = 0; ib < QK_K / 32; ++ib) {
    const int lo = (b.scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf;
    const int hi = (b.scales_h >> 2 * ib) & 3;
    out[ib] = static_cast<short>((lo | (hi << 4)) - 32);
  }
}

// iq4_xs: per super-block and activation row, int32 lanes sum_ib (ls_ib - 32) * sum_k level_k a_k (the levels
// looked up as iq4_nl's, maddubs with the sign trick, madd by the sub-block's scale), then
// acc = fma(d_w * d_a, float(lanes), acc); the element is hsum8(acc).
template <int R, int C>
struct IQ4XSTile {
  static void run(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                  std::int64_t cols, float* y, std::int64_t ldy) {
    const BlockQ8_K* ac[C];
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) ac[c] = reinterpret_cast<const BlockQ8_K*>(a + c * arb);
    const std::int64_t nb = cols / QK_K;
    const std::size_t pf = prefetch_offset(R, wrb);
    const __m256i table = iq4_table();
    TANDEM_UNROLL
    for (int r = 0; r < R; ++r) {
      const BlockIQ4_XS* wr = reinterpret_cast<const BlockIQ4_XS*>(w + r * wrb);
      __m256 acc[C];
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
      for (std::int64_t i = 0; i < nb; ++i) {
        const BlockIQ4_XS& b = wr[i];
        TANDEM_UNROLL
        for (std::size_t off = 0; off < sizeof(BlockIQ4_XS); off += 64) {
          prefetch(reinterpret_cast<const char*>(&b) + off, pf);
        }
        __m256i sumi[C];
        TANDEM_UNROLL
        for (int c = 0; c < C; ++c) sumi[c] = _mm256_setzero_si256();
        short ls[QK_K / 32];
        iq4_xs_scales(b, ls);
        TANDEM_UNROLL
        for (int ib = 0; ib < QK_K / 32; ++ib) {
          const __m256i wv = _mm256_shuffle_epi8(table, nibbles(b.qs + 16 * ib));
          const __m256i aw = _mm256_sign_epi8(wv, wv);
          const __m256i scale = _mm256_set1_epi16(ls[ib]);
          TANDEM_UNROLL
          for (int c = 0; c < C; ++c) {
            const __m256i p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(load256(ac[c][i].qs + 32 * ib), wv));
            sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(scale, p16));
          }
        }
        const float dw = h2f(b.d);
        TANDEM_UNROLL
        for (int c = 0; c < C; ++c) {
          acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * ac[c][i].d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        }
      }
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) y[c * ldy + r] = hsum8(acc[c]);
    }
  }
};

// ---- the table ------------------------------------------------------------------------------------------------

// Register blocks. Decode tiles (one activation) take more weight rows: independent accumulator chains and
// several row streams in flight (k-quant tiles do their rows one after the other; two per call measured a little
// faster than one). Prefill tiles share each loaded weight vector among C activations and each
// activation vector among R rows: f32/f16/bf16 4 x 3 (12 accumulators + 3 activation vectors); q8_0 2 x 4; q4_0
// 2 x 3 (its activations carry a correction vector too); k-quants 1 x 4 (a super-block's unpacked levels and
// scales are shared by the activations).
struct Blocking {
  int decode_rows;
  int rows;
  int acts;
};
constexpr Blocking kFloat{8, 4, 3};
constexpr Blocking kQ8_0{8, 2, 4};
constexpr Blocking kQ4_0{8, 2, 3};
constexpr Blocking kK{2, 1, 4};

template <template <int, int> class K, const Blocking& B>
constexpr TypeKernels entry(QuantizeActFn q) {
  constexpr int max_rows = B.decode_rows > B.rows ? B.decode_rows : B.rows;
  return {q, Tiles<K, max_rows, B.acts>::tile, B.decode_rows, B.rows, B.acts};
}

constexpr KernelTable make_avx2_table() {
  KernelTable t;
  t.isa = Isa::avx2;
  t.types[static_cast<int>(WType::f32)] = entry<F32Tile, kFloat>(store_f32);
  t.types[static_cast<int>(WType::f16)] = entry<F16Tile, kFloat>(quantize_f16);
  t.types[static_cast<int>(WType::bf16)] = entry<BF16Tile, kFloat>(quantize_bf16);
  t.types[static_cast<int>(WType::q8_0)] = entry<Q8_0Tile, kQ8_0>(quantize_q8_0);
  t.types[static_cast<int>(WType::q4_0)] = entry<Q4_0Tile, kQ4_0>(quantize_q8_0);
  t.types[static_cast<int>(WType::q4_K)] = entry<Q4KTile, kK>(quantize_q8_K);
  t.types[static_cast<int>(WType::q5_K)] = entry<Q5KTile, kK>(quantize_q8_K);
  t.types[static_cast<int>(WType::q6_K)] = entry<Q6KTile, kK>(quantize_q8_K);
  t.types[static_cast<int>(WType::q5_0)] = entry<Q5_0Tile, kQ4_0>(quantize_q8_0);
  t.types[static_cast<int>(WType::q4_1)] = entry<Q4_1Tile, kQ4_0>(quantize_q8_1);
  t.types[static_cast<int>(WType::q5_1)] = entry<Q5_1Tile, kQ4_0>(quantize_q8_1);
  t.types[static_cast<int>(WType::iq4_nl)] = entry<IQ4NLTile, kQ4_0>(quantize_q8_0);
  t.types[static_cast<int>(WType::iq4_xs)] = entry<IQ4XSTile, kK>(quantize_q8_K);
  t.types[static_cast<int>(WType::q2_K)] = entry<Q2KTile, kK>(quantize_q8_K);
  t.types[static_cast<int>(WType::q3_K)] = entry<Q3KTile, kK>(quantize_q8_K);
  return t;
}

constexpr KernelTable kAvx2Table = make_avx2_table();

}  // namespace

const KernelTable& avx2_table() { return kAvx2Table; }

}  // namespace tandem::kernels::detail
