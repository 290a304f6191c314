#!/usr/bin/env bash
# Nothing accepted disappears. SIGKILL with jobs running (GPU and CPU) and queued, then a restart on the same state
# directory: every accepted job id reads back in a terminal state (the in-flight ones failed Resumable with reason
# daemon_restart and their journaled checkpoint), idempotency keys resolve to the same jobs, the replay is logged,
# Resume continues from the checkpoint. SIGTERM with jobs running: the daemon refuses new work, exits 0 within the
# drain timeout (set to 0.5 s here), and every job is completed or failed-resumable with its checkpoint. Group commit:
# tandemd killed between the write and the sync of an accept loses no acknowledged job.
TANDEMD=$1 TANDEMCTL=$2 MKMODEL=$3
source "$(dirname "$0")/lib.sh"
tandem_setup "$(printf '[cpu_queue]\nconcurrency = 1\ncapacity = 8\n')"
T_FAST_STOP=1

P="The history of the lighthouse"
N1=1000
is_prefix() {  # is_prefix A B: JSON arrays, one is a prefix of the other
  jq -n -e --argjson a "$1" --argjson b "$2" '([$a, $b] | map(length) | min) as $n | $a[:$n] == $b[:$n]' >/dev/null
}

# Checks after the restart on the killed daemon's state directory.
phase_a_checks() {
  replay=$(grep -E 'journal .*: [0-9]+ jobs' "$T_LOG" | tail -1)
  echo "$replay" | grep -qE ': 5 jobs, .* 4 recovered as failed-resumable' || fail "journal replay line: '$replay'"
  note "replay logged: ${replay#*info: }"

  for id in "$done_id" "$g0" "$c1" "$q2" "$q3"; do
    st=$(jget "$id" state)
    case "$st" in completed|failed|cancelled) ;; *) fail "job $id after the restart: '$st'";; esac
  done
  [ "$(jget "$done_id" state)" = completed ] && [ "$(jget "$done_id" tokens)" = "$done_tokens" ] || fail "the completed job changed"
  for id in "$g0" "$c1"; do
    j=$(job "$id")
    [ "$(echo "$j" | jq -r .state)" = failed ] || fail "in-flight job $id: $(echo "$j" | jq -r .state)"
    [ "$(echo "$j" | jq -r .reason)" = daemon_restart ] || fail "in-flight job $id reason $(echo "$j" | jq -r .reason)"
    [ "$(echo "$j" | jq -r .error_code)" = Resumable ] || fail "in-flight job $id error_code $(echo "$j" | jq -r .error_code)"
    ck=$(echo "$j" | jq -r .checkpoint_tokens)
    [ "$ck" -ge 32 ] || fail "in-flight job $id: checkpoint of $ck tokens (it had 40+ before the kill; checkpoints every 32)"
    [ "$(echo "$j" | jq '.tokens | length')" = "$ck" ] || fail "job $id: checkpoint_tokens != len(tokens)"
    pre=$pre_g0; [ "$id" = "$c1" ] && pre=$pre_c1
    is_prefix "$(echo "$j" | jq -c .tokens)" "$pre" || fail "job $id: the checkpoint is not the tokens it had generated"
    [ -n "$(echo "$j" | jq -r .text)" ] || fail "job $id: checkpoint without text"
  done
  for id in "$q2" "$q3"; do
    j=$(job "$id")
    [ "$(echo "$j" | jq -r .state)/$(echo "$j" | jq -r .reason)/$(echo "$j" | jq -r .error_code)" = failed/daemon_restart/Resumable ] ||
      fail "queued job $id after the restart: $(echo "$j" | jq -c '{state, reason, error_code}')"
    [ "$(echo "$j" | jq -r .checkpoint_tokens)" = 0 ] || fail "queued job $id has a checkpoint"
  done
  note "after the restart: $g0 and $c1 failed Resumable (daemon_restart) with checkpoints of $(jget "$g0" checkpoint_tokens) / $(jget "$c1" checkpoint_tokens) tokens; $q2, $q3 failed (daemon_restart, 0 tokens)"

  # Idempotency keys resolve to the same jobs.
  again=$(bcall Submit 'ssa(ss)a{sv}' default "$P" 0 3 max_tokens u 8 seed t 1 idempotency_key s k-done)
  [ "$(echo "$again" | jq -r '.data[0]')" = "$done_id" ] || fail "key k-done resolved to job $(echo "$again" | jq -r '.data[0]'), want $done_id"
  [ "$(echo "$again" | jfield existing)" = true ] || fail "key k-done: existing is not true"
  out=$(expect_err Resumable gcall Submit default "$P" "@a(ss) []" \
    "{'max_tokens': <uint32 $N1>, 'seed': <uint64 3>, 'temperature': <0.9>, 'idempotency_key': <'k-run'>}")
  echo "$out" | grep -q "job=$c1" || fail "key k-run: the Resumable error does not name job $c1: $out"
  expect_err Duplicate gcall Submit default "another prompt" "@a(ss) []" "{'idempotency_key': <'k-queued'>}" >/dev/null
  fresh=$(submit "$P" 1 max_tokens u 4)
  [ "$fresh" -gt "$g0" ] || fail "new job id $fresh reuses an old id (last was $g0)"
  note "keys: k-done -> job $done_id (existing), k-run -> Resumable job=$c1, k-queued with another request -> Duplicate"

  # Resume from the checkpoint: continues, same seed, as long as asked.
  ck=$(jget "$c1" checkpoint_tokens)
  ck_tokens=$(jget "$c1" tokens)
  M=$((ck + 40))   # 40 more tokens are enough to see it continue
  r=$(bcall Resume ta{sv} "$c1" 1 max_tokens u $M | jq -r '.data[0]')
  [ "$(wait_job "$r" 300)" = completed ] || fail "resumed job $r: $(jget "$r" state)"
  rt=$(jget "$r" tokens)
  [ "$(echo "$rt" | jq length)" = $M ] || fail "resumed job has $(echo "$rt" | jq length) tokens, want $M"
  is_prefix "$ck_tokens" "$rt" || fail "the resumed job does not start with the checkpoint"
  again=$(bcall Submit 'ssa(ss)a{sv}' default "$P" 0 4 max_tokens u $N1 seed t 3 temperature d 0.9 idempotency_key s k-run)
  [ "$(echo "$again" | jq -r '.data[0]')" = "$r" ] && [ "$(echo "$again" | jfield existing)" = true ] ||
    fail "after Resume the key k-run names job $(echo "$again" | jq -r '.data[0]'), want $r (existing)"
  note "Resume($c1) -> job $r completed from the $ck-token checkpoint; k-run now names $r"

}

# --- phase A: jobs in every state, then SIGKILL -------------------------------------------------------------------
done_id=$(submit "$P" 3 max_tokens u 8 seed t 1 idempotency_key s k-done)
[ "$(wait_job "$done_id")" = completed ] || fail "job $done_id"
done_tokens=$(jget "$done_id" tokens)
# The CPU jobs first and the GPU job last: on a loaded 2-core CI machine the CPU route can take 8 s to reach 40
# tokens, longer than the simulated GPU takes for all of its 1,000 (CI saw the GPU job complete before the kill).
btest SetForeignLoad t 900000000                                             # the CPU jobs go to the CPU queue
c1=$(submit "$P" 4 max_tokens u $N1 seed t 3 temperature d 0.9 idempotency_key s k-run)   # running on the CPU
wait_for 10 "job $c1 running" job_state_is "$c1" running
q2=$(submit "$P" 3 max_tokens u 40 seed t 4 idempotency_key s k-queued)     # queued behind c1
q3=$(submit "$P" 2 max_tokens u 40 seed t 5)                                 # queued
[ "$(jget "$q2" state)" = queued ] && [ "$(jget "$q3" state)" = queued ] || fail "jobs $q2/$q3 not queued"
wait_for 60 "40 tokens of job $c1" job_tokens_ge "$c1" 40
btest SetForeignLoad t 0                                                     # the device is free again
g0=$(submit "$P" 2 max_tokens u 1000 seed t 2)                              # running on the GPU
[ "$(jget "$g0" route)" = gpu ] && [ "$(jget "$c1" route)" = cpu ] || fail "placement: $g0 on $(jget "$g0" route), $c1 on $(jget "$c1" route)"
[ "$(jget "$q2" state)" = queued ] && [ "$(jget "$q3" state)" = queued ] || fail "jobs $q2/$q3 left the CPU queue"
wait_for 20 "40 tokens of job $g0" job_tokens_ge "$g0" 40
pre_g0=$(jget "$g0" tokens)
pre_c1=$(jget "$c1" tokens)
[ "$(echo "$pre_c1" | jq length)" -lt $N1 ] || fail "job $c1 finished before the kill"
old_pid=$T_DAEMON_PID
kill -KILL "$T_DAEMON_PID"
wait "$T_DAEMON_PID" 2>/dev/null || true
note "SIGKILL with $g0 (gpu) and $c1 (cpu) running, $q2 and $q3 queued, $done_id completed"

# The restarted daemon drains for at most 0.5 s on SIGTERM (phase B), shorter than its long GPU job (1,000 tokens take
# over 0.7 s on the simulated GPU).
sed -i 's/^drain_timeout_ms = .*/drain_timeout_ms = 500/' "$T_DIR/tandemd.toml"
if tandem_try_start; then
  [ "$T_DAEMON_PID" != "$old_pid" ] || fail "no new daemon"
  phase_a_checks
else
  # BUG (seen, fixed since): Service::restore() journaled the recovered jobs with JobJournal::transition(id, "failed",
  # ...), which only accepts queued|running|retrying|migrating, so tandemd could not start at all on a journal with
  # in-flight jobs. Should it come back, the SIGTERM checks below still run.
  soft_fail "tandemd does not start on the state directory of a killed daemon: $(grep -E 'error: ' "$T_LOG" | tail -1)"
  # Go on with a fresh state directory so that the SIGTERM checks below still run.
  sed -i "s|^dir = \"$T_STATE\"\$|dir = \"$T_STATE.fresh\"|" "$T_DIR/tandemd.toml"
  grep -q "^dir = \"$T_STATE.fresh\"" "$T_DIR/tandemd.toml" || fail "could not switch the state directory"
  tandem_start
fi

# --- phase B: SIGTERM with work in flight --------------------------------------------------------------------------
# The CPU jobs first, the GPU job last, SIGTERM after its 5th token: the tiny model decodes 1,000 tokens in about a
# second on a fast CPU (and its context is 1,024 tokens), so the long GPU job must start just before the drain. The
# CPU queue runs one job at a time: two more long jobs between cpu1 and cq keep cq queued until the drain even when
# the GPU job's admission waits for the pressure to clear on a loaded CI machine (seen: cpu1 and then cq finished
# 1.2 s after cpu1 started, before the GPU job's 5th token).
btest SetForeignLoad t 900000000
cpu1=$(submit "$P" 2 max_tokens u 1000 seed t 8)               # long, on the CPU
wait_for 10 "job $cpu1 running" job_state_is "$cpu1" running
cpu2=$(submit "$P" 2 max_tokens u 1000 seed t 10)              # queued on the CPU
cpu3=$(submit "$P" 2 max_tokens u 1000 seed t 11)              # queued on the CPU
cq=$(submit "$P" 2 max_tokens u 20 seed t 9)                   # queued on the CPU, behind ~3,000 tokens of work
wait_for 20 "tokens of job $cpu1" job_tokens_ge "$cpu1" 5
btest SetForeignLoad t 0
x=$(submit "$P" 2 max_tokens u 1000 seed t 7)                  # long, on the GPU
wait_for 20 "tokens of job $x" job_tokens_ge "$x" 5
t0=$(date +%s%N)
kill -TERM "$T_DAEMON_PID"
# While draining (0.5 s here): no new work. The call goes out once the log shows the drain, polled every 10 ms: sent
# at once instead, it raced the signal on a loaded CI machine (both cores busy with the two jobs; seen once: the
# call was read before the signal and admitted). gdbus starts in tens of milliseconds, well inside the 0.5 s (a
# 100-ms poll once let the daemon finish its drain first).
for _ in $(seq 1 500); do grep -q 'signal 15: draining' "$T_LOG" && break; sleep 0.01; done
grep -q 'signal 15: draining' "$T_LOG" || fail "no drain log line 5 s after SIGTERM"
out=$(expect_err Unavailable gcall Submit default "$P" "@a(ss) []" "{'max_tokens': <uint32 4>}")
note "draining: Submit -> Unavailable"
rc=0
for _ in $(seq 1 150); do kill -0 "$T_DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$T_DAEMON_PID" 2>/dev/null && fail "tandemd still running 15 s after SIGTERM (drain timeout 0.5 s)"
wait "$T_DAEMON_PID" || rc=$?
took_ms=$((($(date +%s%N) - t0) / 1000000))
[ "$rc" = 0 ] || fail "tandemd exited $rc after SIGTERM"
[ "$took_ms" -le 4000 ] || fail "tandemd took $took_ms ms to stop (drain timeout 0.5 s)"
grep -q 'signal 15: draining' "$T_LOG" || fail "no drain log line"
note "SIGTERM: exit 0 after $took_ms ms"

tandem_start
replay=$(grep -E 'journal .*: [0-9]+ jobs' "$T_LOG" | tail -1)
echo "$replay" | grep -qE ' 0 recovered as failed-resumable' || fail "after a clean stop the journal still had in-flight jobs: '$replay'"
for id in "$x" "$cpu1"; do
  j=$(job "$id")
  st=$(echo "$j" | jq -r .state)
  if [ "$st" = failed ]; then
    [ "$(echo "$j" | jq -r .error_code)" = Resumable ] || fail "job $id after SIGTERM: failed with $(echo "$j" | jq -r .error_code)"
    [ "$(echo "$j" | jq -r .reason)" = daemon_stopping ] || fail "job $id after SIGTERM: reason $(echo "$j" | jq -r .reason)"
    [ "$(echo "$j" | jq -r .checkpoint_tokens)" -ge 5 ] || fail "job $id after SIGTERM: checkpoint_tokens $(echo "$j" | jq -r .checkpoint_tokens)"
  elif [ "$st" != completed ]; then
    fail "job $id after SIGTERM and restart: $st"
  fi
done
for id in "$cpu2" "$cpu3"; do
  case "$(jget "$id" state)" in failed|completed) ;; *) fail "job $id after SIGTERM and restart: $(jget "$id" state)";; esac
done
j=$(job "$cq")
[ "$(echo "$j" | jq -c '[.state, .reason, .error_code, .attempts]')" = '["failed","daemon_stopping","Resumable",0]' ] ||
  fail "queued job $cq after SIGTERM: $(echo "$j" | jq -c '{state, reason, error_code, attempts}')"
note "after SIGTERM: job $x $(jget "$x" state) ($(job "$x" | jq '.tokens | length') tokens), $cpu1 $(jget "$cpu1" state) ($(job "$cpu1" | jq '.tokens | length') tokens), queued $cq failed daemon_stopping"
[ "$(jget "$x" state)" = failed ] || fail "job $x (1000 tokens) completed within the 0.5 s drain: the abort path was not tested"
r2=$(bcall Resume ta{sv} "$x" 0 | jq -r '.data[0]')
[ "$(jget "$r2" state)" != failed ] || fail "Resume of $x after SIGTERM: $(jget "$r2" state)"
is_prefix "$(jget "$x" tokens)" "$(jget "$r2" tokens)" || fail "the resumed job does not continue job $x's checkpoint"
bcall Cancel t "$r2" >/dev/null

kill -0 "$T_DAEMON_PID" || fail "daemon died"

# --- phase C: group commit, SIGKILL between the write and the sync of an accept ------------------------------------
# tandemd --testing with TANDEM_TESTING_CRASH_AT_COMMIT=3 kills itself in the third commit that has accepts pending,
# after their accepted records were written and before the fdatasync (docs/journal.md, "Group commit"). Each Submit
# is acknowledged (its reply) only after the commit covering it: the first two are, the third never is. After a
# restart every acknowledged job is there; the written-but-unsynced one may be too (a process kill keeps the page
# cache), and then it is an ordinary job in flight: failed Resumable (daemon_restart).
kill -TERM "$T_DAEMON_PID"
wait "$T_DAEMON_PID" 2>/dev/null || true
TANDEM_TESTING_CRASH_AT_COMMIT=3 tandem_start
acked=()
for i in 1 2 3; do
  if out=$(bcall Submit 'ssa(ss)a{sv}' default "$P" 0 2 max_tokens u 4 seed t $((20 + i)) 2>&1); then
    acked+=("$(echo "$out" | jq -r '.data[0]')")
  else
    note "Submit $i got no reply: ${out:0:120}"
  fi
done
[ "${#acked[@]}" = 2 ] || fail "want 2 acknowledged Submits before the crash at the third commit, got ${#acked[@]}: ${acked[*]}"
for _ in $(seq 1 50); do kill -0 "$T_DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$T_DAEMON_PID" 2>/dev/null && fail "tandemd did not kill itself at the third commit"
wait "$T_DAEMON_PID" 2>/dev/null || true
grep -q 'killing tandemd between the write and the sync' "$T_LOG" || fail "no crash-at-commit log line"
tandem_start
for id in "${acked[@]}"; do
  st=$(jget "$id" state)
  case "$st" in completed|failed|cancelled|queued|running) ;; *) fail "acknowledged job $id after the crash: '$st'";; esac
done
unacked=$((${acked[1]} + 1))
if bcall GetJob t "$unacked" >/dev/null 2>&1; then
  st=$(jget "$unacked" state)
  [ "$st/$(jget "$unacked" reason)" = failed/daemon_restart ] || fail "the unacknowledged job $unacked came back as $st ($(jget "$unacked" reason))"
  note "crash between write and sync: acknowledged ${acked[*]} present; unacknowledged $unacked came back $st (daemon_restart)"
else
  note "crash between write and sync: acknowledged ${acked[*]} present; unacknowledged $unacked not in the journal"
fi
fresh=$(submit "$P" 1 max_tokens u 4)
[ "$fresh" -gt "$unacked" ] || fail "job id $fresh after the crash reuses id $unacked or below"

kill -0 "$T_DAEMON_PID" || fail "daemon died"
tandem_finish it_restart
