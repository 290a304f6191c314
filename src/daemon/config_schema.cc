// tandemd's configuration keys: one table per root type (daemon_schema(), model_schema()) with every key's type,
// range and field, and the text rules and enum spellings they use (config_schema.h).
#include "daemon/config_schema.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace tandem::daemon::config_detail {

namespace {

Spec boolean() { return Spec{}; }
Spec integer(std::int64_t lo, std::int64_t hi, bool zero_ok = false) {
  Spec s;
  s.kind = Kind::integer;
  s.ilo = lo;
  s.ihi = hi;
  s.zero_ok = zero_ok;
  return s;
}
Spec u32() { return integer(0, kU32Max); }                     // policy counts: the range is the policy's
Spec policy_ms() { return integer(0, kYearMillis); }           // policy durations: at most 365 d
Spec policy_s() { return integer(0, kYearSeconds); }
Spec size(std::uint64_t lo, std::uint64_t hi) {
  Spec s;
  s.kind = Kind::size;
  s.ulo = lo;
  s.uhi = hi;
  return s;
}
Spec real(double lo, double hi, bool lo_open = false, bool hi_open = false) {
  Spec s;
  s.kind = Kind::real;
  s.dlo = lo;
  s.dhi = hi;
  s.lo_open = lo_open;
  s.hi_open = hi_open;
  return s;
}
Spec policy_real() {
  Spec s = real(0, 0);
  s.checked = false;
  return s;
}
Spec text(TextRule rule = nullptr, bool path = false) {
  Spec s;
  s.kind = Kind::text;
  s.rule = rule;
  s.path = path;
  return s;
}
Spec choice(std::initializer_list<std::string_view> choices) {
  Spec s;
  s.kind = Kind::choice;
  s.choices = choices;
  return s;
}
Spec text_list(std::size_t max_items, TextRule item_rule) {
  Spec s;
  s.kind = Kind::text_list;
  s.max_items = max_items;
  s.rule = item_rule;
  return s;
}
Spec rung_list() {
  Spec s;
  s.kind = Kind::rung_list;
  for (auto r : policy::kRungs) {
    s.choices.push_back(policy::rung_name(r));
  }
  return s;
}

}  // namespace

// Field accessors. `c` is the root, `v` the converted value (its alternative is fixed by the spec's kind).
#define TANDEM_FIELD(R, KEY, SPEC, GET, SET) \
  Field<R> { KEY, SPEC, [](const R& c) -> Value { return GET; }, [](R& c, Value&& v) { SET; } }
#define TANDEM_BOOL(R, KEY, MEMBER) TANDEM_FIELD(R, KEY, boolean(), c.MEMBER, c.MEMBER = std::get<bool>(v))
#define TANDEM_INT(R, KEY, MEMBER, SPEC)                                     \
  TANDEM_FIELD(R, KEY, SPEC, static_cast<std::int64_t>(c.MEMBER),            \
               c.MEMBER = static_cast<decltype(c.MEMBER)>(std::get<std::int64_t>(v)))
#define TANDEM_SIZE(R, KEY, MEMBER, SPEC) \
  TANDEM_FIELD(R, KEY, SPEC, static_cast<std::uint64_t>(c.MEMBER), c.MEMBER = std::get<std::uint64_t>(v))
#define TANDEM_REAL(R, KEY, MEMBER, SPEC) TANDEM_FIELD(R, KEY, SPEC, c.MEMBER, c.MEMBER = std::get<double>(v))
#define TANDEM_TEXT(R, KEY, MEMBER, SPEC) \
  TANDEM_FIELD(R, KEY, SPEC, std::string(c.MEMBER), c.MEMBER = std::move(std::get<std::string>(v)))
// Durations: an integer count of the key's unit (`_ms`, `_s`) ↔ the field's chrono type.
#define TANDEM_DURATION(R, KEY, MEMBER, SPEC, UNIT)                                                \
  TANDEM_FIELD(R, KEY, SPEC, static_cast<std::int64_t>(std::chrono::duration_cast<UNIT>(c.MEMBER).count()), \
               c.MEMBER = std::chrono::duration_cast<decltype(c.MEMBER)>(UNIT(std::get<std::int64_t>(v))))
#define TANDEM_MS(R, KEY, MEMBER, SPEC) TANDEM_DURATION(R, KEY, MEMBER, SPEC, std::chrono::milliseconds)
#define TANDEM_SEC(R, KEY, MEMBER, SPEC) TANDEM_DURATION(R, KEY, MEMBER, SPEC, std::chrono::seconds)

// ---- text rules -------------------------------------------------------------------------------------------------

bool is_name_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
}

std::string model_name_rule(std::string_view s) {
  if (!s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), is_name_char)) return {};
  return "1-64 characters of [A-Za-z0-9_.-]";
}

namespace {

std::string path_rule(std::string_view s) {
  if (!s.empty() && s.find('\0') == std::string_view::npos) return {};
  return "a non-empty path";
}

std::string revision_rule(std::string_view s) { return s.size() <= 128 ? std::string() : "at most 128 bytes"; }

std::string stop_rule(std::string_view s) { return !s.empty() && s.size() <= 256 ? std::string() : "1-256 bytes"; }

std::string group_rule(std::string_view s) {
  if (!s.empty() && s.size() <= 32 && s[0] != '-' && std::all_of(s.begin(), s.end(), is_name_char)) return {};
  return "a group name (1-32 characters of [A-Za-z0-9_.-], not starting with '-')";
}

// "" (kind = system/session) or "transport:key=value,...".
std::string bus_address_rule(std::string_view s) {
  if (s.empty()) return {};
  const auto colon = s.find(':');
  bool ok = colon != std::string_view::npos && colon > 0 &&
            std::all_of(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(colon),
                        [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }) &&
            s.find_first_of(" \t\n\r") == std::string_view::npos;
  return ok ? std::string() : "a D-Bus address like \"unix:path=/run/tandem/bus\"";
}

// D-Bus well-known name: >= 2 dot-separated elements of [A-Za-z0-9_-], none empty or starting with a digit,
// at most 255 bytes.
std::string bus_name_rule(std::string_view s) {
  const std::string rule = "a well-known D-Bus name like \"io.tandem.Tandem1\"";
  if (s.empty() || s.size() > 255) return rule;
  std::size_t elements = 0;
  std::size_t start = 0;
  while (true) {
    const auto dot = s.find('.', start);
    const auto el = s.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (el.empty() || (el[0] >= '0' && el[0] <= '9')) return rule;
    for (const char c : el) {
      if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) {
        return rule;
      }
    }
    ++elements;
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return elements >= 2 ? std::string() : rule;
}

// ---- enums ------------------------------------------------------------------------------------------------------

BusKind bus_kind_from(std::string_view s) {
  return s == "session" ? BusKind::session : s == "address" ? BusKind::address : BusKind::system;
}

AccelKind accel_kind_from(std::string_view s) {
  return s == "none" ? AccelKind::none
         : s == "simulated" ? AccelKind::simulated
         : s == "cuda" ? AccelKind::cuda
                       : AccelKind::auto_detect;
}

std::string replica_mode_text(const std::optional<policy::ReplicaMode>& m) {
  if (!m) return "auto";
  switch (*m) {
    case policy::ReplicaMode::on_demand: return "on_demand";
    case policy::ReplicaMode::mmap: return "mmap";
    case policy::ReplicaMode::warm: return "warm";
  }
  return "auto";
}

std::optional<policy::ReplicaMode> replica_mode_from(std::string_view s) {
  if (s == "warm") return policy::ReplicaMode::warm;
  if (s == "mmap") return policy::ReplicaMode::mmap;
  if (s == "on_demand") return policy::ReplicaMode::on_demand;
  return std::nullopt;
}

std::vector<std::string> rung_names(const std::vector<policy::Rung>& order) {
  std::vector<std::string> out;
  for (const auto r : order) out.emplace_back(policy::rung_name(r));
  return out;
}

std::vector<policy::Rung> rungs_from(const std::vector<std::string>& names) {
  std::vector<policy::Rung> out;
  for (const auto& n : names) {
    for (auto r : policy::kRungs) {
      if (policy::rung_name(r) == n) out.push_back(r);
    }
  }
  return out;
}

}  // namespace

// ---- the tables -------------------------------------------------------------------------------------------------

using D = DaemonConfig;
using M = ModelConfig;

// Sections in the order render_config() writes them; "model" marks where the [[model]] tables go.
const std::vector<Section<D>>& daemon_schema() {
  static const std::vector<Section<D>> schema = {
      {"", {TANDEM_TEXT(D, "default_model", default_model, text())}},
      {"bus",
       {
           TANDEM_FIELD(D, "kind", choice({"system", "session", "address"}), std::string(bus_kind_name(c.bus.kind)),
                        c.bus.kind = bus_kind_from(std::get<std::string>(v))),
           TANDEM_TEXT(D, "address", bus.address, text(bus_address_rule)),
           TANDEM_TEXT(D, "name", bus.name, text(bus_name_rule)),
       }},
      {"auth",
       {
           TANDEM_TEXT(D, "submit_group", auth.submit_group, text(group_rule)),
           TANDEM_BOOL(D, "allow_any_local_user", auth.allow_any_local_user),
           TANDEM_TEXT(D, "admin_group", auth.admin_group, text(group_rule)),
       }},
      {"device",
       {
           TANDEM_FIELD(D, "kind", choice({"auto", "none", "simulated", "cuda"}),
                        std::string(accel_kind_name(c.device.kind)),
                        c.device.kind = accel_kind_from(std::get<std::string>(v))),
           TANDEM_INT(D, "cuda_index", device.cuda_index, integer(0, 63)),
           TANDEM_SIZE(D, "sim_capacity", device.sim_capacity_bytes, size(64 * kMiB, kPiB)),
           TANDEM_MS(D, "sim_reading_lag_ms", device.sim_reading_lag, integer(0, 60'000)),
           TANDEM_MS(D, "poll_interval_ms", device.poll_interval, integer(10, 60'000)),
           TANDEM_MS(D, "idle_poll_interval_ms", device.idle_poll_interval, integer(10, 60'000)),
           TANDEM_MS(D, "probe_interval_ms", device.probe_interval, integer(100, 3'600'000)),
           TANDEM_MS(D, "probe_timeout_ms", device.probe_timeout, integer(10, 60'000)),
           TANDEM_BOOL(D, "evict_on_hold", device.evict_on_hold),
           TANDEM_MS(D, "drain_ms", device.drain, integer(0, 3'600'000)),
           TANDEM_INT(D, "max_pressure_evictions_per_minute", device.max_pressure_evictions_per_minute,
                      integer(0, 600)),
           TANDEM_MS(D, "recover_after_ms", device.recover_after, integer(0, 3'600'000)),
       }},
      {"model", {}},
      {"margin",
       {
           TANDEM_SIZE(D, "bytes", policy.headroom.margin.bytes, size(0, kU64Max)),
           TANDEM_REAL(D, "fraction", policy.headroom.margin.fraction, policy_real()),
       }},
      {"estimator",
       {
           TANDEM_INT(D, "kv_block_tokens", policy.estimator.kv_block_tokens, u32()),
           TANDEM_REAL(D, "fragmentation_fraction", policy.estimator.fragmentation_fraction, policy_real()),
       }},
      {"headroom",
       {
           TANDEM_MS(D, "fresh_for_ms", policy.headroom.fresh_for, policy_ms()),
           TANDEM_MS(D, "max_age_ms", policy.headroom.max_age, policy_ms()),
           TANDEM_REAL(D, "stale_discount_fraction", policy.headroom.stale_discount_fraction, policy_real()),
       }},
      {"ladder",
       {
           TANDEM_FIELD(D, "order", rung_list(), rung_names(c.policy.ladder.order),
                        c.policy.ladder.order = rungs_from(std::get<std::vector<std::string>>(v))),
           TANDEM_MS(D, "max_delay_ms", policy.ladder.max_delay, policy_ms()),
           TANDEM_INT(D, "min_reduced_new_tokens", policy.ladder.min_reduced_new_tokens, u32()),
           TANDEM_INT(D, "min_prefill_chunk", policy.ladder.min_prefill_chunk, u32()),
           TANDEM_BOOL(D, "offload_enabled", policy.ladder.offload_enabled),
           TANDEM_INT(D, "min_gpu_layers", policy.ladder.min_gpu_layers, u32()),
           TANDEM_MS(D, "default_retry_after_ms", policy.ladder.default_retry_after, policy_ms()),
           TANDEM_MS(D, "max_retry_after_ms", policy.ladder.max_retry_after, policy_ms()),
       }},
      {"ladder.pressure",
       {
           TANDEM_REAL(D, "elevated_enter_fraction", policy.ladder.pressure.elevated_enter_fraction, policy_real()),
           TANDEM_REAL(D, "elevated_exit_fraction", policy.ladder.pressure.elevated_exit_fraction, policy_real()),
           TANDEM_REAL(D, "critical_enter_fraction", policy.ladder.pressure.critical_enter_fraction, policy_real()),
           TANDEM_REAL(D, "critical_exit_fraction", policy.ladder.pressure.critical_exit_fraction, policy_real()),
       }},
      {"breaker",
       {
           TANDEM_MS(D, "window_ms", policy.breaker.window, policy_ms()),
           TANDEM_INT(D, "alloc_failure_threshold", policy.breaker.alloc_failure_threshold, u32()),
           TANDEM_INT(D, "probe_failure_threshold", policy.breaker.probe_failure_threshold, u32()),
           TANDEM_MS(D, "cooldown_ms", policy.breaker.cooldown, policy_ms()),
           TANDEM_REAL(D, "backoff_factor", policy.breaker.backoff_factor, policy_real()),
           TANDEM_MS(D, "max_cooldown_ms", policy.breaker.max_cooldown, policy_ms()),
       }},
      {"gpu_queue",
       {
           TANDEM_INT(D, "capacity", policy.gpu_queue.capacity, u32()),
           TANDEM_INT(D, "concurrency", policy.gpu_queue.concurrency, u32()),
           TANDEM_INT(D, "max_context", policy.gpu_queue.max_context, u32()),
           TANDEM_INT(D, "max_new_tokens", policy.gpu_queue.max_new_tokens, u32()),
           TANDEM_INT(D, "step_tokens", policy.gpu_queue.step_tokens, u32()),
       }},
      {"cpu_queue",
       {
           TANDEM_INT(D, "capacity", policy.cpu_queue.capacity, u32()),
           TANDEM_INT(D, "concurrency", policy.cpu_queue.concurrency, u32()),
           TANDEM_INT(D, "max_context", policy.cpu_queue.max_context, u32()),
           TANDEM_INT(D, "max_new_tokens", policy.cpu_queue.max_new_tokens, u32()),
           TANDEM_INT(D, "step_tokens", policy.cpu_queue.step_tokens, u32()),
       }},
      {"gpu_rates",
       {
           TANDEM_REAL(D, "ewma_alpha", policy.gpu_rates.ewma_alpha, policy_real()),
           TANDEM_REAL(D, "prior_prefill_tps", policy.gpu_rates.prior_prefill_tps, policy_real()),
           TANDEM_REAL(D, "prior_decode_tps", policy.gpu_rates.prior_decode_tps, policy_real()),
           TANDEM_REAL(D, "occupancy_seconds", policy.gpu_rates.occupancy_seconds, policy_real()),
       }},
      {"cpu_rates",
       {
           TANDEM_REAL(D, "ewma_alpha", policy.cpu_rates.ewma_alpha, policy_real()),
           TANDEM_REAL(D, "prior_prefill_tps", policy.cpu_rates.prior_prefill_tps, policy_real()),
           TANDEM_REAL(D, "prior_decode_tps", policy.cpu_rates.prior_decode_tps, policy_real()),
           TANDEM_REAL(D, "occupancy_seconds", policy.cpu_rates.occupancy_seconds, policy_real()),
       }},
      {"host",
       {
           TANDEM_SIZE(D, "budget", policy.host_guard.budget_bytes, size(0, kU64Max)),
           TANDEM_SIZE(D, "mem_available_reserve", policy.host_guard.mem_available_reserve, size(0, kU64Max)),
       }},
      {"service", {TANDEM_MS(D, "recover_after_ms", policy.service.recover_after, policy_ms())}},
      {"replica",
       {
           TANDEM_MS(D, "recovery_budget_ms", policy.replica.recovery_budget, policy_ms()),
           TANDEM_REAL(D, "switch_margin", policy.replica.switch_margin, policy_real()),
       }},
      {"failover", {TANDEM_BOOL(D, "allow_migration", policy.failover.allow_migration)}},
      {"idempotency",
       {
           TANDEM_SEC(D, "retention_s", policy.idempotency.retention, policy_s()),
           TANDEM_INT(D, "max_keys", policy.idempotency.max_keys, u32()),
       }},
      {"journal",
       {
           TANDEM_TEXT(D, "dir", journal.dir, text(path_rule, true)),
           TANDEM_SIZE(D, "max_bytes", journal.max_bytes, size(1 * kMiB, 64 * kGiB)),
           TANDEM_SEC(D, "retention_s", journal.retention, integer(0, kYearSeconds)),
           TANDEM_INT(D, "max_jobs", journal.max_jobs, integer(1, 10'000'000)),
           TANDEM_BOOL(D, "fsync", journal.fsync),
       }},
      {"runtime",
       {
           TANDEM_MS(D, "drain_timeout_ms", runtime.drain_timeout, integer(0, 3'600'000)),
           TANDEM_MS(D, "status_interval_ms", runtime.status_interval, integer(100, 3'600'000)),
           TANDEM_INT(D, "max_prompt_bytes", runtime.max_prompt_bytes, integer(1, 64 << 20)),
           TANDEM_INT(D, "max_messages", runtime.max_messages, integer(1, 65536)),
           TANDEM_INT(D, "max_jobs_per_client", runtime.max_jobs_per_client, integer(1, 1'000'000)),
           TANDEM_MS(D, "token_flush_interval_ms", runtime.token_flush_interval, integer(0, 10'000)),
       }},
      {"embedding",
       {
           TANDEM_TEXT(D, "default_model", embedding.default_model, text()),
           TANDEM_INT(D, "max_inputs", embedding.max_inputs, integer(1, 1024)),
           TANDEM_SIZE(D, "max_image_bytes", embedding.max_image_bytes, size(1 * kKiB, 1 * kGiB)),
           TANDEM_INT(D, "max_image_pixels", embedding.max_image_pixels, integer(1, 1'000'000'000)),
           TANDEM_INT(D, "max_text_bytes", embedding.max_text_bytes, integer(1, 16 << 20)),
       }},
      {"speech",
       {
           TANDEM_TEXT(D, "default_model", speech.default_model, text()),
           TANDEM_SIZE(D, "max_audio_bytes", speech.max_audio_bytes, size(1 * kKiB, 4 * kGiB)),
           TANDEM_INT(D, "max_audio_seconds", speech.max_audio_seconds, integer(1, 86400)),
           TANDEM_INT(D, "stream_idle_seconds", speech.stream_idle_seconds, integer(1, 3600)),
           TANDEM_INT(D, "max_stream_ahead_seconds", speech.max_stream_ahead_seconds, integer(5, 14400)),
       }},
      {"rings",
       {
           TANDEM_BOOL(D, "enabled", rings.enabled),
           TANDEM_INT(D, "max_sessions", rings.max_sessions, integer(0, 4096)),
           TANDEM_INT(D, "max_sessions_per_user", rings.max_sessions_per_user, integer(0, 4096)),
           TANDEM_INT(D, "default_sq_entries", rings.default_sq_entries, integer(8, 65536)),
           TANDEM_INT(D, "default_cq_entries", rings.default_cq_entries, integer(8, 262144)),
           TANDEM_INT(D, "max_sq_entries", rings.max_sq_entries, integer(8, 65536)),
           TANDEM_INT(D, "max_cq_entries", rings.max_cq_entries, integer(8, 262144)),
           TANDEM_SIZE(D, "default_data_bytes", rings.default_data_bytes, size(4 * kKiB, 1 * kGiB)),
           TANDEM_SIZE(D, "max_data_bytes", rings.max_data_bytes, size(4 * kKiB, 1 * kGiB)),
           TANDEM_SIZE(D, "max_backlog_bytes", rings.max_backlog_bytes, size(64 * kKiB, 1 * kGiB)),
           TANDEM_INT(D, "max_entries_per_pass", rings.max_entries_per_pass, integer(1, 65536)),
           TANDEM_DURATION(D, "max_spin_us", rings.max_spin, integer(0, 10'000), std::chrono::microseconds),
       }},
  };
  return schema;
}

// One [[model]] table; "sampling" is [model.sampling] inside it.
const std::vector<Section<M>>& model_schema() {
  static const std::vector<Section<M>> schema = {
      {"",
       {
           TANDEM_TEXT(M, "name", name, text(model_name_rule)),
           TANDEM_TEXT(M, "dir", dir, text(path_rule, true)),
           TANDEM_TEXT(M, "revision", revision, text(revision_rule)),
           TANDEM_TEXT(M, "dtype", dtype, choice({"auto", "f32", "bf16", "f16"})),
           TANDEM_TEXT(M, "kv_cache", kv_cache, choice({"f16", "f32"})),
           TANDEM_TEXT(M, "template", template_name, choice({"", "raw", "llama2", "chatml", "zephyr"})),
           TANDEM_FIELD(M, "replica_mode", choice({"auto", "warm", "mmap", "on_demand"}),
                        replica_mode_text(c.replica_mode),
                        c.replica_mode = replica_mode_from(std::get<std::string>(v))),
           TANDEM_BOOL(M, "gpu", gpu),
           TANDEM_INT(M, "gpu_layers", gpu_layers, integer(-1, 65536)),
           TANDEM_TEXT(M, "fallback", fallback, text()),
           TANDEM_INT(M, "cpu_threads", cpu_threads, integer(1, 256)),
           TANDEM_INT(M, "keep_alive_s", keep_alive_s, integer(-1, 2'592'000)),
           TANDEM_INT(M, "priority", priority, integer(-100, 100)),
           TANDEM_INT(M, "gpu_threads", gpu_threads, integer(1, 256)),
           TANDEM_INT(M, "max_context", max_context, integer(16, 1'048'576, /*zero_ok=*/true)),
           TANDEM_INT(M, "max_sequences", max_sequences, integer(0, 4096)),
       }},
      {"sampling",
       {
           TANDEM_REAL(M, "temperature", sampling.temperature, real(0, 100)),
           TANDEM_INT(M, "top_k", sampling.top_k, integer(0, 1'000'000)),
           TANDEM_REAL(M, "top_p", sampling.top_p, real(0, 1, /*lo_open=*/true)),
           TANDEM_REAL(M, "repetition_penalty", sampling.repetition_penalty, real(0, 10, /*lo_open=*/true)),
           TANDEM_INT(M, "max_new_tokens", sampling.max_new_tokens, integer(1, 1'048'576)),
           TANDEM_FIELD(M, "stop", text_list(16, stop_rule), c.sampling.stop,
                        c.sampling.stop = std::move(std::get<std::vector<std::string>>(v))),
       }},
  };
  return schema;
}

#undef TANDEM_FIELD
#undef TANDEM_BOOL
#undef TANDEM_INT
#undef TANDEM_SIZE
#undef TANDEM_REAL
#undef TANDEM_TEXT
#undef TANDEM_MS
#undef TANDEM_SEC
#undef TANDEM_DURATION

}  // namespace tandem::daemon::config_detail
