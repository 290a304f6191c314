// The reply views as JSON (tandemctl --json): one to_json per view, the D-Bus names mapped to JSON keys; what a
// view could not parse goes under "_unparsed". Split from format.cc (text formatting and parsing).
#include "client/format.h"

#include <variant>

namespace tandem::client {

namespace {

using nlohmann::json;

template <class T>
void put(json& j, const char* key, const std::optional<T>& v) {
  if (v) j[key] = *v;
}

void put_unparsed(json& j, const Unparsed& u) {
  if (!u.empty()) j["_unparsed"] = u;
}

}  // namespace

nlohmann::json policy_value_to_json(const PolicyValue& v) {
  return std::visit([](const auto& x) { return json(x); }, v);
}

json to_json(const PolicySettings& p) {
  json j = json::object();
  put(j, "margin_bytes", p.margin_bytes);
  put(j, "margin_fraction", p.margin_fraction);
  put(j, "ladder_order", p.ladder_order);
  put(j, "max_delay_ms", p.max_delay_ms);
  put(j, "offload_enabled", p.offload_enabled);
  put(j, "allow_migration", p.allow_migration);
  put(j, "gpu_concurrency", p.gpu_concurrency);
  put(j, "cpu_concurrency", p.cpu_concurrency);
  put(j, "host_budget_bytes", p.host_budget_bytes);
  put(j, "breaker_cooldown_ms", p.breaker_cooldown_ms);
  put_unparsed(j, p.unparsed);
  return j;
}

json to_json(const MemoryInfo& m) {
  json j = json::object();
  put(j, "device", m.device);
  put(j, "present", m.present);
  put(j, "total", m.total);
  put(j, "free", m.free);
  put(j, "observed_used", m.observed_used);
  put(j, "predicted_used", m.predicted_used);
  put(j, "margin", m.margin);
  put(j, "foreign", m.foreign);
  put(j, "unmaterialized", m.unmaterialized);
  put(j, "headroom", m.headroom);
  put(j, "prediction_error", m.prediction_error);
  put(j, "reading_age_ms", m.reading_age_ms);
  put(j, "trust", m.trust);
  put(j, "pressure", m.pressure);
  put_unparsed(j, m.unparsed);
  return j;
}

json to_json(const HostMemoryInfo& h) {
  json j = json::object();
  put(j, "budget", h.budget);
  put(j, "bound", h.bound);
  put(j, "configured_budget", h.configured_budget);
  put(j, "cgroup_max", h.cgroup_max);
  put(j, "mem_available", h.mem_available);
  put(j, "used", h.used);
  put(j, "daemon_rss", h.daemon_rss);
  put_unparsed(j, h.unparsed);
  return j;
}

json to_json(const ServiceStatus& s) {
  json j = json::object();
  put(j, "state", s.state);
  put(j, "degraded_reason", s.degraded_reason);
  put(j, "gpu_breaker", s.gpu_breaker);
  if (s.policy) j["policy"] = to_json(*s.policy);
  if (s.memory) j["memory"] = to_json(*s.memory);
  if (s.host_memory) j["host_memory"] = to_json(*s.host_memory);
  if (s.queues) {
    json q = json::array();
    for (const auto& x : *s.queues)
      q.push_back({{"name", x.name},
                   {"depth", x.depth},
                   {"capacity", x.capacity},
                   {"running", x.running},
                   {"concurrency", x.concurrency},
                   {"oldest_age_ms", x.oldest_age_ms}});
    j["queues"] = q;
  }
  if (s.limits) j["limits"] = *s.limits;
  if (s.holds) {
    json h = json::array();
    for (const auto& x : *s.holds)
      h.push_back(
          {{"cookie", x.cookie}, {"app_id", x.app_id}, {"reason", x.reason}, {"since_unix_ms", x.since_unix_ms}});
    j["holds"] = h;
  }
  put(j, "fallback_model", s.fallback_model);
  put(j, "version", s.version);
  put(j, "rings", s.rings);
  j["degraded"] = s.degraded();
  put_unparsed(j, s.unparsed);
  return j;
}

std::string property_json_key(std::string_view dbus_name) {
  std::string o;
  for (std::size_t i = 0; i < dbus_name.size(); ++i) {
    char c = dbus_name[i];
    if (std::isupper(static_cast<unsigned char>(c))) {
      if (i > 0) o += '_';
      o += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else {
      o += c;
    }
  }
  return o;
}

json to_json(const PropertiesChange& c) {
  json all = to_json(c.values);
  json changed = json::object();
  for (const auto& name : c.changed) {
    std::string key = property_json_key(name);
    if (all.contains(key)) changed[key] = all[key];
  }
  json j = {{"changed", changed}, {"invalidated", c.invalidated}};
  if (all.contains("_unparsed")) j["_unparsed"] = all["_unparsed"];
  return j;
}

json to_json(const DegradedChange& d) {
  json j = {{"degraded", d.degraded}, {"reason", d.reason}};
  put(j, "level", d.level);
  put(j, "fallback_model", d.fallback_model);
  put(j, "limits", d.limits);
  put(j, "expected_slowdown", d.expected_slowdown);
  put(j, "since_unix_ms", d.since_unix_ms);
  put_unparsed(j, d.unparsed);
  return j;
}

json to_json(const Placement& p) {
  json j = json::object();
  put(j, "job_id", p.job_id);
  put(j, "state", p.state);
  put(j, "action", p.action);
  put(j, "reason", p.reason);
  put(j, "detail", p.detail);
  put(j, "route", p.route);
  put(j, "queue", p.queue);
  put(j, "queue_position", p.queue_position);
  put(j, "eta_ms", p.eta_ms);
  put(j, "eta_known", p.eta_known);
  put(j, "model", p.model);
  put(j, "fallback_model", p.fallback_model);
  put(j, "fingerprint", p.fingerprint);
  put(j, "max_new_tokens", p.max_new_tokens);
  put(j, "prefill_chunk", p.prefill_chunk);
  put(j, "gpu_layers", p.gpu_layers);
  put(j, "degraded", p.degraded);
  put(j, "expected_slowdown", p.expected_slowdown);
  put(j, "prompt_tokens", p.prompt_tokens);
  put(j, "existing", p.existing);
  put_unparsed(j, p.unparsed);
  return j;
}

json to_json(const PlanDecision& d) {
  json j = json::object();
  put(j, "action", d.action);
  put(j, "reason", d.reason);
  put(j, "detail", d.detail);
  put(j, "route", d.route);
  put(j, "model", d.model);
  put(j, "fallback_model", d.fallback_model);
  put(j, "max_new_tokens", d.max_new_tokens);
  put(j, "prefill_chunk", d.prefill_chunk);
  put(j, "gpu_layers", d.gpu_layers);
  put(j, "eta_ms", d.eta_ms);
  put(j, "eta_known", d.eta_known);
  put(j, "retry_after_ms", d.retry_after_ms);
  put(j, "permanent", d.permanent);
  put(j, "pressure", d.pressure);
  put(j, "prompt_tokens", d.prompt_tokens);
  if (d.skipped) {
    json s = json::array();
    for (const auto& x : *d.skipped) s.push_back({{"rung", x.rung}, {"why", x.why}});
    j["skipped"] = s;
  }
  put(j, "breakdown", d.breakdown);
  put(j, "headroom", d.headroom);
  put_unparsed(j, d.unparsed);
  return j;
}

json to_json(const JobInfo& i) {
  json j = json::object();
  put(j, "id", i.id);
  put(j, "state", i.state);
  put(j, "model", i.model);
  put(j, "route", i.route);
  put(j, "reason", i.reason);
  put(j, "attempts", i.attempts);
  put(j, "accepted_unix_ms", i.accepted_unix_ms);
  put(j, "finished_unix_ms", i.finished_unix_ms);
  put(j, "tokens", i.tokens);
  put(j, "text", i.text);
  put(j, "finish_reason", i.finish_reason);
  put(j, "queue", i.queue);
  put(j, "queue_position", i.queue_position);
  put(j, "eta_ms", i.eta_ms);
  put(j, "eta_known", i.eta_known);
  if (i.history) {
    json h = json::array();
    for (const auto& x : *i.history)
      h.push_back({{"from", x.from}, {"to", x.to}, {"reason", x.reason}, {"at_unix_ms", x.at_unix_ms}});
    j["history"] = h;
  }
  put(j, "routes", i.routes);
  put(j, "error_code", i.error_code);
  put(j, "error_message", i.error_message);
  put(j, "retry_after_ms", i.retry_after_ms);
  if (i.checkpoint) {
    json c = json::object();
    put(c, "seed", i.checkpoint->seed);
    put(c, "tokens_delivered", i.checkpoint->tokens_delivered);
    put(c, "model", i.checkpoint->model);
    put_unparsed(c, i.checkpoint->unparsed);
    j["checkpoint"] = c;
  }
  put(j, "idempotency_key", i.idempotency_key);
  put(j, "side_effects", i.side_effects);
  put(j, "degraded", i.degraded);
  j["resumable"] = i.state.value_or("") == "failed" && i.checkpoint.has_value();
  put(j, "action", i.action);
  put(j, "detail", i.detail);
  put(j, "fingerprint", i.fingerprint);
  put(j, "fallback_model", i.fallback_model);
  put(j, "expected_slowdown", i.expected_slowdown);
  put(j, "gpu_layers", i.gpu_layers);
  put(j, "max_new_tokens", i.max_new_tokens);
  put(j, "prefill_chunk", i.prefill_chunk);
  put(j, "prompt_tokens", i.prompt_tokens);
  // Transcription jobs.
  put(j, "kind", i.kind);
  put(j, "segments_json", i.segments_json);
  put(j, "segments", i.segments);
  put(j, "windows_done", i.windows_done);
  put(j, "windows_total", i.windows_total);
  put(j, "windows_on_cpu", i.windows_on_cpu);
  put(j, "windows_skipped", i.windows_skipped);
  put(j, "fallbacks", i.fallbacks);
  put(j, "audio_ms", i.audio_ms);
  put(j, "audio_done_ms", i.audio_done_ms);
  put(j, "audio_format", i.audio_format);
  put(j, "language", i.language);
  put(j, "realtime_factor", i.realtime_factor);
  put(j, "queued_ms", i.queued_ms);
  put(j, "run_ms", i.run_ms);
  put(j, "stream", i.stream);
  put(j, "stream_bytes", i.stream_bytes);
  put(j, "stream_complete", i.stream_complete);
  // Embedding jobs.
  put(j, "inputs", i.inputs);
  put(j, "texts", i.texts);
  put(j, "images", i.images);
  put(j, "dim", i.dim);
  put(j, "truncated", i.truncated);
  put(j, "text_tokens", i.text_tokens);
  put_unparsed(j, i.unparsed);
  return j;
}

json to_json(const ModelInfo& m) {
  json j = json::object();
  put(j, "name", m.name);
  put(j, "path", m.path);
  put(j, "default", m.is_default);
  put(j, "fingerprint", m.fingerprint);
  put(j, "revision", m.revision);
  put(j, "placement", m.placement);
  put(j, "fallback", m.fallback);
  put(j, "max_context", m.max_context);
  put(j, "kind", m.kind);
  put(j, "dim", m.dim);
  put(j, "image_size", m.image_size);
  put(j, "modalities", m.modalities);
  put(j, "template", m.template_name);
  put(j, "dtype", m.dtype);
  put(j, "weight_bytes", m.weight_bytes);
  put(j, "placement_bytes", m.placement_bytes);
  put(j, "languages", m.languages);
  put(j, "window_ms", m.window_ms);
  put(j, "translate", m.translate);
  put_unparsed(j, m.unparsed);
  return j;
}

json to_json(const EmbedInfo& e) {
  json j = json::object();
  put(j, "job_id", e.job_id);
  put(j, "model", e.model);
  put(j, "route", e.route);
  put(j, "dim", e.dim);
  put(j, "inputs", e.inputs);
  put(j, "texts", e.texts);
  put(j, "images", e.images);
  put(j, "truncated", e.truncated);
  put(j, "text_tokens", e.text_tokens);
  put(j, "attempts", e.attempts);
  put(j, "degraded", e.degraded);
  put(j, "fingerprint", e.fingerprint);
  put(j, "queued_ms", e.queued_ms);
  put(j, "run_ms", e.run_ms);
  put(j, "existing", e.existing);
  put_unparsed(j, e.unparsed);
  return j;
}

json to_json(const ModelDetails& m) {
  json j = {{"path", m.path}};
  put(j, "name", m.name);
  put(j, "revision", m.revision);
  put(j, "fingerprint", m.fingerprint);
  if (m.replicas) {
    json a = json::array();
    for (const auto& r : *m.replicas) {
      json x = json::object();
      put(x, "device", r.device);
      put(x, "state", r.state);
      put(x, "reason", r.reason);
      put(x, "mode", r.mode);
      put(x, "layers", r.layers);
      put(x, "accel_bytes", r.accel_bytes);
      put(x, "host_bytes", r.host_bytes);
      put(x, "fingerprint", r.fingerprint);
      put(x, "error", r.error);
      put_unparsed(x, r.unparsed);
      a.push_back(x);
    }
    j["replicas"] = a;
  }
  put(j, "placement", m.placement);
  put(j, "fallback", m.fallback);
  put(j, "max_context", m.max_context);
  put(j, "template", m.template_name);
  put(j, "kind", m.kind);
  put_unparsed(j, m.unparsed);
  return j;
}

json to_json(const JobUpdate& u) {
  json j = {{"job", u.job_id}, {"kind", u.kind}};
  put(j, "route", u.route);
  put(j, "reason", u.reason);
  put(j, "model", u.model);
  put(j, "fallback_model", u.fallback_model);
  put(j, "degraded", u.degraded);
  put(j, "queue", u.queue);
  put(j, "queue_position", u.queue_position);
  put(j, "eta_ms", u.eta_ms);
  put(j, "eta_known", u.eta_known);
  put(j, "previous_eta_ms", u.previous_eta_ms);
  put(j, "attempt", u.attempt);
  put(j, "text", u.text);
  put(j, "tokens", u.tokens);
  put(j, "step", u.step);
  put(j, "from", u.from);
  put(j, "to", u.to);
  put(j, "tokens_delivered", u.tokens_delivered);
  put(j, "state", u.state);
  put(j, "finish_reason", u.finish_reason);
  put(j, "error_code", u.error_code);
  put(j, "error_message", u.error_message);
  put(j, "retry_after_ms", u.retry_after_ms);
  put(j, "tokens_total", u.tokens_total);
  put_unparsed(j, u.unparsed);
  return j;
}

json to_json(const RunSummary& s) {
  json j = {{"job", s.job_id},    {"state", s.state},           {"finish_reason", s.finish_reason},
            {"tokens", s.tokens}, {"elapsed_ms", s.elapsed_ms}, {"generate_ms", s.generate_ms},
            {"routes", s.routes}};
  if (!s.error_code.empty()) j["error_code"] = s.error_code;
  if (!s.error_message.empty()) j["error_message"] = s.error_message;
  return j;
}

}  // namespace tandem::client
