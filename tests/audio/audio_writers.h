// Test helpers: audio files written in memory with libsndfile's own writer (virtual I/O into a vector), and sines.
// Shared by the decode tests and the fuzz seed writer.
#pragma once

#include <sndfile.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <numbers>
#include <vector>

namespace tandem::audio::testing_writers {

using Bytes = std::vector<std::uint8_t>;

struct GrowBuf {
  Bytes data;
  sf_count_t pos = 0;
};

inline sf_count_t gb_len(void* u) { return static_cast<sf_count_t>(static_cast<GrowBuf*>(u)->data.size()); }
inline sf_count_t gb_seek(sf_count_t off, int whence, void* u) {
  auto* b = static_cast<GrowBuf*>(u);
  const sf_count_t base = whence == SEEK_SET   ? 0
                          : whence == SEEK_CUR ? b->pos
                                               : static_cast<sf_count_t>(b->data.size());
  if (base + off < 0) return -1;
  b->pos = base + off;
  return b->pos;
}
inline sf_count_t gb_read(void* ptr, sf_count_t n, void* u) {
  auto* b = static_cast<GrowBuf*>(u);
  const auto size = static_cast<sf_count_t>(b->data.size());
  if (b->pos >= size || n <= 0) return 0;
  const sf_count_t k = std::min(n, size - b->pos);
  std::memcpy(ptr, b->data.data() + b->pos, static_cast<std::size_t>(k));
  b->pos += k;
  return k;
}
inline sf_count_t gb_write(const void* ptr, sf_count_t n, void* u) {
  auto* b = static_cast<GrowBuf*>(u);
  if (static_cast<std::size_t>(b->pos + n) > b->data.size()) b->data.resize(static_cast<std::size_t>(b->pos + n));
  std::memcpy(b->data.data() + b->pos, ptr, static_cast<std::size_t>(n));
  b->pos += n;
  return n;
}
inline sf_count_t gb_tell(void* u) { return static_cast<GrowBuf*>(u)->pos; }

// `interleaved` holds frames × channels floats; `format` e.g. SF_FORMAT_WAV | SF_FORMAT_PCM_16. Empty on failure.
inline Bytes write_audio(int format, int rate, int channels, const std::vector<float>& interleaved) {
  SF_VIRTUAL_IO vio = {gb_len, gb_seek, gb_read, gb_write, gb_tell};
  GrowBuf buf;
  SF_INFO info{};
  info.samplerate = rate;
  info.channels = channels;
  info.format = format;
  SNDFILE* f = sf_open_virtual(&vio, SFM_WRITE, &info, &buf);
  if (f == nullptr) return {};
  const auto frames = static_cast<sf_count_t>(interleaved.size() / static_cast<std::size_t>(channels));
  const bool ok = sf_writef_float(f, interleaved.data(), frames) == frames;
  if (sf_close(f) != 0 || !ok) return {};
  return std::move(buf.data);
}

inline std::vector<float> sine(double hz, int rate, std::size_t frames, double amp = 0.5) {
  std::vector<float> s(frames);
  for (std::size_t i = 0; i < frames; ++i)
    s[i] = static_cast<float>(amp * std::sin(2 * std::numbers::pi * hz * i / rate));
  return s;
}

}  // namespace tandem::audio::testing_writers
