// Internal to the kernels library: the dispatch table behind kernels.h. One table per instruction set; each has
// an entry per WType with the activation quantizer and a register-blocked "tile" kernel. kernels.cc drives the
// tiles (row loops for decode, cache blocking for prefill); an ISA file (kernels_avx2.cc, kernels_avx512.cc, later
// kernels_neon.cc) only fills in a table. Adding an ISA: a new Isa value, a new file compiled with its flags, a
// table getter here, and a line in kernels.cc's detection.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.h"
#include "kernels/types.h"

namespace tandem::kernels::detail {

// Prepares one activation row of `cols` floats for weights of one type: act_row_bytes(t, cols) bytes.
using QuantizeActFn = void (*)(const float* x, void* out, std::int64_t cols);

// y[c * ldy + r] = dot(weight row r, activation row c) for r < nr, c < nc, where either nc = 1 and
// 1 <= nr <= decode_rows, or 1 <= nr <= tile_rows (any nr >= 1 with tile_any_rows) and 1 <= nc <= tile_acts.
// Weight row r starts at w + r * w_row_bytes, activation row c at act + c * act_row_bytes.
// Contract that makes batching and thread splits invisible in the results: the floating-point operations that
// produce one output element are the same, in the same order, whatever nr and nc are and wherever the tile
// starts, so an element's value depends only on its weight row and its activation row.
using TileFn = void (*)(const std::uint8_t* w, std::size_t w_row_bytes, int nr, const std::uint8_t* act,
                        std::size_t act_row_bytes, int nc, std::int64_t cols, float* y, std::int64_t ldy);

// A tile that can also read the matrix's side table (kernels.h, aux_bytes): `aux` is the table of the 16-row group
// the tile starts, or nullptr (a tile that does not start on a group boundary, or no table): the same results
// either way, only slower without it.
using TileAuxFn = void (*)(const std::uint8_t* w, std::size_t w_row_bytes, int nr, const std::uint8_t* act,
                           std::size_t act_row_bytes, int nc, std::int64_t cols, float* y, std::int64_t ldy,
                           const std::uint8_t* aux);
// Fills a matrix's side table: `rows` x `cols` weights, rows of w_row_bytes.
using PrepareAuxFn = void (*)(const std::uint8_t* w, std::size_t w_row_bytes, std::int64_t rows, std::int64_t cols,
                              std::uint8_t* aux);

struct TypeKernels {
  QuantizeActFn quantize_act = nullptr;
  TileFn tile = nullptr;
  int decode_rows = 1;  // weight rows of a decode tile (one activation row)
  int tile_rows = 1;    // weight rows of a prefill tile
  int tile_acts = 1;    // activation rows of a prefill tile
  // tile_aux takes any number of rows with nc > 1 (the drivers then pass a thread's rows in one call, so what a call
  // makes of its activations once — the o32 kinds' per-block numbers — is made once per matmul and thread).
  bool tile_any_rows = false;
  TileAuxFn tile_aux = nullptr;        // when set, the drivers call it instead of `tile`
  PrepareAuxFn prepare_aux = nullptr;  // with aux_group_bytes: the side table of a matrix (none when null)
  std::size_t (*aux_group_bytes)(std::int64_t cols) = nullptr;  // side-table bytes per 16 weight rows
};

// What a decode row's attention on the SIMD paths brings into cache before its loops (kernels_avx2_common.h,
// touch_kv_head): the positions' whole key and value rows when they total at most this many bytes; above it (long
// contexts), each kv head's part of them just before its query heads.
inline constexpr std::size_t kTouchRowsBytes = std::size_t{8} << 20;

// kernels.h attention_decode on one path.
using AttentionFn = void (*)(const float* q, std::int64_t heads, std::int64_t kv_heads, std::int64_t hd,
                             const float* k, const float* v, const std::int64_t* slots, std::int64_t pos,
                             std::int64_t window, float scale, float cap, float* scratch, float* out, KvRows rows);

// The same over a pool of f16 keys and values (IEEE binary16 bits).
using AttentionF16Fn = void (*)(const float* q, std::int64_t heads, std::int64_t kv_heads, std::int64_t hd,
                                const std::uint16_t* k, const std::uint16_t* v, const std::int64_t* slots,
                                std::int64_t pos, std::int64_t window, float scale, float cap, float* scratch,
                                float* out, KvRows rows);

struct KernelTable {
  Isa isa = Isa::scalar;
  TypeKernels types[kWTypeCount];  // indexed by WType's value
  AttentionFn attention = nullptr;
  AttentionF16Fn attention_f16 = nullptr;
  void (*to_f16)(const float* x, std::uint16_t* out, std::int64_t n) = nullptr;  // kernels.h f32_to_f16_row
  // rows.h silu_mul: the same bits on every path (silu_lanes.h), 4 / 8 / 16 lanes at a time.
  void (*silu_mul)(const float* gate, const float* up, std::int64_t count, float* out) = nullptr;
  // rows.h rmsnorm_rows and rope_rows: the same bits on every path (rows_lanes.h).
  void (*rmsnorm)(const float* x, const float* w, std::int64_t n, std::int64_t d, float eps, float* out) = nullptr;
  void (*rope)(float* x, std::int64_t n, std::int64_t heads, std::int64_t half, const float* cos_tab,
               const float* sin_tab, bool interleaved) = nullptr;

  const TypeKernels& operator[](WType t) const { return types[static_cast<int>(t)]; }
};

// The scalar reference: quantize_act_ref and vec_dot_ref, one element at a time (kernels.cc).
const KernelTable& scalar_table();
// The reference attention (kernels.cc; the SIMD paths call it for head sizes they do not take).
void ref_attention(const float* q, std::int64_t heads, std::int64_t kv_heads, std::int64_t hd, const float* k,
                   const float* v, const std::int64_t* slots, std::int64_t pos, std::int64_t window, float scale,
                   float cap, float* scratch, float* out, KvRows rows);
void ref_attention_f16(const float* q, std::int64_t heads, std::int64_t kv_heads, std::int64_t hd,
                       const std::uint16_t* k, const std::uint16_t* v, const std::int64_t* slots, std::int64_t pos,
                       std::int64_t window, float scale, float cap, float* scratch, float* out, KvRows rows);
#if defined(TANDEM_KERNELS_HAVE_AVX2)
// AVX2 + FMA + F16C (kernels_avx2.cc). Call only when the CPU has all three.
const KernelTable& avx2_table();
#endif
#if defined(TANDEM_KERNELS_HAVE_AVXVNNI)
// The AVX2 table with the 32-element block types' dot products on AVX-VNNI (kernels_avxvnni.cc): bit for bit the
// AVX2 table's results. Call only when the CPU has AVX-VNNI and AVX2 + FMA + F16C.
const KernelTable& avxvnni_table();
#endif
#if defined(TANDEM_KERNELS_HAVE_AVX512)
// AVX-512 F/BW/VL/VNNI (kernels_avx512.cc): the AVX2 table with 512-bit tiles for the float and 32-element block
// types. Call only when the CPU has those and AVX2 + FMA + F16C.
const KernelTable& avx512_table();
// The same with the bf16 tile on AVX512_BF16's vdpbf16ps (kernels_avx512_bf16.cc). Call only when the CPU has it too.
const KernelTable& avx512bf16_table();
// The avx512bf16 table with AMX-INT8 tiles for q8_0, q4_0, q5_0 and iq4_nl, on matrices repacked at load
// (kernels_amx.cc). Call only when the CPU has AMX-TILE and AMX-INT8 and the kernel granted this process the tile
// data (kernels.cc).
const KernelTable& amx_table();
#endif

}  // namespace tandem::kernels::detail
