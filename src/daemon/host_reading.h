// Reads the host-memory numbers the guard decides on: /proc/meminfo MemAvailable and, when the daemon runs in a
// cgroup with a memory limit (systemd's MemoryMax=), the limit and usage of its own cgroup and its ancestors:
// memory.max/memory.current on cgroup v2, memory.limit_in_bytes/memory.usage_in_bytes of the memory controller on
// cgroup v1 and the hybrid layout (v1 controllers plus an empty v2 tree).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/result.h"
#include "policy/host_guard.h"

namespace tandem::daemon {

// `root` prefixes every path (tests point it at a fake tree). Errors: a file that exists but does not parse.
Result<policy::HostReading> read_host_memory(const std::string& root = "");
// Resident set size of this process (/proc/self/statm), bytes.
std::optional<std::uint64_t> read_self_rss();

}  // namespace tandem::daemon
