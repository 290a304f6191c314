// Service: control methods — ownership checks, cancel, resume, GPU holds, vanished clients and closed channels,
// shutdown (drain, abort, journal sync), reload, the testing hooks and the counters.
#include "daemon/service.h"

#include "daemon/service_internal.h"
#include "device/simulated.h"

namespace tandem::daemon {

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
  if (j->terminal()) return phase_name(j->phase);
  if (j->running) {
    if (j->stop_cause == StopCause::none || j->stop_cause == StopCause::evict) j->stop_cause = StopCause::cancelled;
    j->cancel->store(true);
    return std::string("cancelling");
  }
  leave_queue(*j);
  end_job(*j, JobPhase::cancelled, "cancelled", Errc::cancelled, "", 0s);
  pump();
  return phase_name(j->phase);
}

Result<Dict> Service::resume(const Caller& c, JobId id, const SubmitOptions& overrides) {
  JobRecord* old = find(id);
  if (!old) return fail(Errc::not_found, "no job " + std::to_string(id));
  TANDEM_TRY(check_owner(c, *old));
  if (old->kind == WorkloadKind::embed)
    return fail(Errc::illegal_transition, "job " + std::to_string(id) +
                                              " is an embedding job: it has no checkpoint; call Embed again");
  if (old->kind == WorkloadKind::transcribe)
    return fail(Errc::illegal_transition, "job " + std::to_string(id) +
                                              " is a transcription job: its audio is not kept; call Transcribe again");
  if (old->phase != JobPhase::failed)
    return fail(Errc::illegal_transition, "job " + std::to_string(id) + " is " + phase_name(old->phase) +
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
  wake_replica(p->model->name);  // keep_alive: a replica given back while idle comes back
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
  auto cookie = holds_.add(c.bus_name, reason, app_id, unix_ms());
  if (!cookie) return fail(std::move(cookie).error());
  const std::string who = app_id.empty() ? c.bus_name : app_id;
  log::warn("GPU held by {} ({}): {}", who, c.bus_name, reason);
  if (cfg_.device.evict_on_hold)
    for (const auto& m : residency_.evict_all(EvictReason::hold, clock_->now()))
      log::warn("GPU replica of {}: giving it back (GPU held by {})", m, who);
  update_service_state();
  residency_step();
  return std::move(cookie).value();
}

Status Service::release_gpu(const Caller& c, const std::string& cookie) {
  auto gone = holds_.release(cookie, c.bus_name, c.admin && c.uid == 0);
  if (!gone) return fail(std::move(gone).error());
  log::warn("GPU hold released by {} ({})", gone->app_id, c.bus_name);
  restore_after_holds();
  update_service_state();
  pump();
  return {};
}

// --- GPU residency (Residency decides, this carries it out) ---

namespace {
// The checks LoadModel and UnloadModel share: the caller, the model, the device, a GPU replica to move.
Status residency_target(const Caller& c, const Backend& b, const Residency& r, const std::string& model,
                        const std::string& device, const std::string& admin_group) {
  if (!c.admin) return fail(Errc::permission_denied, "loading and unloading models needs root or group '" + admin_group + "'");
  bool known = false;
  for (const auto& m : b.models()) known = known || m.name == model;
  if (!known) return fail(Errc::not_found, "unknown model '" + model + "'");
  if (device == "cpu")
    return fail(Errc::unsupported, "the CPU replica of " + model + " stays: it is what serves when the GPU cannot "
                                   "(its memory use is [[model]] replica_mode)");
  if (device != "gpu") return fail(Errc::invalid_argument, "device must be gpu or cpu, not '" + device + "'");
  if (!r.find(model)) return fail(Errc::unsupported, "model " + model + " has no GPU replica");
  return {};
}
}  // namespace

Dict Service::residency_reply(const std::string& model) const {
  Dict d{{"model", model}, {"device", std::string("gpu")}};
  if (const Residency::Replica* r = residency_.find(model)) {
    d["state"] = std::string(replica_state_name(r->state));
    d["reason"] = std::string(evict_reason_name(r->reason));
    d["accel_bytes"] = backend_->gpu_resident_bytes(model);
  }
  return d;
}

Result<Dict> Service::unload_model(const Caller& c, const std::string& model, const std::string& device) {
  TANDEM_TRY(residency_target(c, *backend_, residency_, model, device, cfg_.auth.admin_group));
  TANDEM_TRY(residency_.evict(model, EvictReason::request, clock_->now()));
  log::warn("GPU replica of {}: giving it back (UnloadModel by uid {})", model, c.uid);
  update_service_state();
  residency_step();
  return residency_reply(model);
}

Result<Dict> Service::load_model(const Caller& c, const std::string& model, const std::string& device) {
  TANDEM_TRY(residency_target(c, *backend_, residency_, model, device, cfg_.auth.admin_group));
  if (!holds_.empty() && cfg_.device.evict_on_hold)
    return fail(Errc::illegal_transition, "the GPU is held (" + holds_.list().front().app_id +
                                              "); it is loaded again when the last hold is released");
  if (readings_.device_lost()) return fail(Errc::unavailable, "the accelerator is lost; retry_after_ms=5000");
  auto load = residency_.restore(model, clock_->now());
  if (!load) return fail(std::move(load).error());
  log::warn("GPU replica of {}: {} (LoadModel by uid {})", model, *load ? "loading it back" : "kept", c.uid);
  if (*load) start_gpu_load(model);
  update_service_state();
  pump();
  return residency_reply(model);
}

bool Service::gpu_busy(const std::string& model) const {
  for (JobId id : active_)
    if (const JobRecord* j = find(id); j && j->running && j->route.device != policy::Device::cpu && j->route.model == model)
      return true;
  return false;
}

std::set<std::string> Service::gpu_wanted_models() const {
  std::set<std::string> wanted;
  for (JobId id : active_)
    if (const JobRecord* j = find(id)) {
      const std::string& m = j->route.model.empty() ? j->model : j->route.model;
      if ((j->running && j->route.device != policy::Device::cpu) || j->queue == QueueId::gpu) wanted.insert(m);
    }
  return wanted;
}

void Service::residency_step() {
  const auto now = clock_->now();
  relieve_pressure(now);
  recover_from_pressure(now);
  // Idle: no job runs on it or waits for it in the GPU queue.
  const auto wanted = gpu_wanted_models();
  for (const auto& m : residency_.evict_idle([&](const std::string& x) { return wanted.count(x) != 0; }, now)) {
    const auto* r = residency_.find(m);
    log::info("GPU replica of {}: giving it back (no job for {} s, keep_alive)", m,
              r && r->keep_alive ? std::chrono::duration_cast<std::chrono::seconds>(*r->keep_alive).count() : 0);
  }
  const auto step = residency_.drain([this](const std::string& m) { return gpu_busy(m); }, now);
  for (const auto& m : step.preempt) {
    std::uint32_t n = 0, kept = 0;
    for (JobId id : active_)
      if (JobRecord* j = find(id); j && j->running && j->route.device != policy::Device::cpu && j->route.model == m &&
                                   j->stop_cause == StopCause::none) {
        // Only a job that can move is moved (retry or migrate on the CPU); one that cannot (allow_cpu = false,
        // side effects, no room on the CPU) finishes where it is: a voluntary eviction never fails a job.
        if (workload(*j).failover(*this, *j).action == policy::FailoverAction::fail_resumable) {
          ++kept;
          continue;
        }
        j->stop_cause = StopCause::evict;
        j->cancel->store(true);
        ++n;
      }
    log::warn("GPU replica of {}: the drain time passed; {} running job(s) move to the CPU at their next checkpoint{}",
              m, n, kept ? ", " + std::to_string(kept) + " that cannot move finish on the GPU first" : std::string());
  }
  for (const auto& m : step.free) {
    maint_pool_->post([this, m] {
      WorkerEvent ev;
      ev.kind = WorkerEvent::gpu_freed;
      ev.model = m;
      auto r = backend_->evict_gpu(m);
      if (r) ev.bytes = *r;
      else ev.status = fail(std::move(r).error());
      post(std::move(ev));
    });
  }
}

std::uint64_t Service::replica_bytes(const std::string& model) const {
  std::uint64_t bytes = backend_->gpu_resident_bytes(model);
  if (const auto* r = residency_.find(model)) bytes = std::max(bytes, r->given_back_bytes);
  for (const auto& m : backend_->models())
    if (m.name == model) bytes = std::max(bytes, m.weight_bytes);
  return bytes;
}

std::vector<policy::EvictCandidate> Service::evict_candidates(const std::string& except) const {
  std::vector<policy::EvictCandidate> out;
  const auto list = residency_.list();
  bool any_loaded = false;
  for (const auto& r : list) any_loaded = any_loaded || (r.state == ReplicaState::loaded && r.model != except);
  if (!any_loaded) return out;
  const auto wanted = gpu_wanted_models();  // one pass over the jobs (this runs for every admission decision)
  for (const auto& r : list) {
    if (r.model == except || r.state != ReplicaState::loaded || wanted.count(r.model)) continue;
    const std::uint64_t bytes = backend_->gpu_resident_bytes(r.model);
    if (bytes > 0) out.push_back({r.model, bytes, r.priority, r.last_used});
  }
  return out;
}

std::uint64_t Service::evicting_bytes() const {
  std::uint64_t sum = 0;
  for (const auto& r : residency_.list())
    // Only those about to go (freeing, or no GPU job left on them): one whose jobs cannot move may stay for long.
    // Their held bytes as loaded, not the live value (it drops at the free, before the reading shows it).
    if (r.state == ReplicaState::draining && (r.freeing || !gpu_busy(r.model))) sum += replica_bytes(r.model);
  return sum;
}

void Service::evict_for(const Decision& d, const std::string& for_model) {
  if (d.action != Rung::evict || d.evict.empty()) return;
  const auto now = clock_->now();
  const auto& h = readings_.headroom();
  for (const auto& m : d.evict)
    if (residency_.evict(m, EvictReason::pressure, now))
      log::warn("GPU replica of {}: giving it back (foreign pressure: others use {} MiB; a job for {} {})", m,
                h.foreign_used_bytes >> 20, for_model, d.detail);
  update_service_state();
  residency_step();
}

// Nothing of ours asks, but others' usage with our resident weights keeps the device in critical pressure (the
// headroom once our jobs' reservations are gone is below the critical level): give idle replicas back until it
// would leave critical, lowest priority and least recently used first, within the cap. Without enough idle bytes
// to lift it, every idle replica the cap allows goes: the other program needs the memory more than an idle copy.
void Service::relieve_pressure(Clock::time_point now) {
  if (!holds_.empty() || readings_.device_lost()) return;
  const auto& order = cfg_.policy.ladder.order;
  if (std::find(order.begin(), order.end(), Rung::evict) == order.end()) return;  // the ladder never evicts
  const auto& h = readings_.headroom();
  if (h.total_bytes == 0 || h.trust == policy::ReadingTrust::expired || h.foreign_used_bytes == 0) return;
  const auto& p = cfg_.policy.ladder.pressure;
  const double total = static_cast<double>(h.total_bytes);
  if (static_cast<double>(h.drained_headroom) >= p.critical_enter_fraction * total) return;
  const std::uint32_t budget = residency_.pressure_budget(now);
  if (budget == 0) return;
  auto candidates = evict_candidates("");
  if (candidates.empty()) return;
  const double exit = std::ceil(p.critical_exit_fraction * total);
  std::uint64_t missing = static_cast<std::uint64_t>(std::max(0.0, exit - static_cast<double>(h.drained_headroom)));
  const std::uint64_t coming = evicting_bytes();  // replicas already being given back (not in the reading yet)
  if (missing <= coming) return;
  missing -= coming;
  std::uint64_t idle = 0;
  for (const auto& c : candidates) idle += c.bytes;
  // All of them, in order, when even all do not free what is missing.
  std::vector<std::string> pick = *policy::choose_evictions(candidates, std::min(missing, idle));
  if (pick.size() > budget) pick.resize(budget);
  for (const auto& m : pick)
    if (residency_.evict(m, EvictReason::pressure, now))
      log::warn("GPU replica of {}: giving it back (foreign pressure: others use {} MiB, {} MiB left once our jobs "
                "end)", m, h.foreign_used_bytes >> 20, h.drained_headroom / (1 << 20));
}

// Replicas given back for foreign pressure come back when the device can take their weights and stay out of
// pressure (the headroom minus their bytes at or above the elevated exit level) for recover_after without a break.
void Service::recover_from_pressure(Clock::time_point now) {
  if (!holds_.empty() || readings_.device_lost()) return;
  // Jobs wait in the GPU queue (perhaps for the very bytes given back): they come first; the wait starts again after.
  if (gpu_queue_.depth() > 0) {
    (void)residency_.recover([](const std::vector<std::string>&) { return false; }, now);
    return;
  }
  const auto& h = readings_.headroom();
  const bool readable = h.total_bytes > 0 && h.trust != policy::ReadingTrust::expired;
  const double floor = cfg_.policy.ladder.pressure.elevated_exit_fraction * static_cast<double>(h.total_bytes);
  auto room = [&](const std::vector<std::string>& models) {
    if (!readable) return false;
    double need = 0;
    for (const auto& m : models) need += static_cast<double>(replica_bytes(m));
    return static_cast<double>(h.headroom) - need >= floor;
  };
  const auto load = residency_.recover(room, now);
  for (const auto& m : load) {
    log::warn("GPU replica of {}: loading it back (room again for {} ms: others use {} MiB)", m,
              std::chrono::duration_cast<std::chrono::milliseconds>(residency_.config().recover_after).count(),
              h.foreign_used_bytes >> 20);
    start_gpu_load(m);
  }
  if (!load.empty()) refresh_readings();  // the loads' bytes are in the ledger before the next decision
}

void Service::wake_replica(const std::string& model) {
  const Residency::Replica* r = residency_.find(model);
  if (!r || r->state != ReplicaState::evicted || r->reason != EvictReason::idle) return;
  if (!holds_.empty() || readings_.device_lost()) return;
  if (auto load = residency_.restore(model, clock_->now()); load && *load) start_gpu_load(model);
}

void Service::restore_after_holds() {
  if (!holds_.empty() || readings_.device_lost()) return;  // after a loss: when the device is back (reload_done)
  const auto step = residency_.restore_all(EvictReason::hold, clock_->now());
  for (const auto& m : step.kept) log::warn("GPU replica of {}: kept (the last hold went before it was given back)", m);
  for (const auto& m : step.load) start_gpu_load(m);
}

void Service::start_gpu_load(const std::string& model) {
  log::info("GPU replica of {}: loading it back", model);
  maint_pool_->post([this, model] {
    WorkerEvent ev;
    ev.kind = WorkerEvent::gpu_loaded;
    ev.model = model;
    const auto t0 = std::chrono::steady_clock::now();
    ev.status = backend_->load_gpu(model);
    ev.took = std::chrono::duration_cast<Clock::duration>(std::chrono::steady_clock::now() - t0);
    post(std::move(ev));
  });
}

void Service::client_vanished(const std::string& bus_name) {
  const auto gone = holds_.release_owner(bus_name);
  for (const auto& h : gone) log::warn("GPU hold of {} released: {} left the bus", h.app_id, bus_name);
  const bool changed = !gone.empty();
  if (changed) restore_after_holds();
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

void Service::channel_closed(const std::string& reply_to) {
  if (reply_to.empty()) return;
  for (JobId id : active_)
    if (JobRecord* j = find(id); j && j->reply_to == reply_to) {
      j->muted = true;
      close_audio_stream(id);  // no more audio can come through a closed channel
    }
}

std::uint32_t Service::active_jobs_of(const std::string& bus_name) const {
  std::uint32_t n = 0;
  for (JobId id : active_)
    if (const JobRecord* j = find(id); j && j->owner == bus_name) ++n;
  return n;
}

// --- shutdown ---

void Service::begin_drain() {
  if (draining_) return;
  draining_ = true;
  log::info("draining: no new jobs; queued jobs end failed-resumable, running ones may finish");
  for (auto& [id, jp] : jobs_) {
    JobRecord& j = *jp;
    if (j.terminal() || j.running) continue;
    leave_queue(j);
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
    if (j->running && (j->stop_cause == StopCause::none || j->stop_cause == StopCause::evict)) {
      j->stop_cause = StopCause::shutdown;
      j->cancel->store(true);
    }
}

Status Service::reload(const DaemonConfig& cfg) {
  cfg_.auth = cfg.auth;
  cfg_.runtime.max_jobs_per_client = cfg.runtime.max_jobs_per_client;
  cfg_.embedding.max_inputs = cfg.embedding.max_inputs;
  cfg_.embedding.max_image_bytes = cfg.embedding.max_image_bytes;
  cfg_.embedding.max_text_bytes = cfg.embedding.max_text_bytes;
  cfg_.speech.max_audio_bytes = cfg.speech.max_audio_bytes;
  cfg_.speech.max_audio_seconds = cfg.speech.max_audio_seconds;
  cfg_.speech.stream_idle_seconds = cfg.speech.stream_idle_seconds;
  cfg_.speech.max_stream_ahead_seconds = cfg.speech.max_stream_ahead_seconds;
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
  reconfigure_models(cfg);
  if (auto st = set_policy(root, changes); !st) {
    log::error("reload: policy knobs not applied: {}", st.error().message);
    return st;
  }
  return {};
}

// --- the runtime model set (ModelCatalog; docs/residency.md, "Adding and removing models") ---

Result<const ModelInfo*> Service::serving_model(const std::string& name) const {
  TANDEM_TRY(catalog_.admits(name));
  for (const auto& m : backend_->models())
    if (m.name == name) return &m;
  return fail(Errc::not_found, "unknown model '" + name.substr(0, 128) + "'");
}

void Service::apply_residency_settings(const ModelConfig& mc) {
  if (!residency_.find(mc.name)) return;
  residency_.set_keep_alive(mc.name, mc.keep_alive_s >= 0 ? std::optional<Clock::duration>(std::chrono::seconds(mc.keep_alive_s))
                                                          : std::nullopt);
  residency_.set_priority(mc.name, mc.priority);
}

void Service::reconfigure_models(const DaemonConfig& cfg) {
  cfg_.default_model = cfg.default_model;
  cfg_.embedding.default_model = cfg.embedding.default_model;
  cfg_.speech.default_model = cfg.speech.default_model;
  cfg_.models = cfg.models;
  const auto plan = catalog_.reconfigure(cfg.models, clock_->now());
  for (const auto& name : plan.remove) {
    const std::uint32_t jobs = jobs_naming(name);
    const auto* e = catalog_.find(name);
    log::warn("model {}: {} by the configuration reload: new jobs are refused, its {} unfinished job(s) finish first",
              name, e && e->replace_with ? "replaced (settings changed)" : "removed", jobs);
  }
  for (const auto& name : plan.kept) log::info("model {}: in the configuration again: it keeps serving", name);
  for (const auto& name : plan.retune)
    if (const auto* e = catalog_.find(name)) {
      apply_residency_settings(e->config);
      log::info("model {}: keep_alive {} s, priority {} (applied at once)", name, e->config.keep_alive_s, e->config.priority);
    }
  for (const auto& mc : plan.load) start_model_load(mc);
  remove_finished_models();
}

void Service::start_model_load(const ModelConfig& mc) {
  log::info("model {}: loading (added by the configuration reload; {})", mc.name, mc.dir);
  ++counters_["model_loads"];
  models_pool_->post([this, mc] {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = backend_->prepare_model(mc);
    WorkerEvent ev;
    ev.kind = WorkerEvent::model_prepared;
    ev.model = mc.name;
    ev.took = std::chrono::duration_cast<Clock::duration>(std::chrono::steady_clock::now() - t0);
    if (r) ev.prepared = std::make_shared<std::unique_ptr<PreparedModel>>(std::move(r).value());
    else ev.status = fail(std::move(r).error());
    post(std::move(ev));
  });
}

void Service::on_model_prepared(WorkerEvent& ev) {
  const auto now = clock_->now();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(ev.took).count();
  std::unique_ptr<PreparedModel> prepared = ev.prepared ? std::move(*ev.prepared) : nullptr;
  switch (catalog_.loaded(ev.model, ev.status, now)) {
    case ModelCatalog::LoadOutcome::discard:
      if (!ev.status) log::error("model {}: not added: {}", ev.model, ev.status.error().message);
      else log::info("model {}: loaded in {} ms but no longer in the configuration: dropped", ev.model, ms);
      return;  // `prepared` unloads here
    case ModelCatalog::LoadOutcome::reload:
      log::info("model {}: its settings changed while it loaded: loading it again", ev.model);
      prepared.reset();
      if (const auto* e = catalog_.find(ev.model)) start_model_load(e->config);
      return;
    case ModelCatalog::LoadOutcome::serve: break;
  }
  const ModelInfo info = prepared->info;
  const std::vector<WarmupReport> warmups = prepared->warmups;
  if (auto st = backend_->add_model(std::move(prepared)); !st) {
    log::error("model {}: loaded but not added: {}", ev.model, st.error().message);
    return;
  }
  unit_times_.forget(info.name);  // a replaced model's figures were its old replicas'
  apply_warmups(warmups);
  if (info.gpu_configured && backend_->accelerator()) {
    residency_.add(info.name, now, backend_->gpu_ready(info.name));
    if (const auto* e = catalog_.find(info.name)) apply_residency_settings(e->config);
    // A GPU hold or a lost device: the new replica is given back like the others.
    if (!holds_.empty() && backend_->gpu_ready(info.name) && residency_.evict(info.name, EvictReason::hold, now))
      log::warn("model {}: GPU replica given back at once (a GPU hold is on)", info.name);
  }
  log::info("model {}: added in {} ms ({} model, {}): serving", info.name, ms, model_kind_name(info.kind),
            backend_->gpu_ready(info.name) ? "GPU and CPU replicas" : "CPU replica");
  if (observer_) observer_->models_changed({info.name}, {});
  refresh_readings();
  update_service_state();
  residency_step();
  pump();
}

std::uint32_t Service::jobs_naming(const std::string& model) const {
  std::uint32_t n = 0;
  for (JobId id : active_)
    if (const JobRecord* j = find(id); j && (j->model == model || j->route.model == model)) ++n;
  return n;
}

bool Service::model_busy(const std::string& model) const {
  if (jobs_naming(model) > 0) return true;
  if (const auto* r = residency_.find(model))
    if (r->state == ReplicaState::draining || r->state == ReplicaState::loading) return true;
  return false;
}

void Service::remove_finished_models() {
  for (const auto& name : catalog_.removable([this](const std::string& m) { return model_busy(m); })) {
    if (auto st = backend_->remove_model(name); !st && st.error().code != Errc::not_found) {
      log::error("model {}: not removed: {}", name, st.error().message);
      continue;
    }
    residency_.remove(name);
    unit_times_.forget(name);
    const auto again = catalog_.removed(name, clock_->now());
    log::warn("model {}: {}", name, again ? "out; loading it with its new settings" : "removed: it no longer serves");
    if (observer_) observer_->models_changed({}, {name});
    if (again) start_model_load(*again);
    refresh_readings();
    update_service_state();
  }
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

void Service::testing_fail_journal_writes(std::uint32_t n) { journal_->testing_fail_writes(n); }

std::map<std::string, std::uint64_t> Service::counters() const {
  std::map<std::string, std::uint64_t> c(counters_.begin(), counters_.end());
  for (const char* k : {"jobs_accepted", "jobs_completed", "jobs_failed", "jobs_cancelled", "jobs_rejected",
                        "migrations", "retries", "probes", "probes_failed"})
    c.emplace(k, 0);
  const auto& rc = residency_.counters();
  c["gpu_evictions"] = rc.evictions;
  c["gpu_restores"] = rc.restores;
  c["gpu_restore_failures"] = rc.restore_failures;
  c["gpu_drain_preemptions"] = rc.preemptions;
  c["gpu_bytes_given_back"] = rc.bytes_given_back;
  c["gpu_pressure_evictions"] = rc.pressure_evictions;
  c["gpu_free_ms_total"] = rc.free_ms_total;
  c["gpu_load_ms_total"] = rc.load_ms_total;
  const auto& mc = catalog_.counters();
  c["models_added"] = mc.added;
  c["models_removed"] = mc.removed;
  c["models_replaced"] = mc.replaced;
  c["model_add_failures"] = mc.add_failures;
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
  c.emplace("jobs_withdrawn", 0);
  const auto& ws = journal_->write_stats();
  c["journal_fdatasyncs"] = ws.fdatasyncs;
  c["journal_commits"] = ws.commits;
  c["journal_records_committed"] = ws.records_committed;
  c["journal_max_records_per_commit"] = ws.max_records_per_commit;
  c["journal_commit_failures"] = ws.commit_failures;
  c["journal_append_failures"] = ws.append_failures;
  c.emplace("journal_write_errors", 0);  // service records (transition, checkpoint, outcome) not written
  return c;
}

}  // namespace tandem::daemon
