#include "modelgen/clip_data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <utility>

namespace tandem::modelgen::clipdata {
namespace {

// splitmix64: the whole scene comes from this stream, so a scene is the same on every machine (no <random>
// distributions, whose algorithms the standard leaves to the implementation).
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // [0, n)
  std::uint32_t below(std::uint32_t n) { return static_cast<std::uint32_t>(next() % n); }
  // [lo, hi), 24 bits of resolution (exact in float).
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
  }
};

Rng scene_rng(std::uint64_t seed, std::uint64_t index) {
  Rng a{seed ^ 0x636c69702d646174ull};  // "clip-dat"
  const std::uint64_t k = a.next();
  Rng r{k ^ (index * 0xd1b54a32d192ed03ull)};
  r.next();
  return r;
}

std::uint8_t clamp_u8(int v) { return static_cast<std::uint8_t>(std::clamp(v, 0, 255)); }

image::Rgb jitter(Rng& r, image::Rgb c, int amount) {
  auto j = [&](std::uint8_t v) { return clamp_u8(v + static_cast<int>(r.below(2 * amount + 1)) - amount); };
  // Evaluated in a fixed order (function arguments would not be).
  const std::uint8_t jr = j(c.r);
  const std::uint8_t jg = j(c.g);
  const std::uint8_t jb = j(c.b);
  return {jr, jg, jb};
}

double distance(image::Rgb a, image::Rgb b) {
  const double dr = a.r - b.r, dg = a.g - b.g, db = a.b - b.b;
  return std::sqrt(dr * dr + dg * dg + db * db);
}

// Unit-square centres of the places.
std::pair<float, float> place_centre(Place p) {
  switch (p) {
    case Place::centre: return {0.5f, 0.5f};
    case Place::left: return {0.28f, 0.5f};
    case Place::right: return {0.72f, 0.5f};
    case Place::top: return {0.5f, 0.28f};
    case Place::bottom: return {0.5f, 0.72f};
  }
  return {0.5f, 0.5f};
}

const char* place_phrase(Place p) {
  switch (p) {
    case Place::centre: return "in the centre";
    case Place::left: return "on the left";
    case Place::right: return "on the right";
    case Place::top: return "at the top";
    case Place::bottom: return "at the bottom";
  }
  return "";
}

void draw(image::Rgb8& img, const Object& o, image::Rgb bg) {
  const float cx = o.cx, cy = o.cy, h = o.half;
  switch (o.shape) {
    case ShapeKind::circle:
      image::fill_circle(img, cx, cy, h, o.rgb);
      break;
    case ShapeKind::square: {
      const float s = 0.886f * h;  // the area of the circle of radius h
      image::fill_rect(img, cx - s, cy - s, cx + s, cy + s, o.rgb);
      break;
    }
    case ShapeKind::triangle: {  // equilateral, pointing up, centroid at the centre
      const float R = 1.2f * h, dx = R * 0.8660254f;
      image::fill_triangle(img, cx, cy - R, cx - dx, cy + 0.5f * R, cx + dx, cy + 0.5f * R, o.rgb);
      break;
    }
    case ShapeKind::ring:
      image::fill_circle(img, cx, cy, h, o.rgb);
      image::fill_circle(img, cx, cy, 0.55f * h, bg);
      break;
    case ShapeKind::star: {  // five points: the union of the triangles (O_k, I_k+1, I_k+3) — overlapping, no seams
      const float R = 1.2f * h, r = 0.42f * R;
      float ox[5], oy[5], ix[5], iy[5];
      for (int k = 0; k < 5; ++k) {
        const double a = -M_PI / 2 + 2 * M_PI * k / 5, b = a + M_PI / 5;
        ox[k] = cx + R * static_cast<float>(std::cos(a));
        oy[k] = cy + R * static_cast<float>(std::sin(a));
        ix[k] = cx + r * static_cast<float>(std::cos(b));
        iy[k] = cy + r * static_cast<float>(std::sin(b));
      }
      for (int k = 0; k < 5; ++k) {
        const int p = (k + 1) % 5, q = (k + 3) % 5;
        image::fill_triangle(img, ox[k], oy[k], ix[p], iy[p], ix[q], iy[q], o.rgb);
      }
      // The inner pentagon (the triangles above leave none of it out, but their union's antialiased seams would
      // show through at the centre otherwise).
      image::fill_triangle(img, ix[0], iy[0], ix[1], iy[1], ix[2], iy[2], o.rgb);
      image::fill_triangle(img, ix[0], iy[0], ix[2], iy[2], ix[4], iy[4], o.rgb);
      image::fill_triangle(img, ix[2], iy[2], ix[3], iy[3], ix[4], iy[4], o.rgb);
      break;
    }
  }
}

std::string join(std::initializer_list<std::string> parts) {
  std::string s;
  for (const auto& p : parts) {
    if (p.empty()) continue;
    if (!s.empty()) s += ' ';
    s += p;
  }
  return s;
}

std::string cs(const Object& o) { return join({name(o.colour), name(o.shape)}); }
std::string zcs(const Object& o) { return join({name(o.size), name(o.colour), name(o.shape)}); }

}  // namespace

const char* name(ShapeKind s) {
  static const char* const n[] = {"circle", "square", "triangle", "ring", "star"};
  return n[static_cast<int>(s)];
}
const char* name(Colour c) {
  static const char* const n[] = {"red", "green", "blue", "yellow", "orange", "purple", "white", "black", "grey"};
  return n[static_cast<int>(c)];
}
const char* name(Size s) { return s == Size::small ? "small" : "large"; }
const char* name(Place p) {
  static const char* const n[] = {"centre", "left", "right", "top", "bottom"};
  return n[static_cast<int>(p)];
}

image::Rgb rgb(Colour c) {
  static const image::Rgb t[] = {
      {215, 35, 35},   {40, 165, 55},  {35, 75, 215},   {240, 215, 40},  {245, 135, 25},
      {135, 45, 175},  {245, 245, 245}, {20, 20, 20},   {128, 128, 128},
  };
  return t[static_cast<int>(c)];
}

Scene render(std::uint64_t seed, std::uint64_t index, std::uint32_t size) {
  Rng r = scene_rng(seed, index);
  Scene s;
  s.seed = seed;
  s.index = index;
  const bool two = r.below(5) < 2;  // 40% of the scenes have two objects
  auto pick = [&](Object& o) {
    o.shape = static_cast<ShapeKind>(r.below(kShapes));
    o.colour = static_cast<Colour>(r.below(kColours));
    o.size = static_cast<Size>(r.below(kSizes));
  };
  if (!two) {
    Object o;
    pick(o);
    o.place = static_cast<Place>(r.below(kPlaces));
    const auto [ux, uy] = place_centre(o.place);
    const float jx = r.uniform(-0.05f, 0.05f), jy = r.uniform(-0.05f, 0.05f);
    o.cx = ux + jx;
    o.cy = uy + jy;
    o.half = o.size == Size::small ? r.uniform(0.08f, 0.12f) : r.uniform(0.17f, 0.22f);
    s.objects.push_back(o);
  } else {
    const bool horizontal = r.below(2) == 0;
    Object a, b;
    pick(a);
    do pick(b);
    while (b.shape == a.shape && b.colour == a.colour);
    a.place = horizontal ? Place::left : Place::top;
    b.place = horizontal ? Place::right : Place::bottom;
    for (Object* o : {&a, &b}) {
      const auto [ux, uy] = place_centre(o->place);
      // Along the axis that separates them ±0.03, across it ±0.05: the two never overlap.
      const float along = r.uniform(-0.03f, 0.03f), across = r.uniform(-0.05f, 0.05f);
      o->cx = ux + (horizontal ? along : across);
      o->cy = uy + (horizontal ? across : along);
      o->half = o->size == Size::small ? r.uniform(0.08f, 0.11f) : r.uniform(0.15f, 0.19f);
    }
    s.objects = {a, b};
  }
  for (Object& o : s.objects) o.rgb = jitter(r, rgb(o.colour), 12);
  // A plain, low-saturation background at least 110 (RGB distance) away from every object's colour.
  for (int attempt = 0;; ++attempt) {
    const int level = 30 + static_cast<int>(r.below(196));
    const image::Rgb bg{clamp_u8(level + static_cast<int>(r.below(31)) - 15),
                        clamp_u8(level + static_cast<int>(r.below(31)) - 15),
                        clamp_u8(level + static_cast<int>(r.below(31)) - 15)};
    bool ok = true;
    for (const Object& o : s.objects) ok = ok && distance(bg, o.rgb) >= 110;
    if (ok || attempt == 63) {
      s.background = bg;
      break;
    }
  }
  const float px = static_cast<float>(size);
  s.image = image::blank(size, size, s.background);
  for (Object& o : s.objects) {
    Object scaled = o;
    scaled.cx *= px;
    scaled.cy *= px;
    scaled.half *= px;
    draw(s.image, scaled, s.background);
    o = scaled;
  }
  return s;
}

std::vector<std::string> captions(const Scene& s) {
  std::vector<std::string> c;
  if (s.objects.size() == 1) {
    const Object& o = s.objects[0];
    const std::string at = place_phrase(o.place);
    c = {
        join({"a", zcs(o), at}),
        join({"a", cs(o)}),
        cs(o),
        join({"a", zcs(o)}),
        join({"a", cs(o), at}),
        join({"a photo of a", cs(o)}),
        join({"a picture of a", zcs(o)}),
        join({"a drawing of a", cs(o), at}),
        join({"a", name(o.shape), "that is", name(o.colour)}),
    };
    if (o.place == Place::centre) c.push_back(join({"a", cs(o), "in the middle"}));
  } else {
    const Object& a = s.objects[0];
    const Object& b = s.objects[1];
    c = {
        join({"a", zcs(a), place_phrase(a.place), "and a", zcs(b), place_phrase(b.place)}),
        join({"a", cs(a), "and a", cs(b)}),
        join({"a", cs(b), "and a", cs(a)}),
        join({cs(a), "and", cs(b)}),
        join({cs(b), "and", cs(a)}),
        join({"a", cs(a), place_phrase(a.place), "and a", cs(b), place_phrase(b.place)}),
        join({"a photo of a", cs(a), "and a", cs(b)}),
        join({"a", cs(a), "next to a", cs(b)}),
    };
  }
  std::vector<std::string> out;
  for (auto& x : c)
    if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(std::move(x));
  return out;
}

std::string full_caption(const Scene& s) { return captions(s)[0]; }

std::vector<std::string> short_captions(const Scene& s) {
  std::vector<std::string> out;
  for (const Object& o : s.objects) out.push_back(join({"a", cs(o)}));
  return out;
}

bool same_content(const Scene& a, const Scene& b) { return full_caption(a) == full_caption(b); }

bool contains(const Scene& s, Colour c, ShapeKind k) {
  return std::any_of(s.objects.begin(), s.objects.end(),
                     [&](const Object& o) { return o.colour == c && o.shape == k; });
}

bool same_objects(const Scene& a, const Scene& b) {
  auto key = [](const Scene& s) {
    std::vector<int> k;
    for (const Object& o : s.objects) k.push_back(static_cast<int>(o.colour) * 16 + static_cast<int>(o.shape));
    std::sort(k.begin(), k.end());
    return k;
  };
  return key(a) == key(b);
}

std::string file_name(const Scene& s) {
  char idx[32];
  std::snprintf(idx, sizeof idx, "%04llu", static_cast<unsigned long long>(s.index));
  std::string n = idx;
  for (const Object& o : s.objects) n += std::string("-") + name(o.colour) + "-" + name(o.shape);
  return n + ".png";
}

std::vector<std::string> caption_corpus(std::uint64_t seed, std::uint64_t n) {
  std::vector<std::string> out;
  for (std::uint64_t i = 0; i < n; ++i) {
    // Captions only: the scene's objects, not its pixels (render at 1 pixel: the cheapest image).
    const Scene s = render(seed, i, 1);
    for (auto& c : captions(s)) out.push_back(std::move(c));
  }
  return out;
}

std::vector<Scene> heldout_scenes(std::size_t n, std::uint32_t size) {
  std::vector<Scene> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) out.push_back(render(kHeldoutSeed, i, size));
  return out;
}

std::vector<ShortQuery> short_queries(const std::vector<Scene>& pool) {
  bool seen[kColours][kShapes] = {};
  for (const Scene& s : pool)
    for (const Object& o : s.objects) seen[static_cast<int>(o.colour)][static_cast<int>(o.shape)] = true;
  std::vector<ShortQuery> out;
  for (int c = 0; c < kColours; ++c)
    for (int k = 0; k < kShapes; ++k)
      if (seen[c][k]) {
        const auto col = static_cast<Colour>(c);
        const auto sh = static_cast<ShapeKind>(k);
        out.push_back({join({"a", name(col), name(sh)}), col, sh});
      }
  return out;
}

namespace {

// P(at least one of m matches among the first k of a random ranking of n).
double chance_at(std::size_t n, std::size_t m, std::size_t k) {
  if (m == 0) return 0;
  if (k >= n) return 1;
  double miss = 1;  // C(n-m, k) / C(n, k)
  for (std::size_t i = 0; i < k; ++i)
    miss *= static_cast<double>(n - m - std::min(n - m, i)) / static_cast<double>(n - i);
  return 1 - miss;
}

// Scores `candidates` rows of `rows` against `q`, ranks them (higher first, ties by index) and adds to top-1 / top-5.
void rank_query(std::span<const float> q, std::span<const float> rows, std::size_t dim,
                const std::vector<std::size_t>& candidates, const std::function<bool(std::size_t)>& match,
                Rate& top1, Rate& top5) {
  std::vector<std::pair<float, std::size_t>> scored;
  std::size_t matches = 0;
  for (std::size_t j : candidates) {
    float d = 0;
    for (std::size_t t = 0; t < dim; ++t) d += q[t] * rows[j * dim + t];
    scored.emplace_back(d, j);
    matches += match(j) ? 1 : 0;
  }
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  bool hit1 = false, hit5 = false;
  for (std::size_t r = 0; r < scored.size() && r < 5; ++r) {
    if (!match(scored[r].second)) continue;
    hit5 = true;
    hit1 = hit1 || r == 0;
  }
  const std::size_t n = candidates.size();
  top1.hit += hit1 ? 1 : 0;
  top5.hit += hit5 ? 1 : 0;
  top1.chance += chance_at(n, matches, 1);
  top5.chance += chance_at(n, matches, 5);
  ++top1.queries;
  ++top5.queries;
}

void finish(Rate& r) {
  if (r.queries == 0) return;
  r.hit /= static_cast<double>(r.queries);
  r.chance /= static_cast<double>(r.queries);
}

}  // namespace

Retrieval retrieval(const std::vector<Scene>& pool, std::span<const float> images, std::span<const float> full_texts,
                    std::span<const float> short_texts, std::size_t dim) {
  Retrieval r;
  const std::size_t n = pool.size();
  const auto queries = short_queries(pool);
  if (dim == 0 || images.size() != n * dim || full_texts.size() != n * dim ||
      short_texts.size() != queries.size() * dim)
    return r;
  std::vector<std::size_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::string> full(n);
  for (std::size_t i = 0; i < n; ++i) full[i] = full_caption(pool[i]);
  for (std::size_t i = 0; i < n; ++i)
    rank_query(full_texts.subspan(i * dim, dim), images, dim, all,
               [&](std::size_t j) { return full[j] == full[i]; }, r.text_top1, r.text_top5);
  for (std::size_t q = 0; q < queries.size(); ++q)
    rank_query(short_texts.subspan(q * dim, dim), images, dim, all,
               [&](std::size_t j) { return contains(pool[j], queries[q].colour, queries[q].shape); }, r.short_top1,
               r.short_top5);
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<std::size_t> others;
    bool any = false;
    for (std::size_t j = 0; j < n; ++j) {
      if (j == i) continue;
      others.push_back(j);
      any = any || same_objects(pool[i], pool[j]);
    }
    if (!any) continue;
    rank_query(images.subspan(i * dim, dim), images, dim, others,
               [&](std::size_t j) { return same_objects(pool[i], pool[j]); }, r.image_top1, r.image_top5);
  }
  for (Rate* x : {&r.text_top1, &r.text_top5, &r.short_top1, &r.short_top5, &r.image_top1, &r.image_top5}) finish(*x);
  return r;
}

}  // namespace tandem::modelgen::clipdata
