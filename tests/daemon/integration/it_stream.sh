#!/usr/bin/env bash
# Streaming through tandemctl: `tandemctl run` writes the job's text to stdout as it is generated (before the job
# ends), the streamed text is exactly GetJob's text, the placement (route, queue, ETA) is shown on stderr; with
# --json every line is one JSON object, the token events are contiguous and agree with GetJob, and the stream's
# last update is the finished event. A degraded (CPU) placement is shown as such.
TANDEMD=$1 TANDEMCTL=$2 MKMODEL=$3
source "$(dirname "$0")/lib.sh"
tandem_setup
T_FAST_STOP=1

ctl() { "$TANDEMCTL" "$@"; }
P="Once upon a time in a small village"

# --- 1. plain run: stdout is the text, stderr the placement and progress ---------------------------------------
rc=0
ctl run --max-tokens 40 --seed 5 --temperature 0.9 "$P" >"$T_DIR/run.out" 2>"$T_DIR/run.err" || rc=$?
[ "$rc" = 0 ] || { cat "$T_DIR/run.err" >&2; fail "tandemctl run exited $rc"; }
id=$(grep -oE '[Jj]ob[ #:]+[0-9]+' "$T_DIR/run.err" | head -1 | grep -oE '[0-9]+$') || true
[ -n "$id" ] || { cat "$T_DIR/run.err" >&2; fail "tandemctl run did not name the job id on stderr"; }
note "tandemctl run: job $id"
[ "$(jget "$id" state)" = completed ] || fail "job $id is $(jget "$id" state)"
job "$id" | jq -j .text >"$T_DIR/getjob.txt"
[ -s "$T_DIR/getjob.txt" ] || fail "GetJob($id).text is empty"
# The streamed stdout is the text, byte for byte (one trailing newline added by tandemctl is tolerated).
if ! cmp -s "$T_DIR/run.out" "$T_DIR/getjob.txt"; then
  { cat "$T_DIR/getjob.txt"; echo; } | cmp -s "$T_DIR/run.out" - ||
    fail "tandemctl stdout != GetJob text: $(od -c "$T_DIR/run.out" | head -3) vs $(od -c "$T_DIR/getjob.txt" | head -3)"
fi
grep -qi 'gpu' "$T_DIR/run.err" || fail "the route (gpu) is not shown: $(cat "$T_DIR/run.err")"
grep -qi 'queue' "$T_DIR/run.err" || fail "the queue is not shown: $(cat "$T_DIR/run.err")"
grep -qiE 'eta' "$T_DIR/run.err" || fail "the ETA is not shown: $(cat "$T_DIR/run.err")"
grep -qiE 'completed' "$T_DIR/run.err" || fail "the final state is not shown: $(cat "$T_DIR/run.err")"
note "plain run: stdout equals GetJob text ($(wc -c <"$T_DIR/run.out") bytes); route/queue/ETA shown"

# --- 2. it really streams: text appears on stdout while the job is still running ----------------------------------
ctl run --max-tokens 600 --seed 6 --temperature 0.9 "$P" >"$T_DIR/long.out" 2>"$T_DIR/long.err" &
long_pid=$!
bg_track "$long_pid"
wait_for 20 "first streamed bytes on stdout" test -s "$T_DIR/long.out"
lid=$(grep -oE '[Jj]ob[ #:]+[0-9]+' "$T_DIR/long.err" | head -1 | grep -oE '[0-9]+$')
st=$(jget "$lid" state)
[ "$st" = running ] || fail "stdout had text but job $lid is $st: tandemctl did not stream (buffered until the end)"
note "streaming: text on stdout while job $lid is $st"
bcall Cancel t "$lid" >/dev/null
rc=0; wait "$long_pid" || rc=$?
[ "$rc" = 3 ] || fail "tandemctl run of a job cancelled by someone else exited $rc, want 3 (cancelled)"

# --- 3. --json run: one JSON object per line; tokens contiguous; ends with the finished event ---------------------
rc=0
ctl --json run --max-tokens 30 --seed 7 --temperature 0.9 "$P" >"$T_DIR/j.out" 2>"$T_DIR/j.err" || rc=$?
[ "$rc" = 0 ] || { cat "$T_DIR/j.err" >&2; fail "tandemctl --json run exited $rc"; }
lines=$(wc -l <"$T_DIR/j.out")
[ "$lines" -ge 3 ] || fail "--json run printed $lines lines"
n=0
while IFS= read -r line; do
  n=$((n + 1))
  echo "$line" | jq -e 'type == "object"' >/dev/null 2>&1 || fail "--json line $n is not one JSON object: $line"
done <"$T_DIR/j.out"
jid=$(jq -r 'select(.job != null) | .job' "$T_DIR/j.out" | head -1)
[ -n "$jid" ] && [ "$jid" != null ] || fail "no job id in the --json stream"
[ "$(jq -r '.job' "$T_DIR/j.out" | sort -u | wc -l)" = 1 ] || fail "events of several jobs in one run"
# The placement: route, queue, eta.
jq -s -e '[.[] | select(.event == "submitted")] | length == 1 and (.[0].placement | (.route == "gpu") and
  (.queue | type == "string") and (.eta_ms | type == "number"))' "$T_DIR/j.out" >/dev/null || fail "submitted event lacks route/queue/eta_ms: $(head -1 "$T_DIR/j.out")"
# The last update is the finished event (a summary line may follow it, nothing else).
last_update=$(jq -c 'select(.event == "update")' "$T_DIR/j.out" | tail -1)
[ "$(echo "$last_update" | jq -r .kind)" = finished ] || fail "the last update is not 'finished': $last_update"
[ "$(jq -c 'select(.kind == "finished")' "$T_DIR/j.out" | wc -l)" = 1 ] || fail "not exactly one finished event"
after=$(awk '/"kind":"finished"/{f=1; next} f' "$T_DIR/j.out")
if [ -n "$after" ]; then
  echo "$after" | jq -s -e 'all(.[]; .event == "summary")' >/dev/null 2>&1 || fail "lines after the finished event: $after"
  [ "$(echo "$after" | wc -l)" = 1 ] || fail "more than one line after the finished event: $after"
fi
[ "$(echo "$last_update" | jq -r .state)" = completed ] || fail "finished event: $last_update"
# Token events: steps contiguous from 0, the concatenation equals GetJob's tokens and text.
jq -s -e '[.[] | select(.kind == "tokens")] as $t | ($t | length) > 0 and
  ([$t[] | .step] == ([foreach $t[] as $e (0; . + ($e.tokens | length); .)] | [0] + .[:-1]))' "$T_DIR/j.out" >/dev/null ||
  fail "token events are not contiguous: $(jq -c 'select(.kind == "tokens") | [.step, (.tokens | length)]' "$T_DIR/j.out" | tr '\n' ' ')"
streamed_tokens=$(jq -s -c '[.[] | select(.kind == "tokens") | .tokens[]]' "$T_DIR/j.out")
streamed_text=$(jq -s -j '[.[] | select(.kind == "tokens") | .text] | add' "$T_DIR/j.out")
[ "$streamed_tokens" = "$(jget "$jid" tokens)" ] || fail "streamed tokens != GetJob tokens"
[ "$streamed_text" = "$(job "$jid" | jq -j .text)" ] || fail "streamed text != GetJob text"
[ "$(echo "$last_update" | jq -r .tokens_total)" = "$(echo "$streamed_tokens" | jq length)" ] ||
  fail "finished.tokens_total != number of streamed tokens"
# Same seed and request as a plain run: the same text (the stream is the job's output, not a re-rendering).
ctl run --max-tokens 30 --seed 7 --temperature 0.9 "$P" >"$T_DIR/same.out" 2>/dev/null
[ "$(cat "$T_DIR/same.out")" = "$streamed_text" ] || fail "plain run text != --json streamed text for the same seed"
note "--json run: $lines lines, $(echo "$streamed_tokens" | jq length) tokens streamed contiguously, ends with finished"

# --- 4. a degraded placement is shown: route cpu, the reason, the ETA ---------------------------------------------
btest SetForeignLoad t 900000000
rc=0
ctl run --max-tokens 10 --seed 8 "$P" >"$T_DIR/cpu.out" 2>"$T_DIR/cpu.err" || rc=$?
[ "$rc" = 0 ] || { cat "$T_DIR/cpu.err" >&2; fail "tandemctl run (cpu route) exited $rc"; }
grep -qi 'cpu' "$T_DIR/cpu.err" || fail "the CPU route is not shown: $(cat "$T_DIR/cpu.err")"
grep -qiE 'eta' "$T_DIR/cpu.err" || fail "the ETA of the CPU route is not shown: $(cat "$T_DIR/cpu.err")"
grep -qiE 'routed_cpu|pressure|degraded' "$T_DIR/cpu.err" || fail "no reason for the CPU route shown: $(cat "$T_DIR/cpu.err")"
cid=$(grep -oE '[Jj]ob[ #:]+[0-9]+' "$T_DIR/cpu.err" | head -1 | grep -oE '[0-9]+$')
[ "$(jget "$cid" routes)" = '["cpu"]' ] || fail "job $cid routes $(jget "$cid" routes)"
job "$cid" | jq -j .text | cmp -s - "$T_DIR/cpu.out" || { job "$cid" | jq -j .text; echo; } | cmp -s - "$T_DIR/cpu.out" ||
  fail "cpu run: stdout != GetJob text"
note "cpu route shown: $(grep -iE 'route' "$T_DIR/cpu.err" | head -1)"

kill -0 "$T_DAEMON_PID" || fail "daemon died"
echo "it_stream: ok"
