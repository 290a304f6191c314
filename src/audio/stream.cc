// Live PCM streams (stream.h): chunk validation, downmix, libsamplerate in streaming mode, and the window wait.
#include "audio/stream.h"

#include <samplerate.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "audio/audio.h"

namespace tandem::audio {

std::string_view sample_format_name(SampleFormat f) {
  switch (f) {
    case SampleFormat::s16le: return "s16le";
    case SampleFormat::f32le: return "f32le";
  }
  return "?";
}

Result<SampleFormat> parse_sample_format(std::string_view name) {
  if (name == "s16le") return SampleFormat::s16le;
  if (name == "f32le") return SampleFormat::f32le;
  return fail(Errc::invalid_argument,
              "sample_format '" + std::string(name.substr(0, 32)) + "' is not one of s16le, f32le");
}

std::size_t StreamFormat::frame_bytes() const {
  return static_cast<std::size_t>(channels) * (sample == SampleFormat::s16le ? 2u : 4u);
}

struct PcmStream::Resampler {
  SRC_STATE* state = nullptr;
  double ratio = 1;
  std::vector<float> out;
  ~Resampler() {
    if (state) src_delete(state);
  }
};

PcmStream::PcmStream(StreamFormat format, StreamLimits limits)
    : format_(format), limits_(limits), last_chunk_(std::chrono::steady_clock::now()) {}

PcmStream::~PcmStream() = default;

Result<std::shared_ptr<PcmStream>> PcmStream::create(StreamFormat format, StreamLimits limits) {
  const AudioLimits lim;
  if (format.rate < lim.min_rate || format.rate > lim.max_rate)
    return fail(Errc::invalid_argument, "sample_rate " + std::to_string(format.rate) + " is outside [" +
                                            std::to_string(lim.min_rate) + ", " + std::to_string(lim.max_rate) + "]");
  if (format.channels < 1 || format.channels > lim.max_channels)
    return fail(Errc::invalid_argument, "channels " + std::to_string(format.channels) + " is outside [1, " +
                                            std::to_string(lim.max_channels) + "]");
  if (!(limits.max_seconds > 0) || !(limits.max_ahead_seconds > 0) || limits.max_chunk_bytes == 0)
    return fail(Errc::invalid_argument, "stream limits must be positive");
  std::shared_ptr<PcmStream> s(new PcmStream(format, limits));
  if (format.rate != kSampleRate) {
    auto r = std::make_unique<Resampler>();
    int err = 0;
    r->state = src_new(SRC_SINC_MEDIUM_QUALITY, 1, &err);
    if (!r->state) return fail(Errc::internal, std::string("libsamplerate: ") + src_strerror(err));
    r->ratio = static_cast<double>(kSampleRate) / format.rate;
    s->resampler_ = std::move(r);
  }
  return s;
}

// Appends n mono samples at the source rate (n == 0 with end flushes the resampler), clamped to [-1, 1].
Status PcmStream::push_locked(const float* mono, std::size_t n, bool end) {
  const std::size_t before = buf_.size();
  if (!resampler_) {
    buf_.insert(buf_.end(), mono, mono + n);
  } else {
    Resampler& r = *resampler_;
    r.out.resize(static_cast<std::size_t>(std::ceil(static_cast<double>(std::max<std::size_t>(n, 1024)) * r.ratio)) + 64);
    SRC_DATA d{};
    d.src_ratio = r.ratio;
    d.end_of_input = end ? 1 : 0;
    // libsamplerate 0.2 silently generates nothing for a null data_in, even to flush the end: never pass one.
    static const float kNone = 0.0f;
    const float* in = mono != nullptr ? mono : &kNone;
    long left = static_cast<long>(n);
    for (;;) {
      d.data_in = in;
      d.input_frames = left;
      d.data_out = r.out.data();
      d.output_frames = static_cast<long>(r.out.size());
      if (int err = src_process(r.state, &d); err != 0)
        return fail(Errc::internal, std::string("libsamplerate: ") + src_strerror(err));
      buf_.insert(buf_.end(), r.out.data(), r.out.data() + d.output_frames_gen);
      in += d.input_frames_used;
      left -= d.input_frames_used;
      if (left == 0 && (!end || d.output_frames_gen == 0)) break;
    }
  }
  for (std::size_t i = before; i < buf_.size(); ++i) buf_[i] = std::clamp(buf_[i], -1.0f, 1.0f);
  return {};
}

Status PcmStream::append(std::uint64_t offset, std::span<const std::uint8_t> bytes, bool end) {
  std::unique_lock lock(mu_);
  if (abandoned_) return fail(Errc::invalid_argument, "the stream's job has ended");
  if (complete_)
    return fail(Errc::invalid_argument, closed_ ? "the stream was closed" : "audio after the end of the stream");
  if (offset != bytes_)
    return fail(Errc::invalid_argument, "chunk at byte offset " + std::to_string(offset) + "; the stream expects " +
                                            std::to_string(bytes_) + " (send the bytes from there)");
  if (bytes.size() > limits_.max_chunk_bytes)
    return fail(Errc::invalid_argument, "chunk of " + std::to_string(bytes.size()) + " bytes; at most " +
                                            std::to_string(limits_.max_chunk_bytes));
  const std::size_t fb = format_.frame_bytes();
  if (bytes.size() % fb != 0)
    return fail(Errc::invalid_argument, "chunk of " + std::to_string(bytes.size()) + " bytes is not whole frames of " +
                                            std::to_string(fb) + " bytes (" + std::to_string(format_.channels) +
                                            " × " + std::string(sample_format_name(format_.sample)) + ")");
  const std::size_t frames = bytes.size() / fb;
  const double seconds_after = static_cast<double>(frames_ + frames) / format_.rate;
  if (seconds_after > limits_.max_seconds)
    return fail(Errc::invalid_argument, "the stream would last " + std::to_string(seconds_after) +
                                            " s; the configured maximum is " + std::to_string(limits_.max_seconds) +
                                            " s ([speech] max_audio_seconds)");
  const double ahead = static_cast<double>(base_ + buf_.size() - std::min(consumed_, base_ + buf_.size())) / kSampleRate;
  if (frames > 0 && ahead >= limits_.max_ahead_seconds) {
    const auto retry = static_cast<std::uint64_t>(std::clamp((ahead - limits_.max_ahead_seconds / 2) * 100.0, 100.0, 10000.0));
    return fail(Errc::queue_full, "the stream is " + std::to_string(static_cast<int>(ahead)) +
                                      " s ahead of the transcription (at most " +
                                      std::to_string(static_cast<int>(limits_.max_ahead_seconds)) +
                                      " s); send this chunk again later; retry_after_ms=" + std::to_string(retry));
  }
  // Decode and check the whole chunk before any of it enters the stream.
  const int ch = format_.channels;
  std::vector<float> mono(frames);
  for (std::size_t f = 0; f < frames; ++f) {
    double sum = 0;
    for (int c = 0; c < ch; ++c) {
      const std::uint8_t* p = bytes.data() + f * fb + static_cast<std::size_t>(c) * (fb / ch);
      float v;
      if (format_.sample == SampleFormat::s16le) {
        const auto u = static_cast<std::uint16_t>(p[0] | (p[1] << 8));
        v = static_cast<float>(static_cast<std::int16_t>(u)) / 32768.0f;
      } else {
        const std::uint32_t u = static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
                                (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
        v = std::bit_cast<float>(u);
        if (!std::isfinite(v))
          return fail(Errc::invalid_argument, "sample " + std::to_string(frames_ + f) + " of channel " +
                                                  std::to_string(c) + " is " + (std::isnan(v) ? "NaN" : "infinite"));
      }
      sum += v;
    }
    mono[f] = static_cast<float>(sum / ch);
  }
  if (end && frames_ + frames == 0) return fail(Errc::invalid_argument, "the stream ends without any samples");
  TANDEM_TRY(push_locked(mono.data(), frames, false));
  if (end) TANDEM_TRY(push_locked(nullptr, 0, true));
  bytes_ += bytes.size();
  frames_ += frames;
  complete_ = end;
  last_chunk_ = std::chrono::steady_clock::now();
  lock.unlock();
  cv_.notify_all();
  return {};
}

void PcmStream::close() {
  {
    std::lock_guard lock(mu_);
    if (complete_) return;
    if (resampler_) (void)push_locked(nullptr, 0, true);
    complete_ = true;
    closed_ = true;
  }
  cv_.notify_all();
}

void PcmStream::abandon() {
  {
    std::lock_guard lock(mu_);
    abandoned_ = true;
    buf_.clear();
    buf_.shrink_to_fit();
  }
  cv_.notify_all();
}

Result<StreamWindow> PcmStream::wait_window(std::uint64_t seek, std::size_t window, const std::atomic<bool>& cancel,
                                            std::chrono::milliseconds idle_timeout) {
  std::unique_lock lock(mu_);
  consumed_ = std::max(consumed_, seek);
  cv_.notify_all();
  for (;;) {
    if (abandoned_ || cancel.load(std::memory_order_relaxed)) return fail(Errc::cancelled, "transcription cancelled");
    if (seek < base_)
      return fail(Errc::invalid_argument, "sample " + std::to_string(seek) + " was released (the stream holds from " +
                                              std::to_string(base_) + ")");
    const std::uint64_t total = base_ + buf_.size();
    if (complete_ || total >= seek + window) {
      StreamWindow w;
      w.first = seek;
      w.total = total;
      w.complete = complete_;
      w.closed = closed_;
      const std::uint64_t end = std::min<std::uint64_t>(seek + window, total);
      if (end > seek)
        w.samples.assign(buf_.begin() + static_cast<std::ptrdiff_t>(seek - base_),
                         buf_.begin() + static_cast<std::ptrdiff_t>(end - base_));
      return w;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now - last_chunk_ >= idle_timeout)
      return fail(Errc::timeout, "no audio arrived for " +
                                     std::to_string(std::chrono::duration_cast<std::chrono::seconds>(idle_timeout).count()) +
                                     " s");
    // Wake at least every 50 ms for the cancel flag (it is an atomic, not under the mutex).
    cv_.wait_for(lock, std::min<std::chrono::steady_clock::duration>(std::chrono::milliseconds(50),
                                                                      last_chunk_ + idle_timeout - now));
  }
}

void PcmStream::release_before(std::uint64_t sample) {
  std::lock_guard lock(mu_);
  if (sample <= base_) return;
  const std::uint64_t n = std::min<std::uint64_t>(sample - base_, buf_.size());
  // Drop in bulk (amortised): the front goes when it is at least a quarter of what is held.
  if (n * 4 < buf_.size() && n < (1u << 20)) return;
  buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(n));
  base_ += n;
}

std::uint64_t PcmStream::bytes_received() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

std::uint64_t PcmStream::samples_total() const {
  std::lock_guard lock(mu_);
  return base_ + buf_.size();
}

double PcmStream::seconds() const {
  std::lock_guard lock(mu_);
  return static_cast<double>(frames_) / format_.rate;
}

bool PcmStream::complete() const {
  std::lock_guard lock(mu_);
  return complete_;
}

bool PcmStream::closed() const {
  std::lock_guard lock(mu_);
  return closed_;
}

}  // namespace tandem::audio
