#!/usr/bin/env bash
# Tokenizer throughput side by side: Tandem's tokenizers (tokenizer_bench --mixed) and llama.cpp's (the prebuilt
# CPU libraries of the npm package node-llama-cpp, installed into a temporary directory, nothing kept) on the same
# ~4 MB of mixed text (English, code, digits, CJK, emoji) in ~1 KB pieces, 1 thread, on llama.cpp's test
# vocabularies (../shared/models/vocab). Prints both; the ratio is Tandem MB/s / llama.cpp MB/s per vocabulary.
#
#   bash bench/tokenizer/llamacpp_side_by_side.sh [SHARED_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
shared=${1:-$here/../../../shared}
build=${TANDEM_BUILD:-$here/../../build}
work=${NLC_DIR:-/tmp/tandem-llamacpp-bench}
[ -d "$shared/models/vocab" ] || { echo "SKIP: $shared/models/vocab not found"; exit 77; }
mkdir -p "$work"
if [ ! -d "$work/node_modules/node-llama-cpp" ]; then
  (cd "$work" && npm install --no-audit --no-fund node-llama-cpp@3.22.1 >/dev/null)
fi
cp "$here/llamacpp_tokenize.mjs" "$work/tokenize.mjs"
lscpu | sed -n 's/^Model name:[[:space:]]*/CPU: /p'
"$build/tests/tokenizer/tokenizer_bench" --dump-mixed "$work/pieces.bin"
echo "== Tandem"
"$build/tests/tokenizer/tokenizer_bench" --mixed "$shared"
echo "== llama.cpp (node-llama-cpp 3.22.1)"
for v in llama-spm gpt-2 deepseek-coder; do
  (cd "$work" && node tokenize.mjs "$shared/models/vocab/ggml-vocab-$v.gguf" "$work/pieces.bin" 2>/dev/null | tail -1)
done
