#!/usr/bin/env bash
# GPU holds: while a hold exists the Holds property lists it, State is degraded (gpu-held) and new jobs go to the
# CPU (a job already running on the GPU finishes there); a hold goes away when its holder's process exits (crash or
# one-shot client) without a ReleaseGpu; ReleaseGpu works for the holder and is NotAuthorized for another user;
# with two holds, the GPU comes back only when both are gone.
TANDEMD=$1 TANDEMCTL=$2 MKMODEL=$3
source "$(dirname "$0")/lib.sh"
T_DRAIN_MS=120000   # a job running on the GPU when a hold comes finishes there (it_residency.sh: the drain time)
tandem_setup
T_FAST_STOP=1

P="A game is about to start"
MON="$T_DIR/monitor.txt"
monitor_start "$MON" "type='method_call',interface='io.tandem.Tandem1',member='ReleaseGpu'" \
  "type='method_call',interface='io.tandem.Tandem1',member='HoldGpu'" "type='method_return'" "type='error'"
plan_route() { bcall Plan 'ssa(ss)a{sv}' default "$P" 0 1 max_tokens u 8 | jfield route; }
plan_route_is() { [ "$(plan_route)" = "$1" ]; }
holds_n() { prop Holds | jq length; }
holds_is() { [ "$(holds_n)" = "$1" ]; }

[ "$(holds_n)" = 0 ] && [ "$(prop State)" = normal ] || fail "initial Holds/State"

# --- 1. a holder that crashes: the hold is released when its bus name vanishes ------------------------------------
running=$(submit "$P" 3 max_tokens u 300 seed t 1 temperature d 0.9)   # on the GPU before the hold
wait_for 10 "job $running running" job_tokens_ge "$running" 1
"$TANDEMCTL" hold --app-id org.example.Game --for 60 "game running" >"$T_DIR/hold1.out" 2>"$T_DIR/hold1.err" &
h1=$!
bg_track "$h1"
wait_for 10 "the hold to show up" holds_is 1
cookie1=$(head -1 "$T_DIR/hold1.out")
holds=$(prop Holds)
[ "$(echo "$holds" | jq -r '.[0][0]')" = "$cookie1" ] || fail "Holds cookie $(echo "$holds" | jq -r '.[0][0]') != tandemctl's '$cookie1'"
[ "$(echo "$holds" | jq -r '.[0][1]')" = org.example.Game ] || fail "Holds app_id: $holds"
[ "$(echo "$holds" | jq -r '.[0][2]')" = "game running" ] || fail "Holds reason: $holds"
[ "$(echo "$holds" | jq -r '.[0][3]')" -gt 0 ] || fail "Holds since: $holds"
wait_for 3 "State degraded while held" prop_is State degraded
[ "$(prop DegradedReason)" = gpu-held ] || fail "DegradedReason '$(prop DegradedReason)', want gpu-held"
[ "$(plan_route)" = cpu ] || fail "GPU held, but Plan routes $(plan_route)"
cj=$(submit "$P" 2 max_tokens u 8 seed t 2)
[ "$(wait_job "$cj")" = completed ] || fail "job $cj while held"
[ "$(jget "$cj" routes)" = '["cpu"]' ] || fail "job $cj submitted while held ran on $(jget "$cj" routes)"
[ "$(jget "$cj" degraded)" = true ] || fail "job $cj on the CPU because of a hold is not marked degraded"
[ "$(wait_job "$running")" = completed ] || fail "the job running before the hold: $(jget "$running" state)"
[ "$(jget "$running" routes)" = '["gpu"]' ] || fail "the hold moved a running job: routes $(jget "$running" routes)"
note "hold $cookie1: State degraded (gpu-held), new job $cj on the CPU, running job $running finished on the GPU"

# Another user may not release it (the test bus lets uid 65534 talk to tandemd; it is not the holder).
expect_err NotAuthorized as_nobody gdbus call --address "$T_ADDR" --dest io.tandem.Tandem1 --object-path /io/tandem/Tandem1 \
  --method io.tandem.Tandem1.ReleaseGpu "$cookie1" >/dev/null
[ "$(holds_n)" = 1 ] || fail "a ReleaseGpu by another user removed the hold"
expect_err "UnknownJob|InvalidArgument" gcall ReleaseGpu "hold-000000000000000000000000" >/dev/null
note "ReleaseGpu by another user: NotAuthorized; unknown cookie refused"

kill -KILL "$h1"
wait "$h1" 2>/dev/null || true
wait_for 5 "the crashed holder's hold to go" holds_is 0
wait_for 5 "State normal after the holder vanished" prop_is State normal
# The hold gave the GPU replica back (evict_on_hold); it loads again first.
wait_for 10 "Plan routes gpu once the replica is back" plan_route_is gpu
grep -q "left the bus" "$T_LOG" || fail "no log line about the vanished holder"
note "holder killed (SIGKILL): hold released automatically, State normal"

# --- 2. a one-shot holder (gdbus exits right after the call) ------------------------------------------------------
out=$(gcall HoldGpu "one-shot" "org.example.OneShot")
cookie2=$(echo "$out" | grep -oE "hold-[0-9a-f]+")
[ -n "$cookie2" ] || fail "HoldGpu via gdbus: $out"
wait_for 5 "the one-shot hold to go" holds_is 0
wait_for 5 "State normal after the one-shot hold" prop_is State normal
note "one-shot holder: hold $cookie2 released when gdbus left the bus"

# --- 3. the holder releases: ReleaseGpu works, two holds need two releases -----------------------------------------
"$TANDEMCTL" hold --app-id org.example.A --for 60 "first" >"$T_DIR/hA.out" 2>"$T_DIR/hA.err" &
hA=$!
bg_track "$hA"
wait_for 10 "hold A" holds_is 1
"$TANDEMCTL" hold --app-id org.example.B --for 2 "second" >"$T_DIR/hB.out" 2>"$T_DIR/hB.err" &
hB=$!
bg_track "$hB"
wait_for 10 "hold B" holds_is 2
cookieB=$(head -1 "$T_DIR/hB.out")
rc=0; wait "$hB" || rc=$?   # tandemctl hold --for 2 releases after 2 s with ReleaseGpu and exits
[ "$rc" = 0 ] || fail "tandemctl hold --for 2 exited $rc: $(cat "$T_DIR/hB.err")"
[ "$(holds_n)" = 1 ] || fail "after B released: $(prop Holds)"
[ "$(prop Holds | jq -r '.[0][1]')" = org.example.A ] || fail "the wrong hold was released: $(prop Holds)"
sleep 0.5
[ "$(prop State)" = degraded ] || fail "one hold left, but State $(prop State)"
[ "$(plan_route)" = cpu ] || fail "one hold left, but Plan routes $(plan_route)"
# The release was a ReleaseGpu call of the holder's own connection, answered with a method return (not an error).
sleep 0.2
hdr=$(awk -v c="\"$cookieB\"" '/^(signal|method call|method return|error) / {h = $0; next}
  h ~ /member=ReleaseGpu/ && index($0, c) {print h; exit}' "$MON")
[ -n "$hdr" ] || fail "no ReleaseGpu($cookieB) seen on the bus"
rel_serial=$(echo "$hdr" | grep -oE 'serial=[0-9]+' | head -1 | cut -d= -f2)
rel_sender=$(echo "$hdr" | grep -oE 'sender=:[0-9.]+' | cut -d= -f2)
reply=$(grep -E "^(method return|error) .*destination=$rel_sender .*reply_serial=$rel_serial\b" "$MON" | head -1)
case "$reply" in "method return"*) ;; *) fail "ReleaseGpu by the holder $rel_sender was answered: '${reply:-nothing}'";; esac
grep -q 'released' "$T_DIR/hB.err" || fail "tandemctl hold did not report the release: $(cat "$T_DIR/hB.err")"
kill -INT "$hA"   # Ctrl-C: tandemctl releases and exits 0
rc=0; wait "$hA" || rc=$?
[ "$rc" = 0 ] || fail "tandemctl hold after Ctrl-C exited $rc: $(cat "$T_DIR/hA.err")"
wait_for 3 "no holds" holds_is 0
wait_for 5 "State normal after both holds" prop_is State normal
wait_for 10 "Plan routes gpu once the replica is back" plan_route_is gpu
j=$(submit "$P" 2 max_tokens u 8 seed t 3)
[ "$(wait_job "$j")" = completed ] && [ "$(jget "$j" routes)" = '["gpu"]' ] || fail "job $j after the holds: $(jget "$j" routes)"
note "two holds: the GPU came back only after both were released (ReleaseGpu by the holder answered OK)"

# A released cookie is gone.
expect_err "UnknownJob|InvalidArgument" gcall ReleaseGpu "$cookieB" >/dev/null

kill -0 "$T_DAEMON_PID" || fail "daemon died"
tandem_finish it_hold
