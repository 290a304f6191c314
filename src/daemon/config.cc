// tandemd's configuration: TOML → DaemonConfig, key-by-key drop-in merging, validation and rendering.
//
// One table per root type (`daemon_schema()`, `model_schema()`) lists every key with its type, its range and the
// field it sets. Parsing, DaemonConfig::validate(), render_config() and docs/config.md all follow that table, so a
// key cannot be parsed but not rendered, or rendered but not validated. Policy keys only get a representability
// range here (an integer that fits, a duration of at most 365 d); their real ranges live in
// policy::PolicyConfig::validate(), whose messages are rewritten to name the TOML key (`kPolicyPaths`).
#include "daemon/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <sstream>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

#include "policy/format.h"

namespace tandem::daemon {

namespace fs = std::filesystem;

namespace {

using policy::kGiB;
using policy::kMiB;
using policy::kPiB;
constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kTiB = 1024 * kGiB;
constexpr std::int64_t kYearSeconds = 365LL * 86400;
constexpr std::int64_t kYearMillis = kYearSeconds * 1000;
constexpr std::int64_t kU32Max = std::numeric_limits<std::uint32_t>::max();
constexpr std::uint64_t kU64Max = std::numeric_limits<std::uint64_t>::max();

// ---- text -------------------------------------------------------------------------------------------------------

// A TOML basic string (also how strings are shown in messages).
std::string quote(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04X", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out += '"';
}

std::string join(std::string_view a, std::string_view b) {
  if (a.empty()) return std::string(b);
  std::string out(a);
  out += '.';
  out += b;
  return out;
}

std::string quoted_list(const std::vector<std::string_view>& items) {
  std::string out;
  for (const auto& s : items) {
    if (!out.empty()) out += ", ";
    out += quote(s);
  }
  return out;
}

// "8GiB" when the value is a whole number of a binary unit, else the bytes.
std::string size_text(std::uint64_t v) {
  static constexpr std::pair<std::uint64_t, const char*> kUnits[] = {
      {kPiB, "PiB"}, {kTiB, "TiB"}, {kGiB, "GiB"}, {kMiB, "MiB"}, {kKiB, "KiB"}};
  for (const auto& [unit, name] : kUnits) {
    if (v >= unit && v % unit == 0) return std::to_string(v / unit) + name;
  }
  return std::to_string(v);
}

// A TOML float that reads back to the same double.
std::string render_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string s = policy::format_double(v);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

// ---- sizes ------------------------------------------------------------------------------------------------------

struct SizeUnit {
  std::string_view name;
  std::uint64_t bytes;
};
constexpr SizeUnit kSizeUnits[] = {
    {"B", 1},
    {"KiB", kKiB},
    {"MiB", kMiB},
    {"GiB", kGiB},
    {"TiB", kTiB},
    {"PiB", kPiB},
    {"KB", 1000ull},
    {"MB", 1000ull * 1000},
    {"GB", 1000ull * 1000 * 1000},
    {"TB", 1000ull * 1000 * 1000 * 1000},
    {"PB", 1000ull * 1000 * 1000 * 1000 * 1000},
};
constexpr std::string_view kSizeUnitNames = "B, KiB, MiB, GiB, TiB, PiB, KB, MB, GB, TB, PB";

// Exact decimal arithmetic: "1.5GiB" is 1610612736, "0.1KiB" is not a whole number of bytes (an error, not a
// rounding).
std::optional<std::uint64_t> parse_size_impl(std::string_view text, std::string& why) {
  const auto is_space = [](char c) { return c == ' ' || c == '\t'; };
  const auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  std::size_t b = 0;
  std::size_t e = text.size();
  while (b < e && is_space(text[b])) ++b;
  while (e > b && is_space(text[e - 1])) --e;
  const std::string_view s = text.substr(b, e - b);
  if (s.empty()) {
    why = "empty";
    return std::nullopt;
  }
  if (s[0] == '-') {
    why = "negative";
    return std::nullopt;
  }
  using u128 = unsigned __int128;
  const u128 max = kU64Max;
  const std::string too_large = "larger than " + std::to_string(kU64Max) + " bytes";
  std::size_t i = 0;
  u128 whole = 0;
  for (; i < s.size() && is_digit(s[i]); ++i) {
    whole = whole * 10 + static_cast<unsigned>(s[i] - '0');
    if (whole > max) {
      why = too_large;
      return std::nullopt;
    }
  }
  if (i == 0) {
    why = "does not start with a number";
    return std::nullopt;
  }
  std::string_view frac;
  if (i < s.size() && s[i] == '.') {
    const std::size_t f = ++i;
    while (i < s.size() && is_digit(s[i])) ++i;
    frac = s.substr(f, i - f);
    if (frac.empty()) {
      why = "no digits after '.'";
      return std::nullopt;
    }
  }
  while (i < s.size() && is_space(s[i])) ++i;
  const std::string_view unit_name = s.substr(i);
  std::uint64_t unit = 1;
  if (!unit_name.empty()) {
    const auto it = std::find_if(std::begin(kSizeUnits), std::end(kSizeUnits),
                                 [&](const SizeUnit& u) { return u.name == unit_name; });
    if (it == std::end(kSizeUnits)) {
      why = "unknown unit " + quote(unit_name) + "; allowed: " + std::string(kSizeUnitNames);
      return std::nullopt;
    }
    unit = it->bytes;
  }
  while (!frac.empty() && frac.back() == '0') frac.remove_suffix(1);
  u128 total = whole * unit;  // < 2^64 · 2^50: no overflow in 128 bits
  if (!frac.empty()) {
    if (frac.size() > 18) {
      why = "more than 18 decimal digits";
      return std::nullopt;
    }
    u128 num = 0;
    u128 den = 1;
    for (const char c : frac) {
      num = num * 10 + static_cast<unsigned>(c - '0');
      den *= 10;
    }
    const u128 part = num * unit;
    if (part % den != 0) {
      why = "not a whole number of bytes";
      return std::nullopt;
    }
    total += part / den;
  }
  if (total > max) {
    why = too_large;
    return std::nullopt;
  }
  return static_cast<std::uint64_t>(total);
}

// ---- the schema -------------------------------------------------------------------------------------------------

// One key's value, in the key's unit: integers and durations as int64, sizes as uint64 bytes.
using Value = std::variant<bool, std::int64_t, std::uint64_t, double, std::string, std::vector<std::string>>;

enum class Kind { boolean, integer, size, real, text, choice, text_list, rung_list };

using TextRule = std::string (*)(std::string_view);  // "" = fine, else the rule the text breaks

struct Spec {
  Kind kind = Kind::boolean;
  std::int64_t ilo = 0, ihi = 0;      // integer: [ilo, ihi]
  std::uint64_t ulo = 0, uhi = 0;     // size: [ulo, uhi]
  bool zero_ok = false;               // integer: 0 is allowed besides the range ("0 = none")
  double dlo = 0, dhi = 0;            // real
  bool lo_open = false, hi_open = false;
  bool checked = true;                // real: false = only policy::PolicyConfig::validate() decides
  TextRule rule = nullptr;            // text, text_list items
  std::vector<std::string_view> choices;  // choice
  bool path = false;                  // text: relative paths resolve against the directory of the file
  std::size_t max_items = 0;          // text_list
};

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
  for (auto r : {policy::Rung::admit, policy::Rung::delay, policy::Rung::reduce, policy::Rung::offload,
                 policy::Rung::route_cpu, policy::Rung::reject}) {
    s.choices.push_back(policy::rung_name(r));
  }
  return s;
}

template <class Root>
struct Field {
  std::string_view key;
  Spec spec;
  Value (*get)(const Root&);
  void (*set)(Root&, Value&&);
};

template <class Root>
struct Section {
  std::string_view path;  // "" = the root table; "ladder.pressure" = [ladder.pressure]
  std::vector<Field<Root>> fields;
};

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
    for (auto r : {policy::Rung::admit, policy::Rung::delay, policy::Rung::reduce, policy::Rung::offload,
                   policy::Rung::route_cpu, policy::Rung::reject}) {
      if (policy::rung_name(r) == n) out.push_back(r);
    }
  }
  return out;
}

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
           TANDEM_MS(D, "probe_interval_ms", device.probe_interval, integer(100, 3'600'000)),
           TANDEM_MS(D, "probe_timeout_ms", device.probe_timeout, integer(10, 60'000)),
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
       }},
      {"cpu_queue",
       {
           TANDEM_INT(D, "capacity", policy.cpu_queue.capacity, u32()),
           TANDEM_INT(D, "concurrency", policy.cpu_queue.concurrency, u32()),
           TANDEM_INT(D, "max_context", policy.cpu_queue.max_context, u32()),
           TANDEM_INT(D, "max_new_tokens", policy.cpu_queue.max_new_tokens, u32()),
       }},
      {"gpu_rates",
       {
           TANDEM_REAL(D, "ewma_alpha", policy.gpu_rates.ewma_alpha, policy_real()),
           TANDEM_REAL(D, "prior_prefill_tps", policy.gpu_rates.prior_prefill_tps, policy_real()),
           TANDEM_REAL(D, "prior_decode_tps", policy.gpu_rates.prior_decode_tps, policy_real()),
       }},
      {"cpu_rates",
       {
           TANDEM_REAL(D, "ewma_alpha", policy.cpu_rates.ewma_alpha, policy_real()),
           TANDEM_REAL(D, "prior_prefill_tps", policy.cpu_rates.prior_prefill_tps, policy_real()),
           TANDEM_REAL(D, "prior_decode_tps", policy.cpu_rates.prior_decode_tps, policy_real()),
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
           TANDEM_TEXT(M, "template", template_name, choice({"", "raw", "llama2", "chatml", "zephyr"})),
           TANDEM_FIELD(M, "replica_mode", choice({"auto", "warm", "mmap", "on_demand"}),
                        replica_mode_text(c.replica_mode),
                        c.replica_mode = replica_mode_from(std::get<std::string>(v))),
           TANDEM_BOOL(M, "gpu", gpu),
           TANDEM_INT(M, "gpu_layers", gpu_layers, integer(-1, 65536)),
           TANDEM_TEXT(M, "fallback", fallback, text()),
           TANDEM_INT(M, "cpu_threads", cpu_threads, integer(1, 256)),
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

template <class Root>
const Section<Root>* find_section(const std::vector<Section<Root>>& schema, std::string_view path) {
  for (const auto& s : schema) {
    if (s.path == path) return &s;
  }
  return nullptr;
}

// The direct children of `path` ("ladder" → "pressure").
template <class Root>
std::vector<std::string_view> child_sections(const std::vector<Section<Root>>& schema, std::string_view path) {
  std::vector<std::string_view> out;
  for (const auto& s : schema) {
    std::string_view p = s.path;
    if (p.empty()) continue;
    if (!path.empty()) {
      if (p.size() <= path.size() + 1 || p.substr(0, path.size()) != path || p[path.size()] != '.') continue;
      p.remove_prefix(path.size() + 1);
    }
    if (p.find('.') == std::string_view::npos) out.push_back(p);
  }
  return out;
}

template <class Root>
std::string allowed_keys(const std::vector<Section<Root>>& schema, std::string_view path) {
  std::string out;
  const auto add = [&](std::string_view k) {
    if (!out.empty()) out += ", ";
    out += k;
  };
  if (const auto* s = find_section(schema, path)) {
    for (const auto& f : s->fields) add(f.key);
  }
  for (const auto c : child_sections(schema, path)) add(c);
  return out;
}

// ---- checking values --------------------------------------------------------------------------------------------

// What is wrong with one value: `where` is appended to the key ("[3]" for a list item), `what` is
// "must be <rule>, got <value>".
struct Bad {
  std::string where;
  std::string what;
};

std::string range_rule(const Spec& s) {
  switch (s.kind) {
    case Kind::integer: {
      std::string r = "in [" + std::to_string(s.ilo) + "," + std::to_string(s.ihi) + "]";
      return s.zero_ok ? "0 or " + r : r;
    }
    case Kind::size:
      return "in [" + size_text(s.ulo) + "," + size_text(s.uhi) + "]";
    case Kind::real:
      if (!s.checked) return {};
      return std::string("in ") + (s.lo_open ? "(" : "[") + policy::format_double(s.dlo) + "," +
             policy::format_double(s.dhi) + (s.hi_open ? ")" : "]");
    case Kind::choice:
    case Kind::rung_list:
      return "one of " + quoted_list(s.choices);
    default:
      return {};
  }
}

std::string with_range(std::string what, const Spec& s) {
  const std::string r = range_rule(s);
  if (!r.empty()) what += " " + r;
  return what;
}

std::string describe(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "string " + quote(n.as_string()->get());
    case toml::node_type::integer: return "integer " + std::to_string(n.as_integer()->get());
    case toml::node_type::floating_point: return "float " + policy::format_double(n.as_floating_point()->get());
    case toml::node_type::boolean: return n.as_boolean()->get() ? "boolean true" : "boolean false";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    default: return "nothing";
  }
}

bool in_choices(const Spec& s, std::string_view v) {
  return std::find(s.choices.begin(), s.choices.end(), v) != s.choices.end();
}

// The range / rule of an already typed value (shared by the loader and DaemonConfig::validate()).
std::optional<Bad> check(const Spec& s, const Value& value) {
  switch (s.kind) {
    case Kind::boolean: return std::nullopt;
    case Kind::integer: {
      const auto v = std::get<std::int64_t>(value);
      if ((s.zero_ok && v == 0) || (v >= s.ilo && v <= s.ihi)) return std::nullopt;
      return Bad{"", "must be " + range_rule(s) + ", got " + std::to_string(v)};
    }
    case Kind::size: {
      const auto v = std::get<std::uint64_t>(value);
      if (v >= s.ulo && v <= s.uhi) return std::nullopt;
      return Bad{"", "must be " + range_rule(s) + ", got " + size_text(v)};
    }
    case Kind::real: {
      const double v = std::get<double>(value);
      if (!s.checked) return std::nullopt;
      const bool ok = !std::isnan(v) && (s.lo_open ? v > s.dlo : v >= s.dlo) && (s.hi_open ? v < s.dhi : v <= s.dhi);
      if (ok) return std::nullopt;
      return Bad{"", "must be " + range_rule(s) + ", got " + policy::format_double(v)};
    }
    case Kind::text: {
      const auto& v = std::get<std::string>(value);
      if (!s.rule) return std::nullopt;
      const std::string rule = s.rule(v);
      if (rule.empty()) return std::nullopt;
      return Bad{"", "must be " + rule + ", got " + quote(v)};
    }
    case Kind::choice: {
      const auto& v = std::get<std::string>(value);
      if (in_choices(s, v)) return std::nullopt;
      return Bad{"", "must be " + range_rule(s) + ", got " + quote(v)};
    }
    case Kind::text_list: {
      const auto& v = std::get<std::vector<std::string>>(value);
      if (v.size() > s.max_items) {
        return Bad{"", "must be at most " + std::to_string(s.max_items) + " strings, got " + std::to_string(v.size())};
      }
      for (std::size_t i = 0; i < v.size(); ++i) {
        const std::string rule = s.rule ? s.rule(v[i]) : std::string();
        if (!rule.empty()) return Bad{"[" + std::to_string(i) + "]", "must be " + rule + ", got " + quote(v[i])};
      }
      return std::nullopt;
    }
    case Kind::rung_list: {
      const auto& v = std::get<std::vector<std::string>>(value);
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (!in_choices(s, v[i])) {
          return Bad{"[" + std::to_string(i) + "]", "must be " + range_rule(s) + ", got " + quote(v[i])};
        }
      }
      return std::nullopt;
    }
  }
  return std::nullopt;
}

// TOML node → Value of the spec's kind; a wrong type names the expected one.
std::optional<Bad> convert(const toml::node& n, const Spec& s, Value& out) {
  switch (s.kind) {
    case Kind::boolean:
      if (const auto* b = n.as_boolean()) {
        out = b->get();
        return std::nullopt;
      }
      return Bad{"", "must be a boolean (true or false), got " + describe(n)};
    case Kind::integer:
      if (const auto* i = n.as_integer()) {
        out = static_cast<std::int64_t>(i->get());
        return std::nullopt;
      }
      return Bad{"", with_range("must be an integer", s) + ", got " + describe(n)};
    case Kind::size: {
      const std::string rule = with_range("must be a size (integer bytes or a string like \"8GiB\")", s);
      if (const auto* i = n.as_integer()) {
        if (i->get() < 0) return Bad{"", rule + ", got " + std::to_string(i->get())};
        out = static_cast<std::uint64_t>(i->get());
        return std::nullopt;
      }
      if (const auto* str = n.as_string()) {
        std::string why;
        if (auto v = parse_size_impl(str->get(), why)) {
          out = *v;
          return std::nullopt;
        }
        return Bad{"", rule + ", got " + quote(str->get()) + " (" + why + ")"};
      }
      return Bad{"", rule + ", got " + describe(n)};
    }
    case Kind::real:
      if (const auto* f = n.as_floating_point()) {
        out = f->get();
        return std::nullopt;
      }
      if (const auto* i = n.as_integer()) {
        out = static_cast<double>(i->get());
        return std::nullopt;
      }
      return Bad{"", with_range("must be a number", s) + ", got " + describe(n)};
    case Kind::text:
    case Kind::choice:
      if (const auto* str = n.as_string()) {
        out = std::string(str->get());
        return std::nullopt;
      }
      return Bad{"", (s.kind == Kind::choice ? "must be " + range_rule(s) : std::string("must be a string")) +
                         ", got " + describe(n)};
    case Kind::text_list:
    case Kind::rung_list: {
      const auto* arr = n.as_array();
      if (!arr) return Bad{"", "must be an array of strings, got " + describe(n)};
      std::vector<std::string> items;
      for (std::size_t i = 0; i < arr->size(); ++i) {
        const auto* str = (*arr)[i].as_string();
        if (!str) return Bad{"[" + std::to_string(i) + "]", "must be a string, got " + describe((*arr)[i])};
        items.emplace_back(str->get());
      }
      out = std::move(items);
      return std::nullopt;
    }
  }
  return Bad{"", "must be a known kind of value, got " + describe(n)};
}

std::string render_value(const Value& v) {
  return std::visit(
      [&](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) {
          return x ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::int64_t>) {
          return std::to_string(x);
        } else if constexpr (std::is_same_v<T, std::uint64_t>) {
          const std::string t = size_text(x);
          const bool has_unit = t.back() < '0' || t.back() > '9';
          // Bytes above INT64_MAX do not fit a TOML integer; parse_size reads them from a string.
          if (has_unit || x > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return quote(t);
          return t;
        } else if constexpr (std::is_same_v<T, double>) {
          return render_double(x);
        } else if constexpr (std::is_same_v<T, std::string>) {
          return quote(x);
        } else {
          std::string out = "[";
          for (std::size_t i = 0; i < x.size(); ++i) out += (i ? ", " : "") + quote(x[i]);
          return out + "]";
        }
      },
      v);
}

// ---- policy messages → TOML keys --------------------------------------------------------------------------------

struct PathMap {
  std::string_view policy;
  std::string_view toml;
};
// Where policy::PolicyConfig::validate()'s dotted path differs from the TOML key (unit suffixes, [margin], [host]).
constexpr PathMap kPolicyPaths[] = {
    {"headroom.margin.bytes", "margin.bytes"},
    {"headroom.margin.fraction", "margin.fraction"},
    {"headroom.fresh_for", "headroom.fresh_for_ms"},
    {"headroom.max_age", "headroom.max_age_ms"},
    {"ladder.max_delay", "ladder.max_delay_ms"},
    {"ladder.default_retry_after", "ladder.default_retry_after_ms"},
    {"ladder.max_retry_after", "ladder.max_retry_after_ms"},
    {"breaker.window", "breaker.window_ms"},
    {"breaker.cooldown", "breaker.cooldown_ms"},
    {"breaker.max_cooldown", "breaker.max_cooldown_ms"},
    {"host_guard.budget_bytes", "host.budget"},
    {"host_guard.mem_available_reserve", "host.mem_available_reserve"},
    {"service.recover_after", "service.recover_after_ms"},
    {"replica.recovery_budget", "replica.recovery_budget_ms"},
    {"idempotency.retention", "idempotency.retention_s"},
};

bool is_ident_char(char c) { return is_name_char(c) && c != '-'; }

std::string_view section_of(std::string_view path) {
  const auto dot = path.rfind('.');
  return dot == std::string_view::npos ? std::string_view() : path.substr(0, dot);
}

std::string_view last_of(std::string_view path) {
  const auto dot = path.rfind('.');
  return dot == std::string_view::npos ? path : path.substr(dot + 1);
}

// Positions where `token` occurs as a whole dotted identifier.
std::vector<std::size_t> token_positions(std::string_view text, std::string_view token) {
  std::vector<std::size_t> out;
  for (std::size_t pos = text.find(token); pos != std::string_view::npos; pos = text.find(token, pos + 1)) {
    const bool before_ok = pos == 0 || (!is_ident_char(text[pos - 1]) && text[pos - 1] != '.');
    const std::size_t end = pos + token.size();
    const bool after_ok = end == text.size() || !is_ident_char(text[end]);
    if (before_ok && after_ok) out.push_back(pos);
  }
  return out;
}

std::string replace_token(std::string text, std::string_view from, std::string_view to) {
  const auto positions = token_positions(text, from);
  for (auto it = positions.rbegin(); it != positions.rend(); ++it) text.replace(*it, from.size(), to);
  return text;
}

// "headroom.max_age must be >= headroom.fresh_for (500ms), got 100ms"
//   → "headroom.max_age_ms: must be >= headroom.fresh_for_ms (500ms), got 100ms"
std::string map_policy_message(const std::string& msg) {
  const auto cut = msg.find(" must be ");
  if (cut == std::string::npos) return msg;
  const std::string path = msg.substr(0, cut);
  std::string rest = msg.substr(cut + 1);
  std::string key = path;
  for (const auto& m : kPolicyPaths) {
    if (m.policy == path) key = std::string(m.toml);
  }
  for (const auto& m : kPolicyPaths) {
    rest = replace_token(std::move(rest), m.policy, m.toml);
    if (section_of(m.policy) == section_of(path)) {
      rest = replace_token(std::move(rest), last_of(m.policy), last_of(m.toml));
    }
  }
  return key + ": " + rest;
}

// ---- models -----------------------------------------------------------------------------------------------------

std::string model_at(const ModelConfig& m, std::size_t index) {
  if (model_name_rule(m.name).empty()) return "model[\"" + m.name + "\"]";
  return "model[" + std::to_string(index) + "]";
}

std::string model_names(const std::vector<ModelConfig>& models, std::string_view except = {}) {
  std::vector<std::string_view> names;
  for (const auto& m : models) {
    if (m.name != except) names.push_back(m.name);
  }
  return names.empty() ? "none" : quoted_list(names);
}

// ---- loading ----------------------------------------------------------------------------------------------------

class Loader {
 public:
  explicit Loader(DaemonConfig& cfg) : cfg_(cfg) {}

  Status apply_document(std::string_view text, const std::string& file, fs::path base) {
    cfg_.sources.push_back(file);
    index_ = cfg_.sources.size() - 1;
    file_ = file;
    base_ = std::move(base);
    toml::table doc;
    try {
      doc = toml::parse(text, std::string_view(file));
    } catch (const toml::parse_error& e) {
      const auto& at = e.source().begin;
      return fail(Errc::parse_error, file + ":" + std::to_string(at.line) + ":" + std::to_string(at.column) + ": " +
                                         std::string(e.description()));
    }
    return apply_table(doc, daemon_schema(), "", "", cfg_);
  }

  // Cross-field validation of the merged result; the error names the file that set the offending key.
  Status finish() {
    Status s = cfg_.validate();
    if (s.ok()) return {};
    const std::string& msg = s.error().message;
    return fail(s.error().code, attribute(msg) + ": " + msg);
  }

 private:
  Failure bad(const std::string& key, const std::string& what) const {
    return fail(Errc::invalid_argument, file_ + ": " + key + ": " + what);
  }

  template <class Root>
  Status apply_table(const toml::table& t, const std::vector<Section<Root>>& schema, std::string_view sec,
                     const std::string& display, Root& root) {
    const Section<Root>* here = find_section(schema, sec);
    // Document order, so the first error reported is the first one in the file.
    std::vector<std::pair<std::string_view, const toml::node*>> items;
    for (auto&& [k, v] : t) items.emplace_back(k.str(), &v);
    std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
      const auto& pa = a.second->source().begin;
      const auto& pb = b.second->source().begin;
      return std::tie(pa.line, pa.column) < std::tie(pb.line, pb.column);
    });
    for (const auto& [key, node] : items) {
      const std::string path = join(display, key);
      if (here) {
        const auto f = std::find_if(here->fields.begin(), here->fields.end(),
                                    [&](const Field<Root>& x) { return x.key == key; });
        if (f != here->fields.end()) {
          TANDEM_TRY(apply_field(*f, *node, path, root));
          continue;
        }
      }
      const std::string child = join(sec, key);
      if (find_section(schema, child)) {
        if constexpr (std::is_same_v<Root, DaemonConfig>) {
          if (child == "model") {
            TANDEM_TRY(apply_models(*node));
            continue;
          }
        }
        const toml::table* sub = node->as_table();
        if (!sub) return bad(path, "must be a table, got " + describe(*node));
        TANDEM_TRY(apply_table(*sub, schema, child, path, root));
        continue;
      }
      return fail(Errc::invalid_argument,
                  file_ + ": unknown key '" + path + "' (allowed: " + allowed_keys(schema, sec) + ")");
    }
    return {};
  }

  template <class Root>
  Status apply_field(const Field<Root>& f, const toml::node& n, const std::string& path, Root& root) {
    Value v;
    if (auto b = convert(n, f.spec, v)) return bad(path + b->where, b->what);
    if (auto b = check(f.spec, v)) return bad(path + b->where, b->what);
    if (f.spec.path && !base_.empty()) {
      auto& s = std::get<std::string>(v);
      const fs::path p(s);
      if (p.is_relative()) s = (base_ / p).lexically_normal().string();
    }
    f.set(root, std::move(v));
    origins_[path] = index_;
    return {};
  }

  // [[model]]: every table needs a name; a name seen in an earlier file merges into that model, a new one appends.
  Status apply_models(const toml::node& n) {
    const toml::array* arr = n.as_array();
    if (!arr || !arr->is_array_of_tables()) {
      return bad("model", "must be an array of tables ([[model]] with name and dir), got " + describe(n));
    }
    const auto& name_field = model_schema().front().fields.front();
    std::vector<std::string> seen;
    for (std::size_t i = 0; i < arr->size(); ++i) {
      const toml::table& t = *(*arr)[i].as_table();
      const std::string at = "model[" + std::to_string(i) + "]";
      const toml::node* name_node = t.get("name");
      if (!name_node) return bad(at + ".name", "must be set (every [[model]] needs a name), got nothing");
      Value v;
      if (auto b = convert(*name_node, name_field.spec, v)) return bad(at + ".name", b->what);
      if (auto b = check(name_field.spec, v)) return bad(at + ".name", b->what);
      const std::string name = std::get<std::string>(v);
      if (std::find(seen.begin(), seen.end(), name) != seen.end()) {
        return bad(at + ".name", "must be unique within a file, got " + quote(name) + " twice");
      }
      seen.push_back(name);
      auto it = std::find_if(cfg_.models.begin(), cfg_.models.end(),
                             [&](const ModelConfig& m) { return m.name == name; });
      if (it == cfg_.models.end()) {
        cfg_.models.emplace_back();
        cfg_.models.back().name = name;
        it = std::prev(cfg_.models.end());
      }
      TANDEM_TRY(apply_table(t, model_schema(), "", "model[\"" + name + "\"]", *it));
    }
    return {};
  }

  // The file to blame for a validation message "<key>: ...": the one that set the key, else the latest file that
  // set a key the rule mentions, else the one that last named the model, else the main file.
  std::string attribute(const std::string& msg) const {
    const std::string key = msg.substr(0, msg.find(": "));
    if (auto it = origins_.find(key); it != origins_.end()) return cfg_.sources[it->second];
    std::optional<std::size_t> best;
    for (const auto& [k, index] : origins_) {
      const bool mentioned = !token_positions(msg, k).empty() ||
                             (section_of(k) == section_of(key) && !token_positions(msg, last_of(k)).empty());
      if (mentioned && (!best || index > *best)) best = index;
    }
    if (best) return cfg_.sources[*best];
    if (key.rfind("model[\"", 0) == 0) {
      const auto close = key.find("\"]");
      if (auto it = origins_.find(key.substr(0, close + 2) + ".name"); it != origins_.end()) {
        return cfg_.sources[it->second];
      }
    }
    return cfg_.sources.empty() ? std::string("<config>") : cfg_.sources.front();
  }

  DaemonConfig& cfg_;
  std::map<std::string, std::size_t> origins_;  // rendered key → index in cfg_.sources of the file that set it last
  std::size_t index_ = 0;
  std::string file_;
  fs::path base_;  // relative paths resolve against this; empty = leave them relative
};

Result<std::string> read_text(const std::string& path) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (st.type() == fs::file_type::not_found) return fail(Errc::not_found, path + ": no such file");
  if (ec) return fail(Errc::io_error, path + ": " + ec.message());
  if (fs::is_directory(st)) return fail(Errc::io_error, path + ": is a directory, expected a TOML file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(Errc::io_error, path + ": cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return fail(Errc::io_error, path + ": read failed");
  return ss.str();
}

fs::path directory_of(const std::string& file) {
  std::error_code ec;
  fs::path abs = fs::absolute(file, ec);
  if (ec) abs = fs::path(file);
  return abs.lexically_normal().parent_path();
}

}  // namespace

// ---- public -----------------------------------------------------------------------------------------------------

std::string_view bus_kind_name(BusKind k) noexcept {
  switch (k) {
    case BusKind::system: return "system";
    case BusKind::session: return "session";
    case BusKind::address: return "address";
  }
  return "system";
}

std::string_view accel_kind_name(AccelKind k) noexcept {
  switch (k) {
    case AccelKind::none: return "none";
    case AccelKind::simulated: return "simulated";
    case AccelKind::cuda: return "cuda";
    case AccelKind::auto_detect: return "auto";
  }
  return "auto";
}

const ModelConfig* DaemonConfig::find_model(std::string_view name) const {
  for (const auto& m : models) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

Status DaemonConfig::validate() const {
  const auto bad = [](const std::string& key, const std::string& what) {
    return fail(Errc::invalid_argument, key + ": " + what);
  };
  // Every key's own range, as the loader checks it (for configurations built in code).
  for (const auto& sec : daemon_schema()) {
    for (const auto& f : sec.fields) {
      if (auto b = check(f.spec, f.get(*this))) return bad(join(sec.path, f.key) + b->where, b->what);
    }
  }
  if (models.empty()) return bad("model", "must be at least one [[model]] table with name and dir, got none");
  for (std::size_t i = 0; i < models.size(); ++i) {
    const ModelConfig& m = models[i];
    const std::string at = model_at(m, i);
    for (const auto& sec : model_schema()) {
      for (const auto& f : sec.fields) {
        if (auto b = check(f.spec, f.get(m))) return bad(join(at, join(sec.path, f.key)) + b->where, b->what);
      }
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (models[j].name == m.name) return bad(at + ".name", "must be unique, got " + quote(m.name) + " twice");
    }
  }
  for (std::size_t i = 0; i < models.size(); ++i) {
    const ModelConfig& m = models[i];
    if (!m.fallback.empty() && (m.fallback == m.name || !find_model(m.fallback))) {
      return bad(model_at(m, i) + ".fallback", "must be \"\" or the name of another [[model]] (" +
                                                   model_names(models, m.name) + "), got " + quote(m.fallback));
    }
  }
  if (rings.default_sq_entries > rings.max_sq_entries)
    return bad("rings.default_sq_entries", "must be at most rings.max_sq_entries (" +
                                               std::to_string(rings.max_sq_entries) + ")");
  if (rings.default_cq_entries > rings.max_cq_entries)
    return bad("rings.default_cq_entries", "must be at most rings.max_cq_entries (" +
                                               std::to_string(rings.max_cq_entries) + ")");
  if (rings.default_data_bytes > rings.max_data_bytes)
    return bad("rings.default_data_bytes", "must be at most rings.max_data_bytes (" +
                                               size_text(rings.max_data_bytes) + ")");
  if (!default_model.empty() && !find_model(default_model)) {
    return bad("default_model", "must be \"\" (the first [[model]]) or the name of a [[model]] (" +
                                    model_names(models) + "), got " + quote(default_model));
  }
  if (bus.kind == BusKind::address && bus.address.empty()) {
    return bad("bus.address", "must be set when bus.kind = \"address\", got \"\"");
  }
  if (bus.kind != BusKind::address && !bus.address.empty()) {
    return bad("bus.address", "must be \"\" unless bus.kind = \"address\" (it is " + quote(bus_kind_name(bus.kind)) +
                                  "), got " + quote(bus.address));
  }
  if (Status p = policy.validate(); !p.ok()) return fail(p.error().code, map_policy_message(p.error().message));
  return {};
}

Result<std::uint64_t> parse_size(std::string_view text) {
  std::string why;
  if (auto v = parse_size_impl(text, why)) return *v;
  return fail(Errc::invalid_argument, "size " + quote(text) + ": " + why);
}

Result<DaemonConfig> parse_config(std::string_view toml_text, const std::string& origin) {
  DaemonConfig cfg;
  Loader loader(cfg);
  TANDEM_TRY(loader.apply_document(toml_text, origin, fs::path(origin).parent_path()));
  TANDEM_TRY(loader.finish());
  return cfg;
}

Result<DaemonConfig> load_config(const std::string& path, const std::string& dropin_dir) {
  DaemonConfig cfg;
  Loader loader(cfg);
  auto text = read_text(path);
  if (!text.ok()) return fail(std::move(text).error());
  TANDEM_TRY(loader.apply_document(*text, path, directory_of(path)));

  const fs::path dir = dropin_dir.empty() ? fs::path(path).parent_path() / "tandemd.d" : fs::path(dropin_dir);
  std::error_code ec;
  const auto st = fs::status(dir, ec);
  if (st.type() != fs::file_type::not_found) {
    if (ec) return fail(Errc::io_error, dir.string() + ": " + ec.message());
    if (!fs::is_directory(st)) return fail(Errc::io_error, dir.string() + ": not a directory (drop-in directory)");
    std::vector<std::string> names;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      // Like the shell glob *.toml: hidden files (editor and package-manager leftovers) are not read.
      if (name.size() <= 5 || name[0] == '.' || name.compare(name.size() - 5, 5, ".toml") != 0) continue;
      std::error_code fec;
      if (!fs::is_regular_file(it->path(), fec)) continue;  // follows symlinks
      names.push_back(name);
    }
    if (ec) return fail(Errc::io_error, dir.string() + ": " + ec.message());
    std::sort(names.begin(), names.end());
    for (const auto& name : names) {
      const std::string file = (dir / name).string();
      auto dropin = read_text(file);
      if (!dropin.ok()) return fail(std::move(dropin).error());
      TANDEM_TRY(loader.apply_document(*dropin, file, directory_of(file)));
    }
  }
  TANDEM_TRY(loader.finish());
  return cfg;
}

std::string render_config(const DaemonConfig& cfg) {
  std::string out = "# tandemd configuration as loaded (render_config); keys: docs/config.md\n";
  for (const auto& s : cfg.sources) out += "# source: " + s + "\n";
  const auto fields = [&out](const auto& sec, const auto& root) {
    for (const auto& f : sec.fields) out += std::string(f.key) + " = " + render_value(f.get(root)) + "\n";
  };
  for (const auto& sec : daemon_schema()) {
    if (sec.path == "model") {
      for (const auto& m : cfg.models) {
        for (const auto& msec : model_schema()) {
          out += msec.path.empty() ? "\n[[model]]\n" : "[model." + std::string(msec.path) + "]\n";
          fields(msec, m);
        }
      }
      continue;
    }
    if (!sec.path.empty()) out += "\n[" + std::string(sec.path) + "]\n";
    fields(sec, cfg);
  }
  return out;
}

}  // namespace tandem::daemon
