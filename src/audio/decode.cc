// Decoding through libsndfile's virtual I/O (no temporary file), limits checked from the header first, then a
// streaming downmix + libsamplerate pass so memory stays proportional to the 16-kHz output, whatever the source's
// rate and channel count.
#include <samplerate.h>
#include <sndfile.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "audio/audio.h"

namespace tandem::audio {

double AudioInfo::seconds() const {
  return source_rate > 0 ? static_cast<double>(source_frames) / source_rate : 0.0;
}

double Pcm::seconds() const { return static_cast<double>(samples.size()) / kSampleRate; }

namespace {

// ---- libsndfile virtual I/O over a read-only byte span ---------------------------------------------------------
struct MemFile {
  const std::uint8_t* data = nullptr;
  sf_count_t size = 0;
  sf_count_t pos = 0;
};

sf_count_t vio_filelen(void* user) { return static_cast<MemFile*>(user)->size; }

sf_count_t vio_seek(sf_count_t offset, int whence, void* user) {
  auto* m = static_cast<MemFile*>(user);
  sf_count_t base = 0;
  switch (whence) {
    case SEEK_SET: base = 0; break;
    case SEEK_CUR: base = m->pos; break;
    case SEEK_END: base = m->size; break;
    default: return -1;
  }
  // Offsets come from untrusted headers: refuse overflow and positions before the start; past the end is allowed
  // (reads there return 0, as with a file).
  if ((offset > 0 && base > INT64_MAX - offset) || base + offset < 0) return -1;
  m->pos = base + offset;
  return m->pos;
}

sf_count_t vio_read(void* ptr, sf_count_t count, void* user) {
  auto* m = static_cast<MemFile*>(user);
  if (count <= 0 || m->pos >= m->size) return 0;
  const sf_count_t n = std::min(count, m->size - m->pos);
  std::memcpy(ptr, m->data + m->pos, static_cast<std::size_t>(n));
  m->pos += n;
  return n;
}

sf_count_t vio_write(const void*, sf_count_t, void*) { return 0; }  // read-only
sf_count_t vio_tell(void* user) { return static_cast<MemFile*>(user)->pos; }

SF_VIRTUAL_IO g_vio = {vio_filelen, vio_seek, vio_read, vio_write, vio_tell};

// ---- helpers -----------------------------------------------------------------------------------------------------

// "5h 2m", "4h", "1m 30s", "45s", "0.25s": for limit messages.
std::string format_duration(double s) {
  if (!(s >= 0)) return "?";
  if (s < 60 && s != std::floor(s)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3gs", s);
    return buf;
  }
  const auto total = static_cast<std::uint64_t>(std::floor(s));
  const std::uint64_t h = total / 3600, m = total / 60 % 60, sec = total % 60;
  std::string out;
  auto part = [&](std::uint64_t v, const char* unit) {
    if (v == 0) return;
    if (!out.empty()) out += ' ';
    out += std::to_string(v) + unit;
  };
  part(h, "h");
  part(m, "m");
  if (h == 0) part(sec, "s");  // seconds are noise next to hours
  return out.empty() ? "0s" : out;
}

// libsndfile's major format as a short name: the first word of its own name, with WAVEX folded into WAV.
std::string short_format_name(int format) {
  const int major = format & SF_FORMAT_TYPEMASK;
  if (major == SF_FORMAT_WAV || major == SF_FORMAT_WAVEX) return "WAV";
  if (major == SF_FORMAT_NIST) return "NIST";
  if (major == SF_FORMAT_MPEG) return (format & SF_FORMAT_SUBMASK) == SF_FORMAT_MPEG_LAYER_III ? "MP3" : "MPEG";
  SF_FORMAT_INFO fi{};
  fi.format = major;
  if (sf_command(nullptr, SFC_GET_FORMAT_INFO, &fi, sizeof fi) != 0 || fi.name == nullptr) return "unknown";
  std::string name = fi.name;
  return name.substr(0, name.find(' '));
}

std::uint32_t le32(const std::uint8_t* p) {
  return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}

// libsndfile silently shortens a RIFF/WAVE file whose data chunk runs past the end of the file (it only notes
// "should be N" in its log), so the declared size is read here. Returns a message when truncated. Sizes 0 and
// 0xFFFFFFFF are what streaming writers (ffmpeg to a pipe) leave: length unknown, not a truncation.
std::optional<std::string> wav_truncation(std::span<const std::uint8_t> b) {
  if (b.size() < 12 || std::memcmp(b.data(), "RIFF", 4) != 0 || std::memcmp(b.data() + 8, "WAVE", 4) != 0) {
    return std::nullopt;
  }
  std::size_t off = 12;
  for (int guard = 0; guard < 1024 && off + 8 <= b.size(); ++guard) {
    const std::uint32_t size = le32(b.data() + off + 4);
    if (std::memcmp(b.data() + off, "data", 4) == 0) {
      const std::uint64_t have = b.size() - (off + 8);
      if (size != 0 && size != 0xFFFFFFFFu && size > have) {
        return "truncated: header says " + std::to_string(size) + " bytes of samples, the file holds " +
               std::to_string(have);
      }
      return std::nullopt;
    }
    off += 8 + static_cast<std::uint64_t>(size) + (size & 1);  // chunks are padded to even sizes
  }
  return std::nullopt;
}

// An open libsndfile handle over the caller's bytes; not movable (libsndfile keeps a pointer to `mem`).
struct Source {
  MemFile mem;
  SNDFILE* file = nullptr;
  SF_INFO sf{};
  Source() = default;
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;
  ~Source() {
    if (file != nullptr) sf_close(file);
  }
};

// Opens and checks everything the header tells, in the order a caller can act on: size, format, channels, rate,
// length, duration.
Result<AudioInfo> open_checked(Source& src, std::span<const std::uint8_t> bytes, const AudioLimits& limits) {
  if (bytes.size() > limits.max_bytes) {
    return fail(Errc::invalid_argument, "file of " + std::to_string(bytes.size()) + " bytes exceeds the limit of " +
                                            std::to_string(limits.max_bytes) + " bytes");
  }
  if (bytes.empty()) return fail(Errc::invalid_argument, "not an audio file libsndfile can read: the file is empty");
  src.mem = MemFile{bytes.data(), static_cast<sf_count_t>(bytes.size()), 0};
  src.file = sf_open_virtual(&g_vio, SFM_READ, &src.sf, &src.mem);
  if (src.file == nullptr) {
    return fail(Errc::invalid_argument, std::string("not an audio file libsndfile can read: ") + sf_strerror(nullptr));
  }
  AudioInfo info;
  info.format = short_format_name(src.sf.format);
  info.source_rate = src.sf.samplerate;
  info.channels = src.sf.channels;
  if (info.channels <= 0) {
    return fail(Errc::invalid_argument, info.format + " header gives " + std::to_string(info.channels) + " channels");
  }
  if (info.channels > limits.max_channels) {
    return fail(Errc::invalid_argument, std::to_string(info.channels) + " channels exceeds " +
                                            std::to_string(limits.max_channels));
  }
  if (info.source_rate < limits.min_rate || info.source_rate > limits.max_rate) {
    return fail(Errc::invalid_argument, "sample rate " + std::to_string(info.source_rate) + " Hz is outside " +
                                            std::to_string(limits.min_rate) + ".." + std::to_string(limits.max_rate));
  }
  if (auto t = wav_truncation(bytes)) return fail(Errc::invalid_argument, *t);
  if (src.sf.frames == SF_COUNT_MAX) {
    return fail(Errc::invalid_argument, info.format + " stream of unknown length (the header gives no frame count)");
  }
  if (src.sf.frames <= 0) return fail(Errc::invalid_argument, "no samples");
  info.source_frames = static_cast<std::uint64_t>(src.sf.frames);
  if (info.seconds() > limits.max_seconds) {
    return fail(Errc::invalid_argument, "duration " + format_duration(info.seconds()) +
                                            " exceeds the configured maximum " + format_duration(limits.max_seconds));
  }
  return info;
}

struct SrcDeleter {
  void operator()(SRC_STATE* s) const { src_delete(s); }
};

}  // namespace

Result<AudioInfo> probe_audio(std::span<const std::uint8_t> bytes, const AudioLimits& limits) {
  Source src;
  return open_checked(src, bytes, limits);
}

Result<Pcm> decode_audio(std::span<const std::uint8_t> bytes, const AudioLimits& limits) {
  Source src;
  auto opened = open_checked(src, bytes, limits);
  if (!opened.ok()) return fail(std::move(opened).error());
  Pcm pcm;
  pcm.info = std::move(*opened);
  const int ch = pcm.info.channels;
  const std::uint64_t header_frames = pcm.info.source_frames;
  // MP3 frame counts are estimates when the stream has no Xing/Info header: only an exact count can show truncation.
  const bool exact_count = (src.sf.format & SF_FORMAT_TYPEMASK) != SF_FORMAT_MPEG;
  const double max_frames = limits.max_seconds * pcm.info.source_rate;  // compared in double: any limit is safe

  std::unique_ptr<SRC_STATE, SrcDeleter> resampler;
  const bool resample = pcm.info.source_rate != kSampleRate;
  const double ratio = static_cast<double>(kSampleRate) / pcm.info.source_rate;
  if (resample) {
    int err = 0;
    resampler.reset(src_new(SRC_SINC_MEDIUM_QUALITY, 1, &err));
    if (!resampler) return fail(Errc::internal, std::string("libsamplerate: ") + src_strerror(err));
  }
  // The header's length is untrusted (a 100-byte FLAC may claim hours): reserve at most 10 minutes up front and let
  // the vector grow past that only as samples actually decode.
  const double expected = std::min(static_cast<double>(header_frames) * ratio, 600.0 * kSampleRate);
  pcm.samples.reserve(static_cast<std::size_t>(expected) + 64);

  constexpr sf_count_t kChunk = 8192;
  std::vector<float> interleaved(static_cast<std::size_t>(kChunk) * ch);
  std::vector<float> mono(kChunk);
  std::vector<float> out(static_cast<std::size_t>(std::ceil(kChunk * ratio)) + 64);

  // Feeds `n` mono frames (n == 0 with end == true flushes) through the resampler into pcm.samples.
  auto push = [&](const float* in, long n, bool end) -> Status {
    if (!resample) {
      pcm.samples.insert(pcm.samples.end(), in, in + n);
      return {};
    }
    SRC_DATA d{};
    d.src_ratio = ratio;
    d.end_of_input = end ? 1 : 0;
    for (;;) {
      d.data_in = in;
      d.input_frames = n;
      d.data_out = out.data();
      d.output_frames = static_cast<long>(out.size());
      if (int err = src_process(resampler.get(), &d); err != 0) {
        return fail(Errc::internal, std::string("libsamplerate: ") + src_strerror(err));
      }
      pcm.samples.insert(pcm.samples.end(), out.data(), out.data() + d.output_frames_gen);
      in += d.input_frames_used;
      n -= d.input_frames_used;
      if (n == 0 && (!end || d.output_frames_gen == 0)) return {};
    }
  };

  std::uint64_t decoded = 0;
  for (;;) {
    const sf_count_t got = sf_readf_float(src.file, interleaved.data(), kChunk);
    if (got <= 0) break;
    for (sf_count_t f = 0; f < got; ++f) {
      double sum = 0;
      for (int c = 0; c < ch; ++c) {
        const float v = interleaved[static_cast<std::size_t>(f) * ch + c];
        if (!std::isfinite(v)) {
          return fail(Errc::invalid_argument, "sample " + std::to_string(decoded + f) + " of channel " +
                                                  std::to_string(c) + " is " + (std::isnan(v) ? "NaN" : "infinite"));
        }
        sum += v;
      }
      mono[f] = static_cast<float>(sum / ch);
    }
    decoded += static_cast<std::uint64_t>(got);
    if (static_cast<double>(decoded) > max_frames) {  // an MP3 longer than its estimate: the duration limit still holds
      return fail(Errc::invalid_argument, "duration over " + format_duration(static_cast<double>(decoded) /
                                                                              pcm.info.source_rate) +
                                              " exceeds the configured maximum " + format_duration(limits.max_seconds));
    }
    TANDEM_TRY(push(mono.data(), static_cast<long>(got), false));
  }
  if (exact_count && decoded < header_frames) {
    // Some decoders also set an error (a corrupt frame rather than a missing end): say so when one did.
    std::string why;
    if (sf_error(src.file) != SF_ERR_NO_ERROR) why = std::string(" (") + sf_strerror(src.file) + ")";
    return fail(Errc::invalid_argument, "truncated: header says " + std::to_string(header_frames) + " frames, " +
                                            std::to_string(decoded) + " decoded" + why);
  }
  if (decoded == 0) return fail(Errc::invalid_argument, "no samples");
  pcm.info.source_frames = decoded;
  TANDEM_TRY(push(mono.data(), 0, true));
  // Sinc ringing can overshoot a full-scale input slightly, and float WAVs may hold values past 1.
  for (float& v : pcm.samples) v = std::clamp(v, -1.0f, 1.0f);
  return pcm;
}

}  // namespace tandem::audio
