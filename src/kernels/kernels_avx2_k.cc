// AVX2 + FMA + F16C tiles of the 256-element super-block types x q8_K activations (q4_K, q5_K, q6_K, q2_K, q3_K,
// iq4_xs), split from kernels_avx2.cc along that line; same flags, same rules (its header comment and ODR note).
#include "kernels/kernels_avx2_act.h"
#include "kernels/kernels_avx2_common.h"
#include "kernels/kernels_avx2_k.h"

namespace tandem::kernels::detail {
namespace {

// ---- k-quants x q8_K -----------------------------------------------------------------------------------------

// The loop every super-block tile shares: for each of its R weight rows, one 8-lane accumulator per activation row,
// T::block over the row's super-blocks in order (prefetching the rows ahead), then a fixed-order horizontal sum.
template <class T, int R, int C>
inline void superblock_rows(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                            std::int64_t cols, float* y, std::int64_t ldy) {
  using Block = typename T::Block;
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
      T::block(b, ac, i, acc);
    }
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) y[c * ldy + r] = hsum8(acc[c]);
  }
}

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
  // One super-block of weight row b against activation rows ac[0..C), into their accumulators.
  static void block(const Block& b, const BlockQ8_K* const (&ac)[C], std::int64_t i, __m256 (&acc)[C]) {
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
  static void run(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                  std::int64_t cols, float* y, std::int64_t ldy) {
    superblock_rows<KMinnedTile, R, C>(w, wrb, a, arb, cols, y, ldy);
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
  using Block = BlockQ6_K;
  // One super-block of weight row b against activation rows ac[0..C), into their accumulators.
  static void block(const BlockQ6_K& b, const BlockQ8_K* const (&ac)[C], std::int64_t i, __m256 (&acc)[C]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
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
  static void run(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                  std::int64_t cols, float* y, std::int64_t ldy) {
    superblock_rows<Q6KTile, R, C>(w, wrb, a, arb, cols, y, ldy);
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
  using Block = BlockQ2_K;
  // One super-block of weight row b against activation rows ac[0..C), into their accumulators.
  static void block(const BlockQ2_K& b, const BlockQ8_K* const (&ac)[C], std::int64_t i, __m256 (&acc)[C]) {
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
  static void run(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                  std::int64_t cols, float* y, std::int64_t ldy) {
    superblock_rows<Q2KTile, R, C>(w, wrb, a, arb, cols, y, ldy);
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
  using Block = BlockQ3_K;
  // One super-block of weight row b against activation rows ac[0..C), into their accumulators.
  static void block(const BlockQ3_K& b, const BlockQ8_K* const (&ac)[C], std::int64_t i, __m256 (&acc)[C]) {
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
  static void run(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                  std::int64_t cols, float* y, std::int64_t ldy) {
    superblock_rows<Q3KTile, R, C>(w, wrb, a, arb, cols, y, ldy);
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
  using Block = BlockIQ4_XS;
  // One super-block of weight row b against activation rows ac[0..C), into their accumulators.
  static void block(const BlockIQ4_XS& b, const BlockQ8_K* const (&ac)[C], std::int64_t i, __m256 (&acc)[C]) {
    const __m256i table = iq4_table();
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
  static void run(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                  std::int64_t cols, float* y, std::int64_t ldy) {
    superblock_rows<IQ4XSTile, R, C>(w, wrb, a, arb, cols, y, ldy);
  }
};

}  // namespace

TypeKernels avx2_superblock_kernels(WType t) {
  switch (t) {
    case WType::q4_K: return entry<Q4KTile, kK>(quantize_q8_K);
    case WType::q5_K: return entry<Q5KTile, kK>(quantize_q8_K);
    case WType::q6_K: return entry<Q6KTile, kK>(quantize_q8_K);
    case WType::q2_K: return entry<Q2KTile, kK>(quantize_q8_K);
    case WType::q3_K: return entry<Q3KTile, kK>(quantize_q8_K);
    case WType::iq4_xs: return entry<IQ4XSTile, kK>(quantize_q8_K);
    default: return {};
  }
}

}  // namespace tandem::kernels::detail
