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
    std::string dir = *cg;
    std::optional<std::uint64_t> tightest;
    current = slurp(root + "/sys/fs/cgroup" + dir + "/memory.current");
    for (;;) {
      if (auto m = slurp(root + "/sys/fs/cgroup" + dir + "/memory.max")) {
        auto v = policy::parse_cgroup_memory_max(*m);
        if (!v) return fail(std::move(v).error());
        if (*v && (!tightest || **v < *tightest)) tightest = **v;
      }
      if (dir.empty() || dir == "/") break;
      dir = dir.substr(0, dir.rfind('/'));
    }
    if (tightest) max = std::to_string(*tightest) + "\n";
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
