// libFuzzer target for untrusted audio input (src/audio): probe and decode arbitrary bytes under tight limits, check
// that probe and decode agree and that decoded samples are mono 16 kHz in [-1, 1], and run a log-mel window over
// what decodes. Built only with -Dfuzz=true; run by scripts/fuzz.sh --target audio.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "audio/audio.h"
#include "audio/mel.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tandem::audio;
  // Small limits keep each run fast and under the RSS limit; the limit checks themselves are exercised all the same.
  AudioLimits limits;
  limits.max_bytes = 1 << 20;
  limits.max_seconds = 4.0;
  limits.max_channels = 8;
  const std::span<const std::uint8_t> bytes(data, size);
  auto info = probe_audio(bytes, limits);
  if (!info.ok() && info.error().message.empty()) std::abort();  // every refusal must say what is wrong
  auto pcm = decode_audio(bytes, limits);
  if (!pcm.ok()) {
    if (pcm.error().message.empty()) std::abort();
    return 0;
  }
  // decode accepts only what probe accepts, with the same header facts (frames may shrink only for MP3 estimates).
  if (!info.ok() || info->format != pcm->info.format || info->source_rate != pcm->info.source_rate ||
      info->channels != pcm->info.channels) {
    std::abort();
  }
  if (pcm->samples.empty() || pcm->seconds() > limits.max_seconds + 1.0) std::abort();
  for (float v : pcm->samples) {
    if (!(v >= -1.0f && v <= 1.0f)) std::abort();
  }
  static const LogMel mel;
  const auto m = mel.window(pcm->samples, 0, 1600);
  if (m.size() != 80u * 10) std::abort();
  for (float v : m) {
    if (!std::isfinite(v)) std::abort();
  }
  return 0;
}
