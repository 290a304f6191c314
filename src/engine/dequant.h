// Dequantization of GGUF weight blocks with ATen tensor operations, so the same code runs wherever a replica's
// tensors live: the simulated accelerator (CPU tensors) and CUDA. An accelerator layer keeps its weights at their
// stored size (raw blocks in a uint8 tensor) and expands one matrix at a time into a workspace just before its
// matmul. The results equal kernels::dequantize_row() bit for bit (same float operations in the same order;
// tests/engine/test_dequant.cc), so both devices share one meaning of every weight type (docs/kernels.md).
// Only engine translation units include this (it pulls in ATen).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "kernels/types.h"

namespace tandem::engine {

// `stored`: for quantized types a uint8 tensor [rows, row_bytes(t, cols)] of raw blocks; for f32/f16/bf16 a tensor
// of that dtype [rows, cols]. Returns [rows, cols] in `out` dtype on the same device.
at::Tensor dequantize_aten(const at::Tensor& stored, kernels::WType t, std::int64_t cols, at::ScalarType out);

// Temporary bytes dequantize_aten() needs for a rows x cols matrix of type t, output included (an upper bound
// used by the workspace estimate).
std::uint64_t dequantize_aten_workspace(kernels::WType t, std::int64_t rows, std::int64_t cols, std::size_t out_elem);

}  // namespace tandem::engine
