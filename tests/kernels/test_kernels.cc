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

#include "kernel_test_util.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/types.h"

namespace tandem::kernels {
namespace {

using namespace tandem::kernels::testing;

// ---- dispatch -------------------------------------------------------------------------------------------------

TEST(KernelsDispatch, IsaNamesAndSelection) {
  EXPECT_EQ(isa_name(Isa::scalar), "scalar");
  EXPECT_EQ(isa_name(Isa::avx2), "avx2");
  EXPECT_EQ(isa_name(Isa::avx512), "avx512");
  EXPECT_EQ(isa_name(Isa::avx512bf16), "avx512bf16");
  EXPECT_EQ(isa_name(Isa::amx), "amx");
  EXPECT_EQ(isa_name(Isa::avxvnni), "avxvnni");
  set_isa_for_testing(Isa::scalar);
  EXPECT_EQ(active_isa(), Isa::scalar);
  for (Isa i : {Isa::avx2, Isa::avxvnni, Isa::avx512, Isa::avx512bf16, Isa::amx}) {
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
  if (isa_supported(Isa::avxvnni)) {  // not implied by AVX-512 (Ice Lake has AVX512-VNNI only), nor implying it
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

// f32_to_f16_row (the KV pool's rows) on every path: f32_to_f16 of each element, the special values above and
// random ones, lengths around the 8-lane vectors.
TEST(KernelsQuantizeAct, HalfRowsEqualF32ToF16OnEveryPath) {
  const float nan_payload = std::bit_cast<float>(0x7FA12345u);
  std::vector<float> x = {0.f, -0.f, 65504.f, 65519.f, 65520.f, 1e9f, 6e-8f, 3e-8f, 2.98e-8f, -1e-6f, 1e-40f,
                          nan_payload, std::bit_cast<float>(0xFFC00001u), std::numeric_limits<float>::infinity(),
                          1.00390625f, 1.0009765625f};
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.F, 4.F);
  while (x.size() < 1000) x.push_back(g(rng));
  for (Isa isa : runnable_isas()) {
    IsaScope scope(isa);
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{9}, std::size_t{16},
                          std::size_t{777}, x.size()}) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " n=" + std::to_string(n));
      std::vector<std::uint16_t> got(n + 1, 0xABCD);
      f32_to_f16_row(x.data(), got.data(), static_cast<std::int64_t>(n));
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], f32_to_f16(x[i])) << "element " << i;
      EXPECT_EQ(got[n], 0xABCD) << "wrote past n";
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

// Float weight rows at every offset past a cache line (a GGUF tensor lies on a 32-byte boundary, a safetensors
// file's data anywhere; the AVX-512 f32 and bf16 tiles line their steps up with the rows' offset): within the
// tolerance of the reference, batch rows equal single rows and thread splits equal one call bit for bit, and the
// activations' own offset changes nothing (the lanes follow the weights only). Rows of whole lines and not.
TEST(KernelsMatmul, FloatRowsAtEveryOffsetPastALine) {
  std::mt19937 rng(47);
  for (Isa isa : runnable_isas()) {
    IsaScope scope(isa);
    for (WType t : {WType::f32, WType::bf16, WType::f16}) {
      const int elem = static_cast<int>(row_bytes(t, 1));
      const int aelem = static_cast<int>(act_row_bytes(t, 1));  // f16's activations are f32: on 4-byte offsets
      const std::int64_t line = 64 / elem;
      for (std::int64_t cols : {line, 3 * line, 5 * line, std::int64_t{37}, std::int64_t{3}}) {
        const std::int64_t rows = 19, n = 9;
        const std::size_t rb = row_bytes(t, cols), arb = act_row_bytes(t, cols);
        const Bytes w0 = random_weights(rng, t, rows, cols);
        const Bytes a0 = random_acts(rng, t, n, cols);
        for (int phase = 0; phase < 64; phase += elem) {
          SCOPED_TRACE(std::string(isa_name(isa)) + " " + tname(t) + " cols=" + std::to_string(cols) +
                       " offset=" + std::to_string(phase));
          // The matrix at `phase` bytes past a line; the activations at the same offset (as far as their elements'
          // alignment allows), and at another one.
          Bytes wbuf(w0.size() + 128), abuf(a0.size() + 128), abuf2(a0.size() + 128);
          const auto place = [](Bytes& buf, const Bytes& src, std::size_t off) {
            const std::size_t to_line = (64 - reinterpret_cast<std::uintptr_t>(buf.data()) % 64) % 64;
            std::memcpy(buf.data() + to_line + off, src.data(), src.size());
            return buf.data() + to_line + off;
          };
          const std::uint8_t* w = place(wbuf, w0, static_cast<std::size_t>(phase));
          const std::uint8_t* a = place(abuf, a0, static_cast<std::size_t>(phase / aelem * aelem));
          const std::uint8_t* a2 = place(abuf2, a0, static_cast<std::size_t>((phase + 5 * elem) % 64 / aelem * aelem));
          std::vector<float> y(static_cast<std::size_t>(n * rows)), y2(y.size());
          matmul_rows(t, w, cols, a, n, y.data(), rows, 0, rows);
          matmul_rows(t, w, cols, a2, n, y2.data(), rows, 0, rows);
          ASSERT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * sizeof(float))) << "the activations' offset";
          for (std::int64_t i = 0; i < n; ++i) {
            std::vector<float> y1(static_cast<std::size_t>(rows));
            matmul_rows(t, w, cols, a + static_cast<std::size_t>(i) * arb, 1, y1.data(), rows, 0, rows);
            for (std::int64_t r = 0; r < rows; ++r) {
              ASSERT_TRUE(same_bits(y[i * rows + r], y1[r])) << "act " << i << " row " << r;
              const std::uint8_t* wr = w + static_cast<std::size_t>(r) * rb;
              const std::uint8_t* ai = a + static_cast<std::size_t>(i) * arb;
              ASSERT_NEAR(y1[r], vec_dot_ref(t, cols, wr, ai), tolerance(t, wr, ai, cols)) << "act " << i << " row " << r;
            }
          }
          for (std::int64_t cut : {1, 7, 16, 18}) {
            std::vector<float> ys(y.size(), -1.f);
            matmul_rows(t, w, cols, a, n, ys.data(), rows, 0, cut);
            matmul_rows(t, w, cols, a, n, ys.data(), rows, cut, rows);
            ASSERT_EQ(0, std::memcmp(ys.data(), y.data(), y.size() * sizeof(float))) << "cut " << cut;
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
