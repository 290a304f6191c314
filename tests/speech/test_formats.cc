// SRT, WebVTT and plain text of segments; openai/whisper's zlib compression ratio.
#include <gtest/gtest.h>

#include "speech/transcriber.h"

namespace tandem::speech {
namespace {

std::vector<Segment> sample() {
  Segment a;
  a.start = 0.0;
  a.end = 2.5;
  a.text = " Hello world.";
  Segment b;
  b.start = 3661.004;
  b.end = 3662.9996;
  b.text = " A --> B ";
  return {a, b};
}

TEST(Formats, SrtNumbersCuesFromOneWithCommaMilliseconds) {
  const auto s = sample();
  EXPECT_EQ(to_srt(s),
            "1\n00:00:00,000 --> 00:00:02,500\nHello world.\n\n"
            "2\n01:01:01,004 --> 01:01:03,000\nA -> B\n\n");
  EXPECT_EQ(to_srt({}), "");
}

TEST(Formats, VttHasAHeaderAndDotMilliseconds) {
  const auto s = sample();
  EXPECT_EQ(to_vtt(s),
            "WEBVTT\n\n"
            "00:00:00.000 --> 00:00:02.500\nHello world.\n\n"
            "01:01:01.004 --> 01:01:03.000\nA -> B\n\n");
  EXPECT_EQ(to_vtt({}), "WEBVTT\n\n");
}

TEST(Formats, TextJoinsSegmentsAndTrims) {
  const auto s = sample();
  EXPECT_EQ(to_text(s), "Hello world. A --> B");
  EXPECT_EQ(to_text({}), "");
}

TEST(Formats, CompressionRatioIsHighForRepetitiveText) {
  std::string rep;
  for (int i = 0; i < 40; ++i) rep += " la";
  EXPECT_GT(compression_ratio(rep), 2.4);
  EXPECT_LT(compression_ratio(" The quick brown fox jumps over the lazy dog."), 1.5);
  EXPECT_EQ(compression_ratio(""), 0.0);
}

}  // namespace
}  // namespace tandem::speech
