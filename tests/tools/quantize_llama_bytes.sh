#!/usr/bin/env bash
# tandem-quantize writes llama-quantize's bytes, including the fallbacks and the per-tensor rules: tandem-mkmodel's
# tiny, qwen2, phi3 and gemma2 presets (f16, GGUF) have 128- and 64-column matrices, which Q4_K_M / Q5_K_M / IQ4_XS cannot
# hold in blocks of 256 (nor Q2_K / Q3_K_*); llama-quantize (llama.cpp c392e509, GGML_NATIVE build) falls back to
# q5_0, q5_1, q8_0 and iq4_nl for them, and gives Phi-3's fused attn_qkv one more step (q5_K for Q4_K_M, q4_K for
# Q3_K_M: their q5_1 / q5_0 fallbacks here).
# Its output files from the very F16 files these commands write (norms F32, as llama.cpp's converter writes them)
# had these SHA-256 digests; Tandem's must be the same.
# usage: quantize_llama_bytes.sh TANDEM_MKMODEL TANDEM_QUANTIZE
set -u
mkmodel=$1 quantize=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
# preset type fallback-type-that-must-appear sha256
cases="
tiny   Q4_K_M q5_0   235c35af8ac30e1d3c834a390d58c4606e3a2214184fe0f1ef858009b090185a
qwen2  Q4_K_M q5_0   38f075c3cbaaad6e131d63cf075241da20e02e7a2d70424e50f61f7dcb62b262
tiny   Q5_K_M q5_1   a874a1ba9d0d772633ca38e028e4f39c9b860c5b37aa663387b9b686ddc64659
qwen2  Q5_K_M q5_1   9aed3768a7728cf17fe0a0c6a65d7491cf4b25e3865128d89b36be08e225e788
tiny   IQ4_XS iq4_nl 5fefc4552467698708462c69ba63ce0941cc98a70fce8b771f48fc5e69b45d63
qwen2  IQ4_XS iq4_nl 0b31c736b204050045883a69233307ffe506966991a53e6d11a687bc21613522
tiny   IQ4_NL iq4_nl 99959f3cc87c25e7d959f58b179f00ac7929fb2e17489cf11e1bec757a28fced
phi3   Q4_K_M q5_1   2be709f74553ba18af621bca640ce1c1e0fd80141199809e889e6184b39dcc7e
phi3   IQ4_XS iq4_nl d7c528fb59c5c4efbc75313055dc960827807156bb1879043bafe981272dfb2c
tiny   Q2_K   iq4_nl 13fe17212c7857dc4304108a3e6f3c2ea320350492cfb97f2f792b4a6b05ccc6
tiny   Q3_K_M iq4_nl 677808af6134f14865333ab9b2a383e601b338c00dd27a381b02b43d1b98f860
qwen2  Q3_K_S iq4_nl aedbe7b2ccec977f5125e8f36658721b234eac4092d0879f3147ba126a261d13
qwen2  Q3_K_L q5_1   763df8b7eaa8fbc7310ba56641dc3b6d2ced72f12d189cbf29c7b3e509f3f382
phi3   Q3_K_M q5_0   78c29a54ffb6458ca6c0c5281bde76e63b924fa88f11497ace59bb92aa3549b7
gemma2 Q4_K_M q5_0   c595ff20f865bd24c6bf265f412e406be2e554e5a355a05eac62a37952abbb1e
gemma2 Q3_K_M q5_1   a5e8c61057a0c2e01797f3dfa67ddd843dc682d5c1c5e5b6dc5dac40dcd51e4c
"
while read -r preset type fallback want; do
  [ -n "$preset" ] || continue
  src="$tmp/$preset-f16.gguf"
  [ -f "$src" ] || "$mkmodel" --out "$src" --preset "$preset" --dtype f16 --format gguf >/dev/null ||
    { echo "FAIL $preset: tandem-mkmodel"; fails=$((fails + 1)); continue; }
  if ! "$quantize" "$src" "$tmp/$preset-$type.gguf" "$type" >"$tmp/out" 2>&1; then
    echo "FAIL $preset $type: tandem-quantize"; sed 's/^/  | /' "$tmp/out"; fails=$((fails + 1)); continue
  fi
  grep -q "$fallback" "$tmp/out" ||
    { echo "FAIL $preset $type: no $fallback tensors"; cat "$tmp/out"; fails=$((fails + 1)); }
  got=$(sha256sum "$tmp/$preset-$type.gguf" | cut -d' ' -f1)
  if [ "$got" = "$want" ]; then
    echo "ok   $preset $type is llama-quantize's file: $(sed 's/^wrote [^:]*: //' "$tmp/out")"
  else
    echo "FAIL $preset $type: sha256 $got, llama-quantize's $want"; fails=$((fails + 1))
  fi
done <<< "$cases"
echo "$fails failed"
[ "$fails" = 0 ]
