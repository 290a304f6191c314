#!/usr/bin/env bash
# Ring sessions end to end (docs/rings.md) against the real tandemd with the tiny model:
#   1. many jobs across several sessions (ring_tool many): each exactly accepted once, contiguous token steps,
#      finished once; streamed text == GetJob for a sample; the Rings property counts it all.
#   2. garbage: one session per fault kind gets a bad entry written straight into its mapping (ring_tool garbage):
#      the session fails with that fault, Rings counts ring_fault_<kind>, the log has the warning, the job the
#      session had submitted still ends (GetJob), the daemon still answers (Ping, GetJob, another session).
#   3. a client SIGKILLed mid-stream: its job reaches a terminal state, Rings shows its session closed.
#   4. the C API (c_api_client, compiled as C): its streamed text == GetJob's text.
#   5. tandemctl run through a ring (default) and with --no-ring: the same text for the same seed; no fallback.
#   6. a client that closes its submit doorbell but stays connected must not keep tandemd busy (the session ends).
#   7. [rings] enabled = false: OpenSession is Unavailable, the C API is refused, tandemctl run falls back to D-Bus
#      and prints the same text.
# Arguments: TANDEMD TANDEMCTL MKMODEL RING_TOOL C_API_CLIENT
TANDEMD=$1 TANDEMCTL=$2 MKMODEL=$3 RING_TOOL=$4 C_API=$5
source "$(dirname "$0")/lib.sh"
tandem_setup
T_FAST_STOP=1

ctl() { "$TANDEMCTL" "$@"; }
# rcount NAME: a counter of the Rings property (0 when absent).
rcount() { bget Rings | jq -r --arg k "$1" '.data[$k] // 0'; }
rcount_is() { [ "$(rcount "$1")" = "$2" ]; }
rcount_gt() { [ "$(rcount "$1")" -gt "$2" ]; }
ping() { busctl --address="$T_ADDR" call io.tandem.Tandem1 /io/tandem/Tandem1 org.freedesktop.DBus.Peer Ping; }
P="Once upon a time in a small village"

# --- 1. many jobs across sessions ----------------------------------------------------------------------------------
t0=$SECONDS
rc=0
timeout 150 "$RING_TOOL" many 4 250 4 >"$T_DIR/many.out" 2>"$T_DIR/many.err" || rc=$?
[ "$rc" = 0 ] || fail "ring_tool many exited $rc: $(head -c 3000 "$T_DIR/many.err") $(cat "$T_DIR/many.out")"
summary=$(cat "$T_DIR/many.out")
case "$summary" in
  *"jobs=1000 accepted=1000 finished=1000 distinct_ids=1000 "*) ;;
  *) fail "ring_tool many: want 1000 jobs accepted, finished and distinct, got: $summary" ;;
esac
note "many: $summary ($((SECONDS - t0)) s)"
wait_for 10 "all 4 sessions closed after the tool exited" rcount_is ring_sessions_open 0
[ "$(rcount ring_sessions_opened)" = 4 ] || fail "ring_sessions_opened = $(rcount ring_sessions_opened), want 4"
[ "$(rcount ring_sessions_closed)" = 4 ] || fail "ring_sessions_closed = $(rcount ring_sessions_closed), want 4"
subs=$(rcount ring_submissions)
[ "$subs" -ge 1000 ] || fail "ring_submissions = $subs, want >= 1000"
toks=$(rcount ring_tokens)
tool_toks=$(echo "$summary" | grep -oE 'tokens=[0-9]+' | cut -d= -f2)
[ "$toks" = "$tool_toks" ] || fail "ring_tokens = $toks, the clients received $tool_toks"
note "Rings after many: $(bget Rings | jq -c .data)"

# --- 2. garbage: every fault kind, one session each --------------------------------------------------------------
n_failed=0
for f in opcode reserved length offset record utf8 sq_index cq_index; do
  rc=0
  out=$(timeout 60 "$RING_TOOL" garbage "$f" 2>"$T_DIR/garbage.err") || rc=$?
  [ "$rc" = 0 ] || fail "ring_tool garbage $f exited $rc: $out $(cat "$T_DIR/garbage.err")"
  n_failed=$((n_failed + 1))
  sid=$(echo "$out" | grep -oE 'session=[0-9]+' | cut -d= -f2)
  jid=$(echo "$out" | grep -oE 'job=[0-9]+' | cut -d= -f2)
  [ -n "$sid" ] && [ -n "$jid" ] || fail "garbage $f: no session/job in: $out"
  echo "$out" | grep -q "state=failed fault=$f\$" || fail "garbage $f: want state=failed fault=$f, got: $out"
  [ "$(rcount "ring_fault_$f")" = 1 ] || fail "Rings ring_fault_$f = $(rcount "ring_fault_$f"), want 1"
  [ "$(rcount ring_sessions_failed)" = "$n_failed" ] ||
    fail "Rings ring_sessions_failed = $(rcount ring_sessions_failed), want $n_failed"
  grep -qE "ring session $sid of :[0-9.]+ \(uid [0-9]+\) failed: $f: " "$T_LOG" ||
    fail "no warning for session $sid ($f) in the log: $(grep "ring session $sid" "$T_LOG" | tail -3)"
  grep -E "ring session $sid of .* failed: $f" "$T_LOG" | grep -qiE '\[warn|warning' ||
    fail "the failure of session $sid is not logged at warning level: $(grep "ring session $sid" "$T_LOG")"
  ping >/dev/null || fail "Ping after garbage $f"
  st=$(wait_job "$jid") || fail "job $jid of the failed session ($f) did not end: $st"
  [ "$st" = completed ] || fail "job $jid of the failed session ($f) ended $st, want completed"
  note "garbage $f: session $sid failed ($f), its job $jid $st"
done
wait_for 10 "failed sessions are gone" rcount_is ring_sessions_open 0
# Another session still works after all that.
rc=0
timeout 60 "$RING_TOOL" many 1 10 4 >"$T_DIR/after.out" 2>"$T_DIR/after.err" || rc=$?
[ "$rc" = 0 ] || fail "a new session after the garbage: exit $rc: $(cat "$T_DIR/after.err")"
note "a new session after the garbage: $(cat "$T_DIR/after.out")"
daemon_alive || fail "tandemd died"

# --- 3. a client killed mid-stream -------------------------------------------------------------------------------
closed0=$(rcount ring_sessions_closed)
"$RING_TOOL" stream 600 >"$T_DIR/stream.out" 2>"$T_DIR/stream.err" &
spid=$!
bg_track "$spid"
wait_for 30 "the streaming client's first tokens" grep -q '^job ' "$T_DIR/stream.out"
sjid=$(awk '/^job /{print $2; exit}' "$T_DIR/stream.out")
kstate=$(jget "$sjid" state)
{ kill -KILL "$spid"; wait "$spid"; } 2>/dev/null && rc=0 || rc=$?
[ "$rc" = 137 ] || fail "the streaming client exited $rc before the kill: $(cat "$T_DIR/stream.err")"
wait_for 10 "the killed client's session closed" rcount_gt ring_sessions_closed "$closed0"
wait_for 10 "no session open" rcount_is ring_sessions_open 0
st=$(wait_job "$sjid") || fail "job $sjid of the killed client did not end: $st"
case "$st" in completed|failed|cancelled) ;; *) fail "job $sjid: $st" ;; esac
[ "$(jget "$sjid" tokens | jq length)" -gt 0 ] || fail "job $sjid has no tokens"
# Whichever the daemon notices first: the dead process's end of the submit doorbell (EOF) or its bus name leaving.
grep -qE "ring session [0-9]+ closed: (its owner :[0-9.]+ left the bus|its submit doorbell was closed)" "$T_LOG" ||
  fail "no 'left the bus' / 'doorbell was closed' line for the killed client's session"
note "killed mid-stream: job $sjid was $kstate just before the kill, then $st; session closed"

# --- 4. the C API (and the Rings PropertiesChanged of its session) ----------------------------------------------------
monitor_start "$T_DIR/props.mon" "type='signal',interface='org.freedesktop.DBus.Properties',member='PropertiesChanged'"
rc=0
"$C_API" "$P" 30 9 >"$T_DIR/c.out" 2>"$T_DIR/c.err" || rc=$?
[ "$rc" = 0 ] || fail "c_api_client exited $rc: $(cat "$T_DIR/c.err")"
cjid=$(grep -oE 'job=[0-9]+' "$T_DIR/c.err" | cut -d= -f2)
grep -q 'state=completed' "$T_DIR/c.err" || fail "c_api_client: $(cat "$T_DIR/c.err")"
job "$cjid" | jq -j .text >"$T_DIR/c.getjob"
[ -s "$T_DIR/c.out" ] || fail "c_api_client streamed no text"
cmp -s "$T_DIR/c.out" "$T_DIR/c.getjob" ||
  fail "C API streamed text != GetJob($cjid) text: $(od -c "$T_DIR/c.out" | head -3) vs $(od -c "$T_DIR/c.getjob" | head -3)"
wait_for 5 "PropertiesChanged naming Rings" grep -q '"Rings"' "$T_DIR/props.mon"
note "C API: job $cjid, $(wc -c <"$T_DIR/c.out") bytes == GetJob; Rings announced in PropertiesChanged"

# --- 5. tandemctl run: ring vs --no-ring ---------------------------------------------------------------------------
subs0=$(rcount ring_submissions)
rc=0
TANDEMCTL_DEBUG=1 ctl run --max-tokens 30 --seed 5 --temperature 0.9 "$P" >"$T_DIR/ring.out" 2>"$T_DIR/ring.err" || rc=$?
[ "$rc" = 0 ] || fail "tandemctl run (ring) exited $rc: $(cat "$T_DIR/ring.err")"
! grep -qi "no ring session\|using D-Bus" "$T_DIR/ring.err" || fail "tandemctl fell back: $(cat "$T_DIR/ring.err")"
[ "$(rcount ring_submissions)" = $((subs0 + 1)) ] ||
  fail "tandemctl run did not submit through a ring (ring_submissions $subs0 -> $(rcount ring_submissions))"
rc=0
ctl run --no-ring --max-tokens 30 --seed 5 --temperature 0.9 "$P" >"$T_DIR/dbus.out" 2>"$T_DIR/dbus.err" || rc=$?
[ "$rc" = 0 ] || fail "tandemctl run --no-ring exited $rc: $(cat "$T_DIR/dbus.err")"
[ "$(rcount ring_submissions)" = $((subs0 + 1)) ] || fail "--no-ring submitted through a ring"
[ -s "$T_DIR/ring.out" ] || fail "tandemctl run (ring) printed nothing"
cmp -s "$T_DIR/ring.out" "$T_DIR/dbus.out" ||
  fail "ring and --no-ring texts differ for the same seed: $(od -c "$T_DIR/ring.out" | head -2) vs $(od -c "$T_DIR/dbus.out" | head -2)"
note "tandemctl run: ring and --no-ring print the same $(wc -c <"$T_DIR/ring.out") bytes"

# --- 6. a closed submit doorbell must not make tandemd spin (TANDEM_IT_RING_HANGUP=0 skips it) ---------------------
if [ "${TANDEM_IT_RING_HANGUP:-1}" = 1 ]; then
  "$RING_TOOL" hangup 6 >"$T_DIR/hangup.out" 2>&1 &
  hpid=$!
  bg_track "$hpid"
  wait_for 10 "the hang-up client's session" grep -q 'doorbell closed' "$T_DIR/hangup.out"
  cpu() { awk '{print $14 + $15}' "/proc/$T_DAEMON_PID/stat"; }
  c0=$(cpu); w0=$(date +%s%N)
  sleep 3  # a measurement window (CPU ticks of tandemd while nothing happens), not a synchronization
  c1=$(cpu); w1=$(date +%s%N)
  ticks=$((c1 - c0)); wall_cs=$(((w1 - w0) / 10000000))
  wait "$hpid" || true
  [ $((ticks * 4)) -lt "$wall_cs" ] ||
    fail "tandemd used $ticks CPU ticks in $wall_cs cs while a client's submit doorbell was closed (busy loop on POLLHUP)"
  note "hang-up: tandemd used $ticks ticks in $wall_cs cs"
fi

# --- 7. rings disabled: OpenSession Unavailable, tandemctl falls back ------------------------------------------------
kill -TERM "$T_DAEMON_PID"
for _ in $(seq 1 100); do kill -0 "$T_DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$T_DAEMON_PID" 2>/dev/null && fail "tandemd did not stop on SIGTERM"
{ wait "$T_DAEMON_PID"; } 2>/dev/null || true
tandem_config "$(printf '[rings]\nenabled = false\n')"
tandem_start
expect_err Unavailable gcall OpenSession '@a{sv} {}' >/dev/null
rc=0
"$C_API" "$P" 10 9 >/dev/null 2>"$T_DIR/c2.err" || rc=$?
[ "$rc" = 1 ] && grep -q "tandem_session_open: -3" "$T_DIR/c2.err" ||
  fail "the C API with rings disabled: want exit 1 and TANDEM_E_REFUSED (-3), got $rc: $(cat "$T_DIR/c2.err")"
rc=0
TANDEMCTL_DEBUG=1 ctl run --max-tokens 30 --seed 5 --temperature 0.9 "$P" >"$T_DIR/off.out" 2>"$T_DIR/off.err" || rc=$?
[ "$rc" = 0 ] || fail "tandemctl run with rings disabled exited $rc: $(cat "$T_DIR/off.err")"
grep -q "no ring session" "$T_DIR/off.err" || fail "TANDEMCTL_DEBUG=1 does not say why it fell back: $(cat "$T_DIR/off.err")"
cmp -s "$T_DIR/off.out" "$T_DIR/ring.out" || fail "the D-Bus fallback printed another text for the same seed"
[ "$(rcount ring_sessions_opened)" = 0 ] || fail "a session was opened with rings disabled"
note "rings disabled: OpenSession Unavailable, C API refused, tandemctl fell back with the same text"

tandem_finish it_ring
