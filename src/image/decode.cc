// JPEG and PNG decoding of untrusted bytes. Both C libraries report fatal errors through a callback that must not
// return; we longjmp out of it. Every setjmp sits in a small member function whose frame holds only trivially
// destructible locals, so the jump skips no C++ destructor; buffers are allocated by the caller between phases.
#include <csetjmp>
#include <cstddef>
#include <cstdio>  // jpeglib.h needs FILE and size_t declared first
#include <cstring>
#include <new>
#include <string>

#include <jerror.h>
#include <jpeglib.h>
#include <png.h>

#include "image/image.h"

namespace tandem::image {
namespace {

constexpr std::uint8_t kPngMagic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
// Progressive JPEGs can carry thousands of tiny scans that each re-walk the coefficient buffer; a real encoder
// writes about ten. Refusing more bounds the CPU time an attacker can buy (libjpeg-turbo's own advice).
constexpr int kMaxJpegScans = 500;

void copy_message(char* dst, std::size_t cap, const char* src) {
  std::snprintf(dst, cap, "%s", src);
}

Status check_limits(const char* what, std::uint64_t w, std::uint64_t h, const DecodeLimits& limits) {
  if (w == 0 || h == 0) {
    return fail(Errc::invalid_argument, std::string(what) + " image has a zero side (" + std::to_string(w) + "x" +
                                            std::to_string(h) + ")");
  }
  if (w > limits.max_side || h > limits.max_side) {
    return fail(Errc::invalid_argument, std::string(what) + " image " + std::to_string(w) + "x" + std::to_string(h) +
                                            " exceeds max_side " + std::to_string(limits.max_side));
  }
  if (w * h > limits.max_pixels) {
    return fail(Errc::invalid_argument, std::string(what) + " image " + std::to_string(w) + "x" + std::to_string(h) +
                                            " has " + std::to_string(w * h) + " pixels, more than max_pixels " +
                                            std::to_string(limits.max_pixels));
  }
  return {};
}

// Allocates width * height * 3 bytes, or out_of_memory.
Status allocate(Rgb8& out, std::uint32_t w, std::uint32_t h) {
  try {
    out.width = w;
    out.height = h;
    out.pixels.assign(static_cast<std::size_t>(w) * h * 3, 0);
  } catch (const std::bad_alloc&) {
    return fail(Errc::out_of_memory,
                "cannot allocate " + std::to_string(static_cast<std::uint64_t>(w) * h * 3) + " bytes for the image");
  }
  return {};
}

// --- JPEG ------------------------------------------------------------------------------------------------------------

struct JpegError {
  jpeg_error_mgr mgr;  // first member: libjpeg hands us a pointer to it
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX + 64];
  bool premature_eof = false;
};

extern "C" void jpeg_error_exit_cb(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  char buf[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, buf);
  copy_message(err->message, sizeof err->message, buf);
  std::longjmp(err->jump, 1);
}

// Warnings (level -1) are not printed; the one that matters, a premature end of data (libjpeg then pads the image
// with grey and carries on), is remembered and turned into an error like PIL's "image file is truncated". Other
// corrupt-data warnings (extraneous bytes before a marker) are tolerated, as PIL does. Trace messages are dropped.
extern "C" void jpeg_emit_message_cb(j_common_ptr cinfo, int msg_level) {
  if (msg_level != -1) return;
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  if (cinfo->err->msg_code == JWRN_JPEG_EOF) err->premature_eof = true;
  cinfo->err->num_warnings++;
}

extern "C" void jpeg_progress_cb(j_common_ptr cinfo) {
  if (cinfo->is_decompressor) {
    auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
    if (d->input_scan_number > kMaxJpegScans) {
      auto* err = reinterpret_cast<JpegError*>(cinfo->err);
      std::snprintf(err->message, sizeof err->message, "more than %d scans (progressive JPEG)", kMaxJpegScans);
      std::longjmp(err->jump, 1);
    }
  }
}

class JpegReader {
 public:
  JpegReader() {
    cinfo_.err = jpeg_std_error(&err_.mgr);
    err_.mgr.error_exit = jpeg_error_exit_cb;
    err_.mgr.emit_message = jpeg_emit_message_cb;
    err_.message[0] = '\0';
    progress_.progress_monitor = jpeg_progress_cb;
  }
  ~JpegReader() {
    if (created_) jpeg_destroy_decompress(&cinfo_);
  }
  JpegReader(const JpegReader&) = delete;
  JpegReader& operator=(const JpegReader&) = delete;

  // Creates the decompressor, reads the header and chooses the output colour space; false on a libjpeg error.
  bool read_header(const std::uint8_t* data, std::size_t size) {
    if (setjmp(err_.jump)) return false;
    jpeg_create_decompress(&cinfo_);
    created_ = true;
    cinfo_.progress = &progress_;
    jpeg_mem_src(&cinfo_, data, static_cast<unsigned long>(size));
    jpeg_read_header(&cinfo_, TRUE);
    return true;
  }

  // Starts decompression in out_space and reads every scanline; row_buf holds one output row.
  bool read_pixels(J_COLOR_SPACE out_space, std::uint8_t* row_buf, Rgb8& out, bool cmyk) {
    if (setjmp(err_.jump)) return false;
    cinfo_.out_color_space = out_space;
    jpeg_start_decompress(&cinfo_);
    if (cinfo_.output_width != out.width || cinfo_.output_height != out.height ||
        cinfo_.output_components != (cmyk ? 4 : 3)) {
      copy_message(err_.message, sizeof err_.message, "unexpected output geometry");
      return false;
    }
    while (cinfo_.output_scanline < cinfo_.output_height) {
      const JDIMENSION y = cinfo_.output_scanline;
      JSAMPROW row = row_buf;
      if (jpeg_read_scanlines(&cinfo_, &row, 1) != 1) {
        copy_message(err_.message, sizeof err_.message, "no scanline returned");
        return false;
      }
      std::uint8_t* dst = &out.pixels[static_cast<std::size_t>(y) * out.width * 3];
      if (!cmyk) {
        std::memcpy(dst, row_buf, static_cast<std::size_t>(out.width) * 3);
        continue;
      }
      // libjpeg hands out CMYK as stored; Adobe's writers (and libjpeg itself) store it inverted, and PIL reads every
      // CMYK JPEG as inverted ("CMYK;I") before its CMYK -> RGB: R = (255 - C)(255 - K) / 255 with C = 255 - c_stored,
      // i.e. R = k_stored - k_stored * (255 - c_stored) / 255, with PIL's rounding of that division.
      for (std::uint32_t x = 0; x < out.width; ++x) {
        const int nk = row_buf[x * 4 + 3];
        for (int c = 0; c < 3; ++c) {
          const int ink = 255 - row_buf[x * 4 + c];
          const int t = ink * nk + 128;
          const int v = nk - (((t >> 8) + t) >> 8);
          dst[x * 3 + c] = static_cast<std::uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
        }
      }
    }
    jpeg_finish_decompress(&cinfo_);
    return true;
  }

  jpeg_decompress_struct& cinfo() { return cinfo_; }
  const char* message() const { return err_.message; }
  bool premature_eof() const { return err_.premature_eof; }

 private:
  jpeg_decompress_struct cinfo_{};
  JpegError err_{};
  jpeg_progress_mgr progress_{};
  bool created_ = false;
};

Result<Rgb8> decode_jpeg(std::span<const std::uint8_t> bytes, const DecodeLimits& limits) {
  JpegReader r;
  if (!r.read_header(bytes.data(), bytes.size())) {
    return fail(Errc::invalid_argument, std::string("corrupt JPEG header: ") + r.message());
  }
  auto& ci = r.cinfo();
  TANDEM_TRY(check_limits("JPEG", ci.image_width, ci.image_height, limits));
  J_COLOR_SPACE out_space = JCS_RGB;
  bool cmyk = false;
  switch (ci.jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB:
      break;  // libjpeg converts all three to RGB itself (grey is replicated, as PIL's L -> RGB)
    case JCS_CMYK:
    case JCS_YCCK:
      out_space = JCS_CMYK;  // libjpeg turns YCCK into CMYK; we do CMYK -> RGB as PIL does
      cmyk = true;
      break;
    default:
      return fail(Errc::unsupported, "JPEG colour space " + std::to_string(static_cast<int>(ci.jpeg_color_space)) +
                                         " with " + std::to_string(ci.num_components) +
                                         " components (supported: grey, YCbCr, RGB, CMYK, YCCK)");
  }
  Rgb8 out;
  TANDEM_TRY(allocate(out, ci.image_width, ci.image_height));
  std::vector<std::uint8_t> row;
  try {
    row.resize(static_cast<std::size_t>(ci.image_width) * 4);
  } catch (const std::bad_alloc&) {
    return fail(Errc::out_of_memory, "cannot allocate a JPEG row buffer");
  }
  if (!r.read_pixels(out_space, row.data(), out, cmyk)) {
    return fail(Errc::invalid_argument, std::string("corrupt JPEG data: ") + r.message());
  }
  if (r.premature_eof()) return fail(Errc::invalid_argument, "truncated JPEG: premature end of data");
  return out;
}

// --- PNG -------------------------------------------------------------------------------------------------------------

struct PngState {
  const std::uint8_t* data = nullptr;
  std::size_t size = 0, pos = 0;
  char message[256] = {};
};

extern "C" void png_read_cb(png_structp png, png_bytep dst, png_size_t n) {
  auto* s = static_cast<PngState*>(png_get_io_ptr(png));
  if (n > s->size - s->pos) png_error(png, "truncated PNG: unexpected end of data");
  std::memcpy(dst, s->data + s->pos, n);
  s->pos += n;
}

extern "C" void png_error_cb(png_structp png, png_const_charp msg) {
  auto* s = static_cast<PngState*>(png_get_error_ptr(png));
  copy_message(s->message, sizeof s->message, msg);
  png_longjmp(png, 1);
}

extern "C" void png_warning_cb(png_structp, png_const_charp) {}  // quiet: warnings are about ancillary chunks

class PngReader {
 public:
  explicit PngReader(std::span<const std::uint8_t> bytes) {
    state_.data = bytes.data();
    state_.size = bytes.size();
  }
  ~PngReader() {
    if (png_ != nullptr) png_destroy_read_struct(&png_, info_ != nullptr ? &info_ : nullptr, nullptr);
  }
  PngReader(const PngReader&) = delete;
  PngReader& operator=(const PngReader&) = delete;

  // Reads up to the first IDAT and sets the transformations to 8-bit RGB; false on a libpng error.
  bool read_header() {
    png_ = png_create_read_struct(PNG_LIBPNG_VER_STRING, &state_, png_error_cb, png_warning_cb);
    if (png_ == nullptr) {
      copy_message(state_.message, sizeof state_.message, "cannot create the PNG reader");
      return false;
    }
    info_ = png_create_info_struct(png_);
    if (info_ == nullptr) {
      copy_message(state_.message, sizeof state_.message, "cannot create the PNG info");
      return false;
    }
    if (setjmp(png_jmpbuf(png_))) return false;
    png_set_read_fn(png_, &state_, png_read_cb);
    // Bound what ancillary chunks (zTXt, iCCP: compressed, so small input can expand a lot) may allocate.
    png_set_chunk_cache_max(png_, 256);
    png_set_chunk_malloc_max(png_, 8u << 20);
    png_read_info(png_, info_);
    width_ = png_get_image_width(png_, info_);
    height_ = png_get_image_height(png_, info_);
    const int color = png_get_color_type(png_, info_);
    // PIL's convert("RGB"): palette -> its colours, grey -> replicated, alpha (channel or tRNS) dropped; 16-bit
    // samples keep their high byte (PIL's "RGB;16B" unpacker).
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png_);
    if (color == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(png_, info_) < 8) png_set_expand_gray_1_2_4_to_8(png_);
    png_set_strip_16(png_);
    if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png_);
    png_set_strip_alpha(png_);
    passes_ = png_set_interlace_handling(png_);
    png_read_update_info(png_, info_);
    channels_ = png_get_channels(png_, info_);
    depth_ = png_get_bit_depth(png_, info_);
    rowbytes_ = png_get_rowbytes(png_, info_);
    return true;
  }

  // Reads every row (all passes when interlaced) into rows[] and the end of the stream.
  bool read_pixels(png_bytep* rows) {
    if (setjmp(png_jmpbuf(png_))) return false;
    png_read_image(png_, rows);
    png_read_end(png_, nullptr);
    return true;
  }

  std::uint32_t width() const { return width_; }
  std::uint32_t height() const { return height_; }
  int channels() const { return channels_; }
  int depth() const { return depth_; }
  std::size_t rowbytes() const { return rowbytes_; }
  const char* message() const { return state_.message; }

 private:
  PngState state_;
  png_structp png_ = nullptr;
  png_infop info_ = nullptr;
  std::uint32_t width_ = 0, height_ = 0;
  int channels_ = 0, depth_ = 0, passes_ = 0;
  std::size_t rowbytes_ = 0;
};

Result<Rgb8> decode_png(std::span<const std::uint8_t> bytes, const DecodeLimits& limits) {
  // IHDR must be the first chunk; its size is checked before libpng reads on (png_read_info walks every chunk up
  // to the first IDAT), so a huge claim is refused on the first 24 bytes alone.
  if (bytes.size() >= 24 && std::memcmp(bytes.data() + 12, "IHDR", 4) == 0) {
    const auto be32 = [&](std::size_t at) {
      return std::uint32_t{bytes[at]} << 24 | std::uint32_t{bytes[at + 1]} << 16 | std::uint32_t{bytes[at + 2]} << 8 |
             std::uint32_t{bytes[at + 3]};
    };
    const std::uint32_t w = be32(16), h = be32(20);
    if (w != 0 && h != 0) TANDEM_TRY(check_limits("PNG", w, h, limits));  // zero: libpng names the field
  }
  PngReader r(bytes);
  if (!r.read_header()) return fail(Errc::invalid_argument, std::string("corrupt PNG header: ") + r.message());
  TANDEM_TRY(check_limits("PNG", r.width(), r.height(), limits));
  if (r.channels() != 3 || r.depth() != 8 || r.rowbytes() != static_cast<std::size_t>(r.width()) * 3) {
    return fail(Errc::internal, "PNG transformations gave " + std::to_string(r.channels()) + " channels of " +
                                    std::to_string(r.depth()) + " bits, not 8-bit RGB");
  }
  Rgb8 out;
  TANDEM_TRY(allocate(out, r.width(), r.height()));
  std::vector<png_bytep> rows;
  try {
    rows.resize(out.height);
  } catch (const std::bad_alloc&) {
    return fail(Errc::out_of_memory, "cannot allocate PNG row pointers");
  }
  for (std::uint32_t y = 0; y < out.height; ++y) rows[y] = &out.pixels[static_cast<std::size_t>(y) * out.width * 3];
  if (!r.read_pixels(rows.data())) return fail(Errc::invalid_argument, std::string("corrupt PNG data: ") + r.message());
  return out;
}

}  // namespace

Result<Format> sniff(std::span<const std::uint8_t> bytes) {
  if (bytes.size() >= 3 && bytes[0] == 0xff && bytes[1] == 0xd8 && bytes[2] == 0xff) return Format::jpeg;
  if (bytes.size() >= sizeof kPngMagic && std::memcmp(bytes.data(), kPngMagic, sizeof kPngMagic) == 0) {
    return Format::png;
  }
  return fail(Errc::invalid_argument, "not a JPEG or PNG image");
}

Result<Rgb8> decode(std::span<const std::uint8_t> bytes, const DecodeLimits& limits) {
  if (bytes.size() > limits.max_bytes) {
    return fail(Errc::invalid_argument, "image of " + std::to_string(bytes.size()) + " bytes exceeds max_bytes " +
                                            std::to_string(limits.max_bytes));
  }
  auto format = sniff(bytes);
  if (!format.ok()) {
    if (bytes.empty()) return fail(Errc::invalid_argument, "not a JPEG or PNG image: empty input");
    return fail(std::move(format).error());
  }
  return *format == Format::jpeg ? decode_jpeg(bytes, limits) : decode_png(bytes, limits);
}

}  // namespace tandem::image
