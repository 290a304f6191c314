// tok::bpe_vocab_from_hf_json (tokenizer/hf_vocab.h): a byte-level BPE tokenizer.json read back as the GGUF "gpt2"
// vocabulary it came from (generated vocabularies of each pre name, llama.cpp's gpt-2 and deepseek-coder vocabulary
// files from ../shared), the pre name identified from the spellings real checkpoints use (Llama 3's (?i:...)
// contractions, GPT-2's ByteLevel regex, SmolLM's Digits, DeepSeek's literal newlines, Qwen2's NFC), the result
// encoding like the tokenizer.json itself, and the typed refusals.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "bpe_test_util.h"
#include "tokenizer/hf_vocab.h"

namespace tandem::tok::testing {
namespace {

using J = nlohmann::json;

const std::vector<std::string>& sample_texts() {
  static const std::vector<std::string> t = {
      "Hello world, once upon a time: 42 cats and 1234567 dogs!",
      "  indented\n\tcode(x) == y->z[3];  // trailing  \n\n",
      "don't I'LL we've THEY'RE it's",
      "caf\xC3\xA9 na\xC3\xAFve \xE4\xB8\xAD\xE6\x96\x87\xE5\xAD\x97 \xF0\x9F\x98\x80 emoji \xEA\xB0\x80\xEB\x82\x98",
      "<|endoftext|> <|im_end|> <s> text that spells specials",
      "   \n  \r\n x",
      "",
  };
  return t;
}

std::vector<std::string> specials_for(const std::string& pre) {
  if (pre == "llama-bpe") return {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|eot_id|>"};
  if (pre == "qwen2") return {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  if (pre == "gpt-2") return {"<|endoftext|>"};
  return {"<s>", "</s>"};
}

void expect_same_vocab(const BpeVocab& a, const BpeVocab& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  std::vector<PieceType> ta = a.types, tb = b.types;
  if (ta.empty()) ta.assign(a.tokens.size(), PieceType::normal);
  if (tb.empty()) tb.assign(b.tokens.size(), PieceType::normal);
  EXPECT_EQ(ta, tb);
  EXPECT_EQ(a.merges, b.merges);
  EXPECT_EQ(a.pre, b.pre);
  EXPECT_EQ(a.bos, b.bos);
  EXPECT_EQ(a.eos, b.eos);
  EXPECT_EQ(a.eot, b.eot);
  EXPECT_EQ(a.unk, b.unk);
  EXPECT_EQ(a.pad, b.pad);
  EXPECT_EQ(a.add_bos, b.add_bos);
  EXPECT_EQ(a.add_eos, b.add_eos);
}

// from_bpe_vocab(v) encodes every sample like from_hf_json(json) (plain and with specials parsed).
void expect_encodes_like(const BpeVocab& v, const std::string& json) {
  auto g = Tokenizer::from_bpe_vocab(v, "round-trip");
  ASSERT_TRUE(g.ok()) << g.error().message;
  auto h = Tokenizer::from_hf_json(json, "tokenizer.json");
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_EQ(g->adds_bos(), h->adds_bos());
  EXPECT_EQ(g->bos_id(), h->bos_id());
  EXPECT_EQ(g->eos_id(), h->eos_id());
  EXPECT_EQ(g->eot_id(), h->eot_id());
  EXPECT_EQ(g->special_ids(), h->special_ids());
  for (const std::string& t : sample_texts()) {
    EXPECT_EQ(g->encode(t, true, false), h->encode(t, true, false)) << t;
    EncodeOptions o;
    o.parse_special = true;
    EXPECT_EQ(g->encode(t, o), h->encode(t, o)) << t;
  }
}

Result<BpeVocab> read(const std::string& json, std::string_view config = {}) {
  return bpe_vocab_from_hf_json(json, "dir/tokenizer.json", config);
}

#define EXPECT_REFUSED(result, errc, needle)                                               \
  do {                                                                                     \
    const auto& _r = (result);                                                             \
    ASSERT_FALSE(_r.ok()) << "accepted";                                                   \
    EXPECT_EQ(_r.error().code, (errc)) << _r.error().message;                              \
    EXPECT_NE(_r.error().message.find(needle), std::string::npos) << _r.error().message;   \
    EXPECT_NE(_r.error().message.find("dir/tokenizer.json"), std::string::npos) << _r.error().message; \
  } while (0)

class GeneratedPre : public ::testing::TestWithParam<const char*> {};

TEST_P(GeneratedPre, RoundTripGivesTheVocabularyBackAndEncodesAlike) {
  const std::string pre = GetParam();
  const BpeVocab v = generate_bpe_vocab(700, pre, specials_for(pre), 11);
  const std::string json = hf_json_from_bpe_vocab(v);
  auto r = read(json);
  ASSERT_TRUE(r.ok()) << r.error().message;
  expect_same_vocab(v, *r);
  expect_encodes_like(*r, json);
}

INSTANTIATE_TEST_SUITE_P(Names, GeneratedPre,
                         ::testing::Values("llama-bpe", "qwen2", "gpt-2", "starcoder", "deepseek-llm",
                                           "deepseek-coder", "falcon", "default"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

TEST(HfVocab, AliasNamesAreIdentifiedAsTheirPreferredNameWithTheSameRegexes) {
  const std::pair<const char*, const char*> aliases[] = {
      {"llama3", "llama-bpe"}, {"llama-v3", "llama-bpe"}, {"mpt", "gpt-2"}, {"phi-2", "gpt-2"},
      {"smollm", "starcoder"}, {"refact", "starcoder"}};
  for (const auto& [alias, name] : aliases) {
    SCOPED_TRACE(alias);
    BpeVocab v = generate_bpe_vocab(300, alias, {"<|endoftext|>"}, 5);
    auto r = read(hf_json_from_bpe_vocab(v));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->pre, name);
    EXPECT_EQ(bpe_pre_regexes(alias), bpe_pre_regexes(name));
  }
  // Every name in the table is identified as a name with its regexes.
  for (const std::string& n : bpe_pre_names()) {
    SCOPED_TRACE(n);
    BpeVocab v = generate_bpe_vocab(300, n, {"<|endoftext|>"}, 5);
    auto r = read(hf_json_from_bpe_vocab(v));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(bpe_pre_regexes(r->pre), bpe_pre_regexes(n));
  }
}

// The tokenizer.json of `pre`'s generated vocabulary with its pre_tokenizer / normalizer replaced.
std::string with_components(const std::string& pre, const J& pre_tokenizer, const J& normalizer = nullptr,
                            BpeVocab* out = nullptr) {
  const BpeVocab v = generate_bpe_vocab(700, pre, specials_for(pre), 3);
  if (out != nullptr) *out = v;
  J j = J::parse(hf_json_from_bpe_vocab(v));
  j["pre_tokenizer"] = pre_tokenizer;
  j["normalizer"] = normalizer;
  return j.dump();
}

J split(const std::string& regex) {
  return J{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
}
J byte_level(bool use_regex) {
  return J{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}
J sequence(std::vector<J> steps) { return J{{"type", "Sequence"}, {"pretokenizers", steps}}; }

TEST(HfVocab, TheSpellingsOfRealCheckpointsAreIdentified) {
  struct Case {
    const char* label;
    const char* pre;
    J pre_tokenizer;
    J normalizer;
  };
  const std::string llama3 =  // Meta-Llama-3's tokenizer.json
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const std::string qwen2 =  // Qwen2.5's
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const std::string cjk = "[\xE4\xB8\x80-\xE9\xBE\xA5\xE0\xA0\x80-\xE4\xB8\x80\xEA\xB0\x80-\xED\x9F\xBF]+";
  const std::vector<Case> cases = {
      {"Llama 3", "llama-bpe", sequence({split(llama3), byte_level(false)}), nullptr},
      {"Qwen2 (NFC)", "qwen2", sequence({split(qwen2), byte_level(false)}), J{{"type", "NFC"}}},
      {"GPT-2", "gpt-2", byte_level(true), nullptr},
      {"SmolLM / StarCoder", "starcoder",
       sequence({J{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true)}), nullptr},
      {"DeepSeek Coder", "deepseek-coder",
       sequence({split("[\r\n]"), split("\\s?\\p{L}+"), split("\\s?\\p{P}+"), split(cjk),
                 J{{"type", "Digits"}, {"individual_digits", true}}, byte_level(false)}),
       nullptr},
      {"DeepSeek Coder, escaped newlines", "deepseek-coder",
       sequence({split("[\\r\\n]"), split("\\s?\\p{L}+"), split("\\s?\\p{P}+"), split(cjk), split("\\p{N}"),
                 byte_level(false)}),
       nullptr},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    const std::string json = with_components(c.pre, c.pre_tokenizer, c.normalizer);
    auto r = read(json);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->pre, c.pre);
    expect_encodes_like(*r, json);  // the samples are NFC, so Qwen2's normalizer changes nothing
  }
}

TEST(HfVocab, CanonicalRegexes) {
  EXPECT_EQ(canonical_pre_regex("(?i:'s|'t|'re|'ve|'m|'ll|'d)|x"),
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|x");
  EXPECT_EQ(canonical_pre_regex("[\\r\\n]\\t"), "[\r\n]\t");
  EXPECT_EQ(canonical_pre_regex("\\\\r"), "\\\\r") << "an escaped backslash followed by r stays";
  EXPECT_EQ(canonical_pre_regex("\\s+(?!\\S)"), "\\p{White_Space}+(?!\\P{White_Space})");
  EXPECT_NE(canonical_pre_regex("\\p{N}{1,3}"), canonical_pre_regex("\\p{N}"));
}

TEST(HfVocab, TokenizerConfigNamesSpecialsAndDecidesBos) {
  BpeVocab v = generate_bpe_vocab(400, "gpt-2", {"<|endoftext|>", "<|pad|>", "<|begin|>", "<|fin|>"}, 9);
  const std::string json = hf_json_from_bpe_vocab(v);
  auto plain = read(json);
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_EQ(plain->bos, -1);
  EXPECT_FALSE(plain->add_bos);
  const TokenId begin = static_cast<TokenId>(v.tokens.size() - 2), fin = static_cast<TokenId>(v.tokens.size() - 1);
  ASSERT_EQ(v.tokens[static_cast<std::size_t>(begin)], "<|begin|>");
  auto r = read(json, R"({"bos_token": {"content": "<|begin|>", "lstrip": false}, "eos_token": "<|fin|>",
                         "pad_token": "<|pad|>", "add_bos_token": true})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->bos, begin);
  EXPECT_TRUE(r->add_bos);
  EXPECT_EQ(r->eos, plain->eos) << "the tokenizer.json's own <|endoftext|> EOS is kept";
  EXPECT_EQ(r->pad, static_cast<TokenId>(v.tokens.size() - 3));
  // add_bos_token false overrides a TemplateProcessing BOS.
  BpeVocab l = generate_bpe_vocab(400, "llama-bpe", specials_for("llama-bpe"), 9);
  ASSERT_TRUE(l.add_bos);
  auto nb = read(hf_json_from_bpe_vocab(l), R"({"add_bos_token": false})");
  ASSERT_TRUE(nb.ok()) << nb.error().message;
  EXPECT_FALSE(nb->add_bos);
  EXPECT_EQ(nb->bos, l.bos);
  (void)fin;
  EXPECT_REFUSED(read(json, "{not json"), Errc::parse_error, "tokenizer_config.json");
}

// llama.cpp's gpt-2 and deepseek-coder vocabularies: GGUF → tokenizer.json → bpe_vocab_from_hf_json gives the same
// pre name and vocabulary, and the result encodes every .inp case as the .out ids.
class SharedVocab : public ::testing::TestWithParam<const char*> {};

TEST_P(SharedVocab, GgufThroughTokenizerJsonAndBackKeepsThePreNameAndTheEncodings) {
  const std::string path = vocab_path(GetParam());
  SKIP_WITHOUT(path);
  auto f = weights::GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto v = weights::bpe_vocab_from_gguf(*f);
  ASSERT_TRUE(v.ok()) << v.error().message;
  const std::string json = hf_json_from_bpe_vocab(*v);
  auto r = read(json);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->pre, v->pre);
  EXPECT_EQ(r->tokens, v->tokens);
  EXPECT_EQ(r->merges, v->merges);
  auto t = Tokenizer::from_bpe_vocab(*r, "round-trip");
  ASSERT_TRUE(t.ok()) << t.error().message;
  const auto cases = read_cases(path);
  ASSERT_EQ(cases.size(), 46u);
  int pass = 0;
  for (const auto& c : cases) {
    EXPECT_EQ(t->encode(c.text), c.ids) << c.text;
    pass += t->encode(c.text) == c.ids ? 1 : 0;
  }
  std::printf("[ vocab    ] %-34s %d/%d cases pass\n", (std::string(GetParam()) + " (json → BpeVocab)").c_str(), pass,
              static_cast<int>(cases.size()));
}

INSTANTIATE_TEST_SUITE_P(Shared, SharedVocab, ::testing::Values("gpt-2", "deepseek-coder"), [](const auto& info) {
  std::string s = info.param;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
});

// The SentencePiece vocabularies as Llama-2-style tokenizer.json: refused, pointing at tokenizer.model.
TEST(HfVocab, SharedSentencePieceVocabulariesAsTokenizerJsonAreRefused) {
  for (const char* name : {"llama-spm", "phi-3"}) {
    SCOPED_TRACE(name);
    const std::string path = vocab_path(name);
    SKIP_WITHOUT(path);
    auto sp = gguf_tokenizer(path);
    ASSERT_TRUE(sp.ok()) << sp.error().message;
    EXPECT_REFUSED(read(llama2_style_json(*sp)), Errc::unsupported, "convert from tokenizer.model");
  }
}

TEST(HfVocab, RefusalsAreTyped) {
  // A regex list llama.cpp has no name for.
  EXPECT_REFUSED(read(with_components("qwen2", sequence({split("\\p{L}+|\\p{N}{1,2}"), byte_level(false)}))),
                 Errc::unsupported, "matches none of llama.cpp's pre names");
  // A normalizer a GGUF vocabulary cannot carry.
  EXPECT_REFUSED(read(with_components("gpt-2", byte_level(true), J{{"type", "NFKC"}})), Errc::unsupported,
                 "normalizer");
  // The right regexes in another order.
  EXPECT_REFUSED(read(with_components("deepseek-coder",
                                      sequence({split("\\s?\\p{L}+"), split("[\r\n]"), split("\\s?\\p{P}+"),
                                                split("\\p{N}"), byte_level(false)}))),
                 Errc::unsupported, "matches none");
  // Split behaviors other than Isolated, String patterns, ByteLevel add_prefix_space.
  {
    J s = split("\\p{N}");
    s["behavior"] = "Removed";
    EXPECT_REFUSED(read(with_components("gpt-2", sequence({s, byte_level(true)}))), Errc::unsupported, "Removed");
    J t = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Isolated"}, {"invert", false}};
    EXPECT_REFUSED(read(with_components("gpt-2", sequence({t, byte_level(true)}))), Errc::unsupported, "String");
    J b = byte_level(true);
    b["add_prefix_space"] = true;
    EXPECT_REFUSED(read(with_components("gpt-2", b)), Errc::unsupported, "add_prefix_space");
  }
  // SentencePiece style: Metaspace; byte_fallback.
  {
    J meta = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}, {"split", false}};
    EXPECT_REFUSED(read(with_components("gpt-2", meta)), Errc::unsupported, "convert from tokenizer.model");
    J j = J::parse(hf_json_from_bpe_vocab(generate_bpe_vocab(300, "gpt-2", {"<|endoftext|>"}, 1)));
    j["model"]["byte_fallback"] = true;
    EXPECT_REFUSED(read(j.dump()), Errc::unsupported, "byte_fallback");
    j["model"]["byte_fallback"] = false;
    j["pre_tokenizer"] = nullptr;
    EXPECT_REFUSED(read(j.dump()), Errc::unsupported, "no ByteLevel");
  }
  // Not BPE.
  {
    J wp = {{"version", "1.0"}, {"added_tokens", J::array()}, {"normalizer", nullptr}, {"pre_tokenizer", nullptr},
            {"decoder", nullptr},
            {"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"vocab", {{"[UNK]", 0}, {"a", 1}}}}}};
    EXPECT_REFUSED(read(wp.dump()), Errc::unsupported, "WordPiece");
  }
  // Ids with a gap; a token that is not byte-level text.
  {
    J j = J::parse(hf_json_from_bpe_vocab(generate_bpe_vocab(300, "gpt-2", {"<|endoftext|>"}, 1)));
    J& vocab = j["model"]["vocab"];
    std::string at5;
    for (auto it = vocab.begin(); it != vocab.end(); ++it)
      if (it.value() == 5) at5 = it.key();
    ASSERT_FALSE(at5.empty());
    vocab[at5] = 100000;
    EXPECT_REFUSED(read(j.dump()), Errc::format_error, "id 5");
  }
  {
    J j = J::parse(hf_json_from_bpe_vocab(generate_bpe_vocab(300, "gpt-2", {"<|endoftext|>"}, 1)));
    J& vocab = j["model"]["vocab"];
    const auto n = static_cast<int>(vocab.size());  // (the added <|endoftext|> is in the vocab too)
    // A new last id whose spelling holds a raw space (GPT-2's alphabet spells it "Ġ").
    const int id = n;
    vocab["a b"] = id;
    EXPECT_REFUSED(read(j.dump()), Errc::format_error, "not byte-level text");
    // As a (non-special) added token the same spelling is fine: added tokens are raw text.
    vocab.erase("a b");
    j["added_tokens"].push_back(J{{"id", id}, {"content", "a b"}, {"special", false}});
    auto ok = read(j.dump());
    ASSERT_TRUE(ok.ok()) << ok.error().message;
    EXPECT_EQ(ok->types.at(static_cast<std::size_t>(id)), PieceType::user_defined);
  }
}

}  // namespace
}  // namespace tandem::tok::testing
