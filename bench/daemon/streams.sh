#!/usr/bin/env bash
# Continuous batching through the daemon: starts a private bus and tandemd (simulated GPU, --testing) on MODEL with
# both queues at max batch 16 and token updates sent as they come, then runs bench_streams on the CPU route and the
# simulated-GPU route.
#   bash bench/daemon/streams.sh [BUILD_DIR] [MODEL_DIR] [bench_streams flags...]
# Default model: a generated '134m' model (the benchmark shape), f32. Environment: TANDEM_STREAMS_ROUTES (default
# "cpu gpu"), TANDEM_STREAMS_REPEAT (runs per route, default 1), TANDEM_STREAMS_CONFIG (the daemon's queue sections).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}; shift || true
MODEL=${1:-/tmp/tandem-bench-model-134m}; shift || true
if [ ! -f "$MODEL/model.safetensors" ] && [ ! -f "$MODEL" ]; then
  "$BUILD/tools/tandem-mkmodel" --out "$MODEL" --preset 134m >/dev/null
fi
BUILD=$(realpath "$BUILD")
TANDEMD=$BUILD/src/daemon/tandemd TANDEMCTL=$BUILD/src/client/tandemctl MKMODEL=$BUILD/tools/tandem-mkmodel
MODEL=$(realpath "$MODEL")
# T_START_TIMEOUT_S: the daemon measures both replicas at load; the simulated GPU's dequantizing ATen path takes
# over 20 s on a quantized 134M file.
export TANDEM_IT_MODEL=$MODEL T_SIM_CAPACITY=${T_SIM_CAPACITY:-4GiB} T_START_TIMEOUT_S=${T_START_TIMEOUT_S:-120}
source tests/daemon/integration/lib.sh
tandem_setup "${TANDEM_STREAMS_CONFIG:-[gpu_queue]
concurrency = 16
step_tokens = 80
[cpu_queue]
concurrency = 16
step_tokens = 80}"
echo "bench: model $MODEL, daemon pid $T_DAEMON_PID, CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
# TANDEM_STREAMS_REPEAT=n runs bench_streams n times per route against the same daemon (on a host whose speed moves
# between runs, each side's best is the comparison it allows: docs/kernels.md).
for route in ${TANDEM_STREAMS_ROUTES:-cpu gpu}; do
  for _ in $(seq "${TANDEM_STREAMS_REPEAT:-1}"); do
    "$BUILD/bench/daemon/bench_streams" --address "$T_ADDR" --route "$route" "$@"
    echo
  done
done
