// BERT-family layouts (bert_layout.h).
#include "weights/bert_layout.h"

#include <algorithm>
#include <cmath>

#include "weights/json_fields.h"
#include "weights/model_limits.h"

namespace tandem::weights {

std::string_view bert_family_name(BertFamily f) { return f == BertFamily::bert ? "bert" : "nomic-bert"; }
std::string_view bert_pooling_name(BertPooling p) { return p == BertPooling::mean ? "mean" : "cls"; }

namespace {

// BertModel's config.json.
Status parse_bert(const Fields& f, BertConfig& c) {
  std::int64_t v = 0;
  ASSIGN_OR_RETURN(v, f.integer("hidden_size", 1, kMaxHidden));
  c.hidden = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, f.integer("num_hidden_layers", 1, kMaxLayers));
  c.layers = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, f.integer("num_attention_heads", 1, kMaxHeads));
  c.heads = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, f.integer("intermediate_size", 1, kMaxIntermediate));
  c.intermediate = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, f.integer("max_position_embeddings", 1, kMaxPositions));
  c.positions = static_cast<int>(v);
  std::optional<std::int64_t> ov;
  ASSIGN_OR_RETURN(ov, f.opt_integer("type_vocab_size", 1, 1024));
  c.type_vocab = static_cast<int>(ov.value_or(2));
  std::optional<double> od;
  ASSIGN_OR_RETURN(od, f.opt_number("layer_norm_eps", 0.0, false, 1.0));
  c.eps = od.value_or(1e-12);
  std::optional<std::string> os;
  ASSIGN_OR_RETURN(os, f.opt_string("hidden_act"));
  if (os && *os != "gelu")
    return f.error(Errc::unsupported, "hidden_act", "\"" + os->substr(0, 64) + "\" is not supported (only \"gelu\")");
  ASSIGN_OR_RETURN(os, f.opt_string("position_embedding_type"));
  if (os && *os != "absolute")
    return f.error(Errc::unsupported, "position_embedding_type",
                   "\"" + os->substr(0, 64) + "\" is not supported (only \"absolute\")");
  c.pooling = BertPooling::cls;
  return {};
}

// NomicBertModel's config.json (contrastors' NomicBertConfig, GPT-2-style key names).
Status parse_nomic(const Fields& f, BertConfig& c) {
  std::int64_t v = 0;
  ASSIGN_OR_RETURN(v, f.integer("n_embd", 1, kMaxHidden));
  c.hidden = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, f.integer("n_layer", 1, kMaxLayers));
  c.layers = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, f.integer("n_head", 1, kMaxHeads));
  c.heads = static_cast<int>(v);
  std::optional<std::int64_t> ov;
  ASSIGN_OR_RETURN(ov, f.opt_integer("n_inner", 1, kMaxIntermediate));
  c.intermediate = static_cast<int>(ov.value_or(4 * static_cast<std::int64_t>(c.hidden)));
  // The context the model was trained for (max_trained_positions) bounds inputs, as llama.cpp's converter sets it.
  ASSIGN_OR_RETURN(ov, f.opt_integer("max_trained_positions", 1, kMaxPositions));
  if (!ov) ASSIGN_OR_RETURN(ov, f.opt_integer("n_positions", 1, kMaxPositions));
  if (!ov) return f.error(Errc::format_error, "n_positions", "is missing");
  c.positions = static_cast<int>(*ov);
  ASSIGN_OR_RETURN(ov, f.opt_integer("type_vocab_size", 1, 1024));
  c.type_vocab = static_cast<int>(ov.value_or(2));
  std::optional<double> od;
  ASSIGN_OR_RETURN(od, f.opt_number("layer_norm_epsilon", 0.0, false, 1.0));
  c.eps = od.value_or(1e-12);
  ASSIGN_OR_RETURN(od, f.opt_number("rotary_emb_base", 0.0, false, kMaxRopeTheta));
  c.rope_theta = od.value_or(1000.0);
  ASSIGN_OR_RETURN(od, f.opt_number("rotary_emb_fraction", 0.0, false, 1.0));
  if (od && *od != 1.0) return f.error(Errc::unsupported, "rotary_emb_fraction", "other than 1 is not supported");
  std::optional<std::string> os;
  ASSIGN_OR_RETURN(os, f.opt_string("activation_function"));
  if (os.value_or("swiglu") != "swiglu")
    return f.error(Errc::unsupported, "activation_function", "\"" + os->substr(0, 64) + "\" is not supported (only \"swiglu\")");
  for (const char* key : {"rotary_emb_interleaved", "prenorm", "qkv_proj_bias", "mlp_fc1_bias", "mlp_fc2_bias",
                          "use_rms_norm", "causal"}) {
    std::optional<bool> ob;
    ASSIGN_OR_RETURN(ob, f.opt_bool(key));
    if (ob.value_or(false)) return f.error(Errc::unsupported, key, "true is not supported");
  }
  ASSIGN_OR_RETURN(ov, f.opt_integer("rotary_emb_scale_base", 0, kMaxPositions));
  if (ov) return f.error(Errc::unsupported, "rotary_emb_scale_base", "(xPos scaling) is not supported");
  c.pooling = BertPooling::mean;
  return {};
}

}  // namespace

Result<BertConfig> parse_bert_config(std::string_view json_text, const std::string& origin) {
  Json j;
  ASSIGN_OR_RETURN(j, parse_object(json_text, origin));
  const Fields f(j, origin);
  std::optional<std::string> mt;
  ASSIGN_OR_RETURN(mt, f.opt_string("model_type"));
  if (!mt) return f.error(Errc::format_error, "model_type", "is missing");
  BertConfig c;
  if (*mt == "bert") {
    c.family = BertFamily::bert;
    TANDEM_TRY(parse_bert(f, c));
  } else if (*mt == "nomic_bert") {
    c.family = BertFamily::nomic_bert;
    TANDEM_TRY(parse_nomic(f, c));
  } else {
    return f.error(Errc::unsupported, "model_type",
                   "\"" + mt->substr(0, 64) + "\" is not a supported text embedding model (bert, nomic_bert)");
  }
  if (c.hidden % c.heads != 0)
    return fail(Errc::format_error, origin + ": the attention heads (" + std::to_string(c.heads) +
                                        ") do not divide the hidden size (" + std::to_string(c.hidden) + ")");
  if (c.family == BertFamily::nomic_bert && c.head_dim() % 2 != 0)
    return fail(Errc::format_error, origin + ": the head dimension must be even for rotary embeddings");
  std::int64_t v = 0;
  ASSIGN_OR_RETURN(v, f.integer("vocab_size", 1, kMaxVocab));
  c.vocab = static_cast<int>(v);
  std::optional<std::int64_t> ov;
  ASSIGN_OR_RETURN(ov, f.opt_integer("pad_token_id", 0, c.vocab - 1));
  c.pad_id = static_cast<std::int32_t>(ov.value_or(0));
  return c;
}

Status parse_sentence_transformers_pooling(std::string_view json_text, const std::string& origin, BertConfig& c) {
  Json j;
  ASSIGN_OR_RETURN(j, parse_object(json_text, origin));
  const Fields f(j, origin);
  bool mean = false, cls = false;
  for (const char* key : {"pooling_mode_mean_tokens", "pooling_mode_cls_token", "pooling_mode_max_tokens",
                          "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                          "pooling_mode_lasttoken"}) {
    std::optional<bool> ob;
    ASSIGN_OR_RETURN(ob, f.opt_bool(key));
    if (!ob.value_or(false)) continue;
    const std::string k = key;
    if (k == "pooling_mode_mean_tokens")
      mean = true;
    else if (k == "pooling_mode_cls_token")
      cls = true;
    else
      return f.error(Errc::unsupported, key, "is not supported (mean or CLS pooling only)");
  }
  if (mean == cls) return fail(Errc::format_error, origin + ": exactly one of pooling_mode_mean_tokens and "
                                                            "pooling_mode_cls_token must be true");
  c.pooling = mean ? BertPooling::mean : BertPooling::cls;
  return {};
}

Result<std::string> sentence_transformers_pooling_dir(std::string_view modules_json, const std::string& origin) {
  Json j;
  ASSIGN_OR_RETURN(j, detail::parse_json(modules_json, origin));
  if (!j.is_array()) return fail(Errc::format_error, origin + ": must be a JSON array of modules");
  // A module after pooling that changes the vector (a Dense projection, a LayerNorm) is not applied by Tandem:
  // refused rather than giving other vectors than sentence-transformers does.
  for (const Json& m : j) {
    if (!m.is_object() || !m.contains("type") || !m["type"].is_string()) continue;
    const std::string t = m["type"].get<std::string>();
    if (t != "sentence_transformers.models.Transformer" && t != "sentence_transformers.models.Pooling" &&
        t != "sentence_transformers.models.Normalize")
      return fail(Errc::unsupported, origin + ": module " + detail::printable(t.substr(0, 96)) +
                                         " is not supported (Transformer, Pooling and Normalize only)");
  }
  for (const Json& m : j) {
    if (!m.is_object() || !m.contains("type") || !m["type"].is_string()) continue;
    if (m["type"].get<std::string>() != "sentence_transformers.models.Pooling") continue;
    if (!m.contains("path") || !m["path"].is_string()) return fail(Errc::format_error, origin + ": the Pooling module has no path");
    const std::string p = m["path"].get<std::string>();
    if (p.empty() || p.size() > 128 || p == "." || p == ".." || p.find('/') != std::string::npos)
      return fail(Errc::format_error, origin + ": the Pooling module's path '" + detail::printable(p.substr(0, 64)) +
                                          "' is not a directory name");
    return p;
  }
  return std::string();
}

Result<bool> tokenizer_do_lower_case(std::string_view tokenizer_config_json, const std::string& origin) {
  Json j;
  ASSIGN_OR_RETURN(j, parse_object(tokenizer_config_json, origin));
  const Fields f(j, origin);
  std::optional<bool> ob;
  ASSIGN_OR_RETURN(ob, f.opt_bool("do_lower_case"));
  return ob.value_or(true);
}

std::vector<std::pair<std::string, std::vector<std::int64_t>>> bert_required_tensors(const BertConfig& c) {
  const std::int64_t H = c.hidden, I = c.intermediate;
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  out.push_back({"embeddings.word_embeddings.weight", {c.vocab, H}});
  out.push_back({"embeddings.token_type_embeddings.weight", {c.type_vocab, H}});
  if (c.family == BertFamily::bert) {
    out.push_back({"embeddings.position_embeddings.weight", {c.positions, H}});
    out.push_back({"embeddings.LayerNorm.weight", {H}});
    out.push_back({"embeddings.LayerNorm.bias", {H}});
    for (int i = 0; i < c.layers; ++i) {
      const std::string p = "encoder.layer." + std::to_string(i) + ".";
      for (const char* m : {"attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"}) {
        out.push_back({p + m + ".weight", {H, H}});
        out.push_back({p + m + ".bias", {H}});
      }
      out.push_back({p + "attention.output.LayerNorm.weight", {H}});
      out.push_back({p + "attention.output.LayerNorm.bias", {H}});
      out.push_back({p + "intermediate.dense.weight", {I, H}});
      out.push_back({p + "intermediate.dense.bias", {I}});
      out.push_back({p + "output.dense.weight", {H, I}});
      out.push_back({p + "output.dense.bias", {H}});
      out.push_back({p + "output.LayerNorm.weight", {H}});
      out.push_back({p + "output.LayerNorm.bias", {H}});
    }
  } else {
    out.push_back({"emb_ln.weight", {H}});
    out.push_back({"emb_ln.bias", {H}});
    for (int i = 0; i < c.layers; ++i) {
      const std::string p = "encoder.layers." + std::to_string(i) + ".";
      out.push_back({p + "attn.Wqkv.weight", {3 * H, H}});
      out.push_back({p + "attn.out_proj.weight", {H, H}});
      out.push_back({p + "norm1.weight", {H}});
      out.push_back({p + "norm1.bias", {H}});
      out.push_back({p + "mlp.fc11.weight", {I, H}});
      out.push_back({p + "mlp.fc12.weight", {I, H}});
      out.push_back({p + "mlp.fc2.weight", {H, I}});
      out.push_back({p + "norm2.weight", {H}});
      out.push_back({p + "norm2.bias", {H}});
    }
  }
  return out;
}

namespace {

// GGUF ↔ HF per family (both without the .weight / .bias ending); layer parts after "blk.N." / the HF layer prefix.
struct NamePair {
  std::string_view gguf, hf;
};
constexpr NamePair kBertGlobal[] = {{"token_embd", "embeddings.word_embeddings"},
                                    {"token_types", "embeddings.token_type_embeddings"},
                                    {"position_embd", "embeddings.position_embeddings"},
                                    {"token_embd_norm", "embeddings.LayerNorm"}};
constexpr NamePair kBertLayer[] = {{"attn_q", "attention.self.query"},
                                   {"attn_k", "attention.self.key"},
                                   {"attn_v", "attention.self.value"},
                                   {"attn_output", "attention.output.dense"},
                                   {"attn_output_norm", "attention.output.LayerNorm"},
                                   {"ffn_up", "intermediate.dense"},
                                   {"ffn_down", "output.dense"},
                                   {"layer_output_norm", "output.LayerNorm"}};
constexpr NamePair kNomicGlobal[] = {{"token_embd", "embeddings.word_embeddings"},
                                     {"token_types", "embeddings.token_type_embeddings"},
                                     {"token_embd_norm", "emb_ln"}};
constexpr NamePair kNomicLayer[] = {{"attn_qkv", "attn.Wqkv"},     {"attn_output", "attn.out_proj"},
                                    {"attn_output_norm", "norm1"}, {"ffn_up", "mlp.fc11"},
                                    {"ffn_gate", "mlp.fc12"},      {"ffn_down", "mlp.fc2"},
                                    {"layer_output_norm", "norm2"}};

bool split_suffix(std::string_view name, std::string_view& stem, std::string_view& suffix) {
  for (std::string_view s : {std::string_view(".weight"), std::string_view(".bias")}) {
    if (name.size() > s.size() && name.ends_with(s)) {
      stem = name.substr(0, name.size() - s.size());
      suffix = s;
      return true;
    }
  }
  return false;
}

bool parse_index(std::string_view s, int& out) {
  if (s.empty() || s.size() > 5 || (s.size() > 1 && s[0] == '0')) return false;
  out = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
    out = out * 10 + (ch - '0');
  }
  return true;
}

// direction true: GGUF → HF.
std::optional<std::string> map_name(std::string_view name, BertFamily f, bool to_hf) {
  std::string_view stem, suffix;
  if (!split_suffix(name, stem, suffix)) return std::nullopt;
  const bool bert = f == BertFamily::bert;
  const std::span<const NamePair> global = bert ? std::span<const NamePair>(kBertGlobal) : std::span<const NamePair>(kNomicGlobal);
  const std::span<const NamePair> layer = bert ? std::span<const NamePair>(kBertLayer) : std::span<const NamePair>(kNomicLayer);
  for (const NamePair& p : global)
    if (stem == (to_hf ? p.gguf : p.hf)) return std::string(to_hf ? p.hf : p.gguf) + std::string(suffix);
  const std::string_view from_prefix = to_hf ? "blk." : (bert ? "encoder.layer." : "encoder.layers.");
  if (!stem.starts_with(from_prefix)) return std::nullopt;
  stem.remove_prefix(from_prefix.size());
  const auto dot = stem.find('.');
  int li = 0;
  if (dot == std::string_view::npos || !parse_index(stem.substr(0, dot), li)) return std::nullopt;
  const std::string_view part = stem.substr(dot + 1);
  const std::string to_prefix = to_hf ? (bert ? "encoder.layer." : "encoder.layers.") : "blk.";
  for (const NamePair& p : layer)
    if (part == (to_hf ? p.gguf : p.hf))
      return to_prefix + std::to_string(li) + "." + std::string(to_hf ? p.hf : p.gguf) + std::string(suffix);
  return std::nullopt;
}

}  // namespace

std::optional<std::string> bert_gguf_name_from_hf(std::string_view hf_name, BertFamily f) {
  return map_name(hf_name, f, false);
}

Result<BertConfig> bert_config_from_gguf(const GgufFile& f) {
  const std::string& origin = f.path();
  const GgufValue* a = f.find("general.architecture");
  if (a == nullptr || a->type != GgufType::string)
    return fail(Errc::format_error, origin + ": general.architecture is missing");
  BertConfig c;
  if (a->str == "bert") {
    c.family = BertFamily::bert;
  } else if (a->str == "nomic-bert") {
    c.family = BertFamily::nomic_bert;
  } else {
    return fail(Errc::unsupported, origin + ": general.architecture '" + detail::printable(a->str) +
                                       "' is not a text embedding model (bert, nomic-bert)");
  }
  const std::string p = a->str + ".";
  auto integer = [&](const std::string& key, std::int64_t lo, std::int64_t hi, std::optional<std::int64_t> def) -> Result<std::int64_t> {
    const GgufValue* v = f.find(key);
    if (v == nullptr) {
      if (def) return *def;
      return fail(Errc::format_error, origin + ": key '" + key + "' is missing");
    }
    const auto x = v->as_i64();
    if (!v->is_integer() || !x || *x < lo || *x > hi)
      return fail(Errc::format_error, origin + ": key '" + key + "' must be an integer in [" + std::to_string(lo) +
                                          ", " + std::to_string(hi) + "]");
    return *x;
  };
  auto number = [&](const std::string& key, double def) -> Result<double> {
    const GgufValue* v = f.find(key);
    if (v == nullptr) return def;
    const auto x = v->as_f64();
    if (!x || !std::isfinite(*x) || *x <= 0) return fail(Errc::format_error, origin + ": key '" + key + "' must be a positive number");
    return *x;
  };
  std::int64_t v = 0;
  ASSIGN_OR_RETURN(v, integer(p + "embedding_length", 1, kMaxHidden, std::nullopt));
  c.hidden = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, integer(p + "block_count", 1, kMaxLayers, std::nullopt));
  c.layers = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, integer(p + "attention.head_count", 1, kMaxHeads, std::nullopt));
  c.heads = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, integer(p + "feed_forward_length", 1, kMaxIntermediate, std::nullopt));
  c.intermediate = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, integer(p + "context_length", 1, kMaxPositions, std::nullopt));
  c.positions = static_cast<int>(v);
  ASSIGN_OR_RETURN(c.eps, number(p + "attention.layer_norm_epsilon", 1e-12));
  ASSIGN_OR_RETURN(c.rope_theta, number(p + "rope.freq_base", 1000.0));
  if (const GgufValue* causal = f.find(p + "attention.causal"); causal && causal->type == GgufType::boolean && causal->u != 0)
    return fail(Errc::unsupported, origin + ": key '" + p + "attention.causal' is true (a causal encoder)");
  ASSIGN_OR_RETURN(v, integer(p + "pooling_type", 0, 1 << 20, std::nullopt));
  if (v == 1)
    c.pooling = BertPooling::mean;
  else if (v == 2)
    c.pooling = BertPooling::cls;
  else
    return fail(Errc::unsupported, origin + ": key '" + p + "pooling_type' is " + std::to_string(v) +
                                       " (supported: 1 mean, 2 cls)");
  ASSIGN_OR_RETURN(v, integer("tokenizer.ggml.token_type_count", 1, 1024, 2));
  c.type_vocab = static_cast<int>(v);
  if (c.hidden % c.heads != 0) return fail(Errc::format_error, origin + ": " + p + "attention.head_count does not divide embedding_length");
  const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
  if (emb == nullptr || emb->ne.size() != 2 || emb->ne[1] < 1 || emb->ne[1] > static_cast<std::uint64_t>(kMaxVocab))
    return fail(Errc::format_error, origin + ": tensor 'token_embd.weight' is missing or not [hidden, vocab]");
  c.vocab = static_cast<int>(emb->ne[1]);
  ASSIGN_OR_RETURN(v, integer("tokenizer.ggml.padding_token_id", 0, c.vocab - 1, 0));
  c.pad_id = static_cast<std::int32_t>(v);
  return c;
}

Result<std::vector<TensorView>> bert_tensor_views_from_gguf(const GgufFile& f, const BertConfig& c) {
  std::vector<TensorView> out;
  for (const GgufTensorInfo& t : f.tensors()) {
    auto hf = map_name(t.name, c.family, true);
    if (!hf) continue;
    out.push_back(gguf_tensor_view(f, t, std::move(*hf)));
  }
  std::sort(out.begin(), out.end(), [](const TensorView& a, const TensorView& b) { return a.name < b.name; });
  for (std::size_t i = 1; i < out.size(); ++i)
    if (out[i].name == out[i - 1].name)
      return fail(Errc::format_error, f.path() + ": two tensors map to '" + out[i].name + "'");
  return out;
}

}  // namespace tandem::weights
