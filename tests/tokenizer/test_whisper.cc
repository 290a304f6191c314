// Whisper's tokenizer (issue 17): write_whisper_tokenizer's layout and determinism, whisper_specials on written
// files, on older-style files (no timestamp tokens, <|nocaptions|>) and on malformed ones, text-only encoding
// (special and timestamp spellings stay text), the TemplateProcessing with two specials before the sequence, and
// decoding / streaming around specials and timestamps.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/temp_dir.h"
#include "tokenizer/hf_vocab.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/whisper_tokens.h"

namespace tandem::tok::testing {
namespace {

using nlohmann::ordered_json;

// Scratch space removed with its contents when the test ends.
using TempDir = ::tandem::core::TempDir;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

template <class T>
T must(Result<T> r) {
  if (!r.ok()) {
    ADD_FAILURE() << r.error().message;
    std::abort();
  }
  return std::move(r).value();
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> c = [] {
    std::vector<std::string> v;
    for (int k = 0; k < 30; ++k) {
      v.push_back("The quick brown fox jumps over the lazy dog. Hello world, this is a transcription test.");
      v.push_back("And so my fellow Americans, ask not what your country can do for you. " + std::to_string(k * 37));
      v.push_back("Caf\xC3\xA9 na\xC3\xAFve \xE4\xBD\xA0\xE5\xA5\xBD, she said; they're here.");
    }
    return v;
  }();
  return c;
}

constexpr int kSpecialsAfterLanguages = 6 + kWhisperTimestampCount;  // translate … notimestamps, timestamps

// A written tokenizer with `languages` language tokens, loaded back; `total` is write's result.
struct Written {
  TempDir dir;
  int total = 0;
  std::optional<Tokenizer> tok;
};
std::unique_ptr<Written> write(int languages, std::size_t vocab_tokens = 400) {
  auto w = std::make_unique<Written>();
  w->total = must(write_whisper_tokenizer(w->dir.path(), corpus(), {vocab_tokens, languages}));
  w->tok.emplace(must(load_tokenizer_files(w->dir.path())));
  return w;
}

// A tokenizer.json of the 256 byte tokens (no merges) followed by `specials` as special added tokens, ids in order.
std::string json_with_specials(const std::vector<std::string>& specials, std::size_t fill_tokens = 0) {
  nlohmann::json vocab = nlohmann::json::object();  // not ordered_json: its insertion is linear in the size
  const auto& alpha = detail::ByteAlphabet::get();
  std::size_t n = 0;
  for (int b = 0; b < 256; ++b) vocab[alpha.byte_to_utf8[static_cast<std::size_t>(b)]] = n++;
  for (std::size_t k = 0; k < fill_tokens; ++k) vocab["x" + std::to_string(k)] = n++;
  ordered_json added = ordered_json::array();
  for (const std::string& s : specials) {
    added.push_back({{"id", n++}, {"content", s}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  }
  ordered_json j = {{"version", "1.0"},
                    {"added_tokens", added},
                    {"normalizer", nullptr},
                    {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                    {"post_processor", nullptr},
                    {"decoder", {{"type", "ByteLevel"}}},
                    {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", ordered_json::array()}}}};
  return j.dump();
}

std::vector<std::string> old_style_specials(int languages) {
  std::vector<std::string> s{"<|endoftext|>", "<|startoftranscript|>"};
  for (int k = 0; k < languages; ++k) {
    s.push_back("<|" + std::string(whisper_languages()[static_cast<std::size_t>(k)].code) + "|>");
  }
  for (const char* t : {"<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>",
                        "<|notimestamps|>"}) {
    s.emplace_back(t);
  }
  return s;
}

TEST(WhisperLanguages, OrderAndCount) {
  const auto langs = whisper_languages();
  ASSERT_EQ(langs.size(), 100u);
  EXPECT_EQ(langs[0].code, "en");
  EXPECT_EQ(langs[0].name, "english");
  EXPECT_EQ(langs[1].code, "zh");
  EXPECT_EQ(langs[29].code, "no");
  EXPECT_EQ(langs[98].code, "su");
  EXPECT_EQ(langs[99].code, "yue");
  std::set<std::string_view> codes;
  for (const auto& l : langs) {
    EXPECT_FALSE(l.name.empty());
    codes.insert(l.code);
  }
  EXPECT_EQ(codes.size(), 100u);
}

TEST(WhisperWriter, SpecialsInOrder) {
  const auto w = write(99);
  const Tokenizer& tok = *w->tok;
  EXPECT_EQ(w->total, tok.vocab_size());
  const int n_text = w->total - (2 + 99 + kSpecialsAfterLanguages);
  EXPECT_GT(n_text, 256);
  EXPECT_LE(n_text, 400);
  const auto s = must(whisper_specials(tok, w->total));
  EXPECT_EQ(s.eot, n_text);
  EXPECT_EQ(s.sot, n_text + 1);
  ASSERT_EQ(s.languages.size(), 99u);
  for (int k = 0; k < 99; ++k) {
    EXPECT_EQ(s.languages[static_cast<std::size_t>(k)], n_text + 2 + k);
    const std::string_view code = whisper_languages()[static_cast<std::size_t>(k)].code;
    EXPECT_EQ(tok.piece(n_text + 2 + k), "<|" + std::string(code) + "|>");
  }
  EXPECT_EQ(s.translate, n_text + 101);
  EXPECT_EQ(s.transcribe, n_text + 102);
  EXPECT_EQ(s.startoflm, n_text + 103);
  EXPECT_EQ(s.startofprev, n_text + 104);
  EXPECT_EQ(s.nospeech, n_text + 105);
  EXPECT_EQ(tok.piece(s.nospeech), "<|nospeech|>");
  EXPECT_EQ(s.notimestamps, n_text + 106);
  EXPECT_EQ(s.timestamp_begin, n_text + 107);
  EXPECT_EQ(s.timestamp_count, 1501);
  EXPECT_EQ(s.timestamp_begin + s.timestamp_count, w->total);
  EXPECT_EQ(tok.piece(s.timestamp_begin), "<|0.00|>");
  EXPECT_EQ(tok.piece(s.timestamp_begin + 60), "<|1.20|>");
  EXPECT_EQ(tok.piece(s.timestamp_begin + 1500), "<|30.00|>");
  EXPECT_TRUE(s.multilingual());
  EXPECT_EQ(s.language_id("en"), n_text + 2);
  EXPECT_EQ(s.language_id("de"), n_text + 4);
  EXPECT_EQ(s.language_id("su"), n_text + 100);
  EXPECT_EQ(s.language_id("yue"), -1);
  EXPECT_EQ(s.language_id("xx"), -1);
  EXPECT_EQ(s.language_code(n_text + 3), "zh");
  EXPECT_EQ(s.language_code(s.sot), "");
  EXPECT_EQ(s.language_code(s.translate), "");
  // Every special is a control token: text spelling it stays text.
  for (TokenId id = s.eot; id < w->total; ++id) EXPECT_EQ(tok.type(id), PieceType::control) << id;
  // The post-processor: <|startoftranscript|> <|notimestamps|> $A <|endoftext|>.
  EXPECT_TRUE(tok.adds_bos());
  EXPECT_EQ(tok.bos_id(), s.sot);
  EXPECT_EQ(tok.eos_id(), s.eot);
  const auto text = tok.encode("hello world");
  auto full = tok.encode("hello world", EncodeOptions{.add_bos = true, .add_eos = true});
  std::vector<TokenId> expect{s.sot, s.notimestamps};
  expect.insert(expect.end(), text.begin(), text.end());
  expect.push_back(s.eot);
  EXPECT_EQ(full, expect);
  EXPECT_TRUE(read_file(w->dir.path() + "/tokenizer_config.json").find("WhisperTokenizer") != std::string::npos);
}

TEST(WhisperWriter, LanguageCounts) {
  const auto one = write(1);
  const auto s1 = must(whisper_specials(*one->tok, one->total));
  EXPECT_EQ(s1.languages.size(), 1u);
  EXPECT_FALSE(s1.multilingual());
  EXPECT_EQ(s1.language_id("en"), s1.sot + 1);
  EXPECT_EQ(s1.language_id("zh"), -1);
  EXPECT_EQ(s1.translate, s1.sot + 2);

  const auto none = write(0);
  const auto s0 = must(whisper_specials(*none->tok, none->total));
  EXPECT_TRUE(s0.languages.empty());
  EXPECT_EQ(s0.language_id("en"), -1);
  EXPECT_EQ(s0.translate, s0.sot + 1);

  const auto all = write(100);
  const auto s100 = must(whisper_specials(*all->tok, all->total));
  ASSERT_EQ(s100.languages.size(), 100u);
  EXPECT_EQ(s100.language_id("yue"), s100.sot + 100);
  EXPECT_EQ(s100.language_code(s100.sot + 100), "yue");
  EXPECT_EQ(all->total, none->total + 100);

  TempDir d;
  for (int bad : {-1, 101}) {
    const auto r = write_whisper_tokenizer(d.path(), corpus(), {400, bad});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, Errc::invalid_argument);
  }
}

TEST(WhisperWriter, VocabTokensBoundTheText) {
  const auto small = write(99, 300);
  const auto large = write(99, 600);
  const int fixed = 2 + 99 + kSpecialsAfterLanguages;
  EXPECT_LE(small->total - fixed, 300);
  EXPECT_GT(small->total - fixed, 256);
  EXPECT_GT(large->total, small->total);
  EXPECT_LE(large->total - fixed, 600);
  // Below 256 the byte tokens remain.
  const auto bytes_only = write(99, 10);
  EXPECT_EQ(bytes_only->total - fixed, 256);
}

TEST(WhisperWriter, Deterministic) {
  TempDir a, b, c;
  const int ta = must(write_whisper_tokenizer(a.path(), corpus(), {500, 99}));
  const int tb = must(write_whisper_tokenizer(b.path(), corpus(), {500, 99}));
  EXPECT_EQ(ta, tb);
  for (const char* f : {"/tokenizer.json", "/tokenizer_config.json"}) {
    const std::string x = read_file(a.path() + f);
    EXPECT_FALSE(x.empty());
    EXPECT_EQ(x, read_file(b.path() + f)) << f;
  }
  std::vector<std::string> other = corpus();
  other.push_back("zebra zebra zebra zebra quartz quartz quartz");
  must(write_whisper_tokenizer(c.path(), other, {500, 99}));
  EXPECT_NE(read_file(a.path() + "/tokenizer.json"), read_file(c.path() + "/tokenizer.json"));
  // A directory that does not exist yet is created.
  const std::string nested = a.path() + "/sub/dir";
  EXPECT_EQ(must(write_whisper_tokenizer(nested, corpus(), {500, 99})), ta);
  EXPECT_EQ(read_file(nested + "/tokenizer.json"), read_file(a.path() + "/tokenizer.json"));
}

TEST(WhisperSpecials, TimestampsRoundTripAndClamp) {
  const auto w = write(99);
  const auto s = must(whisper_specials(*w->tok, w->total));
  const TokenId b = s.timestamp_begin;
  for (int k = 0; k < s.timestamp_count; ++k) {
    EXPECT_TRUE(s.is_timestamp(b + k));
    EXPECT_NEAR(s.timestamp_seconds(b + k), k * 0.02, 1e-9);
    EXPECT_EQ(s.timestamp_token(s.timestamp_seconds(b + k)), b + k) << k;
    EXPECT_EQ(w->tok->piece(s.timestamp_token(k * 0.02)), [&] {
      char buf[32];
      std::snprintf(buf, sizeof buf, "<|%.2f|>", k * 0.02);
      return std::string(buf);
    }());
  }
  EXPECT_FALSE(s.is_timestamp(b - 1));
  EXPECT_FALSE(s.is_timestamp(b + 1501));
  EXPECT_FALSE(s.is_timestamp(s.eot));
  EXPECT_DOUBLE_EQ(s.timestamp_seconds(b + 60), 60 * 0.02);
  EXPECT_EQ(s.timestamp_token(1.205), b + 60);   // 60.25 steps
  EXPECT_EQ(s.timestamp_token(1.215), b + 61);   // 60.75 steps
  EXPECT_EQ(s.timestamp_token(1.2099), b + 60);
  EXPECT_EQ(s.timestamp_token(-3.0), b);
  EXPECT_EQ(s.timestamp_token(30.0), b + 1500);
  EXPECT_EQ(s.timestamp_token(45.7), b + 1500);
  EXPECT_EQ(s.timestamp_token(std::nan("")), b);
  EXPECT_EQ(WhisperSpecials{}.timestamp_token(1.0), -1);
  EXPECT_FALSE(WhisperSpecials{}.is_timestamp(0));
}

TEST(WhisperSpecials, OldStyleFileTimestampsFollowNotimestamps) {
  const Tokenizer tok = must(Tokenizer::from_hf_json(json_with_specials(old_style_specials(99)), "old.json"));
  const int notimestamps = 256 + 2 + 99 + 5;
  ASSERT_EQ(tok.vocab_size(), notimestamps + 1);
  const int model_vocab = notimestamps + 1 + 1501;
  const auto s = must(whisper_specials(tok, model_vocab));
  EXPECT_EQ(s.eot, 256);
  EXPECT_EQ(s.sot, 257);
  EXPECT_EQ(s.nospeech, notimestamps - 1);
  EXPECT_EQ(tok.piece(s.nospeech), "<|nocaptions|>");
  EXPECT_EQ(s.notimestamps, notimestamps);
  EXPECT_EQ(s.timestamp_begin, notimestamps + 1);
  EXPECT_EQ(s.timestamp_count, 1501);
  EXPECT_EQ(s.languages.size(), 99u);
  EXPECT_TRUE(s.is_timestamp(model_vocab - 1));
  EXPECT_FALSE(s.is_timestamp(model_vocab));
  EXPECT_EQ(s.timestamp_token(30.0), model_vocab - 1);
  // Ids past the tokenizer (the timestamps here) decode to nothing.
  const auto text = whisper_text_ids(tok, "hi");
  std::vector<TokenId> ids{s.sot, s.timestamp_begin};
  ids.insert(ids.end(), text.begin(), text.end());
  ids.push_back(s.timestamp_token(2.0));
  ids.push_back(s.eot);
  EXPECT_EQ(tok.decode(ids), "hi");
  // A model vocabulary with fewer timestamps gives fewer.
  EXPECT_EQ(must(whisper_specials(tok, notimestamps + 101)).timestamp_count, 100);
}

TEST(WhisperSpecials, EnglishOnlyCheckpointHasNoLanguageTokens) {
  // openai/whisper-*.en: GPT-2's 50,256 text tokens, eot 50256, all 99 language tokens listed, vocab_size 51864.
  const Tokenizer tok =
      must(Tokenizer::from_hf_json(json_with_specials(old_style_specials(99), 50256 - 256), "en.json"));
  const auto s = must(whisper_specials(tok, 51864));
  EXPECT_EQ(s.eot, 50256);
  EXPECT_EQ(s.sot, 50257);
  EXPECT_EQ(s.translate, 50357);
  EXPECT_EQ(s.nospeech, 50361);
  EXPECT_EQ(s.notimestamps, 50362);
  EXPECT_EQ(s.timestamp_begin, 50363);
  EXPECT_EQ(s.timestamp_count, 1501);
  EXPECT_TRUE(s.languages.empty());
  EXPECT_FALSE(s.multilingual());
  EXPECT_EQ(s.language_id("en"), -1);
  // The same tokenizer with a larger model vocabulary is taken as multilingual-shaped.
  EXPECT_EQ(must(whisper_specials(tok, 51865)).languages.size(), 99u);
}

void expect_format_error(const Result<WhisperSpecials>& r, std::string_view needle) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::format_error);
  EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
}

TEST(WhisperSpecials, Errors) {
  const int big = 100000;
  // Each required special missing in turn: the error names it.
  const auto full = old_style_specials(2);
  for (std::size_t drop : {0u, 1u, 4u, 5u, 6u, 7u, 8u, 9u}) {
    auto sp = full;
    const std::string missing = sp[drop];
    sp.erase(sp.begin() + static_cast<std::ptrdiff_t>(drop));
    const Tokenizer tok = must(Tokenizer::from_hf_json(json_with_specials(sp), "t.json"));
    expect_format_error(whisper_specials(tok, big), missing == "<|nocaptions|>" ? "<|nospeech|>" : missing);
  }
  {  // A gap in the language ids.
    std::vector<std::string> sp{"<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|translate|>", "<|zh|>",
                                "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
                                "<|notimestamps|>"};
    const Tokenizer tok = must(Tokenizer::from_hf_json(json_with_specials(sp), "t.json"));
    expect_format_error(whisper_specials(tok, big), "<|zh|>");
  }
  {  // A language present after one that is missing (no <|zh|>).
    auto sp = old_style_specials(3);
    sp.erase(sp.begin() + 3);
    const Tokenizer tok = must(Tokenizer::from_hf_json(json_with_specials(sp), "t.json"));
    expect_format_error(whisper_specials(tok, big), "<|de|>");
  }
  {  // Timestamp tokens that are not consecutive.
    auto sp = old_style_specials(1);
    for (const char* t : {"<|0.00|>", "<|0.02|>", "<|extra|>", "<|0.04|>"}) sp.emplace_back(t);
    const Tokenizer tok = must(Tokenizer::from_hf_json(json_with_specials(sp), "t.json"));
    expect_format_error(whisper_specials(tok, big), "<|0.04|>");
  }
  {  // Old style: the model vocabulary leaves no room for timestamps; a token where they would begin.
    const auto sp = old_style_specials(2);
    const Tokenizer tok = must(Tokenizer::from_hf_json(json_with_specials(sp), "t.json"));
    expect_format_error(whisper_specials(tok, tok.vocab_size()), "too small");
    expect_format_error(whisper_specials(tok, 10), "too small");
    auto extra = sp;
    extra.emplace_back("<|something|>");
    const Tokenizer tok2 = must(Tokenizer::from_hf_json(json_with_specials(extra), "t.json"));
    expect_format_error(whisper_specials(tok2, big), "<|something|>");
  }
  {  // New style: a model vocabulary smaller than the tokenizer.
    const auto w = write(2);
    expect_format_error(whisper_specials(*w->tok, w->total - 1), "too small");
    EXPECT_TRUE(whisper_specials(*w->tok, w->total + 10).ok());
  }
}

TEST(WhisperText, SpellingsStayTextAndRoundTrip) {
  const auto w = write(99);
  const Tokenizer& tok = *w->tok;
  const auto s = must(whisper_specials(tok, w->total));
  const std::string text =
      " Hello world, <|en|> and <|startoftranscript|><|0.00|> are text here. Caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD!";
  const auto ids = whisper_text_ids(tok, text);
  ASSERT_FALSE(ids.empty());
  for (TokenId id : ids) EXPECT_LT(id, s.eot) << id;
  EXPECT_EQ(ids, tok.encode(text));
  EXPECT_EQ(tok.decode(ids), text);
  // With parse_special the spellings are the tokens (which whisper_text_ids never does).
  const auto parsed = tok.encode("<|en|>hi", EncodeOptions{.parse_special = true});
  ASSERT_FALSE(parsed.empty());
  EXPECT_EQ(parsed[0], s.language_id("en"));
}

TEST(WhisperText, NonSpecialTimestampTokensStayText) {
  // The Hub's newer files add the timestamps as non-special added tokens, which encode() matches in any text.
  const auto w = write(99);
  ordered_json j = ordered_json::parse(read_file(w->dir.path() + "/tokenizer.json"));
  for (auto& a : j["added_tokens"]) {
    if (a["content"].get<std::string>().find('.') != std::string::npos) a["special"] = false;
  }
  const Tokenizer hub = must(Tokenizer::from_hf_json(j.dump(), "hub.json"));
  const auto s = must(whisper_specials(hub, w->total));
  EXPECT_EQ(s.timestamp_count, 1501);
  for (const std::string text : {"<|0.00|> Hello there.<|1.20|>", "a<|2.00|><|30.00|>b <|0.04|>", "<|9.99|>",
                                 "plain <|1.2|> <|x.00|> <|1.20| text"}) {
    const auto matched = hub.encode(text);
    const auto ids = whisper_text_ids(hub, text);
    for (TokenId id : ids) EXPECT_LT(id, s.eot) << text;
    EXPECT_EQ(ids, whisper_text_ids(*w->tok, text)) << text;  // the all-special file encodes them as text
    EXPECT_EQ(ids, w->tok->encode(text)) << text;
    EXPECT_EQ(hub.decode(ids), text);
    if (text.find("<|0.00|>") != std::string::npos) {
      EXPECT_NE(std::find(matched.begin(), matched.end(), s.timestamp_begin), matched.end());
    }
  }
}

TEST(WhisperDecode, SpecialsAndTimestampsGiveOnlyText) {
  const auto w = write(99);
  const Tokenizer& tok = *w->tok;
  const auto s = must(whisper_specials(tok, w->total));
  const std::string text = " The quick brown fox, caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD.";
  const auto body = whisper_text_ids(tok, text);
  std::vector<TokenId> ids{s.sot, s.language_id("en"), s.transcribe, s.timestamp_token(0.0)};
  ids.insert(ids.end(), body.begin(), body.end());
  ids.push_back(s.timestamp_token(1.2));
  ids.push_back(s.eot);
  EXPECT_EQ(tok.decode(ids), text);
  for (TokenId id : {s.sot, s.eot, s.nospeech, s.notimestamps, s.timestamp_begin, s.startofprev}) {
    EXPECT_EQ(tok.token_bytes(id), "");
  }
  // Streaming, token by token, equals the whole; specials produce nothing on their own.
  StreamDecoder sd(tok);
  std::string streamed;
  for (TokenId id : ids) {
    const std::string piece = sd.push(id);
    if (id >= s.eot) {
      EXPECT_EQ(piece, "") << id;
    }
    streamed += piece;
  }
  streamed += sd.flush();
  EXPECT_EQ(streamed, text);
}

TEST(WhisperLoader, TemplateWithTwoPrefixSpecials) {
  const auto w = write(1);
  const Tokenizer& tok = *w->tok;
  const auto s = must(whisper_specials(tok, w->total));
  // max_tokens keeps the prefix and the EOS.
  const auto cut = tok.encode_pieces(std::vector<TextPiece>{{"hello world hello world", false}},
                                     EncodeOptions{.add_bos = true, .add_eos = true, .max_tokens = 4});
  ASSERT_EQ(cut.size(), 4u);
  EXPECT_EQ(cut[0], s.sot);
  EXPECT_EQ(cut[1], s.notimestamps);
  EXPECT_EQ(cut[3], s.eot);
  // A GGUF vocabulary cannot say "two specials before the text": the conversion refuses rather than drop one.
  const auto v = bpe_vocab_from_hf_json(read_file(w->dir.path() + "/tokenizer.json"), "tokenizer.json");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.error().code, Errc::unsupported);
  // A third special before the sequence is read too.
  ordered_json j = ordered_json::parse(read_file(w->dir.path() + "/tokenizer.json"));
  auto& single = j["post_processor"]["single"];
  single.insert(single.begin() + 2, ordered_json{{"SpecialToken", {{"id", "<|en|>"}, {"type_id", 0}}}});
  const Tokenizer three = must(Tokenizer::from_hf_json(j.dump(), "three.json"));
  const auto ids = three.encode("hi", true, false);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ((std::vector<TokenId>{ids[0], ids[1], ids[2]}),
            (std::vector<TokenId>{s.sot, s.notimestamps, s.language_id("en")}));
}

}  // namespace
}  // namespace tandem::tok::testing
