#include "weights/whisper_layout.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "weights/json_util.h"
#include "weights/model_limits.h"

namespace tandem::weights {

using detail::Json;

namespace {

using namespace limits;

Failure key_error(Errc code, const std::string& origin, const std::string& key, const std::string& what) {
  return fail(code, origin + ": " + key + " " + what);
}

Result<std::int64_t> get_int(const Json& obj, const std::string& origin, const char* key, std::int64_t lo,
                             std::int64_t hi, std::optional<std::int64_t> def = std::nullopt) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (def) return *def;
    return key_error(Errc::format_error, origin, key, "is missing");
  }
  const auto v = detail::json_int(*it);
  if (!v) return key_error(Errc::format_error, origin, key, "must be an integer, got " + std::string(detail::json_kind(*it)));
  if (*v < lo || *v > hi)
    return key_error(Errc::format_error, origin, key,
                     "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(*v));
  return *v;
}

}  // namespace

Result<WhisperConfig> parse_whisper_config(std::string_view json_text, const std::string& origin) {
  auto parsed = detail::parse_json(json_text, origin);
  if (!parsed) return fail(std::move(parsed).error());
  const Json& j = *parsed;
  if (!j.is_object()) return fail(Errc::format_error, origin + ": must be a JSON object");
  if (const auto mt = j.find("model_type"); mt != j.end() && !mt->is_null()) {
    if (!mt->is_string()) return key_error(Errc::format_error, origin, "model_type", "must be a string");
    if (mt->get_ref<const std::string&>() != "whisper")
      return key_error(Errc::unsupported, origin, "model_type",
                       "\"" + detail::printable(mt->get_ref<const std::string&>()) + "\" is not whisper");
  }
  WhisperConfig c;
  struct IntKey {
    const char* key;
    int* dst;
    std::int64_t lo, hi;
    std::optional<std::int64_t> def;
  };
  const IntKey keys[] = {
      {"d_model", &c.d_model, 1, kMaxHidden, std::nullopt},
      {"encoder_layers", &c.encoder_layers, 1, kMaxLayers, std::nullopt},
      {"decoder_layers", &c.decoder_layers, 1, kMaxLayers, std::nullopt},
      {"encoder_attention_heads", &c.encoder_heads, 1, kMaxHeads, std::nullopt},
      {"decoder_attention_heads", &c.decoder_heads, 1, kMaxHeads, std::nullopt},
      {"encoder_ffn_dim", &c.encoder_ffn, 1, kMaxIntermediate, std::nullopt},
      {"decoder_ffn_dim", &c.decoder_ffn, 1, kMaxIntermediate, std::nullopt},
      {"num_mel_bins", &c.n_mels, 1, 1024, 80},
      {"max_source_positions", &c.source_positions, 1, 1 << 16, 1500},
      {"max_target_positions", &c.target_positions, 1, 1 << 16, 448},
      {"vocab_size", &c.vocab, 1, kMaxVocab, std::nullopt},
  };
  for (const IntKey& k : keys) {
    auto v = get_int(j, origin, k.key, k.lo, k.hi, k.def);
    if (!v) return fail(std::move(v).error());
    *k.dst = static_cast<int>(*v);
  }
  for (auto [key, heads] : {std::pair{"encoder_attention_heads", c.encoder_heads}, std::pair{"decoder_attention_heads", c.decoder_heads}})
    if (c.d_model % heads != 0)
      return key_error(Errc::format_error, origin, key, std::to_string(heads) + " does not divide d_model " + std::to_string(c.d_model));
  if (const auto it = j.find("activation_function"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return key_error(Errc::format_error, origin, "activation_function", "must be a string");
    const auto& s = it->get_ref<const std::string&>();
    if (s != "gelu")
      return key_error(Errc::unsupported, origin, "activation_function",
                       "\"" + detail::printable(s) + "\" is not supported (gelu)");
  }
  if (const auto it = j.find("scale_embedding"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return key_error(Errc::format_error, origin, "scale_embedding", "must be true or false");
    c.scale_embedding = it->get<bool>();
  }
  for (auto [key, dst] : {std::pair{"decoder_start_token_id", &c.decoder_start_id}, std::pair{"eos_token_id", &c.eos_id},
                          std::pair{"pad_token_id", &c.pad_id}, std::pair{"bos_token_id", &c.bos_id}}) {
    auto v = get_int(j, origin, key, -1, c.vocab - 1, -1);
    if (!v) return fail(std::move(v).error());
    *dst = static_cast<std::int32_t>(*v);
  }
  return c;
}

std::vector<std::pair<std::string, std::vector<std::int64_t>>> whisper_required_tensors(const WhisperConfig& c) {
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  const std::int64_t d = c.d_model;
  auto vec = [&](const std::string& n, std::int64_t len) { out.push_back({n, {len}}); };
  auto lin = [&](const std::string& n, std::int64_t o, std::int64_t i, bool bias) {
    out.push_back({n + ".weight", {o, i}});
    if (bias) vec(n + ".bias", o);
  };
  auto norm = [&](const std::string& n) {
    vec(n + ".weight", d);
    vec(n + ".bias", d);
  };
  auto attn = [&](const std::string& p) {
    lin(p + ".q_proj", d, d, true);
    lin(p + ".k_proj", d, d, false);
    lin(p + ".v_proj", d, d, true);
    lin(p + ".out_proj", d, d, true);
  };
  out.push_back({"model.encoder.conv1.weight", {d, c.n_mels, 3}});
  vec("model.encoder.conv1.bias", d);
  out.push_back({"model.encoder.conv2.weight", {d, d, 3}});
  vec("model.encoder.conv2.bias", d);
  out.push_back({"model.encoder.embed_positions.weight", {c.source_positions, d}});
  for (int i = 0; i < c.encoder_layers; ++i) {
    const std::string l = "model.encoder.layers." + std::to_string(i) + ".";
    attn(l + "self_attn");
    norm(l + "self_attn_layer_norm");
    lin(l + "fc1", c.encoder_ffn, d, true);
    lin(l + "fc2", d, c.encoder_ffn, true);
    norm(l + "final_layer_norm");
  }
  norm("model.encoder.layer_norm");
  out.push_back({"model.decoder.embed_tokens.weight", {c.vocab, d}});
  out.push_back({"model.decoder.embed_positions.weight", {c.target_positions, d}});
  for (int i = 0; i < c.decoder_layers; ++i) {
    const std::string l = "model.decoder.layers." + std::to_string(i) + ".";
    attn(l + "self_attn");
    norm(l + "self_attn_layer_norm");
    attn(l + "encoder_attn");
    norm(l + "encoder_attn_layer_norm");
    lin(l + "fc1", c.decoder_ffn, d, true);
    lin(l + "fc2", d, c.decoder_ffn, true);
    norm(l + "final_layer_norm");
  }
  norm("model.decoder.layer_norm");
  return out;
}

Result<WhisperConfig> whisper_config_from_gguf(const GgufFile& f) {
  const std::string& origin = f.path();
  const GgufValue* arch = f.find("general.architecture");
  if (!arch || arch->type != GgufType::string) return fail(Errc::format_error, origin + ": general.architecture is missing");
  if (arch->str != "whisper")
    return fail(Errc::unsupported, origin + ": general.architecture '" + detail::printable(arch->str) + "' is not whisper");
  auto integer = [&](const std::string& key, std::int64_t lo, std::int64_t hi, std::optional<std::int64_t> def) -> Result<std::int64_t> {
    const GgufValue* v = f.find(key);
    if (!v) {
      if (def) return *def;
      return fail(Errc::format_error, origin + ": " + key + " is missing");
    }
    const auto x = v->as_i64();
    if (!v->is_integer() || !x) return fail(Errc::format_error, origin + ": " + key + " must be an integer");
    if (*x < lo || *x > hi) return fail(Errc::format_error, origin + ": " + key + " is out of range");
    return *x;
  };
  WhisperConfig c;
  const GgufTensorInfo* te = f.find_tensor("model.decoder.embed_tokens.weight");
  if (!te || te->ne.size() != 2 || te->ne[1] < 1 || te->ne[1] > static_cast<std::uint64_t>(kMaxVocab))
    return fail(Errc::format_error, origin + ": tensor 'model.decoder.embed_tokens.weight' is missing or not [vocab, d]");
  c.vocab = static_cast<int>(te->ne[1]);
  struct Key {
    const char* key;
    int* dst;
    std::int64_t hi;
    std::optional<std::int64_t> def;
  };
  const Key keys[] = {
      {"whisper.embedding_length", &c.d_model, kMaxHidden, std::nullopt},
      {"whisper.encoder.block_count", &c.encoder_layers, kMaxLayers, std::nullopt},
      {"whisper.decoder.block_count", &c.decoder_layers, kMaxLayers, std::nullopt},
      {"whisper.encoder.attention.head_count", &c.encoder_heads, kMaxHeads, std::nullopt},
      {"whisper.decoder.attention.head_count", &c.decoder_heads, kMaxHeads, std::nullopt},
      {"whisper.encoder.feed_forward_length", &c.encoder_ffn, kMaxIntermediate, std::nullopt},
      {"whisper.decoder.feed_forward_length", &c.decoder_ffn, kMaxIntermediate, std::nullopt},
      {"whisper.n_mels", &c.n_mels, 1024, 80},
      {"whisper.encoder.context_length", &c.source_positions, 1 << 16, 1500},
      {"whisper.decoder.context_length", &c.target_positions, 1 << 16, 448},
  };
  for (const Key& k : keys) {
    auto v = integer(k.key, 1, k.hi, k.def);
    if (!v) return fail(std::move(v).error());
    *k.dst = static_cast<int>(*v);
  }
  for (auto [key, heads] : {std::pair{"whisper.encoder.attention.head_count", c.encoder_heads},
                            std::pair{"whisper.decoder.attention.head_count", c.decoder_heads}})
    if (c.d_model % heads != 0) return fail(Errc::format_error, origin + ": " + key + " does not divide whisper.embedding_length");
  if (const GgufValue* v = f.find("whisper.scale_embedding")) {
    if (v->type != GgufType::boolean) return fail(Errc::format_error, origin + ": whisper.scale_embedding must be a bool");
    c.scale_embedding = v->u != 0;
  }
  for (auto [key, dst] : {std::pair{"whisper.decoder_start_token_id", &c.decoder_start_id}, std::pair{"whisper.eos_token_id", &c.eos_id},
                          std::pair{"whisper.pad_token_id", &c.pad_id}, std::pair{"whisper.bos_token_id", &c.bos_id}}) {
    auto v = integer(key, -1, c.vocab - 1, -1);
    if (!v) return fail(std::move(v).error());
    *dst = static_cast<std::int32_t>(*v);
  }
  return c;
}

std::vector<TensorView> whisper_tensor_views_from_gguf(const GgufFile& f) {
  std::vector<TensorView> out;
  for (const GgufTensorInfo& t : f.tensors()) {
    out.push_back(gguf_tensor_view(f, t, t.name));
  }
  std::sort(out.begin(), out.end(), [](const TensorView& a, const TensorView& b) { return a.name < b.name; });
  return out;
}

}  // namespace tandem::weights
