#!/usr/bin/env bash
# Transcription through the daemon, and what a GPU fault mid-file costs: starts a private bus and tandemd (simulated
# GPU, --testing) serving SPEECH_MODEL twice ("asr" with a GPU replica, "asr-cpu" without), transcribes AUDIO on each
# (the real-time factors of both routes), then transcribes it on "asr" again and loses the device once the job has
# finished window K. Reports the recovery time: from LoseDevice to the next finished window (GetJob polled every
# 10 ms), the CPU's mean window time for comparison, whether the resumed text equals the CPU replica's, and the
# GPU memory the daemon accounted vs what the (simulated) device reports while a transcription runs.
#   bash bench/daemon/transcribe_failover.sh [BUILD_DIR] [SPEECH_MODEL] [AUDIO] [K]
# Defaults: build/models/whisper-default when it exists (else a generated whisper-test), 60 sentences spoken by
# espeak-ng three times over (else 10 min of tones), K = 2.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
ASR=${2:-}
AUDIO=${3:-}
K=${4:-2}
BUILD=$(realpath "$BUILD")
if [ -z "$ASR" ]; then
  if [ -f "$BUILD/models/whisper-default/model.safetensors" ]; then ASR=$BUILD/models/whisper-default
  else ASR=/tmp/tandem-bench-whisper-test; [ -f "$ASR/model.safetensors" ] || "$BUILD/tools/tandem-mkmodel" --out "$ASR" --preset whisper-test >/dev/null
  fi
fi
ASR=$(realpath "$ASR")
TANDEMD=$BUILD/src/daemon/tandemd TANDEMCTL=$BUILD/src/client/tandemctl MKMODEL=$BUILD/tools/tandem-mkmodel
source tests/daemon/integration/lib.sh
if [ -z "$AUDIO" ]; then
  AUDIO=$T_DIR/long.wav
  if command -v espeak-ng >/dev/null 2>&1; then
    words=(red green blue yellow fox dog cat bird box ball tree house one two three four)
    text=""
    for i in $(seq 1 60); do text+="the ${words[$((i % 16))]} ${words[$(((i * 7) % 16))]} sees ${words[$(((i * 3) % 16))]} ${words[$(((i * 5) % 16))]}. "; done
    espeak-ng -w "$T_DIR/once.wav" "$text"
    # three times over (about 4.5 min): enough windows that the fault lands mid-file
    python3 -c 'import sys,wave; r=wave.open(sys.argv[1]); p=r.getparams(); d=r.readframes(r.getnframes()); w=wave.open(sys.argv[2],"wb"); w.setparams(p); w.writeframes(d*3); w.close()' "$T_DIR/once.wav" "$AUDIO"
  else
    python3 -c 'import math,struct,sys; r=16000; n=r*600; d=b"".join(struct.pack("<h", int(8000*math.sin(2*math.pi*(220+110*((i//r)%5))*i/r))) for i in range(n)); open(sys.argv[1],"wb").write(b"RIFF"+struct.pack("<I",36+len(d))+b"WAVEfmt "+struct.pack("<IHHIIHH",16,1,1,r,2*r,2,16)+b"data"+struct.pack("<I",len(d))+d)' "$AUDIO"
  fi
fi
tandem_setup "
[[model]]
name = \"asr\"
dir = \"$ASR\"
cpu_threads = 1
gpu_threads = 1
[[model]]
name = \"asr-cpu\"
dir = \"$ASR\"
gpu = false
cpu_threads = 1
[speech]
max_audio_seconds = 7200
"
echo "bench: model $ASR, audio $AUDIO, CPU:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores"
ctl() { "$TANDEMCTL" "$@"; }
g=$(ctl --json transcribe --model asr "$AUDIO")
c=$(ctl --json transcribe --model asr-cpu "$AUDIO")
secs=$(echo "$g" | jq .audio_seconds)
echo "audio: ${secs} s, $(echo "$g" | jq .windows) windows, $(echo "$g" | jq '.segments | length') segments"
echo "real-time factor (audio s per run s): gpu (simulated) $(echo "$g" | jq .realtime_factor), cpu $(echo "$c" | jq .realtime_factor)"
[ "$(echo "$g" | jq -r .text)" = "$(echo "$c" | jq -r .text)" ] && echo "GPU and CPU texts: equal" || echo "GPU and CPU texts: DIFFER"

# The fault run: GetJob every 10 ms; LoseDevice once window K is done; the next window's completion time.
id=$(ctl --json transcribe --model asr --detach "$AUDIO" | jq -r .job_id)
getjob() { busctl --address="$T_ADDR" --json=short call io.tandem.Tandem1 /io/tandem/Tandem1 io.tandem.Tandem1 GetJob t "$id" | jq -c '.data[0] | with_entries(.value = .value.data)'; }
accounted=""
while :; do
  j=$(getjob)
  w=$(echo "$j" | jq .windows_done)
  m=$(ctl --json status | jq -c '.memory | {observed_used, predicted_used, prediction_error, free, total}')
  if [ -z "$accounted" ] || [ "$(echo "$m" | jq .observed_used)" -gt "$(echo "$accounted" | jq .observed_used)" ]; then accounted=$m; fi
  [ "$w" -ge "$K" ] && break
  [ "$(echo "$j" | jq -r .state)" = completed ] && { echo "the file ended before window $K: use a longer AUDIO"; exit 1; }
  sleep 0.01
done
t0=$(date +%s.%N)
btest LoseDevice >/dev/null
while :; do
  j=$(getjob)
  [ "$(echo "$j" | jq .windows_done)" -gt "$w" ] && break
  sleep 0.01
done
t1=$(date +%s.%N)
wait_job "$id" 3000 >/dev/null
j=$(getjob)
echo "fault after window $w: the next window finished on the CPU $(echo "$t1 - $t0" | bc) s after LoseDevice"
echo "  CPU mean window time (the asr-cpu run): $(echo "$c" | jq '(.audio_seconds / .realtime_factor) / .windows')"
echo "  routes $(echo "$j" | jq -c .routes), windows on the CPU $(echo "$j" | jq .windows_on_cpu) of $(echo "$j" | jq .windows_done)"
[ "$(echo "$j" | jq -r .text)" = "$(echo "$c" | jq -r .text)" ] && echo "  resumed text = the CPU replica's" || echo "  resumed text DIFFERS from the CPU replica's"
echo "GPU memory at its peak while the fault run ran on the GPU (accounted = predicted_used, the device's reading = observed_used): $accounted"
