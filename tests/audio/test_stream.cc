// audio::PcmStream: live PCM in chunks — exact offsets, whole frames, finite samples, limits and backpressure, the
// consumer's window wait across threads, and resampling in pieces against decoding the same samples as one file.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <thread>

#include "audio/audio.h"
#include "audio/stream.h"
#include "audio_writers.h"

namespace tandem::audio {
namespace {

using namespace std::chrono_literals;
using testing_writers::Bytes;

Bytes s16_bytes(const std::vector<std::int16_t>& v) {
  Bytes b(v.size() * 2);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto u = static_cast<std::uint16_t>(v[i]);
    b[2 * i] = static_cast<std::uint8_t>(u & 0xff);
    b[2 * i + 1] = static_cast<std::uint8_t>(u >> 8);
  }
  return b;
}

Bytes f32_bytes(const std::vector<float>& v) {
  Bytes b(v.size() * 4);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto u = std::bit_cast<std::uint32_t>(v[i]);
    for (int k = 0; k < 4; ++k) b[4 * i + k] = static_cast<std::uint8_t>(u >> (8 * k));
  }
  return b;
}

std::shared_ptr<PcmStream> make(StreamFormat f, StreamLimits l = {}) {
  auto s = PcmStream::create(f, l);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
  return s.ok() ? *s : nullptr;
}

const std::atomic<bool> kNoCancel{false};

TEST(PcmStream, SampleFormatNames) {
  EXPECT_EQ(*parse_sample_format("s16le"), SampleFormat::s16le);
  EXPECT_EQ(*parse_sample_format("f32le"), SampleFormat::f32le);
  auto bad = parse_sample_format("u8");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, Errc::invalid_argument);
  EXPECT_NE(bad.error().message.find("s16le, f32le"), std::string::npos);
  EXPECT_EQ(sample_format_name(SampleFormat::f32le), "f32le");
  EXPECT_EQ((StreamFormat{48000, 2, SampleFormat::f32le}).frame_bytes(), 8u);
}

TEST(PcmStream, CreateRefusesAbsurdFormats) {
  for (const StreamFormat f : {StreamFormat{0, 1}, StreamFormat{999, 1}, StreamFormat{768001, 1},
                               StreamFormat{16000, 0}, StreamFormat{16000, 33}}) {
    auto s = PcmStream::create(f);
    ASSERT_FALSE(s.ok()) << f.rate << " " << f.channels;
    EXPECT_EQ(s.error().code, Errc::invalid_argument);
  }
  StreamLimits l;
  l.max_seconds = 0;
  EXPECT_FALSE(PcmStream::create({}, l).ok());
}

TEST(PcmStream, S16MonoChunksArriveExactlyInOrder) {
  auto s = make({16000, 1, SampleFormat::s16le});
  std::vector<std::int16_t> v(5000);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int16_t>((i * 7919) % 65536 - 32768);
  const Bytes all = s16_bytes(v);
  std::uint64_t off = 0;
  for (std::size_t n : {2u, 998u, 4000u, 4000u, 1000u}) {  // 10,000 bytes
    ASSERT_TRUE(s->append(off, std::span(all).subspan(off, n), false).ok());
    off += n;
  }
  EXPECT_EQ(s->bytes_received(), all.size());
  EXPECT_EQ(s->samples_total(), v.size());
  EXPECT_DOUBLE_EQ(s->seconds(), 5000.0 / 16000);
  auto w = s->wait_window(1000, 3000, kNoCancel, 1s);
  ASSERT_TRUE(w.ok()) << w.error().message;
  EXPECT_EQ(w->first, 1000u);
  EXPECT_EQ(w->total, 5000u);
  EXPECT_FALSE(w->complete);
  ASSERT_EQ(w->samples.size(), 3000u);
  for (std::size_t i = 0; i < 3000; ++i) ASSERT_EQ(w->samples[i], static_cast<float>(v[1000 + i]) / 32768.0f) << i;
}

TEST(PcmStream, RefusedChunksLeaveTheStreamUnchanged) {
  auto s = make({16000, 2, SampleFormat::f32le});
  const Bytes ok = f32_bytes({0.1f, 0.3f, -0.5f, 0.5f});  // two frames
  ASSERT_TRUE(s->append(0, ok, false).ok());
  std::uint64_t bytes = 16, samples = 2;
  auto expect_refused = [&](std::uint64_t off, const Bytes& b, bool end, const char* says) {
    auto st = s->append(off, b, end);
    ASSERT_FALSE(st.ok()) << says;
    EXPECT_EQ(st.error().code, Errc::invalid_argument);
    EXPECT_NE(st.error().message.find(says), std::string::npos) << st.error().message;
    EXPECT_EQ(s->bytes_received(), bytes);
    EXPECT_EQ(s->samples_total(), samples);
  };
  expect_refused(0, ok, false, "expects 16");                      // a repeat
  expect_refused(32, ok, false, "expects 16");                     // a gap
  expect_refused(16, f32_bytes({0.1f}), false, "not whole frames");  // half a stereo frame
  expect_refused(16, f32_bytes({0.1f, std::nanf("")}), false, "NaN");
  expect_refused(16, f32_bytes({INFINITY, 0.f}), false, "infinite");
  ASSERT_TRUE(s->append(16, ok, true).ok());  // the resend continues exactly
  EXPECT_TRUE(s->complete());
  EXPECT_FALSE(s->closed());
  bytes = 32;
  samples = 4;
  expect_refused(32, ok, false, "after the end");
  auto w = s->wait_window(0, 100, kNoCancel, 1s);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(w->complete);
  ASSERT_EQ(w->samples.size(), 4u);
  EXPECT_FLOAT_EQ(w->samples[0], 0.2f);  // the mean of the channels
  EXPECT_FLOAT_EQ(w->samples[1], 0.0f);
}

TEST(PcmStream, LimitsOnDurationChunkAndEmptyEnd) {
  StreamLimits l;
  l.max_seconds = 0.5;
  l.max_chunk_bytes = 20000;
  auto s = make({16000, 1, SampleFormat::s16le}, l);
  auto st = s->append(0, {}, true);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("without any samples"), std::string::npos);
  st = s->append(0, Bytes(20002), false);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("at most 20000"), std::string::npos);
  ASSERT_TRUE(s->append(0, Bytes(16000), false).ok());  // 8000 samples: 0.5 s
  st = s->append(16000, Bytes(2), false);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("max_audio_seconds"), std::string::npos) << st.error().message;
  EXPECT_TRUE(s->append(16000, {}, true).ok());  // an empty end is fine once there is audio
}

TEST(PcmStream, BackpressureWhenFarAheadOfTheConsumer) {
  StreamLimits l;
  l.max_ahead_seconds = 1.0;
  auto s = make({16000, 1, SampleFormat::s16le}, l);
  ASSERT_TRUE(s->append(0, Bytes(32000), false).ok());  // 1 s
  auto st = s->append(32000, Bytes(3200), false);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, Errc::queue_full);
  EXPECT_NE(st.error().message.find("retry_after_ms="), std::string::npos) << st.error().message;
  EXPECT_TRUE(s->append(32000, {}, false).ok());  // an empty chunk adds nothing: never refused for this
  ASSERT_TRUE(s->wait_window(8000, 8000, kNoCancel, 1s).ok());  // the decoder reached 0.5 s
  EXPECT_TRUE(s->append(32000, Bytes(3200), false).ok());
}

TEST(PcmStream, WaitBlocksUntilAWholeWindowThenReturnsIt) {
  auto s = make({16000, 1, SampleFormat::s16le});
  std::thread producer([&] {
    std::uint64_t off = 0;
    for (int i = 0; i < 10; ++i) {
      std::this_thread::sleep_for(5ms);
      ASSERT_TRUE(s->append(off, Bytes(400, 0x10), false).ok());  // 200 samples
      off += 400;
    }
  });
  auto w = s->wait_window(0, 1500, kNoCancel, 5s);
  producer.join();
  ASSERT_TRUE(w.ok()) << w.error().message;
  EXPECT_GE(w->total, 1500u);
  EXPECT_EQ(w->samples.size(), 1500u);
  EXPECT_FALSE(w->complete);
}

TEST(PcmStream, WaitEndsOnEndCloseCancelAbandonAndIdleTimeout) {
  {
    auto s = make({16000, 1, SampleFormat::s16le});
    ASSERT_TRUE(s->append(0, Bytes(200), false).ok());
    std::thread t([&] {
      std::this_thread::sleep_for(10ms);
      s->close();
    });
    auto w = s->wait_window(0, 16000, kNoCancel, 5s);
    t.join();
    ASSERT_TRUE(w.ok());
    EXPECT_TRUE(w->complete);
    EXPECT_TRUE(w->closed);
    EXPECT_EQ(w->samples.size(), 100u);
    auto st = s->append(200, Bytes(2), false);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().message.find("closed"), std::string::npos);
  }
  {
    auto s = make({16000, 1, SampleFormat::s16le});
    std::atomic<bool> cancel{false};
    std::thread t([&] {
      std::this_thread::sleep_for(10ms);
      cancel = true;
    });
    auto w = s->wait_window(0, 16000, cancel, 5s);
    t.join();
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.error().code, Errc::cancelled);
  }
  {
    auto s = make({16000, 1, SampleFormat::s16le});
    std::thread t([&] {
      std::this_thread::sleep_for(10ms);
      s->abandon();
    });
    auto w = s->wait_window(0, 16000, kNoCancel, 5s);
    t.join();
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.error().code, Errc::cancelled);
    EXPECT_FALSE(s->append(0, Bytes(2), false).ok());
  }
  {
    auto s = make({16000, 1, SampleFormat::s16le});
    const auto t0 = std::chrono::steady_clock::now();
    auto w = s->wait_window(0, 16000, kNoCancel, 60ms);
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.error().code, Errc::timeout);
    EXPECT_GE(std::chrono::steady_clock::now() - t0, 60ms);
  }
}

TEST(PcmStream, ReleasedSamplesCannotBeReadAgain) {
  auto s = make({16000, 1, SampleFormat::s16le});
  ASSERT_TRUE(s->append(0, Bytes(64000), false).ok());  // 32,000 samples
  s->release_before(20000);
  auto w = s->wait_window(20000, 4000, kNoCancel, 1s);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->samples.size(), 4000u);
  auto before = s->wait_window(100, 4000, kNoCancel, 1s);
  ASSERT_FALSE(before.ok());
  EXPECT_EQ(before.error().code, Errc::invalid_argument);
  EXPECT_EQ(s->samples_total(), 32000u);
}

// Resampling in pieces gives what decoding the same samples as one file gives (libsamplerate's streaming state).
TEST(PcmStream, ResampledInPiecesMatchesTheWholeFile) {
  const int rate = 44100;
  std::vector<float> stereo;
  const auto l = testing_writers::sine(440, rate, 44100, 0.4), r = testing_writers::sine(1000, rate, 44100, 0.3);
  for (std::size_t i = 0; i < l.size(); ++i) {
    stereo.push_back(l[i]);
    stereo.push_back(r[i]);
  }
  const Bytes wav = testing_writers::write_audio(SF_FORMAT_WAV | SF_FORMAT_FLOAT, rate, 2, stereo);
  auto whole = decode_audio(wav);
  ASSERT_TRUE(whole.ok()) << whole.error().message;

  auto s = make({rate, 2, SampleFormat::f32le});
  const Bytes raw = f32_bytes(stereo);
  std::uint64_t off = 0;
  std::size_t piece = 8;
  while (off < raw.size()) {
    const std::size_t n = std::min<std::size_t>(piece * 8, raw.size() - off);
    ASSERT_TRUE(s->append(off, std::span(raw).subspan(off, n), false).ok());
    off += n;
    piece = piece * 3 % 4099 + 1;  // uneven piece sizes
  }
  ASSERT_TRUE(s->append(off, {}, true).ok());
  auto w = s->wait_window(0, 1u << 20, kNoCancel, 1s);
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(w->samples.size(), whole->samples.size());
  double max_diff = 0;
  for (std::size_t i = 0; i < w->samples.size(); ++i)
    max_diff = std::max(max_diff, static_cast<double>(std::abs(w->samples[i] - whole->samples[i])));
  EXPECT_LT(max_diff, 1e-4);
}

}  // namespace
}  // namespace tandem::audio
