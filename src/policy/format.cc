#include "policy/format.h"

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>

namespace tandem::policy {

std::string format_double(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string format_duration(Clock::duration d) {
  using namespace std::chrono;
  auto ns = d.count();
  if (ns % 1'000'000'000 == 0) return std::to_string(ns / 1'000'000'000) + "s";
  if (ns % 1'000'000 == 0) {
    auto ms = ns / 1'000'000;
    if (ms >= 1000 || ms <= -1000) return format_double(static_cast<double>(ms) / 1000.0) + "s";
    return std::to_string(ms) + "ms";
  }
  // Measured durations (ETAs from service rates) are rarely whole units: shown rounded, to three digits.
  const double a = static_cast<double>(ns < 0 ? -ns : ns);
  char buf[32];
  if (a >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.3gs", static_cast<double>(ns) / 1e9);
    return buf;
  }
  if (a >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.3gms", static_cast<double>(ns) / 1e6);
    return buf;
  }
  if (ns % 1000 == 0) return std::to_string(ns / 1000) + "us";
  return std::to_string(ns) + "ns";
}

std::string format_bytes(std::uint64_t bytes) {
  char buf[48];
  if (bytes >= (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / static_cast<double>(1ull << 30));
  } else if (bytes >= (1ull << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / static_cast<double>(1ull << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  }
  return buf;
}

}  // namespace tandem::policy
