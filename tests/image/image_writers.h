// Test-only image writers (libpng, libjpeg) shared by test_decode.cc and the fuzz seed generator: PNGs of any colour
// type, depth and interlacing, and JPEGs at quality 100 without chroma subsampling.
#pragma once

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <jpeglib.h>
#include <png.h>

#include "image/draw.h"
#include "image/image.h"

namespace tandem::image::testing_writers {

using Bytes = std::vector<std::uint8_t>;

inline void png_sink(png_structp png, png_bytep data, png_size_t n) {
  auto* out = static_cast<Bytes*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}

struct PngSpec {
  std::uint32_t w = 0, h = 0;
  int color = PNG_COLOR_TYPE_RGB, depth = 8;
  bool interlace = false;
  Bytes rows;                  // packed rows, big-endian samples, as PNG stores them
  std::vector<png_color> palette;
  std::vector<png_byte> trns;  // palette alpha
};

inline Bytes write_png(const PngSpec& s) {
  Bytes out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);  // the caller sees an empty file
    return {};
  }
  png_set_write_fn(png, &out, png_sink, nullptr);
  png_set_IHDR(png, info, s.w, s.h, s.depth, s.color, s.interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!s.palette.empty()) png_set_PLTE(png, info, s.palette.data(), static_cast<int>(s.palette.size()));
  if (!s.trns.empty()) png_set_tRNS(png, info, s.trns.data(), static_cast<int>(s.trns.size()), nullptr);
  png_write_info(png, info);
  const std::size_t stride = s.rows.size() / s.h;
  std::vector<png_bytep> rows(s.h);
  for (std::uint32_t y = 0; y < s.h; ++y) rows[y] = const_cast<png_bytep>(&s.rows[y * stride]);
  png_write_image(png, rows.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

// quality 100, 4:4:4 (no chroma subsampling); cmyk takes 4 bytes per pixel, grey 1.
inline Bytes write_jpeg(std::uint32_t w, std::uint32_t h, const Bytes& px, J_COLOR_SPACE space, int components,
                 bool progressive = false) {
  jpeg_compress_struct c{};
  jpeg_error_mgr err{};
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buf, &size);
  c.image_width = w;
  c.image_height = h;
  c.input_components = components;
  c.in_color_space = space;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 100, TRUE);
  for (int i = 0; i < c.num_components; ++i) c.comp_info[i].h_samp_factor = c.comp_info[i].v_samp_factor = 1;
  if (progressive) jpeg_simple_progression(&c);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < h) {
    JSAMPROW row = const_cast<JSAMPROW>(&px[static_cast<std::size_t>(c.next_scanline) * w * components]);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  Bytes out(buf, buf + size);
  std::free(buf);
  return out;
}

inline Rgb8 test_picture(std::uint32_t w, std::uint32_t h) {
  // Smooth shapes: JPEG at quality 100 keeps them within a few levels.
  Rgb8 img = blank(w, h, Rgb{30, 90, 200});
  fill_circle(img, w * 0.4f, h * 0.5f, h * 0.3f, Rgb{240, 200, 20});
  fill_rect(img, w * 0.6f, h * 0.1f, w * 0.9f, h * 0.6f, Rgb{10, 160, 60});
  return img;
}

}  // namespace tandem::image::testing_writers
