// Internal to the kernels library: the AVX-512 entries of the 256-element super-block weight types, from
// kernels_avx512_k.cc, for the AVX-512 tables (kernels_avx512.cc): q4_K, q5_K, q6_K and iq4_xs on matrices repacked
// at load, the others the AVX2 entries (kernels_avx2_k.h). Call only when the CPU has AVX-512 F/BW/VL/VNNI, AVX2,
// FMA and F16C.
#pragma once

#include "kernels/dispatch.h"
#include "kernels/types.h"

namespace tandem::kernels::detail {

TypeKernels avx512_superblock_kernels(WType t);  // {} for the other types
// q4_1 and q5_1 on matrices repacked at load, falling back on `k` (the table's entry) without the copy; `k` itself
// for the other types.
TypeKernels avx512_minned_kernels(WType t, TypeKernels k);
// q4_0, q5_0, iq4_nl and q8_0 (signed levels, q8_0 activations) on matrices repacked at load, falling back on `k`
// without the copy; `k` itself for the other types.
TypeKernels avx512_offset_kernels(WType t, TypeKernels k);

}  // namespace tandem::kernels::detail
