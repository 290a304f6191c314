// A weight matrix as the engine holds it (the bytes the CPU kernels read, and its accelerator copy), how one is
// made from a model file's tensor, and the CPU matrix product over it. Engine-internal; includes ATen's Tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "engine/model.h"
#include "engine/worker_pool.h"
#include "kernels/types.h"
#include "weights/model_dir.h"

namespace tandem::engine {

bool is_float_type(kernels::WType t);
at::ScalarType scalar_of(kernels::WType t);
// The type float weights are held in for a compute dtype (`auto`: as stored); quantized weights never change.
kernels::WType held_type(kernels::WType stored, ComputeDType d);

// A weight matrix [rows, cols] as the kernels see it: `type` blocks in `data` (the mapping, zero-copy, or an owned
// converted copy in `host`), and on an accelerator layer `dev`: the same bytes there (uint8 [rows, row_bytes] for
// quantized types, a typed tensor for float types), expanded one matrix at a time before its matmul.
struct Weight {
  kernels::WType type = kernels::WType::f32;
  std::int64_t rows = 0, cols = 0;
  const std::byte* data = nullptr;
  at::Tensor host;  // owner of converted or realigned bytes (undefined when zero-copy)
  at::Tensor dev;   // accelerator copy (undefined on the CPU)
  at::Tensor aux;   // the CPU kernels' side table for this matrix (kernels::aux_bytes; undefined when none)

  std::uint64_t bytes() const { return kernels::row_bytes(type, cols) * static_cast<std::uint64_t>(rows); }
  // The bytes as a CPU tensor (typed for float types, uint8 rows for quantized ones), zero-copy.
  at::Tensor cpu_tensor() const;
};

// A matrix from the files, converted to the held type when that differs (counted in `copied`); otherwise a
// zero-copy view (copied once when the mapping is misaligned for the element size). `cpu_compute`: the CPU kernels
// will multiply with it, so it also gets their side table when they want one (kernels::aux_bytes; counted in
// `copied`); a matrix bound for an accelerator does not.
Weight make_weight(const weights::TensorView& tv, ComputeDType d, std::uint64_t& copied, bool cpu_compute = true);
// A 1-D weight (norms) as an f32 CPU tensor.
at::Tensor vector_f32(const weights::TensorView& tv);

// x @ W^T on the CPU through Tandem's kernels (kernels.h): the activations (f32 [n, cols]) are prepared once in
// `act_buf` for the weight type, then the output rows are split across `pool` on 16-row boundaries. Returns f32
// [n, rows]; every element is computed the same way whatever the split.
at::Tensor cpu_linear(const at::Tensor& x, const Weight& w, WorkerPool& pool, std::vector<std::byte>& act_buf);
// x @ W^T for several weights of the same width over the same rows (a layer's q, k and v; gate and up) in one pass
// of `pool`: each weight's result is cpu_linear's, bit for bit, one wake of the workers instead of one per weight.
std::vector<at::Tensor> cpu_linears(const at::Tensor& x, std::initializer_list<const Weight*> weights, WorkerPool& pool,
                                    std::vector<std::byte>& act_buf);
// Rows `ids` of an embedding matrix of any type, as f32 [n, cols].
at::Tensor embedding_rows(const Weight& embed, const std::vector<std::int64_t>& ids);

}  // namespace tandem::engine
