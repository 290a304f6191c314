#include "engine/weight.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/kernels.h"
#include "kernels/quant.h"

namespace tandem::engine {

using kernels::WType;

namespace {
constexpr std::uintptr_t kCacheLine = 64;
// A prompt's activation rows are prepared on the worker pool in ranges of this many rows; a decode step's few stay
// on the calling thread.
constexpr std::int64_t kPrepareGrain = 16;
}  // namespace

bool is_float_type(WType t) { return t == WType::f32 || t == WType::f16 || t == WType::bf16; }

at::ScalarType scalar_of(WType t) {
  switch (t) {
    case WType::f16: return at::kHalf;
    case WType::bf16: return at::kBFloat16;
    default: return at::kFloat;
  }
}

WType held_type(WType stored, ComputeDType d) {
  if (!is_float_type(stored)) return stored;
  switch (d) {
    case ComputeDType::f32: return WType::f32;
    case ComputeDType::bf16: return WType::bf16;
    case ComputeDType::f16: return WType::f16;
    case ComputeDType::auto_: break;
  }
  return stored;
}

Weight make_weight(const weights::TensorView& tv, ComputeDType d, std::uint64_t& copied, bool cpu_compute) {
  Weight w;
  w.rows = tv.shape.size() == 2 ? tv.shape[0] : 1;
  w.cols = tv.shape.empty() ? 0 : tv.shape.back();
  const WType stored = tv.type;
  w.type = held_type(stored, d);
  w.data = tv.data.data();
  const auto elem = is_float_type(stored) ? static_cast<std::uintptr_t>(kernels::traits(stored).block_bytes) : 2;
  if (w.type != stored) {
    std::vector<float> row(static_cast<std::size_t>(w.cols));
    const std::size_t in_rb = kernels::row_bytes(stored, w.cols), out_rb = kernels::row_bytes(w.type, w.cols);
    w.host = at::empty({static_cast<std::int64_t>(out_rb * static_cast<std::uint64_t>(w.rows))},
                       at::TensorOptions().dtype(at::kByte));
    auto* out = static_cast<std::byte*>(w.host.data_ptr());
    for (std::int64_t r = 0; r < w.rows; ++r) {
      kernels::dequantize_row(stored, w.data + static_cast<std::size_t>(r) * in_rb, row.data(), w.cols);
      kernels::quantize_row(w.type, row.data(), out + static_cast<std::size_t>(r) * out_rb, w.cols);
    }
    w.data = out;
    copied += w.bytes();
  } else if (reinterpret_cast<std::uintptr_t>(w.data) % elem != 0) {
    w.host = at::empty({static_cast<std::int64_t>(tv.data.size())}, at::TensorOptions().dtype(at::kByte));
    std::memcpy(w.host.data_ptr(), tv.data.data(), tv.data.size());
    w.data = static_cast<const std::byte*>(w.host.data_ptr());
    copied += tv.data.size();
  }
  // The side table the active CPU kernels read beside this matrix (the amx path: the matrix repacked in 16-row
  // groups), made once here from the bytes the kernels will read; host memory like a converted copy. The file's
  // pages are not needed by the kernels after this (they stay in the page cache, clean, until the kernel reclaims
  // them).
  if (const std::size_t aux = cpu_compute && w.rows > 0 ? kernels::aux_bytes(w.type, w.rows, w.cols) : 0; aux > 0) {
    w.aux = at::empty({static_cast<std::int64_t>(aux)}, at::TensorOptions().dtype(at::kByte));
    kernels::prepare_aux(w.type, w.data, w.rows, w.cols, w.aux.data_ptr());
    copied += aux;
  }
  return w;
}

at::Tensor vector_f32(const weights::TensorView& tv) {
  const std::int64_t n = tv.shape.empty() ? 0 : tv.shape.back();
  at::Tensor t = at::empty({n}, at::TensorOptions().dtype(at::kFloat));
  kernels::dequantize_row(tv.type, tv.data.data(), t.data_ptr<float>(), n);
  return t;
}

at::Tensor Weight::cpu_tensor() const {
  auto* p = const_cast<std::byte*>(data);  // read-only mapping: never written through
  if (is_float_type(type)) return at::from_blob(p, {rows, cols}, at::TensorOptions().dtype(scalar_of(type)));
  return at::from_blob(p, {rows, static_cast<std::int64_t>(kernels::row_bytes(type, cols))},
                       at::TensorOptions().dtype(at::kByte));
}

std::vector<at::Tensor> cpu_linears(const at::Tensor& x, std::initializer_list<const Weight*> weights, WorkerPool& pool,
                                    std::vector<std::byte>& act_buf) {
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const std::int64_t n = xf.size(0);
  const std::vector<const Weight*> ws(weights);
  const std::size_t m = ws.size();
  const auto address = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  // Each weight's prepared rows start where a float tile's 64-byte loads of them read whole cache lines: on a line,
  // or for f32 and bf16 weights at the weight rows' own offset past one (their AVX-512 tiles line their steps up
  // with those, kernels_avx512_common.h). f32 weights take x's floats in place when they already lie so; a weight
  // of the same type, width and phase as an earlier one shares its prepared rows.
  std::vector<std::uintptr_t> phase(m);
  std::vector<std::size_t> slot(m);  // offset of the weight's rows in act_buf past its first line; kInPlace: x itself
  std::vector<std::size_t> owner(m);
  constexpr auto kInPlace = static_cast<std::size_t>(-1);
  std::size_t need = kCacheLine;
  for (std::size_t i = 0; i < m; ++i) {
    const Weight& w = *ws[i];
    const std::size_t arb = kernels::act_row_bytes(w.type, w.cols);
    const bool phased = (w.type == WType::f32 || w.type == WType::bf16) && arb % kCacheLine == 0;
    phase[i] = phased ? address(w.data) % kCacheLine : std::uintptr_t{0};
    owner[i] = i;
    if (w.type == WType::f32 && address(xf.data_ptr<float>()) % kCacheLine == phase[i]) {
      slot[i] = kInPlace;
      continue;
    }
    for (std::size_t j = 0; j < i; ++j)
      if (slot[j] != kInPlace && owner[j] == j && ws[j]->type == w.type && ws[j]->cols == w.cols && phase[j] == phase[i])
        owner[i] = j;
    if (owner[i] != i) continue;
    slot[i] = need - kCacheLine;
    need += (arb * static_cast<std::size_t>(n) + kCacheLine - 1) / kCacheLine * kCacheLine + kCacheLine;
  }
  if (act_buf.size() < need) act_buf.resize(need);
  const std::uintptr_t base = (address(act_buf.data()) + kCacheLine - 1) / kCacheLine * kCacheLine;
  std::vector<const void*> act(m);
  std::vector<at::Tensor> out(m);
  std::vector<float*> y(m);
  for (std::size_t i = 0; i < m; ++i) {
    if (slot[owner[i]] == kInPlace) act[i] = xf.data_ptr<float>();
    else if (owner[i] != i) act[i] = act[owner[i]];
    else act[i] = reinterpret_cast<const void*>(base + slot[i] + phase[i]);
    out[i] = at::empty({n, ws[i]->rows}, at::TensorOptions().dtype(at::kFloat));
    y[i] = out[i].data_ptr<float>();
  }
  // The activation rows prepared (each row on its own: the cut does not matter), a prompt's on the pool.
  const float* xp = xf.data_ptr<float>();
  pool.split(n, kPrepareGrain, [&](std::int64_t b, std::int64_t e) {
    for (std::size_t i = 0; i < m; ++i) {
      if (owner[i] != i || slot[i] == kInPlace) continue;
      const Weight& w = *ws[i];
      const std::size_t arb = kernels::act_row_bytes(w.type, w.cols);
      kernels::quantize_act(w.type, xp + b * w.cols, w.cols, e - b, w.cols,
                            const_cast<std::byte*>(static_cast<const std::byte*>(act[i])) + static_cast<std::size_t>(b) * arb);
    }
  });
  const auto rows = [&](std::size_t i, std::int64_t r0, std::int64_t r1) {
    const Weight& w = *ws[i];
    kernels::matmul_rows(w.type, w.data, w.cols, act[i], n, y[i], w.rows, r0, r1,
                         w.aux.defined() ? w.aux.data_ptr() : nullptr);
  };
  std::int64_t all_rows = 0;
  for (const Weight* w : ws) all_rows += w->rows;
  const int T = pool.size();
  if (T == 1 || all_rows < 64) {
    for (std::size_t i = 0; i < m; ++i) rows(i, 0, ws[i]->rows);
    return out;
  }
  // The weights' 16-row tiles one after the other, cut into T ranges of about equal bytes of weights: one pass of
  // the pool for all of them. Ranges on 16-row boundaries of each weight (whole register tiles, and the side
  // tables' groups); each output element is computed the same way whatever the cut, so neither the thread count
  // nor which weights share a pass changes the result.
  std::vector<std::int64_t> first(m + 1, 0);  // global index of weight i's first tile
  std::vector<std::uint64_t> cost(m);         // bytes of one tile of weight i
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < m; ++i) {
    const std::int64_t tiles = (ws[i]->rows + 15) / 16;
    first[i + 1] = first[i] + tiles;
    cost[i] = std::max<std::uint64_t>(1, kernels::row_bytes(ws[i]->type, ws[i]->cols) * 16);
    total += cost[i] * static_cast<std::uint64_t>(tiles);
  }
  const auto cut = [&](int t) {  // the first tile of range t: where the bytes before it reach total * t / T
    if (t == T) return first[m];
    const std::uint64_t target = total * static_cast<std::uint64_t>(t) / static_cast<std::uint64_t>(T);
    std::uint64_t acc = 0;
    for (std::size_t i = 0; i < m; ++i) {
      const std::uint64_t span = cost[i] * static_cast<std::uint64_t>(first[i + 1] - first[i]);
      if (acc + span >= target) return first[i] + static_cast<std::int64_t>((target - acc) / cost[i]);
      acc += span;
    }
    return first[m];
  };
  pool.run([&](int t) {
    const std::int64_t g0 = cut(t), g1 = cut(t + 1);
    for (std::size_t i = 0; i < m; ++i) {
      const std::int64_t b = std::max(g0, first[i]), e = std::min(g1, first[i + 1]);
      if (b < e) rows(i, (b - first[i]) * 16, std::min(ws[i]->rows, (e - first[i]) * 16));
    }
  });
  return out;
}

at::Tensor cpu_linear(const at::Tensor& x, const Weight& w, WorkerPool& pool, std::vector<std::byte>& act_buf) {
  return cpu_linears(x, {&w}, pool, act_buf)[0];
}

at::Tensor embedding_rows(const Weight& embed, const std::vector<std::int64_t>& ids) {
  const auto n = static_cast<std::int64_t>(ids.size());
  at::Tensor x = at::empty({n, embed.cols}, at::TensorOptions().dtype(at::kFloat));
  const std::size_t rb = kernels::row_bytes(embed.type, embed.cols);
  for (std::int64_t i = 0; i < n; ++i)
    kernels::dequantize_row(embed.type, embed.data + static_cast<std::size_t>(ids[static_cast<std::size_t>(i)]) * rb,
                            x.data_ptr<float>() + i * embed.cols, embed.cols);
  return x;
}

}  // namespace tandem::engine
