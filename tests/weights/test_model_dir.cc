// ModelDir and the JSON side files: a tiny valid Llama directory, then one malformed variant per rule.
#include <random>

#include "test_util.h"

namespace tandem::weights::testing {
namespace {

std::vector<OwnedTensor> without(std::vector<OwnedTensor> ts, const std::string& name) {
  std::erase_if(ts, [&](const OwnedTensor& t) { return t.name == name; });
  return ts;
}

OwnedTensor& find_t(std::vector<OwnedTensor>& ts, const std::string& name) {
  for (auto& t : ts) {
    if (t.name == name) return t;
  }
  std::abort();
}

// --- happy paths --------------------------------------------------------------------------------------------------

TEST(ModelDir, OpensTinyLlama) {
  TempDir d;
  write_model(d);
  auto m = ModelDir::open(d.path() + "/");
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->dir(), d.path());
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.hidden_size, 8);
  EXPECT_EQ(c.num_heads, 2);
  EXPECT_EQ(c.num_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(m->dtype(), DType::f32);
  EXPECT_EQ(m->shards().size(), 1u);
  EXPECT_EQ(m->tokenizer_path(), d / "tokenizer.model");
  EXPECT_FALSE(m->generation().temperature.has_value());
  EXPECT_EQ(m->tokenizer_settings().template_guess, "");

  const auto req = ModelDir::required_tensors(c);
  EXPECT_EQ(req.size(), 1 + 2 * 9 + 1 + 1u);
  EXPECT_EQ(req.front().first, "model.embed_tokens.weight");
  EXPECT_EQ(req.back().first, "lm_head.weight");
  const TensorView* k = m->tensor("model.layers.1.self_attn.k_proj.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->shape, (std::vector<std::int64_t>{4, 8}));
  EXPECT_EQ(k->data.size(), 4u * 8 * 4);
  EXPECT_EQ(k->shard, 0);
  EXPECT_EQ(m->tensor("nope"), nullptr);

  // params: embed 256 + lm_head 256 + norm 8 + per layer (8+32+32... ) computed from the shapes
  std::uint64_t params = 0;
  for (const auto& [name, shape] : req) {
    std::uint64_t p = 1;
    for (auto s : shape) p *= static_cast<std::uint64_t>(s);
    params += p;
  }
  EXPECT_EQ(m->parameter_count(), params);
  EXPECT_EQ(m->weight_bytes(), params * 4);
  EXPECT_EQ(m->config_text(), read_file(d / "config.json"));
}

TEST(ModelDir, DigestsAreStableAndSensitive) {
  TempDir d;
  const json cfg = tiny_config();
  auto ts = tensors_for(cfg);
  write_model(d, cfg, ts);
  auto m1 = ModelDir::open(d.path());
  ASSERT_TRUE(m1.ok()) << m1.error().message;
  const std::string h1 = m1->header_digest(), c1 = m1->content_digest();
  EXPECT_EQ(h1.size(), 64u);
  EXPECT_EQ(c1.size(), 64u);
  EXPECT_NE(h1, c1);
  auto m2 = ModelDir::open(d.path());
  ASSERT_TRUE(m2.ok());
  EXPECT_EQ(m2->header_digest(), h1);
  EXPECT_EQ(m2->content_digest(), c1);

  // One weight byte changes the content digest but not the header digest.
  TempDir d2;
  find_t(ts, "model.layers.1.mlp.up_proj.weight").data[5] ^= std::byte{1};
  write_model(d2, cfg, ts);
  auto m3 = ModelDir::open(d2.path());
  ASSERT_TRUE(m3.ok());
  EXPECT_EQ(m3->header_digest(), h1);
  EXPECT_NE(m3->content_digest(), c1);

  // config.json bytes are part of the header digest (and not of the content digest).
  write_file(d2 / "config.json", cfg.dump());
  auto m4 = ModelDir::open(d2.path());
  ASSERT_TRUE(m4.ok());
  EXPECT_NE(m4->header_digest(), h1);
  EXPECT_EQ(m4->content_digest(), m3->content_digest());
}

TEST(ModelDir, TiedEmbeddingsNeedNoLmHead) {
  TempDir d;
  json cfg = tiny_config();
  cfg["tie_word_embeddings"] = true;
  auto ts = tensors_for(cfg);
  for (const auto& t : ts) ASSERT_NE(t.name, "lm_head.weight");
  write_model(d, cfg, ts);
  auto m = ModelDir::open(d.path());
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_TRUE(m->config().tie_word_embeddings);
  EXPECT_EQ(m->tensor("lm_head.weight"), nullptr);
}

TEST(ModelDir, ExtraTensorsAreIgnoredButVisible) {
  TempDir d;
  const json cfg = tiny_config();
  auto ts = tensors_for(cfg);
  ts.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", DType::f32, {2}, std::vector<std::byte>(8)});
  write_model(d, cfg, ts);
  auto m = ModelDir::open(d.path());
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_NE(m->tensor("model.layers.0.self_attn.rotary_emb.inv_freq"), nullptr);
  EXPECT_EQ(m->weight_bytes(), m->parameter_count() * 4);  // extras are not counted
}

TEST(ModelDir, HalfPrecisionDtypes) {
  for (DType dt : {DType::f16, DType::bf16}) {
    TempDir d;
    const json cfg = tiny_config();
    write_model(d, cfg, tensors_for(cfg, dt));
    auto m = ModelDir::open(d.path());
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_EQ(m->dtype(), dt);
    EXPECT_EQ(m->weight_bytes(), m->parameter_count() * 2);
  }
}

TEST(ModelDir, OptionalSideFilesAreParsed) {
  TempDir d;
  write_model(d);
  write_file(d / "generation_config.json", R"({"temperature": 0.6, "top_p": 0.9, "do_sample": true,
                                              "eos_token_id": [2, 7], "transformers_version": "4.40.0"})");
  write_file(d / "tokenizer_config.json",
             R"({"add_bos_token": true, "add_eos_token": false,
                 "chat_template": "{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}"})");
  auto m = ModelDir::open(d.path());
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_DOUBLE_EQ(m->generation().temperature.value(), 0.6);
  EXPECT_EQ(m->generation().eos_token_ids, (std::vector<int>{2, 7}));
  EXPECT_EQ(m->tokenizer_settings().add_bos_token, std::optional<bool>(true));
  EXPECT_EQ(m->tokenizer_settings().template_guess, "llama2");

  write_file(d / "generation_config.json", R"({"top_p": 0})");
  EXPECT_ERR(ModelDir::open(d.path()), Errc::format_error, d / "generation_config.json");
  std::filesystem::remove(d / "generation_config.json");
  write_file(d / "tokenizer_config.json", "{");
  EXPECT_ERR(ModelDir::open(d.path()), Errc::parse_error, d / "tokenizer_config.json");
}

// --- required files and tensors -----------------------------------------------------------------------------------

TEST(ModelDir, MissingFiles) {
  TempDir d;
  EXPECT_ERR(ModelDir::open(d.path()), Errc::not_found, "config.json");
  write_model(d);
  std::filesystem::remove(d / "tokenizer.model");
  EXPECT_ERR(ModelDir::open(d.path()), Errc::not_found, "tokenizer.model");
  EXPECT_ERR(ModelDir::open(d.path()), Errc::not_found, "tokenizer.json");
  write_file(d / "tokenizer.model", "x");
  std::filesystem::remove(d / "model.safetensors");
  EXPECT_ERR(ModelDir::open(d.path()), Errc::not_found, "model.safetensors");
  EXPECT_ERR(ModelDir::open(d / "does-not-exist"), Errc::not_found, "config.json");
}

TEST(ModelDir, TokenizerJsonAloneIsATokenizer) {
  TempDir d;
  write_model(d);
  std::filesystem::remove(d / "tokenizer.model");
  write_file(d / "tokenizer.json", "{}");
  auto m = ModelDir::open(d.path());
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->tokenizer_json_path(), d / "tokenizer.json");
  EXPECT_FALSE(std::filesystem::exists(m->tokenizer_path()));
}

TEST(ModelDir, MissingRequiredTensor) {
  TempDir d;
  const json cfg = tiny_config();
  write_model(d, cfg, without(tensors_for(cfg), "model.layers.1.mlp.down_proj.weight"));
  auto r = ModelDir::open(d.path());
  EXPECT_ERR(r, Errc::format_error, "model.layers.1.mlp.down_proj.weight");
  EXPECT_ERR(r, Errc::format_error, "model.safetensors");
  EXPECT_ERR(r, Errc::format_error, "[8, 16]");

  TempDir d2;
  write_model(d2, cfg, without(tensors_for(cfg), "lm_head.weight"));  // untied: lm_head is required
  EXPECT_ERR(ModelDir::open(d2.path()), Errc::format_error, "lm_head.weight");
}

TEST(ModelDir, WrongShape) {
  TempDir d;
  const json cfg = tiny_config();
  auto ts = tensors_for(cfg);
  auto& q = find_t(ts, "model.layers.0.self_attn.k_proj.weight");
  q.shape = {8, 4};  // transposed: same bytes, wrong shape
  write_model(d, cfg, ts);
  auto r = ModelDir::open(d.path());
  EXPECT_ERR(r, Errc::format_error, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_ERR(r, Errc::format_error, "[8, 4]");
  EXPECT_ERR(r, Errc::format_error, "[4, 8]");
  EXPECT_ERR(r, Errc::format_error, "model.safetensors");
}

TEST(ModelDir, MixedDtypes) {
  TempDir d;
  const json cfg = tiny_config();
  auto ts = tensors_for(cfg);
  auto& n = find_t(ts, "model.norm.weight");
  n.dtype = DType::bf16;
  n.data.resize(n.data.size() / 2);
  write_model(d, cfg, ts);
  auto r = ModelDir::open(d.path());
  EXPECT_ERR(r, Errc::format_error, "model.norm.weight");
  EXPECT_ERR(r, Errc::format_error, "BF16");
}

TEST(ModelDir, NonFloatWeightsUnsupported) {
  TempDir d;
  const json cfg = tiny_config();
  write_model(d, cfg, tensors_for(cfg, DType::i8));
  EXPECT_ERR(ModelDir::open(d.path()), Errc::unsupported, "model.embed_tokens.weight");
}

TEST(ModelDir, CorruptSafetensorsNamesTheFile) {
  TempDir d;
  write_model(d);
  write_file(d / "model.safetensors", raw_safetensors("{nope", 0));
  EXPECT_ERR(ModelDir::open(d.path()), Errc::parse_error, "model.safetensors");
}

TEST(ModelDir, ConfigErrorsNameTheFile) {
  TempDir d;
  write_model(d);
  json cfg = tiny_config();
  cfg["num_key_value_heads"] = 3;
  write_file(d / "config.json", cfg.dump());
  EXPECT_ERR(ModelDir::open(d.path()), Errc::format_error, d / "config.json: num_key_value_heads");
}

// --- sharded ------------------------------------------------------------------------------------------------------

class Sharded : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_ = tiny_config();
    ts_ = tensors_for(cfg_);
    write_file(dir_ / "config.json", cfg_.dump());
    write_file(dir_ / "tokenizer.model", "x");
    // Layer 0 + embeddings in shard 1, the rest in shard 2.
    for (auto& t : ts_) {
      const bool first = t.name.starts_with("model.layers.0.") || t.name == "model.embed_tokens.weight";
      (first ? s1_ : s2_).push_back(t);
      map_[t.name] = first ? kS1 : kS2;
    }
  }
  void write_all() {
    ASSERT_TRUE(write_tensors(dir_ / kS1, s1_).ok());
    ASSERT_TRUE(write_tensors(dir_ / kS2, s2_).ok());
    write_index();
  }
  void write_index() {
    json idx = {{"metadata", {{"total_size", 1234}}}, {"weight_map", map_}};
    write_file(dir_ / "model.safetensors.index.json", idx.dump(2));
  }
  static constexpr const char* kS1 = "model-00001-of-00002.safetensors";
  static constexpr const char* kS2 = "model-00002-of-00002.safetensors";
  TempDir dir_;
  json cfg_;
  std::vector<OwnedTensor> ts_, s1_, s2_;
  std::map<std::string, std::string> map_;
};

TEST_F(Sharded, HappyPath) {
  write_all();
  auto m = ModelDir::open(dir_.path());
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_EQ(m->shards().size(), 2u);
  EXPECT_EQ(m->shards()[0].path(), dir_ / kS1);
  EXPECT_EQ(m->tensor("model.layers.0.mlp.up_proj.weight")->shard, 0);
  EXPECT_EQ(m->tensor("model.layers.1.mlp.up_proj.weight")->shard, 1);
  EXPECT_EQ(m->tensor("lm_head.weight")->shard, 1);

  // Same tensors as a single file: same content digest, different header digest.
  TempDir single;
  write_model(single, cfg_, ts_);
  auto s = ModelDir::open(single.path());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->content_digest(), m->content_digest());
  EXPECT_NE(s->header_digest(), m->header_digest());
}

TEST_F(Sharded, IndexNamesMissingShard) {
  write_all();
  map_["model.norm.weight"] = "model-00003-of-00003.safetensors";
  write_index();
  auto r = ModelDir::open(dir_.path());
  EXPECT_ERR(r, Errc::not_found, "model-00003-of-00003.safetensors");
  EXPECT_ERR(r, Errc::not_found, "model.safetensors.index.json");
}

TEST_F(Sharded, ShardNameEscapingTheDirectory) {
  write_all();
  for (const char* bad : {"../x.safetensors", "sub/x.safetensors", "/etc/passwd", "..", ""}) {
    map_["model.norm.weight"] = bad;
    write_index();
    auto r = ModelDir::open(dir_.path());
    EXPECT_ERR(r, Errc::format_error, "model.norm.weight");
    EXPECT_ERR(r, Errc::format_error, "model.safetensors.index.json");
    if (*bad != '\0') EXPECT_ERR(r, Errc::format_error, bad);
  }
}

TEST_F(Sharded, TensorInWrongShard) {
  write_all();
  map_["model.layers.1.mlp.up_proj.weight"] = kS1;  // it lives in shard 2
  write_index();
  auto r = ModelDir::open(dir_.path());
  EXPECT_ERR(r, Errc::format_error, "model.layers.1.mlp.up_proj.weight");
  EXPECT_ERR(r, Errc::format_error, kS1);
}

TEST_F(Sharded, IndexedTensorAbsentEverywhere) {
  write_all();
  map_["model.ghost.weight"] = kS2;
  write_index();
  EXPECT_ERR(ModelDir::open(dir_.path()), Errc::format_error, "model.ghost.weight");
}

TEST_F(Sharded, TensorInTwoShards) {
  s1_.push_back(find_t(ts_, "model.norm.weight"));
  write_all();
  auto r = ModelDir::open(dir_.path());
  EXPECT_ERR(r, Errc::format_error, "model.norm.weight");
  EXPECT_ERR(r, Errc::format_error, "two shards");
}

TEST_F(Sharded, MalformedIndex) {
  write_all();
  write_file(dir_ / "model.safetensors.index.json", "not json");
  EXPECT_ERR(ModelDir::open(dir_.path()), Errc::parse_error, "model.safetensors.index.json");
  write_file(dir_ / "model.safetensors.index.json", R"({"metadata": {}})");
  EXPECT_ERR(ModelDir::open(dir_.path()), Errc::format_error, "weight_map");
  write_file(dir_ / "model.safetensors.index.json", R"({"weight_map": {"model.norm.weight": 3}})");
  EXPECT_ERR(ModelDir::open(dir_.path()), Errc::format_error, "model.norm.weight");
  write_file(dir_ / "model.safetensors.index.json", R"({"weight_map": {}})");
  EXPECT_ERR(ModelDir::open(dir_.path()), Errc::format_error, "weight_map");
}

TEST_F(Sharded, MissingTensorNamesAllShards) {
  s2_ = without(s2_, "model.norm.weight");
  map_.erase("model.norm.weight");
  write_all();
  auto r = ModelDir::open(dir_.path());
  EXPECT_ERR(r, Errc::format_error, "model.norm.weight");
  EXPECT_ERR(r, Errc::format_error, kS2);
}

// --- config.json --------------------------------------------------------------------------------------------------

Result<ModelConfig> parse_cfg(const json& j) { return ModelConfig::parse(j.dump(), "config.json"); }

TEST(ModelConfig, DefaultsAndValues) {
  json j = tiny_config();
  j.erase("num_key_value_heads");
  j.erase("rope_theta");
  j.erase("tie_word_embeddings");
  j.erase("torch_dtype");
  j.erase("rope_scaling");
  auto c = parse_cfg(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->head_dim, 4);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->rope_scaling, RopeScaling::none);
  EXPECT_EQ(c->torch_dtype, "");
  EXPECT_FALSE(c->sliding_window.has_value());
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->bos_token_ids, std::vector<int>{1});
  EXPECT_EQ(c->eos_token_ids, std::vector<int>{2});
}

TEST(ModelConfig, ExplicitValuesMistral) {
  json j = tiny_config();
  j["architectures"] = {"MistralForCausalLM"};
  j["head_dim"] = 6;
  j["sliding_window"] = 32;
  j["eos_token_id"] = {2, 3, 31};
  j["bos_token_id"] = nullptr;
  j["torch_dtype"] = "bfloat16";
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["rope_theta"] = 500000;
  auto c = parse_cfg(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->architecture, "MistralForCausalLM");
  EXPECT_EQ(c->head_dim, 6);
  EXPECT_EQ(c->sliding_window, std::optional<int>(32));
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{2, 3, 31}));
  EXPECT_TRUE(c->bos_token_ids.empty());
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  j["sliding_window"] = nullptr;
  EXPECT_FALSE(parse_cfg(j)->sliding_window.has_value());

  // model_type when "architectures" is absent.
  json k = tiny_config();
  k.erase("architectures");
  EXPECT_EQ(parse_cfg(k)->architecture, "LlamaForCausalLM");
}

TEST(ModelConfig, RopeScaling) {
  json j = tiny_config();
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  auto c = parse_cfg(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->rope_scaling, RopeScaling::llama3);
  EXPECT_DOUBLE_EQ(c->rope_factor, 8.0);
  EXPECT_EQ(c->rope_original_max_positions, 8192);

  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2}};
  c = parse_cfg(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->rope_scaling, RopeScaling::linear);
  EXPECT_DOUBLE_EQ(c->rope_factor, 2.0);

  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  EXPECT_ERR(parse_cfg(j), Errc::unsupported, "yarn");
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 4.0}};
  EXPECT_ERR(parse_cfg(j), Errc::unsupported, "config.json: rope_scaling");
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  EXPECT_ERR(parse_cfg(j), Errc::format_error, "rope_scaling.low_freq_factor");
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", -1.0}};
  EXPECT_ERR(parse_cfg(j), Errc::format_error, "rope_scaling.factor");
  j["rope_scaling"] = {{"factor", 2.0}};
  EXPECT_ERR(parse_cfg(j), Errc::format_error, "rope_scaling");
  j["rope_scaling"] = "linear";
  EXPECT_ERR(parse_cfg(j), Errc::format_error, "rope_scaling");
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 4.0},
                       {"high_freq_factor", 1.0},
                       {"original_max_position_embeddings", 8192}};
  EXPECT_ERR(parse_cfg(j), Errc::format_error, "high_freq_factor");
}

TEST(ModelConfig, HeadsNotDivisibleExactMessage) {
  json j = tiny_config();
  j["hidden_size"] = 128;
  j["num_attention_heads"] = 32;
  j["num_key_value_heads"] = 5;
  auto c = parse_cfg(j);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code, Errc::format_error);
  EXPECT_EQ(c.error().message, "config.json: num_key_value_heads must divide num_attention_heads (32), got 5");
}

TEST(ModelConfig, MissingKeys) {
  for (const char* key : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                          "rms_norm_eps", "vocab_size", "max_position_embeddings"}) {
    json j = tiny_config();
    j.erase(key);
    auto c = parse_cfg(j);
    EXPECT_ERR(c, Errc::format_error, std::string("config.json: ") + key + " is missing");
  }
  json j = tiny_config();
  j.erase("architectures");
  j.erase("model_type");
  EXPECT_ERR(parse_cfg(j), Errc::format_error, "architectures");
}

TEST(ModelConfig, Unsupported) {
  json j = tiny_config();
  j["architectures"] = {"GPT2LMHeadModel"};
  EXPECT_ERR(parse_cfg(j), Errc::unsupported, "GPT2LMHeadModel");
  j = tiny_config();
  j.erase("architectures");
  j["model_type"] = "gemma";
  EXPECT_ERR(parse_cfg(j), Errc::unsupported, "gemma");
  j = tiny_config();
  j["hidden_act"] = "gelu";
  EXPECT_ERR(parse_cfg(j), Errc::unsupported, "hidden_act");
  j = tiny_config();
  j["attention_bias"] = true;
  EXPECT_ERR(parse_cfg(j), Errc::unsupported, "attention_bias");
  j = tiny_config();
  j["mlp_bias"] = true;
  EXPECT_ERR(parse_cfg(j), Errc::unsupported, "mlp_bias");
}

TEST(ModelConfig, RangesAndTypes) {
  const std::vector<std::pair<const char*, json>> bad = {
      {"hidden_size", 0},
      {"hidden_size", -8},
      {"hidden_size", 8.5},
      {"hidden_size", "8"},
      {"hidden_size", 1 << 20},
      {"num_hidden_layers", 1025},
      {"num_attention_heads", 0},
      {"num_key_value_heads", 0},
      {"head_dim", 5},  // odd: RoPE needs pairs
      {"rms_norm_eps", 0},
      {"rms_norm_eps", "1e-5"},
      {"rope_theta", -1},
      {"vocab_size", 0},
      {"max_position_embeddings", 0},
      {"tie_word_embeddings", "yes"},
      {"sliding_window", 0},
      {"eos_token_id", 32},  // >= vocab_size
      {"bos_token_id", -1},
      {"eos_token_id", json::array({2, "x"})},
      {"hidden_act", 3},
      {"torch_dtype", 16},
      {"architectures", "LlamaForCausalLM"},
  };
  for (const auto& [key, value] : bad) {
    json j = tiny_config();
    j[key] = value;
    auto c = parse_cfg(j);
    ASSERT_FALSE(c.ok()) << key << " = " << value.dump();
    EXPECT_EQ(c.error().code, Errc::format_error) << c.error().message;
    EXPECT_NE(c.error().message.find(std::string("config.json: ") + key), std::string::npos) << c.error().message;
  }
  json j = tiny_config();
  j["num_attention_heads"] = 3;  // 8 % 3 != 0 and no head_dim
  j["num_key_value_heads"] = 3;
  EXPECT_ERR(parse_cfg(j), Errc::format_error, "head_dim");
}

TEST(ModelConfig, NotJsonOrNotObject) {
  EXPECT_ERR(ModelConfig::parse("{", "config.json"), Errc::parse_error, "config.json");
  EXPECT_ERR(ModelConfig::parse("", "config.json"), Errc::parse_error, "config.json");
  EXPECT_ERR(ModelConfig::parse("[]", "config.json"), Errc::format_error, "config.json");
}

// --- generation_config.json ---------------------------------------------------------------------------------------

TEST(GenerationDefaults, Parses) {
  auto g = GenerationDefaults::parse(R"({"temperature": 0, "top_p": 1, "top_k": 0, "repetition_penalty": 1.1,
                                         "do_sample": false, "max_new_tokens": 256, "bos_token_id": 1,
                                         "eos_token_id": [128001, 128009], "pad_token_id": null})",
                                     "generation_config.json");
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_DOUBLE_EQ(*g->temperature, 0.0);
  EXPECT_DOUBLE_EQ(*g->top_p, 1.0);
  EXPECT_EQ(*g->top_k, 0);
  EXPECT_DOUBLE_EQ(*g->repetition_penalty, 1.1);
  EXPECT_EQ(g->do_sample, std::optional<bool>(false));
  EXPECT_EQ(g->max_new_tokens, std::optional<int>(256));
  EXPECT_EQ(g->bos_token_ids, std::vector<int>{1});
  EXPECT_EQ(g->eos_token_ids, (std::vector<int>{128001, 128009}));

  auto empty = GenerationDefaults::parse(R"({"temperature": null})", "g.json");
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(empty->temperature.has_value());
  EXPECT_FALSE(empty->top_k.has_value());
}

TEST(GenerationDefaults, Ranges) {
  for (const char* text : {R"({"temperature": -0.1})", R"({"top_p": 0})", R"({"top_p": 1.01})", R"({"top_k": -1})",
                           R"({"top_k": 2.5})", R"({"repetition_penalty": 0})", R"({"do_sample": 1})",
                           R"({"max_new_tokens": 0})", R"({"eos_token_id": -2})", R"({"temperature": "hot"})"}) {
    auto g = GenerationDefaults::parse(text, "generation_config.json");
    ASSERT_FALSE(g.ok()) << text;
    EXPECT_EQ(g.error().code, Errc::format_error) << text;
    EXPECT_NE(g.error().message.find("generation_config.json: "), std::string::npos) << g.error().message;
  }
  EXPECT_ERR(GenerationDefaults::parse("nope", "generation_config.json"), Errc::parse_error, "generation_config.json");
}

// --- tokenizer_config.json ----------------------------------------------------------------------------------------

TEST(TokenizerSettings, TemplateGuess) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{{ bos_token }}[INST] {{ m }} [/INST]", "llama2"},
      {"{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}", "chatml"},
      {"{% for m in messages %}<|user|>\n{{ m.content }}</s>{% endfor %}", "zephyr"},
      {"{{ messages }}", ""},
  };
  for (const auto& [tmpl, guess] : cases) {
    auto t = TokenizerSettings::parse(json{{"chat_template", tmpl}}.dump(), "tokenizer_config.json");
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_EQ(t->chat_template, tmpl);
    EXPECT_EQ(t->template_guess, guess) << tmpl;
  }
  auto none = TokenizerSettings::parse("{}", "tokenizer_config.json");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->chat_template, "");
  EXPECT_EQ(none->template_guess, "");
  EXPECT_FALSE(none->add_bos_token.has_value());
}

TEST(TokenizerSettings, TemplateArrayAndFlags) {
  auto t = TokenizerSettings::parse(R"({"add_bos_token": true, "add_eos_token": false,
      "chat_template": [{"name": "tool_use", "template": "[INST] tools"},
                        {"name": "default", "template": "<|im_start|>user"}]})",
                                    "tokenizer_config.json");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->add_bos_token, std::optional<bool>(true));
  EXPECT_EQ(t->add_eos_token, std::optional<bool>(false));
  EXPECT_EQ(t->chat_template, "<|im_start|>user");
  EXPECT_EQ(t->template_guess, "chatml");

  auto first = TokenizerSettings::parse(R"({"chat_template": [{"name": "a", "template": "<|user|>"}]})", "t.json");
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->template_guess, "zephyr");

  EXPECT_ERR(TokenizerSettings::parse(R"({"add_bos_token": "true"})", "tokenizer_config.json"), Errc::format_error,
             "tokenizer_config.json: add_bos_token");
  EXPECT_ERR(TokenizerSettings::parse(R"({"chat_template": 5})", "tokenizer_config.json"), Errc::format_error,
             "chat_template");
  EXPECT_ERR(TokenizerSettings::parse(R"({"chat_template": [{"name": "x"}]})", "tokenizer_config.json"),
             Errc::format_error, "chat_template");
  EXPECT_ERR(TokenizerSettings::parse(R"({"chat_template": ["x"]})", "tokenizer_config.json"), Errc::format_error,
             "chat_template");
}

// --- robustness through ModelDir ----------------------------------------------------------------------------------

TEST(ModelDirRobustness, RandomShardCorruption) {
  TempDir d;
  write_model(d);
  const std::string good = read_file(d / "model.safetensors");
  std::uint64_t hlen = 0;
  std::memcpy(&hlen, good.data(), 8);
  std::mt19937_64 rng(7);
  int failed = 0;
  for (int iter = 0; iter < 600; ++iter) {
    std::string v = good;
    for (int e = 0; e < 1 + static_cast<int>(rng() % 3); ++e) {
      const std::size_t pos = 8 + rng() % hlen;
      if (rng() % 2) {
        v[pos] = static_cast<char>(v[pos] ^ (1 << (rng() % 8)));
      } else {
        v[pos] = "0123456789{}[],:\"-"[rng() % 18];
      }
    }
    write_file(d / "model.safetensors", v);
    auto m = ModelDir::open(d.path());
    if (!m.ok()) {
      ++failed;
      EXPECT_FALSE(m.error().message.empty());
    } else {
      for (const auto& t : m->tensors()) {
        std::uint64_t n = dtype_size(t.dtype);
        for (auto s : t.shape) n *= static_cast<std::uint64_t>(s);
        ASSERT_EQ(n, t.data.size()) << t.name;
      }
      (void)m->content_digest();
    }
  }
  EXPECT_GT(failed, 300);
}

}  // namespace
}  // namespace tandem::weights::testing
