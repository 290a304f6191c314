# Shared harness of the tandemd integration tests: a private dbus-daemon, a generated model, a config with the
# simulated accelerator, the daemon from the build tree, and helpers around busctl. Source it; then
#   tandem_setup [extra toml]   (starts bus + daemon, waits for the name)
#   bcall METHOD SIG ARGS...    (busctl call on io.tandem.Tandem1, JSON output)
#   tandem_teardown             (trap'd automatically)
# Needs: TANDEMD, TANDEMCTL, MKMODEL (paths), from the test's arguments.
set -euo pipefail

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
note() { echo "# $*"; }

tandem_teardown() {
  if [ -n "$T_DAEMON_PID" ] && kill -0 "$T_DAEMON_PID" 2>/dev/null; then
    kill -TERM "$T_DAEMON_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$T_DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$T_DAEMON_PID" 2>/dev/null || true
  fi
  if [ -n "$T_BUS_PID" ]; then kill "$T_BUS_PID" 2>/dev/null || true; fi
  if [ "${TANDEM_IT_KEEP:-0}" = 1 ]; then echo "kept $T_DIR"; else rm -rf "$T_DIR"; fi
}
trap tandem_teardown EXIT

tandem_model() {
  # A small random model with the real tokenizer, shared by the tests (written once per machine).
  if [ ! -f "$T_MODEL/model.safetensors" ]; then
    local tmp="$T_MODEL.tmp.$$"
    "$MKMODEL" --out "$tmp" --preset tiny >/dev/null
    mv -T "$tmp" "$T_MODEL" 2>/dev/null || rm -rf "$tmp"
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
sim_capacity = "1GiB"
poll_interval_ms = 50
probe_interval_ms = 300
probe_timeout_ms = 500

[[model]]
name = "default"
dir = "$T_MODEL"
replica_mode = "mmap"
cpu_threads = 1
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

tandem_start() {
  "$TANDEMD" --config "$T_DIR/tandemd.toml" --testing --log-stderr --log-level debug >>"$T_LOG" 2>&1 &
  T_DAEMON_PID=$!
  for _ in $(seq 1 300); do
    if busctl --address="$T_ADDR" status io.tandem.Tandem1 >/dev/null 2>&1; then return 0; fi
    kill -0 "$T_DAEMON_PID" 2>/dev/null || fail "tandemd exited during start"
    sleep 0.1
  done
  fail "tandemd did not own io.tandem.Tandem1 within 30 s"
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
