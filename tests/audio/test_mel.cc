// Whisper log-mel: the FFT against a naive DFT, the Slaney filters against formulas written here independently (and
// spot values derived by hand), a whole short window recomputed here with an O(N²) DFT, sines landing in the right
// mel bin, silence at the exact floor, zero padding, and preprocessor_config.json.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <numbers>
#include <random>
#include <vector>

#include "audio/mel.h"

using namespace tandem;
using namespace tandem::audio;

namespace {

using cd = std::complex<double>;

std::vector<cd> naive_dft(const std::vector<cd>& x) {
  const std::size_t n = x.size();
  std::vector<cd> out(n);
  for (std::size_t k = 0; k < n; ++k) {
    cd acc = 0;
    for (std::size_t j = 0; j < n; ++j) {
      // Reduce j·k mod n first so the angle stays small and exact.
      acc +=
          x[j] * std::polar(1.0, -2.0 * std::numbers::pi * static_cast<double>((j * k) % n) / static_cast<double>(n));
    }
    out[k] = acc;
  }
  return out;
}

// Slaney mel scale written from its definition: 3 mels per 200 Hz up to 1 kHz (mel 15), then 27 mels per
// factor 6.4 of frequency.
double slaney_mel(double hz) {
  return hz < 1000 ? 3.0 * hz / 200.0 : 15.0 + 27.0 * std::log(hz / 1000.0) / std::log(6.4);
}
double slaney_hz(double mel) { return mel < 15 ? 200.0 * mel / 3.0 : 1000.0 * std::pow(6.4, (mel - 15.0) / 27.0); }

// librosa.filters.mel(sr, n_fft, n_mels, htk=False, norm="slaney"), double.
std::vector<double> reference_filters(int sr, int n_fft, int n_mels) {
  const int bins = n_fft / 2 + 1;
  std::vector<double> f(n_mels + 2);
  for (int i = 0; i < n_mels + 2; ++i) f[i] = slaney_hz(slaney_mel(sr / 2.0) * i / (n_mels + 1));
  std::vector<double> w(static_cast<std::size_t>(n_mels) * bins, 0.0);
  for (int i = 0; i < n_mels; ++i) {
    for (int k = 0; k < bins; ++k) {
      const double hz = k * static_cast<double>(sr) / n_fft;
      double tri = 0;
      if (hz > f[i] && hz <= f[i + 1]) tri = (hz - f[i]) / (f[i + 1] - f[i]);
      if (hz > f[i + 1] && hz < f[i + 2]) tri = (f[i + 2] - hz) / (f[i + 2] - f[i + 1]);
      w[static_cast<std::size_t>(i) * bins + k] = tri * 2.0 / (f[i + 2] - f[i]);
    }
  }
  return w;
}

// The whole recipe for a short window, with the O(N²) DFT: reflect padding, periodic Hann, power, filters, log10
// floor, max − 8, (x + 4) / 4.
std::vector<double> reference_window(const std::vector<float>& x, int n_mels, int n_fft, int hop) {
  const int w = static_cast<int>(x.size()), pad = n_fft / 2, frames = w / hop, bins = n_fft / 2 + 1;
  const auto filt = reference_filters(16000, n_fft, n_mels);
  std::vector<double> lm(static_cast<std::size_t>(n_mels) * frames);
  for (int t = 0; t < frames; ++t) {
    std::vector<cd> fr(n_fft);
    for (int j = 0; j < n_fft; ++j) {
      int s = t * hop + j - pad;
      if (s < 0) s = -s;                // reflect: x[-1] = x[1]
      if (s >= w) s = 2 * (w - 1) - s;  // x[w] = x[w - 2]
      fr[j] = x[s] * (0.5 - 0.5 * std::cos(2 * std::numbers::pi * j / n_fft));
    }
    const auto spec = naive_dft(fr);
    for (int i = 0; i < n_mels; ++i) {
      double mel = 0;
      for (int k = 0; k < bins; ++k) mel += filt[static_cast<std::size_t>(i) * bins + k] * std::norm(spec[k]);
      lm[static_cast<std::size_t>(i) * frames + t] = std::log10(std::max(mel, 1e-10));
    }
  }
  const double mx = *std::max_element(lm.begin(), lm.end());
  for (double& v : lm) v = (std::max(v, mx - 8.0) + 4.0) / 4.0;
  return lm;
}

std::vector<float> noise(std::size_t n, unsigned seed, double amp = 0.3) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(-amp, amp);
  std::vector<float> v(n);
  for (auto& s : v) s = static_cast<float>(d(rng));
  return v;
}

std::vector<float> sine(double hz, std::size_t n, double amp = 0.5) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(amp * std::sin(2 * std::numbers::pi * hz * i / 16000.0));
  return v;
}

}  // namespace

TEST(Fft, MatchesNaiveDftForMixedRadixAndPrimeLengths) {
  for (std::size_t n : {1u, 2u, 3u, 4u, 5u, 7u, 12u, 16u, 97u, 100u, 256u, 400u, 510u}) {
    std::mt19937 rng(static_cast<unsigned>(n));
    std::normal_distribution<double> d;
    std::vector<cd> x(n), y(n);
    for (auto& v : x) v = cd(d(rng), d(rng));
    Fft(n).forward(x.data(), y.data());
    const auto ref = naive_dft(x);
    for (std::size_t k = 0; k < n; ++k) {
      ASSERT_NEAR(y[k].real(), ref[k].real(), 1e-9 * std::sqrt(static_cast<double>(n))) << "n=" << n << " k=" << k;
      ASSERT_NEAR(y[k].imag(), ref[k].imag(), 1e-9 * std::sqrt(static_cast<double>(n))) << "n=" << n << " k=" << k;
    }
  }
}

TEST(LogMel, FiltersMatchSlaneyFormulas) {
  for (int n_mels : {80, 128}) {
    const LogMel lm(MelSpec{n_mels, 400, 160, 16000});
    const auto ref = reference_filters(16000, 400, n_mels);
    ASSERT_EQ(lm.filters().size(), static_cast<std::size_t>(n_mels) * 201);
    for (std::size_t i = 0; i < ref.size(); ++i) {
      ASSERT_NEAR(lm.filters()[i], ref[i], 1e-6 * std::max(1.0, std::fabs(ref[i]) * 100)) << "index " << i;
    }
    for (int i = 0; i < n_mels; ++i) {  // every filter has some weight
      double sum = 0;
      for (int k = 0; k < 201; ++k) sum += lm.filters()[static_cast<std::size_t>(i) * 201 + k];
      EXPECT_GT(sum, 0.0) << "filter " << i;
    }
  }
}

TEST(LogMel, FilterSpotValuesDerivedByHand) {
  // 80 filters, 16 kHz: mel(8000) = 15 + 27·ln(8)/ln(6.4) = 45.24564; 82 edges 45.24564/81 = 0.558588 mel apart,
  // i.e. 37.23921 Hz apart below 1 kHz (x 200/3). Bins are 40 Hz apart.
  // Filter 0: edges 0, 37.239, 74.478 Hz; enorm 2/74.478 = 0.0268535. Bin 1 (40 Hz) on the falling side:
  //   (74.478 − 40)/37.239 = 0.925870 → 0.0248626 (whisper's mel_filters.npz has 0.02486259 there).
  // Filter 1: edges 37.239, 74.478, 111.718. Bin 1: (40 − 37.239)/37.239 · 0.0268535 = 0.00199082;
  //   bin 2 (80 Hz): (111.718 − 80)/37.239 · 0.0268535 = 0.0228718.
  // Filter 79: edges 7408.54, 7698.59, 8000 Hz. Bin 199 (7960 Hz): 40/301.41 · 2/591.46 = 0.000448759.
  const LogMel lm;
  const auto& f = lm.filters();
  EXPECT_NEAR(f[0 * 201 + 1], 0.0248626, 2e-7);
  EXPECT_EQ(f[0 * 201 + 0], 0.0f);
  EXPECT_EQ(f[0 * 201 + 2], 0.0f);
  EXPECT_NEAR(f[1 * 201 + 1], 0.00199082, 2e-8);
  EXPECT_NEAR(f[1 * 201 + 2], 0.0228718, 2e-7);
  EXPECT_NEAR(f[79 * 201 + 199], 0.000448759, 5e-9);
  EXPECT_EQ(f[79 * 201 + 200], 0.0f);  // 8000 Hz is the last edge: weight 0
}

TEST(LogMel, PowerSpectrumOfReflectPaddedFirstFrameMatchesNaiveDft) {
  const auto x = noise(1600, 7);
  // STFT frame 0 with center=True: samples −200..199, the negative ones reflected (x[-j] = x[j]).
  std::vector<double> frame(400);
  for (int j = 0; j < 400; ++j) frame[j] = x[static_cast<std::size_t>(std::abs(j - 200))];
  const LogMel lm;
  const auto power = lm.power_spectrum(frame);
  std::vector<cd> windowed(400);
  for (int j = 0; j < 400; ++j) windowed[j] = frame[j] * (0.5 - 0.5 * std::cos(2 * std::numbers::pi * j / 400));
  const auto ref = naive_dft(windowed);
  ASSERT_EQ(power.size(), 201u);
  for (int k = 0; k < 201; ++k) ASSERT_NEAR(power[k], std::norm(ref[k]), 1e-9 * (1 + std::norm(ref[k]))) << k;
}

TEST(LogMel, ShortWindowMatchesNaiveRecipeEverywhere) {
  // 10 frames of noise plus a tone: covers the reflect-padded first and last frames and the max − 8 clamp.
  auto x = noise(1600, 11, 0.05);
  const auto s = sine(440, 1600);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] += s[i];
  const LogMel lm;
  const auto got = lm.window(x, 0, x.size());
  const auto ref = reference_window(x, 80, 400, 160);
  ASSERT_EQ(got.size(), 80u * 10);
  for (std::size_t i = 0; i < ref.size(); ++i)
    ASSERT_NEAR(got[i], ref[i], 2e-6) << "mel " << i / 10 << " frame " << i % 10;
}

TEST(LogMel, SineEnergyLandsInTheFilterPeakingNearestItsFrequency) {
  const LogMel lm;
  // Filter i peaks at edge i + 1: recompute those centres here.
  std::vector<double> centre(80);
  for (int i = 0; i < 80; ++i) centre[i] = slaney_hz(slaney_mel(8000) * (i + 1) / 81);
  // Tones clearly nearer one centre than its neighbours (6000 Hz, nearly midway between 5884 and 6114, is not:
  // there the narrower filter's larger enorm decides).
  for (double hz : {250.0, 1000.0, 3000.0, 5000.0, 6600.0}) {
    const auto x = sine(hz, 16000);
    const auto m = lm.window(x, 0, x.size());
    ASSERT_EQ(m.size(), 80u * 100);
    int best = 0;
    double best_e = -1e9;
    for (int i = 0; i < 80; ++i) {
      double e = 0;
      for (int t = 10; t < 90; ++t) e += m[static_cast<std::size_t>(i) * 100 + t];
      if (e > best_e) best_e = e, best = i;
    }
    int nearest = 0;
    for (int i = 1; i < 80; ++i)
      if (std::fabs(centre[i] - hz) < std::fabs(centre[nearest] - hz)) nearest = i;
    EXPECT_EQ(best, nearest) << hz << " Hz: loudest mel bin " << best << " (peak " << centre[best] << " Hz)";
  }
  // 1000 Hz: centres ... 968, 1006, 1045 ... → bin 26; 3000 Hz: 2947 vs 3063 → bin 54 (values derived above).
  EXPECT_NEAR(centre[26], 1006, 1);
  EXPECT_NEAR(centre[54], 2947, 1);
}

TEST(LogMel, SilenceGivesTheExactFloor) {
  // All mel energies 0 → log10(1e-10) = −10 everywhere; the window max is −10, so max − 8 = −18 clamps
  // nothing; (−10 + 4) / 4 = −1.5.
  const LogMel lm;
  const std::vector<float> zeros(4800, 0.0f);
  const auto m = lm.window(zeros, 0, zeros.size());
  ASSERT_EQ(m.size(), 80u * 30);
  for (float v : m) ASSERT_EQ(v, -1.5f);
}

TEST(LogMel, DynamicRangeIsClampedToEightDecades) {
  // A pure tone: most bins far below its peak. After max − 8 the smallest value is exactly the largest − 2.
  const LogMel lm;
  const auto x = sine(1000, 16000, 0.9);
  const auto m = lm.window(x, 0, x.size());
  const auto [mn, mx] = std::minmax_element(m.begin(), m.end());
  EXPECT_FLOAT_EQ(*mn, *mx - 2.0f);
}

TEST(LogMel, PaddingPastTheEndEqualsExplicitZerosAndWindowsAreIndependent) {
  const LogMel lm;
  const auto x = noise(20000, 3);
  // A window running past the end of pcm == the same window over explicitly zero-padded samples.
  std::vector<float> padded(x.begin() + 16000, x.end());
  padded.resize(16000, 0.0f);
  EXPECT_EQ(lm.window(x, 16000, 16000), lm.window(padded, 0, 16000));
  // A window depends only on its own samples: the same slice elsewhere gives the same features.
  const std::vector<float> slice(x.begin() + 3200, x.begin() + 8000);
  EXPECT_EQ(lm.window(x, 3200, 4800), lm.window(slice, 0, 4800));
  // Starting past the end: silence.
  const auto far = lm.window(x, 1'000'000, 1600);
  ASSERT_EQ(far.size(), 800u);
  for (float v : far) ASSERT_EQ(v, -1.5f);
}

TEST(LogMel, ThirtySecondWindowHas3000Frames) {
  const LogMel lm;
  const auto x = noise(480000, 5);
  EXPECT_EQ(lm.window(x, 0, 2 * 1500 * 160).size(), 80u * 3000);
  EXPECT_EQ(lm.window(x, 0, 1601).size(), 80u * 10);  // floor(w / hop)
  EXPECT_TRUE(lm.window(x, 0, 159).empty());
}

TEST(MelSpecJson, DefaultsWhenKeysAreMissing) {
  auto s = mel_spec_from_preprocessor_json("{}");
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->n_mels, 80);
  EXPECT_EQ(s->n_fft, 400);
  EXPECT_EQ(s->hop, 160);
  EXPECT_EQ(s->sample_rate, 16000);
}

TEST(MelSpecJson, ReadsWhisperLargeV3Config) {
  auto s = mel_spec_from_preprocessor_json(R"({"chunk_length": 30, "feature_extractor_type": "WhisperFeatureExtractor",
    "feature_size": 128, "hop_length": 160, "n_fft": 400, "n_samples": 480000, "nb_max_frames": 3000,
    "padding_side": "right", "padding_value": 0.0, "processor_class": "WhisperProcessor", "return_attention_mask": false,
    "sampling_rate": 16000})");
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->n_mels, 128);
  EXPECT_EQ(LogMel(*s).filters().size(), 128u * 201);
}

TEST(MelSpecJson, WrongTypeIsAFormatErrorNamingTheKey) {
  auto s = mel_spec_from_preprocessor_json(R"({"n_fft": "400"})");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::format_error);
  EXPECT_NE(s.error().message.find("n_fft"), std::string::npos) << s.error().message;
  auto h = mel_spec_from_preprocessor_json(R"({"hop_length": 160.5})");
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.error().code, Errc::format_error);
  EXPECT_NE(h.error().message.find("hop_length"), std::string::npos) << h.error().message;
  auto z = mel_spec_from_preprocessor_json(R"({"feature_size": 0})");
  ASSERT_FALSE(z.ok());
  EXPECT_NE(z.error().message.find("feature_size 0 is outside"), std::string::npos) << z.error().message;
  auto odd = mel_spec_from_preprocessor_json(R"({"n_fft": 401})");
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.error().message.find("odd"), std::string::npos) << odd.error().message;
}

TEST(MelSpecJson, OtherSamplingRatesAreUnsupported) {
  auto s = mel_spec_from_preprocessor_json(R"({"sampling_rate": 8000})");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::unsupported);
  EXPECT_NE(s.error().message.find("sampling_rate 8000"), std::string::npos) << s.error().message;
}

TEST(MelSpecJson, NotJsonIsAParseError) {
  EXPECT_EQ(mel_spec_from_preprocessor_json("{feature_size").error().code, Errc::parse_error);
  EXPECT_EQ(mel_spec_from_preprocessor_json("[80]").error().code, Errc::parse_error);
}
