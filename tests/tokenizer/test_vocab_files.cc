// llama.cpp's four tokenizer test vocabularies (../shared/models/vocab: gpt-2 and deepseek-coder byte-level BPE,
// llama-spm and phi-3 SentencePiece) against the Hugging Face ids in their .out files: through the GGUF path, and
// through tokenizer.json files written from the same vocabularies (hf_json_from_bpe_vocab for the BPE ones, a
// Llama-2-style file for the SentencePiece ones). Round-trip and streaming decoding of every case. Skipped when
// ../shared is absent. Each test prints its pass count.
#include <gtest/gtest.h>

#include "bpe_test_util.h"

namespace tandem::tok::testing {
namespace {

const char* const kVocabs[] = {"gpt-2", "deepseek-coder", "llama-spm", "phi-3"};

std::string test_name(const ::testing::TestParamInfo<const char*>& info) {
  std::string s = info.param;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

struct Tally {
  int passed = 0;
  int total = 0;
};

Tally check_cases(const Tokenizer& t, const std::vector<VocabCase>& cases, const std::string& label) {
  Tally tally;
  for (const auto& c : cases) {
    const auto ids = t.encode(c.text);
    EXPECT_EQ(ids, c.ids) << label << " text: '" << c.text << "'";
    tally.passed += ids == c.ids ? 1 : 0;
    ++tally.total;
  }
  std::printf("[ vocab    ] %-34s %d/%d cases pass\n", label.c_str(), tally.passed, tally.total);
  return tally;
}

class VocabFile : public ::testing::TestWithParam<const char*> {};

TEST_P(VocabFile, EveryCaseEncodesAsHuggingFaceThroughGguf) {
  const std::string path = vocab_path(GetParam());
  SKIP_WITHOUT(path);
  auto t = gguf_tokenizer(path);
  ASSERT_TRUE(t.ok()) << t.error().message;
  const auto cases = read_cases(path);
  ASSERT_EQ(cases.size(), 46u);
  const Tally tally = check_cases(*t, cases, std::string(GetParam()) + " (GGUF)");
  RecordProperty("cases_passed", tally.passed);
  EXPECT_EQ(tally.passed, 46);
}

TEST_P(VocabFile, EveryCaseEncodesAsHuggingFaceThroughTokenizerJson) {
  const std::string path = vocab_path(GetParam());
  SKIP_WITHOUT(path);
  std::string json;
  const bool bpe = std::string(GetParam()) == "gpt-2" || std::string(GetParam()) == "deepseek-coder";
  if (bpe) {
    auto f = weights::GgufFile::open(path);
    ASSERT_TRUE(f.ok()) << f.error().message;
    auto v = weights::bpe_vocab_from_gguf(*f);
    ASSERT_TRUE(v.ok()) << v.error().message;
    json = hf_json_from_bpe_vocab(*v);
  } else {
    auto sp = gguf_tokenizer(path);
    ASSERT_TRUE(sp.ok()) << sp.error().message;
    json = llama2_style_json(*sp);
  }
  auto t = Tokenizer::from_hf_json(json, std::string(GetParam()) + "/tokenizer.json");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->kind(), TokenizerKind::bpe);
  EXPECT_EQ(t->model_bytes(), json);
  const auto cases = read_cases(path);
  ASSERT_EQ(cases.size(), 46u);
  const Tally tally = check_cases(*t, cases, std::string(GetParam()) + " (tokenizer.json)");
  RecordProperty("cases_passed", tally.passed);
  EXPECT_EQ(tally.passed, 46);
  for (const auto& c : cases) {  // the tokenizer.json decoders give the text back too
    EXPECT_EQ(t->decode(c.ids), c.text);
    EXPECT_EQ(stream_decode(*t, c.ids), c.text);
  }
}

// Decoding the reference ids gives every case's text back exactly (all four vocabularies), and a StreamDecoder
// fed one id at a time gives the same text as decode().
TEST_P(VocabFile, DecodingRoundTripsAndStreamingEqualsWholeDecoding) {
  const std::string path = vocab_path(GetParam());
  SKIP_WITHOUT(path);
  auto t = gguf_tokenizer(path);
  ASSERT_TRUE(t.ok()) << t.error().message;
  int exact = 0;
  int total = 0;
  for (const auto& c : read_cases(path)) {
    const std::string whole = t->decode(c.ids);
    EXPECT_EQ(stream_decode(*t, c.ids), whole) << c.text;
    const std::string& expect = c.text;
    EXPECT_EQ(whole, expect);
    exact += whole == expect ? 1 : 0;
    ++total;
  }
  std::printf("[ vocab    ] %-34s %d/%d cases decode back\n", GetParam(), exact, total);
}

INSTANTIATE_TEST_SUITE_P(Shared, VocabFile, ::testing::ValuesIn(kVocabs), test_name);

}  // namespace
}  // namespace tandem::tok::testing
