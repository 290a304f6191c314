// A Transcribe call as the service takes it (service.h), from D-Bus (dbus_requests.h) or a ring record
// (transcribe_record.h). Its own header so that the pure ring-record parser builds without the service.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "audio/stream.h"

namespace tandem::daemon {

struct TranscribeOptions {
  std::optional<std::string> idempotency_key;
  std::optional<bool> allow_cpu;              // default true
  std::optional<std::uint64_t> deadline_ms;
  std::string language;                       // "" = detected (multilingual models) / the model's only language
  bool translate = false;                     // the translate task (to English) instead of transcribe
  bool timestamps = true;                     // segment times from the timestamp tokens; false: one segment per window
  std::optional<double> temperature;          // the first temperature (default 0: greedy)
  bool temperature_fallback = true;           // retry a window hotter when its text is repetitive or improbable
  std::uint64_t seed = 0;
  std::string initial_prompt;                 // text the first window is conditioned on
  bool condition_on_previous_text = true;
};

// A Transcribe call: one audio file (the bytes of a WAV, FLAC, Ogg, ... file; front ends read fds into these).
struct TranscribeRequest {
  std::string model;  // "" = [speech] default_model, else the first speech model
  std::shared_ptr<const std::vector<std::uint8_t>> audio;  // a file; or, with `stream`, none:
  // A live stream (ring sessions): the PCM's format; the audio follows in chunks through append_audio.
  std::optional<audio::StreamFormat> stream;
  std::string audio_name = "audio";  // the caller's name of the audio in error messages ("audio_fd")
  TranscribeOptions options;
};

}  // namespace tandem::daemon
