#!/usr/bin/env python3
# Writes the recorded event logs of tests/validate/data from one hand-checked clean run (clean.jsonl) and five
# variants, each breaking exactly one verdict rule. The logs are committed; this script documents how they were made.
#   cd tests/validate/data && python3 ../make_logs.py
import json, copy
MiB = 1 << 20

def base():
    E = []
    seq = [0]
    def add(t, type, client=-1, job=0, **d):
        seq[0] += 1
        e = {"t_us": 1000000 + t * 1000, "seq": seq[0], "type": type, "phase": 0}
        if client != -1: e["client"] = client
        if job: e["job"] = job
        if d: e["data"] = d
        E.append(e)
    q0 = [{"name": "gpu", "depth": 0, "running": 0, "oldest_age_ms": 0}, {"name": "cpu", "depth": 0, "running": 0, "oldest_age_ms": 0}]
    add(0, "phase_start", name="mixed", index=0, expect={"min_completed": 3, "min_migrated": 1})
    add(1, "state_seen", 0, state="normal", reason="")
    add(2, "sample", state="normal", reason="", breaker="closed", mem_total=1024*MiB, mem_free=900*MiB, host_budget=2048*MiB, daemon_rss=230*MiB, rss=231*MiB, queues=q0)
    # job 1: GPU, clean, key k1
    add(10, "submit", 0, req=1, key="k1", max_tokens=3)
    add(12, "submit_ok", 0, 1, req=1, key="k1", existing=False, route="gpu", queue="gpu", degraded=False)
    add(13, "update", 0, 1, kind="accepted", route="gpu")
    add(14, "update", 0, 1, kind="routed", route="gpu", degraded=False, queue="gpu")
    add(15, "update", 0, 1, kind="started", route="gpu", attempt=1)
    add(20, "update", 0, 1, kind="tokens", step=0, tokens=[5, 6])
    add(25, "update", 0, 1, kind="tokens", step=2, tokens=[7])
    add(30, "update", 0, 1, kind="finished", state="completed", finish_reason="max_tokens")
    # job 2: GPU, device lost mid-generation, migrated to the CPU at token 2
    add(40, "submit", 0, req=2, key="k2", max_tokens=4)
    add(42, "submit_ok", 0, 2, req=2, key="k2", existing=False, route="gpu", queue="gpu", degraded=False)
    add(43, "update", 0, 2, kind="routed", route="gpu", degraded=False, queue="gpu")
    add(44, "update", 0, 2, kind="started", route="gpu", attempt=1)
    add(50, "update", 0, 2, kind="tokens", step=0, tokens=[5, 6])
    add(51, "fault", kind="lose_device", when="generating")
    add(52, "degraded_changed", 0, degraded=True, reason="gpu-absent", level="degraded")
    add(52, "degraded_changed", degraded=True, reason="gpu-absent", level="degraded")
    add(53, "breaker", state="open")
    add(54, "update", 0, 2, kind="migrated", **{"from": "gpu", "to": "cpu", "tokens_delivered": 2})
    add(55, "update", 0, 2, kind="routed", route="cpu", degraded=True, queue="cpu")
    add(56, "update", 0, 2, kind="started", route="cpu", attempt=2)
    add(60, "update", 0, 2, kind="tokens", step=2, tokens=[7, 8])
    add(65, "update", 0, 2, kind="finished", state="completed", finish_reason="max_tokens")
    add(66, "sample", state="degraded", reason="gpu-absent", breaker="open", mem_total=1024*MiB, mem_free=0, host_budget=2048*MiB, daemon_rss=240*MiB, rss=241*MiB,
        queues=[{"name": "gpu", "depth": 0, "running": 0, "oldest_age_ms": 0}, {"name": "cpu", "depth": 1, "running": 1, "oldest_age_ms": 120}])
    # job 3: a side-effects job resubmitted with the same key: answered with the same job (existing)
    add(70, "submit", 0, req=3, key="k3", side_effects=True, max_tokens=2)
    add(71, "submit_ok", 0, 3, req=3, key="k3", existing=False, route="cpu", queue="cpu", degraded=True, side_effects=True)
    add(72, "update", 0, 3, kind="routed", route="cpu", degraded=True, queue="cpu")
    add(73, "update", 0, 3, kind="started", route="cpu", attempt=1)
    add(80, "update", 0, 3, kind="tokens", step=0, tokens=[9, 9])
    add(81, "update", 0, 3, kind="finished", state="completed", finish_reason="max_tokens")
    add(82, "submit", 0, req=4, key="k3", side_effects=True, max_tokens=2)
    add(83, "submit_ok", 0, 3, req=4, key="k3", existing=True, route="cpu")
    # recovery
    add(300, "breaker", state="half_open")
    add(310, "breaker", state="closed")
    add(320, "degraded_changed", 0, degraded=False, reason="", level="normal")
    # a rejection
    add(330, "submit", 0, req=5, key="k5")
    add(331, "submit_rejected", 0, req=5, key="k5", error="QueueFull", message="queue full", retry_after_ms=1000)
    add(400, "job_final", -1, 1, state="completed", routes=["gpu"], tokens=[5, 6, 7], attempts=1, history=["queued", "running", "completed"], key="k1")
    add(401, "job_final", -1, 2, state="completed", routes=["gpu", "cpu"], tokens=[5, 6, 7, 8], attempts=2, history=["queued", "running", "migrating", "queued", "running", "completed"], key="k2")
    add(402, "job_final", -1, 3, state="completed", routes=["cpu"], tokens=[9, 9], attempts=1, history=["queued", "running", "completed"], key="k3", side_effects=True)
    add(403, "sample", state="normal", reason="", breaker="closed", mem_total=1024*MiB, mem_free=900*MiB, host_budget=2048*MiB, daemon_rss=235*MiB, rss=236*MiB, queues=q0)
    add(410, "phase_end", name="mixed")
    return E

def write(name, E):
    E = sorted(E, key=lambda e: (e["t_us"], e["seq"]))
    with open(name, "w") as f:
        for e in E: f.write(json.dumps(e, separators=(",", ":")) + "\n")

def at(E, pred):
    return [e for e in E if pred(e)]

E = base(); write("clean.jsonl", E)

# lost_job: a fourth job was accepted (Submit returned id 4) but GetJob still shows it queued after the drain.
L = copy.deepcopy(E)
L += [{"t_us": 1000000 + 90000, "seq": 800, "type": "submit", "phase": 0, "client": 0, "data": {"req": 6, "key": "k6"}},
      {"t_us": 1000000 + 91000, "seq": 801, "type": "submit_ok", "phase": 0, "client": 0, "job": 4, "data": {"req": 6, "key": "k6", "existing": False, "route": "gpu"}},
      {"t_us": 1000000 + 404000, "seq": 802, "type": "job_final", "phase": 0, "job": 4, "data": {"state": "queued", "routes": [], "tokens": [], "attempts": 0, "history": ["queued"], "key": "k6"}}]
write("lost_job.jsonl", L)

# duplicate_side_effect: the resubmission of key k3 started and completed a second job (4): two executions.
D = copy.deepcopy(E)
r = at(D, lambda e: e["type"] == "submit_ok" and e["data"].get("req") == 4)[0]
r["job"] = 4; r["data"]["existing"] = False
t = r["t_us"]
D += [{"t_us": t + 1, "seq": 900, "type": "update", "phase": 0, "client": 0, "job": 4, "data": {"kind": "started", "route": "cpu", "attempt": 1}},
      {"t_us": t + 2, "seq": 901, "type": "update", "phase": 0, "client": 0, "job": 4, "data": {"kind": "tokens", "step": 0, "tokens": [9, 9]}},
      {"t_us": t + 3, "seq": 902, "type": "update", "phase": 0, "client": 0, "job": 4, "data": {"kind": "finished", "state": "completed"}},
      {"t_us": 1000000 + 402500, "seq": 903, "type": "job_final", "phase": 0, "job": 4, "data": {"state": "completed", "routes": ["cpu"], "tokens": [9, 9], "attempts": 1, "history": ["queued", "running", "completed"], "key": "k3", "side_effects": True}}]
write("duplicate_side_effect.jsonl", D)

# tokens_redelivered: after the migration the CPU run streams from step 1 again (token 6 delivered twice).
R = copy.deepcopy(E)
for e in at(R, lambda e: e["type"] == "update" and e.get("job") == 2 and e["data"].get("kind") == "tokens" and e["data"]["step"] == 2):
    e["data"]["step"] = 1; e["data"]["tokens"] = [6, 7, 8]
write("tokens_redelivered.jsonl", R)

# degraded_late: job 2 moves to the CPU without a migrated update and with routed(degraded=false), and client 0
# gets DegradedModeChanged only after job 2's first CPU tokens (+60 ms): nothing announced it first.
G = copy.deepcopy(E)
at(G, lambda e: e["type"] == "degraded_changed" and e.get("client") == 0 and e["data"]["degraded"])[0]["t_us"] = 1000000 + 61000
G = [e for e in G if not (e["type"] == "update" and e.get("job") == 2 and e["data"]["kind"] == "migrated")]
at(G, lambda e: e["type"] == "update" and e.get("job") == 2 and e["data"]["kind"] == "routed" and e["data"]["route"] == "cpu")[0]["data"]["degraded"] = False
write("degraded_late.jsonl", G)

# ram_over_budget: one RSS sample above the 2048 MiB budget.
M = copy.deepcopy(E)
for e in at(M, lambda e: e["type"] == "sample" and e["data"].get("rss") == 241 * MiB):
    e["data"]["rss"] = 2100 * MiB
write("ram_over_budget.jsonl", M)

# recorded_*.jsonl are real phases of a CI campaign (tandem-validate --spawn config/validation/ci.toml), copied
# unchanged: phase 9 (daemon-kill) and phase 3 (alloc-before-generation). recorded_daemon_kill_lost.jsonl is the
# daemon-kill phase with one daemon_restart job's final GetJob answered "UnknownJob" (as if the restarted daemon had
# forgotten it): the verdict must fail lost_jobs.
K = [json.loads(l) for l in open("recorded_daemon_kill.jsonl")]
for e in K:
    if e["type"] == "job_final" and e["data"].get("reason") == "daemon_restart":
        e["data"] = {"state": "", "error": "UnknownJob: no job %d" % e["job"]}
        break
with open("recorded_daemon_kill_lost.jsonl", "w") as f:
    for e in K: f.write(json.dumps(e, separators=(",", ":")) + "\n")

# transcribe.jsonl: a home-server-like phase with transcription jobs (kind = "transcribe", runner_transcribe.cc):
#   job 11: 2 windows on the GPU, 3 segments;
#   job 12: 3 windows, the device is lost after window 1: migrated to the CPU at the window boundary (segments 0-1
#           from the GPU, 2-3 from the CPU), the text is the 4 segments' texts;
#   job 13: routed to the CPU at admission (critical pressure), 1 window, no segment (the random model said nothing);
#   req 14: refused (InvalidArgument); req 15: the key of job 11 again, answered with job 11 (existing).
# The variants break the rule transcribe_outcomes one way each.
def transcribe_base():
    E = []
    seq = [0]
    def add(t, type, client=-1, job=0, **d):
        seq[0] += 1
        e = {"t_us": 2000000 + t * 1000, "seq": seq[0], "type": type, "phase": 0}
        if client != -1: e["client"] = client
        if job: e["job"] = job
        if d: e["data"] = d
        E.append(e)
    add(0, "phase_start", name="speech", index=0, expect={"min_transcribe_ok": 3, "min_transcribe_gpu": 1, "min_transcribe_cpu": 2, "min_transcribe_migrated": 1})
    add(1, "state_seen", 0, state="normal", reason="")
    add(2, "sample", state="normal", reason="", breaker="closed", host_budget=2048*MiB, rss=300*MiB)
    seg = lambda t, job, i, text, s, e, w: add(t, "update", 0, job, kind="segment", index=i, text=text, start_ms=s, end_ms=e, window=w)
    # job 11: GPU
    add(10, "transcribe_call", 0, req=11, key="t11", model="asr", audio_seconds=40, sample_rate=16000, bytes=1280044, input="bytes", language="", workload="speech", transport="dbus")
    add(12, "transcribe_accepted", 0, 11, req=11, key="t11", route="gpu", queue="gpu", existing=False, degraded=False)
    add(13, "update", 0, 11, kind="routed", route="gpu", degraded=False, queue="gpu")
    add(14, "update", 0, 11, kind="started", route="gpu", attempt=1)
    add(15, "update", 0, 11, kind="audio", seconds=40.0, windows_total=2)
    seg(20, 11, 0, " one", 0, 4000, 0); seg(21, 11, 1, " two", 4000, 30000, 0)
    add(22, "update", 0, 11, kind="progress", windows_done=1, windows_total=2)
    seg(30, 11, 2, " three", 30000, 40000, 1)
    add(31, "update", 0, 11, kind="progress", windows_done=2, windows_total=2)
    add(32, "update", 0, 11, kind="finished", state="completed", segments=3, windows_done=2)
    add(33, "transcribe_final", 0, 11, req=11, key="t11", state="completed", kind="transcribe", routes=["gpu"], history=["queued", "running", "completed"], text=" one two three",
        segments=[{"index": 0, "start": 0.0, "end": 4.0, "text": " one"}, {"index": 1, "start": 4.0, "end": 30.0, "text": " two"}, {"index": 2, "start": 30.0, "end": 40.0, "text": " three"}],
        windows_done=2, windows_total=2, windows_on_cpu=0, audio_ms=40000, followed_by="finished")
    # job 12: GPU, device lost after window 1, migrated
    add(40, "transcribe_call", 0, req=12, key="t12", model="asr", audio_seconds=80, sample_rate=16000, bytes=2560044, input="memfd", language="en", workload="speech", transport="dbus")
    add(42, "transcribe_accepted", 0, 12, req=12, key="t12", route="gpu", queue="gpu", existing=False, degraded=False)
    add(43, "update", 0, 12, kind="routed", route="gpu", degraded=False, queue="gpu")
    add(44, "update", 0, 12, kind="started", route="gpu", attempt=1)
    seg(50, 12, 0, " a", 0, 10000, 0); seg(51, 12, 1, " b", 10000, 30000, 0)
    add(52, "update", 0, 12, kind="progress", windows_done=1, windows_total=3)
    add(53, "fault", kind="lose_device", when="generating")
    add(54, "degraded_changed", 0, degraded=True, reason="gpu-absent", level="degraded")
    add(54, "breaker", state="open")
    add(55, "update", 0, 12, kind="migrated", **{"from": "gpu", "to": "cpu", "reason": "device_lost"})
    add(56, "update", 0, 12, kind="routed", route="cpu", degraded=True, queue="cpu")
    add(57, "update", 0, 12, kind="started", route="cpu", attempt=2)
    seg(60, 12, 2, " c", 30000, 60000, 1)
    add(61, "update", 0, 12, kind="progress", windows_done=2, windows_total=3)
    seg(70, 12, 3, " d", 60000, 80000, 2)
    add(71, "update", 0, 12, kind="progress", windows_done=3, windows_total=3)
    add(72, "update", 0, 12, kind="finished", state="completed", segments=4, windows_done=3)
    add(73, "transcribe_final", 0, 12, req=12, key="t12", state="completed", kind="transcribe", routes=["gpu", "cpu"], history=["queued", "running", "migrating", "queued", "running", "completed"], text=" a b c d",
        segments=[{"index": 0, "start": 0.0, "end": 10.0, "text": " a"}, {"index": 1, "start": 10.0, "end": 30.0, "text": " b"},
                  {"index": 2, "start": 30.0, "end": 60.0, "text": " c"}, {"index": 3, "start": 60.0, "end": 80.0, "text": " d"}],
        windows_done=3, windows_total=3, windows_on_cpu=2, audio_ms=80000, followed_by="finished")
    # job 13: routed to the CPU at admission
    add(80, "transcribe_call", 0, req=13, key="t13", model="asr", audio_seconds=10, sample_rate=8000, bytes=160044, input="bytes", language="", workload="speech", transport="dbus")
    add(81, "transcribe_accepted", 0, 13, req=13, key="t13", route="cpu", queue="cpu", existing=False, degraded=True)
    add(82, "update", 0, 13, kind="routed", route="cpu", degraded=True, queue="cpu")
    add(83, "update", 0, 13, kind="started", route="cpu", attempt=1)
    add(90, "update", 0, 13, kind="progress", windows_done=1, windows_total=1)
    add(91, "update", 0, 13, kind="finished", state="completed", segments=0, windows_done=1)
    add(92, "transcribe_final", 0, 13, req=13, key="t13", state="completed", kind="transcribe", routes=["cpu"], history=["queued", "running", "completed"], text="", segments=[],
        windows_done=1, windows_total=1, windows_on_cpu=1, audio_ms=10000, followed_by="finished")
    # req 14 refused, req 15 an existing hit
    add(100, "transcribe_call", 0, req=14, key="t14", model="asr", audio_seconds=1, sample_rate=16000, bytes=32044, input="bytes", language="xx", workload="speech", transport="dbus")
    add(101, "transcribe_rejected", 0, req=14, key="t14", error="InvalidArgument", message="language 'xx' is not one of the model's")
    add(110, "transcribe_call", 0, req=15, key="t11", model="asr", audio_seconds=40, sample_rate=16000, bytes=1280044, input="bytes", language="", workload="speech", transport="dbus")
    add(111, "transcribe_accepted", 0, 11, req=15, key="t11", route="gpu", existing=True, degraded=False)
    add(1112, "transcribe_final", 0, 11, req=15, key="t11", state="completed", kind="transcribe", routes=["gpu"], history=["queued", "running", "completed"], text=" one two three",
        segments=[{"index": 0, "start": 0.0, "end": 4.0, "text": " one"}, {"index": 1, "start": 4.0, "end": 30.0, "text": " two"}, {"index": 2, "start": 30.0, "end": 40.0, "text": " three"}],
        windows_done=2, windows_total=2, windows_on_cpu=0, audio_ms=40000, followed_by="poll")
    add(1200, "breaker", state="closed")
    add(1201, "degraded_changed", 0, degraded=False, reason="", level="normal")
    add(1202, "sample", state="normal", reason="", breaker="closed", host_budget=2048*MiB, rss=310*MiB)
    add(1210, "phase_end", name="speech")
    return E

T = transcribe_base(); write("transcribe.jsonl", T)

# transcribe_segment_repeated: after the migration the CPU run streams segment 1 (" b") again.
S = copy.deepcopy(T)
S.append({"t_us": 2000000 + 59000, "seq": 990, "type": "update", "phase": 0, "client": 0, "job": 12,
          "data": {"kind": "segment", "index": 1, "text": " b", "start_ms": 10000, "end_ms": 30000, "window": 0}})
write("transcribe_segment_repeated.jsonl", S)

# transcribe_segment_lost: the job's record lost the first CPU window's segment (" c"): GetJob's segments_json has
# indices 0, 1, 3 while its text still holds all four.
Lo = copy.deepcopy(T)
f = at(Lo, lambda e: e["type"] == "transcribe_final" and e.get("job") == 12)[0]
f["data"]["segments"] = [s for s in f["data"]["segments"] if s["index"] != 2]
write("transcribe_segment_lost.jsonl", Lo)

# transcribe_not_terminal: job 13 is still running when the phase ends (GetJob after the drain says running).
N = copy.deepcopy(T)
N = [e for e in N if not (e["type"] == "update" and e.get("job") == 13 and e["data"]["kind"] in ("finished", "progress"))]
f = at(N, lambda e: e["type"] == "transcribe_final" and e.get("job") == 13)[0]
f["data"]["state"] = "running"; f["data"]["followed_by"] = "timeout"
write("transcribe_not_terminal.jsonl", N)
