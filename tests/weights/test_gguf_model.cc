// ModelDir over GGUF files: llama.cpp's own files from ../shared (skipped when absent) and models generated with
// GgufWriter (every mapping rule and its failures).
#include <gtest/gtest.h>

#include <filesystem>

#include "gguf_test_util.h"
#include "test_util.h"
#include "weights/gguf_model.h"
#include "weights/model_dir.h"

namespace tandem::weights {
namespace {

using kernels::WType;
using testing::RawTensor;
using testing::TempDir;
using testing::tiny_gguf;
using testing::TinyShape;

std::string tiny_path() { return testing::shared_dir() + "/models/gguf-tiny"; }

struct RealCase {
  const char* file;
  const char* summary;
  WType embd;
  WType q;
  WType output;
  DType dtype;
};

class RealGguf : public ::testing::TestWithParam<RealCase> {};

TEST_P(RealGguf, OpensWithConfigTypesAndViews) {
  const RealCase& rc = GetParam();
  const std::string path = tiny_path() + "/" + rc.file;
  SKIP_WITHOUT(path);
  auto m = ModelDir::open(path);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->format(), ModelDir::Format::gguf);
  EXPECT_EQ(m->model_path(), path);
  EXPECT_EQ(m->tokenizer_path(), "");
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.intermediate_size, 768);
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_NEAR(c.rms_norm_eps, 1e-5, 1e-9);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rope_scaling, RopeScaling::none);
  EXPECT_TRUE(c.rope_interleaved);
  EXPECT_TRUE(c.rope_freq_factors.empty());
  EXPECT_EQ(c.bos_token_ids, std::vector<int>{1});
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{2});
  EXPECT_EQ(m->generation().eos_token_ids, std::vector<int>{2});
  EXPECT_EQ(m->tokenizer_settings().add_bos_token, std::optional<bool>(true));
  EXPECT_EQ(m->tokenizer_settings().add_eos_token, std::optional<bool>(false));
  EXPECT_EQ(m->type_summary(), rc.summary);
  EXPECT_EQ(m->dtype(), rc.dtype);

  const MappedFile* mf = m->mapped_files().at(0);
  ASSERT_NE(mf, nullptr);
  auto check = [&](const char* name, std::vector<std::int64_t> shape, WType type) {
    const TensorView* t = m->tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape, shape) << name;
    EXPECT_EQ(t->type, type) << name;
    EXPECT_TRUE(t->type_supported);
    EXPECT_EQ(t->data.size(),
              kernels::row_bytes(type, shape.back()) * static_cast<std::size_t>(shape.size() == 2 ? shape[0] : 1))
        << name;
    // Zero-copy: the view points into the mapping.
    EXPECT_GE(t->data.data(), mf->data()) << name;
    EXPECT_LE(t->data.data() + t->data.size(), mf->data() + mf->size()) << name;
  };
  check("model.embed_tokens.weight", {32000, 256}, rc.embd);
  check("model.layers.0.self_attn.q_proj.weight", {256, 256}, rc.q);
  check("model.layers.1.self_attn.k_proj.weight", {128, 256}, rc.q);
  // Q4_K_M keeps some layers' attn_v / ffn_down in q6_K (llama.cpp's recipe): here layer 1's.
  const bool k_m = std::string(rc.file).find("Q4_K_M") != std::string::npos;
  check("model.layers.0.mlp.down_proj.weight", {256, 768}, rc.q);
  check("model.layers.1.mlp.down_proj.weight", {256, 768}, k_m ? WType::q6_K : rc.q);
  check("model.layers.1.self_attn.v_proj.weight", {128, 256}, k_m ? WType::q6_K : rc.q);
  check("model.layers.1.input_layernorm.weight", {256}, WType::f32);
  check("model.norm.weight", {256}, WType::f32);
  check("lm_head.weight", {32000, 256}, rc.output);
  EXPECT_EQ(m->tensor("token_embd.weight"), nullptr);  // renamed

  auto tok = m->tokenizer_bytes();
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_GT(tok->size(), 32000u * 8);
  EXPECT_EQ(m->header_digest().size(), 64u);
}

INSTANTIATE_TEST_SUITE_P(
    GgufTiny, RealGguf,
    ::testing::Values(
        RealCase{"shared256-f16.gguf", "f32:5,f16:16", WType::f16, WType::f16, WType::f16, DType::f16},
        RealCase{"shared256-Q8_0.gguf", "f32:5,q8_0:16", WType::q8_0, WType::q8_0, WType::q8_0, DType::f32},
        RealCase{"shared256-Q4_0.gguf", "f32:5,q4_0:15,q6_K:1", WType::q4_0, WType::q4_0, WType::q6_K, DType::f32},
        RealCase{"shared256-Q4_K_M.gguf", "f32:5,q4_K:13,q6_K:3", WType::q4_K, WType::q4_K, WType::q6_K, DType::f32}),
    [](const auto& info) {
      std::string n = info.param.file;
      n = n.substr(10, n.size() - 15);  // "shared256-" ... ".gguf"
      return n;
    });

TEST(RealGguf, DirectoryOfOneFileAndHeaderDigest) {
  const std::string src = tiny_path() + "/shared256-Q8_0.gguf";
  SKIP_WITHOUT(src);
  TempDir dir;
  std::filesystem::create_symlink(src, dir / "model.gguf");
  auto a = ModelDir::open(dir.path());
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->model_path(), dir / "model.gguf");
  auto b = ModelDir::open(src);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->header_digest(), b->header_digest());  // the file name is not part of the identity
  EXPECT_EQ(a->content_digest(), b->content_digest());
}

// --- generated models ---------------------------------------------------------------------------------------------

Result<ModelDir> open_written(const TempDir& dir, const GgufWriter& w, const std::string& name = "m.gguf") {
  const Status st = w.write(dir / name);
  if (!st.ok()) return fail(st.error());
  return ModelDir::open(dir / name);
}

TEST(GgufModel, GeneratedModelMapsNamesShapesAndTypes) {
  TempDir dir;
  auto m = open_written(dir, tiny_gguf(WType::f16));
  ASSERT_TRUE(m.ok()) << m.error().message;
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.hidden_size, 32);
  EXPECT_EQ(c.intermediate_size, 64);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.num_heads, 2);
  EXPECT_EQ(c.num_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.vocab_size, static_cast<int>(testing::tiny_vocab().size()));
  EXPECT_EQ(c.max_position_embeddings, 128);
  EXPECT_TRUE(c.rope_interleaved);
  EXPECT_EQ(m->dtype(), DType::f16);
  EXPECT_EQ(m->type_summary(), "f32:5,f16:16");
  EXPECT_EQ(m->config_text(), "");
  // Every required tensor is there under its HF name, with the GGUF bytes.
  for (const auto& [name, shape] : ModelDir::required_tensors(c)) {
    const TensorView* t = m->tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape, shape) << name;
    const auto gname = gguf_name_from_hf(name);
    ASSERT_TRUE(gname.has_value()) << name;
    const GgufTensorInfo* gi = m->gguf()->find_tensor(*gname);
    ASSERT_NE(gi, nullptr) << *gname;
    EXPECT_EQ(t->data.data(), m->gguf()->raw_tensor_bytes(*gi).data()) << name;
    EXPECT_EQ(t->dtype, shape.size() == 1 ? DType::f32 : DType::f16) << name;
  }
  EXPECT_EQ(m->weight_bytes(), [&] {
    std::uint64_t n = 0;
    for (const auto& t : m->tensors()) n += t.data.size();
    return n;
  }());
  // Digests: stable across opens, different for different bytes.
  auto again = ModelDir::open(dir / "m.gguf");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->header_digest(), m->header_digest());
  EXPECT_EQ(again->content_digest(), m->content_digest());
  auto other = open_written(dir, tiny_gguf(WType::f32), "other.gguf");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->header_digest(), m->header_digest());
  EXPECT_NE(other->content_digest(), m->content_digest());
}

TEST(GgufModel, QuantizedTiedAndBf16) {
  TempDir dir;
  auto q = open_written(dir, tiny_gguf(WType::q8_0, /*tied=*/true));
  ASSERT_TRUE(q.ok()) << q.error().message;
  EXPECT_TRUE(q->config().tie_word_embeddings);
  EXPECT_EQ(q->tensor("lm_head.weight"), nullptr);
  EXPECT_EQ(q->type_summary(), "f32:5,q8_0:15");
  EXPECT_EQ(q->dtype(), DType::f32);  // quantized: what dequantized weights become
  const TensorView* e = q->tensor("model.embed_tokens.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dtype, DType::u8);
  EXPECT_EQ(e->type, WType::q8_0);
  EXPECT_EQ(e->data.size(), kernels::row_bytes(WType::q8_0, 32) * testing::tiny_vocab().size());
  auto b = open_written(dir, tiny_gguf(WType::bf16), "b.gguf");
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(b->dtype(), DType::bf16);
  EXPECT_EQ(b->type_summary(), "f32:5,bf16:16");
}

TEST(GgufModel, DirectoryHoldingGgufFiles) {
  TempDir dir;
  ASSERT_TRUE(tiny_gguf().write(dir / "a.gguf").ok());
  auto one = ModelDir::open(dir.path() + "/");
  ASSERT_TRUE(one.ok()) << one.error().message;
  EXPECT_EQ(one->model_path(), dir / "a.gguf");
  EXPECT_EQ(one->dir(), dir.path());
  ASSERT_TRUE(tiny_gguf().write(dir / "b.gguf").ok());
  EXPECT_ERR(ModelDir::open(dir.path()), Errc::format_error, "a.gguf, b.gguf");
  // A config.json makes it a Hugging Face directory again (which then needs its own files).
  testing::write_file(dir / "config.json", testing::tiny_config().dump());
  EXPECT_ERR(ModelDir::open(dir.path()), Errc::not_found, "tokenizer.model");
  // An empty directory still reports the missing config.json.
  TempDir empty;
  EXPECT_ERR(ModelDir::open(empty.path()), Errc::not_found, "config.json");
  // A file that is not GGUF.
  testing::write_file(dir / "x.bin", "not a model");
  EXPECT_ERR(ModelDir::open(dir / "x.bin"), Errc::format_error, "not a GGUF file");
}

TEST(GgufModel, SafetensorsViewsCarryTypes) {
  TempDir dir;
  testing::write_model(dir);
  auto m = ModelDir::open(dir.path());
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->format(), ModelDir::Format::hf_dir);
  EXPECT_EQ(m->gguf(), nullptr);
  EXPECT_EQ(m->type_summary(), "f32:21");
  EXPECT_EQ(m->mapped_files().size(), 1u);
  EXPECT_EQ(m->tokenizer_path(), dir / "tokenizer.model");
  auto tb = m->tokenizer_bytes();
  ASSERT_TRUE(tb.ok());
  EXPECT_EQ(*tb, "not parsed here");
  for (const auto& t : m->tensors()) {
    EXPECT_EQ(t.type, WType::f32);
    EXPECT_TRUE(t.type_supported);
  }
  auto bf = testing::tensors_for(testing::tiny_config(), DType::bf16);
  TempDir d2;
  testing::write_model(d2, testing::tiny_config(), bf);
  auto m2 = ModelDir::open(d2.path());
  ASSERT_TRUE(m2.ok());
  EXPECT_EQ(m2->type_summary(), "bf16:21");
}

TEST(GgufModel, UnsupportedTypesOnExtraAndRequiredTensors) {
  TempDir dir;
  GgufWriter w = tiny_gguf();
  // An extra tensor of a ggml type Tandem does not compute with (iq2_xxs) and one of an unknown id.
  ASSERT_TRUE(w.add_tensor("extra.iq2.weight", 16, {256}, testing::pattern(66, 1)).ok());
  ASSERT_TRUE(w.add_tensor("extra.unknown.weight", 99, {7}, testing::pattern(40, 2)).ok());
  auto m = open_written(dir, w);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const TensorView* q2 = m->tensor("extra.iq2.weight");
  ASSERT_NE(q2, nullptr);
  EXPECT_FALSE(q2->type_supported);
  EXPECT_TRUE(q2->data.empty());
  EXPECT_ERR(m->gguf()->tensor_data(*m->gguf()->find_tensor("extra.iq2.weight")), Errc::unsupported, "iq2_xxs");
  EXPECT_ERR(m->gguf()->tensor_data(*m->gguf()->find_tensor("extra.unknown.weight")), Errc::unsupported,
             "ggml type 99");
  EXPECT_FALSE(m->gguf()->find_tensor("extra.unknown.weight")->size_known);

  // The same types on a required tensor: the model does not open.
  std::map<std::string, RawTensor> r{{"blk.1.attn_q.weight", RawTensor{99, {32, 32}, testing::pattern(100, 3)}}};
  auto bad = open_written(dir, tiny_gguf(WType::f32, false, {}, r), "bad.gguf");
  EXPECT_ERR(bad, Errc::unsupported, "'blk.1.attn_q.weight' has type ggml type 99");
  // A file that uses the HF name itself for a required tensor, in an unknown type.
  r = {{"output_norm.weight", RawTensor{0, {}, {}}}};
  GgufWriter literal = tiny_gguf(WType::f32, false, {}, r);
  ASSERT_TRUE(literal.add_tensor("model.norm.weight", 99, {32}, testing::pattern(64, 5)).ok());
  EXPECT_ERR(open_written(dir, literal, "lit.gguf"), Errc::unsupported, "'model.norm.weight' has type ggml type 99");
  // A norm in a block-quantized type.
  r = {{"blk.0.ffn_norm.weight", RawTensor{8, {32}, testing::pattern(34, 4)}}};
  EXPECT_ERR(open_written(dir, tiny_gguf(WType::f32, false, {}, r), "n.gguf"), Errc::unsupported,
             "'blk.0.ffn_norm.weight' has type q8_0; norm weights");
}

TEST(GgufModel, ShapeAndPresenceErrorsNameTheGgufTensor) {
  TempDir dir;
  std::map<std::string, RawTensor> r{{"blk.0.attn_k.weight", RawTensor{0, {32, 32}, testing::pattern(4096, 1)}}};
  EXPECT_ERR(open_written(dir, tiny_gguf(WType::f32, false, {}, r)), Errc::format_error,
             "'blk.0.attn_k.weight' has shape [32, 32] (HF order), expected [16, 32]");
  // A missing layer tensor: rename it.
  r = {{"blk.1.ffn_up.weight", RawTensor{0, {32, 64}, testing::pattern(32 * 64 * 4, 2)}}};
  GgufWriter w = tiny_gguf(WType::f32, false, {}, r);
  w.set("llama.block_count", GgufValue::of_uint(GgufType::u32, 3));
  EXPECT_ERR(open_written(dir, w, "x.gguf"), Errc::format_error,
             "required tensor 'blk.2.attn_norm.weight' (model.layers.2.input_layernorm.weight) [32] is missing");
  // Two GGUF names for one HF name.
  GgufWriter dup = tiny_gguf();
  ASSERT_TRUE(dup.add_tensor("model.norm.weight", WType::f32, {32}, testing::pattern(128, 5)).ok());
  EXPECT_ERR(open_written(dir, dup, "d.gguf"), Errc::format_error, "'output_norm.weight' also names");
  // Bias terms.
  GgufWriter bias = tiny_gguf();
  ASSERT_TRUE(bias.add_tensor("blk.0.attn_q.bias", WType::f32, {32}, testing::pattern(128, 6)).ok());
  EXPECT_ERR(open_written(dir, bias, "b.gguf"), Errc::unsupported, "'blk.0.attn_q.bias': bias terms");
}

TEST(GgufModel, MetadataRules) {
  TempDir dir;
  struct Case {
    const char* what;
    std::function<void(GgufWriter&)> edit;
    Errc code;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"architecture", [](GgufWriter& w) { w.set("general.architecture", GgufValue::of_string("gemma")); },
       Errc::unsupported, "general.architecture' \"gemma\" is not supported (supported: llama, qwen2, qwen3, phi3, gemma2, gemma3)"},
      {"qwen2 keys", [](GgufWriter& w) { w.set("general.architecture", GgufValue::of_string("qwen2")); },
       Errc::format_error, "'qwen2.embedding_length' is missing"},
      {"no architecture", [](GgufWriter& w) { w.erase("general.architecture"); }, Errc::format_error,
       "'general.architecture' is missing"},
      {"missing block count", [](GgufWriter& w) { w.erase("llama.block_count"); }, Errc::format_error,
       "'llama.block_count' is missing"},
      {"string as integer", [](GgufWriter& w) { w.set("llama.embedding_length", GgufValue::of_string("32")); },
       Errc::format_error, "'llama.embedding_length' must be an integer in [1, 65536], got \"32\""},
      {"kv heads", [](GgufWriter& w) { w.set("llama.attention.head_count_kv", GgufValue::of_uint(GgufType::u32, 3)); },
       Errc::format_error, "'llama.attention.head_count_kv' (3) must divide"},
      {"experts", [](GgufWriter& w) { w.set("llama.expert_count", GgufValue::of_uint(GgufType::u32, 8)); },
       Errc::unsupported, "mixture-of-experts"},
      {"eps",
       [](GgufWriter& w) { w.set("llama.attention.layer_norm_rms_epsilon", GgufValue::of_float(GgufType::f32, 0)); },
       Errc::format_error, "layer_norm_rms_epsilon' must be a number in (0, 1]"},
      {"partial rotary",
       [](GgufWriter& w) { w.set("llama.rope.dimension_count", GgufValue::of_uint(GgufType::u32, 8)); },
       Errc::unsupported, "partial rotary"},
      {"yarn", [](GgufWriter& w) { w.set("llama.rope.scaling.type", GgufValue::of_string("yarn")); }, Errc::unsupported,
       "'llama.rope.scaling.type' \"yarn\" is not supported"},
      {"linear without factor", [](GgufWriter& w) { w.set("llama.rope.scaling.type", GgufValue::of_string("linear")); },
       Errc::format_error, "rope.scaling.factor' is missing"},
      {"vocab size", [](GgufWriter& w) { w.set("llama.vocab_size", GgufValue::of_uint(GgufType::u32, 100)); },
       Errc::format_error, "'llama.vocab_size' (100) differs from the rows of token_embd.weight"},
      {"bos out of range",
       [](GgufWriter& w) { w.set("tokenizer.ggml.bos_token_id", GgufValue::of_uint(GgufType::u32, 5000)); },
       Errc::format_error, "'tokenizer.ggml.bos_token_id' must be an integer in [0, 276]"},
      {"add_bos not bool",
       [](GgufWriter& w) { w.set("tokenizer.ggml.add_bos_token", GgufValue::of_uint(GgufType::u8, 1)); },
       Errc::format_error, "'tokenizer.ggml.add_bos_token' must be a bool"},
      {"too many tokens",
       [](GgufWriter& w) {
         auto v = testing::tiny_vocab();
         v.push_back("extra");
         w.set("tokenizer.ggml.tokens", GgufValue::of_strings(v));
       },
       Errc::format_error, "'tokenizer.ggml.tokens' has 278 tokens, more than the 277 rows"},
  };
  ASSERT_EQ(testing::tiny_vocab().size(), 277u);
  int k = 0;
  for (const auto& tc : cases) {
    SCOPED_TRACE(tc.what);
    GgufWriter w = tiny_gguf();
    tc.edit(w);
    EXPECT_ERR(open_written(dir, w, "c" + std::to_string(k++) + ".gguf"), tc.code, tc.needle);
  }
}

TEST(GgufModel, RopeScalingEotTemplateAndFreqFactors) {
  TempDir dir;
  GgufWriter w = tiny_gguf();
  w.set("llama.rope.scaling.type", GgufValue::of_string("linear"));
  w.set("llama.rope.scaling.factor", GgufValue::of_float(GgufType::f32, 4.0));
  w.set("tokenizer.ggml.eot_token_id", GgufValue::of_uint(GgufType::u32, 1));
  w.set("tokenizer.chat_template", GgufValue::of_string("{% for m in messages %}<|im_start|>{{ m }}{% endfor %}"));
  std::vector<float> factors(8);
  for (std::size_t i = 0; i < factors.size(); ++i) factors[i] = 1.0F + static_cast<float>(i);
  ASSERT_TRUE(w.add_tensor("rope_freqs.weight", WType::f32, {8},
                           std::as_bytes(std::span<const float>(factors.data(), factors.size())))
                  .ok());
  auto m = open_written(dir, w);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->config().rope_scaling, RopeScaling::linear);
  EXPECT_EQ(m->config().rope_factor, 4.0);
  EXPECT_EQ(m->config().eos_token_ids, (std::vector<int>{2, 1}));
  EXPECT_EQ(m->generation().eos_token_ids, (std::vector<int>{2, 1}));
  EXPECT_EQ(m->tokenizer_settings().template_guess, "chatml");
  EXPECT_NE(m->tokenizer_settings().chat_template.find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(m->config().rope_freq_factors, factors);

  GgufWriter bad = tiny_gguf();
  ASSERT_TRUE(bad.add_tensor("rope_freqs.weight", WType::f32, {4}, testing::pattern(16, 1)).ok());
  EXPECT_ERR(open_written(dir, bad, "b.gguf"), Errc::format_error, "'rope_freqs.weight' must be f32 [8]");
}

TEST(GgufModel, TokenizerModelsAndArrays) {
  TempDir dir;
  GgufWriter bpe = tiny_gguf();
  bpe.set("tokenizer.ggml.model", GgufValue::of_string("gpt2"));
  auto m = open_written(dir, bpe, "bpe.gguf");
  ASSERT_TRUE(m.ok()) << m.error().message;  // opens; its tokenizer is BPE, not a SentencePiece model
  EXPECT_ERR(m->tokenizer_bytes(), Errc::unsupported, "weights::bpe_vocab_from_gguf reads it");

  GgufWriter t5 = tiny_gguf();
  t5.set("tokenizer.ggml.model", GgufValue::of_string("t5"));
  auto m5 = open_written(dir, t5, "t5.gguf");
  ASSERT_TRUE(m5.ok());
  EXPECT_ERR(m5->tokenizer_bytes(), Errc::unsupported, "tokenizer.ggml.model \"t5\" is not supported");

  GgufWriter scores = tiny_gguf();
  scores.set("tokenizer.ggml.scores", GgufValue::of_f32s(std::vector<float>(3, 0.0F)));
  auto ms = open_written(dir, scores, "s.gguf");
  ASSERT_TRUE(ms.ok());
  EXPECT_ERR(ms->tokenizer_bytes(), Errc::format_error, "'tokenizer.ggml.scores' must be an array of 277 f32");

  GgufWriter types = tiny_gguf();
  std::vector<std::int32_t> tt(277, 1);
  tt[10] = 9;
  types.set("tokenizer.ggml.token_type", GgufValue::of_i32s(tt));
  auto mt = open_written(dir, types, "t.gguf");
  ASSERT_TRUE(mt.ok());
  EXPECT_ERR(mt->tokenizer_bytes(), Errc::format_error, "'tokenizer.ggml.token_type' element 10 is 9");

  GgufWriter none = tiny_gguf();
  none.erase("tokenizer.ggml.model");
  auto mn = open_written(dir, none, "n.gguf");
  ASSERT_TRUE(mn.ok());
  EXPECT_ERR(mn->tokenizer_bytes(), Errc::format_error, "'tokenizer.ggml.model' is missing");
}

TEST(GgufNames, MappingBothWays) {
  const std::pair<const char*, const char*> cases[] = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
      {"blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"},
      {"blk.12.attn_q.weight", "model.layers.12.self_attn.q_proj.weight"},
      {"blk.3.attn_k.weight", "model.layers.3.self_attn.k_proj.weight"},
      {"blk.3.attn_v.weight", "model.layers.3.self_attn.v_proj.weight"},
      {"blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"},
      {"blk.3.ffn_norm.weight", "model.layers.3.post_attention_layernorm.weight"},
      {"blk.3.ffn_gate.weight", "model.layers.3.mlp.gate_proj.weight"},
      {"blk.3.ffn_up.weight", "model.layers.3.mlp.up_proj.weight"},
      {"blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight"},
      {"blk.3.attn_q.bias", "model.layers.3.self_attn.q_proj.bias"},
  };
  for (const auto& [g, h] : cases) {
    EXPECT_EQ(hf_name_from_gguf(g), std::optional<std::string>(h)) << g;
    EXPECT_EQ(gguf_name_from_hf(h), std::optional<std::string>(g)) << h;
  }
  for (const char* n : {"rope_freqs.weight", "blk.x.attn_q.weight", "blk.01.attn_q.weight", "blk.0.attn_q",
                        "blk.0.attn_qq.weight", "token_embd.weightx", "blk..attn_q.weight"}) {
    EXPECT_EQ(hf_name_from_gguf(n), std::nullopt) << n;
  }
}

TEST(GgufPermute, QkRowsMatchConvertHfToGguf) {
  // 2 heads of head_dim 4, rows of 3 bytes: row r holds bytes {r, r, r}. convert_hf_to_gguf's
  // reshape(n_head, 2, hd/2, cols).swapaxes(1, 2) puts HF rows [0 2 1 3 | 4 6 5 7] in GGUF order.
  const int rows = 8;
  std::vector<std::byte> hf(rows * 3), gguf(rows * 3), back(rows * 3);
  for (int r = 0; r < rows; ++r) {
    for (int k = 0; k < 3; ++k) hf[static_cast<std::size_t>(r * 3 + k)] = static_cast<std::byte>(r);
  }
  ASSERT_TRUE(permute_qk_rows_for_gguf(hf, gguf, 2, 3).ok());
  const int expect[] = {0, 2, 1, 3, 4, 6, 5, 7};
  for (int r = 0; r < rows; ++r) {
    EXPECT_EQ(std::to_integer<int>(gguf[static_cast<std::size_t>(r * 3)]), expect[r]) << r;
  }
  ASSERT_TRUE(unpermute_qk_rows_from_gguf(gguf, back, 2, 3).ok());
  EXPECT_EQ(back, hf);
  // Larger: head_dim 8, q8_0 rows of 34 bytes; round trip and a non-identity permutation.
  const auto big = testing::pattern(4 * 8 * 34, 7);
  std::vector<std::byte> p(big.size()), q(big.size());
  ASSERT_TRUE(permute_qk_rows_for_gguf(big, p, 4, 34).ok());
  EXPECT_NE(p, big);
  ASSERT_TRUE(unpermute_qk_rows_from_gguf(p, q, 4, 34).ok());
  EXPECT_EQ(q, big);
  // Sizes that do not fit.
  EXPECT_ERR(permute_qk_rows_for_gguf(hf, gguf, 3, 3), Errc::invalid_argument, "3 heads");
  EXPECT_ERR(permute_qk_rows_for_gguf(hf, std::span<std::byte>(gguf).first(6), 2, 3), Errc::invalid_argument,
             "24 bytes in, 6 out");
  EXPECT_ERR(
      permute_qk_rows_for_gguf(std::span<const std::byte>(hf).first(18), std::span<std::byte>(gguf).first(18), 2, 3),
      Errc::invalid_argument, "6 rows are not 2 heads");
}

}  // namespace
}  // namespace tandem::weights
