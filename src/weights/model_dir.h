// A model directory in the Hugging Face layout used by Llama-family checkpoints:
//   config.json, model.safetensors | model-0000N-of-0000M.safetensors + model.safetensors.index.json,
//   tokenizer.model and/or tokenizer.json, and optionally generation_config.json, tokenizer_config.json;
// or a llama.cpp GGUF file (a .gguf path, or a directory holding exactly one .gguf and no config.json), whose
// metadata, tensor names and tokenizer are mapped to the same view (docs/model-format.md, "GGUF").
// Everything read from disk is validated; a directory either opens as a complete, consistent model or fails with a
// typed error naming the file (and tensor / key).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "kernels/types.h"
#include "weights/gguf.h"
#include "weights/safetensors.h"

namespace tandem::weights {

enum class RopeScaling : std::uint8_t { none, llama3, linear, longrope };
// The MLP's gate activation: SiLU (Llama, Mistral, Qwen, Phi-3) or GELU with the tanh approximation (Gemma's
// "gelu_pytorch_tanh").
enum class Activation : std::uint8_t { silu, gelu_tanh };

struct ModelConfig {
  // "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM" or "Phi3ForCausalLM" (GGUF: llama → Llama,
  // qwen2 → Qwen2, phi3 → Phi3). What differs between them is carried by the fields below, not by the name.
  std::string architecture;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;      // defaults to num_heads when absent
  int head_dim = 0;          // config "head_dim" or hidden_size / num_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling = RopeScaling::none;
  double rope_factor = 1.0;            // linear / llama3
  double rope_low_freq_factor = 1.0;   // llama3
  double rope_high_freq_factor = 4.0;  // llama3
  // llama3: rope_scaling.original_max_position_embeddings. longrope (Phi-3): the top-level
  // original_max_position_embeddings (Phi3Config's default 4096 when absent).
  int rope_original_max_positions = 8192;
  // longrope (Phi-3's "longrope", formerly "su"): per rotary pair i < head_dim/2 the inverse frequency is divided
  // by short_factor[i] when the loaded context is <= rope_original_max_positions, else by long_factor[i] (llama.cpp's
  // choice per context; Hugging Face switches per forward length), and cos/sin are multiplied by the attention
  // factor (rope_scaling.attention_factor, else Hugging Face's rule: longrope_attention_factor()).
  std::vector<float> rope_short_factors, rope_long_factors;
  std::optional<double> rope_attention_factor;
  int vocab_size = 0;
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  std::string torch_dtype;   // as written ("float32", "bfloat16", ...), may be empty
  // Sliding-window attention (Mistral; Phi-3 as Hugging Face applies it): the query at position i sees the keys at
  // positions j with i - W < j <= i (W keys including its own), as transformers' sliding-window mask and
  // llama.cpp's LLAMA_SWA_TYPE_STANDARD define it. nullopt: full causal attention.
  std::optional<int> sliding_window;
  // Qwen2: q_proj, k_proj and v_proj carry biases (self_attn.{q,k,v}_proj.bias); o_proj and the MLP do not.
  bool qkv_bias = false;
  bool qk_norm = false;  // Qwen3, Gemma 3: per-head RMSNorm of q and k (self_attn.q_norm / k_norm, [head_dim]) before RoPE
  // Gemma 2 / 3. The MLP's activation; the embedding rows multiplied by embed_scale (sqrt(hidden_size); 0: not
  // scaled); every RMSNorm weight applied as 1 + w (Hugging Face's Gemma*RMSNorm; llama.cpp's converter stores w + 1,
  // so GGUF files have it false); post_norms: the attention output and the MLP output are RMS-normalised before
  // their residual adds (post_attention_layernorm, post_feedforward_layernorm), and the MLP's input norm is
  // pre_feedforward_layernorm (post_attention_layernorm is the MLP's input norm elsewhere).
  Activation activation = Activation::silu;
  double embed_scale = 0.0;
  bool norm_add_one = false;
  bool post_norms = false;
  // Scores are q·k × attn_scale (0: 1/sqrt(head_dim); Gemma: query_pre_attn_scalar^-1/2), then soft-capped as
  // cap · tanh(s / cap) when attn_softcap is set (Gemma 2); the logits likewise with final_softcap.
  double attn_scale = 0.0;
  std::optional<double> attn_softcap, final_softcap;
  // Which layers the sliding window applies to: empty = every layer (Mistral, Phi-3); else one flag per layer
  // (Gemma 2: even layers; Gemma 3: all but every sliding_window_pattern-th). Local layers rotate with
  // rope_local_theta when set (Gemma 3's rope_local_base_freq, without the global rope_scaling).
  std::vector<std::uint8_t> sliding_layers;
  std::optional<double> rope_local_theta;
  // Phi-3: self_attn.qkv_proj.weight holds the rows of q, k, v in that order and mlp.gate_up_proj.weight those of
  // gate, up; ModelDir adds zero-copy row-range views under the unfused names (q_proj, k_proj, v_proj, gate_proj,
  // up_proj).
  bool fused_projections = false;
  std::vector<int> bos_token_ids;
  std::vector<int> eos_token_ids;
  // RoPE pairing. false: Hugging Face's half-split rotation (element i pairs with i + head_dim/2). true: ggml's
  // interleaved rotation (element 2i pairs with 2i + 1), which GGUF llama files need because llama.cpp's converter
  // permuted the rows of q_proj / k_proj per head (permute_qk_rows_for_gguf in weights/gguf.h). GGUF qwen2 and phi3
  // files are not permuted (llama.cpp rotates them NEOX-style, as Hugging Face does): false.
  bool rope_interleaved = false;
  // GGUF `rope_freqs.weight` (llama3-style files): per rotary pair i < head_dim/2, the inverse frequency is divided
  // by rope_freq_factors[i] (llama.cpp's "freq_factors"). Empty: none.
  std::vector<float> rope_freq_factors;

  // Hugging Face's longrope attention factor: rope_attention_factor when given, else with
  // s = max_position_embeddings / rope_original_max_positions: 1 when s <= 1, else sqrt(1 + ln s / ln original).
  double longrope_attention_factor() const;
  // Whether layer `li` attends through the sliding window.
  bool layer_slides(int li) const {
    return sliding_window && (sliding_layers.empty() || sliding_layers[static_cast<std::size_t>(li)] != 0);
  }
  // Whether a replica loaded with `max_context` positions uses the long factors (max_context > original).
  bool longrope_uses_long(int max_context) const { return max_context > rope_original_max_positions; }

  // Parses and validates config.json text. `origin` names the file in error messages. Errors: parse_error (not
  // JSON), format_error (missing/mistyped key, value out of range, heads not dividing), unsupported
  // (an architecture other than Llama/Mistral/Qwen2/Phi3, naming it; attention_bias/mlp_bias true; hidden_act
  // other than "silu"; an unknown rope_scaling type; Qwen2's use_sliding_window true; partial_rotary_factor < 1).
  static Result<ModelConfig> parse(std::string_view json_text, const std::string& origin);
};

// generation_config.json (optional): the checkpoint's default sampling.
struct GenerationDefaults {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int> top_k;
  std::optional<double> repetition_penalty;
  std::optional<bool> do_sample;
  std::optional<int> max_new_tokens;
  std::vector<int> bos_token_ids;
  std::vector<int> eos_token_ids;

  static Result<GenerationDefaults> parse(std::string_view json_text, const std::string& origin);
};

// tokenizer_config.json (optional).
struct TokenizerSettings {
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
  std::string chat_template;       // raw Jinja text if present (not executed)
  std::string template_guess;      // "llama2", "chatml", "zephyr" or "" — recognised from chat_template markers

  static Result<TokenizerSettings> parse(std::string_view json_text, const std::string& origin);
  // The recognition behind template_guess.
  static std::string guess_template(std::string_view chat_template);
};

// A tensor of the model, zero-copy from its shard's (or GGUF file's) mapping.
struct TensorView {
  std::string name;   // Hugging Face name (GGUF names are mapped: blk.N.attn_q.weight → model.layers.N.self_attn...)
  DType dtype = DType::f32;  // f32/f16/bf16 as stored; u8 for block-quantized GGUF types (data = raw ggml blocks)
  std::vector<std::int64_t> shape;  // Hugging Face order: [rows, cols] for matrices (GGUF ne reversed)
  std::span<const std::byte> data;
  int shard = 0;  // index into shards(); 0 for GGUF
  // The weight type. f32/f16/bf16 for safetensors float tensors; any WType for GGUF. type_supported is false for
  // tensors Tandem cannot compute with (safetensors integer dtypes, GGUF types outside WType — then data is empty);
  // only extra tensors can be like that, a required tensor always has a supported type.
  kernels::WType type = kernels::WType::f32;
  bool type_supported = true;
};

// The view of GGUF tensor `t` of `f` under `name` (a Hugging Face name): HF-order shape, its weight type (or
// type_supported false and no data for a ggml type Tandem does not compute with), zero-copy bytes. Used by every
// GGUF layout reader (LLM, CLIP, BERT, Whisper).
TensorView gguf_tensor_view(const GgufFile& f, const GgufTensorInfo& t, std::string name);

// The safetensors weights of a Hugging Face directory, whatever the model: model.safetensors (preferred when
// present, as in transformers) or model.safetensors.index.json and its shards. Validated as ModelDir::open does:
// every shard opens, index entries name plain files and the shard that holds the tensor, no tensor in two shards.
// Views of every tensor (any dtype; type_supported false for non-float ones), sorted by name. Used by ModelDir::open
// and by non-Llama models (engine/clip.h).
struct SafetensorsWeights {
  std::vector<SafetensorsFile> shards;
  std::vector<TensorView> tensors;
  const TensorView* find(const std::string& name) const;  // nullptr if absent
};
Result<SafetensorsWeights> open_safetensors_weights(const std::string& dir);

class ModelDir {
 public:
  enum class Format : std::uint8_t { hf_dir, gguf };

  // Opens and validates the directory: config.json parses; the safetensors file(s) open; with an index, every
  // tensor named lives in the listed shard, every listed shard exists, no tensor appears in two shards; all tensors
  // the config implies are present with the implied shapes (lm_head.weight unless tied), in one of f32/f16/bf16
  // and all the same dtype; a tokenizer exists: tokenizer.model (SentencePiece) or tokenizer.json (Hugging Face
  // tokenizers), either or both (not_found naming both when neither does). Extra tensors (e.g. rotary inv_freq) are
  // ignored.
  // A path naming a regular file, or a directory without config.json that holds exactly one *.gguf, opens as GGUF:
  // general.architecture "llama", its llama.* metadata mapped to ModelConfig (rope_interleaved = true), tensors
  // renamed to the HF names with HF-order shapes, mixed weight types allowed (1-D norms f32/f16/bf16); the
  // tokenizer comes from tokenizer.ggml.* (tokenizer_bytes()). Errors as for directories, plus unsupported for other
  // architectures and ggml types Tandem does not compute with (naming the tensor and type).
  static Result<ModelDir> open(const std::string& dir);

  Format format() const { return format_; }
  // The opened path for GGUF (the .gguf file), the directory for hf_dir.
  const std::string& model_path() const { return format_ == Format::gguf ? gguf_path_ : dir_; }
  // The GGUF file (metadata, raw tensor infos); nullptr for hf_dir.
  const GgufFile* gguf() const { return gguf_ ? &*gguf_ : nullptr; }
  // Every mapping the tensor views point into (the shards, or the one GGUF file): for prefaulting and sampling.
  std::vector<const MappedFile*> mapped_files() const;
  // The SentencePiece ModelProto bytes for tok::Tokenizer::from_bytes(): tokenizer.model's bytes for hf_dir (read
  // now; not_found / io_error), or a ModelProto serialized from the GGUF vocabulary (unsupported for BPE / other
  // tokenizer models, format_error for inconsistent tokenizer.ggml.* arrays).
  Result<std::string> tokenizer_bytes() const;
  // Weight types of the required tensors as "type:count" in kernels::kAllWTypes order, e.g. "f32:5,q4_K:14,q6_K:3"
  // (stable; for fingerprints).
  std::string type_summary() const;

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const GenerationDefaults& generation() const { return generation_; }
  const TokenizerSettings& tokenizer_settings() const { return tokenizer_settings_; }
  // tokenizer.model in the directory; "" for GGUF (use tokenizer_bytes()). It may be absent when tokenizer.json is
  // there (open() requires one of the two).
  std::string tokenizer_path() const { return format_ == Format::gguf ? std::string() : dir_ + "/tokenizer.model"; }
  // tokenizer.json (Hugging Face tokenizers) in the directory; "" for GGUF. It may be absent when tokenizer.model
  // is there.
  std::string tokenizer_json_path() const {
    return format_ == Format::gguf ? std::string() : dir_ + "/tokenizer.json";
  }
  // The one float dtype of the weights for hf_dir. For GGUF: the float type (F32/F16/BF16) when every required
  // matrix is stored in that one type; otherwise (quantized or mixed) F32, the type dequantized weights take —
  // type_summary() says what is stored.
  DType dtype() const { return dtype_; }

  // Lookup of a required or extra tensor (or a view of a fused one); nullptr if absent.
  const TensorView* tensor(const std::string& name) const;
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const std::vector<SafetensorsFile>& shards() const { return shards_; }

  std::uint64_t weight_bytes() const;  // sum of the required tensors' bytes
  std::uint64_t parameter_count() const;

  // Identity of the weights without reading them all: SHA-256 over each shard's header bytes and file size, and
  // config.json (GGUF: over the file size and the header up to the data section). Cheap (headers only).
  // content_digest() hashes every tensor byte (slow; used on request).
  std::string header_digest() const;
  std::string content_digest() const;

  // Raw config.json text (for fingerprints); empty for GGUF.
  const std::string& config_text() const { return config_text_; }

  // Names of the required tensors for a config, in a stable order.
  static std::vector<std::pair<std::string, std::vector<std::int64_t>>> required_tensors(const ModelConfig& c);

 private:
  ModelDir() = default;
  static Result<ModelDir> open_gguf(const std::string& file);  // gguf_model.cc
  // For fused_projections: adds the row-range views q_proj/k_proj/v_proj of each qkv_proj and gate_proj/up_proj of
  // each gate_up_proj (required tensors already validated). format_error when an unfused name is also present.
  Status add_fused_views(const std::string& origin);

  Format format_ = Format::hf_dir;
  std::string dir_;
  std::string gguf_path_;
  std::optional<GgufFile> gguf_;
  std::string gguf_tokenizer_;           // the synthesized ModelProto, or
  std::optional<Error> gguf_tokenizer_error_;  // why there is none
  std::string config_text_;
  ModelConfig config_;
  GenerationDefaults generation_;
  TokenizerSettings tokenizer_settings_;
  DType dtype_ = DType::f32;
  std::vector<SafetensorsFile> shards_;
  std::vector<TensorView> tensors_;  // sorted by name
};

}  // namespace tandem::weights
