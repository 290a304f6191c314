#!/usr/bin/env bash
# tandem-http against the ring path, in one run on one machine, every figure a ratio against a baseline measured in
# the same run. A private bus, tandemd (--testing, simulated accelerator) and tandem-http on 127.0.0.1 are started
# with tests/daemon/integration/lib.sh (as tests/http/it_http.sh does); bench/http/gateway.mjs drives them:
#   1. one stream: TTFT and decode tokens/s through the gateway (POST /v1/chat/completions, stream: true, timed in the
#      client from the request to the first content chunk; decode = usage.completion_tokens after the first over
#      first → last chunk) vs the ring path with the same model, messages, seed, temperature 0 and max_tokens;
#   2. N (64) concurrent streams: aggregate tokens/s and p50/p95 inter-token gap, gateway vs ring, in rounds run in
#      ABBA order (gateway, ring, ring, gateway), each side's best round shown (other load only slows a round down);
#   3. tandem-http's VmRSS / VmHWM and CPU time (utime+stime) per 1,000 streamed tokens over its N-stream rounds;
#   4. requests/s of GET /health and of a 1-token chat completion with a keep-alive client (8 in flight, 5 s).
# The ring baseline is `tandemctl --json run --chat` (the existing native client: one ring session per process,
# JSON lines flushed per update and timestamped by the driver on arrival). It cannot show when it submits (its
# process start, bus connection and OpenSession come first), only when the job is accepted, so the comparable TTFT
# is "accepted → first token"; the full TTFT row estimates the ring's as the gateway's request → accepted plus the
# ring's accepted → first token (an upper bound for the ring, so a generous ratio for the gateway). At N streams the
# ring side is N tandemctl processes = N ring sessions; aggregates are counted from the first acceptance so their
# process start is left out. bench_streams (bench/daemon, D-Bus Submit + JobUpdate signals, raw prompt, not the
# ring) is run at 1 and N streams as a reference when it is built. Daemon settings as bench/daemon/streams.sh: token
# updates sent as they come (token_flush_interval_ms = 0), gpu_queue concurrency = N; journal fsync on (default).
#
#   bash bench/http/gateway.sh [--build DIR] [--preset tiny|134m] [--route gpu|cpu] [--tokens 64] [--streams 64]
#                              [--reps 9] [--rounds 2] [--duration 5] [--concurrency 8] [--no-dbus-ref]
#                              [--json-out FILE]
# Defaults: the generated 'tiny' model (tandem-mkmodel --preset tiny, shared with the integration tests), the
# simulated-GPU route; about a minute on 2 cores. --preset 134m: the benchmark shape of bench/daemon/streams.sh
# (minutes). --route cpu: the model without an accelerator replica (every job on the CPU route).
# Needs: the build (tandemd, tandemctl, tandem-http, tandem-mkmodel), node (≥ 18), dbus-daemon, busctl, curl.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=build PRESET=tiny ROUTE=gpu TOKENS=64 STREAMS=64 REPS=9 ROUNDS=2 DURATION=5 CONC=8 DBUS_REF=1 JSON_OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift 2;;
    --preset) PRESET=$2; shift 2;;
    --route) ROUTE=$2; shift 2;;
    --tokens) TOKENS=$2; shift 2;;
    --streams) STREAMS=$2; shift 2;;
    --reps) REPS=$2; shift 2;;
    --rounds) ROUNDS=$2; shift 2;;
    --duration) DURATION=$2; shift 2;;
    --concurrency) CONC=$2; shift 2;;
    --no-dbus-ref) DBUS_REF=0; shift;;
    --json-out) JSON_OUT=$(realpath -m "$2"); shift 2;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;;
    *) echo "gateway.sh: unknown argument $1 (--help)" >&2; exit 2;;
  esac
done
case "$PRESET" in tiny|134m) ;; *) echo "gateway.sh: --preset tiny or 134m" >&2; exit 2;; esac
case "$ROUTE" in gpu|cpu) ;; *) echo "gateway.sh: --route gpu or cpu" >&2; exit 2;; esac
for n in "$TOKENS" "$STREAMS" "$REPS" "$ROUNDS" "$DURATION" "$CONC"; do
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] || { echo "gateway.sh: counts must be positive integers" >&2; exit 2; }
done
[ "$TOKENS" -ge 2 ] || { echo "gateway.sh: --tokens must be at least 2 (a decode rate needs two tokens)" >&2; exit 2; }
[ "$STREAMS" -le 1024 ] && [ "$DURATION" -le 60 ] && [ "$CONC" -le 256 ] && [ "$REPS" -le 100 ] && [ "$ROUNDS" -le 10 ] ||
  { echo "gateway.sh: at most 1024 streams, 60 s, 256 in flight, 100 reps, 10 rounds" >&2; exit 2; }
for tool in node dbus-daemon busctl curl; do
  command -v "$tool" >/dev/null || { echo "gateway.sh: $tool is not installed" >&2; exit 2; }
done
BUILD=$(realpath "$BUILD")
TANDEMD=$BUILD/src/daemon/tandemd TANDEMCTL=$BUILD/src/client/tandemctl MKMODEL=$BUILD/tools/tandem-mkmodel
TANDEM_HTTP=$BUILD/src/http/tandem-http BENCH_STREAMS=$BUILD/bench/daemon/bench_streams
for b in "$TANDEMD" "$TANDEMCTL" "$MKMODEL" "$TANDEM_HTTP"; do
  [ -x "$b" ] || { echo "gateway.sh: $b is not built (ninja -C $BUILD)" >&2; exit 2; }
done

if [ "$PRESET" = 134m ]; then
  MODEL=/tmp/tandem-bench-model-134m  # the one bench/daemon/streams.sh generates
  [ -f "$MODEL/model.safetensors" ] || "$MKMODEL" --out "$MODEL" --preset 134m >/dev/null
  export TANDEM_IT_MODEL=$MODEL T_SIM_CAPACITY=${T_SIM_CAPACITY:-4GiB}
fi
source tests/daemon/integration/lib.sh
T_FAST_STOP=1

# Queue and ring limits raised for N streams (as streams.sh raises concurrency), in a drop-in next to the config.
mkdir -p "$T_DIR/tandemd.d"
cat >"$T_DIR/tandemd.d/bench.toml" <<CONF
[gpu_queue]
concurrency = $STREAMS
capacity = $((STREAMS * 4 + 64))
step_tokens = $((STREAMS > 256 ? STREAMS : 256))

[cpu_queue]
concurrency = $STREAMS
capacity = $((STREAMS * 4 + 64))
step_tokens = $((STREAMS > 256 ? STREAMS : 256))

[runtime]
max_jobs_per_client = $((STREAMS * 4 + CONC + 64))

[rings]
max_sessions = $((STREAMS + 16))
max_sessions_per_user = $((STREAMS + 16))
CONF
if [ "$ROUTE" = cpu ]; then printf '\n[[model]]\nname = "default"\ngpu = false\n' >>"$T_DIR/tandemd.d/bench.toml"; fi
tandem_setup

PORT=$(( 20000 + RANDOM % 20000 ))
cat >"$T_DIR/http.toml" <<CONF
[http]
max_streams_per_client = $((STREAMS + CONC + 16))
max_connections = $((STREAMS + CONC + 64))
CONF
"$TANDEM_HTTP" --config "$T_DIR/http.toml" --listen "127.0.0.1:$PORT" --bus "address=$T_ADDR" >>"$T_DIR/http.log" 2>&1 &
H_PID=$!
bg_track "$H_PID"
wait_for 20 "tandem-http healthy" sh -c "curl -sf http://127.0.0.1:$PORT/health >/dev/null"

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
simd=$(lscpu | sed -n 's/^Flags: *//p' | tr ' ' '\n' | grep -xE 'sse4_2|avx|avx2|fma|f16c|avx512f|avx512bw|avx512_vnni|avx512_bf16|amx_tile|amx_bf16' | tr '\n' ' ')
busy=$(ps -eo comm= | grep -cE '^(cc1plus|ninja|ld|c\+\+|make)$' || true)
echo "CPU: ${cpu:-unknown}, $(nproc) cores; SIMD flags: ${simd:-none of the listed}"
echo "flags: preset $PRESET ($T_MODEL), route $ROUTE (simulated accelerator$([ "$ROUTE" = cpu ] && echo ' present, model gpu = false')), tokens $TOKENS, streams $STREAMS, reps $REPS, rounds $ROUNDS, requests ${DURATION} s x $CONC in flight, seed 7, temperature 0, journal fsync on, token_flush_interval_ms 0"
echo "processes: tandemd $T_DAEMON_PID, tandem-http $H_PID on 127.0.0.1:$PORT; $(node --version); compiler/build processes running now: $busy"

args=(--base "http://127.0.0.1:$PORT" --tandemctl "$TANDEMCTL" --bus "$T_ADDR" --http-pid "$H_PID"
      --daemon-pid "$T_DAEMON_PID" --tokens "$TOKENS" --streams "$STREAMS" --reps "$REPS" --rounds "$ROUNDS" --duration "$DURATION"
      --concurrency "$CONC" --clk-tck "$(getconf CLK_TCK)" --route "$ROUTE")
if [ "$DBUS_REF" = 1 ]; then
  if [ -x "$BENCH_STREAMS" ]; then args+=(--bench-streams "$BENCH_STREAMS")
  else echo "(bench_streams is not built: the D-Bus reference is skipped; ninja -C $BUILD bench/daemon/bench_streams)"; fi
fi
[ -z "$JSON_OUT" ] || args+=(--json-out "$JSON_OUT")
node "$ROOT/bench/http/gateway.mjs" "${args[@]}" || { echo "--- tandem-http log ---" >&2; tail -20 "$T_DIR/http.log" >&2; fail "the benchmark driver failed"; }
kill -0 "$H_PID" 2>/dev/null || fail "tandem-http died during the benchmark"
# Evidence that both sides used ring sessions (the gateway's one + one per tandemctl) rather than D-Bus Submit.
if command -v jq >/dev/null; then
  echo "tandemd Rings counters: $(prop Rings | jq -c '{ring_sessions_opened, ring_submissions, ring_tokens} + (with_entries(select(.key | startswith("ring_fault_"))))')"
fi
