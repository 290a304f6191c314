// The kernels over packed copies made at load (kernels.h aux_bytes / prepare_aux: the amx path's 32-element block
// types, the AVX-512 paths' super-block types, q4_1 and q5_1) against the reference, bit for bit, and where the copies
// are asked for; and a decode row's attention (attention_decode) on every path against the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/types.h"

namespace tandem::kernels {
namespace {

using namespace tandem::kernels::testing;

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
      // 21 rows: part of a call's four 16-row groups; 85: two prefill calls, the second's last group short (one
      // decode call of six groups, side by side); 150: two decode calls, the second's groups short.
      for (std::int64_t rows : {21, 85, 150}) {
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

// AVX-VNNI: the AVX2 tiles of the 32-element block types with vpdpbusd for their dot products give the AVX2 table's
// results bit for bit (the same exact int32 lanes), decode and prefill, partial tiles, long rows.
TEST(KernelsMatmul, AvxVnniEqualsAvx2BitForBit) {
  if (!isa_supported(Isa::avxvnni)) GTEST_SKIP() << "NOT RUN: this CPU (or build) has no AVX-VNNI";
  std::mt19937 rng(43);
  for (WType t : {WType::q8_0, WType::q4_0, WType::q5_0, WType::iq4_nl, WType::q4_1, WType::q5_1}) {
    for (std::int64_t cols : {32, 96, 4160}) {
      for (std::int64_t n : {1, 2, 3, 7}) {
        SCOPED_TRACE(tname(t) + " cols=" + std::to_string(cols) + " n=" + std::to_string(n));
        const std::int64_t rows = 21;
        const Bytes w = random_weights(rng, t, rows, cols);
        const Bytes a = random_acts(rng, t, n, cols);
        std::vector<float> y2(static_cast<std::size_t>(rows * n), -1.f), yv(y2.size(), -2.f);
        {
          IsaScope scope(Isa::avx2);
          matmul_rows(t, w.data(), cols, a.data(), n, y2.data(), rows, 0, rows);
        }
        {
          IsaScope scope(Isa::avxvnni);
          ASSERT_EQ(active_isa(), Isa::avxvnni);
          matmul_rows(t, w.data(), cols, a.data(), n, yv.data(), rows, 0, rows);
        }
        ASSERT_EQ(0, std::memcmp(y2.data(), yv.data(), y2.size() * sizeof(float)));
      }
    }
  }
}

// The side tables (packed copies of the matrix) and where they are asked for: every quantized type on every AVX-512
// path (the amx path's own layout for q8_0, q4_0, q5_0 and iq4_nl); every other path and type reads the matrix alone.
bool packed_on(Isa isa, WType t) {
  const bool avx512 = isa == Isa::avx512 || isa == Isa::avx512bf16 || isa == Isa::amx;
  return avx512 && block_elems(t) > 1;
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

// A packed copy of w (rows x cols of type t) against the reference for n activations a, on the active path: called
// on group boundaries (0-16, 16-rows) every element equals vec_dot_ref bit for bit; a range that starts inside a group
// (0-5, 5-rows) reads the rows (the tiles the packed entry replaced), within their tolerance of the same values.
void check_packed(WType t, const Bytes& w, const Bytes& a, std::int64_t rows, std::int64_t cols, std::int64_t n) {
  Bytes x(aux_bytes(t, rows, cols), 0xEE);
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

// q4_0, q5_0, iq4_nl and q8_0 on the avx512 paths' packed copies (not amx: its own layout, above): the reference's
// integers exactly (the unsigned codes' offset taken off through the activation's sum) and its float step, equal to
// vec_dot_ref bit for bit; block counts odd (the scale region's padding) and even, and more than a call's piece of
// 512; decode (eight groups side by side, two calls for 150 rows) and 2 to 8 activations a call over any number of
// rows (tile_any_rows: up to 134 rows, 9 groups, in one call); a range inside a group (the rows' tiles: within their
// tolerance).
TEST(KernelsMatmul, OffsetTypesPackedCopiesEqualTheReferenceBitForBit) {
  std::vector<Isa> isas;
  for (Isa isa : runnable_isas())
    if (isa == Isa::avx512 || isa == Isa::avx512bf16) isas.push_back(isa);
  if (isas.empty()) GTEST_SKIP() << "NOT RUN: this CPU has no AVX-512 VNNI path";
  std::mt19937 rng(37);
  for (Isa isa : isas) {
    IsaScope scope(isa);
    for (WType t : {WType::q4_0, WType::q5_0, WType::iq4_nl, WType::q8_0}) {
      for (std::int64_t cols : {32, 96, 768, 4160, 16480}) {  // 16480: 515 blocks, more than a call's 512 at a time
        for (std::int64_t rows : {21, 85, 150}) {
          for (std::int64_t n : {1, 2, 8, 9, 20}) {
            // 16480 columns with 85 rows and 2 activations: a call's 69 rows past the first group are 5 groups, more
            // than kGroups, each 4 remaking the numbers of 2 pieces.
            if (cols > 4160 && (rows > 85 || n > 9 || (rows > 21 && n != 2))) continue;
            SCOPED_TRACE(std::string(isa_name(isa)) + " " + tname(t) + " cols=" + std::to_string(cols) +
                         " rows=" + std::to_string(rows) + " n=" + std::to_string(n));
            const Bytes w = random_weights(rng, t, rows, cols);
            const Bytes a = random_acts(rng, t, n, cols);
            const std::int64_t nb = cols / 32;
            // Per group: 16 rows' bytes, and 32 for an odd block count (the scale region padded to a cache line).
            ASSERT_EQ(aux_bytes(t, rows, cols),
                      static_cast<std::size_t>((rows + 15) / 16) * (16 * row_bytes(t, cols) + (nb % 2 ? 32 : 0)));
            ASSERT_NO_FATAL_FAILURE(check_packed(t, w, a, rows, cols, n));
          }
        }
      }
    }
  }
}

// The super-block types, q4_1 and q5_1 on the AVX-512 paths' packed copies compute the reference's integers exactly
// and its float step in its order (e.g. sum += d * float(isum) - dmin * float(msum)): equal to vec_dot_ref bit for
// bit, decode and prefill, partial groups, two calls, 1 to 8 activations per call (on amx, q4_1 and q5_1 take the
// AMX tiles from 17 activations: 20 is a group of 16 and one of 4); from the rows (the tiles of the table the packed
// entry replaced) within their tolerance.
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
          ASSERT_NO_FATAL_FAILURE(check_packed(t, w, a, rows, cols, n));
        }
      }
    }
  }
}

// attention_decode on every path against the reference (double sums, std::exp): grouped heads, head sizes with and
// without a partial vector (20, 80, 96) and beyond the SIMD paths' 256 (the reference then), a sliding window, soft
// capping, large scores (exp's range), positions read through shuffled pool slots — the other pool rows hold NaN, so
// a read outside the item's slots shows — and rows past kTouchRowsBytes (16 heads of 128 over 601 positions: 9.8 MB
// of f32 keys and values, read into cache per kv head; 4.9 MB in f16, whole rows). The pool in f32 and in f16; each
// head's result alone the same bit for bit, and each kv head's as a prompt chunk's rows ask for it.
TEST(KernelsAttention, EveryPathMatchesTheReference) {
  struct Case {
    std::int64_t heads, kv_heads, hd, pos, window;
    float cap, spread;
  };
  const Case cases[] = {{4, 4, 64, 0, 0, 0.F, 1.F},   {8, 2, 64, 37, 0, 0.F, 1.F},  {6, 3, 80, 300, 0, 0.F, 1.F},
                        {4, 1, 96, 129, 16, 0.F, 1.F}, {2, 2, 256, 70, 0, 50.F, 1.F}, {3, 3, 20, 9, 4, 0.F, 1.F},
                        {2, 1, 64, 200, 0, 0.F, 8.F},  {2, 2, 320, 33, 0, 0.F, 1.F}, {16, 16, 128, 600, 0, 0.F, 1.F}};
  static_assert(601 * 16 * 128 * sizeof(float) * 2 > detail::kTouchRowsBytes &&
                601 * 16 * 128 * sizeof(std::uint16_t) * 2 <= detail::kTouchRowsBytes);
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
      // This case's attention on path `on` over the pool (kp, vp): f32 or f16 values.
      const auto attend = [&](Isa on, const auto* kp, const auto* vp, std::vector<float>& o) {
        IsaScope scope(on);
        attention_decode(q.data(), c.heads, c.kv_heads, c.hd, kp, vp, slots.data(), c.pos, c.window, scale, c.cap,
                         scratch.data(), o.data());
      };
      attend(Isa::scalar, k.data(), v.data(), ref);
      attend(isa, k.data(), v.data(), out);
      for (std::size_t i = 0; i < out.size(); ++i) {
        ASSERT_TRUE(std::isfinite(ref[i]));
        ASSERT_NEAR(out[i], ref[i], 2e-5 * (1.0 + std::fabs(ref[i]))) << "element " << i;
      }
      // The same pool in f16 (the CPU layers' KV pool): each path within the same bound of the f16 reference, and
      // the f16 reference exactly the f32 reference over the f16-rounded values (the widening is exact).
      std::vector<std::uint16_t> k16(k.size()), v16(v.size());
      std::vector<float> kr(k.size()), vr(v.size());
      for (std::size_t i = 0; i < k.size(); ++i) {
        k16[i] = f32_to_f16(k[i]);
        v16[i] = f32_to_f16(v[i]);
        kr[i] = f16_to_f32(k16[i]);
        vr[i] = f16_to_f32(v16[i]);
      }
      std::vector<float> out16(q.size()), ref16(q.size()), ref_rounded(q.size());
      attend(Isa::scalar, k16.data(), v16.data(), ref16);
      attend(Isa::scalar, kr.data(), vr.data(), ref_rounded);
      attend(isa, k16.data(), v16.data(), out16);
      for (std::size_t i = 0; i < out16.size(); ++i) {
        ASSERT_TRUE(same_bits(ref16[i], ref_rounded[i])) << "f16 reference, element " << i;
        ASSERT_NEAR(out16[i], ref16[i], 2e-5 * (1.0 + std::fabs(ref16[i]))) << "f16 pool, element " << i;
      }
      // Each head alone (one query head over a pool of its kv head's elements only) gives that head's result bit for
      // bit: a head's operations do not depend on the others.
      for (std::int64_t h = 0; h < c.heads; ++h) {
        const std::int64_t kvh = h / (c.heads / c.kv_heads);
        std::vector<float> k1(static_cast<std::size_t>(slots_n * c.hd)), v1 = k1, q1(q.begin() + h * c.hd,
                                                                                      q.begin() + (h + 1) * c.hd);
        for (std::int64_t s = 0; s < slots_n; ++s)
          for (std::int64_t e = 0; e < c.hd; ++e) {
            k1[static_cast<std::size_t>(s * c.hd + e)] = k[static_cast<std::size_t>(s * row + kvh * c.hd + e)];
            v1[static_cast<std::size_t>(s * c.hd + e)] = v[static_cast<std::size_t>(s * row + kvh * c.hd + e)];
          }
        std::vector<float> one(static_cast<std::size_t>(c.hd));
        {
          IsaScope scope(isa);
          attention_decode(q1.data(), 1, 1, c.hd, k1.data(), v1.data(), slots.data(), c.pos, c.window, scale, c.cap,
                           scratch.data(), one.data());
        }
        for (std::int64_t e = 0; e < c.hd; ++e)
          ASSERT_TRUE(same_bits(one[static_cast<std::size_t>(e)], out[static_cast<std::size_t>(h * c.hd + e)]))
              << "head " << h << " alone, element " << e;
      }
      // As a prompt chunk's rows call it (engine attention_rows): one kv head's query heads over the same pool, its
      // slots scaled to that head's part of the rows (slot · kv_heads + g, rows of hd elements), with the pass that
      // brings the rows into cache (cold) and without it (cached): each head's result bit for bit, f32 and f16.
      const std::int64_t group = c.heads / c.kv_heads;
      for (KvRows rows : {KvRows::cold, KvRows::cached})
        for (std::int64_t g = 0; g < c.kv_heads; ++g) {
          std::vector<std::int64_t> head_slots(slots.size());
          for (std::size_t j = 0; j < slots.size(); ++j) head_slots[j] = slots[j] * c.kv_heads + g;
          std::vector<float> part(static_cast<std::size_t>(group * c.hd)), part16(part.size());
          {
            IsaScope scope(isa);
            attention_decode(q.data() + g * group * c.hd, group, 1, c.hd, k.data(), v.data(), head_slots.data(), c.pos,
                             c.window, scale, c.cap, scratch.data(), part.data(), rows);
            attention_decode(q.data() + g * group * c.hd, group, 1, c.hd, k16.data(), v16.data(), head_slots.data(),
                             c.pos, c.window, scale, c.cap, scratch.data(), part16.data(), rows);
          }
          for (std::size_t e = 0; e < part.size(); ++e) {
            const std::size_t at = static_cast<std::size_t>(g * group * c.hd) + e;
            ASSERT_TRUE(same_bits(part[e], out[at])) << "kv head " << g << " through its slots, element " << e;
            ASSERT_TRUE(same_bits(part16[e], out16[at])) << "kv head " << g << " through its slots (f16), element " << e;
          }
        }
    }
  }
}

}  // namespace
}  // namespace tandem::kernels
