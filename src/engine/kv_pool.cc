// The paged KV pool shared by the LLM and the Whisper decoder (kv_pool.h).
#include "engine/kv_pool.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>

#include "kernels/kernels.h"

namespace tandem::engine {

std::uint64_t KvPool::layer_bytes(std::int64_t row, at::ScalarType st) const {
  return static_cast<std::uint64_t>(slots()) * static_cast<std::uint64_t>(row) *
         static_cast<std::uint64_t>(at::elementSize(st)) * 2;
}

Result<device::Allocation> KvPool::add_layer(const std::vector<std::int64_t>& row_shape, at::ScalarType st,
                                             at::Device dev, device::Device* accel) {
  std::int64_t row = 1;
  for (std::int64_t e : row_shape) row *= e;
  const std::uint64_t bytes = layer_bytes(row, st);
  device::Allocation a;
  if (accel) {
    auto got = accel->allocate(bytes, device::Site::kv_pool);
    if (!got) return fail(std::move(got).error());
    a = std::move(got).value();
  }
  std::vector<std::int64_t> shape{slots()};
  shape.insert(shape.end(), row_shape.begin(), row_shape.end());
  const auto opt = at::TensorOptions().dtype(st).device(dev);
  at::Tensor k = at::empty(shape, opt), v = at::empty(shape, opt);
  k_.push_back(std::move(k));
  v_.push_back(std::move(v));
  bytes_ += bytes;
  return a;
}

Status KvPool::create(gen::SeqId seq) {
  std::lock_guard lock(mu_);
  return alloc_.create(seq);
}

Result<std::vector<std::int64_t>> KvPool::reserve(gen::SeqId seq, std::int64_t tokens) {
  std::lock_guard lock(mu_);
  TANDEM_TRY(alloc_.reserve(seq, tokens));
  const auto& table = *alloc_.table(seq);
  const std::int64_t bs = alloc_.block_size();
  std::vector<std::int64_t> slots(static_cast<std::size_t>(tokens));
  for (std::int64_t p = 0; p < tokens; ++p)
    slots[static_cast<std::size_t>(p)] = std::int64_t{table[static_cast<std::size_t>(p / bs)]} * bs + p % bs;
  return slots;
}

int KvPool::truncate(gen::SeqId seq, std::int64_t tokens) {
  std::lock_guard lock(mu_);
  return alloc_.truncate(seq, tokens);
}

void KvPool::release(gen::SeqId seq) {
  std::lock_guard lock(mu_);
  alloc_.release(seq);
}

KvStats KvPool::stats() const {
  std::lock_guard lock(mu_);
  KvStats s;
  s.block_size = alloc_.block_size();
  s.total_blocks = alloc_.total_blocks();
  s.used_blocks = alloc_.used_blocks();
  s.sequences = alloc_.sequences();
  s.bytes_total = bytes_;
  s.bytes_used = s.total_blocks > 0 ? s.bytes_total / static_cast<std::uint64_t>(s.total_blocks) *
                                          static_cast<std::uint64_t>(s.used_blocks)
                                    : 0;
  return s;
}

void KvPool::write(std::size_t layer, const at::Tensor& slots, const at::Tensor& k, const at::Tensor& v) {
  at::Tensor& ks = k_[layer];
  at::Tensor& vs = v_[layer];
  if (ks.is_cpu() && slots.is_cpu() && k.is_cpu() && v.is_cpu() && slots.scalar_type() == at::kLong) {
    // On the CPU a row copy per position (a decode step writes one row per layer: no operator call for it). Rows in
    // the pool's element type go as they are; f32 rows into an f16 pool are converted straight into their slots
    // (kernels::f32_to_f16_row: rounded to nearest even, the same bits as ATen's conversion), so a batched decode
    // step makes no tensor per item; other rows are converted once by ATen first.
    const at::ScalarType pt = ks.scalar_type();
    const bool to_half = pt == at::kHalf && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat &&
                         k.is_contiguous() && v.is_contiguous();
    const auto as_pool = [&](const at::Tensor& t) {
      return to_half || (t.scalar_type() == pt && t.is_contiguous()) ? t : t.to(pt).contiguous();
    };
    const at::Tensor kc = as_pool(k), vc = as_pool(v);
    const at::Tensor sc = slots.is_contiguous() ? slots : slots.contiguous();
    const std::int64_t n = sc.numel(), row = ks.numel() / ks.size(0);
    TORCH_CHECK(kc.numel() == row * n && vc.numel() == kc.numel(), "KvPool::write: rows do not match the pool's");
    const auto* s = sc.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < n; ++i) TORCH_CHECK(s[i] >= 0 && s[i] < ks.size(0), "KvPool::write: slot outside the pool");
    const std::size_t rb = static_cast<std::size_t>(row) * ks.element_size();
    auto* kd = static_cast<std::byte*>(ks.data_ptr());
    auto* vd = static_cast<std::byte*>(vs.data_ptr());
    const auto* kp = static_cast<const std::byte*>(kc.data_ptr());
    const auto* vp = static_cast<const std::byte*>(vc.data_ptr());
    for (std::int64_t i = 0; i < n; ++i) {
      const std::size_t to = static_cast<std::size_t>(s[i]) * rb;
      if (to_half) {
        kernels::f32_to_f16_row(kc.data_ptr<float>() + i * row, reinterpret_cast<std::uint16_t*>(kd + to), row);
        kernels::f32_to_f16_row(vc.data_ptr<float>() + i * row, reinterpret_cast<std::uint16_t*>(vd + to), row);
      } else {
        std::memcpy(kd + to, kp + static_cast<std::size_t>(i) * rb, rb);
        std::memcpy(vd + to, vp + static_cast<std::size_t>(i) * rb, rb);
      }
    }
    return;
  }
  ks.index_copy_(0, slots, k);
  vs.index_copy_(0, slots, v);
}

std::pair<at::Tensor, at::Tensor> KvPool::read(std::size_t layer, const at::Tensor& slots) const {
  return {k_[layer].index_select(0, slots), v_[layer].index_select(0, slots)};
}

}  // namespace tandem::engine
