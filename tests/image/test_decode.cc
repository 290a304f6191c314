// JPEG/PNG decoding of untrusted bytes and PNG writing (src/image/decode.cc, png_write.cc): round trips, every PNG
// colour type written here with libpng, JPEGs written here with libjpeg, and typed refusals for corrupt, truncated,
// non-image, empty and over-limit inputs (a huge header is refused before any pixel is allocated).
#include <gtest/gtest.h>

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <jpeglib.h>
#include <png.h>

#include "image/draw.h"
#include "image/image.h"
#include "image_writers.h"

namespace tandem::image {
namespace {

using namespace testing_writers;

int max_diff(const Bytes& a, const Bytes& b) {
  if (a.size() != b.size()) return 256;
  int m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(int{a[i]} - int{b[i]}));
  return m;
}

void expect_refused(const Bytes& bytes, Errc code, const std::string& needle, const DecodeLimits& limits = {}) {
  auto r = decode(bytes, limits);
  ASSERT_FALSE(r.ok()) << needle;
  EXPECT_EQ(r.error().code, code) << r.error().message;
  EXPECT_NE(r.error().message.find(needle), std::string::npos) << "'" << r.error().message << "' lacks " << needle;
}

// --- sniff, PNG -------------------------------------------------------------------------------------------------

TEST(ImageSniff, ByMagic) {
  EXPECT_EQ(*sniff(Bytes{0xff, 0xd8, 0xff, 0xe0}), Format::jpeg);
  EXPECT_EQ(*sniff(Bytes{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'}), Format::png);
  for (const Bytes& b : {Bytes{}, Bytes{0xff, 0xd8}, Bytes{'G', 'I', 'F', '8', '9', 'a'}, Bytes{0x89, 'P', 'N', 'G'}}) {
    auto r = sniff(b);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, Errc::invalid_argument);
    EXPECT_EQ(r.error().message, "not a JPEG or PNG image");
  }
}

TEST(ImagePng, EncodeDecodeRoundTrip) {
  std::mt19937 rng(3);
  Rgb8 img = blank(13, 7, Rgb{});
  for (auto& v : img.pixels) v = static_cast<std::uint8_t>(rng());
  auto png = encode_png(img);
  ASSERT_TRUE(png.ok()) << png.error().message;
  auto back = decode(*png);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->width, 13u);
  EXPECT_EQ(back->height, 7u);
  EXPECT_EQ(back->pixels, img.pixels);
}

TEST(ImagePng, EncodeRefusesInconsistentImages) {
  Rgb8 bad;
  EXPECT_EQ(encode_png(bad).error().code, Errc::invalid_argument);
  bad.width = 2;
  bad.height = 2;
  bad.pixels.assign(11, 0);
  EXPECT_EQ(encode_png(bad).error().code, Errc::invalid_argument);
}

TEST(ImagePng, GreyGreyAlphaPaletteSixteenBitInterlacedAndOneBit) {
  // 8-bit grey: replicated.
  {
    PngSpec s{2, 1, PNG_COLOR_TYPE_GRAY, 8, false, {7, 200}, {}, {}};
    auto r = decode(write_png(s));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->pixels, (Bytes{7, 7, 7, 200, 200, 200}));
  }
  // Grey + alpha: alpha dropped, not composited (PIL's convert("RGB")).
  {
    PngSpec s{2, 1, PNG_COLOR_TYPE_GRAY_ALPHA, 8, false, {50, 0, 60, 128}, {}, {}};
    auto r = decode(write_png(s));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->pixels, (Bytes{50, 50, 50, 60, 60, 60}));
  }
  // RGBA: alpha dropped.
  {
    PngSpec s{1, 1, PNG_COLOR_TYPE_RGBA, 8, false, {1, 2, 3, 0}, {}, {}};
    auto r = decode(write_png(s));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->pixels, (Bytes{1, 2, 3}));
  }
  // Palette with tRNS: the palette colours, transparency dropped.
  {
    PngSpec s{3, 1, PNG_COLOR_TYPE_PALETTE, 8, false, {2, 0, 1}, {{10, 20, 30}, {40, 50, 60}, {70, 80, 90}}, {0, 128}};
    auto r = decode(write_png(s));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->pixels, (Bytes{70, 80, 90, 10, 20, 30, 40, 50, 60}));
  }
  // 16-bit RGB: the high byte of each big-endian sample (PIL's "RGB;16B").
  {
    PngSpec s{1, 1, PNG_COLOR_TYPE_RGB, 16, false, {0x12, 0x34, 0xab, 0xff, 0xff, 0x00}, {}, {}};
    auto r = decode(write_png(s));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->pixels, (Bytes{0x12, 0xab, 0xff}));
  }
  // 16-bit grey.
  {
    PngSpec s{1, 1, PNG_COLOR_TYPE_GRAY, 16, false, {0x80, 0x01}, {}, {}};
    auto r = decode(write_png(s));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->pixels, (Bytes{0x80, 0x80, 0x80}));
  }
  // 1-bit grey, 3 pixels 1 0 1 packed MSB first: 0b1010'0000; 1 scales to 255.
  {
    PngSpec s{3, 1, PNG_COLOR_TYPE_GRAY, 1, false, {0xa0}, {}, {}};
    auto r = decode(write_png(s));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->pixels, (Bytes{255, 255, 255, 0, 0, 0, 255, 255, 255}));
  }
  // Adam7-interlaced RGB: the same pixels as written.
  {
    const Rgb8 pic = test_picture(19, 11);
    PngSpec s{19, 11, PNG_COLOR_TYPE_RGB, 8, true, pic.pixels, {}, {}};
    auto r = decode(write_png(s));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->pixels, pic.pixels);
  }
}

// A PNG signature and IHDR with a correct CRC, nothing after it.
Bytes png_header(std::uint32_t w, std::uint32_t h) {
  Bytes b = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R'};
  for (std::uint32_t v : {w, h}) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<std::uint8_t>(v >> s));
  }
  b.insert(b.end(), {8, 2, 0, 0, 0});  // 8-bit RGB, no interlace
  std::uint32_t crc = 0xffffffffu;      // CRC-32 over type + data, as PNG defines it
  for (std::size_t i = 12; i < b.size(); ++i) {
    crc ^= b[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  crc ^= 0xffffffffu;
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<std::uint8_t>(crc >> s));
  return b;
}

TEST(ImagePng, HugeHeaderRefusedBeforeAllocation) {
  // 100000 x 100000 x 3 would be 30 GB: refused from the header (the file has no pixel data at all, so a decoder
  // that allocated first would fail differently or not at all).
  expect_refused(png_header(100000, 100000), Errc::invalid_argument, "exceeds max_side 16384");
  // Within max_side but over max_pixels.
  expect_refused(png_header(16000, 16000), Errc::invalid_argument, "more than max_pixels");
  // Custom limits.
  DecodeLimits tight;
  tight.max_side = 8;
  expect_refused(png_header(9, 2), Errc::invalid_argument, "max_side 8", tight);
  // A zero side is refused by libpng's IHDR checks.
  expect_refused(png_header(0, 5), Errc::invalid_argument, "PNG");
}

TEST(ImagePng, TruncatedCorruptAndOversizedInput) {
  const Rgb8 pic = test_picture(32, 16);
  const Bytes good = *encode_png(pic);
  // Truncated: inside the IHDR, inside IDAT, just before IEND.
  for (std::size_t n : {std::size_t{12}, std::size_t{20}, good.size() / 2, good.size() - 12}) {
    expect_refused(Bytes(good.begin(), good.begin() + n), Errc::invalid_argument, "PNG");
  }
  // A flipped bit in IDAT's compressed data fails its CRC.
  Bytes bad = good;
  bad[bad.size() / 2] ^= 0x10;
  expect_refused(bad, Errc::invalid_argument, "corrupt PNG");
  // max_bytes is checked before anything else.
  DecodeLimits small;
  small.max_bytes = 16;
  expect_refused(good, Errc::invalid_argument, "exceeds max_bytes 16", small);
}

// --- JPEG -------------------------------------------------------------------------------------------------------

TEST(ImageJpeg, QualityHundredBaselineAndProgressive) {
  const Rgb8 pic = test_picture(40, 24);
  for (bool progressive : {false, true}) {
    const Bytes jpg = write_jpeg(pic.width, pic.height, pic.pixels, JCS_RGB, 3, progressive);
    ASSERT_EQ(*sniff(jpg), Format::jpeg);
    auto r = decode(jpg);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->width, 40u);
    EXPECT_EQ(r->height, 24u);
    // Quality 100 4:4:4 still rounds through YCbCr and the DCT; sharp edges ring by a few levels.
    EXPECT_LE(max_diff(r->pixels, pic.pixels), 12) << "progressive " << progressive;
  }
}

TEST(ImageJpeg, GreyAndCmyk) {
  {
    Bytes grey(16 * 8);
    for (std::size_t i = 0; i < grey.size(); ++i) grey[i] = static_cast<std::uint8_t>(i * 2);
    auto r = decode(write_jpeg(16, 8, grey, JCS_GRAYSCALE, 1));
    ASSERT_TRUE(r.ok()) << r.error().message;
    for (std::size_t i = 0; i < grey.size(); ++i) {
      EXPECT_EQ(r->pixels[i * 3], r->pixels[i * 3 + 1]);
      EXPECT_EQ(r->pixels[i * 3], r->pixels[i * 3 + 2]);
      EXPECT_NEAR(r->pixels[i * 3], grey[i], 3);
    }
  }
  {
    // libjpeg writes CMYK with an Adobe marker; stored values follow Adobe's inverted convention (255 = no ink).
    // Stored (255, 0, 255, 255): magenta ink only -> RGB (255, 0, 255). Stored (128, 255, 255, 255): C = 127 ->
    // R = (255 - 127) * 255 / 255 = 128, G = B = 255. Stored K = 0 (full black) -> (0, 0, 0).
    Bytes cmyk;
    for (int i = 0; i < 64; ++i) cmyk.insert(cmyk.end(), {255, 0, 255, 255});
    for (int i = 0; i < 64; ++i) cmyk.insert(cmyk.end(), {128, 255, 255, 255});
    for (int i = 0; i < 64; ++i) cmyk.insert(cmyk.end(), {200, 100, 50, 0});
    auto r = decode(write_jpeg(8, 24, cmyk, JCS_CMYK, 4));
    ASSERT_TRUE(r.ok()) << r.error().message;
    const auto px = [&](std::uint32_t y) { return Bytes(&r->pixels[y * 8 * 3], &r->pixels[y * 8 * 3 + 3]); };
    EXPECT_LE(max_diff(px(3), Bytes{255, 0, 255}), 2);
    EXPECT_LE(max_diff(px(11), Bytes{128, 255, 255}), 2);
    EXPECT_LE(max_diff(px(20), Bytes{0, 0, 0}), 2);
  }
}

TEST(ImageJpeg, TruncatedCorruptAndHugeHeader) {
  const Rgb8 pic = test_picture(48, 32);
  const Bytes good = write_jpeg(pic.width, pic.height, pic.pixels, JCS_RGB, 3);
  // Truncated in the header and in the scan data: libjpeg would pad with grey; we refuse like PIL.
  expect_refused(Bytes(good.begin(), good.begin() + 4), Errc::invalid_argument, "JPEG");
  expect_refused(Bytes(good.begin(), good.begin() + 100), Errc::invalid_argument, "JPEG");
  expect_refused(Bytes(good.begin(), good.begin() + good.size() / 2), Errc::invalid_argument, "truncated JPEG");
  // The SOF0 marker's dimensions patched to 60000 x 60000: refused from the header.
  Bytes huge = good;
  std::size_t sof = 0;
  for (std::size_t i = 2; i + 9 < huge.size(); ++i) {
    if (huge[i] == 0xff && huge[i + 1] == 0xc0) {
      sof = i;
      break;
    }
  }
  ASSERT_NE(sof, 0u);
  huge[sof + 5] = 0xea;  // height 0xea60 = 60000
  huge[sof + 6] = 0x60;
  huge[sof + 7] = 0xea;  // width
  huge[sof + 8] = 0x60;
  expect_refused(huge, Errc::invalid_argument, "exceeds max_side");
  // Zero height in the frame header.
  Bytes zero = good;
  zero[sof + 5] = 0;
  zero[sof + 6] = 0;
  expect_refused(zero, Errc::invalid_argument, "JPEG");
  // A garbled quantisation table / frame header.
  Bytes bad = good;
  bad[sof + 4] = 3;  // sample precision 3 bits
  expect_refused(bad, Errc::invalid_argument, "corrupt JPEG");
}

TEST(ImageDecode, EmptyAndNonImageInput) {
  expect_refused(Bytes{}, Errc::invalid_argument, "empty input");
  const std::string text = "hello, this is not an image";
  expect_refused(Bytes(text.begin(), text.end()), Errc::invalid_argument, "not a JPEG or PNG image");
}

// Every prefix of a valid PNG and JPEG decodes or is refused with a typed error: never a crash (ASan in the
// sanitizer build), never a message on stderr that libjpeg/libpng print by default.
TEST(ImageDecode, EveryPrefixIsHandled) {
  const Rgb8 pic = test_picture(24, 16);
  for (const Bytes& whole : {*encode_png(pic), write_jpeg(pic.width, pic.height, pic.pixels, JCS_RGB, 3, true)}) {
    testing::internal::CaptureStderr();
    for (std::size_t n = 0; n < whole.size(); ++n) {
      auto r = decode(std::span<const std::uint8_t>(whole.data(), n));
      ASSERT_FALSE(r.ok()) << "prefix " << n << " of " << whole.size();
      EXPECT_EQ(r.error().code, Errc::invalid_argument) << r.error().message;
    }
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
    EXPECT_TRUE(decode(whole).ok());
  }
}

}  // namespace
}  // namespace tandem::image
