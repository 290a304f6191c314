#include "weights/whisper_layout.h"

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

}  // namespace tandem::weights
