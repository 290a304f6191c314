// A model directory in the Hugging Face layout used by Llama-family checkpoints:
//   config.json, model.safetensors | model-0000N-of-0000M.safetensors + model.safetensors.index.json,
//   tokenizer.model, and optionally generation_config.json, tokenizer_config.json.
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
#include "weights/safetensors.h"

namespace tandem::weights {

enum class RopeScaling : std::uint8_t { none, llama3, linear };

struct ModelConfig {
  std::string architecture;  // "LlamaForCausalLM" or "MistralForCausalLM"
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
  int rope_original_max_positions = 8192;  // llama3
  int vocab_size = 0;
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  std::string torch_dtype;   // as written ("float32", "bfloat16", ...), may be empty
  std::optional<int> sliding_window;  // Mistral; parsed, reported, not applied beyond max positions
  std::vector<int> bos_token_ids;
  std::vector<int> eos_token_ids;

  // Parses and validates config.json text. `origin` names the file in error messages. Errors: parse_error (not
  // JSON), format_error (missing/mistyped key, value out of range, heads not dividing), unsupported
  // (architecture, attention_bias/mlp_bias true, hidden_act other than "silu", unknown rope_scaling type).
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
};

// A tensor of the model, zero-copy from its shard's mapping.
struct TensorView {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> data;
  int shard = 0;
};

class ModelDir {
 public:
  // Opens and validates the directory: config.json parses; the safetensors file(s) open; with an index, every
  // tensor named lives in the listed shard, every listed shard exists, no tensor appears in two shards; all tensors
  // the config implies are present with the implied shapes (lm_head.weight unless tied), in one of f32/f16/bf16
  // and all the same dtype; tokenizer.model exists. Extra tensors (e.g. rotary inv_freq) are ignored.
  static Result<ModelDir> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const GenerationDefaults& generation() const { return generation_; }
  const TokenizerSettings& tokenizer_settings() const { return tokenizer_settings_; }
  std::string tokenizer_path() const { return dir_ + "/tokenizer.model"; }
  DType dtype() const { return dtype_; }

  // Lookup of a required or extra tensor; nullptr if absent.
  const TensorView* tensor(const std::string& name) const;
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const std::vector<SafetensorsFile>& shards() const { return shards_; }

  std::uint64_t weight_bytes() const;  // sum of the required tensors' bytes
  std::uint64_t parameter_count() const;

  // Identity of the weights without reading them all: SHA-256 over each shard's header bytes and file size, and
  // config.json. Cheap (headers only). content_digest() hashes every tensor byte (slow; used on request).
  std::string header_digest() const;
  std::string content_digest() const;

  // Raw config.json text (for fingerprints).
  const std::string& config_text() const { return config_text_; }

  // Names of the required tensors for a config, in a stable order.
  static std::vector<std::pair<std::string, std::vector<std::int64_t>>> required_tensors(const ModelConfig& c);

 private:
  ModelDir() = default;
  std::string dir_;
  std::string config_text_;
  ModelConfig config_;
  GenerationDefaults generation_;
  TokenizerSettings tokenizer_settings_;
  DType dtype_ = DType::f32;
  std::vector<SafetensorsFile> shards_;
  std::vector<TensorView> tensors_;  // sorted by name
};

}  // namespace tandem::weights
