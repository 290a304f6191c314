// libFuzzer target for untrusted image input (src/image): decode arbitrary bytes as JPEG/PNG under tight limits, run
// CLIP preprocessing on what decodes, and check that a decoded image survives a PNG round trip bit for bit.
// Built only with -Dfuzz=true; run by scripts/fuzz.sh --target image.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "image/image.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tandem::image;
  // Small limits keep each run fast and under the RSS limit; the limit checks themselves are exercised all the same.
  DecodeLimits limits;
  limits.max_pixels = 1 << 20;
  limits.max_side = 4096;
  auto img = decode(std::span<const std::uint8_t>(data, size), limits);
  if (!img.ok()) {
    if (img.error().message.empty()) std::abort();  // every refusal must say what is wrong
    return 0;
  }
  if (img->width == 0 || img->height == 0 ||
      img->pixels.size() != static_cast<std::size_t>(img->width) * img->height * 3) {
    std::abort();
  }
  ClipPreprocess p;
  p.size = 16;
  p.crop = 12;
  if (clip_preprocess(*img, p).size() != 3u * 12 * 12) std::abort();
  if (img->pixels.size() <= (1u << 16)) {
    auto png = encode_png(*img);
    if (!png.ok()) std::abort();
    auto back = decode(*png, limits);
    if (!back.ok() || back->pixels != img->pixels) std::abort();
  }
  return 0;
}
