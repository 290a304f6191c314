// Weight-type traits and the scalar f16 / bf16 conversions. See types.h and docs/kernels.md.
#include "kernels/types.h"

#include <array>
#include <bit>
#include <cctype>

namespace tandem::kernels {
namespace {

constexpr std::array<TypeTraits, kWTypeCount> kTraits = {{
    {"f32", 0, 1, 4, AType::f32},
    {"f16", 1, 1, 2, AType::f16},
    {"bf16", 30, 1, 2, AType::bf16},
    {"q8_0", 8, QK8_0, sizeof(BlockQ8_0), AType::q8_0},
    {"q4_0", 2, QK4_0, sizeof(BlockQ4_0), AType::q8_0},
    {"q4_K", 12, QK_K, sizeof(BlockQ4_K), AType::q8_K},
    {"q5_K", 13, QK_K, sizeof(BlockQ5_K), AType::q8_K},
    {"q6_K", 14, QK_K, sizeof(BlockQ6_K), AType::q8_K},
    {"q5_0", 6, QK5_0, sizeof(BlockQ5_0), AType::q8_0},
    {"q4_1", 3, QK4_1, sizeof(BlockQ4_1), AType::q8_1},
    {"q5_1", 7, QK5_1, sizeof(BlockQ5_1), AType::q8_1},
    {"iq4_nl", 20, QK4_NL, sizeof(BlockIQ4_NL), AType::q8_0},
    {"iq4_xs", 23, QK_K, sizeof(BlockIQ4_XS), AType::q8_K},
    {"q2_K", 10, QK_K, sizeof(BlockQ2_K), AType::q8_K},
    {"q3_K", 11, QK_K, sizeof(BlockQ3_K), AType::q8_K},
}};

// kTraits is indexed by the enum's value; keep them in step.
static_assert(static_cast<int>(WType::f32) == 0 && static_cast<int>(WType::f16) == 1 &&
              static_cast<int>(WType::bf16) == 2 && static_cast<int>(WType::q8_0) == 3 &&
              static_cast<int>(WType::q4_0) == 4 && static_cast<int>(WType::q4_K) == 5 &&
              static_cast<int>(WType::q5_K) == 6 && static_cast<int>(WType::q6_K) == 7 &&
              static_cast<int>(WType::q5_0) == 8 && static_cast<int>(WType::q4_1) == 9 &&
              static_cast<int>(WType::q5_1) == 10 && static_cast<int>(WType::iq4_nl) == 11 &&
              static_cast<int>(WType::iq4_xs) == 12 && static_cast<int>(WType::q2_K) == 13 &&
              static_cast<int>(WType::q3_K) == 14);

struct ActFormat {
  int block_elems;
  std::size_t block_bytes;
};

constexpr ActFormat act_format(AType a) {
  switch (a) {
    case AType::f32: return {1, 4};
    case AType::f16: return {1, 4};  // f16-rounded values held as f32 (the tiles widen no activation)
    case AType::bf16: return {1, 2};
    case AType::q8_0: return {QK8_0, sizeof(BlockQ8_0)};
    case AType::q8_K: return {QK_K, sizeof(BlockQ8_K)};
    case AType::q8_1: return {QK8_1, sizeof(BlockQ8_1)};
  }
  return {1, 0};
}

std::size_t blocks_bytes(int block_elems, std::size_t block_bytes, std::int64_t cols) {
  if (cols < 0 || cols % block_elems != 0) return 0;
  return static_cast<std::size_t>(cols / block_elems) * block_bytes;
}

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

}  // namespace

const TypeTraits& traits(WType t) { return kTraits[static_cast<std::size_t>(t)]; }

std::string_view wtype_name(WType t) { return traits(t).name; }

std::optional<WType> wtype_from_name(std::string_view name) {
  for (WType t : kAllWTypes) {
    if (iequal(traits(t).name, name)) return t;
  }
  return std::nullopt;
}

std::optional<WType> wtype_from_ggml(int ggml_id) {
  for (WType t : kAllWTypes) {
    if (traits(t).ggml_id == ggml_id) return t;
  }
  return std::nullopt;
}

std::size_t row_bytes(WType t, std::int64_t cols) {
  const TypeTraits& tr = traits(t);
  return blocks_bytes(tr.block_elems, tr.block_bytes, cols);
}

std::size_t act_row_bytes(WType t, std::int64_t cols) {
  const ActFormat a = act_format(traits(t).act);
  return blocks_bytes(a.block_elems, a.block_bytes, cols);
}

// binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. Exact: every f16 value is an f32 value.
float f16_to_f32(f16_bits h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  std::uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // Inf, or NaN with its payload (stays quiet/signalling as it was)
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);  // 112 = 127 - 15
  } else if (mant == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal: value = mant * 2^-24. Normalise: shift the leading 1 up to bit 10.
    int e = 113;  // biased f32 exponent of 2^-14, before the shifts below
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (static_cast<std::uint32_t>(e) << 23) | ((mant & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// Round to nearest, ties to even; overflow to Inf; results below the smallest subnormal round to +-0 or to it.
// NaN -> quiet NaN 0x7E00 with the sign kept (ggml's software conversion; F16C hardware would keep payload bits).
f16_bits f32_to_f16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<f16_bits>(sign | 0x7E00u);
  if (ax >= 0x477FF000u) return static_cast<f16_bits>(sign | 0x7C00u);  // >= 65520 rounds to Inf (and Inf)
  if (ax >= 0x38800000u) {
    // Normal f16 range [2^-14, 65520): rebias the exponent, round 13 dropped mantissa bits to nearest even. A carry
    // out of the mantissa correctly bumps the exponent (up to 0x7C00 only for inputs excluded above).
    const std::uint32_t r = ax - 0x38000000u;  // exponent 127 -> 15 after the >> 13
    const std::uint32_t lsb = (r >> 13) & 1u;
    return static_cast<f16_bits>(sign | ((r + 0xFFFu + lsb) >> 13));
  }
  if (ax < 0x33000000u) return static_cast<f16_bits>(sign);  // < 2^-25: rounds to 0 (2^-25 is a tie -> 0 below)
  // Subnormal result: value / 2^-24 rounded to an integer, nearest even, in [0, 1024] (1024 = smallest normal).
  const std::uint32_t exp = ax >> 23;                       // 102 .. 112
  const std::uint32_t mant = (ax & 0x7FFFFFu) | 0x800000u;  // 24-bit significand
  const std::uint32_t shift = 126u - exp;                   // value * 2^24 = mant >> shift; shift in 14 .. 24
  const std::uint32_t q = mant >> shift;
  const std::uint32_t rem = mant & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  const std::uint32_t rounded = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
  return static_cast<f16_bits>(sign | rounded);
}

float bf16_to_f32(bf16_bits h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

// As ggml's GGML_FP32_TO_BF16: NaN keeps its upper 16 bits with the quiet bit forced; everything else rounds to
// nearest even (subnormals kept, not flushed; values near FLT_MAX round to Inf).
bf16_bits f32_to_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<bf16_bits>((x >> 16) | 0x40u);
  return static_cast<bf16_bits>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace tandem::kernels
