// The architectures' typed errors: malformed or unsupported config.json keys (each naming the key), Gemma's config
// defaults and the GGUF writer's refusals, and broken GGUF files (naming the architecture or tensor). Split from
// test_architectures.cc.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "architectures_fixture.h"
#include "model_fixture.h"
#include "modelgen/gguf_convert.h"
#include "weights/gguf.h"
#include "weights/gguf_model.h"

namespace tandem {
namespace {

using testing::gguf_of;
using testing::load;
using testing::make_model;
using json = nlohmann::json;

// --- typed errors ------------------------------------------------------------------------------------------------

json config_of(const std::string& preset) {
  std::ifstream f(make_model(std::string("arch-") + preset, preset) + "/config.json");
  return json::parse(f);
}

#define EXPECT_FAILS(result, errc, needle)                                                          \
  do {                                                                                              \
    const auto& _r = (result);                                                                      \
    ASSERT_FALSE(_r.ok());                                                                          \
    EXPECT_EQ(_r.error().code, (errc)) << _r.error().message;                                       \
    EXPECT_NE(_r.error().message.find(needle), std::string::npos) << _r.error().message;            \
  } while (0)

TEST(Architectures, ConfigErrorsAreTypedAndNameTheKey) {
  using weights::ModelConfig;
  json c = config_of("qwen2");
  c["architectures"] = {"GemmaForCausalLM"};
  EXPECT_FAILS(ModelConfig::parse(c.dump(), "config.json"), Errc::unsupported, "GemmaForCausalLM");
  c = config_of("qwen2");
  c["use_sliding_window"] = true;
  EXPECT_FAILS(ModelConfig::parse(c.dump(), "config.json"), Errc::unsupported, "use_sliding_window");
  c = config_of("phi3");
  c["rope_scaling"]["short_factor"] = {1.0, 2.0};
  EXPECT_FAILS(ModelConfig::parse(c.dump(), "config.json"), Errc::format_error, "rope_scaling.short_factor");
  c = config_of("phi3");
  c["rope_scaling"]["long_factor"][3] = -1.0;
  EXPECT_FAILS(ModelConfig::parse(c.dump(), "config.json"), Errc::format_error, "rope_scaling.long_factor");
  c = config_of("phi3");
  c["rope_scaling"].erase("long_factor");
  EXPECT_FAILS(ModelConfig::parse(c.dump(), "config.json"), Errc::format_error, "long_factor");
  c = config_of("phi3");
  c["partial_rotary_factor"] = 0.75;
  EXPECT_FAILS(ModelConfig::parse(c.dump(), "config.json"), Errc::unsupported, "partial_rotary_factor");
  c = config_of("llama3");
  c["rope_scaling"] = {{"rope_type", "longrope"}, {"short_factor", json::array()}, {"long_factor", json::array()}};
  EXPECT_FAILS(ModelConfig::parse(c.dump(), "config.json"), Errc::unsupported, "longrope");
  c = config_of("llama3");
  c["attention_bias"] = true;
  EXPECT_FAILS(ModelConfig::parse(c.dump(), "config.json"), Errc::unsupported, "attention_bias");
  // A Phi-3 directory whose fused qkv_proj does not hold q + 2 kv rows for its config.
  {
    const std::string dir = testing::temp_root() + "/arch-phi3-bad-kv";
    std::filesystem::create_directories(dir);
    const std::string src = make_model("arch-phi3", "phi3");
    for (const char* f : {"model.safetensors", "tokenizer.model"})
      std::filesystem::copy_file(src + "/" + f, dir + "/" + f, std::filesystem::copy_options::overwrite_existing);
    c = config_of("phi3");
    c["num_key_value_heads"] = 1;
    std::ofstream(dir + "/config.json") << c.dump();
    EXPECT_FAILS(weights::ModelDir::open(dir), Errc::format_error, "model.layers.0.self_attn.qkv_proj.weight");
  }
  c = config_of("qwen3");
  c["use_sliding_window"] = true;
  EXPECT_FAILS(ModelConfig::parse(c.dump(), "config.json"), Errc::unsupported, "use_sliding_window");
  c = config_of("qwen3");
  c["attention_bias"] = true;
  EXPECT_FAILS(ModelConfig::parse(c.dump(), "config.json"), Errc::unsupported, "attention_bias");
  c = config_of("qwen3");
  c["head_dim"] = 31;
  EXPECT_FAILS(ModelConfig::parse(c.dump(), "config.json"), Errc::format_error, "head_dim");
  // Qwen2 configs carry a sliding_window that is not in use.
  c = config_of("qwen2");
  c["sliding_window"] = 16;
  auto q = ModelConfig::parse(c.dump(), "config.json");
  ASSERT_TRUE(q.ok());
  EXPECT_FALSE(q->sliding_window.has_value());
}

// Gemma's configs: transformers' defaults where a key is absent, null caps as none, the two layer patterns and
// layer_types; bad values typed and named; and a configuration llama.cpp's gemma loaders cannot express is refused by
// the GGUF writer rather than written into a file llama.cpp would run differently.
TEST(Architectures, GemmaConfigsFollowTransformersDefaultsAndRefuseWhatTheyCannotRun) {
  using weights::ModelConfig;
  auto parse = [](const json& c) { return ModelConfig::parse(c.dump(), "config.json"); };
  json c = config_of("gemma2");
  c.erase("attn_logit_softcapping");
  c.erase("final_logit_softcapping");
  c.erase("sliding_window");
  c.erase("query_pre_attn_scalar");
  c.erase("tie_word_embeddings");
  auto g = parse(c);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(g->attn_softcap, 50.0);
  EXPECT_EQ(g->final_softcap, 30.0);
  EXPECT_EQ(g->sliding_window, 4096);
  EXPECT_DOUBLE_EQ(g->attn_scale, 1.0 / 16.0);  // query_pre_attn_scalar 256
  EXPECT_TRUE(g->tie_word_embeddings);
  EXPECT_EQ(g->sliding_layers, (std::vector<std::uint8_t>{1, 0}));
  EXPECT_DOUBLE_EQ(g->embed_scale, 8.0);
  EXPECT_TRUE(g->norm_add_one && g->post_norms && !g->qk_norm);
  EXPECT_EQ(g->activation, weights::Activation::gelu_tanh);
  c["attn_logit_softcapping"] = nullptr;
  g = parse(c);
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(g->attn_softcap.has_value());
  EXPECT_EQ(g->final_softcap, 30.0);

  c = config_of("gemma3");
  g = parse(c);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(g->sliding_layers, (std::vector<std::uint8_t>{1, 1, 1, 1, 1, 0}));
  EXPECT_EQ(g->rope_local_theta, 10000.0);
  EXPECT_FALSE(g->attn_softcap || g->final_softcap);
  EXPECT_TRUE(g->qk_norm);
  c.erase("sliding_window_pattern");
  c["layer_types"] = {"full_attention", "sliding_attention", "sliding_attention", "full_attention",
                      "sliding_attention", "full_attention"};
  g = parse(c);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(g->sliding_layers, (std::vector<std::uint8_t>{0, 1, 1, 0, 1, 0}));
  c["layer_types"] = {"full_attention"};
  EXPECT_FAILS(parse(c), Errc::format_error, "layer_types");
  c["layer_types"] = {"chunked_attention", "full_attention", "full_attention", "full_attention", "full_attention",
                      "full_attention"};
  EXPECT_FAILS(parse(c), Errc::unsupported, "chunked_attention");
  c = config_of("gemma3");
  c["hidden_activation"] = "relu";
  EXPECT_FAILS(parse(c), Errc::unsupported, "hidden_activation");
  c = config_of("gemma2");
  c["query_pre_attn_scalar"] = "wide";
  EXPECT_FAILS(parse(c), Errc::format_error, "query_pre_attn_scalar");
  c = config_of("gemma2");
  c["attention_bias"] = true;
  EXPECT_FAILS(parse(c), Errc::unsupported, "attention_bias");
  c = config_of("qwen2");
  c["architectures"] = {"Gemma3ForConditionalGeneration"};
  EXPECT_FAILS(parse(c), Errc::unsupported, "Gemma3ForConditionalGeneration");

  // The writer's refusals: a pattern, a query scale and a local base llama.cpp's gemma loaders fix otherwise. Each
  // directory still loads in Tandem.
  const std::string src = make_model("arch-gemma3", "gemma3");
  struct Edit {
    const char* tag;
    std::function<void(json&)> edit;
    const char* needle;
  };
  const Edit edits[] = {
      {"pattern", [](json& j) { j["sliding_window_pattern"] = 3; }, "layer 2 does not slide"},
      {"scale", [](json& j) { j["query_pre_attn_scalar"] = 64; }, "query_pre_attn_scalar"},
      {"local", [](json& j) { j["rope_local_base_freq"] = 20000.0; }, "rope_local_base_freq"},
  };
  for (const Edit& e : edits) {
    SCOPED_TRACE(e.tag);
    const std::string dir = testing::temp_root() + "/arch-gemma3-" + e.tag;
    std::filesystem::create_directories(dir);
    for (const char* f : {"model.safetensors", "tokenizer.model", "tokenizer_config.json"})
      std::filesystem::copy_file(src + "/" + f, dir + "/" + f, std::filesystem::copy_options::overwrite_existing);
    json j = config_of("gemma3");
    e.edit(j);
    std::ofstream(dir + "/config.json") << j.dump();
    EXPECT_TRUE(load(dir) != nullptr);
    EXPECT_FAILS(modelgen::convert_to_gguf(dir, dir + ".gguf", modelgen::Recipe::f32), Errc::unsupported, e.needle);
  }
}

// Rewrites a GGUF file: metadata through `meta`, each tensor through `tensor` (return false to drop it).
using MetaEdit = std::function<void(std::string&, weights::GgufValue&)>;
struct TensorOut {
  std::string name;
  std::uint32_t ggml_type;
  std::vector<std::uint64_t> ne;
  std::vector<std::byte> data;
};
std::string rewrite(const std::string& in, const std::string& name, const MetaEdit& meta,
                    const std::function<bool(TensorOut&)>& tensor) {
  auto f = weights::GgufFile::open(in);
  EXPECT_TRUE(f.ok());
  weights::GgufWriter w;
  for (auto [k, v] : f->metadata()) {
    if (meta) meta(k, v);
    w.set(k, v);
  }
  for (const auto& t : f->tensors()) {
    const auto b = f->raw_tensor_bytes(t);
    TensorOut o{t.name, t.ggml_type, t.ne, std::vector<std::byte>(b.begin(), b.end())};
    if (tensor && !tensor(o)) continue;
    const Status s = w.add_tensor(o.name, o.ggml_type, o.ne, o.data);
    EXPECT_TRUE(s.ok()) << o.name << ": " << (s.ok() ? "" : s.error().message);
  }
  const std::string out = testing::temp_root() + "/" + name + ".gguf";
  EXPECT_TRUE(w.write(out).ok());
  return out;
}

TEST(Architectures, GgufErrorsAreTypedAndNameTheArchitectureOrTensor) {
  using weights::ModelDir;
  const std::string phi = gguf_of("phi3"), qwen = gguf_of("qwen2"), llama = gguf_of("llama3");
  EXPECT_FAILS(ModelDir::open(rewrite(llama, "e-arch", [](std::string& k, weights::GgufValue& v) {
                 if (k == "general.architecture") v = weights::GgufValue::of_string("falcon");
               }, nullptr)),
               Errc::unsupported, "falcon");
  // Gemma's post-norm missing: named by its GGUF name.
  EXPECT_FAILS(ModelDir::open(rewrite(gguf_of("gemma2"), "e-post", nullptr,
                                      [](TensorOut& t) { return t.name != "blk.1.post_ffw_norm.weight"; })),
               Errc::format_error, "blk.1.post_ffw_norm.weight");
  // A fused qkv whose rows are not q + 2 kv.
  EXPECT_FAILS(ModelDir::open(rewrite(phi, "e-qkv", nullptr, [](TensorOut& t) {
                 if (t.name == "blk.0.attn_qkv.weight") {
                   t.ne[1] -= 1;
                   t.data.resize(t.data.size() - t.ne[0] * 4);
                 }
                 return true;
               })),
               Errc::format_error, "blk.0.attn_qkv.weight");
  EXPECT_FAILS(ModelDir::open(rewrite(phi, "e-ffn-up", nullptr, [](TensorOut& t) {
                 if (t.name == "blk.1.ffn_up.weight") {
                   t.ne[1] /= 2;
                   t.data.resize(t.data.size() / 2);
                 }
                 return true;
               })),
               Errc::format_error, "blk.1.ffn_up.weight");
  EXPECT_FAILS(ModelDir::open(rewrite(phi, "e-factors", nullptr, [](TensorOut& t) {
                 if (t.name == "rope_factors_long.weight") {
                   t.ne[0] = 4;
                   t.data.resize(16);
                 }
                 return true;
               })),
               Errc::format_error, "rope_factors_long.weight");
  EXPECT_FAILS(ModelDir::open(rewrite(phi, "e-factors-gone", nullptr,
                                      [](TensorOut& t) { return t.name != "rope_factors_short.weight"; })),
               Errc::format_error, "rope_factors_short.weight");
  EXPECT_FAILS(ModelDir::open(rewrite(qwen, "e-bias", nullptr, [](TensorOut& t) {
                 if (t.name == "blk.0.attn_k.bias") {
                   t.ne[0] -= 2;
                   t.data.resize(t.data.size() - 8);
                 }
                 return true;
               })),
               Errc::format_error, "blk.0.attn_k.bias");
  EXPECT_FAILS(ModelDir::open(rewrite(qwen, "e-bias-gone", nullptr,
                                      [](TensorOut& t) { return t.name != "blk.1.attn_v.bias"; })),
               Errc::format_error, "blk.1.attn_v.bias");
  // Qwen3: its per-head norms are required and must be [head_dim]; the head width comes from key_length.
  const std::string qwen3 = gguf_of("qwen3");
  EXPECT_FAILS(ModelDir::open(rewrite(qwen3, "e-qnorm-gone", nullptr,
                                      [](TensorOut& t) { return t.name != "blk.1.attn_q_norm.weight"; })),
               Errc::format_error, "blk.1.attn_q_norm.weight");
  EXPECT_FAILS(ModelDir::open(rewrite(qwen3, "e-knorm", nullptr, [](TensorOut& t) {
                 if (t.name == "blk.0.attn_k_norm.weight") {
                   t.ne[0] = 16;
                   t.data.resize(64);
                 }
                 return true;
               })),
               Errc::format_error, "blk.0.attn_k_norm.weight");
  EXPECT_FAILS(ModelDir::open(rewrite(qwen3, "e-keylen", [](std::string& k, weights::GgufValue& v) {
                 if (k == "qwen3.attention.key_length" || k == "qwen3.attention.value_length" ||
                     k == "qwen3.rope.dimension_count")
                   v = weights::GgufValue::of_uint(weights::GgufType::u32, 16);
               }, nullptr)),
               Errc::format_error, "blk.0.attn_q.weight");
  {
    auto f = weights::GgufFile::open(qwen3);
    ASSERT_TRUE(f.ok());
    const auto* kl = f->find("qwen3.attention.key_length");
    ASSERT_NE(kl, nullptr) << "llama.cpp needs the head width when it is not embedding_length / head_count";
    EXPECT_EQ(kl->u, 32u);
    auto m = load(qwen3);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->config().head_dim, 32);
    EXPECT_TRUE(m->config().qk_norm);
    EXPECT_FALSE(m->config().qkv_bias);
    EXPECT_FALSE(m->config().rope_interleaved) << "llama.cpp rotates qwen3 NEOX-style, on the HF rows";
  }
  // A bias on a llama file is not something Tandem computes.
  EXPECT_FAILS(ModelDir::open(rewrite(qwen, "e-llama-bias", [](std::string& k, weights::GgufValue& v) {
                 if (k == "general.architecture") v = weights::GgufValue::of_string("llama");
                 if (k.rfind("qwen2.", 0) == 0) k = "llama." + k.substr(6);
               }, nullptr)),
               Errc::unsupported, "bias terms are not supported");
}

}  // namespace
}  // namespace tandem
