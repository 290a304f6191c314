// AVX-VNNI (the 256-bit vpdpbusd of Intel Alder Lake and later, AMD Zen 5; for CPUs with AVX2 and VNNI but no
// AVX-512, where it is the only VNNI): the AVX2 table with the 32-element block types' dot products on vpdpbusd.
// Built with -mavx2 -mfma -mf16c -mavxvnni, called only after the CPU check (kernels.cc cpu_has).
//
// Each AVX2 dot product of a block — maddubs (unsigned × signed bytes into int16 pairs) then madd by 1 (pairs into
// int32 lanes of 4 products), with an offset term subtracted for q4_0 and q5_0 — is one vpdpbusd here, from the
// negated offset term where there is one. Both give the same exact int32 lanes (the AVX2 forms were chosen so that
// their int16 steps cannot saturate), and the tiles around them are the AVX2 tiles themselves
// (kernels_avx2_blocks.h): every result is the AVX2 table's bit for bit, whatever the shape, the thread split or the
// batch (test AvxVnniEqualsAvx2BitForBit).
#include <immintrin.h>

#include "kernels/kernels_avx2_blocks.h"
#include "kernels/kernels_avx2_common.h"

namespace tandem::kernels::detail {
namespace {

inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }

// q8_0 and iq4_nl: the sign trick as in AVX2 (|w| unsigned times sign(w) · a).
struct Q8_0LevelsVnni : Q8_0Levels {
  static __m256i dot(const Row& w, const Act& a) {
    return dpbusd(_mm256_setzero_si256(), w.aw, _mm256_sign_epi8(a.a, w.w));
  }
};
struct IQ4NLLevelsVnni : IQ4NLLevels {
  static __m256i dot(const Row& w, const Act& a) { return Q8_0LevelsVnni::dot(w, a); }
};

// q4_0 / q5_0: levels u - kOffset, Σ (u - kOffset) a = Σ u a - kOffset Σ a: the activation's -kOffset Σ a per 4
// bytes once per block (one vpdpbusd of kOffset with a, negated), then per row one vpdpbusd from it.
template <class Base, int kOffset>
struct OffsetLevelsVnni {
  using Block = typename Base::Block;
  using Row = typename Base::Row;
  struct Act {
    __m256i a;
    __m256i neg;  // -kOffset (a[4i] + .. + a[4i+3]) as int32
  };
  static Row row(const Block& b) { return Base::row(b); }
  static Act act(const BlockQ8_0& b) {
    const __m256i a = load256(b.qs);
    const __m256i off = dpbusd(_mm256_setzero_si256(), _mm256_set1_epi8(static_cast<char>(kOffset)), a);
    return {a, _mm256_sub_epi32(_mm256_setzero_si256(), off)};
  }
  static __m256i dot(const Row& w, const Act& a) { return dpbusd(a.neg, w.u, a.a); }
};
using Q4_0LevelsVnni = OffsetLevelsVnni<Q4_0Levels, 8>;
using Q5_0LevelsVnni = OffsetLevelsVnni<Q5_0Levels, 16>;

// q4_1 / q5_1: the unsigned levels times the activation bytes from zero.
template <class B, bool kFive>
struct MinnedLevelsVnni : MinnedLevels<B, kFive> {
  static __m256i dot(__m256i u, __m256i a) { return dpbusd(_mm256_setzero_si256(), u, a); }
};

template <int R, int C>
using Q8_0TileVnni = Q8ActTile<Q8_0LevelsVnni, R, C>;
template <int R, int C>
using Q4_0TileVnni = Q8ActTile<Q4_0LevelsVnni, R, C>;
template <int R, int C>
using Q5_0TileVnni = Q8ActTile<Q5_0LevelsVnni, R, C>;
template <int R, int C>
using IQ4NLTileVnni = Q8ActTile<IQ4NLLevelsVnni, R, C>;
template <int R, int C>
using Q4_1TileVnni = Q81ActTile<MinnedLevelsVnni<BlockQ4_1, false>, R, C>;
template <int R, int C>
using Q5_1TileVnni = Q81ActTile<MinnedLevelsVnni<BlockQ5_1, true>, R, C>;

KernelTable make_avxvnni_table() {
  KernelTable t = avx2_table();
  t.isa = Isa::avxvnni;
  set_tile<Q8_0TileVnni, kQ8_0>(t, WType::q8_0);
  set_tile<Q4_0TileVnni, kQ4_0>(t, WType::q4_0);
  set_tile<Q5_0TileVnni, kQ4_0>(t, WType::q5_0);
  set_tile<IQ4NLTileVnni, kQ4_0>(t, WType::iq4_nl);
  set_tile<Q4_1TileVnni, kQ4_0>(t, WType::q4_1);
  set_tile<Q5_1TileVnni, kQ4_0>(t, WType::q5_1);
  return t;
}

}  // namespace

const KernelTable& avxvnni_table() {
  static const KernelTable table = make_avxvnni_table();
  return table;
}

}  // namespace tandem::kernels::detail
