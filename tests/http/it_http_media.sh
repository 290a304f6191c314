#!/usr/bin/env bash
# Media through tandem-http against the real tandemd (a Whisper-layout model and a CLIP model next to the LLM on one
# simulated GPU), driven by curl, the official `openai` and `ollama` npm clients and a small Wyoming client:
#   - embeddings (OpenAI float and base64, Ollama /api/embed, a CLIP image as a data URL) equal D-Bus Embed's vectors;
#     a BERT-family text encoder (nomic-test) through the same endpoints and clients, with OpenAI's dimensions
#     (Matryoshka: the first N values, normalised again);
#   - espeak-ng speech uploaded as multipart gives the same text as D-Bus Transcribe (tandemctl transcribe) on the
#     same file, in each response_format (json, text, srt, vtt, verbose_json), streamed as transcript.text.delta /
#     done events; malformed uploads get typed errors;
#   - Wyoming (Home Assistant): the same speech in 20-ms chunks gives the same text; bad input -> error + close.
# Args: TANDEMD TANDEMCTL MKMODEL TANDEM_HTTP
TANDEMD=$1 TANDEMCTL=$2 MKMODEL=$3 TANDEM_HTTP=$4
source "$(dirname "$0")/../daemon/integration/lib.sh"
NODE_DIR="$(cd "$(dirname "$0")/node" && pwd)"

tandem_asr_model
tandem_clip_model
"$MKMODEL" --out "$T_DIR/nomic" --preset nomic-test >/dev/null
tandem_setup "
[[model]]
name = \"clip\"
dir = \"$CLIP\"
cpu_threads = 1
gpu_threads = 1

[[model]]
name = \"nomic\"
dir = \"$T_DIR/nomic\"
cpu_threads = 1
gpu_threads = 1

[[model]]
name = \"asr\"
dir = \"$ASR\"
cpu_threads = 1
gpu_threads = 1
"
T_FAST_STOP=1
PORT=$(( 20000 + RANDOM % 20000 ))
WPORT=$(( PORT + 1 ))
H_LOG="$T_DIR/http.log"
"$TANDEM_HTTP" --listen "127.0.0.1:$PORT" --wyoming "127.0.0.1:$WPORT" --bus "address=$T_ADDR" >>"$H_LOG" 2>&1 &
H_PID=$!
bg_track "$H_PID"
B="http://127.0.0.1:$PORT"
wait_for 20 "tandem-http healthy" sh -c "curl -sf $B/health >/dev/null"
hfail() { echo "--- tandem-http log ---" >&2; tail -20 "$H_LOG" >&2; fail "$@"; }

# --- embeddings: the gateway's vectors are D-Bus Embed's -----------------------------------------------------------
ref_e=$("$TANDEMCTL" embed --json --model clip "a red square" "a blue circle") || fail "tandemctl embed: $ref_e"
same_vectors() {  # same_vectors JSON_A JSON_B: two arrays of vectors equal within 1e-6
  jq -e -n --argjson a "$1" --argjson b "$2" \
    '($a | length) == ($b | length) and ([range(0; $a | length) as $i | ($a[$i] | length) == ($b[$i] | length) and
      ([range(0; $a[$i] | length) as $k | (($a[$i][$k] - $b[$i][$k]) | fabs) < 1e-6] | all)] | all)' >/dev/null
}
ref_vecs=$(jq -c '.vectors // [.embeddings[]?] // []' <<<"$ref_e")
[ "$(jq length <<<"$ref_vecs")" = 2 ] || fail "tandemctl embed --json: no vectors in $ref_e"
f=$(curl -s -D "$T_DIR/eh.txt" "$B/v1/embeddings" -d '{"model":"clip","input":["a red square","a blue circle"],"encoding_format":"float"}')
same_vectors "$(jq -c '[.data[].embedding]' <<<"$f")" "$ref_vecs" || hfail "float embeddings != D-Bus Embed: $f"
grep -qi '^Tandem-Route: gpu' "$T_DIR/eh.txt" || hfail "embeddings: no Tandem-Route"
o=$(curl -s "$B/api/embed" -d '{"model":"clip","input":["a red square","a blue circle"]}')
same_vectors "$(jq -c .embeddings <<<"$o")" "$ref_vecs" || hfail "/api/embed != D-Bus Embed: $o"
# Token arrays: the clip-test vocabulary has one token per single-letter word ("a</w>"), so "a b c" is three ids.
ids=$(jq -c '[."a</w>", ."b</w>", ."c</w>"]' "$CLIP/vocab.json")
jq -e 'all(type == "number")' <<<"$ids" >/dev/null || fail "the clip-test vocabulary lacks a single-letter word: $ids"
ref_t=$("$TANDEMCTL" embed --json --model clip "a b c" "a red square") || fail "tandemctl embed: $ref_t"
t=$(curl -s "$B/v1/embeddings" -d "{\"model\":\"clip\",\"input\":[$ids,\"a red square\"]}")
same_vectors "$(jq -c '[.data[].embedding]' <<<"$t")" "$(jq -c '.vectors // [.embeddings[]?]' <<<"$ref_t")" ||
  hfail "a token array's vector != its text's ($ids for 'a b c'): $t"
# BOS + 3 ids + EOS, and the text (BOS + at least one token + EOS): the count tandemd read, as usage.
[ "$(jq .usage.prompt_tokens <<<"$t")" = "$(jq .tandem.text_tokens <<<"$t")" ] && [ "$(jq .usage.prompt_tokens <<<"$t")" -ge 8 ] ||
  hfail "usage.prompt_tokens: $(jq -c '{usage, text_tokens: .tandem.text_tokens}' <<<"$t")"
bos=$(jq '."<|startoftext|>"' "$CLIP/vocab.json")
bad=$(curl -s -w '\n%{http_code}' "$B/v1/embeddings" -d "{\"model\":\"clip\",\"input\":[[5],[$bos]]}")
[ "$(tail -1 <<<"$bad")" = 400 ] && head -1 <<<"$bad" | jq -e '.error.param == "input[1]" and (.error.message | test("^input\\[1\\]: .*BOS"))' >/dev/null ||
  hfail "the BOS id in a token array: $bad"
bad=$(curl -s -w '\n%{http_code}' "$B/v1/embeddings" -d '{"model":"clip","input":[[5, 100000]]}')
[ "$(tail -1 <<<"$bad")" = 400 ] && head -1 <<<"$bad" | jq -e '.error.message | test("100000")' >/dev/null ||
  hfail "an id outside the vocabulary: $bad"
# The embedding job's GetJob view: every key modelled by the client (no _unparsed), its token count as the reply's.
ej=$(jq .tandem.job <<<"$t")
jv=$("$TANDEMCTL" --json job "$ej") || fail "tandemctl --json job $ej: $jv"
jq -e --argjson n "$(jq .tandem.text_tokens <<<"$t")" '([.. | objects | has("_unparsed")] | any | not) and .kind == "embed" and
  .text_tokens == $n and .inputs == 2 and .texts == 2' <<<"$jv" >/dev/null || fail "tandemctl --json job $ej (embed): $jv"
note "token arrays: $ids embeds as 'a b c' does; usage.prompt_tokens $(jq .usage.prompt_tokens <<<"$t"); BOS / unknown ids: 400"
if command -v node >/dev/null; then
  [ -d "$NODE_DIR/node_modules/openai" ] || (cd "$NODE_DIR" && npm ci --no-audit --no-fund >/dev/null 2>&1) || fail "npm ci failed"
  r=$(node "$NODE_DIR/clients.mjs" "$B" openai_embed clip) || hfail "openai embeddings: $r"
  same_vectors "$(jq -c .vectors <<<"$r")" "$ref_vecs" || hfail "openai client (base64, its default) != D-Bus Embed: $r"
  r=$(node "$NODE_DIR/clients.mjs" "$B" openai_embed_tokens clip "[$ids]") || hfail "openai embeddings of tokens: $r"
  same_vectors "$(jq -c .vectors <<<"$r")" "$(jq -c '.vectors // [.embeddings[]?] | .[:1]' <<<"$ref_t")" ||
    hfail "openai client, token array != its text: $r"
  r=$(node "$NODE_DIR/clients.mjs" "$B" ollama_embed clip) || hfail "ollama embed: $r"
  same_vectors "$(jq -c .vectors <<<"$r")" "$ref_vecs" || hfail "ollama client != D-Bus Embed: $r"
fi
# An image as a data URL (CLIP's image tower): the vector D-Bus Embed gives for the same PNG file.
/usr/bin/python3 - "$T_DIR/red.png" <<'PY'
import struct, sys, zlib
w = h = 32
raw = b"".join(b"\x00" + bytes([200, 30, 30]) * w for _ in range(h))
def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
open(sys.argv[1], "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
                             chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
PY
ref_i=$("$TANDEMCTL" embed --json --model clip --image "$T_DIR/red.png") || fail "tandemctl embed --image: $ref_i"
url="data:image/png;base64,$(base64 -w0 "$T_DIR/red.png")"
i=$(curl -s "$B/v1/embeddings" -d "{\"model\":\"clip\",\"input\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"$url\"}}]}")
same_vectors "$(jq -c '[.data[].embedding]' <<<"$i")" "$(jq -c '.vectors // [.embeddings[]?]' <<<"$ref_i")" || hfail "image embedding != D-Bus Embed: $i"
note "embeddings: OpenAI float, base64 (openai client), /api/embed (ollama client), a PNG data URL: D-Bus Embed's vectors"

# A text encoder (NomicBertModel) behind the same endpoints: D-Bus Embed's vectors; dimensions=16 gives the first 16
# values of each, normalised again (Matryoshka truncation).
ref_n=$("$TANDEMCTL" embed --json --model nomic "search_query: a red square" "search_document: a blue circle") ||
  fail "tandemctl embed nomic: $ref_n"
ref_nv=$(jq -c '.vectors' <<<"$ref_n")
f=$(curl -s "$B/v1/embeddings" -d '{"model":"nomic","input":["search_query: a red square","search_document: a blue circle"],"encoding_format":"float"}')
same_vectors "$(jq -c '[.data[].embedding]' <<<"$f")" "$ref_nv" || hfail "nomic: float embeddings != D-Bus Embed: $f"
o=$(curl -s "$B/api/embed" -d '{"model":"nomic","input":["search_query: a red square","search_document: a blue circle"]}')
same_vectors "$(jq -c .embeddings <<<"$o")" "$ref_nv" || hfail "nomic: /api/embed != D-Bus Embed: $o"
d=$(curl -s "$B/v1/embeddings" -d '{"model":"nomic","input":["search_query: a red square","search_document: a blue circle"],"encoding_format":"float","dimensions":16}')
want16=$(jq -c '[.[] | .[:16] | (map(. * .) | add | sqrt) as $n | map(. / $n)]' <<<"$ref_nv")
same_vectors "$(jq -c '[.data[].embedding]' <<<"$d")" "$want16" || hfail "nomic: dimensions=16 is not the normalised first 16 values: $d"
if command -v node >/dev/null; then
  r=$(node "$NODE_DIR/clients.mjs" "$B" ollama_embed nomic) || hfail "ollama embed nomic: $r"
  ref_o=$("$TANDEMCTL" embed --json --model nomic "a red square" "a blue circle") || fail "tandemctl embed nomic: $ref_o"
  same_vectors "$(jq -c .vectors <<<"$r")" "$(jq -c .vectors <<<"$ref_o")" || hfail "ollama client (nomic) != D-Bus Embed: $r"
  r=$(node "$NODE_DIR/clients.mjs" "$B" openai_embed nomic) || hfail "openai embeddings nomic: $r"
  same_vectors "$(jq -c .vectors <<<"$r")" "$(jq -c .vectors <<<"$ref_o")" || hfail "openai client (nomic) != D-Bus Embed: $r"
fi
note "a text encoder (nomic-test): /v1/embeddings, /api/embed, the openai and ollama clients give D-Bus Embed's vectors; dimensions=16 truncates and normalises"

if command -v espeak-ng >/dev/null; then
  # libpulse (espeak-ng opens audio even to write a file) would leave $TMPDIR/pulse-<id> without XDG_RUNTIME_DIR
  PULSE_RUNTIME_PATH="$T_DIR/pulse" espeak-ng -w "$T_DIR/speech.wav" "the quick brown fox jumps over the lazy dog" || fail "espeak-ng"
else
  echo "SKIP: espeak-ng is not installed (scripts/setup.sh installs it)"
  exit 77
fi
# The test model has random weights: Whisper's rules make it say nothing at temperature 0, so both paths sample at
# 1.0 with seed 3 and no temperature fallback (Tandem's multipart extensions tandem.seed, tandem.temperature_fallback):
# the same request must give the same text, and that text is not empty.
ref=$("$TANDEMCTL" --json transcribe --model asr --temperature 1.0 --seed 3 --no-fallback "$T_DIR/speech.wav") || fail "tandemctl transcribe: $ref"
ref_text=$(jq -j .text <<<"$ref")
[ -n "$(tr -d ' ' <<<"$ref_text")" ] || fail "the reference transcript is empty: nothing to compare ($ref)"
note "D-Bus Transcribe: $(jq '.segments | length' <<<"$ref") segments, text '${ref_text:0:60}'"

up() { curl -s -D "$T_DIR/h.txt" "$B/v1/audio/transcriptions" -F "file=@$T_DIR/speech.wav" -F model=asr -F temperature=1.0 -F tandem.seed=3 -F tandem.temperature_fallback=false "$@"; }
j=$(up -F response_format=json)
[ "$(jq -j .text <<<"$j")" = "$ref_text" ] || hfail "json text != D-Bus Transcribe's: $j"
grep -qi '^Tandem-Job: [0-9]' "$T_DIR/h.txt" || hfail "no Tandem-Job header"
jq -e '.tandem.route == "gpu"' <<<"$j" >/dev/null || hfail "no tandem member: $j"
t=$(up -F response_format=text)
[ "$t" = "$ref_text" ] || hfail "text format: '$t' != '$ref_text'"
v=$(up -F response_format=verbose_json -F 'timestamp_granularities[]=segment')
[ "$(jq -j '[.segments[].text] | join("")' <<<"$v")" = "$ref_text" ] || hfail "verbose_json segments != text: $v"
jq -e '.task == "transcribe" and (.duration > 2) and (.language | length > 0)' <<<"$v" >/dev/null || hfail "verbose_json: $v"
n=$(jq '.segments | length' <<<"$v")
srt=$(up -F response_format=srt)
vtt=$(up -F response_format=vtt)
head -1 <<<"$vtt" | grep -q '^WEBVTT' || hfail "vtt: $vtt"
grep -qE '^[0-9]{2}:[0-9]{2}:[0-9]{2},[0-9]{3} --> ' <<<"$srt" || hfail "srt has no cue: $srt"
grep -qE '^[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3} --> ' <<<"$vtt" || hfail "vtt has no cue: $vtt"
[ "$(grep -c ' --> ' <<<"$srt")" -le "$n" ] || hfail "srt has more cues than segments"
note "json, text, verbose_json ($n segments), srt, vtt: the D-Bus text"
# A retried upload with the same Idempotency-Key: the same job, answered from its stored outcome.
k1=$(up -H 'Idempotency-Key: audio-1' | jq -r .tandem.job)
k2=$(up -m 30 -H 'Idempotency-Key: audio-1' | jq -r .tandem.job)
[ -n "$k1" ] && [ "$k1" = "$k2" ] || hfail "the same Idempotency-Key gave transcription jobs '$k1' and '$k2'"
# The job views model every key tandemd sends for a transcription (GET /tandem/v1/jobs and tandemctl --json).
curl -s "$B/tandem/v1/jobs/$k1" | jq -e 'has("_unparsed") | not' >/dev/null || hfail "GET /tandem/v1/jobs/$k1 has _unparsed keys"
"$TANDEMCTL" --json job "$k1" | jq -e '[.. | objects | has("_unparsed")] | any | not' >/dev/null || hfail "tandemctl --json job $k1 has _unparsed keys"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$B/api/show" -d '{"model":"asr"}')" = 200 ] || hfail "/api/show does not know the speech model"
note "Idempotency-Key: one transcription job ($k1); its views have no _unparsed keys; /api/show knows asr"
# Streamed: a delta per segment, then done with the whole text.
up -N -F stream=true >"$T_DIR/s.txt"
grep '^data: ' "$T_DIR/s.txt" | sed 's/^data: //' >"$T_DIR/s.json"
[ "$(jq -j 'select(.type == "transcript.text.delta") | .delta' "$T_DIR/s.json")" = "$ref_text" ] || hfail "the deltas are not the text: $(cat "$T_DIR/s.txt")"
[ "$(jq -j 'select(.type == "transcript.text.done") | .text' "$T_DIR/s.json")" = "$ref_text" ] || hfail "done is not the text"
note "stream: $(jq -s 'map(select(.type == "transcript.text.delta")) | length' "$T_DIR/s.json") deltas + done"

# The official client.
if command -v node >/dev/null; then
  [ -d "$NODE_DIR/node_modules/openai" ] || (cd "$NODE_DIR" && npm ci --no-audit --no-fund >/dev/null 2>&1) || hfail "npm ci failed"
  r=$(node "$NODE_DIR/clients.mjs" "$B" openai_transcribe asr "$T_DIR/speech.wav") || hfail "openai transcriptions: $r"
  [ "$(jq -j .text <<<"$r")" = "$ref_text" ] || hfail "openai client text != D-Bus: $r"
  note "openai audio.transcriptions.create: the D-Bus text"
fi

# Bad uploads: typed errors, nothing disturbed.
code() { curl -s -o "$T_DIR/err.json" -w '%{http_code}' "$@"; }
[ "$(code "$B/v1/audio/transcriptions" -F model=asr)" = 400 ] || hfail "no file is not 400"
jq -e '.error.param == "file"' "$T_DIR/err.json" >/dev/null || hfail "no file: $(cat "$T_DIR/err.json")"
[ "$(code "$B/v1/audio/transcriptions" -F "file=@$T_DIR/speech.wav" -F model=nope)" = 404 ] || hfail "unknown model is not 404"
[ "$(code "$B/v1/audio/transcriptions" -F "file=@$T_DIR/speech.wav" -F model=default)" = 400 ] || hfail "the LLM as a speech model is not 400"
[ "$(code "$B/v1/audio/transcriptions" -F "file=@$T_DIR/speech.wav" -F model=asr -F response_format=xml)" = 400 ] || hfail "a bad response_format is not 400"
[ "$(code "$B/v1/audio/transcriptions" -F "file=@$T_DIR/speech.wav" -F model=asr -F 'timestamp_granularities[]=word')" = 400 ] || hfail "word timestamps are not refused"
head -c 20000 /dev/urandom >"$T_DIR/noise.bin"
[ "$(code "$B/v1/audio/transcriptions" -F "file=@$T_DIR/noise.bin" -F model=asr)" = 400 ] || hfail "a file that is not audio is not 400: $(cat "$T_DIR/err.json")"
# A truncated multipart body.
printf -- '--XyZ\r\nContent-Disposition: form-data; name="model"\r\n\r\nasr\r\n--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF' >"$T_DIR/trunc.bin"
[ "$(code "$B/v1/audio/transcriptions" -H 'Content-Type: multipart/form-data; boundary=XyZ' --data-binary @"$T_DIR/trunc.bin")" = 400 ] ||
  hfail "a truncated multipart body is not 400"
grep -q 'truncated' "$T_DIR/err.json" || hfail "the truncated upload's error does not say so: $(cat "$T_DIR/err.json")"
[ "$(jq -j .text <<<"$(up)")" = "$ref_text" ] || hfail "transcription after bad uploads differs"
note "bad uploads: 400 (no file, not audio, format, word timestamps, truncated multipart), 404; still serving"

# --- Wyoming (Home Assistant's speech-to-text): the same speech in 20-ms chunks gives Transcribe's text -------------
WY="/usr/bin/python3 $(dirname "$0")/wyoming_client.py 127.0.0.1 $WPORT"
d=$($WY describe) || hfail "wyoming describe: $d"
jq -e '.events[0].type == "info" and (.events[0].data.asr[0].models | map(.name) | index("asr") != null)' <<<"$d" >/dev/null ||
  hfail "wyoming info does not list asr: $d"
ctx='{"tandem":{"temperature":1.0,"seed":3,"temperature_fallback":false}}'
w=$($WY transcribe "$T_DIR/speech.wav" --model asr --chunk-ms 20 --context "$ctx") || hfail "wyoming transcribe: $w"
want=$(sed 's/^ *//' <<<"$ref_text")
[ "$(jq -j .text <<<"$w")" = "$want" ] || hfail "Wyoming's transcript '$(jq -j .text <<<"$w")' != Transcribe's '$want': $w"
[ "$(jq -j '.chunks | join("")' <<<"$w")" = "$ref_text" ] || hfail "the transcript-chunks are not the segments: $w"
note "wyoming: describe lists asr; $(jq '.chunks | length' <<<"$w") transcript-chunk(s) + transcript = Transcribe's text"
# Bad input: an error event and a closed connection, nothing else disturbed.
hexof() { /usr/bin/python3 -c 'import sys; print(sys.stdin.buffer.read().hex())'; }
wybad() {  # wybad HEX|- WHAT (- : the bytes on stdin)
  local r; r=$($WY raw "$1") || hfail "wyoming raw ($2): $r"
  jq -e '.closed and (.events | length) >= 1 and .events[-1].type == "error"' <<<"$r" >/dev/null || hfail "wyoming $2: no error event: $r"
}
wybad "$(printf '%s' '{"type":"audio-chunk","data":{"rate":16000,"width":2,"channels":1},"payload_length":2}' | hexof)0a0000" "audio before audio-start"
wybad "$(printf '%s' '{"type":"audio-chunk","payload_length":99999999}' | hexof)0a" "payload over the limit"
head -c 70000 /dev/zero | tr '\0' 'a' | wybad - "a header line without a newline"
wybad "$(printf 'not json\n' | hexof)" "a header that is not JSON"
wybad "$(printf '%s\n%s' '{"type":"audio-start","data":{"rate":16000,"width":1,"channels":1}}' '' | hexof)" "8-bit audio"
w2=$($WY transcribe "$T_DIR/speech.wav" --model asr --context "$ctx") || hfail "wyoming after bad input: $w2"
[ "$(jq -j .text <<<"$w2")" = "$want" ] || hfail "Wyoming after bad input differs: $w2"
note "wyoming bad input: audio before audio-start, payload over the limit, an endless header line, not JSON, 8-bit audio -> error + close; still serving"
echo PASS
