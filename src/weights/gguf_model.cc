// ModelDir over a GGUF file: llama.* metadata → ModelConfig, GGUF tensor names → Hugging Face names, the tokenizer
// from tokenizer.ggml.* as a SentencePiece ModelProto. docs/model-format.md ("GGUF") describes the rules.
#include "weights/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "weights/json_util.h"
#include "weights/model_limits.h"
#include "weights/model_dir.h"

namespace tandem::weights {
namespace {

using namespace limits;  // the same bounds as config.json (weights/model_limits.h)

// Per-layer suffixes: GGUF → HF (both without the ".weight" / ".bias" ending).
constexpr std::pair<std::string_view, std::string_view> kLayerNames[] = {
    {"attn_norm", "input_layernorm"}, {"attn_q", "self_attn.q_proj"},      {"attn_k", "self_attn.k_proj"},
    {"attn_v", "self_attn.v_proj"},   {"attn_output", "self_attn.o_proj"}, {"ffn_norm", "post_attention_layernorm"},
    {"ffn_gate", "mlp.gate_proj"},    {"ffn_up", "mlp.up_proj"},           {"ffn_down", "mlp.down_proj"},
    {"attn_q_norm", "self_attn.q_norm"}, {"attn_k_norm", "self_attn.k_norm"},  // Qwen3
};
// Phi-3's fused projections (llama.cpp: attn_qkv = [q; k; v] rows, ffn_up = [gate; up] rows, no ffn_gate).
constexpr std::pair<std::string_view, std::string_view> kPhi3LayerNames[] = {
    {"attn_qkv", "self_attn.qkv_proj"}, {"ffn_up", "mlp.gate_up_proj"},
};
// Gemma 2 / 3's norms (llama.cpp: attn_post_norm, ffn_norm = the MLP's input norm, ffn_post_norm).
constexpr std::pair<std::string_view, std::string_view> kGemmaLayerNames[] = {
    {"post_attention_norm", "post_attention_layernorm"},
    {"ffn_norm", "pre_feedforward_layernorm"},
    {"post_ffw_norm", "post_feedforward_layernorm"},
};
constexpr std::pair<std::string_view, std::string_view> kGlobalNames[] = {
    {"token_embd", "model.embed_tokens"},
    {"output_norm", "model.norm"},
    {"output", "lm_head"},
};

std::string num_str(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Splits "<stem>.<weight|bias>".
bool split_suffix(std::string_view name, std::string_view& stem, std::string_view& suffix) {
  for (std::string_view s : {std::string_view(".weight"), std::string_view(".bias")}) {
    if (name.size() > s.size() && name.substr(name.size() - s.size()) == s) {
      stem = name.substr(0, name.size() - s.size());
      suffix = s;
      return true;
    }
  }
  return false;
}

// A decimal layer index without sign or leading zeros, < 100000.
bool parse_layer(std::string_view s, int& out) {
  if (s.empty() || s.size() > 5 || (s.size() > 1 && s[0] == '0')) return false;
  int v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
    v = v * 10 + (ch - '0');
  }
  out = v;
  return true;
}

// Typed access to the metadata, messages "<file>: key '<k>' ...".
class Meta {
 public:
  explicit Meta(const GgufFile& f) : f_(f) {}

  const GgufValue* get(const std::string& key) const { return f_.find(key); }
  Failure error(Errc code, const std::string& key, const std::string& what) const {
    return fail(code, f_.path() + ": key '" + key + "' " + what);
  }

  Result<std::optional<std::int64_t>> opt_int(const std::string& key, std::int64_t lo, std::int64_t hi) const {
    const GgufValue* v = get(key);
    if (v == nullptr) return std::optional<std::int64_t>{};
    const auto x = v->as_i64();
    if (!x || *x < lo || *x > hi) {
      return error(Errc::format_error, key,
                   "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + show(*v));
    }
    return std::optional<std::int64_t>{*x};
  }
  Result<std::int64_t> integer(const std::string& key, std::int64_t lo, std::int64_t hi) const {
    auto r = opt_int(key, lo, hi);
    if (!r) return fail(std::move(r).error());
    if (!r->has_value()) return error(Errc::format_error, key, "is missing");
    return **r;
  }
  Result<std::optional<double>> opt_num(const std::string& key, double lo, double hi) const {  // (lo, hi]
    const GgufValue* v = get(key);
    if (v == nullptr) return std::optional<double>{};
    const auto x = v->as_f64();
    if (!x || !std::isfinite(*x) || *x <= lo || *x > hi) {
      return error(Errc::format_error, key,
                   "must be a number in (" + num_str(lo) + ", " + num_str(hi) + "], got " + show(*v));
    }
    return std::optional<double>{*x};
  }
  Result<std::optional<bool>> opt_bool(const std::string& key) const {
    const GgufValue* v = get(key);
    if (v == nullptr) return std::optional<bool>{};
    if (v->type != GgufType::boolean) return error(Errc::format_error, key, "must be a bool, got " + show(*v));
    return std::optional<bool>{v->u != 0};
  }
  Result<std::optional<std::string>> opt_string(const std::string& key) const {
    const GgufValue* v = get(key);
    if (v == nullptr) return std::optional<std::string>{};
    if (v->type != GgufType::string) return error(Errc::format_error, key, "must be a string, got " + show(*v));
    return std::optional<std::string>{v->str};
  }

  static std::string show(const GgufValue& v) {
    if (v.type == GgufType::string) return v.str.size() <= 64 ? "\"" + v.str + "\"" : "a string";
    if (v.type == GgufType::array) return "an array of " + std::string(gguf_type_name(v.elem_type));
    if (v.type == GgufType::boolean) return v.u ? "true" : "false";
    if (v.type == GgufType::f32 || v.type == GgufType::f64) return num_str(v.f);
    if (const auto i = v.as_i64()) return std::to_string(*i);
    return std::to_string(v.u);
  }

 private:
  const GgufFile& f_;
};

#define GM_ASSIGN(lhs, expr)                               \
  do {                                                     \
    auto _r = (expr);                                      \
    if (!_r) return ::tandem::fail(std::move(_r).error()); \
    lhs = std::move(*_r);                                  \
  } while (0)

// --- protobuf wire format (the subset a ModelProto needs) ----------------------------------------------------------

void pb_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void pb_tag(std::string& out, int field, int wire) { pb_varint(out, (static_cast<std::uint64_t>(field) << 3) | wire); }
void pb_bytes(std::string& out, int field, std::string_view s) {
  pb_tag(out, field, 2);
  pb_varint(out, s.size());
  out.append(s);
}
void pb_int(std::string& out, int field, std::int64_t v) {  // int32 / enum / bool: negatives as 10-byte varints
  pb_tag(out, field, 0);
  pb_varint(out, static_cast<std::uint64_t>(v));
}
void pb_float(std::string& out, int field, float v) {
  pb_tag(out, field, 5);
  std::uint32_t b = 0;
  std::memcpy(&b, &v, 4);
  for (int k = 0; k < 4; ++k) out.push_back(static_cast<char>((b >> (8 * k)) & 0xFF));
}

}  // namespace

TensorView gguf_tensor_view(const GgufFile& f, const GgufTensorInfo& t, std::string name) {
  TensorView tv;
  tv.name = std::move(name);
  tv.shape = t.hf_shape();
  tv.type_supported = t.wtype.has_value();
  tv.type = t.wtype.value_or(kernels::WType::f32);
  tv.dtype = !t.wtype                           ? DType::u8
             : *t.wtype == kernels::WType::f32  ? DType::f32
             : *t.wtype == kernels::WType::f16  ? DType::f16
             : *t.wtype == kernels::WType::bf16 ? DType::bf16
                                                : DType::u8;
  if (t.wtype) tv.data = f.raw_tensor_bytes(t);
  return tv;
}

std::optional<std::string> hf_name_from_gguf(std::string_view name, std::string_view arch) {
  std::string_view stem, suffix;
  if (!split_suffix(name, stem, suffix)) return std::nullopt;
  for (const auto& [g, h] : kGlobalNames) {
    if (stem == g) return std::string(h) + std::string(suffix);
  }
  if (stem.substr(0, 4) != "blk.") return std::nullopt;
  stem.remove_prefix(4);
  const auto dot = stem.find('.');
  int layer = 0;
  if (dot == std::string_view::npos || !parse_layer(stem.substr(0, dot), layer)) return std::nullopt;
  const std::string_view part = stem.substr(dot + 1);
  if (arch == "phi3") {
    for (const auto& [g, h] : kPhi3LayerNames) {
      if (part == g) return "model.layers." + std::to_string(layer) + "." + std::string(h) + std::string(suffix);
    }
  }
  if (arch == "gemma2" || arch == "gemma3") {
    for (const auto& [g, h] : kGemmaLayerNames) {
      if (part == g) return "model.layers." + std::to_string(layer) + "." + std::string(h) + std::string(suffix);
    }
  }
  for (const auto& [g, h] : kLayerNames) {
    if (part == g) return "model.layers." + std::to_string(layer) + "." + std::string(h) + std::string(suffix);
  }
  return std::nullopt;
}

std::optional<std::string> gguf_name_from_hf(std::string_view name, std::string_view arch) {
  std::string_view stem, suffix;
  if (!split_suffix(name, stem, suffix)) return std::nullopt;
  for (const auto& [g, h] : kGlobalNames) {
    if (stem == h) return std::string(g) + std::string(suffix);
  }
  constexpr std::string_view kPrefix = "model.layers.";
  if (stem.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  stem.remove_prefix(kPrefix.size());
  const auto dot = stem.find('.');
  int layer = 0;
  if (dot == std::string_view::npos || !parse_layer(stem.substr(0, dot), layer)) return std::nullopt;
  const std::string_view part = stem.substr(dot + 1);
  if (arch == "phi3") {
    for (const auto& [g, h] : kPhi3LayerNames) {
      if (part == h) return "blk." + std::to_string(layer) + "." + std::string(g) + std::string(suffix);
    }
    if (part == "mlp.up_proj" || part == "mlp.gate_proj") return std::nullopt;  // only the fused gate_up exists
  }
  if (arch == "gemma2" || arch == "gemma3") {
    for (const auto& [g, h] : kGemmaLayerNames) {
      if (part == h) return "blk." + std::to_string(layer) + "." + std::string(g) + std::string(suffix);
    }
  }
  for (const auto& [g, h] : kLayerNames) {
    if (part == h) return "blk." + std::to_string(layer) + "." + std::string(g) + std::string(suffix);
  }
  return std::nullopt;
}

std::optional<std::string> gguf_arch_of(std::string_view a) {
  if (a == "LlamaForCausalLM" || a == "MistralForCausalLM") return "llama";
  if (a == "Qwen2ForCausalLM") return "qwen2";
  if (a == "Qwen3ForCausalLM") return "qwen3";
  if (a == "Phi3ForCausalLM") return "phi3";
  if (a == "Gemma2ForCausalLM") return "gemma2";
  if (a == "Gemma3ForCausalLM") return "gemma3";
  return std::nullopt;
}

// --- tokenizer ----------------------------------------------------------------------------------------------------

Result<std::string> sentencepiece_model_from_gguf(const GgufFile& f) {
  const Meta meta(f);
  std::optional<std::string> model;
  GM_ASSIGN(model, meta.opt_string("tokenizer.ggml.model"));
  if (!model) return fail(Errc::format_error, f.path() + ": has no tokenizer (key 'tokenizer.ggml.model' is missing)");
  if (*model == "gpt2") {
    return fail(Errc::unsupported, f.path() +
                                       ": tokenizer.ggml.model \"gpt2\" is a byte-level BPE vocabulary, not a SentencePiece "
                                       "model (weights::bpe_vocab_from_gguf reads it; tok::load_model_tokenizer "
                                       "chooses)");
  }
  if (*model != "llama") {
    return fail(Errc::unsupported, f.path() + ": tokenizer.ggml.model " +
                                       Meta::show(*meta.get("tokenizer.ggml.model")) +
                                       " is not supported (only \"llama\", SentencePiece)");
  }
  const GgufValue* tokens = meta.get("tokenizer.ggml.tokens");
  if (tokens == nullptr) return meta.error(Errc::format_error, "tokenizer.ggml.tokens", "is missing");
  if (tokens->type != GgufType::array || tokens->elem_type != GgufType::string) {
    return meta.error(Errc::format_error, "tokenizer.ggml.tokens",
                      "must be an array of strings, got " + Meta::show(*tokens));
  }
  const std::uint64_t n = tokens->count;
  if (n == 0) return meta.error(Errc::format_error, "tokenizer.ggml.tokens", "is empty");
  if (n > static_cast<std::uint64_t>(kMaxVocab)) {
    return meta.error(Errc::format_error, "tokenizer.ggml.tokens",
                      "has " + std::to_string(n) + " tokens, more than " + std::to_string(kMaxVocab));
  }
  const GgufValue* scores = meta.get("tokenizer.ggml.scores");
  if (scores != nullptr &&
      (scores->type != GgufType::array || scores->elem_type != GgufType::f32 || scores->count != n)) {
    return meta.error(Errc::format_error, "tokenizer.ggml.scores",
                      "must be an array of " + std::to_string(n) + " f32 (one per token), got " + Meta::show(*scores) +
                          (scores->type == GgufType::array ? " of length " + std::to_string(scores->count) : ""));
  }
  const GgufValue* types = meta.get("tokenizer.ggml.token_type");
  if (types != nullptr) {
    const bool int_elems = types->type == GgufType::array && types->elem_type != GgufType::f32 &&
                           types->elem_type != GgufType::f64 && types->elem_type != GgufType::boolean &&
                           gguf_scalar_size(types->elem_type) != 0;
    if (!int_elems || types->count != n) {
      return meta.error(Errc::format_error, "tokenizer.ggml.token_type",
                        "must be an array of " + std::to_string(n) + " integers (one per token), got " +
                            Meta::show(*types) +
                            (types->type == GgufType::array ? " of length " + std::to_string(types->count) : ""));
    }
  }
  const std::int64_t max_id = static_cast<std::int64_t>(n) - 1;
  std::optional<std::int64_t> bos, eos, unk, pad;
  GM_ASSIGN(bos, meta.opt_int("tokenizer.ggml.bos_token_id", 0, max_id));
  GM_ASSIGN(eos, meta.opt_int("tokenizer.ggml.eos_token_id", 0, max_id));
  GM_ASSIGN(unk, meta.opt_int("tokenizer.ggml.unknown_token_id", 0, max_id));
  GM_ASSIGN(pad, meta.opt_int("tokenizer.ggml.padding_token_id", 0, max_id));
  std::optional<bool> add_space_prefix, remove_extra_ws;
  GM_ASSIGN(add_space_prefix, meta.opt_bool("tokenizer.ggml.add_space_prefix"));
  GM_ASSIGN(remove_extra_ws, meta.opt_bool("tokenizer.ggml.remove_extra_whitespaces"));
  std::string charsmap;
  if (const GgufValue* cm = meta.get("tokenizer.ggml.precompiled_charsmap")) {
    if (cm->type != GgufType::array || (cm->elem_type != GgufType::u8 && cm->elem_type != GgufType::i8)) {
      return meta.error(Errc::format_error, "tokenizer.ggml.precompiled_charsmap",
                        "must be an array of bytes, got " + Meta::show(*cm));
    }
    charsmap = cm->raw;
  }

  // Piece types as SentencePiece numbers them (llama.cpp uses the same: 1 normal, 2 unknown, 3 control,
  // 4 user-defined, 5 unused, 6 byte; 0 "undefined" is read as normal).
  std::vector<int> type(static_cast<std::size_t>(n), 1);
  std::optional<std::int64_t> first_unknown;
  bool has_bytes = false;
  for (std::uint64_t k = 0; types != nullptr && k < n; ++k) {
    const auto t = types->int_at(k);
    if (!t || *t < 0 || *t > 6) {
      return meta.error(Errc::format_error, "tokenizer.ggml.token_type",
                        "element " + std::to_string(k) + " is " + (t ? std::to_string(*t) : std::string("invalid")) +
                            ", not a token type 0-6");
    }
    type[static_cast<std::size_t>(k)] = *t == 0 ? 1 : static_cast<int>(*t);
    if (*t == 2 && !first_unknown) first_unknown = static_cast<std::int64_t>(k);
    has_bytes = has_bytes || *t == 6;
  }
  // SentencePiece has exactly one unknown piece: the one unknown_token_id names (else the first typed unknown, else
  // id 0), as llama.cpp uses it. Other tokens typed unknown (phi-3's [PADnnnnn] fillers) become control pieces:
  // never produced from text, decoded to nothing. A vocabulary whose <unk> is typed otherwise (phi-3: control) gets
  // it typed unknown.
  const std::int64_t unk_id = unk.value_or(first_unknown.value_or(0));
  for (auto& t : type) {
    if (t == 2) t = 3;
  }
  type[static_cast<std::size_t>(unk_id)] = 2;

  std::string out;
  std::string piece;
  for (std::uint64_t k = 0; k < n; ++k) {
    piece.clear();
    pb_bytes(piece, 1, tokens->strings[static_cast<std::size_t>(k)]);
    pb_float(piece, 2, scores != nullptr ? static_cast<float>(scores->float_at(k).value_or(0.0)) : 0.0F);
    pb_int(piece, 3, type[static_cast<std::size_t>(k)]);
    pb_bytes(out, 1, piece);
  }
  auto piece_name = [&](std::int64_t id) -> const std::string& {
    return tokens->strings[static_cast<std::size_t>(id)];
  };
  std::string trainer;
  pb_int(trainer, 3, 2);                  // model_type BPE
  if (has_bytes) pb_int(trainer, 35, 1);  // byte_fallback
  pb_int(trainer, 40, unk_id);
  pb_int(trainer, 41, bos.value_or(-1));
  pb_int(trainer, 42, eos.value_or(-1));
  pb_int(trainer, 43, pad.value_or(-1));
  pb_bytes(trainer, 45, piece_name(unk_id));
  // SentencePiece finds the special tokens by piece text; a missing id gets a text that is no piece.
  constexpr std::string_view kNone = "<tandem:none>";
  pb_bytes(trainer, 46, bos ? std::string_view(piece_name(*bos)) : kNone);
  pb_bytes(trainer, 47, eos ? std::string_view(piece_name(*eos)) : kNone);
  pb_bytes(trainer, 48, pad ? std::string_view(piece_name(*pad)) : kNone);
  pb_bytes(out, 2, trainer);
  std::string normalizer;
  pb_bytes(normalizer, 1, charsmap.empty() ? "identity" : "gguf_precompiled");
  if (!charsmap.empty()) pb_bytes(normalizer, 2, charsmap);
  pb_int(normalizer, 3, add_space_prefix.value_or(true) ? 1 : 0);
  pb_int(normalizer, 4, remove_extra_ws.value_or(false) ? 1 : 0);
  pb_int(normalizer, 5, 1);  // escape_whitespaces
  pb_bytes(out, 3, normalizer);
  return out;
}

// --- ModelDir over a GGUF file ------------------------------------------------------------------------------------

Result<ModelDir> ModelDir::open_gguf(const std::string& file) {
  ModelDir m;
  m.format_ = Format::gguf;
  m.gguf_path_ = file;
  const auto slash = file.rfind('/');
  m.dir_ = slash == std::string::npos ? "." : slash == 0 ? "/" : file.substr(0, slash);
  {
    auto g = GgufFile::open(file);
    if (!g) return fail(std::move(g).error());
    m.gguf_.emplace(std::move(*g));
  }
  const GgufFile& f = *m.gguf_;
  const Meta meta(f);
  ModelConfig& c = m.config_;

  std::optional<std::string> arch;
  GM_ASSIGN(arch, meta.opt_string("general.architecture"));
  if (!arch) return meta.error(Errc::format_error, "general.architecture", "is missing");
  if (*arch != "llama" && *arch != "qwen2" && *arch != "qwen3" && *arch != "phi3" && *arch != "gemma2" &&
      *arch != "gemma3") {
    return meta.error(Errc::unsupported, "general.architecture",
                      Meta::show(*meta.get("general.architecture")) +
                          " is not supported (supported: llama, qwen2, qwen3, phi3, gemma2, gemma3)");
  }
  const bool phi3 = *arch == "phi3";
  const bool gemma2 = *arch == "gemma2", gemma3 = *arch == "gemma3";
  c.architecture = *arch == "llama"   ? "LlamaForCausalLM"
                   : phi3             ? "Phi3ForCausalLM"
                   : *arch == "qwen3" ? "Qwen3ForCausalLM"
                   : gemma2           ? "Gemma2ForCausalLM"
                   : gemma3           ? "Gemma3ForCausalLM"
                                      : "Qwen2ForCausalLM";
  c.qkv_bias = *arch == "qwen2";           // llama.cpp requires blk.N.attn_{q,k,v}.bias for qwen2
  c.qk_norm = *arch == "qwen3" || gemma3;  // and blk.N.attn_{q,k}_norm for qwen3 and gemma3
  c.fused_projections = phi3;     // blk.N.attn_qkv and the [gate; up] blk.N.ffn_up
  const std::string p = *arch + ".";
  std::optional<std::int64_t> ov;
  GM_ASSIGN(ov, meta.opt_int(p + "expert_count", 0, kMaxLayers));
  if (ov.value_or(0) > 0) {
    return meta.error(Errc::unsupported, p + "expert_count",
                      "is " + std::to_string(*ov) + ": mixture-of-experts models are not supported");
  }
  std::int64_t v = 0;
  GM_ASSIGN(v, meta.integer(p + "embedding_length", 1, kMaxHidden));
  c.hidden_size = static_cast<int>(v);
  GM_ASSIGN(v, meta.integer(p + "feed_forward_length", 1, kMaxIntermediate));
  c.intermediate_size = static_cast<int>(v);
  GM_ASSIGN(v, meta.integer(p + "block_count", 1, kMaxLayers));
  c.num_layers = static_cast<int>(v);
  GM_ASSIGN(v, meta.integer(p + "attention.head_count", 1, kMaxHeads));
  c.num_heads = static_cast<int>(v);
  GM_ASSIGN(ov, meta.opt_int(p + "attention.head_count_kv", 1, kMaxHeads));
  c.num_kv_heads = ov ? static_cast<int>(*ov) : c.num_heads;
  if (c.num_heads % c.num_kv_heads != 0) {
    return meta.error(Errc::format_error, p + "attention.head_count_kv",
                      "(" + std::to_string(c.num_kv_heads) + ") must divide " + p + "attention.head_count (" +
                          std::to_string(c.num_heads) + ")");
  }
  GM_ASSIGN(ov, meta.opt_int(p + "attention.key_length", 1, kMaxHeadDim));
  if (ov) {
    c.head_dim = static_cast<int>(*ov);
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      return meta.error(Errc::format_error, p + "embedding_length",
                        "(" + std::to_string(c.hidden_size) + ") is not a multiple of the head count (" +
                            std::to_string(c.num_heads) + ") and " + p + "attention.key_length is not given");
    }
    c.head_dim = c.hidden_size / c.num_heads;
    if (c.head_dim > kMaxHeadDim) {
      return meta.error(Errc::format_error, p + "embedding_length",
                        "/ head count = " + std::to_string(c.head_dim) + " exceeds " + std::to_string(kMaxHeadDim));
    }
  }
  if (c.head_dim % 2 != 0) {
    return meta.error(Errc::format_error, p + "attention.key_length",
                      "head dimension must be even for rotary embeddings, got " + std::to_string(c.head_dim));
  }
  GM_ASSIGN(ov, meta.opt_int(p + "attention.value_length", 1, kMaxHeadDim));
  if (ov && *ov != c.head_dim) {
    return meta.error(Errc::unsupported, p + "attention.value_length",
                      "(" + std::to_string(*ov) + ") differs from the key length (" + std::to_string(c.head_dim) + ")");
  }
  GM_ASSIGN(ov, meta.opt_int(p + "rope.dimension_count", 1, kMaxHeadDim));
  if (ov && *ov != c.head_dim) {
    return meta.error(Errc::unsupported, p + "rope.dimension_count",
                      "(" + std::to_string(*ov) + ") differs from the head dimension (" + std::to_string(c.head_dim) +
                          "): partial rotary embeddings are not supported");
  }
  std::optional<double> od;
  GM_ASSIGN(od, meta.opt_num(p + "attention.layer_norm_rms_epsilon", 0.0, 1.0));
  if (!od) return meta.error(Errc::format_error, p + "attention.layer_norm_rms_epsilon", "is missing");
  c.rms_norm_eps = *od;
  GM_ASSIGN(od, meta.opt_num(p + "rope.freq_base", 0.0, kMaxRopeTheta));
  c.rope_theta = od.value_or(10000.0);
  std::optional<std::string> scaling;
  GM_ASSIGN(scaling, meta.opt_string(p + "rope.scaling.type"));
  if (!scaling || *scaling == "none") {
    // Older files: rope.scale_linear (a factor; 1 = none).
    GM_ASSIGN(od, meta.opt_num(p + "rope.scale_linear", 0.0, kMaxRopeFactor));
    if (!scaling && od && *od != 1.0) {
      c.rope_scaling = RopeScaling::linear;
      c.rope_factor = *od;
    }
  } else if (*scaling == "linear") {
    GM_ASSIGN(od, meta.opt_num(p + "rope.scaling.factor", 0.0, kMaxRopeFactor));
    if (!od) return meta.error(Errc::format_error, p + "rope.scaling.factor", "is missing (scaling type linear)");
    c.rope_scaling = RopeScaling::linear;
    c.rope_factor = *od;
  } else {
    return meta.error(Errc::unsupported, p + "rope.scaling.type",
                      Meta::show(*meta.get(p + "rope.scaling.type")) + " is not supported (supported: none, linear)");
  }
  GM_ASSIGN(v, meta.integer(p + "context_length", 1, kMaxPositions));
  c.max_position_embeddings = static_cast<int>(v);
  // llama.cpp's converter permuted q_proj / k_proj rows for ggml's interleaved RoPE only for llama; qwen2 and phi3
  // keep the Hugging Face rows and rotate NEOX-style (llama_model_rope_type).
  c.rope_interleaved = *arch == "llama";
  // Sliding window: phi3.attention.sliding_window as llama.cpp's converter writes it (0 = none; llama.cpp itself
  // does not apply it for phi3, Hugging Face does, and Tandem does); llama.attention.sliding_window for Mistral
  // files written by Tandem (llama.cpp's converter writes none for Mistral, whose files then run with full
  // attention, as in llama.cpp).
  GM_ASSIGN(ov, meta.opt_int(p + "attention.sliding_window", 0, kMaxPositions));
  if (ov.value_or(0) > 0 && *arch != "qwen2" && *arch != "qwen3") c.sliding_window = static_cast<int>(*ov);
  if (gemma2 || gemma3) {
    // As llama.cpp's loader reads a gemma2 / gemma3 file (llama_model::load_hparams, build_gemma*): the norms were
    // stored as 1 + w by its converter; the embedding scaled by sqrt(embedding_length); GELU-tanh MLP; post-norms;
    // every second layer (gemma2) or all but every sixth (gemma3) slides, gemma2's window defaulting to 4096;
    // gemma3's local layers rotate with base 10000 (rope.freq_base_swa when given) and no scaling; the query scale
    // 1/sqrt(key_length), except for the 27B shapes (46 / 62 layers), 1/sqrt(embedding_length / head_count);
    // gemma2's soft caps from its keys, 50 and 30 by default; gemma3 has none.
    c.activation = Activation::gelu_tanh;
    c.embed_scale = std::sqrt(static_cast<double>(c.hidden_size));
    c.post_norms = true;
    if (!c.sliding_window && gemma2) c.sliding_window = 4096;
    const int pattern = gemma2 ? 2 : 6;
    c.sliding_layers.assign(static_cast<std::size_t>(c.num_layers), 0);
    for (int i = 0; i < c.num_layers; ++i) c.sliding_layers[static_cast<std::size_t>(i)] = i % pattern < pattern - 1;
    const bool big = c.num_layers == (gemma2 ? 46 : 62);
    c.attn_scale = 1.0 / std::sqrt(big ? static_cast<double>(c.hidden_size / c.num_heads) : c.head_dim);
    if (gemma2) {
      GM_ASSIGN(od, meta.opt_num(p + "attn_logit_softcapping", 0.0, 1e9));
      c.attn_softcap = od.value_or(50.0);
      GM_ASSIGN(od, meta.opt_num(p + "final_logit_softcapping", 0.0, 1e9));
      c.final_softcap = od.value_or(30.0);
    } else {
      GM_ASSIGN(od, meta.opt_num(p + "rope.freq_base_swa", 0.0, kMaxRopeTheta));
      c.rope_local_theta = od.value_or(10000.0);
    }
  }

  // Vocabulary size: the embedding's rows; llama.vocab_size and the token list must agree with it.
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (embd == nullptr || embd->ne.size() != 2) {
    return fail(Errc::format_error, f.path() + ": tensor 'token_embd.weight' (model.embed_tokens.weight) is " +
                                        (embd == nullptr ? "missing" : "not 2-dimensional"));
  }
  if (embd->ne[1] < 1 || embd->ne[1] > static_cast<std::uint64_t>(kMaxVocab)) {
    return fail(Errc::format_error, f.path() + ": tensor 'token_embd.weight' has " + std::to_string(embd->ne[1]) +
                                        " rows; the vocabulary size must be in [1, " + std::to_string(kMaxVocab) + "]");
  }
  c.vocab_size = static_cast<int>(embd->ne[1]);
  GM_ASSIGN(ov, meta.opt_int(p + "vocab_size", 1, kMaxVocab));
  if (ov && *ov != c.vocab_size) {
    return meta.error(Errc::format_error, p + "vocab_size",
                      "(" + std::to_string(*ov) + ") differs from the rows of token_embd.weight (" +
                          std::to_string(c.vocab_size) + ")");
  }
  if (const GgufValue* toks = meta.get("tokenizer.ggml.tokens");
      toks != nullptr && toks->type == GgufType::array && toks->count > static_cast<std::uint64_t>(c.vocab_size)) {
    return meta.error(Errc::format_error, "tokenizer.ggml.tokens",
                      "has " + std::to_string(toks->count) + " tokens, more than the " + std::to_string(c.vocab_size) +
                          " rows of token_embd.weight");
  }
  c.tie_word_embeddings = f.find_tensor("output.weight") == nullptr;

  // Special ids (config, generation defaults) and the tokenizer settings.
  const std::int64_t max_id = c.vocab_size - 1;
  std::optional<std::int64_t> bos, eos, eot;
  GM_ASSIGN(bos, meta.opt_int("tokenizer.ggml.bos_token_id", 0, max_id));
  GM_ASSIGN(eos, meta.opt_int("tokenizer.ggml.eos_token_id", 0, max_id));
  GM_ASSIGN(eot, meta.opt_int("tokenizer.ggml.eot_token_id", 0, max_id));
  if (bos) c.bos_token_ids = {static_cast<int>(*bos)};
  if (eos) c.eos_token_ids = {static_cast<int>(*eos)};
  if (eot && eot != eos) c.eos_token_ids.push_back(static_cast<int>(*eot));
  m.generation_.bos_token_ids = c.bos_token_ids;
  m.generation_.eos_token_ids = c.eos_token_ids;
  TokenizerSettings& ts = m.tokenizer_settings_;
  GM_ASSIGN(ts.add_bos_token, meta.opt_bool("tokenizer.ggml.add_bos_token"));
  GM_ASSIGN(ts.add_eos_token, meta.opt_bool("tokenizer.ggml.add_eos_token"));
  std::optional<std::string> tmpl;
  GM_ASSIGN(tmpl, meta.opt_string("tokenizer.chat_template"));
  ts.chat_template = tmpl.value_or("");
  ts.template_guess = TokenizerSettings::guess_template(ts.chat_template);

  // Tensors under their HF names, HF-order shapes.
  std::map<std::string, std::string> gguf_name;  // HF name → GGUF name (messages)
  for (const GgufTensorInfo& t : f.tensors()) {
    const std::optional<std::string> hf = hf_name_from_gguf(t.name, *arch);
    const std::string name = hf.value_or(t.name);
    const std::string where = f.path() + ": tensor " + detail::printable(t.name);
    const bool qkv_bias_name = hf && (hf->ends_with("q_proj.bias") || hf->ends_with("k_proj.bias") ||
                                      hf->ends_with("v_proj.bias"));
    if (hf && hf->ends_with(".bias") && !(c.qkv_bias && qkv_bias_name)) {
      return fail(Errc::unsupported, where + ": bias terms are not supported here (only q/k/v biases, for qwen2)");
    }
    if (!gguf_name.emplace(name, t.name).second) {
      return fail(Errc::format_error, where + " maps to " + detail::printable(name) + ", which tensor " +
                                          detail::printable(gguf_name[name]) + " also names");
    }
    m.tensors_.push_back(gguf_tensor_view(f, t, name));
  }
  std::sort(m.tensors_.begin(), m.tensors_.end(),
            [](const TensorView& a, const TensorView& b) { return a.name < b.name; });

  // llama3-style frequency factors.
  if (const TensorView* rf = m.tensor("rope_freqs.weight")) {
    if (!rf->type_supported || rf->type != kernels::WType::f32 || rf->shape.size() != 1 ||
        rf->shape[0] != c.head_dim / 2) {
      return fail(Errc::format_error, f.path() + ": tensor 'rope_freqs.weight' must be f32 [" +
                                          std::to_string(c.head_dim / 2) + "] (head_dim / 2), got " +
                                          shape_str(rf->shape));
    }
    c.rope_freq_factors.resize(static_cast<std::size_t>(c.head_dim / 2));
    std::memcpy(c.rope_freq_factors.data(), rf->data.data(), rf->data.size());
    for (float x : c.rope_freq_factors) {
      if (!std::isfinite(x) || x <= 0.0F) {
        return fail(Errc::format_error, f.path() + ": tensor 'rope_freqs.weight' holds " + num_str(x) +
                                            "; factors must be positive and finite");
      }
    }
  }

  // Phi-3 LongRoPE: rope_factors_short.weight / rope_factors_long.weight (f32 [head_dim / 2], global), the
  // original context (rope.scaling.original_context_length) and the attention factor (rope.scaling.attn_factor,
  // else Hugging Face's rule).
  const TensorView* rf_short = m.tensor("rope_factors_short.weight");
  const TensorView* rf_long = m.tensor("rope_factors_long.weight");
  if (rf_short != nullptr || rf_long != nullptr) {
    if (!phi3) {
      return fail(Errc::unsupported, f.path() + ": tensors rope_factors_short/long (LongRoPE) are supported for phi3 "
                                                "only, not " + *arch);
    }
    for (const char* name : {"rope_factors_short.weight", "rope_factors_long.weight"}) {
      const TensorView* rf = m.tensor(name);
      if (rf == nullptr) return fail(Errc::format_error, f.path() + ": tensor '" + name + "' is missing (LongRoPE "
                                                                      "needs both rope_factors_short and _long)");
      if (!rf->type_supported || rf->type != kernels::WType::f32 || rf->shape.size() != 1 ||
          rf->shape[0] != c.head_dim / 2) {
        return fail(Errc::format_error, f.path() + ": tensor '" + name + "' must be f32 [" +
                                            std::to_string(c.head_dim / 2) + "] (head_dim / 2), got " +
                                            shape_str(rf->shape));
      }
      std::vector<float>& out = name[13] == 's' ? c.rope_short_factors : c.rope_long_factors;
      out.resize(static_cast<std::size_t>(c.head_dim / 2));
      std::memcpy(out.data(), rf->data.data(), rf->data.size());
      for (float x : out) {
        if (!std::isfinite(x) || x <= 0.0F || x > kMaxRopeFactor) {
          return fail(Errc::format_error, f.path() + ": tensor '" + name + "' holds " + num_str(x) +
                                              "; factors must be in (0, " + num_str(kMaxRopeFactor) + "]");
        }
      }
    }
    c.rope_scaling = RopeScaling::longrope;
    GM_ASSIGN(ov, meta.opt_int(p + "rope.scaling.original_context_length", 2, kMaxPositions));
    c.rope_original_max_positions = ov ? static_cast<int>(*ov) : c.max_position_embeddings;
    GM_ASSIGN(c.rope_attention_factor, meta.opt_num(p + "rope.scaling.attn_factor", 0.0, kMaxRopeFactor));
  }

  // Required tensors: present, implied shape, a type Tandem computes with (norms in a float type).
  bool one_float_type = true;
  const TensorView* first = nullptr;
  for (const auto& [name, shape] : required_tensors(c)) {
    const TensorView* t = m.tensor(name);
    // The name in the file (a file may also use an HF name literally).
    const auto named = gguf_name.find(name);
    const std::string gname =
        named != gguf_name.end() ? named->second : gguf_name_from_hf(name, *arch).value_or(name);
    if (t == nullptr) {
      return fail(Errc::format_error,
                  f.path() + ": required tensor '" + gname + "' (" + name + ") " + shape_str(shape) + " is missing");
    }
    if (t->shape != shape) {
      return fail(Errc::format_error, f.path() + ": tensor '" + gname + "' has shape " + shape_str(t->shape) +
                                          " (HF order), expected " + shape_str(shape) + " from the " + p +
                                          "* metadata");
    }
    if (!t->type_supported) {
      const GgufTensorInfo* gi = f.find_tensor(gname);
      auto r = f.tensor_data(*gi);
      return fail(std::move(r).error());
    }
    const bool is_float =
        t->type == kernels::WType::f32 || t->type == kernels::WType::f16 || t->type == kernels::WType::bf16;
    if (shape.size() == 1 && !is_float) {
      return fail(Errc::unsupported, f.path() + ": tensor '" + gname + "' has type " +
                                         std::string(kernels::wtype_name(t->type)) +
                                         "; norm weights and biases must be f32, f16 or bf16");
    }
    if (shape.size() == 2) {
      if (first == nullptr) first = t;
      one_float_type = one_float_type && is_float && t->type == first->type;
    }
  }
  m.dtype_ = one_float_type && first != nullptr ? first->dtype : DType::f32;
  if (c.fused_projections) TANDEM_TRY(m.add_fused_views(f.path()));

  auto tok = sentencepiece_model_from_gguf(f);
  if (tok) {
    m.gguf_tokenizer_ = std::move(*tok);
  } else {
    m.gguf_tokenizer_error_ = std::move(tok).error();
  }
  return m;
}

#undef GM_ASSIGN

}  // namespace tandem::weights
