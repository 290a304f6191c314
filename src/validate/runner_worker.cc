// tandem-validate runner: the workload clients (runner_internal.h).
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

namespace {

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

class Worker : public WorkloadClient {
 public:
  Worker(Campaign& c, const Phase& ph, const Workload& w, std::int32_t id, std::uint32_t index_in_workload)
      : c_(c), ph_(ph), w_(w), id_(id), idx_(index_in_workload) {}

  void run(Clock::time_point phase_t0) override {
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
    json ok{{"req", req}, {"key", key}, {"existing", p.existing.value_or(false)}, {"route", p.route.value_or("")},
            {"action", p.action.value_or("")}, {"queue", p.queue.value_or("")}, {"degraded", p.degraded.value_or(false)},
            {"reason", p.reason.value_or("")}, {"side_effects", w_.side_effects}};
    if (p.eta_ms) ok["eta_ms"] = *p.eta_ms;  // the placement's estimate (ETA accuracy, metrics_eta.cc)
    c_.rec("submit_ok", id_, res->job_id, ok);
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


}  // namespace

std::unique_ptr<WorkloadClient> make_workload_client(Campaign& c, const Phase& ph, const Workload& w, std::int32_t id,
                                                     std::uint32_t index_in_workload) {
  if (w.kind == WorkloadKind::embed) return make_embed_client(c, ph, w, id, index_in_workload);
  if (w.kind == WorkloadKind::transcribe) return make_transcribe_client(c, ph, w, id, index_in_workload);
  return std::make_unique<Worker>(c, ph, w, id, index_in_workload);
}

}  // namespace tandem::validate::detail
