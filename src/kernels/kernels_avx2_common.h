// Internal to the kernels library, for the files built with -mavx2 -mfma -mf16c only (kernels_avx2.cc,
// kernels_avx2_k.cc): the tile selector, register blockings and small helpers they share. Everything is in an
// anonymous namespace (each including file gets its own copy), so no AVX2-compiled inline function is shared with
// the files built for any CPU (see the ODR note in kernels_avx2.cc).
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/dispatch.h"
#include "kernels/quant_iq4.h"  // (kIq4NlValues: data only)
#include "kernels/types.h"

// Loops over tile rows, tile activations and sub-blocks are short and fixed; unrolling them lets the accumulator
// arrays live in registers.
#define TANDEM_UNROLL _Pragma("GCC unroll 16")

namespace tandem::kernels::detail {
namespace {


using RunFn = void (*)(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                       std::int64_t cols, float* y, std::int64_t ldy);

// Picks the instantiation K<nr, nc> for a tile of nr x nc (1 <= nr <= MaxR, 1 <= nc <= MaxC).
template <template <int, int> class K, int MaxR, int MaxC>
struct Tiles {
  struct Fns {
    RunFn f[MaxR * MaxC];
  };
  template <int... I>
  static constexpr Fns make(std::integer_sequence<int, I...>) {
    return {{&K<I / MaxC + 1, I % MaxC + 1>::run...}};
  }
  static constexpr Fns kFns = make(std::make_integer_sequence<int, MaxR * MaxC>{});

  static void tile(const std::uint8_t* w, std::size_t wrb, int nr, const std::uint8_t* a, std::size_t arb, int nc,
                   std::int64_t cols, float* y, std::int64_t ldy) {
    kFns.f[(nr - 1) * MaxC + (nc - 1)](w, wrb, a, arb, cols, y, ldy);
  }
};

// ---- helpers -------------------------------------------------------------------------------------------------

// Fixed-order horizontal sums: 8 -> 4 (low + high half) -> 2 -> 1.
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float h2f(std::uint16_t h) { return _cvtsh_ss(h); }

// Software prefetch for the weight rows: a tile reads R rows side by side, which the hardware prefetchers follow
// poorly when rows are short. Each load of row r also prefetches the same offset some whole tiles ahead, at least
// kPrefetchBytes further on in memory (prefetches past the matrix's end are harmless; they never fault).
constexpr std::size_t kPrefetchBytes = 4096;
inline std::size_t prefetch_offset(int rows, std::size_t wrb) {
  const std::size_t tile = static_cast<std::size_t>(rows) * wrb;
  return tile * ((kPrefetchBytes + tile - 1) / tile);
}
inline void prefetch(const void* p, std::size_t off) {
  // The address may lie past the matrix: form it as an integer, not by pointer arithmetic.
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(p) + off), _MM_HINT_T0);
}

// A tile's set-up: N rows' pointers, `stride` bytes apart from base; R x C 256-bit accumulators at zero.
template <class T, int N>
inline void row_ptrs(const T* (&p)[N], const std::uint8_t* base, std::size_t stride) {
  TANDEM_UNROLL
  for (int i = 0; i < N; ++i) p[i] = reinterpret_cast<const T*>(base + i * stride);
}
template <int R, int C>
inline void zero_acc(__m256 (&acc)[R][C]) {
  TANDEM_UNROLL
  for (int r = 0; r < R; ++r) {
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// The 32 nibbles of a 16-byte quant array as bytes in element order (element j < 16: low nibble of qs[j]; j >= 16:
// high nibble of qs[j - 16]).
inline __m256i nibbles(const std::uint8_t* qs) {
  const __m256i both = _mm256_broadcastsi128_si256(load128(qs));
  const __m256i shifted = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
  return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
}

// llama.cpp's table of the 16 int8 iq4 levels, in both 128-bit lanes (for one pshufb per 32 indices).
inline __m256i iq4_table() {
  return _mm256_broadcastsi128_si256(load128(kIq4NlValues));
}

// ---- attention of a decode row (kernels.h attention_decode) ----------------------------------------------------

// exp(x) for x <= 0: Cephes' expf as exp512_nonpositive (kernels_avx512_common.h), 2^n built in the exponent bits.
inline __m256 exp256_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3F));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341F)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375F), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4F), r);
  __m256 y = _mm256_set1_ps(1.9875691500E-4F);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507E-3F));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073E-3F));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894E-2F));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459E-1F));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201E-1F));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0F)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// Reads one byte of each 64-byte line of the keys and values at positions [j0, j1] (rows slots[j] of `row` elements;
// of each, the `hd` elements from `off`), so that the attention loops after it find them in cache. Loads, not
// prefetch hints: on the AMD EPYC we measure on, software prefetches of these lines (T0 or T1, per head or the whole
// range ahead) changed nothing — 47 ns per head and position with the pool out of cache either way — while these
// loads, which the core keeps in flight side by side, make the attention 2.5x faster there (docs/kernels.md,
// "Attention of a decode row"). The bytes' sum goes into an empty asm so the loads stay.
template <class KV>
inline void touch_kv_head(const KV* k, const KV* v, const std::int64_t* slots, std::int64_t row, std::int64_t off,
                          std::int64_t hd, std::int64_t j0, std::int64_t j1) {
  const std::size_t bytes = static_cast<std::size_t>(hd) * sizeof(KV);
  std::uint64_t acc = 0;
  for (std::int64_t j = j0; j <= j1; ++j) {
    const char* kj = reinterpret_cast<const char*>(k + slots[j] * row + off);
    const char* vj = reinterpret_cast<const char*>(v + slots[j] * row + off);
    // The first byte, each line start after it, and the last byte (a head may straddle lines).
    for (std::size_t b = 0; b < bytes; b = (b | 63) + 1)
      acc += static_cast<unsigned char>(kj[b]) + static_cast<unsigned char>(vj[b]);
    acc += static_cast<unsigned char>(kj[bytes - 1]) + static_cast<unsigned char>(vj[bytes - 1]);
  }
  asm volatile("" : : "r"(acc));
}

// Whether a decode row's attention brings the positions' whole rows into cache first — every head's keys and values,
// row after row — rather than each kv head's part just before its heads (kTouchRowsBytes, dispatch.h). Whole rows
// measured fastest up to 2,000 positions of the 134M shape (6 MB).
template <class KV>
inline bool touch_whole_rows(std::int64_t row, std::int64_t first, std::int64_t pos) {
  return static_cast<std::size_t>(pos + 1 - first) * static_cast<std::size_t>(row) * sizeof(KV) * 2 <= kTouchRowsBytes;
}

// The reference attention for either pool element type (dispatch.h).
inline void ref_attention_kv(const float* q, std::int64_t heads, std::int64_t kv_heads, std::int64_t hd, const float* k,
                             const float* v, const std::int64_t* slots, std::int64_t pos, std::int64_t window,
                             float scale, float cap, float* scratch, float* out, KvRows rows) {
  ref_attention(q, heads, kv_heads, hd, k, v, slots, pos, window, scale, cap, scratch, out, rows);
}
inline void ref_attention_kv(const float* q, std::int64_t heads, std::int64_t kv_heads, std::int64_t hd,
                             const std::uint16_t* k, const std::uint16_t* v, const std::int64_t* slots,
                             std::int64_t pos, std::int64_t window, float scale, float cap, float* scratch, float* out,
                             KvRows rows) {
  ref_attention_f16(q, heads, kv_heads, hd, k, v, slots, pos, window, scale, cap, scratch, out, rows);
}

// 8 keys' or values' elements as f32: f32 as they are, f16 widened exactly (F16C).
inline __m256 kv_load256(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 kv_load256(const std::uint16_t* p) { return _mm256_cvtph_ps(load128(p)); }

// NI vectors of 8 elements of a head's output: out = (Σ_j e_j · v_j) / sum, each element one FMA chain over j from
// first to pos (e: the exponentials in scratch; v0: the pool's elements of position 0 at the vectors' offset). The
// NI chains in registers (a runtime count kept them in memory: a store and a reload per element and position).
template <int NI, class KV>
inline void weighted_values_256(const float* e, const KV* v0, const std::int64_t* slots, std::int64_t row,
                                std::int64_t first, std::int64_t pos, __m256 sum, float* out) {
  __m256 acc[NI];
  for (int i = 0; i < NI; ++i) acc[i] = _mm256_setzero_ps();
  for (std::int64_t j = first; j <= pos; ++j) {
    const __m256 p = _mm256_set1_ps(e[j]);
    const KV* vj = v0 + slots[j] * row;
    TANDEM_UNROLL
    for (int i = 0; i < NI; ++i) acc[i] = _mm256_fmadd_ps(p, kv_load256(vj + 8 * i), acc[i]);
  }
  for (int i = 0; i < NI; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_div_ps(acc[i], sum));
}

// As attention_512 with 8 lanes; head sizes that are not multiples of 8 (or above 256) go to the reference. KV: f32
// or f16 (std::uint16_t) pool elements.
template <class KV>
inline void attention_256(const float* q, std::int64_t heads, std::int64_t kv_heads, std::int64_t hd, const KV* k,
                          const KV* v, const std::int64_t* slots, std::int64_t pos, std::int64_t window,
                          float scale, float cap, float* scratch, float* out, KvRows rows) {
  if (hd % 8 != 0 || hd > 256) {
    ref_attention_kv(q, heads, kv_heads, hd, k, v, slots, pos, window, scale, cap, scratch, out, rows);
    return;
  }
  const std::int64_t group = heads / kv_heads, row = kv_heads * hd;
  const std::int64_t first = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
  const int nv = static_cast<int>(hd / 8);
  const bool touch = rows == KvRows::cold, whole = touch_whole_rows<KV>(row, first, pos);
  if (touch && whole) touch_kv_head(k, v, slots, row, 0, row, first, pos);
  for (std::int64_t h = 0; h < heads; ++h) {
    const float* qh = q + h * hd;
    const std::int64_t off = (h / group) * hd;
    if (touch && !whole && h % group == 0) touch_kv_head(k, v, slots, row, off, hd, first, pos);
    float mx = -__builtin_inff();
    for (std::int64_t j = first; j <= pos; ++j) {
      const KV* kj = k + slots[j] * row + off;
      __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(qh), kv_load256(kj));
      for (int i = 1; i < nv; ++i) acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * i), kv_load256(kj + 8 * i), acc);
      float sc = hsum8(acc) * scale;
      if (cap > 0.0F) sc = cap * __builtin_tanhf(sc / cap);
      scratch[j] = sc;
      mx = sc > mx ? sc : mx;
    }
    // exp 8 keys at a time; the last few (fewer than 8) through a zero-padded copy.
    __m256 sumv = _mm256_setzero_ps();
    const __m256 mxv = _mm256_set1_ps(mx);
    std::int64_t j = first;
    for (; j + 8 <= pos + 1; j += 8) {
      const __m256 e = exp256_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(scratch + j), mxv));
      _mm256_storeu_ps(scratch + j, e);
      sumv = _mm256_add_ps(sumv, e);
    }
    if (j <= pos) {
      alignas(32) float t[8];
      const int left = static_cast<int>(pos + 1 - j);
      for (int l = 0; l < 8; ++l) t[l] = l < left ? scratch[j + l] : mx;
      __m256 e = exp256_nonpositive(_mm256_sub_ps(_mm256_load_ps(t), mxv));
      _mm256_store_ps(t, e);
      for (int l = left; l < 8; ++l) t[l] = 0.0F;
      for (int l = 0; l < left; ++l) scratch[j + l] = t[l];
      sumv = _mm256_add_ps(sumv, _mm256_load_ps(t));
    }
    const __m256 sum = _mm256_set1_ps(hsum8(sumv));
    for (int i0 = 0; i0 < nv; i0 += 4) {
      const KV* v0 = v + off + 8 * i0;
      float* o = out + h * hd + 8 * i0;
      switch (nv - i0 < 4 ? nv - i0 : 4) {
        case 4: weighted_values_256<4>(scratch, v0, slots, row, first, pos, sum, o); break;
        case 3: weighted_values_256<3>(scratch, v0, slots, row, first, pos, sum, o); break;
        case 2: weighted_values_256<2>(scratch, v0, slots, row, first, pos, sum, o); break;
        default: weighted_values_256<1>(scratch, v0, slots, row, first, pos, sum, o); break;
      }
    }
  }
}

// Register blocks. Decode tiles (one activation) take more weight rows: independent accumulator chains and
// several row streams in flight (k-quant tiles do their rows one after the other; two per call measured a little
// faster than one). Prefill tiles share each loaded weight vector among C activations and each
// activation vector among R rows: f32/f16/bf16 4 x 3 (12 accumulators + 3 activation vectors); q8_0 2 x 4; q4_0
// 2 x 3 (its activations carry a correction vector too); k-quants 1 x 4 (a super-block's unpacked levels and
// scales are shared by the activations).
struct Blocking {
  int decode_rows;
  int rows;
  int acts;
};
constexpr Blocking kFloat{8, 4, 3};
constexpr Blocking kQ8_0{8, 2, 4};
constexpr Blocking kQ4_0{8, 2, 3};
constexpr Blocking kK{2, 1, 4};

template <template <int, int> class K, const Blocking& B>
constexpr TypeKernels entry(QuantizeActFn q) {
  constexpr int max_rows = B.decode_rows > B.rows ? B.decode_rows : B.rows;
  return {q, Tiles<K, max_rows, B.acts>::tile, B.decode_rows, B.rows, B.acts};
}

// A table's entry of `type` with its tile (and blocking) replaced, keeping its activation quantizer (the tables built
// from the AVX2 one: AVX-VNNI, AVX-512).
template <template <int, int> class K, const Blocking& B>
void set_tile(KernelTable& t, WType type) {
  TypeKernels& k = t.types[static_cast<int>(type)];
  k = entry<K, B>(k.quantize_act);
}

}  // namespace
}  // namespace tandem::kernels::detail
