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
#include "kernels/kernels_avx2_blocks.h"
#include "kernels/kernels_avx2_common.h"
#include "kernels/kernels_avx2_k.h"
#include "kernels/rows_lanes.h"
#include "kernels/silu_lanes.h"

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
    row_ptrs(wr, w, wrb);
    row_ptrs(ac, a, arb);
    __m256 acc[R][C];
    zero_acc(acc);
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
  t.to_f16 = to_f16_row;
  t.silu_mul = silu_mul_lanes<8>;
  t.rmsnorm = rmsnorm_lanes<8>;
  t.rope = rope_lanes<8>;
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
