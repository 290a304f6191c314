// tandemctl run, resume, plan: the job options and following a job (JobUpdate signals or a ring session).
#include "tandemctl_common.h"

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
#include "client/ring_session.h"

namespace tandemctl {

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
    else if (f == "--no-thinking" || f == "--thinking")
      o.enable_thinking = f == "--thinking";
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

}  // namespace tandemctl
