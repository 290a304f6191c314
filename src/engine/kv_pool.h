// The paged KV pool of the LLM (Model's attention) and of the Whisper decoder's self-attention (WhisperModel): per
// layer one K and one V tensor of [blocks × block_size, row…] and gen::KvBlockAllocator's free list and block tables
// (docs/engine.md, "Paged KV cache"). A sequence grows block by block (all-or-nothing: Errc::kv_exhausted leaves it
// as it was), gives back the blocks past a truncation (a rewind) and all of them when released. Position p of a
// sequence lives in slot table[p / block_size] × block_size + p % block_size of every layer. The bookkeeping is
// guarded by the pool's own mutex (sequences come and go on several threads); the storage is written and read by
// the model's forward under the model's compute lock. Engine-internal; includes ATen's Tensor type.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "core/result.h"
#include "device/device.h"
#include "engine/model.h"
#include "generation/kv_blocks.h"

namespace tandem::engine {

class KvPool {
 public:
  KvPool(int blocks, int block_size) : alloc_(blocks, block_size) {}
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  int block_size() const { return alloc_.block_size(); }
  std::int64_t slots() const { return std::int64_t{alloc_.total_blocks()} * alloc_.block_size(); }
  // Bytes of one layer's K and V storage with rows of `row` elements of `st`.
  std::uint64_t layer_bytes(std::int64_t row, at::ScalarType st) const;
  std::uint64_t bytes() const { return bytes_; }  // every layer's storage
  std::size_t layers() const { return k_.size(); }

  // Adds the next layer's K and V storage, [slots(), row_shape…] each, of `st` on `dev` (uninitialised: a slot is
  // written before it is read). With `accel` its bytes are accounted there first at Site::kv_pool: the allocation is
  // returned (keep it as long as the pool), a refusal is the device's typed error and adds nothing. Without, an
  // empty Allocation. May throw c10::Error / std::bad_alloc (call inside the load's guard).
  Result<device::Allocation> add_layer(const std::vector<std::int64_t>& row_shape, at::ScalarType st, at::Device dev,
                                       device::Device* accel);
  const at::Tensor& k(std::size_t layer) const { return k_[layer]; }
  const at::Tensor& v(std::size_t layer) const { return v_[layer]; }

  Status create(gen::SeqId seq);  // an empty block table; duplicate if it exists
  // Grows `seq` to hold positions [0, tokens) and returns the slot of each of them. kv_exhausted (the sequence
  // unchanged) when the pool cannot supply the missing blocks; not_found for an unknown sequence.
  Result<std::vector<std::int64_t>> reserve(gen::SeqId seq, std::int64_t tokens);
  // Keeps the blocks holding positions [0, tokens) and returns the others to the pool; returns how many went back.
  int truncate(gen::SeqId seq, std::int64_t tokens);
  void release(gen::SeqId seq);  // every block back; idempotent

  // Blocks, sequences and bytes (bytes_used: the used blocks' share of bytes()).
  KvStats stats() const;

  // Layer `layer`: rows k, v ([n, row…]) into `slots` (a long tensor of n slots on the storage's device), and the
  // rows at `slots` gathered into new [m, row…] tensors.
  void write(std::size_t layer, const at::Tensor& slots, const at::Tensor& k, const at::Tensor& v);
  std::pair<at::Tensor, at::Tensor> read(std::size_t layer, const at::Tensor& slots) const;

 private:
  mutable std::mutex mu_;  // guards alloc_
  gen::KvBlockAllocator alloc_;
  std::vector<at::Tensor> k_, v_;
  std::uint64_t bytes_ = 0;
};

}  // namespace tandem::engine
