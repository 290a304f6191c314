// Untrusted audio input for speech models: decoding any file libsndfile reads (WAV, FLAC, Ogg Vorbis/Opus, MP3, ...)
// from memory, with every limit checked from the header before samples are decoded, downmixed to mono and resampled
// to 16 kHz with libsamplerate. Depends only on core; neither C library's headers leak out of this file.
// docs/audio-input.md describes formats, limits and their errors. Whisper's log-mel spectrogram is in mel.h.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"

namespace tandem::audio {

constexpr int kSampleRate = 16000;  // what every Whisper model takes

struct AudioLimits {
  std::uint64_t max_bytes = 2ull << 30;    // encoded file size
  double max_seconds = 4 * 3600.0;         // decoded duration (a configured maximum in the daemon)
  int min_rate = 1000, max_rate = 768000;  // source sample rate accepted
  int max_channels = 32;
};

struct AudioInfo {
  std::string format;  // libsndfile's major format, short: "WAV", "FLAC", "OGG" (Vorbis and Opus), "MP3", "AIFF", ...
  int source_rate = 0;
  int channels = 0;
  std::uint64_t source_frames = 0;
  double seconds() const;  // source_frames / source_rate
};

struct Pcm {
  std::vector<float> samples;  // mono, kSampleRate, in [-1, 1]
  AudioInfo info;
  double seconds() const;  // samples.size() / kSampleRate
};

// Header only (no sample decoding): format, rate, channels, frames, with every limit checked; a WAV whose data chunk
// runs past the end of the file is refused here already. Cheap enough for the daemon's loop thread.
// Errors: Errc::invalid_argument, the message saying what is wrong (not audio, truncated, no samples, a limit).
Result<AudioInfo> probe_audio(std::span<const std::uint8_t> bytes, const AudioLimits& limits = {});

// Decodes (libsndfile virtual I/O over the bytes), downmixes to mono (mean of channels), resamples to 16 kHz with
// libsamplerate (SRC_SINC_MEDIUM_QUALITY; none when already 16 kHz), returns f32 samples clamped to [-1, 1].
// Errors: everything probe_audio refuses, plus a stream that ends before the frames its header promises
// ("truncated: ...") and NaN/Inf samples; all Errc::invalid_argument.
Result<Pcm> decode_audio(std::span<const std::uint8_t> bytes, const AudioLimits& limits = {});

}  // namespace tandem::audio
