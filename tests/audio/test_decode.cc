// Decoding: files written here with libsndfile's own writer (WAV 16/24-bit/float, FLAC, Ogg Vorbis/Opus, MP3),
// round trips, downmix, resampling with the frequency kept, and every refusal with its Errc and message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <random>
#include <string>

#include "audio/audio.h"
#include "audio_writers.h"

using namespace tandem;
using namespace tandem::audio;
using namespace tandem::audio::testing_writers;

namespace {

constexpr int kWav16 = SF_FORMAT_WAV | SF_FORMAT_PCM_16;

// Relative power of `hz` in x (16 kHz), by correlation with a complex exponential (one DFT bin).
double tone_power(const std::vector<float>& x, double hz) {
  double re = 0, im = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    re += x[i] * std::cos(2 * std::numbers::pi * hz * i / kSampleRate);
    im -= x[i] * std::sin(2 * std::numbers::pi * hz * i / kSampleRate);
  }
  return (re * re + im * im) / (static_cast<double>(x.size()) * x.size());
}

// Upward zero crossings per second → frequency.
double crossing_hz(const std::vector<float>& x) {
  int n = 0;
  for (std::size_t i = 1; i < x.size(); ++i) n += (x[i - 1] < 0 && x[i] >= 0);
  return n * static_cast<double>(kSampleRate) / x.size();
}

void expect_refused(const Bytes& b, const std::string& what, const AudioLimits& limits = {}, bool probe_too = true) {
  auto d = decode_audio(b, limits);
  ASSERT_FALSE(d.ok()) << "decoded " << d->samples.size() << " samples; expected: " << what;
  EXPECT_EQ(d.error().code, Errc::invalid_argument);
  EXPECT_NE(d.error().message.find(what), std::string::npos) << d.error().message;
  if (probe_too) {
    auto p = probe_audio(b, limits);
    ASSERT_FALSE(p.ok()) << "probe accepted; expected: " << what;
    EXPECT_EQ(p.error().code, Errc::invalid_argument);
    EXPECT_NE(p.error().message.find(what), std::string::npos) << p.error().message;
  }
}

void put_le32(Bytes& b, std::size_t off, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b[off + i] = static_cast<std::uint8_t>(v >> (8 * i));
}

// A plain 44-byte-header PCM WAV (what libsndfile writes for mono 16-bit): rate at 24, byte rate at 28.
Bytes wav_with_rate(std::uint32_t rate, std::size_t frames = 1600) {
  Bytes b = write_audio(kWav16, 16000, 1, sine(440, 16000, frames));
  EXPECT_EQ(std::memcmp(b.data() + 36, "data", 4), 0);
  put_le32(b, 24, rate);
  put_le32(b, 28, rate * 2);
  return b;
}

}  // namespace

TEST(Decode, Wav16MonoAt16kRoundTrips) {
  const auto x = sine(440, 16000, 16000);
  const Bytes b = write_audio(kWav16, 16000, 1, x);
  auto pcm = decode_audio(b);
  ASSERT_TRUE(pcm.ok()) << pcm.error().message;
  EXPECT_EQ(pcm->info.format, "WAV");
  EXPECT_EQ(pcm->info.source_rate, 16000);
  EXPECT_EQ(pcm->info.channels, 1);
  EXPECT_EQ(pcm->info.source_frames, 16000u);
  EXPECT_DOUBLE_EQ(pcm->info.seconds(), 1.0);
  ASSERT_EQ(pcm->samples.size(), x.size());
  EXPECT_DOUBLE_EQ(pcm->seconds(), 1.0);
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(pcm->samples[i], x[i], 1.0 / 32768) << i;
}

TEST(Decode, Wav24AndFloatRoundTrip) {
  const auto x = sine(1234, 16000, 8000, 0.7);
  auto p24 = decode_audio(write_audio(SF_FORMAT_WAV | SF_FORMAT_PCM_24, 16000, 1, x));
  ASSERT_TRUE(p24.ok()) << p24.error().message;
  ASSERT_EQ(p24->samples.size(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(p24->samples[i], x[i], 1.0 / (1 << 23)) << i;
  auto pf = decode_audio(write_audio(SF_FORMAT_WAV | SF_FORMAT_FLOAT, 16000, 1, x));
  ASSERT_TRUE(pf.ok()) << pf.error().message;
  EXPECT_EQ(pf->samples, x);  // float in, float out, no resampling: bit exact
}

TEST(Decode, FlacRoundTrips) {
  const auto x = sine(440, 16000, 16000);
  auto pcm = decode_audio(write_audio(SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 16000, 1, x));
  ASSERT_TRUE(pcm.ok()) << pcm.error().message;
  EXPECT_EQ(pcm->info.format, "FLAC");
  ASSERT_EQ(pcm->samples.size(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(pcm->samples[i], x[i], 1.0 / 32768) << i;
}

TEST(Decode, OggVorbisOpusAndMp3KeepLengthAndFrequency) {
  struct Case {
    int format;
    const char* name;
  };
  for (const Case c : {Case{SF_FORMAT_OGG | SF_FORMAT_VORBIS, "OGG"}, Case{SF_FORMAT_OGG | SF_FORMAT_OPUS, "OGG"},
                       Case{SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III, "MP3"}}) {
    const Bytes b = write_audio(c.format, 16000, 1, sine(1000, 16000, 16000));
    ASSERT_FALSE(b.empty()) << "libsndfile cannot write format " << std::hex << c.format;
    auto pcm = decode_audio(b);
    ASSERT_TRUE(pcm.ok()) << c.name << ": " << pcm.error().message;
    EXPECT_EQ(pcm->info.format, c.name);
    EXPECT_EQ(pcm->info.source_rate, 16000);
    EXPECT_NEAR(static_cast<double>(pcm->samples.size()), 16000.0, 1200.0) << c.name;  // codec delay/padding
    EXPECT_GT(tone_power(pcm->samples, 1000), 100 * tone_power(pcm->samples, 1500)) << c.name;
    EXPECT_NEAR(crossing_hz(pcm->samples), 1000.0, 30.0) << c.name;
    auto info = probe_audio(b);
    ASSERT_TRUE(info.ok()) << info.error().message;
    EXPECT_EQ(info->source_frames, pcm->info.source_frames) << c.name;
  }
}

TEST(Decode, StereoIsDownmixedToTheMeanOfChannels) {
  std::vector<float> inter;
  const auto l = sine(300, 16000, 4000, 0.8), r = sine(2000, 16000, 4000, 0.4);
  for (std::size_t i = 0; i < l.size(); ++i) inter.insert(inter.end(), {l[i], r[i]});
  auto pcm = decode_audio(write_audio(SF_FORMAT_WAV | SF_FORMAT_FLOAT, 16000, 2, inter));
  ASSERT_TRUE(pcm.ok()) << pcm.error().message;
  EXPECT_EQ(pcm->info.channels, 2);
  ASSERT_EQ(pcm->samples.size(), l.size());
  for (std::size_t i = 0; i < l.size(); ++i) ASSERT_FLOAT_EQ(pcm->samples[i], (l[i] + r[i]) / 2) << i;
}

TEST(Decode, OtherRatesAreResampledTo16kKeepingTheFrequency) {
  for (int rate : {44100, 8000, 48000, 22050}) {
    const Bytes b =
        write_audio(SF_FORMAT_WAV | SF_FORMAT_FLOAT, rate, 1, sine(1000, rate, static_cast<std::size_t>(rate)));
    auto pcm = decode_audio(b);
    ASSERT_TRUE(pcm.ok()) << pcm.error().message;
    EXPECT_EQ(pcm->info.source_rate, rate);
    EXPECT_EQ(pcm->info.source_frames, static_cast<std::uint64_t>(rate));
    EXPECT_NEAR(static_cast<double>(pcm->samples.size()), 16000.0, 4.0) << rate;
    EXPECT_NEAR(crossing_hz(pcm->samples), 1000.0, 2.0) << rate;
    EXPECT_GT(tone_power(pcm->samples, 1000), 1000 * tone_power(pcm->samples, 1100)) << rate;
    // Amplitude kept (0.5): look away from the filter's start-up at the edges.
    const auto mid = std::max_element(pcm->samples.begin() + 2000, pcm->samples.end() - 2000);
    EXPECT_NEAR(*mid, 0.5, 0.01) << rate;
  }
}

TEST(Decode, ProbeAgreesWithDecode) {
  std::vector<float> stereo(2 * 22050, 0.25f);
  for (const Bytes& b : {write_audio(kWav16, 16000, 1, sine(440, 16000, 3000)),
                         write_audio(SF_FORMAT_FLAC | SF_FORMAT_PCM_24, 44100, 1, sine(440, 44100, 5000)),
                         write_audio(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 22050, 2, stereo),
                         write_audio(SF_FORMAT_OGG | SF_FORMAT_VORBIS, 48000, 1, sine(440, 48000, 9000))}) {
    auto p = probe_audio(b);
    auto d = decode_audio(b);
    ASSERT_TRUE(p.ok()) << p.error().message;
    ASSERT_TRUE(d.ok()) << d.error().message;
    EXPECT_EQ(p->format, d->info.format);
    EXPECT_EQ(p->source_rate, d->info.source_rate);
    EXPECT_EQ(p->channels, d->info.channels);
    EXPECT_EQ(p->source_frames, d->info.source_frames);
  }
}

TEST(Refuse, NotAudio) {
  std::mt19937 rng(42);
  Bytes random(4096);
  for (auto& v : random) v = static_cast<std::uint8_t>(rng());
  expect_refused(random, "not an audio file libsndfile can read: ");
  Bytes png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R'};
  png.resize(200, 0);
  expect_refused(png, "not an audio file libsndfile can read: ");
  expect_refused({}, "not an audio file libsndfile can read: the file is empty");
  expect_refused(Bytes{'R', 'I', 'F', 'F'}, "not an audio file libsndfile can read: ");
}

TEST(Refuse, TruncatedWavIsSeenFromItsHeader) {
  Bytes b = write_audio(kWav16, 16000, 1, sine(440, 16000, 16000));
  b.resize(b.size() / 2);
  // 16000 frames × 2 bytes declared; half the file (minus the 44-byte header) present.
  expect_refused(b, "truncated: header says 32000 bytes of samples, the file holds " + std::to_string(b.size() - 44));
}

TEST(Refuse, TruncatedFlacIsSeenWhenDecoding) {
  Bytes b = write_audio(SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 16000, 1, sine(440, 16000, 32000));
  b.resize(b.size() / 2);
  ASSERT_TRUE(probe_audio(b).ok());  // the STREAMINFO header is intact: only decoding finds the end missing
  expect_refused(b, "truncated: header says 32000 frames, ", {}, false);
}

TEST(Refuse, NoSamples) {
  // libsndfile writes nothing for 0 frames, so: a 1-frame WAV cut back to its 44-byte header, data size 0 (and
  // 0xFFFFFFFF, a streaming writer's "unknown").
  Bytes b = write_audio(kWav16, 16000, 1, {0.5f});
  ASSERT_EQ(b.size(), 46u);
  b.resize(44);
  put_le32(b, 4, 36);
  put_le32(b, 40, 0);
  expect_refused(b, "no samples");
  put_le32(b, 40, 0xFFFFFFFFu);
  expect_refused(b, "no samples");
}

TEST(Refuse, AbsurdSampleRates) {
  expect_refused(wav_with_rate(1), "sample rate 1 Hz is outside 1000..768000");
  expect_refused(wav_with_rate(10'000'000), "sample rate 10000000 Hz is outside 1000..768000");
  AudioLimits narrow;
  narrow.max_rate = 48000;
  expect_refused(write_audio(kWav16, 96000, 1, sine(440, 96000, 960)), "sample rate 96000 Hz is outside 1000..48000",
                 narrow);
}

TEST(Refuse, TooManyChannels) {
  std::vector<float> inter(33 * 100, 0.1f);
  expect_refused(write_audio(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 33, inter), "33 channels exceeds 32");
}

TEST(Refuse, TooLongFromTheHeader) {
  AudioLimits small;
  small.max_seconds = 0.5;
  expect_refused(write_audio(kWav16, 16000, 1, sine(440, 16000, 16000)),
                 "duration 1s exceeds the configured maximum 0.5s", small);
  // 18,120 frames declared at 1 Hz: 5 h 2 min against the default 4 h (rate limit lowered to let 1 Hz through).
  AudioLimits slow;
  slow.min_rate = 1;
  expect_refused(wav_with_rate(1, 18120), "duration 5h 2m exceeds the configured maximum 4h", slow);
}

TEST(Refuse, FlacWhoseHeaderClaimsMoreThanTheFileHolds) {
  Bytes b = write_audio(SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 16000, 1, sine(440, 16000, 16000));
  ASSERT_EQ(std::memcmp(b.data(), "fLaC", 4), 0);
  // STREAMINFO starts at 8; bytes 18..25 hold rate (20 bits), channels − 1 (3), bits − 1 (5), total samples (36).
  auto set_total = [&](std::uint64_t total) {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | b[18 + i];
    v = (v & ~((1ull << 36) - 1)) | total;
    for (int i = 7; i >= 0; --i, v >>= 8) b[18 + i] = static_cast<std::uint8_t>(v);
  };
  set_total(16000ull * 3600 * 5);  // 5 hours in a few kilobytes: refused from the header
  expect_refused(b, "duration 5h exceeds the configured maximum 4h");
  set_total(16000ull * 120);  // 2 minutes: only decoding finds 1 s
  ASSERT_TRUE(probe_audio(b).ok());
  expect_refused(b, "truncated: header says 1920000 frames, 16000 decoded", {}, false);
}

TEST(Refuse, TooManyBytes) {
  const Bytes b = write_audio(kWav16, 16000, 1, sine(440, 16000, 1000));
  AudioLimits lim;
  lim.max_bytes = 1000;
  expect_refused(b, "file of " + std::to_string(b.size()) + " bytes exceeds the limit of 1000 bytes", lim);
}

TEST(Refuse, NanAndInfinityInAFloatWav) {
  auto x = sine(440, 16000, 4000);
  x[1234] = std::numeric_limits<float>::quiet_NaN();
  const Bytes nan = write_audio(SF_FORMAT_WAV | SF_FORMAT_FLOAT, 16000, 1, x);
  ASSERT_TRUE(probe_audio(nan).ok());  // only the samples are bad
  expect_refused(nan, "sample 1234 of channel 0 is NaN", {}, false);
  std::vector<float> inter(2 * 100, 0.0f);
  inter[2 * 50 + 1] = -std::numeric_limits<float>::infinity();
  expect_refused(write_audio(SF_FORMAT_WAV | SF_FORMAT_FLOAT, 16000, 2, inter), "sample 50 of channel 1 is infinite",
                 {}, false);
}

TEST(Decode, FullScaleFloatIsClampedToUnitRange) {
  std::vector<float> x = sine(440, 16000, 1000, 1.0);
  x[10] = 1.5f;
  x[20] = -3.0f;
  auto pcm = decode_audio(write_audio(SF_FORMAT_WAV | SF_FORMAT_FLOAT, 16000, 1, x));
  ASSERT_TRUE(pcm.ok()) << pcm.error().message;
  EXPECT_EQ(pcm->samples[10], 1.0f);
  EXPECT_EQ(pcm->samples[20], -1.0f);
  auto up = decode_audio(write_audio(SF_FORMAT_WAV | SF_FORMAT_FLOAT, 44100, 1, sine(1000, 44100, 44100, 1.0)));
  ASSERT_TRUE(up.ok());
  for (float v : up->samples) ASSERT_LE(std::fabs(v), 1.0f);
}
