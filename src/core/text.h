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

}  // namespace tandem
