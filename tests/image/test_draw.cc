// The rasteriser (src/image/draw.h): coverage by hand on small images, clipping, both triangle windings, bad input.
#include "image/draw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace tandem::image {
namespace {

const Rgb kBlack{0, 0, 0};
const Rgb kWhite{255, 255, 255};

std::uint8_t red_at(const Rgb8& img, std::uint32_t x, std::uint32_t y) {
  return img.pixels[(static_cast<std::size_t>(y) * img.width + x) * 3];
}

TEST(ImageDraw, BlankFillsEveryPixel) {
  const Rgb8 img = blank(3, 2, Rgb{1, 2, 3});
  ASSERT_EQ(img.width, 3u);
  ASSERT_EQ(img.height, 2u);
  ASSERT_EQ(img.pixels.size(), 18u);
  for (std::size_t i = 0; i < img.pixels.size(); i += 3) {
    EXPECT_EQ(img.pixels[i], 1);
    EXPECT_EQ(img.pixels[i + 1], 2);
    EXPECT_EQ(img.pixels[i + 2], 3);
  }
}

TEST(ImageDraw, RectOnPixelBoundariesIsExact) {
  Rgb8 img = blank(4, 4, kBlack);
  fill_rect(img, 1, 1, 3, 2, kWhite);
  for (std::uint32_t y = 0; y < 4; ++y)
    for (std::uint32_t x = 0; x < 4; ++x)
      EXPECT_EQ(red_at(img, x, y), (y == 1 && (x == 1 || x == 2)) ? 255 : 0) << x << "," << y;
}

TEST(ImageDraw, HalfCoveredPixelGetsHalfTheColour) {
  // [0, 0.5) x [0, 1) covers the left 2 of 4 sample columns: 8 of 16 samples; (255*8 + 0*8 + 8) / 16 = 128.
  Rgb8 img = blank(2, 1, kBlack);
  fill_rect(img, 0, 0, 0.5f, 1, kWhite);
  EXPECT_EQ(red_at(img, 0, 0), 128);
  EXPECT_EQ(red_at(img, 1, 0), 0);
  // Without antialiasing the centre (0.5, 0.5) is not inside [0, 0.5): nothing is painted.
  Rgb8 hard = blank(2, 1, kBlack);
  fill_rect(hard, 0, 0, 0.5f, 1, kWhite, /*antialias=*/false);
  EXPECT_EQ(red_at(hard, 0, 0), 0);
}

TEST(ImageDraw, CircleCentreFullEdgePartialOutsideUntouched) {
  Rgb8 img = blank(9, 9, kBlack);
  fill_circle(img, 4.5f, 4.5f, 3.0f, kWhite);
  EXPECT_EQ(red_at(img, 4, 4), 255);  // the centre pixel is wholly inside
  EXPECT_EQ(red_at(img, 0, 0), 0);    // far corner
  // The pixel straddling the rim on the axis, x in [7, 8): samples at x = 7.125..7.875 are 2.625..3.375 from the
  // centre, so the two nearer columns (2.625, 2.875) are inside for the middle rows: partial coverage.
  const int rim = red_at(img, 7, 4);
  EXPECT_GT(rim, 0);
  EXPECT_LT(rim, 255);
}

TEST(ImageDraw, TriangleBothWindingsAgree) {
  Rgb8 a = blank(8, 8, kBlack), b = blank(8, 8, kBlack);
  fill_triangle(a, 1, 1, 7, 1, 1, 7, kWhite);
  fill_triangle(b, 1, 1, 1, 7, 7, 1, kWhite);
  EXPECT_EQ(a.pixels, b.pixels);
  EXPECT_EQ(red_at(a, 2, 2), 255);  // inside the right angle
  EXPECT_EQ(red_at(a, 6, 6), 0);    // beyond the hypotenuse
}

TEST(ImageDraw, ShapesOutsideOrDegenerateDrawNothingAndNeverCrash) {
  Rgb8 img = blank(4, 4, kBlack);
  const Rgb8 before = img;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  fill_circle(img, -100, -100, 5, kWhite);
  fill_circle(img, 2, 2, 0, kWhite);
  fill_circle(img, 2, 2, -1, kWhite);
  fill_circle(img, nan, 2, 1, kWhite);
  fill_rect(img, 10, 10, 20, 20, kWhite);
  fill_rect(img, -inf, 0, 1, 1, kWhite);
  fill_triangle(img, 0, 0, 1, 1, 2, 2, kWhite);  // collinear
  fill_triangle(img, nan, 0, 1, 1, 2, 0, kWhite);
  EXPECT_EQ(img.pixels, before.pixels);
  // A huge shape covering everything is clipped to the image.
  fill_circle(img, 2, 2, 1e30f, kWhite);
  for (auto v : img.pixels) EXPECT_EQ(v, 255);
  // An empty or inconsistent image is left alone.
  Rgb8 empty;
  fill_circle(empty, 0, 0, 3, kWhite);
  Rgb8 bad;
  bad.width = 10;
  bad.height = 10;
  fill_rect(bad, 0, 0, 5, 5, kWhite);
  EXPECT_TRUE(bad.pixels.empty());
}

}  // namespace
}  // namespace tandem::image
