// tandemctl's shared pieces (tandemctl_common.h).
#include "tandemctl_common.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "cli_args.h"
#include "client/client.h"
#include "client/ring_session.h"
#include "client/format.h"

namespace tandemctl {

std::int64_t now_unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void out_json(const json& j) {
  std::string s = dump(j);
  s += '\n';
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

// {"event": name, ...rest}
json with_event(const char* name, const json& rest) {
  json j = {{"event", name}};
  j.update(rest);
  return j;
}

void out_text(std::string_view s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

void err_line(std::string_view s) {
  std::string l(s);
  if (l.empty() || l.back() != '\n') l += '\n';
  std::fwrite(l.data(), 1, l.size(), stderr);
  std::fflush(stderr);
}

// A usage error: message on stderr, exit 1.
int usage_error(const std::string& msg) {
  err_line("tandemctl: " + msg);
  err_line("Try 'tandemctl --help'.");
  return kUsage;
}

json error_json(const tandem::Error& e, const std::optional<tc::RemoteError>& re) {
  json j = {{"code", std::string(tandem::errc_name(e.code))}, {"message", e.message}};
  if (re) {
    j["name"] = re->name;
    if (re->retry_after_ms) j["retry_after_ms"] = *re->retry_after_ms;
    if (re->job) j["job"] = *re->job;
    if (re->tokens) j["tokens"] = *re->tokens;
    if (!re->facts.empty()) j["facts"] = re->facts;
  }
  return j;
}

// A bus/daemon error: message on stderr (and a JSON document on stdout with --json), exit 4.
int bus_error(const Global& g, const tandem::Error& e, const std::optional<tc::RemoteError>& re) {
  err_line("tandemctl: " + e.message);
  if (re && re->retry_after_ms && re->name.ends_with(".Resumable") == false)
    err_line("tandemctl: the daemon suggests retrying in " + tc::format_duration_ms(*re->retry_after_ms));
  if (g.json) out_json({{"event", "error"}, {"error", error_json(e, re)}});
  return kBusError;
}

std::uint64_t parse_u64(const std::string& flag, const std::string& v) {
  return tandem::cli::parse_number<std::uint64_t>(flag, v, 0, UINT64_MAX);
}

std::uint64_t parse_job_id(const std::string& v) {
  return tandem::cli::parse_number<std::uint64_t>("JOB", v, 0, UINT64_MAX);
}

double parse_double(const std::string& flag, const std::string& v, double lo, double hi) {
  double d = 0;
  auto r = std::from_chars(v.data(), v.data() + v.size(), d);
  if (v.empty() || r.ec != std::errc{} || r.ptr != v.data() + v.size() || !std::isfinite(d))
    throw ArgError{flag + ": '" + v + "' is not a number"};
  if (d < lo || d > hi) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "%s: %s is outside [%g, %g]", flag.c_str(), v.c_str(), lo, hi);
    throw ArgError{buf};
  }
  return d;
}

std::uint64_t parse_size_arg(const std::string& flag, const std::string& v) {
  auto r = tc::parse_size(v);
  if (!r.ok()) throw ArgError{flag + ": " + r.error().message};
  return *r;
}

std::uint64_t parse_ms_arg(const std::string& flag, const std::string& v) {
  auto r = tc::parse_duration_ms(v);
  if (!r.ok()) throw ArgError{flag + ": " + r.error().message};
  return *r;
}

// Plain numbers are seconds here ("--timeout 30"); "500ms", "2min" work too.
std::uint64_t parse_seconds_arg(const std::string& flag, const std::string& v) {
  bool plain = !v.empty() && v.find_first_not_of("0123456789.") == std::string::npos;
  if (plain) {
    double s = parse_double(flag, v, 0.0, 1e9);
    return static_cast<std::uint64_t>(s * 1000.0 + 0.5);
  }
  return parse_ms_arg(flag, v);
}

std::string read_stdin() {
  std::string s{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  return s;
}

std::unique_ptr<tc::Client> open_client(const Global& g, int& exit_code) {
  auto c = tc::Client::connect(g.bus, g.service);
  if (!c.ok()) {
    exit_code = bus_error(g, c.error());
    return nullptr;
  }
  return std::move(c).value();
}

// Replies may grow new keys (docs/dbus.md, compatibility): unknown ones are ignored, and listed only with
// TANDEMCTL_STRICT=1 (contract checks, e.g. tandem-validate).
void note_unparsed(const std::string& what, const tc::Unparsed& u) {
  if (u.empty()) return;
  if (const char* s = std::getenv("TANDEMCTL_STRICT"); !s || std::string(s) != "1") return;
  std::string t;
  for (const auto& [k, why] : u) t += (t.empty() ? "" : ", ") + k + " (" + why + ")";
  err_line("tandemctl: note: " + what + " has keys this tandemctl does not understand: " + t);
}

}  // namespace tandemctl
