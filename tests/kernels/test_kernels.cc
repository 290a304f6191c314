// SIMD kernels and their dispatch (kernels.h) against the reference (quant.h): activation bytes equal to
// quantize_act_ref's, integer parts exact, floats within the stated summation-order tolerance, odd shapes, thread
// splits and batch rows bit-identical to single calls, and the TANDEM_KERNELS override. Each check runs for the
// scalar path and for every SIMD path this CPU has (the others are reported as not run).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/types.h"

namespace tandem::kernels {
namespace {

using Bytes = std::vector<std::uint8_t>;

std::string tname(WType t) { return std::string(wtype_name(t)); }

constexpr Isa kAllIsas[] = {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx};

// The ISAs this machine can run; the scalar path always. The first call says which paths will not run here (a
// machine without AVX-512 reports it rather than passing those checks silently).
std::vector<Isa> runnable_isas() {
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

std::int64_t block_elems(WType t) { return traits(t).block_elems; }

// cols values for a type: 1..8 blocks for block types; tails around the 8-float SIMD width for float types.
std::vector<std::int64_t> test_cols(WType t) {
  if (block_elems(t) == 1) return {1, 3, 7, 8, 9, 15, 16, 17, 31, 64, 100, 257};
  std::vector<std::int64_t> v;
  for (std::int64_t b = 1; b <= 8; ++b) v.push_back(b * block_elems(t));
  return v;
}

std::vector<float> gaussian(std::mt19937& rng, std::size_t n, float sigma) {
  std::normal_distribution<float> nd(0.f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = nd(rng);
  return x;
}

// rows x cols weights of type t, quantized from Gaussian floats by the reference quantizer.
Bytes random_weights(std::mt19937& rng, WType t, std::int64_t rows, std::int64_t cols) {
  const std::vector<float> x = gaussian(rng, static_cast<std::size_t>(rows * cols), 0.05f);
  Bytes w(row_bytes(t, cols) * static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    quantize_row(t, x.data() + r * cols, w.data() + static_cast<std::size_t>(r) * row_bytes(t, cols), cols);
  }
  return w;
}

// n prepared activation rows of type t from Gaussian floats, by the reference.
Bytes random_acts(std::mt19937& rng, WType t, std::int64_t n, std::int64_t cols) {
  const std::vector<float> x = gaussian(rng, static_cast<std::size_t>(n * cols), 1.0f);
  Bytes a(act_row_bytes(t, cols) * static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    quantize_act_ref(t, x.data() + i * cols, a.data() + static_cast<std::size_t>(i) * act_row_bytes(t, cols), cols);
  }
  return a;
}

// Prepared activations decoded to doubles (every format's values are exact in double).
std::vector<double> decode_act(WType t, const std::uint8_t* act, std::int64_t cols) {
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
  // The other activation formats are laid out as a weight type: f32 / f16 / bf16 as themselves, q8_0 as q8_0.
  const WType as = traits(t).act == AType::q8_0 ? WType::q8_0 : t;
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
double tolerance(WType t, const std::uint8_t* w_row, const std::uint8_t* act, std::int64_t cols) {
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

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// ---- dispatch -------------------------------------------------------------------------------------------------

TEST(KernelsDispatch, IsaNamesAndSelection) {
  EXPECT_EQ(isa_name(Isa::scalar), "scalar");
  EXPECT_EQ(isa_name(Isa::avx2), "avx2");
  EXPECT_EQ(isa_name(Isa::avx512), "avx512");
  EXPECT_EQ(isa_name(Isa::avx512bf16), "avx512bf16");
  EXPECT_EQ(isa_name(Isa::amx), "amx");
  set_isa_for_testing(Isa::scalar);
  EXPECT_EQ(active_isa(), Isa::scalar);
  for (Isa i : {Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx}) {
    set_isa_for_testing(i);
    EXPECT_EQ(active_isa(), isa_supported(i) ? i : detected_isa()) << isa_name(i);  // else the fallback
  }
  set_isa_for_testing(detected_isa());
  // The paths nest: each needs what the one before it needs.
  EXPECT_TRUE(isa_supported(Isa::scalar));
  if (isa_supported(Isa::amx)) {
    EXPECT_TRUE(isa_supported(Isa::avx512bf16));
  }
  if (isa_supported(Isa::avx512bf16)) {
    EXPECT_TRUE(isa_supported(Isa::avx512));
  }
  if (isa_supported(Isa::avx512)) {
    EXPECT_TRUE(isa_supported(Isa::avx2));
  }
  Isa best = Isa::scalar;
  for (Isa i : kAllIsas)
    if (isa_supported(i)) best = i;
  EXPECT_EQ(detected_isa(), best);
#if defined(__x86_64__)
  // F16C from CPUID leaf 1 (ECX bit 29): clang 14 has no "f16c" name for __builtin_cpu_supports.
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool f16c = __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
  const bool cpu_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  EXPECT_EQ(isa_supported(Isa::avx2), cpu_avx2);
  // GCC's own names for the AVX-512 features (the library reads CPUID itself).
  const bool cpu_avx512 = cpu_avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  EXPECT_EQ(isa_supported(Isa::avx512), cpu_avx512);
  EXPECT_EQ(isa_supported(Isa::avx512bf16), cpu_avx512 && __builtin_cpu_supports("avx512bf16"));
#endif
}

// TANDEM_KERNELS is read when the first kernel runs; each case runs in a fresh process (death-test child).
void expect_env_selects(const char* value, Isa expected) {
  SCOPED_TRACE(std::string("TANDEM_KERNELS=") + value);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("TANDEM_KERNELS", value, 1);
        std::exit(active_isa() == expected ? 0 : 3);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(KernelsDispatch, EnvironmentOverride) {
  expect_env_selects("scalar", Isa::scalar);
  for (Isa i : {Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx})
    expect_env_selects(std::string(isa_name(i)).c_str(), isa_supported(i) ? i : detected_isa());
  expect_env_selects("no-such-isa", detected_isa());
  expect_env_selects("", detected_isa());
}

// ---- activation quantization ----------------------------------------------------------------------------------

// Rows that probe the rounding rules: ties at .5 after scaling (q8_0 and q8_K activations both round them to even),
// equal magnitudes of both signs (q8_K takes the first), zero blocks, tiny and large values.
std::vector<std::vector<float>> probe_rows(std::mt19937& rng, std::int64_t cols) {
  std::vector<std::vector<float>> rows;
  rows.push_back(gaussian(rng, static_cast<std::size_t>(cols), 1.0f));
  rows.push_back(gaussian(rng, static_cast<std::size_t>(cols), 1e-3f));
  std::vector<float> ties(static_cast<std::size_t>(cols));
  std::uniform_int_distribution<int> level(-126, 126);
  for (std::int64_t k = 0; k < cols; ++k) {
    // Each 32-block has a largest magnitude of exactly 127, so d = 1 (q8_0) and iscale = +-1 (q8_K): x.5 are ties.
    ties[k] = (k % 32 == 5) ? (k % 64 == 5 ? 127.f : -127.f) : static_cast<float>(level(rng)) + 0.5f;
  }
  rows.push_back(ties);
  std::vector<float> both_signs = gaussian(rng, static_cast<std::size_t>(cols), 0.1f);
  for (std::int64_t k = 0; k < cols; k += 7) both_signs[k] = (k / 7) % 2 == 0 ? -3.f : 3.f;
  rows.push_back(both_signs);
  std::vector<float> zeros_then(static_cast<std::size_t>(cols), 0.f);
  for (std::int64_t k = cols / 2; k < cols; ++k) zeros_then[k] = static_cast<float>(k % 5) - 2.f;
  rows.push_back(zeros_then);
  std::vector<float> wide = gaussian(rng, static_cast<std::size_t>(cols), 1.0f);
  for (std::int64_t k = 0; k < cols; k += 3) wide[k] *= (k % 2 == 0) ? 3e4f : 1e-6f;
  rows.push_back(wide);
  return rows;
}

TEST(KernelsQuantizeAct, SimdBytesEqualReferenceBytes) {
  std::mt19937 rng(11);
  for (Isa isa : runnable_isas()) {
    IsaScope scope(isa);
    for (WType t : kAllWTypes) {
      for (std::int64_t cols : test_cols(t)) {
        SCOPED_TRACE(std::string(isa_name(isa)) + " " + tname(t) + " cols=" + std::to_string(cols));
        const auto rows = probe_rows(rng, cols);
        const std::size_t arb = act_row_bytes(t, cols);
        // All probe rows in one call, with a row stride larger than cols.
        const std::int64_t ldx = cols + 3;
        std::vector<float> x(rows.size() * static_cast<std::size_t>(ldx), 1e9f);
        for (std::size_t i = 0; i < rows.size(); ++i) std::copy(rows[i].begin(), rows[i].end(), &x[i * ldx]);
        Bytes got(arb * rows.size() + 16, 0xA5);
        quantize_act(t, x.data(), ldx, static_cast<std::int64_t>(rows.size()), cols, got.data());
        for (std::size_t i = 0; i < rows.size(); ++i) {
          Bytes want(arb, 0x5A);
          quantize_act_ref(t, rows[i].data(), want.data(), cols);
          EXPECT_EQ(0, std::memcmp(want.data(), got.data() + i * arb, arb)) << "row " << i;
        }
        for (std::size_t b = arb * rows.size(); b < got.size(); ++b) ASSERT_EQ(got[b], 0xA5) << "wrote past the end";
      }
    }
  }
}

TEST(KernelsQuantizeAct, HalfFloatSpecialValuesEqualReference) {
  const float nan_payload = std::bit_cast<float>(0x7FA12345u);
  const float neg_nan = std::bit_cast<float>(0xFFC00001u);
  const std::vector<float> specials = {0.f,      -0.f,     65504.f,  65519.f, 65520.f, 1e9f,     -1e9f,
                                       6e-8f,    3e-8f,    2.98e-8f, 1e-5f,   -1e-6f,  1e-40f,   -1e-39f,
                                       3.4e38f,  -3.4e38f, 1.0f / 3, 2.5f,    nan_payload, neg_nan,
                                       std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                       1.00390625f, 1.0009765625f};
  std::vector<float> x;
  for (int rep = 0; rep < 3; ++rep) x.insert(x.end(), specials.begin(), specials.end());
  const auto cols = static_cast<std::int64_t>(x.size());
  for (Isa isa : runnable_isas()) {
    IsaScope scope(isa);
    for (WType t : {WType::f16, WType::bf16}) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " " + tname(t));
      Bytes want(act_row_bytes(t, cols));
      Bytes got(act_row_bytes(t, cols));
      quantize_act_ref(t, x.data(), want.data(), cols);
      quantize_act(t, x.data(), cols, 1, cols, got.data());
      EXPECT_EQ(want, got);
    }
  }
}

// ---- dot products ---------------------------------------------------------------------------------------------

TEST(KernelsMatmul, DecodeMatchesReferenceWithinTolerance) {
  std::mt19937 rng(21);
  double worst = 0;  // largest |simd - ref| / tolerance seen, reported as a test property
  for (Isa isa : runnable_isas()) {
    IsaScope scope(isa);
    for (WType t : kAllWTypes) {
      for (std::int64_t cols : test_cols(t)) {
        SCOPED_TRACE(std::string(isa_name(isa)) + " " + tname(t) + " cols=" + std::to_string(cols));
        const std::int64_t rows = 11;
        const Bytes w = random_weights(rng, t, rows, cols);
        const Bytes a = random_acts(rng, t, 1, cols);
        std::vector<float> y(static_cast<std::size_t>(rows));
        matmul_rows(t, w.data(), cols, a.data(), 1, y.data(), rows, 0, rows);
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::uint8_t* wr = w.data() + static_cast<std::size_t>(r) * row_bytes(t, cols);
          const float ref = vec_dot_ref(t, cols, wr, a.data());
          if (isa == Isa::scalar) {
            EXPECT_TRUE(same_bits(ref, y[r])) << "row " << r << ": the scalar path is the reference";
          } else {
            const double tol = tolerance(t, wr, a.data(), cols);
            EXPECT_NEAR(y[r], ref, tol) << "row " << r;
            if (tol > 0) worst = std::max(worst, std::fabs(static_cast<double>(y[r]) - ref) / tol);
          }
        }
      }
    }
  }
  RecordProperty("worst_error_over_tolerance", std::to_string(worst));
  std::printf("worst |simd - ref| / tolerance over the SIMD paths: %.3g\n", worst);
}

// The SIMD paths differ from each other only in the float summation order: for every type, every pair of paths
// this machine runs agrees within twice the stated tolerance (each is within it of the reference); the largest
// difference seen, relative to the tolerance, is printed per pair (docs/kernels.md, "Paths and their differences").
TEST(KernelsMatmul, PathsAgreeWithinTheirTolerance) {
  std::vector<Isa> simd;
  for (Isa i : runnable_isas())
    if (i != Isa::scalar) simd.push_back(i);
  if (simd.size() < 2) GTEST_SKIP() << "fewer than two SIMD paths run on this machine";
  std::mt19937 rng(23);
  std::vector<double> worst(simd.size() * simd.size(), 0.0);
  for (WType t : kAllWTypes) {
    for (std::int64_t cols : test_cols(t)) {
      const std::int64_t rows = 9, n = 5;
      const Bytes w = random_weights(rng, t, rows, cols);
      const Bytes a = random_acts(rng, t, n, cols);
      std::vector<std::vector<float>> y(simd.size(), std::vector<float>(static_cast<std::size_t>(rows * n)));
      for (std::size_t p = 0; p < simd.size(); ++p) {
        IsaScope scope(simd[p]);
        matmul_rows(t, w.data(), cols, a.data(), n, y[p].data(), rows, 0, rows);
      }
      for (std::int64_t i = 0; i < n; ++i) {
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::uint8_t* wr = w.data() + static_cast<std::size_t>(r) * row_bytes(t, cols);
          const std::uint8_t* ai = a.data() + static_cast<std::size_t>(i) * act_row_bytes(t, cols);
          const double tol = tolerance(t, wr, ai, cols);
          for (std::size_t p = 0; p < simd.size(); ++p) {
            for (std::size_t q = p + 1; q < simd.size(); ++q) {
              const double d = std::fabs(static_cast<double>(y[p][i * rows + r]) - y[q][i * rows + r]);
              EXPECT_LE(d, 2 * tol) << tname(t) << " cols=" << cols << " " << isa_name(simd[p]) << " vs "
                                    << isa_name(simd[q]);
              if (tol > 0) worst[p * simd.size() + q] = std::max(worst[p * simd.size() + q], d / tol);
            }
          }
        }
      }
    }
  }
  for (std::size_t p = 0; p < simd.size(); ++p)
    for (std::size_t q = p + 1; q < simd.size(); ++q)
      std::printf("worst |%s - %s| / tolerance: %.3g\n", std::string(isa_name(simd[p])).c_str(),
                  std::string(isa_name(simd[q])).c_str(), worst[p * simd.size() + q]);
}

// The AMX path computes the 32-element block types with q8_0 activations in the reference's own order and roundings
// (an exact integer per block, then sum += float(sumi) * (d_w * d_a)): equal to vec_dot_ref bit for bit, decode and
// prefill, from the packed side table and from the rows, short and long rows (longer than the 1,024 columns a
// prefill pass and the 8,192 a decode pass cover at a time), partial groups of weight and activation rows.
TEST(KernelsMatmul, AmxBlockTypesEqualTheReferenceBitForBit) {
  if (!isa_supported(Isa::amx)) GTEST_SKIP() << "NOT RUN: this CPU (or kernel) gives no AMX-INT8";
  IsaScope scope(Isa::amx);
  std::mt19937 rng(29);
  for (WType t : {WType::q8_0, WType::q4_0, WType::q5_0, WType::iq4_nl}) {
    for (std::int64_t cols : {32, 96, 768, 4096, 4160, 8224}) {
      // 21 rows: part of a call's four 16-row groups; 85: two calls, the second's last group short.
      for (std::int64_t rows : {21, 85}) {
        for (std::int64_t n : {1, 2, 3, 16, 17, 40}) {
          SCOPED_TRACE(tname(t) + " cols=" + std::to_string(cols) + " rows=" + std::to_string(rows) +
                       " n=" + std::to_string(n));
          const Bytes w = random_weights(rng, t, rows, cols);
          const Bytes a = random_acts(rng, t, n, cols);
          std::vector<float> y(static_cast<std::size_t>(rows * n));
          matmul_rows(t, w.data(), cols, a.data(), n, y.data(), rows, 0, rows);
          // With the side table — the matrix packed in 16-row groups: the matrix's bytes in whole groups and 32
          // more per group and block — (the engine's case: ranges on group boundaries), split at a group boundary;
          // and a range that starts inside a group, whose tiles read the rows instead.
          const std::size_t aux = aux_bytes(t, rows, cols);
          ASSERT_EQ(aux, static_cast<std::size_t>((rows + 15) / 16) * (16 * row_bytes(t, cols) + 32 * (cols / 32)));
          Bytes x(aux, 0xEE);
          prepare_aux(t, w.data(), rows, cols, x.data());
          std::vector<float> yx(static_cast<std::size_t>(rows * n), -1.f);
          matmul_rows(t, w.data(), cols, a.data(), n, yx.data(), rows, 0, 16, x.data());
          matmul_rows(t, w.data(), cols, a.data(), n, yx.data(), rows, 16, rows, x.data());
          ASSERT_EQ(0, std::memcmp(y.data(), yx.data(), y.size() * sizeof(float))) << "the side table changed a result";
          std::vector<float> yu(static_cast<std::size_t>(rows * n), -1.f);
          matmul_rows(t, w.data(), cols, a.data(), n, yu.data(), rows, 0, 5, x.data());
          matmul_rows(t, w.data(), cols, a.data(), n, yu.data(), rows, 5, rows, x.data());
          ASSERT_EQ(0, std::memcmp(y.data(), yu.data(), y.size() * sizeof(float))) << "a range inside a group differs";
          for (std::int64_t i = 0; i < n; ++i) {
            for (std::int64_t r = 0; r < rows; ++r) {
              const float ref = vec_dot_ref(t, cols, w.data() + static_cast<std::size_t>(r) * row_bytes(t, cols),
                                            a.data() + static_cast<std::size_t>(i) * act_row_bytes(t, cols));
              ASSERT_TRUE(same_bits(y[i * rows + r], ref))
                  << "act " << i << " row " << r << ": " << y[i * rows + r] << " vs " << ref;
            }
          }
        }
      }
    }
  }
}

// Blocks whose scales are 1 and whose levels are small: every partial sum is an integer below 2^24, so any
// summation order is exact and the SIMD result must equal the reference bit for bit. This pins the integer parts
// (unpacking, signs, scales, mins, bsums) independently of float rounding.
Bytes unit_scale_weights(std::mt19937& rng, WType t, std::int64_t rows, std::int64_t cols) {
  const std::uint16_t one = f32_to_f16(1.0f);
  Bytes w(row_bytes(t, cols) * static_cast<std::size_t>(rows));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : w) b = static_cast<std::uint8_t>(byte(rng));
  const std::int64_t nblocks = rows * cols / block_elems(t);
  switch (t) {
    case WType::f32:
    case WType::f16:
    case WType::bf16: {
      std::uniform_int_distribution<int> v(-100, 100);
      std::vector<float> f(static_cast<std::size_t>(cols));
      for (std::int64_t r = 0; r < rows; ++r) {
        for (float& x : f) x = static_cast<float>(v(rng));
        quantize_row(t, f.data(), w.data() + static_cast<std::size_t>(r) * row_bytes(t, cols), cols);
      }
      break;
    }
    case WType::q8_0:  // levels anywhere in [-128, 127], including -128
      for (std::int64_t i = 0; i < nblocks; ++i) reinterpret_cast<BlockQ8_0*>(w.data())[i].d = one;
      break;
    case WType::q4_0:
      for (std::int64_t i = 0; i < nblocks; ++i) reinterpret_cast<BlockQ4_0*>(w.data())[i].d = one;
      break;
    case WType::q5_0:  // levels 0..31, every fifth-bit pattern
      for (std::int64_t i = 0; i < nblocks; ++i) reinterpret_cast<BlockQ5_0*>(w.data())[i].d = one;
      break;
    case WType::iq4_nl:  // every index, so every table level
      for (std::int64_t i = 0; i < nblocks; ++i) reinterpret_cast<BlockIQ4_NL*>(w.data())[i].d = one;
      break;
    case WType::iq4_xs:  // random 6-bit sub-block scales (-32..31), every index
      for (std::int64_t i = 0; i < nblocks; ++i) reinterpret_cast<BlockIQ4_XS*>(w.data())[i].d = one;
      break;
    case WType::q2_K:  // random 4-bit scales and mins, every level
      for (std::int64_t i = 0; i < nblocks; ++i) {
        auto& b = reinterpret_cast<BlockQ2_K*>(w.data())[i];
        b.d = one;
        b.dmin = one;
      }
      break;
    case WType::q3_K:  // random 6-bit signed scales, every level and third bit
      for (std::int64_t i = 0; i < nblocks; ++i) reinterpret_cast<BlockQ3_K*>(w.data())[i].d = one;
      break;
    case WType::q4_1:  // m = 0: the min term (m · s, s a rounded f16) would not be an integer
      for (std::int64_t i = 0; i < nblocks; ++i) {
        auto& b = reinterpret_cast<BlockQ4_1*>(w.data())[i];
        b.d = one;
        b.m = 0;
      }
      break;
    case WType::q5_1:
      for (std::int64_t i = 0; i < nblocks; ++i) {
        auto& b = reinterpret_cast<BlockQ5_1*>(w.data())[i];
        b.d = one;
        b.m = 0;
      }
      break;
    case WType::q4_K:
      for (std::int64_t i = 0; i < nblocks; ++i) {
        auto& b = reinterpret_cast<BlockQ4_K*>(w.data())[i];
        b.d = one;
        b.dmin = one;
      }
      break;
    case WType::q5_K:
      for (std::int64_t i = 0; i < nblocks; ++i) {
        auto& b = reinterpret_cast<BlockQ5_K*>(w.data())[i];
        b.d = one;
        b.dmin = one;
      }
      break;
    case WType::q6_K: {
      std::uniform_int_distribution<int> sc(-64, 63);
      for (std::int64_t i = 0; i < nblocks; ++i) {
        auto& b = reinterpret_cast<BlockQ6_K*>(w.data())[i];
        b.d = one;
        for (auto& s : b.scales) s = static_cast<std::int8_t>(sc(rng));
      }
      break;
    }
  }
  return w;
}

Bytes unit_scale_acts(std::mt19937& rng, WType t, std::int64_t n, std::int64_t cols) {
  const std::size_t arb = act_row_bytes(t, cols);
  Bytes a(arb * static_cast<std::size_t>(n));
  switch (traits(t).act) {
    case AType::f32:
    case AType::f16:
    case AType::bf16: {
      std::uniform_int_distribution<int> v(-100, 100);
      std::vector<float> f(static_cast<std::size_t>(cols));
      for (std::int64_t i = 0; i < n; ++i) {
        for (float& x : f) x = static_cast<float>(v(rng));
        quantize_act_ref(t, f.data(), a.data() + static_cast<std::size_t>(i) * arb, cols);
      }
      break;
    }
    case AType::q8_1: {  // (q4_1 / q5_1 weights with m = 0: s is not used, but set as the format says)
      std::uniform_int_distribution<int> v(-127, 127);
      auto* b = reinterpret_cast<BlockQ8_1*>(a.data());
      for (std::int64_t i = 0; i < n * cols / QK8_1; ++i) {
        b[i].d = f32_to_f16(1.0f);
        int sum = 0;
        for (auto& q : b[i].qs) sum += q = static_cast<std::int8_t>(v(rng));
        b[i].s = f32_to_f16(static_cast<float>(sum));
      }
      break;
    }
    case AType::q8_0: {
      std::uniform_int_distribution<int> v(-127, 127);
      auto* b = reinterpret_cast<BlockQ8_0*>(a.data());
      for (std::int64_t i = 0; i < n * cols / QK8_0; ++i) {
        b[i].d = f32_to_f16(1.0f);
        for (auto& q : b[i].qs) q = static_cast<std::int8_t>(v(rng));
      }
      break;
    }
    case AType::q8_K: {
      std::uniform_int_distribution<int> v(-3, 3);
      auto* b = reinterpret_cast<BlockQ8_K*>(a.data());
      for (std::int64_t i = 0; i < n * cols / QK_K; ++i) {
        b[i].d = 1.0f;
        for (auto& q : b[i].qs) q = static_cast<std::int8_t>(v(rng));
        for (int g = 0; g < QK_K / 16; ++g) {
          int s = 0;
          for (int k = 0; k < 16; ++k) s += b[i].qs[16 * g + k];
          b[i].bsums[g] = static_cast<std::int16_t>(s);
        }
      }
      break;
    }
  }
  return a;
}

TEST(KernelsMatmul, IntegerPartsAreExact) {
  std::mt19937 rng(31);
  for (Isa isa : runnable_isas()) {
    IsaScope scope(isa);
    for (WType t : kAllWTypes) {
      for (std::int64_t cols : test_cols(t)) {
        SCOPED_TRACE(std::string(isa_name(isa)) + " " + tname(t) + " cols=" + std::to_string(cols));
        const std::int64_t rows = 5;
        const std::int64_t n = 3;
        const Bytes w = unit_scale_weights(rng, t, rows, cols);
        const Bytes a = unit_scale_acts(rng, t, n, cols);
        std::vector<float> y(static_cast<std::size_t>(rows * n));
        matmul_rows(t, w.data(), cols, a.data(), n, y.data(), rows, 0, rows);
        for (std::int64_t i = 0; i < n; ++i) {
          for (std::int64_t r = 0; r < rows; ++r) {
            const float ref = vec_dot_ref(t, cols, w.data() + static_cast<std::size_t>(r) * row_bytes(t, cols),
                                          a.data() + static_cast<std::size_t>(i) * act_row_bytes(t, cols));
            ASSERT_EQ(ref, std::nearbyint(ref)) << "the fixture must give an integer";
            EXPECT_EQ(y[i * rows + r], ref) << "act " << i << " row " << r;
          }
        }
      }
    }
  }
}

// Row i of an n-row product equals the 1-row product of activation i, bit for bit, for every shape; the output
// stride is honoured and nothing outside [r0, r1) is written.
TEST(KernelsMatmul, BatchRowsEqualSingleRowsBitForBit) {
  std::mt19937 rng(41);
  const std::vector<std::int64_t> row_counts = {1, 2, 3, 4, 5, 6, 7, 9, 13, 33};
  for (Isa isa : runnable_isas()) {
    IsaScope scope(isa);
    for (WType t : kAllWTypes) {
      const auto cols_list = test_cols(t);
      for (std::size_t ci = 0; ci < cols_list.size(); ci += (isa == Isa::scalar ? 3 : 1)) {
        const std::int64_t cols = cols_list[ci];
        for (std::int64_t rows : row_counts) {
          const Bytes w = random_weights(rng, t, rows, cols);
          const Bytes a = random_acts(rng, t, 7, cols);
          const std::size_t arb = act_row_bytes(t, cols);
          for (std::int64_t n = 1; n <= 7; ++n) {
            SCOPED_TRACE(std::string(isa_name(isa)) + " " + tname(t) + " cols=" + std::to_string(cols) +
                         " rows=" + std::to_string(rows) + " n=" + std::to_string(n));
            const std::int64_t ldy = rows + 2;
            std::vector<float> y(static_cast<std::size_t>(n * ldy), -7.f);
            matmul_rows(t, w.data(), cols, a.data(), n, y.data(), ldy, 0, rows);
            for (std::int64_t i = 0; i < n; ++i) {
              std::vector<float> y1(static_cast<std::size_t>(rows));
              matmul_rows(t, w.data(), cols, a.data() + static_cast<std::size_t>(i) * arb, 1, y1.data(), rows, 0,
                          rows);
              for (std::int64_t r = 0; r < rows; ++r) {
                ASSERT_TRUE(same_bits(y[i * ldy + r], y1[r]))
                    << "act " << i << " row " << r << ": " << y[i * ldy + r] << " vs " << y1[r];
              }
              ASSERT_EQ(y[i * ldy + rows], -7.f);
              ASSERT_EQ(y[i * ldy + rows + 1], -7.f);
            }
          }
        }
      }
    }
  }
}

// Splitting the rows into 1-4 disjoint ranges (run on as many threads, as the engine's WorkerPool does) gives the
// same floats as one call; so does every two-way cut.
TEST(KernelsMatmul, ThreadSplitsEqualOneCall) {
  std::mt19937 rng(51);
  for (Isa isa : runnable_isas()) {
    IsaScope scope(isa);
    for (WType t : kAllWTypes) {
      const std::int64_t cols = block_elems(t) == 1 ? 37 : 2 * block_elems(t);
      const std::int64_t rows = 23;
      const Bytes w = random_weights(rng, t, rows, cols);
      for (std::int64_t n : {1, 5}) {
        SCOPED_TRACE(std::string(isa_name(isa)) + " " + tname(t) + " n=" + std::to_string(n));
        const Bytes a = random_acts(rng, t, n, cols);
        std::vector<float> whole(static_cast<std::size_t>(n * rows));
        matmul_rows(t, w.data(), cols, a.data(), n, whole.data(), rows, 0, rows);
        for (std::int64_t cut = 0; cut <= rows; ++cut) {
          std::vector<float> y(static_cast<std::size_t>(n * rows), -1.f);
          matmul_rows(t, w.data(), cols, a.data(), n, y.data(), rows, 0, cut);
          matmul_rows(t, w.data(), cols, a.data(), n, y.data(), rows, cut, rows);
          ASSERT_EQ(0, std::memcmp(y.data(), whole.data(), y.size() * sizeof(float))) << "cut " << cut;
        }
        for (int threads = 1; threads <= 4; ++threads) {
          for (int trial = 0; trial < 5; ++trial) {
            std::vector<std::int64_t> cuts = {0, rows};
            std::uniform_int_distribution<std::int64_t> pos(0, rows);
            for (int k = 1; k < threads; ++k) cuts.push_back(pos(rng));
            std::sort(cuts.begin(), cuts.end());
            std::vector<float> y(static_cast<std::size_t>(n * rows), -1.f);
            std::vector<std::thread> pool;
            for (int k = 0; k < threads; ++k) {
              pool.emplace_back([&, k] {
                matmul_rows(t, w.data(), cols, a.data(), n, y.data(), rows, cuts[k], cuts[k + 1]);
              });
            }
            for (auto& th : pool) th.join();
            ASSERT_EQ(0, std::memcmp(y.data(), whole.data(), y.size() * sizeof(float)))
                << threads << " threads, trial " << trial;
          }
        }
      }
    }
  }
}

// Prefill shapes larger than one cache block (many rows, n > the register tile) agree with the reference.
TEST(KernelsMatmul, LargePrefillMatchesReference) {
  std::mt19937 rng(61);
  for (Isa isa : runnable_isas()) {
    if (isa == Isa::scalar) continue;  // the scalar path is the reference itself (checked above)
    IsaScope scope(isa);
    for (WType t : kAllWTypes) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " " + tname(t));
      const std::int64_t cols = block_elems(t) == 1 ? 520 : 2 * QK_K;
      const std::int64_t rows = 1 + static_cast<std::int64_t>(400 * 1024 / row_bytes(t, cols));
      const std::int64_t n = 9;
      const Bytes w = random_weights(rng, t, rows, cols);
      const Bytes a = random_acts(rng, t, n, cols);
      std::vector<float> y(static_cast<std::size_t>(n * rows));
      matmul_rows(t, w.data(), cols, a.data(), n, y.data(), rows, 0, rows);
      for (std::int64_t i = 0; i < n; ++i) {
        for (std::int64_t r = 0; r < rows; r += 7) {
          const std::uint8_t* wr = w.data() + static_cast<std::size_t>(r) * row_bytes(t, cols);
          const std::uint8_t* ai = a.data() + static_cast<std::size_t>(i) * act_row_bytes(t, cols);
          ASSERT_NEAR(y[i * rows + r], vec_dot_ref(t, cols, wr, ai), tolerance(t, wr, ai, cols))
              << "act " << i << " row " << r;
        }
      }
    }
  }
}

// The side tables (packed copies of the matrix) and where they are asked for: the amx path's 32-element block types,
// and the super-block types (q2_K .. q6_K, iq4_xs), q4_1 and q5_1 on every AVX-512 path; every other path and type
// reads the matrix alone.
bool packed_on(Isa isa, WType t) {
  const bool amx_type = t == WType::q8_0 || t == WType::q4_0 || t == WType::q5_0 || t == WType::iq4_nl;
  const bool avx512 = isa == Isa::avx512 || isa == Isa::avx512bf16 || isa == Isa::amx;
  const bool packed_k = t == WType::q4_K || t == WType::q5_K || t == WType::q6_K || t == WType::q2_K ||
                        t == WType::q3_K || t == WType::iq4_xs || t == WType::q4_1 || t == WType::q5_1;
  return (isa == Isa::amx && amx_type) || (avx512 && packed_k);
}

TEST(KernelsMatmul, SideTablesOnlyWhereAsked) {
  for (Isa isa : runnable_isas()) {
    IsaScope scope(isa);
    for (WType t : kAllWTypes) {
      const std::int64_t cols = block_elems(t) == 1 ? 64 : 2 * QK_K;
      EXPECT_EQ(aux_bytes(t, 33, cols) > 0, packed_on(isa, t)) << isa_name(isa) << " " << tname(t);
    }
  }
}

// The super-block types, q4_1 and q5_1 on the AVX-512 paths' packed copies compute the reference's integers exactly
// and its float step in its order (e.g. sum += d * float(isum) - dmin * float(msum)): equal to vec_dot_ref bit for
// bit, decode and prefill, partial groups, two calls, 1 to 8 activations per call; from the rows (the tiles of the
// table the packed entry replaced) within their tolerance.
TEST(KernelsMatmul, PackedCopiesEqualTheReferenceBitForBit) {
  std::vector<Isa> isas;
  for (Isa isa : runnable_isas())
    if (packed_on(isa, WType::q4_K)) isas.push_back(isa);
  if (isas.empty()) GTEST_SKIP() << "NOT RUN: this CPU has no AVX-512 VNNI path";
  std::mt19937 rng(31);
  std::vector<std::pair<Isa, WType>> cases;
  for (Isa isa : isas)
    for (WType t : {WType::q4_K, WType::q5_K, WType::q6_K, WType::q2_K, WType::q3_K, WType::iq4_xs, WType::q4_1,
                    WType::q5_1})
      cases.emplace_back(isa, t);
  for (const auto& [isa, t] : cases) {
    IsaScope scope(isa);
    for (std::int64_t cols : {256, 768, 4096}) {
      for (std::int64_t rows : {21, 85}) {
        for (std::int64_t n : {1, 3, 8, 9, 20}) {
          SCOPED_TRACE(std::string(isa_name(isa)) + " " + tname(t) + " cols=" + std::to_string(cols) +
                       " rows=" + std::to_string(rows) + " n=" + std::to_string(n));
          const Bytes w = random_weights(rng, t, rows, cols);
          const Bytes a = random_acts(rng, t, n, cols);
          const std::size_t aux = aux_bytes(t, rows, cols);
          // Per group: 16 rows' bytes and per super-block the layout's growth (q4_K, q5_K and q3_K 64, iq4_xs 32).
          const std::size_t growth = t == WType::q4_K || t == WType::q5_K || t == WType::q3_K ? 64
                                     : t == WType::iq4_xs                                    ? 32
                                                                                             : 0;
          ASSERT_EQ(aux, static_cast<std::size_t>((rows + 15) / 16) * (16 * row_bytes(t, cols) + growth * (cols / QK_K)));
          Bytes x(aux, 0xEE);
          prepare_aux(t, w.data(), rows, cols, x.data());
          std::vector<float> y(static_cast<std::size_t>(rows * n), -1.f);
          matmul_rows(t, w.data(), cols, a.data(), n, y.data(), rows, 0, 16, x.data());
          matmul_rows(t, w.data(), cols, a.data(), n, y.data(), rows, 16, rows, x.data());
          for (std::int64_t i = 0; i < n; ++i) {
            for (std::int64_t r = 0; r < rows; ++r) {
              const float ref = vec_dot_ref(t, cols, w.data() + static_cast<std::size_t>(r) * row_bytes(t, cols),
                                            a.data() + static_cast<std::size_t>(i) * act_row_bytes(t, cols));
              ASSERT_TRUE(same_bits(y[i * rows + r], ref))
                  << "act " << i << " row " << r << ": " << y[i * rows + r] << " vs " << ref;
            }
          }
          // A range inside a group reads the rows (the replaced tiles): within their tolerance of the same values.
          std::vector<float> yu(static_cast<std::size_t>(rows * n), -1.f);
          matmul_rows(t, w.data(), cols, a.data(), n, yu.data(), rows, 0, 5, x.data());
          matmul_rows(t, w.data(), cols, a.data(), n, yu.data(), rows, 5, rows, x.data());
          for (std::int64_t i = 0; i < n; ++i) {
            for (std::int64_t r = 0; r < rows; ++r) {
              const std::uint8_t* wr = w.data() + static_cast<std::size_t>(r) * row_bytes(t, cols);
              const std::uint8_t* ai = a.data() + static_cast<std::size_t>(i) * act_row_bytes(t, cols);
              ASSERT_NEAR(yu[i * rows + r], y[i * rows + r], tolerance(t, wr, ai, cols)) << "act " << i << " row " << r;
            }
          }
        }
      }
    }
  }
}

// attention_decode on every path against the reference (double sums, std::exp): grouped heads, head sizes with and
// without a partial vector (20, 80, 96) and beyond the SIMD paths' 256 (the reference then), a sliding window, soft
// capping, large scores (exp's range), positions read through shuffled pool slots — the other pool rows hold NaN, so
// a read outside the item's slots shows.
TEST(KernelsAttention, EveryPathMatchesTheReference) {
  struct Case {
    std::int64_t heads, kv_heads, hd, pos, window;
    float cap, spread;
  };
  const Case cases[] = {{4, 4, 64, 0, 0, 0.F, 1.F},   {8, 2, 64, 37, 0, 0.F, 1.F},  {6, 3, 80, 300, 0, 0.F, 1.F},
                        {4, 1, 96, 129, 16, 0.F, 1.F}, {2, 2, 256, 70, 0, 50.F, 1.F}, {3, 3, 20, 9, 4, 0.F, 1.F},
                        {2, 1, 64, 200, 0, 0.F, 8.F},  {2, 2, 320, 33, 0, 0.F, 1.F}};
  std::mt19937 rng(41);
  std::normal_distribution<float> g(0.F, 1.F);
  for (Isa isa : runnable_isas()) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " heads=" + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) +
                   " hd=" + std::to_string(c.hd) + " pos=" + std::to_string(c.pos));
      const std::int64_t row = c.kv_heads * c.hd, slots_n = 2 * (c.pos + 1) + 3;
      std::vector<float> k(static_cast<std::size_t>(slots_n * row), std::nanf("")), v = k;
      std::vector<std::int64_t> perm(static_cast<std::size_t>(slots_n));
      for (std::int64_t i = 0; i < slots_n; ++i) perm[static_cast<std::size_t>(i)] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      const std::vector<std::int64_t> slots(perm.begin(), perm.begin() + c.pos + 1);
      for (std::int64_t s : slots)
        for (std::int64_t e = 0; e < row; ++e) {
          k[static_cast<std::size_t>(s * row + e)] = g(rng) * c.spread;
          v[static_cast<std::size_t>(s * row + e)] = g(rng);
        }
      std::vector<float> q(static_cast<std::size_t>(c.heads * c.hd));
      for (auto& x : q) x = g(rng);
      const float scale = 1.F / std::sqrt(static_cast<float>(c.hd));
      std::vector<float> scratch(static_cast<std::size_t>(c.pos + 1)), out(q.size()), ref(q.size());
      {
        IsaScope reference(Isa::scalar);
        attention_decode(q.data(), c.heads, c.kv_heads, c.hd, k.data(), v.data(), slots.data(), c.pos, c.window,
                         scale, c.cap, scratch.data(), ref.data());
      }
      {
        IsaScope scope(isa);
        attention_decode(q.data(), c.heads, c.kv_heads, c.hd, k.data(), v.data(), slots.data(), c.pos, c.window,
                         scale, c.cap, scratch.data(), out.data());
      }
      for (std::size_t i = 0; i < out.size(); ++i) {
        ASSERT_TRUE(std::isfinite(ref[i]));
        ASSERT_NEAR(out[i], ref[i], 2e-5 * (1.0 + std::fabs(ref[i]))) << "element " << i;
      }
    }
  }
}

TEST(KernelsMatmul, EmptyRangesWriteNothing) {
  std::mt19937 rng(71);
  for (Isa isa : runnable_isas()) {
    IsaScope scope(isa);
    const Bytes w = random_weights(rng, WType::q8_0, 4, 32);
    const Bytes a = random_acts(rng, WType::q8_0, 2, 32);
    std::vector<float> y(8, -3.f);
    matmul_rows(WType::q8_0, w.data(), 32, a.data(), 2, y.data(), 4, 2, 2);
    matmul_rows(WType::q8_0, w.data(), 32, a.data(), 2, y.data(), 4, 3, 1);
    matmul_rows(WType::q8_0, w.data(), 32, a.data(), 0, y.data(), 4, 0, 4);
    for (float v : y) EXPECT_EQ(v, -3.f);
  }
}

}  // namespace
}  // namespace tandem::kernels
