// What the gateway answers (docs/http.md "Responses"): a job's view as tandemd reports it (JobView: placement, route
// changes, degraded mode, text, usage), Tandem's state as headers and as a "tandem" JSON object, and the OpenAI and
// Ollama body/chunk shapes. Pure: views in, JSON and strings out.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "client/format.h"
#include "client/requests.h"
#include "http/api.h"
#include "http/requests.h"

namespace tandem::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

// One job as the gateway follows it: the placement, then JobUpdates and DegradedModeChanged signals.
class JobView {
 public:
  void accepted(const client::SubmitResult& s);
  // Returns true when what a client is told about the job changed (route, degraded, fallback model, reason):
  // streams announce it before the next token.
  bool update(const client::JobUpdate& u);
  bool degraded_change(const client::DegradedChange& d);

  std::uint64_t job() const { return job_; }
  const std::string& route() const { return route_; }
  bool degraded() const { return degraded_; }
  const std::string& model() const { return model_; }
  bool finished() const { return finished_; }
  const std::string& state() const { return state_; }
  const std::string& finish_reason() const { return finish_reason_; }
  const std::string& text() const { return text_; }  // everything delivered so far (the final text once finished)
  std::uint32_t completion_tokens() const { return completion_tokens_; }
  std::optional<std::uint32_t> prompt_tokens() const { return prompt_tokens_; }
  // The text a stream has not sent yet, and marks it sent.
  std::string take_unsent();
  // A failed or cancelled job as an API error. resumable: the error carries the job and its resume path (generation);
  // otherwise (a transcription, which tandemd does not resume) it says to send the request again.
  ApiError failure(bool resumable = true) const;

  // Tandem-Route, Tandem-Degraded (when degraded), Tandem-Queue-Position, Tandem-ETA-Ms, Tandem-Job,
  // Tandem-Model (the model actually used).
  Headers headers() const;
  // {"job","route","degraded","reason" (the placement's),"degraded_reason" (the service's),"expected_slowdown","model","fallback_model","queue","queue_position",
  //  "eta_ms","routes"}: the same facts as the headers, plus the route history.
  nlohmann::json tandem_json() const;

 private:
  std::uint64_t job_ = 0;
  std::string degraded_reason_;  // the service's DegradedReason while it is degraded
  std::string route_, queue_, reason_, model_, state_, finish_reason_, error_code_, error_message_;
  std::vector<std::string> routes_;
  bool degraded_ = false, fallback_ = false, finished_ = false;
  std::optional<double> slowdown_;
  std::uint32_t queue_position_ = 0;
  std::uint64_t eta_ms_ = 0;
  std::optional<std::uint64_t> retry_after_ms_;
  std::optional<std::uint32_t> prompt_tokens_;
  std::uint32_t completion_tokens_ = 0;
  std::string text_;
  std::size_t sent_ = 0;
};

// tandemd's finish_reason -> OpenAI's ("stop" for eos/stop_string, "length" for max_tokens/context_full).
std::string openai_finish_reason(const std::string& tandem_reason);

// The identity of one response: "chatcmpl-<job>" / "cmpl-<job>", created (unix seconds), the model as named.
struct ResponseMeta {
  Api api = Api::openai_chat;
  std::string id;
  std::int64_t created = 0;
  std::string model;
  std::int64_t started_unix_ns = 0;  // Ollama's durations
  std::int64_t first_token_unix_ns = 0;
};

// Non-streamed bodies.
nlohmann::json completion_body(const ResponseMeta& m, const JobView& v);
// One streamed chunk with `text` (OpenAI: a chat.completion.chunk / text_completion delta; Ollama: an NDJSON
// object with done false). `first` adds the assistant role to an OpenAI chat delta.
nlohmann::json stream_chunk(const ResponseMeta& m, const std::string& text, bool first);
// The last chunk: OpenAI: empty delta with finish_reason; Ollama: done true with the counts and durations.
nlohmann::json stream_final(const ResponseMeta& m, const JobView& v, std::int64_t now_unix_ns);
// OpenAI's usage chunk (stream_options.include_usage): choices [] and usage.
nlohmann::json usage_chunk(const ResponseMeta& m, const JobView& v);
nlohmann::json usage_json(const JobView& v);

// Server-sent events: "data: <json>\n\n", a comment line ": tandem <json>\n\n" (ignored by SSE parsers: the
// OpenAI SDKs never see it), and the terminator "data: [DONE]\n\n".
std::string sse_data(const nlohmann::json& j);
std::string sse_comment(const nlohmann::json& j);
inline std::string sse_done() { return "data: [DONE]\n\n"; }
// NDJSON: one object per line.
inline std::string ndjson(const nlohmann::json& j) { return j.dump() + "\n"; }

// Embeddings: the reply's vectors (in the request's order) in each API's shape.
struct EmbedResult {
  std::vector<std::vector<float>> vectors;  // request order
  client::EmbedInfo info;
};
// OpenAI: {"object":"list","data":[{"object":"embedding","index","embedding"}],"model","usage","tandem"}; vectors
// as float arrays or base64 of little-endian float32. Ollama embed: {"model","embeddings",...}; legacy:
// {"embedding"}. `dimensions` cuts and re-normalises (Matryoshka) when it is below the model's width.
nlohmann::json embed_body(const EmbedCall& call, const EmbedResult& r, std::uint64_t total_ns);
// Tandem's facts about an embedding job, as headers and as the "tandem" member.
Headers embed_headers(const client::EmbedInfo& info);
nlohmann::json embed_tandem_json(const client::EmbedInfo& info);

// RFC 3339 UTC with nanoseconds, as Ollama writes created_at ("2026-12-05T10:00:00.123456789Z").
std::string rfc3339_ns(std::int64_t unix_ns);

}  // namespace tandem::http
