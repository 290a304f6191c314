#include "modelgen/modelgen.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/text.h"
#include "generation/family_templates.h"
#include "generation/rng.h"
#include "tokenizer/model_proto.h"
#include "tokenizer/tokenizer.h"
#include "weights/model_dir.h"

namespace tandem::modelgen {

namespace fs = std::filesystem;

std::uint64_t Shape::parameters() const {
  const std::uint64_t hd = static_cast<std::uint64_t>(head_dimension());
  const std::uint64_t h = static_cast<std::uint64_t>(hidden);
  const bool gemma = architecture == "Gemma2ForCausalLM" || architecture == "Gemma3ForCausalLM";
  const std::uint64_t biases = architecture == "Qwen2ForCausalLM"   ? heads * hd + 2 * kv_heads * hd
                               : architecture == "Qwen3ForCausalLM" ? 2 * hd
                               : architecture == "Gemma3ForCausalLM" ? 2 * hd + 2 * h
                               : gemma                              ? 2 * h
                                                                    : 0;
  const std::uint64_t per_layer = 2 * h + h * heads * hd + 2 * h * kv_heads * hd + heads * hd * h +
                                  3 * h * static_cast<std::uint64_t>(intermediate) + biases;
  return static_cast<std::uint64_t>(vocab) * h * (tied ? 1 : 2) + h + per_layer * static_cast<std::uint64_t>(layers);
}

Result<Shape> preset(std::string_view name) {
  Shape s;
  if (name == "test") return s;
  if (name == "tiny") {
    s.hidden = 128;
    s.intermediate = 384;
    s.layers = 4;
    s.heads = 4;
    s.kv_heads = 2;
    s.max_positions = 1024;
    s.tied = true;
    return s;
  }
  if (name == "134m") {
    s.hidden = 768;
    s.intermediate = 2048;
    s.layers = 12;
    s.heads = 12;
    s.kv_heads = 12;
    s.max_positions = 2048;
    return s;
  }
  if (name == "llama3") {
    s.rope_theta = 500000.0;
    s.rope_scaling = "llama3";
    s.rope_factor = 32.0;
    s.original_max_positions = 8192;
    s.tied = true;
    return s;
  }
  if (name == "qwen2") {
    s.architecture = "Qwen2ForCausalLM";
    s.rope_theta = 1000000.0;
    s.rms_eps = 1e-6;
    s.tied = true;
    return s;
  }
  if (name == "qwen3") {
    s.architecture = "Qwen3ForCausalLM";
    s.head_dim = 32;  // 4 heads of 32 = 128 query rows from a hidden size of 64 (o_proj maps them back)
    s.rope_theta = 1000000.0;
    s.rms_eps = 1e-6;
    s.tied = true;
    return s;
  }
  if (name == "gemma2" || name == "gemma3") {
    // hidden 64, 4 heads of 32 (wider than hidden / heads, as Gemma's), GQA 4/2, window 16 (tests cross it), tied;
    // Gemma 2: 2 layers (layer 0 slides, layer 1 is global), soft caps 0.05 on the scores and 1 on the logits;
    // Gemma 3: 6 layers (the sixth is global), rope_theta 1e6 with linear scaling 8 on the global layer, local base
    // 10000. Vocabulary: Llama 2's + <start_of_turn>, <end_of_turn>.
    s.architecture = name == "gemma2" ? "Gemma2ForCausalLM" : "Gemma3ForCausalLM";
    s.head_dim = 32;
    s.sliding_window = 16;
    s.rms_eps = 1e-6;
    s.tied = true;
    s.vocab = 32002;
    if (name == "gemma2") {
      s.attn_softcap = 0.05;
      s.final_softcap = 1.0;
    } else {
      s.layers = 6;
      s.rope_theta = 1000000.0;
      s.rope_scaling = "linear";
      s.rope_factor = 8.0;
    }
    return s;
  }
  if (name == "mistral") {
    s.architecture = "MistralForCausalLM";
    s.sliding_window = 32;
    return s;
  }
  if (name == "phi3") {
    s.architecture = "Phi3ForCausalLM";
    s.rope_scaling = "longrope";
    s.original_max_positions = 64;
    return s;
  }
  return fail(Errc::invalid_argument,
              "unknown model preset '" + std::string(name) +
                  "' (test, tiny, 134m, llama3, qwen2, qwen3, mistral, phi3, gemma2, gemma3)");
}

std::string_view preset_chat_template(std::string_view preset) {
  if (preset == "llama3") return gen::family_template("llama3_2");
  if (preset == "qwen2") return gen::family_template("qwen2_5");
  if (preset == "qwen3") return gen::family_template("qwen3");
  if (preset == "mistral") return gen::family_template("mistral_v0_3");
  if (preset == "phi3") return gen::family_template("phi3");
  if (preset == "gemma2") return gen::family_template("gemma2");
  if (preset == "gemma3") return gen::family_template("gemma3");
  return {};
}

std::vector<std::string> preset_extra_pieces(std::string_view preset) {
  if (preset == "gemma2" || preset == "gemma3") return {"<start_of_turn>", "<end_of_turn>"};
  return {};
}

std::shared_ptr<const tok::BpeVocab> preset_bpe_vocab(std::string_view preset) {
  if (preset == "llama3") {
    return std::make_shared<const tok::BpeVocab>(tok::generate_bpe_vocab(
        4096, "llama-bpe",
        {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}, 3));
  }
  if (preset == "qwen2") {
    return std::make_shared<const tok::BpeVocab>(
        tok::generate_bpe_vocab(4096, "qwen2", {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, 2));
  }
  if (preset == "qwen3") {
    return std::make_shared<const tok::BpeVocab>(tok::generate_bpe_vocab(
        4096, "qwen2", {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"}, 2));
  }
  return nullptr;
}

std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if (std::isnan(f)) return 0x7FC0;
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<std::uint16_t>(u >> 16);
}

float bf16_to_float(std::uint16_t h) { return std::bit_cast<float>(std::uint32_t{h} << 16); }

std::uint16_t float_to_f16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 16) & 0x8000;
  const std::uint32_t absu = u & 0x7FFFFFFF;
  if (absu >= 0x7F800000) return static_cast<std::uint16_t>(sign | (absu > 0x7F800000 ? 0x7E00 : 0x7C00));
  if (absu >= 0x477FF000) return static_cast<std::uint16_t>(sign | 0x7C00);  // overflow → inf
  if (absu < 0x38800000) {  // subnormal or zero in f16
    const float a = std::bit_cast<float>(absu);
    const auto m = static_cast<std::uint32_t>(std::nearbyint(a * 16777216.0f));  // a / 2^-24
    return static_cast<std::uint16_t>(sign | m);
  }
  std::uint32_t r = absu - 0x38000000;  // rebias exponent 127 → 15
  r += 0xFFF + ((r >> 13) & 1);
  return static_cast<std::uint16_t>(sign | (r >> 13));
}

namespace {

Status check(const Options& o) {
  const Shape& s = o.shape;
  auto bad = [](const std::string& m) { return fail(Errc::invalid_argument, "model shape: " + m); };
  if (s.hidden < 2 || s.hidden > 65536) return bad("hidden must be in [2, 65536]");
  if (s.heads < 1 || s.hidden % s.heads != 0) return bad("heads must divide hidden");
  if (s.head_dim < 0 || s.head_dim > 1024) return bad("head_dim must be in [0, 1024]");
  if (s.head_dimension() % 2 != 0) return bad("head_dim must be even");
  if (s.kv_heads < 1 || s.heads % s.kv_heads != 0) return bad("kv_heads must divide heads");
  if (s.layers < 1 || s.layers > 1024) return bad("layers must be in [1, 1024]");
  if (s.intermediate < 1) return bad("intermediate must be >= 1");
  if (s.vocab < 1) return bad("vocab must be >= 1");
  if (s.max_positions < 1) return bad("max_positions must be >= 1");
  if (o.shards < 1 || o.shards > 64) return bad("shards must be in [1, 64]");
  if (o.dtype != weights::DType::f32 && o.dtype != weights::DType::f16 && o.dtype != weights::DType::bf16)
    return bad("dtype must be f32, f16 or bf16");
  return {};
}

Status write_text(const fs::path& p, const std::string& text) { return write_text_file(p.string(), text); }

}  // namespace

Status write_text_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) return fail(Errc::io_error, "cannot write " + path);
  return {};
}

void fill_uniform(std::vector<float>& vals, float base, float a, std::uint64_t seed, std::uint32_t ti, std::uint32_t salt) {
  const std::uint64_t numel = vals.size();
  for (std::uint64_t i = 0; i < numel; i += 4) {
    const auto r = gen::philox4x32({static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i >> 32), ti, salt},
                                   {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
    for (std::uint64_t j = 0; j < 4 && i + j < numel; ++j)
      vals[i + j] = base + (static_cast<float>(r[j] >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * a;
  }
}

void encode_floats(const std::vector<float>& vals, weights::DType dtype, std::vector<std::byte>& out) {
  out.resize(vals.size() * weights::dtype_size(dtype));
  if (dtype == weights::DType::f32) {
    std::memcpy(out.data(), vals.data(), out.size());
    return;
  }
  for (std::size_t i = 0; i < vals.size(); ++i) {
    const std::uint16_t h = dtype == weights::DType::bf16 ? float_to_bf16(vals[i]) : float_to_f16(vals[i]);
    std::memcpy(out.data() + i * 2, &h, 2);
  }
}

Result<std::string> read_text_file(const std::string& path) {
  constexpr std::uintmax_t kMax = 512u << 20;
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) return fail(Errc::io_error, path + ": cannot read (" + ec.message() + ")");
  if (size > kMax) return fail(Errc::format_error, path + ": is larger than 512 MiB");
  std::ifstream f(path, std::ios::binary);
  if (!f) return fail(Errc::io_error, path + ": cannot open");
  std::string text(static_cast<std::size_t>(size), '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (static_cast<std::uintmax_t>(f.gcount()) != size) return fail(Errc::io_error, path + ": read error");
  return text;
}

Status write_model(const std::string& dir, const Options& o) {
  TANDEM_TRY(check(o));
  const Shape& s = o.shape;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return fail(Errc::io_error, "cannot create " + dir + ": " + ec.message());

  const bool gemma = s.architecture == "Gemma2ForCausalLM" || s.architecture == "Gemma3ForCausalLM";
  const std::string model_type = s.architecture == "MistralForCausalLM" ? "mistral"
                                 : s.architecture == "Gemma2ForCausalLM" ? "gemma2"
                                 : s.architecture == "Gemma3ForCausalLM" ? "gemma3_text"
                                 : s.architecture == "Qwen2ForCausalLM" ? "qwen2"
                                 : s.architecture == "Qwen3ForCausalLM" ? "qwen3"
                                 : s.architecture == "Phi3ForCausalLM"  ? "phi3"
                                                                        : "llama";
  const int half = s.head_dimension() / 2;
  std::ostringstream rope;
  rope.precision(17);
  if (s.rope_scaling == "llama3") {
    rope << "{\"rope_type\": \"llama3\", \"factor\": " << s.rope_factor
         << ", \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": "
         << s.original_max_positions << "}";
  } else if (s.rope_scaling == "linear") {
    rope << "{\"rope_type\": \"linear\", \"factor\": " << s.rope_factor << "}";
  } else if (s.rope_scaling == "longrope") {
    rope << "{\"type\": \"longrope\", \"short_factor\": [";
    for (int i = 0; i < half; ++i) rope << (i ? ", " : "") << 1.0 + 0.1 * i;
    rope << "], \"long_factor\": [";
    for (int i = 0; i < half; ++i) rope << (i ? ", " : "") << 1.0 + 0.75 * i;
    rope << "]}";
  } else {
    rope << "null";
  }
  // Special ids: the BPE vocabulary's (null when it has none), else the Llama 2 tokenizer's <s> = 1, </s> = 2; the
  // generation defaults stop on the end-of-turn token too.
  auto id_or_null = [](int id) { return id >= 0 ? std::to_string(id) : std::string("null"); };
  const std::string bos = o.bpe ? id_or_null(o.bpe->bos) : "1";
  const std::string eos = o.bpe ? id_or_null(o.bpe->eos) : "2";
  std::string gen_eos = eos;
  if (o.bpe && o.bpe->eot >= 0 && o.bpe->eot != o.bpe->eos)
    gen_eos = o.bpe->eos >= 0 ? "[" + eos + ", " + std::to_string(o.bpe->eot) + "]" : std::to_string(o.bpe->eot);
  // The SentencePiece vocabulary with the extra pieces appended (a ModelProto's pieces are a repeated field: more
  // entries after the copied bytes extend the list).
  std::string sp_bytes;
  if (!o.bpe && !o.tokenizer_model.empty() && !o.extra_pieces.empty()) {
    auto bytes = read_text_file(o.tokenizer_model);
    if (!bytes) return fail(std::move(bytes).error());
    auto base = tok::Tokenizer::from_bytes(*bytes, o.tokenizer_model);
    if (!base) return fail(std::move(base).error());
    sp_bytes = std::move(*bytes);
    // Gemma's normalizer adds no dummy prefix ("<start_of_turn>user" at the start of a text is not "▁" + ...):
    // a second normalizer_spec merges into the first (protobuf's rule for a repeated singular message).
    std::string norm;
    tok::detail::put_varint_field(norm, 3, 0);  // add_dummy_prefix false
    tok::detail::put_len_field(sp_bytes, 3, norm);
    for (std::size_t i = 0; i < o.extra_pieces.size(); ++i) {
      std::string piece;
      tok::detail::put_len_field(piece, 1, o.extra_pieces[i]);
      tok::detail::put_float_field(piece, 2, 0.0F);
      tok::detail::put_varint_field(piece, 3, 4);  // USER_DEFINED
      tok::detail::put_len_field(sp_bytes, 1, piece);
      if (o.extra_pieces[i] == "<end_of_turn>") gen_eos = "[" + eos + ", " + std::to_string(base->vocab_size() + static_cast<int>(i)) + "]";
    }
  }
  std::ostringstream cfg;
  cfg << "{\n  \"architectures\": [\"" << s.architecture << "\"],\n  \"model_type\": \"" << model_type << "\",\n"
      << "  \"hidden_size\": " << s.hidden << ",\n  \"intermediate_size\": " << s.intermediate << ",\n"
      << "  \"num_hidden_layers\": " << s.layers << ",\n  \"num_attention_heads\": " << s.heads << ",\n"
      << "  \"num_key_value_heads\": " << s.kv_heads << ",\n  \"hidden_act\": \"" << (gemma ? "gelu_pytorch_tanh" : "silu") << "\",\n"
      << "  \"max_position_embeddings\": " << s.max_positions << ",\n  \"rms_norm_eps\": " << s.rms_eps << ",\n"
      << "  \"rope_theta\": " << s.rope_theta << ",\n  \"rope_scaling\": " << rope.str() << ",\n"
      << "  \"vocab_size\": " << s.vocab << ",\n  \"tie_word_embeddings\": " << (s.tied ? "true" : "false") << ",\n"
      << "  \"torch_dtype\": \""
      << (o.dtype == weights::DType::f32 ? "float32" : o.dtype == weights::DType::f16 ? "float16" : "bfloat16")
      << "\",\n  \"bos_token_id\": " << bos << ",\n  \"eos_token_id\": " << eos << ",\n  \"attention_bias\": false";
  if (s.sliding_window > 0) cfg << ",\n  \"sliding_window\": " << s.sliding_window;
  if (model_type == "qwen2" || model_type == "qwen3") cfg << ",\n  \"use_sliding_window\": false";
  if (s.head_dim > 0) cfg << ",\n  \"head_dim\": " << s.head_dim;
  if (model_type == "phi3") cfg << ",\n  \"original_max_position_embeddings\": " << s.original_max_positions;
  if (gemma) {
    cfg << ",\n  \"hidden_activation\": \"gelu_pytorch_tanh\",\n  \"query_pre_attn_scalar\": " << s.head_dimension();
    if (model_type == "gemma2") {
      cfg << ",\n  \"attn_logit_softcapping\": " << s.attn_softcap << ",\n  \"final_logit_softcapping\": " << s.final_softcap;
    } else {
      cfg << ",\n  \"attn_logit_softcapping\": null,\n  \"final_logit_softcapping\": null,\n  \"sliding_window_pattern\": 6"
          << ",\n  \"rope_local_base_freq\": 10000.0";
    }
  }
  cfg << "\n}\n";
  TANDEM_TRY(write_text(fs::path(dir) / "config.json", cfg.str()));

  if (o.write_generation_config)
    TANDEM_TRY(write_text(fs::path(dir) / "generation_config.json",
                          "{\n  \"bos_token_id\": " + bos + ",\n  \"eos_token_id\": " + gen_eos +
                              ",\n  \"do_sample\": false\n}\n"));
  {
    std::string tc = std::string("{\n  \"add_bos_token\": ") + (!o.bpe || o.bpe->add_bos ? "true" : "false") +
                     ",\n  \"add_eos_token\": false";
    if (!o.chat_template.empty()) tc += ",\n  \"chat_template\": \"" + json_escape(o.chat_template) + "\"";
    tc += "\n}\n";
    TANDEM_TRY(write_text(fs::path(dir) / "tokenizer_config.json", tc));
  }
  if (o.bpe) {
    TANDEM_TRY(write_text(fs::path(dir) / "tokenizer.json", tok::hf_json_from_bpe_vocab(*o.bpe)));
  } else if (!sp_bytes.empty()) {
    TANDEM_TRY(write_text(fs::path(dir) / "tokenizer.model", sp_bytes));
  } else if (!o.tokenizer_model.empty()) {
    fs::copy_file(o.tokenizer_model, fs::path(dir) / "tokenizer.model", fs::copy_options::overwrite_existing, ec);
    if (ec) return fail(Errc::io_error, "cannot copy " + o.tokenizer_model + ": " + ec.message());
    fs::permissions(fs::path(dir) / "tokenizer.model", fs::perms(0644), ec);
  }

  // Tensors in the order HF writes them; each shard gets a contiguous run of them.
  weights::ModelConfig mc;
  mc.hidden_size = s.hidden;
  mc.intermediate_size = s.intermediate;
  mc.num_layers = s.layers;
  mc.num_heads = s.heads;
  mc.num_kv_heads = s.kv_heads;
  mc.head_dim = s.head_dimension();
  mc.vocab_size = s.vocab;
  mc.tie_word_embeddings = s.tied;
  mc.qkv_bias = model_type == "qwen2";
  mc.qk_norm = model_type == "qwen3" || model_type == "gemma3_text";
  mc.post_norms = gemma;
  mc.fused_projections = model_type == "phi3";
  const auto required = weights::ModelDir::required_tensors(mc);

  std::vector<std::vector<std::byte>> storage(required.size());
  std::vector<weights::TensorToWrite> all;
  std::vector<float> vals;
  for (std::size_t ti = 0; ti < required.size(); ++ti) {
    const auto& [name, shape] = required[ti];
    std::uint64_t numel = 1;
    for (auto d : shape) numel *= static_cast<std::uint64_t>(d);
    vals.assign(numel, 0.0f);
    if (o.source) {
      o.source(name, vals);
      if (vals.size() != numel) return fail(Errc::invalid_argument, "weight source returned a wrong size for " + name);
    } else if (!gemma && name.find("norm") != std::string::npos && name.find("q_norm") == std::string::npos &&
               name.find("k_norm") == std::string::npos) {
      std::fill(vals.begin(), vals.end(), 1.0f);
    } else {
      // (Qwen3's q/k norms: 1 + uniform with std 0.5, so a test sees whether they are applied and how.)
      // Uniform in [-a, a] with std 0.02 (a = 0.02·√3), four values per Philox call, keyed by (seed, tensor);
      // biases with std 0.5, large enough to move the logits.
      const bool bias = name.ends_with(".bias");
      // (Gemma's norms: w uniform with std 0.5 around 0, applied as 1 + w.)
      const bool qk_norm = !gemma && (name.ends_with("q_norm.weight") || name.ends_with("k_norm.weight"));
      const bool gemma_norm = gemma && name.ends_with("norm.weight");
      const float a = (bias || qk_norm || gemma_norm ? 0.5f : 0.02f) * std::sqrt(3.0f);
      fill_uniform(vals, qk_norm ? 1.0f : 0.0f, a, o.seed, static_cast<std::uint32_t>(ti), 0x5EED);
    }
    auto& buf = storage[ti];
    encode_floats(vals, o.dtype, buf);
    all.push_back({name, o.dtype, shape, std::span<const std::byte>(buf)});
  }

  const std::map<std::string, std::string> meta{{"format", "pt"}, {"generator", "tandem-mkmodel"}};
  if (o.shards == 1) return weights::write_safetensors((fs::path(dir) / "model.safetensors").string(), all, meta);

  std::ostringstream index;
  index << "{\n  \"metadata\": {\"total_size\": " << [&] {
    std::uint64_t t = 0;
    for (const auto& w : all) t += w.data.size();
    return t;
  }() << "},\n  \"weight_map\": {\n";
  const std::size_t per = (all.size() + static_cast<std::size_t>(o.shards) - 1) / static_cast<std::size_t>(o.shards);
  bool first = true;
  for (int sh = 0; sh < o.shards; ++sh) {
    char fname[64];
    std::snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", sh + 1, o.shards);
    std::vector<weights::TensorToWrite> part;
    for (std::size_t i = sh * per; i < std::min(all.size(), (sh + 1) * per); ++i) {
      part.push_back(all[i]);
      index << (first ? "" : ",\n") << "    \"" << all[i].name << "\": \"" << fname << "\"";
      first = false;
    }
    TANDEM_TRY(weights::write_safetensors((fs::path(dir) / fname).string(), part, meta));
  }
  index << "\n  }\n}\n";
  return write_text(fs::path(dir) / "model.safetensors.index.json", index.str());
}

}  // namespace tandem::modelgen
