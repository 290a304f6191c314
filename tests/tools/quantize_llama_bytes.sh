#!/usr/bin/env bash
# tandem-quantize writes llama-quantize's bytes, including the k-quant fallbacks: tandem-mkmodel's tiny and qwen2
# presets (f16, GGUF) have 128- and 64-column matrices, which Q4_K_M / Q5_K_M cannot hold in q4_K / q5_K / q6_K
# blocks of 256; llama-quantize (llama.cpp c392e509, GGML_NATIVE build) falls back to q5_0, q5_1 and q8_0 for them.
# Its output files from the very F16 files these commands write (norms F32, as llama.cpp's converter writes them)
# had these SHA-256 digests; Tandem's must be the same.
# usage: quantize_llama_bytes.sh TANDEM_MKMODEL TANDEM_QUANTIZE
set -u
mkmodel=$1 quantize=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
declare -A want=(
  [tiny-Q4_K_M]=235c35af8ac30e1d3c834a390d58c4606e3a2214184fe0f1ef858009b090185a
  [qwen2-Q4_K_M]=abf5589bc6c81a339a1f902fe9eab0904f14d63a2b35336d8a286c0e1a31a7d9
  [tiny-Q5_K_M]=a874a1ba9d0d772633ca38e028e4f39c9b860c5b37aa663387b9b686ddc64659
  [qwen2-Q5_K_M]=6669ec215564e119b09bccabec7a76d63103586edbf09c6f6d914e32b439ac67
)
declare -A fallback=([Q4_K_M]=q5_0 [Q5_K_M]=q5_1)
for preset in tiny qwen2; do
  "$mkmodel" --out "$tmp/$preset-f16.gguf" --preset "$preset" --dtype f16 --format gguf >/dev/null ||
    { echo "FAIL $preset: tandem-mkmodel"; fails=$((fails + 1)); continue; }
  for type in Q4_K_M Q5_K_M; do
    if ! "$quantize" "$tmp/$preset-f16.gguf" "$tmp/$preset-$type.gguf" "$type" >"$tmp/out" 2>&1; then
      echo "FAIL $preset $type: tandem-quantize"; sed 's/^/  | /' "$tmp/out"; fails=$((fails + 1)); continue
    fi
    grep -q "${fallback[$type]}" "$tmp/out" ||
      { echo "FAIL $preset $type: no ${fallback[$type]} fallback tensors"; cat "$tmp/out"; fails=$((fails + 1)); }
    got=$(sha256sum "$tmp/$preset-$type.gguf" | cut -d' ' -f1)
    if [ "$got" = "${want[$preset-$type]}" ]; then
      echo "ok   $preset $type (fallbacks) is llama-quantize's file: $(sed 's/^wrote [^:]*: //' "$tmp/out")"
    else
      echo "FAIL $preset $type: sha256 $got, llama-quantize's ${want[$preset-$type]}"; fails=$((fails + 1))
    fi
  done
done
echo "$fails failed"
[ "$fails" = 0 ]
