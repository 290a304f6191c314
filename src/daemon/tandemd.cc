// tandemd: the failover inference daemon. One event loop (poll over the D-Bus fd, a timer, a signal pipe and the
// workers' wake-up eventfd) drives the Service; route workers run the engine. See docs/daemon.md.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "core/process_heap.h"
#include "daemon/config.h"
#include "daemon/dbus_server.h"
#include "daemon/engine_backend.h"
#include "daemon/log.h"
#include "daemon/service.h"
#include "device/simulated.h"
#if defined(TANDEM_HAVE_CUDA)
#include "device/cuda.h"
#endif

using namespace tandem;
using namespace tandem::daemon;
using namespace std::chrono_literals;

namespace {

int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  (void)!write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

// A real handler for each (not just a mask): OpenBLAS starts threads before main, and a signal delivered to one of
// them would take the default action (TOOLCHAIN.md, "SIGTERM trap").
bool install_signals() {
  if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return false;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int s : {SIGTERM, SIGINT, SIGHUP})
    if (sigaction(s, &sa, nullptr) != 0) return false;
  signal(SIGPIPE, SIG_IGN);
  // Threads started from here on (workers, the signal thread) block these signals; one thread takes them with
  // sigwait. So a blocking sd-bus call on the loop thread is never interrupted (EINTR would lose its reply), and
  // threads started before main (OpenBLAS) still reach the pipe through the handler above.
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&set, s);
  if (pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) return false;
  std::thread([set] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) == 0) on_signal(sig);
    }
  }).detach();
  return true;
}

void usage(FILE* f) {
  std::fprintf(f,
               "usage: tandemd [--config PATH] [--dropin-dir DIR] [--check-config] [--testing]\n"
               "               [--bus system|session|ADDRESS] [--state-dir DIR] [--log-level LEVEL] [--log-stderr]\n"
               "  --config PATH      main configuration file (default /etc/tandem/tandemd.toml)\n"
               "  --dropin-dir DIR   drop-in directory (default: tandemd.d next to the config file)\n"
               "  --check-config     validate, print the effective configuration, exit (0 valid, 1 invalid)\n"
               "  --testing          expose io.tandem.Tandem1.Testing (fault injection; admin only)\n"
               "  --bus B            override [bus]: system, session, or a D-Bus address (unix:path=...)\n"
               "  --state-dir DIR    override [journal] dir\n"
               "  --log-level L      trace|debug|info|warn|error (default info)\n"
               "  --log-stderr       log to stderr even under systemd\n");
}

std::shared_ptr<device::Device> make_accelerator(const DeviceConfig& d, std::string& why) {
  switch (d.kind) {
    case AccelKind::none: return nullptr;
    case AccelKind::simulated: {
      device::SimulatedConfig sc;
      sc.capacity_bytes = d.sim_capacity_bytes;
      sc.reading_lag = d.sim_reading_lag;
      return std::make_shared<device::SimulatedDevice>(sc, std::make_shared<SteadyClock>());
    }
    case AccelKind::cuda:
    case AccelKind::auto_detect: {
#if defined(TANDEM_HAVE_CUDA)
      auto dev = device::CudaDevice::open(d.cuda_index, std::make_shared<SteadyClock>());
      if (dev) return *dev;
      why = dev.error().message;
#else
      why = "this build has no CUDA runtime";
#endif
      return nullptr;
    }
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path = "/etc/tandem/tandemd.toml", dropin, bus_override, state_override, level = "info";
  bool check_only = false, testing = false, log_stderr = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tandemd: %s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--config") config_path = value("--config");
    else if (a == "--dropin-dir") dropin = value("--dropin-dir");
    else if (a == "--check-config") check_only = true;
    else if (a == "--testing") testing = true;
    else if (a == "--bus") bus_override = value("--bus");
    else if (a == "--state-dir") state_override = value("--state-dir");
    else if (a == "--log-level") level = value("--log-level");
    else if (a == "--log-stderr") log_stderr = true;
    else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "tandemd: unknown argument '%s'\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  if (level != "trace" && level != "debug" && level != "info" && level != "warn" && level != "error") {
    std::fprintf(stderr, "tandemd: --log-level must be trace, debug, info, warn or error\n");
    return 2;
  }

  auto loaded = load_config(config_path, dropin);
  if (!loaded) {
    std::fprintf(stderr, "tandemd: invalid configuration: %s\n", loaded.error().message.c_str());
    return 1;
  }
  DaemonConfig cfg = std::move(loaded).value();
  if (!bus_override.empty()) {
    if (bus_override == "system") cfg.bus.kind = BusKind::system;
    else if (bus_override == "session") cfg.bus.kind = BusKind::session;
    else {
      cfg.bus.kind = BusKind::address;
      cfg.bus.address = bus_override;
    }
  }
  if (!state_override.empty()) cfg.journal.dir = state_override;
  if (check_only) {
    std::fputs(render_config(cfg).c_str(), stdout);
    std::fprintf(stderr, "tandemd: configuration is valid (%zu file(s))\n", cfg.sources.size());
    return 0;
  }

  log::init(log_stderr ? log::Target::stderr_only : log::Target::auto_detect, level);
  // Before the models load: a forward's activations stay mapped from one forward to the next (core/process_heap.h);
  // the loop below gives the free heap back once the daemon has been idle for a few seconds.
  if (auto st = core::keep_heap(); !st) log::warn("the heap keeps glibc's defaults: {}", st.error().message);
  if (!install_signals()) {
    log::error("cannot install signal handlers: {}", std::strerror(errno));
    return 1;
  }
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    log::error("eventfd: {}", std::strerror(errno));
    return 1;
  }
  sd_notifyf(0, "STATUS=loading models (%zu)", cfg.models.size());

  std::string accel_why;
  auto accel = make_accelerator(cfg.device, accel_why);
  if (!accel && cfg.device.kind == AccelKind::cuda) {
    log::error("[device] kind = cuda but no CUDA device: {}", accel_why);
    return 1;
  }
  if (accel) log::info("accelerator: {} ({})", accel->name(), device::kind_name(accel->kind()));
  else log::info("no accelerator ({}): every job runs on the CPU", cfg.device.kind == AccelKind::none ? "configured" : accel_why);

  const auto extend = [](const std::string& what) {
    sd_notifyf(0, "EXTEND_TIMEOUT_USEC=%llu\nSTATUS=%s", 120ull * 1000000ull, what.c_str());
    log::info("{}", what);
  };
  auto backend = EngineBackend::create(cfg, accel, extend);
  if (!backend) {
    log::error("loading models failed: {}", backend.error().message);
    sd_notifyf(0, "STATUS=failed: %s", backend.error().message.c_str());
    return 1;
  }

  auto server = DbusServer::connect(cfg.bus);
  if (!server) {
    log::error("{}", server.error().message);
    return 1;
  }
  auto wake = [wake_fd] {
    const std::uint64_t one = 1;
    (void)!write(wake_fd, &one, sizeof one);
  };
  auto service = Service::create(cfg, *backend, std::make_shared<SteadyClock>(), server->get(), wake);
  if (!service) {
    log::error("starting the service failed: {}", service.error().message);
    return 1;
  }
  const auto& rs = (*service)->replay_stats();
  log::info("journal {}/journal: {} jobs, {} records, {} corrupt, torn tail {} bytes, {} recovered as failed-resumable",
            cfg.journal.dir, rs.jobs, rs.records, rs.corrupt_records, rs.torn_tail_bytes, rs.recovered_nonterminal);
  RingHub rings(service->get(), cfg.rings);
  if (auto st = (*server)->serve(service->get(), cfg, testing, &rings); !st) {
    log::error("{}", st.error().message);
    return 1;
  }
  log::info("serving {} on the {} bus{}", cfg.bus.name, bus_kind_name(cfg.bus.kind), testing ? " (testing interface on)" : "");

  Service& svc = **service;
  DbusServer& bus = **server;
  // Group commit: accepts and outcomes written during one loop iteration share one fdatasync (svc.commit() below);
  // nothing about a job leaves the process before the commit that covers it (docs/journal.md).
  // --testing only: TANDEM_TESTING_GROUP_COMMIT=0 turns it off (a sync per accept and per outcome, as before it;
  // bench/ring/run.sh GROUP_COMMIT=false measures the difference), TANDEM_TESTING_CRASH_AT_COMMIT=n (it_restart.sh).
  const char* group = testing ? std::getenv("TANDEM_TESTING_GROUP_COMMIT") : nullptr;
  svc.set_group_commit(group == nullptr || std::string(group) != "0");
  if (const char* crash = std::getenv("TANDEM_TESTING_CRASH_AT_COMMIT"); crash != nullptr && testing)
    svc.testing_crash_at_commit(static_cast<std::uint32_t>(std::strtoul(crash, nullptr, 10)));
  std::uint64_t watchdog_usec = 0;
  const bool watchdog = sd_watchdog_enabled(0, &watchdog_usec) > 0 && watchdog_usec > 0;
  sd_notifyf(0, "READY=1\nSTATUS=%s", svc.status_line().c_str());

  using SteadyTime = std::chrono::steady_clock;
  auto next_tick = SteadyTime::now();
  auto last_tick = next_tick;
  auto next_status = SteadyTime::now();
  auto next_watchdog = SteadyTime::now();
  std::string last_status;
  // The STATUS= line only changes when something happened (a call, a worker event, ring traffic, a tick): it is
  // recomputed (at most every status_interval) only then, so an idle daemon has no status timer (docs/daemon.md).
  bool status_dirty = true;
  bool draining = false;
  bool bus_ok = true;
  SteadyTime::time_point drain_deadline{}, hard_deadline{};
  int exit_code = 0;

  auto next_flush = SteadyTime::now();
  core::HeapReleaser heap_releaser(3s);  // idle (no job running) this long: the free heap goes back
  bool activity = false;
  auto next_extend = SteadyTime::now();
  // Ring sessions: after ring activity the loop busy-polls for up to [rings] max_spin_us (an active client's next
  // submission is taken without a wake-up); otherwise it sleeps with every session's doorbell in the poll set.
  auto last_ring_activity = SteadyTime::time_point{};
  // Signals are read at the top of every iteration, before the bus: a SIGTERM that arrived before a call is read
  // drains first, so the call is refused (Unavailable) rather than accepted into a stopping daemon.
  auto handle_signals = [&] {
    unsigned char sig = 0;
    while (read(g_signal_pipe[0], &sig, 1) == 1) {
      if (sig == SIGHUP) {
        auto re = load_config(config_path, dropin);
        if (!re) {
          log::error("SIGHUP: configuration not reloaded: {}", re.error().message);
          continue;
        }
        const auto st = svc.reload(*re);
        bus.reload_auth(re->auth, re->rings);
        if (st)
          log::info("SIGHUP: configuration reloaded (policy knobs, limits, authorization, the [[model]] list; [bus] and [device] need a restart)");
        else
          log::warn("SIGHUP: authorization and request limits reloaded; policy knobs kept: {}", st.error().message);
      } else if (!draining) {
        draining = true;
        sd_notify(0, "STOPPING=1\nSTATUS=draining");
        log::info("signal {}: draining (timeout {} ms)", static_cast<int>(sig), cfg.runtime.drain_timeout.count());
        svc.begin_drain();
        drain_deadline = SteadyTime::now() + cfg.runtime.drain_timeout;
        hard_deadline = drain_deadline + 20s;
      } else {
        log::warn("second signal: stopping running jobs now (they end failed-resumable)");
        svc.abort_running();
      }
    }
  };
  std::vector<pollfd> fds;
  for (;;) {
    handle_signals();
    if (bus_ok) bus.process();
    if (rings.any_sessions() && rings.process()) last_ring_activity = SteadyTime::now();
    if (rings.take_changed()) bus.properties_changed({"Rings"});
    const auto now = SteadyTime::now();
    // One PropertiesChanged per batch, at most every 50 ms (token bursts do not turn into property storms).
    if (now >= next_flush) {
      svc.flush_changes();
      next_flush = now + 50ms;
    }
    // Idle, the timer runs at [device] idle_poll_interval_ms; the first call or event that makes the service busy
    // brings the next tick forward to poll_interval_ms.
    next_tick = std::min(next_tick, last_tick + svc.poll_interval());
    if (now >= next_tick) {
      svc.tick();
      svc.flush_changes();
      last_tick = now;
      next_tick = now + svc.poll_interval();
      status_dirty = true;
      if (heap_releaser.due(svc.drained(), now)) {
        const core::HeapFigures before = core::heap_figures();
        const bool released = core::release_heap();
        log::debug("idle: heap given back (released {}; {} MiB free in the arenas, {} MiB in use)", released,
                   before.free >> 20, before.in_use >> 20);
      }
    }
    if (now >= next_status && status_dirty) {
      status_dirty = false;
      auto line = svc.status_line();
      if (line != last_status) {
        sd_notifyf(0, "STATUS=%s", line.c_str());
        last_status = line;
      }
      next_status = now + cfg.runtime.status_interval;
    }
    if (watchdog && now >= next_watchdog) {
      sd_notify(0, "WATCHDOG=1");
      next_watchdog = now + std::chrono::microseconds(watchdog_usec / 2);
    }
    if (draining) {
      if (svc.drained()) break;
      if (now >= hard_deadline) {
        // A run that does not stop (a long prefill, a hung driver call): leave anyway. Every accepted job is in the
        // journal; the ones still running recover as failed-resumable at the next start.
        log::error("drain: running jobs did not stop in time; exiting with them in flight (they recover on restart)");
        svc.sync_journal();
        std::_Exit(1);
      }
      if (now >= next_extend && now < hard_deadline) {  // keep systemd informed, up to the hard deadline
        sd_notifyf(0, "EXTEND_TIMEOUT_USEC=%llu", 15ull * 1000000ull);
        next_extend = now + 5s;
      }
      if (now >= drain_deadline) {
        svc.abort_running();
        drain_deadline = now + 10s;  // the engine stops within a token; then the jobs end resumable
      }
    }

    // All ready input of this iteration was handled (bus calls, the ring drain, the workers' events of the last
    // poll, the tick): one journal commit for it, then the acknowledgements, held updates and dispatches it covers.
    (void)svc.commit();  // a failure is logged and answered to each waiting caller by the service

    sdbus::IConnection::PollData pd{};
    pd.fd = -1;
    pd.timeout_usec = UINT64_MAX;
    if (bus_ok) {
      try {
        pd = bus.poll_data();
      } catch (const std::exception& e) {
        // The bus went away (dbus-daemon restarted): nothing can reach us. Stop like SIGTERM, exit non-zero so
        // Restart=on-failure brings us back on the new bus.
        log::error("lost the D-Bus connection ({}): draining and exiting", e.what());
        bus_ok = false;
        exit_code = 1;
        if (!draining) {
          draining = true;
          sd_notify(0, "STOPPING=1\nSTATUS=lost the bus");
          svc.begin_drain();
          drain_deadline = SteadyTime::now() + cfg.runtime.drain_timeout;
          hard_deadline = drain_deadline + 20s;
        }
        continue;
      }
    }
    auto wait_until = status_dirty ? std::min(next_tick, next_status) : next_tick;
    if (activity) wait_until = std::min(wait_until, next_flush);  // publish what that activity changed
    if (watchdog) wait_until = std::min(wait_until, next_watchdog);
    if (draining) wait_until = std::min(wait_until, SteadyTime::now() + 100ms);
    auto timeout_ms = std::chrono::duration_cast<std::chrono::milliseconds>(wait_until - SteadyTime::now()).count();
    if (pd.timeout_usec != UINT64_MAX) {
      // sd-bus reports an absolute CLOCK_MONOTONIC deadline in µs.
      timespec ts{};
      clock_gettime(CLOCK_MONOTONIC, &ts);
      const std::uint64_t mono = static_cast<std::uint64_t>(ts.tv_sec) * 1000000ull + static_cast<std::uint64_t>(ts.tv_nsec) / 1000ull;
      const auto bus_ms = pd.timeout_usec > mono ? static_cast<long long>((pd.timeout_usec - mono + 999) / 1000) : 0LL;
      timeout_ms = std::min<long long>(timeout_ms, bus_ms);
    }
    timeout_ms = std::max<long long>(0, timeout_ms);
    if (svc.commit_pending()) timeout_ms = 0;  // the commit's pump journaled more: commit it before sleeping
    fds.assign({{pd.fd, static_cast<short>(pd.events), 0}, {g_signal_pipe[0], POLLIN, 0}, {wake_fd, POLLIN, 0}});
    bool ring_sleep = false;
    if (rings.any_sessions()) {
      if (SteadyTime::now() - last_ring_activity < rings.spin_budget()) {
        timeout_ms = 0;  // spinning
      } else if (timeout_ms > 0) {
        ring_sleep = rings.prepare_sleep();
        if (!ring_sleep) timeout_ms = 0;  // a submission arrived meanwhile
        for (int fd : rings.fds()) fds.push_back({fd, POLLIN, 0});
      }
    }
    const long long cap_ms =
        std::max<long long>(1000, std::chrono::duration_cast<std::chrono::milliseconds>(svc.poll_interval()).count());
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(timeout_ms, cap_ms)));
    if (ring_sleep) rings.finish_sleep();
    activity = n > 0;
    if (activity || SteadyTime::now() - last_ring_activity < rings.spin_budget()) status_dirty = true;
    if (n < 0 && errno != EINTR) {
      log::error("poll: {}", std::strerror(errno));
      exit_code = 1;
      break;
    }
    if (fds[2].revents & POLLIN) {
      std::uint64_t v;
      (void)!read(wake_fd, &v, sizeof v);
      svc.process_events();
    }
  }
  // Let the last finished-updates go out, then leave the bus.
  svc.process_events();
  rings.process();
  (void)svc.commit();
  rings.close_all("tandemd is stopping");
  if (bus_ok) {
    bus.process();
    svc.flush_changes();
    bus.process();
    bus.release_name();
  }
  log::info("stopped: {}", svc.status_line());
  return exit_code;
}
