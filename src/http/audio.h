// POST /v1/audio/transcriptions and /v1/audio/translations (docs/http.md): the multipart upload -> a Transcribe
// request, and the transcript in OpenAI's response formats (json, text, srt, vtt, verbose_json) or as SSE events
// (transcript.text.delta per segment, transcript.text.done). Pure.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "client/requests.h"
#include "http/api.h"

namespace tandem::http {

enum class TranscriptFormat { json, text, srt, vtt, verbose_json };

struct TranscriptionCall {
  std::string model;
  std::string filename;
  std::vector<std::uint8_t> audio;  // the file as uploaded (tandemd decodes and validates it)
  TranscriptFormat format = TranscriptFormat::json;
  bool stream = false;
  bool translate = false;
  client::TranscribeOptions options;  // language, temperature, initial_prompt (OpenAI's "prompt")
};

// `content_type` is the request's Content-Type header (it carries the boundary). Errors are 400s naming the field
// (or the part of the multipart body that is malformed).
ApiResult<TranscriptionCall> parse_transcription(std::string_view content_type, std::string_view body, bool translate);

// The finished transcript as the response_format asks: the body and its Content-Type. `tandem` goes into the JSON
// formats as the "tandem" member (text, srt and vtt carry Tandem's state in the headers only).
struct TranscriptBody {
  std::string content_type;
  std::string body;
};
TranscriptBody transcript_body(const TranscriptionCall& call, const std::string& text,
                               const std::vector<client::TranscriptSegment>& segments, const client::JobInfo& job,
                               const nlohmann::json& tandem);
// Streamed: one event per segment as its window finishes, then the whole text.
nlohmann::json transcript_delta(const client::TranscriptSegment& s);
nlohmann::json transcript_done(const std::string& text, const nlohmann::json& tandem);
// A JobUpdate "segment" -> the segment it carries.
client::TranscriptSegment segment_from_update(const client::JobUpdate& u);

}  // namespace tandem::http
