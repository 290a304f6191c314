// tandem-validate runner: processes, files, interrupts, JSON of jobs and updates (runner_internal.h).
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

extern char** environ;

namespace tandem::validate::detail {

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
  // transcription jobs (audio / segment / progress / finished)
  if (u.seconds) d["seconds"] = *u.seconds;
  if (u.windows_total) d["windows_total"] = *u.windows_total;
  if (u.windows_done) d["windows_done"] = *u.windows_done;
  if (u.window) d["window"] = *u.window;
  if (u.index) d["index"] = *u.index;
  if (u.segments) d["segments"] = *u.segments;
  if (u.start_ms) d["start_ms"] = *u.start_ms;
  if (u.end_ms) d["end_ms"] = *u.end_ms;
  if (u.audio_ms) d["audio_ms"] = *u.audio_ms;
  if (u.language) d["language"] = *u.language;
  if (u.kind == "segment") d["text"] = u.text.value_or("");
  return d;
}

const char* kShortPrompts[8] = {
    "Once upon a time in a small village",
    "Tell me about the weather",
    "The quick brown fox",
    "Write a short poem about the sea",
    "What is the capital of France?",
    "List three colors",
    "Explain how a bicycle works",
    "A story about a cat and a dog",
};
const char* kWords[14] = {"the", "of", "and", "to", "in", "is", "it", "that", "was", "for", "on", "are", "with", "as"};

}  // namespace tandem::validate::detail
