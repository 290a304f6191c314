// Helpers of the SIMD kernels' tests (test_kernels.cc, test_kernels_packed.cc): the paths this machine runs, random
// and decoded weights and activations, the stated tolerance against the reference.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/types.h"

namespace tandem::kernels::testing {

using Bytes = std::vector<std::uint8_t>;

inline std::string tname(WType t) { return std::string(wtype_name(t)); }

// In the order of preference (detected_isa takes the last this machine runs).
constexpr Isa kAllIsas[] = {Isa::scalar, Isa::avx2, Isa::avxvnni, Isa::avx512, Isa::avx512bf16, Isa::amx};

// The ISAs this machine can run; the scalar path always. The first call says which paths will not run here (a
// machine without AVX-512 reports it rather than passing those checks silently).
inline std::vector<Isa> runnable_isas() {
  static const std::vector<Isa> v = [] {
    std::vector<Isa> r;
    std::string skipped;
    for (Isa i : kAllIsas) {
      if (isa_supported(i)) r.push_back(i);
      else skipped += std::string(skipped.empty() ? "" : ", ") + std::string(isa_name(i));
    }
    if (!skipped.empty())
      std::printf("NOT RUN on this machine (the CPU or the build lacks them): %s\n", skipped.c_str());
    return r;
  }();
  return v;
}

// Sets the ISA for one scope and restores the detected one.
class IsaScope {
 public:
  explicit IsaScope(Isa i) { set_isa_for_testing(i); }
  ~IsaScope() { set_isa_for_testing(detected_isa()); }
};

inline std::int64_t block_elems(WType t) { return traits(t).block_elems; }

// cols values for a type: 1..8 blocks for block types; tails around the 8-float SIMD width for float types.
inline std::vector<std::int64_t> test_cols(WType t) {
  if (block_elems(t) == 1) return {1, 3, 7, 8, 9, 15, 16, 17, 31, 64, 100, 257};
  std::vector<std::int64_t> v;
  for (std::int64_t b = 1; b <= 8; ++b) v.push_back(b * block_elems(t));
  return v;
}

inline std::vector<float> gaussian(std::mt19937& rng, std::size_t n, float sigma) {
  std::normal_distribution<float> nd(0.f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = nd(rng);
  return x;
}

// rows x cols weights of type t, quantized from Gaussian floats by the reference quantizer.
inline Bytes random_weights(std::mt19937& rng, WType t, std::int64_t rows, std::int64_t cols) {
  const std::vector<float> x = gaussian(rng, static_cast<std::size_t>(rows * cols), 0.05f);
  Bytes w(row_bytes(t, cols) * static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    quantize_row(t, x.data() + r * cols, w.data() + static_cast<std::size_t>(r) * row_bytes(t, cols), cols);
  }
  return w;
}

// n prepared activation rows of type t from Gaussian floats, by the reference.
inline Bytes random_acts(std::mt19937& rng, WType t, std::int64_t n, std::int64_t cols) {
  const std::vector<float> x = gaussian(rng, static_cast<std::size_t>(n * cols), 1.0f);
  Bytes a(act_row_bytes(t, cols) * static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    quantize_act_ref(t, x.data() + i * cols, a.data() + static_cast<std::size_t>(i) * act_row_bytes(t, cols), cols);
  }
  return a;
}

// Prepared activations decoded to doubles (every format's values are exact in double).
inline std::vector<double> decode_act(WType t, const std::uint8_t* act, std::int64_t cols) {
  std::vector<double> a(static_cast<std::size_t>(cols));
  if (traits(t).act == AType::q8_K) {
    const auto* b = reinterpret_cast<const BlockQ8_K*>(act);
    for (std::int64_t k = 0; k < cols; ++k) a[k] = static_cast<double>(b[k / QK_K].d) * b[k / QK_K].qs[k % QK_K];
    return a;
  }
  if (traits(t).act == AType::q8_1) {  // d · qs (s is their sum, for the weights' m)
    const auto* b = reinterpret_cast<const BlockQ8_1*>(act);
    for (std::int64_t k = 0; k < cols; ++k)
      a[k] = static_cast<double>(f16_to_f32(b[k / QK8_1].d)) * b[k / QK8_1].qs[k % QK8_1];
    return a;
  }
  // The other activation formats are laid out as a weight type: f32 / bf16 as themselves, q8_0 as q8_0, f16's as
  // f32 (f16-rounded values held as f32).
  const WType as = traits(t).act == AType::q8_0 ? WType::q8_0 : traits(t).act == AType::f16 ? WType::f32 : t;
  std::vector<float> f(static_cast<std::size_t>(cols));
  dequantize_row(as, act, f.data(), cols);
  for (std::int64_t k = 0; k < cols; ++k) a[k] = f[k];
  return a;
}

// The stated tolerance: |simd - ref| <= (cols + 64) * 2^-24 * S, with S = sum_k |w_k a_k| over the dequantized
// weights and decoded activations, plus, for q4_K / q5_K, sum_k 2 * 63 * |dmin_k| * |a_k| (their SIMD and reference
// sums both carry the scale and the min terms separately, each up to that size before they cancel); for q4_1 / q5_1
// the weight's magnitude is taken as 31 |d| + 2 |m| (the level term and the min term m · s, also summed apart). A bound of
// Higham's form for two summation orders of at most cols + 64 rounded operations each (cols / 8 lane steps, block
// scalings and the horizontal sums for SIMD; cols products and additions for the reference).
inline double tolerance(WType t, const std::uint8_t* w_row, const std::uint8_t* act, std::int64_t cols) {
  std::vector<float> wf(static_cast<std::size_t>(cols));
  dequantize_row(t, w_row, wf.data(), cols);
  const std::vector<double> a = decode_act(t, act, cols);
  const bool minned = t == WType::q4_K || t == WType::q5_K || t == WType::q2_K;
  const bool minned32 = t == WType::q4_1 || t == WType::q5_1;
  double m = 0;
  for (std::int64_t k = 0; k < cols; ++k) {
    double wmag = std::fabs(static_cast<double>(wf[k]));
    if (minned32) {  // q4_1 / q5_1: d · q and m summed apart (m at byte 2 of both blocks)
      const std::uint8_t* block = w_row + static_cast<std::size_t>(k / 32) * traits(t).block_bytes;
      std::uint16_t d, mn;
      std::memcpy(&d, block, 2);
      std::memcpy(&mn, block + 2, 2);
      wmag = 31.0 * std::fabs(static_cast<double>(f16_to_f32(d))) + 2.0 * std::fabs(static_cast<double>(f16_to_f32(mn)));
    }
    if (minned) {
      // d and dmin are the first two f16 fields of both block types (6-bit mins); q2_K's dmin is last (4-bit mins).
      const std::uint8_t* block = w_row + static_cast<std::size_t>(k / QK_K) * traits(t).block_bytes;
      std::uint16_t dmin;
      std::memcpy(&dmin, block + (t == WType::q2_K ? offsetof(BlockQ2_K, dmin) : 2), 2);
      wmag += 2.0 * (t == WType::q2_K ? 15.0 : 63.0) * std::fabs(static_cast<double>(f16_to_f32(dmin)));
    }
    m += wmag * std::fabs(a[k]);
  }
  return static_cast<double>(cols + 64) * std::ldexp(1.0, -24) * m;
}

inline bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

}  // namespace tandem::kernels::testing
