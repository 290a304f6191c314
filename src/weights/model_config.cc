// The JSON files of a Hugging Face model directory: config.json (ModelConfig::parse), generation_config.json
// (GenerationDefaults::parse) and tokenizer_config.json (TokenizerSettings::parse). Split from model_dir.cc, which
// reads the directory itself. Rules in docs/model-format.md.
#include "weights/model_dir.h"

#include <algorithm>
#include <cmath>

#include "weights/json_fields.h"

namespace tandem::weights {
namespace {

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


// Gemma 2 / Gemma 3 (transformers' Gemma2Config / Gemma3TextConfig; their defaults where a key is absent): the
// embedding scale, the 1 + w norms and post-norms, the attention scale from query_pre_attn_scalar, the soft caps
// (a key given as null: none), and which layers slide (layer_types, else Gemma 2's even layers, Gemma 3's all but
// every sliding_window_pattern-th) with Gemma 3's local RoPE base.
Status parse_gemma(const Fields& f, ModelConfig& c, bool gemma3) {
  c.embed_scale = std::sqrt(static_cast<double>(c.hidden_size));
  c.norm_add_one = true;
  c.post_norms = true;
  std::optional<double> od;
  ASSIGN_OR_RETURN(od, f.opt_number("query_pre_attn_scalar", 0.0, false, 1e9));
  c.attn_scale = 1.0 / std::sqrt(od.value_or(256.0));
  auto cap = [&](const char* key, std::optional<double> dflt) -> Result<std::optional<double>> {
    std::optional<double> v;
    ASSIGN_OR_RETURN(v, f.opt_number(key, 0.0, false, 1e9));
    if (v) return v;
    return f.present(key) ? std::optional<double>{} : dflt;  // null: no cap
  };
  ASSIGN_OR_RETURN(c.attn_softcap, cap("attn_logit_softcapping", gemma3 ? std::nullopt : std::optional(50.0)));
  ASSIGN_OR_RETURN(c.final_softcap, cap("final_logit_softcapping", gemma3 ? std::nullopt : std::optional(30.0)));
  std::optional<std::int64_t> ov;
  ASSIGN_OR_RETURN(ov, f.opt_integer("sliding_window", 1, kMaxPositions));
  c.sliding_window = ov ? static_cast<int>(*ov) : 4096;  // (both configs' default)
  c.sliding_layers.assign(static_cast<std::size_t>(c.num_layers), 0);
  if (const Json* lt = f.get("layer_types")) {
    if (!lt->is_array() || lt->size() != static_cast<std::size_t>(c.num_layers)) {
      return f.error(Errc::format_error, "layer_types",
                     "must be an array of " + std::to_string(c.num_layers) + " strings (one per layer), got " + show(*lt));
    }
    for (std::size_t i = 0; i < lt->size(); ++i) {
      const Json& x = (*lt)[i];
      if (x == "sliding_attention") {
        c.sliding_layers[i] = 1;
      } else if (x != "full_attention") {
        return f.error(Errc::unsupported, "layer_types",
                       "element " + std::to_string(i) + " is " + show(x) +
                           " (supported: \"sliding_attention\", \"full_attention\")");
      }
    }
  } else {
    std::int64_t pattern = 2;
    if (gemma3) {
      ASSIGN_OR_RETURN(ov, f.opt_integer("sliding_window_pattern", 1, kMaxLayers));
      pattern = ov.value_or(6);
    }
    for (int i = 0; i < c.num_layers; ++i) c.sliding_layers[static_cast<std::size_t>(i)] = (i + 1) % pattern != 0;
  }
  if (gemma3) {
    ASSIGN_OR_RETURN(od, f.opt_number("rope_local_base_freq", 0.0, false, kMaxRopeTheta));
    c.rope_local_theta = od.value_or(10000.0);
  }
  return {};
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
                                                              {"Phi3ForCausalLM", "phi3"},
                                                              {"Gemma2ForCausalLM", "gemma2"},
                                                              {"Gemma3ForCausalLM", "gemma3_text"}};
  constexpr const char* kSupported =
      "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, Gemma2ForCausalLM, "
      "Gemma3ForCausalLM";
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
                         "\" is not supported (supported: llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3_text)");
    }
  }
  const bool qwen2 = c.architecture == "Qwen2ForCausalLM", phi3 = c.architecture == "Phi3ForCausalLM";
  const bool qwen3 = c.architecture == "Qwen3ForCausalLM";
  const bool gemma2 = c.architecture == "Gemma2ForCausalLM", gemma3 = c.architecture == "Gemma3ForCausalLM";
  const bool gemma = gemma2 || gemma3;
  c.qkv_bias = qwen2;  // (Qwen3 has attention_bias false, refused when true below)
  c.qk_norm = qwen3 || gemma3;
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
  c.tie_word_embeddings = ob.value_or(gemma);  // (Gemma2Config / Gemma3TextConfig default to a tied head)
  std::optional<std::string> os;
  ASSIGN_OR_RETURN(os, f.opt_string("torch_dtype"));
  c.torch_dtype = os.value_or("");
  if (c.torch_dtype.size() > 64) return f.error(Errc::format_error, "torch_dtype", "is too long");
  // Sliding window: Mistral and Phi-3 apply it (transformers' MistralAttention / Phi3Attention); Llama has none;
  // Qwen2 and Qwen3 only with use_sliding_window (false in the released models; its max_window_layers rule is not
  // implemented, so true is refused).
  ASSIGN_OR_RETURN(ov, f.opt_integer("sliding_window", 1, kMaxPositions));
  if (ov && (c.architecture == "MistralForCausalLM" || phi3)) c.sliding_window = static_cast<int>(*ov);
  if (gemma) TANDEM_TRY(parse_gemma(f, c, gemma3));
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
  if (gemma) {
    // Gemma configs name it hidden_activation (hidden_act too, in older ones); transformers uses
    // hidden_activation when both are given.
    std::optional<std::string> ha;
    ASSIGN_OR_RETURN(ha, f.opt_string("hidden_activation"));
    const std::string act = ha ? *ha : os.value_or("gelu_pytorch_tanh");
    if (act != "gelu_pytorch_tanh" && act != "gelu_tanh") {
      return f.error(Errc::unsupported, ha ? "hidden_activation" : "hidden_act",
                     "\"" + (act.size() <= 64 ? act : "(long)") + "\" is not supported (only \"gelu_pytorch_tanh\")");
    }
    c.activation = Activation::gelu_tanh;
  } else if (os && *os != "silu") {
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

}  // namespace tandem::weights
