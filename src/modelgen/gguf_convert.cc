#include "modelgen/gguf_convert.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <thread>

#include "kernels/quant.h"
#include "modelgen/modelgen.h"
#include "tokenizer/hf_vocab.h"
#include "tokenizer/tokenizer.h"
#include "weights/gguf.h"
#include "weights/gguf_model.h"
#include "weights/gguf_tokenizer.h"
#include "weights/model_dir.h"

namespace tandem::modelgen {

namespace {

// What llama.cpp's loader fixes for gemma2 / gemma3 instead of reading it from the file (llama_model::load_hparams):
// the sliding-layer pattern, the query scale, gemma3's local RoPE base and its lack of soft caps, gemma2's caps being
// on. A configuration outside those would run differently in llama.cpp than in Tandem: refused, naming the key.
Status check_gemma_for_llamacpp(const weights::ModelConfig& c, const std::string& arch, const std::string& dir) {
  auto refuse = [&](const std::string& what) {
    return fail(Errc::unsupported, dir + ": " + what + ", which a " + arch + " GGUF file cannot express (llama.cpp fixes it)");
  };
  const bool g2 = arch == "gemma2";
  const int pattern = g2 ? 2 : 6;
  for (int i = 0; i < c.num_layers; ++i)
    if (c.layer_slides(i) != (i % pattern < pattern - 1))
      return refuse("layer " + std::to_string(i) + (c.layer_slides(i) ? " slides" : " does not slide"));
  const bool big = c.num_layers == (g2 ? 46 : 62);
  const double scale = 1.0 / std::sqrt(big ? static_cast<double>(c.hidden_size / c.num_heads) : c.head_dim);
  if (std::abs(c.attn_scale - scale) > 1e-9 * scale) return refuse("query_pre_attn_scalar gives another query scale");
  if (g2 && (!c.attn_softcap || !c.final_softcap)) return refuse("a null soft cap");
  if (!g2 && (c.attn_softcap || c.final_softcap)) return refuse("a soft cap");
  if (!g2 && c.rope_local_theta.value_or(10000.0) != 10000.0) return refuse("rope_local_base_freq other than 10000");
  return {};
}


using kernels::WType;
using weights::GgufType;
using weights::GgufValue;

struct RecipeInfo {
  Recipe recipe;
  std::string_view name;
  WType type;
};
constexpr RecipeInfo kRecipes[] = {
    {Recipe::f32, "F32", WType::f32},          {Recipe::f16, "F16", WType::f16},
    {Recipe::bf16, "BF16", WType::bf16},       {Recipe::q8_0, "Q8_0", WType::q8_0},
    {Recipe::q4_0, "Q4_0", WType::q4_0},       {Recipe::q4_K_S, "Q4_K_S", WType::q4_K},
    {Recipe::q4_K_M, "Q4_K_M", WType::q4_K},   {Recipe::q5_K_S, "Q5_K_S", WType::q5_K},
    {Recipe::q5_K_M, "Q5_K_M", WType::q5_K},   {Recipe::q6_K, "Q6_K", WType::q6_K},
    {Recipe::q5_0, "Q5_0", WType::q5_0},       {Recipe::q4_1, "Q4_1", WType::q4_1},
    {Recipe::q5_1, "Q5_1", WType::q5_1},       {Recipe::iq4_nl, "IQ4_NL", WType::iq4_nl},
    {Recipe::iq4_xs, "IQ4_XS", WType::iq4_xs},   {Recipe::q2_K, "Q2_K", WType::q2_K},
    {Recipe::q3_K_S, "Q3_K_S", WType::q3_K},     {Recipe::q3_K_M, "Q3_K_M", WType::q3_K},
    {Recipe::q3_K_L, "Q3_K_L", WType::q3_K},
};

const RecipeInfo& info(Recipe r) {
  for (const auto& i : kRecipes)
    if (i.recipe == r) return i;
  return kRecipes[0];
}

bool is_quantized(WType t) { return t != WType::f32 && t != WType::f16 && t != WType::bf16; }

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// llama.cpp's "more bits" rule for the first and last eighth of the layers and every third one between.
bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// A tensor to write: its GGUF name and dims, its stored type and bytes (a view into the source or `owned`).
struct SrcTensor {
  std::string name;
  std::vector<std::uint64_t> ne;
  WType type = WType::f32;
  std::span<const std::byte> data;
  std::vector<std::byte> owned;
};

struct Source {
  std::vector<std::pair<std::string, GgufValue>> metadata;  // in order
  std::vector<SrcTensor> tensors;
  std::optional<weights::GgufFile> gguf;  // keeps the mapping alive (GGUF source)
  std::optional<weights::ModelDir> hf;    // keeps the mappings alive (HF source)
  std::optional<tok::BpeVocab> bpe;       // HF source: the vocabulary read from its tokenizer.json
  std::uint32_t alignment = 32;
  // HF source: the embedding's rows (config vocab_size). The token list is padded to it as llama.cpp's converter
  // does ("[PAD<id>]", type unused, score -10000): checkpoints pad their embeddings (Qwen2.5: 151,936 rows for
  // 151,665 tokens; Phi-3: 32,064 for 32,011), and llama.cpp refuses a file with fewer tokens than rows.
  std::uint64_t vocab_rows = 0;
};

std::string pad_token(std::uint64_t id) { return "[PAD" + std::to_string(id) + "]"; }

// The layer of "blk.N.*" (-1 for the others): llama-quantize writes tensors sorted by (layer, name).
int layer_of(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  int v = 0;
  std::size_t i = 4;
  if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])) && v < 1000000)
    v = v * 10 + (name[i++] - '0');
  return v;
}

std::string gguf_path_of(const std::string& in) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(in, ec)) return in;
  if (!fs::is_directory(in, ec)) return {};
  if (fs::exists(fs::path(in) / "config.json", ec)) return {};
  std::string found;
  for (const auto& e : fs::directory_iterator(in, ec))
    if (e.path().extension() == ".gguf") {
      if (!found.empty()) return {};
      found = e.path().string();
    }
  return found;
}

Result<Source> from_gguf(const std::string& path) {
  auto f = weights::GgufFile::open(path);
  if (!f) return fail(std::move(f).error());
  Source s;
  s.alignment = static_cast<std::uint32_t>(f->alignment());
  s.metadata = f->metadata();
  for (const auto& t : f->tensors()) {
    if (!t.wtype)
      return fail(Errc::unsupported, path + ": tensor '" + t.name + "' has type " + weights::ggml_type_label(t.ggml_type) +
                                         ", which Tandem does not convert");
    SrcTensor st;
    st.name = t.name;
    st.ne = t.ne;
    st.type = *t.wtype;
    st.data = f->raw_tensor_bytes(t);
    s.tensors.push_back(std::move(st));
  }
  s.gguf = std::move(f).value();
  return s;
}

Result<Source> from_hf(const std::string& dir_path, const tok::BpeVocab* bpe) {
  auto dir = weights::ModelDir::open(dir_path);
  if (!dir) return fail(std::move(dir).error());
  const weights::ModelConfig& c = dir->config();
  const std::optional<std::string> arch_name = weights::gguf_arch_of(c.architecture);
  if (!arch_name) return fail(Errc::unsupported, dir_path + ": no GGUF architecture for " + c.architecture);
  const std::string& arch = *arch_name;
  const std::string p = arch + ".";
  // The tokenizer, by tok::load_model_tokenizer's rule (tokenizer.json when present, else tokenizer.model), so
  // the file tokenizes like the directory: a byte-level BPE tokenizer.json becomes a "gpt2" vocabulary (written by
  // convert_to_gguf); one that bpe_vocab_from_hf_json refuses as unsupported (the SentencePiece-style
  // tokenizer.json of Llama 2 / Mistral) falls back to tokenizer.model when there is one.
  Source s;
  s.vocab_rows = static_cast<std::uint64_t>(c.vocab_size);
  std::optional<tok::Tokenizer> tok;  // SentencePiece
  if (bpe == nullptr) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const std::string json_path = dir->tokenizer_json_path();
    const bool has_model = fs::is_regular_file(dir->tokenizer_path(), ec);
    if (fs::is_regular_file(json_path, ec)) {
      auto text = read_text_file(json_path);
      if (!text) return fail(std::move(text).error());
      std::string config;
      const std::string config_path = dir_path + "/tokenizer_config.json";
      if (fs::is_regular_file(config_path, ec)) {
        auto c = read_text_file(config_path);
        if (!c) return fail(std::move(c).error());
        config = std::move(*c);
      }
      auto v = tok::bpe_vocab_from_hf_json(*text, json_path, config);
      if (v) {
        s.bpe = std::move(*v);
      } else if (v.error().code != Errc::unsupported || !has_model) {
        Error e = std::move(v).error();
        if (e.code == Errc::unsupported) e.message += " (and there is no tokenizer.model to convert instead)";
        return fail(std::move(e));
      }
    }
    if (!s.bpe) {
      auto tok_bytes = dir->tokenizer_bytes();
      if (!tok_bytes) return fail(std::move(tok_bytes).error());
      auto t = tok::Tokenizer::from_bytes(*tok_bytes, dir->tokenizer_path());
      if (!t) return fail(std::move(t).error());
      tok.emplace(std::move(t).value());
    }
  }

  auto u32 = [](std::uint64_t v) { return GgufValue::of_uint(GgufType::u32, v); };
  auto f32 = [](double v) { return GgufValue::of_float(GgufType::f32, v); };
  auto& md = s.metadata;
  md.emplace_back("general.architecture", GgufValue::of_string(arch));
  md.emplace_back("general.type", GgufValue::of_string("model"));
  md.emplace_back("general.name", GgufValue::of_string(std::filesystem::path(dir_path).filename().string()));
  md.emplace_back(p + "block_count", u32(static_cast<std::uint64_t>(c.num_layers)));
  md.emplace_back(p + "context_length", u32(static_cast<std::uint64_t>(c.max_position_embeddings)));
  md.emplace_back(p + "embedding_length", u32(static_cast<std::uint64_t>(c.hidden_size)));
  md.emplace_back(p + "feed_forward_length", u32(static_cast<std::uint64_t>(c.intermediate_size)));
  md.emplace_back(p + "attention.head_count", u32(static_cast<std::uint64_t>(c.num_heads)));
  md.emplace_back(p + "attention.head_count_kv", u32(static_cast<std::uint64_t>(c.num_kv_heads)));
  md.emplace_back(p + "rope.freq_base", f32(c.rope_theta));
  md.emplace_back(p + "attention.layer_norm_rms_epsilon", f32(c.rms_norm_eps));
  md.emplace_back(p + "vocab_size", u32(static_cast<std::uint64_t>(c.vocab_size)));
  md.emplace_back(p + "rope.dimension_count", u32(static_cast<std::uint64_t>(c.head_dim)));
  // The head width where it is not embedding_length / head_count (Qwen3 configs always name it, and llama.cpp's
  // converter then writes both keys).
  const bool gemma = arch == "gemma2" || arch == "gemma3";
  if (gemma) TANDEM_TRY(check_gemma_for_llamacpp(c, arch, dir_path));
  if (arch == "qwen3" || gemma || c.head_dim * c.num_heads != c.hidden_size) {
    md.emplace_back(p + "attention.key_length", u32(static_cast<std::uint64_t>(c.head_dim)));
    md.emplace_back(p + "attention.value_length", u32(static_cast<std::uint64_t>(c.head_dim)));
  }
  // Sliding window: phi3.attention.sliding_window as llama.cpp's converter writes it (0 = none); for Mistral a
  // llama.attention.sliding_window key llama.cpp does not write (and ignores), so Tandem reads its own files back
  // with the window.
  if (arch == "phi3") {
    md.emplace_back(p + "attention.sliding_window", u32(static_cast<std::uint64_t>(c.sliding_window.value_or(0))));
  } else if (c.sliding_window) {
    md.emplace_back(p + "attention.sliding_window", u32(static_cast<std::uint64_t>(*c.sliding_window)));
  }
  if (arch == "gemma2") {
    md.emplace_back(p + "attn_logit_softcapping", f32(*c.attn_softcap));
    md.emplace_back(p + "final_logit_softcapping", f32(*c.final_softcap));
  }
  // RoPE scaling as llama.cpp's converter writes it: linear as metadata; llama3 as the rope_freqs.weight factors
  // (LlamaModel.generate_extra_tensors); Phi-3 LongRoPE as rope_factors_short/long.weight, the original context and
  // the attention factor (Phi3MiniModel).
  std::vector<SrcTensor> extra;
  auto f32_tensor = [&](const std::string& name, const std::vector<float>& v) {
    SrcTensor st;
    st.name = name;
    st.ne = {v.size()};
    st.type = WType::f32;
    st.owned.resize(v.size() * sizeof(float));
    std::memcpy(st.owned.data(), v.data(), st.owned.size());
    st.data = st.owned;
    extra.push_back(std::move(st));
  };
  switch (c.rope_scaling) {
    case weights::RopeScaling::none: break;
    case weights::RopeScaling::linear:
      md.emplace_back(p + "rope.scaling.type", GgufValue::of_string("linear"));
      md.emplace_back(p + "rope.scaling.factor", f32(c.rope_factor));
      break;
    case weights::RopeScaling::llama3: {
      std::vector<float> factors;
      const double low_wl = c.rope_original_max_positions / c.rope_low_freq_factor;
      const double high_wl = c.rope_original_max_positions / c.rope_high_freq_factor;
      for (int i = 0; i < c.head_dim / 2; ++i) {
        const double freq = 1.0 / std::pow(c.rope_theta, 2.0 * i / c.head_dim);
        const double wl = 2.0 * M_PI / freq;
        if (wl < high_wl) {
          factors.push_back(1.0F);
        } else if (wl > low_wl) {
          factors.push_back(static_cast<float>(c.rope_factor));
        } else {
          const double smooth = (c.rope_original_max_positions / wl - c.rope_low_freq_factor) /
                                (c.rope_high_freq_factor - c.rope_low_freq_factor);
          factors.push_back(static_cast<float>(1.0 / ((1.0 - smooth) / c.rope_factor + smooth)));
        }
      }
      f32_tensor("rope_freqs.weight", factors);
      break;
    }
    case weights::RopeScaling::longrope:
      md.emplace_back(p + "rope.scaling.original_context_length",
                      u32(static_cast<std::uint64_t>(c.rope_original_max_positions)));
      md.emplace_back(p + "rope.scaling.attn_factor", f32(c.longrope_attention_factor()));
      f32_tensor("rope_factors_long.weight", c.rope_long_factors);
      f32_tensor("rope_factors_short.weight", c.rope_short_factors);
      break;
  }
  if (tok) {
    md.emplace_back("tokenizer.ggml.model", GgufValue::of_string("llama"));
    md.emplace_back("tokenizer.ggml.pre", GgufValue::of_string("default"));
    std::vector<std::string> pieces;
    std::vector<float> scores;
    std::vector<std::int32_t> types;
    for (int id = 0; id < tok->vocab_size(); ++id) {
      pieces.push_back(tok->piece(id));
      scores.push_back(tok->score(id));
      types.push_back(static_cast<std::int32_t>(tok->type(id)));
    }
    for (auto id = static_cast<std::uint64_t>(tok->vocab_size()); id < static_cast<std::uint64_t>(c.vocab_size); ++id) {
      pieces.push_back(pad_token(id));
      scores.push_back(-10000.0F);
      types.push_back(static_cast<std::int32_t>(tok::PieceType::unused));
    }
    md.emplace_back("tokenizer.ggml.tokens", GgufValue::of_strings(std::move(pieces)));
    md.emplace_back("tokenizer.ggml.scores", GgufValue::of_f32s(scores));
    md.emplace_back("tokenizer.ggml.token_type", GgufValue::of_i32s(types));
    if (tok->bos_id() >= 0)
      md.emplace_back("tokenizer.ggml.bos_token_id", u32(static_cast<std::uint64_t>(tok->bos_id())));
    if (tok->eos_id() >= 0)
      md.emplace_back("tokenizer.ggml.eos_token_id", u32(static_cast<std::uint64_t>(tok->eos_id())));
    if (tok->unk_id() >= 0)
      md.emplace_back("tokenizer.ggml.unknown_token_id", u32(static_cast<std::uint64_t>(tok->unk_id())));
    // An end-of-turn id the generation defaults stop on besides EOS (Gemma's <end_of_turn>): eot_token_id, which
    // Tandem's reader adds to the stop ids (llama.cpp also finds <end_of_turn> by its text).
    std::vector<int> other;
    for (int id : dir->generation().eos_token_ids)
      if (id != tok->eos_id() && id >= 0 && id < tok->vocab_size()) other.push_back(id);
    if (other.size() == 1) md.emplace_back("tokenizer.ggml.eot_token_id", u32(static_cast<std::uint64_t>(other[0])));
    // (llama.cpp's converter writes add_space_prefix from the normalizer; absent, readers assume true)
    if (!tok->add_dummy_prefix()) md.emplace_back("tokenizer.ggml.add_space_prefix", GgufValue::of_bool(false));
    md.emplace_back("tokenizer.ggml.add_bos_token",
                    GgufValue::of_bool(dir->tokenizer_settings().add_bos_token.value_or(true)));
    md.emplace_back("tokenizer.ggml.add_eos_token",
                    GgufValue::of_bool(dir->tokenizer_settings().add_eos_token.value_or(false)));
  }
  if (!dir->tokenizer_settings().chat_template.empty())
    md.emplace_back("tokenizer.chat_template", GgufValue::of_string(dir->tokenizer_settings().chat_template));

  for (const auto& [hf_name, shape] : weights::ModelDir::required_tensors(c)) {
    const weights::TensorView* tv = dir->tensor(hf_name);
    auto g = weights::gguf_name_from_hf(hf_name, arch);
    if (!tv || !g) return fail(Errc::internal, dir_path + ": no GGUF name for tensor '" + hf_name + "'");
    SrcTensor st;
    st.name = *g;
    for (auto it = tv->shape.rbegin(); it != tv->shape.rend(); ++it) st.ne.push_back(static_cast<std::uint64_t>(*it));
    st.type = tv->type;
    // Only llama files are permuted for ggml's interleaved RoPE; qwen2 and phi3 keep the HF rows (NEOX rotation).
    const bool q = ends_with(hf_name, "q_proj.weight"), k = ends_with(hf_name, "k_proj.weight");
    if (gemma && ends_with(hf_name, "norm.weight")) {
      // Gemma: Hugging Face stores w and applies 1 + w; llama.cpp's converter writes 1 + w (F32).
      const auto n = static_cast<std::int64_t>(tv->shape[0]);
      std::vector<float> v(static_cast<std::size_t>(n));
      kernels::dequantize_row(tv->type, tv->data.data(), v.data(), n);
      for (float& x : v) x += 1.0F;
      st.type = WType::f32;
      st.owned.resize(v.size() * sizeof(float));
      std::memcpy(st.owned.data(), v.data(), st.owned.size());
      st.data = st.owned;
    } else if (arch == "llama" && (q || k)) {
      st.owned.resize(tv->data.size());
      const std::size_t rb = kernels::row_bytes(tv->type, tv->shape.back());
      TANDEM_TRY(weights::permute_qk_rows_for_gguf(tv->data, st.owned, q ? c.num_heads : c.num_kv_heads, rb));
      st.data = st.owned;
    } else {
      st.data = tv->data;
    }
    s.tensors.push_back(std::move(st));
  }
  for (auto& e : extra) {
    e.data = e.owned;  // (re-pointed after the moves)
    s.tensors.push_back(std::move(e));
  }
  for (auto& t : s.tensors)
    if (!t.owned.empty()) t.data = t.owned;
  s.hf = std::move(dir).value();  // the views point into its mappings
  return s;
}

// Rows [r0, r1) of `t` converted to `out_type` into `out` (row_bytes(out_type, ne0) per row).
void convert_rows(const SrcTensor& t, WType out_type, std::byte* out, std::uint64_t r0, std::uint64_t r1) {
  const auto cols = static_cast<std::int64_t>(t.ne[0]);
  const std::size_t in_rb = kernels::row_bytes(t.type, cols), out_rb = kernels::row_bytes(out_type, cols);
  std::vector<float> row(static_cast<std::size_t>(cols));
  for (std::uint64_t r = r0; r < r1; ++r) {
    kernels::dequantize_row(t.type, t.data.data() + r * in_rb, row.data(), cols);
    kernels::quantize_row(out_type, row.data(), out + r * out_rb, cols);
  }
}

}  // namespace

Status add_converted_tensor(weights::GgufWriter& w, const weights::TensorView& tv, const std::string& gguf_name,
                            WType type, ConvertStats& stats) {
  const std::int64_t cols = tv.shape.empty() ? 1 : tv.shape.back();
  const std::size_t in_rb = kernels::row_bytes(tv.type, cols), out_rb = kernels::row_bytes(type, cols);
  const std::uint64_t rows = cols > 0 && in_rb > 0 ? tv.data.size() / in_rb : 0;
  std::vector<std::byte> data(out_rb * rows);
  std::vector<float> row(static_cast<std::size_t>(cols));
  for (std::uint64_t i = 0; i < rows; ++i) {
    kernels::dequantize_row(tv.type, tv.data.data() + i * in_rb, row.data(), cols);
    kernels::quantize_row(type, row.data(), data.data() + i * out_rb, cols);
  }
  TANDEM_TRY(w.add_tensor(gguf_name, type, tv.shape, data));
  stats.tensors++;
  stats.quantized += type != tv.type;
  stats.bytes_in += tv.data.size();
  stats.bytes_out += data.size();
  stats.types.emplace_back(gguf_name, type);
  return {};
}

Result<Recipe> parse_recipe(std::string_view name) {
  std::string up(name);
  for (char& ch : up) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  std::string known;
  for (const auto& i : kRecipes) {
    if (i.name == up) return i.recipe;
    known += (known.empty() ? "" : ", ") + std::string(i.name);
  }
  return fail(Errc::invalid_argument, "unknown quantization type '" + std::string(name) + "' (one of " + known + ")");
}

std::string_view recipe_name(Recipe r) { return info(r).name; }
WType recipe_default_type(Recipe r) { return info(r).type; }

Result<WType> recipe_type(Recipe r, const TensorSlot& t) {
  // Only matrices named *weight that are not norms are quantized (llama.cpp's tensor_allows_quantization).
  const bool matrix = t.ne.size() >= 2 && ends_with(t.name, "weight") &&
                      t.name.find("_norm.weight") == std::string::npos;
  // The others (norms, biases, RoPE factors) are F32 whatever the source stores them in, as llama.cpp's converter
  // writes them (n_dims <= 1 or *_norm.weight: F32): llama.cpp's CPU backend only multiplies by F32 vectors
  // (ggml_mul's "only f32 src1 supported"), so an f16 norm aborts it. llama-quantize keeps a tensor it does not
  // quantize as it is; from a file of llama.cpp's converter those are F32 already.
  if (!matrix) return t.stored == WType::f16 || t.stored == WType::bf16 ? WType::f32 : t.stored;
  WType type = recipe_default_type(r);
  if (!is_quantized(type)) return type;  // F32 / F16 / BF16: a conversion of every matrix

  const bool output = t.name == "output.weight";
  const bool embd = t.name == "token_embd.weight";
  const std::uint64_t ncols = t.ne[0];
  if (output || (t.tied && embd)) {
    const auto blk = static_cast<std::uint64_t>(kernels::traits(type).block_elems);
    if (ncols % blk != 0) type = WType::q8_0;
    else if (type != WType::q8_0) type = WType::q6_K;
  } else if (t.name.find("attn_v.weight") != std::string::npos) {
    const bool iq4 = r == Recipe::iq4_nl || r == Recipe::iq4_xs;
    if (r == Recipe::q2_K)
      type = t.n_gqa >= 4 ? WType::q4_K : WType::q3_K;
    else if (r == Recipe::q3_K_M)
      type = t.attn_v_index < 2 ? WType::q5_K : WType::q4_K;
    else if (r == Recipe::q3_K_L)
      type = WType::q5_K;
    else if (iq4 && t.n_gqa >= 4)
      type = WType::q5_K;
    else if ((r == Recipe::q4_K_M || r == Recipe::q5_K_M) && use_more_bits(t.attn_v_index, t.attn_v_count))
      type = WType::q6_K;
    else if (r == Recipe::q4_K_S && t.attn_v_index < 4)
      type = WType::q5_K;
  } else if (t.name.find("ffn_down") != std::string::npos) {
    const int i = t.ffn_down_index, n = t.ffn_down_count;
    if (r == Recipe::q2_K) type = WType::q3_K;
    else if (r == Recipe::q3_K_M) type = i < n / 16 ? WType::q5_K : WType::q4_K;  // (llama.cpp: not Falcon)
    else if (r == Recipe::q3_K_L) type = WType::q5_K;
    else if ((r == Recipe::q4_K_M || r == Recipe::q5_K_M) && use_more_bits(i, n)) type = WType::q6_K;
    else if ((r == Recipe::iq4_nl || r == Recipe::iq4_xs) && i < n / 8) type = WType::q5_K;  // (no imatrix)
    else if (r == Recipe::q4_K_S && i < n / 8) type = WType::q5_K;
  } else if (t.name.find("attn_output.weight") != std::string::npos) {  // (llama.cpp's rule for dense models)
    if (r == Recipe::q2_K) type = WType::q3_K;
    else if (r == Recipe::q3_K_M) type = WType::q4_K;
    else if (r == Recipe::q3_K_L) type = WType::q5_K;
  } else if (t.name.find("attn_qkv.weight") != std::string::npos) {  // Phi-3's fused projection
    if (r == Recipe::q3_K_M || r == Recipe::q3_K_L) type = WType::q4_K;
    else if (r == Recipe::q4_K_M) type = WType::q5_K;
    else if (r == Recipe::q5_K_M) type = WType::q6_K;
  }
  // Shapes the type's blocks do not divide fall back as llama.cpp does.
  const auto blk = static_cast<std::uint64_t>(kernels::traits(type).block_elems);
  if (ncols % blk != 0) {
    if (type == WType::q6_K) type = WType::q8_0;
    else if (type == WType::iq4_xs || type == WType::q2_K || type == WType::q3_K) type = WType::iq4_nl;
    else if (type == WType::q4_K) type = WType::q5_0;
    else if (type == WType::q5_K) type = WType::q5_1;
    if (ncols % static_cast<std::uint64_t>(kernels::traits(type).block_elems) != 0) type = WType::f16;
  }
  return type;
}

Result<ConvertStats> convert_to_gguf(const std::string& in, const std::string& out, Recipe r, int threads,
                                     const tok::BpeVocab* bpe) {
  if (threads < 1 || threads > 256)
    return fail(Errc::invalid_argument, "threads must be in [1, 256], got " + std::to_string(threads));
  const std::string gguf_in = gguf_path_of(in);
  if (bpe != nullptr && !gguf_in.empty())
    return fail(Errc::invalid_argument, in + ": a BPE vocabulary is given for a GGUF source, which has its own");
  auto src = gguf_in.empty() ? from_hf(in, bpe) : from_gguf(gguf_in);
  if (!src) return fail(std::move(src).error());
  Source& s = *src;

  // Tensor order: non-layer tensors first, then by layer, by name within each (llama-quantize's order).
  std::stable_sort(s.tensors.begin(), s.tensors.end(), [](const SrcTensor& a, const SrcTensor& b) {
    const int la = layer_of(a.name), lb = layer_of(b.name);
    return la != lb ? la < lb : a.name < b.name;
  });
  int attn_v_count = 0, ffn_down_count = 0;
  bool tied = true;
  // n_gqa = head_count / head_count_kv from the (source's) metadata, as llama.cpp's hparams give it.
  int n_gqa = 1;
  {
    std::string arch;
    for (const auto& [k, v] : s.metadata)
      if (k == "general.architecture" && v.type == GgufType::string) arch = v.str;
    std::uint64_t heads = 0, kv = 0;
    for (const auto& [k, v] : s.metadata) {
      if (k == arch + ".attention.head_count") heads = v.as_u64().value_or(0);
      if (k == arch + ".attention.head_count_kv") kv = v.as_u64().value_or(0);
    }
    if (heads > 0) n_gqa = static_cast<int>(heads / (kv > 0 ? kv : heads));
  }
  for (const auto& t : s.tensors) {
    attn_v_count += t.name.find("attn_v.weight") != std::string::npos;
    ffn_down_count += t.name.find("ffn_down") != std::string::npos;
    tied = tied && t.name != "output.weight";
  }

  // Metadata: the source's, in order, with general.quantization_version and general.file_type (re)appended last.
  weights::GgufWriter w(s.alignment);
  for (const auto& [k, v] : s.metadata)
    if (k != "general.quantization_version" && k != "general.file_type") w.set(k, v);
  // tokenizer.ggml.model "gpt2", pre, merges, ...: the given vocabulary or the one read from tokenizer.json.
  const tok::BpeVocab* vocab = bpe != nullptr ? bpe : (s.bpe ? &*s.bpe : nullptr);
  if (vocab != nullptr) {
    tok::BpeVocab padded = *vocab;
    padded.types.resize(padded.tokens.size(), tok::PieceType::normal);
    for (std::uint64_t id = padded.tokens.size(); id < s.vocab_rows; ++id) {
      padded.tokens.push_back(pad_token(id));
      padded.types.push_back(tok::PieceType::unused);
    }
    weights::write_bpe_vocab_to_gguf(w, padded);
  }
  w.set("general.quantization_version", GgufValue::of_uint(GgufType::u32, 2));
  w.set("general.file_type", GgufValue::of_uint(GgufType::u32, static_cast<std::uint32_t>(r)));

  ConvertStats st;
  int attn_v_i = 0, ffn_down_i = 0;
  for (const auto& t : s.tensors) {
    TensorSlot slot{t.name, t.ne, t.type, attn_v_i, attn_v_count, ffn_down_i, ffn_down_count, tied, n_gqa};
    attn_v_i += t.name.find("attn_v.weight") != std::string::npos;
    ffn_down_i += t.name.find("ffn_down") != std::string::npos;
    auto type = recipe_type(r, slot);
    if (!type) return fail(std::move(type).error());
    std::uint64_t rows = 1;
    for (std::size_t i = 1; i < t.ne.size(); ++i) rows *= t.ne[i];
    std::vector<std::byte> data;
    std::span<const std::byte> bytes = t.data;
    if (*type != t.type) {
      data.resize(kernels::row_bytes(*type, static_cast<std::int64_t>(t.ne[0])) * rows);
      const int T = rows >= 64 ? threads : 1;
      std::vector<std::thread> pool;
      for (int i = 1; i < T; ++i)
        pool.emplace_back(convert_rows, std::cref(t), *type, data.data(), rows * static_cast<std::uint64_t>(i) / T,
                          rows * static_cast<std::uint64_t>(i + 1) / T);
      convert_rows(t, *type, data.data(), 0, rows / static_cast<std::uint64_t>(T));
      for (auto& th : pool) th.join();
      bytes = data;
      ++st.quantized;
    }
    TANDEM_TRY(w.add_tensor(t.name, static_cast<std::uint32_t>(kernels::traits(*type).ggml_id), t.ne, bytes));
    st.tensors++;
    st.bytes_in += t.data.size();
    st.bytes_out += bytes.size();
    st.types.emplace_back(t.name, *type);
  }
  TANDEM_TRY(w.write(out));
  std::error_code ec;
  st.file_bytes = std::filesystem::file_size(out, ec);
  return st;
}

}  // namespace tandem::modelgen
