// A tiny rasteriser for rendered training data and demo folders: solid fills of circles, axis-aligned rectangles and
// triangles on an Rgb8. Pixel (x, y) covers [x, x+1) x [y, y+1); its centre is (x + 0.5, y + 0.5). With antialias
// (the default) a pixel is blended by its coverage, measured on a fixed 4x4 grid of samples, so output is exact and
// deterministic across machines; without it a pixel is painted when its centre is inside. Shapes may lie partly or
// wholly outside the image; non-finite coordinates draw nothing.
#pragma once

#include <cstdint>

#include "image/image.h"

namespace tandem::image {

struct Rgb {
  std::uint8_t r = 0, g = 0, b = 0;
};

// A w x h image filled with c.
Rgb8 blank(std::uint32_t w, std::uint32_t h, Rgb c);

void fill(Rgb8& img, Rgb c);
void fill_circle(Rgb8& img, float cx, float cy, float r, Rgb c, bool antialias = true);
// The rectangle [x0, x1) x [y0, y1) (corners in any order).
void fill_rect(Rgb8& img, float x0, float y0, float x1, float y1, Rgb c, bool antialias = true);
// Either winding.
void fill_triangle(Rgb8& img, float x0, float y0, float x1, float y1, float x2, float y2, Rgb c,
                   bool antialias = true);

}  // namespace tandem::image
