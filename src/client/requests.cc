// The transcript views of requests.h: segments_json parsing and the SRT / WebVTT renderings (pure).
#include <algorithm>
#include <cmath>
#include <charconv>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <map>

#include <nlohmann/json.hpp>

#include "client/requests.h"

namespace tandem::client {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

bool is_fact_key(std::string_view k) {
  if (k.empty()) return false;
  for (char c : k)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return !std::isdigit(static_cast<unsigned char>(k.front()));
}

std::optional<std::uint64_t> parse_u64(std::string_view s) {
  std::uint64_t v = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || r.ec != std::errc{} || r.ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// HH:MM:SS<sep>mmm, rounded to the millisecond.
std::string clock_text(double seconds, char sep) {
  const auto ms = static_cast<long long>(std::llround(std::max(0.0, seconds) * 1000.0));
  char buf[48];
  std::snprintf(buf, sizeof buf, "%02lld:%02lld:%02lld%c%03lld", ms / 3600000, (ms / 60000) % 60, (ms / 1000) % 60,
                sep, ms % 1000);
  return buf;
}

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\n");
  if (b == std::string::npos) return {};
  const auto e = s.find_last_not_of(" \t\n");
  return s.substr(b, e - b + 1);
}

}  // namespace

Result<std::vector<TranscriptSegment>> segments_from_json(std::string_view text) {
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return fail(Errc::parse_error, "segments_json is not JSON");
  if (!j.is_array()) return fail(Errc::format_error, "segments_json is not an array");
  std::vector<TranscriptSegment> out;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const auto& e = j[i];
    auto bad = [&](const char* key) {
      return fail(Errc::format_error, "segments_json[" + std::to_string(i) + "]." + key + " is missing or mistyped");
    };
    if (!e.is_object()) return fail(Errc::format_error, "segments_json[" + std::to_string(i) + "] is not an object");
    TranscriptSegment s;
    s.index = static_cast<std::uint32_t>(i);
    if (!e.contains("start") || !e["start"].is_number()) return bad("start");
    if (!e.contains("end") || !e["end"].is_number()) return bad("end");
    if (!e.contains("text") || !e["text"].is_string()) return bad("text");
    s.start = e["start"].get<double>();
    s.end = e["end"].get<double>();
    s.text = e["text"].get<std::string>();
    if (!std::isfinite(s.start) || !std::isfinite(s.end) || s.start < 0 || s.end < s.start) return bad("end");
    if (e.contains("avg_logprob") && e["avg_logprob"].is_number()) s.avg_logprob = e["avg_logprob"].get<double>();
    if (e.contains("no_speech_prob") && e["no_speech_prob"].is_number())
      s.no_speech_prob = e["no_speech_prob"].get<double>();
    if (e.contains("temperature") && e["temperature"].is_number()) s.temperature = e["temperature"].get<double>();
    out.push_back(std::move(s));
  }
  return out;
}

std::string segments_to_srt(const std::vector<TranscriptSegment>& segs) {
  std::string out;
  int n = 0;
  for (const auto& s : segs) {
    const std::string t = trimmed(s.text);
    if (t.empty()) continue;
    out += std::to_string(++n) + "\n" + clock_text(s.start, ',') + " --> " + clock_text(s.end, ',') + "\n" + t + "\n\n";
  }
  return out;
}

std::string segments_to_vtt(const std::vector<TranscriptSegment>& segs) {
  std::string out = "WEBVTT\n\n";
  for (const auto& s : segs) {
    const std::string t = trimmed(s.text);
    if (t.empty()) continue;
    out += clock_text(s.start, '.') + " --> " + clock_text(s.end, '.') + "\n" + t + "\n\n";
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Errors

std::string RemoteError::short_name() const {
  if (is_tandem()) return name.substr(std::strlen(kErrorPrefix));
  return name;
}

bool RemoteError::is_tandem() const { return name.starts_with(kErrorPrefix); }

bool RemoteError::daemon_missing() const {
  return name == "org.freedesktop.DBus.Error.ServiceUnknown" || name == "org.freedesktop.DBus.Error.NameHasNoOwner" ||
         name == "org.freedesktop.DBus.Error.Disconnected" || name == "org.freedesktop.DBus.Error.NoServer" ||
         name == "System.Error.ECONNRESET" || name == "System.Error.ENOTCONN";
}

std::string RemoteError::describe() const {
  std::string t = short_name();
  if (!message.empty()) t += ": " + message;
  if (retry_after_ms) t += " (retry after " + format_duration_ms(*retry_after_ms) + ")";
  return t;
}

RemoteError parse_remote_error(std::string_view name, std::string_view message) {
  RemoteError e;
  e.name = std::string(name);
  std::string_view rest = message;
  // Peel "; key=value" pairs off the end.
  while (true) {
    auto semi = rest.rfind(';');
    if (semi == std::string_view::npos) {
      // The whole message may be facts only ("retry_after_ms=5").
      std::string_view seg = trim(rest);
      auto eq = seg.find('=');
      if (eq != std::string_view::npos && is_fact_key(seg.substr(0, eq)) && seg.find(' ') == std::string_view::npos) {
        e.facts.emplace(std::string(seg.substr(0, eq)), std::string(seg.substr(eq + 1)));
        rest = {};
      }
      break;
    }
    std::string_view seg = trim(rest.substr(semi + 1));
    auto eq = seg.find('=');
    if (eq == std::string_view::npos || !is_fact_key(seg.substr(0, eq))) break;
    e.facts.emplace(std::string(seg.substr(0, eq)), std::string(trim(seg.substr(eq + 1))));
    rest = rest.substr(0, semi);
  }
  e.message = std::string(trim(rest));
  auto num = [&](const char* key) -> std::optional<std::uint64_t> {
    auto it = e.facts.find(key);
    if (it == e.facts.end()) return std::nullopt;
    return parse_u64(it->second);
  };
  e.retry_after_ms = num("retry_after_ms");
  e.job = num("job");
  e.tokens = num("tokens");
  return e;
}

Errc errc_for_error_name(std::string_view name) {
  static const std::map<std::string_view, Errc> tandem = {
      {"InvalidArgument", Errc::invalid_argument},
      {"NotAuthorized", Errc::rejected},
      {"UnknownJob", Errc::not_found},
      {"UnknownModel", Errc::not_found},
      {"Busy", Errc::rejected},
      {"QueueFull", Errc::queue_full},
      {"HostMemory", Errc::host_memory},
      {"Resumable", Errc::rejected},
      {"Incompatible", Errc::incompatible},
      {"Duplicate", Errc::duplicate},
      {"IllegalState", Errc::illegal_transition},
      {"Unavailable", Errc::rejected},
      {"NotSupported", Errc::unsupported},
      {"Timeout", Errc::timeout},
      {"Internal", Errc::internal},
  };
  static const std::map<std::string_view, Errc> bus = {
      {"org.freedesktop.DBus.Error.ServiceUnknown", Errc::io_error},
      {"org.freedesktop.DBus.Error.NameHasNoOwner", Errc::io_error},
      {"org.freedesktop.DBus.Error.Disconnected", Errc::io_error},
      {"org.freedesktop.DBus.Error.NoServer", Errc::io_error},
      {"org.freedesktop.DBus.Error.FileNotFound", Errc::io_error},
      {"org.freedesktop.DBus.Error.NoReply", Errc::timeout},
      {"org.freedesktop.DBus.Error.Timeout", Errc::timeout},
      {"org.freedesktop.DBus.Error.TimedOut", Errc::timeout},
      {"org.freedesktop.DBus.Error.AccessDenied", Errc::rejected},
      {"org.freedesktop.DBus.Error.AuthFailed", Errc::rejected},
      {"org.freedesktop.DBus.Error.InteractiveAuthorizationRequired", Errc::rejected},
      {"org.freedesktop.DBus.Error.InvalidArgs", Errc::invalid_argument},
      {"org.freedesktop.DBus.Error.UnknownMethod", Errc::unsupported},
      {"org.freedesktop.DBus.Error.UnknownInterface", Errc::unsupported},
      {"org.freedesktop.DBus.Error.UnknownObject", Errc::unsupported},
      {"org.freedesktop.DBus.Error.UnknownProperty", Errc::unsupported},
      {"org.freedesktop.DBus.Error.PropertyReadOnly", Errc::unsupported},
      {"org.freedesktop.DBus.Error.NotSupported", Errc::unsupported},
      {"org.freedesktop.DBus.Error.NoMemory", Errc::out_of_memory},
      {"org.freedesktop.DBus.Error.LimitsExceeded", Errc::rejected},
  };
  if (name.starts_with(kErrorPrefix)) {
    auto it = tandem.find(name.substr(std::strlen(kErrorPrefix)));
    return it == tandem.end() ? Errc::internal : it->second;
  }
  auto it = bus.find(name);
  if (it != bus.end()) return it->second;
  if (name.starts_with("System.Error.")) return Errc::io_error;
  return Errc::internal;
}

Error to_error(const RemoteError& e) { return Error{errc_for_error_name(e.name), e.describe()}; }

}  // namespace tandem::client
