#include "daemon/service.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/sha256.h"
#include "core/text.h"
#include "daemon/host_reading.h"
#include "daemon/log.h"
#include "device/simulated.h"

namespace tandem::daemon {

using namespace std::chrono_literals;
using policy::BreakerEvent;
using policy::Decision;
using policy::JobPhase;
using policy::Rung;
using nlohmann::json;

namespace {

std::uint64_t to_ms(Clock::duration d) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  return ms < 0 ? 0 : static_cast<std::uint64_t>(ms);
}

std::string route_name(const policy::Route& r) { return std::string(policy::device_name(r.device)); }

json route_json(const policy::Route& r) {
  return json{{"device", route_name(r)}, {"gpu_layers", r.gpu_layers}, {"fallback_model", r.fallback_model},
              {"model", r.model}};
}

// Wire names of the ladder's actions.
std::string action_name(Rung r) { return std::string(policy::rung_name(r)); }

Failure rejected_error(const Decision& d) {
  const auto retry = to_ms(d.retry_after);
  if (d.permanent) return fail(Errc::invalid_argument, d.detail.empty() ? std::string(policy::reason_name(d.reason)) : d.detail);
  Errc code = Errc::rejected;
  if (d.reason == policy::Reason::cpu_queue_full || d.reason == policy::Reason::gpu_queue_full) code = Errc::queue_full;
  if (d.reason == policy::Reason::host_memory) code = Errc::host_memory;
  std::string msg = "rejected (" + std::string(policy::reason_name(d.reason)) + "): " + d.detail;
  msg += "; retry_after_ms=" + std::to_string(retry);
  return fail(code, msg);
}

// Idempotency keys are per user: two users' "key-1" never name the same job. Stored (journal, registry) scoped.
std::string scoped_key(std::uint32_t uid, const std::string& key) { return std::to_string(uid) + "/" + key; }
std::string user_key(const std::string& scoped) {
  const auto slash = scoped.find('/');
  return slash == std::string::npos ? scoped : scoped.substr(slash + 1);
}


}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// TaskPool

TaskPool::TaskPool(std::string name, unsigned threads) : name_(std::move(name)) {
  for (unsigned i = 0; i < std::max(1u, threads); ++i) threads_.emplace_back([this] { loop(); });
}

TaskPool::~TaskPool() { stop(); }

void TaskPool::post(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void TaskPool::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

void TaskPool::loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Records

// A validated request, ready for admission.
struct Service::Prepared {
  SubmitRequest req;
  const ModelInfo* model = nullptr;
  std::vector<TokenId> prompt;
  gen::SamplingParams sampling;
  std::uint32_t max_new_tokens = 0;
  std::vector<std::string> stop;
  std::uint32_t prefill_chunk = 0;
  std::vector<TokenId> resume;
  policy::RequestShape shape;
  std::uint64_t digest = 0;
  json request_json;
};

struct Service::JobRecord {
  JobId id = 0;
  std::optional<policy::Job> fsm;   // absent for jobs restored terminal from the journal
  std::string phase = "queued";     // mirrors fsm (or the journal for restored jobs)
  std::string reason;
  SubmitRequest req;
  json request_json;
  std::string owner;                // bus name of the submitter ("" after a restart)
  std::string reply_to;             // where updates go when not the owner's bus name (a ring session), "" = owner
  bool muted = false;               // its reply channel closed: no updates (the owner's limit still counts it)
  std::uint32_t uid = 0;
  std::string model;                // requested (resolved)
  std::map<std::string, std::vector<TokenId>> prompts;  // tokenized per serving model
  gen::SamplingParams sampling;
  std::uint32_t max_new_tokens = 0;
  std::vector<std::string> stop;
  std::uint32_t prefill_chunk = 0;
  std::vector<TokenId> resume;      // tokens given by the client (checkpoint it resumed from)
  std::vector<TokenId> tokens;      // generated so far, resume tokens included
  std::string text;                 // text delivered by this job's runs
  std::uint32_t journaled_tokens = 0;
  policy::RequestShape shape;
  std::uint64_t digest = 0;
  std::string key;
  bool side_effects = false;
  bool stream = true;
  policy::Route route;              // current or planned
  std::vector<std::string> routes;  // every route started
  std::vector<HistoryRow> history;
  std::string queue;                // "gpu" | "cpu" | "" (not queued)
  bool running = false;
  std::uint64_t attempt = 0;        // run attempt counter (stale events are ignored)
  std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);
  std::string stop_cause;           // why `cancel` was raised: cancelled | deadline | shutdown
  Decision decision;
  bool degraded = false;
  std::int64_t accepted_unix_ms = 0, finished_unix_ms = 0;
  Clock::time_point accepted_at{};
  std::optional<Clock::time_point> deadline;
  std::string finish_reason, error_code, error_message;
  std::uint64_t retry_after_ms = 0;
  std::uint64_t gpu_reserved = 0;
  bool host_admitted = false;
  std::optional<policy::HostJobEstimate> host;
  Clock::time_point run_started{};
  std::uint32_t run_new_tokens = 0;
  std::uint32_t attempts_restored = 0;  // restored jobs: attempts the journal recorded
  bool host_materialized = false;
  std::optional<JobId> resumed_by;      // Resume already created this successor (never a second run)

  bool terminal() const { return phase == "completed" || phase == "failed" || phase == "cancelled"; }
};

struct Service::WorkerEvent {
  enum Kind { prefilled, tokens, finished, probe_done, reload_done } kind = tokens;
  JobId job = 0;
  std::uint64_t attempt = 0;
  std::vector<TokenId> ids;
  std::string text;
  std::uint32_t prefill_tokens = 0;
  Clock::duration took{};
  RunResult result;
  Status status;
  policy::ProbeId probe = policy::kNoProbe;
};

// Collects a run's tokens on the worker thread and posts them in batches (at most one post per flush interval).
class Service::Sink final : public RunSink {
 public:
  Sink(Service* s, JobId id, std::uint64_t attempt, Clock::duration flush)
      : s_(s), id_(id), attempt_(attempt), flush_(flush) {}
  void prefilled(std::uint32_t tokens, Clock::duration took) override {
    WorkerEvent ev;
    ev.kind = WorkerEvent::prefilled;
    ev.job = id_;
    ev.attempt = attempt_;
    ev.prefill_tokens = tokens;
    ev.took = took;
    s_->post(std::move(ev));
    last_ = std::chrono::steady_clock::now();
  }
  void token(TokenId id, const std::string& text) override {
    if (id >= 0) ids_.push_back(id);
    text_ += text;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ >= flush_) flush(now);
  }
  void flush(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) {
    last_ = now;
    if (ids_.empty() && text_.empty()) return;
    WorkerEvent ev;
    ev.kind = WorkerEvent::tokens;
    ev.job = id_;
    ev.attempt = attempt_;
    ev.ids = std::move(ids_);
    ev.text = std::move(text_);
    ids_.clear();
    text_.clear();
    s_->post(std::move(ev));
  }

 private:
  Service* s_;
  JobId id_;
  std::uint64_t attempt_;
  Clock::duration flush_;
  std::chrono::steady_clock::time_point last_{};
  std::vector<TokenId> ids_;
  std::string text_;
};

// ---------------------------------------------------------------------------------------------------------------
// Construction

Service::Service(DaemonConfig cfg, std::shared_ptr<Backend> backend, std::shared_ptr<const Clock> clock,
                 ServiceObserver* observer, std::function<void()> wake)
    : cfg_(std::move(cfg)),
      backend_(std::move(backend)),
      clock_(std::move(clock)),
      observer_(observer),
      wake_(std::move(wake)),
      admission_(cfg_.policy.ladder, cfg_.policy.estimator, cfg_.policy.host_guard),
      breaker_(cfg_.policy.breaker),
      gpu_queue_("gpu", cfg_.policy.gpu_queue, cfg_.policy.gpu_rates),
      cpu_queue_("cpu", cfg_.policy.cpu_queue, cfg_.policy.cpu_rates),
      host_guard_(cfg_.policy.host_guard),
      pressure_tracker_(cfg_.policy.ladder.pressure),
      state_(cfg_.policy.service),
      failover_(cfg_.policy.failover),
      idempotency_(cfg_.policy.idempotency) {}

Result<std::unique_ptr<Service>> Service::create(DaemonConfig cfg, std::shared_ptr<Backend> backend,
                                                 std::shared_ptr<const Clock> clock, ServiceObserver* observer,
                                                 std::function<void()> wake) {
  TANDEM_TRY(cfg.validate());
  if (!backend) return fail(Errc::invalid_argument, "service: no backend");
  if (!clock) return fail(Errc::invalid_argument, "service: no clock");
  std::unique_ptr<Service> s(new Service(std::move(cfg), std::move(backend), std::move(clock), observer, std::move(wake)));
  JobJournal::Options jo;
  jo.dir = s->cfg_.journal.dir;
  jo.max_bytes = s->cfg_.journal.max_bytes;
  jo.retention = s->cfg_.journal.retention;
  jo.max_jobs = s->cfg_.journal.max_jobs;
  jo.fsync = s->cfg_.journal.fsync;
  auto j = JobJournal::open(jo);
  if (!j) return fail(std::move(j).error());
  s->journal_ = std::move(j).value();
  TANDEM_TRY(s->restore());
  s->start_workers();
  s->refresh_readings();
  s->update_service_state();
  return s;
}

Service::~Service() {
  for (auto& [id, j] : jobs_) j->cancel->store(true);
  if (gpu_pool_) gpu_pool_->stop();
  if (cpu_pool_) cpu_pool_->stop();
  if (maint_pool_) maint_pool_->stop();
  if (journal_) (void)journal_->sync();
}

void Service::start_workers() {
  gpu_pool_ = std::make_unique<TaskPool>("gpu", cfg_.policy.gpu_queue.concurrency);
  cpu_pool_ = std::make_unique<TaskPool>("cpu", cfg_.policy.cpu_queue.concurrency);
  maint_pool_ = std::make_unique<TaskPool>("maint", 1);
}

// Jobs from the journal: terminal ones are readable; the rest were in flight when the daemon died and become
// failed-resumable with the checkpoint the journal holds. Idempotency keys resolve to them again.
Status Service::restore() {
  const auto now_ms = unix_ms();
  const auto now = clock_->now();
  // A copy: the outcome appended below for a job left in flight may compact the journal, which erases entries.
  const std::map<std::uint64_t, JournalJob> replayed = journal_->jobs();
  for (const auto& [id, jj] : replayed) {
    auto rec = std::make_unique<JobRecord>();
    rec->id = id;
    rec->model = jj.model;
    rec->key = jj.idempotency_key;
    rec->digest = jj.request_digest;
    rec->uid = jj.owner_uid;
    rec->accepted_unix_ms = jj.accepted_unix_ms;
    rec->tokens = jj.tokens;
    rec->text = jj.text;
    rec->journaled_tokens = static_cast<std::uint32_t>(jj.tokens.size());
    rec->phase = jj.phase;
    rec->reason = jj.reason;
    rec->finish_reason = jj.finish_reason;
    rec->error_code = jj.error_code;
    rec->error_message = jj.error_message;
    rec->retry_after_ms = static_cast<std::uint64_t>(std::max<std::int64_t>(0, jj.retry_after_ms));
    rec->finished_unix_ms = jj.finished_unix_ms;
    rec->accepted_at = now;
    if (auto rj = json::parse(jj.route_json.empty() ? std::string("{}") : jj.route_json, nullptr, false); rj.is_object()) {
      const std::string dev = rj.value("device", "gpu");
      rec->route.device = dev == "cpu" ? policy::Device::cpu : dev == "hybrid" ? policy::Device::hybrid : policy::Device::gpu;
      rec->route.gpu_layers = rj.value("gpu_layers", 0u);
      rec->route.fallback_model = rj.value("fallback_model", false);
      rec->route.model = rj.value("model", jj.model);
      if (!jj.route_json.empty()) rec->routes.push_back(dev);
    }
    rec->attempts_restored = jj.attempts;
    for (const auto& h : jj.history_json) {
      auto hj = json::parse(h, nullptr, false);
      if (hj.is_object())
        rec->history.emplace_back(hj.value("from", ""), hj.value("to", ""), hj.value("reason", ""),
                                  hj.value("at_unix_ms", std::int64_t{0}));
    }
    auto rj = json::parse(jj.request_json, nullptr, false);
    if (rj.is_object()) {
      rec->request_json = rj;
      rec->req.model = rj.value("model", "");
      rec->req.prompt = rj.value("prompt", "");
      if (rj.contains("messages") && rj["messages"].is_array())
        for (const auto& m : rj["messages"]) rec->req.messages.push_back({m.value("role", ""), m.value("content", "")});
      rec->max_new_tokens = rj.value("max_new_tokens", 0u);
      rec->sampling.temperature = rj.value("temperature", 0.0);
      rec->sampling.top_k = rj.value("top_k", 0);
      rec->sampling.top_p = rj.value("top_p", 1.0);
      rec->sampling.repetition_penalty = rj.value("repetition_penalty", 1.0);
      rec->sampling.seed = rj.value("seed", std::uint64_t{0});
      rec->stop = rj.value("stop", std::vector<std::string>{});
      rec->side_effects = rj.value("side_effects", false);
      rec->prefill_chunk = rj.value("prefill_chunk", 0u);
      rec->resume = rj.value("resume_tokens", std::vector<TokenId>{});
      rec->req.options.allow_cpu = rj.value("allow_cpu", true);
      rec->req.options.allow_reduce = rj.value("allow_reduce", false);
      rec->req.options.allow_fallback_model = rj.value("allow_fallback_model", false);
      rec->req.options.side_effects = rec->side_effects;
      rec->req.options.seed = rec->sampling.seed;
      rec->req.options.max_tokens = rec->max_new_tokens;
      rec->req.options.stop = rec->stop;
      // Resume re-prepares the request from its options: the sampling parameters must survive a restart too.
      rec->req.options.temperature = rec->sampling.temperature;
      rec->req.options.top_k = static_cast<std::uint32_t>(std::max(0, rec->sampling.top_k));
      rec->req.options.top_p = rec->sampling.top_p;
      rec->req.options.repetition_penalty = rec->sampling.repetition_penalty;
      rec->req.options.prefill_chunk = rec->prefill_chunk;
      if (!rec->key.empty()) rec->req.options.idempotency_key = rec->key;
    }
    if (!jj.terminal()) {
      // In flight when the daemon stopped: failed-resumable at the journaled checkpoint.
      const std::string reason = "daemon_restart";
      rec->history.emplace_back(rec->phase, "failed", reason, now_ms);
      rec->phase = "failed";
      rec->reason = reason;
      rec->error_code = std::string(errc_name(Errc::resumable));
      rec->error_message = "tandemd stopped while the job was " + jj.phase + "; resume from the checkpoint (" +
                           std::to_string(rec->tokens.size()) + " tokens)";
      rec->retry_after_ms = 0;
      rec->finished_unix_ms = now_ms;
      // The outcome record is the transition to failed (a transition record may only name a non-terminal phase).
      TANDEM_TRY(journal_->outcome(id, "failed", reason, rec->tokens, rec->text, rec->error_code,
                                   rec->error_message, 0, "", now_ms));
      ++counters_["jobs_recovered_failed"];
    }
    if (!rec->key.empty()) {
      auto claim = idempotency_.claim(rec->key, id, rec->digest, now, /*resume=*/true);
      if (claim) {
        policy::JobPhase ph = rec->phase == "completed" ? JobPhase::completed
                              : rec->phase == "cancelled" ? JobPhase::cancelled
                                                          : JobPhase::failed;
        (void)idempotency_.record_outcome(rec->key, id, {ph, rec->reason, now});
      }
    }
    jobs_.emplace(id, std::move(rec));
  }
  next_id_ = journal_->max_job_id() + 1;
  TANDEM_TRY(journal_->sync());
  return {};
}

// ---------------------------------------------------------------------------------------------------------------
// Requests

Result<Service::Prepared> Service::prepare(const Caller& c, const SubmitRequest& req, bool for_plan) {
  if (!c.may_submit && !c.admin)
    return fail(Errc::permission_denied, "uid " + std::to_string(c.uid) + " may not submit (needs group '" +
                                             cfg_.auth.submit_group + "')");
  if (draining_ && !for_plan) return fail(Errc::unavailable, "tandemd is stopping; retry_after_ms=5000");
  Prepared p;
  p.req = req;
  const std::string name = req.model.empty() ? (cfg_.default_model.empty() ? cfg_.models.front().name : cfg_.default_model)
                                             : req.model;
  for (const auto& m : backend_->models())
    if (m.name == name) p.model = &m;
  if (!p.model) return fail(Errc::not_found, "unknown model '" + name.substr(0, 128) + "'");
  p.req.model = name;
  const auto& rt = cfg_.runtime;
  const auto& o = req.options;
  // Prompt.
  if (req.prompt.size() > rt.max_prompt_bytes)
    return fail(Errc::invalid_argument, "prompt must be at most " + std::to_string(rt.max_prompt_bytes) + " bytes, got " +
                                            std::to_string(req.prompt.size()));
  if (!req.messages.empty() && !req.prompt.empty())
    return fail(Errc::invalid_argument, "give either prompt or messages, not both");
  if (req.messages.empty() && req.prompt.empty() && !(o.resume_tokens && !o.resume_tokens->empty()))
    return fail(Errc::invalid_argument, "prompt and messages are both empty");
  if (req.messages.size() > rt.max_messages)
    return fail(Errc::invalid_argument, "at most " + std::to_string(rt.max_messages) + " messages, got " +
                                            std::to_string(req.messages.size()));
  std::size_t total = req.prompt.size();
  if (!valid_utf8(req.prompt)) return fail(Errc::invalid_argument, "prompt is not valid UTF-8");
  for (const auto& m : req.messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
      return fail(Errc::invalid_argument, "message role must be system, user or assistant, got '" +
                                              m.role.substr(0, 32) + "'");
    if (!valid_utf8(m.content)) return fail(Errc::invalid_argument, "message content is not valid UTF-8");
    total += m.content.size();
  }
  if (total > rt.max_prompt_bytes)
    return fail(Errc::invalid_argument, "prompt must be at most " + std::to_string(rt.max_prompt_bytes) +
                                            " bytes in all, got " + std::to_string(total));
  // Sampling and limits.
  p.sampling = p.model->default_sampling;
  if (o.temperature) p.sampling.temperature = *o.temperature;
  if (o.top_k) p.sampling.top_k = static_cast<int>(std::min<std::uint32_t>(*o.top_k, 2000000));
  if (o.top_p) p.sampling.top_p = *o.top_p;
  if (o.repetition_penalty) p.sampling.repetition_penalty = *o.repetition_penalty;
  p.sampling.seed = o.seed.value_or(0);
  if (auto st = p.sampling.validate(); !st) return fail(Errc::invalid_argument, st.error().message);
  p.max_new_tokens = o.max_tokens.value_or(p.model->default_max_new_tokens);
  if (p.max_new_tokens < 1 || p.max_new_tokens > p.model->max_context)
    return fail(Errc::invalid_argument, "max_tokens must be in [1," + std::to_string(p.model->max_context) +
                                            "], got " + std::to_string(p.max_new_tokens));
  p.stop = p.model->default_stop;
  if (!req.messages.empty()) p.stop.insert(p.stop.end(), p.model->chat_stop.begin(), p.model->chat_stop.end());
  if (o.stop) {
    if (o.stop->size() > 16) return fail(Errc::invalid_argument, "stop: at most 16 strings");
    for (const auto& s : *o.stop) {
      if (s.empty() || s.size() > 256) return fail(Errc::invalid_argument, "stop strings must be 1..256 bytes");
      if (!valid_utf8(s)) return fail(Errc::invalid_argument, "stop string is not valid UTF-8");
      p.stop.push_back(s);
    }
  }
  {  // config stops + template stops + the request's: deduplicated, at most 16 (the engine's limit)
    std::vector<std::string> merged;
    for (auto& st : p.stop)
      if (std::find(merged.begin(), merged.end(), st) == merged.end()) merged.push_back(st);
    if (merged.size() > 16)
      return fail(Errc::invalid_argument, "stop: at most 16 strings in all (with the model's " +
                                              std::to_string(merged.size() - (o.stop ? o.stop->size() : 0)) + "), got " +
                                              std::to_string(merged.size()));
    p.stop = std::move(merged);
  }
  if (o.idempotency_key && (o.idempotency_key->empty() || o.idempotency_key->size() > 240 || !valid_utf8(*o.idempotency_key)))
    return fail(Errc::invalid_argument, "idempotency_key must be 1..240 bytes of UTF-8");
  if (o.deadline_ms && (*o.deadline_ms == 0 || *o.deadline_ms > 7ull * 24 * 3600 * 1000))
    return fail(Errc::invalid_argument, "deadline_ms must be in [1,604800000]");
  p.prefill_chunk = o.prefill_chunk.value_or(0);
  if (p.prefill_chunk > p.model->max_context)
    return fail(Errc::invalid_argument, "prefill_chunk must be in [0," + std::to_string(p.model->max_context) + "]");
  if (o.resume_tokens) {
    if (o.resume_tokens->size() >= p.max_new_tokens)
      return fail(Errc::invalid_argument, "resume_tokens (" + std::to_string(o.resume_tokens->size()) +
                                              ") must be fewer than max_tokens");
    for (auto t : *o.resume_tokens)
      if (t < 0 || static_cast<std::uint32_t>(t) >= p.model->shape.vocab)
        return fail(Errc::invalid_argument, "resume_tokens: id " + std::to_string(t) + " outside the vocabulary");
    p.resume = *o.resume_tokens;
  }
  // Tokenize (the prompt the model sees).
  auto ids = backend_->encode(p.model->name, req.prompt, req.messages);
  if (!ids) return fail(std::move(ids).error());
  p.prompt = std::move(ids).value();
  if (p.prompt.size() + p.max_new_tokens > p.model->max_context)
    return fail(Errc::invalid_argument, "prompt (" + std::to_string(p.prompt.size()) + " tokens) + max_tokens (" +
                                            std::to_string(p.max_new_tokens) + ") exceed the model's context of " +
                                            std::to_string(p.model->max_context));
  p.shape.prompt_tokens = static_cast<std::uint32_t>(p.prompt.size() + p.resume.size());
  p.shape.max_new_tokens = p.max_new_tokens - static_cast<std::uint32_t>(p.resume.size());
  p.shape.prefill_chunk = p.prefill_chunk;
  p.shape.allow_reduce = o.allow_reduce.value_or(false);
  p.shape.allow_cpu = o.allow_cpu.value_or(true);
  // A checkpoint's ids are the requested model's: a resumed request never goes to a fallback model.
  p.shape.allow_fallback_model = o.allow_fallback_model.value_or(false) && p.resume.empty();
  p.shape.side_effects = o.side_effects.value_or(false);
  // The request as stored (and digested for idempotency: the same key must name the same request).
  json msgs = json::array();
  for (const auto& m : req.messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
  p.request_json = json{{"model", p.req.model}, {"prompt", req.prompt}, {"messages", msgs},
                        {"max_new_tokens", p.max_new_tokens}, {"temperature", p.sampling.temperature},
                        {"top_k", p.sampling.top_k}, {"top_p", p.sampling.top_p},
                        {"repetition_penalty", p.sampling.repetition_penalty}, {"seed", p.sampling.seed},
                        {"stop", o.stop.value_or(std::vector<std::string>{})}, {"side_effects", p.shape.side_effects},
                        {"allow_cpu", p.shape.allow_cpu}, {"allow_reduce", p.shape.allow_reduce},
                        {"allow_fallback_model", p.shape.allow_fallback_model}, {"prefill_chunk", p.prefill_chunk}};
  json digest_input = p.request_json;
  const auto dig = Sha256::of(digest_input.dump());
  for (int i = 0; i < 8; ++i) p.digest = (p.digest << 8) | dig[i];
  p.request_json["resume_tokens"] = p.resume;
  return p;
}

policy::AdmissionSnapshot Service::snapshot(const ModelInfo& m, const policy::RequestShape& r,
                                            std::optional<JobId> self, Clock::duration waited) const {
  const auto now = clock_->now();
  policy::AdmissionSnapshot s;
  s.model = m.shape;
  s.request = r;
  s.gpu = policy::make_gpu_view(headroom_, pressure_, breaker_, gpu_queue_, ledger_, now, ledger_.is_resident(m.name),
                                /*offload_supported=*/false, self);
  s.gpu.present = gpu_usable(m.name);
  s.gpu.waited = waited;
  std::optional<policy::ModelShape> fallback;
  if (!m.fallback.empty() && backend_->cpu_ready(m.fallback))
    for (const auto& f : backend_->models())
      if (f.name == m.fallback) fallback = f.shape;
  // Same files and settings → same fingerprint; a CPU-only model is its own reference.
  s.cpu = policy::make_cpu_view(cpu_queue_, host_guard_, host_reading_, backend_->cpu_ready(m.name),
                                /*fingerprint_compatible=*/true, fallback, self);
  return s;
}

bool Service::gpu_usable(const std::string& model) const {
  auto acc = backend_->accelerator();
  return acc && !device_lost_ && holds_.empty() && backend_->gpu_ready(model);
}

policy::Decision Service::decide(const Prepared& p, std::optional<JobId> self, Clock::duration waited) {
  return admission_.decide(snapshot(*p.model, p.shape, self, waited));
}

Result<Dict> Service::plan(const Caller& c, const SubmitRequest& req) {
  auto p = prepare(c, req, /*for_plan=*/true);
  if (!p) return fail(std::move(p).error());
  refresh_readings();
  const Decision d = decide(*p, std::nullopt, {});
  Dict out;
  out["action"] = action_name(d.action);
  out["reason"] = std::string(policy::reason_name(d.reason));
  out["detail"] = d.detail;
  out["route"] = route_name(d.route);
  out["model"] = d.route.model.empty() ? p->model->name : d.route.model;
  out["fallback_model"] = d.route.fallback_model;
  out["max_new_tokens"] = d.max_new_tokens;
  out["prefill_chunk"] = d.prefill_chunk;
  out["gpu_layers"] = d.route.gpu_layers;
  out["eta_ms"] = to_ms(d.eta);
  out["retry_after_ms"] = to_ms(d.retry_after);
  out["permanent"] = d.permanent;
  out["pressure"] = std::string(policy::pressure_name(d.pressure));
  out["prompt_tokens"] = p->shape.prompt_tokens;
  std::vector<std::pair<std::string, std::string>> skipped;
  for (const auto& s : d.skipped) skipped.emplace_back(action_name(s.rung), std::string(policy::reason_name(s.reason)));
  out["skipped"] = skipped;
  const auto& b = d.breakdown;
  out["breakdown"] = std::map<std::string, std::uint64_t>{
      {"weights", b.weights_bytes}, {"kv_cache", b.kv_bytes}, {"activations", b.activation_bytes},
      {"fragmentation", b.fragmentation_bytes}, {"total", b.total_bytes}, {"kv_blocks", b.kv_blocks},
      {"layers", b.layers}};
  const auto& h = d.headroom;
  out["headroom"] = std::map<std::string, std::int64_t>{
      {"total", static_cast<std::int64_t>(h.total_bytes)}, {"margin", static_cast<std::int64_t>(h.margin_bytes)},
      {"predicted_headroom", h.predicted_headroom}, {"observed_headroom", h.observed_headroom},
      {"headroom", h.headroom}, {"unmaterialized", static_cast<std::int64_t>(h.unmaterialized_bytes)}};
  if (d.host)
    out["host"] = std::map<std::string, std::uint64_t>{{"mapped_weights", d.host->mapped_weights_bytes},
                                                       {"kv", d.host->kv_bytes},
                                                       {"activations", d.host->activation_bytes}};
  return out;
}

Result<Dict> Service::submit(const Caller& c, const SubmitRequest& req) {
  auto p = prepare(c, req, /*for_plan=*/false);
  if (!p) return fail(std::move(p).error());
  const auto now = clock_->now();
  // Idempotency: the same key returns the job it named (never a second run).
  if (const auto& key = p->req.options.idempotency_key) {
    if (auto found = idempotency_.find(scoped_key(c.uid, *key))) {
      JobRecord* j = find(found->job);
      if (j) {
        if (j->digest != p->digest)
          return fail(Errc::duplicate, "idempotency_key '" + key->substr(0, 64) + "' names job " +
                                           std::to_string(j->id) + " with a different request");
        if (j->phase == "failed")
          return fail(Errc::resumable, "job " + std::to_string(j->id) + " for this idempotency key failed (" +
                                           j->reason + "): call Resume; job=" + std::to_string(j->id) +
                                           "; tokens=" + std::to_string(j->tokens.size()) +
                                           "; retry_after_ms=" + std::to_string(j->retry_after_ms));
        Dict out = placement(*j);
        out["existing"] = true;
        if (!j->terminal()) {  // the client that retries (often after a crash) gets the rest of the updates
          j->owner = c.bus_name;
          j->reply_to = c.reply_to;
          j->muted = false;
        }
        return out;
      }
    }
  }
  if (active_jobs_of(c.bus_name) >= cfg_.runtime.max_jobs_per_client)
    return fail(Errc::queue_full, "at most " + std::to_string(cfg_.runtime.max_jobs_per_client) +
                                      " unfinished jobs per client; retry_after_ms=1000");
  refresh_readings();
  update_service_state();  // a degraded-mode change is announced before this job's placement
  const Decision d = decide(*p, std::nullopt, {});
  if (!d.accepted()) {
    ++counters_["jobs_rejected"];
    return rejected_error(d);
  }
  (void)now;
  return accept(c, std::move(p).value(), d, std::nullopt);
}

Result<Dict> Service::accept(const Caller& c, Prepared p, const Decision& d, std::optional<JobId> resumed_from) {
  const auto now = clock_->now();
  auto rec = std::make_unique<JobRecord>();
  JobRecord& j = *rec;
  j.id = next_id_;
  j.fsm.emplace(j.id, p.sampling.seed, p.model->name, now);
  j.req = p.req;
  j.request_json = p.request_json;
  j.owner = c.bus_name;
  j.reply_to = c.reply_to;
  j.uid = c.uid;
  j.model = p.model->name;
  j.prompts[p.model->name] = p.prompt;
  j.sampling = p.sampling;
  j.max_new_tokens = d.max_new_tokens ? d.max_new_tokens + static_cast<std::uint32_t>(p.resume.size()) : p.max_new_tokens;
  j.stop = p.stop;
  j.prefill_chunk = d.prefill_chunk;
  j.resume = p.resume;
  j.tokens = p.resume;
  j.shape = p.shape;
  j.digest = p.digest;
  j.key = p.req.options.idempotency_key ? scoped_key(c.uid, *p.req.options.idempotency_key) : "";
  j.side_effects = p.shape.side_effects;
  j.stream = p.req.options.stream.value_or(true);
  j.route = d.route;
  if (j.route.model.empty()) j.route.model = p.model->name;
  j.decision = d;
  j.accepted_unix_ms = unix_ms();
  j.accepted_at = now;
  if (p.req.options.deadline_ms) j.deadline = now + std::chrono::milliseconds(*p.req.options.deadline_ms);
  j.degraded = d.route.device != policy::Device::gpu || d.route.fallback_model;
  if (d.host) j.host = d.host;

  if (!j.key.empty()) {  // would the key be ours? (checked before the journal write; claimed after it)
    auto found = idempotency_.find(j.key);
    const bool can_claim = !found || (resumed_from && found->outcome && found->outcome->phase == JobPhase::failed);
    auto claim = can_claim ? Result<policy::Claim>(policy::Claim{j.id, true, std::nullopt})
                           : Result<policy::Claim>(policy::Claim{found->job, false, found->outcome});
    if (!claim) return fail(std::move(claim).error());
    if (!claim->created) {  // the key names another job (a second Resume, a pruned record): never a second run
      if (const JobRecord* other = find(claim->job)) {
        Dict out = placement(*other);
        out["existing"] = true;
        return out;
      }
      return fail(Errc::duplicate, "idempotency_key '" + j.key.substr(0, 64) + "' names job " +
                                       std::to_string(claim->job) + ", which is no longer kept");
    }
  }
  // Durable before acknowledged.
  JournalJob jj;
  jj.id = j.id;
  jj.model = j.model;
  jj.idempotency_key = j.key;
  jj.request_digest = j.digest;
  jj.owner_uid = j.uid;
  jj.request_json = j.request_json.dump();
  jj.accepted_unix_ms = j.accepted_unix_ms;
  if (auto st = journal_->accepted(jj); !st) {
    log::error("journal write failed, job not accepted: {}", st.error().message);
    return fail(Errc::internal, "could not journal the job (" + st.error().message + "); it was not accepted");
  }
  ++next_id_;
  ++counters_["jobs_accepted"];
  if (!j.key.empty())
    if (auto claim = idempotency_.claim(j.key, j.id, j.digest, now, resumed_from.has_value()); !claim)
      log::error("job {}: idempotency key not recorded: {}", j.id, claim.error().message);
  j.history.emplace_back("", "queued", "accepted", j.accepted_unix_ms);
  JobRecord* jp = rec.get();
  jobs_.emplace(j.id, std::move(rec));
  active_.insert(jp->id);

  // Place it.
  const policy::QueueEntry entry{jp->id, jp->shape.prompt_tokens, jp->shape.max_new_tokens, now};
  Status placed;
  if (d.action == Rung::route_cpu) {
    jp->queue = "cpu";
    placed = cpu_queue_.enqueue(entry);
  } else if (d.action == Rung::delay) {
    jp->queue = "gpu";
    placed = gpu_queue_.enqueue(entry);
  } else {  // admit, reduce, offload: the policy checked the slot, the memory and that nothing is queued ahead
    jp->queue = "gpu";
    placed = gpu_queue_.enqueue(entry);
  }
  if (!placed) {
    end_job(*jp, JobPhase::failed, "queue_error", Errc::internal, placed.error().message, 1s);
  } else {
    emit(*jp, "accepted", {{"model", jp->model}, {"route", route_name(jp->route)}});
    Dict routed{{"route", route_name(jp->route)},
                {"reason", std::string(policy::reason_name(d.reason))},
                {"model", jp->route.model},
                {"fallback_model", jp->route.fallback_model},
                {"degraded", jp->degraded},
                {"queue", jp->queue},
                {"eta_ms", to_ms(d.eta)}};
    emit(*jp, "routed", routed);
    if (jp->degraded)
      log::info("job {} routed {}: {} ({})", jp->id, route_name(jp->route), policy::reason_name(d.reason), d.detail);
    pump();
  }
  Dict out = placement(*jp);
  out["existing"] = false;
  return out;
}

Dict Service::placement(const JobRecord& j) const {
  Dict out;
  out["job_id"] = j.id;
  out["state"] = j.phase;
  out["action"] = action_name(j.decision.action);
  out["reason"] = std::string(policy::reason_name(j.decision.reason));
  out["detail"] = j.decision.detail;
  out["route"] = route_name(j.route);
  out["queue"] = j.queue;
  std::uint32_t pos = 0;
  std::uint64_t eta = 0;
  const policy::JobQueue* q = j.queue == "gpu" ? &gpu_queue_ : j.queue == "cpu" ? &cpu_queue_ : nullptr;
  if (q) {
    if (auto p = q->position(j.id)) pos = static_cast<std::uint32_t>(*p + 1);
    if (auto e = q->eta_start(j.id)) eta = to_ms(*e);
    eta += to_ms(q->rates().service_time(j.shape.prompt_tokens, j.shape.max_new_tokens));
  }
  out["queue_position"] = pos;  // 1 = next; 0 = running or not queued
  out["eta_ms"] = std::max(eta, to_ms(j.decision.eta));
  out["model"] = j.route.model.empty() ? j.model : j.route.model;
  out["fallback_model"] = j.route.fallback_model;
  std::string fp;
  for (const auto& m : backend_->models())
    if (m.name == (j.route.model.empty() ? j.model : j.route.model)) fp = m.fingerprint;
  out["fingerprint"] = fp;
  out["max_new_tokens"] = j.max_new_tokens;
  out["prefill_chunk"] = j.prefill_chunk;
  out["gpu_layers"] = j.route.gpu_layers;
  out["degraded"] = j.degraded;
  // How much slower than the GPU this route is expected to be (smoothed decode rates; 1 on the GPU).
  const double cpu_tps = cpu_queue_.rates().decode_tps();
  out["expected_slowdown"] = j.route.device == policy::Device::cpu && cpu_tps > 0
                                 ? gpu_queue_.rates().decode_tps() / cpu_tps
                                 : 1.0;
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Scheduling

void Service::pump() {
  const auto now = clock_->now();
  // GPU queue head: decided again (memory, breaker, holds may have changed since it was queued).
  for (int guard = 0; guard < 1024; ++guard) {
    const auto* head = gpu_queue_.head();
    if (!head) break;
    JobRecord* j = find(head->id);
    if (!j) {
      gpu_queue_.remove(head->id);
      continue;
    }
    const ModelInfo* mi = nullptr;
    for (const auto& m : backend_->models())
      if (m.name == j->model) mi = &m;
    if (!mi) {
      gpu_queue_.remove(j->id);
      end_job(*j, JobPhase::failed, "model_gone", Errc::not_found, "model " + j->model + " is gone", 0s);
      continue;
    }
    const auto waited = now - j->accepted_at;
    const Decision d = admission_.decide(snapshot(*mi, j->shape, j->id, waited));
    if (d.action == Rung::admit || d.action == Rung::reduce || d.action == Rung::offload) {
      if (!gpu_queue_.has_free_slot()) break;
      auto e = gpu_queue_.start_next();
      if (!e) break;
      j->decision = d;
      j->route = d.route;
      if (j->route.model.empty()) j->route.model = j->model;
      if (d.action == Rung::reduce) {
        j->max_new_tokens = d.max_new_tokens + static_cast<std::uint32_t>(j->resume.size());
        j->prefill_chunk = d.prefill_chunk;
      }
      j->gpu_reserved = d.breakdown.job_bytes();
      if (auto st = ledger_.reserve(j->id, j->gpu_reserved); !st) (void)ledger_.resize(j->id, j->gpu_reserved);
      dispatch(*j, j->route);
      continue;
    }
    if (d.action == Rung::delay) break;  // FIFO: nothing overtakes the head
    if (d.action == Rung::route_cpu) {
      gpu_queue_.remove(j->id);
      j->decision = d;
      j->route = d.route;
      if (j->route.model.empty()) j->route.model = j->model;
      j->degraded = true;
      if (d.host) j->host = d.host;
      to_cpu_queue(*j, std::string(policy::reason_name(d.reason)));
      continue;
    }
    // reject after acceptance: the job ends failed-resumable, never silently.
    gpu_queue_.remove(j->id);
    j->queue.clear();
    end_job(*j, JobPhase::failed, std::string(policy::reason_name(d.reason)), Errc::resumable,
            "could not be placed after waiting: " + d.detail, d.retry_after);
  }
  // CPU queue: FIFO, bounded concurrency, and the host-memory guard.
  for (int guard = 0; guard < 1024; ++guard) {
    const auto* head = cpu_queue_.head();
    if (!head || !cpu_queue_.has_free_slot()) break;
    JobRecord* j = find(head->id);
    if (!j) {
      cpu_queue_.remove(head->id);
      continue;
    }
    const std::string serving = j->route.model.empty() ? j->model : j->route.model;
    const ModelInfo* mi = nullptr;
    for (const auto& m : backend_->models())
      if (m.name == serving) mi = &m;
    if (!mi || !backend_->cpu_ready(serving)) {
      cpu_queue_.remove(j->id);
      j->queue.clear();
      end_job(*j, JobPhase::failed, "cpu_unavailable", Errc::resumable, "no CPU replica of " + serving, 5s);
      continue;
    }
    policy::RequestShape r = j->shape;
    r.prompt_tokens = static_cast<std::uint32_t>((j->prompts.count(serving) ? j->prompts[serving].size() : r.prompt_tokens) +
                                                 j->tokens.size());
    const auto est = policy::estimate_host_job(mi->shape, r, cfg_.policy.estimator, cfg_.policy.host_guard);
    const auto check = host_guard_.check(est, host_reading_);
    if (check.fit == policy::HostFit::wait) break;
    if (check.fit == policy::HostFit::never) {
      cpu_queue_.remove(j->id);
      j->queue.clear();
      end_job(*j, JobPhase::failed, "host_memory", Errc::resumable,
              "the CPU route needs " + format_mib(check.need_bytes) + " of host memory; the budget is " +
                  format_mib(check.budget.bytes),
              30s);
      continue;
    }
    auto adm = host_guard_.admit(j->id, est, host_reading_);
    if (!adm) break;
    j->host_admitted = true;
    j->host = est;  // what the guard holds for it (set_policy re-admits from this)
    auto e = cpu_queue_.start_next();
    if (!e) break;
    policy::Route route = j->route;
    route.device = policy::Device::cpu;
    route.gpu_layers = 0;
    dispatch(*j, route);
  }
}

void Service::to_cpu_queue(JobRecord& j, const std::string& why) {
  j.queue = "cpu";
  const policy::QueueEntry entry{j.id, j.shape.prompt_tokens, j.shape.max_new_tokens, j.accepted_at};
  if (auto st = cpu_queue_.enqueue(entry); !st) {
    j.queue.clear();
    end_job(j, JobPhase::failed, "cpu_queue_full", Errc::resumable, "the CPU queue is full: " + st.error().message, 5s);
    return;
  }
  emit(j, "routed", {{"route", std::string("cpu")}, {"reason", why}, {"model", j.route.model},
                     {"fallback_model", j.route.fallback_model}, {"degraded", true}, {"queue", std::string("cpu")},
                     {"queue_position", static_cast<std::uint32_t>(cpu_queue_.position(j.id).value_or(0) + 1)},
                     {"eta_ms", to_ms(cpu_queue_.eta_start(j.id).value_or(Clock::duration{}))}});
}

void Service::dispatch(JobRecord& j, const policy::Route& route) {
  const auto now = clock_->now();
  j.route = route;
  if (j.route.model.empty()) j.route.model = j.model;
  const std::string serving = j.route.model;
  // A fallback model has its own tokenizer and template: tokenize for it.
  if (!j.prompts.count(serving)) {
    auto ids = backend_->encode(serving, j.req.prompt, j.req.messages);
    if (!ids) {
      (j.queue == "gpu" ? gpu_queue_ : cpu_queue_).finish(j.id);
      release_resources(j);
      end_job(j, JobPhase::failed, "tokenize_failed", ids.error().code, ids.error().message, 0s);
      return;
    }
    j.prompts[serving] = std::move(ids).value();
  }
  const std::string from = j.phase;
  if (auto st = j.fsm->start(j.route, now); !st) {
    log::error("job {}: {}", j.id, st.error().message);
  }
  j.phase = "running";
  j.running = true;
  j.history.emplace_back(from, "running", route_name(j.route), unix_ms());
  j.routes.push_back(route_name(j.route) + (j.route.fallback_model ? "(" + serving + ")" : ""));
  ++j.attempt;
  j.run_started = now;
  j.run_new_tokens = 0;
  journal_transition(j, route_name(j.route));
  emit(j, "started", {{"route", route_name(j.route)}, {"attempt", static_cast<std::uint32_t>(j.fsm->attempts())},
                      {"model", serving}});

  RunSpec spec;
  spec.job = j.id;
  spec.route = j.route;
  spec.prompt = j.prompts[serving];
  spec.sampling = j.sampling;
  spec.max_new_tokens = j.max_new_tokens;
  spec.stop = j.stop;
  spec.resume_tokens = j.tokens;
  spec.prefill_chunk = j.prefill_chunk;
  auto cancel = j.cancel;
  const auto attempt = j.attempt;
  const auto flush = std::chrono::duration_cast<Clock::duration>(cfg_.runtime.token_flush_interval);
  auto task = [this, spec = std::move(spec), cancel, attempt, flush] {
    Sink sink(this, spec.job, attempt, flush);
    RunResult r = backend_->run(spec, sink, *cancel);
    sink.flush();
    WorkerEvent ev;
    ev.kind = WorkerEvent::finished;
    ev.job = spec.job;
    ev.attempt = attempt;
    ev.result = std::move(r);
    post(std::move(ev));
  };
  if (j.route.device == policy::Device::cpu)
    cpu_pool_->post(std::move(task));
  else
    gpu_pool_->post(std::move(task));
}

void Service::release_resources(JobRecord& j) {
  if (j.gpu_reserved || ledger_.find(j.id)) ledger_.release(j.id);
  j.gpu_reserved = 0;
  if (j.host_admitted) host_guard_.release(j.id);
  j.host_admitted = false;
  j.host_materialized = false;
}

void Service::end_job(JobRecord& j, JobPhase phase, const std::string& reason, Errc code, const std::string& message,
                      Clock::duration retry_after) {
  const auto now = clock_->now();
  const std::string from = j.phase;
  if (j.fsm) {
    Status st;
    if (phase == JobPhase::completed) st = j.fsm->complete(now);
    else if (phase == JobPhase::cancelled) st = j.fsm->cancel(now);
    else st = j.fsm->fail(code, reason, retry_after, now);
    if (!st) log::error("job {}: {}", j.id, st.error().message);
  }
  j.phase = std::string(policy::job_phase_name(phase));
  active_.erase(j.id);
  j.reason = reason;
  j.running = false;
  j.queue.clear();
  j.finished_unix_ms = unix_ms();
  if (phase == JobPhase::failed) {
    j.error_code = std::string(errc_name(code));
    j.error_message = message;
    j.retry_after_ms = to_ms(retry_after);
  }
  if (phase == JobPhase::completed && j.finish_reason.empty()) j.finish_reason = reason;
  j.history.emplace_back(from, j.phase, reason, j.finished_unix_ms);
  release_resources(j);
  if (auto st = journal_->outcome(j.id, j.phase, reason, j.tokens, j.text, j.error_code, j.error_message,
                                  static_cast<std::int64_t>(j.retry_after_ms), j.finish_reason, j.finished_unix_ms);
      !st)
    log::error("journal: outcome of job {} not written: {}", j.id, st.error().message);
  if (!j.key.empty()) (void)idempotency_.record_outcome(j.key, j.id, {phase, reason, now});
  ++counters_[phase == JobPhase::completed ? "jobs_completed" : phase == JobPhase::cancelled ? "jobs_cancelled" : "jobs_failed"];
  Dict fin{{"state", j.phase}, {"reason", reason}, {"finish_reason", j.finish_reason},
           {"tokens_total", static_cast<std::uint32_t>(j.tokens.size())}, {"text", j.text}};
  if (phase == JobPhase::failed) {
    fin["error_code"] = j.error_code;
    fin["error_message"] = j.error_message;
    fin["retry_after_ms"] = j.retry_after_ms;
  }
  emit(j, "finished", fin);
  log::job_line(j.id, j.model, route_name(j.route), j.phase, reason, breaker_state());
  if (phase != JobPhase::failed) {  // nothing can resume it: the prompt need not stay in memory
    j.prompts.clear();
    j.req.prompt.clear();
    j.req.prompt.shrink_to_fit();
    j.req.messages.clear();
    j.request_json = json();
  }
}

void Service::on_run_finished(JobRecord& j, const RunResult& r) {
  const auto now = clock_->now();
  j.running = false;
  const bool on_gpu = j.route.device != policy::Device::cpu;
  auto& q = on_gpu ? gpu_queue_ : cpu_queue_;
  q.finish(j.id);
  if (r.new_tokens > 0 && r.decode_time > Clock::duration::zero()) q.rates().observe_decode(r.new_tokens, r.decode_time);
  release_resources(j);
  j.queue.clear();
  // Journal what was delivered.
  if (j.tokens.size() != j.journaled_tokens) {
    (void)journal_->checkpoint(j.id, j.tokens, j.text);
    j.journaled_tokens = static_cast<std::uint32_t>(j.tokens.size());
  }
  if (r.status) {
    if (on_gpu) breaker_event(BreakerEvent::job_succeeded);
    if (r.finish_reason == "cancelled") {
      if (j.stop_cause == "deadline") {
        end_job(j, JobPhase::failed, "deadline", Errc::timeout, "the deadline passed after " +
                                                                   std::to_string(j.tokens.size()) + " tokens", 0s);
      } else if (j.stop_cause == "shutdown") {
        end_job(j, JobPhase::failed, "daemon_stopping", Errc::resumable, "tandemd stopped; resume from the checkpoint", 0s);
      } else {
        end_job(j, JobPhase::cancelled, "cancelled", Errc::cancelled, "", 0s);
      }
      return;
    }
    j.finish_reason = r.finish_reason;
    end_job(j, JobPhase::completed, r.finish_reason, Errc::internal, "", 0s);
    return;
  }
  // The run failed.
  if (j.stop_cause == "cancelled") {
    end_job(j, JobPhase::cancelled, "cancelled", Errc::cancelled, "", 0s);
    return;
  }
  if (on_gpu && (r.accelerator_fault || r.status.error().code == Errc::out_of_memory ||
                 r.status.error().code == Errc::device_lost || r.status.error().code == Errc::kv_exhausted)) {
    on_gpu_failure(j, r);
    return;
  }
  (void)now;
  const Errc ec = r.status.error().code;
  if (ec == Errc::invalid_argument || ec == Errc::not_found || ec == Errc::unsupported) {
    end_job(j, JobPhase::failed, "invalid_request", Errc::invalid_argument, r.status.error().message, 0s);
    return;
  }
  end_job(j, JobPhase::failed, "run_failed", ec == Errc::internal ? Errc::internal : Errc::resumable,
          r.status.error().message, 5s);
}

bool Service::cpu_can_serve(const JobRecord& j) const {
  if (!j.req.options.allow_cpu.value_or(true)) return false;
  if (!backend_->cpu_ready(j.model)) return false;
  if (cpu_queue_.full()) return false;
  if (!cpu_queue_.check_limits(j.shape.prompt_tokens, j.shape.max_new_tokens)) return false;
  for (const auto& m : backend_->models())
    if (m.name == j.model) {
      policy::RequestShape r = j.shape;
      r.prompt_tokens = static_cast<std::uint32_t>(r.prompt_tokens + j.tokens.size());
      const auto est = policy::estimate_host_job(m.shape, r, cfg_.policy.estimator, cfg_.policy.host_guard);
      return host_guard_.check(est, host_reading_).fit != policy::HostFit::never;
    }
  return false;
}

void Service::on_gpu_failure(JobRecord& j, const RunResult& r) {
  const auto& err = r.status.error();
  if (err.code == Errc::device_lost) {
    breaker_event(BreakerEvent::driver_reset);
    if (!device_lost_) {
      device_lost_ = true;
      log::warn("accelerator lost: {}", err.message);
    }
  } else if (err.code == Errc::out_of_memory) {
    breaker_event(BreakerEvent::alloc_failure);
  }
  ++counters_[err.code == Errc::device_lost ? "gpu_device_lost" : "gpu_alloc_failures"];
  policy::FailoverInput in;
  in.tokens_delivered = static_cast<std::uint32_t>(j.tokens.size() - j.resume.size());
  in.sampling_reproducible = true;  // counter-based RNG keyed by (seed, step); CPU replica has the same fingerprint
  in.side_effects = j.side_effects;
  in.cpu_route_available = cpu_can_serve(j);
  const auto fd = failover_.decide(in);
  const auto now = clock_->now();
  const std::string cause = std::string(errc_name(err.code));
  const std::string from = j.phase;
  switch (fd.action) {
    case policy::FailoverAction::retry_on_cpu: {
      (void)j.fsm->begin_retry(cause, now);
      j.phase = "retrying";
      j.history.emplace_back(from, "retrying", cause, unix_ms());
      ++counters_["retries"];
      journal_transition(j, cause);
      j.route.device = policy::Device::cpu;
      j.route.gpu_layers = 0;
      j.degraded = true;
      log::warn("job {}: GPU run failed before any token ({}); retrying on the CPU", j.id, err.message);
      to_cpu_queue(j, "gpu_failure:" + cause);
      break;
    }
    case policy::FailoverAction::migrate_at_checkpoint: {
      (void)j.fsm->record_tokens(in.tokens_delivered);
      (void)j.fsm->begin_migration(cause, now);
      j.phase = "migrating";
      j.history.emplace_back(from, "migrating", cause, unix_ms());
      ++counters_["migrations"];
      journal_transition(j, cause);
      emit(j, "migrated", {{"from", route_name(j.route)}, {"to", std::string("cpu")}, {"reason", cause},
                           {"tokens_delivered", static_cast<std::uint32_t>(j.tokens.size())}});
      j.route.device = policy::Device::cpu;
      j.route.gpu_layers = 0;
      j.degraded = true;
      log::warn("job {}: GPU run failed after {} tokens ({}); migrating to the CPU at the checkpoint", j.id,
                j.tokens.size(), err.message);
      to_cpu_queue(j, "migrated:" + cause);
      break;
    }
    case policy::FailoverAction::fail_resumable:
      end_job(j, JobPhase::failed, fd.reason, Errc::resumable,
              "the GPU run failed (" + err.message + ") after " + std::to_string(j.tokens.size()) +
                  " tokens and the job cannot move (" + fd.reason + "); resume from the checkpoint",
              breaker_.retry_in(now) > Clock::duration::zero() ? breaker_.retry_in(now) : 5s);
      break;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Events from the workers

void Service::post(WorkerEvent ev) {
  {
    std::lock_guard lock(events_mu_);
    events_.push_back(std::move(ev));
  }
  if (wake_) wake_();
}

void Service::process_events() {
  std::deque<WorkerEvent> evs;
  {
    std::lock_guard lock(events_mu_);
    evs.swap(events_);
  }
  bool any = false;
  for (auto& ev : evs) {
    any = true;
    if (ev.kind == WorkerEvent::probe_done) {
      probe_in_flight_ = false;
      const bool ok = static_cast<bool>(ev.status);
      if (!ok) ++counters_["probes_failed"];
      breaker_event(ok ? BreakerEvent::probe_succeeded : BreakerEvent::probe_failed, ev.probe);
      if (ok && device_lost_ && breaker_.state() == policy::BreakerState::closed && !reload_in_flight_) {
        reload_in_flight_ = true;
        maint_pool_->post([this] {
          WorkerEvent r;
          r.kind = WorkerEvent::reload_done;
          r.status = backend_->reload_gpu();
          post(std::move(r));
        });
      }
      continue;
    }
    if (ev.kind == WorkerEvent::reload_done) {
      reload_in_flight_ = false;
      if (ev.status) {
        device_lost_ = false;
        log::warn("accelerator recovered: GPU replicas reloaded");
      } else {
        log::error("reloading the GPU replicas failed: {}", ev.status.error().message);
        breaker_event(BreakerEvent::driver_reset);
      }
      continue;
    }
    JobRecord* j = find(ev.job);
    if (!j || ev.attempt != j->attempt) continue;
    switch (ev.kind) {
      case WorkerEvent::prefilled: {
        auto& q = j->route.device == policy::Device::cpu ? cpu_queue_ : gpu_queue_;
        q.rates().observe_prefill(ev.prefill_tokens, ev.took);
        q.update_progress(j->id, true, 0);
        if (ledger_.find(j->id)) (void)ledger_.materialize(j->id);
        if (j->host_admitted) {
          (void)host_guard_.materialize(j->id);
          j->host_materialized = true;
        }
        break;
      }
      case WorkerEvent::tokens: {
        const auto first_step = static_cast<std::uint32_t>(j->tokens.size());
        j->tokens.insert(j->tokens.end(), ev.ids.begin(), ev.ids.end());
        j->text += ev.text;
        j->run_new_tokens += static_cast<std::uint32_t>(ev.ids.size());
        if (j->fsm && j->phase == "running")
          (void)j->fsm->record_tokens(static_cast<std::uint32_t>(j->tokens.size() - j->resume.size()));
        auto& q = j->route.device == policy::Device::cpu ? cpu_queue_ : gpu_queue_;
        q.update_progress(j->id, true, j->run_new_tokens);
        if (j->stream)
          emit(*j, "tokens", {{"text", ev.text}, {"tokens", ev.ids}, {"step", first_step}});
        // Checkpoints ride along in the journal (synced with the next accept/outcome).
        if (j->tokens.size() >= j->journaled_tokens + 32u) {
          (void)journal_->checkpoint(j->id, j->tokens, j->text);
          j->journaled_tokens = static_cast<std::uint32_t>(j->tokens.size());
        }
        break;
      }
      case WorkerEvent::finished:
        on_run_finished(*j, ev.result);
        break;
      default:
        break;
    }
  }
  if (any) {
    update_service_state();
    pump();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Readings, breaker, state

void Service::refresh_readings() {
  const auto now = clock_->now();
  auto acc = backend_->accelerator();
  for (const auto& m : backend_->models()) {
    const auto bytes = backend_->gpu_resident_bytes(m.name);
    (void)ledger_.set_resident(m.name, bytes);
  }
  if (acc) {
    auto snap = acc->memory();
    if (snap) {
      snapshot_ = *snap;
    } else if (snap.error().code == Errc::device_lost) {
      if (!device_lost_) {
        device_lost_ = true;
        log::warn("accelerator lost: {}", snap.error().message);
        breaker_event(BreakerEvent::driver_reset);
      }
    }
    if (acc->lost() && !device_lost_) {
      device_lost_ = true;
      log::warn("accelerator lost");
      breaker_event(BreakerEvent::driver_reset);
    }
    if (snapshot_) {
      headroom_ = policy::compute_headroom(*snapshot_, ledger_, cfg_.policy.headroom, now);
      pressure_ = pressure_tracker_.update(headroom_.fraction());
    }
  }
  if (auto hr = read_host_memory(); hr) host_reading_ = *hr;
  breaker_.poll(now);
}

void Service::breaker_event(BreakerEvent e, policy::ProbeId probe) {
  const auto before = breaker_.state();
  breaker_.record(e, clock_->now(), probe);
  for (const auto& t : breaker_.drain_transitions())
    log::warn("GPU breaker {} -> {} ({})", policy::breaker_state_name(t.from), policy::breaker_state_name(t.to),
              t.reason);
  if (before != breaker_.state()) update_service_state();
}

void Service::maybe_probe() {
  auto acc = backend_->accelerator();
  if (!acc || probe_in_flight_) return;
  const auto now = clock_->now();
  policy::ProbeId id = policy::kNoProbe;
  if (breaker_.state() == policy::BreakerState::half_open) {
    auto p = breaker_.try_acquire_probe(now);
    if (!p) return;
    id = *p;
  } else if (breaker_.state() == policy::BreakerState::closed) {
    if (now - last_probe_ < std::chrono::duration_cast<Clock::duration>(cfg_.device.probe_interval)) return;
  } else {
    return;
  }
  last_probe_ = now;
  probe_in_flight_ = true;
  ++counters_["probes"];
  const auto deadline = cfg_.device.probe_timeout;
  maint_pool_->post([this, acc, id, deadline] {
    WorkerEvent ev;
    ev.kind = WorkerEvent::probe_done;
    ev.probe = id;
    ev.status = acc->lost() ? Status(fail(Errc::device_lost, "device lost")) : acc->health_probe(deadline);
    post(std::move(ev));
  });
}

void Service::update_service_state() {
  const auto now = clock_->now();
  policy::ServiceInputs in;
  in.pressure = pressure_;
  in.breaker = breaker_.state();
  auto acc = backend_->accelerator();
  bool any_gpu = false;
  for (const auto& m : backend_->models()) any_gpu = any_gpu || m.gpu_configured;
  in.gpu_present = !acc || !any_gpu ? true : !device_lost_;
  if (acc && any_gpu && !device_lost_) {
    bool ready = false;
    for (const auto& m : backend_->models()) ready = ready || backend_->gpu_ready(m.name);
    in.gpu_present = ready;
  }
  in.gpu_held = !holds_.empty();
  for (JobId id : active_)  // a fallback model serving an unfinished job is announced
    if (const JobRecord* j = find(id); j && j->route.fallback_model) {
      in.fallback_model = j->route.model;
      break;
    }
  bool cpu = false;
  for (const auto& m : backend_->models()) cpu = cpu || backend_->cpu_ready(m.name);
  in.cpu_available = cpu;
  in.limits = {cfg_.policy.gpu_queue.max_context, cfg_.policy.gpu_queue.max_new_tokens,
               cfg_.policy.cpu_queue.max_context, cfg_.policy.cpu_queue.max_new_tokens};
  in.reading = headroom_.trust;
  if (!acc || !any_gpu) {
    // No accelerator configured: CPU-only operation is the configured normal, not a degradation.
    in.pressure = policy::Pressure::normal;
    in.reading = policy::ReadingTrust::fresh;
  }
  state_.update(in, now);
  for (const auto& ch : state_.drain_changes()) {
    // normal → normal (the limits filled in by the first update at start): nothing degraded began or ended.
    if (ch.from.level == policy::ServiceLevel::normal && ch.to.level == policy::ServiceLevel::normal) continue;
    const bool degraded = ch.to.level != policy::ServiceLevel::normal;
    if (degraded && degraded_since_unix_ms_ == 0) degraded_since_unix_ms_ = unix_ms();
    if (!degraded) degraded_since_unix_ms_ = 0;
    const double gpu_tps = gpu_queue_.rates().decode_tps();
    const double cpu_tps = cpu_queue_.rates().decode_tps();
    Dict details{{"level", std::string(policy::service_level_name(ch.to.level))},
                 {"fallback_model", ch.to.fallback_model},
                 {"limits", limits_view()},
                 {"expected_slowdown", cpu_tps > 0 ? gpu_tps / cpu_tps : 0.0},
                 {"since_unix_ms", degraded_since_unix_ms_},
                 {"previous", std::string(policy::service_level_name(ch.from.level))}};
    const bool level_changed = ch.from.level != ch.to.level || ch.from.reason != ch.to.reason;
    if (degraded && level_changed)
      log::warn("degraded mode: {} ({}); the CPU route decodes at ~{:.0f} tok/s, the GPU at ~{:.0f} tok/s (smoothed)",
                policy::service_level_name(ch.to.level), ch.to.reason, cpu_tps, gpu_tps);
    else if (!degraded && level_changed)
      log::warn("degraded mode ended: back to normal (was {})", ch.from.reason);
    if (observer_) observer_->degraded_changed(degraded, ch.to.reason, details);
  }
}

void Service::check_deadlines() {
  const auto now = clock_->now();
  const std::vector<JobId> ids(active_.begin(), active_.end());  // end_job() below changes active_
  for (JobId id : ids) {
    JobRecord* jp = find(id);
    if (!jp) continue;
    JobRecord& j = *jp;
    if (j.terminal() || !j.deadline || now < *j.deadline) continue;
    if (j.running) {
      if (j.stop_cause.empty()) {
        j.stop_cause = "deadline";
        j.cancel->store(true);
      }
      continue;
    }
    if (!j.queue.empty()) (j.queue == "gpu" ? gpu_queue_ : cpu_queue_).remove(j.id);
    end_job(j, JobPhase::failed, "deadline", Errc::timeout, "the deadline passed while the job waited", 0s);
  }
}

void Service::tick() {
  refresh_readings();
  maybe_probe();
  check_deadlines();
  update_service_state();
  pump();
  prune_finished();
}

Clock::duration Service::poll_interval() const {
  return std::chrono::duration_cast<Clock::duration>(cfg_.device.poll_interval);
}

// Terminal jobs stay readable (GetJob) as long as the journal keeps them.
void Service::prune_finished() {
  if (jobs_.size() <= cfg_.journal.max_jobs + 64u) return;
  std::size_t terminal = 0;
  for (const auto& [id, j] : jobs_) terminal += j->terminal();
  for (auto it = jobs_.begin(); it != jobs_.end() && terminal > cfg_.journal.max_jobs;) {
    if (it->second->terminal()) {
      it = jobs_.erase(it);
      --terminal;
    } else {
      ++it;
    }
  }
  idempotency_.expire(clock_->now());
}

// ---------------------------------------------------------------------------------------------------------------
// Other methods

Status Service::check_owner(const Caller& c, const JobRecord& j) const {
  if (c.admin || c.uid == j.uid) return {};
  return fail(Errc::permission_denied, "job " + std::to_string(j.id) + " belongs to another user");
}

Result<std::string> Service::cancel(const Caller& c, JobId id) {
  JobRecord* j = find(id);
  if (!j) return fail(Errc::not_found, "no job " + std::to_string(id));
  TANDEM_TRY(check_owner(c, *j));
  if (j->terminal()) return j->phase;
  if (j->running) {
    if (j->stop_cause.empty()) j->stop_cause = "cancelled";
    j->cancel->store(true);
    return std::string("cancelling");
  }
  if (j->queue == "gpu") gpu_queue_.remove(id);
  if (j->queue == "cpu") cpu_queue_.remove(id);
  end_job(*j, JobPhase::cancelled, "cancelled", Errc::cancelled, "", 0s);
  pump();
  return j->phase;
}

Dict Service::job_dict(const JobRecord& j) const {
  Dict d = placement(j);
  d.erase("job_id");
  d["id"] = j.id;
  d["state"] = j.phase;
  d["reason"] = j.reason;
  d["attempts"] = static_cast<std::uint32_t>(j.fsm ? j.fsm->attempts() : j.attempts_restored);
  d["accepted_unix_ms"] = j.accepted_unix_ms;
  d["finished_unix_ms"] = j.finished_unix_ms;
  d["tokens"] = j.tokens;
  d["text"] = j.text;
  d["finish_reason"] = j.finish_reason;
  d["history"] = j.history;
  d["routes"] = j.routes;
  d["error_code"] = j.error_code;
  d["error_message"] = j.error_message;
  d["retry_after_ms"] = j.retry_after_ms;
  d["idempotency_key"] = user_key(j.key);
  d["side_effects"] = j.side_effects;
  d["model"] = j.model;
  if (j.phase == "failed") {
    d["checkpoint_seed"] = j.sampling.seed;
    d["checkpoint_tokens"] = static_cast<std::uint32_t>(j.tokens.size());
    d["checkpoint_model"] = j.route.model.empty() ? j.model : j.route.model;  // the model whose ids they are
  }
  return d;
}

Result<Dict> Service::get_job(const Caller& c, JobId id) const {
  const JobRecord* j = find(id);
  if (!j) return fail(Errc::not_found, "no job " + std::to_string(id));
  TANDEM_TRY(check_owner(c, *j));
  return job_dict(*j);
}

Result<Dict> Service::resume(const Caller& c, JobId id, const SubmitOptions& overrides) {
  JobRecord* old = find(id);
  if (!old) return fail(Errc::not_found, "no job " + std::to_string(id));
  TANDEM_TRY(check_owner(c, *old));
  if (old->phase != "failed")
    return fail(Errc::illegal_transition, "job " + std::to_string(id) + " is " + old->phase +
                                              "; only a failed job can be resumed");
  if (old->error_code == std::string(errc_name(Errc::invalid_argument)))
    return fail(Errc::illegal_transition, "job " + std::to_string(id) + " failed permanently; resubmit a new request");
  if (old->resumed_by) {  // resumed before: that job, not a second run
    if (const JobRecord* next = find(*old->resumed_by)) {
      Dict out = placement(*next);
      out["existing"] = true;
      return out;
    }
  }
  SubmitRequest req = old->req;
  // The checkpoint's token ids belong to the model that produced them (a fallback model has its own vocabulary).
  req.model = old->route.model.empty() ? old->model : old->route.model;
  req.options.override_with(overrides);
  req.options.allow_fallback_model = false;
  req.options.seed = old->sampling.seed;
  req.options.resume_tokens = old->tokens;
  if (!old->key.empty()) req.options.idempotency_key = user_key(old->key);
  if (overrides.idempotency_key && *overrides.idempotency_key != user_key(old->key))
    return fail(Errc::invalid_argument, "Resume keeps the job's idempotency key");
  auto p = prepare(c, req, false);
  if (!p) return fail(std::move(p).error());
  // The digest names the original request (resume tokens are not part of it).
  p->digest = old->digest;
  refresh_readings();
  update_service_state();
  const Decision d = decide(*p, std::nullopt, {});
  if (!d.accepted()) return rejected_error(d);
  Caller owner = c;
  owner.uid = old->uid;  // the job (and its idempotency key) stays its owner's, whoever resumes it
  auto out = accept(owner, std::move(p).value(), d, id);
  if (out && !std::get<bool>(out->at("existing"))) {
    ++counters_["jobs_resumed"];
    old->resumed_by = std::get<std::uint64_t>(out->at("job_id"));
  }
  return out;
}

Result<std::string> Service::hold_gpu(const Caller& c, const std::string& reason, const std::string& app_id) {
  if (!c.admin) return fail(Errc::permission_denied, "holding the GPU needs root or group '" + cfg_.auth.admin_group + "'");
  if (reason.size() > 256 || app_id.size() > 256 || !valid_utf8(reason) || !valid_utf8(app_id))
    return fail(Errc::invalid_argument, "reason and app_id must be at most 256 bytes of UTF-8");
  if (holds_.size() >= 64) return fail(Errc::queue_full, "at most 64 GPU holds; retry_after_ms=1000");
  const auto raw = Sha256::hex(Sha256::of(c.bus_name + "|" + std::to_string(++hold_counter_) + "|" +
                                          std::to_string(unix_ms()) + "|" + std::to_string(::getpid())));
  const std::string cookie = "hold-" + raw.substr(0, 24);
  holds_[cookie] = Hold{c.bus_name, app_id, reason, unix_ms()};
  log::warn("GPU held by {} ({}): {}", app_id.empty() ? c.bus_name : app_id, c.bus_name, reason);
  update_service_state();
  return cookie;
}

Status Service::release_gpu(const Caller& c, const std::string& cookie) {
  auto it = holds_.find(cookie);
  if (it == holds_.end()) return fail(Errc::not_found, "no GPU hold with that cookie");
  if (it->second.owner != c.bus_name && !(c.admin && c.uid == 0))
    return fail(Errc::permission_denied, "only the holder may release a GPU hold");
  log::warn("GPU hold released by {} ({})", it->second.app_id, c.bus_name);
  holds_.erase(it);
  update_service_state();
  pump();
  return {};
}

void Service::client_vanished(const std::string& bus_name) {
  bool changed = false;
  for (auto it = holds_.begin(); it != holds_.end();) {
    if (it->second.owner == bus_name) {
      log::warn("GPU hold of {} released: {} left the bus", it->second.app_id, bus_name);
      it = holds_.erase(it);
      changed = true;
    } else {
      ++it;
    }
  }
  // Its jobs keep running; updates are no longer sent (GetJob still reads them).
  for (JobId id : active_)
    if (JobRecord* j = find(id); j && j->owner == bus_name) {
      j->owner.clear();
      j->reply_to.clear();
    }
  if (changed) {
    update_service_state();
    pump();
  }
}

std::vector<Dict> Service::list_models() const {
  std::vector<Dict> out;
  for (const auto& m : backend_->models()) out.push_back(model_view(m.name));
  return out;
}

Dict Service::model_view(const std::string& name) const {
  for (const auto& m : backend_->models()) {
    if (m.name != name) continue;
    Dict d;
    d["name"] = m.name;
    d["default"] = m.name == (cfg_.default_model.empty() ? cfg_.models.front().name : cfg_.default_model);
    d["fingerprint"] = m.fingerprint;
    d["revision"] = m.revision;
    d["fallback"] = m.fallback;
    d["max_context"] = m.max_context;
    d["template"] = m.template_name;
    d["dtype"] = m.dtype;
    d["weight_bytes"] = m.weight_bytes;
    std::string placement;
    std::uint64_t gpu_bytes = 0, host_bytes = 0;
    for (const auto& r : backend_->replicas(m.name)) {
      if (!placement.empty()) placement += "+";
      placement += r.device;
      if (r.device == "cpu") placement += "(" + r.mode + ")";
      if (r.state != "loaded") placement += "[" + r.state + "]";
      gpu_bytes += r.accel_bytes;
      host_bytes += r.host_bytes;
    }
    d["placement"] = placement;
    d["placement_bytes"] = std::map<std::string, std::uint64_t>{{"storage", m.weight_bytes}, {"host", host_bytes},
                                                                {"gpu", gpu_bytes}};
    return d;
  }
  return {};
}

void Service::channel_closed(const std::string& reply_to) {
  if (reply_to.empty()) return;
  for (JobId id : active_)
    if (JobRecord* j = find(id); j && j->reply_to == reply_to) j->muted = true;
}

std::uint32_t Service::active_jobs_of(const std::string& bus_name) const {
  std::uint32_t n = 0;
  for (JobId id : active_)
    if (const JobRecord* j = find(id); j && j->owner == bus_name) ++n;
  return n;
}

// --- properties ---

std::string Service::state() const { return std::string(policy::service_level_name(state_.current().level)); }
std::string Service::degraded_reason() const { return state_.current().reason; }
std::string Service::breaker_state() const { return std::string(policy::breaker_state_name(breaker_.state())); }
std::string Service::fallback_model() const { return state_.current().fallback_model; }

Dict Service::policy_view() const {
  const auto& p = cfg_.policy;
  std::vector<std::string> order;
  for (auto r : p.ladder.order) order.push_back(action_name(r));
  return Dict{{"margin_bytes", p.headroom.margin.bytes},
              {"margin_fraction", p.headroom.margin.fraction},
              {"ladder_order", order},
              {"max_delay_ms", to_ms(p.ladder.max_delay)},
              {"offload_enabled", p.ladder.offload_enabled},
              {"allow_migration", p.failover.allow_migration},
              {"host_budget_bytes", p.host_guard.budget_bytes},
              {"gpu_concurrency", p.gpu_queue.concurrency},
              {"cpu_concurrency", p.cpu_queue.concurrency}};
}

Status Service::set_policy(const Caller& c, const Dict& changes) {
  if (!c.admin) return fail(Errc::permission_denied, "changing the policy needs root or group '" + cfg_.auth.admin_group + "'");
  policy::PolicyConfig next = cfg_.policy;
  for (const auto& [k, v] : changes) {
    auto want = [&](auto* out) -> Status {
      using T = std::remove_pointer_t<decltype(out)>;
      if (const T* x = std::get_if<T>(&v)) {
        *out = *x;
        return {};
      }
      if constexpr (std::is_same_v<T, double>) {  // an integer where a fraction is expected: 0 or 1
        if (const auto* i = std::get_if<std::uint64_t>(&v)) {
          *out = static_cast<double>(*i);
          return {};
        }
      }
      return fail(Errc::invalid_argument, "Policy." + k + " has the wrong type");
    };
    if (k == "margin_bytes") {
      TANDEM_TRY(want(&next.headroom.margin.bytes));
    } else if (k == "margin_fraction") {
      TANDEM_TRY(want(&next.headroom.margin.fraction));
    } else if (k == "ladder_order") {
      std::vector<std::string> names;
      TANDEM_TRY(want(&names));
      std::vector<Rung> order;
      for (const auto& n : names) {
        bool found = false;
        for (Rung r : {Rung::admit, Rung::delay, Rung::reduce, Rung::offload, Rung::route_cpu, Rung::reject})
          if (n == action_name(r)) {
            order.push_back(r);
            found = true;
          }
        if (!found) return fail(Errc::invalid_argument, "Policy.ladder_order: unknown rung '" + n.substr(0, 32) + "'");
      }
      next.ladder.order = order;
    } else if (k == "max_delay_ms") {
      std::uint64_t ms = 0;
      TANDEM_TRY(want(&ms));
      if (ms > 3600000) return fail(Errc::invalid_argument, "Policy.max_delay_ms must be in [0,3600000]");
      next.ladder.max_delay = std::chrono::milliseconds(ms);
    } else if (k == "offload_enabled") {
      TANDEM_TRY(want(&next.ladder.offload_enabled));
    } else if (k == "allow_migration") {
      TANDEM_TRY(want(&next.failover.allow_migration));
    } else if (k == "host_budget_bytes") {
      TANDEM_TRY(want(&next.host_guard.budget_bytes));
    } else {
      return fail(Errc::invalid_argument, "Policy." + k.substr(0, 64) +
                                              " cannot be changed at run time (writable: margin_bytes, margin_fraction, "
                                              "ladder_order, max_delay_ms, offload_enabled, allow_migration, "
                                              "host_budget_bytes)");
    }
  }
  if (auto st = next.validate(); !st) {  // name the Policy keys the caller set, not only the config path
    std::string keys;
    for (const auto& [k, v] : changes) keys += (keys.empty() ? "Policy." : ", Policy.") + k.substr(0, 64);
    return fail(Errc::invalid_argument, keys + ": " + st.error().message);
  }
  // The host guard keeps its admitted jobs; only its budget changes. A budget below what running CPU jobs hold is
  // refused (they cannot give memory back mid-run): lower it once they finished.
  policy::HostMemoryGuard guard(next.host_guard);
  for (const auto& [id, j] : jobs_)
    if (j->host_admitted && j->host) {
      if (auto adm = guard.admit(id, *j->host, host_reading_); !adm)
        return fail(Errc::invalid_argument, "Policy.host_budget_bytes: running CPU jobs hold " +
                                                format_mib(host_guard_.committed_bytes()) +
                                                "; a budget below that applies once they finished");
      if (j->host_materialized) (void)guard.materialize(id);
    }
  cfg_.policy = next;
  admission_ = policy::AdmissionPolicy(next.ladder, next.estimator, next.host_guard);
  failover_ = policy::FailoverPolicy(next.failover);
  host_guard_ = std::move(guard);
  log::warn("policy changed by uid {}", c.uid);
  refresh_readings();
  update_service_state();
  pump();
  return {};
}

Dict Service::memory_view() const {
  Dict d;
  auto acc = backend_->accelerator();
  d["device"] = acc ? acc->name() : std::string("none");
  d["present"] = acc && !device_lost_;
  const auto& h = headroom_;
  d["total"] = h.total_bytes;
  d["free"] = snapshot_ ? snapshot_->free_bytes : 0;
  d["observed_used"] = h.observed_used_bytes;
  d["predicted_used"] = h.predicted_used_bytes;
  d["margin"] = h.margin_bytes;
  d["foreign"] = h.foreign_used_bytes;
  d["unmaterialized"] = h.unmaterialized_bytes;
  d["headroom"] = h.headroom;
  d["prediction_error"] = h.prediction_error_bytes;
  d["reading_age_ms"] = to_ms(h.reading_age);
  d["trust"] = std::string(policy::trust_name(h.trust));
  d["pressure"] = std::string(policy::pressure_name(pressure_));
  return d;
}

Dict Service::host_memory_view() const {
  Dict d;
  const auto b = host_guard_.budget(host_reading_);
  d["budget"] = b.bytes;
  d["bound"] = std::string(policy::host_bound_name(b.bound));
  d["configured_budget"] = cfg_.policy.host_guard.budget_bytes;
  d["cgroup_max"] = host_reading_.cgroup_max.value_or(0);
  d["mem_available"] = host_reading_.mem_available.value_or(0);
  d["used"] = host_guard_.committed_bytes();
  d["daemon_rss"] = read_self_rss().value_or(0);
  return d;
}

std::vector<Service::QueueRow> Service::queues_view() const {
  const auto now = clock_->now();
  std::vector<QueueRow> rows;
  for (const auto* q : {&gpu_queue_, &cpu_queue_})
    rows.push_back({q->name(), static_cast<std::uint32_t>(q->depth()), q->config().capacity,
                    static_cast<std::uint32_t>(q->running()), q->config().concurrency, to_ms(q->oldest_age(now))});
  return rows;
}

std::map<std::string, std::uint32_t> Service::limits_view() const {
  const auto& l = state_.current().limits;
  return {{"gpu_max_context", l.gpu_max_context},
          {"gpu_max_new_tokens", l.gpu_max_new_tokens},
          {"cpu_max_context", l.cpu_max_context},
          {"cpu_max_new_tokens", l.cpu_max_new_tokens}};
}

std::vector<Service::HoldRow> Service::holds_view() const {
  std::vector<HoldRow> rows;
  for (const auto& [cookie, h] : holds_) rows.push_back({cookie, h.app_id, h.reason, h.since_unix_ms});
  return rows;
}

std::string Service::status_line() const {
  std::string s = state();
  if (!degraded_reason().empty()) s += " (" + degraded_reason() + ")";
  s += "; breaker " + breaker_state();
  for (const auto& q : queues_view())
    s += "; " + q.name + " " + std::to_string(q.running) + "/" + std::to_string(q.concurrency) + " running, " +
         std::to_string(q.depth) + " queued";
  if (!holds_.empty()) s += "; GPU held";
  if (draining_) s += "; draining";
  return s;
}

void Service::flush_changes() {
  if (!observer_) return;
  std::map<std::string, std::string> now;
  auto dump = [](const Dict& d, std::initializer_list<const char*> skip = {}) {
    std::string s;
    for (const auto& [k, v] : d) {
      bool skipped = false;
      for (const char* x : skip) skipped = skipped || k == x;
      if (skipped) continue;
      s += k + "=" + std::to_string(v.index()) + ":";
      std::visit(
          [&](const auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, std::string>) s += x;
            else if constexpr (std::is_arithmetic_v<T>) s += std::to_string(x);
            else s += std::to_string(x.size());
          },
          v);
      s += ";";
    }
    return s;
  };
  now["State"] = state();
  now["DegradedReason"] = degraded_reason();
  now["GpuBreaker"] = breaker_state();
  now["FallbackModel"] = fallback_model();
  now["Policy"] = dump(policy_view());
  now["Memory"] = dump(memory_view(), {"reading_age_ms"});
  {
    auto hm = host_memory_view();
    // RSS, MemAvailable and a budget bound by it move all the time: published at 16 MiB granularity.
    for (const char* k : {"daemon_rss", "mem_available", "budget"})
      if (auto* v = std::get_if<std::uint64_t>(&hm[k])) *v >>= 24;
    now["HostMemory"] = dump(hm);
  }
  std::string qs;
  for (const auto& q : queues_view())
    qs += q.name + std::to_string(q.depth) + "/" + std::to_string(q.running) + "/" + std::to_string(q.oldest_age_ms / 1000) + ";";
  now["Queues"] = qs;
  std::string ls;
  for (const auto& [k, v] : limits_view()) ls += k + std::to_string(v);
  now["Limits"] = ls;
  std::string hs;
  for (const auto& h : holds_view()) hs += h.cookie + ";";
  now["Holds"] = hs;
  std::vector<std::string> changed;
  for (const auto& [k, v] : now) {
    auto it = published_.find(k);
    if (it == published_.end() || it->second != v) changed.push_back(k);
  }
  if (published_.empty()) {  // the first call only records
    published_ = std::move(now);
    return;
  }
  published_ = std::move(now);
  if (!changed.empty()) observer_->properties_changed(changed);
}

// --- shutdown ---

void Service::begin_drain() {
  if (draining_) return;
  draining_ = true;
  log::info("draining: no new jobs; queued jobs end failed-resumable, running ones may finish");
  for (auto& [id, jp] : jobs_) {
    JobRecord& j = *jp;
    if (j.terminal() || j.running) continue;
    if (j.queue == "gpu") gpu_queue_.remove(id);
    if (j.queue == "cpu") cpu_queue_.remove(id);
    end_job(j, JobPhase::failed, "daemon_stopping", Errc::resumable, "tandemd is stopping; resume later", 5s);
  }
}

bool Service::drained() const {
  for (const auto& [id, j] : jobs_)
    if (j->running) return false;
  return true;
}

void Service::sync_journal() {
  if (auto st = journal_->sync(); !st) log::error("journal sync: {}", st.error().message);
}

void Service::abort_running() {
  for (auto& [id, j] : jobs_)
    if (j->running && j->stop_cause.empty()) {
      j->stop_cause = "shutdown";
      j->cancel->store(true);
    }
}

Status Service::reload(const DaemonConfig& cfg) {
  cfg_.auth = cfg.auth;
  cfg_.runtime.max_jobs_per_client = cfg.runtime.max_jobs_per_client;
  cfg_.runtime.max_prompt_bytes = cfg.runtime.max_prompt_bytes;
  cfg_.runtime.max_messages = cfg.runtime.max_messages;
  Caller root{"", 0, true, true, ""};
  Dict changes{{"margin_bytes", cfg.policy.headroom.margin.bytes},
               {"margin_fraction", cfg.policy.headroom.margin.fraction},
               {"max_delay_ms", to_ms(cfg.policy.ladder.max_delay)},
               {"offload_enabled", cfg.policy.ladder.offload_enabled},
               {"allow_migration", cfg.policy.failover.allow_migration},
               {"host_budget_bytes", cfg.policy.host_guard.budget_bytes}};
  std::vector<std::string> order;
  for (auto r : cfg.policy.ladder.order) order.push_back(action_name(r));
  changes["ladder_order"] = order;
  if (auto st = set_policy(root, changes); !st) {
    log::error("reload: policy knobs not applied: {}", st.error().message);
    return st;
  }
  return {};
}

// --- testing ---

namespace {
device::SimulatedDevice* as_sim(const std::shared_ptr<device::Device>& d) {
  return d && d->kind() == device::Kind::simulated ? static_cast<device::SimulatedDevice*>(d.get()) : nullptr;
}
}  // namespace

Status Service::testing_foreign_load(std::uint64_t bytes) {
  auto* sim = as_sim(backend_->accelerator());
  if (!sim) return fail(Errc::unsupported, "SetForeignLoad needs the simulated accelerator (on CUDA use tandem-gpu-ballast)");
  sim->set_foreign_bytes(bytes);
  log::info("testing: foreign load {}", format_mib(bytes));
  refresh_readings();
  update_service_state();
  pump();
  return {};
}

Status Service::testing_fail_allocations(std::uint32_t n, const std::string& site) {
  auto* sim = as_sim(backend_->accelerator());
  if (!sim) return fail(Errc::unsupported, "FailAllocations needs the simulated accelerator");
  if (n > 1000000) return fail(Errc::invalid_argument, "n must be at most 1000000");
  if (site == "any") {
    sim->fail_next_allocations(static_cast<int>(n));
  } else {
    auto s = device::parse_site(site);
    if (!s) return fail(Errc::invalid_argument, "site must be any, weights, kv_pool, prefill, decode, probe or other");
    sim->fail_at_site(*s, static_cast<int>(n));
  }
  return {};
}

Status Service::testing_fail_probes(std::uint32_t n) {
  auto* sim = as_sim(backend_->accelerator());
  if (!sim) return fail(Errc::unsupported, "FailProbes needs the simulated accelerator");
  if (n > 1000000) return fail(Errc::invalid_argument, "n must be at most 1000000");
  sim->fail_probes(static_cast<int>(n));
  last_probe_ = {};  // probe soon
  return {};
}

Status Service::testing_reading_lag(std::uint64_t ms) {
  auto* sim = as_sim(backend_->accelerator());
  if (!sim) return fail(Errc::unsupported, "SetReadingLag needs the simulated accelerator");
  if (ms > 600000) return fail(Errc::invalid_argument, "ms must be at most 600000");
  sim->set_reading_lag(std::chrono::milliseconds(ms));
  return {};
}

Status Service::testing_lose_device() {
  auto* sim = as_sim(backend_->accelerator());
  if (!sim) return fail(Errc::unsupported, "LoseDevice needs the simulated accelerator");
  sim->lose();
  refresh_readings();
  update_service_state();
  return {};
}

Status Service::testing_recover_device() {
  auto* sim = as_sim(backend_->accelerator());
  if (!sim) return fail(Errc::unsupported, "RecoverDevice needs the simulated accelerator");
  sim->recover();
  last_probe_ = {};
  return {};
}

std::map<std::string, std::uint64_t> Service::counters() const {
  std::map<std::string, std::uint64_t> c(counters_.begin(), counters_.end());
  for (const char* k : {"jobs_accepted", "jobs_completed", "jobs_failed", "jobs_cancelled", "jobs_rejected",
                        "migrations", "retries", "probes", "probes_failed"})
    c.emplace(k, 0);
  if (auto* sim = as_sim(backend_->accelerator())) {
    const auto sc = sim->counters();
    c["sim_allocations"] = sc.allocations;
    c["sim_refused_capacity"] = sc.refused_capacity;
    c["sim_refused_injected"] = sc.refused_injected;
    c["sim_probes"] = sc.probes;
    c["sim_probes_failed"] = sc.probes_failed;
    c["sim_losses"] = sc.losses;
  }
  std::uint64_t running = 0, queued = 0;
  for (const auto& [id, j] : jobs_) {
    running += j->running;
    queued += !j->terminal() && !j->running;
  }
  c["jobs_running"] = running;
  c["jobs_waiting"] = queued;
  return c;
}

// --- helpers ---

void Service::emit(const JobRecord& j, const std::string& kind, const Dict& data) {
  if (!observer_ || j.owner.empty() || j.muted) return;
  observer_->job_update(j.reply_to.empty() ? j.owner : j.reply_to, j.id, kind, data);
}

void Service::journal_transition(const JobRecord& j, const std::string& reason) {
  (void)journal_->transition(j.id, j.phase, reason, route_json(j.route).dump(), unix_ms(),
                             j.fsm ? j.fsm->attempts() : 0);
}

Service::JobRecord* Service::find(JobId id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

const Service::JobRecord* Service::find(JobId id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

std::int64_t Service::unix_ms() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace tandem::daemon
