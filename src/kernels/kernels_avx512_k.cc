// AVX-512 VNNI kernels on matrices repacked at load: the 256-element super-block types (q4_K, q5_K, q6_K, q2_K,
// q3_K, iq4_xs) and the 32-element block types (q4_1, q5_1; q4_0, q5_0, iq4_nl, q8_0, each at its kind below): built
// with the avx512 flags like kernels_avx512.cc (its header comment and the ODR note in kernels_avx2.cc), called only
// after the CPU check. Without the side table (a range that does not start on a 16-row
// group, a matrix bound for an accelerator) the AVX2 tiles run instead.
//
// The side table (kernels.h, aux_bytes) is the matrix again in 16-row groups, per group and super-block a head of
// scales and then the levels in AMX's B order: B row k (k = 0..7) of a 32-element unit holds its elements 4k..4k+3
// of each weight row, row r at bytes 4r..4r+3 (each type's layout is at its kind below). So one vpdpbusd of B row k
// (the levels as unsigned bytes) with an activation's bytes 4k..4k+3 in every lane adds four products to each of the
// 16 rows' lanes: no reduction across lanes. Per super-block and activation the row lanes get the reference's
// integers exactly (the sub-block scales by vpmullo, mins and offsets through the activation's bsums by vpdpwssd),
// then its float step in its order, no fused multiply-add: vec_dot_ref's results (quant.cc, quant_iq4.cc) bit for
// bit, whatever the tile shape, the thread split or the batch.
#include "kernels/kernels_avx512_k.h"

#include <algorithm>

#include "kernels/kernels_avx2_k.h"
#include "kernels/kernels_avx512_common.h"
#include "kernels/kernels_avx512_sb.h"

namespace tandem::kernels::detail {
namespace {

constexpr int kRows = 16;    // weight rows of a group (vector lanes)
constexpr int kGroups = 4;   // groups per call (decode_rows, tile_rows)
constexpr int kActs = 8;     // activations per call (tile_acts)

// NC activations against one packed group of nr rows: per sub-block j, vpdpbusd of B row k's unsigned levels with
// the activation's bytes 4k..4k+3 in every lane, times the scale vector (vpmullo) into isum; the mins (or the
// offset) through vpdpwssd of their int16 pairs with the bsums; then the type's float step.
template <class K, int NC>
void k32_group(const std::uint8_t* grp, int nr, const BlockQ8_K* const* ac, std::int64_t nb, float* y,
               std::int64_t ldy) {
  constexpr std::size_t kBytes = sb_bytes<K>();
  constexpr std::size_t kPrefetch = 4 * kBytes;
  __m512 sum[NC];
  TANDEM_UNROLL
  for (int c = 0; c < NC; ++c) sum[c] = _mm512_setzero_ps();
  for (std::int64_t i = 0; i < nb; ++i) {
    const std::uint8_t* p = grp + static_cast<std::size_t>(i) * kBytes;
    for (std::size_t l = 0; l < kBytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch + l), _MM_HINT_T1);
    __m512i isum[NC], msum[NC];
    TANDEM_UNROLL
    for (int c = 0; c < NC; ++c) isum[c] = msum[c] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      __m512i wv[8];
      K::levels(p + K::kHead + K::kUnit * j, wv);
      const __m512i sc = K::scale(p, j);
      const __m512i mm = K::pair(p, j, sc);
      TANDEM_UNROLL
      for (int c = 0; c < NC; ++c) {
        const std::int8_t* q = ac[c][i].qs + 32 * j;
        __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
        TANDEM_UNROLL
        for (int k = 0; k < 8; ++k) {
          std::int32_t a4;
          std::memcpy(&a4, q + 4 * k, 4);
          if (k < 4) lo = _mm512_dpbusd_epi32(lo, wv[k], _mm512_set1_epi32(a4));
          else hi = _mm512_dpbusd_epi32(hi, wv[k], _mm512_set1_epi32(a4));
        }
        k32_part(_mm512_add_epi32(lo, hi), sc, mm, ac[c][i].bsums, j, isum[c], msum[c]);
      }
    }
    TANDEM_UNROLL
    for (int c = 0; c < NC; ++c) sum[c] = _mm512_add_ps(sum[c], K::step(p, ac[c][i].d, isum[c], msum[c]));
  }
  TANDEM_UNROLL
  for (int c = 0; c < NC; ++c) _mm512_mask_storeu_ps(y + c * ldy, first16(nr), sum[c]);
}

template <class K, int NC>
void k16_group(const std::uint8_t* grp, int nr, const BlockQ8_K* const* ac, std::int64_t nb, float* y,
               std::int64_t ldy) {
  constexpr std::size_t kBytes = sb_bytes<K>();
  constexpr std::size_t kPrefetch = 4 * kBytes;
  __m512 sum[NC];
  TANDEM_UNROLL
  for (int c = 0; c < NC; ++c) sum[c] = _mm512_setzero_ps();
  for (std::int64_t i = 0; i < nb; ++i) {
    const std::uint8_t* p = grp + static_cast<std::size_t>(i) * kBytes;
    for (std::size_t l = 0; l < kBytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch + l), _MM_HINT_T1);
    __m512i isum[NC], corr[NC];
    TANDEM_UNROLL
    for (int c = 0; c < NC; ++c) isum[c] = corr[c] = _mm512_setzero_si512();
    for (int u = 0; u < 8; ++u) {
      __m512i wv[8];
      K::levels(p + K::kHead + K::kUnit * u, wv);
      const __m512i sa = K::scale(p, 2 * u);
      const __m512i sb = K::scale(p, 2 * u + 1);
      TANDEM_UNROLL
      for (int c = 0; c < NC; ++c) {
        const std::int8_t* q = ac[c][i].qs + 32 * u;
        __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
        TANDEM_UNROLL
        for (int k = 0; k < 8; ++k) {
          std::int32_t a4;
          std::memcpy(&a4, q + 4 * k, 4);
          if (k < 4) lo = _mm512_dpbusd_epi32(lo, wv[k], _mm512_set1_epi32(a4));
          else hi = _mm512_dpbusd_epi32(hi, wv[k], _mm512_set1_epi32(a4));
        }
        isum[c] = _mm512_add_epi32(isum[c], _mm512_add_epi32(_mm512_mullo_epi32(lo, sa), _mm512_mullo_epi32(hi, sb)));
      }
    }
    for (int u = 0; u < 8; ++u) {  // the offset's (q2_K: the mins') term in a pass of its own: fewer live registers above
      const __m512i pair = K::pair(p, u, K::scale(p, 2 * u), K::scale(p, 2 * u + 1));
      TANDEM_UNROLL
      for (int c = 0; c < NC; ++c) {
        std::int32_t b2;
        std::memcpy(&b2, ac[c][i].bsums + 2 * u, 4);
        corr[c] = _mm512_dpwssd_epi32(corr[c], pair, _mm512_set1_epi32(b2));
      }
    }
    TANDEM_UNROLL
    for (int c = 0; c < NC; ++c) sum[c] = _mm512_add_ps(sum[c], K::step(p, ac[c][i].d, isum[c], corr[c]));
  }
  TANDEM_UNROLL
  for (int c = 0; c < NC; ++c) _mm512_mask_storeu_ps(y + c * ldy, first16(nr), sum[c]);
}

// The 32 codes of a 4-bit block (element j < 16: the low nibble of qs[j]; j >= 16: the high nibble of qs[j - 16]),
// and of a 5-bit one (q5_0, q5_1: bit j of qh is element j's fifth bit).
inline __m256i nibbles32(const std::uint8_t* qs) {
  const __m128i q = load128(qs);
  const __m128i lo = _mm_and_si128(q, _mm_set1_epi8(0x0F));
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0F));
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}
// An activation block's bytes 4k..4k+3 in every lane of av[k] (q8_0 or q8_1: the same bytes).
template <class Act>
inline void act_lanes(const Act& ab, __m512i (&av)[8]) {
  TANDEM_UNROLL
  for (int k = 0; k < 8; ++k) {
    std::int32_t a4;
    std::memcpy(&a4, ab.qs + 4 * k, 4);
    av[k] = _mm512_set1_epi32(a4);
  }
}

template <class Block>
inline __m256i fifth_codes(const Block& b) {
  std::uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  return _mm256_or_si256(nibbles32(b.qs), _mm256_maskz_mov_epi8(static_cast<__mmask32>(qh), _mm256_set1_epi8(0x10)));
}

// ---- q4_1, q5_1: blocks of 32 with a min, q8_1 activations ----------------------------------------------------
//
// Per 16-row group and block: d [0, 32) and m [32, 64) (f16), then the levels (0..15 / 0..31) in B order as a nibble
// plane (256 bytes), for q5_1 followed by the fifth bits as a bit plane (64 bytes): 320 / 384 bytes, the rows' 16 x
// 20 / 16 x 24. Per block and activation: sumi = Σ q·a exactly (8 vpdpbusd, the levels unsigned already), then the
// reference's float step, sumf += float(sumi) * (d_w * d_a) + m_w * s_a.
struct Q41Kind : NibblePlane {
  using Block = BlockQ4_1;
  static constexpr WType kType = WType::q4_1;
  static constexpr std::size_t kCode = 256;
  static __m256i codes(const Block& b) { return nibbles32(b.qs); }
};
struct Q51Kind : FifthPlane {
  using Block = BlockQ5_1;
  static constexpr WType kType = WType::q5_1;
  static constexpr std::size_t kCode = 256 + 64;
  static __m256i codes(const Block& b) { return fifth_codes(b); }
};

template <class K>
constexpr std::size_t b32_bytes() { return 64 + K::kCode; }  // per group and block

template <class K>
std::size_t b32_group_bytes(std::int64_t cols) { return static_cast<std::size_t>(cols / QK4_1) * b32_bytes<K>(); }

template <class K>
void prepare_b32(const std::uint8_t* w, std::size_t wrb, std::int64_t rows, std::int64_t cols, std::uint8_t* aux) {
  using Block = typename K::Block;
  const std::int64_t nb = cols / QK4_1;
  std::uint8_t* out = aux;
  for (std::int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const int nr = static_cast<int>(std::min<std::int64_t>(kRows, rows - r0));
    for (std::int64_t i = 0; i < nb; ++i) {
      alignas(64) std::uint8_t head[64] = {};
      alignas(64) std::uint32_t bq[8][kRows] = {};  // [B row][weight row]: four codes
      for (int r = 0; r < nr; ++r) {
        const auto* row = reinterpret_cast<const Block*>(w + static_cast<std::size_t>(r0 + r) * wrb);
        if (i + 8 < nb) _mm_prefetch(reinterpret_cast<const char*>(row + i + 8), _MM_HINT_T0);
        const Block& b = row[i];
        std::memcpy(head + 2 * r, &b.d, 2);
        std::memcpy(head + 32 + 2 * r, &b.m, 2);
        alignas(32) std::uint32_t v[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(v), K::codes(b));
        for (int k = 0; k < 8; ++k) bq[k][r] = v[k];
      }
      std::memcpy(out, head, 64);
      K::encode(reinterpret_cast<const std::uint8_t*>(bq), out + 64);
      out += b32_bytes<K>();
    }
  }
}

// A packed block of a 32-element type (b32_group, b32_decode): the next blocks' prefetch `ahead` bytes on, its levels
// as 8 B rows, its d and m scales (16 rows' lanes).
template <class K>
struct B32Block {
  __m512i wv[8];
  __m512 dw, mw;
  B32Block(const std::uint8_t* p, std::size_t ahead) {
    constexpr std::size_t kBytes = b32_bytes<K>();
    TANDEM_UNROLL
    for (std::size_t l = 0; l < kBytes; l += 64)
      _mm_prefetch(reinterpret_cast<const char*>(p + ahead + l), _MM_HINT_T1);
    K::levels(p + 64, wv);
    dw = f16x16(p);
    mw = f16x16(p + 32);
  }
  // One activation's term: its bytes 4k..4k+3 in every lane of av[k]; d_a and s_a in every lane.
  __m512 term(const __m512i (&av)[8], __m512 da, __m512 sa) const {
    __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
    TANDEM_UNROLL
    for (int k = 0; k < 8; ++k) {
      if (k < 4) lo = _mm512_dpbusd_epi32(lo, wv[k], av[k]);
      else hi = _mm512_dpbusd_epi32(hi, wv[k], av[k]);
    }
    const __m512 scale = _mm512_mul_ps(dw, da);  // d_w * d_a
    return _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), scale),
                         _mm512_mul_ps(mw, sa));  // + m_w * s_a
  }
};

template <class K, int NC>
void b32_group(const std::uint8_t* grp, int nr, const BlockQ8_1* const* ac, std::int64_t nb, float* y,
               std::int64_t ldy) {
  constexpr std::size_t kBytes = b32_bytes<K>();
  __m512 sum[NC];
  TANDEM_UNROLL
  for (int c = 0; c < NC; ++c) sum[c] = _mm512_setzero_ps();
  for (std::int64_t ib = 0; ib < nb; ++ib) {
    const B32Block<K> b(grp + static_cast<std::size_t>(ib) * kBytes, 8 * kBytes);
    TANDEM_UNROLL
    for (int c = 0; c < NC; ++c) {
      const BlockQ8_1& ab = ac[c][ib];
      __m512i av[8];
      act_lanes(ab, av);
      sum[c] = _mm512_add_ps(sum[c], b.term(av, _mm512_set1_ps(h2f(ab.d)), _mm512_set1_ps(h2f(ab.s))));
    }
  }
  TANDEM_UNROLL
  for (int c = 0; c < NC; ++c) _mm512_mask_storeu_ps(y + c * ldy, first16(nr), sum[c]);
}

// Decode (one activation) over up to kGroups groups side by side, block by block: one memory stream per group (group
// after group is one stream, which measured below the bandwidth: packed_decode in kernels_amx.cc). Each row's
// operations are b32_group<K, 1>'s, in its order, so the results are the same bit for bit.
template <class K>
void b32_decode(const std::uint8_t* aux, std::size_t group_bytes, int nr, const BlockQ8_1* a, std::int64_t nb,
                float* y) {
  constexpr std::size_t kBytes = b32_bytes<K>();
  const int ng = (nr + kRows - 1) / kRows;
  __m512 sum[kGroups];
  TANDEM_UNROLL
  for (int g = 0; g < kGroups; ++g) sum[g] = _mm512_setzero_ps();
  for (std::int64_t ib = 0; ib < nb; ++ib) {
    __m512i av[8];
    act_lanes(a[ib], av);
    const __m512 da = _mm512_set1_ps(h2f(a[ib].d)), sa = _mm512_set1_ps(h2f(a[ib].s));
    for (int g = 0; g < ng; ++g) {
      const B32Block<K> b(aux + static_cast<std::size_t>(g) * group_bytes + static_cast<std::size_t>(ib) * kBytes,
                          8 * kBytes);
      sum[g] = _mm512_add_ps(sum[g], b.term(av, da, sa));
    }
  }
  for (int g = 0; g < ng; ++g) _mm512_mask_storeu_ps(y + g * kRows, first16(nr - g * kRows), sum[g]);
}

// ---- q4_0, q5_0, iq4_nl, q8_0: blocks of 32 with signed levels, q8_0 activations ------------------------------
//
// Per 16-row group: first the rows' f16 scales of every block (32 bytes a block, block after block, the region
// padded to whole cache lines), then per block the codes in B order as unsigned bytes u = level + kOffset — q4_0 and
// q5_0 their indices (level + 8, level + 16: a nibble plane, for q5_0 and a bit plane of fifth bits), iq4_nl its
// indices (the table's value + 128 read through a shuffle), q8_0 its levels ^ 0x80 (512 bytes). Every code region
// starts on a cache line; a group takes the rows' own bytes and at most 32 more (an odd block count's padding).
// Per block and activation: 8 vpdpbusd give Σ u·a = Σ level·a + kOffset · Σ a; the second term, the same for every
// row, is made once per call from the activation block's bytes and taken off, leaving the reference's exact sumi;
// then its float step, sumf += float(sumi) * (d_w * d_a).
struct Q40Kind : NibblePlane {
  using Block = BlockQ4_0;
  static constexpr WType kType = WType::q4_0;
  static constexpr std::size_t kCode = 256;
  static constexpr int kOffset = 8;
  static __m256i codes(const Block& b) { return nibbles32(b.qs); }
};
struct Q50Kind : FifthPlane {
  using Block = BlockQ5_0;
  static constexpr WType kType = WType::q5_0;
  static constexpr std::size_t kCode = 256 + 64;
  static constexpr int kOffset = 16;
  static __m256i codes(const Block& b) { return fifth_codes(b); }
};
struct IQ4NLKind : NibblePlane {
  using Block = BlockIQ4_NL;
  static constexpr WType kType = WType::iq4_nl;
  static constexpr std::size_t kCode = 256;
  static constexpr int kOffset = 128;
  static __m256i codes(const Block& b) { return nibbles32(b.qs); }
  static void levels(const std::uint8_t* p, __m512i (&w)[8]) {
    decode_nibbles(p, w);
    const __m512i table =
        _mm512_xor_si512(_mm512_broadcast_i32x4(load128(kIq4NlValues)), _mm512_set1_epi8(static_cast<char>(0x80)));
    TANDEM_UNROLL
    for (int k = 0; k < 8; ++k) w[k] = _mm512_shuffle_epi8(table, w[k]);
  }
};
struct Q80Kind {
  using Block = BlockQ8_0;
  static constexpr WType kType = WType::q8_0;
  static constexpr std::size_t kCode = 512;
  static constexpr int kOffset = 128;
  static __m256i codes(const Block& b) { return _mm256_xor_si256(load256(b.qs), _mm256_set1_epi8(static_cast<char>(0x80))); }
  static void encode(const std::uint8_t* codes, std::uint8_t* out) { std::memcpy(out, codes, 512); }
  static void levels(const std::uint8_t* p, __m512i (&w)[8]) {
    TANDEM_UNROLL
    for (int k = 0; k < 8; ++k) w[k] = load512(p + 64 * k);
  }
};

// A group's scale region (nb blocks of 16 f16 scales, padded to whole cache lines), and a group's bytes.
constexpr int kO32DecodeGroups = 8;  // groups a decode call reads side by side (decode_rows: 128)
inline std::size_t o32_head_bytes(std::int64_t nb) { return (static_cast<std::size_t>(nb) * 32 + 63) / 64 * 64; }
template <class K>
std::size_t o32_group_bytes(std::int64_t cols) {
  const std::int64_t nb = cols / QK8_0;
  return o32_head_bytes(nb) + static_cast<std::size_t>(nb) * K::kCode;
}

template <class K>
void prepare_o32(const std::uint8_t* w, std::size_t wrb, std::int64_t rows, std::int64_t cols, std::uint8_t* aux) {
  using Block = typename K::Block;
  const std::int64_t nb = cols / QK8_0;
  const std::size_t head = o32_head_bytes(nb), group_bytes = o32_group_bytes<K>(cols);
  for (std::int64_t r0 = 0; r0 < rows; r0 += kRows) {
    std::uint8_t* grp = aux + static_cast<std::size_t>(r0 / kRows) * group_bytes;
    const int nr = static_cast<int>(std::min<std::int64_t>(kRows, rows - r0));
    std::memset(grp + static_cast<std::size_t>(nb) * 32, 0, head - static_cast<std::size_t>(nb) * 32);
    for (std::int64_t i = 0; i < nb; ++i) {
      alignas(64) std::uint16_t d[kRows] = {};
      alignas(64) std::uint32_t bq[8][kRows] = {};  // [B row][weight row]: four codes (rows past the matrix: 0)
      for (int r = 0; r < nr; ++r) {
        const auto* row = reinterpret_cast<const Block*>(w + static_cast<std::size_t>(r0 + r) * wrb);
        if (i + 8 < nb) _mm_prefetch(reinterpret_cast<const char*>(row + i + 8), _MM_HINT_T0);
        const Block& b = row[i];
        d[r] = b.d;
        alignas(32) std::uint32_t v[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(v), K::codes(b));
        for (int k = 0; k < 8; ++k) bq[k][r] = v[k];
      }
      std::memcpy(grp + 32 * static_cast<std::size_t>(i), d, 32);
      K::encode(reinterpret_cast<const std::uint8_t*>(bq), grp + head + static_cast<std::size_t>(i) * K::kCode);
    }
  }
}

// kOffset · Σ a of an activation block (Σ a = Σ (a + 128) - 32 · 128, the first from sums of absolute differences).
template <class K>
inline std::int32_t o32_offset(const BlockQ8_0& ab) {
  const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(load256(ab.qs), _mm256_set1_epi8(static_cast<char>(0x80))),
                                      _mm256_setzero_si256());
  const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
  const auto sum = static_cast<std::int32_t>(_mm_cvtsi128_si64(_mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2))));
  return K::kOffset * (sum - 32 * 128);
}

// A packed block of an offset type (o32_group, o32_decode): its codes as 8 B rows, its scales, and the prefetch of
// the block `ahead` blocks on.
template <class K>
struct O32Block {
  __m512i wv[8];
  __m512 dw;
  O32Block(const std::uint8_t* grp, std::size_t head, std::int64_t ib, std::int64_t ahead) {
    const std::uint8_t* codes = grp + head + static_cast<std::size_t>(ib) * K::kCode;
    TANDEM_UNROLL
    for (std::size_t l = 0; l < K::kCode; l += 64)
      _mm_prefetch(reinterpret_cast<const char*>(codes + static_cast<std::size_t>(ahead) * K::kCode + l), _MM_HINT_T1);
    if ((ib & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(grp + 32 * static_cast<std::size_t>(ib + ahead)), _MM_HINT_T1);
    K::levels(codes, wv);
    dw = f16x16(grp + 32 * static_cast<std::size_t>(ib));
  }
  // One activation's term: its bytes 4k..4k+3 in every lane of av[k], d_a in every lane, −kOffset · Σ a in every
  // lane. The integer sum starts at the offset term and takes the 8 products in one chain (exact integers: the
  // same sum as Σ level · a in any order).
  __m512 term(const __m512i (&av)[8], __m512 da, __m512i neg_off) const {
    __m512i sumi = neg_off;
    TANDEM_UNROLL
    for (int k = 0; k < 8; ++k) sumi = _mm512_dpbusd_epi32(sumi, wv[k], av[k]);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(sumi), _mm512_mul_ps(dw, da));  // float(sumi) * (d_w * d_a)
  }
  // The same term with the activation's bytes taken from its block by the dot-product instructions themselves (a
  // 4-byte broadcast operand, {1to16}) instead of 8 broadcasts first.
  __m512 term(const BlockQ8_0& ab, __m512 da, __m512i neg_off) const {
    __m512i sumi = neg_off;
    TANDEM_UNROLL
    for (int k = 0; k < 8; ++k)
      asm("vpdpbusd %[a]%{1to16%}, %[w], %[s]"
          : [s] "+v"(sumi)
          : [w] "v"(wv[k]), [a] "m"(*reinterpret_cast<const std::int32_t*>(ab.qs + 4 * k)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(sumi), _mm512_mul_ps(dw, da));
  }
};

// An activation block's two per-call numbers (o32_tile, made once per piece of blocks for all of a call's groups):
// −kOffset · Σ a and d_a as a float.
struct O32Act {
  std::int32_t neg_off;
  float d;
};

// NC activations (their numbers sc[c][ib - b0]) against blocks [b0, b1) of one packed group: the running sums in acc
// (NC × 16 floats, kept between pieces of a call: the order of the additions is the same).
template <class K, int NC>
void o32_group(const std::uint8_t* grp, std::int64_t nb, const BlockQ8_0* const* ac, const O32Act* const* sc,
               std::int64_t b0, std::int64_t b1, float* acc) {
  const std::size_t head = o32_head_bytes(nb);
  __m512 sum[NC];
  TANDEM_UNROLL
  for (int c = 0; c < NC; ++c) sum[c] = _mm512_load_ps(acc + 16 * c);
  for (std::int64_t ib = b0; ib < b1; ++ib) {
    const O32Block<K> b(grp, head, ib, 8);
    TANDEM_UNROLL
    for (int c = 0; c < NC; ++c) {
      const O32Act& x = sc[c][ib - b0];
      sum[c] = _mm512_add_ps(sum[c], b.term(ac[c][ib], _mm512_set1_ps(x.d), _mm512_set1_epi32(x.neg_off)));
    }
  }
  TANDEM_UNROLL
  for (int c = 0; c < NC; ++c) _mm512_store_ps(acc + 16 * c, sum[c]);
}

// Decode (one activation) over up to kO32DecodeGroups groups side by side, block by block (as b32_decode); each row's
// operations are o32_group<K, 1>'s, in its order, so the results are the same bit for bit.
template <class K>
void o32_decode(const std::uint8_t* aux, std::size_t group_bytes, int nr, const BlockQ8_0* a, std::int64_t nb,
                float* y) {
  const std::size_t head = o32_head_bytes(nb);
  const int ng = (nr + kRows - 1) / kRows;
  __m512 sum[kO32DecodeGroups];
  TANDEM_UNROLL
  for (int g = 0; g < kO32DecodeGroups; ++g) sum[g] = _mm512_setzero_ps();
  for (std::int64_t ib = 0; ib < nb; ++ib) {
    __m512i av[8];
    act_lanes(a[ib], av);
    const __m512 da = _mm512_set1_ps(h2f(a[ib].d));
    const __m512i neg_off = _mm512_set1_epi32(-o32_offset<K>(a[ib]));
    for (int g = 0; g < ng; ++g) {
      const O32Block<K> b(aux + static_cast<std::size_t>(g) * group_bytes, head, ib, 8);
      sum[g] = _mm512_add_ps(sum[g], b.term(av, da, neg_off));
    }
  }
  for (int g = 0; g < ng; ++g) _mm512_mask_storeu_ps(y + g * kRows, first16(nr - g * kRows), sum[g]);
}

// ---- the tiles -------------------------------------------------------------------------------------------------

template <class Act>
using GroupFn = void (*)(const std::uint8_t*, int, const Act* const*, std::int64_t, float*, std::int64_t);
// A decode over all of a call's groups at once (aux, group bytes, rows, the activation, its blocks, y).
template <class Act>
using DecodeFn = void (*)(const std::uint8_t*, std::size_t, int, const Act*, std::int64_t, float*);

// The entries the packed tiles fall back on without the side table, by type (set once, with the tables).
TypeKernels g_base[kWTypeCount];

// The AVX2 tile, for calls without the side table, within its own shapes.
void base_tiles(const TypeKernels& base, const std::uint8_t* w, std::size_t wrb, int nr, const std::uint8_t* a,
                std::size_t arb, int nc, std::int64_t cols, float* y, std::int64_t ldy) {
  const int rs = nc == 1 ? base.decode_rows : base.tile_rows;
  for (int c = 0; c < nc; c += base.tile_acts)
    for (int r = 0; r < nr; r += rs)
      base.tile(w + static_cast<std::size_t>(r) * wrb, wrb, std::min(rs, nr - r), a + static_cast<std::size_t>(c) * arb,
                arb, std::min(base.tile_acts, nc - c), cols, y + c * ldy + r, ldy);
}

// One packed type: its activation block (elements per block), its group bytes, its group kernels for 1..kActs
// activations, its decode over all groups at once where it has one; g_base[T] where the copy is absent.
template <WType T, class Act, std::int64_t kElems, std::size_t (*GroupBytes)(std::int64_t), template <int> class G,
          DecodeFn<Act> Decode>
struct Packed {
  static void tile(const std::uint8_t* w, std::size_t wrb, int nr, const std::uint8_t* a, std::size_t arb, int nc,
                   std::int64_t cols, float* y, std::int64_t ldy, const std::uint8_t* aux) {
    if (aux == nullptr) {
      base_tiles(g_base[static_cast<int>(T)], w, wrb, nr, a, arb, nc, cols, y, ldy);
      return;
    }
    static constexpr GroupFn<Act> kGroup[kActs] = {G<1>::run, G<2>::run, G<3>::run, G<4>::run,
                                                   G<5>::run, G<6>::run, G<7>::run, G<8>::run};
    const std::int64_t nb = cols / kElems;
    const std::size_t group_bytes = GroupBytes(cols);
    if constexpr (Decode != nullptr) {
      if (nc == 1) return Decode(aux, group_bytes, nr, reinterpret_cast<const Act*>(a), nb, y);
    }
    const Act* ac[kActs];
    for (int c = 0; c < nc; ++c) ac[c] = reinterpret_cast<const Act*>(a + static_cast<std::size_t>(c) * arb);
    for (int g = 0; g * kRows < nr; ++g)
      kGroup[nc - 1](aux + static_cast<std::size_t>(g) * group_bytes, std::min(kRows, nr - g * kRows), ac, nb,
                     y + g * kRows, ldy);
  }
};

// The packed entry of kind K whose group kernel is Call::run<K, NC> (the three kernels below), on activation blocks
// Act of kElems elements.
template <class K, class Call, class Act, std::int64_t kElems, std::size_t (*GroupBytes)(std::int64_t)>
struct Via {
  template <int NC>
  struct Group {
    static void run(const std::uint8_t* g, int nr, const Act* const* ac, std::int64_t nb, float* y, std::int64_t ldy) {
      Call::template run<K, NC>(g, nr, ac, nb, y, ldy);
    }
  };
  using P = Packed<K::kType, Act, kElems, GroupBytes, Group, Call::template decode<K>>;
};
struct K32Call {
  template <class K, int NC, class... A>
  static void run(A... a) { k32_group<K, NC>(a...); }
  template <class K>
  static constexpr DecodeFn<BlockQ8_K> decode = nullptr;
};
struct K16Call {
  template <class K, int NC, class... A>
  static void run(A... a) { k16_group<K, NC>(a...); }
  template <class K>
  static constexpr DecodeFn<BlockQ8_K> decode = nullptr;
};
struct B32Call {
  template <class K, int NC, class... A>
  static void run(A... a) { b32_group<K, NC>(a...); }
  template <class K>
  static constexpr DecodeFn<BlockQ8_1> decode = b32_decode<K>;
};
template <class K>
using K32 = Via<K, K32Call, BlockQ8_K, QK_K, sb_group_bytes<K>>;
template <class K>
using K16 = Via<K, K16Call, BlockQ8_K, QK_K, sb_group_bytes<K>>;
template <class K>
using B32 = Via<K, B32Call, BlockQ8_1, QK4_1, b32_group_bytes<K>>;

template <class P>
void set_packed(WType t, TypeKernels& k, PrepareAuxFn prepare, std::size_t (*group_bytes)(std::int64_t)) {
  g_base[static_cast<int>(t)] = k;
  k.tile = nullptr;
  k.tile_aux = P::tile;
  k.prepare_aux = prepare;
  k.aux_group_bytes = group_bytes;
  k.decode_rows = kGroups * kRows;
  k.tile_rows = kGroups * kRows;
  k.tile_acts = kActs;
}


// The offset types' entry (any number of rows: tile_any_rows): the rows' tiles (g_base) without the side table; one
// activation: o32_decode; more: per piece of blocks the activations' numbers made once, then o32_group per group.
template <class K>
void o32_tile(const std::uint8_t* w, std::size_t wrb, int nr, const std::uint8_t* a, std::size_t arb, int nc,
              std::int64_t cols, float* y, std::int64_t ldy, const std::uint8_t* aux) {
  if (aux == nullptr) {
    base_tiles(g_base[static_cast<int>(K::kType)], w, wrb, nr, a, arb, nc, cols, y, ldy);
    return;
  }
  using GroupFnO = void (*)(const std::uint8_t*, std::int64_t, const BlockQ8_0* const*, const O32Act* const*,
                            std::int64_t, std::int64_t, float*);
  static constexpr GroupFnO kGroup[kActs] = {o32_group<K, 1>, o32_group<K, 2>, o32_group<K, 3>, o32_group<K, 4>,
                                             o32_group<K, 5>, o32_group<K, 6>, o32_group<K, 7>, o32_group<K, 8>};
  constexpr std::int64_t kPiece = 512;  // blocks whose numbers are held at a time (32 KiB for 8 activations)
  const std::int64_t nb = cols / QK8_0;
  const std::size_t group_bytes = o32_group_bytes<K>(cols);
  if (nc == 1) return o32_decode<K>(aux, group_bytes, nr, reinterpret_cast<const BlockQ8_0*>(a), nb, y);
  const int ng = (nr + kRows - 1) / kRows;
  alignas(64) O32Act numbers[kActs][kPiece];
  alignas(64) float acc[kGroups][kActs * kRows];
  const BlockQ8_0* ac[kActs];
  const O32Act* sc[kActs];
  for (int c = 0; c < nc; ++c) {
    ac[c] = reinterpret_cast<const BlockQ8_0*>(a + static_cast<std::size_t>(c) * arb);
    sc[c] = numbers[c];
  }
  // The groups kGroups at a time (a call may take any number of rows: tile_any_rows), their running sums zeroed (the
  // first nc · 16 of each); the activations' numbers made per piece of blocks — once per call when the row holds one
  // piece (up to 16,384 columns), else again for each kGroups groups.
  for (int g0 = 0; g0 < ng; g0 += kGroups) {
    const int gn = std::min(kGroups, ng - g0);
    for (int g = 0; g < gn; ++g) std::fill_n(acc[g], nc * kRows, 0.0F);
    for (std::int64_t b0 = 0; b0 < nb; b0 += kPiece) {
      const std::int64_t b1 = std::min(nb, b0 + kPiece);
      if (g0 == 0 || nb > kPiece)
        for (int c = 0; c < nc; ++c)
          for (std::int64_t ib = b0; ib < b1; ++ib) numbers[c][ib - b0] = {-o32_offset<K>(ac[c][ib]), h2f(ac[c][ib].d)};
      for (int g = 0; g < gn; ++g)
        kGroup[nc - 1](aux + static_cast<std::size_t>(g0 + g) * group_bytes, nb, ac, sc, b0, b1, acc[g]);
    }
    for (int g = 0; g < gn; ++g)
      for (int c = 0; c < nc; ++c)
        _mm512_mask_storeu_ps(y + c * ldy + (g0 + g) * kRows, first16(nr - (g0 + g) * kRows),
                              _mm512_load_ps(acc[g] + c * kRows));
  }
}

template <class K>
void set_offset(TypeKernels& k) {
  g_base[static_cast<int>(K::kType)] = k;
  k.tile = nullptr;
  k.tile_aux = o32_tile<K>;
  k.tile_any_rows = true;
  k.prepare_aux = prepare_o32<K>;
  k.aux_group_bytes = o32_group_bytes<K>;
  k.decode_rows = kO32DecodeGroups * kRows;
  k.tile_rows = kGroups * kRows;
  k.tile_acts = kActs;
}

}  // namespace

TypeKernels avx512_superblock_kernels(WType t) {
  TypeKernels k = avx2_superblock_kernels(t);
  if (t == WType::q4_K) set_packed<K32<Q4KKind>::P>(t, k, prepare_sb<Q4KKind>, sb_group_bytes<Q4KKind>);
  if (t == WType::q5_K) set_packed<K32<Q5KKind>::P>(t, k, prepare_sb<Q5KKind>, sb_group_bytes<Q5KKind>);
  if (t == WType::iq4_xs) set_packed<K32<IQ4XSKind>::P>(t, k, prepare_sb<IQ4XSKind>, sb_group_bytes<IQ4XSKind>);
  if (t == WType::q6_K) set_packed<K16<Q6KKind>::P>(t, k, prepare_sb<Q6KKind>, sb_group_bytes<Q6KKind>);
  if (t == WType::q3_K) set_packed<K16<Q3KKind>::P>(t, k, prepare_sb<Q3KKind>, sb_group_bytes<Q3KKind>);
  if (t == WType::q2_K) set_packed<K16<Q2KKind>::P>(t, k, prepare_sb<Q2KKind>, sb_group_bytes<Q2KKind>);
  return k;
}

TypeKernels avx512_minned_kernels(WType t, TypeKernels k) {
  if (t == WType::q4_1) set_packed<B32<Q41Kind>::P>(t, k, prepare_b32<Q41Kind>, b32_group_bytes<Q41Kind>);
  if (t == WType::q5_1) set_packed<B32<Q51Kind>::P>(t, k, prepare_b32<Q51Kind>, b32_group_bytes<Q51Kind>);
  return k;
}

TypeKernels avx512_offset_kernels(WType t, TypeKernels k) {
  if (t == WType::q4_0) set_offset<Q40Kind>(k);
  if (t == WType::q5_0) set_offset<Q50Kind>(k);
  if (t == WType::iq4_nl) set_offset<IQ4NLKind>(k);
  if (t == WType::q8_0) set_offset<Q80Kind>(k);
  return k;
}

}  // namespace tandem::kernels::detail
