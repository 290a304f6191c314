// Reference quantization library: traits, exact f16/bf16 conversions, quantize -> dequantize error bounds, dot
// products against an independent double-precision computation, odd inputs, and byte equality with llama.cpp's
// quantizations of ../shared/models/gguf-tiny/shared256-f16.gguf.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gguf_scan.h"
#include "kernels/quant.h"
#include "kernels/types.h"

namespace tandem::kernels {
namespace {

using Bytes = std::vector<std::uint8_t>;

const std::vector<WType> kQuantTypes = {WType::q8_0, WType::q4_0, WType::q5_0, WType::q4_1, WType::q5_1,
                                        WType::q4_K, WType::q5_K, WType::q6_K, WType::iq4_nl, WType::iq4_xs,
                                        WType::q2_K, WType::q3_K};

std::string tname(WType t) { return std::string(wtype_name(t)); }

Bytes quantize(WType t, const std::vector<float>& x) {
  Bytes out(row_bytes(t, static_cast<std::int64_t>(x.size())));
  quantize_row(t, x.data(), out.data(), static_cast<std::int64_t>(x.size()));
  return out;
}

std::vector<float> dequantize(WType t, const Bytes& q, std::size_t n) {
  std::vector<float> y(n);
  dequantize_row(t, q.data(), y.data(), static_cast<std::int64_t>(n));
  return y;
}

std::vector<float> gaussian(std::mt19937& rng, std::size_t n, float sigma) {
  std::normal_distribution<float> nd(0.f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = nd(rng);
  return x;
}

// Independent decoding of a prepared activation row into doubles (exact: every format's values are exact in double).
std::vector<double> decode_act(WType t, const Bytes& act, std::size_t n) {
  std::vector<double> a(n);
  switch (traits(t).act) {
    case AType::f32:
    case AType::f16:  // f16-rounded values held as f32
      for (std::size_t i = 0; i < n; ++i) {
        float f;
        std::memcpy(&f, act.data() + 4 * i, 4);
        a[i] = f;
      }
      break;
    case AType::bf16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, act.data() + 2 * i, 2);
        a[i] = bf16_to_f32(h);
      }
      break;
    case AType::q8_0: {
      const auto* b = reinterpret_cast<const BlockQ8_0*>(act.data());
      for (std::size_t i = 0; i < n; ++i) a[i] = double(f16_to_f32(b[i / 32].d)) * b[i / 32].qs[i % 32];
      break;
    }
    case AType::q8_K: {
      const auto* b = reinterpret_cast<const BlockQ8_K*>(act.data());
      for (std::size_t i = 0; i < n; ++i) a[i] = double(b[i / 256].d) * b[i / 256].qs[i % 256];
      break;
    }
    case AType::q8_1: {  // d · qs (s, their sum in f16, is checked apart)
      const auto* b = reinterpret_cast<const BlockQ8_1*>(act.data());
      for (std::size_t i = 0; i < n; ++i) a[i] = double(f16_to_f32(b[i / 32].d)) * b[i / 32].qs[i % 32];
      break;
    }
  }
  return a;
}

// |m| of every element's q4_1 / q5_1 block (0 for the other types): the min term m · s rounds s = f16(d · Σ q) with
// the activation's unrounded d, so it is exact only to ~2^-10 relative of |m| Σ |a|.
std::vector<double> q81_mins(WType t, const Bytes& w, std::size_t n) {
  std::vector<double> m(n, 0.0);
  if (t != WType::q4_1 && t != WType::q5_1) return m;
  for (std::size_t i = 0; i < n; ++i) {
    f16_bits mn;
    std::memcpy(&mn, w.data() + (i / 32) * traits(t).block_bytes + 2, 2);
    m[i] = std::fabs(double(f16_to_f32(mn)));
  }
  return m;
}

// Upper bound of |dmin * m| for every element of a q4_K / q5_K / q2_K weight block (0 for the other types).
std::vector<double> min_offsets(WType t, const Bytes& w, std::size_t n) {
  std::vector<double> m(n, 0.0);
  if (t != WType::q4_K && t != WType::q5_K && t != WType::q2_K) return m;
  const std::size_t bytes = traits(t).block_bytes;
  // q4_K / q5_K: d, then dmin at byte 2, 6-bit mins; q2_K: dmin last, 4-bit mins.
  const std::size_t at = t == WType::q2_K ? offsetof(BlockQ2_K, dmin) : 2;
  const double mmax = t == WType::q2_K ? 15 : 63;
  for (std::size_t i = 0; i < n; ++i) {
    f16_bits dmin;
    std::memcpy(&dmin, w.data() + (i / 256) * bytes + at, 2);
    m[i] = std::fabs(double(f16_to_f32(dmin))) * mmax;
  }
  return m;
}

// ---- traits ------------------------------------------------------------------------------------------------------

TEST(KernelsTypes, TraitsTable) {
  struct Row {
    WType t;
    const char* name;
    int ggml;
    int elems;
    std::size_t bytes;
    AType act;
  };
  const Row rows[] = {
      {WType::f32, "f32", 0, 1, 4, AType::f32},        {WType::f16, "f16", 1, 1, 2, AType::f16},
      {WType::bf16, "bf16", 30, 1, 2, AType::bf16},    {WType::q8_0, "q8_0", 8, 32, 34, AType::q8_0},
      {WType::q4_0, "q4_0", 2, 32, 18, AType::q8_0},   {WType::q4_K, "q4_K", 12, 256, 144, AType::q8_K},
      {WType::q5_K, "q5_K", 13, 256, 176, AType::q8_K}, {WType::q6_K, "q6_K", 14, 256, 210, AType::q8_K},
      {WType::q5_0, "q5_0", 6, 32, 22, AType::q8_0},    {WType::q4_1, "q4_1", 3, 32, 20, AType::q8_1},
      {WType::q5_1, "q5_1", 7, 32, 24, AType::q8_1},    {WType::iq4_nl, "iq4_nl", 20, 32, 18, AType::q8_0},
      {WType::iq4_xs, "iq4_xs", 23, 256, 136, AType::q8_K}, {WType::q2_K, "q2_K", 10, 256, 84, AType::q8_K},
      {WType::q3_K, "q3_K", 11, 256, 110, AType::q8_K},
  };
  ASSERT_EQ(std::size(rows), std::size(kAllWTypes));
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    const TypeTraits& tr = traits(r.t);
    EXPECT_EQ(tr.name, r.name);
    EXPECT_EQ(wtype_name(r.t), r.name);
    EXPECT_EQ(tr.ggml_id, r.ggml);
    EXPECT_EQ(tr.block_elems, r.elems);
    EXPECT_EQ(tr.block_bytes, r.bytes);
    EXPECT_EQ(tr.act, r.act);
    EXPECT_EQ(wtype_from_ggml(r.ggml), r.t);
    EXPECT_EQ(wtype_from_name(r.name), r.t);
  }
}

TEST(KernelsTypes, NameLookups) {
  EXPECT_EQ(wtype_from_name("Q4_K"), WType::q4_K);
  EXPECT_EQ(wtype_from_name("BF16"), WType::bf16);
  EXPECT_EQ(wtype_from_name("q8_0"), WType::q8_0);
  EXPECT_EQ(wtype_from_name("q4_k_m"), std::nullopt);  // a file type, not a tensor type
  EXPECT_EQ(wtype_from_name(""), std::nullopt);
  EXPECT_EQ(wtype_from_name("q4_"), std::nullopt);
  for (int id : {9, 15, 16, 29, 31, -1, 1000}) EXPECT_EQ(wtype_from_ggml(id), std::nullopt) << id;
  EXPECT_EQ(wtype_from_ggml(10), WType::q2_K);
  EXPECT_EQ(wtype_from_ggml(23), WType::iq4_xs);
}

TEST(KernelsTypes, RowBytes) {
  EXPECT_EQ(row_bytes(WType::f32, 3), 12u);
  EXPECT_EQ(row_bytes(WType::f16, 3), 6u);
  EXPECT_EQ(row_bytes(WType::bf16, 5), 10u);
  EXPECT_EQ(row_bytes(WType::q8_0, 64), 68u);
  EXPECT_EQ(row_bytes(WType::q4_0, 4096), 128u * 18);
  EXPECT_EQ(row_bytes(WType::q4_K, 4096), 16u * 144);
  EXPECT_EQ(row_bytes(WType::q5_K, 512), 2u * 176);
  EXPECT_EQ(row_bytes(WType::q6_K, 768), 3u * 210);
  EXPECT_EQ(row_bytes(WType::q8_0, 33), 0u);
  EXPECT_EQ(row_bytes(WType::q4_K, 128), 0u);
  EXPECT_EQ(row_bytes(WType::f32, -4), 0u);
  EXPECT_EQ(row_bytes(WType::q6_K, 0), 0u);

  EXPECT_EQ(act_row_bytes(WType::f32, 7), 28u);
  EXPECT_EQ(act_row_bytes(WType::f16, 7), 28u);  // f16-rounded values held as f32
  EXPECT_EQ(act_row_bytes(WType::bf16, 7), 14u);
  EXPECT_EQ(act_row_bytes(WType::q8_0, 64), 68u);
  EXPECT_EQ(act_row_bytes(WType::q4_0, 64), 68u);
  EXPECT_EQ(act_row_bytes(WType::q4_K, 512), 2u * 292);
  EXPECT_EQ(act_row_bytes(WType::q5_K, 256), 292u);
  EXPECT_EQ(act_row_bytes(WType::q6_K, 256), 292u);
  EXPECT_EQ(act_row_bytes(WType::q6_K, 32), 0u);
  EXPECT_EQ(act_row_bytes(WType::q4_0, 16), 0u);
}

// ---- f16 / bf16 conversions ----------------------------------------------------------------------------------

// binary16 value of bit pattern h by the textbook formula.
double f16_formula(std::uint16_t h) {
  const int s = h >> 15;
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  double v;
  if (e == 0) {
    v = std::ldexp(double(m), -24);
  } else if (e == 31) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else {
    v = std::ldexp(1.0 + m / 1024.0, e - 15);
  }
  return s ? -v : v;
}

TEST(KernelsConvert, F16ExhaustiveRoundTrip) {
  int nan_count = 0;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = f16_to_f32(bits);
    const double want = f16_formula(bits);
    if (std::isnan(want)) {
      ++nan_count;
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
      // NaN comes back as the quiet NaN with its sign (ggml's software conversion).
      EXPECT_EQ(f32_to_f16(f), (h & 0x8000) | 0x7E00) << std::hex << h;
      continue;
    }
    ASSERT_EQ(double(f), want) << std::hex << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;  // -0 stays -0
    ASSERT_EQ(f32_to_f16(f), bits) << std::hex << h;
  }
  EXPECT_EQ(nan_count, 2 * 1023);
}

TEST(KernelsConvert, F32ToF16RoundsToNearestEven) {
  // Every midpoint between adjacent finite f16 values (exact in f32) goes to the even one; one f32 ulp either side
  // goes to the nearer one. Covers subnormals, the subnormal/normal boundary and the top of the range.
  for (std::uint32_t h = 0; h < 0x7BFF; ++h) {
    for (std::uint32_t sign : {0u, 0x8000u}) {
      const auto lo = static_cast<std::uint16_t>(h | sign);
      const auto hi = static_cast<std::uint16_t>((h + 1) | sign);
      const float mid = (f16_to_f32(lo) + f16_to_f32(hi)) / 2;  // exact: 12 significant bits at most
      const std::uint16_t even = (h & 1) ? hi : lo;
      ASSERT_EQ(f32_to_f16(mid), even) << std::hex << h;
      ASSERT_EQ(f32_to_f16(std::nextafter(mid, 0.f)), lo) << std::hex << h;
      ASSERT_EQ(f32_to_f16(std::nextafter(mid, sign ? -INFINITY : INFINITY)), hi) << std::hex << h;
    }
  }
  EXPECT_EQ(f32_to_f16(65504.f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.f, 0.f)), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.f), 0x7C00);  // the tie above the largest finite value rounds to Inf
  EXPECT_EQ(f32_to_f16(-1e10f), 0xFC00);
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7C00);
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xFC00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -25)), 0x0000);  // tie between 0 and the smallest subnormal -> 0
  EXPECT_EQ(f32_to_f16(std::nextafter(std::ldexp(1.f, -25), 1.f)), 0x0001);
  EXPECT_EQ(f32_to_f16(-std::ldexp(1.f, -26)), 0x8000);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.f), 0x8000);
  EXPECT_EQ(f32_to_f16(1.f), 0x3C00);
  EXPECT_EQ(f32_to_f16(0.1f), 0x2E66);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::quiet_NaN()) & 0x7FFF, 0x7E00);
}

#if defined(__FLT16_MAX__)
TEST(KernelsConvert, F32ToF16MatchesCompilerFloat16) {
  // The compiler's _Float16 conversion is an independent IEEE implementation: compare on random bit patterns
  // weighted toward the f16 range, plus every f32 exponent.
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  std::uniform_int_distribution<std::uint32_t> exp(90, 150);
  int checked = 0;
  for (int i = 0; i < 2'000'000; ++i) {
    std::uint32_t u = bits(rng);
    if (i % 2) u = (u & 0x807FFFFFu) | (exp(rng) << 23);
    const float f = std::bit_cast<float>(u);
    if (std::isnan(f)) continue;
    const _Float16 h = static_cast<_Float16>(f);
    ASSERT_EQ(f32_to_f16(f), std::bit_cast<std::uint16_t>(h)) << std::hex << u;
    ++checked;
  }
  EXPECT_GT(checked, 1'900'000);
}
#endif

TEST(KernelsConvert, Bf16ExhaustiveRoundTrip) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = bf16_to_f32(bits);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(f), h << 16);
    if (std::isnan(f)) {
      EXPECT_EQ(f32_to_bf16(f), bits | 0x40) << std::hex << h;  // payload kept, quiet bit forced (ggml)
    } else {
      ASSERT_EQ(f32_to_bf16(f), bits) << std::hex << h;
    }
  }
}

// Round to nearest even by comparing distances in double (independent of the bit trick in types.cc).
std::uint16_t bf16_reference(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t lo = u & 0xFFFF0000u;
  const double x = std::fabs(double(f));
  const double vlo = std::fabs(double(std::bit_cast<float>(lo)));
  const std::uint32_t hi_mag = (lo & 0x7FFFFFFFu) + 0x10000u;  // next bf16 away from zero (Inf counts as 2^128)
  const double vhi = hi_mag == 0x7F800000u ? std::ldexp(1.0, 128) : double(std::bit_cast<float>(hi_mag));
  const double dlo = x - vlo;
  const double dhi = vhi - x;
  const std::uint32_t pick = (dlo < dhi || (dlo == dhi && ((lo >> 16) & 1) == 0)) ? lo : ((lo & 0x80000000u) | hi_mag);
  return static_cast<std::uint16_t>(pick >> 16);
}

TEST(KernelsConvert, F32ToBf16RoundsToNearestEven) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 1'000'000; ++i) {
    std::uint32_t u = bits(rng);
    if (i % 4 == 0) u = (u & 0xFFFF0000u) | 0x8000u;  // exact ties
    if (i % 4 == 1) u &= 0x807FFFFFu;                  // subnormals: kept, not flushed
    const float f = std::bit_cast<float>(u);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), bf16_reference(f)) << std::hex << u;
  }
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to Inf
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xFF80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x00018000u)), 0x0002);  // subnormal tie to even (up)
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x7FA00001u)), 0x7FE0);  // signalling NaN -> quiet
}

// ---- quantize -> dequantize ------------------------------------------------------------------------------------

struct ErrorBound {
  WType t;
  double max_rel_block;  // max |x - y| / (max |x| over the element's 32 or 256 block)
  double rmse_rel;       // sqrt(sum (x - y)^2 / sum x^2) over the row
};

// q8_0: step amax/127, error <= step/2 plus the f16 rounding of d (127 * 2^-11 steps); q4_0: step amax/8, error
// <= one step (the -max side clamps at 7); q5_0 likewise with step amax/16 (clamped at 15); q4_1 / q5_1: step
// (max - min) / 15 or 31 <= 2 amax / 15 or 31, error <= step/2 plus the f16 rounding of d and m (rmse bounds 1.25x
// the measured 0.079 and 0.038). The k-quant bounds are about 1.25x the largest errors measured over
// 65536-element rows of Gaussian, uniform and one-signed data (max / rmse: q4_K 0.106 / 0.072, q5_K 0.061 / 0.036,
// q6_K 0.0195 / 0.0178; iq4_nl 0.134 / 0.076, iq4_xs 0.144 / 0.077 over the block's / super-block's amax; q2_K
// 0.378 / 0.298, q3_K 0.254 / 0.151: two and three bits). All of
// them assume block scales in f16's normal range (|scale| >= 2^-14); below that, f16
// subnormal scales add an absolute error (see HugeTinyAndOutlierRows).
const ErrorBound kBounds[] = {
    {WType::q8_0, 0.57 / 127, 0.0065}, {WType::q4_0, 1.01 / 8, 0.10},  {WType::q4_K, 0.13, 0.09},
    {WType::q5_K, 0.075, 0.045},       {WType::q6_K, 0.025, 0.023},     {WType::q5_0, 1.01 / 16, 0.05},
    {WType::q4_1, 0.075, 0.10},        {WType::q5_1, 0.04, 0.048},      {WType::iq4_nl, 0.17, 0.095},
    {WType::iq4_xs, 0.18, 0.096},      {WType::q2_K, 0.48, 0.38},       {WType::q3_K, 0.32, 0.19},
};

void check_error(const ErrorBound& b, const std::vector<float>& x, const std::vector<float>& y) {
  const std::size_t be = traits(b.t).block_elems;
  double se = 0;
  double sx = 0;
  for (std::size_t blk = 0; blk < x.size() / be; ++blk) {
    double amax = 0;
    for (std::size_t i = blk * be; i < (blk + 1) * be; ++i) amax = std::max(amax, std::fabs(double(x[i])));
    for (std::size_t i = blk * be; i < (blk + 1) * be; ++i) {
      const double e = std::fabs(double(x[i]) - double(y[i]));
      ASSERT_LE(e, b.max_rel_block * amax) << tname(b.t) << " element " << i << " x=" << x[i] << " y=" << y[i];
      se += e * e;
      sx += double(x[i]) * x[i];
    }
  }
  if (sx > 0) {
    EXPECT_LE(std::sqrt(se / sx), b.rmse_rel) << tname(b.t);
  }
}

TEST(KernelsQuant, RoundTripErrorBoundsOnRandomRows) {
  std::mt19937 rng(42);
  for (const ErrorBound& b : kBounds) {
    for (float sigma : {0.25f, 1.f, 50.f, 3000.f}) {
      SCOPED_TRACE(tname(b.t) + " sigma " + std::to_string(sigma));
      const std::vector<float> x = gaussian(rng, 256 * 32, sigma);
      const Bytes q = quantize(b.t, x);
      check_error(b, x, dequantize(b.t, q, x.size()));
      EXPECT_EQ(quantize(b.t, x), q);  // deterministic
    }
  }
}

TEST(KernelsQuant, RoundTripErrorBoundsOnUniformAndSkewedRows) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::uniform_real_distribution<float> pos(0.5f, 2.f);
  for (const ErrorBound& b : kBounds) {
    std::vector<float> x(256 * 16);
    for (float& v : x) v = uni(rng);
    check_error(b, x, dequantize(b.t, quantize(b.t, x), x.size()));
    for (float& v : x) v = pos(rng);  // all positive (exercises the k-quants' non-zero mins)
    check_error(b, x, dequantize(b.t, quantize(b.t, x), x.size()));
    for (float& v : x) v = -pos(rng);
    check_error(b, x, dequantize(b.t, quantize(b.t, x), x.size()));
  }
}

TEST(KernelsQuant, FloatTypesConvertExactly) {
  std::mt19937 rng(3);
  const std::vector<float> x = gaussian(rng, 1000, 3.f);
  EXPECT_EQ(dequantize(WType::f32, quantize(WType::f32, x), x.size()), x);
  const std::vector<float> h = dequantize(WType::f16, quantize(WType::f16, x), x.size());
  const std::vector<float> b = dequantize(WType::bf16, quantize(WType::bf16, x), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(h[i], f16_to_f32(f32_to_f16(x[i])));
    EXPECT_EQ(b[i], bf16_to_f32(f32_to_bf16(x[i])));
    EXPECT_LE(std::fabs(h[i] - x[i]), std::ldexp(std::fabs(x[i]), -11) + std::ldexp(1.f, -25));
    EXPECT_LE(std::fabs(b[i] - x[i]), std::ldexp(std::fabs(x[i]), -8));
  }
}

TEST(KernelsQuant, Q5KIsSelfConsistentAndFinerThanQ4K) {
  // No llama.cpp q5_K file exists in ../shared, so q5_K is checked by its bounds (above), by determinism, by the
  // quantization grid of its output, and by beating q4_K (same algorithm, one more bit) on every row.
  std::mt19937 rng(9);
  for (int row = 0; row < 20; ++row) {
    const std::vector<float> x = gaussian(rng, 512, 0.05f);
    const Bytes q5 = quantize(WType::q5_K, x);
    const std::vector<float> y5 = dequantize(WType::q5_K, q5, x.size());
    const std::vector<float> y4 = dequantize(WType::q4_K, quantize(WType::q4_K, x), x.size());
    double e5 = 0;
    double e4 = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      e5 += (x[i] - y5[i]) * double(x[i] - y5[i]);
      e4 += (x[i] - y4[i]) * double(x[i] - y4[i]);
    }
    EXPECT_LT(e5, 0.5 * e4) << "row " << row;
    // Every 32-element sub-block uses all of its range: some element has level >= 16 (the qh bit) in most rows.
    const auto* blk = reinterpret_cast<const BlockQ5_K*>(q5.data());
    int high_bits = 0;
    for (int b = 0; b < 2; ++b) {
      for (std::uint8_t h : blk[b].qh) high_bits += std::popcount(h);
    }
    EXPECT_GT(high_bits, 0) << "row " << row;
    // Re-quantizing the dequantized row changes little: the values already sit on a q5_K grid.
    const std::vector<float> y55 = dequantize(WType::q5_K, quantize(WType::q5_K, y5), x.size());
    double e55 = 0;
    for (std::size_t i = 0; i < x.size(); ++i) e55 += (y5[i] - y55[i]) * double(y5[i] - y55[i]);
    EXPECT_LE(e55, e5) << "row " << row;
  }
}

// ---- odd inputs ------------------------------------------------------------------------------------------------

TEST(KernelsQuant, AllZeroRowsQuantizeToZeroBlocks) {
  for (WType t : kQuantTypes) {
    SCOPED_TRACE(tname(t));
    const std::vector<float> x(512, 0.f);
    const Bytes q = quantize(t, x);
    Bytes want(q.size(), 0);
    if (t == WType::q4_0) {
      // d = 0 / -8 = -0 (f16 0x8000, as ggml), every quant at level 8 (0x88).
      for (std::size_t b = 0; b < want.size(); b += sizeof(BlockQ4_0)) {
        want[b + 1] = 0x80;
        std::fill(want.begin() + b + 2, want.begin() + b + sizeof(BlockQ4_0), 0x88);
      }
    }
    if (t == WType::q5_0) {
      // d = -0 (0x8000), every quant at level 16: low nibbles 0, every fifth bit set.
      for (std::size_t b = 0; b < want.size(); b += sizeof(BlockQ5_0)) {
        want[b + 1] = 0x80;
        std::fill(want.begin() + b + 2, want.begin() + b + 6, 0xFF);
      }
    }
    if (t == WType::iq4_nl) {
      // d = 0, every index at 8 (level 1, the nearest to 0): 0x88.
      for (std::size_t b = 0; b < want.size(); b += sizeof(BlockIQ4_NL))
        std::fill(want.begin() + b + 2, want.begin() + b + sizeof(BlockIQ4_NL), 0x88);
    }
    if (t == WType::iq4_xs) {
      // d = -0 / 32 = -0 (0x8000), every sub-block scale 0 + 32 (scales_l 0, scales_h 0b10 per sub-block: 0xAAAA),
      // indices 8.
      for (std::size_t b = 0; b < want.size(); b += sizeof(BlockIQ4_XS)) {
        want[b + 1] = 0x80;
        want[b + 2] = want[b + 3] = 0xAA;
        std::fill(want.begin() + b + 8, want.begin() + b + sizeof(BlockIQ4_XS), 0x88);
      }
    }
    EXPECT_EQ(q, want);
    for (float v : dequantize(t, q, x.size())) EXPECT_EQ(v, 0.f);
    Bytes act(act_row_bytes(t, 512));
    quantize_act_ref(t, x.data(), act.data(), 512);
    EXPECT_EQ(act, Bytes(act.size(), 0));
    EXPECT_EQ(vec_dot_ref(t, 512, q.data(), act.data()), 0.f);
  }
}

TEST(KernelsQuant, ConstantRows) {
  for (WType t : kQuantTypes) {
    for (float c : {1.f, -1.f, 0.375f, -3000.f, 7.5f}) {  // scales in f16's normal range
      SCOPED_TRACE(tname(t) + " c=" + std::to_string(c));
      const std::vector<float> x(512, c);
      const std::vector<float> y = dequantize(t, quantize(t, x), x.size());
      for (float v : y) ASSERT_NEAR(v, c, std::fabs(c) * 2e-3) << v;
    }
  }
  // q4_0 reproduces a constant power of two exactly: d = 1 / -8, level 0 -> -8 * d.
  const std::vector<float> ones(64, 1.f);
  for (float v : dequantize(WType::q4_0, quantize(WType::q4_0, ones), 64)) EXPECT_EQ(v, 1.f);
}

TEST(KernelsQuant, HugeTinyAndOutlierRows) {
  std::mt19937 rng(13);
  for (const ErrorBound& b : kBounds) {
    SCOPED_TRACE(tname(b.t));
    // Huge but with f16-representable scales, and an outlier block next to small values.
    std::vector<float> x = gaussian(rng, 512, 3000.f);
    check_error(b, x, dequantize(b.t, quantize(b.t, x), x.size()));
    x = gaussian(rng, 512, 0.01f);
    x[37] = 40.f;
    x[300] = -25.f;
    check_error(b, x, dequantize(b.t, quantize(b.t, x), x.size()));
    // Tiny values whose scale underflows f16: finite output, never larger than the input's magnitude.
    x = gaussian(rng, 512, 1e-9f);
    const std::vector<float> y = dequantize(b.t, quantize(b.t, x), x.size());
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    for (float v : y) {
      ASSERT_TRUE(std::isfinite(v));
      ASSERT_LE(std::fabs(v), 2 * amax);
    }
  }
}

// ---- activations -----------------------------------------------------------------------------------------------

TEST(KernelsAct, Q8KBlocksAndBsums) {
  std::mt19937 rng(17);
  std::vector<float> x = gaussian(rng, 768, 2.f);
  std::fill(x.begin() + 256, x.begin() + 512, 0.f);  // a zero block in the middle
  Bytes act(act_row_bytes(WType::q4_K, 768));
  ASSERT_EQ(act.size(), 3 * sizeof(BlockQ8_K));
  quantize_act_ref(WType::q4_K, x.data(), act.data(), 768);
  const auto* b = reinterpret_cast<const BlockQ8_K*>(act.data());
  for (int blk = 0; blk < 3; ++blk) {
    SCOPED_TRACE(blk);
    float amax = 0;
    int arg = 0;
    for (int i = 0; i < 256; ++i) {
      if (std::fabs(x[256 * blk + i]) > amax) {
        amax = std::fabs(x[256 * blk + i]);
        arg = i;
      }
    }
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += b[blk].qs[16 * j + i];
      EXPECT_EQ(b[blk].bsums[j], sum);
    }
    if (blk == 1) {
      EXPECT_EQ(b[blk].d, 0.f);
      for (std::int8_t q : b[blk].qs) EXPECT_EQ(q, 0);
      continue;
    }
    EXPECT_EQ(b[blk].qs[arg], -127);  // the largest magnitude maps to -127 (d carries the sign)
    EXPECT_NEAR(std::fabs(b[blk].d), amax / 127, amax / 127 * 1e-6);
    for (int i = 0; i < 256; ++i) EXPECT_NEAR(b[blk].d * b[blk].qs[i], x[256 * blk + i], std::fabs(b[blk].d) * 0.5001);
  }
}

TEST(KernelsAct, FormatsPerWeightType) {
  std::mt19937 rng(19);
  const std::vector<float> x = gaussian(rng, 256, 1.f);
  for (WType t : kAllWTypes) {
    SCOPED_TRACE(tname(t));
    Bytes act(act_row_bytes(t, 256));
    quantize_act_ref(t, x.data(), act.data(), 256);
    switch (traits(t).act) {
      case AType::f32: EXPECT_EQ(act, quantize(WType::f32, x)); break;
      case AType::f16: {  // the f16 rounding, widened back to f32
        const Bytes h = quantize(WType::f16, x);
        std::vector<float> widened(256);
        dequantize_row(WType::f16, h.data(), widened.data(), 256);
        EXPECT_EQ(act, quantize(WType::f32, widened));
        break;
      }
      case AType::bf16: EXPECT_EQ(act, quantize(WType::bf16, x)); break;
      case AType::q8_0: {
        // llama.cpp's x86 activation quantizer: scale f16(amax / 127), q = x * (127 / amax) rounded to even.
        for (int b = 0; b < 256 / QK8_0; ++b) {
          BlockQ8_0 blk;
          std::memcpy(&blk, act.data() + b * sizeof(BlockQ8_0), sizeof blk);
          float amax = 0;
          for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(x[b * QK8_0 + j]));
          EXPECT_EQ(blk.d, f32_to_f16(amax / 127.f));
          for (int j = 0; j < QK8_0; ++j) {
            const float p = x[b * QK8_0 + j] * (127.f / amax);
            EXPECT_EQ(blk.qs[j], static_cast<int>(std::nearbyint(p))) << b << ":" << j;
          }
        }
        break;
      }
      case AType::q8_K: {
        const std::vector<double> a = decode_act(t, act, 256);
        for (int i = 0; i < 256; ++i) EXPECT_NEAR(a[i], x[i], 4.5 / 127);
        break;
      }
      case AType::q8_1: {
        // q8_0's levels and scale, and s = f16(d · Σ q) with d = amax / 127 before its f16 rounding.
        for (int b = 0; b < 256 / QK8_1; ++b) {
          BlockQ8_1 blk;
          std::memcpy(&blk, act.data() + b * sizeof(BlockQ8_1), sizeof blk);
          float amax = 0;
          for (int j = 0; j < QK8_1; ++j) amax = std::max(amax, std::fabs(x[b * QK8_1 + j]));
          EXPECT_EQ(blk.d, f32_to_f16(amax / 127.f));
          int sum = 0;
          for (int j = 0; j < QK8_1; ++j) {
            EXPECT_EQ(blk.qs[j], static_cast<int>(std::nearbyint(x[b * QK8_1 + j] * (127.f / amax)))) << b << ":" << j;
            sum += blk.qs[j];
          }
          EXPECT_EQ(blk.s, f32_to_f16(amax / 127.f * static_cast<float>(sum))) << b;
        }
        break;
      }
    }
  }
}

// q8_0 activations round ties to even (llama.cpp's CPU quantize_row_q8_0), unlike the q8_0 weight quantizer
// (quantize_row_q8_0_ref: ties away from zero).
TEST(KernelsAct, Q8_0ActivationTiesGoToEven) {
  std::vector<float> x(QK8_0, 0.f);
  x[0] = 127.f;  // amax 127: id = 1, so x.5 is a tie
  x[1] = 2.5f;
  x[2] = -3.5f;
  x[3] = 4.5f;
  BlockQ8_0 act, w;
  quantize_act_ref(WType::q8_0, x.data(), &act, QK8_0);
  quantize_row(WType::q8_0, x.data(), &w, QK8_0);
  EXPECT_EQ(act.qs[1], 2);
  EXPECT_EQ(act.qs[2], -4);
  EXPECT_EQ(act.qs[3], 4);
  EXPECT_EQ(w.qs[1], 3);  // the weight quantizer: away from zero
  EXPECT_EQ(w.qs[2], -4);
  EXPECT_EQ(w.qs[3], 5);
}

// ---- dot products ----------------------------------------------------------------------------------------------

// vec_dot_ref against sum_i w_i * a_i in double, over the dequantized weights and the exactly decoded activations.
// Tolerance: the reference's integer sums are exact; its floats round each block's scale product, the int -> float
// conversion, the scale x sum product (and the min term), and the running f32 sum over nb blocks, so
//   |ref - exact| <= (nb + 4) * 2^-23 * S,  S = sum_i (|w_i| + 2 |dmin m|_max) * |a_i|,
// which also covers the rounding of the dequantized weights used here. Float types: products rounded to f32 (f32) or
// exact (f16, bf16), summed in double: |ref - exact| <= 2^-22 * S.
TEST(KernelsDot, MatchesDoublePrecisionOverDequantizedValues) {
  std::mt19937 rng(23);
  for (WType t : kAllWTypes) {
    const std::int64_t be = std::max(traits(t).block_elems, traits(t).act == AType::q8_K ? 256 : 32);
    for (std::int64_t nb : {1, 3, 16}) {
      const std::int64_t n = be * nb;
      SCOPED_TRACE(tname(t) + " n=" + std::to_string(n));
      for (int trial = 0; trial < 10; ++trial) {
        const std::vector<float> wx = gaussian(rng, n, 0.05f);
        std::vector<float> ax = gaussian(rng, n, 1.5f);
        if (trial % 2) {
          for (float& v : ax) v = std::fabs(v);  // same-sign activations: no cancellation luck
        }
        const Bytes w = quantize(t, wx);
        Bytes act(act_row_bytes(t, n));
        quantize_act_ref(t, ax.data(), act.data(), n);
        const std::vector<float> wd = dequantize(t, w, n);
        const std::vector<double> ad = decode_act(t, act, n);
        const std::vector<double> mo = min_offsets(t, w, n);
        const std::vector<double> m1 = q81_mins(t, w, n);
        double exact = 0;
        double s = 0;
        double ms = 0;
        for (std::int64_t i = 0; i < n; ++i) {
          exact += double(wd[i]) * ad[i];
          s += (std::fabs(double(wd[i])) + 2 * mo[i] + 2 * m1[i]) * std::fabs(ad[i]);
          ms += m1[i] * std::fabs(ad[i]);
        }
        const bool is_float = traits(t).block_elems == 1;
        const double tol =
            (is_float ? std::ldexp(s, -22) : double(nb + 4) * std::ldexp(s, -23)) + std::ldexp(ms, -10);
        const float got = vec_dot_ref(t, n, w.data(), act.data());
        ASSERT_NEAR(got, exact, tol) << "trial " << trial;
        // And it estimates the f32 dot product of the original rows (quantization error, loose).
        double orig = 0;
        double orig_s = 0;
        for (std::int64_t i = 0; i < n; ++i) {
          orig += double(wx[i]) * ax[i];
          orig_s += std::fabs(double(wx[i]) * ax[i]);
        }
        EXPECT_NEAR(got, orig, 0.25 * orig_s + 1e-6) << "trial " << trial;
      }
    }
  }
}

// Blocks with power-of-two scales and small integers: every float operation in the reference is then exact, so
// vec_dot_ref must equal the exact sum bit for bit — any error in the integer parts (unpacking, scales, mins, bsums)
// shows up here.
TEST(KernelsDot, IntegerPartsAreExact) {
  std::mt19937 rng(29);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> small(-3, 3);
  for (WType t : kQuantTypes) {
    const bool k = traits(t).act == AType::q8_K;
    const std::int64_t n = k ? 512 : 256;
    SCOPED_TRACE(tname(t));
    for (int trial = 0; trial < 50; ++trial) {
      Bytes w(row_bytes(t, n));
      for (auto& v : w) v = static_cast<std::uint8_t>(byte(rng));
      const std::size_t nblk = w.size() / traits(t).block_bytes;
      for (std::size_t b = 0; b < nblk; ++b) {
        std::uint8_t* blk = w.data() + b * traits(t).block_bytes;
        const f16_bits d = f32_to_f16(0.125f);
        const f16_bits dmin = f32_to_f16(0.0625f);
        if (t == WType::q6_K) {
          std::memcpy(blk + offsetof(BlockQ6_K, d), &d, 2);
        } else if (t == WType::q2_K) {
          std::memcpy(blk + offsetof(BlockQ2_K, d), &d, 2);
          std::memcpy(blk + offsetof(BlockQ2_K, dmin), &dmin, 2);
        } else if (t == WType::q3_K) {
          std::memcpy(blk + offsetof(BlockQ3_K, d), &d, 2);
        } else {
          std::memcpy(blk, &d, 2);
          // q4_1 / q5_1: m, a power of two (m · s is then exact)
          if (t == WType::q4_K || t == WType::q5_K || t == WType::q4_1 || t == WType::q5_1) std::memcpy(blk + 2, &dmin, 2);
        }
      }
      Bytes act(act_row_bytes(t, n));
      if (k) {
        auto* a = reinterpret_cast<BlockQ8_K*>(act.data());
        for (std::int64_t b = 0; b < n / 256; ++b) {
          a[b].d = 1.f / 64;
          for (int j = 0; j < 16; ++j) {
            int sum = 0;
            for (int i = 0; i < 16; ++i) {
              a[b].qs[16 * j + i] = static_cast<std::int8_t>(small(rng));
              sum += a[b].qs[16 * j + i];
            }
            a[b].bsums[j] = static_cast<std::int16_t>(sum);
          }
        }
      } else if (traits(t).act == AType::q8_1) {  // s = d · Σ q, exact in f16 for these small sums
        auto* a = reinterpret_cast<BlockQ8_1*>(act.data());
        for (std::int64_t b = 0; b < n / 32; ++b) {
          a[b].d = f32_to_f16(1.f / 32);
          int sum = 0;
          for (auto& q : a[b].qs) sum += q = static_cast<std::int8_t>(small(rng));
          a[b].s = f32_to_f16(static_cast<float>(sum) / 32);
        }
      } else {
        auto* a = reinterpret_cast<BlockQ8_0*>(act.data());
        for (std::int64_t b = 0; b < n / 32; ++b) {
          a[b].d = f32_to_f16(1.f / 32);
          for (auto& q : a[b].qs) q = static_cast<std::int8_t>(small(rng));
        }
      }
      const std::vector<float> wd = dequantize(t, w, n);
      const std::vector<double> ad = decode_act(t, act, n);
      double exact = 0;
      for (std::int64_t i = 0; i < n; ++i) exact += double(wd[i]) * ad[i];
      ASSERT_EQ(double(vec_dot_ref(t, n, w.data(), act.data())), exact) << "trial " << trial;
    }
  }
}

TEST(KernelsDot, FloatTypesSumProductsInDouble) {
  // 2^24 + 1 - 2^24: an f32 running sum would lose the 1; the reference sums f32 products in double.
  const std::vector<float> w = {16777216.f, 1.f, -16777216.f};
  const std::vector<float> a = {1.f, 1.f, 1.f};
  EXPECT_EQ(vec_dot_ref(WType::f32, 3, w.data(), a.data()), 1.f);
  const std::vector<float> wb = {std::ldexp(1.f, 30), 1.f, -std::ldexp(1.f, 30)};  // exact in bf16
  const Bytes wbf = quantize(WType::bf16, wb);
  Bytes abf(act_row_bytes(WType::bf16, 3));
  quantize_act_ref(WType::bf16, a.data(), abf.data(), 3);
  EXPECT_EQ(vec_dot_ref(WType::bf16, 3, wbf.data(), abf.data()), 1.f);
  const std::vector<float> wh = {65504.f, 1.f, -65504.f};  // 65504^2 is exact in f32, 65504^2 + 1 is not
  const Bytes whf = quantize(WType::f16, wh);
  Bytes ahf(act_row_bytes(WType::f16, 3));
  quantize_act_ref(WType::f16, std::vector<float>{65504.f, 1.f, 65504.f}.data(), ahf.data(), 3);
  EXPECT_EQ(vec_dot_ref(WType::f16, 3, whf.data(), ahf.data()), 1.f);
}

}  // namespace
}  // namespace tandem::kernels
