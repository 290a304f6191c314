#!/usr/bin/env bash
# tandem-quantize writes llama-quantize's bytes, including the k-quant fallbacks: tandem-mkmodel's tiny and qwen2
# presets (f16, GGUF) have 128- and 64-column matrices, which Q4_K_M cannot hold in q4_K / q6_K blocks of 256;
# llama-quantize (llama.cpp c392e509, GGML_NATIVE build) falls back to q5_0 and q8_0 for them. Its output files from
# the very F16 files these commands write had these SHA-256 digests; Tandem's must be the same files.
# usage: quantize_llama_bytes.sh TANDEM_MKMODEL TANDEM_QUANTIZE
set -u
mkmodel=$1 quantize=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
declare -A want=(
  [tiny]=d32320a09a08fc8eb39f7ea5ad65aca38986970ac5efc8c85af7f42c83f7ec61
  [qwen2]=d2c74d1527f2496d63aaf4edc78c81348ada8097e653613a3895a858f0311717
)
for preset in tiny qwen2; do
  "$mkmodel" --out "$tmp/$preset-f16.gguf" --preset "$preset" --dtype f16 --format gguf >/dev/null ||
    { echo "FAIL $preset: tandem-mkmodel"; fails=$((fails + 1)); continue; }
  if ! "$quantize" "$tmp/$preset-f16.gguf" "$tmp/$preset-Q4_K_M.gguf" Q4_K_M >"$tmp/out" 2>&1; then
    echo "FAIL $preset: tandem-quantize"; sed 's/^/  | /' "$tmp/out"; fails=$((fails + 1)); continue
  fi
  grep -q "q5_0" "$tmp/out" || { echo "FAIL $preset: no q5_0 fallback tensors"; cat "$tmp/out"; fails=$((fails + 1)); }
  got=$(sha256sum "$tmp/$preset-Q4_K_M.gguf" | cut -d' ' -f1)
  if [ "$got" = "${want[$preset]}" ]; then
    echo "ok   $preset Q4_K_M (q5_0 / q8_0 fallbacks) is llama-quantize's file: $(sed 's/^wrote [^:]*: //' "$tmp/out")"
  else
    echo "FAIL $preset Q4_K_M: sha256 $got, llama-quantize's ${want[$preset]}"; fails=$((fails + 1))
  fi
done
echo "$fails failed"
[ "$fails" = 0 ]
