// The bf16 tile on AVX512_BF16 (the only file built with -mavx512bf16; kernels.cc calls into it only after checking
// the CPU): vdpbf16ps takes 32 bf16 weights and 32 bf16 activations and adds the products of each pair of elements
// to one f32 lane (the products are exact in f32: 8-bit significands; the two additions round to nearest even, and
// the instruction treats f32 denormal inputs and results as zero). One instruction per 32 elements and activation,
// where the widening path (kernels_avx512_common.h) needs two conversions and two FMAs. Per (row, activation): the
// steps in order, a masked partial last step, hsum16; the same operations in every tile shape.
#include "kernels/kernels_avx512_common.h"

namespace tandem::kernels::detail {
namespace {

template <int R, int C>
struct BF16DotTile512 {
  template <bool kPart>
  static inline void step(const std::uint16_t* const* wr, const std::uint16_t* const* ac, std::int64_t k, int n,
                          __m512 (&acc)[R][C]) {
    __m512i xv[C];
    TANDEM_UNROLL
    for (int c = 0; c < C; ++c) xv[c] = kPart ? _mm512_maskz_loadu_epi16(first32(n), ac[c] + k) : load512(ac[c] + k);
    TANDEM_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512i wv = kPart ? _mm512_maskz_loadu_epi16(first32(n), wr[r] + k) : load512(wr[r] + k);
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)wv, (__m512bh)xv[c]);
    }
  }

  static void run(const std::uint8_t* w, std::size_t wrb, const std::uint8_t* a, std::size_t arb,
                  std::int64_t cols, float* y, std::int64_t ldy) {
    const std::uint16_t* wr[R];
    const std::uint16_t* ac[C];
    row_ptrs(wr, w, wrb);
    row_ptrs(ac, a, arb);
    __m512 acc[R][C];
    zero_acc(acc);
    const std::size_t pf = prefetch_offset(R, wrb);
    std::int64_t k = 0;
    // Rows of whole cache lines that start s elements past a line (a GGUF tensor on a 32-byte boundary): the first
    // step puts elements 0 .. 31 - s in 16-bit slots s .. 31, so every later weight load reads one line instead of
    // two halves (as the f32 tile, kernels_avx512_common.h). Element k's slot is (k + s) % 32 in every tile shape.
    const int s = wrb % 64 == 0 ? static_cast<int>(reinterpret_cast<std::uintptr_t>(w) % 64 / 2) : 0;
    if (s != 0) {
      const std::int64_t first = cols < 32 - s ? cols : 32 - s;
      const __mmask32 m = first32(static_cast<int>(s + first)) & ~first32(s);
      __m512i xv[C];
      TANDEM_UNROLL
      for (int c = 0; c < C; ++c) xv[c] = _mm512_maskz_loadu_epi16(m, back(ac[c], s));
      TANDEM_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m512i wv = _mm512_maskz_loadu_epi16(m, back(wr[r], s));
        TANDEM_UNROLL
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)wv, (__m512bh)xv[c]);
      }
      k = first;
    }
    for (; k + 32 <= cols; k += 32) {
      TANDEM_UNROLL
      for (int r = 0; r < R; ++r) prefetch(wr[r] + k, pf);
      step<false>(wr, ac, k, 32, acc);
    }
    if (k < cols) step<true>(wr, ac, k, static_cast<int>(cols - k), acc);
    store_sums(acc, y, ldy);
  }
};

KernelTable make_avx512bf16_table() {
  KernelTable t = avx512_table();
  t.isa = Isa::avx512bf16;
  TypeKernels& k = t.types[static_cast<int>(WType::bf16)];
  k = entry<BF16DotTile512, kBF16_512>(k.quantize_act);
  return t;
}

}  // namespace

const KernelTable& avx512bf16_table() {
  static const KernelTable table = make_avx512bf16_table();
  return table;
}

}  // namespace tandem::kernels::detail
