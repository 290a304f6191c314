#!/usr/bin/env bash
# Memory pressure from a foreign load: the state goes to pressure (elevated: jobs still on the GPU; critical: new
# jobs route to the CPU with a reason and an ETA), degraded mode is announced (DegradedModeChanged and
# PropertiesChanged State soon after) BEFORE the first message about a degraded job, the pressure levels have hysteresis, and
# after the foreign load is gone the state returns to normal only after recover_after_ms (300 ms in lib.sh).
# The order is taken from a dbus-monitor on the private bus (it allows eavesdropping, so the unicast JobUpdate
# signals are seen too; all the compared messages come from tandemd's one connection, so arrival order = send order).
TANDEMD=$1 TANDEMCTL=$2 MKMODEL=$3
source "$(dirname "$0")/lib.sh"
tandem_setup
T_FAST_STOP=1

MON="$T_DIR/monitor.txt"
monitor_start "$MON" "type='signal',interface='io.tandem.Tandem1'" \
  "type='signal',interface='org.freedesktop.DBus.Properties',member='PropertiesChanged',path='/io/tandem/Tandem1'" \
  "type='method_call',interface='io.tandem.Tandem1.Testing'"
P="Tell me about the weather"
plan_route() { bcall Plan 'ssa(ss)a{sv}' default "$P" 0 1 max_tokens u 16 | jfield route; }

# Level thresholds of the default policy with lib.sh's device (1 GiB, margin 512 MiB, ~27 MiB of weights + KV):
# headroom = 508947968 - foreign; elevated below 15 % of 1 GiB, critical below 5 %, exits at 20 % / 8 %.
[ "$(prop State)" = normal ] || fail "initial State $(prop State)"
[ "$(plan_route)" = gpu ] || fail "initial route $(plan_route)"
headroom0=$(prop Memory | jq -r .headroom)
[ "$headroom0" -gt 480000000 ] && [ "$headroom0" -lt 520000000 ] ||
  fail "headroom $headroom0 is not what the thresholds below assume (~508947968)"

# --- 1. elevated: State pressure (memory-pressure), jobs still admitted on the GPU ------------------------------
btest SetForeignLoad t 400000000
[ "$(prop State)" = pressure ] || fail "foreign 400 MB: State $(prop State), want pressure"
[ "$(prop DegradedReason)" = memory-pressure ] || fail "foreign 400 MB: DegradedReason '$(prop DegradedReason)'"
[ "$(prop Memory | jq -r .foreign)" = 400000000 ] || fail "Memory.foreign $(prop Memory | jq -r .foreign)"
[ "$(prop Memory | jq -r .pressure)" = elevated ] || fail "Memory.pressure $(prop Memory | jq -r .pressure)"
[ "$(plan_route)" = gpu ] || fail "elevated pressure: Plan routes $(plan_route), want gpu (there is room)"
note "elevated: State pressure (memory-pressure), jobs still go to the GPU"

# --- 2. critical: degraded announcement before the first degraded job update (D-Bus path: --no-ring; the ring
# carries degraded/reason in its own accepted and routed completions, see it_ring.sh) ---------------------------
btest SetForeignLoad t 900000000
rc=0
"$TANDEMCTL" --json run --no-ring --max-tokens 12 --seed 3 "$P" >"$T_DIR/run.json" 2>"$T_DIR/run.err" || rc=$?
[ "$rc" = 0 ] || { cat "$T_DIR/run.err" >&2; fail "tandemctl run under pressure exited $rc"; }
id=$(jq -r 'select(.event == "submitted") | .job' "$T_DIR/run.json")
pl=$(jq -c 'select(.event == "submitted") | .placement' "$T_DIR/run.json")
[ "$(echo "$pl" | jq -r .route)" = cpu ] || fail "critical pressure: placement route $(echo "$pl" | jq -r .route): $pl"
[ "$(echo "$pl" | jq -r .action)" = route_cpu ] || fail "placement action: $pl"
[ "$(echo "$pl" | jq -r .queue)" = cpu ] || fail "placement queue: $pl"
[ -n "$(echo "$pl" | jq -r '.reason // empty')" ] || fail "placement without a reason: $pl"
echo "$pl" | jq -r .detail | grep -q 'critical_pressure' || fail "placement detail does not say why the GPU was skipped: $pl"
[ "$(echo "$pl" | jq -r .eta_ms)" -gt 0 ] || fail "placement eta_ms is 0 on the CPU route: $pl"
[ "$(echo "$pl" | jq -r .degraded)" = true ] || fail "placement not marked degraded: $pl"
[ "$(jget "$id" state)" = completed ] || fail "job $id: $(jget "$id" state)"
[ "$(jget "$id" routes)" = '["cpu"]' ] || fail "job $id routes $(jget "$id" routes)"
[ "$(jget "$id" degraded)" = true ] || fail "GetJob($id).degraded is not true"
jq -e -s '[.[] | select(.kind == "routed")][0] | .route == "cpu" and .degraded == true' "$T_DIR/run.json" >/dev/null ||
  fail "routed update does not say cpu/degraded: $(grep routed "$T_DIR/run.json")"
[ "$(prop State)" = pressure ] && [ "$(prop DegradedReason)" = memory-critical ] ||
  fail "foreign 900 MB: State $(prop State) / '$(prop DegradedReason)', want pressure / memory-critical"
note "critical: job $id routed to the CPU ($(echo "$pl" | jq -r .reason), ETA $(echo "$pl" | jq -r .eta_ms) ms)"

sleep 0.2
monitor_events "$MON" >"$T_DIR/events.txt"
# Message order (line numbers) in the monitor.
line_of() { grep -n -m1 -E "$1" "$T_DIR/events.txt" | cut -d: -f1; }
set_900=$(line_of 'method_call SetForeignLoad \| uint64 900000000')
first_job_msg=$(line_of "signal JobUpdate \\| uint64 $id ")
first_tokens=$(line_of "signal JobUpdate \\| uint64 $id \\| string \"tokens\"")
dmc_critical=$(awk -v from="$set_900" 'NR > from && /signal DegradedModeChanged \| boolean true \| string "memory-critical"/ {print NR; exit}' "$T_DIR/events.txt")
[ -n "$set_900" ] && [ -n "$first_job_msg" ] && [ -n "$first_tokens" ] ||
  fail "monitor missed messages (SetForeignLoad at '$set_900', job at '$first_job_msg'): $(tail -20 "$T_DIR/events.txt")"
[ -n "$dmc_critical" ] || fail "no DegradedModeChanged(true, memory-critical) after SetForeignLoad(900 MB): $(sed -n "${set_900},\$p" "$T_DIR/events.txt" | head -20)"
[ "$dmc_critical" -lt "$first_job_msg" ] ||
  fail "DegradedModeChanged (msg $dmc_critical) came after the degraded job's first update (msg $first_job_msg)"
[ "$dmc_critical" -lt "$first_tokens" ] || fail "DegradedModeChanged after the first degraded tokens"
# The PropertiesChanged carrying DegradedReason follows promptly. (tandemd batches PropertiesChanged, at most one
# per 50 ms, so it may come after the job's first updates when the job is submitted within those 50 ms; the
# DegradedModeChanged signal above is the announcement that must come first.)
pc_state=$(awk -v from="$set_900" '
  /^(signal|method call|method return|error) / { n++; inpc = ($0 ~ /member=PropertiesChanged/) }
  n > from && inpc && /string "DegradedReason"/ { print n; exit }' "$MON")
[ -n "$pc_state" ] || fail "no PropertiesChanged(DegradedReason) after SetForeignLoad(900 MB)"
t_set900=$(sed -n "${set_900}p" "$T_DIR/events.txt" | cut -d' ' -f1)
t_pc=$(sed -n "${pc_state}p" "$T_DIR/events.txt" | cut -d' ' -f1)
pc_ms=$(awk -v a="$t_set900" -v b="$t_pc" 'BEGIN {printf "%d", (b - a) * 1000}')
[ "$pc_ms" -le 500 ] || fail "PropertiesChanged(DegradedReason) came $pc_ms ms after the foreign load"
pc_note="PropertiesChanged(DegradedReason) after $pc_ms ms (msg $pc_state)"
# The announcement's details: level, limits, since, expected slowdown.
# (The first complete DegradedModeChanged that announces memory-critical: later ones may be cut off at the end of
# the capture.)
dmc_body=$(awk '
  /^(signal|method|error)/ { if (p && buf ~ /memory-critical/) { print buf; done = 1; exit } p = 0 }
  /member=DegradedModeChanged/ { p = 1; buf = "" }
  p { buf = buf "\n" $0 }' "$MON")
for k in level limits since_unix_ms expected_slowdown fallback_model; do
  echo "$dmc_body" | grep -q "string \"$k\"" || fail "DegradedModeChanged details lack '$k'"
done
note "DegradedModeChanged (msg $dmc_critical) precedes job $id's first update (msg $first_job_msg); $pc_note"

# --- 3. hysteresis: between the critical enter and exit thresholds the level stays ------------------------------
btest SetForeignLoad t 440000000   # headroom 6.4 %: below critical exit (8 %), above critical enter (5 %)
sleep 0.6                          # > recover_after_ms
[ "$(prop Memory | jq -r .pressure)" = critical ] || fail "hysteresis: 440 MB after critical gives pressure $(prop Memory | jq -r .pressure)"
[ "$(plan_route)" = cpu ] || fail "hysteresis: still critical, but Plan routes $(plan_route)"
btest SetForeignLoad t 300000000   # headroom 19.5 %: out of critical (8 %), still elevated (exit 20 %)
wait_for 3 "leaving critical at 300 MB" prop_is DegradedReason memory-pressure
[ "$(prop Memory | jq -r .pressure)" = elevated ] || fail "300 MB: pressure $(prop Memory | jq -r .pressure), want elevated"
[ "$(plan_route)" = gpu ] || fail "elevated again, but Plan routes $(plan_route)"
note "hysteresis: 440 MB keeps critical, 300 MB gives elevated"

# --- 4. recovery: foreign load 0 -> normal, announced after recover_after_ms --------------------------------------
btest SetForeignLoad t 0
wait_for 5 "State normal after foreign load 0" prop_is State normal
[ "$(prop DegradedReason)" = "" ] || fail "normal but DegradedReason '$(prop DegradedReason)'"
sleep 0.2
monitor_events "$MON" >"$T_DIR/events.txt"
set_0=$(awk '/method_call SetForeignLoad \| uint64 0$/ {n = NR} END {print n}' "$T_DIR/events.txt")
[ -n "$set_0" ] || fail "monitor missed SetForeignLoad(0)"
t_set=$(sed -n "${set_0}p" "$T_DIR/events.txt" | cut -d' ' -f1)
dmc_off=$(awk -v from="$set_0" 'NR > from && /signal DegradedModeChanged \| boolean false/ {print NR; exit}' "$T_DIR/events.txt")
[ -n "$dmc_off" ] || fail "no DegradedModeChanged(false) after SetForeignLoad(0)"
t_off=$(sed -n "${dmc_off}p" "$T_DIR/events.txt" | cut -d' ' -f1)
delay_ms=$(awk -v a="$t_set" -v b="$t_off" 'BEGIN {printf "%d", (b - a) * 1000}')
[ "$delay_ms" -ge 250 ] || fail "normal announced ${delay_ms} ms after the load went away; recover_after_ms is 300"
[ "$delay_ms" -le 3000 ] || fail "normal announced only ${delay_ms} ms after the load went away"
id2=$(submit "$P" 2 max_tokens u 8 seed t 3)
[ "$(wait_job "$id2")" = completed ] || fail "job $id2 after recovery"
[ "$(jget "$id2" routes)" = '["gpu"]' ] || fail "after recovery job $id2 routes $(jget "$id2" routes)"
[ "$(jget "$id2" degraded)" = false ] || fail "after recovery job $id2 is degraded"
note "recovery: DegradedModeChanged(false) ${delay_ms} ms after SetForeignLoad(0); jobs back on the GPU"

# --- 5. an idle daemon publishes nothing but host-memory drift -----------------------------------------------------
# (HostMemory follows MemAvailable at 16 MiB granularity, which moves on a busy machine; everything else -- State,
# Memory, Queues, Limits, Holds, Policy, breaker -- must stay quiet while nothing happens.)
before=$(grep -c 'member=PropertiesChanged' "$MON" || true)
sleep 2
changed=$(awk -v skip="$before" '/member=PropertiesChanged/ {n++} n > skip && /^         string "[A-Z]/' "$MON" |
  sed 's/^ *string //' | sort | uniq -c | tr -s ' ' | tr '\n' ';')
idle_pc=$(($(grep -c 'member=PropertiesChanged' "$MON" || true) - before))
others=$(echo "$changed" | tr ';' '\n' | grep -v '"HostMemory"' | grep . || true)
[ -z "$others" ] || fail "idle daemon announced property changes: $changed"
note "idle: $idle_pc PropertiesChanged in 2 s, only HostMemory ($changed)"

kill -0 "$T_DAEMON_PID" || fail "daemon died"
tandem_finish it_pressure
