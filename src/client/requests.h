// The requests a client sends tandemd (Submit, Embed, Transcribe) and the transcript views, as plain values: no
// D-Bus here, so the HTTP gateway's request mapping (src/http) builds them without linking sdbus-c++. client.h
// converts them to a{sv} (to_dbus) and ring_session.h to ring records.
#pragma once

#include <chrono>
#include <map>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "client/format.h"
#include "core/result.h"

namespace tandem::client {

inline constexpr const char* kServiceName = "io.tandem.Tandem1";
inline constexpr const char* kObjectPath = "/io/tandem/Tandem1";
inline constexpr const char* kInterface = "io.tandem.Tandem1";
inline constexpr const char* kModelInterface = "io.tandem.Tandem1.Model";
inline constexpr const char* kTestingInterface = "io.tandem.Tandem1.Testing";
inline constexpr const char* kErrorPrefix = "io.tandem.Tandem1.Error.";

// ---------------------------------------------------------------------------------------------------------------
// Errors

// A D-Bus error reply, with the machine-readable facts from the end of the message ("...; retry_after_ms=500; job=7").
struct RemoteError {
  std::string name;     // full D-Bus error name, e.g. "io.tandem.Tandem1.Error.Busy"
  std::string message;  // the message without the trailing "; key=value" facts
  std::optional<std::uint64_t> retry_after_ms;
  std::optional<std::uint64_t> job;
  std::optional<std::uint64_t> tokens;
  std::map<std::string, std::string> facts;  // every trailing key=value pair (including the three above)

  // "Busy" for io.tandem.Tandem1.Error.Busy, else the full name.
  std::string short_name() const;
  // Tandem's own error (io.tandem.Tandem1.Error.*), as opposed to a bus or library error.
  bool is_tandem() const;
  // The daemon is not there: ServiceUnknown, NameHasNoOwner, NoReply after it vanished, Disconnected.
  bool daemon_missing() const;
  // "Busy: all GPU slots are taken (retry after 500 ms)".
  std::string describe() const;
};

RemoteError parse_remote_error(std::string_view name, std::string_view message);
// io.tandem.Tandem1.Error.* and the usual org.freedesktop.DBus.Error.* names -> Errc (unknown -> internal).
// There is no Errc for permissions: NotAuthorized / AccessDenied map to Errc::rejected.
Errc errc_for_error_name(std::string_view name);
Error to_error(const RemoteError& e);

// ---------------------------------------------------------------------------------------------------------------
// Requests

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

// Submit/Plan/Resume options; only the fields that are set are sent (the daemon applies its defaults otherwise).
struct SubmitOptions {
  std::optional<std::uint32_t> max_tokens;
  std::optional<double> temperature;
  std::optional<std::uint32_t> top_k;
  std::optional<double> top_p;
  std::optional<double> repetition_penalty;
  std::optional<std::uint64_t> seed;
  std::optional<std::vector<std::string>> stop;
  std::optional<std::string> idempotency_key;
  std::optional<bool> side_effects;
  std::optional<bool> allow_cpu;             // daemon default true
  std::optional<bool> allow_reduce;          // daemon default false
  std::optional<bool> allow_fallback_model;  // daemon default false
  std::optional<std::uint64_t> deadline_ms;
  std::optional<std::uint32_t> prefill_chunk;
  std::optional<std::vector<std::int32_t>> resume_tokens;
  std::optional<bool> stream;  // daemon default true
  std::optional<bool> enable_thinking;  // the chat template's variable (Qwen3); unset: the model's default
};

struct Request {
  std::string model;                  // "" = the default model
  std::string prompt;                 // used when messages is empty
  std::vector<ChatMessage> messages;  // chat (rendered with the model's template)
  SubmitOptions options;
};

// Embed (docs/dbus.md): inputs in order texts, image_fds, images; one vector per input, in that order.
struct EmbedOptions {
  std::optional<std::string> idempotency_key;
  std::optional<bool> allow_cpu;  // daemon default true
  std::optional<std::uint64_t> deadline_ms;
  std::optional<bool> truncate;  // daemon default true: texts longer than the context are cut
};

inline constexpr std::chrono::milliseconds kDefaultEmbedTimeout{10 * 60 * 1000};

// Inputs in this order, and the vectors come back in it: texts, tokens, image_fds, images.
struct EmbedRequest {
  std::string model;  // "" = the daemon's default embedding model
  std::vector<std::string> texts;
  // Texts already tokenized: the model's vocabulary ids without its special tokens (Embed option "tokens", aau;
  // the OpenAI API's token-array input). The daemon adds BOS/EOS as for a text.
  std::vector<std::vector<std::uint32_t>> tokens;
  std::vector<int> image_fds;  // borrowed (not closed): readable JPEG/PNG files, read from their offset to the end
  std::vector<std::vector<std::uint8_t>> images;  // JPEG/PNG file contents
  EmbedOptions options;
  // The reply comes when the job ends, after any queueing: the D-Bus call waits this long (then Errc::timeout).
  std::chrono::milliseconds call_timeout = kDefaultEmbedTimeout;
};

struct EmbedReply {
  std::vector<std::vector<float>> vectors;  // one per input, each info.dim wide
  EmbedInfo info;                           // job_id, model, route, dim, fingerprint, ...
};


// Transcribe (docs/dbus.md, docs/transcription.md): one audio file as a descriptor or as bytes; the job's segments
// arrive as JobUpdate "segment" signals (subscribe() first), GetJob has the transcript (segments_json).
struct TranscribeOptions {
  std::optional<std::string> language;         // "" / unset = detected
  std::optional<bool> translate;
  std::optional<bool> timestamps;              // daemon default true
  std::optional<double> temperature;           // first temperature, daemon default 0
  std::optional<bool> temperature_fallback;    // daemon default true
  std::optional<std::uint64_t> seed;
  std::optional<std::string> initial_prompt;
  std::optional<bool> condition_on_previous_text;
  std::optional<std::string> idempotency_key;
  std::optional<bool> allow_cpu;
  std::optional<std::uint64_t> deadline_ms;
};

// A live stream's PCM format (ring sessions only, docs/rings.md "Transcribe"): its chunks follow with
// RingSession::audio.
struct AudioStreamFormat {
  std::uint32_t sample_rate = 16000;
  std::uint32_t channels = 1;
  std::string sample_format = "s16le";  // or "f32le"
};

struct TranscribeRequest {
  std::string model;                // "" = the daemon's default speech model
  int audio_fd = -1;                // borrowed (not closed): a readable audio file, read from its offset to the end
  std::vector<std::uint8_t> audio;  // or the file's contents (exactly one of the two)
  std::optional<AudioStreamFormat> stream;  // or (ring only) a live stream: no file
  TranscribeOptions options;
};


// One segment of a transcript (JobUpdate "segment", GetJob's segments_json).
struct TranscriptSegment {
  std::uint32_t index = 0;
  double start = 0, end = 0;  // seconds
  std::string text;
  double avg_logprob = 0, no_speech_prob = 0, temperature = 0;
};
// GetJob's segments_json: a JSON array of {index, start, end, text, ...}. Errors: parse_error / format_error.
Result<std::vector<TranscriptSegment>> segments_from_json(std::string_view text);
// SRT (numbered from 1, HH:MM:SS,mmm) and WebVTT of segments.
std::string segments_to_srt(const std::vector<TranscriptSegment>& segs);
std::string segments_to_vtt(const std::vector<TranscriptSegment>& segs);

}  // namespace tandem::client
