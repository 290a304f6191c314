// The BPE tokenizer's features on small hand-made and generated vocabularies: special-token safety (text that
// spells a special token is text unless parse_special or trusted pieces say otherwise), added-token options, each
// pre name's regexes, normalizers, Split behaviours, Digits, Metaspace, decoders, the generated vocabulary, the
// GGUF writer/reader round trip and the model tokenizer loader.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../weights/test_util.h"
#include "bpe_test_util.h"
#include "tokenizer/model_tokenizer.h"
#include "tokenizer/unicode.h"
#include "weights/model_dir.h"

namespace tandem::tok::testing {
namespace {

using nlohmann::json;

Tokenizer must(Result<Tokenizer> r) {
  if (!r.ok()) {
    ADD_FAILURE() << r.error().message;
    std::abort();
  }
  return std::move(r).value();
}

// The texts of the tokens of `ids` (decoded bytes).
std::vector<std::string> texts(const Tokenizer& t, const std::vector<TokenId>& ids) {
  std::vector<std::string> out;
  for (TokenId id : ids) out.push_back(t.token_bytes(id));
  return out;
}

const BpeVocab& llama3_like() {
  static const BpeVocab v = generate_bpe_vocab(
      1200, "llama-bpe", {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|endoftext|>"}, 7);
  return v;
}

bool contains(const std::vector<TokenId>& ids, TokenId id) { return std::find(ids.begin(), ids.end(), id) != ids.end(); }

// --- special tokens ---------------------------------------------------------------------------------------------

TEST(BpeSpecialTokens, TextSpellingASpecialTokenIsEncodedAsText) {
  const Tokenizer t = must(Tokenizer::from_bpe_vocab(llama3_like(), "gen"));
  const TokenId eot = *t.piece_to_id("<|eot_id|>");
  const TokenId end = *t.piece_to_id("<|endoftext|>");
  const auto ids = t.encode("bye <|endoftext|> and <|eot_id|>");
  EXPECT_FALSE(contains(ids, eot));
  EXPECT_FALSE(contains(ids, end));
  EXPECT_EQ(t.decode(ids), "bye <|endoftext|> and <|eot_id|>");

  const auto parsed = t.encode("bye <|endoftext|>", EncodeOptions{false, false, true});
  EXPECT_EQ(parsed.back(), end);
  EXPECT_EQ(std::count(parsed.begin(), parsed.end(), end), 1);
}

TEST(BpeSpecialTokens, OnlyTrustedPiecesProduceSpecialTokens) {
  const Tokenizer t = must(Tokenizer::from_bpe_vocab(llama3_like(), "gen"));
  const TokenId bos = *t.piece_to_id("<|begin_of_text|>");
  const TokenId eot = *t.piece_to_id("<|eot_id|>");
  const TextPiece pieces[] = {{"<|begin_of_text|>user: ", true}, {"hi <|eot_id|> there", false}, {"<|eot_id|>", true}};
  const auto ids = t.encode_pieces(pieces);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), bos);
  EXPECT_EQ(ids.back(), eot);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), eot), 1);  // the user's spelling stayed text
  // The text between specials is one run: the same ids as encoding it whole.
  const auto mid = t.encode("user: hi <|eot_id|> there");
  EXPECT_EQ(std::vector<TokenId>(ids.begin() + 1, ids.end() - 1), mid);
  // A special spelled across a trusted and an untrusted piece is not recognised.
  const TextPiece split[] = {{"<|eot", true}, {"_id|>", false}};
  EXPECT_FALSE(contains(t.encode_pieces(split), eot));
  // Pieces without specials encode like their concatenation, across piece boundaries.
  const TextPiece plain[] = {{"hel", false}, {"lo wor", true}, {"ld", false}};
  EXPECT_EQ(t.encode_pieces(plain), t.encode("hello world"));
}

TEST(BpeSpecialTokens, SpecialIdsEotAndBos) {
  const Tokenizer t = must(Tokenizer::from_bpe_vocab(llama3_like(), "gen"));
  const auto specials = t.special_ids();
  ASSERT_EQ(specials.size(), 4u);
  EXPECT_EQ(t.eot_id(), *t.piece_to_id("<|eot_id|>"));
  EXPECT_EQ(t.bos_id(), *t.piece_to_id("<|begin_of_text|>"));
  EXPECT_EQ(t.eos_id(), *t.piece_to_id("<|end_of_text|>"));
  EXPECT_TRUE(t.adds_bos());
  EXPECT_EQ(t.encode("hi", true).front(), t.bos_id());
  EXPECT_EQ(t.pre_tokenizer_name(), "llama-bpe");
  EXPECT_EQ(t.kind(), TokenizerKind::bpe);
  EXPECT_EQ(t.decode(std::vector<TokenId>{t.bos_id()}), "");  // special tokens decode to nothing
}

TEST(SentencePieceSpecialTokens, ControlSpellingsAreTextUnlessTrusted) {
  const std::string path = vocab_path("llama-spm");
  SKIP_WITHOUT(path);
  const Tokenizer t = must(gguf_tokenizer(path));
  const auto plain = t.encode("a</s>");
  EXPECT_FALSE(contains(plain, t.eos_id()));
  const auto parsed = t.encode("a</s>", EncodeOptions{false, false, true});
  EXPECT_EQ(parsed.back(), t.eos_id());
  const TextPiece pieces[] = {{"<s>", true}, {"x</s>", false}};
  const auto ids = t.encode_pieces(pieces);
  EXPECT_EQ(ids.front(), t.bos_id());
  EXPECT_FALSE(contains(ids, t.eos_id()));
  EXPECT_EQ(t.special_ids(), (std::vector<TokenId>{1, 2}));
  EXPECT_EQ(t.eot_id(), t.eos_id());
  EXPECT_EQ(t.pre_tokenizer_name(), "sentencepiece");
}

// --- tokenizer.json built by hand -------------------------------------------------------------------------------

// A tokenizer.json whose vocabulary is `pieces` (raw text, no byte-level step unless `byte_level`) plus every
// single character they use, no merges, ignore_merges: each pre-token that is in the vocabulary becomes one token,
// so the ids show the pre-tokenization.
json piece_json(std::vector<std::string> pieces, json pre, bool byte_level = false) {
  json vocab = json::object();
  int id = 0;
  auto add = [&](const std::string& p) {
    const std::string s = byte_level ? detail::bytes_to_alphabet(p) : p;
    if (!vocab.contains(s)) vocab[s] = id++;
  };
  if (byte_level) {
    for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)));
  }
  for (const auto& p : pieces) {
    for (std::size_t i = 0; i < p.size();) {
      const std::size_t n = std::max<std::size_t>(1, detail::utf8_char_len(p, i));
      add(p.substr(i, n));
      i += n;
    }
    add(p);
  }
  json j;
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}, {"ignore_merges", true}};
  j["pre_tokenizer"] = pre;
  if (byte_level) j["decoder"] = {{"type", "ByteLevel"}};
  return j;
}

std::vector<std::string> split_of(const json& j, const std::string& text) {
  auto t = Tokenizer::from_hf_json(j.dump(), "piece.json");
  if (!t.ok()) {
    ADD_FAILURE() << t.error().message;
    return {};
  }
  return texts(*t, t->encode(text));
}

json regex_pre(const std::string& name) {
  json seq = json::array();
  for (const auto& r : bpe_pre_regexes(name)) {
    seq.push_back({{"type", "Split"}, {"pattern", {{"Regex", r}}}, {"behavior", "Isolated"}, {"invert", false}});
  }
  seq.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}});
  return {{"type", "Sequence"}, {"pretokenizers", seq}};
}

using Split = std::vector<std::string>;

TEST(BpePreNames, EveryNameCompilesAndUnknownNamesAreRefused) {
  for (const auto& name : bpe_pre_names()) {
    BpeVocab v = generate_bpe_vocab(300, name, {}, 1);
    auto t = Tokenizer::from_bpe_vocab(v, name);
    ASSERT_TRUE(t.ok()) << name << ": " << t.error().message;
    EXPECT_EQ(t->decode(t->encode("Hello 123 wörld\n")), "Hello 123 wörld\n") << name;
  }
  BpeVocab v = generate_bpe_vocab(300, "gpt-2", {}, 1);
  v.pre = "jais-unknown";
  EXPECT_ERR(Tokenizer::from_bpe_vocab(v, "x.gguf"), Errc::unsupported, "jais-unknown");
}

TEST(BpePreNames, Llama3GroupsDigitsByThreeAndSplitsContractions) {
  const json j = piece_json({"123", "45", " abc", "I", "'m", " you", "'RE"}, regex_pre("llama-bpe"), true);
  EXPECT_EQ(split_of(j, "12345 abc"), (Split{"123", "45", " abc"}));
  EXPECT_EQ(split_of(j, "I'm you'RE"), (Split{"I", "'m", " you", "'RE"}));
}

TEST(BpePreNames, Qwen2SplitsDigitsOneByOne) {
  const json j = piece_json({"1", "2", "3", " abc"}, regex_pre("qwen2"), true);
  EXPECT_EQ(split_of(j, "123 abc"), (Split{"1", "2", "3", " abc"}));
}

TEST(BpePreNames, DeepseekKeepsCjkRunsAndSingleDigits) {
  const json j = piece_json({"你好世界", " abc", "1", "2"}, regex_pre("deepseek-coder"), true);
  EXPECT_EQ(split_of(j, "你好世界 abc12"), (Split{"你好世界", " abc", "1", "2"}));
  const json l = piece_json({"你好世界", " abc", "12"}, regex_pre("deepseek-llm"), true);
  EXPECT_EQ(split_of(l, "你好世界 abc12"), (Split{"你好世界", " abc", "12"}));
}

TEST(BpePreNames, Gpt2AndStarcoderAndFalcon) {
  const json g = piece_json({"Hello", " world", "!!", " ", " x", "123"}, regex_pre("gpt-2"), true);
  EXPECT_EQ(split_of(g, "Hello world!!"), (Split{"Hello", " world", "!!"}));
  EXPECT_EQ(split_of(g, "  x"), (Split{" ", " x"}));
  EXPECT_EQ(split_of(g, "123"), (Split{"123"}));
  const json s = piece_json({"abc", "1", "2"}, regex_pre("starcoder"), true);
  EXPECT_EQ(split_of(s, "abc12"), (Split{"abc", "1", "2"}));
  const json f = piece_json({"123", "4"}, regex_pre("falcon"), true);
  EXPECT_EQ(split_of(f, "1234"), (Split{"123", "4"}));
}

TEST(BpePreTokenizers, SplitBehaviours) {
  const std::vector<std::string> pieces = {"a", "b", "c", "-", "--", "a-", "b-", "-b", "-c", "---"};
  auto with = [&](const char* behavior, bool invert) {
    return piece_json(pieces, {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior},
                               {"invert", invert}});
  };
  EXPECT_EQ(split_of(with("Removed", false), "a-b--c"), (Split{"a", "b", "c"}));
  EXPECT_EQ(split_of(with("Isolated", false), "a-b--c"), (Split{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(split_of(with("MergedWithPrevious", false), "a-b--c"), (Split{"a-", "b-", "-", "c"}));
  EXPECT_EQ(split_of(with("MergedWithNext", false), "a-b--c"), (Split{"a", "-b", "-", "-c"}));
  EXPECT_EQ(split_of(with("Contiguous", false), "a-b--c"), (Split{"a", "-", "b", "--", "c"}));
  EXPECT_EQ(split_of(with("Removed", true), "a-b--c"), (Split{"-", "-", "-"}));
  const json re = piece_json({"ab", "12", "c"}, {{"type", "Split"}, {"pattern", {{"Regex", "\\d+"}}},
                                                  {"behavior", "Isolated"}, {"invert", false}});
  EXPECT_EQ(split_of(re, "ab12c"), (Split{"ab", "12", "c"}));
}

TEST(BpePreTokenizers, DigitsAndMetaspace) {
  const json d1 = piece_json({"a", "1", "2", "3"}, {{"type", "Digits"}, {"individual_digits", true}});
  EXPECT_EQ(split_of(d1, "a123"), (Split{"a", "1", "2", "3"}));
  const json d3 = piece_json({"a", "123"}, {{"type", "Digits"}, {"individual_digits", false}});
  EXPECT_EQ(split_of(d3, "a123"), (Split{"a", "123"}));
  const std::string ws = "\xE2\x96\x81";
  json m = piece_json({ws + "hello", ws + "world"},
                      {{"type", "Metaspace"}, {"replacement", ws}, {"prepend_scheme", "always"}, {"split", true}});
  m["decoder"] = {{"type", "Metaspace"}, {"replacement", ws}, {"prepend_scheme", "always"}};
  auto t = must(Tokenizer::from_hf_json(m.dump(), "metaspace.json"));
  const auto ids = t.encode("hello world");
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(t.piece(ids[0]), ws + "hello");
  EXPECT_EQ(t.decode(ids), "hello world");
  EXPECT_EQ(stream_decode(t, ids), "hello world");
}

TEST(BpeNormalizers, NfcNfkcAndRegexReplace) {
  const json nfc_pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  json j = piece_json({"caf\xC3\xA9", "fi"}, nfc_pre, true);
  j["normalizer"] = {{"type", "NFC"}};
  auto nfc = must(Tokenizer::from_hf_json(j.dump(), "nfc.json"));
  EXPECT_EQ(nfc.encode("cafe\xCC\x81"), nfc.encode("caf\xC3\xA9"));  // e + combining acute → é
  EXPECT_EQ(nfc.encode("caf\xC3\xA9").size(), 1u);
  j["normalizer"] = {{"type", "NFKC"}};
  auto nfkc = must(Tokenizer::from_hf_json(j.dump(), "nfkc.json"));
  EXPECT_EQ(nfkc.encode("\xEF\xAC\x81"), nfkc.encode("fi"));  // the ligature ﬁ
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", json::array({{{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}},
                                                   {"content", " "}}})}};
  auto rep = must(Tokenizer::from_hf_json(j.dump(), "replace.json"));
  EXPECT_EQ(rep.encode("fi    fi"), rep.encode("fi fi"));
}

TEST(BpeAddedTokens, LstripRstripSingleWordAndNonSpecialEverywhere) {
  json j = piece_json({"a", " ", "b", "x", "y"}, {{"type", "ByteLevel"}, {"add_prefix_space", false}}, true);
  const int n = static_cast<int>(j["model"]["vocab"].size());
  j["added_tokens"] = json::array({
      {{"id", n}, {"content", "<L>"}, {"special", true}, {"lstrip", true}, {"rstrip", false}},
      {{"id", n + 1}, {"content", "<R>"}, {"special", true}, {"lstrip", false}, {"rstrip", true}},
      {{"id", n + 2}, {"content", "<W>"}, {"special", false}, {"single_word", true}},
      {{"id", n + 3}, {"content", "<N>"}, {"special", false}},
  });
  auto t = must(Tokenizer::from_hf_json(j.dump(), "added.json"));
  const EncodeOptions special{false, false, true};
  EXPECT_EQ(texts(t, t.encode("a <L> b", special)), (Split{"a", "", " ", "b"}));  // the space before <L> is absorbed
  EXPECT_EQ(texts(t, t.encode("a <R> b", special)), (Split{"a", " ", "", "b"}));  // the space after <R> is absorbed
  EXPECT_EQ(t.encode("a <L> b").size(), 7u);                                      // not special-parsed: text
  EXPECT_EQ(t.encode("x<W>y").size(), 5u);                                        // inside a word: text
  EXPECT_TRUE(contains(t.encode("x <W> y"), n + 2));                              // a word of its own
  EXPECT_TRUE(contains(t.encode("x<N>y"), n + 3));  // non-special added tokens match everywhere
  EXPECT_EQ(t.decode(t.encode("x<N>y")), "x<N>y");
}

// --- generated vocabularies, GGUF round trip, loader ------------------------------------------------------------

TEST(GeneratedBpeVocab, DeterministicSizedAndSensible) {
  const BpeVocab a = generate_bpe_vocab(2000, "qwen2", {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, 42);
  const BpeVocab b = generate_bpe_vocab(2000, "qwen2", {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, 42);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.merges, b.merges);
  ASSERT_EQ(a.tokens.size(), 2000u);
  EXPECT_EQ(a.tokens[65], "A");
  EXPECT_EQ(a.tokens[32], "\xC4\xA0");  // the space byte, as GPT-2 spells it
  EXPECT_EQ(a.tokens[1997], "<|endoftext|>");
  EXPECT_EQ(a.types[1999], PieceType::control);
  EXPECT_EQ(a.eot, 1999);
  EXPECT_EQ(a.eos, 1997);
  EXPECT_EQ(a.bos, -1);
  EXPECT_FALSE(a.add_bos);
  const Tokenizer t = must(Tokenizer::from_bpe_vocab(a, "gen"));
  const std::string text = "The quick brown fox said that the word is there.";
  const auto ids = t.encode(text);
  EXPECT_LT(ids.size(), text.size() / 2) << "merges should compress English-like text";
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_EQ(t.eot_id(), 1999);
  // The tokenizer.json written for it encodes the same.
  const Tokenizer j = must(Tokenizer::from_hf_json(hf_json_from_bpe_vocab(a), "gen.json"));
  for (const char* s : {"Hello, world! 12345", "caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80", "  x\n\ny "}) {
    EXPECT_EQ(j.encode(s), t.encode(s)) << s;
  }
}

TEST(GgufBpeVocab, WriterAndReaderRoundTrip) {
  BpeVocab v = generate_bpe_vocab(600, "smollm", {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, 3);
  v.eot = 599;
  v.add_eos = true;
  weights::GgufWriter w;
  weights::write_bpe_vocab_to_gguf(w, v);
  auto bytes = w.serialize();
  ASSERT_TRUE(bytes.ok());
  auto f = weights::GgufFile::parse(weights::testing::as_bytes(*bytes), "mem.gguf");
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto r = weights::bpe_vocab_from_gguf(*f);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->tokens, v.tokens);
  EXPECT_EQ(r->types, v.types);
  EXPECT_EQ(r->merges, v.merges);
  EXPECT_EQ(r->pre, "smollm");
  EXPECT_EQ(r->eos, v.eos);
  EXPECT_EQ(r->eot, 599);
  EXPECT_EQ(r->add_eos, true);
  auto t = Tokenizer::from_bpe_vocab(*r, "mem.gguf");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->model_bytes(), hf_json_from_bpe_vocab(*r));
}

TEST(ModelTokenizer, HfDirPrefersTokenizerJsonAndGgufUsesItsVocabulary) {
  weights::testing::TempDir dir;
  weights::testing::write_model(dir);
  {
    auto m = weights::ModelDir::open(dir.path());
    ASSERT_TRUE(m.ok()) << m.error().message;
    auto t = load_model_tokenizer(*m);  // tokenizer.model holds junk in this fixture: the SentencePiece path fails
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.error().code, Errc::parse_error) << t.error().message;
  }
  const BpeVocab v = generate_bpe_vocab(400, "llama-bpe", {"<|begin_of_text|>", "<|eot_id|>"}, 5);
  weights::testing::write_file(dir / "tokenizer.json", hf_json_from_bpe_vocab(v));
  auto m = weights::ModelDir::open(dir.path());
  ASSERT_TRUE(m.ok()) << m.error().message;
  auto t = load_model_tokenizer(*m);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->kind(), TokenizerKind::bpe);
  EXPECT_EQ(t->vocab_size(), 400);
  EXPECT_TRUE(model_adds_bos(*m, *t));

  // GGUF: the tiny Llama with a "gpt2" vocabulary of the same size as its embedding.
  weights::GgufWriter w = weights::testing::tiny_gguf();
  const auto nv = static_cast<int>(weights::testing::tiny_vocab().size());
  const BpeVocab g = generate_bpe_vocab(nv, "qwen2", {"<|endoftext|>", "<|im_end|>"}, 9);
  w.erase("tokenizer.ggml.scores");
  weights::write_bpe_vocab_to_gguf(w, g);
  ASSERT_TRUE(w.write(dir / "m.gguf").ok());
  auto gm = weights::ModelDir::open(dir / "m.gguf");
  ASSERT_TRUE(gm.ok()) << gm.error().message;
  auto gt = load_model_tokenizer(*gm);
  ASSERT_TRUE(gt.ok()) << gt.error().message;
  EXPECT_EQ(gt->kind(), TokenizerKind::bpe);
  EXPECT_EQ(gt->pre_tokenizer_name(), "qwen2");
  EXPECT_EQ(gt->eot_id(), nv - 1);
  EXPECT_EQ(gt->decode(gt->encode("hello there 42")), "hello there 42");
}

}  // namespace
}  // namespace tandem::tok::testing
