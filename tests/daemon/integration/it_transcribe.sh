#!/usr/bin/env bash
# Transcription through the real daemon, next to the LLM on one simulated GPU: a Whisper-layout model (tandem-mkmodel
# --preset whisper-test: random weights, a Whisper tokenizer, 30-s windows) served as "asr", and the same files as
# "asr-cpu" with no GPU replica.
#   - ListModels shows kind speech; Submit refuses it; Transcribe refuses the LLM and unknown models;
#   - tandemctl transcribe --json on speech espeak-ng spoke (or a tone file without espeak-ng) and on a 70-s file
#     (3 windows): completed, segments in order with times inside the audio, text = the segments' texts, the same
#     text with the audio as bytes (gdbus) as with an fd; --srt numbers cues;
#   - the GPU replica and the CPU replica give the same text;
#   - untrusted input: not audio, a pipe, a truncated WAV, a WAV with no samples, a sample rate of 1 Hz, a file over
#     max_audio_seconds and one over max_audio_bytes, both audio_fd and audio, an unknown option, an unknown
#     language → InvalidArgument naming the input, and the daemon serves on;
#   - a GPU fault mid-file: the job moves to the CPU at a window boundary (routes gpu,cpu), completes, and its text
#     equals the CPU replica's for the same file (nothing repeated, nothing lost);
#   - cancel mid-file → cancelled, keeping the finished windows' text;
#   - a live stream (tandemctl transcribe --raw through a ring session): raw PCM piped in slowly, as a microphone
#     would, gives the text the same samples give as a file; a stream cut short ends "stream_closed".
TANDEMD=$1 TANDEMCTL=$2 MKMODEL=$3
source "$(dirname "$0")/lib.sh"

tandem_asr_model
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
max_audio_seconds = 900
max_audio_bytes = \"24MiB\"
"

# wav FILE SECONDS [RATE] [SEED]: a mono 16-bit WAV of tones and noise whose pitch changes every second.
wav() {
  python3 - "$1" "$2" "${3:-16000}" "${4:-1}" <<'PY'
import math, random, struct, sys
path, secs, rate, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rnd = random.Random(seed)
n = int(secs * rate)
freqs = [rnd.choice([220, 330, 440, 660, 880, 1200]) for _ in range(int(secs) + 1)]
data = bytearray()
for i in range(n):
    t = i / rate
    v = 0.3 * math.sin(2 * math.pi * freqs[int(t)] * t) + 0.05 * (rnd.random() - 0.5)
    data += struct.pack("<h", int(max(-1, min(1, v)) * 32000))
hdr = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
open(path, "wb").write(hdr + b"data" + struct.pack("<I", len(data)) + bytes(data))
PY
}
if command -v espeak-ng >/dev/null 2>&1; then
  # libpulse (espeak-ng opens audio even to write a file) would leave $TMPDIR/pulse-<id> without XDG_RUNTIME_DIR
  PULSE_RUNTIME_PATH="$T_DIR/pulse" espeak-ng -w "$T_DIR/speech.wav" "the quick brown fox jumps over the lazy dog" || fail "espeak-ng"
  note "espeak-ng spoke a sentence"
else
  wav "$T_DIR/speech.wav" 3
  note "no espeak-ng: a tone file stands in for speech"
fi
wav "$T_DIR/short.wav" 1.5 4000 4    # small enough to pass as a GVariant byte array on gdbus's command line
wav "$T_DIR/long.wav" 70 8000 2       # 3 windows of 30 s, at 8 kHz (resampled)
wav "$T_DIR/longer.wav" 600 8000 3    # 20 windows: long enough to act while it runs

# --- the model's kind ----------------------------------------------------------------------------------------------
models=$(bcall ListModels)
kind=$(echo "$models" | jq -r '.data[0][] | select(.name.data == "asr") | .kind.data')
[ "$kind" = speech ] || fail "asr: kind '$kind' (ListModels: ${models:0:600})"
langs=$(echo "$models" | jq -r '.data[0][] | select(.name.data == "asr") | .languages.data | length')
win=$(echo "$models" | jq -r '.data[0][] | select(.name.data == "asr") | .window_ms.data')
[ "$langs" = 99 ] && [ "$win" = 30000 ] || fail "asr: $langs languages, window_ms $win (whisper-test: 99, 30000)"
gtrans() { gcall Transcribe "$1" "@ah []" "$2" "${3:-@a{sv\} {\}}"; }
gaudio() { python3 -c 'import sys; d = open(sys.argv[1], "rb").read(); print("[byte " + ", ".join(map(str, d)) + "]" if d else "@ay []")' "$1"; }
expect_err NotSupported gcall Submit asr "hello" "@a(ss) []" "@a{sv} {}" >/dev/null
expect_err NotSupported gtrans default "$(gaudio "$T_DIR/short.wav")" >/dev/null
expect_err UnknownModel gtrans nope "$(gaudio "$T_DIR/short.wav")" >/dev/null
note "ListModels: asr is a speech model; Submit refuses it, Transcribe refuses the LLM and unknown models"

# --- transcripts -----------------------------------------------------------------------------------------------------
ctl() { "$TANDEMCTL" "$@"; }
check_doc() {  # check_doc JSON AUDIO_SECONDS: completed, segments in order inside the audio, text = their texts
  local doc=$1 secs=$2
  [ "$(echo "$doc" | jq -r .state)" = completed ] || fail "not completed: ${doc:0:400}"
  echo "$doc" | jq -e --argjson s "$secs" '
    (.segments | length) as $n
    | ([.segments[] | .start <= .end and .end <= $s + 0.5] | all)
    and ([range(1; $n) as $i | .segments[$i - 1].start <= .segments[$i].start] | all)' >/dev/null \
    || fail "segments out of order or outside ${secs}s: ${doc:0:600}"
  local joined; joined=$(echo "$doc" | jq -r '[.segments[].text] | join("")')
  local text; text=$(echo "$doc" | jq -r .text)
  [ "$joined" = "$text" ] || fail "text '$text' is not the segments' '$joined'"
}
d1=$(ctl --json transcribe --model asr "$T_DIR/speech.wav") || fail "transcribe speech.wav: $d1"
check_doc "$d1" 4
[ "$(echo "$d1" | jq -r '.routes | join(",")')" = gpu ] || fail "speech.wav: routes $(echo "$d1" | jq -c .routes)"
d2=$(ctl --json transcribe --model asr "$T_DIR/long.wav") || fail "transcribe long.wav: $d2"
check_doc "$d2" 70
[ "$(echo "$d2" | jq -r .windows)" -ge 3 ] || fail "long.wav: windows $(echo "$d2" | jq .windows), expected >= 3"
note "speech.wav: $(echo "$d1" | jq '.segments | length') segments; long.wav (70 s): $(echo "$d2" | jq .windows) windows, $(echo "$d2" | jq '.segments | length') segments, rtf $(echo "$d2" | jq .realtime_factor)"
# The same audio as bytes: the same text.
d3=$(ctl --json transcribe --model asr "$T_DIR/short.wav") || fail "transcribe short.wav: $d3"
check_doc "$d3" 1.5
id=$(gtrans asr "$(gaudio "$T_DIR/short.wav")" | sed -n 's/^(uint64 \([0-9]*\),.*/\1/p')
[ -n "$id" ] || fail "Transcribe with bytes gave no job id"
[ "$(wait_job "$id")" = completed ] || fail "bytes job $id: $(job "$id" | head -c 400)"
[ "$(jget "$id" text)" = "$(echo "$d3" | jq -r .text)" ] || fail "bytes vs fd: '$(jget "$id" text)' vs '$(echo "$d3" | jq -r .text)'"
srt=$(ctl transcribe --model asr --srt "$T_DIR/long.wav") || fail "--srt"
if [ "$(echo "$d2" | jq '[.segments[] | select(.text | test("\\S"))] | length')" -gt 0 ]; then
  echo "$srt" | head -2 | grep -qE '^1$|^[0-9]{2}:[0-9]{2}:[0-9]{2},[0-9]{3} --> ' || fail "--srt: ${srt:0:200}"
fi
note "the same text from bytes as from an fd; --srt cues"
# The GPU replica and the CPU replica agree.
c2=$(ctl --json transcribe --model asr-cpu "$T_DIR/long.wav") || fail "transcribe on asr-cpu: $c2"
[ "$(echo "$c2" | jq -r '.routes | join(",")')" = cpu ] || fail "asr-cpu: routes $(echo "$c2" | jq -c .routes)"
[ "$(echo "$c2" | jq -r .text)" = "$(echo "$d2" | jq -r .text)" ] \
  || fail "GPU and CPU texts differ: '$(echo "$d2" | jq -r .text)' vs '$(echo "$c2" | jq -r .text)'"
note "GPU (simulated) and CPU replicas give the same text"

# running_job_with AFTER JQ: the id of a running job among the next few after job AFTER (jobs get increasing ids and
# nothing else is submitted meanwhile) for which `.data[0].JQ` holds and that has finished a window, waiting up to
# 30 s. (Sweeping every id instead took seconds per sweep on a loaded CI machine: the job ended unseen.)
running_job_with() {
  local id j deadline=$((SECONDS + 30))
  while [ "$SECONDS" -lt "$deadline" ]; do
    for id in $(seq $(($1 + 1)) $(($1 + 4))); do
      j=$(busctl --address="$T_ADDR" --json=short call io.tandem.Tandem1 /io/tandem/Tandem1 io.tandem.Tandem1 GetJob t "$id" 2>/dev/null) || continue
      echo "$j" | jq -e ".data[0].$2 and .data[0].state.data == \"running\" and .data[0].windows_done.data >= 1" >/dev/null && { echo "$id"; return 0; }
    done
    sleep 0.1
  done
  return 1
}

# --- a live stream through a ring session -------------------------------------------------------------------------
wav "$T_DIR/s16k.wav" 70 16000 5
tail -c +45 "$T_DIR/s16k.wav" > "$T_DIR/s16k.raw"   # the samples without the 44-byte header
f16=$(ctl --json transcribe --model asr "$T_DIR/s16k.wav") || fail "transcribe s16k.wav: $f16"
# 1 s of audio every 40 ms: a microphone at 25x real time (the daemon sees a pipe that stays open between chunks).
slow_pipe() { python3 -c '
import sys, time
d = open(sys.argv[1], "rb").read()
for i in range(0, len(d), 32000):
    sys.stdout.buffer.write(d[i:i + 32000]); sys.stdout.buffer.flush(); time.sleep(0.04)' "$1"; }
l16=$(slow_pipe "$T_DIR/s16k.raw" | ctl --json transcribe --model asr --raw 16000 -) || fail "transcribe --raw: $l16"
check_doc "$l16" 70
[ "$(echo "$l16" | jq -r .text)" = "$(echo "$f16" | jq -r .text)" ] \
  || fail "the live stream's text differs from the file's: '$(echo "$l16" | jq -r .text | head -c 300)' vs '$(echo "$f16" | jq -r .text | head -c 300)'"
lid=$(echo "$l16" | jq -r .job_id)
[ "$(jget "$lid" stream)" = true ] && [ "$(jget "$lid" finish_reason)" = end_of_audio ] \
  || fail "stream job $lid: stream $(jget "$lid" stream), finish_reason $(jget "$lid" finish_reason)"
[ "$(jget "$lid" stream_bytes)" = "$(stat -c %s "$T_DIR/s16k.raw")" ] || fail "stream job $lid: stream_bytes $(jget "$lid" stream_bytes)"
# Stereo f32 at 16 kHz of the same samples (both channels equal): the same text again.
python3 -c '
import struct, sys
d = open(sys.argv[1], "rb").read()
xs = struct.unpack("<%dh" % (len(d) // 2), d)
open(sys.argv[2], "wb").write(b"".join(struct.pack("<ff", x / 32768.0, x / 32768.0) for x in xs))' "$T_DIR/s16k.raw" "$T_DIR/s16k.f32"
s2=$(ctl --json transcribe --model asr --raw 16000:2:f32le "$T_DIR/s16k.f32") || fail "transcribe --raw f32le stereo: $s2"
[ "$(echo "$s2" | jq -r .text)" = "$(echo "$f16" | jq -r .text)" ] || fail "f32le stereo text differs from the file's"
note "live stream (--raw, a slow pipe; and f32le stereo): the file's text, finish_reason end_of_audio"
# A producer that goes away mid-stream: the job finishes over what arrived.
( head -c 1600000 "$T_DIR/s16k.raw"; sleep 30 ) | ctl --json transcribe --model asr --raw 16000 - > "$T_DIR/cut.json" &
cut_bg=$!
bg_track $cut_bg
cutid=$(running_job_with "$(echo "$s2" | jq -r .job_id)" 'stream.data == true') || fail "no running stream job with a finished window"
pkill -KILL -P "$cut_bg" -x tandemctl || fail "no tandemctl under $cut_bg"
[ "$(wait_job "$cutid")" = completed ] || fail "cut stream $cutid: $(jget "$cutid" state)"
[ "$(jget "$cutid" finish_reason)" = stream_closed ] || fail "cut stream $cutid: finish_reason $(jget "$cutid" finish_reason)"
note "a stream whose client was killed after 50 s of audio: completed over what arrived (stream_closed)"

# --- untrusted input -----------------------------------------------------------------------------------------------
ctl_refused() {  # ctl_refused NAME TEXT FILE [ARGS...]: tandemctl exits 4 with that D-Bus error naming TEXT
  local want=$1 text=$2 out rc=0; shift 2
  out=$(ctl --json transcribe --model asr "$@" 2>/dev/null) || rc=$?
  [ "$rc" = 4 ] || fail "tandemctl transcribe $*: exit $rc, expected 4 (${out:0:300})"
  [ "$(echo "$out" | jq -r .error.name)" = "io.tandem.Tandem1.Error.$want" ] || fail "tandemctl transcribe $*: $out"
  case "$(echo "$out" | jq -r .error.message)" in *"$text"*) ;; *) fail "tandemctl transcribe $*: no '$text' in $out";; esac
}
printf 'this is not audio at all, just some text' > "$T_DIR/text.wav"
head -c 30000 "$T_DIR/long.wav" > "$T_DIR/truncated.wav"
wav "$T_DIR/empty.wav" 0
python3 - "$T_DIR/long.wav" "$T_DIR/rate1.wav" <<'PY'
import struct, sys
d = bytearray(open(sys.argv[1], "rb").read())
d[24:28] = struct.pack("<I", 1)      # sample rate 1 Hz
d[28:32] = struct.pack("<I", 2)      # byte rate to match
open(sys.argv[2], "wb").write(bytes(d))
PY
wav "$T_DIR/too-long.wav" 901 1000
head -c $((25 * 1024 * 1024)) /dev/zero > "$T_DIR/too-big.wav"
ctl_refused InvalidArgument "audio_fd[0]" "$T_DIR/text.wav"
ctl_refused InvalidArgument "truncated" "$T_DIR/truncated.wav"
ctl_refused InvalidArgument "audio_fd[0]" "$T_DIR/empty.wav"
ctl_refused InvalidArgument "1 Hz" "$T_DIR/rate1.wav"
ctl_refused InvalidArgument "maximum" "$T_DIR/too-long.wav"
ctl_refused InvalidArgument "max_audio_bytes" "$T_DIR/too-big.wav"
ctl_refused InvalidArgument "regular file" <(cat "$T_DIR/speech.wav")
ctl_refused InvalidArgument "language 'xx'" --language xx "$T_DIR/speech.wav"
expect_err InvalidArgument gtrans asr "$(gaudio "$T_DIR/short.wav")" "{'colour': <'red'>}" >/dev/null
expect_err InvalidArgument gtrans asr "@ay []" >/dev/null
expect_err InvalidArgument gcall Transcribe asr "@ah []" "[byte 1, 2, 3]" "@a{sv} {}" >/dev/null
daemon_alive || fail "the daemon died on bad input"
ctl --json transcribe --model asr "$T_DIR/speech.wav" >/dev/null || fail "Transcribe after bad input"
note "bad input (not audio, truncated, no samples, 1 Hz, too long, too big, a pipe, unknown language/option, no audio, 3 bytes) → InvalidArgument; serving on"

# --- a GPU fault mid-file ------------------------------------------------------------------------------------------
ref=$(ctl --json transcribe --model asr-cpu "$T_DIR/longer.wav") || fail "asr-cpu longer.wav: $ref"
out="$T_DIR/fault.json"
ctl --json transcribe --model asr "$T_DIR/longer.wav" > "$out" &
bg=$!
bg_track $bg
# The job id: the running transcription job; wait until it has finished a window on the GPU.
fid=$(running_job_with "$(echo "$ref" | jq -r .job_id)" 'kind.data == "transcribe"') || fail "no running transcription job with a finished window"
btest LoseDevice >/dev/null
wait "$bg" || fail "the fault job's tandemctl exited $? ($(cat "$out" | head -c 400))"
doc=$(cat "$out")
check_doc "$doc" 600
[ "$(echo "$doc" | jq -r '.routes | join(",")')" = "gpu,cpu" ] || fail "fault job: routes $(echo "$doc" | jq -c .routes)"
[ "$(echo "$doc" | jq -r .degraded)" = true ] || fail "fault job: not degraded"
on_cpu=$(echo "$doc" | jq .windows_on_cpu)
total=$(echo "$doc" | jq .windows)
[ "$on_cpu" -ge 1 ] && [ "$on_cpu" -lt "$total" ] || fail "fault job: $on_cpu of $total windows on the CPU"
[ "$(echo "$doc" | jq -r .text)" = "$(echo "$ref" | jq -r .text)" ] \
  || fail "the resumed text differs from the CPU replica's: '$(echo "$doc" | jq -r .text | head -c 300)' vs '$(echo "$ref" | jq -r .text | head -c 300)'"
hist=$(jget "$fid" history)
echo "$hist" | grep -q migrating || fail "fault job $fid: no migrating in $hist"
note "GPU lost at window $((total - on_cpu)) of $total: migrated to the CPU at the window boundary; text = the CPU replica's"
btest RecoverDevice >/dev/null
wait_for 20 "breaker closed after RecoverDevice" prop_is GpuBreaker closed
back=""
for _ in $(seq 1 100); do
  back=$(ctl --json transcribe --model asr "$T_DIR/short.wav" | jq -r '.routes | join(",")')
  [ "$back" = gpu ] && break
  sleep 0.1
done
[ "$back" = gpu ] || fail "after RecoverDevice, transcription still runs on '$back'"
note "RecoverDevice: the breaker closes and transcription is back on the GPU"

# --- cancel mid-file -------------------------------------------------------------------------------------------------
cid=$(ctl --json transcribe --model asr-cpu --detach "$T_DIR/longer.wav" | jq -r .job_id)
wait_for 30 "a window of job $cid" bash -c "busctl --address='$T_ADDR' --json=short call io.tandem.Tandem1 /io/tandem/Tandem1 io.tandem.Tandem1 GetJob t $cid | jq -e '.data[0].windows_done.data >= 1'"
ctl cancel "$cid" >/dev/null || fail "cancel $cid"
[ "$(wait_job "$cid")" = cancelled ] || fail "job $cid: $(jget "$cid" state)"
done_w=$(jget "$cid" windows_done)
[ "$done_w" -ge 1 ] && [ "$done_w" -lt 20 ] || fail "cancelled job: windows_done $done_w"
note "cancel mid-file: cancelled after $done_w of 20 windows, their text kept"
echo "PASS"
