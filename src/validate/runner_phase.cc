// tandem-validate runner: one phase — clients, equivalence runs, drain, settle, results (runner_internal.h).
#include "validate/report.h"
#include "validate/runner_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <filesystem>
#include <sstream>
#include <thread>

namespace tandem::validate::detail {

std::uint64_t run_one(Campaign& c, client::Client& cl, std::int32_t id, const client::Request& r, const std::string& group,
                      std::uint64_t timeout_ms) {
  const std::uint64_t req = c.next_req++;
  const std::string key = r.options.idempotency_key.value_or("");
  c.rec("submit", id, 0, {{"req", req}, {"key", key}, {"prompt", "equivalence"}, {"max_tokens", *r.options.max_tokens},
                          {"temperature", 0.0}, {"equiv", group}});
  auto res = cl.submit(r);
  if (!res) {
    c.rec("submit_rejected", id, 0, {{"req", req}, {"key", key}, {"error", cl.last_error() ? cl.last_error()->short_name() : "error"},
                                     {"message", res.error().message}});
    return 0;
  }
  const auto& p = res->placement;
  json ok{{"req", req}, {"key", key}, {"existing", p.existing.value_or(false)}, {"route", p.route.value_or("")},
          {"queue", p.queue.value_or("")}, {"degraded", p.degraded.value_or(false)}, {"equiv", group}};
  if (p.eta_ms) ok["eta_ms"] = *p.eta_ms;
  c.rec("submit_ok", id, res->job_id, ok);
  c.track(res->job_id, id);
  const auto until = Clock::now() + std::chrono::milliseconds(timeout_ms);
  auto last = Clock::now();
  while (Clock::now() < until && !interrupted()) {
    bool done = false;
    for (const auto& u : cl.take_job_updates(res->job_id)) {
      last = Clock::now();
      if (u.kind == "finished") done = true;
    }
    if (done) break;
    if (Clock::now() - last > 1000ms) {
      last = Clock::now();
      auto j = cl.get_job(res->job_id);
      if (j && j->state && client::is_terminal_state(*j->state)) break;
    }
    (void)cl.process(50ms);
  }
  return res->job_id;
}

void equivalence_thread(Campaign& c, const Phase& ph, std::int32_t id) {
  auto r = connect_client(c.bus);
  if (!r) {
    c.rec("skipped", id, 0, {{"what", "equivalence"}, {"why", r.error().message}});
    return;
  }
  client::Client& cl = **r;
  (void)cl.subscribe();
  cl.on_job_update([&c, id](const client::JobUpdate& u) { c.rec("update", id, u.job_id, update_json(u)); });
  cl.on_degraded_change([&c, id](const client::DegradedChange& d) {
    c.rec("degraded_changed", id, 0, {{"degraded", d.degraded}, {"reason", d.reason}, {"level", d.level.value_or("")}});
  });
  if (auto s = cl.status(); s && s->state)
    c.rec("state_seen", id, 0, {{"state", *s->state}, {"reason", s->degraded_reason.value_or("")}});
  for (std::uint32_t i = 0; i < ph.equivalence.prompts && !interrupted(); ++i) {
    const std::string group = ph.name + "-eq" + std::to_string(i);
    client::Request req;
    req.prompt = kShortPrompts[i % (sizeof kShortPrompts / sizeof *kShortPrompts)];
    req.options.max_tokens = ph.equivalence.max_tokens;
    req.options.temperature = 0.0;
    req.options.seed = 7 + i;
    req.options.idempotency_key = c.nonce + "-" + group + "-gpu";
    // The GPU run of the pair must run there: after the previous pair's hold the GPU replica is loading back
    // (docs/residency.md), and a job free to take the CPU would start there when that finishes sooner.
    req.options.allow_cpu = false;
    const std::uint64_t g = run_one(c, cl, id, req, group, ph.drain_timeout_ms);
    req.options.allow_cpu.reset();
    auto cookie = cl.hold_gpu("tandem-validate equivalence (CPU run)", "io.tandem.Validate");
    if (!cookie) {
      c.rec("skipped", id, 0, {{"what", "equivalence CPU run"}, {"why", "HoldGpu: " + cookie.error().message}});
      continue;
    }
    c.rec("fault", id, 0, {{"kind", "hold_gpu"}, {"cookie", *cookie}, {"for", "equivalence"}});
    req.options.idempotency_key = c.nonce + "-" + group + "-cpu";
    const std::uint64_t k = run_one(c, cl, id, req, group, ph.drain_timeout_ms);
    if (auto s = cl.release_gpu(*cookie); !s)
      c.rec("fault_error", id, 0, {{"kind", "hold_gpu"}, {"call", "ReleaseGpu"}, {"error", s.error().message}});
    c.rec("fault_end", id, 0, {{"kind", "hold_gpu"}, {"action", "ReleaseGpu"}});
    if (g && k) c.rec("equiv_pair", id, 0, {{"group", group}, {"gpu_job", g}, {"cpu_job", k}});
  }
}

// After the workload: GetJob for every job of the phase until each is terminal (or the drain timeout).
void drain(Campaign& c, const Phase& ph) {
  std::vector<std::uint64_t> ids;
  {
    std::lock_guard lk(c.reg_mu);
    for (const auto& [id, t] : c.reg)
      if (t.phase == c.phase.load()) ids.push_back(id);
  }
  std::map<std::uint64_t, json> last;
  std::set<std::uint64_t> waiting(ids.begin(), ids.end());
  const auto until = Clock::now() + std::chrono::milliseconds(ph.drain_timeout_ms);
  std::unique_ptr<client::Client> cl;
  while (!waiting.empty()) {
    if (!cl) {
      auto r = connect_client(c.bus);
      if (r) cl = std::move(*r);
    }
    if (cl)
      for (auto it = waiting.begin(); it != waiting.end();) {
        auto j = cl->get_job(*it);
        if (j) {
          last[*it] = job_final_json(*j);
          if (j->state && client::is_terminal_state(*j->state)) {
            it = waiting.erase(it);
            continue;
          }
        } else {
          last[*it] = {{"state", ""}, {"error", (cl->last_error() ? cl->last_error()->short_name() + ": " : "") +
                                                     j.error().message}};
        }
        ++it;
      }
    if (waiting.empty() || Clock::now() >= until || interrupted()) break;
    std::this_thread::sleep_for(100ms);
  }
  for (auto id : ids) c.rec("job_final", -1, id, last.count(id) ? last[id] : json{{"state", ""}, {"error", "no answer"}});
}

// Between phases: undo the knobs, then optionally wait for breaker closed + State normal.
void reset_and_settle(Campaign& c, const Phase& ph) {
  auto cl = connect_client(c.bus);
  if (!cl) return;
  bool mem = !ph.memory.empty(), lag = false;
  for (const auto& f : ph.faults) lag = lag || f.kind == FaultKind::reading_lag;
  if (mem && c.cuda) set_ballast(c, 0);
  if (mem && !c.cuda) (void)(*cl)->set_foreign_load(0);
  if (lag) (void)(*cl)->set_reading_lag(0);
  // Injected failures the phase did not use up are disarmed: they must not hit the next phase's jobs.
  for (const auto& f : ph.faults) {
    if (f.kind == FaultKind::fail_allocations) {
      auto s = (*cl)->fail_allocations(0, f.site);
      c.rec(s ? "fault_end" : "fault_error", -1, 0,
            {{"kind", "fail_allocations"}, {"site", f.site}, {"action", "disarmed"}, {"error", s ? "" : s.error().message}});
    } else if (f.kind == FaultKind::fail_probes) {
      auto s = (*cl)->fail_probes(0);
      c.rec(s ? "fault_end" : "fault_error", -1, 0,
            {{"kind", "fail_probes"}, {"action", "disarmed"}, {"error", s ? "" : s.error().message}});
    }
  }
  if (ph.settle_ms == 0) return;
  const auto until = Clock::now() + std::chrono::milliseconds(ph.settle_ms);
  while (Clock::now() < until && !interrupted()) {
    auto s = (*cl)->status();
    if (s && s->gpu_breaker.value_or("") == "closed" && s->state.value_or("") == "normal") {
      c.rec("settled", -1, 0, {{"state", "normal"}, {"breaker", "closed"}});
      return;
    }
    std::this_thread::sleep_for(100ms);
  }
  c.rec("settle_timeout", -1, 0, {{"settle_ms", ph.settle_ms}});
}

json expect_json(const Expect& x) {
  json j = json::object();
  if (x.min_completed) j["min_completed"] = *x.min_completed;
  if (x.min_cpu_routed) j["min_cpu_routed"] = *x.min_cpu_routed;
  if (x.min_migrated) j["min_migrated"] = *x.min_migrated;
  if (x.min_retried) j["min_retried"] = *x.min_retried;
  if (x.min_cancelled) j["min_cancelled"] = *x.min_cancelled;
  if (x.min_resumable_failed) j["min_resumable_failed"] = *x.min_resumable_failed;
  if (x.min_rejected) j["min_rejected"] = *x.min_rejected;
  if (x.breaker_cycle) j["breaker_cycle"] = *x.breaker_cycle;
  if (x.min_equivalence_rate) j["min_equivalence_rate"] = *x.min_equivalence_rate;
  if (x.degraded_seen) j["degraded_seen"] = *x.degraded_seen;
  if (x.min_embed_ok) j["min_embed_ok"] = *x.min_embed_ok;
  if (x.min_embed_gpu) j["min_embed_gpu"] = *x.min_embed_gpu;
  if (x.min_embed_cpu) j["min_embed_cpu"] = *x.min_embed_cpu;
  if (x.min_transcribe_ok) j["min_transcribe_ok"] = *x.min_transcribe_ok;
  if (x.min_transcribe_gpu) j["min_transcribe_gpu"] = *x.min_transcribe_gpu;
  if (x.min_transcribe_cpu) j["min_transcribe_cpu"] = *x.min_transcribe_cpu;
  if (x.min_transcribe_migrated) j["min_transcribe_migrated"] = *x.min_transcribe_migrated;
  if (x.min_pressure_evictions) j["min_pressure_evictions"] = *x.min_pressure_evictions;
  if (x.min_gpu_restores) j["min_gpu_restores"] = *x.min_gpu_restores;
  if (x.max_pressure_evictions) j["max_pressure_evictions"] = *x.max_pressure_evictions;
  if (x.restored_by_end) j["restored_by_end"] = *x.restored_by_end;
  if (x.max_eta_p90_error) j["max_eta_p90_error"] = *x.max_eta_p90_error;
  if (x.min_eta_jobs) j["min_eta_jobs"] = *x.min_eta_jobs;
  return j;
}

std::string phase_dir(const Campaign& c, std::size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "phase-%02zu-", i + 1);
  return c.out + "/" + buf + c.sc.phases[i].name;
}

PhaseResult run_phase(Campaign& c, std::size_t i) {
  const Phase& ph = c.sc.phases[i];
  c.phase = static_cast<std::int32_t>(i);
  const auto t0 = Clock::now();
  c.rec("phase_start", -1, 0, {{"name", ph.name}, {"index", i}, {"expect", expect_json(ph.expect)}});
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<WorkloadClient>> workers;
  std::int32_t next_id = 0;
  for (const auto& w : ph.workloads)
    for (std::uint32_t k = 0; k < w.clients; ++k)
      workers.push_back(make_workload_client(c, ph, w, next_id++, static_cast<std::uint32_t>(workers.size())));
  for (auto& w : workers) threads.emplace_back([&w, t0] { w->run(t0); });
  if (!ph.memory.empty()) threads.emplace_back([&c, &ph, t0] { memory_thread(c, ph, t0); });
  for (const auto& f : ph.faults) threads.emplace_back([&c, &f, t0] { fault_thread(c, f, t0); });
  for (auto& t : threads) t.join();
  // Equivalence after the workload: its GPU hold would otherwise send the workload's jobs to the CPU too.
  if (ph.equivalence.prompts > 0 && !interrupted()) equivalence_thread(c, ph, next_id++);
  sleep_until(t0 + std::chrono::milliseconds(ph.duration_ms));
  drain(c, ph);
  reset_and_settle(c, ph);
  c.rec("phase_end", -1, 0, {{"name", ph.name}});
  auto results = compute_phases(c.log.phase_events(static_cast<std::int32_t>(i)));
  PhaseResult pr = results.empty() ? PhaseResult{} : results.front();
  pr.name = ph.name;
  pr.index = static_cast<std::int32_t>(i);
  return pr;
}

}  // namespace tandem::validate::detail
