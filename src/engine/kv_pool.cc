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
    // On the CPU a row copy per position (a decode step writes one row per layer: no operator call for it), after
    // one conversion to the pool's element type when the rows come in another (f32 rows into an f16 pool: rounded
    // to nearest even).
    const at::ScalarType pt = ks.scalar_type();
    if (k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat && (pt == at::kFloat || pt == at::kHalf) &&
        vs.scalar_type() == pt && k.is_contiguous() && v.is_contiguous() && slots.is_contiguous()) {
      // f32 rows as they come from the layer (a step's rows of one item): converted straight into their slots by
      // the kernels (f32_to_f16_row: the same bits as the conversion below), no tensor made — a batched decode
      // step writes every item this way, layer by layer.
      const std::int64_t n = slots.numel(), row = ks.numel() / ks.size(0);
      TORCH_CHECK(k.numel() == row * n && v.numel() == k.numel(), "KvPool::write: rows do not match the pool's");
      const auto* s = slots.data_ptr<std::int64_t>();
      for (std::int64_t i = 0; i < n; ++i) TORCH_CHECK(s[i] >= 0 && s[i] < ks.size(0), "KvPool::write: slot outside the pool");
      const float* kp = k.data_ptr<float>();
      const float* vp = v.data_ptr<float>();
      for (std::int64_t i = 0; i < n; ++i) {
        if (pt == at::kHalf) {
          auto* kd = static_cast<std::uint16_t*>(ks.data_ptr()) + s[i] * row;
          auto* vd = static_cast<std::uint16_t*>(vs.data_ptr()) + s[i] * row;
          kernels::f32_to_f16_row(kp + i * row, kd, row);
          kernels::f32_to_f16_row(vp + i * row, vd, row);
        } else {
          std::memcpy(ks.data_ptr<float>() + s[i] * row, kp + i * row, static_cast<std::size_t>(row) * sizeof(float));
          std::memcpy(vs.data_ptr<float>() + s[i] * row, vp + i * row, static_cast<std::size_t>(row) * sizeof(float));
        }
      }
      return;
    }
    const at::Tensor kc = k.to(ks.scalar_type()).contiguous(), vc = v.to(vs.scalar_type()).contiguous();
    const at::Tensor sc = slots.contiguous();
    const std::int64_t n = sc.numel();
    const std::size_t row = static_cast<std::size_t>(ks.numel() / ks.size(0)) * ks.element_size();
    TORCH_CHECK(kc.numel() * kc.element_size() == static_cast<std::int64_t>(row) * n && vc.numel() == kc.numel(),
                "KvPool::write: rows do not match the pool's");
    const auto* s = sc.data_ptr<std::int64_t>();
    auto* kd = static_cast<std::byte*>(ks.data_ptr());
    auto* vd = static_cast<std::byte*>(vs.data_ptr());
    const auto* kp = static_cast<const std::byte*>(kc.data_ptr());
    const auto* vp = static_cast<const std::byte*>(vc.data_ptr());
    for (std::int64_t i = 0; i < n; ++i) TORCH_CHECK(s[i] >= 0 && s[i] < ks.size(0), "KvPool::write: slot outside the pool");
    for (std::int64_t i = 0; i < n; ++i) {
      std::memcpy(kd + static_cast<std::size_t>(s[i]) * row, kp + static_cast<std::size_t>(i) * row, row);
      std::memcpy(vd + static_cast<std::size_t>(s[i]) * row, vp + static_cast<std::size_t>(i) * row, row);
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
