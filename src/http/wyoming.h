// The Wyoming protocol (Home Assistant's voice pipeline, docs/http.md "Wyoming"): events framed as one JSON header
// line {"type","data","data_length","payload_length"}\n, then data_length bytes of extra JSON data (merged over
// "data"), then payload_length bytes of binary payload (PCM for audio-chunk). Pure: an incremental reader with
// limits and typed errors, the writer, and the speech-to-text session's state machine (describe -> info;
// transcribe + audio-start / audio-chunk / audio-stop -> transcript-chunk per segment, then transcript). Fuzzed by
// tests/http/fuzz_http_request.cc.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "client/format.h"
#include "client/requests.h"
#include "core/result.h"

namespace tandem::http {

struct WyomingEvent {
  std::string type;
  nlohmann::json data = nlohmann::json::object();
  std::string payload;
};

struct WyomingLimits {
  std::size_t max_header_bytes = 64 * 1024;   // the JSON header line
  std::size_t max_data_bytes = 64 * 1024;     // extra data
  std::size_t max_payload_bytes = 1u << 20;   // one audio chunk
};

// Feed bytes as they arrive; next() returns complete events in order. An error (invalid_argument: a header line over
// the limit or without its newline in time, not JSON, not an object, no type, lengths over the limits, data that is
// not a JSON object) is final: the connection is to be answered with an error event and closed.
class WyomingReader {
 public:
  explicit WyomingReader(WyomingLimits limits = {}) : limits_(limits) {}
  Result<void> feed(std::string_view bytes);
  // The next complete event, nullopt when more bytes are needed.
  Result<std::optional<WyomingEvent>> next();

 private:
  WyomingLimits limits_;
  std::string buf_;
  std::size_t pos_ = 0;
};

std::string wyoming_encode(const WyomingEvent& e);

// What the session wants done; the connection carries it out.
struct WyomingAction {
  enum class Kind {
    send,          // send `event`
    start_stream,  // transcribe `request` (a live stream: its format is set) on the model `request.model`
    audio,         // append `pcm` (at the stream's next offset) to the job; `end` closes the stream
    close,         // send `event` (an error) and close the connection
    describe,      // answer describe: the caller builds "info" from tandemd's models (wyoming_info)
  };
  Kind kind = Kind::send;
  WyomingEvent event;
  client::TranscribeRequest request;
  std::string pcm;
  bool end = false;
};

// One connection's speech-to-text session. Audio before audio-start, a second audio-start, a width other than
// 16-bit, rates or channels out of range or changing mid-stream, unknown event types that need an answer: an error
// event and close. Nothing else is disturbed (every session is its own).
class WyomingSession {
 public:
  std::vector<WyomingAction> on_event(const WyomingEvent& e);
  // tandemd's side: a segment of the job (-> transcript-chunk), the end (-> transcript), a failure (-> error).
  std::vector<WyomingAction> on_segment(const std::string& text);
  std::vector<WyomingAction> on_finished(const std::string& text, const std::string& language);
  std::vector<WyomingAction> on_failed(const std::string& message, const std::string& code);
  bool streaming() const { return state_ == State::streaming || state_ == State::stopped; }

 private:
  enum class State { idle, armed, streaming, stopped };
  State state_ = State::idle;
  std::string model_, language_;
  nlohmann::json context_ = nlohmann::json::object();
  std::uint32_t rate_ = 0, channels_ = 0;
  bool sent_start_ = false;
};

WyomingEvent wyoming_error(const std::string& text, const std::string& code);
// The "info" event: asr programs with Tandem's speech models (name, languages, installed).
WyomingEvent wyoming_info(const std::vector<client::ModelInfo>& models, const std::string& version);

}  // namespace tandem::http
