// convert_to_gguf of Hugging Face directories whose tokenizer is a byte-level BPE tokenizer.json, read by the
// converter itself (tok::bpe_vocab_from_hf_json): the qwen2 and llama3 presets converted without passing their
// vocabulary give the same prompt ids (plain text and chat) and the same greedy tokens as the directory; a
// SentencePiece-style tokenizer.json next to tokenizer.model falls back to tokenizer.model; a tokenizer.json with a
// pre-tokenizer llama.cpp has no name for is a typed error.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../tokenizer/bpe_test_util.h"
#include "model_fixture.h"
#include "modelgen/gguf_convert.h"
#include "weights/gguf.h"

namespace tandem {
namespace {

using testing::greedy;

using testing::load;
using testing::max_abs_diff;

std::string gguf_string(const std::string& path, const std::string& key) {
  auto f = weights::GgufFile::open(path);
  if (!f.ok()) return "<" + f.error().message + ">";
  const weights::GgufValue* v = f->find(key);
  return v == nullptr ? "<absent>" : v->str;
}

std::string write_bpe_dir(const std::string& preset, const std::string& name) {
  modelgen::Options o;
  o.shape = *modelgen::preset(preset);
  o.bpe = modelgen::preset_bpe_vocab(preset);
  EXPECT_TRUE(o.bpe);
  const std::string hf = testing::temp_root() + "/" + name;
  auto st = modelgen::write_model(hf, o);
  EXPECT_TRUE(st.ok()) << st.error().message;
  return hf;
}

TEST(ConvertBpe, TokenizerJsonDirectoriesConvertWithoutAVocabularyAndMatchTheDirectory) {
  for (const char* preset : {"qwen2", "llama3"}) {
    SCOPED_TRACE(preset);
    const std::string hf = write_bpe_dir(preset, std::string("convert-bpe-") + preset);
    ASSERT_TRUE(std::filesystem::exists(hf + "/tokenizer.json"));
    ASSERT_FALSE(std::filesystem::exists(hf + "/tokenizer.model"));
    const std::string gguf = hf + ".gguf";
    auto st = modelgen::convert_to_gguf(hf, gguf, modelgen::Recipe::f32);  // no vocabulary passed in
    ASSERT_TRUE(st.ok()) << st.error().message;
    EXPECT_EQ(gguf_string(gguf, "tokenizer.ggml.model"), "gpt2");
    EXPECT_EQ(gguf_string(gguf, "tokenizer.ggml.pre"), std::string(preset) == "qwen2" ? "qwen2" : "llama-bpe");

    auto a = load(hf), b = load(gguf);
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->add_bos(), b->add_bos());
    EXPECT_EQ(a->eos_ids(), b->eos_ids());
    EXPECT_EQ(a->tokenizer().eot_id(), b->tokenizer().eot_id());
    for (const char* text : {"Hello world, once upon a time: 42 cats!", "  indented\n\tcode(x) == 12345;\n",
                             "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 <|im_end|> <|eot_id|> don't"}) {
      EXPECT_EQ(a->encode_text(text), b->encode_text(text)) << text;
    }
    const std::vector<gen::Message> chat = {{"system", "You are terse."},
                                            {"user", "What is 12 + 30? Say <|im_start|> if unsure."},
                                            {"assistant", "42."},
                                            {"user", "Thanks!"}};
    auto ca = a->encode_chat(chat), cb = b->encode_chat(chat);
    ASSERT_TRUE(ca.ok() && cb.ok());
    EXPECT_EQ(*ca, *cb);
    EXPECT_GT(ca->size(), 10u);
    std::vector<float> la, lb;
    const auto ga = greedy(*a, *ca, 16, &la), gb = greedy(*b, *cb, 16, &lb);
    EXPECT_EQ(ga.size(), 16u);
    EXPECT_EQ(ga, gb);
    EXPECT_LT(max_abs_diff(la, lb), 1e-4f);
  }
}

TEST(ConvertBpe, SentencePieceStyleTokenizerJsonFallsBackToTokenizerModel) {
  const std::string hf = testing::make_model("convert-bpe-sp", "test");
  ASSERT_TRUE(std::filesystem::exists(hf + "/tokenizer.model"));
  {
    auto sp = tok::Tokenizer::load_file(hf + "/tokenizer.model");
    ASSERT_TRUE(sp.ok()) << sp.error().message;
    std::ofstream(hf + "/tokenizer.json") << tok::testing::llama2_style_json(*sp);
  }
  const std::string gguf = hf + ".gguf";
  auto st = modelgen::convert_to_gguf(hf, gguf, modelgen::Recipe::f32);
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_EQ(gguf_string(gguf, "tokenizer.ggml.model"), "llama");
  auto a = load(hf), b = load(gguf);
  ASSERT_TRUE(a && b);
  for (const char* text : {"Hello world, once upon a time: 42 cats!", " two  spaces and caf\xC3\xA9"}) {
    EXPECT_EQ(a->encode_text(text), b->encode_text(text)) << text;
  }
}

TEST(ConvertBpe, TokenizerJsonWithoutAPreNameIsATypedError) {
  const std::string hf = write_bpe_dir("qwen2", "convert-bpe-unknown-pre");
  nlohmann::json j;
  {
    std::ifstream in(hf + "/tokenizer.json");
    j = nlohmann::json::parse(in);
  }
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{L}+|\\p{N}{1,2}";
  std::ofstream(hf + "/tokenizer.json") << j.dump();
  auto st = modelgen::convert_to_gguf(hf, hf + ".gguf", modelgen::Recipe::f32);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, Errc::unsupported) << st.error().message;
  EXPECT_NE(st.error().message.find("matches none of llama.cpp's pre names"), std::string::npos)
      << st.error().message;
  EXPECT_NE(st.error().message.find("tokenizer.json"), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find("no tokenizer.model"), std::string::npos) << st.error().message;
  EXPECT_FALSE(std::filesystem::exists(hf + ".gguf"));
}

}  // namespace
}  // namespace tandem
