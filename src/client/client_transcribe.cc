// Client::transcribe (io.tandem.Tandem1.Transcribe) and the transcript formats (SRT, WebVTT) tandemctl writes.
#include <cmath>
#include <cstdio>
#include <utility>

#include <nlohmann/json.hpp>

#include "client/client_impl.h"

namespace tandem::client {

namespace {

// A change of Transcribe's signature in the XML breaks the build here.
static_assert(std::is_same_v<decltype(std::declval<io::tandem::Tandem1_proxy&>().Transcribe(
                                 std::string{}, std::vector<sdbus::UnixFd>{}, std::vector<std::uint8_t>{},
                                 VariantMap{})),
                             std::tuple<std::uint64_t, VariantMap>>,
              "io.tandem.Tandem1.Transcribe changed: update Client::transcribe");

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

VariantMap to_dbus(const TranscribeOptions& o) {
  VariantMap m;
  if (o.language) m["language"] = sdbus::Variant(*o.language);
  if (o.translate) m["translate"] = sdbus::Variant(*o.translate);
  if (o.timestamps) m["timestamps"] = sdbus::Variant(*o.timestamps);
  if (o.temperature) m["temperature"] = sdbus::Variant(*o.temperature);
  if (o.temperature_fallback) m["temperature_fallback"] = sdbus::Variant(*o.temperature_fallback);
  if (o.seed) m["seed"] = sdbus::Variant(*o.seed);
  if (o.initial_prompt) m["initial_prompt"] = sdbus::Variant(*o.initial_prompt);
  if (o.condition_on_previous_text) m["condition_on_previous_text"] = sdbus::Variant(*o.condition_on_previous_text);
  if (o.idempotency_key) m["idempotency_key"] = sdbus::Variant(*o.idempotency_key);
  if (o.allow_cpu) m["allow_cpu"] = sdbus::Variant(*o.allow_cpu);
  if (o.deadline_ms) m["deadline_ms"] = sdbus::Variant(*o.deadline_ms);
  return m;
}

Result<SubmitResult> Client::transcribe(const TranscribeRequest& r) {
  if (r.stream)
    return fail(Errc::invalid_argument, "Transcribe: a live stream goes through a ring session (RingSession::transcribe)");
  if ((r.audio_fd >= 0) == !r.audio.empty())
    return fail(Errc::invalid_argument, "Transcribe: give an audio fd or the audio bytes (exactly one)");
  return impl_->guarded<SubmitResult>("Transcribe", [&] {
    std::vector<sdbus::UnixFd> fds;
    if (r.audio_fd >= 0) fds.emplace_back(r.audio_fd);  // dups: the caller keeps its own
    auto [id, placement] = impl_->methods->Transcribe(r.model, fds, r.audio, to_dbus(r.options));
    return SubmitResult{id, placement_from_dbus(placement)};
  });
}

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

}  // namespace tandem::client
