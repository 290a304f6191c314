#include "validate/runner.h"

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

#include "validate/events.h"
#include "validate/metrics.h"
#include "validate/report.h"
#include "validate/transport.h"

extern char** environ;

namespace tandem::validate {

namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::atomic<bool> g_stop{false};

void say(bool quiet, const std::string& s) {
  if (!quiet) {
    std::fprintf(stderr, "%s\n", s.c_str());
    std::fflush(stderr);
  }
}

bool exists(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0;
}

Status mkdir_p(const std::string& path) {
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
      return fail(Errc::io_error, cur + ": mkdir: " + std::strerror(errno));
  }
  return {};
}

bool interrupted() {
  if (g_stop.load()) return true;
  const int fd = client::interrupt_fd();
  if (fd >= 0) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & POLLIN)) {
      auto sigs = client::take_interrupts();
      if (!sigs.empty()) g_stop = true;
    }
  }
  return g_stop.load();
}

// Sleeps until `until`, in small steps so an interrupt ends it. Returns false when interrupted.
bool sleep_until(Clock::time_point until) {
  while (Clock::now() < until) {
    if (interrupted()) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(20ms, until - Clock::now()));
  }
  return !interrupted();
}

std::string find_in_path(const std::string& name) {
  if (name.find('/') != std::string::npos) return exists(name) ? name : "";
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    const std::string p = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// posix_spawn with stdout/stderr to `log` (appended) or inherited, stdin from /dev/null.
Result<pid_t> spawn(const std::vector<std::string>& argv, const std::string& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  if (!log.empty()) {
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
  }
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&at, &none);
  sigset_t dfl;
  sigemptyset(&dfl);
  sigaddset(&dfl, SIGINT);
  sigaddset(&dfl, SIGTERM);
  sigaddset(&dfl, SIGHUP);
  sigaddset(&dfl, SIGPIPE);
  posix_spawnattr_setsigdefault(&at, &dfl);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0].c_str(), &fa, &at, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  if (rc != 0) return fail(Errc::io_error, "cannot start " + argv[0] + ": " + std::strerror(rc));
  return pid;
}

// Stops a child: SIGTERM, up to `grace`, then SIGKILL; reaps it.
void stop_child(pid_t pid, std::chrono::milliseconds grace) {
  if (pid <= 0) return;
  ::kill(pid, SIGTERM);
  const auto until = Clock::now() + grace;
  while (Clock::now() < until) {
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) return;
    std::this_thread::sleep_for(20ms);
  }
  ::kill(pid, SIGKILL);
  int st = 0;
  ::waitpid(pid, &st, 0);
}

std::uint64_t proc_rss(int pid) {
  if (pid <= 0) return 0;
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) {
      std::uint64_t kb = 0;
      std::sscanf(line.c_str() + 6, "%lu", &kb);
      return kb * 1024;
    }
  return 0;
}

std::string quote_toml(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o + "\"";
}

std::string hex_nonce() {
  std::random_device rd;
  std::uint64_t v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^ static_cast<std::uint64_t>(::getpid());
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016lx", static_cast<unsigned long>(v));
  return std::string(buf, 8);
}

std::string error_name(Transport& t, const Error& e) {
  auto le = t.last_error();
  if (le) return le->short_name();
  return std::string(errc_name(e.code));
}

json job_final_json(const client::JobInfo& j) {
  json d;
  d["state"] = j.state.value_or("");
  if (j.error_code) d["error_code"] = *j.error_code;
  if (j.reason) d["reason"] = *j.reason;
  if (j.finish_reason) d["finish_reason"] = *j.finish_reason;
  d["routes"] = j.routes.value_or(std::vector<std::string>{});
  d["tokens"] = j.tokens.value_or(std::vector<std::int32_t>{});
  d["attempts"] = j.attempts.value_or(0);
  std::vector<std::string> hist;
  if (j.history)
    for (const auto& h : *j.history) hist.push_back(h.to);
  d["history"] = hist;
  if (j.idempotency_key) d["key"] = *j.idempotency_key;
  if (j.side_effects) d["side_effects"] = *j.side_effects;
  if (j.degraded) d["degraded"] = *j.degraded;
  return d;
}

json update_json(const client::JobUpdate& u) {
  json d;
  d["kind"] = u.kind;
  if (u.route) d["route"] = *u.route;
  if (u.reason) d["reason"] = *u.reason;
  if (u.degraded) d["degraded"] = *u.degraded;
  if (u.queue) d["queue"] = *u.queue;
  if (u.queue_position) d["queue_position"] = *u.queue_position;
  if (u.attempt) d["attempt"] = *u.attempt;
  if (u.step) d["step"] = *u.step;
  if (u.tokens) d["tokens"] = *u.tokens;
  if (u.from) d["from"] = *u.from;
  if (u.to) d["to"] = *u.to;
  if (u.tokens_delivered) d["tokens_delivered"] = *u.tokens_delivered;
  if (u.state) d["state"] = *u.state;
  if (u.error_code) d["error_code"] = *u.error_code;
  if (u.finish_reason) d["finish_reason"] = *u.finish_reason;
  if (u.tokens_total) d["tokens_total"] = *u.tokens_total;
  return d;
}

const char* kShortPrompts[] = {
    "Once upon a time in a small village",
    "Tell me about the weather",
    "The quick brown fox",
    "Write a short poem about the sea",
    "What is the capital of France?",
    "List three colors",
    "Explain how a bicycle works",
    "A story about a cat and a dog",
};
const char* kWords[] = {"the", "of", "and", "to", "in", "is", "it", "that", "was", "for", "on", "are", "with", "as"};

// ---------------------------------------------------------------------------------------------------------------

struct Tracked {
  std::int32_t phase = -1;
  std::int32_t client = -1;
  bool queued_cpu = false;
  bool started = false;
  bool tokens = false;
  bool finished = false;
  bool child = false;
};

struct Campaign {
  RunnerOptions opts;
  Scenario sc;
  std::string out;
  std::string nonce;
  client::BusSpec bus;
  EventLog log;
  std::atomic<int> daemon_pid{0};
  std::atomic<std::int32_t> phase{-1};
  std::atomic<std::uint64_t> next_req{1};
  std::atomic<std::int32_t> next_child{1000};
  std::map<std::string, std::uint32_t> max_context;  // model -> context
  std::mutex reg_mu;
  std::map<std::uint64_t, Tracked> reg;
  std::mutex daemon_mu;  // serializes kill/restart
  // spawn mode
  std::string bus_dir, run_dir, config_path, daemon_log, model_dir;
  pid_t bus_pid = 0;
  std::atomic<bool> monitor_stop{false};
  bool cuda = false;          // the accelerator is real: memory steps go to the ballast program
  pid_t ballast_pid = 0;
  std::uint64_t ballast_bytes = 0;

  Event rec(const std::string& type, std::int32_t client, std::uint64_t job, json data = json::object()) {
    return log.record(type, phase.load(), client, job, std::move(data));
  }
  void track(std::uint64_t job, std::int32_t client, bool child = false) {
    std::lock_guard lk(reg_mu);
    Tracked& t = reg[job];
    t.phase = phase.load();
    t.client = client;
    t.child = child;
  }

  std::string prompt_for(const std::string& kind, const std::string& text, const std::string& model,
                         std::uint32_t max_tokens, std::uint64_t n) const {
    if (kind == "text") return text;
    if (kind == "short") return kShortPrompts[n % (sizeof kShortPrompts / sizeof *kShortPrompts)];
    auto it = max_context.find(model.empty() ? "default" : model);
    const std::uint32_t ctx = it != max_context.end() && it->second > 0 ? it->second : 1024;
    const std::int64_t words = static_cast<std::int64_t>(ctx) - static_cast<std::int64_t>(max_tokens) - 12;
    std::string p = "Summarize:";
    for (std::int64_t i = 0; i < std::max<std::int64_t>(8, words); ++i)
      p += std::string(" ") + kWords[(static_cast<std::size_t>(i) + n) % (sizeof kWords / sizeof *kWords)];
    return p;
  }
};

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
    << "[device]\nkind = \"simulated\"\nsim_capacity = " << quote_toml(d.sim_capacity)
    << "\npoll_interval_ms = 50\nprobe_interval_ms = 300\nprobe_timeout_ms = 500\n\n";
  std::vector<std::string> names = {"default"};
  names.insert(names.end(), d.extra_models.begin(), d.extra_models.end());
  for (const auto& n : names)
    o << "[[model]]\nname = " << quote_toml(n) << "\ndir = " << quote_toml(c.model_dir)
      << "\nreplica_mode = \"mmap\"\ncpu_threads = 1\ngpu_threads = 1\n\n";
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

// ---------------------------------------------------------------------------------------------------------------
// Workload clients

struct Mine {
  std::uint64_t job = 0;
  client::Request req;
  std::string key;
  bool done = false;
  std::string state, error_code;
  Clock::time_point last_activity;
  bool followups_done = false;
};

class Worker {
 public:
  Worker(Campaign& c, const Phase& ph, const Workload& w, std::int32_t id, std::uint32_t index_in_workload)
      : c_(c), ph_(ph), w_(w), id_(id), idx_(index_in_workload) {}

  void run(Clock::time_point phase_t0) {
    auto t = make_transport(w_.transport, c_.bus);
    if (!t) {
      c_.rec("client_error", id_, 0, {{"error", t.error().message}});
      return;
    }
    tr_ = std::move(*t);
    tr_->on_update = [this](const client::JobUpdate& u) { on_update(u); };
    tr_->on_degraded = [this](const client::DegradedChange& d) {
      c_.rec("degraded_changed", id_, 0, {{"degraded", d.degraded}, {"reason", d.reason}, {"level", d.level.value_or("")}});
    };
    if (auto s = tr_->subscribe(); !s) c_.rec("client_error", id_, 0, {{"error", s.error().message}});
    if (auto s = tr_->status(); s && s->state)
      c_.rec("state_seen", id_, 0, {{"state", *s->state}, {"reason", s->degraded_reason.value_or("")}});
    if (!sleep_until(phase_t0 + std::chrono::milliseconds(w_.start_ms))) return;
    std::uint32_t sent = 0;
    while (sent < w_.requests && !interrupted()) {
      const std::uint32_t n = std::min(w_.burst, w_.requests - sent);
      for (std::uint32_t i = 0; i < n; ++i) submit_new(sent + i);
      sent += n;
      wait_all();
      if (w_.interval_ms > 0 && !sleep_until(Clock::now() + std::chrono::milliseconds(w_.interval_ms))) break;
    }
  }

 private:
  void on_update(const client::JobUpdate& u) {
    c_.rec("update", id_, u.job_id, update_json(u));
    {
      std::lock_guard lk(c_.reg_mu);
      auto it = c_.reg.find(u.job_id);
      if (it != c_.reg.end()) {
        Tracked& t = it->second;
        if (u.kind == "routed") t.queued_cpu = u.queue && *u.queue == "cpu", t.started = false;
        if (u.kind == "started") t.started = true;
        if (u.kind == "tokens") t.tokens = true;
        if (u.kind == "finished") t.finished = true;
      }
    }
    for (auto& m : mine_)
      if (m.job == u.job_id) {
        m.last_activity = Clock::now();
        if (u.kind == "finished") {
          m.done = true;
          m.state = u.state.value_or("");
          m.error_code = u.error_code.value_or("");
        }
      }
  }

  client::Request build(std::uint32_t n) {
    client::Request r;
    const std::uint64_t global = static_cast<std::uint64_t>(idx_) * 100000 + n;
    if (!w_.models.empty()) r.model = w_.models[global % w_.models.size()];
    r.prompt = c_.prompt_for(w_.prompt, w_.prompt_text, r.model, w_.max_tokens, global);
    r.options.max_tokens = w_.max_tokens;
    r.options.temperature = w_.temperature;
    r.options.seed = w_.seed.value_or(1000 + global);
    if (w_.side_effects) r.options.side_effects = true;
    if (!w_.allow_cpu) r.options.allow_cpu = false;
    if (w_.idempotency_keys)
      r.options.idempotency_key = c_.nonce + "-" + ph_.name + "-" + w_.name + "-c" + std::to_string(idx_) + "-r" +
                                  std::to_string(n);
    return r;
  }

  json submit_data(std::uint64_t req, const client::Request& r, const std::string& key) {
    return {{"req", req},
            {"key", key},
            {"model", r.model},
            {"prompt", w_.prompt},
            {"prompt_bytes", r.prompt.size()},
            {"max_tokens", w_.max_tokens},
            {"temperature", w_.temperature},
            {"side_effects", w_.side_effects},
            {"workload", w_.name}};
  }

  // Returns the job id, or 0 when rejected.
  std::uint64_t do_submit(const client::Request& r, bool track_new) {
    const std::uint64_t req = c_.next_req++;
    const std::string key = r.options.idempotency_key.value_or("");
    c_.rec("submit", id_, 0, submit_data(req, r, key));
    auto res = tr_->submit(r);
    if (!res) {
      auto le = tr_->last_error();
      json d{{"req", req}, {"key", key}, {"error", error_name(*tr_, res.error())}, {"message", res.error().message}};
      if (le && le->retry_after_ms) d["retry_after_ms"] = *le->retry_after_ms;
      c_.rec("submit_rejected", id_, 0, d);
      return 0;
    }
    const auto& p = res->placement;
    c_.rec("submit_ok", id_, res->job_id,
           {{"req", req}, {"key", key}, {"existing", p.existing.value_or(false)}, {"route", p.route.value_or("")},
            {"action", p.action.value_or("")}, {"queue", p.queue.value_or("")}, {"degraded", p.degraded.value_or(false)},
            {"reason", p.reason.value_or("")}, {"side_effects", w_.side_effects}});
    if (track_new && !p.existing.value_or(false)) {
      c_.track(res->job_id, id_);
      std::lock_guard lk(c_.reg_mu);
      c_.reg[res->job_id].queued_cpu = p.queue.value_or("") == "cpu" && p.state.value_or("") == "queued";
    }
    return res->job_id;
  }

  void submit_new(std::uint32_t n) {
    Mine m;
    m.req = build(n);
    m.key = m.req.options.idempotency_key.value_or("");
    m.job = do_submit(m.req, true);
    m.last_activity = Clock::now();
    if (m.job == 0) return;
    mine_.push_back(std::move(m));
  }

  void followups(Mine& m) {
    if (m.followups_done) return;
    m.followups_done = true;
    if (w_.resubmit) do_submit(m.req, false);
    if (w_.resume_failed && m.state == "failed" && m.error_code == "Resumable") {
      const std::uint64_t req = c_.next_req++;
      c_.rec("submit", id_, 0, submit_data(req, m.req, m.key));
      auto res = tr_->resume(m.job, {});
      if (!res) {
        c_.rec("submit_rejected", id_, 0,
               {{"req", req}, {"key", m.key}, {"resume", true}, {"error", error_name(*tr_, res.error())},
                {"message", res.error().message}});
        return;
      }
      c_.rec("resume_ok", id_, res->job_id,
             {{"req", req}, {"key", m.key}, {"from_job", m.job}, {"existing", res->placement.existing.value_or(false)},
              {"route", res->placement.route.value_or("")}, {"side_effects", w_.side_effects}});
      if (!res->placement.existing.value_or(false)) {
        c_.track(res->job_id, id_);
        Mine r;
        r.job = res->job_id;
        r.req = m.req;
        r.key = m.key;
        r.followups_done = true;  // one Resume per chain
        r.last_activity = Clock::now();
        pending_.push_back(std::move(r));
      }
    }
  }

  void wait_all() {
    const auto until = Clock::now() + std::chrono::milliseconds(ph_.drain_timeout_ms);
    while (Clock::now() < until && !interrupted()) {
      bool all = true;
      for (auto& m : mine_) {
        if (m.done) {
          followups(m);
          continue;
        }
        all = false;
        if (Clock::now() - m.last_activity > 1000ms) {  // silence: GetJob is the truth (missed signal, restart)
          m.last_activity = Clock::now();
          auto j = tr_->get_job(m.job);
          if (j && j->state && client::is_terminal_state(*j->state)) {
            c_.rec("job_poll", id_, m.job, {{"state", *j->state}, {"error_code", j->error_code.value_or("")}});
            m.done = true;
            m.state = *j->state;
            m.error_code = j->error_code.value_or("");
          }
        }
      }
      for (auto& p : pending_) mine_.push_back(std::move(p));
      pending_.clear();
      if (all) {
        bool fresh = false;
        for (auto& m : mine_) fresh = fresh || !m.done;
        if (!fresh) break;
      }
      if (auto s = tr_->poll(50ms); !s) {
        c_.rec("client_error", id_, 0, {{"error", s.error().message}});
        std::this_thread::sleep_for(200ms);
        auto t = make_transport(w_.transport, c_.bus);  // the connection is gone: reconnect (jobs are followed by GetJob)
        if (t) {
          tr_ = std::move(*t);
          tr_->on_update = [this](const client::JobUpdate& u) { on_update(u); };
          tr_->on_degraded = [this](const client::DegradedChange& d) {
            c_.rec("degraded_changed", id_, 0,
                    {{"degraded", d.degraded}, {"reason", d.reason}, {"level", d.level.value_or("")}});
          };
          (void)tr_->subscribe();
          if (auto s = tr_->status(); s && s->state)  // a new connection: what it knows starts here
            c_.rec("state_seen", id_, 0, {{"state", *s->state}, {"reason", s->degraded_reason.value_or("")}});
        }
      }
    }
    mine_.clear();
  }

  Campaign& c_;
  const Phase& ph_;
  const Workload& w_;
  std::int32_t id_;
  std::uint32_t idx_;
  std::unique_ptr<Transport> tr_;
  std::vector<Mine> mine_, pending_;
};

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
// (docs/cuda.md). One ballast process at a time; a new step replaces it. Not verified on a GPU (docs/validate.md).
void set_ballast(Campaign& c, std::uint64_t bytes) {
  if (c.ballast_pid > 0) {
    stop_child(c.ballast_pid, 5000ms);
    c.ballast_pid = 0;
    c.ballast_bytes = 0;
  }
  if (bytes == 0) return;
  if (c.opts.ballast.empty()) {
    c.rec("skipped", -1, 0, {{"what", "memory step"}, {"why", "CUDA accelerator and no tandem-gpu-ballast (--ballast)"}});
    return;
  }
  auto pid = spawn({c.opts.ballast, "--bytes", std::to_string(bytes)}, c.run_dir + "/ballast.log");
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
    if (c.cuda) {
      d["via"] = "tandem-gpu-ballast";
      c.rec("memory_step", -1, 0, d);
      set_ballast(c, foreign);
      continue;
    }
    c.rec("memory_step", -1, 0, d);
    if (auto r = (*cl)->set_foreign_load(foreign); !r)
      c.rec("fault_error", -1, 0, {{"kind", "memory_step"}, {"call", "SetForeignLoad"}, {"error", r.error().message}});
  }
}

// Runs one request to its end on `cl` (greedy); returns the job id (0 when rejected).
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
  c.rec("submit_ok", id, res->job_id, {{"req", req}, {"key", key}, {"existing", p.existing.value_or(false)},
                                       {"route", p.route.value_or("")}, {"queue", p.queue.value_or("")},
                                       {"degraded", p.degraded.value_or(false)}, {"equiv", group}});
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
    const std::uint64_t g = run_one(c, cl, id, req, group, ph.drain_timeout_ms);
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
  std::vector<std::unique_ptr<Worker>> workers;
  std::int32_t next_id = 0;
  for (const auto& w : ph.workloads)
    for (std::uint32_t k = 0; k < w.clients; ++k)
      workers.push_back(std::make_unique<Worker>(c, ph, w, next_id++, static_cast<std::uint32_t>(workers.size())));
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

// ---------------------------------------------------------------------------------------------------------------
// Campaign files

Result<std::vector<Event>> load_dir_events(const std::string& dir) {
  std::vector<std::string> files;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.rfind("phase-", 0) == 0 && exists(dir + "/" + n + "/events.jsonl")) files.push_back(dir + "/" + n + "/events.jsonl");
    }
    ::closedir(d);
  } else {
    return fail(Errc::io_error, dir + ": cannot open: " + std::strerror(errno));
  }
  std::sort(files.begin(), files.end());
  std::vector<Event> all;
  for (const auto& f : files) {
    auto ev = read_events(f);
    if (!ev) return fail(ev.error());
    all.insert(all.end(), ev->begin(), ev->end());
  }
  std::stable_sort(all.begin(), all.end(), [](const Event& a, const Event& b) {
    return a.t_us != b.t_us ? a.t_us < b.t_us : a.seq < b.seq;
  });
  return all;
}

int finish_report(const std::string& out, const std::vector<Event>& all, const std::string& name,
                  const std::string& file, const std::string& mode, bool quiet) {
  ReportInput in;
  in.scenario_name = name;
  in.scenario_file = file;
  in.mode = mode;
  in.events = all;
  in.phases = compute_phases(all);
  in.overall = compute_metrics(all);
  in.verdict = judge(in.overall, in.phases);
  if (!out.empty()) {
    if (auto s = write_report(out, in); !s) {
      std::fprintf(stderr, "tandem-validate: %s\n", s.error().message.c_str());
      return kExitRuntime;
    }
  }
  const Metrics& m = in.overall;
  std::printf("tandem-validate: %s: %zu phases, %lu accepted, %lu completed, %lu failed-resumable, %lu cancelled, "
              "%lu rejected, %zu lost, %zu duplicates, peak RSS %lu MiB / budget %lu MiB\n",
              name.c_str(), in.phases.size(), static_cast<unsigned long>(m.accepted),
              static_cast<unsigned long>(m.completed), static_cast<unsigned long>(m.resumable_failed),
              static_cast<unsigned long>(m.cancelled), static_cast<unsigned long>(m.rejected), m.lost.size(),
              m.duplicates.size(), static_cast<unsigned long>(m.peak_rss >> 20),
              static_cast<unsigned long>(m.host_budget >> 20));
  for (const auto& r : in.verdict.rules)
    std::printf("%s %s: %s\n", r.pass ? "pass" : "FAIL", r.rule.c_str(), r.detail.c_str());
  std::printf("verdict: %s%s\n", in.verdict.pass ? "PASS" : "FAIL",
              out.empty() ? "" : (" (report: " + out + "/report.md)").c_str());
  std::fflush(stdout);
  (void)quiet;
  return in.verdict.pass ? kExitPass : kExitVerdictFailed;
}

void cleanup(Campaign& c) {
  c.monitor_stop = true;
  if (c.ballast_pid > 0) stop_child(c.ballast_pid, 5000ms);
  if (c.opts.spawn) {
    stop_child(c.daemon_pid.load(), 15000ms);
    c.daemon_pid = 0;
    stop_child(c.bus_pid, 2000ms);
    if (!c.bus_dir.empty()) {
      std::remove((c.bus_dir + "/bus.sock").c_str());
      std::remove((c.bus_dir + "/bus.conf").c_str());
      ::rmdir(c.bus_dir.c_str());
    }
  }
}

}  // namespace

int run_campaign(const RunnerOptions& opts) {
  try {
    Campaign c;
    c.opts = opts;
    c.out = opts.out_dir;
    std::set<std::string> done_names;
    std::string scenario_path = opts.scenario_path;
    if (opts.resume) {
      std::ifstream f(c.out + "/campaign.json");
      json st = json::parse(f, nullptr, false);
      if (st.is_discarded() || !st.is_object()) {
        std::fprintf(stderr, "tandem-validate: --resume-from %s: no readable campaign.json there\n", c.out.c_str());
        return kExitUsage;
      }
      if (scenario_path.empty()) scenario_path = st.value("scenario_file", "");
      c.nonce = st.value("nonce", hex_nonce());
      for (const auto& n : st.value("completed", json::array())) done_names.insert(n.get<std::string>());
    }
    {
      std::error_code ec;
      auto abs = std::filesystem::absolute(scenario_path, ec);  // campaign.json must work from another directory
      if (!ec) scenario_path = abs.lexically_normal().string();
    }
    auto sc = load_scenario(scenario_path);
    if (!sc) {
      std::fprintf(stderr, "tandem-validate: %s\n", sc.error().message.c_str());
      return kExitUsage;
    }
    c.sc = std::move(*sc);
    if (c.nonce.empty()) c.nonce = hex_nonce();
    if (auto s = mkdir_p(c.out); !s) {
      std::fprintf(stderr, "tandem-validate: %s\n", s.error().message.c_str());
      return kExitRuntime;
    }
    if (!opts.resume) {  // a fresh campaign in a used directory: old phases and the old journal go
      std::error_code ec;
      if (std::filesystem::exists(c.out + "/campaign.json", ec)) {
        for (const auto& e : std::filesystem::directory_iterator(c.out, ec))
          if (e.path().filename().string().rfind("phase-", 0) == 0) std::filesystem::remove_all(e.path(), ec);
        std::filesystem::remove_all(c.out + "/run/state", ec);
        std::filesystem::remove_all(c.out + "/charts", ec);
        for (const char* f : {"report.md", "report.json", "events.jsonl"}) std::filesystem::remove(c.out + "/" + f, ec);
      }
    }
    c.run_dir = c.out + "/run";
    c.daemon_log = c.run_dir + "/tandemd.log";
    (void)mkdir_p(c.run_dir);
    auto save_state = [&]() {
      json st{{"scenario_file", c.sc.file}, {"scenario", c.sc.name}, {"nonce", c.nonce},
              {"mode", opts.spawn ? "spawn" : "attach"}, {"completed", std::vector<std::string>(done_names.begin(), done_names.end())}};
      return write_text(c.out + "/campaign.json", st.dump(2) + "\n");
    };
    if (auto s = save_state(); !s) {
      std::fprintf(stderr, "tandem-validate: %s\n", s.error().message.c_str());
      return kExitRuntime;
    }
    if (opts.spawn) {
      if (find_in_path("dbus-daemon").empty()) {
        std::fprintf(stderr, "tandem-validate: --spawn needs dbus-daemon in PATH; skipping (exit 77)\n");
        return kExitSkip;
      }
      auto fail_rt = [&](const Error& e) {
        std::fprintf(stderr, "tandem-validate: %s\n", e.message.c_str());
        cleanup(c);
        return kExitRuntime;
      };
      if (auto s = prepare_model(c); !s) return fail_rt(s.error());
      if (auto s = start_bus(c); !s) return fail_rt(s.error());
      if (auto s = write_daemon_config(c); !s) return fail_rt(s.error());
      say(opts.quiet, "tandem-validate: starting tandemd (" + opts.tandemd + ") on " + c.bus.describe() + ", log " + c.daemon_log);
      if (auto s = start_daemon(c); !s) return fail_rt(s.error());
    } else {
      c.bus = opts.bus;
      if (auto s = wait_ready(c.bus, 0, 10s); !s) {
        std::fprintf(stderr, "tandem-validate: %s\n", s.error().message.c_str());
        return kExitRuntime;
      }
      c.daemon_pid = opts.daemon_pid;
      if (c.daemon_pid == 0)
        if (auto cl = connect_client(c.bus)) c.daemon_pid = daemon_pid_from_bus(**cl);
    }
    if (auto cl = connect_client(c.bus)) {
      if (auto models = (*cl)->list_models())
        for (const auto& m : *models) c.max_context[m.name.value_or("")] = m.max_context.value_or(0);
      if (auto st = (*cl)->status(); st && st->memory && st->memory->device && st->memory->device->rfind("cuda", 0) == 0) {
        c.cuda = true;
        say(opts.quiet, "tandem-validate: the accelerator is '" + *st->memory->device +
                            "': Testing faults are NotSupported there; memory steps run " +
                            (opts.ballast.empty() ? std::string("nowhere (no tandem-gpu-ballast found)") : opts.ballast));
      }
    }
    std::thread monitor([&c] { monitor_thread(c); });
    int rc = kExitPass;
    for (std::size_t i = 0; i < c.sc.phases.size(); ++i) {
      const Phase& ph = c.sc.phases[i];
      if (done_names.count(ph.name)) continue;
      if (interrupted()) {
        rc = kExitInterrupted;
        break;
      }
      const std::string dir = phase_dir(c, i);
      (void)mkdir_p(dir);
      std::remove((dir + "/events.jsonl").c_str());
      if (auto s = c.log.open(dir + "/events.jsonl"); !s) {
        std::fprintf(stderr, "tandem-validate: %s\n", s.error().message.c_str());
        rc = kExitRuntime;
        break;
      }
      say(opts.quiet, "tandem-validate: phase " + std::to_string(i + 1) + "/" + std::to_string(c.sc.phases.size()) + " " + ph.name);
      PhaseResult pr = run_phase(c, i);
      c.log.close();
      c.log.clear();
      if (interrupted()) {
        rc = kExitInterrupted;
        break;
      }
      if (auto s = write_phase(dir, pr); !s) {
        std::fprintf(stderr, "tandem-validate: %s\n", s.error().message.c_str());
        rc = kExitRuntime;
        break;
      }
      done_names.insert(ph.name);
      (void)save_state();
      const Metrics& m = pr.metrics;
      say(opts.quiet, "  " + ph.name + ": accepted " + std::to_string(m.accepted) + ", completed " + std::to_string(m.completed) +
                          ", failed-resumable " + std::to_string(m.resumable_failed) + ", cancelled " +
                          std::to_string(m.cancelled) + ", rejected " + std::to_string(m.rejected) + ", lost " +
                          std::to_string(m.lost.size()) + ", duplicates " + std::to_string(m.duplicates.size()) +
                          (pr.unmet.empty() ? "" : ", UNMET: " + pr.unmet.front()) + " -> " + dir + "/summary.md");
      if (opts.pause && i + 1 < c.sc.phases.size()) {
        std::fprintf(stderr, "phase %zu written to %s; press Enter for the next phase (Ctrl-D stops; --resume-from %s continues)\n",
                     i + 1, dir.c_str(), c.out.c_str());
        std::string line;
        if (!std::getline(std::cin, line)) {
          rc = kExitInterrupted;
          break;
        }
      }
    }
    cleanup(c);
    monitor.join();
    if (rc != kExitPass) {
      std::fprintf(stderr, "tandem-validate: stopped; phases done so far are in %s (continue with --resume-from %s)\n",
                   c.out.c_str(), c.out.c_str());
      return rc;
    }
    auto all = load_dir_events(c.out);
    if (!all) {
      std::fprintf(stderr, "tandem-validate: %s\n", all.error().message.c_str());
      return kExitRuntime;
    }
    (void)write_events(c.out + "/events.jsonl", *all);
    return finish_report(c.out, *all, c.sc.name, c.sc.file, opts.spawn ? "spawn" : "attach", opts.quiet);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-validate: internal error: %s\n", e.what());
    return kExitRuntime;
  }
}

int analyze(const std::string& input, const std::string& out_dir, bool quiet) {
  try {
    struct stat st{};
    if (::stat(input.c_str(), &st) != 0) {
      std::fprintf(stderr, "tandem-validate: --analyze %s: %s\n", input.c_str(), std::strerror(errno));
      return kExitUsage;
    }
    Result<std::vector<Event>> ev = S_ISDIR(st.st_mode) ? load_dir_events(input) : read_events(input);
    if (!ev) {
      std::fprintf(stderr, "tandem-validate: %s\n", ev.error().message.c_str());
      return kExitUsage;
    }
    if (!out_dir.empty())
      if (auto s = mkdir_p(out_dir); !s) {
        std::fprintf(stderr, "tandem-validate: %s\n", s.error().message.c_str());
        return kExitRuntime;
      }
    return finish_report(out_dir, *ev, input, input, "analyze", quiet);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-validate: internal error: %s\n", e.what());
    return kExitRuntime;
  }
}

int run_child_client(const client::BusSpec& bus, const std::string& prompt, std::uint32_t max_tokens,
                     const std::string& key) {
  auto cl = client::Client::connect(bus);
  if (!cl) {
    std::printf("rejected connect: %s\n", cl.error().message.c_str());
    return kExitRuntime;
  }
  if (auto s = (*cl)->subscribe(); !s) return kExitRuntime;
  client::Request r;
  r.prompt = prompt;
  r.options.max_tokens = max_tokens;
  r.options.temperature = 0.0;
  r.options.seed = 99;
  if (!key.empty()) r.options.idempotency_key = key;
  auto res = (*cl)->submit(r);
  if (!res) {
    std::printf("rejected %s\n", (*cl)->last_error() ? (*cl)->last_error()->short_name().c_str() : "error");
    std::fflush(stdout);
    return kExitRuntime;
  }
  std::printf("submitted %lu %s\n", static_cast<unsigned long>(res->job_id), res->placement.route.value_or("?").c_str());
  std::fflush(stdout);
  std::uint64_t n = 0;
  for (;;) {
    for (const auto& u : (*cl)->take_job_updates(res->job_id)) {
      if (u.kind == "tokens" && u.tokens) {
        n += u.tokens->size();
        std::printf("tokens %lu\n", static_cast<unsigned long>(n));
        std::fflush(stdout);
      }
      if (u.kind == "finished") {
        std::printf("finished %s\n", u.state.value_or("?").c_str());
        return kExitPass;
      }
    }
    if (!(*cl)->process(100ms)) return kExitRuntime;
  }
}

}  // namespace tandem::validate
