// What users type, parsed (format.h "Parsing what users type"): sizes, durations, booleans and `policy set`
// assignments. Split from format.cc (the text and views), behaviour unchanged.
#include <cctype>
#include <charconv>
#include <cmath>
#include <string>

#include "client/format.h"

namespace tandem::client {

namespace {

std::string lower(std::string_view s) {
  std::string o(s);
  for (char& c : o) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return o;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits "1.5GiB" into a non-negative decimal number and a unit; the number keeps its text for exact integers.
struct NumberAndUnit {
  std::string_view number;
  std::string unit;  // lower-case, spaces removed
};

Result<NumberAndUnit> split_number(std::string_view what, std::string_view text) {
  std::string_view t = trim(text);
  std::size_t i = 0;
  bool dot = false;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || (t[i] == '.' && !dot))) {
    if (t[i] == '.') dot = true;
    ++i;
  }
  NumberAndUnit r{t.substr(0, i), lower(trim(t.substr(i)))};
  if (r.number.empty() || r.number == ".")
    return fail(Errc::invalid_argument, std::string(what) + ": '" + std::string(text) + "' is not a number");
  return r;
}

// number × multiplier with overflow and fraction checks.
Result<std::uint64_t> scale(std::string_view what, std::string_view text, std::string_view number, std::uint64_t mult,
                            bool allow_fraction) {
  auto dot = number.find('.');
  std::string_view int_part = number.substr(0, dot);
  std::uint64_t whole = 0;
  if (!int_part.empty()) {
    auto r = std::from_chars(int_part.data(), int_part.data() + int_part.size(), whole);
    if (r.ec != std::errc{} || r.ptr != int_part.data() + int_part.size())
      return fail(Errc::invalid_argument, std::string(what) + ": '" + std::string(text) + "' is out of range");
  }
  std::uint64_t result = 0;
  if (__builtin_mul_overflow(whole, mult, &result))
    return fail(Errc::invalid_argument, std::string(what) + ": '" + std::string(text) + "' is out of range");
  if (dot != std::string_view::npos) {
    std::string_view frac = number.substr(dot + 1);
    if (!allow_fraction && !frac.empty())
      return fail(Errc::invalid_argument,
                  std::string(what) + ": '" + std::string(text) + "' needs a unit for a fractional value");
    long double f = 0, scale_f = 0.1L;
    for (char c : frac) {
      f += (c - '0') * scale_f;
      scale_f /= 10;
    }
    long double add = std::round(f * static_cast<long double>(mult));
    std::uint64_t add_u = static_cast<std::uint64_t>(add);
    if (__builtin_add_overflow(result, add_u, &result))
      return fail(Errc::invalid_argument, std::string(what) + ": '" + std::string(text) + "' is out of range");
  }
  return result;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Parsing

Result<std::uint64_t> parse_size(std::string_view text) {
  auto nu = split_number("size", text);
  if (!nu.ok()) return fail(nu.error());
  static const std::vector<std::pair<std::string_view, std::uint64_t>> units = {
      {"", 1ull},          {"b", 1ull},
      {"k", 1ull << 10},   {"ki", 1ull << 10},
      {"kib", 1ull << 10}, {"kb", 1000ull},
      {"m", 1ull << 20},   {"mi", 1ull << 20},
      {"mib", 1ull << 20}, {"mb", 1000ull * 1000},
      {"g", 1ull << 30},   {"gi", 1ull << 30},
      {"gib", 1ull << 30}, {"gb", 1000ull * 1000 * 1000},
      {"t", 1ull << 40},   {"ti", 1ull << 40},
      {"tib", 1ull << 40}, {"tb", 1000ull * 1000 * 1000 * 1000},
      {"p", 1ull << 50},   {"pi", 1ull << 50},
      {"pib", 1ull << 50}, {"pb", 1000ull * 1000 * 1000 * 1000 * 1000},
  };
  for (const auto& [name, mult] : units) {
    if (nu->unit == name) return scale("size", text, nu->number, mult, !name.empty() && name != "b");
  }
  return fail(Errc::invalid_argument, "size: unknown unit '" + nu->unit + "' in '" + std::string(text) +
                                          "' (use B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB)");
}

Result<std::uint64_t> parse_duration_ms(std::string_view text) {
  auto nu = split_number("duration", text);
  if (!nu.ok()) return fail(nu.error());
  static const std::vector<std::pair<std::string_view, std::uint64_t>> units = {
      {"", 1}, {"ms", 1}, {"s", 1000}, {"sec", 1000}, {"m", 60000}, {"min", 60000}, {"h", 3600000}, {"hour", 3600000},
  };
  for (const auto& [name, mult] : units) {
    if (nu->unit == name) return scale("duration", text, nu->number, mult, mult > 1);
  }
  return fail(Errc::invalid_argument,
              "duration: unknown unit '" + nu->unit + "' in '" + std::string(text) + "' (use ms, s, min, h)");
}

Result<bool> parse_bool(std::string_view text) {
  std::string t = lower(trim(text));
  if (t == "true" || t == "yes" || t == "on" || t == "1") return true;
  if (t == "false" || t == "no" || t == "off" || t == "0") return false;
  return fail(Errc::invalid_argument, "'" + std::string(text) + "' is not a boolean (true/false, yes/no, on/off, 1/0)");
}

const std::vector<std::pair<std::string, std::string>>& policy_keys() {
  static const std::vector<std::pair<std::string, std::string>> keys = {
      // The keys tandemd accepts for writing (dbus/io.tandem.Tandem1.xml, Policy); the others are read-only.
      {"margin_bytes", "t"},    {"margin_fraction", "d"}, {"ladder_order", "as"},      {"max_delay_ms", "t"},
      {"offload_enabled", "b"}, {"allow_migration", "b"}, {"host_budget_bytes", "t"},
  };
  return keys;
}

Result<std::pair<std::string, PolicyValue>> parse_policy_setting(std::string_view assignment) {
  auto eq = assignment.find('=');
  if (eq == std::string_view::npos)
    return fail(Errc::invalid_argument, "policy setting '" + std::string(assignment) + "' is not KEY=VALUE");
  std::string key(trim(assignment.substr(0, eq)));
  std::string_view value = trim(assignment.substr(eq + 1));
  const auto& keys = policy_keys();
  auto it = std::find_if(keys.begin(), keys.end(), [&](const auto& k) { return k.first == key; });
  if (it == keys.end()) {
    std::string names;
    for (const auto& k : keys) names += (names.empty() ? "" : ", ") + k.first;
    return fail(Errc::invalid_argument, "unknown policy key '" + key + "' (known: " + names + ")");
  }
  auto bad = [&](const Error& e) { return fail(Errc::invalid_argument, "policy " + key + ": " + e.message); };
  const std::string& sig = it->second;
  if (sig == "b") {
    auto b = parse_bool(value);
    if (!b.ok()) return bad(b.error());
    return std::pair<std::string, PolicyValue>{key, PolicyValue{*b}};
  }
  if (sig == "d") {
    std::string v(value);
    char* end = nullptr;
    errno = 0;
    double d = v.empty() ? NAN : std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || errno != 0 || !std::isfinite(d))
      return fail(Errc::invalid_argument, "policy " + key + ": '" + v + "' is not a number");
    if (d < 0) return fail(Errc::invalid_argument, "policy " + key + ": " + v + " must not be negative");
    return std::pair<std::string, PolicyValue>{key, PolicyValue{d}};
  }
  if (sig == "as") {
    std::vector<std::string> items;
    std::string_view rest = value;
    while (true) {
      auto comma = rest.find(',');
      std::string_view item = trim(rest.substr(0, comma));
      if (item.empty())
        return fail(Errc::invalid_argument, "policy " + key + ": empty item in '" + std::string(value) + "'");
      items.emplace_back(item);
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
    return std::pair<std::string, PolicyValue>{key, PolicyValue{std::move(items)}};
  }
  if (sig == "u") {
    std::uint32_t u = 0;
    auto r = std::from_chars(value.data(), value.data() + value.size(), u);
    if (value.empty() || r.ec != std::errc{} || r.ptr != value.data() + value.size())
      return fail(Errc::invalid_argument,
                  "policy " + key + ": '" + std::string(value) + "' is not an integer in [0, 4294967295]");
    return std::pair<std::string, PolicyValue>{key, PolicyValue{u}};
  }
  // "t": bytes or milliseconds by the key's suffix
  Result<std::uint64_t> t = key.ends_with("_ms") ? parse_duration_ms(value) : parse_size(value);
  if (!t.ok()) return bad(t.error());
  return std::pair<std::string, PolicyValue>{key, PolicyValue{*t}};
}

}  // namespace tandem::client
