#!/usr/bin/env bash
# Starts a private bus and tandemd (simulated GPU, --testing) on MODEL and runs bench_ring against it.
#   bash bench/ring/run.sh [BUILD_DIR] [MODEL_DIR] [bench_ring flags...]
# Default model: BUILD/models/default (scripts/demo.sh trains it), else a generated 'tiny' model.
# The journal is synced before every accept is acknowledged (tandemd's default, journal.fsync = true), as in
# production; accepts and outcomes of one loop iteration share one fdatasync (group commit, docs/journal.md).
# GROUP_COMMIT=false: one fdatasync per accept and per outcome, as before group commit (tandemd --testing with
# TANDEM_TESTING_GROUP_COMMIT=0), for the before/after figures in docs/rings.md.
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
# Production settings over the test harness's: token updates coalesced over 20 ms (the default; the harness sends
# every token at once). JOURNAL_FSYNC=false: no fdatasync before each accept (isolates the IPC part; not for
# production).
mkdir -p "$T_DIR/tandemd.d"
printf '[runtime]\ntoken_flush_interval_ms = 20\n' >"$T_DIR/tandemd.d/bench.toml"
if [ "${JOURNAL_FSYNC:-true}" = false ]; then
  printf '[journal]\nfsync = false\n' >>"$T_DIR/tandemd.d/bench.toml"
fi
if [ "${GROUP_COMMIT:-true}" = false ]; then export TANDEM_TESTING_GROUP_COMMIT=0; fi
tandem_setup '[gpu_queue]
concurrency = 1'
unset TANDEM_TESTING_GROUP_COMMIT
echo "bench: model $MODEL, daemon pid $T_DAEMON_PID, journal fsync: ${JOURNAL_FSYNC:-true}, group commit: ${GROUP_COMMIT:-true}"
"$BUILD/bench/ring/bench_ring" --address "$T_ADDR" --model "$MODEL" --daemon-pid "$T_DAEMON_PID" "$@"
