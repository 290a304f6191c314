// The row kernels of the CPU layers (kernels/rows.h): SiLU(gate) × up against a double reference, RMSNorm against
// its documented order, the rotary embedding against a double reference; each element the same bits on every path
// whatever the count, the offset and aliasing (the batching guarantee rests on it).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/rows.h"

namespace tandem::kernels {
namespace {

using namespace tandem::kernels::testing;

double silu_ref(double g, double u) { return g / (1.0 + std::exp(-g)) * u; }

TEST(KernelsRows, SiluMulMatchesTheDoubleReference) {
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.F, 4.F);
  std::vector<float> gate(4099), up(gate.size());
  for (std::size_t i = 0; i < gate.size(); ++i) {
    gate[i] = n(rng);
    up[i] = n(rng);
  }
  // The exp's ranges: arguments near and past its clamps, zeros of both signs, tiny values.
  const float edges[] = {0.F, -0.F, 1e-30F, -1e-30F, 87.F, -87.F, 88.2F, -88.2F, 88.4F, -88.4F, 100.F, -100.F,
                         30.F, -30.F, 1e6F, -1e6F};
  for (std::size_t i = 0; i < std::size(edges); ++i) gate[i * 7] = edges[i];
  std::vector<float> out(gate.size());
  silu_mul(gate.data(), up.data(), static_cast<std::int64_t>(gate.size()), out.data());
  for (std::size_t i = 0; i < gate.size(); ++i) {
    const double ref = silu_ref(gate[i], up[i]);
    // exp within ~2 ulp, then an add, a division and a multiply: 1e-6 relative; below the clamp (gate < -88.3)
    // the result is gate · up · ~4.7e-39 instead of a smaller tiny value.
    ASSERT_NEAR(out[i], ref, 1e-6 * std::fabs(ref) + 1e-30) << "gate " << gate[i] << " up " << up[i];
    ASSERT_FALSE(std::isnan(out[i])) << "gate " << gate[i];
  }
  // Infinite gates take the clamp like any other: +inf → inf · up, −inf → −inf · up · 4.7e-39 (not NaN).
  const float inf = std::numeric_limits<float>::infinity(), two = 2.F;
  float r = 0.F;
  silu_mul(&inf, &two, 1, &r);
  EXPECT_EQ(r, inf);
  const float ninf = -inf;
  silu_mul(&ninf, &two, 1, &r);
  EXPECT_EQ(r, -inf);
  // Each element alone (the scalar tail) and in a vector lane at any offset: the same bits; out may alias gate.
  for (std::size_t i = 0; i < 64; ++i) {
    float one = 0.F;
    silu_mul(&gate[i], &up[i], 1, &one);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(one), std::bit_cast<std::uint32_t>(out[i])) << "element " << i;
  }
  for (std::int64_t off : {1, 2, 3, 5}) {
    std::vector<float> g2(gate.begin() + off, gate.end());
    silu_mul(g2.data(), up.data() + off, static_cast<std::int64_t>(g2.size()), g2.data());
    for (std::size_t i = 0; i < g2.size(); ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(g2[i]),
                std::bit_cast<std::uint32_t>(out[i + static_cast<std::size_t>(off)]))
          << "offset " << off << " element " << i;
  }
}

// Each path (4, 8 or 16 lanes: kernels/silu_lanes.h) gives the scalar path's bits for every element, whatever the
// count and offset (the vector loops and the one-by-one tail meet at different elements on each).
TEST(KernelsRows, SiluMulIsTheSameBitsOnEveryPath) {
  std::mt19937 rng(11);
  std::vector<float> gate = gaussian(rng, 1000, 6.F);
  const std::vector<float> up = gaussian(rng, gate.size(), 6.F);
  const float edges[] = {0.F, -0.F, 1e-30F, -88.4F, 88.4F, -100.F, 100.F, std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  for (std::size_t i = 0; i < std::size(edges); ++i) gate[i * 13 + 5] = edges[i];
  std::vector<float> want(gate.size());
  {
    IsaScope scope(Isa::scalar);
    silu_mul(gate.data(), up.data(), static_cast<std::int64_t>(gate.size()), want.data());
  }
  for (Isa isa : runnable_isas()) {
    IsaScope scope(isa);
    for (std::size_t off : {0, 1, 3, 7}) {
      for (std::size_t count : {0, 1, 3, 4, 5, 8, 15, 16, 17, 31, 33, 100, 993}) {
        SCOPED_TRACE(std::string(isa_name(isa)) + " offset " + std::to_string(off) + " count " + std::to_string(count));
        std::vector<float> got(count + 1, -7.F);
        silu_mul(gate.data() + off, up.data() + off, static_cast<std::int64_t>(count), got.data());
        for (std::size_t i = 0; i < count; ++i)
          ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[off + i])) << "element " << i;
        EXPECT_EQ(got[count], -7.F) << "wrote past count";
      }
    }
  }
}

// RMSNorm's documented order: 8 interleaved partial sums of the squares in double (each square exact), combined
// pairwise, r = float(1 / sqrt(sum / d + eps)), out = (x · r) · w in float.
std::vector<float> rmsnorm_in_order(const std::vector<float>& x, const std::vector<float>& w, std::int64_t n,
                                    std::int64_t d, float eps) {
  std::vector<float> out(x.size());
  for (std::int64_t i = 0; i < n; ++i) {
    double p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (std::int64_t j = 0; j < d; ++j) {
      const double v = x[static_cast<std::size_t>(i * d + j)];
      p[j % 8] += v * v;
    }
    const double sum = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
    const auto r = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(d) + static_cast<double>(eps)));
    for (std::int64_t j = 0; j < d; ++j) {
      const float xr = x[static_cast<std::size_t>(i * d + j)] * r;
      out[static_cast<std::size_t>(i * d + j)] = xr * w[static_cast<std::size_t>(j)];
    }
  }
  return out;
}

TEST(KernelsRows, RmsnormIsItsDocumentedOrderOnEveryPathAndInPlace) {
  std::mt19937 rng(13);
  for (Isa isa : runnable_isas()) {
    IsaScope scope(isa);
    for (std::int64_t d : {1, 7, 8, 9, 16, 17, 64, 100, 768, 1001}) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " d " + std::to_string(d));
      constexpr std::int64_t n = 3;
      const std::vector<float> x = gaussian(rng, static_cast<std::size_t>(n * d), 3.F);
      const std::vector<float> w = gaussian(rng, static_cast<std::size_t>(d), 1.F);
      const std::vector<float> want = rmsnorm_in_order(x, w, n, d, 1e-6F);
      std::vector<float> got(x.size() + 1, -7.F);
      rmsnorm_rows(x.data(), w.data(), n, d, 1e-6F, got.data());
      for (std::size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i])) << "element " << i;
      EXPECT_EQ(got[want.size()], -7.F) << "wrote past the rows";
      std::vector<float> inplace = x;
      rmsnorm_rows(inplace.data(), w.data(), n, d, 1e-6F, inplace.data());
      for (std::size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(std::bit_cast<std::uint32_t>(inplace[i]), std::bit_cast<std::uint32_t>(want[i])) << "in place, element " << i;
    }
  }
}

// Every path rotates to the scalar path's bits, in both layouts, for head sizes around each path's width; and the
// scalar path is within float rounding of the rotation computed in double.
TEST(KernelsRows, RopeIsTheSameBitsOnEveryPath) {
  std::mt19937 rng(17);
  for (bool interleaved : {false, true}) {
    for (std::int64_t half : {1, 3, 4, 7, 8, 15, 16, 17, 32, 33, 64}) {
      constexpr std::int64_t n = 3, heads = 2;
      const std::size_t count = static_cast<std::size_t>(n * heads * 2 * half);
      const std::vector<float> x = gaussian(rng, count, 2.F);
      std::vector<float> c(static_cast<std::size_t>(n * half)), s(c.size());
      for (std::size_t k = 0; k < c.size(); ++k) {
        const double a = 0.37 * static_cast<double>(k) + 0.1;
        c[k] = static_cast<float>(std::cos(a));
        s[k] = static_cast<float>(std::sin(a));
      }
      std::vector<float> want = x;
      {
        IsaScope scope(Isa::scalar);
        rope_rows(want.data(), n, heads, half, c.data(), s.data(), interleaved);
      }
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t h = 0; h < heads; ++h)
          for (std::int64_t k = 0; k < half; ++k) {
            const std::int64_t base = (i * heads + h) * 2 * half;
            const std::int64_t ia = interleaved ? base + 2 * k : base + k;
            const std::int64_t ib = interleaved ? base + 2 * k + 1 : base + k + half;
            const double x1 = x[static_cast<std::size_t>(ia)], x2 = x[static_cast<std::size_t>(ib)];
            const double ck = c[static_cast<std::size_t>(i * half + k)], sk = s[static_cast<std::size_t>(i * half + k)];
            EXPECT_NEAR(want[static_cast<std::size_t>(ia)], x1 * ck - x2 * sk, 1e-5 * (std::abs(x1) + std::abs(x2)));
            EXPECT_NEAR(want[static_cast<std::size_t>(ib)], x2 * ck + x1 * sk, 1e-5 * (std::abs(x1) + std::abs(x2)));
          }
      for (Isa isa : runnable_isas()) {
        IsaScope scope(isa);
        SCOPED_TRACE(std::string(isa_name(isa)) + (interleaved ? " interleaved" : " halves") + " half " +
                     std::to_string(half));
        std::vector<float> got = x;
        rope_rows(got.data(), n, heads, half, c.data(), s.data(), interleaved);
        for (std::size_t i = 0; i < count; ++i)
          ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i])) << "element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace tandem::kernels
