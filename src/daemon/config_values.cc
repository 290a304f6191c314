// tandemd's configuration, one value at a time: TOML strings, sizes ("8GiB"), checking a typed value against its
// key's spec, converting a TOML node to it and rendering it back (config_schema.h).
#include "daemon/config_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <type_traits>
#include <utility>

namespace tandem::daemon::config_detail {

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

namespace {

// A TOML float that reads back to the same double.
std::string render_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string s = policy::format_double(v);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

// ---- sizes ------------------------------------------------------------------------------------------------------

namespace {

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

}  // namespace

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

// ---- checking values --------------------------------------------------------------------------------------------

namespace {

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

}  // namespace

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

namespace {

bool in_choices(const Spec& s, std::string_view v) {
  return std::find(s.choices.begin(), s.choices.end(), v) != s.choices.end();
}

}  // namespace

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

}  // namespace tandem::daemon::config_detail
