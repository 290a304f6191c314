// AVX-512 kernels (F, BW, VL and VNNI, with AVX2 + FMA + F16C; the only file built with those flags besides
// kernels_avx512_bf16.cc; kernels.cc calls into it only after checking the CPU). The table starts as the AVX2 one
// (the activation quantizers, whose bytes are the same on every path, and the 256-element super-block types) and
// replaces the tiles of the float types and of the 32-element block types.
//
// Integer dot products use VNNI's vpdpbusd (unsigned bytes x signed bytes, four products summed into each int32
// lane, added to the lane) on two 32-element blocks per 512-bit vector: lanes 0-7 hold block ib, lanes 8-15 block
// ib + 1. The weight levels are made unsigned u = level + offset (q8_0 and iq4_nl: the signed level xor 0x80, i.e.
// + 128; q4_0: the nibble, + 8; q5_0: + 16) and the offset is taken back out by starting each lane at
// -offset * (the sum of its four activation bytes), so a lane ends at sum(level * a) exactly, with no sign trick and
// no pair-sum step (AVX2 needs maddubs + madd + sign per pair; this is one instruction). Per block pair and
// (row, activation): acc = fma(d_w * d_a, float(lanes), acc), each lane with its own block's scales; hsum16 at the
// end. An odd last block runs alone with zeros (bytes and scales) in the upper lanes, which add exactly 0.
//
// Tiles are templates over R weight rows x C activation rows, the operations for one output element the same in
// every shape (batching and thread splits never change a result). Results differ from the AVX2 path's in the last
// bits only: the products and integer sums are exact on both, the float accumulation runs over 16 lanes (two blocks
// apart) instead of 8 (docs/kernels.md, "Paths and their differences").
#include "kernels/kernels_avx512_common.h"
#include "kernels/kernels_avx512_k.h"
#include "kernels/rows_lanes.h"
#include "kernels/silu_lanes.h"

namespace tandem::kernels::detail {
namespace {

template <int R, int C>
using F32Tile512 = FloatTile512<F32Src512, R, C>;
template <int R, int C>
using F16Tile512 = FloatTile512<F16Src512, R, C, F32ActOfF16Src512>;
template <int R, int C>
using BF16WidenTile512 = FloatTile512<BF16Src512, R, C>;

// ---- 32-element blocks x q8_0 activations --------------------------------------------------------------------

template <class L, int R, int C>
struct Q8ActTile512 {
  using Block = typename L::Block;

  // One step over blocks ib and ib + 1 (kPair) or block ib alone.
  template <bool kPair>
  static inline void step(const Block* const* wr, const BlockQ8_0* const* ac, std::int64_t ib, std::size_t pf,
                          __m512 (&acc)[R][C]) {
    __m512i av[C];
    __m512i init[C];
    __m512 da[C];
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) {
      const BlockQ8_0* a0 = &ac[c][ib];
      const BlockQ8_0* a1 = kPair ? a0 + 1 : nullptr;
      av[c] = two_q8(a0, a1);
      // -offset * (sum of each lane's four activation bytes): vpdpbusd with the offset as the unsigned operand.
      init[c] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                 _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(static_cast<char>(L::kOffset)), av[c]));
      da[c] = two_scales(a0->d, kPair ? a1->d : 0);
    }
    TANDEM_UNROLL
    for (int r = 0; r < R; ++r) {
      const Block* w0 = &wr[r][ib];
      const Block* w1 = kPair ? w0 + 1 : nullptr;
      prefetch(w0, pf);
      const __m512i u = L::row(w0, w1);
      const __m512 dw = two_scales(w0->d, kPair ? w1->d : 0);
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) {
        const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(init[c], u, av[c]));
        acc[r][c] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da[c]), p, acc[r][c]);
      }
    }
  }

  static void run(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                  std::int64_t cols, float* y, std::int64_t ldy) {
    const Block* wr[R];
    const BlockQ8_0* ac[C];
    row_ptrs(wr, w, wrb);
    row_ptrs(ac, a, arb);
    __m512 acc[R][C];
    zero_acc(acc);
    const std::int64_t nb = cols / QK8_0;
    const std::size_t pf = prefetch_offset(R, wrb);
    std::int64_t ib = 0;
    for (; ib + 2 <= nb; ib += 2) step<true>(wr, ac, ib, pf, acc);
    if (ib < nb) step<false>(wr, ac, ib, pf, acc);
    store_sums(acc, y, ldy);
  }
};

template <int R, int C>
using Q8_0Tile512 = Q8ActTile512<Q8_0Levels512, R, C>;
template <int R, int C>
using Q4_0Tile512 = Q8ActTile512<Q4_0Levels512, R, C>;
template <int R, int C>
using Q5_0Tile512 = Q8ActTile512<Q5_0Levels512, R, C>;
template <int R, int C>
using IQ4NLTile512 = Q8ActTile512<IQ4NLLevels512, R, C>;

// ---- q4_1 / q5_1 weights x q8_1 activations ---------------------------------------------------------------------

// Unsigned levels u (q4_1: [0, 15], q5_1: [0, 31]) times the activation bytes: vpdpbusd from zero, exact. Per block
// pair acc = fma(d_w * d_a, float(lanes), acc). The min terms m_w * s_a of all C activations go into one vector per
// row: lanes 2c and 2c + 1 hold activation c's even and odd blocks (mins = fma([m0 m1 m0 m1 ..], [s0 s1 ..], mins),
// lane-wise, so an element's lanes see the same operations whatever C is); y = hsum16(acc) + (lane 2c + lane 2c+1).
template <class B, bool kFive>
struct MinnedLevels512 {
  using Block = B;
  static __m512i row(const B* b0, const B* b1) {
    const __m512i u = two_nibbles(b0->qs, b1 ? b1->qs : nullptr);
    if constexpr (kFive) return _mm512_or_si512(u, two_fifth_bits(b0, b1));
    else return u;
  }
};

template <class L, int R, int C>
struct Q81ActTile512 {
  using Block = typename L::Block;
  static_assert(2 * C <= 16, "two min lanes per activation");

  template <bool kPair>
  static inline void step(const Block* const* wr, const BlockQ8_1* const* ac, std::int64_t ib, std::size_t pf,
                          __m512 (&acc)[R][C], __m512 (&mins)[R]) {
    __m512i av[C];
    __m512 da[C];
    alignas(32) std::uint16_t s16[16] = {};
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) {
      const BlockQ8_1* a0 = &ac[c][ib];
      const BlockQ8_1* a1 = kPair ? a0 + 1 : nullptr;
      av[c] = two_q8(a0, a1);
      da[c] = two_scales(a0->d, kPair ? a1->d : 0);
      s16[2 * c] = a0->s;
      s16[2 * c + 1] = kPair ? a1->s : 0;
    }
    const __m512 sa = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(s16)));
    TANDEM_UNROLL
    for (int r = 0; r < R; ++r) {
      const Block* w0 = &wr[r][ib];
      const Block* w1 = kPair ? w0 + 1 : nullptr;
      prefetch(w0, pf);
      const __m512i u = L::row(w0, w1);
      const __m512 dw = two_scales(w0->d, kPair ? w1->d : 0);
      const std::uint32_t m01 = static_cast<std::uint32_t>(w0->m) | (kPair ? static_cast<std::uint32_t>(w1->m) << 16 : 0u);
      mins[r] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_set1_epi32(static_cast<int>(m01))), sa, mins[r]);
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) {
        const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, av[c]));
        acc[r][c] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da[c]), p, acc[r][c]);
      }
    }
  }

  static void run(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                  std::int64_t cols, float* y, std::int64_t ldy) {
    const Block* wr[R];
    const BlockQ8_1* ac[C];
    row_ptrs(wr, w, wrb);
    row_ptrs(ac, a, arb);
    __m512 acc[R][C];
    zero_acc(acc);
    __m512 mins[R];
    TANDEM_UNROLL
    for (int r = 0; r < R; ++r) mins[r] = _mm512_setzero_ps();
    const std::int64_t nb = cols / QK8_1;
    const std::size_t pf = prefetch_offset(R, wrb);
    std::int64_t ib = 0;
    for (; ib + 2 <= nb; ib += 2) step<true>(wr, ac, ib, pf, acc, mins);
    if (ib < nb) step<false>(wr, ac, ib, pf, acc, mins);
    TANDEM_UNROLL
    for (int r = 0; r < R; ++r) {
      alignas(64) float m[16];
      _mm512_store_ps(m, mins[r]);
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) y[c * ldy + r] = hsum16(acc[r][c]) + (m[2 * c] + m[2 * c + 1]);
    }
  }
};

template <int R, int C>
using Q4_1Tile512 = Q81ActTile512<MinnedLevels512<BlockQ4_1, false>, R, C>;
template <int R, int C>
using Q5_1Tile512 = Q81ActTile512<MinnedLevels512<BlockQ5_1, true>, R, C>;

// ---- the table ------------------------------------------------------------------------------------------------

KernelTable make_avx512_table() {
  KernelTable t = avx2_table();
  t.isa = Isa::avx512;
  t.attention = attention_512<float>;
  t.attention_f16 = attention_512<std::uint16_t>;
  t.silu_mul = silu_mul_lanes<16>;
  t.rmsnorm = rmsnorm_lanes<16>;
  t.rope = rope_lanes<16>;
  set_tile<F32Tile512, kFloat512>(t, WType::f32);
  set_tile<F16Tile512, kFloat512>(t, WType::f16);
  set_tile<BF16WidenTile512, kBF16_512>(t, WType::bf16);
  set_tile<Q8_0Tile512, kInt512>(t, WType::q8_0);
  set_tile<Q4_0Tile512, kInt512>(t, WType::q4_0);
  set_tile<Q5_0Tile512, kInt512>(t, WType::q5_0);
  set_tile<IQ4NLTile512, kInt512>(t, WType::iq4_nl);
  set_tile<Q4_1Tile512, kInt512>(t, WType::q4_1);
  set_tile<Q5_1Tile512, kInt512>(t, WType::q5_1);
  for (WType k : {WType::q4_1, WType::q5_1})
    t.types[static_cast<int>(k)] = avx512_minned_kernels(k, t.types[static_cast<int>(k)]);
  for (WType k : {WType::q4_0, WType::q5_0, WType::iq4_nl, WType::q8_0})
    t.types[static_cast<int>(k)] = avx512_offset_kernels(k, t.types[static_cast<int>(k)]);
  for (WType k : {WType::q4_K, WType::q5_K, WType::q6_K, WType::q2_K, WType::q3_K, WType::iq4_xs})
    t.types[static_cast<int>(k)] = avx512_superblock_kernels(k);
  return t;
}

}  // namespace

const KernelTable& avx512_table() {
  static const KernelTable table = make_avx512_table();
  return table;
}

}  // namespace tandem::kernels::detail
