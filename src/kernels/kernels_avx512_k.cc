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
        k16_part(lo, hi, sa, sb, pair, ac[c][i].bsums, u, isum[c], corr[c]);
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

// An activation block's bytes 4k..4k+3 in every lane of av[k].
inline void b32_act(const BlockQ8_1& ab, __m512i (&av)[8]) {
  TANDEM_UNROLL
  for (int k = 0; k < 8; ++k) {
    std::int32_t a4;
    std::memcpy(&a4, ab.qs + 4 * k, 4);
    av[k] = _mm512_set1_epi32(a4);
  }
}

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
      b32_act(ab, av);
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
    b32_act(a[ib], av);
    const __m512 da = _mm512_set1_ps(h2f(a[ib].d)), sa = _mm512_set1_ps(h2f(a[ib].s));
    for (int g = 0; g < ng; ++g) {
      const B32Block<K> b(aux + static_cast<std::size_t>(g) * group_bytes + static_cast<std::size_t>(ib) * kBytes,
                          8 * kBytes);
      sum[g] = _mm512_add_ps(sum[g], b.term(av, da, sa));
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
