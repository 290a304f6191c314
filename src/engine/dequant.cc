#include "engine/dequant.h"

#include <ATen/ATen.h>

namespace tandem::engine {

namespace {

using kernels::WType;

// Blocks as [N, block_bytes] uint8.
at::Tensor blocks_of(const at::Tensor& stored, WType t) {
  const auto bb = static_cast<std::int64_t>(kernels::traits(t).block_bytes);
  return stored.contiguous().view({-1, bb});
}

// A little-endian f16 field at byte `off` of each block, as f32 [N, 1].
at::Tensor half_at(const at::Tensor& b, std::int64_t off) {
  return b.narrow(1, off, 2).contiguous().view(at::kHalf).to(at::kFloat);
}

at::Tensor u8(const at::Tensor& b, std::int64_t off, std::int64_t len) { return b.narrow(1, off, len); }

at::Tensor lo4(const at::Tensor& q) { return at::bitwise_and(q, 0x0F); }
at::Tensor hi4(const at::Tensor& q) { return at::bitwise_right_shift(q, 4); }

// The 6-bit scales and mins of q4_K / q5_K (ggml's get_scale_min_k4), as f32 [N, 8] each.
std::pair<at::Tensor, at::Tensor> scale_min_k4(const at::Tensor& s) {
  const at::Tensor a = s.narrow(1, 0, 4), b = s.narrow(1, 4, 4), c = s.narrow(1, 8, 4);
  const at::Tensor sc = at::cat({at::bitwise_and(a, 63),
                                 at::bitwise_or(at::bitwise_and(c, 0x0F),
                                                at::bitwise_left_shift(at::bitwise_right_shift(a, 6), 4))},
                                1);
  const at::Tensor mn = at::cat({at::bitwise_and(b, 63),
                                 at::bitwise_or(at::bitwise_right_shift(c, 4),
                                                at::bitwise_left_shift(at::bitwise_right_shift(b, 6), 4))},
                                1);
  return {sc.to(at::kFloat), mn.to(at::kFloat)};
}

at::Tensor q8_0(const at::Tensor& b) {
  const at::Tensor d = half_at(b, 0);
  const at::Tensor q = u8(b, 2, 32).contiguous().view(at::kChar).to(at::kFloat);
  return d * q;  // x = d * q
}

at::Tensor q4_0(const at::Tensor& b) {
  const at::Tensor d = half_at(b, 0);
  const at::Tensor qs = u8(b, 2, 16);
  const at::Tensor q = at::cat({lo4(qs), hi4(qs)}, 1).to(at::kFloat) - 8.0f;  // exact: small integers
  return q * d;  // x = (q - 8) * d
}

// q5_0: element k's fifth bit is bit k % 8 of qh byte k / 8 (qh a little-endian u32); x = (q - 16) * d.
at::Tensor q5_0(const at::Tensor& b) {
  const std::int64_t N = b.size(0);
  const at::Tensor d = half_at(b, 0);
  const at::Tensor qh = u8(b, 2, 4).unsqueeze(2);  // [N, 4, 1]
  const at::Tensor bits = at::arange(8, b.options().dtype(at::kByte)).view({1, 1, 8});
  const at::Tensor high =
      at::bitwise_left_shift(at::bitwise_and(at::bitwise_right_shift(qh, bits), 1), 4).reshape({N, 32});
  const at::Tensor qs = u8(b, 6, 16);
  const at::Tensor q = at::bitwise_or(at::cat({lo4(qs), hi4(qs)}, 1), high).to(at::kFloat) - 16.0f;
  return q * d;
}

// q4_1 / q5_1: d and m at 0 and 2, the levels as q4_0's / q5_0's (qh at 4, qs at 8 for q5_1); x = q * d + m.
at::Tensor q4_1(const at::Tensor& b) {
  const at::Tensor d = half_at(b, 0), m = half_at(b, 2);
  const at::Tensor qs = u8(b, 4, 16);
  return at::cat({lo4(qs), hi4(qs)}, 1).to(at::kFloat) * d + m;
}

at::Tensor q5_1(const at::Tensor& b) {
  const std::int64_t N = b.size(0);
  const at::Tensor d = half_at(b, 0), m = half_at(b, 2);
  const at::Tensor qh = u8(b, 4, 4).unsqueeze(2);  // [N, 4, 1]
  const at::Tensor bits = at::arange(8, b.options().dtype(at::kByte)).view({1, 1, 8});
  const at::Tensor high =
      at::bitwise_left_shift(at::bitwise_and(at::bitwise_right_shift(qh, bits), 1), 4).reshape({N, 32});
  const at::Tensor qs = u8(b, 8, 16);
  return at::bitwise_or(at::cat({lo4(qs), hi4(qs)}, 1), high).to(at::kFloat) * d + m;
}

// q4_K: chunk c of 32 bytes holds sub-block 2c in its low nibbles and 2c+1 in its high nibbles;
// x = (d * sc) * q - (dmin * m).
at::Tensor q4_K(const at::Tensor& b) {
  const std::int64_t N = b.size(0);
  const at::Tensor d = half_at(b, 0), dmin = half_at(b, 2);
  auto [sc, mn] = scale_min_k4(u8(b, 4, 12));
  const at::Tensor qs = u8(b, 16, 128).reshape({N, 4, 1, 32});
  const at::Tensor q = at::cat({lo4(qs), hi4(qs)}, 2).reshape({N, 8, 32}).to(at::kFloat);
  const at::Tensor D = (d * sc).unsqueeze(2), M = (dmin * mn).unsqueeze(2);
  return (D * q - M).reshape({N, 256});
}

// q5_K: as q4_K with bit s of qh[l] (l in 0..31) the fifth bit of element l of sub-block s.
at::Tensor q5_K(const at::Tensor& b) {
  const std::int64_t N = b.size(0);
  const at::Tensor d = half_at(b, 0), dmin = half_at(b, 2);
  auto [sc, mn] = scale_min_k4(u8(b, 4, 12));
  const at::Tensor qh = u8(b, 16, 32).unsqueeze(1);  // [N, 1, 32]
  const at::Tensor bits = at::arange(8, b.options().dtype(at::kByte)).view({1, 8, 1});
  const at::Tensor high = at::bitwise_left_shift(at::bitwise_and(at::bitwise_right_shift(qh, bits), 1), 4);
  const at::Tensor qs = u8(b, 48, 128).reshape({N, 4, 1, 32});
  const at::Tensor low = at::cat({lo4(qs), hi4(qs)}, 2).reshape({N, 8, 32});
  const at::Tensor q = at::bitwise_or(low, high).to(at::kFloat);
  const at::Tensor D = (d * sc).unsqueeze(2), M = (dmin * mn).unsqueeze(2);
  return (D * q - M).reshape({N, 256});
}

// q6_K: two halves of 128 elements; half h uses ql[64h .. 64h+63], qh[32h .. 32h+31], scales[8h .. 8h+7].
// Element 32k + l (k = 0..3, l = 0..31) of a half: low 4 bits from ql[l + 32 (k & 1)] (k < 2: low nibble, else
// high), high 2 bits from qh[l] >> 2k; scale index l / 16 + 2k; x = (d * sc) * (q - 32).
at::Tensor q6_K(const at::Tensor& b) {
  const std::int64_t N = b.size(0);
  const at::Tensor ql = u8(b, 0, 128).reshape({N, 2, 2, 32});   // [N, half, j, l]: ql[64h + 32j + l]
  const at::Tensor qh = u8(b, 128, 64).reshape({N, 2, 1, 32});  // [N, half, 1, l]
  const at::Tensor sc = u8(b, 192, 16).contiguous().view(at::kChar).to(at::kFloat).reshape({N, 2, 4, 2});
  const at::Tensor d = half_at(b, 208).reshape({N, 1, 1, 1});
  const at::Tensor low = at::cat({lo4(ql), hi4(ql)}, 2);  // [N, half, k = 0..3, l]: k = 0,1 low; 2,3 high
  const at::Tensor shifts = at::arange(0, 8, 2, b.options().dtype(at::kByte)).view({1, 1, 4, 1});
  const at::Tensor high = at::bitwise_and(at::bitwise_right_shift(qh, shifts), 3);
  const at::Tensor q = (at::bitwise_or(low, at::bitwise_left_shift(high, 4)).to(at::kFloat) - 32.0f)
                           .reshape({N, 2, 4, 2, 16});  // l = 16 * (l / 16) + l % 16
  const at::Tensor D = (d * sc).unsqueeze(4);            // [N, half, k, l / 16, 1]
  return (D * q).reshape({N, 256});
}

// The 2-bit fields of q2_K / q3_K (64 bytes at `off`): element 128 h + 32 s + l is bits 2s..2s+1 of byte 32 h + l.
at::Tensor two_bit_levels(const at::Tensor& b, std::int64_t off) {  // → [N, 256] uint8 in element order
  const std::int64_t N = b.size(0);
  const at::Tensor qs = u8(b, off, 64).reshape({N, 2, 1, 32});
  const at::Tensor shifts = at::arange(0, 8, 2, b.options().dtype(at::kByte)).view({1, 1, 4, 1});
  return at::bitwise_and(at::bitwise_right_shift(qs, shifts), 3).reshape({N, 256});
}

// q2_K: scales at 0 (16 bytes: scale | min << 4), qs at 16, d at 80, dmin at 82; x = d * sc * q - dmin * m.
at::Tensor q2_K(const at::Tensor& b) {
  const std::int64_t N = b.size(0);
  const at::Tensor sc = u8(b, 0, 16);
  const at::Tensor dl = half_at(b, 80) * at::bitwise_and(sc, 15).to(at::kFloat);  // [N, 16]
  const at::Tensor ml = half_at(b, 82) * at::bitwise_right_shift(sc, 4).to(at::kFloat);
  const at::Tensor q = two_bit_levels(b, 16).to(at::kFloat).view({N, 16, 16});
  return (dl.unsqueeze(2) * q - ml.unsqueeze(2)).reshape({N, 256});
}

// q3_K: hmask at 0 (element k's third bit is bit k / 32 of byte k % 32), qs at 32, scales at 96 (12 bytes), d at
// 108; level = low + 4 * bit - 4, scale_j = (low nibble j | 2 high bits << 4) - 32; x = (d * scale) * level.
at::Tensor q3_K(const at::Tensor& b) {
  const std::int64_t N = b.size(0);
  const at::Tensor hm = u8(b, 0, 32).unsqueeze(1);                                       // [N, 1, 32]
  const at::Tensor g = at::arange(8, b.options().dtype(at::kByte)).view({1, 8, 1});
  const at::Tensor high = at::bitwise_and(at::bitwise_right_shift(hm, g), 1).reshape({N, 256});
  const at::Tensor level = (two_bit_levels(b, 32).to(at::kFloat) + 4.0f * high.to(at::kFloat)) - 4.0f;
  const at::Tensor s = u8(b, 96, 12);
  const at::Tensor lo = at::cat({at::bitwise_and(s.narrow(1, 0, 8), 15), at::bitwise_right_shift(s.narrow(1, 0, 8), 4)}, 1);
  const at::Tensor sh = at::arange(0, 8, 2, b.options().dtype(at::kByte)).view({1, 4, 1});
  const at::Tensor hi = at::bitwise_and(at::bitwise_right_shift(s.narrow(1, 8, 4).unsqueeze(1), sh), 3).reshape({N, 16});
  const at::Tensor sc = at::bitwise_or(lo, at::bitwise_left_shift(hi, 4)).to(at::kFloat) - 32.0f;  // [N, 16]
  const at::Tensor dl = half_at(b, 108) * sc;
  return (dl.unsqueeze(2) * level.view({N, 16, 16})).reshape({N, 256});
}

// iq4_nl / iq4_xs: each 4-bit index stands for a level of llama.cpp's table (kernels::detail's kvalues_iq4nl,
// repeated here: the engine does not see the kernels' internals), looked up with index_select.
at::Tensor iq4_levels(const at::Tensor& qs) {  // qs [N, 16] → the 32 levels of each block in element order, f32
  static constexpr float kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  const at::Tensor table = at::from_blob(const_cast<float*>(kValues), {16}, at::kFloat).to(qs.device());
  const at::Tensor idx = at::cat({lo4(qs), hi4(qs)}, 1).to(at::kLong);  // [N, 32]
  return table.index_select(0, idx.reshape({-1})).view(idx.sizes());
}

at::Tensor iq4_nl(const at::Tensor& b) { return iq4_levels(u8(b, 2, 16)) * half_at(b, 0); }

// iq4_xs: d at 0, scales_h (u16) at 2, scales_l at 4..7, qs at 8..135 (16 bytes per sub-block of 32);
// x = d * (ls - 32) * level, ls = (scales_l[ib / 2] >> 4 (ib % 2)) & 15 | ((scales_h >> 2 ib) & 3) << 4.
at::Tensor iq4_xs(const at::Tensor& b) {
  const std::int64_t N = b.size(0);
  const at::Tensor d = half_at(b, 0);                                                 // [N, 1]
  const at::Tensor sh = b.narrow(1, 2, 2).to(at::kInt);                               // [N, 2] bytes of the u16
  const at::Tensor h16 = at::bitwise_or(sh.narrow(1, 0, 1), at::bitwise_left_shift(sh.narrow(1, 1, 1), 8));
  const at::Tensor ib = at::arange(8, b.options().dtype(at::kInt)).view({1, 8});
  const at::Tensor hi = at::bitwise_and(at::bitwise_right_shift(h16, ib * 2), 3);    // [N, 8]
  const at::Tensor sl = u8(b, 4, 4).to(at::kInt);                                    // [N, 4]
  const at::Tensor lo = at::stack({at::bitwise_and(sl, 15), at::bitwise_right_shift(sl, 4)}, 2).reshape({N, 8});
  const at::Tensor ls = (at::bitwise_or(lo, at::bitwise_left_shift(hi, 4)) - 32).to(at::kFloat);  // [N, 8]
  const at::Tensor lev = iq4_levels(u8(b, 8, 128).reshape({N * 8, 16})).view({N, 8, 32});
  return (lev * (d * ls).unsqueeze(2)).reshape({N, 256});
}

}  // namespace

at::Tensor dequantize_aten(const at::Tensor& stored, WType t, std::int64_t cols, at::ScalarType out) {
  switch (t) {
    case WType::f32:
    case WType::f16:
    case WType::bf16:
      return stored.to(out);
    default:
      break;
  }
  const std::int64_t rows = stored.size(0);
  const at::Tensor b = blocks_of(stored, t);
  at::Tensor y;
  switch (t) {
    case WType::q8_0: y = q8_0(b); break;
    case WType::q4_0: y = q4_0(b); break;
    case WType::q5_0: y = q5_0(b); break;
    case WType::q4_1: y = q4_1(b); break;
    case WType::q5_1: y = q5_1(b); break;
    case WType::q4_K: y = q4_K(b); break;
    case WType::q5_K: y = q5_K(b); break;
    case WType::q6_K: y = q6_K(b); break;
    case WType::iq4_nl: y = iq4_nl(b); break;
    case WType::iq4_xs: y = iq4_xs(b); break;
    case WType::q2_K: y = q2_K(b); break;
    case WType::q3_K: y = q3_K(b); break;
    default: break;
  }
  y = y.reshape({rows, cols});
  return out == at::kFloat ? y : y.to(out);
}

std::uint64_t dequantize_aten_workspace(WType t, std::int64_t rows, std::int64_t cols, std::size_t out_elem) {
  const auto n = static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(cols);
  switch (t) {
    case WType::f32:
    case WType::f16:
    case WType::bf16:
      return n * out_elem;
    default:
      // Byte-sized nibble/bit planes (≤ 3 live at once), the f32 quants, the f32 result and the output copy.
      return n * (3 + 4 + 4 + out_elem);
  }
}

}  // namespace tandem::engine
