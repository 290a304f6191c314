// tandem-validate runner: faults and the memory schedule (runner_internal.h).
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

// ---------------------------------------------------------------------------------------------------------------
// Faults, memory schedule, equivalence

bool wait_generating(Campaign& c, std::uint64_t wait_ms) {
  const auto until = Clock::now() + std::chrono::milliseconds(wait_ms);
  while (Clock::now() < until && !interrupted()) {
    {
      std::lock_guard lk(c.reg_mu);
      for (const auto& [id, t] : c.reg)
        if (t.phase == c.phase.load() && t.tokens && !t.finished && !t.child) return true;
    }
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

void child_client_fault(Campaign& c, client::Client& ctl, const Fault& f) {
  (void)ctl;
  const std::int32_t id = c.next_child++;
  const std::string key = c.nonce + "-" + std::to_string(c.phase.load()) + "-child" + std::to_string(id);
  const std::string prompt = c.prompt_for(f.prompt, "", "", f.max_tokens, static_cast<std::uint64_t>(id));
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    c.rec("skipped", -1, 0, {{"what", "kill_client"}, {"why", std::string("pipe: ") + std::strerror(errno)}});
    return;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  std::vector<std::string> argv = {c.opts.self_exe, "--child-client", "--bus", "address=" + c.bus.address,
                                   "--prompt", prompt, "--max-tokens", std::to_string(f.max_tokens), "--key", key};
  if (c.bus.kind != client::BusKind::address)
    argv[3] = c.bus.kind == client::BusKind::system ? "system" : "session";
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = 0;
  const std::uint64_t req = c.next_req++;
  c.rec("submit", id, 0, {{"req", req}, {"key", key}, {"prompt", f.prompt}, {"max_tokens", f.max_tokens}, {"child", true}});
  const int rc = posix_spawn(&pid, c.opts.self_exe.c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    c.rec("skipped", -1, 0, {{"what", "kill_client"}, {"why", std::string("spawn: ") + std::strerror(rc)}});
    return;
  }
  std::string buf;
  std::uint64_t job = 0;
  bool tokens = false;
  const auto until = Clock::now() + 20s;
  while (Clock::now() < until && !tokens) {
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char tmp[512];
    const ssize_t n = ::read(fds[0], tmp, sizeof tmp);
    if (n <= 0) break;
    buf.append(tmp, static_cast<std::size_t>(n));
    std::size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      unsigned long long v = 0;
      char route[16] = {0};
      if (std::sscanf(line.c_str(), "submitted %llu %15s", &v, route) >= 1) {
        job = v;
        c.rec("submit_ok", id, job, {{"req", req}, {"key", key}, {"existing", false}, {"route", route}, {"child", true}});
        c.track(job, id, true);
      } else if (line.rfind("tokens", 0) == 0) {
        tokens = true;
      } else if (line.rfind("rejected", 0) == 0) {
        c.rec("submit_rejected", id, 0, {{"req", req}, {"key", key}, {"error", line.substr(9)}, {"child", true}});
      }
    }
  }
  ::kill(pid, SIGKILL);
  int st = 0;
  ::waitpid(pid, &st, 0);
  ::close(fds[0]);
  c.rec("fault", -1, job, {{"kind", "kill_client"}, {"pid", pid}, {"after_tokens", tokens}});
  c.rec("child_killed", id, job, {{"pid", pid}, {"had_tokens", tokens}});
}

void fault_thread(Campaign& c, const Fault& f, Clock::time_point t0) {
  if (!sleep_until(t0 + std::chrono::milliseconds(f.at_ms))) return;
  bool generating = true;
  if (f.when == "generating") generating = wait_generating(c, f.wait_ms);
  auto cl = connect_client(c.bus);
  if (!cl) {
    c.rec("skipped", -1, 0, {{"what", std::string(fault_kind_name(f.kind))}, {"why", cl.error().message}});
    return;
  }
  client::Client& ctl = **cl;
  json d{{"kind", std::string(fault_kind_name(f.kind))}, {"when", f.when}};
  if (f.when == "generating") d["job_generating"] = generating;
  auto note_err = [&](const char* what, const Error& e) {
    c.rec("fault_error", -1, 0, {{"kind", std::string(fault_kind_name(f.kind))}, {"call", what}, {"error", e.message}});
  };
  switch (f.kind) {
    case FaultKind::fail_allocations: {
      d["count"] = f.count;
      d["site"] = f.site;
      c.rec("fault", -1, 0, d);
      if (auto s = ctl.fail_allocations(f.count, f.site); !s) note_err("FailAllocations", s.error());
      break;
    }
    case FaultKind::lose_device: {
      c.rec("fault", -1, 0, d);
      if (auto s = ctl.lose_device(); !s) note_err("LoseDevice", s.error());
      sleep_until(Clock::now() + std::chrono::milliseconds(f.recover_after_ms));
      if (auto s = ctl.recover_device(); !s) note_err("RecoverDevice", s.error());
      c.rec("fault_end", -1, 0, {{"kind", "lose_device"}, {"action", "RecoverDevice"}});
      break;
    }
    case FaultKind::fail_probes: {
      d["count"] = f.count;
      c.rec("fault", -1, 0, d);
      if (auto s = ctl.fail_probes(f.count); !s) note_err("FailProbes", s.error());
      break;
    }
    case FaultKind::cancel_queued: {
      std::uint32_t done = 0;
      const auto until = Clock::now() + std::chrono::milliseconds(f.wait_ms);
      c.rec("fault", -1, 0, d);
      std::set<std::uint64_t> tried;
      while (done < f.count && Clock::now() < until && !interrupted()) {
        std::vector<std::uint64_t> targets;
        {
          std::lock_guard lk(c.reg_mu);
          for (const auto& [id, t] : c.reg)
            if (t.phase == c.phase.load() && t.queued_cpu && !t.started && !t.finished && !tried.count(id))
              targets.push_back(id);
        }
        for (auto id : targets) {
          if (done >= f.count) break;
          tried.insert(id);
          auto r = ctl.cancel(id);
          c.rec("cancel", -1, id, {{"ok", r.ok()}, {"result", r ? *r : r.error().message}});
          if (r && *r == "cancelled") ++done;
        }
        std::this_thread::sleep_for(5ms);
      }
      c.rec("fault_end", -1, 0, {{"kind", "cancel_queued"}, {"cancelled", done}});
      break;
    }
    case FaultKind::kill_client:
      child_client_fault(c, ctl, f);
      break;
    case FaultKind::kill_daemon: {
      if (!c.opts.spawn && c.opts.restart_cmd.empty()) {
        c.rec("skipped", -1, 0, {{"what", "kill_daemon"}, {"why", "attach mode without --restart-cmd"}});
        break;
      }
      c.rec("fault", -1, 0, d);
      auto r = kill_and_restart(c, f.restart);
      if (!r) note_err("restart", r.error());
      break;
    }
    case FaultKind::hold_gpu: {
      auto cookie = ctl.hold_gpu("tandem-validate fault", "io.tandem.Validate");
      if (!cookie) {
        note_err("HoldGpu", cookie.error());
        break;
      }
      d["cookie"] = *cookie;
      c.rec("fault", -1, 0, d);
      sleep_until(Clock::now() + std::chrono::milliseconds(f.duration_ms));
      if (auto s = ctl.release_gpu(*cookie); !s) note_err("ReleaseGpu", s.error());
      c.rec("fault_end", -1, 0, {{"kind", "hold_gpu"}, {"action", "ReleaseGpu"}});
      break;
    }
    case FaultKind::reading_lag: {
      d["lag_ms"] = f.lag_ms;
      c.rec("fault", -1, 0, d);
      if (auto s = ctl.set_reading_lag(f.lag_ms); !s) note_err("SetReadingLag", s.error());
      sleep_until(Clock::now() + std::chrono::milliseconds(f.duration_ms));
      if (auto s = ctl.set_reading_lag(0); !s) note_err("SetReadingLag", s.error());
      c.rec("fault_end", -1, 0, {{"kind", "reading_lag"}});
      break;
    }
  }
}

// On CUDA the Testing knobs are NotSupported: the foreign load is real memory held by tandem-gpu-ballast
// (docs/cuda.md). One ballast process at a time; a new step replaces it.
void set_ballast(Campaign& c, std::uint64_t bytes, std::optional<std::uint64_t> leave) {
  if (c.ballast_pid > 0) {
    stop_child(c.ballast_pid, 5000ms);
    c.ballast_pid = 0;
    c.ballast_bytes = 0;
  }
  if (bytes == 0 && !leave) return;
  if (c.opts.ballast.empty()) {
    c.rec("skipped", -1, 0, {{"what", "memory step"}, {"why", "CUDA accelerator and no tandem-gpu-ballast (--ballast)"}});
    return;
  }
  auto pid = spawn(leave ? std::vector<std::string>{c.opts.ballast, "--leave", std::to_string(std::max<std::uint64_t>(1, *leave))}
                         : std::vector<std::string>{c.opts.ballast, "--bytes", std::to_string(bytes)},
                   c.run_dir + "/ballast.log");
  if (!pid) {
    c.rec("fault_error", -1, 0, {{"kind", "memory_step"}, {"call", "tandem-gpu-ballast"}, {"error", pid.error().message}});
    return;
  }
  c.ballast_pid = *pid;
  c.ballast_bytes = bytes;
}

void memory_thread(Campaign& c, const Phase& ph, Clock::time_point t0) {
  auto cl = connect_client(c.bus);
  if (!cl) {
    c.rec("skipped", -1, 0, {{"what", "memory schedule"}, {"why", cl.error().message}});
    return;
  }
  for (const auto& s : ph.memory) {
    if (!sleep_until(t0 + std::chrono::milliseconds(s.at_ms))) return;
    std::uint64_t foreign = s.foreign_bytes.value_or(0);
    json d;
    if (s.available_bytes) {
      auto st = (*cl)->status();
      if (!st || !st->memory || !st->memory->total) {
        c.rec("skipped", -1, 0, {{"what", "memory step"}, {"why", "the Memory property could not be read"}});
        continue;
      }
      const std::uint64_t total = *st->memory->total;
      const std::uint64_t ours = st->memory->observed_used.value_or(0);
      foreign = total > ours + *s.available_bytes ? total - ours - *s.available_bytes : 0;
      if (c.cuda) {  // other programs hold memory too: lower what is free now to the target
        const std::uint64_t free_now = st->memory->free.value_or(0) + c.ballast_bytes;
        foreign = free_now > *s.available_bytes ? free_now - *s.available_bytes : 0;
      }
      d["available_target"] = *s.available_bytes;
      d["total"] = total;
      d["observed_used"] = ours;
    }
    d["foreign"] = foreign;
    if (!d.contains("observed_used"))  // our bytes on the device as the step begins (time to free)
      if (auto st = (*cl)->status(); st && st->memory && st->memory->observed_used)
        d["observed_used"] = *st->memory->observed_used;
    if (auto cn = (*cl)->counters())  // the residency counters as the step begins (metrics_residency.cc)
      for (const char* k : {"gpu_evictions", "gpu_pressure_evictions", "gpu_restores", "gpu_restore_failures"})
        if (auto it = cn->find(k); it != cn->end()) d[k] = it->second;
    if (c.cuda) {
      d["via"] = "tandem-gpu-ballast";
      c.rec("memory_step", -1, 0, d);
      set_ballast(c, foreign, s.available_bytes);
      continue;
    }
    c.rec("memory_step", -1, 0, d);
    if (auto r = (*cl)->set_foreign_load(foreign); !r)
      c.rec("fault_error", -1, 0, {{"kind", "memory_step"}, {"call", "SetForeignLoad"}, {"error", r.error().message}});
  }
}

// Runs one request to its end on `cl` (greedy); returns the job id (0 when rejected).

}  // namespace tandem::validate::detail
