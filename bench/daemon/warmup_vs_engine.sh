#!/usr/bin/env bash
# Rates measured at load (the replicas' warm-up, docs/policy.md §6 "Measured at load") against the engine benchmark
# on the same model and machine, in one command: bench_engine's Prefill128 and Decode on the 134M shape (f32,
# 1 thread), then tandemd on the very same files (the integration config: 1 CPU thread, the simulated GPU), its
# warm-up lines read from its journal. Prints both and their ratios; exits 1 when a CPU ratio leaves [1/2, 2] — the
# stated factor: a 64-token prefill and 8 decode steps just after load, against steady-state runs of many.
#   bash bench/daemon/warmup_vs_engine.sh [BUILD_DIR] [MODELS_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=$(realpath "${1:-build}")
MODELS=${2:-/tmp/tandem-bench-models}
echo "bench: CPU:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
out=$(mktemp -d /tmp/tandem-warmup-bench.XXXXXX)
"$BUILD/bench/engine/bench_engine" --models "$MODELS" \
  --benchmark_filter='^(Prefill128|Decode)/134m/f32/threads:1/' \
  --benchmark_out="$out/engine.json" --benchmark_out_format=json >/dev/null
rate() { jq -r --arg n "$1/" '.benchmarks[] | select(.name | startswith($n)) | .["tok/s"]' "$out/engine.json" | head -1; }
bench_prefill=$(rate Prefill128/134m/f32/threads:1)
bench_decode=$(rate Decode/134m/f32/threads:1)
rm -rf "$out"
[ -f "$MODELS/134m-F32/model.safetensors" ] || { echo "FAIL: bench_engine wrote no $MODELS/134m-F32" >&2; exit 1; }

TANDEMD=$BUILD/src/daemon/tandemd TANDEMCTL=$BUILD/src/client/tandemctl MKMODEL=$BUILD/tools/tandem-mkmodel
export TANDEM_IT_MODEL="$MODELS/134m-F32" T_SIM_CAPACITY=${T_SIM_CAPACITY:-4GiB}
source tests/daemon/integration/lib.sh
tandem_setup
line() { grep -m1 "model default: $1 replica measured at load" "$T_LOG" || true; }
cpu=$(line CPU) gpu=$(line GPU)
[ -n "$cpu" ] || fail "no CPU warm-up line in the journal"
field() { sed -E "s/.*$1 ([0-9.]+) tok\\/s.*/\\1/" <<<"$2"; }
cpu_prefill=$(field prefill "$cpu") cpu_decode=$(field decode "$cpu")
printf '%-28s %12s %12s %8s\n' "134M f32, 1 thread" "engine tok/s" "warm-up" "ratio"
ok=1
row() {
  local r
  r=$(awk -v a="$3" -v b="$2" 'BEGIN { printf "%.2f", a / b }')
  printf '%-28s %12.1f %12.1f %8s\n' "$1" "$2" "$3" "$r"
  if [ "$4" = check ] && ! awk -v r="$r" 'BEGIN { exit !(r >= 0.5 && r <= 2.0) }'; then ok=0; fi
}
row "CPU prefill (64 vs 128 tok)" "$bench_prefill" "$cpu_prefill" check
row "CPU decode" "$bench_decode" "$cpu_decode" check
if [ -n "$gpu" ]; then  # the simulated GPU runs the CPU kernels with the device's accounting
  row "sim GPU prefill" "$bench_prefill" "$(field prefill "$gpu")" -
  row "sim GPU decode" "$bench_decode" "$(field decode "$gpu")" -
fi
grep -m2 "decode step of" "$T_LOG" | sed 's/^.*info: /  /' || true
[ "$ok" = 1 ] || { echo "FAIL: a CPU warm-up rate is not within 2x of the engine benchmark's"; exit 1; }
echo "the CPU warm-up rates are within 2x of the engine benchmark's"
