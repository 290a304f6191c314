#!/usr/bin/env bash
# Times llama.cpp on the same GGUF files bench_engine measured, on the same CPU, right after it: the side-by-side
# figures in docs/engine.md. llama.cpp comes as the prebuilt CPU libraries of the npm package node-llama-cpp
# (installed into a temporary directory; nothing of it is kept or committed), driven by llamacpp_side_by_side.mjs:
# a 128-token prompt, then greedy decode, prompt and decode timed separately.
#
#   bash bench/engine/llamacpp_side_by_side.sh [MODELS_DIR] [TOKENS]
# MODELS_DIR: where bench_engine wrote 134m-{F32,F16,BF16,Q8_0,Q4_0,Q4_K_M}.gguf (default /tmp/tandem-bench-models;
# the F32 file is made with tandem-quantize from bench_engine's f32 directory when missing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
models=${1:-/tmp/tandem-bench-models}
tokens=${2:-64}
build=${TANDEM_BUILD:-$here/../../build}
work=${NLC_DIR:-/tmp/tandem-llamacpp-bench}
mkdir -p "$work"
if [ ! -d "$work/node_modules/node-llama-cpp" ]; then
  (cd "$work" && npm install --no-audit --no-fund node-llama-cpp@3.22.1 >/dev/null)
fi
cp "$here/llamacpp_side_by_side.mjs" "$work/bench.mjs"
if [ ! -f "$models/134m-F32.gguf" ] && [ -d "$models/134m-F32" ]; then
  "$build/tools/tandem-quantize" --threads 2 "$models/134m-F32" "$models/134m-F32.gguf" F32
fi
lscpu | sed -n 's/^Model name:[[:space:]]*/CPU: /p'
for t in F32 F16 BF16 Q8_0 Q4_0 Q4_K_M IQ4_NL IQ4_XS; do
  f="$models/134m-$t.gguf"
  [ -f "$f" ] || { echo "skip $t: $f missing (run bench_engine first)"; continue; }
  for threads in 1 2; do (cd "$work" && node bench.mjs "$f" "$threads" "$tokens" 2>/dev/null | tail -1); done
done
