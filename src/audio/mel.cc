// Log-mel features as Hugging Face's WhisperFeatureExtractor (transformers.audio_utils.spectrogram with
// mel_filter_bank(norm="slaney", mel_scale="slaney")) computes them, in double until the final float.
#include "audio/mel.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <numbers>

namespace tandem::audio {

// ---- FFT ---------------------------------------------------------------------------------------------------------

Fft::Fft(std::size_t n) : n_(n) {
  assert(n >= 1);
  twiddles_.resize(n);
  for (std::size_t k = 0; k < n; ++k) {
    twiddles_[k] = std::polar(1.0, -2.0 * std::numbers::pi * static_cast<double>(k) / static_cast<double>(n));
  }
  // Radix 4 first, then 2, 3, 5, ... (kissfft's order); a remaining prime is one generic stage.
  std::size_t rest = n, p = 4;
  while (rest > 1) {
    while (rest % p != 0) {
      p = p == 4 ? 2 : p == 2 ? 3 : p + 2;
      if (p * p > rest) p = rest;
    }
    rest /= p;
    factors_.push_back(p);
    factors_.push_back(rest);
  }
}

void Fft::forward(const std::complex<double>* in, std::complex<double>* out) const {
  if (n_ == 1) {
    out[0] = in[0];
    return;
  }
  work(out, in, 1, 0);
}

// Decimation in time: the p sub-transforms of length m (inputs strided by fstride·p), then one radix-p pass that
// applies the twiddles and the size-p DFT together (kissfft's kf_bfly2/kf_bfly4, else kf_bfly_generic).
void Fft::work(std::complex<double>* out, const std::complex<double>* in, std::size_t fstride,
               std::size_t level) const {
  const std::size_t p = factors_[2 * level], m = factors_[2 * level + 1];
  if (m == 1) {
    for (std::size_t q = 0; q < p; ++q) out[q] = in[q * fstride];
  } else {
    for (std::size_t q = 0; q < p; ++q) work(out + q * m, in + q * fstride, fstride * p, level + 1);
  }
  const std::complex<double>* tw = twiddles_.data();
  if (p == 2) {  // kissfft's kf_bfly2
    for (std::size_t u = 0; u < m; ++u) {
      const std::complex<double> t = out[u + m] * tw[u * fstride];
      out[u + m] = out[u] - t;
      out[u] += t;
    }
    return;
  }
  if (p == 4) {  // kissfft's kf_bfly4, forward
    for (std::size_t u = 0; u < m; ++u) {
      const std::complex<double> s0 = out[u + m] * tw[u * fstride], s1 = out[u + 2 * m] * tw[2 * u * fstride],
                                 s2 = out[u + 3 * m] * tw[3 * u * fstride];
      const std::complex<double> s5 = out[u] - s1, a = out[u] + s1, s3 = s0 + s2, s4 = s0 - s2;
      out[u + 2 * m] = a - s3;
      out[u] = a + s3;
      out[u + m] = {s5.real() + s4.imag(), s5.imag() - s4.real()};
      out[u + 3 * m] = {s5.real() - s4.imag(), s5.imag() + s4.real()};
    }
    return;
  }
  std::complex<double> small[16];
  std::vector<std::complex<double>> big;
  std::complex<double>* scratch = small;
  if (p > 16) {
    big.resize(p);
    scratch = big.data();
  }
  for (std::size_t u = 0; u < m; ++u) {
    for (std::size_t q = 0, k = u; q < p; ++q, k += m) scratch[q] = out[k];
    for (std::size_t q1 = 0, k = u; q1 < p; ++q1, k += m) {
      std::size_t ti = 0;
      std::complex<double> acc = scratch[0];
      for (std::size_t q = 1; q < p; ++q) {
        ti += fstride * k;  // fstride·k < n, so one subtraction keeps ti in range
        if (ti >= n_) ti -= n_;
        acc += scratch[q] * tw[ti];
      }
      out[k] = acc;
    }
  }
}

// ---- mel filters -------------------------------------------------------------------------------------------------

namespace {

// Slaney's mel scale (librosa htk=False): linear below 1 kHz (3 mels per 200 Hz), logarithmic above.
constexpr double kFSp = 200.0 / 3.0, kMinLogHz = 1000.0, kMinLogMel = kMinLogHz / kFSp;
const double kLogStep = std::log(6.4) / 27.0;

double hz_to_mel(double hz) { return hz >= kMinLogHz ? kMinLogMel + std::log(hz / kMinLogHz) / kLogStep : hz / kFSp; }
double mel_to_hz(double mel) {
  return mel >= kMinLogMel ? kMinLogHz * std::exp(kLogStep * (mel - kMinLogMel)) : mel * kFSp;
}

}  // namespace

LogMel::LogMel(MelSpec spec) : spec_(spec), fft_(static_cast<std::size_t>(spec.n_fft / 2)) {
  assert(spec.n_fft >= 4 && spec.n_fft % 2 == 0 && spec.hop >= 1 && spec.n_mels >= 1 && spec.sample_rate > 0);
  const int n_fft = spec.n_fft, bins = n_fft / 2 + 1, n_mels = spec.n_mels;
  split_.resize(static_cast<std::size_t>(bins));
  for (int k = 0; k < bins; ++k) split_[k] = std::polar(1.0, -2.0 * std::numbers::pi * k / n_fft);
  hann_.resize(static_cast<std::size_t>(n_fft));
  for (int j = 0; j < n_fft; ++j) hann_[j] = 0.5 - 0.5 * std::cos(2.0 * std::numbers::pi * j / n_fft);  // periodic

  // Filter edges: n_mels + 2 points evenly spaced in mels from 0 to sr/2, triangles between neighbours,
  // each scaled by 2 / (upper edge − lower edge) (norm="slaney": constant energy per filter).
  const double fmax = spec.sample_rate / 2.0;
  std::vector<double> edges(static_cast<std::size_t>(n_mels) + 2);
  const double mel_max = hz_to_mel(fmax);
  for (std::size_t i = 0; i < edges.size(); ++i) {
    edges[i] = mel_to_hz(mel_max * static_cast<double>(i) / static_cast<double>(n_mels + 1));
  }
  filters_.assign(static_cast<std::size_t>(n_mels) * bins, 0.0);
  first_bin_.assign(n_mels, bins);
  end_bin_.assign(n_mels, 0);
  for (int i = 0; i < n_mels; ++i) {
    const double lo = edges[i], mid = edges[i + 1], hi = edges[i + 2], enorm = 2.0 / (hi - lo);
    for (int k = 0; k < bins; ++k) {
      const double f = fmax * k / (bins - 1);  // np.linspace(0, sr // 2, bins)
      const double w = std::max(0.0, std::min((f - lo) / (mid - lo), (hi - f) / (hi - mid)));
      if (w <= 0) continue;
      filters_[static_cast<std::size_t>(i) * bins + k] = w * enorm;
      first_bin_[i] = std::min(first_bin_[i], k);
      end_bin_[i] = k + 1;
    }
  }
  filters_f_.assign(filters_.begin(), filters_.end());
}

void LogMel::power_of(const double* x, std::complex<double>* z, std::complex<double>* zf, double* power) const {
  const std::size_t m = static_cast<std::size_t>(spec_.n_fft) / 2;
  for (std::size_t j = 0; j < m; ++j) z[j] = {x[2 * j], x[2 * j + 1]};
  fft_.forward(z, zf);
  // With E, O the transforms of the even and odd samples: Z[k] = E[k] + i·O[k], E[k] = (Z[k] + conj Z[m−k]) / 2,
  // O[k] = (Z[k] − conj Z[m−k]) / 2i, and X[k] = E[k] + exp(−2πik/n)·O[k] for k = 0..m (Z[m] = Z[0]).
  for (std::size_t k = 0; k <= m; ++k) {
    const std::complex<double> a = zf[k == m ? 0 : k], b = std::conj(zf[k == 0 ? 0 : m - k]);
    const std::complex<double> e = 0.5 * (a + b), o = std::complex<double>(0, -0.5) * (a - b);
    power[k] = std::norm(e + split_[k] * o);
  }
}

std::vector<double> LogMel::power_spectrum(std::span<const double> frame) const {
  const auto n = static_cast<std::size_t>(spec_.n_fft);
  assert(frame.size() == n);
  std::vector<double> windowed(n), power(n / 2 + 1);
  std::vector<std::complex<double>> z(n / 2), zf(n / 2);
  for (std::size_t j = 0; j < n; ++j) windowed[j] = frame[j] * hann_[j];
  power_of(windowed.data(), z.data(), zf.data(), power.data());
  return power;
}

std::vector<float> LogMel::window(std::span<const float> pcm, std::size_t start, std::size_t window_samples) const {
  const std::size_t w = window_samples, hop = static_cast<std::size_t>(spec_.hop);
  const std::size_t n_fft = static_cast<std::size_t>(spec_.n_fft), pad = n_fft / 2, bins = n_fft / 2 + 1;
  const std::size_t frames = w / hop, n_mels = static_cast<std::size_t>(spec_.n_mels);
  if (frames == 0) return {};

  // Sample i of the window (zeros past the end of pcm), i in [0, w).
  auto sample = [&](std::size_t i) -> double {
    return start < pcm.size() && i < pcm.size() - start ? static_cast<double>(pcm[start + i]) : 0.0;
  };
  // Position j of the reflect-padded window (np.pad "reflect": the edge sample is not repeated; the pattern repeats
  // with period 2(w−1) when the pad is longer than w).
  const long long period = w > 1 ? 2 * static_cast<long long>(w - 1) : 1;
  auto padded = [&](long long j) -> double {
    long long s = ((j - static_cast<long long>(pad)) % period + period) % period;
    if (s >= static_cast<long long>(w)) s = period - s;
    return sample(static_cast<std::size_t>(s));
  };

  std::vector<float> result(n_mels * frames);
  std::vector<std::complex<double>> z(n_fft / 2), zf(n_fft / 2);
  std::vector<double> windowed(n_fft), power(bins);
  double max_log = -HUGE_VAL;
  for (std::size_t t = 0; t < frames; ++t) {
    const std::size_t first = t * hop;  // in padded coordinates
    if (first >= pad && first - pad + n_fft <= w) {
      for (std::size_t j = 0; j < n_fft; ++j) windowed[j] = sample(first - pad + j) * hann_[j];
    } else {  // an edge frame: reflected samples
      for (std::size_t j = 0; j < n_fft; ++j) windowed[j] = padded(static_cast<long long>(first + j)) * hann_[j];
    }
    power_of(windowed.data(), z.data(), zf.data(), power.data());
    for (std::size_t i = 0; i < n_mels; ++i) {
      const double* f = filters_.data() + i * bins;
      double mel = 0;
      for (int k = first_bin_[i]; k < end_bin_[i]; ++k) mel += f[k] * power[k];
      const double v = std::log10(std::max(mel, 1e-10));
      result[i * frames + t] = static_cast<float>(v);  // |v| <= ~20: float keeps ~1e-6 absolute
      max_log = std::max(max_log, v);
    }
  }
  const double floor = max_log - 8.0;
  for (float& v : result) v = static_cast<float>((std::max(static_cast<double>(v), floor) + 4.0) / 4.0);
  return result;
}

// ---- preprocessor_config.json ------------------------------------------------------------------------------------

Result<MelSpec> mel_spec_from_preprocessor_json(const std::string& text) {
  using json = nlohmann::json;
  json cfg;
  try {
    cfg = json::parse(text);
  } catch (const json::exception& e) {
    return fail(Errc::parse_error, std::string("preprocessor_config.json: ") + e.what());
  }
  if (!cfg.is_object()) return fail(Errc::parse_error, "preprocessor_config.json: not a JSON object");
  MelSpec spec;
  struct Key {
    const char* name;
    int* field;
    long long lo, hi;
  };
  const Key keys[] = {{"feature_size", &spec.n_mels, 1, 512},
                      {"n_fft", &spec.n_fft, 4, 16384},
                      {"hop_length", &spec.hop, 1, 16384},
                      {"sampling_rate", &spec.sample_rate, 1, 1'000'000}};
  for (const Key& k : keys) {
    if (!cfg.contains(k.name)) continue;
    const json& v = cfg[k.name];
    if (!v.is_number_integer()) {
      return fail(Errc::format_error,
                  std::string("preprocessor_config.json: ") + k.name + " must be an integer, not " + v.dump());
    }
    const long long x = v.get<long long>();
    if (x < k.lo || x > k.hi) {
      return fail(Errc::format_error, std::string("preprocessor_config.json: ") + k.name + " " + std::to_string(x) +
                                          " is outside " + std::to_string(k.lo) + ".." + std::to_string(k.hi));
    }
    *k.field = static_cast<int>(x);
  }
  if (spec.n_fft % 2 != 0) {
    return fail(Errc::format_error, "preprocessor_config.json: n_fft " + std::to_string(spec.n_fft) + " is odd");
  }
  if (spec.sample_rate != kSampleRate) {
    return fail(Errc::unsupported, "preprocessor_config.json: sampling_rate " + std::to_string(spec.sample_rate) +
                                       " (Whisper models take " + std::to_string(kSampleRate) + " Hz only)");
  }
  return spec;
}

}  // namespace tandem::audio
