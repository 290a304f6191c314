// BERT-family writers (bert_writer.h).
#include "modelgen/bert_writer.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/text.h"
#include "generation/rng.h"
#include "kernels/quant.h"
#include "modelgen/modelgen.h"
#include "weights/gguf.h"
#include "weights/gguf_tokenizer.h"

namespace tandem::modelgen {

namespace fs = std::filesystem;
using weights::BertConfig;
using weights::BertFamily;

Result<BertConfig> bert_preset(std::string_view name) {
  BertConfig c;
  if (name == "bert-test" || name == "nomic-test") {
    c.family = name == "bert-test" ? BertFamily::bert : BertFamily::nomic_bert;
    c.hidden = 64;
    c.intermediate = 128;
    c.layers = 2;
    c.heads = 4;
    c.positions = 64;
    c.eps = 1e-12;
    c.pooling = name == "bert-test" ? weights::BertPooling::cls : weights::BertPooling::mean;
    return c;
  }
  if (name == "bert-base") {
    c.hidden = 768;
    c.intermediate = 3072;
    c.layers = 12;
    c.heads = 12;
    c.positions = 512;
    c.pooling = weights::BertPooling::mean;
    return c;
  }
  return fail(Errc::invalid_argument, "unknown BERT preset '" + std::string(name) + "' (bert-test, nomic-test, bert-base)");
}

std::vector<std::string> generated_wordpiece_vocab() {
  std::vector<std::string> v{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  for (char c = '!'; c <= '~'; ++c)
    if (!std::isalnum(static_cast<unsigned char>(c))) v.emplace_back(1, c);
  for (char c = '0'; c <= '9'; ++c) v.emplace_back(1, c);
  for (char c = 'a'; c <= 'z'; ++c) v.emplace_back(1, c);
  for (char c = 'a'; c <= 'z'; ++c) v.push_back(std::string("##") + c);
  for (char c = '0'; c <= '9'; ++c) v.push_back(std::string("##") + c);
  const char* words =
      "the of and to in is was for on that with as by at from it his an are were which be this has had not but "
      "or have they their one first also new after who its been two her more time when there all other can into "
      "would only some years most may over many these such used than them three people about so where no then "
      "between during world city search query document passage embedding model text vector server gpu cpu memory "
      "home music photo cat dog house water light night day red blue green small large fast slow good bad "
      "question answer what how why find show play read write token word sentence language paris france capital "
      "weather rain snow mountain river sea sun moon star tree flower car train bus road school book story";
  std::set<std::string> seen(v.begin(), v.end());
  std::istringstream ws(words);
  for (std::string w; ws >> w;)
    if (seen.insert(w).second) v.push_back(w);
  for (const char* s : {"##s", "##ed", "##ing", "##er", "##ly", "##ion", "##al", "##es", "##ment", "##ness", "##able"})
    if (seen.insert(s).second) v.push_back(s);
  return v;
}

namespace {

Status write_text(const fs::path& p, const std::string& text) { return write_text_file(p.string(), text); }

}  // namespace

Status write_bert_model(const std::string& dir, const BertWriteOptions& opts) {
  BertConfig c = opts.config;
  const std::vector<std::string> vocab = opts.vocab.empty() ? generated_wordpiece_vocab() : opts.vocab;
  c.vocab = static_cast<int>(vocab.size());
  if (c.hidden < 2 || c.heads < 1 || c.hidden % c.heads != 0 || c.layers < 1 || c.intermediate < 1 || c.positions < 2)
    return fail(Errc::invalid_argument, "BERT shape: hidden, heads (dividing hidden), layers, intermediate, positions");
  if (c.family == BertFamily::nomic_bert && c.head_dim() % 2 != 0)
    return fail(Errc::invalid_argument, "BERT shape: nomic_bert needs an even head dimension");
  if (opts.dtype != weights::DType::f32 && opts.dtype != weights::DType::f16 && opts.dtype != weights::DType::bf16)
    return fail(Errc::invalid_argument, "BERT dtype must be f32, f16 or bf16");
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "1_Pooling", ec);
  if (ec) return fail(Errc::io_error, "cannot create " + dir + ": " + ec.message());
  const bool bert = c.family == BertFamily::bert;
  std::ostringstream cfg;
  cfg.precision(17);
  if (bert) {
    cfg << "{\n  \"architectures\": [\"BertModel\"],\n  \"model_type\": \"bert\",\n  \"hidden_size\": " << c.hidden
        << ",\n  \"num_hidden_layers\": " << c.layers << ",\n  \"num_attention_heads\": " << c.heads
        << ",\n  \"intermediate_size\": " << c.intermediate << ",\n  \"max_position_embeddings\": " << c.positions
        << ",\n  \"type_vocab_size\": " << c.type_vocab << ",\n  \"vocab_size\": " << c.vocab
        << ",\n  \"layer_norm_eps\": " << c.eps << ",\n  \"hidden_act\": \"gelu\",\n  \"position_embedding_type\": "
        << "\"absolute\",\n  \"pad_token_id\": 0,\n  \"torch_dtype\": \"float32\"\n}\n";
  } else {
    cfg << "{\n  \"architectures\": [\"NomicBertModel\"],\n  \"model_type\": \"nomic_bert\",\n  \"n_embd\": " << c.hidden
        << ",\n  \"n_layer\": " << c.layers << ",\n  \"n_head\": " << c.heads << ",\n  \"n_inner\": " << c.intermediate
        << ",\n  \"n_positions\": " << c.positions << ",\n  \"max_trained_positions\": " << c.positions
        << ",\n  \"type_vocab_size\": " << c.type_vocab << ",\n  \"vocab_size\": " << c.vocab
        << ",\n  \"layer_norm_epsilon\": " << c.eps << ",\n  \"rotary_emb_base\": " << c.rope_theta
        << ",\n  \"rotary_emb_fraction\": 1.0,\n  \"rotary_emb_interleaved\": false,\n  \"activation_function\": "
        << "\"swiglu\",\n  \"qkv_proj_bias\": false,\n  \"mlp_fc1_bias\": false,\n  \"mlp_fc2_bias\": false,\n"
        << "  \"prenorm\": false,\n  \"causal\": false,\n  \"pad_token_id\": 0\n}\n";
  }
  TANDEM_TRY(write_text(fs::path(dir) / "config.json", cfg.str()));
  std::string vt;
  for (const std::string& t : vocab) vt += t + "\n";
  TANDEM_TRY(write_text(fs::path(dir) / "vocab.txt", vt));
  TANDEM_TRY(write_text(fs::path(dir) / "tokenizer_config.json",
                        "{\n  \"do_lower_case\": true,\n  \"tokenizer_class\": \"BertTokenizer\",\n  \"model_max_length\": " +
                            std::to_string(c.positions) + "\n}\n"));
  TANDEM_TRY(write_text(fs::path(dir) / "modules.json",
                        "[\n  {\"idx\": 0, \"name\": \"0\", \"path\": \"\", \"type\": \"sentence_transformers.models.Transformer\"},\n"
                        "  {\"idx\": 1, \"name\": \"1\", \"path\": \"1_Pooling\", \"type\": \"sentence_transformers.models.Pooling\"},\n"
                        "  {\"idx\": 2, \"name\": \"2\", \"path\": \"2_Normalize\", \"type\": \"sentence_transformers.models.Normalize\"}\n]\n"));
  const bool mean = c.pooling == weights::BertPooling::mean;
  TANDEM_TRY(write_text(fs::path(dir) / "1_Pooling" / "config.json",
                        std::string("{\n  \"word_embedding_dimension\": ") + std::to_string(c.hidden) +
                            ",\n  \"pooling_mode_cls_token\": " + (mean ? "false" : "true") +
                            ",\n  \"pooling_mode_mean_tokens\": " + (mean ? "true" : "false") +
                            ",\n  \"pooling_mode_max_tokens\": false,\n  \"pooling_mode_mean_sqrt_len_tokens\": false\n}\n"));

  const auto required = weights::bert_required_tensors(c);
  std::vector<std::vector<std::byte>> storage(required.size());
  std::vector<weights::TensorToWrite> all;
  std::vector<float> vals;
  for (std::size_t ti = 0; ti < required.size(); ++ti) {
    const auto& [name, shape] = required[ti];
    std::uint64_t numel = 1;
    for (auto d : shape) numel *= static_cast<std::uint64_t>(d);
    vals.assign(numel, 0.0f);
    const bool norm_w = (name.find("LayerNorm") != std::string::npos || name.find("norm") != std::string::npos ||
                         name.find("emb_ln") != std::string::npos) &&
                        name.ends_with(".weight");
    fill_uniform(vals, norm_w ? 1.0f : 0.0f, (norm_w ? 0.1f : 0.02f) * std::sqrt(3.0f), opts.seed,
                 static_cast<std::uint32_t>(ti), 0xBE57);
    encode_floats(vals, opts.dtype, storage[ti]);
    auto& buf = storage[ti];
    all.push_back({name, opts.dtype, shape, std::span<const std::byte>(buf)});
  }
  return weights::write_safetensors((fs::path(dir) / "model.safetensors").string(), all,
                                    {{"format", "pt"}, {"generator", "tandem-mkmodel"}});
}

Result<ConvertStats> convert_bert_to_gguf(const std::string& hf_dir, const std::string& out_file, Recipe r) {
  using kernels::WType;
  using weights::GgufType;
  using weights::GgufValue;
  if (r != Recipe::f32 && r != Recipe::f16 && r != Recipe::q8_0)
    return fail(Errc::unsupported, "BERT GGUF: type " + std::string(recipe_name(r)) + " is not supported (F32, F16, Q8_0)");
  auto text = read_text_file(hf_dir + "/config.json");
  if (!text) return fail(std::move(text).error());
  auto cfg = weights::parse_bert_config(*text, hf_dir + "/config.json");
  if (!cfg) return fail(std::move(cfg).error());
  BertConfig c = *cfg;
  if (fs::is_regular_file(hf_dir + "/1_Pooling/config.json")) {
    auto pt = read_text_file(hf_dir + "/1_Pooling/config.json");
    if (!pt) return fail(std::move(pt).error());
    TANDEM_TRY(weights::parse_sentence_transformers_pooling(*pt, hf_dir + "/1_Pooling/config.json", c));
  }
  auto vt = read_text_file(hf_dir + "/vocab.txt");
  if (!vt) return fail(std::move(vt).error());
  std::vector<std::string> tokens;
  for (std::size_t i = 0; i < vt->size();) {
    std::size_t nl = vt->find('\n', i);
    if (nl == std::string::npos) nl = vt->size();
    std::string line = vt->substr(i, nl - i);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    tokens.push_back(std::move(line));
    i = nl + 1;
  }
  auto st = weights::open_safetensors_weights(hf_dir);
  if (!st) return fail(std::move(st).error());
  const std::string arch(weights::bert_family_name(c.family));
  const std::string p = arch + ".";
  weights::GgufWriter w;
  auto u32 = [](std::int64_t v) { return GgufValue::of_uint(GgufType::u32, static_cast<std::uint64_t>(v)); };
  auto f32 = [](double v) { return GgufValue::of_float(GgufType::f32, v); };
  w.set("general.architecture", GgufValue::of_string(arch));
  w.set("general.name", GgufValue::of_string(fs::path(hf_dir).filename().string()));
  w.set("general.file_type", u32(static_cast<std::int64_t>(r)));
  w.set(p + "block_count", u32(c.layers));
  w.set(p + "context_length", u32(c.positions));
  w.set(p + "embedding_length", u32(c.hidden));
  w.set(p + "feed_forward_length", u32(c.intermediate));
  w.set(p + "attention.head_count", u32(c.heads));
  w.set(p + "attention.layer_norm_epsilon", f32(c.eps));
  w.set(p + "attention.causal", GgufValue::of_bool(false));
  w.set(p + "pooling_type", u32(c.pooling == weights::BertPooling::mean ? 1 : 2));
  if (c.family == BertFamily::nomic_bert) w.set(p + "rope.freq_base", f32(c.rope_theta));
  w.set("tokenizer.ggml.token_type_count", u32(c.type_vocab));
  w.set("tokenizer.ggml.model", GgufValue::of_string("bert"));
  std::vector<std::int32_t> types;
  for (const std::string& t : tokens) types.push_back(t.size() >= 2 && t.front() == '[' && t.back() == ']' ? 3 : 1);
  for (auto i = tokens.size(); i < static_cast<std::size_t>(c.vocab); ++i) {
    tokens.push_back("[PAD" + std::to_string(i) + "]");
    types.push_back(5);
  }
  w.set("tokenizer.ggml.tokens", GgufValue::of_strings(weights::wordpiece_tokens_to_gguf(tokens)));
  w.set("tokenizer.ggml.token_type", GgufValue::of_i32s(types));
  auto id = [&](const char* t) -> std::int64_t {
    for (std::size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] == t) return static_cast<std::int64_t>(i);
    return -1;
  };
  for (const auto& [key, tok] : {std::pair{"tokenizer.ggml.unknown_token_id", "[UNK]"},
                                 std::pair{"tokenizer.ggml.seperator_token_id", "[SEP]"},
                                 std::pair{"tokenizer.ggml.padding_token_id", "[PAD]"},
                                 std::pair{"tokenizer.ggml.cls_token_id", "[CLS]"},
                                 // (llama.cpp starts a WordPiece input with its BOS id, 101 — bert-base's [CLS] —
                                 // unless the file names one: [CLS] again)
                                 std::pair{"tokenizer.ggml.bos_token_id", "[CLS]"},
                                 std::pair{"tokenizer.ggml.mask_token_id", "[MASK]"}})
    if (const auto i = id(tok); i >= 0) w.set(key, u32(i));

  ConvertStats stats;
  for (const auto& [name, shape] : weights::bert_required_tensors(c)) {
    const weights::TensorView* tv = st->find(name);
    if (!tv) tv = st->find("bert." + name);
    if (!tv) return fail(Errc::format_error, hf_dir + ": required tensor '" + name + "' is missing");
    if (tv->shape != shape) return fail(Errc::format_error, hf_dir + ": tensor '" + name + "' has the wrong shape for config.json");
    if (!tv->type_supported) return fail(Errc::unsupported, hf_dir + ": tensor '" + name + "' is not F32, F16 or BF16");
    const auto g = weights::bert_gguf_name_from_hf(name, c.family);
    if (!g) return fail(Errc::internal, "no GGUF name for BERT tensor '" + name + "'");
    // llama.cpp's converter: 1-D tensors and the small embeddings (positions, token types) f32; matrices in the
    // recipe's type (Q8_0 where the rows hold 32-blocks, else f16).
    const bool matrix = shape.size() == 2 && name.find("position_embeddings") == std::string::npos &&
                        name.find("token_type_embeddings") == std::string::npos;
    WType type = WType::f32;
    if (matrix && r == Recipe::f16) type = WType::f16;
    if (matrix && r == Recipe::q8_0)
      type = shape[1] % 32 == 0 && name.find("word_embeddings") == std::string::npos ? WType::q8_0 : WType::f16;
    TANDEM_TRY(add_converted_tensor(w, *tv, *g, type, stats));
  }
  TANDEM_TRY(w.write(out_file));
  std::error_code ec;
  stats.file_bytes = fs::file_size(out_file, ec);
  return stats;
}

}  // namespace tandem::modelgen
