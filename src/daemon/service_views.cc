// Service: what the front ends read — job dicts, models, the properties (policy, memory, host memory, queues,
// limits, holds), Policy changes, the status line and PropertiesChanged batching.
#include "daemon/service.h"

#include "daemon/host_reading.h"
#include "daemon/service_internal.h"

namespace tandem::daemon {

Dict Service::job_dict(const JobRecord& j) const {
  Dict d = placement(j);
  d.erase("job_id");
  d["id"] = j.id;
  d["state"] = phase_name(j.phase);
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
  workload(j).view(j, d);
  if (j.phase == JobPhase::failed && j.kind == WorkloadKind::generate) {
    d["checkpoint_seed"] = j.sampling.seed;
    d["checkpoint_tokens"] = static_cast<std::uint32_t>(j.tokens.size());
    d["checkpoint_model"] = j.route.model.empty() ? j.model : j.route.model;  // the model whose ids they are
  }
  return d;
}

Result<Dict> Service::get_job(const Caller& c, JobId id) const {
  const JobRecord* j = find(id);
  if (!j || j->accept_pending) return fail(Errc::not_found, "no job " + std::to_string(id));  // not accepted (yet)
  TANDEM_TRY(check_owner(c, *j));
  return job_dict(*j);
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
    d["default"] = m.name == default_llm();
    d["fingerprint"] = m.fingerprint;
    d["revision"] = m.revision;
    d["fallback"] = m.fallback;
    d["max_context"] = m.max_context;
    d["template"] = m.template_name;
    d["dtype"] = m.dtype;
    d["weight_bytes"] = m.weight_bytes;
    d["kind"] = std::string(model_kind_name(m.kind));
    if (m.kind == ModelKind::embedding) {
      d["dim"] = m.embedding.dim;
      d["image_size"] = m.embedding.image_size;
      std::vector<std::string> modalities;
      if (m.embedding.text) modalities.push_back("text");
      if (m.embedding.image) modalities.push_back("image");
      d["modalities"] = modalities;
      d["default"] = m.name == default_embedding_model();
    }
    if (m.kind == ModelKind::speech) {
      d["languages"] = m.speech.languages;
      d["window_ms"] = static_cast<std::uint64_t>(m.speech.window_samples) * 1000u / 16000u;
      d["translate"] = m.speech.translate;
      d["default"] = m.name == default_speech_model();
    }
    std::string placement;
    std::uint64_t gpu_bytes = 0, host_bytes = 0;
    for (const auto& r : replicas(m.name)) {
      if (!placement.empty()) placement += "+";
      placement += r.device;
      if (r.device == "cpu") placement += "(" + r.mode + ")";
      if (r.state != ReplicaState::loaded) placement += "[" + std::string(replica_state_name(r.state)) + "]";
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

std::vector<ReplicaInfo> Service::replicas(const std::string& name) const {
  auto out = backend_->replicas(name);
  const Residency::Replica* r = residency_.find(name);
  if (!r) return out;
  for (auto& x : out) {
    if (x.device == "cpu") continue;
    // The backend knows loaded / evicted / lost / failed; the residency what is under way and why.
    if (r->state == ReplicaState::draining || r->state == ReplicaState::loading) x.state = r->state;
    if (r->state != ReplicaState::loaded && r->state != ReplicaState::failed) x.reason = r->reason;
  }
  return out;
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
        for (Rung r : policy::kRungs)
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
      if (auto adm = guard.admit(id, *j->host, readings_.host()); !adm)
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
  d["present"] = acc && !readings_.device_lost();
  const auto& h = readings_.headroom();
  d["total"] = h.total_bytes;
  d["free"] = readings_.snapshot() ? readings_.snapshot()->free_bytes : 0;
  d["observed_used"] = h.observed_used_bytes;
  d["predicted_used"] = h.predicted_used_bytes;
  d["margin"] = h.margin_bytes;
  d["foreign"] = h.foreign_used_bytes;
  d["unmaterialized"] = h.unmaterialized_bytes;
  d["headroom"] = h.headroom;
  d["prediction_error"] = h.prediction_error_bytes;
  d["reading_age_ms"] = to_ms(h.reading_age);
  d["trust"] = std::string(policy::trust_name(h.trust));
  d["pressure"] = std::string(policy::pressure_name(readings_.pressure()));
  return d;
}

Dict Service::host_memory_view() const {
  Dict d;
  const auto b = host_guard_.budget(readings_.host());
  d["budget"] = b.bytes;
  d["bound"] = std::string(policy::host_bound_name(b.bound));
  d["configured_budget"] = cfg_.policy.host_guard.budget_bytes;
  d["cgroup_max"] = readings_.host().cgroup_max.value_or(0);
  d["mem_available"] = readings_.host().mem_available.value_or(0);
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
  for (const auto& h : holds_.list()) rows.push_back({h.cookie, h.app_id, h.reason, h.since_unix_ms});
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

}  // namespace tandem::daemon
