// Writes Llama-family models (Llama, Mistral, Qwen2, Phi-3) in the Hugging Face layout (config.json,
// model.safetensors or shards + index,
// tokenizer.model, generation_config.json, tokenizer_config.json) with deterministic weights. Used by the
// tandem-mkmodel tool, the tests and the benchmarks, so nothing needs a download.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "tokenizer/bpe_vocab.h"
#include "weights/safetensors.h"

namespace tandem::modelgen {

struct Shape {
  int hidden = 64;
  int intermediate = 128;
  int layers = 2;
  int heads = 4;
  int kv_heads = 2;
  int vocab = 32000;
  int max_positions = 512;
  int head_dim = 0;  // 0: hidden / heads; else written as config "head_dim" (Qwen3's heads are wider than hidden / heads)
  bool tied = false;
  double rope_theta = 10000.0;
  double rms_eps = 1e-5;
  // LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (q/k/v biases), Qwen3ForCausalLM (per-head q/k norms) or
  // Phi3ForCausalLM (fused qkv_proj and gate_up_proj), Gemma2ForCausalLM / Gemma3ForCausalLM (GELU-tanh, scaled
  // embedding, 1 + w norms with random w, post-norms, soft caps (Gemma 2), q/k norms (Gemma 3), sliding and global
  // layers in Gemma's patterns).
  std::string architecture = "LlamaForCausalLM";
  int sliding_window = 0;  // > 0: written as "sliding_window" (Mistral, Phi-3 apply it)
  // "" (none), "llama3" (factor, low 1, high 4, original_max_positions), "linear" (factor; Gemma 3: global layers
  // only) or "longrope" (Phi-3: short/long factors 1 + 0.1·i and 1 + 0.75·i per rotary pair i,
  // original_max_positions as the top-level key).
  std::string rope_scaling;
  double rope_factor = 32.0;
  int original_max_positions = 8192;
  // Gemma 2's soft caps (attn_logit_softcapping, final_logit_softcapping): small in the presets, so that a test sees
  // whether they are applied (the real 50 / 30 barely touch a random model's scores).
  double attn_softcap = 50.0, final_softcap = 30.0;

  int head_dimension() const { return head_dim > 0 ? head_dim : hidden / heads; }
  std::uint64_t parameters() const;
};

// "test" (hidden 64, 2 layers, GQA 4/2), "tiny" (the bundled default: hidden 128, 4 layers, GQA 4/2, tied),
// "134m" (hidden 768, 12 layers, 12 heads, FFN 2048, vocab 32000 — the benchmark shape); per architecture, each
// hidden 64, 2 layers, GQA 4/2, vocab 32000: "llama3" (Llama 3.2-style: rope_theta 500000, llama3 rope scaling
// factor 32 over 8192 original positions, tied head), "qwen2" (q/k/v biases, tied head, rope_theta 1000000),
// "mistral" (sliding window 32, so tests cross it), "phi3" (fused projections, LongRoPE over 64 original of 512
// positions, untied), "qwen3" (per-head q/k RMSNorm with random weights, head_dim 32 > hidden / heads, tied head,
// rope_theta 1000000, no biases).
Result<Shape> preset(std::string_view name);
// The chat_template a family preset carries (its family's real template, gen::family_template): llama3 → Llama 3.2's,
// qwen2 → Qwen2.5's, mistral → Mistral v0.3's, phi3 → Phi-3's; "" for test, tiny and 134m.
std::string_view preset_chat_template(std::string_view preset);

struct Options {
  Shape shape;
  weights::DType dtype = weights::DType::f32;  // f32, f16 or bf16
  std::uint64_t seed = 1;
  int shards = 1;                     // > 1 writes model-0000N-of-0000M.safetensors + index
  std::string tokenizer_model;        // path of the tokenizer.model to copy
  // Appended to the copied tokenizer.model as user-defined pieces (score 0); an "<end_of_turn>" among them joins the
  // generation defaults' EOS ids.
  std::vector<std::string> extra_pieces;
  // A byte-level BPE vocabulary: written as tokenizer.json (hf_json_from_bpe_vocab) instead of copying
  // tokenizer_model; its BOS / EOS (and end-of-turn) ids go into config.json, generation_config.json, and its
  // add_bos into tokenizer_config.json.
  std::shared_ptr<const tok::BpeVocab> bpe;
  std::string chat_template;          // written into tokenizer_config.json when non-empty
  bool write_generation_config = true;
  // Optional weight source: fills `out` (numel floats) for tensor `name`; default: deterministic random init
  // (uniform with std 0.02 for matrices, ones for norms).
  std::function<void(const std::string& name, std::vector<float>& out)> source;
};

// The pieces a preset's SentencePiece vocabulary gets after the copied tokenizer.model's (user-defined pieces, matched
// in text): gemma2 and gemma3 → <start_of_turn>, <end_of_turn> (Gemma's turn markers); empty otherwise.
std::vector<std::string> preset_extra_pieces(std::string_view preset);

// The generated BPE vocabulary of a preset, in the style of the family's real one (nullptr: the preset uses the
// SentencePiece tokenizer.model): "llama3" 4096 tokens, pre-tokenizer llama-bpe, <|begin_of_text|>,
// <|end_of_text|>, <|start_header_id|>, <|end_header_id|>, <|eot_id|>; "qwen2" 4096 tokens, pre-tokenizer qwen2,
// <|endoftext|>, <|im_start|>, <|im_end|> (no BOS, as Qwen2); "qwen3" the same with <think> and </think> added. Mistral and Phi-3 keep SentencePiece, as their real
// tokenizers are (Phi-3's is Llama 2's with <|user|>, <|end|>, ... added).
std::shared_ptr<const tok::BpeVocab> preset_bpe_vocab(std::string_view preset);

// Creates `dir` if needed and writes the model. Errors: invalid_argument (bad shape/options), io_error.
Status write_model(const std::string& dir, const Options& opts);

// Writes `text` to `path` (created or truncated); io_error naming the file. Shared by the writers.
Status write_text_file(const std::string& path, const std::string& text);
// The writers' deterministic random weights: `vals` (its size is the tensor's) filled uniform in base ± a (std
// a/√3), four values per Philox call keyed by (element index, tensor index `ti`, the writer's `salt`) and `seed`.
void fill_uniform(std::vector<float>& vals, float base, float a, std::uint64_t seed, std::uint32_t ti, std::uint32_t salt);
// `vals` as `dtype` bytes into `out` (resized): f32 as is, f16 / bf16 rounded to nearest even.
void encode_floats(const std::vector<float>& vals, weights::DType dtype, std::vector<std::byte>& out);

// A file's bytes (at most 512 MiB: format_error beyond; io_error when it cannot be read). Used by the writers and
// converters for the model files they read.
Result<std::string> read_text_file(const std::string& path);

// Rounding conversions used for f16/bf16 files (round to nearest even).
std::uint16_t float_to_bf16(float f);
std::uint16_t float_to_f16(float f);
float bf16_to_float(std::uint16_t h);

}  // namespace tandem::modelgen
