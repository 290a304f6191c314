// Internal to the kernels library: the AMX table's entries of the super-block types (kernels_amx_sb.cc), for
// kernels_amx.cc's table. Call only where the AMX table may be used (its CPU check).
#pragma once

#include "kernels/dispatch.h"
#include "kernels/types.h"

namespace tandem::kernels::detail {

// The entry of super-block type t on AMX tiles from 16 activations, `base` (the avx512 table's packed entry) below
// that and without the side table; `base` itself for the other types.
TypeKernels amx_superblock_kernels(WType t, const TypeKernels& base);

}  // namespace tandem::kernels::detail
