#include "kernels/rows.h"

#include <cmath>
#include <cstdint>

namespace tandem::kernels {

// rmsnorm_rows, silu_mul, rope_rows: kernels.cc, on the dispatched path (rows_lanes.h, silu_lanes.h).

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

}  // namespace tandem::kernels
