// Untrusted image input: JPEG/PNG decoding with limits checked before allocation, CLIP preprocessing that matches
// Hugging Face's CLIPImageProcessor (PIL bicubic), and PNG writing. Depends only on core, libjpeg and libpng; neither
// C library's headers leak out of this file. docs/image-input.md describes formats, limits and the steps.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"

namespace tandem::image {

// Row-major RGB, 3 bytes per pixel: pixels.size() == width * height * 3.
struct Rgb8 {
  std::uint32_t width = 0, height = 0;
  std::vector<std::uint8_t> pixels;
};

// Checked on the encoded size and on the header's dimensions before any pixel buffer is allocated.
struct DecodeLimits {
  std::uint64_t max_bytes = 64ull << 20;
  std::uint64_t max_pixels = 40'000'000;
  std::uint32_t max_side = 16384;
};

enum class Format { jpeg, png };

// By magic bytes; anything else is Errc::invalid_argument "not a JPEG or PNG image".
Result<Format> sniff(std::span<const std::uint8_t> bytes);

// Any JPEG (baseline, progressive, grey, YCbCr, CMYK/YCCK) or PNG (any colour type and depth, interlaced) to RGB8.
// Alpha is dropped (PIL's convert("RGB")); EXIF orientation is not applied (Hugging Face does not either).
// Errors: invalid_argument (not an image, empty, truncated, corrupt, over a limit: the message says what),
// unsupported (a JPEG colour space we do not convert), out_of_memory.
Result<Rgb8> decode(std::span<const std::uint8_t> bytes, const DecodeLimits& limits = {});

// 8-bit RGB PNG, not interlaced. invalid_argument when pixels.size() != width * height * 3 or a side is 0.
Result<std::vector<std::uint8_t>> encode_png(const Rgb8& img);

// The parts of Hugging Face's preprocessor_config.json that CLIPImageProcessor uses.
struct ClipPreprocess {
  std::uint32_t size = 224;  // the shortest edge after resizing
  std::uint32_t crop = 224;  // the square centre crop
  float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
  float std[3] = {0.26862954f, 0.26130258f, 0.27577711f};
};

// size.shortest_edge or size (int), crop_size (int or {height, width}, square only), image_mean, image_std;
// do_resize / do_center_crop / do_normalize / do_rescale must be true when present (else unsupported), and
// rescale_factor 1/255 when present. parse_error for JSON that does not parse, invalid_argument for bad values.
Result<ClipPreprocess> clip_preprocess_from_json(const std::string& preprocessor_config_json_text);

// Resize (shortest edge = size, PIL bicubic with antialiasing), centre crop, rescale 1/255, normalise:
// [3][crop][crop] CHW floats. An empty image gives an empty vector.
std::vector<float> clip_preprocess(const Rgb8& img, const ClipPreprocess& p);

// PIL's Image.resize(..., BICUBIC) on an 8-bit RGB image (exposed for tests). An empty input or target gives an
// empty image of the target size (zeros).
Rgb8 resize_bicubic(const Rgb8& img, std::uint32_t w, std::uint32_t h);

}  // namespace tandem::image
