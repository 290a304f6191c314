// Internal to the kernels library, for the files built with the AVX-512 flags only (kernels_avx512.cc,
// kernels_avx512_bf16.cc): the 512-bit float tile and its helpers. Like kernels_avx2_common.h (which it includes),
// everything is in an anonymous namespace, so no AVX-512-compiled inline function is shared with code that runs on
// other CPUs (the ODR note in kernels_avx2.cc).
//
// Each step of a float tile reads one 64-byte cache line of every weight row and activation row it pairs: 16 f32,
// or 32 f16 / bf16 elements. The last, partial step reads its elements with masked loads (zeros past the end), so
// a tile never reads past a row and needs no copy of its tail.
#pragma once

#include <immintrin.h>

#include "kernels/kernels_avx2_common.h"

namespace tandem::kernels::detail {
namespace {

// Fixed-order horizontal sum of 16 lanes: the two 256-bit halves added, then hsum8's order.
inline float hsum16(__m512 v) {
  const __m256 lo = _mm512_castps512_ps256(v);
  // (the upper 256 bits through a shuffle: GCC 12 warns on the extract intrinsics' undefined operand)
  const __m256 hi = _mm512_castps512_ps256(_mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(3, 2, 3, 2)));
  return hsum8(_mm256_add_ps(lo, hi));
}

inline __m512i load512(const void* p) { return _mm512_loadu_si512(p); }

// The first n (0 <= n <= 32) 16-bit elements at p, zeros after them; reads nothing past element n.
inline __mmask32 first32(int n) { return n >= 32 ? ~__mmask32{0} : (__mmask32{1} << n) - 1; }
inline __mmask16 first16(int n) { return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1); }

// A tile's set-up and end, the same in every 512-bit tile: its R weight rows' and C activation rows' pointers
// (row_ptrs, kernels_avx2_common.h), the R x C accumulators at zero, and each accumulator's fixed-order sum stored to
// y[c * ldy + r].
template <int R, int C>
inline void zero_acc(__m512 (&acc)[R][C]) {
  TANDEM_UNROLL
  for (int r = 0; r < R; ++r) {
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
}

// Sixteen accumulators' sums at once, each with hsum16's additions in its order (lanes i and i + 8, then i and i + 4,
// i and i + 2, i and i + 1), four to sixteen accumulators' lanes per instruction: 30 shuffles and 15 additions
// where sixteen hsum16 take 64 and 64. Lane 4c + r of the result is acc[r][c]'s sum.
inline __m512 sum16x16(const __m512 (&acc)[4][4]) {
  constexpr int kLo = _MM_SHUFFLE(1, 0, 1, 0), kHi = _MM_SHUFFLE(3, 2, 3, 2);  // 128-bit blocks 0,1 | 2,3
  constexpr int kEven = _MM_SHUFFLE(2, 0, 2, 0), kOdd = _MM_SHUFFLE(3, 1, 3, 1);
  __m512 l1[8];
  TANDEM_UNROLL
  for (int i = 0; i < 8; ++i) {  // lanes i and i + 8 of two accumulators: [a's 8 | b's 8]
    const __m512 a = acc[i / 2][(2 * i) % 4], b = acc[i / 2][(2 * i) % 4 + 1];
    l1[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, kLo), _mm512_shuffle_f32x4(a, b, kHi));
  }
  __m512 l2[4];
  TANDEM_UNROLL
  for (int i = 0; i < 4; ++i)  // i and i + 4: [a's 4 | b's 4 | c's 4 | d's 4]
    l2[i] = _mm512_add_ps(_mm512_shuffle_f32x4(l1[2 * i], l1[2 * i + 1], kEven),
                          _mm512_shuffle_f32x4(l1[2 * i], l1[2 * i + 1], kOdd));
  __m512 l3[2];
  TANDEM_UNROLL
  for (int i = 0; i < 2; ++i)  // i and i + 2, within each 128-bit block
    l3[i] = _mm512_add_ps(_mm512_shuffle_ps(l2[2 * i], l2[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                          _mm512_shuffle_ps(l2[2 * i], l2[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_ps(l3[0], l3[1], kEven), _mm512_shuffle_ps(l3[0], l3[1], kOdd));
}

// A 4 x 4 tile's 16 sums (sum16x16: each hsum16's value) to y[c * ldy + r].
inline void store_sums(const __m512 (&acc)[4][4], float* y, std::int64_t ldy) {
  alignas(64) float out[16];
  _mm512_store_ps(out, sum16x16(acc));
  TANDEM_UNROLL
  for (int c = 0; c < 4; ++c) _mm_storeu_ps(y + c * ldy, _mm_load_ps(out + 4 * c));
}
// Any other tile's sums to y[c * ldy + r], each hsum16's value: from 12 accumulators on, sixteen at a time through
// sum16x16 (accumulator c * R + r in lane (c * R + r) % 16 of group (c * R + r) / 16, a short last group padded
// with zeros), fewer one hsum16 each.
template <int R, int C>
inline void store_sums(const __m512 (&acc)[R][C], float* y, std::int64_t ldy) {
  constexpr int kN = R * C;
  if constexpr (kN < 12) {
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) {
      TANDEM_UNROLL
      for (int r = 0; r < R; ++r) y[c * ldy + r] = hsum16(acc[r][c]);
    }
  } else {
    constexpr int kGroups = (kN + 15) / 16;
    alignas(64) float out[16 * kGroups];
    TANDEM_UNROLL
    for (int g = 0; g < kGroups; ++g) {
      __m512 group[4][4];
      TANDEM_UNROLL
      for (int j = 0; j < 16; ++j) {
        const int i = 16 * g + j;
        group[j % 4][j / 4] = i < kN ? acc[i % R][i / R] : _mm512_setzero_ps();
      }
      _mm512_store_ps(out + 16 * g, sum16x16(group));
    }
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) {
      TANDEM_UNROLL
      for (int r = 0; r < R; ++r) y[c * ldy + r] = out[c * R + r];
    }
  }
}

// Float sources: kStep elements per step (one cache line), delivered as kHalves vectors of 16 floats; `n` < kStep
// is the count of valid elements in a partial step (masked loads). Weights and activations are loaded alike, so
// the products pair up whatever lane an element lands in.
struct F32Src512 {
  using T = float;
  static constexpr int kStep = 16;
  static constexpr int kHalves = 1;
  static constexpr bool kPhased = true;  // FloatTile512's first step lines the steps up with the cache lines
  static __m512 load(const float* p, int) { return _mm512_loadu_ps(p); }
  // Elements [lo, hi) of a step read from p (the others off: nothing is read for them).
  static __m512 load_lanes(const float* p, int, int lo, int hi) {
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>(first16(hi) & ~first16(lo)), p);
  }
  static __m512 load_part(const float* p, int, int n) { return _mm512_maskz_loadu_ps(first16(n), p); }
};
struct F16Src512 {
  using T = std::uint16_t;
  static constexpr int kStep = 32;
  static constexpr int kHalves = 2;
  static constexpr bool kPhased = false;
  static __m512 load(const std::uint16_t* p, int h) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * h)));
  }
  static __m512 load_part(const std::uint16_t* p, int h, int n) {
    const int left = n - 16 * h;
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(first16(left < 0 ? 0 : left), p + 16 * h));
  }
};
// f32 activations of f16 weights (f16-rounded values held as f32), in F16Src512's lanes: half h is elements
// 16h..16h+15 of the step.
struct F32ActOfF16Src512 {
  using T = float;
  static constexpr int kStep = 32;
  static constexpr int kHalves = 2;
  static constexpr bool kPhased = false;
  static __m512 load(const float* p, int h) { return _mm512_loadu_ps(p + 16 * h); }
  static __m512 load_part(const float* p, int h, int n) {
    const int left = n - 16 * h;
    return _mm512_maskz_loadu_ps(first16(left < 0 ? 0 : left), p + 16 * h);
  }
};
// bf16 widened to f32 by interleaving zeros below each 16-bit value (half 0: the low four of each 128-bit lane's
// eight, half 1: the high four).
struct BF16Src512 {
  using T = std::uint16_t;
  static constexpr int kStep = 32;
  static constexpr int kHalves = 2;
  static constexpr bool kPhased = true;
  static __m512 widen(__m512i v, int h) {
    const __m512i z = _mm512_setzero_si512();
    return _mm512_castsi512_ps(h == 0 ? _mm512_unpacklo_epi16(z, v) : _mm512_unpackhi_epi16(z, v));
  }
  static __m512 load(const std::uint16_t* p, int h) { return widen(load512(p), h); }
  static __m512 load_part(const std::uint16_t* p, int h, int n) {
    return widen(_mm512_maskz_loadu_epi16(first32(n), p), h);
  }
  static __m512 load_lanes(const std::uint16_t* p, int h, int lo, int hi) {
    return widen(_mm512_maskz_loadu_epi16(first32(hi) & ~first32(lo), p), h);
  }
};

// The address s elements before p, for a masked load whose lanes below s are off (they read nothing).
template <class T>
inline const T* back(const T* p, int s) {
  return reinterpret_cast<const T*>(reinterpret_cast<std::uintptr_t>(p) - static_cast<std::uintptr_t>(s) * sizeof(T));
}

// One accumulator chain of 16 lanes per output element: acc = fma(w, x, acc) over the steps in order (a source's
// halves in order within a step), the partial last step with masked loads, then hsum16. The operations for one
// (row, activation) pair are the same for every R and C. ASrc loads the activations (f16 weights: f32).
template <class Src, int R, int C, class ASrc = Src>
struct FloatTile512 {
  using T = typename Src::T;
  using TA = typename ASrc::T;
  static_assert(ASrc::kStep == Src::kStep && ASrc::kHalves == Src::kHalves, "weights and activations step alike");

  template <bool kPart>
  static inline void step(const T* const* wr, const TA* const* ac, std::int64_t k, int n, __m512 (&acc)[R][C]) {
    TANDEM_UNROLL
    for (int h = 0; h < Src::kHalves; ++h) {
      __m512 xv[C];
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) xv[c] = kPart ? ASrc::load_part(ac[c] + k, h, n) : ASrc::load(ac[c] + k, h);
      TANDEM_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m512 wv = kPart ? Src::load_part(wr[r] + k, h, n) : Src::load(wr[r] + k, h);
        TANDEM_UNROLL
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(wv, xv[c], acc[r][c]);
      }
    }
  }

  static void run(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                  std::int64_t cols, float* y, std::int64_t ldy) {
    const T* wr[R];
    const TA* ac[C];
    row_ptrs(wr, w, wrb);
    row_ptrs(ac, a, arb);
    __m512 acc[R][C];
    zero_acc(acc);
    const std::size_t pf = prefetch_offset(R, wrb);
    std::int64_t k = 0;
    if constexpr (Src::kPhased && ASrc::kPhased) {
      // Rows of whole cache lines that start s elements past a line (a GGUF tensor on a 32-byte boundary; a
      // safetensors file's data anywhere): the first step puts elements 0 .. kStep - 1 - s in element slots
      // s .. kStep - 1, so every later step's weight loads read one line each instead of two halves. Element k's slot
      // is (k + s) % kStep in every tile shape and call: s belongs to the matrix (where it lies), not to the call.
      const int s = wrb % 64 == 0 ? static_cast<int>(reinterpret_cast<std::uintptr_t>(w) % 64 / sizeof(T)) : 0;
      if (s != 0) {
        const int first = cols < Src::kStep - s ? static_cast<int>(cols) : Src::kStep - s;
        TANDEM_UNROLL
        for (int h = 0; h < Src::kHalves; ++h) {
          __m512 xv[C];
          TANDEM_UNROLL
          for (int c = 0; c < C; ++c) xv[c] = ASrc::load_lanes(back(ac[c], s), h, s, s + first);
          TANDEM_UNROLL
          for (int r = 0; r < R; ++r) {
            const __m512 wv = Src::load_lanes(back(wr[r], s), h, s, s + first);
            TANDEM_UNROLL
            for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(wv, xv[c], acc[r][c]);
          }
        }
        k = first;
      }
    }
    for (; k + Src::kStep <= cols; k += Src::kStep) {
      TANDEM_UNROLL
      for (int r = 0; r < R; ++r) prefetch(wr[r] + k, pf);
      step<false>(wr, ac, k, Src::kStep, acc);
    }
    if (k < cols) step<true>(wr, ac, k, static_cast<int>(cols - k), acc);
    store_sums(acc, y, ldy);
  }
};

// ---- 32-element blocks: two blocks per vector (kernels_avx512.cc, kernels_amx.cc) -------------------------------

// Two blocks' 32 bytes side by side (b1 == nullptr: zeros in the upper half).
template <class B>
inline __m512i two_q8(const B* b0, const B* b1) {
  const __m256i lo = load256(b0->qs);
  return b1 ? _mm512_inserti64x4(_mm512_castsi256_si512(lo), load256(b1->qs), 1) : _mm512_zextsi256_si512(lo);
}

// The 32 nibbles of each of two blocks in element order (element j < 16: low nibble of qs[j], j >= 16: high nibble
// of qs[j - 16]): 128-bit lanes [qs0, qs0, qs1, qs1], shifted by 0 / 4 per 64-bit pair, masked.
inline __m512i two_nibbles(const std::uint8_t* qs0, const std::uint8_t* qs1) {
  const __m256i b0 = _mm256_broadcastsi128_si256(load128(qs0));
  const __m256i b1 = qs1 ? _mm256_broadcastsi128_si256(load128(qs1)) : _mm256_setzero_si256();
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(b0), b1, 1);
  const __m512i shifted = _mm512_srlv_epi64(both, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
  return _mm512_and_si512(shifted, _mm512_set1_epi8(0x0F));
}

// The fifth bits of two q5 blocks as 0x10 in the bytes of their elements (bit j of qh is element j's).
template <class B>
inline __m512i two_fifth_bits(const B* b0, const B* b1) {
  std::uint32_t h0 = 0, h1 = 0;
  std::memcpy(&h0, b0->qh, 4);
  if (b1) std::memcpy(&h1, b1->qh, 4);
  const __mmask64 m = static_cast<__mmask64>(h0) | (static_cast<__mmask64>(h1) << 32);
  return _mm512_maskz_mov_epi8(m, _mm512_set1_epi8(0x10));
}

// Level sources: the weights' unsigned bytes u = level + kOffset for two blocks.
struct Q8_0Levels512 {
  using Block = BlockQ8_0;
  static constexpr int kOffset = 128;
  static __m512i row(const Block* b0, const Block* b1) {
    return _mm512_xor_si512(two_q8(b0, b1), _mm512_set1_epi8(static_cast<char>(0x80)));
  }
};
struct Q4_0Levels512 {
  using Block = BlockQ4_0;
  static constexpr int kOffset = 8;
  static __m512i row(const Block* b0, const Block* b1) { return two_nibbles(b0->qs, b1 ? b1->qs : nullptr); }
};
struct Q5_0Levels512 {
  using Block = BlockQ5_0;
  static constexpr int kOffset = 16;
  static __m512i row(const Block* b0, const Block* b1) {
    return _mm512_or_si512(two_nibbles(b0->qs, b1 ? b1->qs : nullptr), two_fifth_bits(b0, b1));
  }
};
struct IQ4NLLevels512 {
  using Block = BlockIQ4_NL;
  static constexpr int kOffset = 128;
  static __m512i row(const Block* b0, const Block* b1) {
    const __m512i table = _mm512_broadcast_i32x4(load128(kIq4NlValues));
    const __m512i w = _mm512_shuffle_epi8(table, two_nibbles(b0->qs, b1 ? b1->qs : nullptr));
    return _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80)));
  }
};

// Two f16 scales as 16 floats: d0 in lanes 0-7, d1 in lanes 8-15 (f16 +0 for a missing block).
inline __m512 two_scales(std::uint16_t d0, std::uint16_t d1) {
  const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<short>(d0))),
                                            _mm_set1_epi16(static_cast<short>(d1)), 1);
  return _mm512_cvtph_ps(h);
}

// The packed layouts' 4-bit codes (kernels_amx.cc, kernels_avx512_k.cc): 8 B rows of 64 codes (bq) in 256 bytes,
// vector k holding B row k in its low nibbles and B row k + 4 in its high nibbles (only the codes' low 4 bits kept).
inline void encode_nibbles(const std::uint8_t* bq, std::uint8_t* out) {
  const __m512i m = _mm512_set1_epi8(0x0F);
  for (int k = 0; k < 4; ++k) {
    const __m512i lo = _mm512_and_si512(load512(bq + 64 * k), m);
    const __m512i hi = _mm512_slli_epi16(_mm512_and_si512(load512(bq + 64 * (k + 4)), m), 4);
    _mm512_storeu_si512(out + 64 * k, _mm512_or_si512(lo, hi));
  }
}
inline void decode_nibbles(const std::uint8_t* p, __m512i (&u)[8]) {
  const __m512i m = _mm512_set1_epi8(0x0F);
  TANDEM_UNROLL
  for (int k = 0; k < 4; ++k) {
    const __m512i v = load512(p + 64 * k);
    u[k] = _mm512_and_si512(v, m);
    u[k + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m);
  }
}

// A bit plane of a packed layout (8 masks of 64 bits, bit i of mask k for B row k's byte i), as `value` in the
// bytes whose bit is set, or-ed into w.
inline void bit_plane(const std::uint8_t* p, char value, __m512i (&w)[8]) {
  TANDEM_UNROLL
  for (int k = 0; k < 8; ++k) {
    std::uint64_t m;
    std::memcpy(&m, p + 8 * k, 8);
    w[k] = _mm512_or_si512(w[k], _mm512_maskz_mov_epi8(static_cast<__mmask64>(m), _mm512_set1_epi8(value)));
  }
}

// ---- attention of a decode row (kernels.h attention_decode) ----------------------------------------------------

// exp(x) for x <= 0 (softmax's arguments): Cephes' expf — x = n ln 2 + r, |r| <= ln 2 / 2, a degree-6 polynomial,
// times 2^n (vscalefps); x below -87.3 taken as -87.3 (exp of it, 1.2e-38, is still normal). About 2 ulp.
inline __m512 exp512_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3F));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341F)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375F), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4F), r);
  __m512 y = _mm512_set1_ps(1.9875691500E-4F);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507E-3F));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073E-3F));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894E-2F));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459E-1F));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201E-1F));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0F)));
  return _mm512_scalef_ps(y, n);
}

// 16 keys' or values' elements as f32 (lanes off in m read as 0, nothing read for them): f32 as they are, f16
// widened exactly.
inline __m512 kv_load512(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 kv_load512(const std::uint16_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }

// NI vectors of 16 elements of a head's output (the last one's lanes in `tail`): out = (Σ_j e_j · v_j) / sum, each
// element one FMA chain over j from first to pos (e: the exponentials in scratch; v0: the pool's elements of position
// 0 at the vectors' offset). The NI chains in registers (a runtime count kept them in memory: a store and a reload
// per element and position).
template <int NI, class KV>
inline void weighted_values_512(const float* e, const KV* v0, const std::int64_t* slots, std::int64_t row,
                                std::int64_t first, std::int64_t pos, __m512 sum, __mmask16 tail, float* out) {
  __m512 acc[NI];
  for (int i = 0; i < NI; ++i) acc[i] = _mm512_setzero_ps();
  for (std::int64_t j = first; j <= pos; ++j) {
    const __m512 p = _mm512_set1_ps(e[j]);
    const KV* vj = v0 + slots[j] * row;
    TANDEM_UNROLL
    for (int i = 0; i < NI; ++i)
      acc[i] = _mm512_fmadd_ps(p, kv_load512(vj + 16 * i, i + 1 < NI ? __mmask16(0xFFFF) : tail), acc[i]);
  }
  for (int i = 0; i < NI; ++i)
    _mm512_mask_storeu_ps(out + 16 * i, i + 1 < NI ? __mmask16(0xFFFF) : tail, _mm512_div_ps(acc[i], sum));
}

// Per head: scores by 16-lane FMA chains over the head's elements (the last vector masked), 16 keys' sums at once
// (sum16x16: each key's hsum16, bit for bit), scaled and capped; exp of score − max 16 keys at a time, their sum in
// 16 lanes then hsum16; out = (Σ_j e_j v_j) / sum with the weighted sums in FMA chains over j, 64 elements at a
// time. Head sizes above 256 go to the reference.
template <class KV>
inline void attention_512(const float* q, std::int64_t heads, std::int64_t kv_heads, std::int64_t hd, const KV* k,
                          const KV* v, const std::int64_t* slots, std::int64_t pos, std::int64_t window,
                          float scale, float cap, float* scratch, float* out, KvRows rows) {
  if (hd > 256) {
    ref_attention_kv(q, heads, kv_heads, hd, k, v, slots, pos, window, scale, cap, scratch, out, rows);
    return;
  }
  const std::int64_t group = heads / kv_heads, row = kv_heads * hd;
  const std::int64_t first = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
  const int nv = static_cast<int>((hd + 15) / 16);
  const __mmask16 last = first16(static_cast<int>(hd - 16 * (nv - 1)));
  // The positions' rows (or, for long contexts, each kv head's part of them) into cache first (touch_kv_head).
  const bool touch = rows == KvRows::cold, whole = touch_whole_rows<KV>(row, first, pos);
  if (touch && whole) touch_kv_head(k, v, slots, row, 0, row, first, pos);
  for (std::int64_t h = 0; h < heads; ++h) {
    const float* qh = q + h * hd;
    const std::int64_t off = (h / group) * hd;
    if (touch && !whole && h % group == 0) touch_kv_head(k, v, slots, row, off, hd, first, pos);
    __m512 qv[16];
    for (int i = 0; i < nv; ++i) qv[i] = _mm512_maskz_loadu_ps(i + 1 < nv ? __mmask16(0xFFFF) : last, qh + 16 * i);
    // Scores 16 keys at a time: per key an FMA chain over the head's vectors, then the 16 chains' sums at once
    // (sum16x16; key kk of the block in lane kk).
    __m512 maxv = _mm512_set1_ps(-__builtin_inff());
    for (std::int64_t j0 = first; j0 <= pos; j0 += 16) {
      const int nk = pos + 1 - j0 < 16 ? static_cast<int>(pos + 1 - j0) : 16;
      __m512 acc[4][4];
      TANDEM_UNROLL
      for (int kk = 0; kk < 16; ++kk) {
        __m512 a = _mm512_setzero_ps();
        if (kk < nk) {
          const KV* kj = k + slots[j0 + kk] * row + off;
          a = _mm512_mul_ps(qv[0], kv_load512(kj, nv > 1 ? __mmask16(0xFFFF) : last));
          for (int i = 1; i < nv; ++i)
            a = _mm512_fmadd_ps(qv[i], kv_load512(kj + 16 * i, i + 1 < nv ? __mmask16(0xFFFF) : last), a);
        }
        acc[kk % 4][kk / 4] = a;
      }
      const __mmask16 m = first16(nk);
      __m512 sc = _mm512_mul_ps(sum16x16(acc), _mm512_set1_ps(scale));
      if (cap > 0.0F) {
        alignas(64) float t[16];
        _mm512_store_ps(t, sc);
        for (int kk = 0; kk < nk; ++kk) t[kk] = cap * __builtin_tanhf(t[kk] / cap);
        sc = _mm512_load_ps(t);
      }
      _mm512_mask_storeu_ps(scratch + j0, m, sc);
      maxv = _mm512_mask_max_ps(maxv, m, maxv, sc);
    }
    const float mx = _mm512_reduce_max_ps(maxv);
    __m512 sumv = _mm512_setzero_ps();
    const __m512 mxv = _mm512_set1_ps(mx);
    for (std::int64_t j = first; j <= pos; j += 16) {
      const __mmask16 m = first16(static_cast<int>(pos + 1 - j));
      const __m512 e = _mm512_maskz_mov_ps(m, exp512_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scratch + j), mxv)));
      _mm512_mask_storeu_ps(scratch + j, m, e);
      sumv = _mm512_add_ps(sumv, e);
    }
    const __m512 sum = _mm512_set1_ps(hsum16(sumv));
    for (int i0 = 0; i0 < nv; i0 += 4) {
      const KV* v0 = v + off + 16 * i0;
      float* o = out + h * hd + 16 * i0;
      const __mmask16 tail = i0 + 4 >= nv ? last : __mmask16(0xFFFF);  // the block's last vector
      switch (nv - i0 < 4 ? nv - i0 : 4) {
        case 4: weighted_values_512<4>(scratch, v0, slots, row, first, pos, sum, tail, o); break;
        case 3: weighted_values_512<3>(scratch, v0, slots, row, first, pos, sum, tail, o); break;
        case 2: weighted_values_512<2>(scratch, v0, slots, row, first, pos, sum, tail, o); break;
        default: weighted_values_512<1>(scratch, v0, slots, row, first, pos, sum, tail, o); break;
      }
    }
  }
}

// Register blocks of the 512-bit tiles (32 vector registers): f32 / f16 4 x 6 (24 accumulators + 6 activation
// vectors + the weight vector), bf16 4 x 4; the integer types 4 x 4 (16 accumulators, and per activation its bytes,
// its offset term and its scales). Measured on the prefill benchmark (2048x768, n = 128, one thread): integer 4 x 4
// 5-7 % above 4 x 3 and 8-15 % above 8 x 2. Through bench_engine (Prefill128, 134M shape, one thread, three runs
// alternating): f32 4 x 6 6 % and f16 4 % above 4 x 4 once store_sums reduced 4 x 6 sixteen accumulators at a time
// (with one hsum16 each, 4 x 6 had lost f32 9 %); bf16's widening tile 8 % below, so it stays 4 x 4.
constexpr Blocking kFloat512{8, 4, 6};
constexpr Blocking kBF16_512{8, 4, 4};
constexpr Blocking kInt512{8, 4, 4};

}  // namespace
}  // namespace tandem::kernels::detail
