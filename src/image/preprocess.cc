// CLIP preprocessing as Hugging Face's CLIPImageProcessor does it with PIL: resize the shortest edge (PIL bicubic),
// centre crop, rescale 1/255, normalise. The resampler reimplements the behaviour of PIL's Resample.c for 8-bit
// images: a = -0.5 cubic, support widened by the downscale factor, weights normalised then rounded to 22-bit fixed
// point, horizontal pass then vertical pass, each rounded and clamped to uint8.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "image/image.h"

namespace tandem::image {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // PIL's fixed point: the sum of 255 * weights fits an int32
constexpr std::uint32_t kMaxClipSide = 4096;  // size / crop from a config; real CLIP models use 224-448

double bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0) x = -x;
  if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
  return 0;
}

// Fixed-point weights for output positions [first, first + count) of an in_size -> out_size resize.
struct Coeffs {
  std::vector<std::uint32_t> start;   // first input index per output
  std::vector<std::uint32_t> offset;  // into k, per output (count + 1 entries)
  std::vector<std::int32_t> k;
};

Coeffs coeffs(std::uint32_t in_size, std::uint32_t out_size, std::uint32_t first, std::uint32_t count) {
  Coeffs c;
  const double scale = static_cast<double>(in_size) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = 2.0 * filterscale;
  const double ss = 1.0 / filterscale;
  c.start.reserve(count);
  c.offset.reserve(count + 1);
  c.offset.push_back(0);
  std::vector<double> w;
  for (std::uint32_t xx = first; xx < first + count; ++xx) {
    const double center = (xx + 0.5) * scale;
    // PIL rounds the window ends with (int)(v + 0.5): truncation toward zero, then clamps to the input.
    long xmin = static_cast<long>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    long xmax = static_cast<long>(center + support + 0.5);
    if (xmax > static_cast<long>(in_size)) xmax = in_size;
    const long n = std::max(0L, xmax - xmin);
    w.assign(static_cast<std::size_t>(n), 0.0);
    double ww = 0;
    for (long x = 0; x < n; ++x) {
      w[x] = bicubic((static_cast<double>(x + xmin) - center + 0.5) * ss);
      ww += w[x];
    }
    for (long x = 0; x < n; ++x) {
      const double v = ww != 0 ? w[x] / ww : w[x];
      const double f = v * (1 << kPrecisionBits);
      c.k.push_back(static_cast<std::int32_t>(v < 0 ? f - 0.5 : f + 0.5));
    }
    c.start.push_back(static_cast<std::uint32_t>(xmin));
    c.offset.push_back(static_cast<std::uint32_t>(c.k.size()));
  }
  return c;
}

std::uint8_t clip8(std::int64_t v) {
  if (v >= (std::int64_t{1} << kPrecisionBits << 8)) return 255;
  if (v <= 0) return 0;
  return static_cast<std::uint8_t>(v >> kPrecisionBits);
}

// The window [x0, x0 + nx) x [y0, y0 + ny) of PIL's resize of img to w x h. Each output pixel of a pass depends
// only on its own weights, so computing a window gives exactly the pixels of the full resize: this keeps a CLIP
// crop of an extreme aspect ratio (1 x 16384 -> 224 x 3670016) from allocating the whole resized image.
Rgb8 resize_window(const Rgb8& img, std::uint32_t w, std::uint32_t h, std::uint32_t x0, std::uint32_t nx,
                   std::uint32_t y0, std::uint32_t ny) {
  Rgb8 out;
  out.width = nx;
  out.height = ny;
  out.pixels.assign(static_cast<std::size_t>(nx) * ny * 3, 0);
  if (img.width == 0 || img.height == 0 || nx == 0 || ny == 0 ||
      img.pixels.size() != static_cast<std::size_t>(img.width) * img.height * 3) {
    return out;
  }
  const Coeffs cv = coeffs(img.height, h, y0, ny);
  // Input rows the vertical pass reads.
  std::uint32_t row_first = img.height, row_last = 0;
  for (std::uint32_t j = 0; j < ny; ++j) {
    const std::uint32_t n = cv.offset[j + 1] - cv.offset[j];
    if (n == 0) continue;
    row_first = std::min(row_first, cv.start[j]);
    row_last = std::max(row_last, cv.start[j] + n);
  }
  if (row_first >= row_last) return out;
  const std::uint32_t rows = row_last - row_first;

  // Horizontal pass (skipped when the width is unchanged, as PIL does: at scale 1 it is the identity anyway).
  Rgb8 tmp;
  const bool horizontal = w != img.width || x0 != 0 || nx != img.width;
  if (horizontal) {
    const Coeffs ch = coeffs(img.width, w, x0, nx);
    tmp.width = nx;
    tmp.height = rows;
    tmp.pixels.resize(static_cast<std::size_t>(nx) * rows * 3);
    for (std::uint32_t y = 0; y < rows; ++y) {
      const std::uint8_t* src = &img.pixels[static_cast<std::size_t>(row_first + y) * img.width * 3];
      std::uint8_t* dst = &tmp.pixels[static_cast<std::size_t>(y) * nx * 3];
      for (std::uint32_t x = 0; x < nx; ++x) {
        const std::int32_t* k = ch.k.data() + ch.offset[x];
        const std::uint32_t n = ch.offset[x + 1] - ch.offset[x];
        const std::uint8_t* s = src + static_cast<std::size_t>(ch.start[x]) * 3;
        for (int c = 0; c < 3; ++c) {
          std::int64_t acc = std::int64_t{1} << (kPrecisionBits - 1);
          for (std::uint32_t i = 0; i < n; ++i) acc += static_cast<std::int64_t>(s[i * 3 + c]) * k[i];
          dst[x * 3 + c] = clip8(acc);
        }
      }
    }
  }
  const Rgb8& hsrc = horizontal ? tmp : img;
  const std::uint32_t hrow0 = horizontal ? row_first : 0;  // input row r is hsrc row r - hrow0

  // Vertical pass (skipped when the height is unchanged).
  const bool vertical = h != img.height || y0 != 0 || ny != img.height;
  const std::size_t stride = static_cast<std::size_t>(hsrc.width) * 3;
  for (std::uint32_t j = 0; j < ny; ++j) {
    std::uint8_t* dst = &out.pixels[static_cast<std::size_t>(j) * nx * 3];
    if (!vertical) {
      std::copy_n(&hsrc.pixels[(j - hrow0 + y0) * stride], static_cast<std::size_t>(nx) * 3, dst);
      continue;
    }
    const std::uint32_t n = cv.offset[j + 1] - cv.offset[j];
    if (n == 0) continue;  // no input rows: PIL's all-zero weights give 0
    const std::int32_t* k = cv.k.data() + cv.offset[j];
    const std::uint8_t* s = &hsrc.pixels[static_cast<std::size_t>(cv.start[j] - hrow0) * stride];
    for (std::size_t x = 0; x < static_cast<std::size_t>(nx) * 3; ++x) {
      std::int64_t acc = std::int64_t{1} << (kPrecisionBits - 1);
      for (std::uint32_t i = 0; i < n; ++i) acc += static_cast<std::int64_t>(s[i * stride + x]) * k[i];
      dst[x] = clip8(acc);
    }
  }
  return out;
}

// Python's floor division, for the centre crop's offset of a window larger than the image.
std::int64_t floor_div2(std::int64_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); }

using json = nlohmann::json;

Result<std::uint32_t> side_from(const json& v, const char* key) {
  if (!v.is_number_integer() || v.get<std::int64_t>() < 1 || v.get<std::int64_t>() > kMaxClipSide) {
    return fail(Errc::invalid_argument, std::string("preprocessor_config.json: ") + key + " must be an integer in 1.." +
                                            std::to_string(kMaxClipSide) + ", got " + v.dump());
  }
  return static_cast<std::uint32_t>(v.get<std::int64_t>());
}

Status triple_from(const json& cfg, const char* key, float out[3], bool positive) {
  if (!cfg.contains(key)) return {};
  const json& v = cfg[key];
  const auto bad = [&] {
    return fail(Errc::invalid_argument, std::string("preprocessor_config.json: ") + key + " must be 3 finite " +
                                            (positive ? "positive " : "") + "numbers, got " + v.dump());
  };
  if (!v.is_array() || v.size() != 3) return bad();
  for (int i = 0; i < 3; ++i) {
    if (!v[i].is_number()) return bad();
    const double d = v[i].get<double>();
    const float f = static_cast<float>(d);
    if (!std::isfinite(f) || (positive && !(f > 0))) return bad();
    out[i] = f;
  }
  return {};
}

}  // namespace

Rgb8 resize_bicubic(const Rgb8& img, std::uint32_t w, std::uint32_t h) { return resize_window(img, w, h, 0, w, 0, h); }

std::vector<float> clip_preprocess(const Rgb8& img, const ClipPreprocess& p) {
  if (img.width == 0 || img.height == 0 || p.size == 0 || p.crop == 0 ||
      img.pixels.size() != static_cast<std::size_t>(img.width) * img.height * 3) {
    return {};
  }
  // HF get_resize_output_image_size(default_to_square=False): short edge = size, long = int(size * long / short).
  const bool wide = img.width > img.height;
  const std::uint64_t short_in = wide ? img.height : img.width, long_in = wide ? img.width : img.height;
  const std::uint64_t long_out =
      static_cast<std::uint64_t>(static_cast<double>(std::uint64_t{p.size} * long_in) / static_cast<double>(short_in));
  const std::uint64_t rw = wide ? long_out : p.size, rh = wide ? p.size : long_out;
  // HF center_crop: top = (h - crop) // 2; where the crop is larger than the image it pads with zeros around it.
  const std::int64_t crop = p.crop;
  const std::int64_t top = floor_div2(static_cast<std::int64_t>(rh) - crop);
  const std::int64_t left = floor_div2(static_cast<std::int64_t>(rw) - crop);
  const std::int64_t y_begin = std::max<std::int64_t>(0, top), y_end = std::min<std::int64_t>(rh, top + crop);
  const std::int64_t x_begin = std::max<std::int64_t>(0, left), x_end = std::min<std::int64_t>(rw, left + crop);
  Rgb8 win;
  if (x_end > x_begin && y_end > y_begin && rw <= UINT32_MAX && rh <= UINT32_MAX) {
    win = resize_window(img, static_cast<std::uint32_t>(rw), static_cast<std::uint32_t>(rh),
                        static_cast<std::uint32_t>(x_begin), static_cast<std::uint32_t>(x_end - x_begin),
                        static_cast<std::uint32_t>(y_begin), static_cast<std::uint32_t>(y_end - y_begin));
  }
  // HF rescale: float64 multiply by 1/255 then float32; normalize: float32 (x - mean) / std.
  const std::size_t plane = static_cast<std::size_t>(crop) * crop;
  std::vector<float> out(3 * plane);
  for (std::int64_t y = 0; y < crop; ++y) {
    for (std::int64_t x = 0; x < crop; ++x) {
      const std::int64_t sy = y + top, sx = x + left;
      const bool inside = sy >= y_begin && sy < y_end && sx >= x_begin && sx < x_end;
      for (int c = 0; c < 3; ++c) {
        const std::uint8_t v =
            inside ? win.pixels[(static_cast<std::size_t>(sy - y_begin) * win.width + (sx - x_begin)) * 3 + c] : 0;
        const float scaled = static_cast<float>(v * (1.0 / 255.0));
        out[c * plane + static_cast<std::size_t>(y) * crop + x] = (scaled - p.mean[c]) / p.std[c];
      }
    }
  }
  return out;
}

Result<ClipPreprocess> clip_preprocess_from_json(const std::string& text) {
  json cfg;
  try {
    cfg = json::parse(text);
  } catch (const json::exception& e) {
    return fail(Errc::parse_error, std::string("preprocessor_config.json: ") + e.what());
  }
  if (!cfg.is_object()) return fail(Errc::parse_error, "preprocessor_config.json: not a JSON object");
  ClipPreprocess p;
  for (const char* flag : {"do_resize", "do_center_crop", "do_normalize", "do_rescale"}) {
    if (!cfg.contains(flag)) continue;
    if (!cfg[flag].is_boolean()) {
      return fail(Errc::invalid_argument, std::string("preprocessor_config.json: ") + flag + " must be a boolean");
    }
    if (!cfg[flag].get<bool>()) {
      return fail(Errc::unsupported, std::string("preprocessor_config.json: ") + flag +
                                         " = false (only the full CLIP pipeline is implemented)");
    }
  }
  if (cfg.contains("resample") && cfg["resample"] != json(3)) {
    return fail(Errc::unsupported,
                "preprocessor_config.json: resample " + cfg["resample"].dump() + " (only 3 = PIL bicubic)");
  }
  if (cfg.contains("rescale_factor")) {
    const json& f = cfg["rescale_factor"];
    if (!f.is_number() || std::fabs(f.get<double>() * 255.0 - 1.0) > 1e-6) {
      return fail(Errc::unsupported, "preprocessor_config.json: rescale_factor " + f.dump() + " (only 1/255)");
    }
  }
  if (cfg.contains("size")) {
    const json& s = cfg["size"];
    if (s.is_object()) {
      if (!s.contains("shortest_edge")) {
        return fail(Errc::unsupported, "preprocessor_config.json: size " + s.dump() +
                                           " (only {\"shortest_edge\": N} or N: CLIP resizes the shortest edge)");
      }
      auto v = side_from(s["shortest_edge"], "size.shortest_edge");
      if (!v.ok()) return fail(std::move(v).error());
      p.size = *v;
    } else {
      auto v = side_from(s, "size");
      if (!v.ok()) return fail(std::move(v).error());
      p.size = *v;
    }
  }
  if (cfg.contains("crop_size")) {
    const json& s = cfg["crop_size"];
    if (s.is_object()) {
      if (!s.contains("height") || !s.contains("width")) {
        return fail(Errc::invalid_argument, "preprocessor_config.json: crop_size " + s.dump() +
                                                " needs height and width");
      }
      auto h = side_from(s["height"], "crop_size.height");
      if (!h.ok()) return fail(std::move(h).error());
      auto w = side_from(s["width"], "crop_size.width");
      if (!w.ok()) return fail(std::move(w).error());
      if (*h != *w) {
        return fail(Errc::unsupported, "preprocessor_config.json: crop_size " + s.dump() + " is not square");
      }
      p.crop = *h;
    } else {
      auto v = side_from(s, "crop_size");
      if (!v.ok()) return fail(std::move(v).error());
      p.crop = *v;
    }
  }
  TANDEM_TRY(triple_from(cfg, "image_mean", p.mean, /*positive=*/false));
  TANDEM_TRY(triple_from(cfg, "image_std", p.std, /*positive=*/true));
  return p;
}

}  // namespace tandem::image
