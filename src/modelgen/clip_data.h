// clip_data: the deterministic data set the bundled default embedding model is trained on (tools/tandem_train_clip.cc,
// docs/default-embedding-model.md): rendered scenes of one or two flat shapes (circle, square, triangle, ring, star)
// in nine colours, two sizes and five places on a plain background, each with captions in several phrasings
// ("a red circle", "a small blue square on the left", "a photo of a green triangle", "red circle and blue square").
//
// A scene is a pure function of (seed, index): the same pixels on every machine (a splitmix64 stream, no <random>
// distributions, the rasteriser's fixed 4x4 coverage grid). The training stream uses kTrainSeed, the held-out scenes
// kHeldoutSeed; the jitter of positions, sizes and colours makes their images distinct (tests/modelgen). Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "image/draw.h"
#include "image/image.h"

namespace tandem::modelgen::clipdata {

enum class ShapeKind : std::uint8_t { circle, square, triangle, ring, star };
enum class Colour : std::uint8_t { red, green, blue, yellow, orange, purple, white, black, grey };
enum class Size : std::uint8_t { small, large };
enum class Place : std::uint8_t { centre, left, right, top, bottom };

inline constexpr int kShapes = 5, kColours = 9, kSizes = 2, kPlaces = 5;

const char* name(ShapeKind s);
const char* name(Colour c);
const char* name(Size s);
const char* name(Place p);
// The nominal RGB of a colour name (scenes jitter it by up to ±12 per channel).
image::Rgb rgb(Colour c);

struct Object {
  ShapeKind shape{};
  Colour colour{};
  Size size{};
  Place place{};
  // Geometry in pixels of the rendered image: centre and half the extent (the radius of a circle).
  float cx = 0, cy = 0, half = 0;
  image::Rgb rgb;  // the jittered colour actually painted
};

struct Scene {
  std::uint64_t seed = 0, index = 0;
  image::Rgb background;
  // One object, or two at opposite places (left/right or top/bottom, in that order) that differ in colour or shape.
  std::vector<Object> objects;
  image::Rgb8 image;
};

inline constexpr std::uint64_t kTrainSeed = 1;
inline constexpr std::uint64_t kHeldoutSeed = 0x48454c44;  // "HELD"; never a training seed (the tool refuses it)
inline constexpr std::uint32_t kImageSize = 64;            // the model's image_size: no resampling in preprocessing

// The scene (seed, index) rendered at size x size pixels (geometry scales with the size, so a 256-pixel render
// shows the same scene as the 64-pixel one).
Scene render(std::uint64_t seed, std::uint64_t index, std::uint32_t size = kImageSize);

// Every caption that describes the scene, lowercase ASCII words separated by single spaces. captions()[0] is the
// full description (every attribute: "a small red circle on the left", "a blue square at the top and a green ring
// at the bottom"); the others leave out attributes or reword ("a red circle", "a photo of a red circle",
// "red circle and blue square"). Never empty; no duplicates.
std::vector<std::string> captions(const Scene& s);
// captions(s)[0].
std::string full_caption(const Scene& s);
// "a red circle" for each object, in scene order: the short queries of the evaluation and the demo.
std::vector<std::string> short_captions(const Scene& s);

// Two scenes show the same content when their full captions are equal (jitter aside).
bool same_content(const Scene& a, const Scene& b);
// The scene contains an object of this colour and shape.
bool contains(const Scene& s, Colour c, ShapeKind k);
// The multiset of (colour, shape) pairs is equal (sizes and places ignored).
bool same_objects(const Scene& a, const Scene& b);

// A file name for the scene: "0007-blue-circle.png", "0012-red-square-green-star.png" (index zero-padded to 4).
std::string file_name(const Scene& s);

// Every caption of the first n scenes of `seed`, in order (the tokenizer's training corpus).
std::vector<std::string> caption_corpus(std::uint64_t seed, std::uint64_t n);

// ---- held-out retrieval (the figures of training.json, the tool's check and the test) --------------------------

// The held-out pool: render(kHeldoutSeed, i) for i < n.
std::vector<Scene> heldout_scenes(std::size_t n, std::uint32_t size = kImageSize);

// A short query ("a red circle") for each (colour, shape) that occurs in the pool, ordered by colour then shape.
struct ShortQuery {
  std::string text;
  Colour colour{};
  ShapeKind shape{};
};
std::vector<ShortQuery> short_queries(const std::vector<Scene>& pool);

struct Rate {
  double hit = 0;     // fraction of the queries whose first k results hold a match
  double chance = 0;  // the same for a ranking drawn at random (exact expectation from the match counts)
  std::size_t queries = 0;
};
struct Retrieval {
  // text → image, query full_caption(pool[i]); a result matches when same_content().
  Rate text_top1, text_top5;
  // text → image, the short queries; a result matches when it contains() that colour and shape.
  Rate short_top1, short_top5;
  // image → image, query pool[i] against the others; a result matches when same_objects(). Only the queries with at
  // least one match in the rest of the pool count.
  Rate image_top1, image_top5;
};
// Embeddings row-major, `dim` floats per row, L2-normalised (cosine = dot product): `images` one row per pool scene,
// `full_texts` one per pool scene (its full caption), `short_texts` one per short_queries(pool) entry. Ties rank the
// lower index first.
Retrieval retrieval(const std::vector<Scene>& pool, std::span<const float> images, std::span<const float> full_texts,
                    std::span<const float> short_texts, std::size_t dim);

}  // namespace tandem::modelgen::clipdata
