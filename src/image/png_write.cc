// 8-bit RGB PNG writing into memory. libpng's error callback longjmps out (see decode.cc for the pattern).
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include <png.h>

#include "image/image.h"

namespace tandem::image {
namespace {

struct PngSink {
  std::vector<std::uint8_t>* out = nullptr;
  char message[256] = {};
};

extern "C" void png_write_cb(png_structp png, png_bytep data, png_size_t n) {
  auto* s = static_cast<PngSink*>(png_get_io_ptr(png));
  try {
    s->out->insert(s->out->end(), data, data + n);
  } catch (const std::bad_alloc&) {
    png_error(png, "out of memory for the encoded PNG");  // no C++ exception may cross libpng's C frames
  }
}

extern "C" void png_flush_cb(png_structp) {}

extern "C" void png_write_error_cb(png_structp png, png_const_charp msg) {
  auto* s = static_cast<PngSink*>(png_get_error_ptr(png));
  std::snprintf(s->message, sizeof s->message, "%s", msg);
  png_longjmp(png, 1);
}

extern "C" void png_write_warning_cb(png_structp, png_const_charp) {}

class PngWriter {
 public:
  explicit PngWriter(std::vector<std::uint8_t>* out) { sink_.out = out; }
  ~PngWriter() {
    if (png_ != nullptr) png_destroy_write_struct(&png_, info_ != nullptr ? &info_ : nullptr);
  }
  PngWriter(const PngWriter&) = delete;
  PngWriter& operator=(const PngWriter&) = delete;

  bool write(const Rgb8& img, png_bytep* rows) {
    png_ = png_create_write_struct(PNG_LIBPNG_VER_STRING, &sink_, png_write_error_cb, png_write_warning_cb);
    if (png_ == nullptr) return false;
    info_ = png_create_info_struct(png_);
    if (info_ == nullptr) return false;
    if (setjmp(png_jmpbuf(png_))) return false;
    png_set_write_fn(png_, &sink_, png_write_cb, png_flush_cb);
    png_set_IHDR(png_, info_, img.width, img.height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png_, info_);
    png_write_image(png_, rows);
    png_write_end(png_, nullptr);
    return true;
  }

  const char* message() const { return sink_.message[0] != '\0' ? sink_.message : "cannot create the PNG writer"; }

 private:
  PngSink sink_;
  png_structp png_ = nullptr;
  png_infop info_ = nullptr;
};

}  // namespace

Result<std::vector<std::uint8_t>> encode_png(const Rgb8& img) {
  const std::uint64_t want = static_cast<std::uint64_t>(img.width) * img.height * 3;
  if (img.width == 0 || img.height == 0 || img.pixels.size() != want) {
    return fail(Errc::invalid_argument, "encode_png: image " + std::to_string(img.width) + "x" +
                                            std::to_string(img.height) + " with " + std::to_string(img.pixels.size()) +
                                            " bytes of pixels (need a nonzero size and width * height * 3 bytes)");
  }
  // PNG's own limit on a side is 2^31 - 1; libpng's default user limit is 1,000,000 per side.
  if (img.width > 1'000'000 || img.height > 1'000'000) {
    return fail(Errc::invalid_argument, "encode_png: a side over 1000000 pixels");
  }
  std::vector<std::uint8_t> out;
  std::vector<png_bytep> rows;
  try {
    rows.resize(img.height);
    out.reserve(want / 2 + 1024);
  } catch (const std::bad_alloc&) {
    return fail(Errc::out_of_memory, "encode_png: cannot allocate buffers");
  }
  for (std::uint32_t y = 0; y < img.height; ++y) {
    // libpng's row type is non-const although writing only reads it.
    rows[y] = const_cast<png_bytep>(&img.pixels[static_cast<std::size_t>(y) * img.width * 3]);
  }
  PngWriter w(&out);
  if (!w.write(img, rows.data())) return fail(Errc::internal, std::string("encode_png: libpng: ") + w.message());
  return out;
}

}  // namespace tandem::image
