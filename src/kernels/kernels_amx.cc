// AMX-INT8 tiles for the 32-element block types (q8_0, q4_0, q5_0, iq4_nl with q8_0 activations; q4_1, q5_1 with
// q8_1 activations, at MinnedForm below, over the packed layout kernels_avx512_k.cc makes) and the AMX table (the
// super-block types' tiles are in kernels_amx_sb.cc): with kernels_amx_sb.cc the only files built with -mamx-tile
// -mamx-int8; kernels.cc calls into it only after checking the CPU and getting the kernel's
// permission to use the tile data (arch_prctl ARCH_REQ_XCOMP_PERM).
//
// One tile call covers up to 16 weight rows and any number of activation rows. The weight rows' levels are
// rearranged once per call into AMX's B layout (per block: 8 rows of 64 bytes, row g holding elements 4g..4g+3 of
// each of the 16 weight rows), their scales into one vector per block; then for each group of up to 16 activation
// rows and each block: one TDPBSSD (A: the activations' 32 bytes of that block, read in place with the activation
// row stride; B: the block's levels) gives the exact integer dot product of every (activation, weight row) pair,
// and the block's float step is done for 16 weight rows at once, in the reference's order and roundings:
// sum += float(sumi) * (d_w * d_a) (vec_dot_ref in quant_blocks32.cc; no fused multiply-add). The result of every
// element is therefore the reference's, bit for bit, whatever the tile shape, the thread split or the batch.
//
// The matrix's side table (kernels.h, aux_bytes) is the whole matrix again, repacked at load into the order these
// tiles read (the packed layout below): decode streams it front to back instead of sixteen rows at once, and prefill
// gets its B tiles with a few vector operations per block instead of a transposition. Tiles without it (a range that
// does not start on a 16-row group, a matrix bound for an accelerator) read the rows as they are, with the same
// results.
#include <immintrin.h>

#include "kernels/kernels_amx.h"
#include "kernels/kernels_amx_common.h"
#include "kernels/kernels_avx512_common.h"

namespace tandem::kernels::detail {
namespace {

// tmm0 = C (acts x 16 int32), tmm1 = A (acts x 32 bytes), tmm2 = B (8 x 64 bytes), and the same again in tmm3-5;
// loaded at the start of every call and again when the last activation group of the call is short.
inline void configure(int acts) {
  TileConfig c;
  for (int t : {0, 3}) {  // two sets, so that one block's tiles run while the previous block's sums are read
    c.rows[t] = static_cast<std::uint8_t>(acts);
    c.colsb[t] = 64;
    c.rows[t + 1] = static_cast<std::uint8_t>(acts);
    c.colsb[t + 1] = 32;
    c.rows[t + 2] = 8;
    c.colsb[t + 2] = 64;
  }
  _tile_loadconfig(&c);
}

// The packed layout's types (below).
struct PackQ8_0;
struct PackQ4_0;
struct PackQ5_0;
struct PackIQ4_NL;

// A block's 32 signed levels in element order, per type, and its packed layout.
struct Q8_0Src {
  using Block = BlockQ8_0;
  using Levels = Q8_0Levels512;
  using Pack = PackQ8_0;
  static __m256i levels(const Block& b) { return load256(b.qs); }
};
// 4-bit: element j < 16 is the low nibble of qs[j], j >= 16 the high nibble of qs[j - 16].
inline __m256i nibbles32(const std::uint8_t* qs) {
  const __m128i q = load128(qs);
  const __m128i lo = _mm_and_si128(q, _mm_set1_epi8(0x0F));
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0F));
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}
struct Q4_0Src {
  using Block = BlockQ4_0;
  using Levels = Q4_0Levels512;
  using Pack = PackQ4_0;
  static __m256i levels(const Block& b) { return _mm256_sub_epi8(nibbles32(b.qs), _mm256_set1_epi8(8)); }
};
struct Q5_0Src {
  using Block = BlockQ5_0;
  using Levels = Q5_0Levels512;
  using Pack = PackQ5_0;
  static __m256i levels(const Block& b) {
    std::uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    const __m256i fifth = _mm256_maskz_mov_epi8(static_cast<__mmask32>(qh), _mm256_set1_epi8(0x10));
    return _mm256_sub_epi8(_mm256_or_si256(nibbles32(b.qs), fifth), _mm256_set1_epi8(16));
  }
};
struct IQ4NLSrc {
  using Block = BlockIQ4_NL;
  using Levels = IQ4NLLevels512;
  using Pack = PackIQ4_NL;
  static __m256i levels(const Block& b) { return _mm256_shuffle_epi8(iq4_table(), nibbles32(b.qs)); }
};

// ---- the same results for a few activations, without tiles ------------------------------------------------------

// Sixteen rows' block-pair partial sums (lanes 0-7: block ib, 8-15: block ib + 1, eight int32 each) reduced to the
// rows' exact block sums, lanes = rows: p0 for block ib, p1 for block ib + 1 (integer additions: any order is
// exact). Three rounds of interleave-and-add halve the vectors, a last 128-bit shuffle puts the rows in order.
inline void reduce_rows(__m512i (&v)[16], __m512i& p0, __m512i& p1) {
  __m512i t[8], u[4];
  for (int i = 0; i < 8; ++i)
    t[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)
    u[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * i], t[2 * i + 1]), _mm512_unpackhi_epi64(t[2 * i], t[2 * i + 1]));
  // u[i]: 128-bit lane k holds rows 4i..4i+3, sums of elements 4k'..4k'+3 (k = 0, 1: block ib; 2, 3: block ib + 1).
  const __m512i g = _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], 0x88), _mm512_shuffle_i32x4(u[0], u[1], 0xDD));
  const __m512i h = _mm512_add_epi32(_mm512_shuffle_i32x4(u[2], u[3], 0x88), _mm512_shuffle_i32x4(u[2], u[3], 0xDD));
  // g: [rows 0-3 ib, rows 0-3 ib+1, rows 4-7 ib, rows 4-7 ib+1]; h the same for rows 8-15.
  p0 = _mm512_shuffle_i32x4(g, h, 0x88);
  p1 = _mm512_shuffle_i32x4(g, h, 0xDD);
}

// The f16 scales of block ib of nr rows as 16 floats (0 past nr). Plain loads: AVX-512 gathers are slow on CPUs
// with the Gather Data Sampling mitigation (measured here: decode at less than half the speed with one gather).
inline __m512 row_scales(const std::uint8_t* first_d, std::size_t wrb, int nr) {
  alignas(32) std::uint16_t d[16] = {};
  for (int r = 0; r < nr; ++r) std::memcpy(&d[r], first_d + static_cast<std::size_t>(r) * wrb, 2);
  return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(d)));
}

// ---- the packed layout (the side table) ------------------------------------------------------------------------
//
// Per 16-row group, block after block: the 16 rows' f16 scales (32 bytes), the 16 rows' sums of the block's levels
// (int16, 32 bytes), then the levels in AMX's B order — B row g (g = 0..7) holds elements 4g..4g+3 of each weight
// row, row r at bytes 4r..4r+3 — as codes:
//   q8_0: 8 rows of 64 bytes, the levels themselves;
//   q4_0, iq4_nl: 4 vectors of 64 bytes, vector k holding B row k's 4-bit indices in its low nibbles and B row
//     k + 4's in its high nibbles (q4_0's level is the index - 8; iq4_nl's goes through the table);
//   q5_0: those 256 bytes of low 4 bits, then 8 masks of 64 bits: bit i of mask g is the fifth bit of B row g's
//     byte i (the level is the index - 16).
// A group's block takes 16 times the block's bytes plus 32 (576, 320, 320 and 384 bytes: the side table is the
// matrix plus 6 % for q8_0, 11 % for q4_0 and iq4_nl, 9 % for q5_0). Rows past the matrix's end in its last group
// have scale 0, code 0 and sum 0.
struct PackQ8_0 {
  using Block = BlockQ8_0;
  static constexpr std::size_t kCodeBytes = 512;
  static __m256i codes(const Block& b) { return load256(b.qs); }
  static __m256i levels(__m256i codes) { return codes; }
  static void encode(const std::uint8_t* bq, std::uint8_t* out) { std::memcpy(out, bq, 512); }
  static void signed_rows(const std::uint8_t* p, __m512i (&s)[8]) {
    TANDEM_UNROLL
    for (int g = 0; g < 8; ++g) s[g] = load512(p + 64 * g);
  }
};

struct PackQ4_0 {
  using Block = BlockQ4_0;
  static constexpr std::size_t kCodeBytes = 256;
  static __m256i codes(const Block& b) { return nibbles32(b.qs); }
  static __m256i levels(__m256i codes) { return _mm256_sub_epi8(codes, _mm256_set1_epi8(8)); }
  static void encode(const std::uint8_t* bq, std::uint8_t* out) { encode_nibbles(bq, out); }
  static void signed_rows(const std::uint8_t* p, __m512i (&s)[8]) {
    decode_nibbles(p, s);
    TANDEM_UNROLL
    for (int g = 0; g < 8; ++g) s[g] = _mm512_sub_epi8(s[g], _mm512_set1_epi8(8));
  }
};

struct PackIQ4_NL {
  using Block = BlockIQ4_NL;
  static constexpr std::size_t kCodeBytes = 256;
  static __m256i codes(const Block& b) { return nibbles32(b.qs); }
  static __m256i levels(__m256i codes) { return _mm256_shuffle_epi8(iq4_table(), codes); }
  static void encode(const std::uint8_t* bq, std::uint8_t* out) { encode_nibbles(bq, out); }
  static void signed_rows(const std::uint8_t* p, __m512i (&s)[8]) {
    decode_nibbles(p, s);
    const __m512i table = _mm512_broadcast_i32x4(load128(kIq4NlValues));
    TANDEM_UNROLL
    for (int g = 0; g < 8; ++g) s[g] = _mm512_shuffle_epi8(table, s[g]);
  }
};

struct PackQ5_0 {
  using Block = BlockQ5_0;
  static constexpr std::size_t kCodeBytes = 256 + 64;
  static __m256i codes(const Block& b) {
    std::uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    return _mm256_or_si256(nibbles32(b.qs), _mm256_maskz_mov_epi8(static_cast<__mmask32>(qh), _mm256_set1_epi8(0x10)));
  }
  static __m256i levels(__m256i codes) { return _mm256_sub_epi8(codes, _mm256_set1_epi8(16)); }
  static void encode(const std::uint8_t* bq, std::uint8_t* out) {
    encode_nibbles(bq, out);
    for (int g = 0; g < 8; ++g) {
      const std::uint64_t m = _mm512_test_epi8_mask(load512(bq + 64 * g), _mm512_set1_epi8(0x10));
      std::memcpy(out + 256 + 8 * g, &m, 8);
    }
  }
  static void signed_rows(const std::uint8_t* p, __m512i (&s)[8]) {
    decode_nibbles(p, s);
    TANDEM_UNROLL
    for (int g = 0; g < 8; ++g) {
      std::uint64_t m;
      std::memcpy(&m, p + 256 + 8 * g, 8);
      const __m512i fifth = _mm512_maskz_mov_epi8(static_cast<__mmask64>(m), _mm512_set1_epi8(0x10));
      s[g] = _mm512_sub_epi8(_mm512_or_si512(s[g], fifth), _mm512_set1_epi8(16));
    }
  }
};

constexpr std::size_t kPackedHead = 64;  // scales and level sums

template <class P>
constexpr std::size_t packed_block_bytes() { return kPackedHead + P::kCodeBytes; }

template <class P>
std::size_t packed_group_bytes(std::int64_t cols) {
  return static_cast<std::size_t>(cols / QK8_0) * packed_block_bytes<P>();
}

// The packed layout of a matrix: per group and block, each row's 32 codes in element order and the sum of its
// levels (|sum| <= 32 * 128: int16), the codes moved into B order four bytes at a time (B row g, row r <- elements
// 4g..4g+3), then encoded.
template <class P>
void prepare_packed(const std::uint8_t* w, std::size_t wrb, std::int64_t rows, std::int64_t cols, std::uint8_t* aux) {
  using Block = typename P::Block;
  const std::int64_t nb = cols / QK8_0;
  std::uint8_t* out = aux;
  for (std::int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const int nr = static_cast<int>(std::min<std::int64_t>(kRows, rows - r0));
    for (std::int64_t ib = 0; ib < nb; ++ib) {
      alignas(64) std::uint16_t d[kRows] = {};
      alignas(64) std::int16_t sum[kRows] = {};
      alignas(64) std::uint32_t c[kRows][8] = {};
      for (int r = 0; r < nr; ++r) {
        const Block* row = reinterpret_cast<const Block*>(w + static_cast<std::size_t>(r0 + r) * wrb);
        if (ib + 8 < nb) _mm_prefetch(reinterpret_cast<const char*>(row + ib + 8), _MM_HINT_T0);
        const Block& b = row[ib];
        d[r] = b.d;
        const __m256i code = P::codes(b);
        _mm256_store_si256(reinterpret_cast<__m256i*>(c[r]), code);
        // Σ level = Σ (level + 128) - 32 * 128, the first from sums of absolute differences against 0.
        const __m256i u = _mm256_xor_si256(P::levels(code), _mm256_set1_epi8(static_cast<char>(0x80)));
        const __m256i sad = _mm256_sad_epu8(u, _mm256_setzero_si256());
        const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
        sum[r] = static_cast<std::int16_t>(_mm_cvtsi128_si64(_mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2))) - 32 * 128);
      }
      alignas(64) std::uint32_t bq[8][16];
      for (int g = 0; g < 8; ++g)
        for (int r = 0; r < kRows; ++r) bq[g][r] = c[r][g];
      std::memcpy(out, d, 32);
      std::memcpy(out + 32, sum, 32);
      P::encode(reinterpret_cast<const std::uint8_t*>(bq), out + kPackedHead);
      out += packed_block_bytes<P>();
    }
  }
}

// Decode from the packed layout: NC (1-3) activations against nr rows (up to kGroups 16-row groups, group_bytes
// apart in the table). The activations' bytes are made unsigned once per call (u = a + 128, a ^ 0x80) for all the
// groups; per block and activation, vpdpbusd of its bytes 4g..4g+3 in every lane with B row g's signed levels sums,
// lane r, row r's exact Σ u·l = Σ a·l + 128 · Σl, and the stored level sum takes off the second term. Then the
// reference's float step.
template <class P, int NC>
void packed_decode(const std::uint8_t* aux, std::size_t group_bytes, int nr, const std::uint8_t* a, std::size_t arb,
                   std::int64_t nb, float* y, std::int64_t ldy) {
  constexpr std::int64_t kMaxBlocks = 256;  // activation bytes held per piece (8 KiB per activation)
  constexpr std::size_t kPrefetchBlocks = 32;
  constexpr std::size_t kB = packed_block_bytes<P>();
  const int ng = (nr + kRows - 1) / kRows;
  __m512 sums[kDecodeGroups][NC];
  for (int g = 0; g < ng; ++g)
    for (int c = 0; c < NC; ++c) sums[g][c] = _mm512_setzero_ps();
  alignas(64) std::uint8_t au[NC][kMaxBlocks * 32];
  alignas(64) float da[NC][kMaxBlocks];
  for (std::int64_t p0 = 0; p0 < nb; p0 += kMaxBlocks) {
    const std::int64_t pn = std::min(kMaxBlocks, nb - p0);
    for (int c = 0; c < NC; ++c) {
      const auto* act = reinterpret_cast<const BlockQ8_0*>(a + static_cast<std::size_t>(c) * arb) + p0;
      for (std::int64_t ib = 0; ib < pn; ++ib) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(au[c] + 32 * ib),
                           _mm256_xor_si256(load256(act[ib].qs), _mm256_set1_epi8(static_cast<char>(0x80))));
        da[c][ib] = h2f(act[ib].d);
      }
    }
    // One block of group g: its prefetch, its sums into sum[].
    const auto block = [&](int g, std::int64_t ib, __m512 (&sum)[NC]) {
      const std::uint8_t* p = aux + static_cast<std::size_t>(g) * group_bytes + static_cast<std::size_t>(p0 + ib) * kB;
      TANDEM_UNROLL
      for (std::size_t l = 0; l < kB; l += 64)
        _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBlocks * kB + l), _MM_HINT_T1);
      __m512i lv[8];
      P::signed_rows(p + kPackedHead, lv);
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      const __m512i shift =
          _mm512_slli_epi32(_mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32))), 7);
      TANDEM_UNROLL
      for (int c = 0; c < NC; ++c) {
        const std::uint8_t* ab = au[c] + 32 * ib;
        __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
        TANDEM_UNROLL
        for (int k = 0; k < 8; ++k) {
          std::int32_t q;
          std::memcpy(&q, ab + 4 * k, 4);
          if (k < 4) lo = _mm512_dpbusd_epi32(lo, _mm512_set1_epi32(q), lv[k]);
          else hi = _mm512_dpbusd_epi32(hi, _mm512_set1_epi32(q), lv[k]);
        }
        const __m512i sumi = _mm512_sub_epi32(_mm512_add_epi32(lo, hi), shift);
        const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(da[c][ib]));  // d_w * d_a
        sum[c] = _mm512_add_ps(sum[c], _mm512_mul_ps(_mm512_cvtepi32_ps(sumi), scale));
      }
    };
    if constexpr (NC <= 2) {
      // The groups side by side, block by block: as many memory streams as groups (one stream each after the
      // other measured 4-5 % below a plain read's bandwidth at one thread, 20 % below the f32 tile's at two).
      for (std::int64_t ib = 0; ib < pn; ++ib)
        for (int g = 0; g < ng; ++g) block(g, ib, sums[g]);
    } else {
      for (int g = 0; g < ng; ++g) {
        __m512 sum[NC];
        TANDEM_UNROLL
        for (int c = 0; c < NC; ++c) sum[c] = sums[g][c];
        for (std::int64_t ib = 0; ib < pn; ++ib) block(g, ib, sum);
        TANDEM_UNROLL
        for (int c = 0; c < NC; ++c) sums[g][c] = sum[c];
      }
    }
  }
  for (int g = 0; g < ng; ++g)
    for (int c = 0; c < NC; ++c) _mm512_mask_storeu_ps(y + c * ldy + g * kRows, first16(nr - g * kRows), sums[g][c]);
}

template <class L, bool kPair>
__attribute__((always_inline)) inline void exact_step(const std::uint8_t* w, std::size_t wrb, int nr,
                                                      const BlockQ8_0* a0, std::int64_t ib, std::size_t pf,
                                                      __m512& sum) {
  using Block = typename L::Block;
  const __m512i av = two_q8(a0, kPair ? a0 + 1 : nullptr);
  const __m512i init = _mm512_sub_epi32(
      _mm512_setzero_si512(),
      _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(static_cast<char>(L::kOffset)), av));
  __m512i v[16];
  TANDEM_UNROLL
  for (int r = 0; r < 16; ++r) {
    if (r < nr) {
      const Block* b = reinterpret_cast<const Block*>(w + static_cast<std::size_t>(r) * wrb) + ib;
      prefetch(b, pf);
      v[r] = _mm512_dpbusd_epi32(init, L::row(b, kPair ? b + 1 : nullptr), av);
    } else {
      v[r] = _mm512_setzero_si512();
    }
  }
  __m512i p0, p1;
  reduce_rows(v, p0, p1);
  const auto* d0 = w + static_cast<std::size_t>(ib) * sizeof(Block);  // d is each block's first field
  const __m512 w0 = row_scales(d0, wrb, nr);
  const __m512 s0 = _mm512_mul_ps(w0, _mm512_set1_ps(h2f(a0->d)));
  sum = _mm512_add_ps(sum, _mm512_mul_ps(_mm512_cvtepi32_ps(p0), s0));
  if constexpr (kPair) {
    const __m512 w1 = row_scales(d0 + sizeof(Block), wrb, nr);
    const __m512 s1 = _mm512_mul_ps(w1, _mm512_set1_ps(h2f(a0[1].d)));
    sum = _mm512_add_ps(sum, _mm512_mul_ps(_mm512_cvtepi32_ps(p1), s1));
  }
}

// One activation against nr <= 16 rows, the tiles' results: per block an exact integer per row (vpdpbusd on the
// avx512 tiles' unsigned levels from the -offset·Σa start, reduced per row), then sum += float(sumi) * (d_w * d_a)
// with lanes = rows, block after block.
template <class L>
void exact_rows(const std::uint8_t* w, std::size_t wrb, int nr, const BlockQ8_0* act, std::int64_t nb, float* y) {
  __m512 sum = _mm512_setzero_ps();
  const std::size_t pf = prefetch_offset(16, wrb);
  std::int64_t ib = 0;
  for (; ib + 2 <= nb; ib += 2) exact_step<L, true>(w, wrb, nr, act + ib, ib, pf, sum);
  if (ib < nb) exact_step<L, false>(w, wrb, nr, act + ib, ib, pf, sum);
  _mm512_mask_storeu_ps(y, first16(nr), sum);
}

// Prefill's pieces: blocks of a row handled per pass (rows longer than kPieceBlocks * 32 columns go in pieces, the
// sums running on from piece to piece in the same order).
constexpr std::int64_t kPieceBlocks = 32;
// Blocks prefetched ahead while the B tiles are built from the packed layout.
constexpr std::int64_t kAheadBlocks = 8;

// A 16-bit field (the f16 scale d, or q8_1's s) of a group of up to 16 activations (MG of them, or n when MG is 0),
// block by block: per block the 16 values side by side (plain 16-bit moves), then one conversion. `a`: the first
// activation's field at the piece's first block.
template <class Act, int MG>
void act_field(const std::uint8_t* a, std::size_t arb, int n, std::int64_t pn, float (*out)[16]) {
  for (std::int64_t ib = 0; ib < pn; ++ib) {
    alignas(32) std::uint16_t h[16] = {};
    const std::uint8_t* d = a + static_cast<std::size_t>(ib) * sizeof(Act);
    TANDEM_UNROLL
    for (int m = 0; m < (MG > 0 ? MG : 16); ++m)
      if (MG > 0 || m < n) std::memcpy(&h[m], d + static_cast<std::size_t>(m) * arb, 2);
    _mm512_store_ps(out[ib], _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(h))));
  }
}

// One group of up to 16 activations (MG of them, or n when MG is 0) against a piece's pn blocks of 16 weight rows
// (bbuf: B tiles, dw: scales, mw: mins for the forms with one): per block one tile product (F::dp) gives the exact
// integer of every pair, then the float step for each activation over the 16 rows at once, sum += float(sumi) *
// (d_w * d_a), or with a min sum += float(sumi) * (d_w * d_a) + m_w * s_a. The two tile sets alternate, so the tiles
// compute block ib + 1 while the vector units do block ib's float step. `a`: the group's first activation at the
// piece's first block; `da` (and `sa`) its scales (and sums) (act_field); `sums` its running sums (16 per activation).
template <class F, int MG>
void act_group(const std::uint8_t* a, std::size_t arb, int n, const float (*da)[16], const float (*sa)[16],
               const std::int8_t* bbuf, const float* dw, const float* mw, std::int64_t pn, float* sums) {
  using Act = typename F::Act;
  __m512 s[16];
  TANDEM_UNROLL
  for (int m = 0; m < (MG > 0 ? MG : 16); ++m)
    if (MG > 0 || m < n) s[m] = _mm512_load_ps(sums + m * kRows);
  alignas(64) std::int32_t c[2][16][16];
  const auto* qs = a + offsetof(Act, qs);
  const auto tiles_even = [&](std::int64_t ib) {
    _tile_zero(0);
    _tile_loadd(1, qs + static_cast<std::size_t>(ib) * sizeof(Act), static_cast<long>(arb));
    _tile_loadd(2, bbuf + ib * 512, 64);
    F::template dp<0>();
    _tile_stored(0, c[0], 64);
  };
  const auto tiles_odd = [&](std::int64_t ib) {
    _tile_zero(3);
    _tile_loadd(4, qs + static_cast<std::size_t>(ib) * sizeof(Act), static_cast<long>(arb));
    _tile_loadd(5, bbuf + ib * 512, 64);
    F::template dp<1>();
    _tile_stored(3, c[1], 64);
  };
  const auto floats = [&](std::int64_t ib, const std::int32_t (&ct)[16][16]) {
    const __m512 dwv = _mm512_load_ps(dw + ib * kRows);
    [[maybe_unused]] __m512 mwv;
    if constexpr (F::kMin) mwv = _mm512_load_ps(mw + ib * kRows);
    TANDEM_UNROLL
    for (int m = 0; m < (MG > 0 ? MG : 16); ++m) {
      if (MG > 0 || m < n) {
        const __m512 scale = _mm512_mul_ps(dwv, _mm512_set1_ps(da[ib][m]));  // d_w * d_a
        const __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(ct[m])), scale);
        if constexpr (F::kMin)
          s[m] = _mm512_add_ps(s[m], _mm512_add_ps(p, _mm512_mul_ps(mwv, _mm512_set1_ps(sa[ib][m]))));  // + m_w * s_a
        else
          s[m] = _mm512_add_ps(s[m], p);  // sum += float(sumi) * (d_w * d_a)
      }
    }
  };
  if (pn > 0) tiles_even(0);
  for (std::int64_t ib = 0; ib < pn; ib += 2) {
    if (ib + 1 < pn) tiles_odd(ib + 1);
    floats(ib, c[0]);
    if (ib + 1 < pn) {
      if (ib + 2 < pn) tiles_even(ib + 2);
      floats(ib + 1, c[1]);
    }
  }
  TANDEM_UNROLL
  for (int m = 0; m < (MG > 0 ? MG : 16); ++m)
    if (MG > 0 || m < n) _mm512_store_ps(sums + m * kRows, s[m]);
}

// Activation counts below this take the vector forms (packed_decode, or exact_rows without the side table)
// instead of the tiles (same results): a tile call's set-up costs more than it saves for so few (measured: decode).
constexpr int kTileMinActs = 4;
// With the packed layout the vector form keeps up with memory for more activations (continuous batching's steps):
// measured per matrix (bench_kernels' Batch/...), the tiles' per-block set-up (B tiles built, C stored and read back
// for the float step) cost more than the vector form below this count.
constexpr int kTileMinActsPacked = 17;

// The tile products' two forms. Weights with signed levels (q8_0, q4_0, q5_0, iq4_nl) times q8_0 activations:
// TDPBSSD, B tiles from the packed layout above or from the rows.
template <class S>
struct SignedForm {
  using Act = BlockQ8_0;
  using P = typename S::Pack;
  static constexpr bool kMin = false;
  static constexpr std::size_t kB = packed_block_bytes<P>();
  template <int kSet>  // tile set 0 (tmm0-2) or 1 (tmm3-5): the intrinsics take register numbers, not values
  static void dp() {
    if constexpr (kSet == 0) _tile_dpbssd(0, 1, 2);
    else _tile_dpbssd(3, 4, 5);
  }
  // Block p of the packed layout: its 8 B rows into dst, its 16 scales into dw.
  static void build_packed(const std::uint8_t* p, std::int8_t* dst, float* dw, float*) {
    __m512i sv[8];
    P::signed_rows(p + kPackedHead, sv);
    TANDEM_UNROLL
    for (int k = 0; k < 8; ++k) _mm512_store_si512(dst + 64 * k, sv[k]);
    _mm512_store_ps(dw, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
  }
  // Block ib of up to 16 rows (wg, rows_g of them): B row k, column r: levels 4k..4k+3 of weight row r (zeros past
  // the rows).
  static void build_rows(const std::uint8_t* wg, std::size_t wrb, int rows_g, std::int64_t ib, std::int8_t* dst,
                         float* dw) {
    using Block = typename S::Block;
    alignas(32) std::int8_t lv[kRows][32];
    alignas(32) std::uint16_t d16[kRows];
    for (int r = 0; r < kRows; ++r) {
      if (r < rows_g) {
        const Block& b = reinterpret_cast<const Block*>(wg + static_cast<std::size_t>(r) * wrb)[ib];
        _mm256_store_si256(reinterpret_cast<__m256i*>(lv[r]), S::levels(b));
        d16[r] = b.d;
      } else {
        _mm256_store_si256(reinterpret_cast<__m256i*>(lv[r]), _mm256_setzero_si256());
        d16[r] = 0;
      }
    }
    alignas(64) std::uint32_t bq[8][16];
    const auto* src = reinterpret_cast<const std::uint32_t*>(lv);
    for (int k = 0; k < 8; ++k)
      for (int r = 0; r < kRows; ++r) bq[k][r] = src[r * 8 + k];
    std::memcpy(dst, bq, 512);
    _mm512_store_ps(dw, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(d16))));
  }
};

// q4_1 and q5_1 (a min per block): their unsigned levels times q8_1 activations, TDPBSUD, B tiles from
// kernels_avx512_k.cc's packed layout of these types (per 16-row group and block: d [0, 32) and m [32, 64) as f16,
// the levels in B order as a nibble plane, for q5_1 then the fifth bits as a bit plane). The float step adds
// m_w * s_a: the reference's sumf += float(Σ q_w q_a) * (d_w * d_a) + m_w * s_a.
template <int kFifth>
struct MinnedForm {
  using Act = BlockQ8_1;
  static constexpr bool kMin = true;
  static constexpr std::size_t kB = 64 + 256 + (kFifth ? 64 : 0);
  template <int kSet>  // tile set 0 (tmm0-2) or 1 (tmm3-5): the intrinsics take register numbers, not values
  static void dp() {
    if constexpr (kSet == 0) _tile_dpbsud(0, 1, 2);
    else _tile_dpbsud(3, 4, 5);
  }
  static void build_packed(const std::uint8_t* p, std::int8_t* dst, float* dw, float* mw) {
    __m512i u[8];
    decode_nibbles(p + 64, u);
    if constexpr (kFifth) bit_plane(p + 64 + 256, 0x10, u);
    TANDEM_UNROLL
    for (int k = 0; k < 8; ++k) _mm512_store_si512(dst + 64 * k, u[k]);
    _mm512_store_ps(dw, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
    _mm512_store_ps(mw, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32))));
  }
};

// The tiles proper: nc activations (any number up to kActs) against nr rows (up to kGroups groups), in pieces of
// kPieceBlocks blocks. `aux`: the packed layout (F's), or null to build the B tiles from the rows (SignedForm only).
template <class F>
void amx_tiles(const std::uint8_t* w, std::size_t wrb, int nr, const std::uint8_t* a, std::size_t arb, int nc,
               std::int64_t cols, float* y, std::int64_t ldy, const std::uint8_t* aux) {
  using Act = typename F::Act;
  constexpr std::size_t kB = F::kB;
  const std::int64_t nb = cols / QK8_0;
  const std::size_t group_bytes = static_cast<std::size_t>(nb) * kB;
  const int ng = (nr + kRows - 1) / kRows;
  // Per call, on the stack: per group the B tiles, weight scales (and mins) of a piece's blocks, and the running sums
  // of every (activation, weight row) pair.
  alignas(64) std::int8_t bbuf[kGroups][kPieceBlocks * 512];
  alignas(64) float dw[kGroups][kPieceBlocks * kRows];
  alignas(64) float mw[F::kMin ? kGroups : 1][F::kMin ? kPieceBlocks * kRows : 1];
  alignas(64) float sums[kGroups][kActs * kRows];
  alignas(64) float da[kPieceBlocks][16];
  alignas(64) float sa[F::kMin ? kPieceBlocks : 1][16];
  for (int g = 0; g < ng; ++g)
    for (int i = 0; i < nc * kRows; ++i) sums[g][i] = 0.f;

  int configured = 0;  // the activation count the tiles are configured for in this call (0: not yet)
  for (std::int64_t p0 = 0; p0 < nb; p0 += kPieceBlocks) {
    const std::int64_t pn = std::min(kPieceBlocks, nb - p0);
    // Group g's B tiles and scales for the piece's blocks.
    const auto build = [&](int g) {
      if (aux != nullptr) {
        // From the packed layout, a few operations per block. The blocks kAhead on in reading order (this group's,
        // then the next group's) are prefetched: with few activations this loop is what waits on memory.
        const std::uint8_t* grp = aux + static_cast<std::size_t>(g) * group_bytes;
        for (std::int64_t ib = 0; ib < pn; ++ib) {
          const std::uint8_t* p = grp + static_cast<std::size_t>(p0 + ib) * kB;
          const std::int64_t ahead = ib + kAheadBlocks;
          const std::uint8_t* q = ahead < pn || g + 1 == ng ? p + kAheadBlocks * kB
                                                            : grp + group_bytes + static_cast<std::size_t>(p0 + ahead - pn) * kB;
          TANDEM_UNROLL
          for (std::size_t l = 0; l < kB; l += 64) _mm_prefetch(reinterpret_cast<const char*>(q + l), _MM_HINT_T0);
          F::build_packed(p, bbuf[g] + ib * 512, dw[g] + ib * kRows, F::kMin ? mw[g] + ib * kRows : nullptr);
        }
        return;
      }
      if constexpr (!F::kMin) {
        const std::uint8_t* wg = w + static_cast<std::size_t>(g) * kRows * wrb;
        const int rows_g = std::min(kRows, nr - g * kRows);
        for (std::int64_t ib = 0; ib < pn; ++ib) F::build_rows(wg, wrb, rows_g, p0 + ib, bbuf[g] + ib * 512, dw[g] + ib * kRows);
      }
    };
    // Activation group m0 (up to 16) against the groups' tiles: g0 only, or all of them (g0 < 0).
    const auto acts = [&](std::int64_t m0, int g0) {
      const int mg = static_cast<int>(std::min<std::int64_t>(16, nc - m0));
      if (mg != configured) {
        configure(mg);
        configured = mg;
      }
      const std::uint8_t* am = a + static_cast<std::size_t>(m0) * arb + static_cast<std::size_t>(p0) * sizeof(Act);
      for (int g = g0 < 0 ? 0 : g0; g < (g0 < 0 ? ng : g0 + 1); ++g) {
        const float* mg_w = F::kMin ? mw[g] : nullptr;
        if (mg == 16) act_group<F, 16>(am, arb, 16, da, sa, bbuf[g], dw[g], mg_w, pn, sums[g] + m0 * kRows);
        else act_group<F, 0>(am, arb, mg, da, sa, bbuf[g], dw[g], mg_w, pn, sums[g] + m0 * kRows);
      }
    };
    const auto scales = [&](std::int64_t m0) {
      const int mg = static_cast<int>(std::min<std::int64_t>(16, nc - m0));
      const std::uint8_t* am = a + static_cast<std::size_t>(m0) * arb + static_cast<std::size_t>(p0) * sizeof(Act);
      if (mg == 16) act_field<Act, 16>(am, arb, 16, pn, da);
      else act_field<Act, 0>(am, arb, mg, pn, da);
      if constexpr (F::kMin) {
        const std::uint8_t* as = am + offsetof(BlockQ8_1, s);
        if (mg == 16) act_field<Act, 16>(as, arb, 16, pn, sa);
        else act_field<Act, 0>(as, arb, mg, pn, sa);
      }
    };
    if (nc <= 16) {
      // One activation group (continuous batching's steps): each group's tiles used as soon as they are built, while
      // they are in L1.
      scales(0);
      for (int g = 0; g < ng; ++g) {
        build(g);
        acts(0, g);
      }
    } else {
      for (int g = 0; g < ng; ++g) build(g);
      for (std::int64_t m0 = 0; m0 < nc; m0 += 16) {
        scales(m0);
        acts(m0, -1);
      }
    }
  }
  _tile_release();  // the tile state is not kept between calls (see configure)
  for (int g = 0; g < ng; ++g) {
    const int rows_g = std::min(kRows, nr - g * kRows);
    for (int m = 0; m < nc; ++m)
      for (int r = 0; r < rows_g; ++r) y[m * ldy + g * kRows + r] = sums[g][m * kRows + r];
  }
}

template <class S>
void amx_tile(const std::uint8_t* w, std::size_t wrb, int nr, const std::uint8_t* a, std::size_t arb, int nc,
              std::int64_t cols, float* y, std::int64_t ldy, const std::uint8_t* aux) {
  using P = typename S::Pack;
  const std::int64_t nb = cols / QK8_0;
  const std::size_t group_bytes = packed_group_bytes<P>(cols);
  const int ng = (nr + kRows - 1) / kRows;
  if (aux != nullptr && nc < kTileMinActsPacked) {
    // Up to 8 activations per pass over the groups (a second pass reads them from L2).
    for (int c0 = 0; c0 < nc; c0 += 8) {
      const std::uint8_t* ac = a + static_cast<std::size_t>(c0) * arb;
      float* yc = y + c0 * ldy;
      switch (std::min(8, nc - c0)) {
        case 1: packed_decode<P, 1>(aux, group_bytes, nr, ac, arb, nb, yc, ldy); break;
        case 2: packed_decode<P, 2>(aux, group_bytes, nr, ac, arb, nb, yc, ldy); break;
        case 3: packed_decode<P, 3>(aux, group_bytes, nr, ac, arb, nb, yc, ldy); break;
        case 4: packed_decode<P, 4>(aux, group_bytes, nr, ac, arb, nb, yc, ldy); break;
        case 5: packed_decode<P, 5>(aux, group_bytes, nr, ac, arb, nb, yc, ldy); break;
        case 6: packed_decode<P, 6>(aux, group_bytes, nr, ac, arb, nb, yc, ldy); break;
        case 7: packed_decode<P, 7>(aux, group_bytes, nr, ac, arb, nb, yc, ldy); break;
        default: packed_decode<P, 8>(aux, group_bytes, nr, ac, arb, nb, yc, ldy); break;
      }
    }
    return;
  }
  if (nc < kTileMinActs) {
    for (int g = 0; g < ng; ++g)
      for (int c = 0; c < nc; ++c)
        exact_rows<typename S::Levels>(w + static_cast<std::size_t>(g) * kRows * wrb, wrb,
                                       std::min(kRows, nr - g * kRows),
                                       reinterpret_cast<const BlockQ8_0*>(a + static_cast<std::size_t>(c) * arb), nb,
                                       y + c * ldy + g * kRows);
    return;
  }
  amx_tiles<SignedForm<S>>(w, wrb, nr, a, arb, nc, cols, y, ldy, aux);
}

// q4_1 / q5_1: the vector form for fewer than kTileMinActsPacked activations or without the side table, the tiles
// for more.
template <WType T, int kFifth>
void amx_minned_tile(const std::uint8_t* w, std::size_t wrb, int nr, const std::uint8_t* a, std::size_t arb, int nc,
                     std::int64_t cols, float* y, std::int64_t ldy, const std::uint8_t* aux) {
  if (aux == nullptr || nc < kTileMinActsPacked) return base_entry<T>(w, wrb, nr, a, arb, nc, cols, y, ldy, aux);
  amx_tiles<MinnedForm<kFifth>>(w, wrb, nr, a, arb, nc, cols, y, ldy, aux);
}

KernelTable make_amx_table() {
  KernelTable t = avx512bf16_table();
  t.isa = Isa::amx;
  auto set = [&](WType type, TileAuxFn tile, PrepareAuxFn prepare, std::size_t (*group_bytes)(std::int64_t)) {
    TypeKernels& k = t.types[static_cast<int>(type)];
    k.tile = nullptr;
    k.tile_aux = tile;
    k.tile_any_rows = false;  // (the avx512 offset kinds' tile takes any rows; these tiles up to tile_rows)
    k.prepare_aux = prepare;
    k.aux_group_bytes = group_bytes;
    k.decode_rows = kGroups * kRows;
    k.tile_rows = kGroups * kRows;
    k.tile_acts = kActs;
  };
  set(WType::q8_0, amx_tile<Q8_0Src>, prepare_packed<PackQ8_0>, packed_group_bytes<PackQ8_0>);
  set(WType::q4_0, amx_tile<Q4_0Src>, prepare_packed<PackQ4_0>, packed_group_bytes<PackQ4_0>);
  set(WType::q5_0, amx_tile<Q5_0Src>, prepare_packed<PackQ5_0>, packed_group_bytes<PackQ5_0>);
  set(WType::iq4_nl, amx_tile<IQ4NLSrc>, prepare_packed<PackIQ4_NL>, packed_group_bytes<PackIQ4_NL>);
  // Their decode (packed_decode) reads its groups side by side: more groups a call, more memory streams.
  for (WType k : {WType::q8_0, WType::q4_0, WType::q5_0, WType::iq4_nl})
    t.types[static_cast<int>(k)].decode_rows = kDecodeGroups * kRows;
  // q4_1 / q5_1 and the super-block types keep the avx512 table's packed layouts (its prepare and group bytes) and
  // add the tiles.
  const auto tiles_on_base = [&](WType type, TileAuxFn tile) {
    g_base[static_cast<int>(type)] = t.types[static_cast<int>(type)];
    set(type, tile, g_base[static_cast<int>(type)].prepare_aux, g_base[static_cast<int>(type)].aux_group_bytes);
  };
  tiles_on_base(WType::q4_1, amx_minned_tile<WType::q4_1, 0>);
  tiles_on_base(WType::q5_1, amx_minned_tile<WType::q5_1, 1>);
  for (WType k : {WType::q4_K, WType::q5_K, WType::iq4_xs, WType::q6_K, WType::q3_K, WType::q2_K})
    t.types[static_cast<int>(k)] = amx_superblock_kernels(k, t.types[static_cast<int>(k)]);
  // bf16 by widening to f32 and FMAs (the avx512 tile), not vdpbf16ps: on the CPUs with AMX (Intel Sapphire Rapids
  // and later) the widening tile measured 15 % faster in prefill and level in decode (docs/kernels.md).
  t.types[static_cast<int>(WType::bf16)] = avx512_table().types[static_cast<int>(WType::bf16)];
  return t;
}

}  // namespace

const KernelTable& amx_table() {
  static const KernelTable table = make_amx_table();
  return table;
}

}  // namespace tandem::kernels::detail
