// Daemon-internal: the configuration schema shared by config.cc (loading, drop-ins, DaemonConfig::validate(),
// render_config()), config_schema.cc (the key tables and their text rules) and config_values.cc (TOML text, sizes,
// checking, converting and rendering one value). Not part of the daemon's interface (config.h is).
#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "daemon/config.h"
#include "policy/format.h"

namespace tandem::daemon::config_detail {

using policy::kGiB;
using policy::kMiB;
using policy::kPiB;
constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kTiB = 1024 * kGiB;
constexpr std::int64_t kYearSeconds = 365LL * 86400;
constexpr std::int64_t kYearMillis = kYearSeconds * 1000;
constexpr std::int64_t kU32Max = std::numeric_limits<std::uint32_t>::max();
constexpr std::uint64_t kU64Max = std::numeric_limits<std::uint64_t>::max();

// ---- text, sizes (config_values.cc) ------------------------------------------------------------------------------

// A TOML basic string (also how strings are shown in messages).
std::string quote(std::string_view s);
std::string join(std::string_view a, std::string_view b);
std::string quoted_list(const std::vector<std::string_view>& items);
// "8GiB" when the value is a whole number of a binary unit, else the bytes.
std::string size_text(std::uint64_t v);
// Exact decimal arithmetic: "1.5GiB" is 1610612736, "0.1KiB" is not a whole number of bytes (an error, not a
// rounding).
std::optional<std::uint64_t> parse_size_impl(std::string_view text, std::string& why);

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

// ---- text rules (config_schema.cc) -------------------------------------------------------------------------------

bool is_name_char(char c);
std::string model_name_rule(std::string_view s);

// ---- the tables (config_schema.cc) -------------------------------------------------------------------------------

// Sections in the order render_config() writes them; "model" marks where the [[model]] tables go.
const std::vector<Section<DaemonConfig>>& daemon_schema();
// One [[model]] table; "sampling" is [model.sampling] inside it.
const std::vector<Section<ModelConfig>>& model_schema();

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

// ---- checking values (config_values.cc) --------------------------------------------------------------------------

// What is wrong with one value: `where` is appended to the key ("[3]" for a list item), `what` is
// "must be <rule>, got <value>".
struct Bad {
  std::string where;
  std::string what;
};

std::string describe(const toml::node& n);
// The range / rule of an already typed value (shared by the loader and DaemonConfig::validate()).
std::optional<Bad> check(const Spec& s, const Value& value);
// TOML node → Value of the spec's kind; a wrong type names the expected one.
std::optional<Bad> convert(const toml::node& n, const Spec& s, Value& out);
std::string render_value(const Value& v);

}  // namespace tandem::daemon::config_detail
