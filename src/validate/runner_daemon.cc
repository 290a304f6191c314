// tandem-validate runner: --spawn (bus, model, config, tandemd), kill / restart, the monitor (runner_internal.h).
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

Result<std::unique_ptr<client::Client>> connect_client(const client::BusSpec& bus) { return client::Client::connect(bus); }

// Waits until tandemd answers on the bus (or `pid` exited, or the timeout passed).
Status wait_ready(const client::BusSpec& bus, int pid, std::chrono::milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  std::string last = "no answer";
  while (Clock::now() < until) {
    if (pid > 0) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid)
        return fail(Errc::unavailable, "tandemd (pid " + std::to_string(pid) + ") exited during start (status " +
                                           std::to_string(st) + ")");
    }
    auto c = connect_client(bus);
    if (c) {
      auto v = (*c)->version();
      if (v) return {};
      last = v.error().message;
    } else {
      last = c.error().message;
    }
    if (interrupted()) return fail(Errc::cancelled, "interrupted");
    std::this_thread::sleep_for(100ms);
  }
  return fail(Errc::timeout, "tandemd did not answer on " + bus.describe() + " within " +
                                 std::to_string(timeout.count() / 1000) + " s: " + last);
}

int daemon_pid_from_bus(client::Client& c) {
  try {
    auto proxy = sdbus::createProxy(c.connection(), "org.freedesktop.DBus", "/org/freedesktop/DBus");
    std::uint32_t pid = 0;
    proxy->callMethod("GetConnectionUnixProcessID")
        .onInterface("org.freedesktop.DBus")
        .withArguments(std::string(client::kServiceName))
        .storeResultsTo(pid);
    return static_cast<int>(pid);
  } catch (...) {
    return 0;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Spawn mode: private dbus-daemon + tandemd

Status start_bus(Campaign& c) {
  const std::string dbus = find_in_path("dbus-daemon");
  if (dbus.empty()) return fail(Errc::not_found, "dbus-daemon not found in PATH");
  char tmpl[] = "/tmp/tandem-validate.XXXXXX";
  if (!::mkdtemp(tmpl)) return fail(Errc::io_error, std::string("mkdtemp: ") + std::strerror(errno));
  c.bus_dir = tmpl;
  ::chmod(c.bus_dir.c_str(), 0755);
  const std::string sock = c.bus_dir + "/bus.sock";
  const std::string conf = c.bus_dir + "/bus.conf";
  std::string text =
      "<!DOCTYPE busconfig PUBLIC \"-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN\"\n"
      " \"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">\n<busconfig>\n  <type>session</type>\n"
      "  <listen>unix:path=" + sock + "</listen>\n  <auth>EXTERNAL</auth>\n"
      "  <policy context=\"default\">\n    <allow user=\"*\"/>\n    <allow own=\"*\"/>\n"
      "    <allow send_destination=\"*\" eavesdrop=\"true\"/>\n    <allow eavesdrop=\"true\"/>\n  </policy>\n"
      "  <limit name=\"max_incoming_bytes\">1000000000</limit>\n"
      "  <limit name=\"max_outgoing_bytes\">1000000000</limit>\n"
      "  <limit name=\"max_connections_per_user\">1000</limit>\n"
      "</busconfig>\n";
  if (auto s = write_text(conf, text); !s) return s;
  auto pid = spawn({dbus, "--config-file=" + conf, "--nofork", "--nopidfile"}, c.run_dir + "/dbus-daemon.log");
  if (!pid) return fail(pid.error());
  c.bus_pid = *pid;
  for (int i = 0; i < 200 && !exists(sock); ++i) std::this_thread::sleep_for(25ms);
  if (!exists(sock)) return fail(Errc::unavailable, "dbus-daemon did not create " + sock);
  ::chmod(sock.c_str(), 0777);
  c.bus = client::BusSpec{client::BusKind::address, "unix:path=" + sock};
  return {};
}

Status prepare_model(Campaign& c) {
  const DaemonSettings& d = c.sc.daemon;
  if (!d.model_dir.empty()) {
    c.model_dir = d.model_dir;
    if (!exists(c.model_dir + "/config.json"))
      return fail(Errc::not_found, c.sc.file + ": daemon.model_dir " + c.model_dir + " has no config.json");
    return {};
  }
  c.model_dir = c.opts.model_cache.empty() ? "/tmp/tandem-validate-model-" + d.model_preset : c.opts.model_cache;
  if (exists(c.model_dir + "/model.safetensors")) return {};
  if (c.opts.mkmodel.empty()) return fail(Errc::not_found, "tandem-mkmodel not found (give --mkmodel)");
  const std::string tmp = c.model_dir + ".tmp." + std::to_string(::getpid());
  auto pid = spawn({c.opts.mkmodel, "--out", tmp, "--preset", d.model_preset}, c.run_dir + "/mkmodel.log");
  if (!pid) return fail(pid.error());
  int st = 0;
  ::waitpid(*pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    return fail(Errc::io_error, "tandem-mkmodel failed (see " + c.run_dir + "/mkmodel.log)");
  if (std::rename(tmp.c_str(), c.model_dir.c_str()) != 0 && !exists(c.model_dir + "/model.safetensors"))
    return fail(Errc::io_error, "cannot move the model to " + c.model_dir + ": " + std::strerror(errno));
  return {};
}

Status write_daemon_config(Campaign& c) {
  const DaemonSettings& d = c.sc.daemon;
  std::string admin = "root";
  if (const group* g = ::getgrgid(::getgid())) admin = g->gr_name;
  const std::string addr = c.bus.address;
  std::ostringstream o;
  o << "# generated by tandem-validate --spawn for " << c.sc.file << "\n"
    << "[bus]\nkind = \"address\"\naddress = " << quote_toml(addr) << "\n\n"
    << "[auth]\nallow_any_local_user = true\nadmin_group = " << quote_toml(admin) << "\n\n"
    << "[device]\n"
    << (c.opts.cuda ? std::string("kind = \"cuda\"\n")
                    : "kind = \"simulated\"\nsim_capacity = " + quote_toml(d.sim_capacity) + "\n")
    << "poll_interval_ms = 50\nprobe_interval_ms = 300\nprobe_timeout_ms = 500\n";
  if (d.evict_recover_after_ms) o << "recover_after_ms = " << *d.evict_recover_after_ms << "\n";
  if (d.max_pressure_evictions_per_minute)
    o << "max_pressure_evictions_per_minute = " << *d.max_pressure_evictions_per_minute << "\n";
  o << "\n";
  std::vector<std::string> names = {"default"};
  names.insert(names.end(), d.extra_models.begin(), d.extra_models.end());
  for (const auto& n : names)
    o << "[[model]]\nname = " << quote_toml(n) << "\ndir = " << quote_toml(c.model_dir)
      << "\nreplica_mode = \"mmap\"\ncpu_threads = 1\ngpu_threads = 1\n\n";
  if (!d.embedding_preset.empty())
    o << "[[model]]\nname = " << quote_toml(d.embedding_name) << "\ndir = " << quote_toml(c.embedding_dir)
      << "\nreplica_mode = \"mmap\"\ncpu_threads = 1\ngpu_threads = 1\n\n"
      << "[embedding]\ndefault_model = " << quote_toml(d.embedding_name) << "\n\n";
  if (!d.speech_preset.empty())  // one replica on the GPU, one on the CPU (the route a fault or pressure takes)
    o << "[[model]]\nname = " << quote_toml(d.speech_name) << "\ndir = " << quote_toml(c.speech_dir)
      << "\ncpu_threads = 1\ngpu_threads = 1\n\n"
      << "[speech]\ndefault_model = " << quote_toml(d.speech_name) << "\nmax_audio_seconds = 14400\n\n";
  o << "[breaker]\ncooldown_ms = " << d.breaker_cooldown_ms
    << "\nmax_cooldown_ms = " << std::max<std::uint64_t>(5000, d.breaker_cooldown_ms) << "\n\n"
    << "[service]\nrecover_after_ms = " << d.recover_after_ms << "\n\n"
    << "[gpu_queue]\nconcurrency = " << d.gpu_concurrency << "\n\n"
    << "[cpu_queue]\nconcurrency = " << d.cpu_concurrency << "\ncapacity = " << d.cpu_queue_capacity << "\n\n"
    << "[host]\nbudget = " << quote_toml(std::to_string(d.host_budget) + "B") << "\n\n"
    << "[journal]\ndir = " << quote_toml(c.run_dir + "/state") << "\n\n"
    << "[runtime]\ndrain_timeout_ms = 5000\ntoken_flush_interval_ms = 0\nmax_prompt_bytes = 65536\n"
    << "max_jobs_per_client = 256\n";
  if (!d.config_extra.empty()) o << "\n# daemon.config_extra\n" << d.config_extra << "\n";
  c.config_path = c.run_dir + "/tandemd.toml";
  return write_text(c.config_path, o.str());
}

Status start_daemon(Campaign& c) {
  auto pid = spawn({c.opts.tandemd, "--config", c.config_path, "--testing", "--log-stderr"}, c.daemon_log);
  if (!pid) return fail(pid.error());
  c.daemon_pid = *pid;
  return wait_ready(c.bus, *pid, 60s);
}

// kill_daemon: SIGKILL, reap, start again. Returns the new pid (or 0 when not restarted).
Result<int> kill_and_restart(Campaign& c, bool restart) {
  std::lock_guard lk(c.daemon_mu);
  const int pid = c.daemon_pid.load();
  if (pid <= 0) return fail(Errc::not_found, "tandemd's pid is not known");
  if (::kill(pid, SIGKILL) != 0) return fail(Errc::io_error, "kill " + std::to_string(pid) + ": " + std::strerror(errno));
  if (c.opts.spawn) {
    int st = 0;
    ::waitpid(pid, &st, 0);
  } else {
    for (int i = 0; i < 500 && ::kill(pid, 0) == 0; ++i) std::this_thread::sleep_for(10ms);
  }
  c.rec("daemon_killed", -1, 0, {{"pid", pid}});
  c.daemon_pid = 0;
  if (!restart) return 0;
  if (c.opts.spawn) {
    if (auto s = start_daemon(c); !s) return fail(s.error());
  } else {
    auto p = spawn({"/bin/sh", "-c", c.opts.restart_cmd}, "");
    if (!p) return fail(p.error());
    int st = 0;
    ::waitpid(*p, &st, 0);
    if (auto s = wait_ready(c.bus, 0, 60s); !s) return fail(s.error());
    auto cl = connect_client(c.bus);
    if (cl) c.daemon_pid = daemon_pid_from_bus(**cl);
  }
  c.rec("daemon_started", -1, 0, {{"pid", c.daemon_pid.load()}});
  return c.daemon_pid.load();
}

// ---------------------------------------------------------------------------------------------------------------
// Monitor: samples the properties and the daemon's RSS, follows breaker/state/degraded signals.

void monitor_thread(Campaign& c) {
  std::unique_ptr<client::Client> cl;
  auto next_sample = Clock::now();
  while (!c.monitor_stop.load()) {
    if (!cl) {
      auto r = connect_client(c.bus);
      if (!r) {
        std::this_thread::sleep_for(200ms);
        continue;
      }
      cl = std::move(*r);
      (void)cl->subscribe();
      cl->on_properties_change([&c](const client::PropertiesChange& p) {
        if (p.values.gpu_breaker) c.rec("breaker", -1, 0, {{"state", *p.values.gpu_breaker}});
        if (p.values.state)
          c.rec("state_seen", -1, 0, {{"state", *p.values.state}, {"reason", p.values.degraded_reason.value_or("")}});
      });
      cl->on_degraded_change([&c](const client::DegradedChange& d) {
        c.rec("degraded_changed", -1, 0,
              {{"degraded", d.degraded}, {"reason", d.reason}, {"level", d.level.value_or("")},
               {"expected_slowdown", d.expected_slowdown.value_or(0.0)}});
      });
    }
    if (Clock::now() >= next_sample) {
      next_sample = Clock::now() + std::chrono::milliseconds(c.sc.sample_interval_ms);
      auto s = cl->status();
      json d;
      if (s) {
        d["state"] = s->state.value_or("");
        d["reason"] = s->degraded_reason.value_or("");
        d["breaker"] = s->gpu_breaker.value_or("");
        if (s->memory) {
          d["mem_total"] = s->memory->total.value_or(0);
          d["mem_free"] = s->memory->free.value_or(0);
          d["mem_foreign"] = s->memory->foreign.value_or(0);
          d["mem_ours"] = s->memory->observed_used.value_or(0);
          d["headroom"] = s->memory->headroom.value_or(0);
          d["pressure"] = s->memory->pressure.value_or("");
        }
        if (s->host_memory) {
          d["host_budget"] = s->host_memory->budget.value_or(0);
          d["daemon_rss"] = s->host_memory->daemon_rss.value_or(0);
        }
        json qs = json::array();
        if (s->queues)
          for (const auto& q : *s->queues)
            qs.push_back({{"name", q.name}, {"depth", q.depth}, {"running", q.running}, {"oldest_age_ms", q.oldest_age_ms}});
        d["queues"] = qs;
        if (auto cn = cl->counters())  // GPU residency: replicas given back and loaded again (docs/residency.md)
          for (const char* k : {"gpu_evictions", "gpu_pressure_evictions", "gpu_restores", "gpu_restore_failures"})
            if (auto it = cn->find(k); it != cn->end()) d[k] = it->second;
        const int pid = c.daemon_pid.load();
        d["pid"] = pid;
        if (const std::uint64_t rss = proc_rss(pid)) d["rss"] = rss;
        c.rec("sample", -1, 0, d);
      } else {
        c.rec("sample", -1, 0, {{"down", true}, {"error", s.error().message}});
      }
    }
    auto w = cl->process(20ms);
    if (!w) cl.reset();
  }
}

}  // namespace tandem::validate::detail
