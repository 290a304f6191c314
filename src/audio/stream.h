// Live audio for speech models: raw PCM that arrives in chunks (a microphone through a ring session,
// docs/rings.md "Transcribe"), converted as it comes to what every Whisper window reads — 16 kHz mono f32 — and read
// by the job's worker one window at a time. The producer (the daemon's loop thread) appends; the consumer (the
// job's run, on a worker) waits for a whole window or the end. Every chunk is untrusted: its offset must continue
// the stream exactly (nothing lost, nothing twice), it must hold whole frames of finite samples, and the stream
// is bounded in duration and in how far it may run ahead of the decoder. docs/audio-input.md "Live streams".
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace tandem::audio {

enum class SampleFormat : std::uint8_t { s16le, f32le };

std::string_view sample_format_name(SampleFormat f);
// "s16le" or "f32le"; invalid_argument otherwise.
Result<SampleFormat> parse_sample_format(std::string_view name);

struct StreamFormat {
  int rate = 16000;   // frames per second, [1000, 768000]
  int channels = 1;   // [1, 32], interleaved; downmixed to the mean
  SampleFormat sample = SampleFormat::s16le;
  std::size_t frame_bytes() const;
};

struct StreamLimits {
  double max_seconds = 4 * 3600.0;     // the stream's whole duration (the [speech] maximum)
  double max_ahead_seconds = 600.0;    // audio received but not yet transcribed; past it a chunk is refused
                                       // (queue_full, retry later: the decoder is behind)
  std::size_t max_chunk_bytes = 16u << 20;
};

// What a window reads: samples[0] is sample `first` of the 16-kHz stream, `total` samples exist so far.
struct StreamWindow {
  std::vector<float> samples;
  std::uint64_t first = 0;
  std::uint64_t total = 0;
  bool complete = false;  // no more samples will come
  bool closed = false;    // complete because the producer went away without sending the end
};

class PcmStream {
 public:
  // invalid_argument: a rate, channel count or limit out of range.
  static Result<std::shared_ptr<PcmStream>> create(StreamFormat format, StreamLimits limits = {});
  ~PcmStream();
  PcmStream(const PcmStream&) = delete;
  PcmStream& operator=(const PcmStream&) = delete;

  // --- producer ---
  // One chunk: `offset` is how many bytes of PCM the producer sent before it (must equal bytes_received(): a chunk
  // that repeats or skips bytes is refused, so a resend after a refusal can never duplicate or lose audio). `end`
  // marks the last chunk (it may be empty). Errors, none of which change the stream:
  //   invalid_argument — wrong offset (the message says the expected one), not whole frames, a NaN/Inf sample,
  //                      a chunk over max_chunk_bytes, audio after the end, the stream over max_seconds;
  //   queue_full       — the stream runs more than max_ahead_seconds ahead of the decoder ("retry_after_ms=N").
  Status append(std::uint64_t offset, std::span<const std::uint8_t> bytes, bool end);
  // The producer is gone (its session ended): the stream ends where it is, marked closed. Idempotent; no effect
  // after the end was sent.
  void close();
  // The job ended: a waiting consumer returns cancelled, later appends are refused (invalid_argument).
  void abandon();

  // --- consumer ---
  // Waits until the window [seek, seek + window) is whole or the stream is complete, then copies the samples the
  // window reads ([seek, min(seek + window, total))). Errors: cancelled (the flag, or abandon()), timeout (no chunk
  // for idle_timeout: the message says how long), invalid_argument (seek before samples already released).
  Result<StreamWindow> wait_window(std::uint64_t seek, std::size_t window, const std::atomic<bool>& cancel,
                                   std::chrono::milliseconds idle_timeout);
  // Samples before `sample` will not be read again (the job's checkpoint passed them): their memory goes.
  void release_before(std::uint64_t sample);

  // --- observers (any thread) ---
  std::uint64_t bytes_received() const;
  std::uint64_t samples_total() const;  // 16-kHz samples produced so far
  double seconds() const;               // source frames received / source rate
  bool complete() const;
  bool closed() const;
  const StreamFormat& format() const { return format_; }

 private:
  PcmStream(StreamFormat format, StreamLimits limits);
  struct Resampler;
  Status push_locked(const float* mono, std::size_t n, bool end);

  const StreamFormat format_;
  const StreamLimits limits_;
  std::unique_ptr<Resampler> resampler_;  // null at 16 kHz
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<float> buf_;     // samples [base_, base_ + buf_.size())
  std::uint64_t base_ = 0;
  std::uint64_t bytes_ = 0;
  std::uint64_t frames_ = 0;   // source frames
  std::uint64_t consumed_ = 0; // the furthest seek the consumer asked for (for max_ahead_seconds)
  bool complete_ = false, closed_ = false, abandoned_ = false;
  std::chrono::steady_clock::time_point last_chunk_;
};

}  // namespace tandem::audio
