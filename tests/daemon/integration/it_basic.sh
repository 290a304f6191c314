#!/usr/bin/env bash
# Submit and read back through busctl; Plan agrees with Submit; malformed calls get typed errors and the daemon
# keeps serving; unknown jobs and models are typed errors.
TANDEMD=$1 TANDEMCTL=$2 MKMODEL=$3
source "$(dirname "$0")/lib.sh"
tandem_setup

models=$(bcall ListModels)
echo "$models" | grep -q '"name":{"type":"s","data":"default"}' || fail "ListModels: $models"
[ "$(bget State | jq -r .data)" = normal ] || fail "State is not normal: $(bget State)"

plan=$(bcall Plan ssa\(ss\)a{sv} default "The quick brown fox" 0 1 max_tokens u 12)
plan_action=$(echo "$plan" | jfield action); plan_route=$(echo "$plan" | jfield route)
sub=$(bcall Submit ssa\(ss\)a{sv} default "The quick brown fox" 0 2 max_tokens u 12 seed t 7)
id=$(echo "$sub" | jq -r '.data[0]')
[ "$(echo "$sub" | jfield action)" = "$plan_action" ] || fail "Plan action $plan_action != Submit $(echo "$sub" | jfield action)"
[ "$(echo "$sub" | jfield route)" = "$plan_route" ] || fail "Plan route != Submit route"
note "job $id: $plan_action on $plan_route"
[ "$(wait_job "$id")" = completed ] || fail "job $id did not complete"
job=$(bcall GetJob t "$id")
ntok=$(echo "$job" | jfield tokens | jq length)
[ "$ntok" -ge 1 ] && [ "$ntok" -le 12 ] || fail "job $id: $ntok tokens"
[ "$(echo "$job" | jfield routes)" = '["gpu"]' ] || fail "routes: $(echo "$job" | jfield routes)"
note "job $id completed with $ntok tokens"

# Same request, same seed: the same tokens (the RNG is keyed by seed and step).
id2=$(bcall Submit ssa\(ss\)a{sv} default "The quick brown fox" 0 2 max_tokens u 12 seed t 7 | jq -r '.data[0]')
wait_job "$id2" >/dev/null
[ "$(bcall GetJob t "$id2" | jfield tokens)" = "$(echo "$job" | jfield tokens)" ] || fail "same seed, different tokens"

# Chat messages with the template.
id3=$(bcall Submit ssa\(ss\)a{sv} default "" 1 user "Say hi" 1 max_tokens u 8 | jq -r '.data[0]')
[ "$(wait_job "$id3")" = completed ] || fail "chat job"

expect_error() {  # expect_error ERRORNAME busctl-args...
  local want=$1; shift
  local out
  if out=$(busctl --address="$T_ADDR" call io.tandem.Tandem1 /io/tandem/Tandem1 io.tandem.Tandem1 "$@" 2>&1); then
    fail "expected $want, got success: $out"
  fi
  echo "$out" | grep -q "$want" || busctl --address="$T_ADDR" --verbose call io.tandem.Tandem1 /io/tandem/Tandem1 io.tandem.Tandem1 "$@" 2>&1 | grep -q "$want" || fail "expected $want, got: $out"
  note "ok: $want ($out)"
}
expect_error "unknown option" Submit ssa\(ss\)a{sv} default "x" 0 1 max_tokns u 5
expect_error "must be an integer" Submit ssa\(ss\)a{sv} default "x" 0 1 max_tokens s five
expect_error "max_tokens must be in" Submit ssa\(ss\)a{sv} default "x" 0 1 max_tokens u 0
expect_error "unknown model" Submit ssa\(ss\)a{sv} nosuchmodel "x" 0 0
expect_error "role must be" Submit ssa\(ss\)a{sv} default "" 1 wizard "x" 0
expect_error "no job" GetJob t 999999
expect_error "no job" Cancel t 999999
expect_error "both empty" Submit ssa\(ss\)a{sv} default "" 0 0
big=$(head -c 100000 /dev/zero | tr '\0' 'a')
expect_error "at most" Submit ssa\(ss\)a{sv} default "$big" 0 0
expect_error "temperature" Submit ssa\(ss\)a{sv} default "x" 0 1 temperature d 101
expect_error "outside the vocabulary" Submit ssa\(ss\)a{sv} default "x" 0 2 max_tokens u 8 resume_tokens ai 1 99999999

# Still serving.
id4=$(bcall Submit ssa\(ss\)a{sv} default "still there" 0 1 max_tokens u 4 | jq -r '.data[0]')
[ "$(wait_job "$id4")" = completed ] || fail "daemon stopped serving after bad input"
kill -0 "$T_DAEMON_PID" || fail "daemon died"
echo "it_basic: ok"
