#!/usr/bin/env bash
# tandem-http against the real tandemd on a private bus (docs/http.md), driven by clients nobody on this team wrote:
# curl, and the official `openai` (6.x) and `ollama` npm packages from tests/http/node's lockfile. Covers models,
# chat and completions (plain and streamed, with usage), Tandem's headers and "tandem" object, a degraded (CPU)
# answer after a simulated GPU loss, abort mid-stream -> the job ends cancelled in GetJob, queue full -> 503 with
# Retry-After, Idempotency-Key -> one job, tandemd restarted mid-stream -> a resumable error event naming the job,
# bad input -> typed errors with nothing lost in tandemd, and /health + /metrics.
# Args: TANDEMD TANDEMCTL MKMODEL TANDEM_HTTP
TANDEMD=$1 TANDEMCTL=$2 MKMODEL=$3 TANDEM_HTTP=$4
source "$(dirname "$0")/../daemon/integration/lib.sh"
NODE_DIR="$(cd "$(dirname "$0")/node" && pwd)"

# A CPU queue of one running and one waiting job, so "queue full" is reachable once the GPU is lost.
tandem_setup "$(printf '[cpu_queue]\ncapacity = 1\nconcurrency = 1\n')"
T_FAST_STOP=1

# --- tandem-http on a free loopback port ----------------------------------------------------------------------------
PORT=$(( 20000 + RANDOM % 20000 ))
H_LOG="$T_DIR/http.log"
"$TANDEM_HTTP" --listen "127.0.0.1:$PORT" --bus "address=$T_ADDR" >>"$H_LOG" 2>&1 &
H_PID=$!
bg_track "$H_PID"
B="http://127.0.0.1:$PORT"
wait_for 20 "tandem-http healthy" sh -c "curl -sf $B/health >/dev/null"
note "tandem-http on $B (pid $H_PID)"
hfail() { echo "--- tandem-http log ---" >&2; tail -20 "$H_LOG" >&2; fail "$@"; }

# --- curl: models, chat, headers -----------------------------------------------------------------------------------
curl -sf "$B/v1/models" | jq -e '.object == "list" and (.data | map(.id) | index("default") != null)' >/dev/null ||
  hfail "/v1/models does not list the model: $(curl -s "$B/v1/models")"
hdr="$T_DIR/h.txt"
body=$(curl -s -D "$hdr" "$B/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"default","messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":12,"seed":5}')
job=$(tr -d '\r' <"$hdr" | sed -n 's/^Tandem-Job: //Ip')
[ -n "$job" ] || hfail "no Tandem-Job header: $(cat "$hdr")"
grep -qi '^Tandem-Route: gpu' "$hdr" || hfail "Tandem-Route is not gpu: $(cat "$hdr")"
grep -qi '^Tandem-ETA-Ms: ' "$hdr" || hfail "no Tandem-ETA-Ms header"
text=$(jq -r '.choices[0].message.content' <<<"$body")
[ "$(jq -r .tandem.job <<<"$body")" = "$job" ] || hfail "the tandem object does not name job $job: $body"
[ "$(job "$job" | jq -j .text)" = "$text" ] || hfail "the reply's text is not GetJob($job).text: $body vs $(job "$job" | jq -c .text)"
[ "$(jq -r .usage.completion_tokens <<<"$body")" = 12 ] || hfail "usage.completion_tokens != 12: $body"
jq -e '.usage.prompt_tokens > 0' <<<"$body" >/dev/null || hfail "usage.prompt_tokens missing: $body"
note "curl chat: job $job, $(jq -c .usage <<<"$body")"

# The client views the gateway relies on model every key tandemd sends: no "_unparsed" anywhere.
for cmd in status "models --details" "job $job" "run --max-tokens 2 Hi"; do
  out=$("$TANDEMCTL" --json $cmd 2>/dev/null) || hfail "tandemctl --json $cmd failed"
  unparsed=$(jq -c '[.. | objects | select(has("_unparsed")) | ._unparsed] | add // {}' <<<"$out" | jq -s -c 'add')
  [ "$unparsed" = "{}" ] || [ "$unparsed" = "null" ] || hfail "tandemctl --json $cmd: keys tandemd sends that the client does not model: $unparsed"
done
note "tandemctl --json status / models --details / job / run: no _unparsed keys"

# Stream: SSE with the placement as a comment line first, then data chunks, then [DONE].
curl -sN "$B/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"default","messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":20,"stream":true,"stream_options":{"include_usage":true}}' \
  >"$T_DIR/sse.txt"
head -1 "$T_DIR/sse.txt" | sed -n 's/^: tandem //p' | jq -e '.event == "placement" and .route == "gpu"' >/dev/null || hfail "the stream does not start with the placement comment: $(head -3 "$T_DIR/sse.txt")"
tail -2 "$T_DIR/sse.txt" | grep -q '^data: \[DONE\]' || hfail "the stream does not end with [DONE]"
grep '^data: {' "$T_DIR/sse.txt" | sed 's/^data: //' | jq -s -e 'map(select(.usage != null)) | length == 1' >/dev/null ||
  hfail "no usage chunk in the stream"
note "curl stream: $(grep -c '^data: {' "$T_DIR/sse.txt") data events"

# --- the official clients ---------------------------------------------------------------------------------------------
if ! command -v node >/dev/null; then
  echo "SKIP-PART: node is not installed: the official npm clients were not run"
else
  if [ ! -d "$NODE_DIR/node_modules/openai" ]; then
    (cd "$NODE_DIR" && npm ci --no-audit --no-fund >/dev/null 2>&1) || hfail "npm ci in tests/http/node failed"
  fi
  nj() { node "$NODE_DIR/clients.mjs" "$B" "$1" default; }
  r=$(nj openai_models); jq -e '.ids | index("default") != null' <<<"$r" >/dev/null || hfail "openai models.list: $r"
  r=$(nj openai_chat); id=$(jq -r .job <<<"$r")
  [ "$(job "$id" | jq -j .text)" = "$(jq -j .text <<<"$r")" ] || hfail "openai chat text != GetJob($id): $r"
  jq -e '.tandem.route == "gpu" and .usage.total_tokens > 0' <<<"$r" >/dev/null || hfail "openai chat: $r"
  r=$(nj openai_chat_stream); id=$(jq -r .job <<<"$r")
  [ "$(job "$id" | jq -j .text)" = "$(jq -j .text <<<"$r")" ] || hfail "openai stream text != GetJob($id): $r"
  jq -e '.usage.completion_tokens == 24 and .chunks > 0' <<<"$r" >/dev/null || hfail "openai stream usage: $r"
  r=$(nj openai_completion); jq -e '.text | length > 0' <<<"$r" >/dev/null || hfail "openai completions: $r"
  r=$(nj openai_unsupported); jq -e '.status == 400 and .param == "n" and .code == "unsupported_parameter"' <<<"$r" >/dev/null ||
    hfail "n=2 is not refused as unsupported: $r"
  r=$(nj openai_unknown_model); jq -e '.status == 404 and .code == "model_not_found"' <<<"$r" >/dev/null || hfail "unknown model: $r"
  r=$(nj openai_abort) || hfail "openai abort: $r"; id=$(jq -r .job <<<"$r")
  st=$(wait_job "$id" 100) || true
  [ "$st" = cancelled ] || hfail "the aborted stream's job $id is $st, not cancelled"
  note "openai client: models, chat, stream+usage, completions, 400/404, abort -> job $id cancelled"
  r=$(nj ollama_version); jq -e '.version | length > 0' <<<"$r" >/dev/null || hfail "ollama version: $r"
  r=$(nj ollama_tags); jq -e '.names | index("default") != null' <<<"$r" >/dev/null || hfail "ollama list: $r"
  r=$(nj ollama_ps); jq -e '.models[0].size_vram > 0' <<<"$r" >/dev/null || hfail "ollama ps: no GPU bytes: $r"
  r=$(nj ollama_show); jq -e '.capabilities == ["completion"]' <<<"$r" >/dev/null || hfail "ollama show: $r"
  r=$(nj ollama_chat); id=$(jq -r .job <<<"$r")
  jq -e '.eval_duration > 0' <<<"$r" >/dev/null || hfail "a plain Ollama chat has no measured eval_duration: $r"
  [ "$(job "$id" | jq -j .text)" = "$(jq -j .text <<<"$r")" ] || hfail "ollama chat text != GetJob($id): $r"
  r=$(nj ollama_chat_stream); id=$(jq -r .job <<<"$r")
  [ "$(job "$id" | jq -j .text)" = "$(jq -j .text <<<"$r")" ] || hfail "ollama stream text != GetJob($id): $r"
  jq -e '.done == true and .eval_count == 24' <<<"$r" >/dev/null || hfail "ollama stream: $r"
  r=$(nj ollama_generate); jq -e '.done == true and (.text | length > 0)' <<<"$r" >/dev/null || hfail "ollama generate: $r"
  note "ollama client: version, list, ps (size_vram), show, chat, stream, generate"
fi

# --- Idempotency-Key: a retried POST attaches to the same job -------------------------------------------------------------
req='{"model":"default","messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"seed":1}'
a=$(curl -s "$B/v1/chat/completions" -H 'Idempotency-Key: it-http-1' -d "$req" | jq -r .tandem.job)
b=$(curl -s "$B/v1/chat/completions" -H 'Idempotency-Key: it-http-1' -d "$req" | jq -r .tandem.job)
[ -n "$a" ] && [ "$a" = "$b" ] || hfail "the same Idempotency-Key gave jobs $a and $b"
note "Idempotency-Key: both requests answered by job $a"

# --- bad input: typed errors, the gateway stays up ----------------------------------------------------------------------
code() { curl -s -o "$T_DIR/err.json" -w '%{http_code}' "$@"; }
[ "$(code "$B/v1/chat/completions" -d '{"model":')" = 400 ] || hfail "malformed JSON is not 400"
jq -e '.error.type == "invalid_request_error"' "$T_DIR/err.json" >/dev/null || hfail "malformed JSON: not OpenAI's error shape"
[ "$(code "$B/v1/chat/completions" -d '{"model":"default","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}')" = 400 ] ||
  hfail "tools is not refused"
jq -e '.error.param == "tools"' "$T_DIR/err.json" >/dev/null || hfail "the tools refusal does not name the field"
[ "$(code "$B/v1/chat/completions" -d '{"model":"default","messages":[{"role":"user","content":"x"}],"max_tokens":"many"}')" = 400 ] ||
  hfail "a wrong type is not 400"
printf '{"model":"default","prompt":"\xff\xfe"}' >"$T_DIR/bad.json"
[ "$(code "$B/v1/completions" --data-binary @"$T_DIR/bad.json")" = 400 ] || hfail "invalid UTF-8 is not 400"
head -c $((9 * 1024 * 1024)) /dev/zero | tr '\0' 'a' >"$T_DIR/big.txt"
[ "$(code "$B/v1/completions" --data-binary @"$T_DIR/big.txt")" = 413 ] || hfail "a 9-MiB body is not 413"
[ "$(code "$B/api/chat" -d '{"model":"nope","messages":[{"role":"user","content":"x"}]}')" = 404 ] || hfail "unknown model (ollama) is not 404"
jq -e '.error | type == "string"' "$T_DIR/err.json" >/dev/null || hfail "the Ollama error is not {\"error\": string}"
[ "$(code "$B/nowhere")" = 404 ] || hfail "an unknown path is not 404"
[ "$(code -X DELETE "$B/v1/chat/completions")" = 405 ] || hfail "a wrong method is not 405"
# Slow headers (slowloris): the connection is cut after header_timeout; the gateway still answers others.
kill -0 "$H_PID" || hfail "tandem-http died on bad input"
curl -sf "$B/health" >/dev/null || hfail "tandem-http stopped answering after bad input"
note "bad input: 400 (JSON, type, UTF-8, tools), 404, 405, 413; gateway up"

# --- degraded: a simulated GPU loss -> the answer says cpu and why -------------------------------------------------------
btest LoseDevice >/dev/null
wait_for 20 "degraded" sh -c "curl -s $B/health | jq -e '.status == \"degraded\"' >/dev/null"
body=$(curl -s -D "$hdr" "$B/v1/chat/completions" -d '{"model":"default","messages":[{"role":"user","content":"Hi"}],"max_tokens":6}')
grep -qi '^Tandem-Route: cpu' "$hdr" || hfail "degraded: Tandem-Route is not cpu: $(cat "$hdr")"
grep -qi '^Tandem-Degraded: ' "$hdr" || hfail "degraded: no Tandem-Degraded header"
jq -e '.tandem.route == "cpu" and .tandem.degraded == true and (.tandem.degraded_reason | length > 0)' <<<"$body" >/dev/null ||
  hfail "degraded: the tandem object does not say cpu + reason: $body"
curl -sN "$B/api/generate" -d '{"model":"default","prompt":"Hi","options":{"num_predict":6}}' >"$T_DIR/nd.txt"
head -1 "$T_DIR/nd.txt" | jq -e '.tandem.route == "cpu" and .tandem.degraded == true' >/dev/null || hfail "degraded: the NDJSON stream's first line does not say cpu: $(cat "$T_DIR/nd.txt")"
# /metrics reads tandemd's properties per scrape, as /health does (which the wait above polls): polled too, for 5 s
# (CI saw one scrape without the line on a loaded machine; what it had is printed if it happens again).
end=$((SECONDS + 5))
until m=$(curl -s "$B/metrics"); grep -q '^tandem_degraded{reason="[^"]\+"} 1' <<<"$m"; do
  [ "$SECONDS" -lt "$end" ] ||
    hfail "/metrics does not show degraded: $(grep -E '^tandem_(up|degraded|state|gpu_breaker)' <<<"$m" | tr '\n' ' ')"
  sleep 0.1
done
grep -q '^tandem_replica_info{model="default",device="gpu",state="lost",reason=""} 1$' <<<"$(curl -s "$B/metrics")" ||
  hfail "/metrics does not show the lost GPU replica: $(curl -s "$B/metrics" | grep '^tandem_replica' | tr '\n' ' ')"
note "degraded: headers, tandem object, NDJSON event and /metrics say cpu + $(jq -r .tandem.degraded_reason <<<"$body"), the GPU replica lost"

# --- queue full -> 503 with Retry-After; the clients that hang up get their jobs cancelled ------------------------------
long='{"model":"default","messages":[{"role":"user","content":"Tell a story"}],"max_tokens":1000,"stream":true}'
curl -sN "$B/v1/chat/completions" -d "$long" >"$T_DIR/qa.txt" & qa=$!; bg_track "$qa"
wait_for 20 "the first CPU stream running" sh -c "grep -q '^data: {' $T_DIR/qa.txt"
curl -sN "$B/v1/chat/completions" -d "$long" >"$T_DIR/qb.txt" & qb=$!; bg_track "$qb"
wait_for 20 "the second stream queued" sh -c "grep -q '^: tandem' $T_DIR/qb.txt"
[ "$(code -D "$hdr" "$B/v1/chat/completions" -d "$long")" = 503 ] || hfail "a full CPU queue is not 503: $(cat "$T_DIR/err.json")"
grep -qi '^Retry-After: [0-9]' "$hdr" || hfail "the 503 has no Retry-After: $(cat "$hdr")"
jq -e '.error.code == "queue_full" or .error.code == "busy"' "$T_DIR/err.json" >/dev/null || hfail "queue full: $(cat "$T_DIR/err.json")"
ja=$(sed -n 's/^: tandem //p' "$T_DIR/qa.txt" | head -1 | jq .job); jb=$(sed -n 's/^: tandem //p' "$T_DIR/qb.txt" | head -1 | jq .job)
kill "$qa" "$qb"; wait "$qa" "$qb" 2>/dev/null || true
[ "$(wait_job "$ja" 100)" = cancelled ] && [ "$(wait_job "$jb" 100)" = cancelled ] ||
  hfail "the hung-up clients' jobs $ja/$jb are $(jget "$ja" state)/$(jget "$jb" state), not cancelled"
note "queue full: 503 + Retry-After $(sed -n 's/^Retry-After: //Ip' "$hdr" | tr -d '\r') s ($(jq -r .error.code "$T_DIR/err.json")); hung-up jobs $ja (running) and $jb (queued) cancelled"
btest RecoverDevice >/dev/null

# --- tandemd restarted mid-stream: a resumable error event naming the job --------------------------------------------
curl -sN "$B/v1/chat/completions" -d '{"model":"default","messages":[{"role":"user","content":"Tell a story"}],"max_tokens":1000,"stream":true}' \
  >"$T_DIR/restart.txt" &
cpid=$!
bg_track "$cpid"
wait_for 20 "tokens streaming" sh -c "grep -q '^data: {' $T_DIR/restart.txt"
kill -KILL "$T_DAEMON_PID"; wait "$T_DAEMON_PID" 2>/dev/null || true
wait_for 20 "the stream's error event" sh -c "grep -q '\"resumable\"' $T_DIR/restart.txt"
wait "$cpid" 2>/dev/null || true
ev=$(grep '^data: {"error"' "$T_DIR/restart.txt" | tail -1 | sed 's/^data: //')
jq -e '.error.code == "resumable" and (.tandem.job > 0) and (.tandem.resume | startswith("/tandem/v1/jobs/"))' <<<"$ev" >/dev/null ||
  hfail "no resumable error event naming the job: $ev"
[ "$(code "$B/health")" = 503 ] || hfail "/health is not 503 while tandemd is gone"
note "tandemd killed mid-stream: $(jq -c '{code: .error.code, job: .tandem.job, resume: .tandem.resume}' <<<"$ev"); /health 503"

# --- tandemd back: the resumable job is resumed over HTTP, and the new job finishes ------------------------------------
tandem_start
wait_for 30 "tandem-http reconnected" sh -c "curl -sf $B/health >/dev/null"
rj=$(jq -r .tandem.job <<<"$ev")
st=$(wait_job "$rj" 50) || true
[ "$st" = failed ] || hfail "the interrupted job $rj is $st after the restart, not failed (resumable)"
res=$(curl -s -D "$hdr" "$B$(jq -r .tandem.resume <<<"$ev")" -d '{"format":"openai_chat"}')
nj=$(jq -r .tandem.job <<<"$res")
[ -n "$nj" ] && [ "$nj" != null ] && [ "$nj" != "$rj" ] || hfail "resume did not answer with a new job: $res"
[ "$(jq -r '.choices[0].finish_reason' <<<"$res")" = length ] || hfail "the resumed job did not complete: $res"
[ "$(job "$nj" | jq -j .text)" = "$(jq -j '.choices[0].message.content' <<<"$res")" ] || hfail "the resumed job's text != GetJob($nj)"
note "resumed job $rj as job $nj over POST /tandem/v1/jobs/$rj/resume: completed"
echo "PASS"
