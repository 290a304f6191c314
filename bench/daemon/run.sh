#!/usr/bin/env bash
# Starts a private bus and tandemd (simulated GPU, --testing) on MODEL and runs bench_daemon against it.
#   bash bench/daemon/run.sh [BUILD_DIR] [MODEL_DIR] [bench_daemon flags...]
# Default model: BUILD/models/default (scripts/demo.sh trains it), else a generated 'tiny' model.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}; shift || true
MODEL=${1:-$BUILD/models/default}; shift || true
if [ ! -f "$MODEL/model.safetensors" ]; then
  MODEL=/tmp/tandem-bench-model-tiny
  [ -f "$MODEL/model.safetensors" ] || "$BUILD/tools/tandem-mkmodel" --out "$MODEL" --preset tiny >/dev/null
fi
BUILD=$(realpath "$BUILD")
TANDEMD=$BUILD/src/daemon/tandemd TANDEMCTL=$BUILD/src/client/tandemctl MKMODEL=$BUILD/tools/tandem-mkmodel
MODEL=$(realpath "$MODEL")
export TANDEM_IT_MODEL=$MODEL
source tests/daemon/integration/lib.sh
tandem_setup '[gpu_queue]
concurrency = 1'
echo "bench: model $MODEL, daemon pid $T_DAEMON_PID"
"$BUILD/bench/daemon/bench_daemon" --address "$T_ADDR" --model "$MODEL" "$@"
