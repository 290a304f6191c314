// CLIP preprocessing (src/image/preprocess.cc): PIL's bicubic weights derived by hand, per-pass uint8 rounding, HF's
// resize sizes and centre crop (with its zero padding), the normalisation of one pixel, and preprocessor_config.json.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "image/image.h"

namespace tandem::image {
namespace {

Rgb8 make(std::uint32_t w, std::uint32_t h, std::vector<std::uint8_t> px) {
  Rgb8 img;
  img.width = w;
  img.height = h;
  img.pixels = std::move(px);
  return img;
}

// One channel of a w x h image.
std::vector<int> channel(const Rgb8& img, int c) {
  std::vector<int> v;
  for (std::size_t i = c; i < img.pixels.size(); i += 3) v.push_back(img.pixels[i]);
  return v;
}

Rgb8 random_image(std::uint32_t w, std::uint32_t h, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Rgb8 img = make(w, h, std::vector<std::uint8_t>(static_cast<std::size_t>(w) * h * 3));
  for (auto& v : img.pixels) v = static_cast<std::uint8_t>(rng() & 0xff);
  return img;
}

// Downscale 4 -> 2 (one row; the height is unchanged, so only the horizontal pass runs).
// scale = 2, so the filter is stretched: support = 2 * 2 = 4, argument scale ss = 1/2.
// Output 0: centre = (0 + 0.5) * 2 = 1; window [int(1 - 4 + 0.5) -> 0, int(1 + 4 + 0.5) = 5 -> 4) = inputs 0..3 at
// filter arguments (x - 1 + 0.5) / 2 = -0.25, 0.25, 0.75, 1.25. With a = -0.5:
//   f(0.25) = (1.5 * 0.25 - 2.5) * 0.25^2 + 1 = 0.8671875 = 111/128
//   f(0.75) = (1.5 * 0.75 - 2.5) * 0.75^2 + 1 = 0.2265625 = 29/128
//   f(1.25) = (((1.25 - 5) * 1.25 + 8) * 1.25 - 4) * -0.5 = -0.0703125 = -9/128
// normalised by their sum 242/128: weights 111, 111, 29, -9 over 242.
// Ramp R = 0, 80, 160, 240: (111*80 + 29*160 - 9*240) / 242 = 11360 / 242 = 46.94 -> 47.
// Output 1 (centre 3) mirrors it: weights -9, 29, 111, 111: (29*80 + 111*160 + 111*240) / 242 = 193.06 -> 193.
// G = 255 - R gives 255 - those (the weights sum to 1); a constant B stays.
TEST(ImageResize, PilBicubicDownscaleOfARampByHand) {
  const Rgb8 img = make(4, 1, {0, 255, 100, 80, 175, 100, 160, 95, 100, 240, 15, 100});
  const Rgb8 out = resize_bicubic(img, 2, 1);
  ASSERT_EQ(out.width, 2u);
  ASSERT_EQ(out.height, 1u);
  EXPECT_EQ(channel(out, 0), (std::vector<int>{47, 193}));
  EXPECT_EQ(channel(out, 1), (std::vector<int>{208, 62}));
  EXPECT_EQ(channel(out, 2), (std::vector<int>{100, 100}));
  // The same ramp as a column goes through the vertical pass alone and gives the same numbers.
  const Rgb8 col = make(1, 4, img.pixels);
  EXPECT_EQ(channel(resize_bicubic(col, 1, 2), 0), (std::vector<int>{47, 193}));
}

// Upscale 2 -> 4: scale 0.5, support 2 (no stretching), ss = 1.
// Output 0: centre 0.25, window [0, int(2.75) = 2): arguments 0.25, 1.25 -> 111/128, -9/128; normalised 111, -9 / 102.
// Output 1: centre 0.75, window [0, 2): arguments -0.25, 0.75 -> 111, 29 / 140. Outputs 2, 3 mirror 1, 0.
// [100, 200]: (11100 - 1800)/102 = 91.18 -> 91; (11100 + 5800)/140 = 120.7 -> 121; 179.3 -> 179; 208.8 -> 209.
TEST(ImageResize, PilBicubicUpscaleByHand) {
  const Rgb8 img = make(2, 1, {100, 100, 100, 200, 200, 200});
  EXPECT_EQ(channel(resize_bicubic(img, 4, 1), 0), (std::vector<int>{91, 121, 179, 209}));
}

// A 2x2 diagonal [[255, 0], [0, 255]] to 4x4. Horizontal pass, row [255, 0]: 111*255/102 = 277.5 -> clamped 255,
// 111*255/140 = 202.2 -> 202, 29*255/140 = 52.8 -> 53, -9*255/102 = -22.5 -> clamped 0; row [0, 255] mirrored.
// Vertical pass, column 0 = [255, 0] gives 255, 202, 53, 0 again. Had the first pass not rounded and clamped
// (277.5, -22.5), row 1 would be (111*277.5 - 29*22.5)/140 = 215.4: PIL's per-pass uint8 clamp is visible.
// Column 1 = [202, 53]: (111*202 - 9*53)/102 = 215.1 -> 215, (111*202 + 29*53)/140 = 171.1 -> 171,
// (29*202 + 111*53)/140 = 83.9 -> 84, (-9*202 + 111*53)/102 = 39.9 -> 40.
TEST(ImageResize, EachPassRoundsAndClampsToUint8) {
  const Rgb8 img = make(2, 2, {255, 255, 255, 0, 0, 0, 0, 0, 0, 255, 255, 255});
  const Rgb8 out = resize_bicubic(img, 4, 4);
  const std::vector<int> r = channel(out, 0);
  ASSERT_EQ(r.size(), 16u);
  EXPECT_EQ((std::vector<int>{r[0], r[4], r[8], r[12]}), (std::vector<int>{255, 202, 53, 0}));
  EXPECT_EQ((std::vector<int>{r[1], r[5], r[9], r[13]}), (std::vector<int>{215, 171, 84, 40}));
  // The image is symmetric under a 180-degree turn, and so is PIL's resize of it.
  for (int i = 0; i < 16; ++i) EXPECT_EQ(r[i], r[15 - i]) << i;
}

TEST(ImageResize, UniformStaysUniformAndSameSizeIsIdentity) {
  Rgb8 img = make(37, 23, {});
  for (int i = 0; i < 37 * 23; ++i) img.pixels.insert(img.pixels.end(), {10, 128, 250});
  for (auto [w, h] : {std::pair{224u, 224u}, {5u, 3u}, {1u, 1u}, {100u, 7u}, {37u, 23u}}) {
    const Rgb8 out = resize_bicubic(img, w, h);
    ASSERT_EQ(out.pixels.size(), static_cast<std::size_t>(w) * h * 3);
    for (std::size_t i = 0; i < out.pixels.size(); i += 3) {
      ASSERT_EQ(out.pixels[i], 10) << w << "x" << h;
      ASSERT_EQ(out.pixels[i + 1], 128);
      ASSERT_EQ(out.pixels[i + 2], 250);
    }
  }
  const Rgb8 rnd = random_image(9, 6, 1);
  EXPECT_EQ(resize_bicubic(rnd, 9, 6).pixels, rnd.pixels);
  // Empty input: an all-zero image of the requested size, no crash.
  EXPECT_EQ(resize_bicubic(Rgb8{}, 2, 2).pixels, std::vector<std::uint8_t>(12, 0));
}

// A 4x2 image with size 2: the short edge (2) already is 2 and the long one int(2 * 4 / 2) = 4, so no resampling;
// crop 2: top = (2 - 2) // 2 = 0, left = (4 - 2) // 2 = 1, so columns 1 and 2 remain.
// Pixel (1, 0) R = 128: 128 / 255 = 0.50196078; (0.50196078 - 0.48145466) / 0.26862954 = 0.0763360.
// Pixel (2, 1) B = 0: (0 - 0.40821073) / 0.27577711 = -1.4802197.
TEST(ImageClipPreprocess, CropOffsetsAndNormalisationByHand) {
  Rgb8 img = make(4, 2, std::vector<std::uint8_t>(24, 0));
  auto at = [&](std::uint32_t x, std::uint32_t y, int c) -> std::uint8_t& { return img.pixels[(y * 4 + x) * 3 + c]; };
  at(1, 0, 0) = 128;
  at(0, 0, 0) = 255;  // cropped away
  at(3, 1, 1) = 255;  // cropped away
  at(2, 1, 1) = 255;
  ClipPreprocess p;
  p.size = 2;
  p.crop = 2;
  const std::vector<float> t = clip_preprocess(img, p);
  ASSERT_EQ(t.size(), 3u * 2 * 2);
  // [c][y][x]
  EXPECT_NEAR(t[0 * 4 + 0 * 2 + 0], 0.0763360f, 1e-6);
  EXPECT_NEAR(t[0 * 4 + 0 * 2 + 1], -0.48145466f / 0.26862954f, 1e-6);  // pixel (2, 0) R = 0
  EXPECT_NEAR(t[1 * 4 + 1 * 2 + 1], (1.0f - 0.4578275f) / 0.26130258f, 1e-6);  // pixel (2, 1) G = 255
  EXPECT_NEAR(t[2 * 4 + 1 * 2 + 1], -1.4802197f, 1e-6);
}

// Crop larger than the resized image: HF pads with zeros around it. A 2x2 image, size 2, crop 4:
// top = (2 - 4) // 2 = -1, so the image sits at rows/columns 1..2 of the crop, zeros elsewhere.
TEST(ImageClipPreprocess, CropLargerThanImagePadsWithZeros) {
  const Rgb8 img = make(2, 2, std::vector<std::uint8_t>(12, 255));
  ClipPreprocess p;
  p.size = 2;
  p.crop = 4;
  const std::vector<float> t = clip_preprocess(img, p);
  ASSERT_EQ(t.size(), 3u * 16);
  const float zero = -p.mean[0] / p.std[0], one = (1.0f - p.mean[0]) / p.std[0];
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 4; ++x) {
      const bool inside = y >= 1 && y <= 2 && x >= 1 && x <= 2;
      EXPECT_FLOAT_EQ(t[y * 4 + x], inside ? one : zero) << x << "," << y;
    }
  }
}

// The windowed resize must give exactly the pixels of the full resize followed by HF's crop, for wide, tall, odd
// and extreme shapes; the resize sizes follow HF: short = size, long = int(size * long / short).
TEST(ImageClipPreprocess, MatchesFullResizeThenCrop) {
  struct Case {
    std::uint32_t w, h, size, crop, rw, rh;
  };
  const Case cases[] = {
      {6, 3, 2, 2, 4, 2},       // int(2 * 6 / 3) = 4
      {7, 5, 3, 3, 4, 3},       // int(3 * 7 / 5) = int(4.2) = 4
      {5, 7, 3, 3, 3, 4},       // tall
      {640, 480, 224, 224, 298, 224},  // int(224 * 640 / 480) = int(298.67) = 298
      {1, 300, 8, 8, 8, 2400},  // extreme aspect ratio: 8 x 2400, crop rows 1196..1203
      {31, 31, 16, 12, 16, 16}, // crop smaller than size: offset (16 - 12) // 2 = 2
  };
  std::uint32_t seed = 7;
  for (const Case& c : cases) {
    const Rgb8 img = random_image(c.w, c.h, seed++);
    ClipPreprocess p;
    p.size = c.size;
    p.crop = c.crop;
    const std::vector<float> t = clip_preprocess(img, p);
    const Rgb8 full = resize_bicubic(img, c.rw, c.rh);
    const std::uint32_t top = (c.rh - c.crop) / 2, left = (c.rw - c.crop) / 2;
    const std::size_t plane = static_cast<std::size_t>(c.crop) * c.crop;
    ASSERT_EQ(t.size(), 3 * plane);
    for (std::uint32_t y = 0; y < c.crop; ++y) {
      for (std::uint32_t x = 0; x < c.crop; ++x) {
        for (int ch = 0; ch < 3; ++ch) {
          const std::uint8_t v = full.pixels[((top + y) * static_cast<std::size_t>(c.rw) + left + x) * 3 + ch];
          const float want = (static_cast<float>(v * (1.0 / 255.0)) - p.mean[ch]) / p.std[ch];
          ASSERT_EQ(t[ch * plane + y * c.crop + x], want) << c.w << "x" << c.h << " at " << x << "," << y;
        }
      }
    }
  }
}

TEST(ImageClipPreprocess, EmptyOrInconsistentImageGivesEmptyTensor) {
  EXPECT_TRUE(clip_preprocess(Rgb8{}, ClipPreprocess{}).empty());
  Rgb8 bad = make(4, 4, std::vector<std::uint8_t>(5, 0));
  EXPECT_TRUE(clip_preprocess(bad, ClipPreprocess{}).empty());
}

TEST(ImageClipConfig, OldAndNewHuggingFaceLayouts) {
  // openai/clip-vit-base-patch32 (the CLIPFeatureExtractor era): ints.
  auto a = clip_preprocess_from_json(R"({"crop_size": 224, "do_center_crop": true, "do_normalize": true,
    "do_resize": true, "feature_extractor_type": "CLIPFeatureExtractor",
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "resample": 3, "size": 224})");
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->size, 224u);
  EXPECT_EQ(a->crop, 224u);
  EXPECT_FLOAT_EQ(a->mean[1], 0.4578275f);
  // The CLIPImageProcessor layout: dicts, do_rescale, rescale_factor.
  auto b = clip_preprocess_from_json(R"({"crop_size": {"height": 336, "width": 336}, "do_center_crop": true,
    "do_convert_rgb": true, "do_normalize": true, "do_rescale": true, "do_resize": true,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "image_processor_type": "CLIPImageProcessor",
    "resample": 3, "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 336}})");
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(b->size, 336u);
  EXPECT_EQ(b->crop, 336u);
  EXPECT_FLOAT_EQ(b->std[2], 0.5f);
  // Absent keys keep CLIP's defaults.
  auto c = clip_preprocess_from_json("{}");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->size, 224u);
  EXPECT_FLOAT_EQ(c->std[0], 0.26862954f);
}

TEST(ImageClipConfig, RefusalsAreTyped) {
  struct Case {
    const char* json;
    Errc code;
  };
  const Case cases[] = {
      {"{", Errc::parse_error},
      {"[1, 2]", Errc::parse_error},
      {R"({"do_resize": false})", Errc::unsupported},
      {R"({"do_center_crop": false})", Errc::unsupported},
      {R"({"do_normalize": false})", Errc::unsupported},
      {R"({"do_rescale": false})", Errc::unsupported},
      {R"({"do_resize": "yes"})", Errc::invalid_argument},
      {R"({"resample": 2})", Errc::unsupported},
      {R"({"rescale_factor": 1.0})", Errc::unsupported},
      {R"({"size": {"height": 224, "width": 224}})", Errc::unsupported},
      {R"({"size": 0})", Errc::invalid_argument},
      {R"({"size": -5})", Errc::invalid_argument},
      {R"({"size": 100000})", Errc::invalid_argument},
      {R"({"size": 22.5})", Errc::invalid_argument},
      {R"({"crop_size": {"height": 224, "width": 200}})", Errc::unsupported},
      {R"({"crop_size": {"height": 224}})", Errc::invalid_argument},
      {R"({"image_mean": [0.5, 0.5]})", Errc::invalid_argument},
      {R"({"image_mean": "x"})", Errc::invalid_argument},
      {R"({"image_std": [0.5, 0, 0.5]})", Errc::invalid_argument},
      {R"({"image_std": [0.5, 1e300, 0.5]})", Errc::invalid_argument},
  };
  for (const Case& c : cases) {
    auto r = clip_preprocess_from_json(c.json);
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_EQ(r.error().code, c.code) << c.json << ": " << r.error().message;
    EXPECT_NE(r.error().message.find("preprocessor_config.json"), std::string::npos) << r.error().message;
  }
}

}  // namespace
}  // namespace tandem::image
