// Internal to the kernels library: the AVX2 entries of the 256-element super-block weight types (q4_K, q5_K, q6_K,
// q2_K, q3_K, iq4_xs), from kernels_avx2_k.cc, for the AVX2 table (kernels_avx2.cc). Call only when the CPU has
// AVX2, FMA and F16C.
#pragma once

#include "kernels/dispatch.h"
#include "kernels/types.h"

namespace tandem::kernels::detail {

TypeKernels avx2_superblock_kernels(WType t);  // {} for the other types

}  // namespace tandem::kernels::detail
