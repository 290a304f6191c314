#!/usr/bin/env bash
# GPU residency (docs/residency.md) on a real tandemd over the simulated device, with clients nobody on the team
# wrote (busctl, gdbus) beside tandemctl: a GPU hold gives the idle GPU replica's memory back — the device's reading
# (Memory.observed_used) drops by the replica's bytes, the model object's Replicas say evicted (reason hold) — and
# releasing it loads the replica again; a job running on the GPU when the hold comes moves to the CPU at its checkpoint
# (drain_ms = 0 here) with the same greedy tokens as an uninterrupted run, and the breaker stays closed;
# UnloadModel / LoadModel through gdbus and tandemctl, and their typed errors; foreign pressure (Testing.SetForeignLoad
# near the whole device) gives the idle replica back — reason pressure, DegradedReason gpu-given-back, the counters —
# and it is loaded again once the load has been gone for recover_after_ms.
TANDEMD=$1 TANDEMCTL=$2 MKMODEL=$3
source "$(dirname "$0")/lib.sh"
T_DRAIN_MS=0
T_MAX_PRESSURE_EVICTIONS=4
T_EVICT_RECOVER_AFTER_MS=1500
tandem_setup
T_FAST_STOP=1

P="Once upon a time in a small village"
N=800   # tokens of the long job (as it_failover.sh: long enough to be running when the hold comes)
MODEL_PATH=/io/tandem/Tandem1/models/default
gpu_replica() {
  busctl --address="$T_ADDR" --json=short get-property io.tandem.Tandem1 "$MODEL_PATH" io.tandem.Tandem1.Model Replicas |
    jq -c '[.data[] | with_entries(.value = .value.data) | select(.device != "cpu")][0]'
}
gpu_state() { gpu_replica | jq -r .state; }
gpu_state_is() { [ "$(gpu_state)" = "$1" ]; }
used() { prop Memory | jq -r .observed_used; }
counter() { btest GetCounters | grep -oE "\"$1\" [0-9]+" | grep -oE '[0-9]+$'; }
ms_now() { date +%s%3N; }
used_le() { [ "$(used)" -le "$1" ]; }
used_ge() { [ "$(used)" -ge "$1" ]; }

[ "$(gpu_state)" = loaded ] || fail "initial GPU replica: $(gpu_replica)"
bytes=$(gpu_replica | jq -r .accel_bytes)
[ "$bytes" -gt 0 ] || fail "the GPU replica holds no bytes: $(gpu_replica)"
used0=$(used)
[ "$used0" -ge "$bytes" ] || fail "Memory.observed_used $used0 < the replica's $bytes"

# --- 1. a hold gives the idle replica back; its release loads it again ----------------------------------------------
t0=$(ms_now)
"$TANDEMCTL" hold --app-id org.example.Game --for 60 "a game" >"$T_DIR/hold.out" 2>"$T_DIR/hold.err" &
h=$!
bg_track "$h"
wait_for 10 "the replica given back" gpu_state_is evicted
t_free=$(( $(ms_now) - t0 ))
[ "$(gpu_replica | jq -r .reason)" = hold ] || fail "evicted replica's reason: $(gpu_replica)"
[ "$(gpu_replica | jq -r .accel_bytes)" = 0 ] || fail "evicted replica still holds bytes: $(gpu_replica)"
wait_for 5 "the reading to show the bytes free" used_le "$((used0 - bytes))"
[ "$(prop DegradedReason)" = gpu-held ] || fail "DegradedReason '$(prop DegradedReason)' while held, want gpu-held"
"$TANDEMCTL" models default --json | jq -e '.[0].details.replicas[] | select(.device != "cpu") | .state == "evicted"' >/dev/null ||
  fail "tandemctl models: $("$TANDEMCTL" models default --json)"
[ "$(counter gpu_evictions)" = 1 ] || fail "gpu_evictions $(counter gpu_evictions)"
[ "$(counter gpu_bytes_given_back)" = "$bytes" ] || fail "gpu_bytes_given_back $(counter gpu_bytes_given_back), want $bytes"
grep -q "GPU replica of default given back (hold)" "$T_LOG" || fail "no log line for the eviction"
note "hold: $bytes bytes given back in ${t_free} ms (observed_used $used0 -> $(used))"

t0=$(ms_now)
kill -INT "$h"
wait "$h" 2>/dev/null || true
wait_for 10 "the replica loaded again" gpu_state_is loaded
t_back=$(( $(ms_now) - t0 ))
wait_for 5 "the reading to show the bytes in use" used_ge "$used0"
[ "$(counter gpu_restores)" = 1 ] || fail "gpu_restores $(counter gpu_restores)"
grep -q "GPU replica of default restored" "$T_LOG" || fail "no log line for the restore"
j=$(submit "$P" 2 max_tokens u 8 seed t 1)
[ "$(wait_job "$j")" = completed ] && [ "$(jget "$j" routes)" = '["gpu"]' ] || fail "job $j after the restore: $(jget "$j" routes)"
note "release: replica loaded again in ${t_back} ms; the next job ran on the GPU"

# --- 2. a job running on the GPU moves to the CPU at its checkpoint (drain_ms = 0): same greedy tokens -----------
ref=$(submit "$P" 3 max_tokens u $N seed t 42 temperature d 0.0)
[ "$(wait_job "$ref")" = completed ] && [ "$(jget "$ref" routes)" = '["gpu"]' ] || fail "reference job: $(jget "$ref" routes)"
REF_TOKENS=$(jget "$ref" tokens)
[ "$(echo "$REF_TOKENS" | jq length)" = $N ] || fail "reference has $(echo "$REF_TOKENS" | jq length) tokens"
mid=$(submit "$P" 3 max_tokens u $N seed t 42 temperature d 0.0)
wait_for 10 "first tokens of job $mid" job_tokens_ge "$mid" 1
"$TANDEMCTL" hold --app-id org.example.Game --for 60 "a game" >"$T_DIR/hold2.out" 2>"$T_DIR/hold2.err" &
h2=$!
bg_track "$h2"
at_hold=$(job "$mid" | jq '.tokens | length')
[ "$at_hold" -lt $N ] || fail "job $mid finished before the hold; raise N"
[ "$(wait_job "$mid")" = completed ] || fail "moved job $mid: $(job "$mid" | jq -c 'del(.tokens)')"
[ "$(jget "$mid" routes)" = '["gpu","cpu"]' ] || fail "moved job routes $(jget "$mid" routes)"
[ "$(jget "$mid" tokens)" = "$REF_TOKENS" ] || fail "moved job's tokens differ from the uninterrupted run"
wait_for 10 "the replica given back after the move" gpu_state_is evicted
[ "$(prop GpuBreaker)" = closed ] || fail "an eviction fed the breaker: $(prop GpuBreaker)"
[ "$(counter gpu_drain_preemptions)" = 1 ] || fail "gpu_drain_preemptions $(counter gpu_drain_preemptions)"
note "hold during job $mid (at token $at_hold): moved gpu -> cpu, $N tokens equal to the uninterrupted run"
kill -INT "$h2"
wait "$h2" 2>/dev/null || true
wait_for 10 "the replica loaded again" gpu_state_is loaded

# --- 3. UnloadModel / LoadModel: gdbus, tandemctl, errors ---------------------------------------------------------
expect_err NotAuthorized as_nobody gdbus call --address "$T_ADDR" --dest io.tandem.Tandem1 --object-path /io/tandem/Tandem1 \
  --method io.tandem.Tandem1.UnloadModel default gpu >/dev/null
expect_err UnknownModel gcall UnloadModel nope gpu >/dev/null
expect_err InvalidArgument gcall UnloadModel default tpu >/dev/null
expect_err NotSupported gcall UnloadModel default cpu >/dev/null
expect_err IllegalState gcall LoadModel default gpu >/dev/null
out=$(gcall UnloadModel default gpu)
echo "$out" | grep -q "'reason': <'request'>" || fail "UnloadModel reply: $out"
wait_for 10 "the replica unloaded on request" gpu_state_is evicted
[ "$(gpu_replica | jq -r .reason)" = request ] || fail "reason after UnloadModel: $(gpu_replica)"
expect_err IllegalState gcall UnloadModel default gpu >/dev/null
# Plan sends work to the CPU while it is out.
[ "$(bcall Plan 'ssa(ss)a{sv}' default "$P" 0 1 max_tokens u 8 | jfield route)" = cpu ] || fail "unloaded, but Plan routes to the GPU"
out=$("$TANDEMCTL" models load default) || fail "tandemctl models load: $out"
echo "$out" | grep -q "default: GPU replica loaded" || fail "tandemctl models load said: $out"
[ "$(gpu_state)" = loaded ] || fail "after tandemctl models load: $(gpu_replica)"
out=$("$TANDEMCTL" --json models unload default) || fail "tandemctl models unload: $out"
[ "$(echo "$out" | jq -r .state)" = evicted ] || fail "tandemctl models unload --json: $out"
"$TANDEMCTL" models load default >/dev/null || fail "tandemctl models load (again)"
note "UnloadModel/LoadModel: gdbus and tandemctl; NotAuthorized, UnknownModel, InvalidArgument, NotSupported, IllegalState"

# --- 4. foreign pressure: another program takes nearly all of the device; the idle replica goes, then comes back --
used0=$(used)
t0=$(ms_now)
btest SetForeignLoad t 1000000000 >/dev/null
wait_for 10 "the replica given back for pressure" gpu_state_is evicted
t_free=$(( $(ms_now) - t0 ))
[ "$(gpu_replica | jq -r .reason)" = pressure ] || fail "reason under foreign pressure: $(gpu_replica)"
reason_is() { [ "$(prop DegradedReason)" = "$1" ]; }
state_is() { [ "$(prop State)" = "$1" ]; }
wait_for 5 "DegradedReason gpu-given-back" reason_is gpu-given-back
[ "$(counter gpu_pressure_evictions)" = 1 ] || fail "gpu_pressure_evictions $(counter gpu_pressure_evictions)"
grep -q "GPU replica of default: giving it back (foreign pressure" "$T_LOG" || fail "no log line with the reason"
j=$(submit "$P" 2 max_tokens u 8 seed t 1)
[ "$(wait_job "$j")" = completed ] && [ "$(jget "$j" routes)" = '["cpu"]' ] || fail "job $j while given back: $(jget "$j" routes)"
t0=$(ms_now)
btest SetForeignLoad t 0 >/dev/null
wait_for 10 "the replica loaded again after the pressure" gpu_state_is loaded
t_back=$(( $(ms_now) - t0 ))
[ "$t_back" -ge 1400 ] || fail "restored after ${t_back} ms, before recover_after_ms (1500)"
wait_for 5 "State normal again" state_is normal
j=$(submit "$P" 2 max_tokens u 8 seed t 1)
[ "$(wait_job "$j")" = completed ] && [ "$(jget "$j" routes)" = '["gpu"]' ] || fail "job $j after the restore: $(jget "$j" routes)"
note "foreign pressure: replica given back in ${t_free} ms (reason pressure, gpu-given-back), back ${t_back} ms after the load left"

kill -0 "$T_DAEMON_PID" || fail "daemon died"
tandem_finish it_residency
