#!/usr/bin/env bash
# Continuous batching through the daemon: four different requests (greedy and seeded sampling, one with a prompt
# long enough to be prefilled in several step-budget chunks) submitted at once share the steps of one step loop,
# and each job's tokens are exactly the tokens it gets alone — on the simulated-GPU route and on the CPU route
# (the device full). The daemon reports the steps it ran (GetCounters: gpu_steps, cpu_steps).
TANDEMD=$1 TANDEMCTL=$2 MKMODEL=$3
source "$(dirname "$0")/lib.sh"
tandem_setup '[gpu_queue]
concurrency = 4
step_tokens = 24
[cpu_queue]
concurrency = 4
step_tokens = 24'
T_FAST_STOP=1

LONG="The weather in the mountains changes quickly: rain, snow and wind come and go over the high passes all year"
args=(
  "Once upon a time|2 max_tokens u 120 seed t 1"
  "The GPU ran out of memory while|4 max_tokens u 100 seed t 7 temperature d 0.9 top_k u 40"
  "$LONG|2 max_tokens u 80 seed t 3"
  "Hello|4 max_tokens u 140 seed t 11 temperature d 0.8 top_p d 0.9"
)
# run_set ROUTE SCALE [extra submit options]: submits the four alone (one after the other), then together, each with
# SCALE times its max_tokens; compares their tokens. SCALE keeps each job running while the next Submit arrives
# (a busctl process each): the tiny model's CPU route decodes a token in ~0.5 ms, the simulated GPU's in several.
run_set() {
  local route=$1 scale=$2; shift 2
  local extra=("$@")
  local alone=() together=() i
  for i in "${!args[@]}"; do
    local p=${args[$i]%%|*} o=${args[$i]#*|}
    # shellcheck disable=SC2086
    set -- $o
    local n=$1 max=$(( $4 * scale )); shift 4  # n entries, max_tokens first: its value scaled
    local id
    id=$(submit "$p" $((n + ${#extra[@]} / 3)) max_tokens u "$max" "$@" "${extra[@]}")
    wait_for 120 "job $id ($route, alone) finishes" job_state_is "$id" completed
    alone+=("$(jget "$id" tokens)")
  done
  local ids=() s0
  s0=$(counter "${route}_steps")
  for i in "${!args[@]}"; do
    local p=${args[$i]%%|*} o=${args[$i]#*|}
    # shellcheck disable=SC2086
    set -- $o
    local n=$1 max=$(( $4 * scale )); shift 4
    ids+=("$(submit "$p" $((n + ${#extra[@]} / 3)) max_tokens u "$max" "$@" "${extra[@]}")")
  done
  for i in "${!ids[@]}"; do
    wait_for 120 "job ${ids[$i]} ($route, batched) finishes" job_state_is "${ids[$i]}" completed
    local r
    r=$(jget "${ids[$i]}" routes)
    echo "$r" | grep -q "$route" || fail "job ${ids[$i]} ran on $r, want $route"
    together+=("$(jget "${ids[$i]}" tokens)")
    [ "${together[$i]}" = "${alone[$i]}" ] ||
      fail "$route: request $i batched gave ${together[$i]:0:200}, alone ${alone[$i]:0:200}"
  done
  local steps=$(( $(counter "${route}_steps") - s0 ))
  # Alone they would take at least (120 + 100 + 80 + 140) · SCALE steps (one per token); sharing steps takes fewer.
  local alone_steps=$(( 440 * scale ))
  [ "$steps" -gt 0 ] && [ "$steps" -lt "$alone_steps" ] ||
    fail "$route: the 4 batched jobs took $steps steps (want < $alone_steps: shared)"
  note "$route: 4 requests batched in $steps steps give exactly their tokens alone"
}

counter() { busctl --address="$T_ADDR" --json=short call io.tandem.Tandem1 /io/tandem/Tandem1 io.tandem.Tandem1.Testing GetCounters 2>/dev/null | jq -r --arg k "$1" '.data[0][$k] // 0'; }

run_set gpu 1
gs=$(counter gpu_steps)
btest SetForeignLoad t 1000000000 >/dev/null  # another program takes the device: the jobs go to the CPU route
run_set cpu 4 allow_cpu b true
cs=$(counter cpu_steps)
note "steps run: gpu ${gs:-?}, cpu ${cs:-?}"
btest SetForeignLoad t 0 >/dev/null
echo "PASS"
