# Shared harness of the tandemd integration tests: a private dbus-daemon, a generated model, a config with the
# simulated accelerator, the daemon from the build tree, and helpers around busctl. Source it; then
#   tandem_setup [extra toml]   (starts bus + daemon, waits for the name)
#   bcall METHOD SIG ARGS...    (busctl call on io.tandem.Tandem1, JSON output)
#   tandem_teardown             (trap'd automatically)
# Needs: TANDEMD, TANDEMCTL, MKMODEL (paths), from the test's arguments.
set -euo pipefail
# A command failing under `set -e` would end the test without a word: say where.
trap 'echo "FAIL: unexpected command failure (exit $?) at ${BASH_SOURCE[0]##*/}:$LINENO: $BASH_COMMAND" >&2' ERR

T_DIR=$(mktemp -d /tmp/tandem-it.XXXXXX)
chmod 755 "$T_DIR"
T_SOCK="$T_DIR/bus.sock"
T_ADDR="unix:path=$T_SOCK"
T_STATE="$T_DIR/state"
T_LOG="$T_DIR/tandemd.log"
T_BUS_PID=""
T_DAEMON_PID=""
T_MODEL=${TANDEM_IT_MODEL:-/tmp/tandem-it-model-tiny}
export TANDEM_BUS="address=$T_ADDR"

fail() { echo "FAIL: $*" >&2; echo "--- tandemd log (tail) ---" >&2; tail -40 "$T_LOG" >&2 || true; exit 1; }
note() { echo "# [${SECONDS}s] $*"; }

tandem_teardown() {
  if declare -F tandem_kill_bg >/dev/null; then tandem_kill_bg; fi
  if [ -n "$T_DAEMON_PID" ] && kill -0 "$T_DAEMON_PID" 2>/dev/null; then
    # T_FAST_STOP=1: the test has checked what it wanted; don't wait for a drain of leftover jobs.
    if [ "${T_FAST_STOP:-0}" = 1 ]; then disown "$T_DAEMON_PID" 2>/dev/null || true; kill -KILL "$T_DAEMON_PID" 2>/dev/null || true; fi
    kill -TERM "$T_DAEMON_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$T_DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$T_DAEMON_PID" 2>/dev/null || true
    { wait "$T_DAEMON_PID"; } 2>/dev/null || true
  fi
  if [ -n "$T_BUS_PID" ]; then kill "$T_BUS_PID" 2>/dev/null || true; fi
  if [ "${TANDEM_IT_KEEP:-0}" = 1 ]; then echo "kept $T_DIR"; else rm -rf "$T_DIR"; fi
}
trap tandem_teardown EXIT

tandem_model() {
  # A small random model with the real tokenizer, shared by the tests (written once per machine).
  if [ ! -f "$T_MODEL/model.safetensors" ] && [ ! -f "$T_MODEL" ]; then  # a directory, or a .gguf file
    local tmp="$T_MODEL.tmp.$$"
    "$MKMODEL" --out "$tmp" --preset tiny >/dev/null
    mv -T "$tmp" "$T_MODEL" 2>/dev/null || rm -rf "$tmp"
  fi
}

# The Whisper-layout test model (tandem-mkmodel --preset whisper-test: random weights, a Whisper tokenizer), written
# once per machine at $ASR (TANDEM_IT_WHISPER_MODEL overrides the place).
tandem_asr_model() {
  ASR=${TANDEM_IT_WHISPER_MODEL:-/tmp/tandem-it-model-whisper-test}
  if [ ! -f "$ASR/model.safetensors" ] || [ ! -f "$ASR/tokenizer.json" ]; then
    local tmp="$ASR.tmp.$$"
    "$MKMODEL" --out "$tmp" --preset whisper-test >/dev/null
    mv -T "$tmp" "$ASR" 2>/dev/null || rm -rf "$tmp"
  fi
}

# The CLIP test model (tandem-mkmodel --preset clip-test: random weights, a trained CLIP tokenizer), written once per
# machine at $CLIP (TANDEM_IT_CLIP_MODEL overrides the place).
tandem_clip_model() {
  CLIP=${TANDEM_IT_CLIP_MODEL:-/tmp/tandem-it-model-clip-test}
  if [ ! -f "$CLIP/model.safetensors" ] || [ ! -f "$CLIP/vocab.json" ]; then
    local tmp="$CLIP.tmp.$$"
    "$MKMODEL" --out "$tmp" --preset clip-test >/dev/null
    mv -T "$tmp" "$CLIP" 2>/dev/null || rm -rf "$tmp"
  fi
}

tandem_bus() {
  cat > "$T_DIR/bus.conf" <<CONF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path=$T_SOCK</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
  </policy>
</busconfig>
CONF
  T_BUS_PID=$(dbus-daemon --config-file="$T_DIR/bus.conf" --fork --print-pid=1)
  for _ in $(seq 1 50); do [ -S "$T_SOCK" ] && break; sleep 0.05; done
  chmod 777 "$T_SOCK"
}

tandem_config() {
  cat > "$T_DIR/tandemd.toml" <<CONF
[bus]
kind = "address"
address = "$T_ADDR"

[auth]
submit_group = "tandem-it-nogroup"
admin_group = "tandem-it-nogroup"

[device]
kind = "simulated"
sim_capacity = "${T_SIM_CAPACITY:-1GiB}"
poll_interval_ms = 50
probe_interval_ms = 300
probe_timeout_ms = 500
drain_ms = ${T_DRAIN_MS:-5000}
# Foreign pressure gives idle replicas back only where a test asks (it_residency.sh): the other tests' foreign loads
# check the ladder's routing with the replica in place (T_MAX_PRESSURE_EVICTIONS=4 is the daemon's default).
max_pressure_evictions_per_minute = ${T_MAX_PRESSURE_EVICTIONS:-0}
recover_after_ms = ${T_EVICT_RECOVER_AFTER_MS:-30000}

[[model]]
name = "default"
dir = "$T_MODEL"
replica_mode = "mmap"
kv_cache = "${T_KV_CACHE:-f16}"
cpu_threads = ${T_CPU_THREADS:-1}
gpu_threads = 1

[breaker]
cooldown_ms = 1500
max_cooldown_ms = 5000

[service]
recover_after_ms = 300

[journal]
dir = "$T_STATE"

[runtime]
drain_timeout_ms = 5000
token_flush_interval_ms = 0
max_prompt_bytes = 65536
${1:-}
CONF
}

# tandem_try_start: like tandem_start, but returns 1 (instead of failing the test) when tandemd exits during start.
tandem_try_start() {
  "$TANDEMD" --config "$T_DIR/tandemd.toml" --testing --log-stderr --log-level debug >>"$T_LOG" 2>&1 &
  T_DAEMON_PID=$!
  for _ in $(seq 1 $((${T_START_TIMEOUT_S:-30} * 10))); do
    if busctl --address="$T_ADDR" status io.tandem.Tandem1 >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$T_DAEMON_PID" 2>/dev/null; then
      wait "$T_DAEMON_PID" 2>/dev/null || true
      return 1
    fi
    sleep 0.1
  done
  fail "tandemd did not own io.tandem.Tandem1 within ${T_START_TIMEOUT_S:-30} s"
}

tandem_start() {
  tandem_try_start || fail "tandemd exited during start"
}

tandem_setup() {
  tandem_model
  tandem_bus
  tandem_config "${1:-}"
  tandem_start
}

bcall() {
  local method=$1; shift
  busctl --address="$T_ADDR" --json=short call io.tandem.Tandem1 /io/tandem/Tandem1 io.tandem.Tandem1 "$method" "$@"
}
bget() {
  busctl --address="$T_ADDR" --json=short get-property io.tandem.Tandem1 /io/tandem/Tandem1 io.tandem.Tandem1 "$1"
}
btest() {
  local method=$1; shift
  busctl --address="$T_ADDR" call io.tandem.Tandem1 /io/tandem/Tandem1 io.tandem.Tandem1.Testing "$method" "$@"
}
# jfield KEY < busctl-json: the data of a{sv} entry KEY in the last dictionary of the reply.
jfield() { jq -r --arg k "$1" '[.data[] | objects] | last | .[$k].data | if type == "array" or type == "object" then tojson else . end'; }
# Waits until GetJob(id).state is terminal; prints the state.
wait_job() {
  local id=$1 tries=${2:-600} st=""
  for _ in $(seq 1 "$tries"); do
    st=$(bcall GetJob t "$id" | jfield state)
    case "$st" in completed|failed|cancelled) echo "$st"; return 0;; esac
    sleep 0.1
  done
  echo "$st"
  return 1
}

# --- helpers for the it_*.sh scenarios ------------------------------------------------------------------------------
# Background processes a test starts (monitors, clients, holders): killed by tandem_teardown, by pid.
T_BG_PIDS=()
bg_track() { T_BG_PIDS+=("$1"); }
tandem_kill_bg() {
  local p
  for p in "${T_BG_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  T_BG_PIDS=()
}
# gcall METHOD ARGS... : gdbus call on io.tandem.Tandem1 (GVariant text arguments). gdbus prints the D-Bus error
# name on failure ("GDBus.Error:io.tandem.Tandem1.Error.X: ..."), which busctl does not.
gcall() {
  local method=$1; shift
  gdbus call --address "$T_ADDR" --dest io.tandem.Tandem1 --object-path /io/tandem/Tandem1 \
    --method "io.tandem.Tandem1.$method" "$@"
}
gtest() {
  local method=$1; shift
  gdbus call --address "$T_ADDR" --dest io.tandem.Tandem1 --object-path /io/tandem/Tandem1 \
    --method "io.tandem.Tandem1.Testing.$method" "$@"
}
# expect_err NAME[|NAME...] CMD... : CMD must fail, and its output must name one of the D-Bus errors NAME
# (io.tandem.Tandem1.Error.NAME when NAME has no dot). Prints the output (for further greps) on success.
expect_err() {
  local wants=$1; shift
  local out rc=0 w full
  out=$("$@" 2>&1) || rc=$?
  local what="$*"
  [ "$rc" -ne 0 ] || fail "expected $wants, got success: ${what:0:200} -> ${out:0:300}"
  local IFS='|'
  for w in $wants; do
    case "$w" in *.*) full=$w;; *) full="io.tandem.Tandem1.Error.$w";; esac
    case "$out" in *"$full"*) printf '%s\n' "$out"; return 0;; esac
  done
  local cmd="$*"
  fail "expected $wants, got: ${out:0:400} (from: ${cmd:0:200})"
}
# submit PROMPT [N KEY TYPE VALUE...] : Submit through busctl; prints the job id.
submit() {
  local prompt=$1; shift
  if [ $# -eq 0 ]; then set -- 0; fi
  bcall Submit 'ssa(ss)a{sv}' default "$prompt" 0 "$@" | jq -r '.data[0]'
}
# job ID : GetJob as compact JSON {key: value}; jget ID KEY : one field (arrays/objects as JSON).
job() { bcall GetJob t "$1" | jq -c '.data[0] | with_entries(.value = .value.data)'; }
jget() { job "$1" | jq -r --arg k "$2" '.[$k] | if type == "array" or type == "object" then tojson else . end'; }
# prop NAME: a property's value (a{sv} flattened to {key: value}; arrays and objects as compact JSON).
prop() {
  bget "$1" | jq -r 'if .type == "a{sv}" then (.data | with_entries(.value = .value.data)) else .data end
    | if type == "array" or type == "object" then tojson else . end'
}
# wait_for SECONDS WHAT CMD... : polls CMD every 0.1 s until it succeeds; fails the test with WHAT otherwise.
wait_for() {
  local secs=$1 what=$2; shift 2
  local end=$((SECONDS + secs))
  while :; do
    if "$@" >/dev/null 2>&1; then return 0; fi
    [ "$SECONDS" -lt "$end" ] || fail "timed out after ${secs}s waiting for: $what"
    sleep 0.1
  done
}
# Predicates for wait_for.
prop_is() { [ "$(prop "$1")" = "$2" ]; }
job_state_is() { [ "$(jget "$1" state)" = "$2" ]; }
job_tokens_ge() { [ "$(job "$1" | jq '.tokens | length')" -ge "$2" ]; }
daemon_alive() { kill -0 "$T_DAEMON_PID" 2>/dev/null; }
# as_nobody CMD... : runs CMD as uid/gid 65534 without supplementary groups.
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@"; }
# monitor_start FILE MATCH... : dbus-monitor (verbose format) in the background; the test bus allows eavesdropping,
# so unicast JobUpdate signals are seen too. monitor_events FILE: one line per message,
# "TIME SERIAL TYPE MEMBER | first argument | second argument" in arrival order.
monitor_start() {
  local file=$1; shift
  dbus-monitor --address "$T_ADDR" "$@" >"$file" 2>&1 &
  bg_track $!
  local _
  for _ in $(seq 1 50); do grep -q NameAcquired "$file" 2>/dev/null && break; sleep 0.05; done
  sleep 0.1
}
monitor_events() {
  awk '
    /^(signal|method call|method return|error) / {
      if (rec != "") print rec
      t = $0; sub(/.*time=/, "", t); sub(/ .*/, "", t)
      s = $0; if (match(s, /serial=[0-9]+/)) s = substr(s, RSTART + 7, RLENGTH - 7); else s = "-"
      m = $0; if (match(m, /member=[A-Za-z0-9_]+/)) m = substr(m, RSTART + 7, RLENGTH - 7); else if (match(m, /error_name=[A-Za-z0-9_.]+/)) m = substr(m, RSTART + 11, RLENGTH - 11); else m = "-"
      ty = $1; if ($1 == "method") ty = $1 "_" $2
      rec = t " " s " " ty " " m; n = 0; next
    }
    n < 2 && /^   [a-z]/ { a = $0; sub(/^ +/, "", a); rec = rec " | " a; n++ }
    END { if (rec != "") print rec }' "$1"
}
# soft_fail MSG: a FAIL line, but the script goes on (for a known daemon bug that must not hide the checks after
# it); tandem_finish NAME exits non-zero if any soft failure happened.
T_SOFT_FAILS=0
soft_fail() { echo "FAIL: $*" >&2; T_SOFT_FAILS=$((T_SOFT_FAILS + 1)); }
tandem_finish() {
  if [ "$T_SOFT_FAILS" -gt 0 ]; then
    echo "--- tandemd log (tail) ---" >&2; tail -40 "$T_LOG" >&2 || true
    echo "$1: FAILED ($T_SOFT_FAILS failure(s))" >&2
    exit 1
  fi
  echo "$1: ok"
}
