// Whisper's log-mel spectrogram, exactly as Hugging Face's WhisperFeatureExtractor computes it per window (numpy
// path): periodic Hann window, centred STFT with reflect padding, power spectrum, Slaney mel filters, log10 with a
// 1e-10 floor, max - 8 dynamic range, (x + 4) / 4. Each window is computed from its own samples only, so a job that
// resumes at a window boundary gets the same features. docs/audio-input.md gives the recipe step by step.
#pragma once

#include <complex>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "audio/audio.h"
#include "core/result.h"

namespace tandem::audio {

struct MelSpec {
  int n_mels = 80;
  int n_fft = 400;
  int hop = 160;
  int sample_rate = kSampleRate;
};

// A complex FFT of any length (mixed radix, kissfft-style recursive decimation in time with a generic radix-p
// butterfly), in double. Factors 4, 2, 3, 5 are cheap; a large prime factor p costs O(n·p). Exposed for tests.
class Fft {
 public:
  explicit Fft(std::size_t n);
  std::size_t size() const { return n_; }
  // out[k] = sum_j in[j] · exp(-2πi·jk/n); in and out have size() elements and must not alias.
  void forward(const std::complex<double>* in, std::complex<double>* out) const;

 private:
  void work(std::complex<double>* out, const std::complex<double>* in, std::size_t fstride, std::size_t level) const;
  std::size_t n_;
  std::vector<std::size_t> factors_;  // (p, m) pairs: radix p, remaining length m
  std::vector<std::complex<double>> twiddles_;
};

class LogMel {
 public:
  // Precomputes the periodic Hann window (torch.hann_window) and the Slaney mel filters. `spec` must be valid
  // (as mel_spec_from_preprocessor_json returns: n_fft even and >= 4, hop >= 1, n_mels >= 1).
  explicit LogMel(MelSpec spec = {});

  // One window: samples pcm[start, start + window_samples) (zeros past the end of pcm, as HF pads to n_samples),
  // STFT with center=True and reflect padding of n_fft/2 on each side, power |X|^2, frames = window_samples / hop
  // (the last STFT frame dropped, as Whisper does), mel = filters · power, log10(max(mel, 1e-10)),
  // max(x, max_over_window(x) − 8), (x + 4) / 4. Output n_mels × frames floats, row-major (mel bin major).
  std::vector<float> window(std::span<const float> pcm, std::size_t start, std::size_t window_samples) const;

  // |FFT(hann · frame)|² for the n_fft samples of one STFT frame: n_fft/2 + 1 values (exposed for tests).
  std::vector<double> power_spectrum(std::span<const double> frame) const;

  // n_mels × (n_fft/2 + 1), librosa.filters.mel(sr, n_fft, n_mels, fmin 0, fmax sr/2, htk=False, norm="slaney").
  const std::vector<float>& filters() const { return filters_f_; }
  const MelSpec& spec() const { return spec_; }

 private:
  // |FFT|² of n_fft real samples through one complex FFT of n_fft/2 (even samples real, odd imaginary), split
  // with the twiddles below: half the work of a complex FFT of n_fft.
  void power_of(const double* windowed, std::complex<double>* scratch_in, std::complex<double>* scratch_out,
                double* power) const;

  MelSpec spec_;
  Fft fft_;  // length n_fft / 2
  std::vector<std::complex<double>> split_;  // exp(-2πik/n_fft), k = 0..n_fft/2
  std::vector<double> hann_;
  std::vector<double> filters_;  // double copy used for the product
  std::vector<float> filters_f_;
  std::vector<int> first_bin_, end_bin_;  // each filter's non-zero bins [first, end): the product skips the zeros
};

// feature_size → n_mels, n_fft, hop_length, sampling_rate of Hugging Face's preprocessor_config.json. Missing keys
// keep the defaults. parse_error: not JSON or not an object; format_error: a key of the wrong type or out of range
// (named); unsupported: sampling_rate other than 16000.
Result<MelSpec> mel_spec_from_preprocessor_json(const std::string& preprocessor_config_json_text);

}  // namespace tandem::audio
