// Service: readings and state — device and host readings, the breaker and its probes, the service level,
// deadlines, the periodic tick and its interval, pruning finished jobs.
#include "daemon/service.h"

#include "daemon/service_internal.h"

namespace tandem::daemon {

// ---------------------------------------------------------------------------------------------------------------
// Readings, breaker, state

void Service::refresh_readings() {
  const auto now = clock_->now();
  refresh_backgrounds();
  auto acc = backend_->accelerator();
  for (const auto& m : backend_->models()) {
    auto bytes = backend_->gpu_resident_bytes(m.name);
    // A replica being loaded back counts in full from the start of its load: two loads, or a load and a job, cannot
    // overcommit the device between readings.
    if (const auto* r = residency_.find(m.name); r && r->state == ReplicaState::loading)
      bytes = std::max(bytes, replica_bytes(m.name));
    (void)ledger_.set_resident(m.name, bytes);
  }
  if (acc) {
    if (auto why = readings_.read_device(*acc, ledger_, cfg_.policy.headroom, now)) {
      if (why->empty()) log::warn("accelerator lost");
      else log::warn("accelerator lost: {}", *why);
      breaker_event(BreakerEvent::driver_reset);
    }
  }
  readings_.read_host();
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
  in.pressure = readings_.pressure();
  in.breaker = breaker_.state();
  auto acc = backend_->accelerator();
  bool any_gpu = false;
  for (const auto& m : backend_->models()) any_gpu = any_gpu || m.gpu_configured;
  in.gpu_present = !acc || !any_gpu ? true : !readings_.device_lost();
  if (acc && any_gpu && !readings_.device_lost()) {
    bool ready = false;
    for (const auto& m : backend_->models()) ready = ready || backend_->gpu_ready(m.name);
    in.gpu_present = ready || residency_.any_given_back();  // given back on purpose: the device is fine
  }
  in.gpu_held = !holds_.empty();
  for (const auto& r : residency_.list())
    in.gpu_given_back = in.gpu_given_back || (r.reason == EvictReason::pressure && residency_.given_back(r.model));
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
  in.reading = readings_.headroom().trust;
  if (!acc || !any_gpu) {
    // No accelerator configured: CPU-only operation is the configured normal, not a degradation.
    in.pressure = policy::Pressure::normal;
    in.reading = policy::ReadingTrust::fresh;
  }
  state_.update(in, now);
  std::uint32_t offloaded = 0;  // running with their last layers on the CPU (the offload rung)
  for (JobId id : active_)
    if (const JobRecord* j = find(id); j && j->running && j->route.device == policy::Device::hybrid) ++offloaded;
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
                 {"expected_slowdown", expected_slowdown()},
                 {"since_unix_ms", degraded_since_unix_ms_},
                 {"previous", std::string(policy::service_level_name(ch.from.level))},
                 {"offloaded_jobs", offloaded}};
    const bool level_changed = ch.from.level != ch.to.level || ch.from.reason != ch.to.reason;
    auto rate = [](const policy::ServiceRates& r, double tps) {
      return r.from_priors() ? std::string("not measured yet") : fmt::format("~{:.0f} tok/s", tps);
    };
    if (degraded && level_changed)
      log::warn("degraded mode: {} ({}); the CPU route decodes at {}, the GPU at {} (smoothed)",
                policy::service_level_name(ch.to.level), ch.to.reason, rate(cpu_queue_.rates(), cpu_tps),
                rate(gpu_queue_.rates(), gpu_tps));
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
      if (j.stop_cause == StopCause::none || j.stop_cause == StopCause::evict) {
        j.stop_cause = StopCause::deadline;
        j.cancel->store(true);
      }
      continue;
    }
    leave_queue(j);
    end_job(j, JobPhase::failed, "deadline", Errc::timeout, "the deadline passed while the job waited", 0s);
  }
}

void Service::tick() {
  refresh_readings();
  maybe_probe();
  check_deadlines();
  residency_step();
  remove_finished_models();
  update_service_state();
  pump();
  prune_finished();
}

Clock::duration Service::poll_interval() const {
  const auto& d = cfg_.device;
  return std::chrono::duration_cast<Clock::duration>(idle() ? std::max(d.idle_poll_interval, d.poll_interval)
                                                            : d.poll_interval);
}

bool Service::idle() const {
  return active_.empty() && gpu_queue_.depth() == 0 && cpu_queue_.depth() == 0 && gpu_queue_.running() == 0 &&
         cpu_queue_.running() == 0 && readings_.pressure() == policy::Pressure::normal &&
         breaker_.state() == policy::BreakerState::closed && !readings_.device_lost() && !probe_in_flight_ &&
         !last_probe_failed_ && !reload_in_flight_ && !draining_ && outcome_retry_.empty() &&
         !residency_.changing() && !catalog_.changing() &&
         !state_.improving();
}

// Terminal jobs stay readable (GetJob) as long as the journal keeps them.
void Service::prune_finished() {
  if (jobs_.size() <= cfg_.journal.max_jobs + 64u) return;
  std::size_t terminal = 0;
  for (const auto& [id, j] : jobs_) terminal += j->terminal();
  for (auto it = jobs_.begin(); it != jobs_.end() && terminal > cfg_.journal.max_jobs;) {
    if (it->second->terminal() && !it->second->outcome_unwritten) {  // an outcome to write again stays
      it = jobs_.erase(it);
      --terminal;
    } else {
      ++it;
    }
  }
  idempotency_.expire(clock_->now());
}

}  // namespace tandem::daemon
