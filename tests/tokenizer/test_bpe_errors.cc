// Untrusted tokenizer.json and GGUF tokenizer metadata: every malformed input is a typed error naming the key, and a
// randomized mutation loop over a valid tokenizer.json never crashes (run it under ASan/UBSan in build-fuzz too).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "../weights/test_util.h"
#include "bpe_test_util.h"

namespace tandem::tok::testing {
namespace {

using nlohmann::json;

json valid() {
  static const std::string text =
      hf_json_from_bpe_vocab(generate_bpe_vocab(300, "llama-bpe", {"<|begin_of_text|>", "<|eot_id|>"}, 11));
  return json::parse(text);
}

Result<Tokenizer> load(const json& j) { return Tokenizer::from_hf_json(j.dump(), "bad/tokenizer.json"); }

TEST(BpeJsonErrors, TheValidBaseLoads) { ASSERT_TRUE(load(valid()).ok()); }

TEST(BpeJsonErrors, NotJsonOrWrongShape) {
  EXPECT_ERR(Tokenizer::from_hf_json("{not json", "bad/tokenizer.json"), Errc::parse_error, "bad/tokenizer.json");
  EXPECT_ERR(Tokenizer::from_hf_json("[1,2]", "bad/tokenizer.json"), Errc::format_error, "top level");
  EXPECT_ERR(Tokenizer::from_hf_json("{}", "bad/tokenizer.json"), Errc::format_error, "model");
  EXPECT_ERR(Tokenizer::from_hf_json(std::string(100000, '['), "x"), Errc::parse_error, "deep");
  EXPECT_ERR(Tokenizer::from_hf_json("{\"model\": \"\xFF\"}", "x"), Errc::parse_error, "UTF-8");
}

TEST(BpeJsonErrors, OtherModelTypesAreUnsupported) {
  for (const char* type : {"WordPiece", "Unigram", "WordLevel"}) {
    json j = valid();
    j["model"]["type"] = type;
    EXPECT_ERR(load(j), Errc::unsupported, type);
  }
}

TEST(BpeJsonErrors, VocabularyProblems) {
  json j = valid();
  j["model"]["vocab"]["zz-extra"] = "seven";
  EXPECT_ERR(load(j), Errc::format_error, "model.vocab['zz-extra']");
  j = valid();
  j["model"]["vocab"]["zz-extra"] = -1;
  EXPECT_ERR(load(j), Errc::format_error, "out of range");
  j = valid();
  j["model"]["vocab"]["zz-extra"] = 1ULL << 40;  // a huge id
  EXPECT_ERR(load(j), Errc::format_error, "out of range");
  j = valid();
  j["model"]["vocab"]["zz-extra"] = 5;  // two tokens, one id
  EXPECT_ERR(load(j), Errc::format_error, "given to both");
  j = valid();
  j["model"]["vocab"]["zz-extra"] = 100000;  // a gap
  EXPECT_ERR(load(j), Errc::format_error, "dense");
  j = valid();
  j["added_tokens"][0]["id"] = 3;  // an added token on an id the vocabulary gives to another token
  EXPECT_ERR(load(j), Errc::format_error, "added_tokens[0]");
  j = valid();
  j["added_tokens"][0]["content"] = "";
  EXPECT_ERR(load(j), Errc::format_error, "added_tokens[0].content");
  j = valid();
  j["model"]["unk_token"] = "<nope>";
  EXPECT_ERR(load(j), Errc::format_error, "model.unk_token");
}

TEST(BpeJsonErrors, MergeProblems) {
  json j = valid();
  j["model"]["merges"][0] = json::array({"zzz-unknown", "q"});
  EXPECT_ERR(load(j), Errc::format_error, "merge 0");
  j = valid();
  j["model"]["merges"][1] = "nospace";
  EXPECT_ERR(load(j), Errc::format_error, "model.merges[1]");
  j = valid();
  j["model"]["merges"][2] = 42;
  EXPECT_ERR(load(j), Errc::format_error, "model.merges[2]");
  j = valid();
  j["model"]["merges"][3] = "a z";  // both tokens exist, their concatenation does not
  EXPECT_ERR(load(j), Errc::format_error, "not in the vocabulary");
  j = valid();
  j["model"]["merges"] = "a b";
  EXPECT_ERR(load(j), Errc::format_error, "model.merges");
}

TEST(BpeJsonErrors, UnknownComponentsAndBadRegexes) {
  json j = valid();
  j["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  EXPECT_ERR(load(j), Errc::unsupported, "BertPreTokenizer");
  j = valid();
  j["normalizer"] = {{"type", "BertNormalizer"}};
  EXPECT_ERR(load(j), Errc::unsupported, "BertNormalizer");
  j = valid();
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_ERR(load(j), Errc::unsupported, "WordPiece");
  j = valid();
  j["post_processor"] = {{"type", "BertProcessing"}};
  EXPECT_ERR(load(j), Errc::unsupported, "BertProcessing");
  j = valid();
  j["post_processor"] = {{"type", "RobertaProcessing"}};  // CLIP's; cls / sep are required
  EXPECT_ERR(load(j), Errc::format_error, "post_processor.cls");
  j = valid();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(unclosed"}};
  EXPECT_ERR(load(j), Errc::parse_error, "pre_tokenizer.pretokenizers[0].pattern");
  j = valid();
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  EXPECT_ERR(load(j), Errc::format_error, "Sideways");
  j = valid();
  j["pre_tokenizer"]["pretokenizers"][0]["invert"] = "yes";
  EXPECT_ERR(load(j), Errc::format_error, "invert");
  j = valid();
  j["model"]["byte_fallback"] = 1;
  EXPECT_ERR(load(j), Errc::format_error, "model.byte_fallback");
  j = valid();
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", json::array({{{"SpecialToken", {{"id", "<nope>"}, {"type_id", 0}}}},
                                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})}};
  EXPECT_ERR(load(j), Errc::format_error, "<nope>");
}

// GGUF metadata of a "gpt2" vocabulary, broken one key at a time.
Result<BpeVocab> gguf_vocab(const std::function<void(weights::GgufWriter&)>& edit) {
  weights::GgufWriter w;
  weights::write_bpe_vocab_to_gguf(w, generate_bpe_vocab(300, "gpt-2", {"<|endoftext|>"}, 2));
  edit(w);
  auto bytes = w.serialize();
  if (!bytes) return fail(std::move(bytes).error());
  auto f = weights::GgufFile::parse(weights::testing::as_bytes(*bytes), "bad.gguf");
  if (!f) return fail(std::move(f).error());
  return weights::bpe_vocab_from_gguf(*f);
}

TEST(GgufBpeErrors, InconsistentMetadataIsAFormatError) {
  using weights::GgufType;
  using weights::GgufValue;
  ASSERT_TRUE(gguf_vocab([](auto&) {}).ok());
  EXPECT_ERR(gguf_vocab([](auto& w) { w.set("tokenizer.ggml.model", GgufValue::of_string("bert")); }),
             Errc::unsupported, "bert");
  EXPECT_ERR(gguf_vocab([](auto& w) { w.erase("tokenizer.ggml.model"); }), Errc::format_error,
             "tokenizer.ggml.model");
  EXPECT_ERR(gguf_vocab([](auto& w) { w.set("tokenizer.ggml.tokens", GgufValue::of_i32s(std::vector<int>{1, 2})); }),
             Errc::format_error, "tokenizer.ggml.tokens");
  EXPECT_ERR(gguf_vocab([](auto& w) { w.set("tokenizer.ggml.token_type", GgufValue::of_i32s(std::vector<int>{1})); }),
             Errc::format_error, "tokenizer.ggml.token_type");
  EXPECT_ERR(gguf_vocab([](auto& w) {
               std::vector<int> t(300, 1);
               t[7] = 9;
               w.set("tokenizer.ggml.token_type", GgufValue::of_i32s(t));
             }),
             Errc::format_error, "element 7");
  EXPECT_ERR(gguf_vocab([](auto& w) { w.erase("tokenizer.ggml.merges"); }), Errc::format_error,
             "tokenizer.ggml.merges");
  EXPECT_ERR(gguf_vocab([](auto& w) { w.set("tokenizer.ggml.merges", GgufValue::of_strings({"nospace"})); }),
             Errc::format_error, "tokenizer.ggml.merges");
  EXPECT_ERR(gguf_vocab([](auto& w) {
               w.set("tokenizer.ggml.bos_token_id", GgufValue::of_uint(GgufType::u32, 300));
             }),
             Errc::format_error, "tokenizer.ggml.bos_token_id");
  EXPECT_ERR(gguf_vocab([](auto& w) { w.set("tokenizer.ggml.add_bos_token", GgufValue::of_string("yes")); }),
             Errc::format_error, "tokenizer.ggml.add_bos_token");
  EXPECT_ERR(gguf_vocab([](auto& w) { w.set("tokenizer.ggml.pre", GgufValue::of_bool(true)); }), Errc::format_error,
             "tokenizer.ggml.pre");
  // Readable metadata whose spellings are wrong fails in the tokenizer.
  auto v = gguf_vocab([](auto& w) { w.set("tokenizer.ggml.merges", GgufValue::of_strings({"q zzz"})); });
  ASSERT_TRUE(v.ok());
  EXPECT_ERR(Tokenizer::from_bpe_vocab(*v, "bad.gguf"), Errc::format_error, "merge 0");
  v = gguf_vocab([](auto&) {});
  v->tokens[40] = std::string("\xC3", 1);
  EXPECT_ERR(Tokenizer::from_bpe_vocab(*v, "bad.gguf"), Errc::format_error, "token 40");
  v = gguf_vocab([](auto&) {});
  v->tokens[41] = v->tokens[42];
  EXPECT_ERR(Tokenizer::from_bpe_vocab(*v, "bad.gguf"), Errc::format_error, "bad.gguf");
}

TEST(BpeJsonMutations, ThousandsOfMutationsNeverCrash) {
  const std::string base = valid().dump();
  std::mt19937_64 rng(1234);
  int loaded = 0;
  const int kRounds = 3000;
  for (int round = 0; round < kRounds; ++round) {
    std::string s = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const std::size_t at = rng() % s.size();
      switch (rng() % 5) {
        case 0:
          s[at] = static_cast<char>(rng() & 0xFF);
          break;
        case 1:
          s.erase(at, 1 + rng() % 16);
          break;
        case 2:
          s.insert(at, std::string(1 + rng() % 4, "{}[]\",:0-9e\\ "[rng() % 13]));
          break;
        case 3: {
          const std::size_t from = rng() % s.size();
          s.insert(at, s.substr(from, 1 + rng() % 64));
          break;
        }
        default: {  // swap two digits (ids) or quotes
          const std::size_t other = rng() % s.size();
          std::swap(s[at], s[other]);
        }
      }
    }
    auto t = Tokenizer::from_hf_json(s, "mutant");
    if (!t.ok()) {
      EXPECT_FALSE(t.error().message.empty());
      continue;
    }
    ++loaded;
    const auto ids = t->encode("Hello <|eot_id|> w\xC3\xB6rld 12345 \xF0\x9F\x98\x80\n\n", EncodeOptions{true, true, true});
    (void)t->decode(ids);
    (void)stream_decode(*t, ids);
  }
  std::printf("[ mutation ] %d of %d mutants loaded and encoded\n", loaded, kRounds);
}

TEST(BpeJsonMutations, StructuredMutationsGiveTypedErrorsOrWorkingTokenizers) {
  const json base = valid();
  std::vector<std::string> keys;
  for (const auto& [k, v] : base["model"]["vocab"].items()) keys.push_back(k);
  std::mt19937_64 rng(99);
  int loaded = 0;
  for (int round = 0; round < 1000; ++round) {
    json j = base;
    for (int e = 0; e < 1 + static_cast<int>(rng() % 3); ++e) {
      switch (rng() % 6) {
        case 0:
          j["model"]["vocab"][keys[rng() % keys.size()]] = static_cast<int>(rng() % 310) - 5;
          break;
        case 1: {
          auto& m = j["model"]["merges"];
          m[rng() % m.size()] = json::array({keys[rng() % keys.size()], keys[rng() % keys.size()]});
          break;
        }
        case 2:
          j["model"]["ignore_merges"] = rng() % 2 == 0;
          j["model"]["byte_fallback"] = rng() % 2 == 0;
          break;
        case 3:
          j["added_tokens"][rng() % 2]["id"] = static_cast<int>(rng() % 320);
          j["added_tokens"][rng() % 2]["lstrip"] = rng() % 2 == 0;
          j["added_tokens"][rng() % 2]["rstrip"] = rng() % 2 == 0;
          break;
        case 4:
          j["pre_tokenizer"]["pretokenizers"][0]["behavior"] =
              std::vector<std::string>{"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"}
                  [rng() % 5];
          j["pre_tokenizer"]["pretokenizers"][0]["invert"] = rng() % 2 == 0;
          break;
        default:
          j["model"]["merges"].erase(rng() % j["model"]["merges"].size());
      }
    }
    auto t = load(j);
    if (!t.ok()) {
      EXPECT_TRUE(t.error().code == Errc::format_error || t.error().code == Errc::unsupported) << t.error().message;
      continue;
    }
    ++loaded;
    const auto ids = t->encode("Hello <|eot_id|> w\xC3\xB6rld 12345\n", EncodeOptions{true, false, true});
    for (TokenId id : ids) ASSERT_TRUE(id >= 0 && id < t->vocab_size());
    EXPECT_EQ(stream_decode(*t, ids), t->decode(ids));
  }
  std::printf("[ mutation ] %d of 1000 structured mutants loaded\n", loaded);
}

}  // namespace
}  // namespace tandem::tok::testing
