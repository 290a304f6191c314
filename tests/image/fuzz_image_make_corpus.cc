// Writes the seed corpus for fuzz_image into DIR: small PNGs of every colour type (interlaced, 16-bit, palette with
// tRNS) and JPEGs (baseline, progressive, grey, CMYK), so the fuzzer starts inside both decoders.
#include <cstdio>
#include <string>

#include "image_writers.h"

using namespace tandem::image;
using namespace tandem::image::testing_writers;

namespace {

bool save(const std::string& dir, const char* name, const Bytes& b) {
  const std::string path = dir + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(b.data(), 1, b.size(), f) == b.size();
  return std::fclose(f) == 0 && ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_image_make_corpus DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  const Rgb8 pic = test_picture(12, 8);
  Bytes grey(12 * 8), cmyk;
  for (std::size_t i = 0; i < grey.size(); ++i) grey[i] = static_cast<std::uint8_t>(i * 3);
  for (std::size_t i = 0; i < grey.size(); ++i) cmyk.insert(cmyk.end(), {static_cast<std::uint8_t>(i * 3), 40, 200, 250});
  Bytes grey_alpha, grey16, rgb16;
  for (std::size_t i = 0; i < grey.size(); ++i) {
    grey_alpha.insert(grey_alpha.end(), {grey[i], static_cast<std::uint8_t>(255 - grey[i])});
    grey16.insert(grey16.end(), {grey[i], 7});
  }
  for (auto v : pic.pixels) rgb16.insert(rgb16.end(), {v, 0x55});
  const Bytes palette_rows(12 * 8, 1);
  bool ok = true;
  ok &= save(dir, "rgb.png", *encode_png(pic));
  ok &= save(dir, "rgb_interlaced.png", write_png({12, 8, PNG_COLOR_TYPE_RGB, 8, true, pic.pixels, {}, {}}));
  ok &= save(dir, "grey.png", write_png({12, 8, PNG_COLOR_TYPE_GRAY, 8, false, grey, {}, {}}));
  ok &= save(dir, "grey_alpha.png", write_png({12, 8, PNG_COLOR_TYPE_GRAY_ALPHA, 8, false, grey_alpha, {}, {}}));
  ok &= save(dir, "grey16.png", write_png({12, 8, PNG_COLOR_TYPE_GRAY, 16, false, grey16, {}, {}}));
  ok &= save(dir, "rgb16.png", write_png({12, 8, PNG_COLOR_TYPE_RGB, 16, true, rgb16, {}, {}}));
  ok &= save(dir, "palette.png",
             write_png({12, 8, PNG_COLOR_TYPE_PALETTE, 8, false, palette_rows, {{1, 2, 3}, {200, 100, 50}}, {0, 128}}));
  ok &= save(dir, "baseline.jpg", write_jpeg(12, 8, pic.pixels, JCS_RGB, 3));
  ok &= save(dir, "progressive.jpg", write_jpeg(12, 8, pic.pixels, JCS_RGB, 3, true));
  ok &= save(dir, "grey.jpg", write_jpeg(12, 8, grey, JCS_GRAYSCALE, 1));
  ok &= save(dir, "cmyk.jpg", write_jpeg(12, 8, cmyk, JCS_CMYK, 4));
  if (!ok) {
    std::fprintf(stderr, "fuzz_image_make_corpus: cannot write the seeds into %s\n", dir.c_str());
    return 1;
  }
  return 0;
}
