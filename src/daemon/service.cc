// The service core: construction, journal restore, the worker pools and the events they post, small helpers.
// The rest of Service is in service_{admission,schedule,health,views,control,commit}.cc (service_internal.h).
#include "daemon/service.h"

#include <unistd.h>

#include <cerrno>

#include "daemon/service_internal.h"

namespace tandem::daemon {

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
// Construction

namespace {
Clock::duration occupancy_tau(const policy::RateConfig& r) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(r.occupancy_seconds));
}
}  // namespace

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
      gpu_occupancy_(occupancy_tau(cfg_.policy.gpu_rates)),
      cpu_occupancy_(occupancy_tau(cfg_.policy.cpu_rates)),
      host_guard_(cfg_.policy.host_guard),
      state_(cfg_.policy.service),
      failover_(cfg_.policy.failover),
      idempotency_(cfg_.policy.idempotency),
      readings_(cfg_.policy.ladder.pressure),
      residency_(ResidencyConfig{std::chrono::duration_cast<Clock::duration>(cfg_.device.drain),
                                 cfg_.device.max_pressure_evictions_per_minute,
                                 std::chrono::duration_cast<Clock::duration>(cfg_.device.recover_after)}) {
  generate_wl_ = std::make_unique<GenerateWorkload>();
  embed_wl_ = std::make_unique<EmbedWorkload>();
  transcribe_wl_ = std::make_unique<TranscribeWorkload>();
  // The catalog starts from what the backend serves, with each model's configured settings.
  std::vector<ModelConfig> serving;
  for (const auto& m : backend_->models()) {
    ModelConfig mc;
    mc.name = m.name;
    for (const auto& c : cfg_.models)
      if (c.name == m.name) mc = c;
    serving.push_back(mc);
    if (m.gpu_configured && backend_->accelerator()) {
      residency_.add(m.name, clock_->now(), backend_->gpu_ready(m.name));
      apply_residency_settings(mc);
    }
  }
  catalog_.start(serving, clock_->now());
  apply_warmups(backend_->warmup_reports());
}

// The per-route rates start from the default model's warm-up (rates measured when its replicas loaded) instead of
// the configured priors, so that the first ETA and the first degraded announcement are measured figures; the
// warm-up's steps also enter the step model. Another LLM's warm-up seeds a route that has only its priors (the
// default model has none there: its CPU copy loads on demand, say). Embedding and speech models' warm-ups give
// their per-unit times (docs/policy.md §6, "Measured at load", "Fixed-duration jobs").
void Service::apply_warmups(const std::vector<WarmupReport>& warmups) {
  const std::string model = default_llm();
  // The default model's first: another's seeds only a route the default model left with its priors.
  std::vector<const WarmupReport*> order;
  for (const auto& w : warmups)
    if (w.model == model) order.push_back(&w);
  for (const auto& w : warmups)
    if (w.model != model) order.push_back(&w);
  for (const WarmupReport* wp : order) {
    const WarmupReport& w = *wp;
    for (const auto& u : w.units) {
      if (u.units == 0) continue;
      unit_times_.set_measured(w.model, w.route, u.unit, u.took / u.units);
      log::info("model {}: {} route: {:.1f} ms per {} (measured at load)", w.model, policy::device_name(w.route),
                std::chrono::duration<double, std::milli>(u.took / u.units).count(), policy::work_unit_name(u.unit));
    }
    if (w.prefill_tokens == 0 || w.decode_steps.empty()) continue;
    auto& q = w.route == policy::Device::cpu ? cpu_queue_ : gpu_queue_;
    if (w.model != model && !q.rates().from_priors()) continue;
    Clock::duration decode{};
    for (auto d : w.decode_steps) decode += d;
    const double ps = std::chrono::duration<double>(w.prefill_took).count();
    const double ds = std::chrono::duration<double>(decode).count();
    q.rates().set_measured(ps > 0 ? w.prefill_tokens / ps : 0.0,
                           ds > 0 ? static_cast<double>(w.decode_steps.size()) / ds : 0.0);
    q.rates().observe_step(1, w.prefill_tokens, w.prefill_took);
    for (auto d : w.decode_steps) q.rates().observe_step(1, 1, d);
    for (const auto& b : w.batch_steps) q.rates().observe_step(b.batch, b.tokens, b.took);
    const auto& priors = w.route == policy::Device::cpu ? cfg_.policy.cpu_rates : cfg_.policy.gpu_rates;
    log::info("{} route: rates from model {}'s warm-up: prefill {:.0f} tok/s, decode {:.1f} tok/s (priors {:.0f} / {:.1f})",
              policy::device_name(w.route), w.model, q.rates().prefill_tps(), q.rates().decode_tps(),
              priors.prior_prefill_tps, priors.prior_decode_tps);
  }
}

policy::QueueEntry Service::queue_entry(const JobRecord& j, policy::Device route, Clock::time_point accepted) const {
  policy::QueueEntry e{j.id, j.shape.prompt_tokens, j.shape.max_new_tokens, accepted};
  if (auto f = workload(j).fixed_time(*this, j, route)) {
    e.fixed = std::max(*f, Clock::duration{1});
    // One lane per model and route: a replica runs one embedding or speech forward at a time.
    e.lane = static_cast<std::uint32_t>(std::hash<std::string>{}(j.serving_model_name()));
  }
  return e;
}

void Service::refresh_backgrounds() {
  const auto now = clock_->now();
  gpu_queue_.set_background(gpu_occupancy_.at(now));
  cpu_queue_.set_background(cpu_occupancy_.at(now));
}

void Service::update_fixed_time(const JobRecord& j) {
  const policy::Device route = j.queue == QueueId::cpu ? policy::Device::cpu : policy::Device::gpu;
  if (auto f = workload(j).fixed_time(*this, j, route))
    if (policy::JobQueue* q = queue_of(j.queue)) q->set_fixed_left(j.id, *f);
}

Service::Workload& Service::workload(const JobRecord& j) const {
  switch (j.kind) {
    case WorkloadKind::embed: return *embed_wl_;
    case WorkloadKind::transcribe: return *transcribe_wl_;
    case WorkloadKind::generate: break;
  }
  return *generate_wl_;
}

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
  Service* self = s.get();
  jo.sync_hook = [self](int fd) {
    if (self->fail_journal_syncs_ > 0) {  // testing_fail_journal_syncs
      --self->fail_journal_syncs_;
      errno = EIO;
      return -1;
    }
    return ::fdatasync(fd);
  };
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
  if (models_pool_) models_pool_->stop();  // a load under way finishes; its model is dropped with its event
  // No run is left, so no step loop steps (a loop reports a step before it ends any of its jobs).
  backend_->set_step_observer({});
  if (journal_)
    if (Status st = journal_->sync(); !st) log::error("journal sync at exit: {}", st.error().message);
}

void Service::start_workers() {
  gpu_pool_ = std::make_unique<TaskPool>("gpu", cfg_.policy.gpu_queue.concurrency);
  cpu_pool_ = std::make_unique<TaskPool>("cpu", cfg_.policy.cpu_queue.concurrency);
  maint_pool_ = std::make_unique<TaskPool>("maint", 1);
  models_pool_ = std::make_unique<TaskPool>("models", 1);  // loads for the runtime model set (minutes, not probes')
  // Step costs of the step loops feed the queues' ETA model (posted: the loops run on their own threads).
  backend_->set_step_observer([this](const StepReport& r) {
    WorkerEvent ev;
    ev.kind = WorkerEvent::step;
    ev.step_report = r;
    post(std::move(ev));
  });
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
    auto phase = parse_job_phase(jj.phase);  // the journal validates phases on replay: unknown = a bug, fail closed
    if (!phase) return fail(Errc::format_error, "journal: job " + std::to_string(id) + ": " + phase.error().message);
    rec->phase = *phase;
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
    if (rj.is_object() && rj.value("kind", "") == "embed") {
      // An embedding job: its inputs were never journaled (images by digest only) and its vectors are not kept
      // across a restart; the caller that waited got an error when tandemd stopped and calls Embed again.
      rec->kind = WorkloadKind::embed;
      rec->embed = std::make_shared<EmbedWork>();
      const auto count = [&rj](const char* k) {
        return static_cast<std::uint32_t>(rj.contains(k) && rj[k].is_array() ? rj[k].size() : 0);
      };
      rec->embed->n_texts = count("texts") + count("tokens");  // text-tower inputs: texts and token inputs
      rec->embed->n_images = count("images");
      rec->req.model = rj.value("model", "");
      rec->request_json = json{{"kind", "embed"}, {"model", rec->req.model}};
      rec->muted = true;
    } else if (rj.is_object() && rj.value("kind", "") == "transcribe") {
      // A transcription job: its audio was never journaled (by digest only), so it cannot continue after a restart;
      // the journal's text is the transcript of the windows it finished.
      rec->kind = WorkloadKind::transcribe;
      rec->transcribe = std::make_shared<TranscribeWork>();
      rec->req.model = rj.value("model", "");
      rec->request_json = rj;
    } else if (rj.is_object()) {
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
      if (rj.contains("enable_thinking") && rj["enable_thinking"].is_boolean())
        rec->req.options.enable_thinking = rj["enable_thinking"].get<bool>();
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
      rec->history.emplace_back(phase_name(rec->phase), phase_name(JobPhase::failed), reason, now_ms);
      rec->phase = JobPhase::failed;
      rec->reason = reason;
      rec->error_code = std::string(errc_name(rec->kind == WorkloadKind::generate ? Errc::resumable : Errc::unavailable));
      rec->error_message = rec->kind == WorkloadKind::embed
                               ? "tandemd stopped while the embedding job was " + jj.phase + "; call Embed again"
                           : rec->kind == WorkloadKind::transcribe
                               ? "tandemd stopped while the transcription job was " + jj.phase +
                                     "; its text so far is kept; call Transcribe again"
                               : "tandemd stopped while the job was " + jj.phase + "; resume from the checkpoint (" +
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
        (void)idempotency_.record_outcome(rec->key, id, {rec->phase, rec->reason, now});
      }
    }
    jobs_.emplace(id, std::move(rec));
  }
  next_id_ = journal_->max_job_id() + 1;
  TANDEM_TRY(journal_->sync());
  return {};
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
    if (ev.kind == WorkerEvent::step) {  // bookkeeping only: no job or property changes
      const StepReport& r = ev.step_report;
      (r.route == policy::Device::cpu ? cpu_queue_ : gpu_queue_).rates().observe_step(r.batch, r.tokens, r.took);
      (r.route == policy::Device::cpu ? cpu_occupancy_ : gpu_occupancy_).observe_step(r.batch, r.took, clock_->now());
      ++counters_[r.route == policy::Device::cpu ? "cpu_steps" : "gpu_steps"];
      continue;
    }
    any = true;
    if (ev.kind == WorkerEvent::probe_done) {
      probe_in_flight_ = false;
      const bool ok = static_cast<bool>(ev.status);
      last_probe_failed_ = !ok;
      if (!ok) ++counters_["probes_failed"];
      breaker_event(ok ? BreakerEvent::probe_succeeded : BreakerEvent::probe_failed, ev.probe);
      if (ok && readings_.device_lost() && breaker_.state() == policy::BreakerState::closed && !reload_in_flight_) {
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
    if (ev.kind == WorkerEvent::gpu_freed) {
      const auto now = clock_->now();
      const bool reload = residency_.freed(ev.model, ev.bytes, now);
      if (!ev.status)
        log::error("giving back the GPU replica of {} failed: {}", ev.model, ev.status.error().message);
      else if (const auto* r = residency_.find(ev.model))
        log::warn("GPU replica of {} given back ({}): {} MiB in {} ms", ev.model, evict_reason_name(r->reason),
                  ev.bytes >> 20, std::chrono::duration_cast<std::chrono::milliseconds>(r->last_free).count());
      refresh_readings();
      update_service_state();
      if (reload) start_gpu_load(ev.model);
      continue;
    }
    if (ev.kind == WorkerEvent::gpu_loaded) {
      const bool give_back = residency_.loaded(ev.model, ev.status, ev.took, clock_->now());
      if (ev.status)
        log::warn("GPU replica of {} restored in {} ms", ev.model,
                  std::chrono::duration_cast<std::chrono::milliseconds>(ev.took).count());
      else
        log::error("restoring the GPU replica of {} failed: {}; it serves on the CPU", ev.model,
                   ev.status.error().message);
      if (give_back) log::warn("GPU replica of {}: giving it back (a GPU hold came during its load)", ev.model);
      refresh_readings();
      update_service_state();
      pump();
      residency_step();
      continue;
    }
    if (ev.kind == WorkerEvent::model_prepared) {
      on_model_prepared(ev);
      continue;
    }
    if (ev.kind == WorkerEvent::reload_done) {
      reload_in_flight_ = false;
      if (ev.status) {
        readings_.mark_recovered();
        // A replica whose restore failed while the device was away came back with the others.
        for (const auto& r : residency_.list())
          if (r.state == ReplicaState::failed && backend_->gpu_ready(r.model)) residency_.mark_loaded(r.model, clock_->now());
        restore_after_holds();  // holds released while the device was away: their replicas come back now
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
        if (j->fsm && j->phase == JobPhase::running)
          (void)j->fsm->record_tokens(static_cast<std::uint32_t>(j->tokens.size() - j->resume.size()));
        auto& q = j->route.device == policy::Device::cpu ? cpu_queue_ : gpu_queue_;
        q.update_progress(j->id, true, j->run_new_tokens);
        if (j->stream)
          emit(*j, "tokens", {{"text", ev.text}, {"tokens", ev.ids}, {"step", first_step}});
        // Checkpoints ride along in the journal (synced with the next accept/outcome).
        if (j->tokens.size() >= j->journaled_tokens + 32u) journal_checkpoint(*j);
        break;
      }
      case WorkerEvent::finished:
        on_run_finished(*j, ev.result);
        break;
      case WorkerEvent::audio_decoded:
      case WorkerEvent::window:
        on_transcribe_event(*j, ev);
        break;
      default:
        break;
    }
  }
  if (any) {
    update_service_state();
    pump();
    residency_step();  // keep_alive 0: given back as soon as its last GPU job ended
  }
}

// --- helpers ---

void Service::emit(const JobRecord& j, const std::string& kind, const Dict& data) {
  if (!observer_ || j.owner.empty() || j.muted) return;
  // Sent by commit() once its record is durable (an outcome not written: also without group commit).
  if (j.outcome_unwritten || (group_commit_ && (j.accept_pending || j.durable_at > journal_->durable_seq()))) {
    held_updates_.push_back({j.id, kind, data});
    return;
  }
  observer_->job_update(j.reply_to.empty() ? j.owner : j.reply_to, j.id, kind, data);
}

// --- journal writes (docs/journal.md, "Failed writes") ---

void Service::journal_transition(JobRecord& j, const std::string& reason) {
  // Only the latest transition matters to replay (phase, route, attempts): an older unwritten one is replaced.
  j.unwritten_transition = JobRecord::UnwrittenTransition{phase_name(j.phase), reason, route_json(j.route).dump(),
                                                          unix_ms(), j.fsm ? j.fsm->attempts() : 0};
  if (Status st = write_unwritten_transition(j); !st) journal_write_failed("transition", j.id, st);
}

Status Service::write_unwritten_transition(JobRecord& j) {
  if (!j.unwritten_transition) return {};
  const auto& t = *j.unwritten_transition;
  TANDEM_TRY(journal_->transition(j.id, t.phase, t.reason, t.route_json, t.at_unix_ms, t.attempts));
  j.unwritten_transition.reset();
  return {};
}

void Service::journal_checkpoint(JobRecord& j) {
  // The route its tokens came from first: a checkpoint never lands under another route's (model's) record.
  Status st = write_unwritten_transition(j);
  if (st) st = journal_->checkpoint(j.id, j.tokens, j.text);
  if (!st) {
    // journaled_tokens stays where the journal is: the next checkpoint (a checkpoint holds every token so far) covers
    // these tokens too, so the journal never has a hole. The job runs on: a checkpoint only shortens a resume.
    journal_write_failed("checkpoint", j.id, st);
    return;
  }
  j.journaled_tokens = static_cast<std::uint32_t>(j.tokens.size());
}

void Service::journal_write_failed(std::string_view what, JobId id, const Status& st) {
  ++counters_["journal_write_errors"];
  const auto now = std::chrono::steady_clock::now();
  if (journal_error_logged_ != std::chrono::steady_clock::time_point{} && now - journal_error_logged_ < 10s) {
    ++journal_errors_unlogged_;  // at most one line per 10 s (a full disk fails every write)
    return;
  }
  const std::string more = journal_errors_unlogged_ == 0 ? std::string()
                           : "; " + std::to_string(journal_errors_unlogged_) + " more failed writes not logged";
  log::error("journal: {} record of job {} not written: {}{}", what, id, st.error().message, more);
  journal_error_logged_ = now;
  journal_errors_unlogged_ = 0;
}

void Service::resync_journaled_tokens() {
  const auto& held = journal_->jobs();
  for (JobId id : active_)
    if (JobRecord* j = find(id)) {
      const auto it = held.find(id);
      const auto n = static_cast<std::uint32_t>(it == held.end() ? 0 : it->second.tokens.size());
      j->journaled_tokens = std::min(j->journaled_tokens, n);
    }
}

policy::JobQueue* Service::queue_of(QueueId q) {
  return q == QueueId::gpu ? &gpu_queue_ : q == QueueId::cpu ? &cpu_queue_ : nullptr;
}

const policy::JobQueue* Service::queue_of(QueueId q) const {
  return q == QueueId::gpu ? &gpu_queue_ : q == QueueId::cpu ? &cpu_queue_ : nullptr;
}

void Service::leave_queue(const JobRecord& j) {
  if (policy::JobQueue* q = queue_of(j.queue)) q->remove(j.id);
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
