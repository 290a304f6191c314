// Reads the host-memory numbers the guard decides on: /proc/meminfo MemAvailable and, when the daemon runs in a
// cgroup v2 with a memory limit (systemd's MemoryMax=), memory.max and memory.current of its own cgroup.
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
