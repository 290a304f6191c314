// AMX-INT8 tiles of the 256-element super-block types (q4_K, q5_K, iq4_xs; q6_K, q3_K, q2_K) over the packed layouts
// kernels_avx512_k.cc makes (kernels_avx512_sb.h): built with -mamx-tile -mamx-int8 like kernels_amx.cc, whose table
// takes these entries (amx_superblock_kernels); called only after its CPU check.
#include <immintrin.h>

#include "kernels/kernels_amx.h"
#include "kernels/kernels_amx_common.h"
#include "kernels/kernels_avx512_common.h"
#include "kernels/kernels_avx512_sb.h"

namespace tandem::kernels::detail {
namespace {

// Over kernels_avx512_sb.h's packed layout, per 16-row group and super-block: the 8 units' levels (unsigned bytes,
// B order) stored once as B tiles; per group of up to 16 activations and per part — a sub-block of 32 (q4_K's
// kinds: 8 parts, A 32 bytes, B 8 rows) or of 16 (q6_K's: 16 parts, A 16 bytes, B the unit's 4 rows of that half) —
// one TDPBSUD (the activations' signed bytes, the levels unsigned) gives every pair's exact Σ q·a of the part. Then,
// per activation and with rows in lanes, the vector kernels' integer steps (kernels_avx512_k.cc k32_group /
// k16_group: the scales by vpmullo, the mins or offsets through the bsums by vpdpwssd) and the type's float step.
// The integers are exact, so the results are the reference's bit for bit, as the vector form's.

// Activation counts below this take the vector form. Measured per matrix on one thread (bench_kernels' Batch/q4_K
// and q6_K), the tiles were level or 12 % slower at 4 activations, level or 5 % faster at 8 and 20-25 % faster at 16;
// but through the daemon (8 streams, two threads: bench/daemon/streams.sh) 8 activations on the tiles were 7-10 %
// slower in three alternating runs. So continuous batching's steps up to 15 keep the vector form.
constexpr int kTileMinActsSb = 16;

// The tile configuration of the super-block tiles: tmm0-3 four parts' C (m activations x 16 int32), tmm4-5 A (m x
// kb bytes: 32 or 16), tmm6-7 B (kb / 4 rows of 64 bytes). Four parts run before their C tiles are stored, A and B
// alternating between two registers, so the tile unit overlaps them (one register set serialized them: measured
// slower than the vector form).
inline void configure_sb(int m, int kb) {
  TileConfig c;
  for (int t = 0; t < 4; ++t) {
    c.rows[t] = static_cast<std::uint8_t>(m);
    c.colsb[t] = 64;
  }
  for (int t = 4; t < 6; ++t) {
    c.rows[t] = static_cast<std::uint8_t>(m);
    c.colsb[t] = static_cast<std::uint16_t>(kb);
  }
  for (int t = 6; t < 8; ++t) {
    c.rows[t] = static_cast<std::uint8_t>(kb / 4);
    c.colsb[t] = 64;
  }
  _tile_loadconfig(&c);
}

constexpr std::size_t kSbAhead = 4;  // super-blocks prefetched ahead

template <class K, int kParts>
void amx_sb_tiles(const std::uint8_t* aux, std::size_t group_bytes, int nr, const std::uint8_t* a, std::size_t arb,
                  int nc, std::int64_t nb, float* y, std::int64_t ldy) {
  constexpr int kKb = QK_K / 8 / (kParts / 8);  // bytes of a part: 32 or 16
  constexpr std::size_t kBytes = sb_bytes<K>();
  const int ng = (nr + kRows - 1) / kRows;
  // Groups of 16 activations (or all of them when fewer); a last short group is copied into `pad` (zero rows after
  // it) per super-block, so that one configuration serves the call.
  const int m = std::min(nc, 16);
  configure_sb(m, kKb);
  alignas(64) std::int8_t bbuf[8 * 512];
  alignas(64) std::int32_t cbuf[kParts][16][16];
  alignas(64) float sums[kActs][16];
  alignas(64) std::int8_t pad[16][QK_K] = {};
  for (int g = 0; g < ng; ++g) {
    for (int c = 0; c < nc; ++c) _mm512_store_ps(sums[c], _mm512_setzero_ps());
    const std::uint8_t* grp = aux + static_cast<std::size_t>(g) * group_bytes;
    for (std::int64_t i = 0; i < nb; ++i) {
      const std::uint8_t* p = grp + static_cast<std::size_t>(i) * kBytes;
      for (int u = 0; u < 8; ++u) {
        // The super-block kSbAhead on (this group's or the next group's: the groups lie one after the other).
        prefetch_eighth(p + kSbAhead * kBytes, kBytes, u);
        __m512i wv[8];
        K::levels(p + K::kHead + K::kUnit * u, wv);
        TANDEM_UNROLL
        for (int k = 0; k < 8; ++k) _mm512_store_si512(bbuf + 512 * u + 64 * k, wv[k]);
      }
      for (int m0 = 0; m0 < nc; m0 += 16) {
        const int mg = std::min(16, nc - m0);
        const auto* first = reinterpret_cast<const BlockQ8_K*>(a + static_cast<std::size_t>(m0) * arb) + i;
        const std::int8_t* qs = first->qs;
        long stride = static_cast<long>(arb);
        if (mg < m) {
          for (int r = 0; r < mg; ++r)
            std::memcpy(pad[r], (reinterpret_cast<const BlockQ8_K*>(a + static_cast<std::size_t>(m0 + r) * arb) + i)->qs, QK_K);
          qs = pad[0];
          stride = QK_K;
        }
        // Part q: A the activations' bytes kKb q.., B its unit's rows (a unit is 32 elements, 8 B rows of 64 bytes).
        for (int q = 0; q < kParts; q += 4) {
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
          _tile_loadd(4, qs + kKb * q, stride);
          _tile_loadd(6, bbuf + kKb * 16 * q, 64);
          _tile_dpbsud(0, 4, 6);
          _tile_loadd(5, qs + kKb * (q + 1), stride);
          _tile_loadd(7, bbuf + kKb * 16 * (q + 1), 64);
          _tile_dpbsud(1, 5, 7);
          _tile_loadd(4, qs + kKb * (q + 2), stride);
          _tile_loadd(6, bbuf + kKb * 16 * (q + 2), 64);
          _tile_dpbsud(2, 4, 6);
          _tile_loadd(5, qs + kKb * (q + 3), stride);
          _tile_loadd(7, bbuf + kKb * 16 * (q + 3), 64);
          _tile_dpbsud(3, 5, 7);
          _tile_stored(0, cbuf[q], 64);
          _tile_stored(1, cbuf[q + 1], 64);
          _tile_stored(2, cbuf[q + 2], 64);
          _tile_stored(3, cbuf[q + 3], 64);
        }
        for (int c = 0; c < mg; ++c) {
          const auto& act = reinterpret_cast<const BlockQ8_K*>(a + static_cast<std::size_t>(m0 + c) * arb)[i];
          __m512i isum = _mm512_setzero_si512(), msum = _mm512_setzero_si512();
          if constexpr (kParts == 8) {
            TANDEM_UNROLL
            for (int j = 0; j < 8; ++j) {
              const __m512i sc = K::scale(p, j);
              k32_part(_mm512_load_si512(cbuf[j][c]), sc, K::pair(p, j, sc), act.bsums, j, isum, msum);
            }
          } else {
            TANDEM_UNROLL
            for (int u = 0; u < 8; ++u) {
              const __m512i sa = K::scale(p, 2 * u);
              const __m512i sb = K::scale(p, 2 * u + 1);
              k16_part(_mm512_load_si512(cbuf[2 * u][c]), _mm512_load_si512(cbuf[2 * u + 1][c]), sa, sb,
                       K::pair(p, u, sa, sb), act.bsums, u, isum, msum);
            }
          }
          _mm512_store_ps(sums[m0 + c], _mm512_add_ps(_mm512_load_ps(sums[m0 + c]), K::step(p, act.d, isum, msum)));
        }
      }
    }
    for (int c = 0; c < nc; ++c)
      _mm512_mask_storeu_ps(y + c * ldy + g * kRows, first16(nr - g * kRows), _mm512_load_ps(sums[c]));
  }
  _tile_release();
}

template <class K, int kParts, WType T>
void amx_sb_tile(const std::uint8_t* w, std::size_t wrb, int nr, const std::uint8_t* a, std::size_t arb, int nc,
                 std::int64_t cols, float* y, std::int64_t ldy, const std::uint8_t* aux) {
  if (aux == nullptr || nc < kTileMinActsSb) return base_entry<T>(w, wrb, nr, a, arb, nc, cols, y, ldy, aux);
  amx_sb_tiles<K, kParts>(aux, sb_group_bytes<K>(cols), nr, a, arb, nc, cols / QK_K, y, ldy);
}

}  // namespace

TypeKernels amx_superblock_kernels(WType t, const TypeKernels& base) {
  TileAuxFn tile = nullptr;
  switch (t) {
    case WType::q4_K: tile = amx_sb_tile<Q4KKind, 8, WType::q4_K>; break;
    case WType::q5_K: tile = amx_sb_tile<Q5KKind, 8, WType::q5_K>; break;
    case WType::iq4_xs: tile = amx_sb_tile<IQ4XSKind, 8, WType::iq4_xs>; break;
    case WType::q6_K: tile = amx_sb_tile<Q6KKind, 16, WType::q6_K>; break;
    case WType::q3_K: tile = amx_sb_tile<Q3KKind, 16, WType::q3_K>; break;
    case WType::q2_K: tile = amx_sb_tile<Q2KKind, 16, WType::q2_K>; break;
    default: return base;
  }
  g_base[static_cast<int>(t)] = base;
  TypeKernels k = base;  // its activation quantizer, packed layout (prepare, group bytes)
  k.tile = nullptr;
  k.tile_aux = tile;
  k.tile_any_rows = false;
  k.decode_rows = kGroups * kRows;
  k.tile_rows = kGroups * kRows;
  k.tile_acts = kActs;
  return k;
}

}  // namespace tandem::kernels::detail
