#include <gtest/gtest.h>

#include "generation/stop.h"

using tandem::gen::StopMatcher;

namespace {
// Feeds chunks, returns (emitted text, stopped).
std::pair<std::string, bool> run(std::vector<std::string> stops, std::vector<std::string> chunks) {
  StopMatcher m(std::move(stops));
  std::string out;
  for (const auto& c : chunks) {
    auto r = m.push(c);
    out += r.emit;
    if (r.stopped) return {out, true};
  }
  return {out + m.flush(), false};
}
}  // namespace

TEST(StopMatcher, Table) {
  struct Case {
    std::vector<std::string> stops, chunks;
    std::string want;
    bool stopped;
  };
  const std::vector<Case> cases{
      {{}, {"hello", " world"}, "hello world", false},
      {{"END"}, {"abc", "END", "more"}, "abc", true},
      {{"END"}, {"ab", "cE", "N", "Dxyz"}, "abc", true},            // across three tokens
      {{"END"}, {"abcE", "NX"}, "abcENX", false},                   // a false start is released
      {{"\n\n"}, {"line\n", "\nnext"}, "line", true},
      {{"###", "##"}, {"a#", "#", "#"}, "a", true},                 // earliest match wins
      {{"stop"}, {"sto"}, "sto", false},                            // flush releases held prefix
      {{"<|im_end|>"}, {"Hi<|im", "_end|>"}, "Hi", true},
      {{"aab"}, {"aaab"}, "a", true},                               // overlapping prefix
  };
  for (const auto& c : cases) {
    auto [text, stopped] = run(c.stops, c.chunks);
    EXPECT_EQ(text, c.want);
    EXPECT_EQ(stopped, c.stopped) << c.want;
  }
}

TEST(StopMatcher, NothingAfterStopAndHoldBackIsMinimal) {
  StopMatcher m({"STOP"});
  auto r = m.push("abcST");
  EXPECT_EQ(r.emit, "abc");  // "ST" could become STOP: held
  EXPECT_FALSE(r.stopped);
  r = m.push("OP tail");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "");
  EXPECT_EQ(m.matched(), "STOP");
  r = m.push("again");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "");
  EXPECT_EQ(m.flush(), "");
}
