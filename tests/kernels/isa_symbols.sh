#!/usr/bin/env bash
# The ODR guard of the ISA-specific kernel libraries (docs/kernels.md, "ODR guard"): each library built with an
# instruction set's flags may define only its table getters and the AVX2 helpers the AVX2 table is made of. A weak or
# other shared function (an out-of-line copy of a standard-library inline, say) compiled with AVX-512 or AMX flags
# could be picked by the linker for code that runs on any CPU, and fault there with an illegal instruction.
#   isa_symbols.sh LIB.a ...
set -u
allowed='^tandem::kernels::detail::(avx2_table|avx2_superblock_kernels|avx512_table|avx512_superblock_kernels|avx512_minned_kernels|avx512_offset_kernels|amx_superblock_kernels|avx512bf16_table|amx_table|avxvnni_table)\(|^tandem::kernels::detail::(store_f32|quantize_f16|quantize_bf16|to_f16_row|quantize_q8_0|quantize_q8_1|quantize_q8_K)\('
bad=0
for lib in "$@"; do
  # T: text, W/V: weak, u: unique global, i: indirect function; DW.ref.__gxx_personality_v0 is the EH personality.
  while read -r kind name; do
    [ "$name" = DW.ref.__gxx_personality_v0 ] && continue
    if [[ ! $name =~ $allowed ]]; then
      echo "FAIL: $(basename "$lib") defines $kind $name"
      bad=1
    fi
  done < <(nm -C --defined-only "$lib" | awk '$2 ~ /^[TWVuiRBD]$/ { k = $2; $1 = ""; $2 = ""; sub(/^ +/, ""); print k, $0 }')
  [ "$bad" = 0 ] && echo "ok: $(basename "$lib") defines only its table getters"
done
exit "$bad"
