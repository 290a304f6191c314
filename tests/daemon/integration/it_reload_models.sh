#!/usr/bin/env bash
# The runtime model set through the real daemon (docs/residency.md, "Adding and removing models"): models added to
# and removed from the configuration take effect on SIGHUP, without a restart, while a job runs.
#   - a job streams on "default" across every reload and completes with all its tokens;
#   - SIGHUP with two models added ("second", the LLM's files on the CPU only; "asr", a Whisper-layout speech model
#     on the simulated GPU): ModelsChanged is broadcast, their objects appear, ListModels has them, Submit to
#     "second" and tandemctl transcribe with "asr" are served (the demo's way to add its speech model once trained);
#   - a model whose files do not load: the others still come; Submit names it Unavailable with the load's error;
#   - SIGHUP with "second" removed while a job of it runs: new Submits are refused (UnknownModel, "being removed"),
#     its job completes, then its object is gone and ListModels no longer has it;
#   - counters models_added / models_removed / model_add_failures.
TANDEMD=$1 TANDEMCTL=$2 MKMODEL=$3
source "$(dirname "$0")/lib.sh"

tandem_asr_model
tandem_setup
ctl() { "$TANDEMCTL" "$@"; }
models() { bcall ListModels | jq -r '.data[0][] | .name.data' | sort | tr '\n' ' '; }
has_model() { models | grep -qw "$1"; }
lacks_model() { ! has_model "$1"; }
counter() { btest GetCounters | tr ' ' '\n' | grep -A1 -x "\"$1\"" | tail -1; }
T_BASE=$(cat "$T_DIR/tandemd.toml")
write_config() { printf '%s\n%s\n' "$T_BASE" "$1" > "$T_DIR/tandemd.toml.new" && mv "$T_DIR/tandemd.toml.new" "$T_DIR/tandemd.toml"; }

monitor_start "$T_DIR/monitor.txt" "type='signal',member='ModelsChanged'"

# A job on "default" that runs across the reloads.
long=$(submit "a job that runs while models come and go" 2 max_tokens u 200 prefill_chunk u 0) || fail "submit long"
[ -n "$long" ] || fail "no job id"

SECOND="
[[model]]
name = \"second\"
dir = \"$T_MODEL\"
gpu = false
cpu_threads = 1
"
ASR_MODEL="
[[model]]
name = \"asr\"
dir = \"$ASR\"
cpu_threads = 1
gpu_threads = 1
"
BROKEN="
[[model]]
name = \"broken\"
dir = \"$T_DIR/no-such-model\"
"
mkdir -p "$T_DIR/no-such-model"
echo '{"model_type": "llama"}' > "$T_DIR/no-such-model/config.json"

write_config "$SECOND$ASR_MODEL$BROKEN"
kill -HUP "$T_DAEMON_PID"
note "SIGHUP: second, asr and broken added"
wait_for 120 "second and asr in ListModels" bash -c "$(declare -f bcall models has_model); T_ADDR='$T_ADDR'; has_model second && has_model asr"
busctl --address="$T_ADDR" introspect io.tandem.Tandem1 /io/tandem/Tandem1/models/second io.tandem.Tandem1.Model >/dev/null \
  || fail "no object for model second"
[ "$(busctl --address="$T_ADDR" get-property io.tandem.Tandem1 /io/tandem/Tandem1/models/asr io.tandem.Tandem1.Model Kind)" = 's "speech"' ] \
  || fail "model asr's Kind"
wait_for 10 "ModelsChanged for second and asr" grep -q '"second"' "$T_DIR/monitor.txt"
grep -q '"asr"' "$T_DIR/monitor.txt" || fail "no ModelsChanged naming asr: $(cat "$T_DIR/monitor.txt")"

id=$(bcall Submit 'ssa(ss)a{sv}' second "hello from the added model" 0 2 max_tokens u 8 seed t 7 | jq -r '.data[0]') \
  || fail "submit to second"
[ "$(wait_job "$id")" = completed ] || fail "job $id on second: $(job "$id")"
[ "$(jget "$id" model)" = second ] || fail "job $id ran on $(jget "$id" model)"
note "second served job $id"

python3 - "$T_DIR/tone.wav" <<'PY'
import math, struct, sys
rate, n = 16000, 16000 * 3
data = b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate))) for i in range(n))
hdr = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
open(sys.argv[1], "wb").write(hdr + b"data" + struct.pack("<I", len(data)) + data)
PY
doc=$(ctl --json transcribe --model asr "$T_DIR/tone.wav") || fail "transcribe with the added asr: $doc"
[ "$(echo "$doc" | jq -r .state)" = completed ] || fail "transcription: ${doc:0:400}"
note "asr (added at run time) transcribed: routes $(echo "$doc" | jq -c .routes)"

wait_for 60 "broken reported" grep -q "model broken: not added" "$T_LOG"
out=$(expect_err Unavailable gcall Submit broken "x" "@a(ss) []" "@a{sv} {}")
echo "$out" | grep -q "could not be loaded" || fail "broken: $out"
[ "$(counter model_add_failures)" = 1 ] || fail "model_add_failures $(counter model_add_failures)"
[ "$(counter models_added)" = 2 ] || fail "models_added $(counter models_added)"

# "second" removed while a job of it runs: that job finishes, new ones are refused, then it is gone.
busy=$(bcall Submit 'ssa(ss)a{sv}' second "a long answer" 0 2 max_tokens u 400 seed t 3 | jq -r '.data[0]') \
  || fail "submit long to second"
wait_for 30 "job $busy running" job_state_is "$busy" running
write_config "$ASR_MODEL"
kill -HUP "$T_DAEMON_PID"
note "SIGHUP: second and broken removed"
if [ "$(jget "$busy" state)" = running ]; then
  out=$(expect_err UnknownModel gcall Submit second "x" "@a(ss) []" "@a{sv} {}")
  echo "$out" | grep -Eq "being removed|unknown model" || fail "second while removing: $out"
fi
[ "$(wait_job "$busy")" = completed ] || fail "the removed model's job $busy: $(job "$busy")"
wait_for 30 "second gone from ListModels" lacks_model second
if busctl --address="$T_ADDR" introspect io.tandem.Tandem1 /io/tandem/Tandem1/models/second io.tandem.Tandem1.Model >/dev/null 2>&1; then
  fail "model second's object is still exported"
fi
out=$(expect_err UnknownModel gcall Submit second "x" "@a(ss) []" "@a{sv} {}")
wait_for 10 "ModelsChanged removing second (after one per added model)" bash -c "grep -c ModelsChanged '$T_DIR/monitor.txt' | grep -qx 3"
[ "$(counter models_removed)" = 1 ] || fail "models_removed $(counter models_removed)"
has_model asr || fail "asr went with second: $(models)"

[ "$(wait_job "$long")" = completed ] || fail "the long job on default: $(job "$long")"
[ "$(job "$long" | jq '.tokens | length')" -gt 0 ] || fail "the long job has no tokens"
daemon_alive || fail "tandemd died"
tandem_finish it_reload_models
