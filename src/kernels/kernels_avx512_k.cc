// AVX-512 VNNI kernels of the 256-element super-block types on matrices repacked at load (q4_K, q5_K, q6_K,
// iq4_xs): built with the avx512 flags like kernels_avx512.cc (its header comment and the ODR note in
// kernels_avx2.cc), called only after the CPU check. Without the side table (a range that does not start on a 16-row
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

#include "kernels/kernels_avx2_k.h"
#include "kernels/kernels_avx512_common.h"

namespace tandem::kernels::detail {
namespace {

constexpr int kRows = 16;    // weight rows of a group (vector lanes)
constexpr int kGroups = 4;   // groups per call (decode_rows, tile_rows)
constexpr int kActs = 8;     // activations per call (tile_acts)

// ---- bit planes of the packed layouts --------------------------------------------------------------------

// The 2-bit plane: encoding (bits `sh`.. of the codes) and decoding (into bits 0..1 or, shifted, 4..5 of w).
inline void encode_two_bits(const std::uint8_t* codes, int sh, std::uint8_t* out) {
  for (int v = 0; v < 2; ++v) {
    __m512i top = _mm512_setzero_si512();
    for (int k = 0; k < 4; ++k) {
      const __m512i two = _mm512_and_si512(_mm512_srli_epi16(load512(codes + 64 * (4 * v + k)), sh),
                                           _mm512_set1_epi8(0x03));
      top = _mm512_or_si512(top, _mm512_sllv_epi16(two, _mm512_set1_epi16(static_cast<short>(2 * k))));
    }
    _mm512_storeu_si512(out + 64 * v, top);
  }
}
inline void encode_bit(const std::uint8_t* codes, int sh, std::uint8_t* out) {
  for (int k = 0; k < 8; ++k) {
    const std::uint64_t m = _mm512_test_epi8_mask(load512(codes + 64 * k), _mm512_set1_epi8(static_cast<char>(1 << sh)));
    std::memcpy(out + 8 * k, &m, 8);
  }
}
// Bits 0..1 of B rows 0..7 (into w, which it sets).
inline void two_bits_low(const std::uint8_t* p, __m512i (&w)[8]) {
  const __m512i m = _mm512_set1_epi8(0x03);
  TANDEM_UNROLL
  for (int v = 0; v < 2; ++v) {
    const __m512i x = load512(p + 64 * v);
    w[4 * v + 0] = _mm512_and_si512(x, m);
    w[4 * v + 1] = _mm512_and_si512(_mm512_srli_epi16(x, 2), m);
    w[4 * v + 2] = _mm512_and_si512(_mm512_srli_epi16(x, 4), m);
    w[4 * v + 3] = _mm512_and_si512(_mm512_srli_epi16(x, 6), m);
  }
}
// Bits 4..5 of B rows 0..7, or-ed into w.
inline void two_bits_high(const std::uint8_t* p, __m512i (&w)[8]) {
  const __m512i m = _mm512_set1_epi8(0x30);
  TANDEM_UNROLL
  for (int v = 0; v < 2; ++v) {
    const __m512i x = load512(p + 64 * v);
    w[4 * v + 0] = _mm512_or_si512(w[4 * v + 0], _mm512_and_si512(_mm512_slli_epi16(x, 4), m));
    w[4 * v + 1] = _mm512_or_si512(w[4 * v + 1], _mm512_and_si512(_mm512_slli_epi16(x, 2), m));
    w[4 * v + 2] = _mm512_or_si512(w[4 * v + 2], _mm512_and_si512(x, m));
    w[4 * v + 3] = _mm512_or_si512(w[4 * v + 3], _mm512_and_si512(_mm512_srli_epi16(x, 2), m));
  }
}

// Two sub-blocks' int32 vectors as the int16 pairs (a, b) of vpdpwssd.
inline __m512i int16_pairs(__m512i a, __m512i b) {
  return _mm512_or_si512(_mm512_and_si512(a, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(b, 16));
}
inline __m512 f16x16(const std::uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// ---- q4_K, q5_K, iq4_xs: 8 sub-blocks of 32 ------------------------------------------------------------------
//
// Per 16-row group and super-block: a head (scales), then per sub-block j its 32 levels in B order, nibble-packed
// (256 bytes), for q5_K followed by 8 masks of 64 bits (bit i of mask k: the fifth bit of B row k's byte i).
//   q4_K, q5_K head (320 bytes): d [0, 32), dmin [32, 64) (f16), the 6-bit scales [64, 192) and mins [192, 320),
//     16 bytes per sub-block (row r at byte r). 2,368 / 2,880 bytes per group and super-block (the rows': 2,304 /
//     2,816).
//   iq4_xs head (160 bytes): d [0, 32), the signed scales ls - 32 [32, 160) as q4_K's. 2,208 bytes (the rows':
//     2,176). Its levels are table values (signed): the kernel takes them as u = value + 128 and the bsums take the
//     128 back off.

// 6-bit scale and min of sub-block j (0..7) of a q4_K / q5_K block (ggml's get_scale_min_k4).
inline void k4_scale_min(int j, const std::uint8_t* q, std::uint8_t* sc, std::uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<std::uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<std::uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

template <class Block>
inline __m256i k4_low(const Block& b, int j) {  // sub-block j's low 4 bits: nibble j % 2 of qs[32 (j / 2) ..]
  const __m256i bits = load256(b.qs + 32 * (j / 2));
  return _mm256_and_si256(j % 2 ? _mm256_srli_epi16(bits, 4) : bits, _mm256_set1_epi8(0x0F));
}

struct Q4KKind {
  using Block = BlockQ4_K;
  static constexpr WType kType = WType::q4_K;
  static constexpr std::size_t kHead = 320, kUnit = 256;
  static void head(const Block& b, int r, std::uint8_t* h) {
    std::memcpy(h + 2 * r, &b.d, 2);
    std::memcpy(h + 32 + 2 * r, &b.dmin, 2);
    for (int j = 0; j < 8; ++j) k4_scale_min(j, b.scales, &h[64 + 16 * j + r], &h[192 + 16 * j + r]);
  }
  static __m256i codes(const Block& b, int j) { return k4_low(b, j); }
  static void encode(const std::uint8_t* codes, std::uint8_t* out) { encode_nibbles(codes, out); }
  static void levels(const std::uint8_t* p, __m512i (&w)[8]) { decode_nibbles(p, w); }
  static __m512i scale(const std::uint8_t* p, int j) { return _mm512_cvtepu8_epi32(load128(p + 64 + 16 * j)); }
  static __m512i pair(const std::uint8_t* p, int j, __m512i) {  // (m_j, m_j) as int16
    const __m512i m = _mm512_cvtepu8_epi32(load128(p + 192 + 16 * j));
    return _mm512_or_si512(m, _mm512_slli_epi32(m, 16));
  }
  // sumf += d * float(isum) - dmin * float(msum), d = d_w * d_a, dmin = dmin_w * d_a.
  static __m512 step(const std::uint8_t* p, float da, __m512i isum, __m512i msum) {
    const __m512 ad = _mm512_set1_ps(da);
    const __m512 d = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), ad);
    const __m512 dmin = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32))), ad);
    return _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(isum)), _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(msum)));
  }
};

struct Q5KKind : Q4KKind {
  using Block = BlockQ5_K;
  static constexpr WType kType = WType::q5_K;
  static constexpr std::size_t kUnit = 256 + 64;
  static void head(const Block& b, int r, std::uint8_t* h) {
    std::memcpy(h + 2 * r, &b.d, 2);
    std::memcpy(h + 32 + 2 * r, &b.dmin, 2);
    for (int j = 0; j < 8; ++j) k4_scale_min(j, b.scales, &h[64 + 16 * j + r], &h[192 + 16 * j + r]);
  }
  // The fifth bit of element l of sub-block j is bit j of qh[l].
  static __m256i codes(const Block& b, int j) {
    const __m256i fifth = _mm256_and_si256(_mm256_srli_epi16(load256(b.qh), j), _mm256_set1_epi8(1));
    return _mm256_or_si256(k4_low(b, j), _mm256_slli_epi16(fifth, 4));
  }
  static void encode(const std::uint8_t* codes, std::uint8_t* out) {
    encode_nibbles(codes, out);
    encode_bit(codes, 4, out + 256);
  }
  static void levels(const std::uint8_t* p, __m512i (&w)[8]) {
    decode_nibbles(p, w);
    bit_plane(p + 256, 0x10, w);
  }
};

struct IQ4XSKind {
  using Block = BlockIQ4_XS;
  static constexpr WType kType = WType::iq4_xs;
  static constexpr std::size_t kHead = 160, kUnit = 256;
  static void head(const Block& b, int r, std::uint8_t* h) {
    std::memcpy(h + 2 * r, &b.d, 2);
    for (int j = 0; j < 8; ++j) {
      const int lo = (b.scales_l[j / 2] >> 4 * (j % 2)) & 0xF;
      const int hi = (b.scales_h >> 2 * j) & 3;
      h[32 + 16 * j + r] = static_cast<std::uint8_t>((lo | (hi << 4)) - 32);
    }
  }
  static __m256i codes(const Block& b, int j) {  // sub-block j: q4_0's nibble order over qs[16 j ..]
    const __m128i q = load128(b.qs + 16 * j);
    const __m128i lo = _mm_and_si128(q, _mm_set1_epi8(0x0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0F));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
  }
  static void encode(const std::uint8_t* codes, std::uint8_t* out) { encode_nibbles(codes, out); }
  static void levels(const std::uint8_t* p, __m512i (&w)[8]) {  // u = value + 128
    decode_nibbles(p, w);
    const __m512i table = _mm512_xor_si512(_mm512_broadcast_i32x4(load128(kIq4NlValues)),
                                           _mm512_set1_epi8(static_cast<char>(0x80)));
    TANDEM_UNROLL
    for (int k = 0; k < 8; ++k) w[k] = _mm512_shuffle_epi8(table, w[k]);
  }
  static __m512i scale(const std::uint8_t* p, int j) { return _mm512_cvtepi8_epi32(load128(p + 32 + 16 * j)); }
  static __m512i pair(const std::uint8_t*, int, __m512i sc) {  // (s_j, s_j) as int16
    const __m512i lo = _mm512_and_si512(sc, _mm512_set1_epi32(0xFFFF));
    return _mm512_or_si512(lo, _mm512_slli_epi32(sc, 16));
  }
  // isum = Σ_j s_j Σ u·a - 128 Σ_j s_j (bsums[2j] + bsums[2j+1]); sumf += (d_w * d_a) * float(isum).
  static __m512 step(const std::uint8_t* p, float da, __m512i isum, __m512i msum) {
    const __m512 d = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
                                   _mm512_set1_ps(da));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(isum, _mm512_slli_epi32(msum, 7))));
  }
};

// The super-block kinds' layout (q4_K .. iq4_xs, and q6_K .. q2_K below): per group and super-block the head, then 8
// units of 32 elements (K::kUnit bytes each, encoded by K::encode from the codes in B order).
template <class K>
constexpr std::size_t sb_bytes() { return K::kHead + 8 * K::kUnit; }

template <class K>
std::size_t sb_group_bytes(std::int64_t cols) { return static_cast<std::size_t>(cols / QK_K) * sb_bytes<K>(); }

template <class K>
void prepare_sb(const std::uint8_t* w, std::size_t wrb, std::int64_t rows, std::int64_t cols, std::uint8_t* aux) {
  using Block = typename K::Block;
  const std::int64_t nb = cols / QK_K;
  std::uint8_t* out = aux;
  for (std::int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const int nr = static_cast<int>(std::min<std::int64_t>(kRows, rows - r0));
    for (std::int64_t i = 0; i < nb; ++i) {
      alignas(64) std::uint8_t head[K::kHead] = {};
      alignas(64) std::uint32_t bq[8][8][kRows] = {};  // [unit][B row][weight row]: four codes
      for (int r = 0; r < nr; ++r) {
        const auto* row = reinterpret_cast<const Block*>(w + static_cast<std::size_t>(r0 + r) * wrb);
        if (i + 2 < nb) _mm_prefetch(reinterpret_cast<const char*>(row + i + 2), _MM_HINT_T0);
        const Block& b = row[i];
        K::head(b, r, head);
        for (int u = 0; u < 8; ++u) {
          alignas(32) std::uint32_t v[8];
          _mm256_store_si256(reinterpret_cast<__m256i*>(v), K::codes(b, u));
          for (int k = 0; k < 8; ++k) bq[u][k][r] = v[k];
        }
      }
      std::memcpy(out, head, K::kHead);
      for (int u = 0; u < 8; ++u) K::encode(reinterpret_cast<const std::uint8_t*>(bq[u]), out + K::kHead + K::kUnit * u);
      out += sb_bytes<K>();
    }
  }
}

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
        isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(_mm512_add_epi32(lo, hi), sc));
        std::int32_t b2;
        std::memcpy(&b2, ac[c][i].bsums + 2 * j, 4);
        msum[c] = _mm512_dpwssd_epi32(msum[c], mm, _mm512_set1_epi32(b2));
      }
    }
    TANDEM_UNROLL
    for (int c = 0; c < NC; ++c) sum[c] = _mm512_add_ps(sum[c], K::step(p, ac[c][i].d, isum[c], msum[c]));
  }
  TANDEM_UNROLL
  for (int c = 0; c < NC; ++c) _mm512_mask_storeu_ps(y + c * ldy, first16(nr), sum[c]);
}

// ---- q6_K, q3_K, q2_K: 16 sub-blocks of 16 -------------------------------------------------------------------
//
// Per 16-row group and super-block: a head (d, and dmin for q2_K; the sub-block scales, 16 bytes per sub-block, row
// r at byte r), then per unit u of 32 elements (sub-blocks 2u and 2u + 1) its levels in B order, as planes:
//   a nibble plane (256 bytes: vector k holds B row k in its low nibbles, B row k + 4 in its high ones),
//   a 2-bit plane (128 bytes: bits 2k..2k+1 of byte i of vector v are those of B row 4v + k's byte i),
//   a bit plane (64 bytes: bit i of mask k is that of B row k's byte i).
//   q6_K (levels 0..63, offset 32): nibbles, then the top 2 bits as a 2-bit plane; head d [0, 32), scales int8
//     [32, 288). 3,360 bytes per group and super-block, the rows' 16 x 210.
//   q3_K (levels 0..7, offset 4): the low 2 bits, then the third as a bit plane; head d, the signed 6-bit scales
//     (-32..31). 1,824 bytes (the rows': 1,760).
//   q2_K (levels 0..3): the 2-bit plane; head d [0, 32), dmin [32, 64), the scales' bytes (scale in the low nibble,
//     min in the high) [64, 320). 1,344 bytes, the rows' 16 x 84.
// Per super-block and activation: isum = Σ_j sc_j Σ_k q_k a_k by vpmullo; the offset's share (offset Σ_j sc_j
// bsums_j) or q2_K's msum = Σ_j m_j bsums_j by vpdpwssd of int16 pairs with the bsums; then the type's float step.

// The 2-bit field of element k (unit u = k / 32) in q2_K / q3_K's qs: qs[32 (u / 4) + k % 32] >> 2 (u % 4).
template <class Block>
inline __m256i two_bit_codes(const Block& b, int u) {
  return _mm256_and_si256(_mm256_srli_epi16(load256(b.qs + 32 * (u / 4)), 2 * (u % 4)), _mm256_set1_epi8(0x03));
}

struct Q6KKind {
  using Block = BlockQ6_K;
  static constexpr WType kType = WType::q6_K;
  static constexpr std::size_t kHead = 288, kUnit = 384;
  static constexpr int kOffsetShift = 5;  // offset 32
  static void head(const Block& b, int r, std::uint8_t* h) {
    std::memcpy(h + 2 * r, &b.d, 2);
    for (int j = 0; j < 16; ++j) h[32 + 16 * j + r] = static_cast<std::uint8_t>(b.scales[j]);
  }
  // Unit u: half u / 4 (ql[64 half ..], qh[32 half ..]), quarter u % 4 (ql or ql + 32, its low or high nibble;
  // bits 2 quarter of qh).
  static __m256i codes(const Block& b, int u) {
    const int half = u / 4, quarter = u % 4;
    const __m256i ql = load256(b.ql + 64 * half + 32 * (quarter & 1));
    const __m256i low = _mm256_and_si256(quarter < 2 ? ql : _mm256_srli_epi16(ql, 4), _mm256_set1_epi8(0x0F));
    const __m256i high =
        _mm256_and_si256(_mm256_srli_epi16(load256(b.qh + 32 * half), 2 * quarter), _mm256_set1_epi8(0x03));
    return _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
  }
  static void encode(const std::uint8_t* codes, std::uint8_t* out) {
    encode_nibbles(codes, out);
    encode_two_bits(codes, 4, out + 256);
  }
  static void levels(const std::uint8_t* p, __m512i (&w)[8]) {
    decode_nibbles(p, w);
    two_bits_high(p + 256, w);
  }
  static __m512i scale(const std::uint8_t* p, int j) { return _mm512_cvtepi8_epi32(load128(p + 32 + 16 * j)); }
  static __m512i pair(const std::uint8_t*, int, __m512i sa, __m512i sb) { return int16_pairs(sa, sb); }
  // isum - 32 Σ_j sc_j bsums_j; sumf += (d_w * d_a) * float(isum).
  static __m512 step(const std::uint8_t* p, float da, __m512i isum, __m512i corr) {
    const __m512 d = _mm512_mul_ps(f16x16(p), _mm512_set1_ps(da));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(isum, _mm512_slli_epi32(corr, kOffsetShift))));
  }
};

struct Q3KKind {
  using Block = BlockQ3_K;
  static constexpr WType kType = WType::q3_K;
  static constexpr std::size_t kHead = 288, kUnit = 128 + 64;
  static void head(const Block& b, int r, std::uint8_t* h) {
    std::memcpy(h + 2 * r, &b.d, 2);
    for (int j = 0; j < 16; ++j) {
      const int low = j < 8 ? b.scales[j] & 0xF : b.scales[j - 8] >> 4;
      const int high = (b.scales[8 + j % 4] >> (2 * (j / 4))) & 3;
      h[32 + 16 * j + r] = static_cast<std::uint8_t>((low | (high << 4)) - 32);
    }
  }
  // Code = two bits + 4 * (bit u of hmask[k % 32]): the level + 4.
  static __m256i codes(const Block& b, int u) {
    const __m256i third = _mm256_and_si256(_mm256_srli_epi16(load256(b.hmask), u), _mm256_set1_epi8(1));
    return _mm256_or_si256(two_bit_codes(b, u), _mm256_slli_epi16(third, 2));
  }
  static void encode(const std::uint8_t* codes, std::uint8_t* out) {
    encode_two_bits(codes, 0, out);
    encode_bit(codes, 2, out + 128);
  }
  static void levels(const std::uint8_t* p, __m512i (&w)[8]) {
    two_bits_low(p, w);
    bit_plane(p + 128, 0x04, w);
  }
  static __m512i scale(const std::uint8_t* p, int j) { return _mm512_cvtepi8_epi32(load128(p + 32 + 16 * j)); }
  static __m512i pair(const std::uint8_t*, int, __m512i sa, __m512i sb) { return int16_pairs(sa, sb); }
  // isum - 4 Σ_j sc_j bsums_j; sumf += (d_w * d_a) * float(isum).
  static __m512 step(const std::uint8_t* p, float da, __m512i isum, __m512i corr) {
    const __m512 d = _mm512_mul_ps(f16x16(p), _mm512_set1_ps(da));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(isum, _mm512_slli_epi32(corr, 2))));
  }
};

struct Q2KKind {
  using Block = BlockQ2_K;
  static constexpr WType kType = WType::q2_K;
  static constexpr std::size_t kHead = 320, kUnit = 128;
  static void head(const Block& b, int r, std::uint8_t* h) {
    std::memcpy(h + 2 * r, &b.d, 2);
    std::memcpy(h + 32 + 2 * r, &b.dmin, 2);
    for (int j = 0; j < 16; ++j) h[64 + 16 * j + r] = b.scales[j];
  }
  static __m256i codes(const Block& b, int u) { return two_bit_codes(b, u); }
  static void encode(const std::uint8_t* codes, std::uint8_t* out) { encode_two_bits(codes, 0, out); }
  static void levels(const std::uint8_t* p, __m512i (&w)[8]) { two_bits_low(p, w); }
  static __m512i scale(const std::uint8_t* p, int j) {
    return _mm512_and_si512(_mm512_cvtepu8_epi32(load128(p + 64 + 16 * j)), _mm512_set1_epi32(0x0F));
  }
  static __m512i pair(const std::uint8_t* p, int u, __m512i, __m512i) {  // the mins (m_2u, m_2u+1)
    const __m512i ma = _mm512_srli_epi32(_mm512_cvtepu8_epi32(load128(p + 64 + 16 * (2 * u))), 4);
    const __m512i mb = _mm512_srli_epi32(_mm512_cvtepu8_epi32(load128(p + 64 + 16 * (2 * u + 1))), 4);
    return int16_pairs(ma, mb);
  }
  // sumf += d * float(isum) - dmin * float(msum), d = d_w * d_a, dmin = dmin_w * d_a.
  static __m512 step(const std::uint8_t* p, float da, __m512i isum, __m512i msum) {
    const __m512 ad = _mm512_set1_ps(da);
    const __m512 d = _mm512_mul_ps(f16x16(p), ad);
    const __m512 dmin = _mm512_mul_ps(f16x16(p + 32), ad);
    return _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(isum)), _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(msum)));
  }
};

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
      const __m512i pair = K::pair(p, u, sa, sb);
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

// ---- q4_1, q5_1: blocks of 32 with a min, q8_1 activations ----------------------------------------------------
//
// Per 16-row group and block: d [0, 32) and m [32, 64) (f16), then the levels (0..15 / 0..31) in B order as a nibble
// plane (256 bytes), for q5_1 followed by the fifth bits as a bit plane (64 bytes): 320 / 384 bytes, the rows' 16 x
// 20 / 16 x 24. Per block and activation: sumi = Σ q·a exactly (8 vpdpbusd, the levels unsigned already), then the
// reference's float step, sumf += float(sumi) * (d_w * d_a) + m_w * s_a.
struct Q41Kind {
  using Block = BlockQ4_1;
  static constexpr WType kType = WType::q4_1;
  static constexpr std::size_t kCode = 256;
  static __m256i codes(const Block& b) {
    const __m128i q = load128(b.qs);
    const __m128i lo = _mm_and_si128(q, _mm_set1_epi8(0x0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0F));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
  }
  static void encode(const std::uint8_t* codes, std::uint8_t* out) { encode_nibbles(codes, out); }
  static void levels(const std::uint8_t* p, __m512i (&w)[8]) { decode_nibbles(p, w); }
};
struct Q51Kind {
  using Block = BlockQ5_1;
  static constexpr WType kType = WType::q5_1;
  static constexpr std::size_t kCode = 256 + 64;
  static __m256i codes(const Block& b) {
    const __m128i q = load128(b.qs);
    const __m128i lo = _mm_and_si128(q, _mm_set1_epi8(0x0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0F));
    std::uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    const __m256i fifth = _mm256_maskz_mov_epi8(static_cast<__mmask32>(qh), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1), fifth);
  }
  static void encode(const std::uint8_t* codes, std::uint8_t* out) {
    encode_nibbles(codes, out);
    encode_bit(codes, 4, out + 256);
  }
  static void levels(const std::uint8_t* p, __m512i (&w)[8]) {
    decode_nibbles(p, w);
    bit_plane(p + 256, 0x10, w);
  }
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

template <class K, int NC>
void b32_group(const std::uint8_t* grp, int nr, const BlockQ8_1* const* ac, std::int64_t nb, float* y,
               std::int64_t ldy) {
  constexpr std::size_t kBytes = b32_bytes<K>();
  constexpr std::size_t kPrefetch = 8 * kBytes;
  __m512 sum[NC];
  TANDEM_UNROLL
  for (int c = 0; c < NC; ++c) sum[c] = _mm512_setzero_ps();
  for (std::int64_t ib = 0; ib < nb; ++ib) {
    const std::uint8_t* p = grp + static_cast<std::size_t>(ib) * kBytes;
    TANDEM_UNROLL
    for (std::size_t l = 0; l < kBytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch + l), _MM_HINT_T1);
    __m512i wv[8];
    K::levels(p + 64, wv);
    const __m512 dw = f16x16(p);
    const __m512 mw = f16x16(p + 32);
    TANDEM_UNROLL
    for (int c = 0; c < NC; ++c) {
      const BlockQ8_1& ab = ac[c][ib];
      __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
      TANDEM_UNROLL
      for (int k = 0; k < 8; ++k) {
        std::int32_t a4;
        std::memcpy(&a4, ab.qs + 4 * k, 4);
        if (k < 4) lo = _mm512_dpbusd_epi32(lo, wv[k], _mm512_set1_epi32(a4));
        else hi = _mm512_dpbusd_epi32(hi, wv[k], _mm512_set1_epi32(a4));
      }
      const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(h2f(ab.d)));  // d_w * d_a
      const __m512 t = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), scale),
                                     _mm512_mul_ps(mw, _mm512_set1_ps(h2f(ab.s))));  // + m_w * s_a
      sum[c] = _mm512_add_ps(sum[c], t);
    }
  }
  TANDEM_UNROLL
  for (int c = 0; c < NC; ++c) _mm512_mask_storeu_ps(y + c * ldy, first16(nr), sum[c]);
}

// ---- the tiles -------------------------------------------------------------------------------------------------

template <class Act>
using GroupFn = void (*)(const std::uint8_t*, int, const Act* const*, std::int64_t, float*, std::int64_t);

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
// activations; g_base[T] where the copy is absent.
template <WType T, class Act, std::int64_t kElems, std::size_t (*GroupBytes)(std::int64_t), template <int> class G>
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
  using P = Packed<K::kType, Act, kElems, GroupBytes, Group>;
};
struct K32Call {
  template <class K, int NC, class... A>
  static void run(A... a) { k32_group<K, NC>(a...); }
};
struct K16Call {
  template <class K, int NC, class... A>
  static void run(A... a) { k16_group<K, NC>(a...); }
};
struct B32Call {
  template <class K, int NC, class... A>
  static void run(A... a) { b32_group<K, NC>(a...); }
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

}  // namespace tandem::kernels::detail
