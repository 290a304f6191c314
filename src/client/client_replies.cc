// D-Bus replies -> the plain views of format.h (placement_from_dbus, job_from_dbus, ...): lenient readers of a{sv}
// dictionaries whose unknown keys or types go to `unparsed`. Split from client.cc (the connection and the calls).
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "client/client_impl.h"

namespace tandem::client {

namespace {

// ---------------------------------------------------------------------------------------------------------------
// Variant readers. Each returns nullopt when the variant holds another type (or an integer out of range).

template <class T>
std::optional<T> exact(const sdbus::Variant& v) {
  if (!v.containsValueOfType<T>()) return std::nullopt;
  return v.get<T>();
}

template <class T, class S>
std::optional<T> narrow(S s) {
  if (!std::in_range<T>(s)) return std::nullopt;
  return static_cast<T>(s);
}

template <class T>
std::optional<T> as_int(const sdbus::Variant& v) {
  const std::string sig = v.peekValueType();
  if (sig == "t") return narrow<T>(v.get<std::uint64_t>());
  if (sig == "u") return narrow<T>(v.get<std::uint32_t>());
  if (sig == "q") return narrow<T>(v.get<std::uint16_t>());
  if (sig == "y") return narrow<T>(v.get<std::uint8_t>());
  if (sig == "x") return narrow<T>(v.get<std::int64_t>());
  if (sig == "i") return narrow<T>(v.get<std::int32_t>());
  if (sig == "n") return narrow<T>(v.get<std::int16_t>());
  return std::nullopt;
}

std::optional<double> as_double(const sdbus::Variant& v) {
  if (v.peekValueType() == "d") return v.get<double>();
  if (auto i = as_int<std::int64_t>(v)) return static_cast<double>(*i);
  if (auto u = as_int<std::uint64_t>(v)) return static_cast<double>(*u);
  return std::nullopt;
}

std::optional<std::string> as_string(const sdbus::Variant& v) {
  const std::string sig = v.peekValueType();
  if (sig == "s") return v.get<std::string>();
  if (sig == "o") return std::string(v.get<sdbus::ObjectPath>());
  if (sig == "g") return std::string(v.get<sdbus::Signature>());
  return std::nullopt;
}

std::optional<bool> as_bool(const sdbus::Variant& v) { return exact<bool>(v); }
std::optional<std::vector<std::string>> as_strings(const sdbus::Variant& v) {
  return exact<std::vector<std::string>>(v);
}

template <class T, class S>
std::optional<std::vector<T>> narrow_list(const std::vector<S>& in) {
  std::vector<T> out;
  out.reserve(in.size());
  for (S s : in) {
    auto x = narrow<T>(s);
    if (!x) return std::nullopt;
    out.push_back(*x);
  }
  return out;
}

template <class T>
std::optional<std::vector<T>> as_int_list(const sdbus::Variant& v) {
  const std::string sig = v.peekValueType();
  if (sig == "ai") return narrow_list<T>(v.get<std::vector<std::int32_t>>());
  if (sig == "au") return narrow_list<T>(v.get<std::vector<std::uint32_t>>());
  if (sig == "ax") return narrow_list<T>(v.get<std::vector<std::int64_t>>());
  if (sig == "at") return narrow_list<T>(v.get<std::vector<std::uint64_t>>());
  return std::nullopt;
}

template <class T, class S>
std::optional<std::map<std::string, T>> narrow_map(const std::map<std::string, S>& in) {
  std::map<std::string, T> out;
  for (const auto& [k, s] : in) {
    auto x = narrow<T>(s);
    if (!x) return std::nullopt;
    out.emplace(k, *x);
  }
  return out;
}

template <class T>
std::optional<std::map<std::string, T>> as_int_map(const sdbus::Variant& v) {
  const std::string sig = v.peekValueType();
  if (sig == "a{su}") return narrow_map<T>(v.get<std::map<std::string, std::uint32_t>>());
  if (sig == "a{st}") return narrow_map<T>(v.get<std::map<std::string, std::uint64_t>>());
  if (sig == "a{si}") return narrow_map<T>(v.get<std::map<std::string, std::int32_t>>());
  if (sig == "a{sx}") return narrow_map<T>(v.get<std::map<std::string, std::int64_t>>());
  return std::nullopt;
}

// Reads the keys of one a{sv}; keys never asked for, or of another type, end up in `unparsed`.
class Reader {
 public:
  Reader(const VariantMap& m, Unparsed& unparsed) : m_(m), unparsed_(unparsed) {}
  Reader(const Reader&) = delete;
  ~Reader() {
    for (const auto& [k, v] : m_)
      if (!seen_.count(k)) unparsed_[k] = "unknown key (" + v.peekValueType() + ")";
  }

  template <class T, class Conv>
  void read(const char* key, std::optional<T>& out, Conv conv, const char* expected) {
    auto it = m_.find(key);
    if (it == m_.end()) return;
    seen_.insert(key);
    auto v = conv(it->second);
    if (v)
      out = std::move(*v);
    else
      unparsed_[key] = "unexpected type " + it->second.peekValueType() + ", expected " + expected;
  }
  void s(const char* key, std::optional<std::string>& out) { read(key, out, as_string, "s"); }
  void b(const char* key, std::optional<bool>& out) { read(key, out, as_bool, "b"); }
  void u(const char* key, std::optional<std::uint32_t>& out) { read(key, out, as_int<std::uint32_t>, "u"); }
  void t(const char* key, std::optional<std::uint64_t>& out) { read(key, out, as_int<std::uint64_t>, "t"); }
  void x(const char* key, std::optional<std::int64_t>& out) { read(key, out, as_int<std::int64_t>, "x"); }
  void d(const char* key, std::optional<double>& out) { read(key, out, as_double, "d"); }
  void as(const char* key, std::optional<std::vector<std::string>>& out) { read(key, out, as_strings, "as"); }
  void ai(const char* key, std::optional<std::vector<std::int32_t>>& out) {
    read(key, out, as_int_list<std::int32_t>, "ai");
  }
  void su(const char* key, std::optional<std::map<std::string, std::uint32_t>>& out) {
    read(key, out, as_int_map<std::uint32_t>, "a{su}");
  }
  void st(const char* key, std::optional<std::map<std::string, std::uint64_t>>& out) {
    read(key, out, as_int_map<std::uint64_t>, "a{st}");
  }
  void sx(const char* key, std::optional<std::map<std::string, std::int64_t>>& out) {
    read(key, out, as_int_map<std::int64_t>, "a{sx}");
  }

 private:
  const VariantMap& m_;
  Unparsed& unparsed_;
  std::set<std::string> seen_;
};

using Pair = sdbus::Struct<std::string, std::string>;
using HistoryTuple = sdbus::Struct<std::string, std::string, std::string, std::int64_t>;
using QueueTuple =
    sdbus::Struct<std::string, std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t, std::uint64_t>;

std::optional<std::vector<SkippedRung>> as_skipped(const sdbus::Variant& v) {
  auto raw = exact<std::vector<Pair>>(v);
  if (!raw) return std::nullopt;
  std::vector<SkippedRung> out;
  for (const auto& p : *raw) out.push_back({p.get<0>(), p.get<1>()});
  return out;
}

std::optional<std::vector<HistoryEntry>> as_history(const sdbus::Variant& v) {
  auto raw = exact<std::vector<HistoryTuple>>(v);
  if (!raw) return std::nullopt;
  std::vector<HistoryEntry> out;
  for (const auto& h : *raw) out.push_back({h.get<0>(), h.get<1>(), h.get<2>(), h.get<3>()});
  return out;
}

std::optional<std::vector<QueueInfo>> as_queues(const sdbus::Variant& v) {
  auto raw = exact<std::vector<QueueTuple>>(v);
  if (!raw) return std::nullopt;
  std::vector<QueueInfo> out;
  for (const auto& q : *raw) out.push_back({q.get<0>(), q.get<1>(), q.get<2>(), q.get<3>(), q.get<4>(), q.get<5>()});
  return out;
}

std::optional<std::vector<HoldInfo>> as_holds(const sdbus::Variant& v) {
  auto raw = exact<std::vector<HistoryTuple>>(v);
  if (!raw) return std::nullopt;
  std::vector<HoldInfo> out;
  for (const auto& h : *raw) out.push_back({h.get<0>(), h.get<1>(), h.get<2>(), h.get<3>()});
  return out;
}

template <class T, class F>
std::optional<T> as_dict(const sdbus::Variant& v, F from) {
  auto raw = exact<VariantMap>(v);
  if (!raw) return std::nullopt;
  return from(*raw);
}

std::optional<std::vector<ReplicaInfo>> as_replicas(const sdbus::Variant& v) {
  auto raw = exact<std::vector<VariantMap>>(v);
  if (!raw) return std::nullopt;
  std::vector<ReplicaInfo> out;
  for (const auto& m : *raw) {
    ReplicaInfo r;
    Reader rd(m, r.unparsed);
    rd.s("device", r.device);
    rd.s("state", r.state);
    rd.s("reason", r.reason);
    rd.s("mode", r.mode);
    rd.u("layers", r.layers);
    rd.t("accel_bytes", r.accel_bytes);
    rd.t("host_bytes", r.host_bytes);
    rd.s("fingerprint", r.fingerprint);
    rd.s("error", r.error);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Replies

ResidencyReply residency_from_dbus(const VariantMap& m) {
  ResidencyReply out;
  Reader r(m, out.unparsed);
  r.s("model", out.model);
  r.s("device", out.device);
  r.s("state", out.state);
  r.s("reason", out.reason);
  r.t("accel_bytes", out.accel_bytes);
  return out;
}

Placement placement_from_dbus(const VariantMap& m) {
  Placement p;
  Reader r(m, p.unparsed);
  r.t("job_id", p.job_id);
  r.s("state", p.state);
  r.s("action", p.action);
  r.s("reason", p.reason);
  r.s("detail", p.detail);
  r.s("route", p.route);
  r.s("queue", p.queue);
  r.u("queue_position", p.queue_position);
  r.t("eta_ms", p.eta_ms);
  r.b("eta_known", p.eta_known);
  r.s("model", p.model);
  r.b("fallback_model", p.fallback_model);
  r.s("fingerprint", p.fingerprint);
  r.u("max_new_tokens", p.max_new_tokens);
  r.u("prefill_chunk", p.prefill_chunk);
  r.u("gpu_layers", p.gpu_layers);
  r.b("degraded", p.degraded);
  r.d("expected_slowdown", p.expected_slowdown);
  r.u("prompt_tokens", p.prompt_tokens);
  r.b("existing", p.existing);
  return p;
}

PlanDecision plan_from_dbus(const VariantMap& m) {
  PlanDecision d;
  Reader r(m, d.unparsed);
  r.s("action", d.action);
  r.s("reason", d.reason);
  r.s("detail", d.detail);
  r.s("route", d.route);
  r.s("model", d.model);
  r.b("fallback_model", d.fallback_model);
  r.u("max_new_tokens", d.max_new_tokens);
  r.u("prefill_chunk", d.prefill_chunk);
  r.u("gpu_layers", d.gpu_layers);
  r.t("eta_ms", d.eta_ms);
  r.b("eta_known", d.eta_known);
  r.t("retry_after_ms", d.retry_after_ms);
  r.b("permanent", d.permanent);
  r.s("pressure", d.pressure);
  r.u("prompt_tokens", d.prompt_tokens);
  r.read("skipped", d.skipped, as_skipped, "a(ss)");
  r.st("breakdown", d.breakdown);
  r.sx("headroom", d.headroom);
  return d;
}

JobInfo job_from_dbus(const VariantMap& m) {
  JobInfo j;
  Reader r(m, j.unparsed);
  r.t("id", j.id);
  r.s("action", j.action);
  r.s("detail", j.detail);
  r.s("fingerprint", j.fingerprint);
  r.b("fallback_model", j.fallback_model);
  r.d("expected_slowdown", j.expected_slowdown);
  r.u("gpu_layers", j.gpu_layers);
  r.u("max_new_tokens", j.max_new_tokens);
  r.u("prefill_chunk", j.prefill_chunk);
  r.u("prompt_tokens", j.prompt_tokens);
  r.s("state", j.state);
  r.s("model", j.model);
  r.s("route", j.route);
  r.s("reason", j.reason);
  r.u("attempts", j.attempts);
  r.x("accepted_unix_ms", j.accepted_unix_ms);
  r.x("finished_unix_ms", j.finished_unix_ms);
  r.ai("tokens", j.tokens);
  r.s("text", j.text);
  r.s("kind", j.kind);
  r.s("segments_json", j.segments_json);
  r.u("windows_done", j.windows_done);
  r.u("windows_total", j.windows_total);
  r.u("windows_on_cpu", j.windows_on_cpu);
  r.t("audio_ms", j.audio_ms);
  r.t("audio_done_ms", j.audio_done_ms);
  r.s("language", j.language);
  r.d("realtime_factor", j.realtime_factor);
  r.u("segments", j.segments);
  r.u("windows_skipped", j.windows_skipped);
  r.u("fallbacks", j.fallbacks);
  r.s("audio_format", j.audio_format);
  r.t("queued_ms", j.queued_ms);
  r.t("run_ms", j.run_ms);
  r.b("stream", j.stream);
  r.t("stream_bytes", j.stream_bytes);
  r.b("stream_complete", j.stream_complete);
  r.u("inputs", j.inputs);
  r.u("texts", j.texts);
  r.u("images", j.images);
  r.u("dim", j.dim);
  r.u("truncated", j.truncated);
  r.t("text_tokens", j.text_tokens);
  r.s("finish_reason", j.finish_reason);
  r.s("queue", j.queue);
  r.u("queue_position", j.queue_position);
  r.t("eta_ms", j.eta_ms);
  r.b("eta_known", j.eta_known);
  r.read("history", j.history, as_history, "a(sssx)");
  r.as("routes", j.routes);
  r.s("error_code", j.error_code);
  r.s("error_message", j.error_message);
  r.t("retry_after_ms", j.retry_after_ms);
  {  // a failed job's checkpoint: flat keys (checkpoint_seed, checkpoint_tokens, checkpoint_model)
    Checkpoint c;
    r.t("checkpoint_seed", c.seed);
    r.u("checkpoint_tokens", c.tokens_delivered);
    r.s("checkpoint_model", c.model);
    if (c.seed || c.tokens_delivered || c.model) j.checkpoint = c;
  }
  r.s("idempotency_key", j.idempotency_key);
  r.b("side_effects", j.side_effects);
  r.b("degraded", j.degraded);
  return j;
}

ModelInfo model_from_dbus(const VariantMap& m) {
  ModelInfo i;
  Reader r(m, i.unparsed);
  r.s("name", i.name);
  r.s("path", i.path);
  r.b("default", i.is_default);
  r.s("fingerprint", i.fingerprint);
  r.s("revision", i.revision);
  r.s("placement", i.placement);
  r.s("fallback", i.fallback);
  r.u("max_context", i.max_context);
  r.s("kind", i.kind);
  r.u("dim", i.dim);
  r.u("image_size", i.image_size);
  r.as("modalities", i.modalities);
  r.s("template", i.template_name);
  r.s("dtype", i.dtype);
  r.t("weight_bytes", i.weight_bytes);
  r.st("placement_bytes", i.placement_bytes);
  r.as("languages", i.languages);
  r.t("window_ms", i.window_ms);
  r.b("translate", i.translate);
  return i;
}

EmbedInfo embed_info_from_dbus(const VariantMap& m) {
  EmbedInfo e;
  Reader r(m, e.unparsed);
  r.t("job_id", e.job_id);
  r.s("model", e.model);
  r.s("route", e.route);
  r.u("dim", e.dim);
  r.u("inputs", e.inputs);
  r.u("texts", e.texts);
  r.u("images", e.images);
  r.u("truncated", e.truncated);
  r.t("text_tokens", e.text_tokens);
  r.u("attempts", e.attempts);
  r.b("degraded", e.degraded);
  r.s("fingerprint", e.fingerprint);
  r.t("queued_ms", e.queued_ms);
  r.t("run_ms", e.run_ms);
  r.b("existing", e.existing);
  return e;
}

JobUpdate job_update_from_dbus(std::uint64_t job_id, const std::string& kind, const VariantMap& data) {
  JobUpdate u;
  u.job_id = job_id;
  u.kind = kind;
  Reader r(data, u.unparsed);
  r.s("route", u.route);
  r.s("reason", u.reason);
  r.s("model", u.model);
  r.b("fallback_model", u.fallback_model);
  r.b("degraded", u.degraded);
  r.s("queue", u.queue);
  r.u("queue_position", u.queue_position);
  r.t("eta_ms", u.eta_ms);
  r.b("eta_known", u.eta_known);
  r.t("previous_eta_ms", u.previous_eta_ms);
  r.u("attempt", u.attempt);
  r.s("text", u.text);
  r.ai("tokens", u.tokens);
  r.u("step", u.step);
  r.s("from", u.from);
  r.s("to", u.to);
  r.u("tokens_delivered", u.tokens_delivered);
  r.s("state", u.state);
  r.s("finish_reason", u.finish_reason);
  r.s("error_code", u.error_code);
  r.s("error_message", u.error_message);
  r.t("retry_after_ms", u.retry_after_ms);
  r.u("tokens_total", u.tokens_total);
  r.d("seconds", u.seconds);
  r.u("windows_total", u.windows_total);
  r.u("windows_done", u.windows_done);
  r.u("window", u.window);
  r.u("index", u.index);
  r.u("segments", u.segments);
  r.t("start_ms", u.start_ms);
  r.t("end_ms", u.end_ms);
  r.t("audio_done_ms", u.audio_done_ms);
  r.t("audio_ms", u.audio_ms);
  r.s("language", u.language);
  r.s("format", u.format);
  r.d("temperature", u.temperature);
  r.d("avg_logprob", u.avg_logprob);
  r.d("no_speech_prob", u.no_speech_prob);
  r.d("realtime_factor", u.realtime_factor);
  r.b("stream", u.stream);
  return u;
}

DegradedChange degraded_from_dbus(bool degraded, const std::string& reason, const VariantMap& details) {
  DegradedChange d;
  d.degraded = degraded;
  d.reason = reason;
  Reader r(details, d.unparsed);
  r.s("level", d.level);
  r.s("fallback_model", d.fallback_model);
  r.su("limits", d.limits);
  r.d("expected_slowdown", d.expected_slowdown);
  r.x("since_unix_ms", d.since_unix_ms);
  return d;
}

PolicySettings policy_from_dbus(const VariantMap& m) {
  PolicySettings p;
  Reader r(m, p.unparsed);
  r.t("margin_bytes", p.margin_bytes);
  r.d("margin_fraction", p.margin_fraction);
  r.as("ladder_order", p.ladder_order);
  r.t("max_delay_ms", p.max_delay_ms);
  r.b("offload_enabled", p.offload_enabled);
  r.b("allow_migration", p.allow_migration);
  r.u("gpu_concurrency", p.gpu_concurrency);
  r.u("cpu_concurrency", p.cpu_concurrency);
  r.t("host_budget_bytes", p.host_budget_bytes);
  r.t("breaker_cooldown_ms", p.breaker_cooldown_ms);
  return p;
}

MemoryInfo memory_from_dbus(const VariantMap& m) {
  MemoryInfo i;
  Reader r(m, i.unparsed);
  r.s("device", i.device);
  r.b("present", i.present);
  r.t("total", i.total);
  r.t("free", i.free);
  r.t("observed_used", i.observed_used);
  r.t("predicted_used", i.predicted_used);
  r.t("margin", i.margin);
  r.t("foreign", i.foreign);
  r.t("unmaterialized", i.unmaterialized);
  r.x("headroom", i.headroom);
  r.x("prediction_error", i.prediction_error);
  r.t("reading_age_ms", i.reading_age_ms);
  r.s("trust", i.trust);
  r.s("pressure", i.pressure);
  return i;
}

HostMemoryInfo host_memory_from_dbus(const VariantMap& m) {
  HostMemoryInfo h;
  Reader r(m, h.unparsed);
  r.t("budget", h.budget);
  r.s("bound", h.bound);
  r.t("configured_budget", h.configured_budget);
  r.t("cgroup_max", h.cgroup_max);
  r.t("mem_available", h.mem_available);
  r.t("used", h.used);
  r.t("daemon_rss", h.daemon_rss);
  return h;
}

ServiceStatus status_from_dbus(const VariantMap& properties) {
  ServiceStatus s;
  Reader r(properties, s.unparsed);
  r.s("State", s.state);
  r.s("DegradedReason", s.degraded_reason);
  r.s("GpuBreaker", s.gpu_breaker);
  r.read(
      "Policy", s.policy, [](const sdbus::Variant& v) { return as_dict<PolicySettings>(v, policy_from_dbus); },
      "a{sv}");
  r.read(
      "Memory", s.memory, [](const sdbus::Variant& v) { return as_dict<MemoryInfo>(v, memory_from_dbus); }, "a{sv}");
  r.read(
      "HostMemory", s.host_memory,
      [](const sdbus::Variant& v) { return as_dict<HostMemoryInfo>(v, host_memory_from_dbus); }, "a{sv}");
  r.read("Queues", s.queues, as_queues, "a(suuuut)");
  r.su("Limits", s.limits);
  r.read("Holds", s.holds, as_holds, "a(sssx)");
  r.s("FallbackModel", s.fallback_model);
  r.s("Version", s.version);
  r.st("Rings", s.rings);
  return s;
}

ModelDetails model_details_from_dbus(const VariantMap& properties) {
  ModelDetails d;
  Reader r(properties, d.unparsed);
  r.s("Name", d.name);
  r.s("Revision", d.revision);
  r.s("Fingerprint", d.fingerprint);
  r.read("Replicas", d.replicas, as_replicas, "aa{sv}");
  r.st("Placement", d.placement);
  r.s("Fallback", d.fallback);
  r.u("MaxContext", d.max_context);
  r.s("Template", d.template_name);
  r.s("Kind", d.kind);
  return d;
}

std::string model_object_path(std::string_view name) {
  static const char hex[] = "0123456789abcdef";
  std::string p = std::string(kObjectPath) + "/models/";
  if (name.empty()) return p + "_";
  for (unsigned char c : name) {
    if (std::isalnum(c)) {
      p += static_cast<char>(c);
    } else {
      p += '_';
      p += hex[c >> 4];
      p += hex[c & 15];
    }
  }
  return p;
}

}  // namespace tandem::client
