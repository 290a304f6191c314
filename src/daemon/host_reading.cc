#include "daemon/host_reading.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

#include "policy/procfs.h"

namespace tandem::daemon {

namespace {

std::optional<std::string> slurp(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "0::/system.slice/tandemd.service" → "/system.slice/tandemd.service" (cgroup v2 only).
std::optional<std::string> own_cgroup(const std::string& root) {
  auto text = slurp(root + "/proc/self/cgroup");
  if (!text) return std::nullopt;
  std::istringstream in(*text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  return std::nullopt;
}

}  // namespace

Result<policy::HostReading> read_host_memory(const std::string& root) {
  auto meminfo = slurp(root + "/proc/meminfo");
  std::optional<std::string> max, current;
  if (auto cg = own_cgroup(root)) {
    // The limit that binds may sit on an ancestor (a slice); take the tightest memory.max on the way up.
    // The limit that binds may sit on an ancestor (a slice) whose usage includes sibling services: the room is the
    // smallest (memory.max − memory.current) on the way up, reported as own current + that room.
    std::string dir = *cg;
    std::optional<std::uint64_t> own_current, room;
    for (bool own = true;; own = false) {
      const std::string base = root + "/sys/fs/cgroup" + dir;
      auto cur_text = slurp(base + "/memory.current");
      std::optional<std::uint64_t> cur;
      if (cur_text) {
        auto c = policy::parse_cgroup_memory_current(*cur_text);
        if (!c) return fail(std::move(c).error());
        cur = *c;
      }
      if (own) own_current = cur;
      if (auto m = slurp(base + "/memory.max"); m && cur) {
        auto v = policy::parse_cgroup_memory_max(*m);
        if (!v) return fail(std::move(v).error());
        if (*v) {
          const std::uint64_t r = **v > *cur ? **v - *cur : 0;
          if (!room || r < *room) room = r;
        }
      }
      if (dir.empty() || dir == "/") break;
      dir = dir.substr(0, dir.rfind('/'));
    }
    if (own_current) current = std::to_string(*own_current) + "\n";
    if (room && own_current) max = std::to_string(*own_current + *room) + "\n";
    else max = std::string("max\n");
  }
  std::optional<std::string_view> mi, mx, cu;
  if (meminfo) mi = *meminfo;
  if (max) mx = *max;
  if (current) cu = *current;
  if (!current) mx.reset();  // a limit without usage cannot be turned into room
  return policy::parse_host_reading(mi, mx, cu);
}

std::optional<std::uint64_t> read_self_rss() {
  auto text = slurp("/proc/self/statm");
  if (!text) return std::nullopt;
  std::istringstream in(*text);
  std::uint64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return std::nullopt;
  return resident * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace tandem::daemon
