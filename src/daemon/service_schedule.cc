// Service: scheduling — the queue pump, dispatch to a route's workers, releasing reservations, ending jobs, run
// outcomes, the CPU fallback and GPU failover.
#include "daemon/service.h"

#include "daemon/service_internal.h"

namespace tandem::daemon {

// ---------------------------------------------------------------------------------------------------------------
// Scheduling

void Service::reannounce_etas() {
  if (!etas_dirty_) return;
  etas_dirty_ = false;
  const auto now = clock_->now();
  for (const QueueId qid : {QueueId::gpu, QueueId::cpu}) {
    const policy::JobQueue* q = queue_of(qid);
    for (const auto& w : q->finish_etas()) {
      JobRecord* j = find(w.id);
      if (!j || j->terminal() || !j->announced_finish || w.remaining == Clock::duration::max()) continue;
      const Clock::time_point was = *j->announced_finish;
      const Clock::time_point finish = now + w.remaining;
      const Clock::duration left_was = was > now ? was - now : Clock::duration::zero();
      const Clock::duration moved = finish > was ? finish - was : was - finish;
      if (moved < std::max<Clock::duration>(250ms, std::max(left_was, w.remaining) / 5)) continue;
      const auto pos = q->position(j->id);
      emit(*j, "eta", {{"eta_ms", to_ms(w.remaining)},
                       {"eta_known", eta_known(*j)},
                       {"previous_eta_ms", to_ms(left_was)},
                       {"queue", queue_name(qid)},
                       {"queue_position", static_cast<std::uint32_t>(pos ? *pos + 1 : 0)}});
      j->announced_finish = finish;
      ++counters_["eta_reannounced"];
    }
  }
}

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
      // Offload: the layers left on the CPU (their KV, activations, the head) are held by the host guard.
      const bool host_part = d.action == Rung::offload && d.host.has_value();
      if (host_part && !j->host_admitted) {
        if (!host_guard_.admit(j->id, *d.host, readings_.host())) break;  // checked by the policy; raced: wait
        j->host_admitted = true;
        j->host = d.host;
      }
      auto e = gpu_queue_.start_next();
      if (!e) break;
      j->decision = d;
      j->route = d.route;
      if (j->route.model.empty()) j->route.model = j->model;
      if (j->route.device == policy::Device::hybrid) j->degraded = true;  // offloaded: partly on the CPU
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
    if (d.action == Rung::evict) {  // it waits at the head for the bytes of the replicas given back
      evict_for(d, j->model);
      break;
    }
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
    j->queue = QueueId::none;
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
      j->queue = QueueId::none;
      end_job(*j, JobPhase::failed, "cpu_unavailable", Errc::resumable, "no CPU replica of " + serving, 5s);
      continue;
    }
    policy::RequestShape r = j->shape;
    r.prompt_tokens = static_cast<std::uint32_t>((j->prompts.count(serving) ? j->prompts[serving].size() : r.prompt_tokens) +
                                                 j->tokens.size());
    const auto est = policy::estimate_host_job(mi->shape, r, cfg_.policy.estimator, cfg_.policy.host_guard);
    const auto check = host_guard_.check(est, readings_.host());
    if (check.fit == policy::HostFit::wait) break;
    if (check.fit == policy::HostFit::never) {
      cpu_queue_.remove(j->id);
      j->queue = QueueId::none;
      end_job(*j, JobPhase::failed, "host_memory", Errc::resumable,
              "the CPU route needs " + format_mib(check.need_bytes) + " of host memory; the budget is " +
                  format_mib(check.budget.bytes),
              30s);
      continue;
    }
    auto adm = host_guard_.admit(j->id, est, readings_.host());
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
  reannounce_etas();
}

void Service::to_cpu_queue(JobRecord& j, const std::string& why) {
  j.queue = QueueId::cpu;
  const policy::QueueEntry entry = queue_entry(j, policy::Device::cpu, j.accepted_at);
  if (auto st = cpu_queue_.enqueue(entry); !st) {
    j.queue = QueueId::none;
    end_job(j, JobPhase::failed, "cpu_queue_full", Errc::resumable, "the CPU queue is full: " + st.error().message, 5s);
    return;
  }
  etas_dirty_ = true;
  if (auto e = cpu_queue_.eta_done(j.id)) j.announced_finish = clock_->now() + *e;
  emit(j, "routed", {{"route", std::string("cpu")}, {"reason", why}, {"model", j.route.model},
                     {"fallback_model", j.route.fallback_model}, {"degraded", true}, {"queue", queue_name(QueueId::cpu)},
                     {"queue_position", static_cast<std::uint32_t>(cpu_queue_.position(j.id).value_or(0) + 1)},
                     {"eta_ms", to_ms(cpu_queue_.eta_start(j.id).value_or(Clock::duration{}))}});
}

void Service::dispatch(JobRecord& j, const policy::Route& route) {
  if (j.accept_pending) {  // its slot and reservation are taken; it runs once its accept is durable (commit())
    j.deferred_route = route;
    return;
  }
  const auto now = clock_->now();
  j.route = route;
  if (j.route.model.empty()) j.route.model = j.model;
  const std::string serving = j.route.model;
  // A fallback model has its own tokenizer and template: tokenize for it.
  if (j.kind == WorkloadKind::generate && !j.prompts.count(serving)) {
    auto ids = backend_->encode(serving, j.req.prompt, j.req.messages, j.req.options.template_flags());
    if (!ids) {
      if (policy::JobQueue* q = queue_of(j.queue)) q->finish(j.id);
      release_resources(j);
      end_job(j, JobPhase::failed, "tokenize_failed", ids.error().code, ids.error().message, 0s);
      return;
    }
    j.prompts[serving] = std::move(ids).value();
  }
  const JobPhase from = j.phase;
  if (auto st = j.fsm->start(j.route, now); !st) {
    log::error("job {}: {}", j.id, st.error().message);
  }
  j.phase = JobPhase::running;
  j.running = true;
  j.history.emplace_back(phase_name(from), phase_name(j.phase), route_name(j.route), unix_ms());
  j.routes.push_back(route_name(j.route) + (j.route.fallback_model ? "(" + serving + ")" : ""));
  ++j.attempt;
  j.run_started = now;
  j.run_new_tokens = 0;
  if (j.route.device != policy::Device::cpu) residency_.used(serving, now);  // keep_alive counts from here
  journal_transition(j, route_name(j.route));
  Dict started{{"route", route_name(j.route)}, {"attempt", static_cast<std::uint32_t>(j.fsm->attempts())},
               {"model", serving}};
  if (j.route.device == policy::Device::hybrid) {  // offloaded: partly on the CPU, and says so
    started["gpu_layers"] = j.route.gpu_layers;
    started["partly_on_cpu"] = true;
    started["degraded"] = true;
  }
  emit(j, "started", started);

  workload(j).start(*this, j);
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
  const JobPhase from = j.phase;
  if (phase == JobPhase::failed && code == Errc::resumable && !workload(j).resumable()) code = Errc::unavailable;
  if (j.fsm) {
    Status st;
    if (phase == JobPhase::completed) st = j.fsm->complete(now);
    else if (phase == JobPhase::cancelled) st = j.fsm->cancel(now);
    else st = j.fsm->fail(code, reason, retry_after, now);
    if (!st) log::error("job {}: {}", j.id, st.error().message);
  }
  j.phase = phase;
  active_.erase(j.id);
  etas_dirty_ = true;  // the jobs it shared steps with may finish sooner
  j.reason = reason;
  j.running = false;
  j.queue = QueueId::none;
  j.finished_unix_ms = unix_ms();
  if (phase == JobPhase::failed) {
    j.error_code = std::string(errc_name(code));
    j.error_message = message;
    j.retry_after_ms = to_ms(retry_after);
  }
  if (phase == JobPhase::completed && j.finish_reason.empty()) j.finish_reason = reason;
  j.history.emplace_back(phase_name(from), phase_name(j.phase), reason, j.finished_unix_ms);
  release_resources(j);
  journal_outcome(j);
  if (!j.key.empty()) (void)idempotency_.record_outcome(j.key, j.id, {phase, reason, now});
  ++counters_[phase == JobPhase::completed ? "jobs_completed" : phase == JobPhase::cancelled ? "jobs_cancelled" : "jobs_failed"];
  Dict fin{{"state", phase_name(j.phase)}, {"reason", reason}, {"finish_reason", j.finish_reason}};
  workload(j).outcome(j, fin);
  if (phase == JobPhase::failed) {
    fin["error_code"] = j.error_code;
    fin["error_message"] = j.error_message;
    fin["retry_after_ms"] = j.retry_after_ms;
  }
  emit(j, "finished", fin);
  log::job_line(j.id, j.model, route_name(j.route), phase_name(j.phase), reason, breaker_state());
  workload(j).ended(*this, j, phase, code, message);
}

void Service::on_run_finished(JobRecord& j, const RunResult& r) {
  const auto now = clock_->now();
  j.running = false;
  const bool on_gpu = j.route.device != policy::Device::cpu;
  auto& q = on_gpu ? gpu_queue_ : cpu_queue_;
  q.finish(j.id);
  if (on_gpu) residency_.used(j.route.model, now);
  if (r.new_tokens > 0 && r.decode_time > Clock::duration::zero()) q.rates().observe_decode(r.new_tokens, r.decode_time);
  release_resources(j);
  j.queue = QueueId::none;
  // Journal what was delivered.
  if (j.tokens.size() != j.journaled_tokens) journal_checkpoint(j);
  if (r.status && r.finish_reason == "cancelled" && j.stop_cause == StopCause::evict && on_gpu) {
    // Stopped by an eviction's drain (not a fault: the breaker is not fed). While tandemd stops, it ends as the
    // other running jobs do.
    if (draining_) {
      j.stop_cause = StopCause::shutdown;
    } else {
      ++counters_["gpu_evict_moves"];
      move_off_gpu(j, "evicted", "its GPU replica is being given back");
      return;
    }
  }
  if (r.status) {
    if (on_gpu) breaker_event(BreakerEvent::job_succeeded);
    if (r.finish_reason == "cancelled") {
      const bool resumable = workload(j).resumable();
      if (j.stop_cause == StopCause::deadline) {
        end_job(j, JobPhase::failed, "deadline", Errc::timeout,
                resumable ? "the deadline passed after " + std::to_string(j.tokens.size()) + " tokens"
                          : std::string("the deadline passed before the run ended"),
                0s);
      } else if (j.stop_cause == StopCause::shutdown) {
        end_job(j, JobPhase::failed, "daemon_stopping", Errc::resumable,
                resumable ? "tandemd stopped; resume from the checkpoint" : "tandemd stopped; call again when it is back",
                0s);
      } else {
        end_job(j, JobPhase::cancelled, "cancelled", Errc::cancelled, "", 0s);
      }
      return;
    }
    j.finish_reason = r.finish_reason;
    if (Status kept = workload(j).completed(*this, j, r); !kept) {
      log::error("job {}: {}", j.id, kept.error().message);
      j.finish_reason.clear();
      end_job(j, JobPhase::failed, "run_failed", kept.error().code, kept.error().message, 0s);
      return;
    }
    end_job(j, JobPhase::completed, r.finish_reason, Errc::internal, "", 0s);
    return;
  }
  // The run failed.
  if (j.stop_cause == StopCause::cancelled) {
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
  if (ec == Errc::timeout) {  // the run waited too long for its input (a live stream without audio)
    end_job(j, JobPhase::failed, "input_timeout", Errc::timeout, r.status.error().message, 0s);
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
      return host_guard_.check(est, readings_.host()).fit != policy::HostFit::never;
    }
  return false;
}

void Service::on_gpu_failure(JobRecord& j, const RunResult& r) {
  const auto& err = r.status.error();
  if (err.code == Errc::device_lost) {
    breaker_event(BreakerEvent::driver_reset);
    if (readings_.mark_lost()) log::warn("accelerator lost: {}", err.message);
  } else if (err.code == Errc::out_of_memory) {
    breaker_event(BreakerEvent::alloc_failure);
  }
  ++counters_[err.code == Errc::device_lost ? "gpu_device_lost" : "gpu_alloc_failures"];
  move_off_gpu(j, std::string(errc_name(err.code)), err.message);
}

void Service::move_off_gpu(JobRecord& j, const std::string& cause, const std::string& message) {
  // A fresh cancel flag for the next run (an eviction's preemption raised the old one).
  j.cancel = std::make_shared<std::atomic<bool>>(false);
  j.stop_cause = StopCause::none;
  const auto fd = workload(j).failover(*this, j);
  const auto tokens_delivered = workload(j).delivered(j);
  const auto now = clock_->now();
  const JobPhase from = j.phase;
  switch (fd.action) {
    case policy::FailoverAction::retry_on_cpu: {
      (void)j.fsm->begin_retry(cause, now);
      j.phase = JobPhase::retrying;
      j.history.emplace_back(phase_name(from), phase_name(j.phase), cause, unix_ms());
      ++counters_["retries"];
      journal_transition(j, cause);
      j.route.device = policy::Device::cpu;
      j.route.gpu_layers = 0;
      j.degraded = true;
      log::warn("job {}: its GPU run ended before any token ({}); retrying on the CPU", j.id, message);
      to_cpu_queue(j, (cause == "evicted" ? "" : "gpu_failure:") + cause);
      break;
    }
    case policy::FailoverAction::migrate_at_checkpoint: {
      (void)j.fsm->record_tokens(tokens_delivered);
      (void)j.fsm->begin_migration(cause, now);
      j.phase = JobPhase::migrating;
      j.history.emplace_back(phase_name(from), phase_name(j.phase), cause, unix_ms());
      ++counters_["migrations"];
      journal_transition(j, cause);
      emit(j, "migrated", {{"from", route_name(j.route)}, {"to", std::string("cpu")}, {"reason", cause},
                           {"tokens_delivered", static_cast<std::uint32_t>(j.tokens.size())}});
      j.route.device = policy::Device::cpu;
      j.route.gpu_layers = 0;
      j.degraded = true;
      log::warn("job {}: its GPU run ended after {} tokens ({}); migrating to the CPU at the checkpoint", j.id,
                j.tokens.size(), message);
      to_cpu_queue(j, "migrated:" + cause);
      break;
    }
    case policy::FailoverAction::fail_resumable:
      end_job(j, JobPhase::failed, fd.reason, Errc::resumable,
              "the GPU run ended (" + message + ") after " + std::to_string(j.tokens.size()) +
                  " tokens and the job cannot move (" + fd.reason + "); resume from the checkpoint",
              breaker_.retry_in(now) > Clock::duration::zero() ? breaker_.retry_in(now) : 5s);
      break;
  }
}

}  // namespace tandem::daemon
