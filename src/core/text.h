// Small text helpers shared by tools and libraries.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tandem {

// Escapes a string for inclusion between double quotes in JSON (quotes, backslash, control characters).
std::string json_escape(std::string_view s);
// "12.3 MiB"
std::string format_mib(std::uint64_t bytes);
// Strict UTF-8 (RFC 3629: no overlong forms, no surrogates, <= U+10FFFF), the set nlohmann accepts when dumping.
bool valid_utf8(std::string_view s) noexcept;
// Maximum bracket nesting of JSON `text`, counting only brackets outside strings; stops early past `limit`
// (callers reject deep documents before a recursive parser sees them).
int json_nesting_depth(std::string_view text, int limit) noexcept;

}  // namespace tandem
