// The CPU hot path: matrix x vector (decode) and matrix x matrix (prefill) for every WType, with runtime dispatch
// by CPU features (scalar reference; AVX2+FMA+F16C; AVX-512 with VNNI, and BF16). Torch-free; no OpenMP or BLAS: callers split output rows
// across their own threads (the engine's WorkerPool) by calling matmul_rows() on disjoint row ranges.
// Every output element depends only on its weight row and its activation row (row-independent kernels), so a
// sequence's results do not depend on what else shares a batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kernels/types.h"

namespace tandem::kernels {

// scalar: the reference. avx2: AVX2 + FMA + F16C. avx512: that and AVX-512 F/BW/VL/VNNI. avx512bf16: that and
// AVX512_BF16 (only the bf16 tile differs). amx: that and AMX-INT8 (the q8_0-activation block types on tiles).
// Each path is a table of its own (docs/kernels.md, "CPU kernels").
enum class Isa : std::uint8_t { scalar, avx2, avx512, avx512bf16, amx, avxvnni };
std::string_view isa_name(Isa i);
Isa detected_isa();  // the best the CPU supports and this build has
bool isa_supported(Isa i);  // this CPU and this build can run it
// Selected for this process: TANDEM_KERNELS=scalar|avx2|avxvnni|avx512|avx512bf16|amx in the environment forces one (one this
// CPU or build lacks falls back to the detected ISA), else detected_isa().
Isa active_isa();
void set_isa_for_testing(Isa i);

// Prepares `n` activation rows x[n][cols] (row stride ldx floats) for weights of type t into `act`
// (n * act_row_bytes(t, cols) bytes, rows contiguous).
void quantize_act(WType t, const float* x, std::int64_t ldx, std::int64_t n, std::int64_t cols, void* act);

// y[i][r] = dot(W row r, act row i) for r in [r0, r1), i in [0, n). W is `rows` x `cols` of type t, rows of
// row_bytes(t, cols) bytes, contiguous. y has row stride ldy floats. Cache-blocked when n > 1. cols must be a
// positive multiple of the type's block size (asserted). Each y[i][r] is a function of W row r and act row i only,
// bit for bit: splitting [r0, r1) across threads or batching activation rows never changes a result.
// `aux` (optional): the matrix's side table from prepare_aux, for kernels that read one (aux_bytes > 0); results
// are the same without it, only slower.
void matmul_rows(WType t, const void* w, std::int64_t cols, const void* act, std::int64_t n, float* y,
                 std::int64_t ldy, std::int64_t r0, std::int64_t r1, const void* aux = nullptr);

// A side table the active kernels read beside a weight matrix of type t (rows x cols), derived from its bytes once
// (at load) and never written back: the amx path's is the whole matrix repacked in 16-row groups in the order its
// tiles read (the matrix's bytes plus 6-11 %; docs/kernels.md, "The AMX path"). 0 when the active kernels want
// none. Counted by the caller as host memory.
std::size_t aux_bytes(WType t, std::int64_t rows, std::int64_t cols);
void prepare_aux(WType t, const void* w, std::int64_t rows, std::int64_t cols, void* aux);

// One query row's attention over a paged KV pool (a decode step), on the active path: q [heads][hd] at position
// pos; the keys and values of position j <= pos in pool rows slots[j] of kv_heads × hd floats (k, v: the pool's
// storage); query head h reads kv head h / (heads / kv_heads). Visible: j <= pos, and j > pos − window when
// window > 0. Per head: score_j = dot(q_h, k_j) · scale, cap · tanh(score / cap) when cap > 0; softmax; out_h =
// Σ_j p_j · v_j. `scratch`: pos + 1 floats. Each head's result depends on its own row and pool rows only (the same
// operations whatever else the step holds); paths differ from each other and from the reference (double sums,
// std::exp) in the last bits only.
// `rows`: KvRows::cold (a decode row: the positions' rows were last read a step ago, so the SIMD paths bring them
// into cache first, dispatch.h kTouchRowsBytes) or KvRows::cached (the caller has just read the same rows — the next
// row of a prompt chunk over the same kv head — so that pass is skipped); the results are the same either way.
enum class KvRows : std::uint8_t { cold, cached };
void attention_decode(const float* q, std::int64_t heads, std::int64_t kv_heads, std::int64_t hd, const float* k,
                      const float* v, const std::int64_t* slots, std::int64_t pos, std::int64_t window, float scale,
                      float cap, float* scratch, float* out, KvRows rows = KvRows::cold);
// The same over a pool of f16 keys and values (IEEE binary16 bits; each read as its exact f32 value).
void attention_decode(const float* q, std::int64_t heads, std::int64_t kv_heads, std::int64_t hd,
                      const std::uint16_t* k, const std::uint16_t* v, const std::int64_t* slots, std::int64_t pos,
                      std::int64_t window, float scale, float cap, float* scratch, float* out,
                      KvRows rows = KvRows::cold);

// n floats to IEEE binary16 bits on the active path, each as f32_to_f16 (types.h) gives it: round to nearest even,
// overflow to infinity, NaN as sign | 0x7E00 — the same bits as ATen's conversion to kHalf (the KV pool's rows).
void f32_to_f16_row(const float* x, std::uint16_t* out, std::int64_t n);

}  // namespace tandem::kernels
