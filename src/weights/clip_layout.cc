#include "weights/clip_layout.h"

#include <algorithm>
#include <cmath>

#include "weights/json_util.h"
#include "weights/model_limits.h"

#define ASSIGN_OR_RETURN(lhs, expr)                        \
  do {                                                     \
    auto _r = (expr);                                      \
    if (!_r) return ::tandem::fail(std::move(_r).error()); \
    lhs = std::move(*_r);                                  \
  } while (0)

namespace tandem::weights {

using detail::Json;

namespace {

using namespace limits;

Failure key_error(Errc code, const std::string& origin, const std::string& key, const std::string& what) {
  return fail(code, origin + ": " + key + " " + what);
}

Result<std::int64_t> get_int(const Json& obj, const std::string& origin, const std::string& prefix, const char* key,
                             std::int64_t lo, std::int64_t hi, std::optional<std::int64_t> def = std::nullopt) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (def) return *def;
    return key_error(Errc::format_error, origin, prefix + key, "is missing");
  }
  const auto v = detail::json_int(*it);
  if (!v) return key_error(Errc::format_error, origin, prefix + key, "must be an integer, got " + std::string(detail::json_kind(*it)));
  if (*v < lo || *v > hi)
    return key_error(Errc::format_error, origin, prefix + key,
                     "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(*v));
  return *v;
}

Result<double> get_num(const Json& obj, const std::string& origin, const std::string& prefix, const char* key,
                       double lo, double hi, double def) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  if (!it->is_number())
    return key_error(Errc::format_error, origin, prefix + key, "must be a number, got " + std::string(detail::json_kind(*it)));
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi)
    return key_error(Errc::format_error, origin, prefix + key, "is out of range");
  return v;
}

Status parse_act(const Json& obj, const std::string& origin, const std::string& prefix, std::string& act) {
  const auto it = obj.find("hidden_act");
  if (it == obj.end() || it->is_null()) return {};
  if (!it->is_string()) return key_error(Errc::format_error, origin, prefix + "hidden_act", "must be a string");
  const auto& s = it->get_ref<const std::string&>();
  if (s != "quick_gelu" && s != "gelu")
    return key_error(Errc::unsupported, origin, prefix + "hidden_act",
                     "\"" + detail::printable(s) + "\" is not supported (quick_gelu, gelu)");
  act = s;
  return {};
}

Status parse_tower(const Json& root, const std::string& origin, const char* name, ClipTowerShape& t, int& extra) {
  const auto it = root.find(name);
  if (it == root.end() || it->is_null()) return key_error(Errc::format_error, origin, name, "is missing");
  if (!it->is_object()) return key_error(Errc::format_error, origin, name, "must be an object");
  const Json& o = *it;
  const std::string p = std::string(name) + ".";
  std::int64_t v = 0;
  ASSIGN_OR_RETURN(v, get_int(o, origin, p, "hidden_size", 1, kMaxHidden));
  t.hidden = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, get_int(o, origin, p, "intermediate_size", 1, kMaxIntermediate));
  t.intermediate = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, get_int(o, origin, p, "num_hidden_layers", 1, kMaxLayers));
  t.layers = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, get_int(o, origin, p, "num_attention_heads", 1, kMaxHeads));
  t.heads = static_cast<int>(v);
  if (t.hidden % t.heads != 0)
    return key_error(Errc::format_error, origin, p + "num_attention_heads",
                     std::to_string(t.heads) + " does not divide hidden_size " + std::to_string(t.hidden));
  ASSIGN_OR_RETURN(t.eps, get_num(o, origin, p, "layer_norm_eps", 0.0, 1.0, 1e-5));
  TANDEM_TRY(parse_act(o, origin, p, t.act));
  (void)extra;
  return {};
}

std::vector<float> float_list(const Json& v) {
  std::vector<float> out;
  for (const auto& x : v) out.push_back(x.get<float>());
  return out;
}

Result<std::vector<float>> get_floats3(const Json& o, const std::string& origin, const char* key,
                                       std::vector<float> def) {
  const auto it = o.find(key);
  if (it == o.end() || it->is_null()) return def;
  if (it->is_number()) return std::vector<float>(3, it->get<float>());
  if (!it->is_array() || it->size() != 3)
    return key_error(Errc::format_error, origin, key, "must be a list of 3 numbers");
  for (const auto& x : *it)
    if (!x.is_number()) return key_error(Errc::format_error, origin, key, "must be a list of 3 numbers");
  return float_list(*it);
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (std::size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size())
    s.replace(pos, from.size(), to);
  return s;
}

}  // namespace

Result<ClipConfig> parse_clip_config(std::string_view json_text, const std::string& origin) {
  Json j;
  ASSIGN_OR_RETURN(j, detail::parse_json(json_text, origin));
  if (!j.is_object()) return fail(Errc::format_error, origin + ": must be a JSON object");
  if (const auto mt = j.find("model_type"); mt != j.end() && !mt->is_null()) {
    if (!mt->is_string()) return key_error(Errc::format_error, origin, "model_type", "must be a string");
    if (mt->get_ref<const std::string&>() != "clip")
      return key_error(Errc::unsupported, origin, "model_type",
                       "\"" + detail::printable(mt->get_ref<const std::string&>()) + "\" is not clip");
  }
  ClipConfig c;
  int unused = 0;
  TANDEM_TRY(parse_tower(j, origin, "text_config", c.text, unused));
  TANDEM_TRY(parse_tower(j, origin, "vision_config", c.vision, unused));
  const Json& t = j["text_config"];
  const Json& v = j["vision_config"];
  std::int64_t x = 0;
  ASSIGN_OR_RETURN(x, get_int(t, origin, "text_config.", "vocab_size", 1, kMaxVocab));
  c.vocab = static_cast<int>(x);
  ASSIGN_OR_RETURN(x, get_int(t, origin, "text_config.", "max_position_embeddings", 1, kMaxPositions));
  c.text.positions = static_cast<int>(x);
  ASSIGN_OR_RETURN(x, get_int(t, origin, "text_config.", "eos_token_id", -1, c.vocab - 1, -1));
  c.eos_id = static_cast<std::int32_t>(x);
  ASSIGN_OR_RETURN(x, get_int(t, origin, "text_config.", "bos_token_id", -1, c.vocab - 1, -1));
  c.bos_id = static_cast<std::int32_t>(x);
  c.legacy_eos_argmax = c.eos_id == 2;
  ASSIGN_OR_RETURN(x, get_int(j, origin, "", "projection_dim", 1, kMaxHidden));
  c.projection_dim = static_cast<int>(x);
  ASSIGN_OR_RETURN(x, get_int(v, origin, "vision_config.", "image_size", 1, 1 << 16));
  c.image_size = static_cast<int>(x);
  ASSIGN_OR_RETURN(x, get_int(v, origin, "vision_config.", "patch_size", 1, 1 << 16));
  c.patch_size = static_cast<int>(x);
  ASSIGN_OR_RETURN(x, get_int(v, origin, "vision_config.", "num_channels", 1, 16, 3));
  c.channels = static_cast<int>(x);
  if (c.image_size % c.patch_size != 0)
    return key_error(Errc::format_error, origin, "vision_config.patch_size",
                     std::to_string(c.patch_size) + " does not divide image_size " + std::to_string(c.image_size));
  if (static_cast<std::int64_t>(c.patches()) + 1 > kMaxPositions)
    return key_error(Errc::format_error, origin, "vision_config.image_size", "gives too many patches");
  c.vision.positions = c.patches() + 1;
  double ls = 0;
  ASSIGN_OR_RETURN(ls, get_num(j, origin, "", "logit_scale_init_value", -100.0, 100.0, 2.6592));
  c.logit_scale = static_cast<float>(ls);
  return c;
}

Status parse_clip_preprocessor(std::string_view json_text, const std::string& origin, ClipConfig& c) {
  Json j;
  ASSIGN_OR_RETURN(j, detail::parse_json(json_text, origin));
  if (!j.is_object()) return fail(Errc::format_error, origin + ": must be a JSON object");
  ASSIGN_OR_RETURN(c.image_mean, get_floats3(j, origin, "image_mean", c.image_mean));
  ASSIGN_OR_RETURN(c.image_std, get_floats3(j, origin, "image_std", c.image_std));
  for (float s : c.image_std)
    if (!(s > 0)) return key_error(Errc::format_error, origin, "image_std", "must be positive");
  return {};
}

std::vector<std::pair<std::string, std::vector<std::int64_t>>> clip_required_tensors(const ClipConfig& c) {
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  auto tower = [&](const std::string& p, const ClipTowerShape& s) {
    const std::int64_t h = s.hidden, f = s.intermediate;
    for (int i = 0; i < s.layers; ++i) {
      const std::string l = p + "encoder.layers." + std::to_string(i) + ".";
      for (const char* proj : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
        out.push_back({l + "self_attn." + proj + ".weight", {h, h}});
        out.push_back({l + "self_attn." + proj + ".bias", {h}});
      }
      out.push_back({l + "layer_norm1.weight", {h}});
      out.push_back({l + "layer_norm1.bias", {h}});
      out.push_back({l + "mlp.fc1.weight", {f, h}});
      out.push_back({l + "mlp.fc1.bias", {f}});
      out.push_back({l + "mlp.fc2.weight", {h, f}});
      out.push_back({l + "mlp.fc2.bias", {h}});
      out.push_back({l + "layer_norm2.weight", {h}});
      out.push_back({l + "layer_norm2.bias", {h}});
    }
  };
  const std::int64_t th = c.text.hidden, vh = c.vision.hidden;
  out.push_back({"text_model.embeddings.token_embedding.weight", {c.vocab, th}});
  out.push_back({"text_model.embeddings.position_embedding.weight", {c.text.positions, th}});
  tower("text_model.", c.text);
  out.push_back({"text_model.final_layer_norm.weight", {th}});
  out.push_back({"text_model.final_layer_norm.bias", {th}});
  out.push_back({"vision_model.embeddings.class_embedding", {vh}});
  out.push_back({"vision_model.embeddings.patch_embedding.weight", {vh, c.channels, c.patch_size, c.patch_size}});
  out.push_back({"vision_model.embeddings.position_embedding.weight", {c.vision.positions, vh}});
  out.push_back({"vision_model.pre_layrnorm.weight", {vh}});
  out.push_back({"vision_model.pre_layrnorm.bias", {vh}});
  tower("vision_model.", c.vision);
  out.push_back({"vision_model.post_layernorm.weight", {vh}});
  out.push_back({"vision_model.post_layernorm.bias", {vh}});
  out.push_back({"visual_projection.weight", {c.projection_dim, vh}});
  out.push_back({"text_projection.weight", {c.projection_dim, th}});
  out.push_back({"logit_scale", {}});
  return out;
}

std::optional<std::string> clip_gguf_name_from_hf(std::string_view hf) {
  if (hf == "text_projection.weight" || hf == "visual_projection.weight") return std::string(hf);
  if (!starts_with(hf, "text_model.") && !starts_with(hf, "vision_model.")) return std::nullopt;
  if (hf.find("position_ids") != std::string_view::npos) return std::nullopt;
  // convert_image_encoder_to_gguf.py's get_tensor_name, the same replacements in the same order.
  std::string s(hf);
  static const std::pair<std::string_view, std::string_view> kRepl[] = {
      {"text_model", "t"},   {"vision_model", "v"}, {"encoder.layers", "blk"}, {"embeddings.", ""},
      {"_proj", ""},         {"self_attn.", "attn_"}, {"layer_norm", "ln"},    {"layernorm", "ln"},
      {"mlp.fc1", "ffn_down"}, {"mlp.fc2", "ffn_up"}, {"embedding", "embd"},   {"final", "post"},
      {"layrnorm", "ln"}};
  for (const auto& [from, to] : kRepl) s = replace_all(std::move(s), from, to);
  return s;
}

std::optional<std::string> clip_hf_name_from_gguf(std::string_view g) {
  if (g == "text_projection.weight" || g == "visual_projection.weight") return std::string(g);
  std::string p, rest;
  if (starts_with(g, "t.")) {
    p = "text_model.";
  } else if (starts_with(g, "v.")) {
    p = "vision_model.";
  } else {
    return std::nullopt;
  }
  rest = std::string(g.substr(2));
  const bool text = p == "text_model.";
  auto suffix = [](const std::string& r, std::string_view head, std::string& tail) {
    if (!starts_with(r, head)) return false;
    tail = r.substr(head.size());
    return tail == ".weight" || tail == ".bias" || tail.empty();
  };
  std::string tail;
  if (text && suffix(rest, "token_embd", tail)) return p + "embeddings.token_embedding" + tail;
  if (suffix(rest, "position_embd", tail)) return p + "embeddings.position_embedding" + tail;
  if (!text && rest == "class_embd") return p + "embeddings.class_embedding";
  if (!text && suffix(rest, "patch_embd", tail)) return p + "embeddings.patch_embedding" + tail;
  if (!text && suffix(rest, "pre_ln", tail)) return p + "pre_layrnorm" + tail;
  if (suffix(rest, "post_ln", tail)) return p + (text ? "final_layer_norm" : "post_layernorm") + tail;
  if (starts_with(rest, "blk.")) {
    const std::size_t dot = rest.find('.', 4);
    if (dot == std::string::npos || dot == 4) return std::nullopt;
    const std::string idx = rest.substr(4, dot - 4);
    for (char ch : idx)
      if (ch < '0' || ch > '9') return std::nullopt;
    const std::string r = rest.substr(dot + 1);
    static const std::pair<std::string_view, std::string_view> kBlk[] = {
        {"attn_q", "self_attn.q_proj"}, {"attn_k", "self_attn.k_proj"},  {"attn_v", "self_attn.v_proj"},
        {"attn_out", "self_attn.out_proj"}, {"ln1", "layer_norm1"},      {"ln2", "layer_norm2"},
        {"ffn_down", "mlp.fc1"},        {"ffn_up", "mlp.fc2"}};
    for (const auto& [from, to] : kBlk)
      if (suffix(r, from, tail) && !tail.empty()) return p + "encoder.layers." + idx + "." + std::string(to) + tail;
  }
  return std::nullopt;
}

Result<ClipConfig> clip_config_from_gguf(const GgufFile& f) {
  const std::string& origin = f.path();
  auto str = [&](std::string_view key) -> std::optional<std::string> {
    const GgufValue* v = f.find(key);
    if (!v || v->type != GgufType::string) return std::nullopt;
    return v->str;
  };
  const auto arch = str("general.architecture");
  if (!arch) return fail(Errc::format_error, origin + ": general.architecture is missing");
  if (*arch != "clip") return fail(Errc::unsupported, origin + ": general.architecture '" + detail::printable(*arch) + "' is not clip");
  for (const char* k : {"clip.has_text_encoder", "clip.has_vision_encoder"}) {
    const GgufValue* v = f.find(k);
    if (!v || v->type != GgufType::boolean) return fail(Errc::format_error, origin + ": " + k + " is missing or not a bool");
    if (v->u == 0) return fail(Errc::unsupported, origin + ": " + k + " is false; Tandem needs both encoders");
  }
  auto uint = [&](const std::string& key, std::int64_t lo, std::int64_t hi) -> Result<int> {
    const GgufValue* v = f.find(key);
    if (!v) return fail(Errc::format_error, origin + ": " + key + " is missing");
    const auto x = v->as_i64();
    if (!v->is_integer() || !x) return fail(Errc::format_error, origin + ": " + key + " must be an integer");
    if (*x < lo || *x > hi) return fail(Errc::format_error, origin + ": " + key + " is out of range");
    return static_cast<int>(*x);
  };
  auto num = [&](const std::string& key, double def) -> Result<double> {
    const GgufValue* v = f.find(key);
    if (!v) return def;
    const auto x = v->as_f64();
    if (!x || !std::isfinite(*x)) return fail(Errc::format_error, origin + ": " + key + " must be a number");
    return *x;
  };
  bool gelu = false;
  if (const GgufValue* v = f.find("clip.use_gelu")) gelu = v->type == GgufType::boolean && v->u != 0;
  ClipConfig c;
  auto tower = [&](const std::string& p, ClipTowerShape& t) -> Status {
    ASSIGN_OR_RETURN(t.hidden, uint(p + "embedding_length", 1, kMaxHidden));
    ASSIGN_OR_RETURN(t.intermediate, uint(p + "feed_forward_length", 1, kMaxIntermediate));
    ASSIGN_OR_RETURN(t.heads, uint(p + "attention.head_count", 1, kMaxHeads));
    ASSIGN_OR_RETURN(t.layers, uint(p + "block_count", 1, kMaxLayers));
    ASSIGN_OR_RETURN(t.eps, num(p + "attention.layer_norm_epsilon", 1e-5));
    if (t.hidden % t.heads != 0)
      return fail(Errc::format_error, origin + ": " + p + "attention.head_count does not divide embedding_length");
    t.act = gelu ? "gelu" : "quick_gelu";
    return {};
  };
  TANDEM_TRY(tower("clip.text.", c.text));
  TANDEM_TRY(tower("clip.vision.", c.vision));
  if (const GgufValue* v = f.find("clip.text.use_gelu"); v && v->type == GgufType::boolean)
    c.text.act = v->u ? "gelu" : "quick_gelu";
  ASSIGN_OR_RETURN(c.text.positions, uint("clip.text.context_length", 1, kMaxPositions));
  ASSIGN_OR_RETURN(c.projection_dim, uint("clip.text.projection_dim", 1, kMaxHidden));
  int vproj = 0;
  ASSIGN_OR_RETURN(vproj, uint("clip.vision.projection_dim", 1, kMaxHidden));
  if (vproj != c.projection_dim)
    return fail(Errc::format_error, origin + ": clip.vision.projection_dim " + std::to_string(vproj) +
                                        " differs from clip.text.projection_dim " + std::to_string(c.projection_dim));
  ASSIGN_OR_RETURN(c.image_size, uint("clip.vision.image_size", 1, 1 << 16));
  ASSIGN_OR_RETURN(c.patch_size, uint("clip.vision.patch_size", 1, 1 << 16));
  if (c.image_size % c.patch_size != 0)
    return fail(Errc::format_error, origin + ": clip.vision.patch_size does not divide clip.vision.image_size");
  c.vision.positions = c.patches() + 1;
  const GgufTensorInfo* te = f.find_tensor("t.token_embd.weight");
  if (!te || te->ne.size() != 2) return fail(Errc::format_error, origin + ": tensor 't.token_embd.weight' is missing or not 2-D");
  if (te->ne[1] < 1 || te->ne[1] > static_cast<std::uint64_t>(kMaxVocab))
    return fail(Errc::format_error, origin + ": tensor 't.token_embd.weight' has a vocabulary out of range");
  c.vocab = static_cast<int>(te->ne[1]);
  const GgufTensorInfo* pe = f.find_tensor("v.patch_embd.weight");
  if (pe && pe->ne.size() == 4 && pe->ne[2] >= 1 && pe->ne[2] <= 16) c.channels = static_cast<int>(pe->ne[2]);
  for (auto [key, dst] : {std::pair{"clip.vision.image_mean", &c.image_mean}, std::pair{"clip.vision.image_std", &c.image_std}}) {
    const GgufValue* v = f.find(key);
    if (!v) continue;
    if (v->type != GgufType::array || v->count != 3)
      return fail(Errc::format_error, origin + ": " + key + " must be an array of 3 numbers");
    dst->clear();
    for (std::uint64_t i = 0; i < 3; ++i) {
      const auto x = v->float_at(i);
      if (!x) return fail(Errc::format_error, origin + ": " + key + " must be an array of 3 numbers");
      dst->push_back(static_cast<float>(*x));
    }
  }
  if (const GgufValue* v = f.find("clip.text.eos_token_id")) {
    const auto x = v->as_i64();
    if (!v->is_integer() || !x || *x < -1 || *x >= c.vocab)
      return fail(Errc::format_error, origin + ": clip.text.eos_token_id is out of range");
    c.eos_id = static_cast<std::int32_t>(*x);
  } else if (const GgufValue* toks = f.find("tokenizer.ggml.tokens")) {
    for (std::size_t i = 0; i < toks->strings.size() && i < static_cast<std::size_t>(c.vocab); ++i)
      if (toks->strings[i] == "<|endoftext|>") c.eos_id = static_cast<std::int32_t>(i);
  }
  if (const GgufValue* v = f.find("clip.text.bos_token_id")) {
    const auto x = v->as_i64();
    if (!v->is_integer() || !x || *x < -1 || *x >= c.vocab)
      return fail(Errc::format_error, origin + ": clip.text.bos_token_id is out of range");
    c.bos_id = static_cast<std::int32_t>(*x);
  }
  if (const GgufValue* v = f.find("clip.text.legacy_eos_argmax"); v && v->type == GgufType::boolean)
    c.legacy_eos_argmax = v->u != 0;
  double ls = 0;
  ASSIGN_OR_RETURN(ls, num("clip.logit_scale", 2.6592));
  c.logit_scale = static_cast<float>(ls);
  return c;
}

Result<std::vector<TensorView>> clip_tensor_views_from_gguf(const GgufFile& f, const ClipConfig& c) {
  std::vector<TensorView> out;
  for (const GgufTensorInfo& t : f.tensors()) {
    auto hf = clip_hf_name_from_gguf(t.name);
    if (!hf) continue;
    out.push_back(gguf_tensor_view(f, t, std::move(*hf)));
  }
  // fc1/fc2 by shape: when "fc1" (the legacy ffn_down) has fc2's shape and vice versa, the file names them the
  // other way round.
  auto at = [&](const std::string& n) -> TensorView* {
    for (auto& t : out)
      if (t.name == n) return &t;
    return nullptr;
  };
  for (const auto& [p, s] : {std::pair{std::string("text_model."), c.text}, std::pair{std::string("vision_model."), c.vision}}) {
    if (s.hidden == s.intermediate) continue;
    for (int i = 0; i < s.layers; ++i) {
      const std::string l = p + "encoder.layers." + std::to_string(i) + ".mlp.";
      TensorView* w1 = at(l + "fc1.weight");
      TensorView* w2 = at(l + "fc2.weight");
      const std::vector<std::int64_t> fc1{s.intermediate, s.hidden}, fc2{s.hidden, s.intermediate};
      if (w1 && w2 && w1->shape == fc2 && w2->shape == fc1) {
        std::swap(w1->name, w2->name);
        TensorView* b1 = at(l + "fc1.bias");
        TensorView* b2 = at(l + "fc2.bias");
        if (b1 && b2) std::swap(b1->name, b2->name);
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const TensorView& a, const TensorView& b) { return a.name < b.name; });
  for (std::size_t i = 1; i < out.size(); ++i)
    if (out[i].name == out[i - 1].name)
      return fail(Errc::format_error, f.path() + ": two tensors map to '" + out[i].name + "'");
  return out;
}

Result<std::vector<std::string>> clip_vocab_tokens(std::string_view text, const std::string& origin) {
  Json j;
  ASSIGN_OR_RETURN(j, detail::parse_json(text, origin));
  if (!j.is_object()) return fail(Errc::format_error, origin + ": must be an object of token -> id");
  std::vector<std::string> tokens(j.size());
  std::vector<bool> seen(j.size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    const auto id = detail::json_int(*it);
    if (!id || *id < 0 || static_cast<std::size_t>(*id) >= tokens.size() || seen[static_cast<std::size_t>(*id)])
      return fail(Errc::format_error, origin + ": token " + detail::printable(it.key()) +
                                          " has an id that is not in [0, size) or is repeated");
    seen[static_cast<std::size_t>(*id)] = true;
    tokens[static_cast<std::size_t>(*id)] = it.key();
  }
  return tokens;
}

}  // namespace tandem::weights
