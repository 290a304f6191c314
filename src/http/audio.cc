// Transcription uploads and transcripts (audio.h).
#include "http/audio.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>

#include "http/multipart.h"

namespace tandem::http {

using nlohmann::json;

ApiResult<TranscriptionCall> parse_transcription(std::string_view content_type, std::string_view body, bool translate) {
  auto boundary = multipart_boundary(content_type);
  if (!boundary.ok()) return invalid_field("", boundary.error().message);
  auto parts = parse_multipart(body, *boundary);
  if (!parts.ok()) return invalid_field("", "the multipart body is malformed: " + parts.error().message);
  TranscriptionCall c;
  c.translate = translate;
  std::set<std::string> seen;
  bool have_file = false;
  for (const auto& p : *parts) {
    const std::string& n = p.name;
    const std::string v(p.data);
    const bool repeatable = n == "timestamp_granularities[]" || n == "include[]";
    if (!repeatable && !seen.insert(n).second) return invalid_field(n, "given twice");
    if (n == "file") {
      if (v.empty()) return invalid_field("file", "the uploaded file is empty");
      c.audio.assign(p.data.begin(), p.data.end());
      c.filename = p.filename.value_or("");
      have_file = true;
    } else if (n == "model") {
      if (v.empty()) return invalid_field("model", "must not be empty");
      c.model = v;
    } else if (n == "language" && !translate) {
      if (!v.empty()) c.options.language = v;
    } else if (n == "prompt") {
      if (!v.empty()) c.options.initial_prompt = v;
    } else if (n == "response_format") {
      if (v == "json") c.format = TranscriptFormat::json;
      else if (v == "text") c.format = TranscriptFormat::text;
      else if (v == "srt") c.format = TranscriptFormat::srt;
      else if (v == "vtt") c.format = TranscriptFormat::vtt;
      else if (v == "verbose_json") c.format = TranscriptFormat::verbose_json;
      else return invalid_field("response_format", "expected json, text, srt, vtt or verbose_json");
    } else if (n == "temperature") {
      char* end = nullptr;
      const double t = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !std::isfinite(t) || t < 0 || t > 1)
        return invalid_field("temperature", "expected a number from 0 to 1");
      c.options.temperature = t;
    } else if (n == "timestamp_granularities[]") {
      if (v != "segment") return unsupported_field("timestamp_granularities[]", "'" + v + "' (Tandem gives segment timestamps)");
    } else if (n == "stream" && !translate) {
      if (v == "true") c.stream = true;
      else if (v != "false") return invalid_field("stream", "expected true or false");
    } else if (n == "tandem.seed") {  // Tandem's extensions (docs/http.md): the sampler's seed and Whisper's decoding rules
      char* end = nullptr;
      errno = 0;
      const unsigned long long num = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || errno == ERANGE || v.find_first_not_of("0123456789") != std::string::npos)
        return invalid_field(n, "expected a non-negative integer");
      c.options.seed = num;
    } else if (n == "tandem.temperature_fallback" || n == "tandem.timestamps") {
      if (v != "true" && v != "false") return invalid_field(n, "expected true or false");
      (n == "tandem.timestamps" ? c.options.timestamps : c.options.temperature_fallback) = v == "true";
    } else if (n == "chunking_strategy" || n == "include[]" || n == "known_speaker_names[]" || n == "known_speaker_references[]") {
      return unsupported_field(n);
    } else {
      ApiError e = invalid_field(n, "unknown field (Tandem refuses what it does not know rather than ignore it)");
      e.code = "unknown_parameter";
      return e;
    }
  }
  if (!have_file) return invalid_field("file", "missing (upload the audio as the multipart part 'file')");
  if (c.model.empty()) return invalid_field("model", "missing");
  if (translate) c.options.translate = true;
  return c;
}

client::TranscriptSegment segment_from_update(const client::JobUpdate& u) {
  client::TranscriptSegment s;
  s.index = u.index.value_or(0);
  s.start = static_cast<double>(u.start_ms.value_or(0)) / 1000.0;
  s.end = static_cast<double>(u.end_ms.value_or(0)) / 1000.0;
  s.text = u.text.value_or("");
  s.avg_logprob = u.avg_logprob.value_or(0);
  s.no_speech_prob = u.no_speech_prob.value_or(0);
  s.temperature = u.temperature.value_or(0);
  return s;
}

json transcript_delta(const client::TranscriptSegment& s) {
  return {{"type", "transcript.text.delta"},
          {"delta", s.text},
          {"segment", {{"id", s.index}, {"start", s.start}, {"end", s.end}, {"text", s.text}}}};
}

json transcript_done(const std::string& text, const json& tandem) {
  return {{"type", "transcript.text.done"}, {"text", text}, {"tandem", tandem}};
}

TranscriptBody transcript_body(const TranscriptionCall& call, const std::string& text,
                               const std::vector<client::TranscriptSegment>& segments, const client::JobInfo& job,
                               const json& tandem) {
  switch (call.format) {
    case TranscriptFormat::text: return {"text/plain; charset=utf-8", text + "\n"};
    case TranscriptFormat::srt: return {"application/x-subrip", client::segments_to_srt(segments)};
    case TranscriptFormat::vtt: return {"text/vtt", client::segments_to_vtt(segments)};
    case TranscriptFormat::json: return {"application/json", json{{"text", text}, {"tandem", tandem}}.dump()};
    case TranscriptFormat::verbose_json: {
      json segs = json::array();
      for (const auto& s : segments)
        segs.push_back({{"id", s.index}, {"seek", 0}, {"start", s.start}, {"end", s.end}, {"text", s.text},
                        {"tokens", json::array()}, {"temperature", s.temperature}, {"avg_logprob", s.avg_logprob},
                        {"no_speech_prob", s.no_speech_prob}});
      json j = {{"task", call.translate ? "translate" : "transcribe"}, {"text", text}, {"segments", std::move(segs)},
                {"tandem", tandem}};
      if (job.language) j["language"] = *job.language;
      if (job.audio_ms) j["duration"] = static_cast<double>(*job.audio_ms) / 1000.0;
      return {"application/json", j.dump()};
    }
  }
  return {"application/json", "{}"};
}

}  // namespace tandem::http
