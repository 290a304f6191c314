// Reading an event's data fields (src/validate/metrics_*.cc): absent or mistyped fields read as absent, never throw.
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace tandem::validate {

// An integer field; a negative one reads as 0.
inline std::optional<std::uint64_t> field_u64(const nlohmann::json& d, const char* k) {
  auto it = d.find(k);
  if (it == d.end() || !it->is_number_integer()) return std::nullopt;
  if (it->is_number_unsigned()) return it->get<std::uint64_t>();
  return static_cast<std::uint64_t>(std::max<std::int64_t>(0, it->get<std::int64_t>()));
}

// A string field, "" when absent.
inline std::string field_str(const nlohmann::json& d, const char* k) {
  auto it = d.find(k);
  return it != d.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace tandem::validate
