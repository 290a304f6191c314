// What the AMX files share (kernels_amx.cc, kernels_amx_sb.cc): a call's shape, the tile configuration's layout,
// and the base entries the tiles fall back on. Like kernels_avx512_common.h, everything is in an anonymous
// namespace (one copy per file) and may be included only by files built with the AMX flags.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/dispatch.h"

namespace tandem::kernels::detail {
namespace {

constexpr int kRows = 16;    // weight rows of a group (B tile columns)
// A call covers up to kGroups groups (tile_rows, decode_rows; the decode of the q8_0-family packed types up to
// kDecodeGroups): the activations' preparation (their scales for prefill, their unsigned bytes for decode) is shared
// by the groups.
constexpr int kGroups = 4;
constexpr int kDecodeGroups = 8;
constexpr int kActs = 128;   // activation rows per call, in groups of 16 (A tile rows)

// The tile configuration's memory layout (palette 1: per tile register its rows and bytes per row). Each tile loop
// loads its own (kernels_amx.cc configure: two sets of C, A, B; kernels_amx_sb.cc configure_sb: four C, two A, two
// B) at the start of every call: other code on the thread (oneDNN inside LibTorch may use AMX too) can have released
// or replaced the configuration since the previous call, so none is assumed to survive between calls.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// The avx512 table's entries of the types whose tiles read its packed layouts (q4_1, q5_1, the super-block types):
// the vector form over the same layout (8 activations per call; the AVX2 tiles without it), which the tiles call for
// few activations or without the side table. Set once per file, with the table.
TypeKernels g_base[kWTypeCount];

// The base entry of type T, kActs activations at a time in pieces of its tile_acts.
template <WType T>
void base_entry(const std::uint8_t* w, std::size_t wrb, int nr, const std::uint8_t* a, std::size_t arb, int nc,
                std::int64_t cols, float* y, std::int64_t ldy, const std::uint8_t* aux) {
  const TypeKernels& base = g_base[static_cast<int>(T)];
  for (int c0 = 0; c0 < nc; c0 += base.tile_acts)
    base.tile_aux(w, wrb, nr, a + static_cast<std::size_t>(c0) * arb, arb, std::min(base.tile_acts, nc - c0), cols,
                  y + c0 * ldy, ldy, aux);
}

}  // namespace
}  // namespace tandem::kernels::detail
