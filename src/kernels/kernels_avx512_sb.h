// The packed layouts of the 256-element super-block types (q4_K, q5_K, iq4_xs: 8 sub-blocks of 32; q6_K, q3_K,
// q2_K: 16 of 16), per type a "kind": its head of scales, its levels' planes in AMX's B order, the decoding of both.
// Shared by kernels_avx512_k.cc (the vector kernels, which also write the layout: prepare_sb) and kernels_amx.cc (the
// tiles over the same layout). Like kernels_avx512_common.h, everything is in an anonymous namespace and may be
// included only by files built with the AVX-512 flags.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/kernels_avx512_common.h"
#include "kernels/types.h"

namespace tandem::kernels::detail {
namespace {

constexpr int kPackRows = 16;  // weight rows of a packed group

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

// The code planes of the packed layouts (their encode / levels): 4-bit codes as a nibble plane (256 bytes per 32-element
// unit), 5-bit codes as the nibble plane and a bit plane of fifth bits (64 bytes more).
struct NibblePlane {
  static void encode(const std::uint8_t* codes, std::uint8_t* out) { encode_nibbles(codes, out); }
  static void levels(const std::uint8_t* p, __m512i (&w)[8]) { decode_nibbles(p, w); }
};
struct FifthPlane {
  static void encode(const std::uint8_t* codes, std::uint8_t* out) {
    encode_nibbles(codes, out);
    encode_bit(codes, 4, out + 256);
  }
  static void levels(const std::uint8_t* p, __m512i (&w)[8]) {
    decode_nibbles(p, w);
    bit_plane(p + 256, 0x10, w);
  }
};

struct Q4KKind : NibblePlane {
  using Block = BlockQ4_K;
  static constexpr WType kType = WType::q4_K;
  static constexpr std::size_t kHead = 320, kUnit = 256;
  static void head(const Block& b, int r, std::uint8_t* h) {
    std::memcpy(h + 2 * r, &b.d, 2);
    std::memcpy(h + 32 + 2 * r, &b.dmin, 2);
    for (int j = 0; j < 8; ++j) k4_scale_min(j, b.scales, &h[64 + 16 * j + r], &h[192 + 16 * j + r]);
  }
  static __m256i codes(const Block& b, int j) { return k4_low(b, j); }
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

struct Q5KKind : Q4KKind, FifthPlane {
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
  using FifthPlane::encode;
  using FifthPlane::levels;
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
  for (std::int64_t r0 = 0; r0 < rows; r0 += kPackRows) {
    const int nr = static_cast<int>(std::min<std::int64_t>(kPackRows, rows - r0));
    for (std::int64_t i = 0; i < nb; ++i) {
      alignas(64) std::uint8_t head[K::kHead] = {};
      alignas(64) std::uint32_t bq[8][8][kPackRows] = {};  // [unit][B row][weight row]: four codes
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

// A super-block's integers for one activation, one part at a time (the vector kernels and the AMX tiles share them;
// lanes are rows). 8 sub-blocks of 32 (q4_K, q5_K, iq4_xs): sub-block j's exact Σ q·a times its scale into isum,
// and the mins' (or iq4_xs's offset's) term into msum: the pair (m_j, m_j) against the activation's bsums 2j, 2j + 1.
inline void k32_part(__m512i sumi, __m512i sc, __m512i pair, const std::int16_t* bsums, int j, __m512i& isum,
                     __m512i& msum) {
  isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(sumi, sc));
  std::int32_t b2;
  std::memcpy(&b2, bsums + 2 * j, 4);
  msum = _mm512_dpwssd_epi32(msum, pair, _mm512_set1_epi32(b2));
}
// 16 sub-blocks of 16 (q6_K, q3_K, q2_K), unit u: sub-blocks 2u and 2u + 1's sums times their scales into isum, the
// offset's (or q2_K's mins') term into corr: the pair against bsums 2u, 2u + 1.
inline void k16_part(__m512i sum_a, __m512i sum_b, __m512i sa, __m512i sb, __m512i pair, const std::int16_t* bsums,
                     int u, __m512i& isum, __m512i& corr) {
  isum = _mm512_add_epi32(isum, _mm512_add_epi32(_mm512_mullo_epi32(sum_a, sa), _mm512_mullo_epi32(sum_b, sb)));
  std::int32_t b2;
  std::memcpy(&b2, bsums + 2 * u, 4);
  corr = _mm512_dpwssd_epi32(corr, pair, _mm512_set1_epi32(b2));
}

// Prefetch into L2 of the eighth `part` (0..7) of `bytes` bytes at `ahead`: the AMX super-block tiles spread the
// next super-blocks' prefetches over their 8 units, a few lines each (there, all of a super-block's lines at once
// stalled the loop on the prefetch instruction: perf). The vector kernels keep theirs at once: spread, decode fell
// from 0.82 to 0.65 of the streaming bound and 8 activations from 0.49 to 0.41 (bench_kernels --quick).
inline void prefetch_eighth(const std::uint8_t* ahead, std::size_t bytes, int part) {
  const std::size_t lo = static_cast<std::size_t>(part) * bytes / 8 / 64 * 64;
  const std::size_t hi = static_cast<std::size_t>(part + 1) * bytes / 8;
  for (std::size_t l = lo; l < hi; l += 64) _mm_prefetch(reinterpret_cast<const char*>(ahead + l), _MM_HINT_T1);
}

}  // namespace
}  // namespace tandem::kernels::detail
