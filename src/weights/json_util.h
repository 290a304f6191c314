// Private to src/weights: hardened JSON parsing and typed accessors for untrusted files. Not installed, not included
// by any public header (nlohmann stays out of the public API).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "core/result.h"

namespace tandem::weights::detail {

using Json = nlohmann::json;

// Nesting deeper than this is rejected before nlohmann builds a tree (a 100 MiB "[[[[..." would otherwise allocate
// gigabytes). Every format we read needs depth <= 4.
inline constexpr int kMaxJsonDepth = 64;

// Parses `text` as JSON. Errors: parse_error (not JSON, invalid UTF-8, nesting > kMaxJsonDepth) with the message
// "<origin>: <what>". If `duplicate_top_key` is non-null, a key repeated inside the top-level object is reported
// through it (format_error is the caller's choice) instead of the last value silently winning.
Result<Json> parse_json(std::string_view text, const std::string& origin, std::string* duplicate_top_key = nullptr);

// "object", "array", "string", "integer", "number", "boolean", "null".
std::string_view json_kind(const Json& v);

// The value as a signed 64-bit integer if it is a JSON integer that fits; nullopt for anything else (including
// floats such as 1.0 and integers above INT64_MAX).
std::optional<std::int64_t> json_int(const Json& v);

// Reads a whole file of at most `max_bytes`. not_found (ENOENT), io_error (other errno, not a regular file),
// format_error (too large).
Result<std::string> read_small_file(const std::string& path, std::uint64_t max_bytes);

// `name` (untrusted) in single quotes for an error message: control characters as \xNN, cut after 200 bytes.
std::string printable(std::string_view name);

// Whether `path` names an existing regular file (following symlinks).
bool is_regular_file(const std::string& path);

}  // namespace tandem::weights::detail
