// The Whisper decode loop over a scripted session: prompts, language detection, timestamp rules, segments and
// seeks, temperature fallback, the no-speech skip, the model's generation config and option errors.
#include <gtest/gtest.h>

#include "speech_test_util.h"

namespace tandem::speech::testing {
namespace {

class TranscriberTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    multi_ = make_vocab(5).release();  // en zh de es ru
    english_ = make_vocab(0).release();
  }
  static void TearDownTestSuite() {
    delete multi_;
    delete english_;
  }
  static const Vocab& v() { return *multi_; }
  static std::vector<TokenId> ids(std::string_view text) { return tok::whisper_text_ids(v().tok, text); }
  static TokenId ts(double s) { return v().sp.timestamp_token(s); }
  static ScriptBuilder script() { return ScriptBuilder{v(), {}}; }

  Transcriber make(TranscribeOptions o, std::string_view config = "", const Vocab* voc = nullptr) const {
    const Vocab& x = voc != nullptr ? *voc : v();
    return must(Transcriber::create(x.tok, x.sp, model_info(x), config, std::move(o)));
  }
  static TranscribeOptions english() {
    TranscribeOptions o;
    o.language = "en";
    return o;
  }
  // Decodes the single window at seek 0 of `pcm` with one attempt script.
  WindowResult one(const Transcriber& t, const std::vector<Want>& wants, WindowScript ws = {}) {
    ws.attempts = {wants};
    ScriptedSession s(v().sp, v().total, {{window_hash(pcm_, 0), ws}});
    auto r = t.window(pcm_, Checkpoint{}, s, nullptr);
    EXPECT_TRUE(r.ok()) << r.error().message;
    last_prompts_ = s.prompts;
    return std::move(r).value();
  }

  static inline Vocab* multi_ = nullptr;
  static inline Vocab* english_ = nullptr;
  std::vector<float> pcm_ = noise(80000);
  std::vector<std::vector<TokenId>> last_prompts_;
};

std::vector<TokenId> cat(std::initializer_list<std::vector<TokenId>> parts) {
  std::vector<TokenId> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST_F(TranscriberTest, PromptIsSotLanguageTaskAndGrowsStartofprevWithPreviousTokens) {
  const Transcriber t = make(english());
  const auto& sp = v().sp;
  EXPECT_EQ(t.prompt_tokens({}, "en"), (std::vector<TokenId>{sp.sot, sp.language_id("en"), sp.transcribe}));
  const std::vector<TokenId> prev{ts(0), 300, 301, ts(1)};
  EXPECT_EQ(t.prompt_tokens(prev, "de"),
            cat({{sp.startofprev}, prev, {sp.sot, sp.language_id("de"), sp.transcribe}}));
  // Only the last max_target_positions/2 − 1 = 223 previous tokens are kept.
  std::vector<TokenId> long_prev(300);
  for (std::size_t i = 0; i < long_prev.size(); ++i) long_prev[i] = static_cast<TokenId>(i);
  const auto p = t.prompt_tokens(long_prev, "en");
  ASSERT_EQ(p.size(), 1u + 223u + 3u);
  EXPECT_EQ(p[1], 77);
  EXPECT_EQ(p[223], 299);
}

TEST_F(TranscriberTest, PromptVariantsTranslateNotimestampsInitialPromptEnglishOnly) {
  const auto& sp = v().sp;
  TranscribeOptions o = english();
  o.task = Task::translate;
  o.timestamps = false;
  EXPECT_EQ(make(o).prompt_tokens({}, "en"),
            (std::vector<TokenId>{sp.sot, sp.language_id("en"), sp.translate, sp.notimestamps}));

  // initial_prompt: " " + the trimmed text, before the first window only.
  TranscribeOptions ip = english();
  ip.initial_prompt = "  hello world ";
  const Transcriber t = make(ip);
  const WindowResult r = one(t, script().ts(0).text(" again").ts(1).eot().done());
  ASSERT_EQ(last_prompts_.size(), 1u);
  EXPECT_EQ(last_prompts_[0], cat({{sp.startofprev}, ids(" hello world"), {sp.sot, sp.language_id("en"), sp.transcribe}}));
  EXPECT_EQ(r.next.prompt, cat({ids(" hello world"), {ts(0)}, ids(" again"), {ts(1)}}));

  // English-only models are prompted with <|startoftranscript|> alone; translate is refused.
  const Vocab& en = *english_;
  EXPECT_TRUE(en.sp.languages.empty());
  const Transcriber te = make(TranscribeOptions{}, "", &en);
  EXPECT_EQ(te.prompt_tokens({}, "en"), (std::vector<TokenId>{en.sp.sot}));
  TranscribeOptions tr;
  tr.task = Task::translate;
  EXPECT_EQ(Transcriber::create(en.tok, en.sp, model_info(en), "", tr).error().code, Errc::invalid_argument);
  TranscribeOptions de;
  de.language = "de";
  EXPECT_EQ(Transcriber::create(en.tok, en.sp, model_info(en), "", de).error().code, Errc::invalid_argument);
}

TEST_F(TranscriberTest, DetectsLanguageOnTheFirstWindowAndKeepsIt) {
  const Transcriber t = make(TranscribeOptions{});  // language "" on a multilingual model
  WindowScript ws;
  ws.language = "de";
  ws.attempts = {script().ts(0).text(" hello").ts(1).eot().done()};
  ScriptedSession s(v().sp, v().total, {{window_hash(pcm_, 0), ws}});
  const WindowResult r = must(t.window(pcm_, Checkpoint{}, s, nullptr));
  EXPECT_EQ(s.detections, 1);
  EXPECT_EQ(r.next.language, "de");
  ASSERT_EQ(s.prompts.size(), 1u);
  EXPECT_EQ(s.prompts[0], (std::vector<TokenId>{v().sp.sot, v().sp.language_id("de"), v().sp.transcribe}));

  // The next window uses the checkpoint's language without detecting again.
  WindowScript ws2;
  ws2.language = "es";
  ws2.attempts = {script().ts(0).text(" world").ts(1).eot().done()};
  ScriptedSession s2(v().sp, v().total, {{window_hash(pcm_, r.next.seek), ws2}});
  const WindowResult r2 = must(t.window(pcm_, r.next, s2, nullptr));
  EXPECT_EQ(s2.detections, 0);
  EXPECT_EQ(r2.next.language, "de");
  EXPECT_EQ(s2.prompts[0].back(), v().sp.transcribe);
  EXPECT_EQ(s2.prompts[0][s2.prompts[0].size() - 2], v().sp.language_id("de"));
}

TEST_F(TranscriberTest, TextFirstIsForcedToTheFirstTimestamp) {
  // The model wants text at the first step; only timestamps are allowed there and it likes none: <|0.00|>.
  const WindowResult r =
      one(make(english()), script().want(Want{ids("hello")[0]}).text(" world").ts(1).eot().done());
  ASSERT_EQ(r.segments.size(), 1u);
  EXPECT_EQ(r.segments[0].tokens, cat({{ts(0)}, ids(" world"), {ts(1)}}));
  EXPECT_EQ(r.segments[0].text, " world");
  EXPECT_DOUBLE_EQ(r.segments[0].start, 0.0);
  EXPECT_DOUBLE_EQ(r.segments[0].end, 1.0);
}

TEST_F(TranscriberTest, InitialTimestampIsCappedByMaxInitialTimestamp) {
  const auto w = script().ts(1.5).text(" hello").ts(1.8).eot().done();
  const WindowResult capped = one(make(english()), w);  // 1.0 s by default
  ASSERT_EQ(capped.segments.size(), 1u);
  EXPECT_EQ(capped.segments[0].tokens.front(), ts(1.0));
  // No pair: one segment from the window's start to the last timestamp (openai/whisper).
  EXPECT_DOUBLE_EQ(capped.segments[0].start, 0.0);
  EXPECT_DOUBLE_EQ(capped.segments[0].end, 1.8);

  TranscribeOptions o = english();
  o.max_initial_timestamp = 1.5;
  const WindowResult free = one(make(o), w);
  EXPECT_EQ(free.segments.at(0).tokens.front(), ts(1.5));

  // Negative: the generation config's max_initial_timestamp_index (here 10 → 0.20 s).
  o.max_initial_timestamp = -1;
  const WindowResult cfg = one(make(o, R"({"max_initial_timestamp_index": 10})"), w);
  EXPECT_EQ(cfg.segments.at(0).tokens.front(), ts(0.2));
}

TEST_F(TranscriberTest, DecreasingTimestampIsRefusedAndTheUnfinishedSegmentReDecodedLater) {
  // The model wants <|0.40|> after "<|0.50|> hello <|1.00|><|1.00|> world": only ≥ 1.02 is allowed there, far
  // less likely than eot, so the window ends without closing the second segment.
  const WindowResult r = one(make(english()),
                             script().ts(0.5).text(" hello").ts(1.0).ts(1.0).text(" world").ts(0.4).eot().done());
  ASSERT_EQ(r.segments.size(), 1u);
  EXPECT_EQ(r.segments[0].text, " hello");
  EXPECT_DOUBLE_EQ(r.segments[0].start, 0.5);
  EXPECT_DOUBLE_EQ(r.segments[0].end, 1.0);
  EXPECT_EQ(r.next.seek, 16000u);  // to the last complete segment's end
  for (std::size_t i = 1; i < r.segments[0].tokens.size(); ++i) {
    const TokenId a = r.segments[0].tokens[i - 1], b = r.segments[0].tokens[i];
    if (v().sp.is_timestamp(a) && v().sp.is_timestamp(b)) {
      EXPECT_LE(a, b);
    }
  }
}

TEST_F(TranscriberTest, TimestampsComePairedAndSummedTimestampProbabilityWins) {
  // After "<|0.00|> hello" the model prefers " world" (logit 2) over any single timestamp (logit 0), but the
  // timestamps together are likelier: the earliest allowed one (strictly after 0.00) is taken.
  const WindowResult r =
      one(make(english()), script().ts(0).text(" hello").want(Want{ids(" world")[0], 2, false, 0}).eot().done());
  ASSERT_EQ(r.segments.size(), 1u);
  EXPECT_EQ(r.segments[0].tokens, cat({{ts(0)}, ids(" hello"), {ts(0.02)}}));
  // A lone closing timestamp at the end: the whole window is done.
  EXPECT_EQ(r.next.seek, kWindow);

  // After a pair, a timestamp is not allowed: the wanted third timestamp becomes text or eot.
  const WindowResult p = one(make(english()), script().ts(0).text(" hello").ts(0.5).ts(0.5).ts(0.6).eot().done());
  for (std::size_t i = 2; i < p.segments.at(0).tokens.size(); ++i) {
    const auto& tk = p.segments[0].tokens;
    EXPECT_FALSE(v().sp.is_timestamp(tk[i]) && v().sp.is_timestamp(tk[i - 1]) && v().sp.is_timestamp(tk[i - 2]));
  }
}

TEST_F(TranscriberTest, SegmentsAndSeeksAcrossThreeWindows) {
  const Transcriber t = make(english());
  WindowScript w0, w1, w2;
  // Ends in text: seek to the last pair (1.60 s); "again" is decoded again in the next window.
  w0.attempts = {script().ts(0).text(" hello").ts(0.8).ts(0.8).text(" world").ts(1.6).ts(1.6).text(" again").done()};
  // Ends with a single timestamp: the whole window (to 3.60 s).
  w1.attempts = {script().ts(0).text(" again").ts(1.0).eot().done()};
  // The last 1.4 s: no pair, one segment to its closing timestamp.
  w2.attempts = {script().ts(0).text(" the end").ts(1.2).eot().done()};
  ScriptedSession s(v().sp, v().total,
                    {{window_hash(pcm_, 0), w0}, {window_hash(pcm_, 25600), w1}, {window_hash(pcm_, 57600), w2}});
  Checkpoint ck;
  std::vector<Segment> all;
  std::vector<std::uint64_t> seeks;
  while (!ck.finished) {
    WindowResult r = must(t.window(pcm_, ck, s, nullptr));
    all.insert(all.end(), r.segments.begin(), r.segments.end());
    ck = r.next;
    seeks.push_back(ck.seek);
  }
  EXPECT_EQ(seeks, (std::vector<std::uint64_t>{25600, 57600, 80000}));
  ASSERT_EQ(all.size(), 4u);
  const std::vector<std::tuple<double, double, std::string>> want{
      {0.0, 0.8, " hello"}, {0.8, 1.6, " world"}, {1.6, 2.6, " again"}, {3.6, 4.8, " the end"}};
  for (std::size_t i = 0; i < all.size(); ++i) {
    EXPECT_NEAR(all[i].start, std::get<0>(want[i]), 1e-9) << i;
    EXPECT_NEAR(all[i].end, std::get<1>(want[i]), 1e-9) << i;
    EXPECT_EQ(all[i].text, std::get<2>(want[i])) << i;
  }
  EXPECT_EQ(ck.windows_done, 3u);
  EXPECT_EQ(ck.segments_done, 4u);
  // The second window's prompt carries the first window's segment tokens (timestamps included).
  ASSERT_EQ(s.prompts.size(), 3u);
  EXPECT_EQ(s.prompts[1], cat({{v().sp.startofprev, ts(0)}, ids(" hello"), {ts(0.8), ts(0.8)}, ids(" world"),
                               {ts(1.6), v().sp.sot, v().sp.language_id("en"), v().sp.transcribe}}));
  EXPECT_EQ(to_text(all), "hello world again the end");
}

TEST_F(TranscriberTest, WithoutTimestampsOneSegmentPerWholeWindow) {
  TranscribeOptions o = english();
  o.timestamps = false;
  // Every timestamp is likelier than the text the model wants, but timestamps are off in this mode.
  ScriptBuilder b = script();
  for (TokenId id : ids(" world again")) b.want(Want{id, 10, false, 20});
  const WindowResult r = one(make(o), b.eot().done());
  EXPECT_EQ(last_prompts_.at(0).back(), v().sp.notimestamps);
  ASSERT_EQ(r.segments.size(), 1u);
  EXPECT_EQ(r.segments[0].tokens, ids(" world again"));
  EXPECT_DOUBLE_EQ(r.segments[0].start, 0.0);
  EXPECT_DOUBLE_EQ(r.segments[0].end, 2.0);
  EXPECT_EQ(r.next.seek, kWindow);
}

TEST_F(TranscriberTest, TextWithoutPairsSpansTheWholeWindow) {
  const WindowResult r = one(make(english()), script().ts(0).text(" hello").eot().done());
  ASSERT_EQ(r.segments.size(), 1u);
  EXPECT_DOUBLE_EQ(r.segments[0].end, 2.0);
  EXPECT_EQ(r.next.seek, kWindow);
}

std::vector<Want> repetitive(ScriptBuilder b) {
  b.ts(0);
  for (int i = 0; i < 40; ++i) b.text(" la");
  return b.eot().done();
}

TEST_F(TranscriberTest, HighCompressionRatioFallsBackToTheNextTemperature) {
  const Transcriber t = make(english());
  WindowScript ws;
  ws.attempts = {repetitive(script()), script().ts(0).text(" hello world").ts(1).eot().done()};
  ScriptedSession s(v().sp, v().total, {{window_hash(pcm_, 0), ws}});
  const WindowResult r = must(t.window(pcm_, Checkpoint{}, s, nullptr));
  EXPECT_DOUBLE_EQ(r.temperature, 0.2);
  ASSERT_EQ(r.segments.size(), 1u);
  EXPECT_EQ(r.segments[0].text, " hello world");
  EXPECT_DOUBLE_EQ(r.segments[0].temperature, 0.2);
  EXPECT_LT(r.segments[0].compression_ratio, 2.4);
  EXPECT_FALSE(r.next.prompt.empty());  // 0.2 ≤ 0.5: the text conditions the next window
}

TEST_F(TranscriberTest, LowLogprobFallsBackAndAllFailingKeepsTheLastTemperature) {
  const Transcriber t = make(english());
  WindowScript ws;
  ws.attempts = {script().ts(0).text(" hello world", true).ts(1).eot(true).done(),
                 script().ts(0).text(" hello world", true).ts(1).eot(true).done(),
                 script().ts(0).text(" again").ts(1).eot().done()};
  ScriptedSession s(v().sp, v().total, {{window_hash(pcm_, 0), ws}});
  const WindowResult r = must(t.window(pcm_, Checkpoint{}, s, nullptr));
  EXPECT_DOUBLE_EQ(r.temperature, 0.4);
  EXPECT_EQ(r.segments.at(0).text, " again");
  EXPECT_GT(r.segments[0].avg_logprob, -1.0);

  // Every temperature repetitive: the last (1.0) is kept, and its text does not condition the next window.
  WindowScript bad;
  bad.attempts = {repetitive(script())};
  ScriptedSession s2(v().sp, v().total, {{window_hash(pcm_, 0), bad}});
  const WindowResult r2 = must(t.window(pcm_, Checkpoint{}, s2, nullptr));
  EXPECT_DOUBLE_EQ(r2.temperature, 1.0);
  EXPECT_GT(r2.segments.at(0).compression_ratio, 2.4);
  EXPECT_TRUE(r2.next.prompt.empty());
}

TEST_F(TranscriberTest, NoSpeechWithLowLogprobSkipsTheWindow) {
  WindowScript ws;
  ws.nospeech_logit = 15;
  const auto flat = script().ts(0).text(" hello world", true).ts(1).eot(true).done();
  const WindowResult r = one(make(english()), flat, ws);
  EXPECT_TRUE(r.skipped_silence);
  EXPECT_TRUE(r.segments.empty());
  EXPECT_DOUBLE_EQ(r.temperature, 0.0);  // silence stops the fallback
  EXPECT_EQ(r.next.seek, kWindow);
  EXPECT_EQ(r.next.windows_done, 1u);

  // Confident text overrides a high no-speech probability.
  const WindowResult kept = one(make(english()), script().ts(0).text(" hello").ts(1).eot().done(), ws);
  EXPECT_FALSE(kept.skipped_silence);
  ASSERT_EQ(kept.segments.size(), 1u);
  EXPECT_GT(kept.segments[0].no_speech_prob, 0.6);

  // Low log-prob without the no-speech token: not silence (fallback, then kept).
  const WindowResult speech = one(make(english()), flat);
  EXPECT_FALSE(speech.skipped_silence);
  EXPECT_LT(speech.segments.at(0).no_speech_prob, 0.01);
}

TEST_F(TranscriberTest, GenerationConfigSuppressesTokensAndIsChecked) {
  const TokenId hello = ids(" world")[0];
  const std::string cfg = R"({"suppress_tokens": [-1, )" + std::to_string(hello) + "]}";
  const WindowResult r = one(make(english(), cfg), script().ts(0).text(" world").ts(1).eot().done());
  ASSERT_EQ(r.segments.size(), 1u);
  for (const Segment& s : r.segments) {
    EXPECT_EQ(std::find(s.tokens.begin(), s.tokens.end(), hello), s.tokens.end());
  }
  const auto err = [&](std::string_view c) {
    return Transcriber::create(v().tok, v().sp, model_info(v()), c, english()).error();
  };
  EXPECT_EQ(err("{not json").code, Errc::parse_error);
  Error e = err(R"({"suppress_tokens": [1, 999999]})");
  EXPECT_EQ(e.code, Errc::format_error);
  EXPECT_NE(e.message.find("suppress_tokens"), std::string::npos);
  e = err(R"({"begin_suppress_tokens": "x"})");
  EXPECT_NE(e.message.find("begin_suppress_tokens"), std::string::npos);
  e = err(R"({"no_timestamps_token_id": 5})");
  EXPECT_NE(e.message.find("no_timestamps_token_id"), std::string::npos);
  e = err(R"({"is_multilingual": false})");
  EXPECT_NE(e.message.find("is_multilingual"), std::string::npos);
  e = err(R"({"max_initial_timestamp_index": -3})");
  EXPECT_NE(e.message.find("max_initial_timestamp_index"), std::string::npos);
  EXPECT_TRUE(Transcriber::create(v().tok, v().sp, model_info(v()),
                                  R"({"is_multilingual": true, "no_timestamps_token_id": )" +
                                      std::to_string(v().sp.notimestamps) + "}",
                                  english())
                  .ok());
}

TEST_F(TranscriberTest, BeginSuppressAppliesToTheFirstSampledTokenOnly) {
  // Without timestamps the first token may be text; begin_suppress_tokens takes " hello" away there only.
  TranscribeOptions o = english();
  o.timestamps = false;
  const TokenId hello = ids(" world")[0];
  ASSERT_EQ(ids(" world").size(), 1u);
  const std::string cfg = R"({"begin_suppress_tokens": [)" + std::to_string(hello) + "]}";
  const WindowResult r = one(make(o, cfg), script().text(" world").text(" world").eot().done());
  ASSERT_EQ(r.segments.size(), 1u);
  EXPECT_NE(r.segments[0].tokens.at(0), hello);
  EXPECT_EQ(r.segments[0].tokens.at(1), hello);
}

TEST_F(TranscriberTest, OptionErrors) {
  const auto code = [&](TranscribeOptions o) {
    auto r = Transcriber::create(v().tok, v().sp, model_info(v()), "", std::move(o));
    return r.ok() ? std::optional<Errc>{} : std::optional<Errc>{r.error().code};
  };
  TranscribeOptions o = english();
  o.temperatures.clear();
  EXPECT_EQ(code(o), Errc::invalid_argument);
  o.temperatures = {0.0, -0.2};
  EXPECT_EQ(code(o), Errc::invalid_argument);
  o = english();
  o.language = "xx";
  EXPECT_EQ(code(o), Errc::invalid_argument);
  o.language = "ja";  // a Whisper language this 5-language model lacks
  EXPECT_EQ(code(o), Errc::invalid_argument);
  o.language = "German";  // names are accepted
  EXPECT_FALSE(code(o).has_value());
  o = english();
  o.max_new_tokens = 10000;
  EXPECT_EQ(code(o), Errc::invalid_argument);
  ModelSpeechInfo m = model_info(v());
  m.vocab = 100;  // smaller than the tokenizer's specials
  EXPECT_EQ(Transcriber::create(v().tok, v().sp, m, "", english()).error().code, Errc::invalid_argument);
}

TEST_F(TranscriberTest, MaxNewTokensEndsTheWindow) {
  TranscribeOptions o = english();
  o.max_new_tokens = 3;
  const WindowResult r = one(make(o), script().ts(0).text(" hello world again").ts(1.5).eot().done());
  ASSERT_EQ(r.segments.size(), 1u);
  EXPECT_EQ(r.segments[0].tokens.size(), 3u);
  EXPECT_EQ(Transcriber::windows_estimate(80000, kFrames), 3u);
  EXPECT_EQ(Transcriber::windows_estimate(0, kFrames), 0u);
  EXPECT_EQ(Transcriber::windows_estimate(16000 * 30, 3000), 1u);
}

}  // namespace
}  // namespace tandem::speech::testing
