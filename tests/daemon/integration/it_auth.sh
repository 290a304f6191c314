#!/usr/bin/env bash
# Authorization: a local user outside the submit group (uid 65534 here; lib.sh's groups do not exist) may read the
# properties but not Submit/Plan, not write the Policy, not use Testing or HoldGpu, and not read or cancel another
# user's job; root (admin) writes the Policy (read back), and an invalid write is InvalidArgument naming the key and
# changes nothing (validated as a whole). After SIGHUP with [auth] allow_any_local_user = true the same user may
# submit and manage its own jobs, still not root's.
TANDEMD=$1 TANDEMCTL=$2 MKMODEL=$3
source "$(dirname "$0")/lib.sh"
tandem_setup
T_FAST_STOP=1

P="Hello from somebody"
ncall() {  # ncall INTERFACE.METHOD ARGS... : gdbus call as uid 65534
  local m=$1; shift
  as_nobody gdbus call --address "$T_ADDR" --dest io.tandem.Tandem1 --object-path /io/tandem/Tandem1 --method "$m" "$@"
}
pset_as() {  # pset_as root|nobody GVARIANT : Properties.Set Policy
  local who=$1 v=$2
  local cmd=(gdbus call --address "$T_ADDR" --dest io.tandem.Tandem1 --object-path /io/tandem/Tandem1
    --method org.freedesktop.DBus.Properties.Set io.tandem.Tandem1 Policy "$v")
  if [ "$who" = nobody ]; then as_nobody "${cmd[@]}"; else "${cmd[@]}"; fi
}
OPTS="{'max_tokens': <uint32 8>}"

# A job of root's, for the cross-user checks.
rootjob=$(submit "$P" 2 max_tokens u 8 seed t 1)
[ "$(wait_job "$rootjob")" = completed ] || fail "root's job"
rootlong=$(submit "$P" 2 max_tokens u 1000 seed t 2)

# --- 1. the non-member: reads yes, everything else NotAuthorized ------------------------------------------------
as_nobody busctl --address="$T_ADDR" get-property io.tandem.Tandem1 /io/tandem/Tandem1 io.tandem.Tandem1 State >/dev/null ||
  fail "uid 65534 cannot read State"
ncall io.tandem.Tandem1.ListModels >/dev/null || fail "uid 65534 cannot ListModels"
ncall org.freedesktop.DBus.Properties.GetAll io.tandem.Tandem1 >/dev/null || fail "uid 65534 cannot GetAll"
out=$(expect_err NotAuthorized ncall io.tandem.Tandem1.Submit default "$P" "@a(ss) []" "$OPTS")
echo "$out" | grep -q 'uid 65534' || fail "the NotAuthorized message does not say who: $out"
expect_err NotAuthorized ncall io.tandem.Tandem1.Plan default "$P" "@a(ss) []" "$OPTS" >/dev/null
expect_err NotAuthorized ncall io.tandem.Tandem1.GetJob "uint64 $rootjob" >/dev/null
expect_err NotAuthorized ncall io.tandem.Tandem1.Cancel "uint64 $rootlong" >/dev/null
expect_err NotAuthorized ncall io.tandem.Tandem1.Resume "uint64 $rootjob" "@a{sv} {}" >/dev/null
expect_err NotAuthorized ncall io.tandem.Tandem1.HoldGpu "game" "org.example.Game" >/dev/null
expect_err NotAuthorized pset_as nobody "<{'margin_fraction': <0.1>}>" >/dev/null
expect_err NotAuthorized ncall io.tandem.Tandem1.Testing.SetForeignLoad "uint64 900000000" >/dev/null
expect_err NotAuthorized ncall io.tandem.Tandem1.Testing.FailAllocations "uint32 1" "any" >/dev/null
expect_err NotAuthorized ncall io.tandem.Tandem1.Testing.FailProbes "uint32 5" >/dev/null
expect_err NotAuthorized ncall io.tandem.Tandem1.Testing.SetReadingLag "uint64 1000" >/dev/null
expect_err NotAuthorized ncall io.tandem.Tandem1.Testing.LoseDevice >/dev/null
expect_err NotAuthorized ncall io.tandem.Tandem1.Testing.RecoverDevice >/dev/null
expect_err NotAuthorized ncall io.tandem.Tandem1.Testing.GetCounters >/dev/null
# Nothing of it took effect.
[ "$(jget "$rootlong" state)" != cancelled ] || fail "uid 65534 cancelled root's job $rootlong"
[ "$(prop Memory | jq -r .foreign)" = 0 ] || fail "uid 65534's SetForeignLoad took effect"
[ "$(prop Memory | jq -r .present)" = true ] || fail "uid 65534's LoseDevice took effect"
[ "$(prop Holds | jq length)" = 0 ] || fail "uid 65534's HoldGpu took effect"
[ "$(prop Policy | jq -r .margin_fraction)" = 0.05 ] || fail "uid 65534's Policy write took effect"
c=$(btest GetCounters)
echo "$c" | grep -q '"jobs_accepted" 2 ' || fail "a job was accepted from uid 65534: $c"
echo "$c" | grep -q '"sim_refused_injected" 0' || fail "uid 65534's FailAllocations took effect"
note "uid 65534 (no group): reads allowed; Submit, Plan, GetJob/Cancel/Resume of root's job, HoldGpu, Policy, Testing.*: NotAuthorized"
bcall Cancel t "$rootlong" >/dev/null

# --- 2. root writes the Policy; invalid writes name the key and change nothing ---------------------------------
pset_as root "<{'margin_fraction': <0.2>, 'max_delay_ms': <uint64 1500>, 'ladder_order': <['admit', 'route_cpu', 'reject']>}>" >/dev/null ||
  fail "root could not write a valid Policy"
pol=$(prop Policy)
[ "$(echo "$pol" | jq -r .margin_fraction)" = 0.2 ] || fail "Policy.margin_fraction read back $(echo "$pol" | jq -r .margin_fraction)"
[ "$(echo "$pol" | jq -r .max_delay_ms)" = 1500 ] || fail "Policy.max_delay_ms read back $(echo "$pol" | jq -r .max_delay_ms)"
[ "$(echo "$pol" | jq -c .ladder_order)" = '["admit","route_cpu","reject"]' ] || fail "Policy.ladder_order read back $(echo "$pol" | jq -c .ladder_order)"
# margin 20 % of 1 GiB instead of 512 MiB... the margin is max(bytes, fraction x total): still 512 MiB; 0.5 -> 512 MiB.
[ "$(prop Memory | jq -r .margin)" = 536870912 ] || fail "Memory.margin $(prop Memory | jq -r .margin)"
# busctl set-property works too (the usual admin tool).
busctl --address="$T_ADDR" set-property io.tandem.Tandem1 /io/tandem/Tandem1 io.tandem.Tandem1 Policy 'a{sv}' 1 max_delay_ms t 2500 ||
  fail "busctl set-property Policy"
[ "$(prop Policy | jq -r .max_delay_ms)" = 2500 ] || fail "busctl set-property max_delay_ms not applied"
before=$(prop Policy)
out=$(expect_err InvalidArgument pset_as root "<{'margin_fraction': <0.9>}>")
# (The policy validator's own path is headroom.margin.fraction; the error must name the Policy key that was written.)
echo "$out" | grep -q 'margin_fraction' || fail "margin_fraction 0.9: InvalidArgument does not name the key margin_fraction: $out"
out=$(expect_err InvalidArgument pset_as root "<{'no_such_knob': <uint32 1>}>")
echo "$out" | grep -q 'no_such_knob' || fail "unknown Policy key: the error does not name it: $out"
out=$(expect_err InvalidArgument pset_as root "<{'max_delay_ms': <'soon'>}>")
echo "$out" | grep -q 'max_delay_ms' || fail "wrong type: the error does not name the key: $out"
out=$(expect_err InvalidArgument pset_as root "<{'ladder_order': <['admit', 'teleport', 'reject']>}>")
echo "$out" | grep -q 'teleport' || fail "unknown rung not named: $out"
expect_err InvalidArgument pset_as root "<{'ladder_order': <['admit', 'delay']>}>" >/dev/null
expect_err InvalidArgument pset_as root "<{'max_delay_ms': <uint64 99999999999>}>" >/dev/null
# Validated as a whole: one bad key, nothing applied.
expect_err InvalidArgument pset_as root "<{'margin_fraction': <0.3>, 'no_such_knob': <true>}>" >/dev/null
expect_err InvalidArgument pset_as root "<{'max_delay_ms': <uint64 100>, 'margin_fraction': <0.9>}>" >/dev/null
[ "$(prop Policy)" = "$before" ] || fail "a rejected Policy write changed the policy: $before -> $(prop Policy)"
note "root: valid Policy writes read back; invalid ones InvalidArgument, nothing applied"

# --- 3. allow_any_local_user = true (SIGHUP reload): uid 65534 submits, still cannot touch root's jobs ------------
sed -i 's/^\[auth\]$/[auth]\nallow_any_local_user = true/' "$T_DIR/tandemd.toml"
grep -q 'allow_any_local_user = true' "$T_DIR/tandemd.toml" || fail "could not edit the config"
kill -HUP "$T_DAEMON_PID"
wait_for 5 "the SIGHUP reload" grep -q 'SIGHUP: configuration reloaded' "$T_LOG"
out=$(ncall io.tandem.Tandem1.Submit default "$P" "@a(ss) []" "{'max_tokens': <uint32 8>, 'seed': <uint64 3>}") ||
  fail "uid 65534 cannot submit with allow_any_local_user: $out"
njob=$(echo "$out" | sed -n 's/^(uint64 \([0-9]*\),.*/\1/p')
[ -n "$njob" ] || fail "Submit reply: $out"
for _ in $(seq 1 100); do
  st=$(ncall io.tandem.Tandem1.GetJob "uint64 $njob" | grep -oE "'state': <'[a-z]+'>" | sed "s/.*<'\([a-z]*\)'>/\1/") || true
  [ "$st" = completed ] && break
  sleep 0.1
done
[ "$st" = completed ] || fail "uid 65534's own job $njob: GetJob (as 65534) says '$st'"
[ "$(jget "$njob" state)" = completed ] || fail "root (admin) cannot read uid 65534's job"
nlong=$(ncall io.tandem.Tandem1.Submit default "$P" "@a(ss) []" "{'max_tokens': <uint32 1000>}" | sed -n 's/^(uint64 \([0-9]*\),.*/\1/p')
[ -n "$nlong" ] || fail "uid 65534's second Submit"
ncall io.tandem.Tandem1.Cancel "uint64 $nlong" >/dev/null || fail "uid 65534 cannot cancel its own job"
expect_err NotAuthorized ncall io.tandem.Tandem1.GetJob "uint64 $rootjob" >/dev/null
rootlong2=$(submit "$P" 2 max_tokens u 1000 seed t 4)
expect_err NotAuthorized ncall io.tandem.Tandem1.Cancel "uint64 $rootlong2" >/dev/null
[ "$(jget "$rootlong2" state)" != cancelled ] || fail "uid 65534 cancelled root's job"
bcall Cancel t "$rootlong2" >/dev/null
expect_err NotAuthorized ncall io.tandem.Tandem1.Testing.SetForeignLoad "uint64 1" >/dev/null
expect_err NotAuthorized pset_as nobody "<{'max_delay_ms': <uint64 10>}>" >/dev/null
expect_err NotAuthorized ncall io.tandem.Tandem1.HoldGpu "game" "" >/dev/null
# tandemctl as that user streams its own job.
rc=0
as_nobody env TANDEM_BUS="address=$T_ADDR" "$TANDEMCTL" run --max-tokens 6 --seed 5 "$P" >"$T_DIR/nobody.out" 2>"$T_DIR/nobody.err" || rc=$?
[ "$rc" = 0 ] && [ -s "$T_DIR/nobody.out" ] || fail "tandemctl run as uid 65534 exited $rc: $(cat "$T_DIR/nobody.err")"
note "allow_any_local_user: uid 65534 submitted job $njob and cancelled its own; root's jobs, Testing, Policy, HoldGpu: NotAuthorized"

kill -0 "$T_DAEMON_PID" || fail "daemon died"
tandem_finish it_auth
