// AMX-INT8 tiles for the 32-element block types with q8_0 activations (q8_0, q4_0, q5_0, iq4_nl): the only file
// built with -mamx-tile -mamx-int8; kernels.cc calls into it only after checking the CPU and getting the kernel's
// permission to use the tile data (arch_prctl ARCH_REQ_XCOMP_PERM).
//
// One tile call covers up to 16 weight rows and any number of activation rows. The weight rows' levels are
// rearranged once per call into AMX's B layout (per block: 8 rows of 64 bytes, row g holding elements 4g..4g+3 of
// each of the 16 weight rows), their scales into one vector per block; then for each group of up to 16 activation
// rows and each block: one TDPBSSD (A: the activations' 32 bytes of that block, read in place with the activation
// row stride; B: the block's levels) gives the exact integer dot product of every (activation, weight row) pair,
// and the block's float step is done for 16 weight rows at once, in the reference's order and roundings:
// sum += float(sumi) * (d_w * d_a) (vec_dot_ref in quant_blocks32.cc; no fused multiply-add). The result of every
// element is therefore the reference's, bit for bit, whatever the tile shape, the thread split or the batch — and
// decode (one activation row) runs the same code with a one-row A tile.
#include <immintrin.h>

#include "kernels/kernels_avx512_common.h"

namespace tandem::kernels::detail {
namespace {

constexpr int kRows = 16;    // weight rows per call (B tile columns)
constexpr int kActs = 128;   // activation rows per call, in groups of 16 (A tile rows)

// The tile configuration (palette 1): tmm0 = C (acts x 16 int32), tmm1 = A (acts x 32 bytes), tmm2 = B (8 x 64
// bytes). Loaded at the start of every call and again when the last activation group of the call is short: other
// code on the thread (oneDNN inside LibTorch may use AMX too) can have released or replaced the configuration since
// the previous call, so none is assumed to survive between calls.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

inline void configure(int acts) {
  TileConfig c;
  c.rows[0] = static_cast<std::uint8_t>(acts);
  c.colsb[0] = 64;
  c.rows[1] = static_cast<std::uint8_t>(acts);
  c.colsb[1] = 32;
  c.rows[2] = 8;
  c.colsb[2] = 64;
  _tile_loadconfig(&c);
}

// A block's 32 signed levels in element order, per type.
struct Q8_0Src {
  using Block = BlockQ8_0;
  using Levels = Q8_0Levels512;
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
  static __m256i levels(const Block& b) { return _mm256_sub_epi8(nibbles32(b.qs), _mm256_set1_epi8(8)); }
};
struct Q5_0Src {
  using Block = BlockQ5_0;
  using Levels = Q5_0Levels512;
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

// The side table (kernels.h, aux_bytes): per 16-row group, for each block the 16 rows' f16 scales side by side.
std::size_t aux_group_bytes(std::int64_t cols) { return static_cast<std::size_t>(cols / QK8_0) * 32; }

template <class Block>
void prepare_scales(const std::uint8_t* w, std::size_t wrb, std::int64_t rows, std::int64_t cols, std::uint8_t* aux) {
  const std::int64_t nb = cols / QK8_0;
  auto* out = reinterpret_cast<std::uint16_t*>(aux);
  for (std::int64_t g = 0; g < (rows + 15) / 16; ++g)
    for (std::int64_t ib = 0; ib < nb; ++ib)
      for (std::int64_t r = 0; r < 16; ++r) {
        const std::int64_t row = 16 * g + r;
        *out++ = row < rows ? reinterpret_cast<const Block*>(w + static_cast<std::size_t>(row) * wrb)[ib].d : 0;
      }
}

inline __m512 group_scales(const std::uint8_t* aux, std::int64_t ib) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(aux + ib * 32)));
}

template <class L, bool kPair>
__attribute__((always_inline)) inline void exact_step(const std::uint8_t* w, std::size_t wrb, int nr,
                                                      const BlockQ8_0* a0, std::int64_t ib, std::size_t pf,
                                                      const std::uint8_t* aux, __m512& sum) {
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
  const __m512 w0 = aux ? group_scales(aux, ib) : row_scales(d0, wrb, nr);
  const __m512 s0 = _mm512_mul_ps(w0, _mm512_set1_ps(h2f(a0->d)));
  sum = _mm512_add_ps(sum, _mm512_mul_ps(_mm512_cvtepi32_ps(p0), s0));
  if constexpr (kPair) {
    const __m512 w1 = aux ? group_scales(aux, ib + 1) : row_scales(d0 + sizeof(Block), wrb, nr);
    const __m512 s1 = _mm512_mul_ps(w1, _mm512_set1_ps(h2f(a0[1].d)));
    sum = _mm512_add_ps(sum, _mm512_mul_ps(_mm512_cvtepi32_ps(p1), s1));
  }
}

// One activation against nr <= 16 rows, the tiles' results: per block an exact integer per row (vpdpbusd on the
// avx512 tiles' unsigned levels from the -offset·Σa start, reduced per row), then sum += float(sumi) * (d_w * d_a)
// with lanes = rows, block after block.
template <class L>
void exact_rows(const std::uint8_t* w, std::size_t wrb, int nr, const BlockQ8_0* act, std::int64_t nb, float* y,
                const std::uint8_t* aux) {
  __m512 sum = _mm512_setzero_ps();
  const std::size_t pf = prefetch_offset(16, wrb);
  std::int64_t ib = 0;
  for (; ib + 2 <= nb; ib += 2) exact_step<L, true>(w, wrb, nr, act + ib, ib, pf, aux, sum);
  if (ib < nb) exact_step<L, false>(w, wrb, nr, act + ib, ib, pf, aux, sum);
  _mm512_mask_storeu_ps(y, first16(nr), sum);
}

// Activation counts below this run exact_rows once per activation instead of the tiles (same results): the
// tiles' per-call rearrangement of the weights costs more than it saves for so few (measured: decode).
constexpr int kTileMinActs = 4;

template <class S>
void amx_tile(const std::uint8_t* w, std::size_t wrb, int nr, const std::uint8_t* a, std::size_t arb, int nc,
              std::int64_t cols, float* y, std::int64_t ldy, const std::uint8_t* aux) {
  using Block = typename S::Block;
  const std::int64_t nb = cols / QK8_0;
  if (nc < kTileMinActs) {
    for (int c = 0; c < nc; ++c)
      exact_rows<typename S::Levels>(w, wrb, nr, reinterpret_cast<const BlockQ8_0*>(a + static_cast<std::size_t>(c) * arb),
                                     nb, y + c * ldy, aux);
    return;
  }
  // Per call, on the stack: the B tiles and weight scales of up to kMaxBlocks blocks of the 16 rows (rows longer
  // than 4096 columns go in pieces, the sums running on from piece to piece in the same order), and the running
  // sums of every (activation, weight row) pair.
  constexpr std::int64_t kMaxBlocks = 128;
  alignas(64) std::int8_t bbuf[kMaxBlocks * 512];
  alignas(64) float dw[kMaxBlocks * kRows];
  alignas(64) float sums[kActs * kRows];
  for (int i = 0; i < nc * kRows; ++i) sums[i] = 0.f;

  for (std::int64_t p0 = 0; p0 < nb; p0 += kMaxBlocks) {
    const std::int64_t pn = std::min(kMaxBlocks, nb - p0);
    // Rearrange: for block ib, B row g, column r: levels 4g..4g+3 of weight row r (zeros past nr).
    for (std::int64_t ib = 0; ib < pn; ++ib) {
      alignas(32) std::int8_t lv[kRows][32];
      alignas(32) std::uint16_t d16[kRows];
      for (int r = 0; r < kRows; ++r) {
        if (r < nr) {
          const Block& b = reinterpret_cast<const Block*>(w + static_cast<std::size_t>(r) * wrb)[p0 + ib];
          _mm256_store_si256(reinterpret_cast<__m256i*>(lv[r]), S::levels(b));
          d16[r] = b.d;
        } else {
          _mm256_store_si256(reinterpret_cast<__m256i*>(lv[r]), _mm256_setzero_si256());
          d16[r] = 0;
        }
      }
      // Transpose 16 rows x 8 dwords into 8 rows x 16 dwords.
      const auto* src = reinterpret_cast<const std::uint32_t*>(lv);
      const __m512i idx = _mm512_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120);
      std::int8_t* dst = bbuf + ib * 512;
      for (int g = 0; g < 8; ++g)
        _mm512_store_si512(dst + 64 * g, _mm512_i32gather_epi32(_mm512_add_epi32(idx, _mm512_set1_epi32(g)), src, 4));
      _mm512_store_ps(dw + ib * kRows, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(d16))));
    }
    int configured = 0;  // the activation count the tiles are configured for in this call (0: not yet)
    for (std::int64_t m0 = 0; m0 < nc; m0 += 16) {
      const int mg = static_cast<int>(std::min<std::int64_t>(16, nc - m0));
      if (mg != configured) {
        configure(mg);
        configured = mg;
      }
      __m512 s[16];
      for (int m = 0; m < mg; ++m) s[m] = _mm512_load_ps(sums + (m0 + m) * kRows);
      alignas(64) std::int32_t c[16][16];
      for (std::int64_t ib = 0; ib < pn; ++ib) {
        const std::uint8_t* ablk = a + static_cast<std::size_t>(m0) * arb +
                                   static_cast<std::size_t>(p0 + ib) * sizeof(BlockQ8_0);
        _tile_zero(0);
        _tile_loadd(1, ablk + offsetof(BlockQ8_0, qs), static_cast<long>(arb));
        _tile_loadd(2, bbuf + ib * 512, 64);
        _tile_dpbssd(0, 1, 2);
        _tile_stored(0, c, 64);
        const __m512 dwv = _mm512_load_ps(dw + ib * kRows);
        for (int m = 0; m < mg; ++m) {
          std::uint16_t dah;
          std::memcpy(&dah, ablk + static_cast<std::size_t>(m) * arb, 2);
          const __m512 scale = _mm512_mul_ps(dwv, _mm512_set1_ps(h2f(dah)));  // d_w * d_a
          const __m512 p = _mm512_cvtepi32_ps(_mm512_load_si512(c[m]));
          s[m] = _mm512_add_ps(s[m], _mm512_mul_ps(p, scale));  // sum += float(sumi) * (d_w * d_a)
        }
      }
      for (int m = 0; m < mg; ++m) _mm512_store_ps(sums + (m0 + m) * kRows, s[m]);
    }
  }
  _tile_release();  // the tile state is not kept between calls (see configure)
  for (int m = 0; m < nc; ++m)
    for (int r = 0; r < nr; ++r) y[m * ldy + r] = sums[m * kRows + r];
}

KernelTable make_amx_table() {
  KernelTable t = avx512bf16_table();
  t.isa = Isa::amx;
  auto set = [&](WType type, TileAuxFn tile, PrepareAuxFn prepare) {
    TypeKernels& k = t.types[static_cast<int>(type)];
    k.tile = nullptr;
    k.tile_aux = tile;
    k.prepare_aux = prepare;
    k.aux_group_bytes = aux_group_bytes;
    k.decode_rows = kRows;
    k.tile_rows = kRows;
    k.tile_acts = kActs;
  };
  set(WType::q8_0, amx_tile<Q8_0Src>, prepare_scales<BlockQ8_0>);
  set(WType::q4_0, amx_tile<Q4_0Src>, prepare_scales<BlockQ4_0>);
  set(WType::q5_0, amx_tile<Q5_0Src>, prepare_scales<BlockQ5_0>);
  set(WType::iq4_nl, amx_tile<IQ4NLSrc>, prepare_scales<BlockIQ4_NL>);
  return t;
}

}  // namespace

const KernelTable& amx_table() {
  static const KernelTable table = make_amx_table();
  return table;
}

}  // namespace tandem::kernels::detail
