// Row kernels shared by the CLIP and Whisper forwards (encoder_rows.h).
#include "engine/encoder_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace tandem::engine {

Error torch_error(const std::string& what, const char* op) {
  const bool oom = what.find("out of memory") != std::string::npos || what.find("alloc") != std::string::npos;
  return Error{oom ? Errc::out_of_memory : Errc::internal, std::string(op) + ": " + what};
}

void layer_norm_rows(const float* x, const float* w, const float* b, std::int64_t n, std::int64_t d, double eps,
                     float* out) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float* r = x + i * d;
    double sum = 0;
    for (std::int64_t j = 0; j < d; ++j) sum += r[j];
    const double mean = sum / static_cast<double>(d);
    double var = 0;
    for (std::int64_t j = 0; j < d; ++j) var += (r[j] - mean) * (r[j] - mean);
    const double rstd = 1.0 / std::sqrt(var / static_cast<double>(d) + eps);
    float* o = out + i * d;
    for (std::int64_t j = 0; j < d; ++j) o[j] = static_cast<float>((r[j] - mean) * rstd) * w[j] + b[j];
  }
}

void gelu_rows(float* x, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i)
    x[i] = static_cast<float>(0.5 * x[i] * (1.0 + std::erf(x[i] * 0.70710678118654752440)));
}

void add_bias_rows(float* y, const float* b, std::int64_t n, std::int64_t r) {
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < r; ++j) y[i * r + j] += b[j];
}

void attention_rows(const float* q, const float* k, const float* v, float* out, std::int64_t r0, std::int64_t r1,
                    std::int64_t m, std::int64_t d, int heads, bool causal, std::int64_t past,
                    const std::int64_t* slots) {
  const std::int64_t hd = d / heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> s(static_cast<std::size_t>(m)), acc(static_cast<std::size_t>(hd));
  for (std::int64_t i = r0; i < r1; ++i) {
    const std::int64_t n = causal ? std::min(m, past + i + 1) : m;
    for (int h = 0; h < heads; ++h) {
      const float* qi = q + i * d + h * hd;
      double mx = -std::numeric_limits<double>::infinity();
      for (std::int64_t j = 0; j < n; ++j) {
        const float* kj = k + (slots ? slots[j] : j) * d + h * hd;
        double dot = 0;
        for (std::int64_t e = 0; e < hd; ++e) dot += static_cast<double>(qi[e]) * kj[e];
        s[static_cast<std::size_t>(j)] = dot * scale;
        mx = std::max(mx, s[static_cast<std::size_t>(j)]);
      }
      double sum = 0;
      for (std::int64_t j = 0; j < n; ++j) sum += (s[static_cast<std::size_t>(j)] = std::exp(s[static_cast<std::size_t>(j)] - mx));
      std::fill(acc.begin(), acc.end(), 0.0);
      for (std::int64_t j = 0; j < n; ++j) {
        const float* vj = v + (slots ? slots[j] : j) * d + h * hd;
        const double p = s[static_cast<std::size_t>(j)];
        for (std::int64_t e = 0; e < hd; ++e) acc[static_cast<std::size_t>(e)] += p * vj[e];
      }
      float* o = out + i * d + h * hd;
      for (std::int64_t e = 0; e < hd; ++e) o[e] = static_cast<float>(acc[static_cast<std::size_t>(e)] / sum);
    }
  }
}

}  // namespace tandem::engine
