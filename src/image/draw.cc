#include "image/draw.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace tandem::image {
namespace {

constexpr int kGrid = 4;  // 4x4 samples per pixel: 17 coverage levels, enough for shapes of a few pixels

bool usable(const Rgb8& img) {
  return img.width > 0 && img.height > 0 &&
         img.pixels.size() == static_cast<std::size_t>(img.width) * img.height * 3;
}

// Blend c over pixel (x, y) with coverage k / (kGrid * kGrid), rounding to nearest.
void blend(Rgb8& img, std::uint32_t x, std::uint32_t y, int k, Rgb c) {
  constexpr int n = kGrid * kGrid;
  std::uint8_t* p = &img.pixels[(static_cast<std::size_t>(y) * img.width + x) * 3];
  const std::uint8_t src[3] = {c.r, c.g, c.b};
  for (int i = 0; i < 3; ++i) p[i] = static_cast<std::uint8_t>((src[i] * k + p[i] * (n - k) + n / 2) / n);
}

// Visits every pixel of the bounding box [bx0, bx1) x [by0, by1) (clipped to the image) and paints it by the share
// of samples for which inside(sx, sy) holds.
template <class Inside>
void raster(Rgb8& img, float bx0, float by0, float bx1, float by1, Rgb c, bool antialias, Inside inside) {
  if (!usable(img)) return;
  if (!std::isfinite(bx0) || !std::isfinite(by0) || !std::isfinite(bx1) || !std::isfinite(by1)) return;
  // Clamp in float before converting: a huge coordinate must not overflow the integer conversion.
  const float wf = static_cast<float>(img.width), hf = static_cast<float>(img.height);
  const auto x0 = static_cast<std::uint32_t>(std::clamp(std::floor(bx0), 0.0f, wf));
  const auto y0 = static_cast<std::uint32_t>(std::clamp(std::floor(by0), 0.0f, hf));
  const auto x1 = static_cast<std::uint32_t>(std::clamp(std::ceil(bx1), 0.0f, wf));
  const auto y1 = static_cast<std::uint32_t>(std::clamp(std::ceil(by1), 0.0f, hf));
  for (std::uint32_t y = y0; y < y1; ++y) {
    for (std::uint32_t x = x0; x < x1; ++x) {
      int k = 0;
      if (antialias) {
        for (int j = 0; j < kGrid; ++j) {
          for (int i = 0; i < kGrid; ++i) {
            const float sx = static_cast<float>(x) + (static_cast<float>(i) + 0.5f) / kGrid;
            const float sy = static_cast<float>(y) + (static_cast<float>(j) + 0.5f) / kGrid;
            k += inside(sx, sy) ? 1 : 0;
          }
        }
      } else {
        k = inside(static_cast<float>(x) + 0.5f, static_cast<float>(y) + 0.5f) ? kGrid * kGrid : 0;
      }
      if (k > 0) blend(img, x, y, k, c);
    }
  }
}

}  // namespace

Rgb8 blank(std::uint32_t w, std::uint32_t h, Rgb c) {
  Rgb8 img;
  img.width = w;
  img.height = h;
  img.pixels.resize(static_cast<std::size_t>(w) * h * 3);
  fill(img, c);
  return img;
}

void fill(Rgb8& img, Rgb c) {
  for (std::size_t i = 0; i + 2 < img.pixels.size(); i += 3) {
    img.pixels[i] = c.r;
    img.pixels[i + 1] = c.g;
    img.pixels[i + 2] = c.b;
  }
}

void fill_circle(Rgb8& img, float cx, float cy, float r, Rgb c, bool antialias) {
  if (!(r > 0)) return;
  const float r2 = r * r;
  raster(img, cx - r, cy - r, cx + r, cy + r, c, antialias, [&](float x, float y) {
    const float dx = x - cx, dy = y - cy;
    return dx * dx + dy * dy < r2;
  });
}

void fill_rect(Rgb8& img, float x0, float y0, float x1, float y1, Rgb c, bool antialias) {
  if (x1 < x0) std::swap(x0, x1);
  if (y1 < y0) std::swap(y0, y1);
  raster(img, x0, y0, x1, y1, c, antialias,
         [&](float x, float y) { return x >= x0 && x < x1 && y >= y0 && y < y1; });
}

void fill_triangle(Rgb8& img, float x0, float y0, float x1, float y1, float x2, float y2, Rgb c, bool antialias) {
  // Edge functions; multiplying by the sign of the doubled area makes both windings "inside = all >= 0".
  const float area = (x1 - x0) * (y2 - y0) - (y1 - y0) * (x2 - x0);
  if (!(area != 0)) return;  // degenerate (or NaN): no interior
  const float s = area > 0 ? 1.0f : -1.0f;
  const auto edge = [](float ax, float ay, float bx, float by, float px, float py) {
    return (bx - ax) * (py - ay) - (by - ay) * (px - ax);
  };
  raster(img, std::min({x0, x1, x2}), std::min({y0, y1, y2}), std::max({x0, x1, x2}), std::max({y0, y1, y2}), c,
         antialias, [&](float x, float y) {
           return s * edge(x0, y0, x1, y1, x, y) >= 0 && s * edge(x1, y1, x2, y2, x, y) >= 0 &&
                  s * edge(x2, y2, x0, y0, x, y) >= 0;
         });
}

}  // namespace tandem::image
