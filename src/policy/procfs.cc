#include "policy/procfs.h"

#include <charconv>
#include <string>

namespace tandem::policy {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

Result<std::uint64_t> parse_u64(std::string_view s, const char* what) {
  s = trim(s);
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || p != s.data() + s.size()) {
    return fail(Errc::parse_error, std::string(what) + ": expected an unsigned integer, got '" +
                                       std::string(s.substr(0, 40)) + "'");
  }
  return v;
}

}  // namespace

Result<std::uint64_t> parse_meminfo_available(std::string_view meminfo) {
  constexpr std::string_view key = "MemAvailable:";
  std::size_t pos = 0;
  while (pos < meminfo.size()) {
    std::size_t eol = meminfo.find('\n', pos);
    if (eol == std::string_view::npos) eol = meminfo.size();
    std::string_view line = meminfo.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.substr(0, key.size()) != key) continue;
    std::string_view rest = trim(line.substr(key.size()));
    std::uint64_t mult = 1;
    if (rest.size() >= 2 && rest.substr(rest.size() - 2) == "kB") {
      mult = 1024;
      rest = trim(rest.substr(0, rest.size() - 2));
    }
    auto v = parse_u64(rest, "meminfo MemAvailable");
    if (!v) return fail(std::move(v).error());
    if (*v > UINT64_MAX / mult) return fail(Errc::parse_error, "meminfo MemAvailable: value too large");
    return *v * mult;
  }
  return fail(Errc::not_found, "meminfo: no MemAvailable line");
}

Result<std::optional<std::uint64_t>> parse_cgroup_memory_max(std::string_view text) {
  if (trim(text) == "max") return std::optional<std::uint64_t>{};
  auto v = parse_u64(text, "cgroup memory.max");
  if (!v) return fail(std::move(v).error());
  return std::optional<std::uint64_t>{*v};
}

Result<std::uint64_t> parse_cgroup_memory_current(std::string_view text) {
  return parse_u64(text, "cgroup memory.current");
}

Result<HostReading> parse_host_reading(std::optional<std::string_view> meminfo,
                                       std::optional<std::string_view> cgroup_max,
                                       std::optional<std::string_view> cgroup_current) {
  HostReading r;
  if (meminfo) {
    auto v = parse_meminfo_available(*meminfo);
    if (!v) return fail(std::move(v).error());
    r.mem_available = *v;
  }
  if (cgroup_max) {
    auto v = parse_cgroup_memory_max(*cgroup_max);
    if (!v) return fail(std::move(v).error());
    r.cgroup_max = *v;
  }
  if (cgroup_current) {
    auto v = parse_cgroup_memory_current(*cgroup_current);
    if (!v) return fail(std::move(v).error());
    r.cgroup_current = *v;
  }
  if (r.cgroup_max && !r.cgroup_current) {
    return fail(Errc::invalid_argument, "cgroup memory.max is set but memory.current is missing");
  }
  return r;
}

}  // namespace tandem::policy
