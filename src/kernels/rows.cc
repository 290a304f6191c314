#include "kernels/rows.h"

#include <cmath>
#include <cstdint>

namespace tandem::kernels {

void rmsnorm_rows(const float* x, const float* w, std::int64_t n, std::int64_t d, float eps, float* out) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float* xr = x + i * d;
    double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::int64_t j = 0;
    for (; j + 8 <= d; j += 8)
      for (int l = 0; l < 8; ++l) part[l] += static_cast<double>(xr[j + l]) * static_cast<double>(xr[j + l]);
    for (int l = 0; j < d; ++j, ++l) part[l] += static_cast<double>(xr[j]) * static_cast<double>(xr[j]);
    const double sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    const auto r = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(d) + static_cast<double>(eps)));
    float* o = out + i * d;
    for (j = 0; j < d; ++j) o[j] = (xr[j] * r) * w[j];
  }
}

// silu_mul: kernels.cc, on the dispatched path (silu_lanes.h).

void gelu_tanh_mul(const float* gate, const float* up, std::int64_t count, float* out) {
  constexpr float kSqrt2OverPi = 0.7978845608028654F;
  for (std::int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    out[i] = 0.5F * g * (1.0F + std::tanh(kSqrt2OverPi * (g + 0.044715F * g * g * g))) * up[i];
  }
}

void softcap_rows(float* x, std::int64_t count, float cap) {
  for (std::int64_t i = 0; i < count; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

void rope_table(const std::int64_t* pos, std::int64_t n, const float* inv_freq, std::int64_t half, float scale,
                float* cos_out, float* sin_out) {
  for (std::int64_t i = 0; i < n; ++i) {
    const auto p = static_cast<float>(pos[i]);
    for (std::int64_t k = 0; k < half; ++k) {
      const double a = static_cast<double>(p * inv_freq[k]);
      cos_out[i * half + k] = static_cast<float>(std::cos(a)) * scale;
      sin_out[i * half + k] = static_cast<float>(std::sin(a)) * scale;
    }
  }
}

void rope_rows(float* x, std::int64_t n, std::int64_t heads, std::int64_t half, const float* cos_tab,
               const float* sin_tab, bool interleaved) {
  const std::int64_t hd = 2 * half;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* c = cos_tab + i * half;
    const float* s = sin_tab + i * half;
    for (std::int64_t h = 0; h < heads; ++h) {
      float* v = x + (i * heads + h) * hd;
      for (std::int64_t k = 0; k < half; ++k) {
        float* a = interleaved ? v + 2 * k : v + k;
        float* b = interleaved ? v + 2 * k + 1 : v + k + half;
        const float x1 = *a, x2 = *b;
        *a = x1 * c[k] - x2 * s[k];
        *b = x2 * c[k] + x1 * s[k];
      }
    }
  }
}

}  // namespace tandem::kernels
