// The WordPiece tokenizer of BERT-family embedding models: llama.cpp's 46 tokenizer test strings on the bge vocabulary
// (bert-base-uncased's 30,522 tokens) give the ids Hugging Face's tokenizer gives (tests/tokenizer/data/bert-bge,
// from llama.cpp's models/ggml-vocab-bert-bge.gguf.*); the normalizer's and WordPiece's rules one by one; tokenizer.json
// and GGUF "bert" vocabularies load to the same tokenizer; bad vocabularies are typed errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "bpe_test_util.h"
#include "tokenizer/wordpiece.h"
#include "weights/gguf.h"
#include "weights/gguf_tokenizer.h"

namespace tandem::tok {
namespace {

const std::string kData = std::string(TANDEM_SOURCE_DIR) + "/tests/tokenizer/data/bert-bge";

WordPieceTokenizer bge() {
  auto t = WordPieceTokenizer::from_vocab_txt(testing::slurp(kData + "/vocab.txt"), "vocab.txt");
  EXPECT_TRUE(t.ok()) << t.error().message;
  return std::move(t).value();
}

TEST(WordPiece, LlamaCppsTestStringsGiveHuggingFacesIds) {
  const WordPieceTokenizer t = bge();
  EXPECT_EQ(t.vocab_size(), 30522);
  EXPECT_EQ(t.cls_id(), 101);
  EXPECT_EQ(t.sep_id(), 102);
  EXPECT_EQ(t.unk_id(), 100);
  EXPECT_EQ(t.pad_id(), 0);
  const auto cases = testing::read_cases(kData + "/cases");
  ASSERT_EQ(cases.size(), 46u);
  int ok = 0;
  for (const auto& c : cases) {
    const auto ids = t.encode(c.text);
    ASSERT_GE(ids.size(), 2u);
    EXPECT_EQ(ids.front(), 101);
    EXPECT_EQ(ids.back(), 102);
    const std::vector<TokenId> inner(ids.begin() + 1, ids.end() - 1);
    EXPECT_EQ(inner, c.ids) << "text: '" << c.text << "'";
    ok += inner == c.ids;
  }
  std::printf("[ report ] %d of %zu cases equal Hugging Face's ids\n", ok, cases.size());
}

TEST(WordPiece, NormalizerAndPreTokenizerRules) {
  const WordPieceTokenizer t = bge();
  // Lowercase, accents stripped (NFD, marks dropped), punctuation isolated, whitespace of every kind a separator.
  EXPECT_EQ(t.pieces("Héllo,\tWORLD!"), (std::vector<std::string>{"hello", ",", "world", "!"}));
  // Control characters and U+FFFD are removed; malformed UTF-8 becomes U+FFFD first, so it is removed too.
  EXPECT_EQ(t.pieces("he\x01llo\xff"), (std::vector<std::string>{"hello"}));
  // CJK ideographs become words of their own.
  const auto cjk = detail::bert_words("ab中文cd", t.options());
  EXPECT_EQ(cjk, (std::vector<std::string>{"ab", "中", "文", "cd"}));
  // Continuations carry "##"; a word the vocabulary cannot cover is one [UNK], whatever it had matched before.
  EXPECT_EQ(t.pieces("tokenization"), (std::vector<std::string>{"token", "##ization"}));
  EXPECT_EQ(t.encode("\xF0\x9F\xA6\x99"), (std::vector<std::int32_t>{101, 100, 102}));  // an emoji: [UNK]
  // Longer than 100 characters: [UNK] without trying.
  EXPECT_EQ(t.encode(std::string(101, 'a')), (std::vector<std::int32_t>{101, 100, 102}));
  EXPECT_GT(t.encode(std::string(100, 'a')).size(), 3u);
  // Truncation keeps [CLS] and [SEP].
  const auto cut = t.encode("one two three four five six", 5);
  ASSERT_EQ(cut.size(), 5u);
  EXPECT_EQ(cut.front(), 101);
  EXPECT_EQ(cut.back(), 102);
  const auto three = t.encode("one two three");
  EXPECT_EQ(cut, three);
  EXPECT_EQ(t.encode(""), (std::vector<std::int32_t>{101, 102}));
  // Cased: no lowercasing, no accent stripping.
  WordPieceOptions cased;
  cased.lowercase = false;
  cased.strip_accents = false;
  EXPECT_EQ(detail::bert_words("Héllo", cased), (std::vector<std::string>{"Héllo"}));
}

TEST(WordPiece, TokenizerJsonAndGgufGiveTheSameTokenizer) {
  const WordPieceTokenizer t = bge();
  // A tokenizer.json as Hugging Face writes BertTokenizerFast's.
  nlohmann::json vocab = nlohmann::json::object();
  for (int i = 0; i < t.vocab_size(); ++i) vocab[t.token(i)] = i;
  nlohmann::json j = {
      {"normalizer", {{"type", "BertNormalizer"}, {"clean_text", true}, {"handle_chinese_chars", true},
                      {"strip_accents", nullptr}, {"lowercase", true}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"post_processor", {{"type", "TemplateProcessing"},
                          {"single", {{{"SpecialToken", {{"id", "[CLS]"}, {"type_id", 0}}}},
                                      {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                      {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 0}}}}}}}},
      {"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"continuing_subword_prefix", "##"},
                 {"max_input_chars_per_word", 100}, {"vocab", vocab}}}};
  auto h = WordPieceTokenizer::from_hf_json(j.dump(), "tokenizer.json");
  ASSERT_TRUE(h.ok()) << h.error().message;
  // GGUF: the converter's phantom-space spelling, read back.
  weights::GgufWriter w;
  std::vector<std::string> toks;
  for (int i = 0; i < t.vocab_size(); ++i) toks.push_back(t.token(i));
  const auto spelled = weights::wordpiece_tokens_to_gguf(toks);
  EXPECT_EQ(spelled[2001], "\xE2\x96\x81was");  // word-initial pieces get U+2581
  EXPECT_EQ(spelled[101], "[CLS]");
  w.set("tokenizer.ggml.model", weights::GgufValue::of_string("bert"));
  w.set("tokenizer.ggml.tokens", weights::GgufValue::of_strings(spelled));
  auto bytes = w.serialize();
  ASSERT_TRUE(bytes.ok());
  auto f = weights::GgufFile::parse(std::as_bytes(std::span(*bytes)), "vocab.gguf");
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto back = weights::wordpiece_tokens_from_gguf(*f);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, toks);
  auto g = WordPieceTokenizer::from_tokens(*back, "vocab.gguf");
  ASSERT_TRUE(g.ok());
  for (const auto& c : testing::read_cases(kData + "/cases")) {
    EXPECT_EQ(h->encode(c.text), t.encode(c.text)) << c.text;
    EXPECT_EQ(g->encode(c.text), t.encode(c.text)) << c.text;
  }
  // llama.cpp's own file, when the fetched snapshot is around, spells it the same way.
  const char* ll = std::getenv("TANDEM_BERT_VOCAB_GGUF");
  if (ll != nullptr) {
    auto lf = weights::GgufFile::open(ll);
    ASSERT_TRUE(lf.ok()) << lf.error().message;
    auto lt = weights::wordpiece_tokens_from_gguf(*lf);
    ASSERT_TRUE(lt.ok());
    EXPECT_EQ(*lt, toks);
  }
}

TEST(WordPiece, BadVocabulariesAreTypedErrors) {
  auto dup = WordPieceTokenizer::from_vocab_txt("[PAD]\n[UNK]\n[CLS]\n[SEP]\na\na\n", "v.txt");
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.error().code, Errc::format_error);
  EXPECT_NE(dup.error().message.find("token 5 (a) appears twice"), std::string::npos) << dup.error().message;
  auto nounk = WordPieceTokenizer::from_vocab_txt("[CLS]\n[SEP]\na\n", "v.txt");
  ASSERT_FALSE(nounk.ok());
  EXPECT_NE(nounk.error().message.find("[UNK]"), std::string::npos);
  EXPECT_FALSE(WordPieceTokenizer::from_vocab_txt("", "v.txt").ok());
  auto bpe = WordPieceTokenizer::from_hf_json(R"({"model": {"type": "BPE", "vocab": {}}})", "tokenizer.json");
  ASSERT_FALSE(bpe.ok());
  EXPECT_EQ(bpe.error().code, Errc::unsupported);
  auto norm = WordPieceTokenizer::from_hf_json(
      R"({"normalizer": {"type": "NFKC"}, "model": {"type": "WordPiece", "vocab": {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2}}})",
      "tokenizer.json");
  ASSERT_FALSE(norm.ok());
  EXPECT_EQ(norm.error().code, Errc::unsupported);
  auto ids = WordPieceTokenizer::from_hf_json(
      R"({"model": {"type": "WordPiece", "vocab": {"[UNK]": 0, "[CLS]": 1, "[SEP]": 7}}})", "tokenizer.json");
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.error().code, Errc::format_error);
  EXPECT_FALSE(WordPieceTokenizer::from_hf_json("{not json", "tokenizer.json").ok());
  weights::GgufWriter w;
  w.set("tokenizer.ggml.model", weights::GgufValue::of_string("llama"));
  auto bytes = w.serialize();
  auto f = weights::GgufFile::parse(std::as_bytes(std::span(*bytes)), "v.gguf");
  ASSERT_TRUE(f.ok());
  auto r = weights::wordpiece_tokens_from_gguf(*f);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::unsupported);
}

}  // namespace
}  // namespace tandem::tok
