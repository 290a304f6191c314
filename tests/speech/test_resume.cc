// Window-boundary resume through the checkpoint's JSON, cancellation, session errors and checkpoint decoding.
#include <gtest/gtest.h>

#include "speech_test_util.h"

namespace tandem::speech::testing {
namespace {

class ResumeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { v_ = make_vocab(5).release(); }
  static void TearDownTestSuite() { delete v_; }
  static const Vocab& v() { return *v_; }
  static ScriptBuilder script() { return ScriptBuilder{v(), {}}; }

  // Three windows: a pair boundary seek, a fallback to sampling at 0.2 (repetitive text first), a tail.
  std::map<std::uint64_t, WindowScript> scripts() const {
    WindowScript w0, w1, w2;
    w0.language = "de";
    w0.attempts = {script().ts(0).text(" hello").ts(0.8).ts(0.8).text(" world").ts(1.6).ts(1.6).text(" again").done()};
    ScriptBuilder rep = script();
    rep.ts(0);
    for (int i = 0; i < 30; ++i) rep.text(" la");
    w1.attempts = {rep.eot().done(), script().ts(0).text(" again and").ts(1.0).ts(1.0).text(" more").ts(1.9).eot().done()};
    w2.attempts = {script().ts(0).text(" the end").ts(1.2).eot().done()};
    return {{window_hash(pcm_, 0), w0}, {window_hash(pcm_, 25600), w1}, {window_hash(pcm_, 57600), w2}};
  }
  Transcriber make() const {
    TranscribeOptions o;  // language detected on the first window
    o.seed = 42;
    o.initial_prompt = "hello";
    return must(Transcriber::create(v().tok, v().sp, model_info(v()), "", o));
  }

  static inline Vocab* v_ = nullptr;
  std::vector<float> pcm_ = noise(80000);
};

bool same(const Segment& a, const Segment& b) {
  return a.start == b.start && a.end == b.end && a.text == b.text && a.tokens == b.tokens &&
         a.avg_logprob == b.avg_logprob && a.no_speech_prob == b.no_speech_prob &&
         a.compression_ratio == b.compression_ratio && a.temperature == b.temperature;
}

TEST_F(ResumeTest, ResumingAtEachWindowBoundaryOnAFreshReplicaGivesTheUninterruptedSegments) {
  const Transcriber t = make();
  ScriptedSession one(v().sp, v().total, scripts());
  std::vector<Segment> straight;
  Checkpoint ck;
  std::vector<double> temps;
  while (!ck.finished) {
    WindowResult r = must(t.window(pcm_, ck, one, nullptr));
    straight.insert(straight.end(), r.segments.begin(), r.segments.end());
    temps.push_back(r.temperature);
    ck = r.next;
  }
  const Checkpoint final_straight = ck;
  EXPECT_EQ(temps, (std::vector<double>{0.0, 0.2, 0.0}));
  EXPECT_EQ(final_straight.language, "de");
  ASSERT_EQ(straight.size(), 5u);

  // Each window on a new session and a new Transcriber, the checkpoint through its JSON in between.
  std::vector<Segment> resumed;
  std::string journal = encode_checkpoint(Checkpoint{});
  for (int w = 0; w < 10; ++w) {
    const Checkpoint c = must(decode_checkpoint(journal));
    if (c.finished) break;
    const Transcriber replica = make();
    ScriptedSession s(v().sp, v().total, scripts());
    WindowResult r = must(replica.window(pcm_, c, s, nullptr));
    resumed.insert(resumed.end(), r.segments.begin(), r.segments.end());
    journal = encode_checkpoint(r.next);
  }
  ASSERT_EQ(resumed.size(), straight.size());
  for (std::size_t i = 0; i < straight.size(); ++i) EXPECT_TRUE(same(straight[i], resumed[i])) << i;
  EXPECT_EQ(must(decode_checkpoint(journal)), final_straight);
}

// A live stream: each window sees only the samples it needs, and only once they are all there (the views the
// daemon's stream wait hands over). The segments and checkpoints equal the whole file's.
TEST_F(ResumeTest, AStreamSeenAWindowAtATimeGivesTheFileSegments) {
  const Transcriber t = make();
  ScriptedSession one(v().sp, v().total, scripts());
  std::vector<Segment> straight;
  std::vector<Checkpoint> cks;
  for (Checkpoint ck; !ck.finished;) {
    WindowResult r = must(t.window(pcm_, ck, one, nullptr));
    straight.insert(straight.end(), r.segments.begin(), r.segments.end());
    ck = r.next;
    cks.push_back(ck);
  }
  ScriptedSession s(v().sp, v().total, scripts());
  const std::size_t ws = t.window_samples();
  std::vector<Segment> streamed;
  std::size_t i = 0;
  for (Checkpoint ck; !ck.finished; ++i) {
    const std::uint64_t arrived = std::min<std::uint64_t>(ck.seek + ws, pcm_.size());
    const bool complete = arrived == pcm_.size();
    AudioView view{std::span<const float>(pcm_).subspan(ck.seek, arrived - ck.seek), ck.seek, arrived, complete};
    WindowResult r = must(t.window(view, ck, s, nullptr));
    streamed.insert(streamed.end(), r.segments.begin(), r.segments.end());
    ck = r.next;
    ASSERT_LT(i, cks.size());
    EXPECT_EQ(ck, cks[i]) << i;
  }
  EXPECT_EQ(i, cks.size());
  ASSERT_EQ(streamed.size(), straight.size());
  for (std::size_t k = 0; k < straight.size(); ++k) EXPECT_TRUE(same(straight[k], streamed[k])) << k;
}

TEST_F(ResumeTest, AnIncompleteViewNeedsAWholeWindowAndNeverFinishes) {
  const Transcriber t = make();
  ScriptedSession s(v().sp, v().total, scripts());
  const std::size_t ws = t.window_samples();
  const std::span<const float> pcm(pcm_);
  // Less than a window of an unfinished stream: refused, the session untouched.
  auto short_view = t.window(AudioView{pcm.first(ws - 1), 0, ws - 1, false}, Checkpoint{}, s, nullptr);
  ASSERT_FALSE(short_view.ok());
  EXPECT_EQ(short_view.error().code, Errc::invalid_argument);
  EXPECT_NE(short_view.error().message.find("unfinished stream"), std::string::npos) << short_view.error().message;
  // Samples before seek missing.
  Checkpoint later;
  later.seek = 100;
  auto missing = t.window(AudioView{pcm.subspan(200, ws), 200, 200 + ws, false}, later, s, nullptr);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, Errc::invalid_argument);
  // A view claiming more samples than its total.
  auto bad = t.window(AudioView{pcm.first(ws), 0, 10, false}, Checkpoint{}, s, nullptr);
  ASSERT_FALSE(bad.ok());
  // A whole window of an unfinished stream: decoded, never finished even if the seek reaches what has arrived.
  auto ok = t.window(AudioView{pcm.first(ws), 0, ws, false}, Checkpoint{}, s, nullptr);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_FALSE(ok->next.finished);
  // An empty incomplete view at the seek: nothing to do yet (not finished, refused).
  Checkpoint at_end;
  at_end.seek = ws;
  EXPECT_FALSE(t.window(AudioView{{}, ws, ws, false}, at_end, s, nullptr).ok());
  // The same position of a complete stream: finished.
  auto fin = t.window(AudioView{{}, ws, ws, true}, at_end, s, nullptr);
  ASSERT_TRUE(fin.ok());
  EXPECT_TRUE(fin->next.finished);
}

TEST_F(ResumeTest, CancelBetweenTokensStopsTheWindow) {
  const Transcriber t = make();
  ScriptedSession s(v().sp, v().total, scripts());
  std::atomic<bool> cancel{false};
  s.cancel_flag = &cancel;
  s.cancel_at_decode = 5;  // mid-window: after the prompt and a few tokens
  const auto r = t.window(pcm_, Checkpoint{}, s, &cancel);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::cancelled);
  EXPECT_EQ(s.decodes, 5);

  std::atomic<bool> already{true};
  ScriptedSession s2(v().sp, v().total, scripts());
  EXPECT_EQ(t.window(pcm_, Checkpoint{}, s2, &already).error().code, Errc::cancelled);
  EXPECT_EQ(s2.encodes, 0);
}

TEST_F(ResumeTest, SessionErrorsPassThroughUnchanged) {
  const Transcriber t = make();
  ScriptedSession s(v().sp, v().total, scripts());
  s.fail_encode_at = 2;
  const WindowResult first = must(t.window(pcm_, Checkpoint{}, s, nullptr));
  const auto lost = t.window(pcm_, first.next, s, nullptr);
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.error(), (Error{Errc::device_lost, "scripted device loss"}));

  ScriptedSession oom(v().sp, v().total, scripts());
  oom.fail_decode_at = 4;
  const auto r = t.window(pcm_, Checkpoint{}, oom, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error(), (Error{Errc::out_of_memory, "scripted allocation failure"}));

  // A checkpoint from elsewhere with an id this model does not have is refused before the session is touched.
  Checkpoint bad = first.next;
  bad.prompt.push_back(v().total + 5);
  ScriptedSession untouched(v().sp, v().total, scripts());
  EXPECT_EQ(t.window(pcm_, bad, untouched, nullptr).error().code, Errc::invalid_argument);
  bad = first.next;
  bad.language = "ja";
  EXPECT_EQ(t.window(pcm_, bad, untouched, nullptr).error().code, Errc::invalid_argument);
  EXPECT_EQ(untouched.encodes, 0);
}

TEST_F(ResumeTest, FinishedCheckpointDoesNothing) {
  const Transcriber t = make();
  ScriptedSession s(v().sp, v().total, scripts());
  Checkpoint done;
  done.seek = 80000;
  const WindowResult r = must(t.window(pcm_, done, s, nullptr));
  EXPECT_TRUE(r.next.finished);
  EXPECT_TRUE(r.segments.empty());
  EXPECT_EQ(s.encodes, 0);
  const std::vector<float> empty;
  EXPECT_TRUE(must(t.window(empty, Checkpoint{}, s, nullptr)).next.finished);
}

TEST(Checkpoint, RoundTripsThroughJson) {
  Checkpoint ck;
  ck.seek = 123456789012ull;
  ck.prompt = {1, 2, 50364, 7};
  ck.language = "de";
  ck.windows_done = 4;
  ck.segments_done = 9;
  ck.finished = true;
  const std::string text = encode_checkpoint(ck);
  EXPECT_EQ(text.find('\n'), std::string::npos);
  EXPECT_EQ(must(decode_checkpoint(text)), ck);
  EXPECT_EQ(must(decode_checkpoint(encode_checkpoint(Checkpoint{}))), Checkpoint{});
}

TEST(Checkpoint, MalformedTextIsRefusedNamingTheKey) {
  const auto err = [](std::string_view t) { return decode_checkpoint(t).error(); };
  EXPECT_EQ(err("").code, Errc::parse_error);
  EXPECT_EQ(err("{\"seek\": 1").code, Errc::parse_error);
  EXPECT_EQ(err("[1, 2]").code, Errc::parse_error);
  EXPECT_EQ(err("[[[[[[[[[[1]]]]]]]]]]").code, Errc::parse_error);
  const std::string good = R"("v":1,"prompt":[1,2],"language":"en","windows_done":1,"segments_done":2,"finished":false)";
  EXPECT_TRUE(decode_checkpoint("{\"seek\":5," + good + "}").ok());
  const auto key = [&](std::string_view text, std::string_view k) {
    const Error e = err(text);
    EXPECT_EQ(e.code, Errc::format_error) << text;
    EXPECT_NE(e.message.find(k), std::string::npos) << e.message;
  };
  key("{" + good + "}", "seek");
  key("{\"seek\":-1," + good + "}", "seek");
  key("{\"seek\":1.5," + good + "}", "seek");
  key(R"({"v":2,"seek":0,"prompt":[],"language":"","windows_done":0,"segments_done":0,"finished":false})", "\"v\"");
  key(R"({"v":1,"seek":0,"prompt":[1,-4],"language":"","windows_done":0,"segments_done":0,"finished":false})",
      "prompt");
  key(R"({"v":1,"seek":0,"prompt":{},"language":"","windows_done":0,"segments_done":0,"finished":false})", "prompt");
  key(R"({"v":1,"seek":0,"prompt":[],"language":7,"windows_done":0,"segments_done":0,"finished":false})", "language");
  key(R"({"v":1,"seek":0,"prompt":[],"language":"","windows_done":4294967296,"segments_done":0,"finished":false})",
      "windows_done");
  key(R"({"v":1,"seek":0,"prompt":[],"language":"","windows_done":0,"finished":false})", "segments_done");
  key(R"({"v":1,"seek":0,"prompt":[],"language":"","windows_done":0,"segments_done":0,"finished":"no"})", "finished");
  std::string huge = R"({"v":1,"seek":0,"language":"","windows_done":0,"segments_done":0,"finished":false,"prompt":[)";
  for (int i = 0; i < 5000; ++i) huge += (i ? ",1" : "1");
  key(huge + "]}", "prompt");
}

}  // namespace
}  // namespace tandem::speech::testing
