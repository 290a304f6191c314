// The default embedding model's data set (src/modelgen/clip_data.h): renders are deterministic and pinned, the
// captions say what the pixels show, the held-out split is disjoint from the training stream, and the retrieval
// figures are right on embeddings whose answer is known.
#include "modelgen/clip_data.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "core/sha256.h"

namespace tandem::modelgen::clipdata {
namespace {

image::Rgb pixel(const image::Rgb8& img, std::uint32_t x, std::uint32_t y) {
  const std::uint8_t* p = &img.pixels[(static_cast<std::size_t>(y) * img.width + x) * 3];
  return {p[0], p[1], p[2]};
}

bool same(image::Rgb a, image::Rgb b) { return a.r == b.r && a.g == b.g && a.b == b.b; }

std::string digest(const image::Rgb8& img) {
  return Sha256::hex(Sha256::of(std::string_view(reinterpret_cast<const char*>(img.pixels.data()), img.pixels.size())));
}

TEST(ClipData, RenderIsDeterministic) {
  for (std::uint64_t i : {0u, 1u, 7u, 1000u}) {
    const Scene a = render(kTrainSeed, i), b = render(kTrainSeed, i);
    EXPECT_EQ(a.image.pixels, b.image.pixels) << i;
    EXPECT_EQ(full_caption(a), full_caption(b));
    EXPECT_EQ(a.image.width, kImageSize);
    EXPECT_EQ(a.image.height, kImageSize);
    EXPECT_EQ(a.image.pixels.size(), std::size_t{kImageSize} * kImageSize * 3);
  }
  EXPECT_NE(render(kTrainSeed, 0).image.pixels, render(kTrainSeed, 1).image.pixels);
}

// The pixels of the first scenes are pinned: a change to the renderer or the sampling changes the trained model's
// data, so it must show up here (and in docs/default-embedding-model.md's figures).
TEST(ClipData, FirstScenesArePinned) {
  Sha256 h;
  std::string captions_seen;
  for (std::uint64_t i = 0; i < 16; ++i) {
    const Scene s = render(kTrainSeed, i);
    h.update(std::string_view(reinterpret_cast<const char*>(s.image.pixels.data()), s.image.pixels.size()));
    captions_seen += full_caption(s) + "\n";
  }
  EXPECT_EQ(render(kTrainSeed, 0).objects.size(), 1u);
  EXPECT_EQ(full_caption(render(kTrainSeed, 0)), "a small green circle on the right");
  EXPECT_EQ(full_caption(render(kTrainSeed, 4)),
            "a large white triangle at the top and a small black circle at the bottom");
  EXPECT_EQ(Sha256::hex(h.finish()), "f2cd2dd75d35f7834c19dfff43cf520a898edb431c3ff6dbd3c27f125ee131aa") << captions_seen;
}

// What captions()[0] says is what the pixels show: the object's colour at its centre (the background for a ring's
// hole), the background in the corners, and every attribute named.
TEST(ClipData, CaptionsMatchThePixels) {
  for (std::uint64_t i = 0; i < 400; ++i) {
    const Scene s = render(kTrainSeed, i);
    const std::string full = full_caption(s);
    ASSERT_TRUE(s.objects.size() == 1 || s.objects.size() == 2) << i;
    EXPECT_TRUE(same(pixel(s.image, 0, 0), s.background)) << i;
    EXPECT_TRUE(same(pixel(s.image, kImageSize - 1, kImageSize - 1), s.background)) << i;
    for (const Object& o : s.objects) {
      const auto cx = static_cast<std::uint32_t>(o.cx), cy = static_cast<std::uint32_t>(o.cy);
      const image::Rgb at = pixel(s.image, cx, cy);
      if (o.shape == ShapeKind::ring) EXPECT_TRUE(same(at, s.background)) << full;
      else EXPECT_TRUE(same(at, o.rgb)) << full;
      EXPECT_LE(std::abs(o.rgb.r - rgb(o.colour).r), 12);
      EXPECT_LE(std::abs(o.rgb.g - rgb(o.colour).g), 12);
      EXPECT_LE(std::abs(o.rgb.b - rgb(o.colour).b), 12);
      for (const char* word : {name(o.colour), name(o.shape), name(o.size)})
        EXPECT_NE(full.find(word), std::string::npos) << full << " lacks " << word;
      // The place agrees with the geometry.
      const float c = kImageSize / 2.0f;
      switch (o.place) {
        case Place::left: EXPECT_LT(o.cx, c - 8) << full; break;
        case Place::right: EXPECT_GT(o.cx, c + 8) << full; break;
        case Place::top: EXPECT_LT(o.cy, c - 8) << full; break;
        case Place::bottom: EXPECT_GT(o.cy, c + 8) << full; break;
        case Place::centre: EXPECT_LT(std::hypot(o.cx - c, o.cy - c), 5) << full; break;
      }
      EXPECT_EQ(o.half > kImageSize * 0.14f, o.size == Size::large) << full;
    }
    if (s.objects.size() == 2) {
      const Object &a = s.objects[0], &b = s.objects[1];
      EXPECT_TRUE(a.shape != b.shape || a.colour != b.colour) << full;
      EXPECT_TRUE((a.place == Place::left && b.place == Place::right) ||
                  (a.place == Place::top && b.place == Place::bottom)) << full;
      EXPECT_GT(std::hypot(a.cx - b.cx, a.cy - b.cy), a.half + b.half) << full;
    }
    const auto cs = captions(s);
    EXPECT_GE(cs.size(), 8u);
    EXPECT_EQ(std::set<std::string>(cs.begin(), cs.end()).size(), cs.size()) << "duplicate caption in " << full;
    for (const std::string& x : cs) {
      ASSERT_FALSE(x.empty());
      EXPECT_EQ(x.find("  "), std::string::npos) << x;
      EXPECT_NE(x.front(), ' ');
      EXPECT_NE(x.back(), ' ');
      for (char ch : x) EXPECT_TRUE((ch >= 'a' && ch <= 'z') || ch == ' ') << x;
      for (const Object& o : s.objects) {
        EXPECT_NE(x.find(name(o.colour)), std::string::npos) << x;
        EXPECT_NE(x.find(name(o.shape)), std::string::npos) << x;
      }
    }
    const auto shorts = short_captions(s);
    ASSERT_EQ(shorts.size(), s.objects.size());
    EXPECT_EQ(shorts[0], std::string("a ") + name(s.objects[0].colour) + " " + name(s.objects[0].shape));
  }
}

TEST(ClipData, EveryAttributeOccurs) {
  int shapes[kShapes] = {}, colours[kColours] = {}, sizes[kSizes] = {}, places[kPlaces] = {}, two = 0;
  const int n = 2000;
  for (int i = 0; i < n; ++i) {
    const Scene s = render(kTrainSeed, static_cast<std::uint64_t>(i), 1);
    two += s.objects.size() == 2 ? 1 : 0;
    for (const Object& o : s.objects) {
      ++shapes[static_cast<int>(o.shape)];
      ++colours[static_cast<int>(o.colour)];
      ++sizes[static_cast<int>(o.size)];
      ++places[static_cast<int>(o.place)];
    }
  }
  for (int x : shapes) EXPECT_GT(x, 300);
  for (int x : colours) EXPECT_GT(x, 150);
  for (int x : sizes) EXPECT_GT(x, 1000);
  for (int x : places) EXPECT_GT(x, 150);
  EXPECT_NEAR(two / double(n), 0.4, 0.05);
}

// The geometry scales with the render size: a 256-pixel render is the same scene.
TEST(ClipData, LargerRenderIsTheSameScene) {
  for (std::uint64_t i = 0; i < 20; ++i) {
    const Scene a = render(kTrainSeed, i), b = render(kTrainSeed, i, 256);
    EXPECT_EQ(captions(a), captions(b));
    EXPECT_EQ(b.image.width, 256u);
    ASSERT_EQ(a.objects.size(), b.objects.size());
    for (std::size_t k = 0; k < a.objects.size(); ++k) EXPECT_NEAR(b.objects[k].cx, 4 * a.objects[k].cx, 1e-3);
    EXPECT_TRUE(same(a.background, b.background));
  }
}

// No held-out image occurs in the training stream's first 20,000 scenes (more than --quick and the default run
// draw: 12,800 at the default's 100 steps x 128 ... see the tool), and the seeds differ.
TEST(ClipData, HeldOutSplitIsDisjoint) {
  ASSERT_NE(kHeldoutSeed, kTrainSeed);
  const auto pool = heldout_scenes(200);
  std::set<std::string> held;
  for (const Scene& s : pool) {
    EXPECT_EQ(s.seed, kHeldoutSeed);
    held.insert(digest(s.image));
  }
  EXPECT_EQ(held.size(), pool.size()) << "duplicate images inside the held-out pool";
  for (std::uint64_t i = 0; i < 20000; ++i) EXPECT_EQ(held.count(digest(render(kTrainSeed, i).image)), 0u) << i;
}

TEST(ClipData, FileNamesNameTheContent) {
  EXPECT_EQ(file_name(render(kTrainSeed, 0)), "0000-green-circle.png");
  EXPECT_EQ(file_name(render(kTrainSeed, 4)), "0004-white-triangle-black-circle.png");
  EXPECT_EQ(file_name(render(kTrainSeed, 12345)).substr(0, 6), "12345-");
}

TEST(ClipData, CaptionCorpusHoldsEveryCaption) {
  const auto corpus = caption_corpus(kTrainSeed, 10);
  std::size_t n = 0;
  for (std::uint64_t i = 0; i < 10; ++i) n += captions(render(kTrainSeed, i)).size();
  EXPECT_EQ(corpus.size(), n);
  EXPECT_EQ(corpus[0], "a small green circle on the right");
}

// Embeddings that know the answer: images and full captions one-hot by full caption → perfect text retrieval; a
// constant embedding ranks by index → the figures of one fixed ranking; the chance levels are exact.
TEST(ClipData, RetrievalFigures) {
  const auto pool = heldout_scenes(120);
  const auto queries = short_queries(pool);
  ASSERT_FALSE(queries.empty());
  std::vector<std::string> keys;
  for (const Scene& s : pool) keys.push_back(full_caption(s));
  std::vector<std::string> distinct = keys;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  const std::size_t dim = distinct.size();
  std::vector<float> img(pool.size() * dim, 0.0f), txt(pool.size() * dim, 0.0f), shrt(queries.size() * dim, 0.0f);
  for (std::size_t i = 0; i < pool.size(); ++i) {
    const auto k = static_cast<std::size_t>(std::lower_bound(distinct.begin(), distinct.end(), keys[i]) - distinct.begin());
    img[i * dim + k] = 1;
    txt[i * dim + k] = 1;
  }
  for (std::size_t q = 0; q < queries.size(); ++q) shrt[q * dim] = 1;
  const Retrieval r = retrieval(pool, img, txt, shrt, dim);
  EXPECT_EQ(r.text_top1.queries, pool.size());
  EXPECT_DOUBLE_EQ(r.text_top1.hit, 1.0);
  EXPECT_DOUBLE_EQ(r.text_top5.hit, 1.0);
  double chance = 0;
  for (const auto& k : keys) chance += static_cast<double>(std::count(keys.begin(), keys.end(), k)) / keys.size();
  EXPECT_NEAR(r.text_top1.chance, chance / keys.size(), 1e-12);
  EXPECT_GT(r.text_top5.chance, r.text_top1.chance);
  EXPECT_EQ(r.short_top1.queries, queries.size());
  // Image → image with one-hot full captions: the nearest other image has the same full caption when one exists,
  // and then the same objects.
  EXPECT_GT(r.image_top1.queries, 0u);
  EXPECT_GT(r.image_top1.hit, r.image_top1.chance);
  // Wrong sizes give empty figures rather than reading out of bounds.
  const Retrieval bad = retrieval(pool, img, txt, std::span<const float>(shrt).first(dim), dim);
  EXPECT_EQ(bad.text_top1.queries, 0u);
}

}  // namespace
}  // namespace tandem::modelgen::clipdata
