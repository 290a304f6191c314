// tandemctl: the command-line client of tandemd (docs/tandemctl.md). Torch-free: src/client + sdbus-c++ only.
//
// Exit codes: 0 ok/completed, 1 usage (bad flags or values), 2 job failed, 3 job cancelled (also Ctrl-C),
// 4 bus or daemon error (cannot connect, tandemd not running, an error reply, a timeout).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "cli_args.h"
#include "client/client.h"
#include "client/ring_session.h"
#include "client/format.h"

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "unknown"
#endif

namespace tc = tandem::client;
using nlohmann::json;
using tandem::cli::ArgError;
using SteadyTime = std::chrono::steady_clock::time_point;

namespace {

enum Exit : int { kOk = 0, kUsage = 1, kFailed = 2, kCancelled = 3, kBusError = 4 };

constexpr const char* kUsageText =
    R"(usage: tandemctl [--system|--session|--address ADDR] [--name NAME] [--json] COMMAND [ARGS]

Commands:
  status                         service state, degraded reason, breaker, memory, queues, limits, holds
  watch [--count N] [--timeout S]
                                 one line per property change / degraded-mode change, until Ctrl-C
  run [OPTIONS] PROMPT           submit a job and stream its text (PROMPT "-" reads stdin)
  resume JOB [OPTIONS]           resume a failed job from its checkpoint and stream it
  plan [OPTIONS] PROMPT          the admission decision a submit would get now (changes nothing)
  cancel JOB                     cancel a job
  job JOB                        a job's state, route history, text so far, error and checkpoint
  policy                         show the runtime policy
  policy set KEY=VALUE...        change policy keys (admin)
  hold [--app-id ID] [--for S] REASON
                                 keep new work off the GPU until Ctrl-C (or S seconds); prints the cookie
  release COOKIE                 release a GPU hold
  models [NAME] [--details]      configured models (--details / NAME: replicas, placement, template)
  testing foreign-load BYTES | fail-alloc N SITE | fail-probes N | lose-device | recover-device |
          reading-lag MS | counters
                                 fault injection (tandemd must run with testing enabled)

Job options (run, resume, plan):
  --model M  --max-tokens N  --temperature T  --top-k K  --top-p P  --repetition-penalty R  --seed S
  --stop STR (repeatable)  --key IDEMPOTENCY_KEY  --side-effects  --no-cpu  --allow-reduce  --allow-fallback
  --deadline MS  --prefill-chunk N  --chat  --system-prompt TEXT
  run/resume only: --timeout S (give up: cancel the job, exit 4)  --detach (print the job id and exit)

Global: --system (default, or TANDEM_BUS=system|session|address=ADDR), --session, --address ADDR,
  --name NAME (tandemd's bus name, default io.tandem.Tandem1), --json (machine-readable output), --help, --version
Sizes take units (6GiB, 512MiB); durations take ms, s, min, h (plain numbers: seconds for --timeout/--for, ms
otherwise). Exit codes: 0 ok, 1 usage, 2 job failed, 3 cancelled, 4 bus/daemon error.
)";

struct Global {
  tc::BusSpec bus;
  std::string service = tc::kServiceName;
  bool json = false;

  // "tandemctl --session" etc., for commands printed ready to paste.
  std::string prefix() const {
    std::string p = "tandemctl";
    if (!(bus == tc::BusSpec{})) p += " " + bus.flag();
    if (service != tc::kServiceName) p += " --name " + service;
    return p;
  }
};

std::int64_t now_unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void out_json(const json& j) {
  std::string s = dump(j);
  s += '\n';
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

// {"event": name, ...rest}
json with_event(const char* name, const json& rest) {
  json j = {{"event", name}};
  j.update(rest);
  return j;
}

void out_text(std::string_view s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

void err_line(std::string_view s) {
  std::string l(s);
  if (l.empty() || l.back() != '\n') l += '\n';
  std::fwrite(l.data(), 1, l.size(), stderr);
  std::fflush(stderr);
}

// A usage error: message on stderr, exit 1.
int usage_error(const std::string& msg) {
  err_line("tandemctl: " + msg);
  err_line("Try 'tandemctl --help'.");
  return kUsage;
}

json error_json(const tandem::Error& e, const std::optional<tc::RemoteError>& re) {
  json j = {{"code", std::string(tandem::errc_name(e.code))}, {"message", e.message}};
  if (re) {
    j["name"] = re->name;
    if (re->retry_after_ms) j["retry_after_ms"] = *re->retry_after_ms;
    if (re->job) j["job"] = *re->job;
    if (re->tokens) j["tokens"] = *re->tokens;
    if (!re->facts.empty()) j["facts"] = re->facts;
  }
  return j;
}

// A bus/daemon error: message on stderr (and a JSON document on stdout with --json), exit 4.
int bus_error(const Global& g, const tandem::Error& e, const std::optional<tc::RemoteError>& re = std::nullopt) {
  err_line("tandemctl: " + e.message);
  if (re && re->retry_after_ms && re->name.ends_with(".Resumable") == false)
    err_line("tandemctl: the daemon suggests retrying in " + tc::format_duration_ms(*re->retry_after_ms));
  if (g.json) out_json({{"event", "error"}, {"error", error_json(e, re)}});
  return kBusError;
}

// Walks the arguments of a subcommand.
class ArgList {
 public:
  explicit ArgList(std::vector<std::string> args) : args_(std::move(args)) {}
  bool done() const { return i_ >= args_.size(); }
  std::string next() { return args_[i_++]; }
  std::string value(const std::string& flag) {
    if (done()) throw ArgError{flag + " needs a value"};
    return next();
  }

 private:
  std::vector<std::string> args_;
  std::size_t i_ = 0;
};

std::uint64_t parse_u64(const std::string& flag, const std::string& v) {
  return tandem::cli::parse_number<std::uint64_t>(flag, v, 0, UINT64_MAX);
}

std::uint64_t parse_job_id(const std::string& v) {
  return tandem::cli::parse_number<std::uint64_t>("JOB", v, 0, UINT64_MAX);
}

double parse_double(const std::string& flag, const std::string& v, double lo, double hi) {
  double d = 0;
  auto r = std::from_chars(v.data(), v.data() + v.size(), d);
  if (v.empty() || r.ec != std::errc{} || r.ptr != v.data() + v.size() || !std::isfinite(d))
    throw ArgError{flag + ": '" + v + "' is not a number"};
  if (d < lo || d > hi) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "%s: %s is outside [%g, %g]", flag.c_str(), v.c_str(), lo, hi);
    throw ArgError{buf};
  }
  return d;
}

std::uint64_t parse_size_arg(const std::string& flag, const std::string& v) {
  auto r = tc::parse_size(v);
  if (!r.ok()) throw ArgError{flag + ": " + r.error().message};
  return *r;
}

std::uint64_t parse_ms_arg(const std::string& flag, const std::string& v) {
  auto r = tc::parse_duration_ms(v);
  if (!r.ok()) throw ArgError{flag + ": " + r.error().message};
  return *r;
}

// Plain numbers are seconds here ("--timeout 30"); "500ms", "2min" work too.
std::uint64_t parse_seconds_arg(const std::string& flag, const std::string& v) {
  bool plain = !v.empty() && v.find_first_not_of("0123456789.") == std::string::npos;
  if (plain) {
    double s = parse_double(flag, v, 0.0, 1e9);
    return static_cast<std::uint64_t>(s * 1000.0 + 0.5);
  }
  return parse_ms_arg(flag, v);
}

std::string read_stdin() {
  std::string s{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  return s;
}

std::optional<std::string> help_for(const std::string& cmd) {
  if (cmd == "run" || cmd == "plan" || cmd == "resume")
    return "usage: tandemctl " + cmd + (cmd == "resume" ? " JOB" : "") +
           " [--model M] [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]\n"
           "         [--repetition-penalty R] [--seed S] [--stop STR]... [--key IDEMPOTENCY_KEY] [--side-effects]\n"
           "         [--no-cpu] [--allow-reduce] [--allow-fallback] [--deadline MS] [--prefill-chunk N] [--chat]\n"
           "         [--system-prompt TEXT]" +
           (cmd == "plan" ? std::string("") : std::string(" [--timeout S] [--detach]")) +
           (cmd == "run" ? std::string(" [--no-ring]") : std::string("")) +
           (cmd == "resume" ? std::string("") : std::string(" PROMPT")) + "\n";
  if (cmd == "watch") return std::string("usage: tandemctl watch [--count N] [--timeout S]\n");
  if (cmd == "hold") return std::string("usage: tandemctl hold [--app-id ID] [--for S] REASON\n");
  if (cmd == "policy") return std::string("usage: tandemctl policy | tandemctl policy set KEY=VALUE...\n");
  if (cmd == "testing")
    return std::string(
        "usage: tandemctl testing foreign-load BYTES | fail-alloc N SITE | fail-probes N | lose-device |\n"
        "                         recover-device | reading-lag MS | counters\n");
  return std::nullopt;
}

std::unique_ptr<tc::Client> open_client(const Global& g, int& exit_code) {
  auto c = tc::Client::connect(g.bus, g.service);
  if (!c.ok()) {
    exit_code = bus_error(g, c.error());
    return nullptr;
  }
  return std::move(c).value();
}

// Replies may grow new keys (docs/dbus.md, compatibility): unknown ones are ignored, and listed only with
// TANDEMCTL_STRICT=1 (contract checks, e.g. tandem-validate).
void note_unparsed(const std::string& what, const tc::Unparsed& u) {
  if (u.empty()) return;
  if (const char* s = std::getenv("TANDEMCTL_STRICT"); !s || std::string(s) != "1") return;
  std::string t;
  for (const auto& [k, why] : u) t += (t.empty() ? "" : ", ") + k + " (" + why + ")";
  err_line("tandemctl: note: " + what + " has keys this tandemctl does not understand: " + t);
}

// ---------------------------------------------------------------------------------------------------------------
// Job options

struct JobArgs {
  tc::Request req;
  bool chat = false;
  std::optional<std::string> system_prompt;
  std::vector<std::string> positional;
  bool model_given = false;
  std::uint64_t timeout_ms = 0;
  bool detach = false;
  bool no_ring = false;  // run: D-Bus Submit and JobUpdate signals instead of a ring session
};

JobArgs parse_job_args(const std::string& cmd, ArgList& a, Global& g) {
  JobArgs j;
  tc::SubmitOptions& o = j.req.options;
  const bool waits = cmd != "plan";
  bool only_positional = false;
  while (!a.done()) {
    std::string f = a.next();
    if (only_positional || f == "-" || f.empty() || f[0] != '-') {
      j.positional.push_back(f);
      continue;
    }
    if (f == "--")
      only_positional = true;
    else if (f == "--json")
      g.json = true;
    else if (f == "--model")
      j.req.model = a.value(f), j.model_given = true;
    else if (f == "--max-tokens")
      o.max_tokens = tandem::cli::parse_number<std::uint32_t>(f, a.value(f), 1, UINT32_MAX);
    else if (f == "--temperature")
      o.temperature = parse_double(f, a.value(f), 0.0, 1e6);
    else if (f == "--top-k")
      o.top_k = tandem::cli::parse_number<std::uint32_t>(f, a.value(f), 0, UINT32_MAX);
    else if (f == "--top-p")
      o.top_p = parse_double(f, a.value(f), 0.0, 1.0);
    else if (f == "--repetition-penalty")
      o.repetition_penalty = parse_double(f, a.value(f), 0.0, 1e6);
    else if (f == "--seed")
      o.seed = parse_u64(f, a.value(f));
    else if (f == "--stop") {
      if (!o.stop) o.stop.emplace();
      std::string s = a.value(f);
      if (s.empty()) throw ArgError{"--stop: an empty stop string would stop at once"};
      o.stop->push_back(s);
    } else if (f == "--key") {
      std::string k = a.value(f);
      if (k.empty()) throw ArgError{"--key: the idempotency key must not be empty"};
      o.idempotency_key = k;
    } else if (f == "--side-effects")
      o.side_effects = true;
    else if (f == "--no-cpu")
      o.allow_cpu = false;
    else if (f == "--allow-reduce")
      o.allow_reduce = true;
    else if (f == "--allow-fallback")
      o.allow_fallback_model = true;
    else if (f == "--deadline")
      o.deadline_ms = parse_ms_arg(f, a.value(f));
    else if (f == "--prefill-chunk")
      o.prefill_chunk = tandem::cli::parse_number<std::uint32_t>(f, a.value(f), 0, UINT32_MAX);
    else if (f == "--chat")
      j.chat = true;
    else if (f == "--system-prompt")
      j.system_prompt = a.value(f), j.chat = true;
    else if (waits && f == "--timeout")
      j.timeout_ms = parse_seconds_arg(f, a.value(f));
    else if (waits && f == "--detach")
      j.detach = true;
    else if (cmd == "run" && f == "--no-ring")
      j.no_ring = true;
    else
      throw ArgError{cmd + ": unknown option " + f};
  }
  return j;
}

// Fills prompt / messages from the one positional PROMPT ("-" = stdin).
void take_prompt(JobArgs& j, const std::string& cmd) {
  if (j.positional.empty()) throw ArgError{cmd + ": PROMPT is missing (use - to read it from stdin)"};
  if (j.positional.size() > 1)
    throw ArgError{cmd + ": one PROMPT expected, got " + std::to_string(j.positional.size()) +
                   " arguments (quote the prompt)"};
  std::string prompt = j.positional[0];
  if (prompt == "-") {
    prompt = read_stdin();
    if (!prompt.empty() && prompt.back() == '\n') prompt.pop_back();  // the one newline echo/heredocs add
  }
  if (j.chat) {
    if (j.system_prompt) j.req.messages.push_back({"system", *j.system_prompt});
    j.req.messages.push_back({"user", prompt});
  } else {
    j.req.prompt = prompt;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Following a job (run, resume)

class JobFollower {
 public:
  JobFollower(const Global& g, tc::Client& c, std::uint64_t job, SteadyTime t0, std::uint64_t timeout_ms,
              tc::RingSession* ring = nullptr, std::vector<tc::RingEvent> early = {})
      : g_(g), c_(c), ring_(ring), early_(std::move(early)), job_(job), t0_(t0), timeout_ms_(timeout_ms),
        shared_(stdout_shares_stderr()) {}

  int run(const tc::Placement& placement) {
    last_activity_ = std::chrono::steady_clock::now();
    if (placement.route) add_route(*placement.route);
    if (placement.degraded.value_or(false) || placement.fallback_model.value_or(false))
      banner_route_ = placement.route.value_or("cpu");
    if (placement.existing.value_or(false)) {
      // Its updates go to whoever submitted it first: read it with GetJob.
      polling_text_ = true;
    }
    for (auto& ev : early_) take_ring_event(ev);
    early_.clear();
    while (!finished_) {
      for (auto& u : c_.take_job_updates(job_)) handle(u);
      if (finished_) break;
      if (ring_ && !ring_->open() && !polling_text_) start_polling("the ring session ended: " + ring_->state_text());
      if (!polling_text_ && c_.dropped_job_updates(job_) > 0) start_polling("updates were dropped");

      const auto now = std::chrono::steady_clock::now();
      if (timeout_ms_ > 0 && now - t0_ >= std::chrono::milliseconds(timeout_ms_)) {
        if (!cancel_sent_) (void)c_.cancel(job_);
        return fail_exit("timed out after " + tc::format_duration_ms(timeout_ms_) + " waiting for job " +
                         std::to_string(job_) + "; cancelled it");
      }
      const bool quiet = now - last_activity_ >= std::chrono::milliseconds(1000);
      if ((quiet || polling_text_ || cancel_sent_) && now - last_poll_ >= std::chrono::milliseconds(500)) {
        int rc = poll_job();
        if (rc >= 0) return rc;
        if (finished_) break;
      }

      if (ring_ && ring_->open()) {
        // Job updates come through the ring; the bus still brings DegradedModeChanged and method replies.
        std::vector<tc::RingEvent> evs;
        auto n = ring_->wait(evs, std::chrono::milliseconds(100), tc::interrupt_fd());
        if (!n.ok()) start_polling(n.error().message);
        for (auto& ev : evs) take_ring_event(ev);
        auto w = c_.process(std::chrono::milliseconds(0));
        if (!w.ok()) return fail_exit(w.error().message);
        int rc = on_interrupts();
        if (rc >= 0) return rc;
        continue;
      }
      auto w = c_.process(std::chrono::milliseconds(100), tc::interrupt_fd());
      if (!w.ok()) {
        // The connection is gone: nothing more will arrive.
        return fail_exit(w.error().message);
      }
      if (*w == tc::Wake::interrupted) {
        int rc = on_interrupts();
        if (rc >= 0) return rc;
      }
    }
    return finish();
  }

 private:
  void take_ring_event(const tc::RingEvent& ev) {
    if (ev.job_id != job_ || !ev.update) return;
    if (ev.gap && !polling_text_) start_polling("the ring dropped tokens (completion backlog full)");
    handle(*ev.update);
  }

  void add_route(const std::string& r) {
    if (r.empty()) return;
    if (routes_.empty() || routes_.back() != r) routes_.push_back(r);
  }

  void emit_text(const std::string& t) {
    if (t.empty()) return;
    printed_bytes_ += t.size();
    if (g_.json) return;
    out_text(t);
    last_char_ = t.back();
  }

  void start_polling(const std::string& why) {
    if (polling_text_) return;
    polling_text_ = true;
    if (!g_.json)
      err_line(separator() + "tandemctl: " + why + "; following job " + std::to_string(job_) +
               " with GetJob every 500 ms");
  }

  // When the streamed text and stderr end up in the same place (a terminal, 2>&1), a stderr line that follows
  // unfinished text starts on a new line.
  std::string separator() {
    if (g_.json || !shared_ || last_char_ == '\n' || printed_bytes_ == 0) return "";
    last_char_ = '\n';
    return "\n";
  }

  static bool stdout_shares_stderr() {
    if (isatty(STDOUT_FILENO) && isatty(STDERR_FILENO)) return true;
    struct stat a {
    }, b{};
    if (fstat(STDOUT_FILENO, &a) != 0 || fstat(STDERR_FILENO, &b) != 0) return false;
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
  }

  void handle(const tc::JobUpdate& u) {
    last_activity_ = std::chrono::steady_clock::now();
    if (u.kind == "tokens") {
      if (u.tokens) tokens_seen_ += u.tokens->size();
      if (polling_text_) return;  // text comes from GetJob now
      if (u.text) emit_text(*u.text);
      if (g_.json) out_json(with_event("update", tc::to_json(u)));
      return;
    }
    if (g_.json) out_json(with_event("update", tc::to_json(u)));
    if (u.kind == "started" && !started_at_) started_at_ = std::chrono::steady_clock::now();
    if (u.kind == "routed" || u.kind == "started") {
      if (u.route) add_route(*u.route);
    }
    if (u.kind == "migrated" && u.to) add_route(*u.to);
    if (u.kind == "finished") {
      finished_ = true;
      state_ = u.state.value_or("");
      finish_reason_ = u.finish_reason.value_or("");
      error_code_ = u.error_code.value_or("");
      error_message_ = u.error_message.value_or("");
      if (u.tokens_total) tokens_total_ = *u.tokens_total;
      return;
    }
    if (g_.json || u.kind == "accepted") return;
    // Progress on stderr, on a line of its own.
    err_line(separator() + tc::format_job_update(u));
    if ((u.kind == "routed" && (u.degraded.value_or(false) || u.fallback_model.value_or(false))) ||
        (u.kind == "migrated" && u.to && *u.to != "gpu")) {
      tc::Placement p;
      p.route = u.kind == "migrated" ? u.to : u.route;
      p.reason = u.reason;
      p.model = u.model;
      p.fallback_model = u.fallback_model;
      p.degraded = true;
      std::optional<double> slow;
      if (auto d = c_.last_degraded_change(); d && d->degraded) slow = d->expected_slowdown;
      std::string banner = tc::degraded_banner(p, slow, "");
      if (!banner.empty() && p.route.value_or("") != banner_route_) {
        err_line(banner);
        banner_route_ = p.route.value_or("");
      }
    }
  }

  // Returns an exit code to stop with, or -1 to go on.
  int poll_job() {
    last_poll_ = std::chrono::steady_clock::now();
    auto j = c_.get_job(job_);
    if (!j.ok()) {
      const auto& re = c_.last_error();
      const bool transient = re && (re->daemon_missing() || re->name == "org.freedesktop.DBus.Error.NoReply");
      if (!transient) return fail_exit(j.error().message);
      if (!poll_fail_since_) {
        poll_fail_since_ = last_poll_;
        if (!g_.json) err_line(separator() + "tandemctl: " + j.error().message + "; retrying for up to 30 s");
      } else if (last_poll_ - *poll_fail_since_ > std::chrono::seconds(30)) {
        return fail_exit(j.error().message);
      }
      return -1;
    }
    poll_fail_since_.reset();
    // Signals sent before this reply are queued behind it: deliver them before comparing.
    (void)c_.process(std::chrono::milliseconds(0));
    for (auto& u : c_.take_job_updates(job_)) handle(u);
    const tc::JobInfo& info = *j;
    const std::uint64_t job_tokens = info.tokens ? info.tokens->size() : 0;
    if (!polling_text_ && job_tokens > tokens_seen_ && info.text && info.text->size() > printed_bytes_)
      start_polling("the update stream has a gap");
    if (polling_text_ && info.text && info.text->size() > printed_bytes_) {
      std::string more = info.text->substr(printed_bytes_);
      emit_text(more);
      if (g_.json)
        out_json({{"event", "update"}, {"job", job_}, {"kind", "tokens"}, {"text", more}, {"source", "GetJob"}});
    }
    if (info.routes)
      for (const auto& r : *info.routes) add_route(r);
    if (!finished_ && info.state && tc::is_terminal_state(*info.state)) {
      finished_ = true;
      state_ = *info.state;
      finish_reason_ = info.finish_reason.value_or("");
      error_code_ = info.error_code.value_or("");
      error_message_ = info.error_message.value_or("");
      tokens_total_ = job_tokens;
      final_ = info;
    }
    return -1;
  }

  int on_interrupts() {
    for (int sig : tc::take_interrupts()) {
      if (sig == SIGINT && !cancel_sent_) {
        cancel_sent_ = true;
        err_line(separator() + "tandemctl: cancelling job " + std::to_string(job_) + " (Ctrl-C again to quit)");
        auto r = c_.cancel(job_);
        if (!r.ok()) err_line("tandemctl: " + r.error().message);
        last_poll_ = {};  // check the state now
      } else if (sig == SIGTERM || sig == SIGHUP) {
        if (!cancel_sent_) (void)c_.cancel(job_);
        err_line(separator() + "tandemctl: terminated; cancelled job " + std::to_string(job_));
        return kCancelled;
      }
    }
    return -1;
  }

  int fail_exit(const std::string& msg) {
    err_line(separator() + "tandemctl: " + msg);
    if (g_.json) out_json({{"event", "error"}, {"job", job_}, {"error", {{"code", "bus"}, {"message", msg}}}});
    return kBusError;
  }

  int finish() {
    const auto end = std::chrono::steady_clock::now();
    if (!final_) {
      auto j = c_.get_job(job_);
      if (j.ok()) final_ = *j;
    }
    if (final_) {
      if (final_->text && final_->text->size() > printed_bytes_) {
        std::string more = final_->text->substr(printed_bytes_);
        emit_text(more);
        if (g_.json)
          out_json({{"event", "update"}, {"job", job_}, {"kind", "tokens"}, {"text", more}, {"source", "GetJob"}});
      }
      if (final_->routes) {
        routes_.clear();
        for (const auto& r : *final_->routes) add_route(r);
      }
      if (final_->tokens && tokens_total_ == 0) tokens_total_ = final_->tokens->size();
      if (state_.empty() && final_->state) state_ = *final_->state;
    }
    if (tokens_total_ == 0) tokens_total_ = tokens_seen_;
    // Text that did not end a line: finish it on a terminal; else keep stdout exactly the generated text.
    if (!g_.json && last_char_ != '\n' && printed_bytes_ > 0 && isatty(STDOUT_FILENO)) {
      out_text("\n");
      last_char_ = '\n';
    }

    tc::RunSummary s;
    s.job_id = job_;
    s.state = state_;
    s.finish_reason = finish_reason_;
    s.tokens = tokens_total_;
    s.elapsed_ms = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(end - t0_).count());
    if (started_at_)
      s.generate_ms =
          static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(end - *started_at_).count());
    s.routes = routes_;
    s.error_code = error_code_;
    s.error_message = error_message_;

    int rc = kFailed;
    if (state_ == "completed")
      rc = kOk;
    else if (state_ == "cancelled")
      rc = kCancelled;
    const bool resumable = state_ == "failed" && final_ && final_->checkpoint;

    if (g_.json) {
      json j = {{"event", "summary"}};
      j.update(tc::to_json(s));
      j["exit_code"] = rc;
      if (resumable) {
        j["resumable"] = true;
        j["checkpoint"] = tc::to_json(*final_)["checkpoint"];
        j["resume_command"] = g_.prefix() + " resume " + std::to_string(job_);
      }
      out_json(j);
    } else {
      err_line(separator() + tc::format_run_summary(s));
      if (resumable) err_line(tc::format_resume_hint(job_, *final_, g_.prefix()));
    }
    return rc;
  }

  const Global& g_;
  tc::Client& c_;
  tc::RingSession* ring_;
  std::vector<tc::RingEvent> early_;  // ring events that arrived with the accepted completion
  std::uint64_t job_;
  SteadyTime t0_;
  std::uint64_t timeout_ms_;
  bool shared_;

  bool finished_ = false;
  bool polling_text_ = false;
  bool cancel_sent_ = false;
  std::size_t printed_bytes_ = 0;
  std::uint64_t tokens_seen_ = 0;
  std::uint64_t tokens_total_ = 0;
  char last_char_ = '\n';
  SteadyTime last_activity_{};
  SteadyTime last_poll_{};
  std::optional<SteadyTime> started_at_;
  std::optional<SteadyTime> poll_fail_since_;
  std::vector<std::string> routes_;
  std::string state_, finish_reason_, error_code_, error_message_;
  std::string banner_route_;  // route the DEGRADED banner was last shown for
  std::optional<tc::JobInfo> final_;
};

int submit_and_follow(Global& g, const std::string& cmd, ArgList& a) {
  JobArgs j = parse_job_args(cmd, a, g);
  std::uint64_t resume_of = 0;
  if (cmd == "resume") {
    if (j.positional.size() != 1) throw ArgError{"resume: exactly one JOB expected"};
    resume_of = parse_job_id(j.positional[0]);
    if (j.model_given || j.chat) throw ArgError{"resume: --model, --chat and --system-prompt come from the checkpoint"};
  } else {
    take_prompt(j, cmd);
  }

  int rc = kOk;
  auto client = open_client(g, rc);
  if (!client) return rc;
  // Signals first, so no update is missed between Submit's reply and our first look.
  if (auto s = client->subscribe(); !s.ok()) return bus_error(g, s.error(), client->last_error());
  if (auto s = tc::install_interrupt_handler(kCancelled); !s.ok()) return bus_error(g, s.error());

  const SteadyTime t0 = std::chrono::steady_clock::now();
  // run: through a ring session when the daemon offers one (docs/rings.md), else D-Bus Submit + JobUpdate signals.
  std::unique_ptr<tc::RingSession> ring;
  std::vector<tc::RingEvent> early;
  std::optional<tc::SubmitResult> ring_sub;
  if (cmd == "run" && !j.no_ring && !j.detach) {
    auto opened = tc::RingSession::open(*client);
    if (opened.ok()) ring = std::move(opened).value();
    else if (std::getenv("TANDEMCTL_DEBUG"))
      err_line("tandemctl: no ring session (" + opened.error().message + "); using D-Bus");
  }
  if (ring) {
    if (auto s = ring->submit(j.req, 1); !s.ok()) return bus_error(g, s.error());
    bool interrupted = false;
    while (!ring_sub) {
      std::vector<tc::RingEvent> evs;
      auto n = ring->wait(evs, std::chrono::seconds(1), tc::interrupt_fd());
      if (!n.ok()) return bus_error(g, n.error());
      if (!ring->open() && evs.empty()) return bus_error(g, tandem::make_error(tandem::Errc::unavailable, "the ring session ended: " + ring->state_text()));
      for (auto& ev : evs) {
        if (ev.user_data == 1 && ev.error) return bus_error(g, tc::to_error(*ev.error), *ev.error);
        if (ev.user_data == 1 && ev.accepted) ring_sub = *ev.accepted;
        else early.push_back(std::move(ev));
      }
      if (!tc::take_interrupts().empty()) interrupted = true;  // cancel it as soon as it has an id
    }
    if (interrupted) {
      (void)client->cancel(ring_sub->job_id);
      err_line("tandemctl: interrupted; cancelled job " + std::to_string(ring_sub->job_id));
      return kCancelled;
    }
  }
  auto r = ring_sub ? tandem::Result<tc::SubmitResult>(*ring_sub)
           : cmd == "resume" ? client->resume(resume_of, j.req.options)
                             : client->submit(j.req);
  if (!r.ok()) return bus_error(g, r.error(), client->last_error());
  const tc::SubmitResult& sub = *r;

  // A DegradedModeChanged that came with the submit tells how much slower the CPU is.
  (void)client->process(std::chrono::milliseconds(0));
  std::optional<double> slow;
  if (auto d = client->last_degraded_change(); d && d->degraded) slow = d->expected_slowdown;

  if (g.json) {
    json e = {{"event", "submitted"}, {"job", sub.job_id}, {"placement", tc::to_json(sub.placement)}};
    if (cmd == "resume") e["resumed_from"] = resume_of;
    out_json(e);
  } else {
    if (cmd == "resume")
      err_line("resuming job " + std::to_string(resume_of) + " as job " + std::to_string(sub.job_id));
    std::string p = tc::format_placement(sub.job_id, sub.placement, slow);
    err_line(p);
    note_unparsed("the placement", sub.placement.unparsed);
  }
  if (j.detach) {
    if (!g.json) out_text(std::to_string(sub.job_id) + "\n");
    return kOk;
  }
  JobFollower f(g, *client, sub.job_id, t0, j.timeout_ms, ring.get(), std::move(early));
  return f.run(sub.placement);
}

// ---------------------------------------------------------------------------------------------------------------
// Other commands

int cmd_status(Global& g, ArgList& a) {
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else
      throw ArgError{"status: unexpected argument " + f};
  }
  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  auto s = c->status();
  if (!s.ok()) return bus_error(g, s.error(), c->last_error());
  if (g.json) {
    out_json(tc::to_json(*s));
  } else {
    out_text(tc::format_status(*s, now_unix_ms()));
    note_unparsed("the property set", s->unparsed);
    if (s->memory) note_unparsed("Memory", s->memory->unparsed);
    if (s->host_memory) note_unparsed("HostMemory", s->host_memory->unparsed);
    if (s->policy) note_unparsed("Policy", s->policy->unparsed);
  }
  return kOk;
}

std::string clock_prefix() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02d:%02d:%02d.%03d ", tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

int cmd_watch(Global& g, ArgList& a) {
  std::uint64_t count = 0, timeout_ms = 0;
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else if (f == "--count")
      count = tandem::cli::parse_number<std::uint64_t>(f, a.value(f), 1, UINT64_MAX);
    else if (f == "--timeout")
      timeout_ms = parse_seconds_arg(f, a.value(f));
    else
      throw ArgError{"watch: unexpected argument " + f};
  }
  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  if (auto s = tc::install_interrupt_handler(-1); !s.ok()) return bus_error(g, s.error());

  std::uint64_t seen = 0;
  // Both kinds in arrival order; printed after process() returns (filling invalidated properties needs a call).
  std::vector<std::variant<tc::PropertiesChange, tc::DegradedChange>> pending;
  c->on_properties_change([&](const tc::PropertiesChange& p) { pending.emplace_back(p); });
  c->on_degraded_change([&](const tc::DegradedChange& d) { pending.emplace_back(d); });
  if (auto s = c->subscribe(); !s.ok()) return bus_error(g, s.error(), c->last_error());
  // Make sure tandemd is there (and say so) before waiting.
  auto st = c->status();
  if (!st.ok()) return bus_error(g, st.error(), c->last_error());
  if (!g.json)
    err_line("watching tandemd on " + g.bus.describe() + " (state " + st->state.value_or("?") + "); Ctrl-C stops");

  const SteadyTime t0 = std::chrono::steady_clock::now();
  while (count == 0 || seen < count) {
    std::chrono::milliseconds wait(1000);
    if (timeout_ms > 0) {
      auto left = std::chrono::milliseconds(timeout_ms) -
                  std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
      if (left.count() <= 0) {
        if (count > 0) {
          err_line("tandemctl: watch timed out after " + tc::format_duration_ms(timeout_ms) + " with " +
                   std::to_string(seen) + " of " + std::to_string(count) + " events");
          return kBusError;
        }
        return kOk;
      }
      wait = std::min(wait, left);
    }
    auto w = c->process(wait, tc::interrupt_fd());
    if (!w.ok()) return bus_error(g, w.error());
    if (*w == tc::Wake::interrupted) {
      tc::take_interrupts();
      return kOk;
    }
    for (auto& ev : pending) {
      if (count > 0 && seen >= count) break;
      ++seen;
      if (auto* p = std::get_if<tc::PropertiesChange>(&ev)) {
        (void)c->fill_invalidated(*p);
        if (g.json) {
          json j = with_event("properties", tc::to_json(*p));
          j["time_unix_ms"] = now_unix_ms();
          out_json(j);
        } else
          out_text(clock_prefix() + tc::format_properties_change(*p) + "\n");
      } else {
        const auto& d = std::get<tc::DegradedChange>(ev);
        if (g.json) {
          json j = with_event("degraded", tc::to_json(d));
          j["time_unix_ms"] = now_unix_ms();
          out_json(j);
        } else
          out_text(clock_prefix() + tc::format_degraded_change(d) + "\n");
      }
    }
    pending.clear();
  }
  return kOk;
}

int cmd_plan(Global& g, ArgList& a) {
  JobArgs j = parse_job_args("plan", a, g);
  take_prompt(j, "plan");
  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  auto d = c->plan(j.req);
  if (!d.ok()) return bus_error(g, d.error(), c->last_error());
  if (g.json) {
    out_json(tc::to_json(*d));
  } else {
    out_text(tc::format_plan(*d));
    note_unparsed("the decision", d->unparsed);
  }
  return kOk;
}

std::uint64_t one_job_arg(const std::string& cmd, ArgList& a, Global& g) {
  std::optional<std::uint64_t> job;
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else if (!job && !f.empty() && f[0] != '-')
      job = parse_job_id(f);
    else
      throw ArgError{cmd + ": unexpected argument " + f};
  }
  if (!job) throw ArgError{cmd + ": JOB is missing"};
  return *job;
}

int cmd_cancel(Global& g, ArgList& a) {
  std::uint64_t job = one_job_arg("cancel", a, g);
  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  auto r = c->cancel(job);
  if (!r.ok()) return bus_error(g, r.error(), c->last_error());
  if (g.json)
    out_json({{"job", job}, {"state", *r}});
  else
    out_text("job " + std::to_string(job) + ": " + *r + "\n");
  return kOk;
}

int cmd_job(Global& g, ArgList& a) {
  std::uint64_t job = one_job_arg("job", a, g);
  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  auto r = c->get_job(job);
  if (!r.ok()) return bus_error(g, r.error(), c->last_error());
  if (g.json) {
    out_json(tc::to_json(*r));
  } else {
    out_text(tc::format_job(*r, now_unix_ms()));
    note_unparsed("the job", r->unparsed);
  }
  return kOk;
}

int cmd_policy(Global& g, ArgList& a) {
  std::vector<std::string> rest;
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else
      rest.push_back(f);
  }
  std::map<std::string, tc::PolicyValue> values;
  if (!rest.empty()) {
    if (rest[0] != "set")
      throw ArgError{"policy: unknown subcommand '" + rest[0] + "' (policy | policy set KEY=VALUE...)"};
    if (rest.size() < 2) throw ArgError{"policy set: give at least one KEY=VALUE"};
    for (std::size_t i = 1; i < rest.size(); ++i) {
      auto p = tc::parse_policy_setting(rest[i]);
      if (!p.ok()) throw ArgError{p.error().message};
      if (values.count(p->first)) throw ArgError{"policy set: " + p->first + " given twice"};
      values.insert(std::move(p).value());
    }
  }
  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  if (!values.empty()) {
    auto s = c->set_policy(values);
    if (!s.ok()) return bus_error(g, s.error(), c->last_error());
  }
  auto p = c->policy();
  if (!p.ok()) return bus_error(g, p.error(), c->last_error());
  if (g.json)
    out_json(tc::to_json(*p));
  else
    out_text(tc::format_policy(*p));
  return kOk;
}

int cmd_hold(Global& g, ArgList& a) {
  std::string app_id;
  std::uint64_t for_ms = 0;
  std::vector<std::string> words;
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else if (f == "--app-id")
      app_id = a.value(f);
    else if (f == "--for")
      for_ms = parse_seconds_arg(f, a.value(f));
    else if (!f.empty() && f[0] == '-' && f != "-")
      throw ArgError{"hold: unknown option " + f};
    else
      words.push_back(f);
  }
  if (words.empty()) throw ArgError{"hold: REASON is missing (e.g. tandemctl hold \"game running\")"};
  std::string reason;
  for (const auto& w : words) reason += (reason.empty() ? "" : " ") + w;

  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  if (auto s = tc::install_interrupt_handler(-1); !s.ok()) return bus_error(g, s.error());
  auto cookie = c->hold_gpu(reason, app_id);
  if (!cookie.ok()) return bus_error(g, cookie.error(), c->last_error());
  if (g.json) {
    out_json({{"event", "held"}, {"cookie", *cookie}});
  } else {
    out_text(*cookie + "\n");
    err_line("holding the GPU (cookie " + *cookie + ")" +
             (for_ms ? " for " + tc::format_duration_ms(for_ms) : std::string("")) +
             "; Ctrl-C releases it (so does tandemctl exiting)");
  }
  const SteadyTime t0 = std::chrono::steady_clock::now();
  while (true) {
    std::chrono::milliseconds wait(1000);
    if (for_ms > 0) {
      auto left = std::chrono::milliseconds(for_ms) -
                  std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
      if (left.count() <= 0) break;
      wait = std::min(wait, left);
    }
    auto w = c->process(wait, tc::interrupt_fd());
    if (!w.ok()) return bus_error(g, w.error());
    if (*w == tc::Wake::interrupted) {
      tc::take_interrupts();
      break;
    }
  }
  auto r = c->release_gpu(*cookie);
  if (!r.ok()) return bus_error(g, r.error(), c->last_error());
  if (g.json)
    out_json({{"event", "released"}, {"cookie", *cookie}});
  else
    err_line("released the GPU hold " + *cookie);
  return kOk;
}

int cmd_release(Global& g, ArgList& a) {
  std::optional<std::string> cookie;
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else if (!cookie)
      cookie = f;
    else
      throw ArgError{"release: unexpected argument " + f};
  }
  if (!cookie || cookie->empty()) throw ArgError{"release: COOKIE is missing"};
  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  auto r = c->release_gpu(*cookie);
  if (!r.ok()) return bus_error(g, r.error(), c->last_error());
  if (g.json)
    out_json({{"released", *cookie}});
  else
    out_text("released " + *cookie + "\n");
  return kOk;
}

int cmd_models(Global& g, ArgList& a) {
  bool details = false;
  std::optional<std::string> only;
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else if (f == "--details")
      details = true;
    else if (!only && !f.empty() && f[0] != '-')
      only = f, details = true;
    else
      throw ArgError{"models: unexpected argument " + f};
  }
  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  auto m = c->list_models();
  if (!m.ok()) return bus_error(g, m.error(), c->last_error());
  std::vector<tc::ModelInfo> models;
  for (const auto& x : *m)
    if (!only || x.name.value_or("") == *only) models.push_back(x);
  if (only && models.empty()) {
    err_line("tandemctl: no model named '" + *only + "'");
    if (g.json)
      out_json({{"event", "error"}, {"error", {{"code", "not_found"}, {"message", "no model named " + *only}}}});
    return kBusError;
  }
  json arr = json::array();
  std::string text = details ? "" : tc::format_models(models);
  for (const auto& x : models) {
    json j = tc::to_json(x);
    if (details) {
      std::string path = x.path.value_or(tc::model_object_path(x.name.value_or("")));
      auto d = c->model_details(path);
      if (!d.ok()) return bus_error(g, d.error(), c->last_error());
      j["details"] = tc::to_json(*d);
      text += (text.empty() ? "" : "\n") + tc::format_model_details(*d);
    }
    arr.push_back(j);
  }
  if (g.json)
    out_json(arr);
  else
    out_text(text);
  return kOk;
}

int cmd_testing(Global& g, ArgList& a) {
  std::vector<std::string> w;
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else
      w.push_back(f);
  }
  if (w.empty())
    throw ArgError{
        "testing: what? (foreign-load, fail-alloc, fail-probes, lose-device, recover-device, "
        "reading-lag, counters)"};
  const std::string what = w[0];
  auto want = [&](std::size_t n, const char* usage) {
    if (w.size() != n + 1) throw ArgError{"usage: tandemctl testing " + what + (n ? " " : "") + usage};
  };
  std::function<tandem::Result<void>(tc::Client&)> act;
  std::string done_text;
  if (what == "foreign-load") {
    want(1, "BYTES");
    std::uint64_t bytes = parse_size_arg("foreign-load", w[1]);
    act = [bytes](tc::Client& c) { return c.set_foreign_load(bytes); };
    done_text = "foreign load set to " + tc::format_bytes(bytes);
  } else if (what == "fail-alloc") {
    want(2, "N SITE");
    std::uint32_t n = tandem::cli::parse_number<std::uint32_t>("fail-alloc N", w[1], 0, UINT32_MAX);
    std::string site = w[2];
    static const std::vector<std::string> sites = {"weights", "kv_pool", "prefill", "decode", "probe", "other", "any"};
    if (std::find(sites.begin(), sites.end(), site) == sites.end())
      throw ArgError{"fail-alloc: SITE '" + site +
                     "' is not one of weights, kv_pool, prefill, decode, probe, other, any"};
    act = [n, site](tc::Client& c) { return c.fail_allocations(n, site); };
    done_text = "the next " + std::to_string(n) + " allocations at " + site + " will fail";
  } else if (what == "fail-probes") {
    want(1, "N");
    std::uint32_t n = tandem::cli::parse_number<std::uint32_t>("fail-probes N", w[1], 0, UINT32_MAX);
    act = [n](tc::Client& c) { return c.fail_probes(n); };
    done_text = "the next " + std::to_string(n) + " health probes will fail";
  } else if (what == "lose-device") {
    want(0, "");
    act = [](tc::Client& c) { return c.lose_device(); };
    done_text = "device lost";
  } else if (what == "recover-device") {
    want(0, "");
    act = [](tc::Client& c) { return c.recover_device(); };
    done_text = "device recovered";
  } else if (what == "reading-lag") {
    want(1, "MS");
    std::uint64_t ms = parse_ms_arg("reading-lag", w[1]);
    act = [ms](tc::Client& c) { return c.set_reading_lag(ms); };
    done_text = "memory readings lag by " + tc::format_duration_ms(ms);
  } else if (what == "counters") {
    want(0, "");
  } else {
    throw ArgError{"testing: unknown action '" + what + "'"};
  }
  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  if (what == "counters") {
    auto r = c->counters();
    if (!r.ok()) return bus_error(g, r.error(), c->last_error());
    if (g.json)
      out_json(json(*r));
    else
      out_text(tc::format_counters(*r));
    return kOk;
  }
  auto r = act(*c);
  if (!r.ok()) return bus_error(g, r.error(), c->last_error());
  if (g.json)
    out_json({{"ok", true}, {"action", what}});
  else
    out_text(done_text + "\n");
  return kOk;
}

int dispatch(Global& g, const std::string& cmd, ArgList& a) {
  if (cmd == "status") return cmd_status(g, a);
  if (cmd == "watch") return cmd_watch(g, a);
  if (cmd == "run" || cmd == "resume") return submit_and_follow(g, cmd, a);
  if (cmd == "plan") return cmd_plan(g, a);
  if (cmd == "cancel") return cmd_cancel(g, a);
  if (cmd == "job") return cmd_job(g, a);
  if (cmd == "policy") return cmd_policy(g, a);
  if (cmd == "hold") return cmd_hold(g, a);
  if (cmd == "release") return cmd_release(g, a);
  if (cmd == "models") return cmd_models(g, a);
  if (cmd == "testing") return cmd_testing(g, a);
  throw ArgError{"unknown command '" + cmd + "'"};
}

}  // namespace

int main(int argc, char** argv) {
  Global g;
  try {
    auto env = tc::bus_spec_from_env();
    if (!env.ok()) return usage_error(env.error().message);
    g.bus = *env;

    int i = 1;
    for (; i < argc; ++i) {
      std::string f = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw ArgError{f + " needs a value"};
        return argv[++i];
      };
      if (f == "--system")
        g.bus = tc::BusSpec{tc::BusKind::system, ""};
      else if (f == "--session")
        g.bus = tc::BusSpec{tc::BusKind::session, ""};
      else if (f == "--address") {
        auto b = tc::parse_bus_spec("address=" + value());
        if (!b.ok()) throw ArgError{"--address: " + b.error().message};
        g.bus = *b;
      } else if (f == "--bus") {
        auto b = tc::parse_bus_spec(value());
        if (!b.ok()) throw ArgError{"--bus: " + b.error().message};
        g.bus = *b;
      } else if (f == "--name") {
        g.service = value();
        if (g.service.empty()) throw ArgError{"--name must not be empty"};
      } else if (f == "--json")
        g.json = true;
      else if (f == "-h" || f == "--help") {
        out_text(kUsageText);
        return kOk;
      } else if (f == "--version") {
        out_text(std::string("tandemctl ") + TANDEM_VERSION + "\n");
        return kOk;
      } else if (!f.empty() && f[0] == '-')
        throw ArgError{"unknown option " + f};
      else
        break;
    }
    if (i >= argc) return usage_error("a COMMAND is missing");
    std::string cmd = argv[i++];
    if (cmd == "help") {
      if (i < argc) {
        if (auto h = help_for(argv[i])) {
          out_text(*h);
          return kOk;
        }
      }
      out_text(kUsageText);
      return kOk;
    }
    std::vector<std::string> rest(argv + i, argv + argc);
    for (const auto& r : rest) {
      if (r == "--") break;
      if (r == "-h" || r == "--help") {
        out_text(help_for(cmd).value_or(kUsageText));
        return kOk;
      }
    }
    ArgList a(std::move(rest));
    return dispatch(g, cmd, a);
  } catch (const ArgError& e) {
    return usage_error(e.message);
  }
}
