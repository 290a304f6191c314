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

at::Tensor cpu_linear(const at::Tensor& x, const Weight& w, WorkerPool& pool, std::vector<std::byte>& act_buf) {
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const std::int64_t n = xf.size(0), rows = w.rows, cols = w.cols;
  // The prepared rows start where a float tile's 64-byte loads of them read whole cache lines: on a line, or for
  // f32 and bf16 weights at the weight rows' own offset past one (their AVX-512 tiles line their steps up with
  // those, kernels_avx512_common.h). f32 weights take x's floats in place when they already lie so.
  const std::size_t arb = kernels::act_row_bytes(w.type, cols);
  const auto address = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  const bool phased = (w.type == WType::f32 || w.type == WType::bf16) && arb % kCacheLine == 0;
  const std::uintptr_t phase = phased ? address(w.data) % kCacheLine : std::uintptr_t{0};
  const void* act = xf.data_ptr<float>();
  if (w.type != WType::f32 || address(act) % kCacheLine != phase) {
    const std::size_t need = arb * static_cast<std::size_t>(n) + 2 * kCacheLine;
    if (act_buf.size() < need) act_buf.resize(need);
    const std::uintptr_t at = (address(act_buf.data()) + kCacheLine - 1) / kCacheLine * kCacheLine + phase;
    kernels::quantize_act(w.type, xf.data_ptr<float>(), cols, n, cols, reinterpret_cast<void*>(at));
    act = reinterpret_cast<const void*>(at);
  }
  at::Tensor out = at::empty({n, rows}, at::TensorOptions().dtype(at::kFloat));
  float* y = out.data_ptr<float>();
  const void* aux = w.aux.defined() ? w.aux.data_ptr() : nullptr;
  const int T = pool.size();
  if (T == 1 || rows < 64) {
    kernels::matmul_rows(w.type, w.data, cols, act, n, y, rows, 0, rows, aux);
    return out;
  }
  // Row ranges on 16-row boundaries (whole register tiles); each output element is computed the same way whatever
  // the split, so the thread count never changes the result.
  const std::int64_t tiles = (rows + 15) / 16;
  pool.run([&](int i) {
    const std::int64_t r0 = std::min(rows, tiles * i / T * 16), r1 = std::min(rows, tiles * (i + 1) / T * 16);
    if (r0 < r1) kernels::matmul_rows(w.type, w.data, cols, act, n, y, rows, r0, r1, aux);
  });
  return out;
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
