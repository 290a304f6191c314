// Pure parsers for the host-memory texts the daemon reads: /proc/meminfo and cgroup v2 memory.max /
// memory.current. They take the file contents (strings), never paths.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/result.h"
#include "policy/host_guard.h"

namespace tandem::policy {

// "MemAvailable:   12345678 kB" → bytes. Errc::not_found if the line is absent, Errc::parse_error if malformed.
Result<std::uint64_t> parse_meminfo_available(std::string_view meminfo);
// "max\n" → nullopt (no limit); "8589934592\n" → bytes.
Result<std::optional<std::uint64_t>> parse_cgroup_memory_max(std::string_view text);
// "123456\n" → bytes.
Result<std::uint64_t> parse_cgroup_memory_current(std::string_view text);

// Builds a HostReading from whichever texts are present (nullopt = file absent). A text that is present but
// malformed is an error: the guard must not silently lose a limit.
Result<HostReading> parse_host_reading(std::optional<std::string_view> meminfo,
                                       std::optional<std::string_view> cgroup_max,
                                       std::optional<std::string_view> cgroup_current);

}  // namespace tandem::policy
