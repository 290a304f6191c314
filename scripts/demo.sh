#!/usr/bin/env bash
# The main job on an embedded default: installs packages (as root), builds, makes the bundled default model (a
# small Llama-architecture model trained once on the license texts every Debian machine ships, with the real
# Llama 2 tokenizer) and the bundled default embedding model (CLIP layout, trained here on rendered shapes with
# captions) and the bundled default speech model (Whisper layout, trained here on sentences espeak-ng speaks), then
# starts tandemd on a PRIVATE D-Bus bus with a simulated GPU (no CUDA needed) serving all three, and walks through
# normal → image search → transcription → memory pressure (the embeddings and a transcription keep the GPU; for the
# long prompt the ladder gives back an idle replica of another model, or offloads its last layer) → GPU fault (degraded; embeddings re-run on the CPU, a transcription moves to the CPU at
# a window boundary) → recovered with tandemctl.
#   bash scripts/demo.sh ["your prompt"]
# TANDEM_DEMO_KEEP=1 leaves the daemon running at the end (its bus address is printed).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${TANDEM_BUILD:-build}
MODEL=${TANDEM_MODEL:-$PWD/$BUILD/models/default}
PROMPT=${1:-"This program is free software; you can"}

if [ "$(id -u)" = 0 ]; then bash scripts/setup.sh; fi
bash scripts/build.sh

if [ ! -f "$MODEL/model.safetensors" ]; then
  echo "demo: training the default model into $MODEL (a few minutes, once)"
  "$BUILD/tools/tandem-train" --out "$MODEL"
fi
CLIP_MODEL=${TANDEM_CLIP_MODEL:-$PWD/$BUILD/models/clip-default}
if [ ! -f "$CLIP_MODEL/model.safetensors" ]; then
  echo "demo: training the default embedding model into $CLIP_MODEL (about 3 minutes, once)"
  "$BUILD/tools/tandem-train-clip" --out "$CLIP_MODEL"
fi

ASR_MODEL=${TANDEM_ASR_MODEL:-$PWD/$BUILD/models/whisper-default}
if [ ! -f "$ASR_MODEL/model.safetensors" ]; then
  echo "demo: training the default speech model into $ASR_MODEL (about 16 minutes on two cores, once)"
  "$BUILD/tools/tandem-train-whisper" --out "$ASR_MODEL"
fi

DIR=$(mktemp -d /tmp/tandem-demo.XXXXXX)
SOCK="$DIR/bus.sock"
export TANDEM_BUS="address=unix:path=$SOCK"
export XDG_CACHE_HOME="$DIR/cache"  # the image index (tandemctl index) lives here, not in your ~/.cache
CTL="$BUILD/src/client/tandemctl"
BUS_PID=""; DAEMON_PID=""
cleanup() {
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

# The embedded default: a simulated 2 GiB GPU, the default model on it and mmap'd for the CPU route.
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
[[model]]
name = "asr"
dir = "$ASR_MODEL"
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

step "2. image search: index a folder of pictures (the CLIP model on the GPU), then search it by text and by image"
"$BUILD/tools/tandem-train-clip" --render "$DIR/photos" 200 >/dev/null
"$CTL" models
"$CTL" index "$DIR/photos"
"$CTL" search -n 5 "a blue circle"
"$CTL" search -n 3 --image "$(ls "$DIR"/photos/*red-square*.png | head -1)"

step "2b. transcription: sentences espeak-ng speaks (held out from training), transcribed on the GPU, segment by segment"
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

# transcription_job AFTER: the id of a running transcription job above AFTER with a finished window (for the steps
# that act on it while it runs).
transcription_job() {
  local best=""
  for id in $(seq $(($1 + 1)) $(($1 + 8))); do
    j=$(busctl --address="unix:path=$SOCK" --json=short call io.tandem.Tandem1 /io/tandem/Tandem1 io.tandem.Tandem1 GetJob t "$id" 2>/dev/null) || continue
    echo "$j" | jq -e '.data[0].kind.data == "transcribe" and .data[0].state.data == "running" and .data[0].windows_done.data >= 1' >/dev/null && best=$id
  done
  echo "$best"
}

step "3. memory pressure: another program takes most of the GPU; embeddings keep the GPU, the long prompt does not fit"
"$CTL" testing foreign-load 1.43GiB   # about 40 MiB of headroom left above the 512 MiB safety margin
"$CTL" status | grep -A1 "GPU memory"
touch "$DIR"/photos/00[01]*.png  # 20 changed mtimes: re-embedded while the GPU is nearly full
"$CTL" index "$DIR/photos"
"$CTL" embed "a yellow ring" >/dev/null   # prints where it ran (stderr): the GPU, a small job
LONG="$PROMPT $(printf 'and you can redistribute it under the terms of the license %.0s' $(seq 1 40))"
"$CTL" --json transcribe "$DIR/speech/all.wav" > "$DIR/t3.json" &   # a transcription, started first
T3=$!
"$CTL" plan "$LONG"   # the long prompt does not fit whole: "evict" (an idle replica of another model is given back
                      # for it, docs/residency.md) when that frees enough, else "offload" (its last layer on the CPU)
"$CTL" run --seed 1 "$LONG"
wait "$T3" || true
echo "the transcription that ran meanwhile: $(jq -r '"\(.windows) windows on \(.routes | join(",")), \(.segments | length) segments, rtf \(.realtime_factor | floor)"' "$DIR/t3.json")"

step "4. GPU fault: the driver resets; the breaker opens and tandemd serves on the CPU (degraded)"
"$CTL" testing foreign-load 0
"$CTL" transcribe "$DIR/speech/all.wav" > "$DIR/t4.txt" &   # mid-file when the device goes
T4=$!
LAST=$(jq -r .job_id "$DIR/t3.json")
for _ in $(seq 1 500); do [ -n "$(transcription_job "$LAST")" ] && break; sleep 0.02; done
"$CTL" testing lose-device
wait "$T4" || true
sed 's/^/  /' "$DIR/t4.txt"
echo "the transcription: $(grep -c . "$DIR/t4.txt") segments, none twice: it moved to the CPU at a window boundary (above)"
wait_state degraded 10
"$CTL" status
"$CTL" run --seed 1 "$PROMPT"
"$CTL" search -n 3 "a green triangle"
"$CTL" transcribe "$DIR/speech/0002.wav"
"$CTL" embed "a yellow ring" >/dev/null

step "5. recovered: the device is back; the half-open probe closes the breaker; back on the GPU"
"$CTL" testing recover-device
wait_state normal 30
"$CTL" status
"$CTL" run --seed 1 "$PROMPT"

step "6. the daemon's log (degraded-mode lines)"
grep -E "degraded|breaker|routed|accelerator" "$DIR/tandemd.log" | sed 's/^/  /' | head -20
echo
echo "demo: done (SIGTERM drains and exits 0)"
