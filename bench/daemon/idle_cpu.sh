#!/usr/bin/env bash
# Idle CPU of tandemd: starts a private bus and tandemd (simulated accelerator, the default poll intervals, no jobs,
# no clients), lets it settle, and prints the CPU time it used over SECONDS (utime + stime of every thread, from
# /proc/PID/stat) and how often its threads woke (context switches, from /proc/PID/task/*/status).
#   bash bench/daemon/idle_cpu.sh [BUILD_DIR] [SECONDS] [TANDEMD]
# BUILD_DIR (default build) provides tandem-mkmodel for the tiny model; TANDEMD defaults to BUILD_DIR's tandemd.
# IDLE_CPU_TOML: extra TOML appended to the config (e.g. "[device]" keys to compare intervals).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=$(realpath "${1:-build}")
SECS=${2:-60}
TANDEMD=$(realpath "${3:-$BUILD/src/daemon/tandemd}")
TANDEMCTL=$BUILD/src/client/tandemctl
MKMODEL=$BUILD/tools/tandem-mkmodel
export TANDEM_IT_MODEL=${TANDEM_IT_MODEL:-/tmp/tandem-it-model-tiny}
source tests/daemon/integration/lib.sh
: "$TANDEMCTL"

tandem_model
tandem_bus
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

[[model]]
name = "default"
dir = "$T_MODEL"
replica_mode = "mmap"

[journal]
dir = "$T_STATE"
fsync = false
${IDLE_CPU_TOML:-}
CONF
"$TANDEMD" --config "$T_DIR/tandemd.toml" --log-stderr --log-level info >>"$T_LOG" 2>&1 &
T_DAEMON_PID=$!
for _ in $(seq 1 300); do
  busctl --address="$T_ADDR" status io.tandem.Tandem1 >/dev/null 2>&1 && break
  kill -0 "$T_DAEMON_PID" 2>/dev/null || fail "tandemd exited during start"
  sleep 0.1
done
sleep 5  # start-up work (model load, first readings) is not idle time

# utime + stime (fields 14 and 15; counted after the ")" that ends the command name), clock ticks.
cpu_ticks() { sed 's/.*) //' "/proc/$T_DAEMON_PID/stat" | awk '{print $12 + $13}'; }
switches() { cat /proc/"$T_DAEMON_PID"/task/*/status 2>/dev/null | awk '/^(non)?voluntary_ctxt_switches/ {s += $2} END {print s + 0}'; }
hz=$(getconf CLK_TCK)
c0=$(cpu_ticks); s0=$(switches); w0=$(date +%s.%N)
sleep "$SECS"
c1=$(cpu_ticks); s1=$(switches); w1=$(date +%s.%N)
kill -0 "$T_DAEMON_PID" 2>/dev/null || fail "tandemd exited while idle"
awk -v c="$((c1 - c0))" -v hz="$hz" -v s="$((s1 - s0))" -v w0="$w0" -v w1="$w1" -v bin="$TANDEMD" 'BEGIN {
  wall = w1 - w0
  printf "tandemd idle: %.2f s CPU over %.1f s = %.2f %% of one core; %.1f thread wake-ups/s (%s)\n",
         c / hz, wall, 100 * c / hz / wall, s / wall, bin
}'
