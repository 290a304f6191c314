// Weight types and their block layouts, byte for byte as llama.cpp / ggml stores them in GGUF files, so a file
// moves between Tandem and llama.cpp / Ollama unchanged. Torch-free, dependency-free (a header of the kernels
// library). The quantization *semantics* (how activations are prepared for each weight type, how dot products
// are accumulated) are written down in docs/kernels.md; every device implements the same meaning.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tandem::kernels {

// Weight (tensor) types Tandem computes with. Values are our own; ggml's type ids are in ggml_type_id().
enum class WType : std::uint8_t {
  f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K, q5_0, q4_1, q5_1, iq4_nl, iq4_xs, q2_K, q3_K
};
inline constexpr WType kAllWTypes[] = {WType::f32,  WType::f16,    WType::bf16,   WType::q8_0, WType::q4_0,
                                       WType::q4_K, WType::q5_K,   WType::q6_K,   WType::q5_0, WType::q4_1,
                                       WType::q5_1, WType::iq4_nl, WType::iq4_xs, WType::q2_K, WType::q3_K};
inline constexpr int kWTypeCount = static_cast<int>(sizeof(kAllWTypes) / sizeof(kAllWTypes[0]));

// Formats of a prepared activation row (what the weights' dot product consumes): llama.cpp's "vec_dot_type".
enum class AType : std::uint8_t { f32, f16, bf16, q8_0, q8_K, q8_1 };

inline constexpr int QK4_0 = 32;
inline constexpr int QK5_0 = 32;
inline constexpr int QK4_1 = 32;
inline constexpr int QK5_1 = 32;
inline constexpr int QK8_1 = 32;
inline constexpr int QK8_0 = 32;
inline constexpr int QK4_NL = 32;
inline constexpr int QK_K = 256;
inline constexpr int K_SCALE_SIZE = 12;

using f16_bits = std::uint16_t;   // IEEE binary16, stored little-endian
using bf16_bits = std::uint16_t;  // bfloat16 (upper half of an f32)

// ggml block_q4_0: x[i] = d * ((q & 0xF) - 8); element j (< 16) is the low nibble of qs[j], element j + 16 the
// high nibble.
struct BlockQ4_0 {
  f16_bits d;
  std::uint8_t qs[QK4_0 / 2];
};
// ggml block_q5_0: x[i] = d * (q - 16) with q in [0, 31]: the low 4 bits of element j (< 16) are the low nibble of
// qs[j], of element j + 16 the high nibble; the fifth bit of element j (0..31) is bit j of qh (little-endian u32).
struct BlockQ5_0 {
  f16_bits d;
  std::uint8_t qh[4];
  std::uint8_t qs[QK5_0 / 2];
};
// ggml block_q4_1: x[i] = d * q + m with q in [0, 15] laid out as q4_0's.
struct BlockQ4_1 {
  f16_bits d;
  f16_bits m;
  std::uint8_t qs[QK4_1 / 2];
};
// ggml block_q5_1: x[i] = d * q + m with q in [0, 31] laid out as q5_0's.
struct BlockQ5_1 {
  f16_bits d;
  f16_bits m;
  std::uint8_t qh[4];
  std::uint8_t qs[QK5_1 / 2];
};
// ggml block_q8_1 (activations only, for q4_1 / q5_1): x = d * qs; s = d * sum(qs) (f16), for the weights' m.
struct BlockQ8_1 {
  f16_bits d;
  f16_bits s;
  std::int8_t qs[QK8_1];
};
// ggml block_q8_0: x[i] = d * qs[i].
struct BlockQ8_0 {
  f16_bits d;
  std::int8_t qs[QK8_0];
};
// ggml block_q2_K: 16 sub-blocks of 16, each with a 4-bit scale (low nibble of scales[j]) and a 4-bit min (high
// nibble); 2-bit levels q (element j + 32 s of each 128-element half in bits 2s of byte j of that half's 32 bytes);
// x = d * (sc & 15) * q - dmin * (sc >> 4).
struct BlockQ2_K {
  std::uint8_t scales[QK_K / 16];
  std::uint8_t qs[QK_K / 4];
  f16_bits d;
  f16_bits dmin;
};
// ggml block_q3_K: 16 sub-blocks of 16 with signed 6-bit scales (low 4 bits in scales[0..7]'s nibbles, high 2 bits
// in scales[8..11]); levels in [-4, 3]: two low bits laid out as q2_K's, the third (set = +0, clear = -4) in bit
// k / 32 of hmask[k % 32]; x = d * (scale - 32) * level.
struct BlockQ3_K {
  std::uint8_t hmask[QK_K / 8];
  std::uint8_t qs[QK_K / 4];
  std::uint8_t scales[12];
  f16_bits d;
};
// ggml block_q4_K: 8 sub-blocks of 32, 6-bit scales and mins packed in `scales` (get_scale_min_k4), 4-bit quants;
// x = d * sc * q - dmin * m.
struct BlockQ4_K {
  f16_bits d;
  f16_bits dmin;
  std::uint8_t scales[K_SCALE_SIZE];
  std::uint8_t qs[QK_K / 2];
};
// ggml block_q5_K: as q4_K with a fifth bit per quant in qh.
struct BlockQ5_K {
  f16_bits d;
  f16_bits dmin;
  std::uint8_t scales[K_SCALE_SIZE];
  std::uint8_t qh[QK_K / 8];
  std::uint8_t qs[QK_K / 2];
};
// ggml block_q6_K: 16 sub-blocks of 16, 8-bit signed scales, 6-bit quants (low 4 bits in ql, high 2 in qh);
// x = d * scale * (q - 32).
struct BlockQ6_K {
  std::uint8_t ql[QK_K / 2];
  std::uint8_t qh[QK_K / 4];
  std::int8_t scales[QK_K / 16];
  f16_bits d;
};
// ggml block_iq4_nl: x[i] = d * kvalues_iq4nl[q] (a fixed non-linear table of 16 int8 levels, quant_iq4.h), the
// 4-bit indices laid out as q4_0's.
struct BlockIQ4_NL {
  f16_bits d;
  std::uint8_t qs[QK4_NL / 2];
};
// ggml block_iq4_xs: 8 sub-blocks of 32, each with a 6-bit scale ls (low 4 bits: nibble ib % 2 of scales_l[ib / 2];
// high 2: bits 2ib, 2ib+1 of scales_h); x = d * (ls - 32) * kvalues_iq4nl[q]; sub-block ib's indices are qs[16ib ..
// 16ib + 15] laid out as q4_0's.
struct BlockIQ4_XS {
  f16_bits d;
  std::uint16_t scales_h;
  std::uint8_t scales_l[QK_K / 64];
  std::uint8_t qs[QK_K / 2];
};
// ggml block_q8_K (activations only): x = d * qs; bsums[j] = sum of qs[16j .. 16j+15].
struct BlockQ8_K {
  float d;
  std::int8_t qs[QK_K];
  std::int16_t bsums[QK_K / 16];
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);

struct TypeTraits {
  std::string_view name;    // "f32", "f16", "bf16", "q8_0", "q4_0", "q4_K", ..., "iq4_nl", "iq4_xs" (ggml's spelling)
  int ggml_id;              // ggml_type value in GGUF files
  int block_elems;          // elements per block (1 for the float types)
  std::size_t block_bytes;  // bytes per block
  AType act;                // activation format its dot product consumes
};

const TypeTraits& traits(WType t);
std::string_view wtype_name(WType t);
std::optional<WType> wtype_from_name(std::string_view name);  // ggml spelling, case-insensitive ("Q4_K" too)
std::optional<WType> wtype_from_ggml(int ggml_id);            // nullopt: a ggml type we do not compute with

// Bytes of one row of `cols` elements; cols must be a multiple of block_elems (0 if not).
std::size_t row_bytes(WType t, std::int64_t cols);
// Bytes of one prepared activation row of `cols` elements for weights of type t.
std::size_t act_row_bytes(WType t, std::int64_t cols);

// Scalar conversions (IEEE round-to-nearest-even; NaN stays NaN).
float f16_to_f32(f16_bits h);
f16_bits f32_to_f16(float f);
float bf16_to_f32(bf16_bits h);
bf16_bits f32_to_bf16(float f);  // round to nearest even, as ggml's GGML_FP32_TO_BF16

}  // namespace tandem::kernels
