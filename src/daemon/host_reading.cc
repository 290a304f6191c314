#include "daemon/host_reading.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

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

// The cgroup memory files of one layout. cgroup v2: "0::/system.slice/tandemd.service" in /proc/self/cgroup, files
// memory.current and memory.max under /sys/fs/cgroup. cgroup v1 (and the "hybrid" layout, whose v2 tree has no
// memory controller): "4:memory:/system.slice/tandemd.service", files memory.usage_in_bytes and
// memory.limit_in_bytes under /sys/fs/cgroup/memory. systemd writes MemoryMax= into whichever the host has.
struct CgroupLayout {
  std::string path;      // own cgroup, from /proc/self/cgroup
  std::string mount;     // root + "/sys/fs/cgroup" (v2) or root + "/sys/fs/cgroup/memory" (v1)
  const char* current;   // usage file
  const char* max;       // limit file
  bool v1;
};

std::vector<CgroupLayout> own_cgroups(const std::string& root) {
  std::vector<CgroupLayout> out;
  auto text = slurp(root + "/proc/self/cgroup");
  if (!text) return out;
  std::istringstream in(*text);
  std::string line;
  std::optional<std::string> v2, v1;
  while (std::getline(in, line)) {
    const auto a = line.find(':');
    const auto b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) v2 = line.substr(b + 1);
    std::istringstream cs(controllers);
    for (std::string c; std::getline(cs, c, ',');)
      if (c == "memory") v1 = line.substr(b + 1);
  }
  // v2 first: on a v2 host there is no v1 memory line; on a hybrid host the v2 tree has no memory.current and
  // the walk below finds nothing there.
  if (v2) out.push_back({*v2, root + "/sys/fs/cgroup", "memory.current", "memory.max", false});
  if (v1) out.push_back({*v1, root + "/sys/fs/cgroup/memory", "memory.usage_in_bytes", "memory.limit_in_bytes", true});
  return out;
}

// cgroup v1 reports "no limit" as the largest page-aligned counter (0x7FFFFFFFFFFFF000 on 64-bit), not "max".
constexpr std::uint64_t kV1Unlimited = std::uint64_t{1} << 62;

}  // namespace

Result<policy::HostReading> read_host_memory(const std::string& root) {
  auto meminfo = slurp(root + "/proc/meminfo");
  std::optional<std::string> max, current;
  for (const auto& cg : own_cgroups(root)) {
    // The limit that binds may sit on an ancestor (a slice) whose usage includes sibling services: the room is the
    // smallest (limit − usage) on the way up, reported as own usage + that room.
    std::string dir = cg.path;
    std::optional<std::uint64_t> own_current, room;
    for (bool own = true;; own = false) {
      const std::string base = cg.mount + (dir == "/" ? "" : dir);
      auto cur_text = slurp(base + "/" + cg.current);
      std::optional<std::uint64_t> cur;
      if (cur_text) {
        auto c = policy::parse_cgroup_memory_current(*cur_text);
        if (!c) return fail(std::move(c).error());
        cur = *c;
      }
      if (own) own_current = cur;
      if (auto m = slurp(base + "/" + cg.max); m && cur) {
        auto v = policy::parse_cgroup_memory_max(*m);
        if (!v) return fail(std::move(v).error());
        if (*v && !(cg.v1 && **v >= kV1Unlimited)) {
          const std::uint64_t r = **v > *cur ? **v - *cur : 0;
          if (!room || r < *room) room = r;
        }
      }
      if (dir.empty() || dir == "/") break;
      dir = dir.substr(0, dir.rfind('/'));
      if (dir.empty()) dir = "/";
    }
    if (!own_current) continue;  // this layout has no memory files here (the v2 tree of a hybrid host)
    current = std::to_string(*own_current) + "\n";
    if (room) max = std::to_string(*own_current + *room) + "\n";
    else max = std::string("max\n");
    break;
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
