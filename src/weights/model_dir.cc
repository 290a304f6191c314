#include "weights/model_dir.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <utility>

#include "core/sha256.h"
#include "weights/json_util.h"
#include "weights/model_limits.h"

namespace tandem::weights {

using detail::Json;

namespace {

constexpr std::uint64_t kMaxJsonFileBytes = 64ull * 1024 * 1024;  // config / index / tokenizer_config / generation

using namespace limits;  // the bounds shared with GGUF metadata (weights/model_limits.h)

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string num_str(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string show(const Json& v) {
  if (v.is_number() || v.is_boolean() || v.is_null()) return v.dump();
  if (v.is_string() && v.get_ref<const std::string&>().size() <= 64) return v.dump();
  return std::string(detail::json_kind(v));
}

// Typed access to the keys of one JSON object, with messages "<origin>: <key> ...".
class Fields {
 public:
  Fields(const Json& obj, std::string origin, std::string prefix = "")
      : obj_(obj), origin_(std::move(origin)), prefix_(std::move(prefix)) {}

  const std::string& origin() const { return origin_; }
  std::string key_name(const char* key) const { return prefix_ + key; }

  // Present and not null.
  const Json* get(const char* key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  Failure error(Errc code, const char* key, const std::string& what) const {
    return fail(code, origin_ + ": " + key_name(key) + " " + what);
  }

  Result<std::int64_t> integer(const char* key, std::int64_t lo, std::int64_t hi) const {
    const Json* v = get(key);
    if (v == nullptr) return error(Errc::format_error, key, "is missing");
    return integer_value(key, *v, lo, hi);
  }
  Result<std::optional<std::int64_t>> opt_integer(const char* key, std::int64_t lo, std::int64_t hi) const {
    const Json* v = get(key);
    if (v == nullptr) return std::optional<std::int64_t>{};
    auto r = integer_value(key, *v, lo, hi);
    if (!r) return fail(std::move(r).error());
    return std::optional<std::int64_t>{*r};
  }
  Result<std::int64_t> integer_value(const char* key, const Json& v, std::int64_t lo, std::int64_t hi) const {
    const auto i = detail::json_int(v);
    if (!i || *i < lo || *i > hi) {
      return error(Errc::format_error, key,
                   "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + show(v));
    }
    return *i;
  }

  // A finite number with lo (<|<=) x <= hi.
  Result<std::optional<double>> opt_number(const char* key, double lo, bool lo_inclusive, double hi) const {
    const Json* v = get(key);
    if (v == nullptr) return std::optional<double>{};
    const double x = v->is_number() ? v->get<double>() : NAN;
    if (!v->is_number() || !std::isfinite(x) || (lo_inclusive ? x < lo : x <= lo) || x > hi) {
      return error(Errc::format_error, key,
                   std::string("must be a number in ") + (lo_inclusive ? "[" : "(") + num_str(lo) + ", " + num_str(hi) +
                       "], got " + show(*v));
    }
    return std::optional<double>{x};
  }
  Result<double> number(const char* key, double lo, bool lo_inclusive, double hi) const {
    auto r = opt_number(key, lo, lo_inclusive, hi);
    if (!r) return fail(std::move(r).error());
    if (!r->has_value()) return error(Errc::format_error, key, "is missing");
    return **r;
  }

  Result<std::optional<bool>> opt_bool(const char* key) const {
    const Json* v = get(key);
    if (v == nullptr) return std::optional<bool>{};
    if (!v->is_boolean()) return error(Errc::format_error, key, "must be a boolean, got " + show(*v));
    return std::optional<bool>{v->get<bool>()};
  }

  Result<std::optional<std::string>> opt_string(const char* key) const {
    const Json* v = get(key);
    if (v == nullptr) return std::optional<std::string>{};
    if (!v->is_string()) return error(Errc::format_error, key, "must be a string, got " + show(*v));
    return std::optional<std::string>{v->get<std::string>()};
  }

  // An int, an array of ints, or null/absent (empty).
  Result<std::vector<int>> token_ids(const char* key, std::int64_t max_id) const {
    std::vector<int> out;
    const Json* v = get(key);
    if (v == nullptr) return out;
    auto one = [&](const Json& x) -> Status {
      const auto i = detail::json_int(x);
      if (!i || *i < 0 || *i > max_id) {
        return error(Errc::format_error, key,
                     "must be token ids in [0, " + std::to_string(max_id) + "], got " + show(x));
      }
      out.push_back(static_cast<int>(*i));
      return {};
    };
    if (v->is_array()) {
      for (const auto& x : *v) TANDEM_TRY(one(x));
    } else {
      TANDEM_TRY(one(*v));
    }
    return out;
  }

 private:
  const Json& obj_;
  std::string origin_;
  std::string prefix_;
};

#define ASSIGN_OR_RETURN(lhs, expr)                        \
  do {                                                     \
    auto _r = (expr);                                      \
    if (!_r) return ::tandem::fail(std::move(_r).error()); \
    lhs = std::move(*_r);                                  \
  } while (0)

Result<Json> parse_object(std::string_view text, const std::string& origin) {
  auto j = detail::parse_json(text, origin);
  if (!j) return fail(std::move(j).error());
  if (!j->is_object()) {
    return fail(Errc::format_error, origin + ": must be a JSON object, got " + std::string(detail::json_kind(*j)));
  }
  return std::move(*j);
}

Status parse_rope_scaling(const Json& v, const std::string& origin, ModelConfig& c) {
  if (!v.is_object()) {
    return fail(Errc::format_error, origin + ": rope_scaling must be null or an object, got " + show(v));
  }
  const Fields f(v, origin, "rope_scaling.");
  std::optional<std::string> type;
  ASSIGN_OR_RETURN(type, f.opt_string("rope_type"));
  if (!type) ASSIGN_OR_RETURN(type, f.opt_string("type"));
  if (!type) return fail(Errc::format_error, origin + ": rope_scaling has neither \"rope_type\" nor \"type\"");
  if (*type == "default") {
    c.rope_scaling = RopeScaling::none;
  } else if (*type == "linear") {
    c.rope_scaling = RopeScaling::linear;
    ASSIGN_OR_RETURN(c.rope_factor, f.number("factor", 0.0, false, kMaxRopeFactor));
  } else if (*type == "llama3") {
    c.rope_scaling = RopeScaling::llama3;
    ASSIGN_OR_RETURN(c.rope_factor, f.number("factor", 0.0, false, kMaxRopeFactor));
    ASSIGN_OR_RETURN(c.rope_low_freq_factor, f.number("low_freq_factor", 0.0, false, kMaxRopeFactor));
    ASSIGN_OR_RETURN(c.rope_high_freq_factor, f.number("high_freq_factor", 0.0, false, kMaxRopeFactor));
    if (!(c.rope_high_freq_factor > c.rope_low_freq_factor)) {
      return fail(Errc::format_error, origin + ": rope_scaling.high_freq_factor (" + num_str(c.rope_high_freq_factor) +
                                          ") must be greater than low_freq_factor (" + num_str(c.rope_low_freq_factor) +
                                          ")");
    }
    std::int64_t omp = 0;
    ASSIGN_OR_RETURN(omp, f.integer("original_max_position_embeddings", 1, kMaxPositions));
    c.rope_original_max_positions = static_cast<int>(omp);
  } else if ((*type == "longrope" || *type == "su") && c.architecture == "Phi3ForCausalLM") {
    c.rope_scaling = RopeScaling::longrope;
    const std::size_t n = static_cast<std::size_t>(c.head_dim / 2);
    for (const char* key : {"short_factor", "long_factor"}) {
      const Json* a = f.get(key);
      if (a == nullptr) return f.error(Errc::format_error, key, "is missing (longrope)");
      if (!a->is_array() || a->size() != n) {
        return f.error(Errc::format_error, key,
                       "must be an array of " + std::to_string(n) + " numbers (head_dim / 2), got " + show(*a) +
                           (a->is_array() ? " of length " + std::to_string(a->size()) : ""));
      }
      std::vector<float>& out = key[0] == 's' ? c.rope_short_factors : c.rope_long_factors;
      for (std::size_t i = 0; i < n; ++i) {
        const Json& x = (*a)[i];
        const double d = x.is_number() ? x.get<double>() : NAN;
        if (!std::isfinite(d) || d <= 0.0 || d > kMaxRopeFactor) {
          return f.error(Errc::format_error, key,
                         "element " + std::to_string(i) + " must be a number in (0, " + num_str(kMaxRopeFactor) +
                             "], got " + show(x));
        }
        out.push_back(static_cast<float>(d));
      }
    }
    ASSIGN_OR_RETURN(c.rope_attention_factor, f.opt_number("attention_factor", 0.0, false, kMaxRopeFactor));
  } else {
    return fail(Errc::unsupported, origin + ": rope_scaling type \"" + (type->size() <= 64 ? *type : "(long)") +
                                       "\" is not supported (supported: llama3, linear; longrope/su for Phi3)");
  }
  return {};
}

// Plain file name inside the model directory: no separators, no "..", no control characters.
bool plain_file_name(const std::string& s) {
  if (s.empty() || s == "." || s.size() > 255) return false;
  if (s.find('/') != std::string::npos || s.find("..") != std::string::npos) return false;
  return std::none_of(s.begin(), s.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x20; });
}

void put_u64(Sha256& h, std::uint64_t v) {
  std::byte b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<std::byte>(v >> (8 * i));
  h.update(std::span<const std::byte>(b, 8));
}

void put_str(Sha256& h, std::string_view s) {
  put_u64(h, s.size());
  h.update(s);
}

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

// --- config.json --------------------------------------------------------------------------------------------------

Result<ModelConfig> ModelConfig::parse(std::string_view json_text, const std::string& origin) {
  Json j;
  ASSIGN_OR_RETURN(j, parse_object(json_text, origin));
  const Fields f(j, origin);
  ModelConfig c;

  // Architecture: "architectures" (list, any supported entry) or, when absent, "model_type".
  static const std::pair<const char*, const char*> kArch[] = {{"LlamaForCausalLM", "llama"},
                                                              {"MistralForCausalLM", "mistral"},
                                                              {"Qwen2ForCausalLM", "qwen2"},
                                                              {"Qwen3ForCausalLM", "qwen3"},
                                                              {"Phi3ForCausalLM", "phi3"}};
  constexpr const char* kSupported =
      "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM";
  if (const Json* a = f.get("architectures")) {
    if (!a->is_array() || a->empty()) {
      return f.error(Errc::format_error, "architectures", "must be a non-empty array of strings, got " + show(*a));
    }
    for (const auto& x : *a) {
      if (!x.is_string()) {
        return f.error(Errc::format_error, "architectures", "must contain strings, got " + show(x));
      }
      for (const auto& [arch, type] : kArch) {
        if (c.architecture.empty() && x.get_ref<const std::string&>() == arch) c.architecture = arch;
      }
    }
    if (c.architecture.empty()) {
      return f.error(Errc::unsupported, "architectures",
                     show((*a)[0]) + " is not supported (supported: " + kSupported + ")");
    }
  } else {
    std::optional<std::string> mt;
    ASSIGN_OR_RETURN(mt, f.opt_string("model_type"));
    if (!mt) return f.error(Errc::format_error, "architectures", "is missing (and there is no model_type)");
    for (const auto& [arch, type] : kArch) {
      if (*mt == type) c.architecture = arch;
    }
    if (c.architecture.empty()) {
      return f.error(Errc::unsupported, "model_type",
                     "\"" + (mt->size() <= 64 ? *mt : "(long)") +
                         "\" is not supported (supported: llama, mistral, qwen2, qwen3, phi3)");
    }
  }
  const bool qwen2 = c.architecture == "Qwen2ForCausalLM", phi3 = c.architecture == "Phi3ForCausalLM";
  const bool qwen3 = c.architecture == "Qwen3ForCausalLM";
  c.qkv_bias = qwen2;  // (Qwen3 has attention_bias false, refused when true below)
  c.qk_norm = qwen3;
  c.fused_projections = phi3;

  std::int64_t v = 0;
  ASSIGN_OR_RETURN(v, f.integer("hidden_size", 1, kMaxHidden));
  c.hidden_size = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, f.integer("intermediate_size", 1, kMaxIntermediate));
  c.intermediate_size = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, f.integer("num_hidden_layers", 1, kMaxLayers));
  c.num_layers = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, f.integer("num_attention_heads", 1, kMaxHeads));
  c.num_heads = static_cast<int>(v);
  std::optional<std::int64_t> ov;
  ASSIGN_OR_RETURN(ov, f.opt_integer("num_key_value_heads", 1, kMaxHeads));
  c.num_kv_heads = ov ? static_cast<int>(*ov) : c.num_heads;
  if (c.num_heads % c.num_kv_heads != 0) {
    return fail(Errc::format_error, origin + ": num_key_value_heads must divide num_attention_heads (" +
                                        std::to_string(c.num_heads) + "), got " + std::to_string(c.num_kv_heads));
  }
  ASSIGN_OR_RETURN(ov, f.opt_integer("head_dim", 1, kMaxHeadDim));
  if (ov) {
    c.head_dim = static_cast<int>(*ov);
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      return fail(Errc::format_error, origin + ": hidden_size (" + std::to_string(c.hidden_size) +
                                          ") is not a multiple of num_attention_heads (" + std::to_string(c.num_heads) +
                                          ") and head_dim is not given");
    }
    c.head_dim = c.hidden_size / c.num_heads;
    if (c.head_dim > kMaxHeadDim) {
      return fail(Errc::format_error, origin + ": head_dim (hidden_size / num_attention_heads = " +
                                          std::to_string(c.head_dim) + ") exceeds " + std::to_string(kMaxHeadDim));
    }
  }
  if (c.head_dim % 2 != 0) {
    return fail(Errc::format_error,
                origin + ": head_dim must be even for rotary embeddings, got " + std::to_string(c.head_dim));
  }
  ASSIGN_OR_RETURN(c.rms_norm_eps, f.number("rms_norm_eps", 0.0, false, 1.0));
  std::optional<double> od;
  ASSIGN_OR_RETURN(od, f.opt_number("rope_theta", 0.0, false, kMaxRopeTheta));
  c.rope_theta = od.value_or(10000.0);
  if (const Json* rs = f.get("rope_scaling")) TANDEM_TRY(parse_rope_scaling(*rs, origin, c));
  ASSIGN_OR_RETURN(v, f.integer("vocab_size", 1, kMaxVocab));
  c.vocab_size = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, f.integer("max_position_embeddings", 1, kMaxPositions));
  c.max_position_embeddings = static_cast<int>(v);
  std::optional<bool> ob;
  ASSIGN_OR_RETURN(ob, f.opt_bool("tie_word_embeddings"));
  c.tie_word_embeddings = ob.value_or(false);
  std::optional<std::string> os;
  ASSIGN_OR_RETURN(os, f.opt_string("torch_dtype"));
  c.torch_dtype = os.value_or("");
  if (c.torch_dtype.size() > 64) return f.error(Errc::format_error, "torch_dtype", "is too long");
  // Sliding window: Mistral and Phi-3 apply it (transformers' MistralAttention / Phi3Attention); Llama has none;
  // Qwen2 and Qwen3 only with use_sliding_window (false in the released models; its max_window_layers rule is not
  // implemented, so true is refused).
  ASSIGN_OR_RETURN(ov, f.opt_integer("sliding_window", 1, kMaxPositions));
  if (ov && (c.architecture == "MistralForCausalLM" || phi3)) c.sliding_window = static_cast<int>(*ov);
  if (qwen2 || qwen3) {
    ASSIGN_OR_RETURN(ob, f.opt_bool("use_sliding_window"));
    if (ob.value_or(false)) {
      return f.error(Errc::unsupported, "use_sliding_window",
                     "true is not supported (Qwen's per-layer max_window_layers rule is not implemented)");
    }
  }
  if (phi3) {
    ASSIGN_OR_RETURN(od, f.opt_number("partial_rotary_factor", 0.0, false, 1.0));
    if (od && *od < 1.0) {
      return f.error(Errc::unsupported, "partial_rotary_factor",
                     num_str(*od) + " is not supported (rotary embeddings over the whole head only)");
    }
    ASSIGN_OR_RETURN(ov, f.opt_integer("original_max_position_embeddings", 2, kMaxPositions));
    if (c.rope_scaling == RopeScaling::longrope) c.rope_original_max_positions = ov ? static_cast<int>(*ov) : 4096;
  }
  ASSIGN_OR_RETURN(c.bos_token_ids, f.token_ids("bos_token_id", c.vocab_size - 1));
  ASSIGN_OR_RETURN(c.eos_token_ids, f.token_ids("eos_token_id", c.vocab_size - 1));
  ASSIGN_OR_RETURN(os, f.opt_string("hidden_act"));
  if (os && *os != "silu") {
    return f.error(Errc::unsupported, "hidden_act",
                   "\"" + (os->size() <= 64 ? *os : "(long)") + "\" is not supported (only \"silu\")");
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    ASSIGN_OR_RETURN(ob, f.opt_bool(key));
    if (ob.value_or(false)) return f.error(Errc::unsupported, key, "true is not supported (no bias terms)");
  }
  return c;
}

// --- generation_config.json ---------------------------------------------------------------------------------------

Result<GenerationDefaults> GenerationDefaults::parse(std::string_view json_text, const std::string& origin) {
  Json j;
  ASSIGN_OR_RETURN(j, parse_object(json_text, origin));
  const Fields f(j, origin);
  GenerationDefaults g;
  ASSIGN_OR_RETURN(g.temperature, f.opt_number("temperature", 0.0, true, 1e6));
  ASSIGN_OR_RETURN(g.top_p, f.opt_number("top_p", 0.0, false, 1.0));
  std::optional<std::int64_t> ov;
  ASSIGN_OR_RETURN(ov, f.opt_integer("top_k", 0, kMaxVocab));
  if (ov) g.top_k = static_cast<int>(*ov);
  ASSIGN_OR_RETURN(g.repetition_penalty, f.opt_number("repetition_penalty", 0.0, false, 1e6));
  ASSIGN_OR_RETURN(g.do_sample, f.opt_bool("do_sample"));
  ASSIGN_OR_RETURN(ov, f.opt_integer("max_new_tokens", 1, kMaxPositions));
  if (ov) g.max_new_tokens = static_cast<int>(*ov);
  ASSIGN_OR_RETURN(g.bos_token_ids, f.token_ids("bos_token_id", kMaxTokenId));
  ASSIGN_OR_RETURN(g.eos_token_ids, f.token_ids("eos_token_id", kMaxTokenId));
  return g;
}

// --- tokenizer_config.json ----------------------------------------------------------------------------------------

Result<TokenizerSettings> TokenizerSettings::parse(std::string_view json_text, const std::string& origin) {
  Json j;
  ASSIGN_OR_RETURN(j, parse_object(json_text, origin));
  const Fields f(j, origin);
  TokenizerSettings t;
  ASSIGN_OR_RETURN(t.add_bos_token, f.opt_bool("add_bos_token"));
  ASSIGN_OR_RETURN(t.add_eos_token, f.opt_bool("add_eos_token"));
  if (const Json* ct = f.get("chat_template")) {
    if (ct->is_string()) {
      t.chat_template = ct->get<std::string>();
    } else if (ct->is_array()) {
      // [{"name": ..., "template": ...}, ...]: the entry named "default", else the first.
      const Json* chosen = nullptr;
      for (const auto& e : *ct) {
        if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("template") ||
            !e["template"].is_string()) {
          return f.error(Errc::format_error, "chat_template",
                         "array entries must be objects with string \"name\" and \"template\", got " + show(e));
        }
        if (chosen == nullptr || (e["name"] == "default" && (*chosen)["name"] != "default")) chosen = &e;
      }
      if (chosen != nullptr) t.chat_template = (*chosen)["template"].get<std::string>();
    } else {
      return f.error(Errc::format_error, "chat_template",
                     "must be a string or an array of {name, template}, got " + show(*ct));
    }
  }
  t.template_guess = guess_template(t.chat_template);
  return t;
}

std::string TokenizerSettings::guess_template(std::string_view t) {
  if (t.find("[INST]") != std::string_view::npos) return "llama2";
  if (t.find("<|im_start|>") != std::string_view::npos) return "chatml";
  if (t.find("<|user|>") != std::string_view::npos) return "zephyr";
  return "";
}

// --- ModelDir -----------------------------------------------------------------------------------------------------

std::vector<std::pair<std::string, std::vector<std::int64_t>>> ModelDir::required_tensors(const ModelConfig& c) {
  const std::int64_t hidden = c.hidden_size, inter = c.intermediate_size, vocab = c.vocab_size;
  const std::int64_t q = std::int64_t{c.num_heads} * c.head_dim, kv = std::int64_t{c.num_kv_heads} * c.head_dim;
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  out.reserve(3 + 12 * static_cast<std::size_t>(std::max(c.num_layers, 0)));
  out.push_back({"model.embed_tokens.weight", {vocab, hidden}});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out.push_back({p + "input_layernorm.weight", {hidden}});
    if (c.fused_projections) {
      out.push_back({p + "self_attn.qkv_proj.weight", {q + 2 * kv, hidden}});
    } else {
      out.push_back({p + "self_attn.q_proj.weight", {q, hidden}});
      out.push_back({p + "self_attn.k_proj.weight", {kv, hidden}});
      out.push_back({p + "self_attn.v_proj.weight", {kv, hidden}});
    }
    if (c.qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
      out.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
    }
    if (c.qkv_bias) {
      out.push_back({p + "self_attn.q_proj.bias", {q}});
      out.push_back({p + "self_attn.k_proj.bias", {kv}});
      out.push_back({p + "self_attn.v_proj.bias", {kv}});
    }
    out.push_back({p + "self_attn.o_proj.weight", {hidden, q}});
    out.push_back({p + "post_attention_layernorm.weight", {hidden}});
    if (c.fused_projections) {
      out.push_back({p + "mlp.gate_up_proj.weight", {2 * inter, hidden}});
    } else {
      out.push_back({p + "mlp.gate_proj.weight", {inter, hidden}});
      out.push_back({p + "mlp.up_proj.weight", {inter, hidden}});
    }
    out.push_back({p + "mlp.down_proj.weight", {hidden, inter}});
  }
  out.push_back({"model.norm.weight", {hidden}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {vocab, hidden}});
  return out;
}

Result<SafetensorsWeights> open_safetensors_weights(const std::string& dir) {
  SafetensorsWeights w;
  // Weights: a single model.safetensors (preferred when present, as in transformers) or an index with shards.
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  // For sharded models: tensor name -> shard file name from weight_map.
  std::map<std::string, std::string> weight_map;
  if (detail::is_regular_file(single)) {
    auto f = SafetensorsFile::open(single);
    if (!f) return fail(std::move(f).error());
    w.shards.push_back(std::move(*f));
  } else {
    auto text = detail::read_small_file(index_path, kMaxJsonFileBytes);
    if (!text) {
      if (text.error().code == Errc::not_found) {
        return fail(Errc::not_found, dir + ": neither model.safetensors nor model.safetensors.index.json found");
      }
      return fail(std::move(text).error());
    }
    Json j;
    ASSIGN_OR_RETURN(j, parse_object(*text, index_path));
    const auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object()) {
      return fail(Errc::format_error, index_path + ": weight_map must be an object of tensor name -> shard file");
    }
    if (wm->empty()) return fail(Errc::format_error, index_path + ": weight_map is empty");
    std::set<std::string> shard_names;  // sorted: the shard order used everywhere (ids, header_digest)
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it->is_string()) {
        return fail(Errc::format_error, index_path + ": weight_map entry for tensor " + detail::printable(it.key()) +
                                            " must be a string, got " + show(*it));
      }
      const std::string& shard = it->get_ref<const std::string&>();
      if (!plain_file_name(shard)) {
        return fail(Errc::format_error, index_path + ": tensor " + detail::printable(it.key()) + " names shard " +
                                            detail::printable(shard) +
                                            ", which is not a plain file name inside the model directory");
      }
      weight_map.emplace(it.key(), shard);
      shard_names.insert(shard);
    }
    for (const auto& name : shard_names) {
      const std::string p = dir + "/" + name;
      auto f = SafetensorsFile::open(p);
      if (!f) {
        if (f.error().code == Errc::not_found) {
          return fail(Errc::not_found, index_path + ": shard " + name + " listed in weight_map does not exist");
        }
        return fail(std::move(f).error());
      }
      w.shards.push_back(std::move(*f));
    }
  }

  // Tensor views over all shards; a name in two shards is ambiguous.
  std::map<std::string, int> where;
  for (int s = 0; s < static_cast<int>(w.shards.size()); ++s) {
    const auto& sf = w.shards[static_cast<std::size_t>(s)];
    for (const auto& t : sf.tensors()) {
      auto [it, inserted] = where.emplace(t.name, s);
      if (!inserted) {
        return fail(Errc::format_error, "tensor " + detail::printable(t.name) + " appears in two shards: " +
                                            w.shards[static_cast<std::size_t>(it->second)].path() + " and " +
                                            sf.path());
      }
      TensorView v{t.name, t.dtype, t.shape, sf.bytes(t), s};
      v.type_supported = t.dtype == DType::f32 || t.dtype == DType::f16 || t.dtype == DType::bf16;
      v.type = t.dtype == DType::f16    ? kernels::WType::f16
               : t.dtype == DType::bf16 ? kernels::WType::bf16
                                        : kernels::WType::f32;
      w.tensors.push_back(std::move(v));
    }
  }
  std::sort(w.tensors.begin(), w.tensors.end(),
            [](const TensorView& a, const TensorView& b) { return a.name < b.name; });

  // With an index, every listed tensor must be in the shard the index names.
  for (const auto& [name, shard] : weight_map) {
    auto it = where.find(name);
    const std::string& actual =
        it == where.end() ? std::string() : base_name(w.shards[static_cast<std::size_t>(it->second)].path());
    if (actual != shard) {
      return fail(Errc::format_error, index_path + ": weight_map puts tensor " + detail::printable(name) + " in " +
                                          shard + ", but " + dir + "/" + shard + " has no tensor " +
                                          detail::printable(name) +
                                          (actual.empty() ? "" : " (it is in " + actual + ")"));
    }
  }

  return w;
}

const TensorView* SafetensorsWeights::find(const std::string& name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const TensorView& t, const std::string& n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

Result<ModelDir> ModelDir::open(const std::string& dir_in) {
  ModelDir m;
  m.dir_ = dir_in;
  while (m.dir_.size() > 1 && m.dir_.back() == '/') m.dir_.pop_back();
  const std::string& dir = m.dir_;

  // A file is a GGUF model; so is a directory without config.json that holds exactly one *.gguf.
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return open_gguf(dir);
  if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && !detail::is_regular_file(dir + "/config.json")) {
    std::vector<std::string> ggufs;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0 && detail::is_regular_file(e.path())) {
        ggufs.push_back(name);
      }
    }
    std::sort(ggufs.begin(), ggufs.end());
    if (ggufs.size() == 1) return open_gguf(dir + "/" + ggufs[0]);
    if (ggufs.size() > 1) {
      std::string list;
      for (const auto& g : ggufs) list += (list.empty() ? "" : ", ") + g;
      return fail(Errc::format_error, dir + ": no config.json and " + std::to_string(ggufs.size()) +
                                          " .gguf files (" + list + "); name the one to use");
    }
  }

  // config.json (required), then the optional JSON side files.
  const std::string config_path = dir + "/config.json";
  ASSIGN_OR_RETURN(m.config_text_, detail::read_small_file(config_path, kMaxJsonFileBytes));
  ASSIGN_OR_RETURN(m.config_, ModelConfig::parse(m.config_text_, config_path));
  const ModelConfig& c = m.config_;
  {
    const std::string p = dir + "/generation_config.json";
    auto text = detail::read_small_file(p, kMaxJsonFileBytes);
    if (text) {
      ASSIGN_OR_RETURN(m.generation_, GenerationDefaults::parse(*text, p));
    } else if (text.error().code != Errc::not_found) {
      return fail(std::move(text).error());
    }
  }
  {
    const std::string p = dir + "/tokenizer_config.json";
    auto text = detail::read_small_file(p, kMaxJsonFileBytes);
    if (text) {
      ASSIGN_OR_RETURN(m.tokenizer_settings_, TokenizerSettings::parse(*text, p));
    } else if (text.error().code != Errc::not_found) {
      return fail(std::move(text).error());
    }
  }
  // The tokenizer: a SentencePiece tokenizer.model, or a Hugging Face tokenizer.json (BPE), at least one.
  if (!detail::is_regular_file(m.tokenizer_path()) && !detail::is_regular_file(m.tokenizer_json_path())) {
    return fail(Errc::not_found, dir + ": no tokenizer: neither tokenizer.model (SentencePiece) nor tokenizer.json "
                                       "(Hugging Face tokenizers) found");
  }

  {
    SafetensorsWeights w;
    ASSIGN_OR_RETURN(w, open_safetensors_weights(dir));
    m.shards_ = std::move(w.shards);
    m.tensors_ = std::move(w.tensors);
  }

  // Required tensors: present, implied shape, one float dtype.
  const TensorView* first = nullptr;
  for (const auto& [name, shape] : required_tensors(c)) {
    const TensorView* t = m.tensor(name);
    if (t == nullptr) {
      std::string files;
      for (const auto& s : m.shards_) files += (files.empty() ? "" : ", ") + s.path();
      return fail(Errc::format_error, files + ": required tensor '" + name + "' " + shape_str(shape) + " is missing");
    }
    const std::string& file = m.shards_[static_cast<std::size_t>(t->shard)].path();
    if (t->shape != shape) {
      return fail(Errc::format_error, file + ": tensor '" + name + "' has shape " + shape_str(t->shape) +
                                          ", expected " + shape_str(shape) + " from config.json");
    }
    if (t->dtype != DType::f32 && t->dtype != DType::f16 && t->dtype != DType::bf16) {
      return fail(Errc::unsupported, file + ": tensor '" + name + "' has dtype " + std::string(dtype_name(t->dtype)) +
                                         "; weights must be F32, F16 or BF16");
    }
    if (first == nullptr) {
      first = t;
    } else if (t->dtype != first->dtype) {
      return fail(Errc::format_error, file + ": tensor '" + name + "' has dtype " + std::string(dtype_name(t->dtype)) +
                                          " but '" + first->name + "' has " + std::string(dtype_name(first->dtype)) +
                                          "; all weights must share one dtype");
    }
  }
  m.dtype_ = first->dtype;  // required_tensors() is never empty
  if (c.fused_projections) TANDEM_TRY(m.add_fused_views(dir));
  return m;
}

Status ModelDir::add_fused_views(const std::string& origin) {
  const ModelConfig& c = config_;
  const std::int64_t q = std::int64_t{c.num_heads} * c.head_dim, kv = std::int64_t{c.num_kv_heads} * c.head_dim;
  const std::int64_t inter = c.intermediate_size;
  std::vector<TensorView> views;
  using Parts = std::initializer_list<std::pair<std::string, std::int64_t>>;  // (unfused name, rows)
  auto split = [&](const std::string& fused, Parts parts) -> Status {
    const TensorView* t = tensor(fused);  // present with the fused shape (checked as a required tensor)
    const std::size_t rb = kernels::row_bytes(t->type, t->shape[1]);
    std::int64_t row = 0;
    for (const auto& [name, rows] : parts) {
      if (tensor(name) != nullptr) {
        return fail(Errc::format_error, origin + ": tensor '" + name + "' is present next to the fused '" + fused +
                                            "' that holds its rows; the model must have one or the other");
      }
      TensorView v = *t;
      v.name = name;
      v.shape = {rows, t->shape[1]};
      v.data = t->data.subspan(static_cast<std::size_t>(row) * rb, static_cast<std::size_t>(rows) * rb);
      views.push_back(std::move(v));
      row += rows;
    }
    return {};
  };
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    TANDEM_TRY(split(p + "self_attn.qkv_proj.weight", {{p + "self_attn.q_proj.weight", q},
                                                      {p + "self_attn.k_proj.weight", kv},
                                                      {p + "self_attn.v_proj.weight", kv}}));
    TANDEM_TRY(split(p + "mlp.gate_up_proj.weight", {{p + "mlp.gate_proj.weight", inter},
                                                    {p + "mlp.up_proj.weight", inter}}));
  }
  for (auto& v : views) tensors_.push_back(std::move(v));
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorView& a, const TensorView& b) { return a.name < b.name; });
  return {};
}

double ModelConfig::longrope_attention_factor() const {
  if (rope_attention_factor) return *rope_attention_factor;
  const double s = static_cast<double>(max_position_embeddings) / rope_original_max_positions;
  if (s <= 1.0) return 1.0;
  return std::sqrt(1.0 + std::log(s) / std::log(static_cast<double>(rope_original_max_positions)));
}

const TensorView* ModelDir::tensor(const std::string& name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorView& t, const std::string& n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

std::uint64_t ModelDir::weight_bytes() const {
  std::uint64_t n = 0;
  for (const auto& [name, shape] : required_tensors(config_)) {
    if (const TensorView* t = tensor(name)) n += t->data.size();
  }
  return n;
}

std::uint64_t ModelDir::parameter_count() const {
  std::uint64_t n = 0;
  for (const auto& [name, shape] : required_tensors(config_)) {
    std::uint64_t p = 1;
    for (auto d : shape) p *= static_cast<std::uint64_t>(d);
    n += p;
  }
  return n;
}

std::string ModelDir::header_digest() const {
  Sha256 h;
  if (gguf_) {
    put_str(h, "tandem.weights.gguf.header.v1");
    put_u64(h, gguf_->file_size());
    const auto hb = gguf_->header_bytes();
    put_u64(h, hb.size());
    h.update(hb);
    return Sha256::hex(h.finish());
  }
  put_str(h, "tandem.weights.header.v1");
  put_str(h, config_text_);
  put_u64(h, shards_.size());
  for (const auto& s : shards_) {
    put_str(h, base_name(s.path()));
    put_u64(h, s.file().size());
    const auto hb = s.header_bytes();
    put_u64(h, hb.size());
    h.update(hb);
  }
  return Sha256::hex(h.finish());
}

std::string ModelDir::content_digest() const {
  Sha256 h;
  put_str(h, "tandem.weights.content.v1");
  for (const auto& [name, shape] : required_tensors(config_)) {
    const TensorView* t = tensor(name);
    put_str(h, name);
    const auto bytes = t != nullptr ? t->data : std::span<const std::byte>();
    put_u64(h, bytes.size());
    h.update(bytes);
  }
  return Sha256::hex(h.finish());
}

std::vector<const MappedFile*> ModelDir::mapped_files() const {
  std::vector<const MappedFile*> out;
  if (gguf_ && gguf_->mapped_file() != nullptr) out.push_back(gguf_->mapped_file());
  for (const auto& s : shards_) out.push_back(&s.file());
  return out;
}

Result<std::string> ModelDir::tokenizer_bytes() const {
  if (format_ == Format::gguf) {
    if (gguf_tokenizer_error_) return fail(*gguf_tokenizer_error_);
    return gguf_tokenizer_;
  }
  return detail::read_small_file(tokenizer_path(), kMaxJsonFileBytes);
}

std::string ModelDir::type_summary() const {
  std::map<kernels::WType, int> counts;
  for (const auto& [name, shape] : required_tensors(config_)) {
    if (const TensorView* t = tensor(name)) ++counts[t->type];
  }
  std::string out;
  for (const kernels::WType w : kernels::kAllWTypes) {
    const auto it = counts.find(w);
    if (it == counts.end()) continue;
    out += (out.empty() ? "" : ",") + std::string(kernels::wtype_name(w)) + ":" + std::to_string(it->second);
  }
  return out;
}

}  // namespace tandem::weights
