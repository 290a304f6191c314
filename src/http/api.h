// The HTTP gateway's pure half (docs/http.md): typed API errors in each API's own shape, the strict JSON field reader
// every request parser uses, and the mapping of tandemd's D-Bus errors onto honest HTTP status codes. No sockets, no
// D-Bus, no Beast here: everything below is testable with strings (tests/http/test_http_api.cc) and fuzzed
// (tests/http/fuzz_http_request.cc).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "client/format.h"

namespace tandem::client {
struct RemoteError;
}

namespace tandem::http {

// Which API a response is shaped for.
enum class Flavor { openai, ollama, tandem };

// An error answered to an HTTP client. `status` is the HTTP status; the rest fills the body in the flavor's shape
// (OpenAI: {"error":{"message","type","param","code"}}; Ollama: {"error":"message"}).
struct ApiError {
  ApiError() = default;
  ApiError(int status_, std::string type_, std::string code_, std::string param_, std::string message_,
           std::optional<std::uint64_t> retry_after_ms_ = std::nullopt, std::optional<std::uint64_t> job_ = std::nullopt)
      : status(status_), type(std::move(type_)), code(std::move(code_)), param(std::move(param_)),
        message(std::move(message_)), retry_after_ms(retry_after_ms_), job(job_) {}
  int status = 500;
  std::string type;     // OpenAI's error type: invalid_request_error, not_found_error, ...
  std::string code;     // a short machine-readable code: unsupported_parameter, model_not_found, queue_full, ...
  std::string param;    // the request field at fault ("" = none)
  std::string message;  // for a person
  std::optional<std::uint64_t> retry_after_ms;  // 429/503: also the Retry-After header (seconds, rounded up)
  std::optional<std::uint64_t> job;             // a resumable failure: the job to resume
};

// 400 invalid_request_error naming the field.
ApiError invalid_field(std::string param, std::string message);
// 400 for a field Tandem does not implement (never silently ignored): code "unsupported_parameter".
ApiError unsupported_field(std::string param, std::string why = {});
// 404 for a model tandemd does not serve; `known` is listed in the message.
ApiError unknown_model(const std::string& name, const std::vector<std::string>& known);
// tandemd's error reply (io.tandem.Tandem1.Error.*, or the bus saying it is not there) -> status, type and code.
ApiError error_from_remote(const client::RemoteError& e);

// The body for `e` in the flavor's shape. Tandem's facts (retry_after_ms, job, resume) ride in a "tandem" member
// for every flavor, which the official clients ignore.
nlohmann::json error_json(const ApiError& e, Flavor flavor);
// Retry-After (RFC 9110: delay-seconds): whole seconds, rounded up, at least 1.
std::string retry_after_seconds(std::uint64_t ms);
// The path that resumes a job (POST): "/tandem/v1/jobs/N/resume".
std::string resume_path(std::uint64_t job);

// A value or the error that stopped it.
template <class T>
struct ApiResult {
  std::optional<T> value;
  std::optional<ApiError> error;
  ApiResult(T v) : value(std::move(v)) {}  // NOLINT(google-explicit-constructor)
  ApiResult(ApiError e) : error(std::move(e)) {}  // NOLINT(google-explicit-constructor)
  bool ok() const { return value.has_value(); }
  T& operator*() { return *value; }
  const T& operator*() const { return *value; }
  T* operator->() { return &*value; }
  const T* operator->() const { return &*value; }
};

// Limits on what a request body may hold (beyond the byte limits the server enforces before parsing).
struct BodyLimits {
  int max_json_depth = 32;
  std::size_t max_messages = 1024;
  std::size_t max_inputs = 2048;  // embeddings inputs per request
  std::size_t max_stop = 4;       // stop sequences (OpenAI's own limit)
  std::size_t max_stop_bytes = 256;
};

// A request body as one JSON object: strict UTF-8, bounded nesting, an object at the top. Errors are 400s that say
// what is wrong ("the body is not valid JSON: ... at byte N").
ApiResult<nlohmann::json> parse_json_object(std::string_view body, const BodyLimits& limits = {});

// Reads an object's members by name, each once, with types checked; every member that was not read when finish()
// is called is an error naming it: "unsupported" for members known to the API that Tandem does not implement,
// "unknown" for the rest. JSON null reads as absent (clients send null for unset optionals). The first error wins
// and later reads are no-ops.
class FieldReader {
 public:
  // `where` prefixes field names in errors ("" at the top level, "stream_options." inside a member).
  FieldReader(const nlohmann::json& object, std::string where = {});

  const nlohmann::json* take(const char* key);  // marks it read; nullptr when absent or null
  std::optional<std::string> str(const char* key, bool allow_empty = true);
  std::optional<bool> boolean(const char* key);
  std::optional<double> number(const char* key, double lo, double hi);
  std::optional<std::uint64_t> uint(const char* key, std::uint64_t lo, std::uint64_t hi);
  // A string or an array of strings (OpenAI's `stop`), at most `max` of at most `max_bytes` each, none empty.
  std::optional<std::vector<std::string>> str_or_list(const char* key, std::size_t max, std::size_t max_bytes);
  // A member Tandem accepts only at one value (e.g. n = 1, logprobs = false): any other value is unsupported.
  void only(const char* key, const nlohmann::json& allowed, const char* why);
  // Marks a member read without looking at it (it is documented as accepted and without effect).
  void ignore(const char* key);

  void fail(ApiError e);
  bool failed() const { return error_.has_value(); }
  // Members left unread -> the error (unsupported when in `known_unsupported`).
  std::optional<ApiError> finish(const std::set<std::string>& known_unsupported);
  const std::string& where() const { return where_; }

 private:
  std::string name(const char* key) const { return where_ + key; }
  const nlohmann::json& obj_;
  std::string where_;
  std::set<std::string> read_;
  std::optional<ApiError> error_;
};

}  // namespace tandem::http
