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

}  // namespace
}  // namespace tandem::kernels::detail
