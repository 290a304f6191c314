// The ring's transcribe and audio records (docs/rings.md "Transcribe (ABI 1.2)"): a Transcribe call as a ring client
// writes it — a whole file, or the format of a live stream whose PCM follows in `audio` entries — and one chunk of
// such a stream. Every field is checked here (type, unknown key, a file xor a stream) with invalid_argument naming
// the field; what depends on the model and the [speech] limits is the service's to check.
#pragma once

#include <cstdint>
#include <vector>

#include "core/result.h"
#include "daemon/transcribe_request.h"
#include "ring/record.h"

namespace tandem::daemon {

// Keys: model, audio (bytes_list of one file) | stream (boolean true) with sample_rate (uint64), channels (uint64,
// default 1), sample_format ("s16le" default, "f32le"); language, initial_prompt, idempotency_key (string);
// translate, timestamps, temperature_fallback, condition_on_previous_text, allow_cpu (boolean); temperature
// (float64); seed, deadline_ms (uint64 or int64 >= 0).
Result<TranscribeRequest> transcribe_from_record(const std::vector<ring::Field>& fields);

struct AudioChunk {
  std::uint64_t offset = 0;          // PCM bytes of the stream before this chunk
  std::vector<std::uint8_t> pcm;     // whole frames in the stream's format (may be empty with end)
  bool end = false;                  // the last chunk
};

// Keys: offset (uint64, required), pcm (bytes_list of at most one element; absent = no bytes), end (boolean).
Result<AudioChunk> audio_from_record(const std::vector<ring::Field>& fields);

// The records a client writes (the inverses; for clients and tests). A request with `stream` writes the stream keys
// and no audio.
std::vector<std::uint8_t> transcribe_record(const TranscribeRequest& r);
std::vector<std::uint8_t> audio_record(const AudioChunk& c);

}  // namespace tandem::daemon
