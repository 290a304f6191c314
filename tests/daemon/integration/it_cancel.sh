#!/usr/bin/env bash
# Cancellation in every state: a job waiting in the CPU queue is cancelled and never starts; a running job stops
# with the tokens it had; `tandemctl run` interrupted with SIGINT cancels its job and exits 3; a deadline that
# passes while the job waits in the queue fails it with Timeout (and one that passes while it runs, too);
# cancelling a finished job changes nothing. The CPU queue has concurrency 1 and jobs are pushed to the CPU by a
# foreign load on the simulated GPU.
TANDEMD=$1 TANDEMCTL=$2 MKMODEL=$3
source "$(dirname "$0")/lib.sh"
tandem_setup "$(printf '[cpu_queue]\nconcurrency = 1\ncapacity = 4\n')"
T_FAST_STOP=1

P="Write a long story about a lighthouse keeper"
queue_row() { prop Queues | jq -c --arg q "$1" '.[] | select(.[0] == $q)'; }

btest SetForeignLoad t 900000000
[ "$(bcall Plan 'ssa(ss)a{sv}' default "$P" 0 0 | jfield route)" = cpu ] || fail "foreign load did not route jobs to the CPU"
# One short CPU job first, so that the CPU queue's ETAs come from measured rates (not only from the priors).
warm=$(submit "$P" 1 max_tokens u 5)
[ "$(wait_job "$warm")" = completed ] || fail "warm-up job $warm"

# --- 1. cancel while waiting in the CPU queue, 2. cancel while running ------------------------------------------
# (A holds the only CPU slot; everything about A and B is read after both cancels, so that A is surely still
# running when it is cancelled, even on a slow machine.)
a=$(submit "$P" 2 max_tokens u 1000 seed t 1)
wait_for 10 "job $a running with tokens" job_tokens_ge "$a" 1
subb=$(bcall Submit 'ssa(ss)a{sv}' default "$P" 0 2 max_tokens u 20 seed t 2)
cpu_row=$(prop Queues)
rb=$(bcall Cancel t "$(echo "$subb" | jq -r '.data[0]')" | jq -r '.data[0]')
ra=$(bcall Cancel t "$a" | jq -r '.data[0]')
b=$(echo "$subb" | jq -r '.data[0]')
cpu_row=$(echo "$cpu_row" | jq -c '.[] | select(.[0] == "cpu")')
[ "$(echo "$subb" | jfield state)" = queued ] || fail "second CPU job not queued: $(echo "$subb" | jfield state)"
[ "$(echo "$subb" | jfield queue)" = cpu ] || fail "second job's queue: $(echo "$subb" | jfield queue)"
[ "$(echo "$subb" | jfield queue_position)" = 1 ] || fail "second job's queue_position: $(echo "$subb" | jfield queue_position)"
[ "$(echo "$subb" | jfield eta_ms)" -gt 0 ] || fail "queued job without an ETA"
[ "$(echo "$cpu_row" | jq -r '.[1]')" = 1 ] && [ "$(echo "$cpu_row" | jq -r '.[3]')" = 1 ] ||
  fail "Queues cpu row $cpu_row, want depth 1 running 1"
[ "$rb" = cancelled ] || fail "Cancel of the queued job returned '$rb', want cancelled"
detail=$(echo "$subb" | jfield detail)
echo "$detail" | grep -q 'eta ' || fail "the queued job's placement detail gives no ETA: $detail"
if echo "$detail" | grep -qE 'eta [0-9]+(ns|us)\b'; then
  # Regression check (was a bug): policy::format_duration printed a duration that is not a whole number of milliseconds as raw nanoseconds
  # ("eta 64472963042ns"); the placement detail (and the log line) should say "64.5s".
  soft_fail "placement detail shows the ETA in raw nanoseconds: $detail"
fi
case "$ra" in cancelling|cancelled) ;; *) fail "Cancel of the running job $a returned '$ra'";; esac
[ "$(jget "$a" route)" = cpu ] || fail "job $a on $(jget "$a" route)"
j=$(job "$b")
[ "$(echo "$j" | jq -r .state)" = cancelled ] || fail "job $b: $(echo "$j" | jq -r .state)"
[ "$(echo "$j" | jq -r .attempts)" = 0 ] || fail "cancelled queued job has attempts $(echo "$j" | jq -r .attempts)"
[ "$(echo "$j" | jq -c .routes)" = '[]' ] || fail "cancelled queued job has routes $(echo "$j" | jq -c .routes)"
[ "$(echo "$j" | jq '.tokens | length')" = 0 ] || fail "cancelled queued job has tokens"
[ "$(bcall Cancel t "$b" | jq -r '.data[0]')" = cancelled ] || fail "second Cancel of a cancelled job"
note "queued job $b cancelled: attempts 0, never started (placement: $detail)"

[ "$(wait_job "$a" 50)" = cancelled ] || fail "running job $a: $(jget "$a" state) 5 s after Cancel"
j=$(job "$a")
n=$(echo "$j" | jq '.tokens | length')
[ "$n" -ge 1 ] && [ "$n" -lt 1000 ] || fail "cancelled running job has $n tokens"
[ "$(echo "$j" | jq -r .attempts)" = 1 ] || fail "cancelled running job attempts $(echo "$j" | jq -r .attempts)"
[ -n "$(echo "$j" | jq -r .text)" ] || fail "cancelled running job lost its text"
sleep 0.3
[ "$(job "$a" | jq '.tokens | length')" = "$n" ] || fail "tokens kept coming after the job was cancelled"
[ "$(jget "$b" state)" = cancelled ] && [ "$(jget "$b" attempts)" = 0 ] || fail "the cancelled queued job started after all"
[ "$(queue_row cpu | jq -r '.[1]')" = 0 ] || fail "the cancelled job is still counted in the CPU queue: $(queue_row cpu)"
[ "$(queue_row cpu | jq -r '.[3]')" = 0 ] || fail "CPU slot still taken after the cancel: $(queue_row cpu)"
note "running job $a cancelled after $n tokens"

# --- 3. tandemctl run + SIGINT -> the job is cancelled, tandemctl exits 3 -----------------------------------------
"$TANDEMCTL" run --max-tokens 1000 --seed 3 "$P" >"$T_DIR/int.out" 2>"$T_DIR/int.err" &
ctl_pid=$!
bg_track "$ctl_pid"
wait_for 15 "tandemctl streaming" test -s "$T_DIR/int.out"
cid=$(grep -oE '[Jj]ob[ #:]+[0-9]+' "$T_DIR/int.err" | head -1 | grep -oE '[0-9]+$')
[ -n "$cid" ] || fail "no job id on tandemctl's stderr: $(cat "$T_DIR/int.err")"
kill -INT "$ctl_pid"
rc=0
for _ in $(seq 1 100); do kill -0 "$ctl_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$ctl_pid" 2>/dev/null && fail "tandemctl still running 10 s after SIGINT"
wait "$ctl_pid" || rc=$?
[ "$rc" = 3 ] || fail "tandemctl run after SIGINT exited $rc, want 3 (stderr: $(tail -3 "$T_DIR/int.err"))"
[ "$(wait_job "$cid" 50)" = cancelled ] || fail "job $cid after SIGINT to tandemctl: $(jget "$cid" state)"
note "tandemctl run + SIGINT: job $cid cancelled, exit 3"

# --- 4. deadline while waiting in the CPU queue -> failed Timeout, never started --------------------------------
# Two long jobs ahead of it in the one CPU slot: the tiny model decodes 1,000 tokens in about a second on a fast
# CPU, so one occupier alone may be done before the deadline; with two, the queue wait is at least one whole job.
occ1=$(submit "$P" 2 max_tokens u 1000 seed t 4)
wait_for 10 "job $occ1 running" job_state_is "$occ1" running
occ=$(submit "$P" 2 max_tokens u 1000 seed t 7)
d=$(submit "$P" 3 max_tokens u 20 seed t 5 deadline_ms t 600)
[ "$(jget "$d" state)" = queued ] || fail "deadline job not queued: $(jget "$d" state)"
[ "$(wait_job "$d" 50)" = failed ] || fail "deadline job $d: $(jget "$d" state) 5 s after a 600 ms deadline"
j=$(job "$d")
[ "$(echo "$j" | jq -r .error_code)" = Timeout ] || fail "deadline job error_code $(echo "$j" | jq -r .error_code)"
[ "$(echo "$j" | jq -r .attempts)" = 0 ] || fail "deadline job started: attempts $(echo "$j" | jq -r .attempts)"
el=$(($(echo "$j" | jq -r .finished_unix_ms) - $(echo "$j" | jq -r .accepted_unix_ms)))
[ "$el" -ge 550 ] && [ "$el" -le 3000 ] || fail "deadline of 600 ms fired after $el ms"
# Queued now: at most the second occupier (its state read first: it can only leave the queue meanwhile).
qmax=$([ "$(jget "$occ" state)" = queued ] && echo 1 || echo 0)
[ "$(queue_row cpu | jq -r '.[1]')" -le "$qmax" ] || fail "the timed-out job is still in the CPU queue: $(queue_row cpu)"
note "deadline in the queue: job $d failed Timeout after $el ms, attempts 0"

# A deadline passing while the job runs: failed Timeout with the tokens it had. The second occupier has not had
# time to finish (it waits for the first): its cancel is one of the counted ones; the first may have completed.
[ "$(jget "$occ" state)" != completed ] || fail "the second occupier $occ completed already"
bcall Cancel t "$occ1" >/dev/null
bcall Cancel t "$occ" >/dev/null
wait_job "$occ1" >/dev/null
[ "$(wait_job "$occ")" = cancelled ] || fail "occupier $occ: $(jget "$occ" state) after Cancel"
occ1_cancelled=0
[ "$(jget "$occ1" state)" = cancelled ] && occ1_cancelled=1
e=$(submit "$P" 3 max_tokens u 1000 seed t 6 deadline_ms t 800)
[ "$(wait_job "$e" 80)" = failed ] || fail "running deadline job $e: $(jget "$e" state)"
j=$(job "$e")
[ "$(echo "$j" | jq -r .error_code)" = Timeout ] || fail "running deadline job error_code $(echo "$j" | jq -r .error_code)"
[ "$(echo "$j" | jq '.tokens | length')" -gt 0 ] || fail "running deadline job has no tokens"
note "deadline while running: job $e failed Timeout after $(echo "$j" | jq '.tokens | length') tokens"

# --- 5. cancel of a finished job returns its state and changes nothing ------------------------------------------
btest SetForeignLoad t 0
f=$(submit "$P" 1 max_tokens u 5)
[ "$(wait_job "$f")" = completed ] || fail "short job $f"
[ "$(bcall Cancel t "$f" | jq -r '.data[0]')" = completed ] || fail "Cancel of a completed job did not return completed"
[ "$(jget "$f" state)" = completed ] || fail "Cancel changed a completed job"
[ "$(bcall Cancel t "$e" | jq -r '.data[0]')" = failed ] || fail "Cancel of a failed job did not return failed"

# --- 6. the counters agree ---------------------------------------------------------------------------------------
c=$(gtest GetCounters)
cnt() { echo "$c" | grep -oE "'$1': (uint64 )?[0-9]+" | grep -oE '[0-9]+$'; }
want=$((4 + occ1_cancelled))
[ "$(cnt jobs_cancelled)" = "$want" ] || fail "jobs_cancelled $(cnt jobs_cancelled), want $want ($b, $a, $cid, $occ and $occ1 if it was still running): $c"
[ "$(cnt jobs_failed)" = 2 ] || fail "jobs_failed $(cnt jobs_failed), want 2 (two deadlines): $c"
[ "$(cnt jobs_running)" = 0 ] && [ "$(cnt jobs_waiting)" = 0 ] || fail "jobs left running/waiting: $c"

kill -0 "$T_DAEMON_PID" || fail "daemon died"
tandem_finish it_cancel
