#!/usr/bin/env bash
# sd_notify protocol, as systemd (Type=notify, WatchdogSec=2) would see it: tandemd runs with NOTIFY_SOCKET pointing
# at a datagram socket read by socat, WATCHDOG_USEC=2000000 and WATCHDOG_PID = its own pid. Expected: STATUS lines
# and EXTEND_TIMEOUT_USEC while loading, READY=1 (with a STATUS) only once the bus name is owned -- a second
# instance that cannot own the name never says READY=1 --, WATCHDOG=1 about every WATCHDOG_USEC/2, STATUS updates
# when the state changes, STOPPING=1 on SIGTERM and exit status 0.
TANDEMD=$1 TANDEMCTL=$2 MKMODEL=$3
source "$(dirname "$0")/lib.sh"
tandem_model
tandem_bus
tandem_config

NS="$T_DIR/notify.sock"
RAW="$T_DIR/notify.raw"
start_reader() {  # start_reader SOCKET RAWFILE: socat -v logs every datagram with a header line
  socat -u -v "UNIX-RECV:$1" /dev/null 2>"$2" &
  bg_track $!
  for _ in $(seq 1 50); do [ -S "$1" ] && return 0; sleep 0.05; done
  fail "socat did not create $1"
}
# notify_msgs RAWFILE: one line per datagram, newlines inside a message shown as '|'.
notify_msgs() {
  sed -E 's#> ([0-9]{4}/[0-9]{2}/[0-9]{2} [0-9:.]+ +length=[0-9]+ from=[0-9]+ to=[0-9]+)#\n@@MSG#g' "$1" |
    awk '/^@@MSG/ { if (started) print msg; started = 1; msg = ""; next }
         started { msg = (msg == "" ? $0 : msg "|" $0) }
         END { if (started) print msg }'
}
count_msgs() { notify_msgs "$RAW" | grep -c -- "$1" || true; }
msgs_have() { notify_msgs "$RAW" | grep -q -- "$1"; }

start_reader "$NS" "$RAW"
# exec keeps the pid: WATCHDOG_PID is tandemd's own pid, as under systemd.
NOTIFY_SOCKET="$NS" WATCHDOG_USEC=2000000 bash -c 'export WATCHDOG_PID=$$; exec "$@"' _ \
  "$TANDEMD" --config "$T_DIR/tandemd.toml" --testing --log-stderr >>"$T_LOG" 2>&1 &
T_DAEMON_PID=$!
wait_for 30 "READY=1" msgs_have 'READY=1'
t_ready=$SECONDS
busctl --address="$T_ADDR" status io.tandem.Tandem1 >/dev/null 2>&1 || fail "READY=1 sent, but io.tandem.Tandem1 is not owned"
owner_pid=$(busctl --address="$T_ADDR" status io.tandem.Tandem1 | sed -n 's/^PID=//p')
[ "$owner_pid" = "$T_DAEMON_PID" ] || fail "io.tandem.Tandem1 is owned by pid $owner_pid, tandemd is $T_DAEMON_PID"
notify_msgs "$RAW" >"$T_DIR/msgs.txt"
ready_line=$(grep -n -m1 'READY=1' "$T_DIR/msgs.txt" | cut -d: -f1)
ready_msg=$(sed -n "${ready_line}p" "$T_DIR/msgs.txt")
echo "$ready_msg" | grep -q 'STATUS=' || fail "READY=1 without a STATUS: $ready_msg"
echo "$ready_msg" | grep -q 'STATUS=normal' || fail "READY's STATUS does not say normal: $ready_msg"
head -n $((ready_line - 1)) "$T_DIR/msgs.txt" | grep -q '^STATUS=loading' || fail "no STATUS=loading... before READY: $(head -5 "$T_DIR/msgs.txt")"
head -n $((ready_line - 1)) "$T_DIR/msgs.txt" | grep -q 'EXTEND_TIMEOUT_USEC=' || fail "no EXTEND_TIMEOUT_USEC while loading"
[ "$(grep -c 'READY=1' "$T_DIR/msgs.txt")" = 1 ] || fail "READY=1 sent more than once"
note "start: $(head -n $((ready_line - 1)) "$T_DIR/msgs.txt" | tr '\n' ' ' | cut -c1-200)... then '$ready_msg'"

# A second instance (own state directory, same bus name) cannot own the name: it must never say READY=1.
NS2="$T_DIR/notify2.sock"
start_reader "$NS2" "$T_DIR/notify2.raw"
NOTIFY_SOCKET="$NS2" "$TANDEMD" --config "$T_DIR/tandemd.toml" --state-dir "$T_DIR/state2" --log-stderr \
  >"$T_DIR/second.log" 2>&1 &
second=$!
bg_track "$second"
for _ in $(seq 1 150); do kill -0 "$second" 2>/dev/null || break; sleep 0.1; done
if notify_msgs "$T_DIR/notify2.raw" | grep -q 'READY=1'; then
  fail "a second tandemd said READY=1 while the first owns io.tandem.Tandem1: $(tail -2 "$T_DIR/second.log")"
fi
if kill -0 "$second" 2>/dev/null; then
  note "second instance still waiting after 15 s (no READY=1)"
  kill "$second"
else
  rc=0; wait "$second" || rc=$?
  [ "$rc" != 0 ] || fail "a second tandemd that could not own the name exited 0"
  note "second instance: exit $rc without READY=1 ($(grep -o 'cannot serve.*' "$T_DIR/second.log" | cut -c1-90))"
fi
[ "$(busctl --address="$T_ADDR" status io.tandem.Tandem1 | sed -n 's/^PID=//p')" = "$T_DAEMON_PID" ] ||
  fail "the second instance took the name"

# Watchdog: WATCHDOG_USEC=2 s -> a ping about every second.
w0=$(count_msgs 'WATCHDOG=1')
sleep 4.2
w1=$(count_msgs 'WATCHDOG=1')
pings=$((w1 - w0))
[ "$pings" -ge 3 ] || fail "$pings WATCHDOG=1 in 4.2 s with WATCHDOG_USEC=2000000 (want one per second)"
[ "$pings" -le 10 ] || fail "$pings WATCHDOG=1 in 4.2 s: too many"
note "watchdog: $pings pings in 4.2 s"

# STATUS follows the state.
btest SetForeignLoad t 900000000
wait_for 5 "a STATUS line with the pressure" msgs_have 'STATUS=pressure (memory-critical)'
btest SetForeignLoad t 0
wait_for 5 "a STATUS line back to normal" sh -c "sed -E 's#> [0-9]{4}/#\n#g' '$RAW' | grep 'STATUS=' | tail -1 | grep -q 'STATUS=normal'"
note "STATUS: $(notify_msgs "$RAW" | grep -o 'STATUS=pressure[^|]*' | head -1)"

# SIGTERM with a job running: STOPPING=1, STATUS=draining, exit 0.
id=$(submit "Goodbye" 2 max_tokens u 1000 seed t 1)
wait_for 10 "job $id running" job_state_is "$id" running
kill -TERM "$T_DAEMON_PID"
rc=0
for _ in $(seq 1 150); do kill -0 "$T_DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$T_DAEMON_PID" 2>/dev/null && fail "tandemd still running 15 s after SIGTERM"
wait "$T_DAEMON_PID" || rc=$?
[ "$rc" = 0 ] || fail "tandemd exited $rc after SIGTERM"
sleep 0.2
notify_msgs "$RAW" >"$T_DIR/msgs.txt"
stop_line=$(grep -n -m1 'STOPPING=1' "$T_DIR/msgs.txt" | cut -d: -f1)
[ -n "$stop_line" ] || fail "no STOPPING=1 after SIGTERM: $(tail -3 "$T_DIR/msgs.txt")"
[ "$stop_line" -gt "$ready_line" ] || fail "STOPPING=1 before READY=1"
sed -n "${stop_line}p" "$T_DIR/msgs.txt" | grep -q 'STATUS=draining' || fail "STOPPING=1 without STATUS=draining"
[ "$(grep -c 'READY=1' "$T_DIR/msgs.txt")" = 1 ] || fail "READY=1 sent again"
note "SIGTERM: '$(sed -n "${stop_line}p" "$T_DIR/msgs.txt")', exit 0 after $((SECONDS - t_ready))s of service"
T_DAEMON_PID=""
echo "it_systemd_notify: ok"
