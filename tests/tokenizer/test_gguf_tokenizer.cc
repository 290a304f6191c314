// The SentencePiece tokenizer rebuilt from GGUF metadata (weights/gguf_model.h) and loaded by the native tokenizer:
// llama.cpp's llama-spm test vocabulary against the Hugging Face ids in its .out file, the gguf-tiny models' prompt,
// the same vocabulary as the Llama 2 tokenizer.model, and a generated vocabulary. Real files come from ../shared
// (or TANDEM_SHARED_DIR); those tests skip when it is absent.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "../weights/gguf_test_util.h"
#include "bpe_test_util.h"
#include "../weights/test_util.h"
#include "tokenizer/tokenizer.h"
#include "weights/gguf.h"
#include "weights/gguf_model.h"
#include "weights/model_dir.h"

namespace tandem {
namespace {

using weights::testing::shared_dir;

Result<tok::Tokenizer> tokenizer_of(const std::string& gguf_path) {
  auto f = weights::GgufFile::open(gguf_path);
  if (!f) return fail(std::move(f).error());
  auto bytes = weights::sentencepiece_model_from_gguf(*f);
  if (!bytes) return fail(std::move(bytes).error());
  return tok::Tokenizer::from_bytes(*bytes, gguf_path);
}

// llama.cpp's vocabulary test files (.inp cases, .out ids): read_cases in bpe_test_util.h.
using tok::testing::read_cases;
using tok::testing::slurp;

class GgufVocab : public ::testing::TestWithParam<const char*> {};

TEST_P(GgufVocab, EncodesEveryCaseAsTheReference) {
  const std::string base = shared_dir() + "/models/vocab/ggml-vocab-" + GetParam() + ".gguf";
  SKIP_WITHOUT(base);
  auto t = tokenizer_of(base);
  ASSERT_TRUE(t.ok()) << t.error().message;
  const auto cases = read_cases(base);
  ASSERT_EQ(cases.size(), 46u);
  int passed = 0;
  for (const auto& c : cases) {
    const auto ids = t->encode(c.text);
    EXPECT_EQ(ids, c.ids) << "text: '" << c.text << "'";
    passed += ids == c.ids ? 1 : 0;
  }
  RecordProperty("cases_passed", passed);
}

INSTANTIATE_TEST_SUITE_P(Spm, GgufVocab, ::testing::Values("llama-spm", "phi-3"),
                         [](const auto& info) { return std::string(info.param) == "phi-3" ? "phi3" : "llama_spm"; });

TEST(GgufVocab, BpeVocabularyIsNotASentencePieceModel) {
  const std::string path = shared_dir() + "/models/vocab/ggml-vocab-gpt-2.gguf";
  SKIP_WITHOUT(path);
  auto t = tokenizer_of(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code, Errc::unsupported);
  EXPECT_NE(t.error().message.find("bpe_vocab_from_gguf"), std::string::npos) << t.error().message;
}

TEST(GgufVocab, SameVocabularyAsTheLlama2TokenizerModel) {
  const std::string gguf = shared_dir() + "/models/vocab/ggml-vocab-llama-spm.gguf";
  const std::string model = shared_dir() + "/models/llama2-tokenizer/tokenizer.model";
  SKIP_WITHOUT(gguf);
  SKIP_WITHOUT(model);
  auto a = tokenizer_of(gguf);
  auto b = tok::Tokenizer::load_file(model);
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_TRUE(b.ok()) << b.error().message;
  ASSERT_EQ(a->vocab_size(), b->vocab_size());
  int differ = 0;
  for (tok::TokenId id = 0; id < a->vocab_size(); ++id) {
    if (a->piece(id) != b->piece(id) || a->type(id) != b->type(id) || a->score(id) != b->score(id)) ++differ;
  }
  EXPECT_EQ(differ, 0);
  EXPECT_EQ(a->bos_id(), b->bos_id());
  EXPECT_EQ(a->eos_id(), b->eos_id());
  EXPECT_EQ(a->unk_id(), b->unk_id());
  EXPECT_EQ(a->pad_id(), b->pad_id());
  EXPECT_EQ(a->add_dummy_prefix(), b->add_dummy_prefix());
  for (const auto& c : read_cases(gguf)) EXPECT_EQ(a->encode(c.text, true), b->encode(c.text, true)) << c.text;
}

TEST(GgufTiny, ModelTokenizerEncodesTheReadmePrompt) {
  for (const char* name : {"f16", "Q8_0", "Q4_0", "Q4_K_M"}) {
    const std::string path = shared_dir() + "/models/gguf-tiny/shared256-" + name + ".gguf";
    SKIP_WITHOUT(path);
    auto m = weights::ModelDir::open(path);
    ASSERT_TRUE(m.ok()) << m.error().message;
    auto bytes = m->tokenizer_bytes();
    ASSERT_TRUE(bytes.ok()) << bytes.error().message;
    auto t = tok::Tokenizer::from_bytes(*bytes, path);
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_EQ(t->vocab_size(), 32000);
    EXPECT_EQ(t->bos_id(), 1);
    EXPECT_EQ(t->eos_id(), 2);
    EXPECT_EQ(t->encode("Hello world, once upon a time"),
              (std::vector<tok::TokenId>{15043, 3186, 29892, 2748, 2501, 263, 931}))
        << name;
    EXPECT_EQ(t->encode("Hello world, once upon a time", m->tokenizer_settings().add_bos_token.value_or(false)).at(0),
              1);
    EXPECT_EQ(t->decode(t->encode("Hello world, once upon a time")), "Hello world, once upon a time");
  }
}

TEST(GgufTokenizer, GeneratedVocabulary) {
  weights::testing::TempDir dir;
  ASSERT_TRUE(weights::testing::tiny_gguf().write(dir / "m.gguf").ok());
  auto m = weights::ModelDir::open(dir / "m.gguf");
  ASSERT_TRUE(m.ok()) << m.error().message;
  auto bytes = m->tokenizer_bytes();
  ASSERT_TRUE(bytes.ok()) << bytes.error().message;
  auto t = tok::Tokenizer::from_bytes(*bytes, "tiny");
  ASSERT_TRUE(t.ok()) << t.error().message;
  using weights::testing::tiny_vocab_id;
  EXPECT_EQ(t->encode("hello world"),
            (std::vector<tok::TokenId>{tiny_vocab_id("\xE2\x96\x81hello"), tiny_vocab_id("\xE2\x96\x81world")}));
  // Byte fallback for characters outside the vocabulary: "Z" is <0x5A> (id 3 + 0x5A).
  EXPECT_EQ(t->encode("Z"), (std::vector<tok::TokenId>{tiny_vocab_id("\xE2\x96\x81"), 3 + 0x5A}));
  EXPECT_EQ(t->unk_id(), 0);

  // add_space_prefix = false reaches the normalizer.
  auto w = weights::testing::tiny_gguf();
  w.set("tokenizer.ggml.add_space_prefix", weights::GgufValue::of_bool(false));
  ASSERT_TRUE(w.write(dir / "n.gguf").ok());
  auto m2 = weights::ModelDir::open(dir / "n.gguf");
  ASSERT_TRUE(m2.ok());
  auto t2 = tok::Tokenizer::from_bytes(*m2->tokenizer_bytes(), "tiny-nospace");
  ASSERT_TRUE(t2.ok()) << t2.error().message;
  EXPECT_FALSE(t2->add_dummy_prefix());
  EXPECT_EQ(t2->encode("hello"),
            (std::vector<tok::TokenId>{tiny_vocab_id("h"), tiny_vocab_id("e"), tiny_vocab_id("llo")}));
}

}  // namespace
}  // namespace tandem
