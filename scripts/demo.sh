#!/usr/bin/env bash
# The main job on an embedded default: installs packages (as root), builds the five programs it runs, makes the
# bundled default model (a small Llama-architecture model trained once on the license texts every Debian machine
# ships, with the real Llama 2 tokenizer) and the bundled default embedding model (CLIP layout, trained here on
# rendered shapes with captions), then starts tandemd on a PRIVATE D-Bus bus with a simulated GPU (no CUDA needed)
# serving both, and walks through normal → image search → memory pressure (the embeddings keep the GPU; for the long
# prompt the ladder gives back an idle replica of another model, or offloads its last layer) → GPU fault (degraded;
# embeddings re-run on the CPU) → recovered with tandemctl. The bundled default speech model (Whisper layout, trained
# here on sentences espeak-ng speaks; the longest training) trains in the background meanwhile and is added to the
# RUNNING daemon when it is ready (SIGHUP with a [[model]] more: docs/residency.md, "Adding and removing models"):
# the walk ends with transcription — files, a live stream, and a GPU fault mid-file.
#   bash scripts/demo.sh ["your prompt"]
# TANDEM_DEMO_KEEP=1 leaves the daemon running at the end (its bus address is printed).
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
elapsed() { printf '%dm%02ds' $(( (SECONDS - T0) / 60 )) $(( (SECONDS - T0) % 60 )); }
BUILD=${TANDEM_BUILD:-build}
MODEL=${TANDEM_MODEL:-$PWD/$BUILD/models/default}
PROMPT=${1:-"This program is free software; you can"}

if [ "$(id -u)" = 0 ]; then bash scripts/setup.sh; fi
# Only what the demo runs; `bash scripts/test.sh` builds the rest (tests, benchmarks).
TANDEM_BUILD_TARGETS="src/daemon/tandemd src/client/tandemctl tools/tandem-train tools/tandem-train-clip tools/tandem-train-whisper" \
  bash scripts/build.sh
echo "demo: built in $(elapsed)"

DIR=$(mktemp -d /tmp/tandem-demo.XXXXXX)
ASR_PID=""
if [ ! -f "$MODEL/model.safetensors" ]; then
  echo "demo: training the default model into $MODEL (about 1.5 minutes, once)"
  "$BUILD/tools/tandem-train" --out "$MODEL"
fi
CLIP_MODEL=${TANDEM_CLIP_MODEL:-$PWD/$BUILD/models/clip-default}
if [ ! -f "$CLIP_MODEL/model.safetensors" ]; then
  echo "demo: training the default embedding model into $CLIP_MODEL (about 3 minutes, once)"
  "$BUILD/tools/tandem-train-clip" --out "$CLIP_MODEL"
fi
ASR_MODEL=${TANDEM_ASR_MODEL:-$PWD/$BUILD/models/whisper-default}
if [ ! -f "$ASR_MODEL/model.safetensors" ]; then
  echo "demo: training the default speech model into $ASR_MODEL in the background (about 16 minutes on two idle"
  echo "      cores, once); the walk starts now, and transcription joins it when the model is added to the daemon"
  rm -rf "$ASR_MODEL.training"
  nice -n 10 "$BUILD/tools/tandem-train-whisper" --out "$ASR_MODEL.training" > "$DIR/train-whisper.log" 2>&1 &
  ASR_PID=$!
fi

SOCK="$DIR/bus.sock"
export TANDEM_BUS="address=unix:path=$SOCK"
export XDG_CACHE_HOME="$DIR/cache"  # the image index (tandemctl index) lives here, not in your ~/.cache
CTL="$BUILD/src/client/tandemctl"
BUS_PID=""; DAEMON_PID=""
cleanup() {
  # An unfinished background training stops with the demo (the next run starts it again).
  [ -n "$ASR_PID" ] && kill "$ASR_PID" 2>/dev/null && wait "$ASR_PID" 2>/dev/null || true
  if [ "${TANDEM_DEMO_KEEP:-0}" = 1 ]; then echo "demo: left running: TANDEM_BUS=$TANDEM_BUS (pids $BUS_PID $DAEMON_PID)"; return; fi
  [ -n "$DAEMON_PID" ] && kill -TERM "$DAEMON_PID" 2>/dev/null && wait "$DAEMON_PID" 2>/dev/null || true
  [ -n "$BUS_PID" ] && kill "$BUS_PID" 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT

cat > "$DIR/bus.conf" <<CONF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path=$SOCK</listen>
  <auth>EXTERNAL</auth>
  <policy context="default"><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/><allow own="*"/></policy>
</busconfig>
CONF
BUS_PID=$(dbus-daemon --config-file="$DIR/bus.conf" --fork --print-pid=1)

# The embedded default: a simulated 2 GiB GPU, the default model on it and mmap'd for the CPU route. The speech model
# is added to this file, and the daemon told (SIGHUP), when it is trained (step 6).
cat > "$DIR/tandemd.toml" <<CONF
[bus]
kind = "address"
address = "unix:path=$SOCK"
[auth]
allow_any_local_user = true
[device]
kind = "simulated"
sim_capacity = "2GiB"
poll_interval_ms = 100
probe_interval_ms = 1000
# A replica given back for another program's memory use (step 3) comes back 5 s after the memory is free again.
recover_after_ms = 5000
[[model]]
name = "default"
dir = "$MODEL"
replica_mode = "mmap"
[model.sampling]
max_new_tokens = 40
[[model]]
name = "clip"
dir = "$CLIP_MODEL"
replica_mode = "mmap"
[ladder.pressure]
# The demo's GPU is small: "critical" (where nothing new starts on the GPU) begins at 1% headroom instead of 5%, so
# that in step 3 the ladder decides job by job under elevated pressure.
critical_enter_fraction = 0.01
critical_exit_fraction = 0.02
[breaker]
cooldown_ms = 2000
[service]
recover_after_ms = 1000
[journal]
dir = "$DIR/state"
CONF

echo "demo: starting tandemd (simulated GPU, private bus $SOCK)"
"$BUILD/src/daemon/tandemd" --config "$DIR/tandemd.toml" --testing --log-stderr 2> "$DIR/tandemd.log" &
DAEMON_PID=$!
for _ in $(seq 1 300); do
  "$CTL" status >/dev/null 2>&1 && break
  kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$DIR/tandemd.log"; exit 1; }
  sleep 0.1
done

step() { printf '\n\033[1m=== %s\033[0m\n' "$*"; }
wait_state() {  # wait_state STATE [seconds]
  for _ in $(seq 1 $(( ${2:-20} * 10 ))); do
    [ "$("$CTL" --json status | jq -r .state)" = "$1" ] && return 0
    sleep 0.1
  done
  echo "demo: state did not become $1" >&2
}

step "1. normal: the job runs on the (simulated) GPU"
"$CTL" status
"$CTL" run --seed 1 "$PROMPT"
echo "demo: first answer $(elapsed) after the start of the demo"

step "2. image search: index a folder of pictures (the CLIP model on the GPU), then search it by text and by image"
"$BUILD/tools/tandem-train-clip" --render "$DIR/photos" 200 >/dev/null
"$CTL" models
"$CTL" index "$DIR/photos"
"$CTL" search -n 5 "a blue circle"
"$CTL" search -n 3 --image "$(ls "$DIR"/photos/*red-square*.png | head -1)"

step "3. memory pressure: another program takes most of the GPU; embeddings keep the GPU, the long prompt does not fit"
"$CTL" testing foreign-load 1.43GiB   # about 40 MiB of headroom left above the 512 MiB safety margin
"$CTL" status | grep -A1 "GPU memory"
touch "$DIR"/photos/00[01]*.png  # 20 changed mtimes: re-embedded while the GPU is nearly full
"$CTL" index "$DIR/photos"
"$CTL" embed "a yellow ring" >/dev/null   # prints where it ran (stderr): the GPU, a small job
LONG="$PROMPT $(printf 'and you can redistribute it under the terms of the license %.0s' $(seq 1 40))"
"$CTL" plan "$LONG"   # the long prompt does not fit whole: "evict" (an idle replica of another model is given back
                      # for it, docs/residency.md) when that frees enough, else "offload" (its last layer on the CPU)
"$CTL" run --seed 1 "$LONG"

step "4. GPU fault: the driver resets; the breaker opens and tandemd serves on the CPU (degraded)"
"$CTL" testing foreign-load 0
"$CTL" testing lose-device
wait_state degraded 10
"$CTL" status
"$CTL" run --seed 1 "$PROMPT"
"$CTL" search -n 3 "a green triangle"
"$CTL" embed "a yellow ring" >/dev/null

step "5. recovered: the device is back; the half-open probe closes the breaker; back on the GPU"
"$CTL" testing recover-device
wait_state normal 30
"$CTL" status
"$CTL" run --seed 1 "$PROMPT"

step "6. transcription: the speech model joins the running daemon (a [[model]] more, SIGHUP), then transcribes"
if [ -n "$ASR_PID" ]; then
  echo "demo: the speech model is still training in the background ($(elapsed) so far); waiting for it:"
  while kill -0 "$ASR_PID" 2>/dev/null; do
    last=$(grep -E '^step ' "$DIR/train-whisper.log" | tail -1 | cut -c1-40)
    [ -z "$last" ] || echo "  $last"
    sleep 30
  done
  wait "$ASR_PID" || { tail -5 "$DIR/train-whisper.log"; echo "demo: training the speech model failed" >&2; exit 1; }
  ASR_PID=""
  mv -T "$ASR_MODEL.training" "$ASR_MODEL"
  echo "demo: the speech model is trained ($(elapsed))"
fi
cat >> "$DIR/tandemd.toml" <<CONF
[[model]]
name = "asr"
dir = "$ASR_MODEL"
CONF
kill -HUP "$DAEMON_PID"   # what \`systemctl reload tandemd\` does: nothing restarts, nothing running stops
models() { busctl --address="unix:path=$SOCK" --json=short call io.tandem.Tandem1 /io/tandem/Tandem1 io.tandem.Tandem1 ListModels | jq -r '.data[0][].name.data'; }
for _ in $(seq 1 600); do models | grep -qx asr && break; sleep 0.1; done
grep -E "model asr: (loading|added)" "$DIR/tandemd.log" | sed 's/^/  /'
"$CTL" models
"$BUILD/tools/tandem-train-whisper" --render "$DIR/speech" 12 >/dev/null
python3 - "$DIR/speech" <<'PY'   # one longer recording of all twelve, for the steps below
import sys, wave, glob
files = sorted(glob.glob(sys.argv[1] + "/0*.wav"))
out = wave.open(sys.argv[1] + "/all.wav", "wb")
for i, f in enumerate(files):
    r = wave.open(f)
    if i == 0: out.setparams(r.getparams())
    out.writeframes(r.readframes(r.getnframes()))
out.close()
PY
echo "said: $(sed -n 1p "$DIR/speech/transcripts.txt" | cut -f2)"
"$CTL" transcribe "$DIR/speech/0000.wav"
echo "said: $(sed -n 2p "$DIR/speech/transcripts.txt" | cut -f2)"
"$CTL" transcribe --srt "$DIR/speech/0001.wav"
echo "live: the twelve sentences as raw PCM through a ring session, 1 s of audio every 0.2 s, as a microphone sends it"
RATE=$(python3 -c 'import sys, wave; w = wave.open(sys.argv[1]); assert w.getsampwidth() == 2 and w.getnchannels() == 1; print(w.getframerate())' "$DIR/speech/all.wav")
python3 - "$DIR/speech/all.wav" <<'PY' | "$CTL" transcribe --raw "$RATE" -
import sys, time, wave
w = wave.open(sys.argv[1])
while True:
    frames = w.readframes(w.getframerate())
    if not frames:
        break
    sys.stdout.buffer.write(frames)
    sys.stdout.buffer.flush()
    time.sleep(0.2)
PY

# transcription_job AFTER: the id of a running transcription job above AFTER with a finished window (to lose the
# device under it).
transcription_job() {
  local best="" id j
  for id in $(seq $(($1 + 1)) $(($1 + 8))); do
    j=$(busctl --address="unix:path=$SOCK" --json=short call io.tandem.Tandem1 /io/tandem/Tandem1 io.tandem.Tandem1 GetJob t "$id" 2>/dev/null) || continue
    echo "$j" | jq -e '.data[0].kind.data == "transcribe" and .data[0].state.data == "running" and .data[0].windows_done.data >= 1' >/dev/null && best=$id
  done
  echo "$best"
}
echo "a GPU fault mid-file: the transcription moves to the CPU at a window boundary, nothing repeated or lost"
FIRST=$("$CTL" --json transcribe "$DIR/speech/0002.wav" | jq -r .job_id)
"$CTL" transcribe "$DIR/speech/all.wav" > "$DIR/t6.txt" &
T6=$!
for _ in $(seq 1 500); do [ -n "$(transcription_job "$FIRST")" ] && break; sleep 0.02; done
"$CTL" testing lose-device
wait "$T6" || true
sed 's/^/  /' "$DIR/t6.txt"
echo "the transcription: $(grep -c . "$DIR/t6.txt") segments, none twice"
"$CTL" testing recover-device
wait_state normal 30

step "7. the daemon's log (degraded-mode and model-set lines)"
grep -E "degraded|breaker|routed|accelerator|model asr" "$DIR/tandemd.log" | sed 's/^/  /' | head -24
echo
echo "demo: done in $(elapsed) (SIGTERM drains and exits 0)"
