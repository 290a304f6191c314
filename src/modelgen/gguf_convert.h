// Writes GGUF files from a Hugging Face model directory or another GGUF file, with llama.cpp's quantization types
// and mixes ("recipes"): the engine of `tandem-quantize` and `tandem-mkmodel --format gguf`. From a GGUF source the
// output is what llama.cpp's `llama-quantize IN OUT TYPE` writes (no importance matrix): the same metadata in the
// same order, tensors in the same order, the same types per tensor and the same bytes (tests/modelgen). From a HF
// directory it writes what convert_hf_to_gguf would need to be read by llama.cpp: llama.* hyper-parameters, the
// vocabulary as tokenizer.ggml.* (a byte-level BPE tokenizer.json as "gpt2" with its llama.cpp pre name, else the
// SentencePiece tokenizer.model as "llama"), the chat template, Q/K rows permuted for ggml's RoPE. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "tokenizer/bpe_vocab.h"
#include "kernels/types.h"
#include "weights/model_dir.h"

namespace tandem::modelgen {

// llama.cpp's llama_ftype values for the recipes Tandem can write (the file's `general.file_type`).
enum class Recipe : std::uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q8_0 = 7,
  q4_1 = 3,
  q5_0 = 8,
  q5_1 = 9,
  q2_K = 10,
  q3_K_S = 11,
  q3_K_M = 12,
  q3_K_L = 13,
  q4_K_S = 14,
  q4_K_M = 15,
  q5_K_S = 16,
  q5_K_M = 17,
  q6_K = 18,
  iq4_nl = 25,
  iq4_xs = 30,
  bf16 = 32,
};

// "Q4_K_M", "q4_k_m", "Q8_0", "f16", "BF16", ... (llama-quantize's names). invalid_argument lists the known ones.
Result<Recipe> parse_recipe(std::string_view name);
std::string_view recipe_name(Recipe r);  // "Q4_K_M", "F16", ...
kernels::WType recipe_default_type(Recipe r);

// The type llama.cpp's recipe gives one tensor (GGUF name, GGUF dims ne[0] = row length). `attn_v_index` /
// `ffn_down_index` are the 0-based positions of this tensor among the file's attn_v / ffn_down tensors in writing
// order and `attn_v_count` / `ffn_down_count` their totals; `tied` says the file has no output.weight; `n_gqa` is
// head_count / head_count_kv (llama.cpp's n_gqa(), 1 when the file does not say). Tensors that
// are not quantized (1-D, norms, non-weights) keep `stored`. unsupported when the recipe's shape fallback needs a
// type Tandem does not implement (q5_0 / q5_1).
struct TensorSlot {
  std::string name;
  std::vector<std::uint64_t> ne;
  kernels::WType stored = kernels::WType::f32;
  int attn_v_index = 0, attn_v_count = 0, ffn_down_index = 0, ffn_down_count = 0;
  bool tied = false;
  int n_gqa = 1;
};
Result<kernels::WType> recipe_type(Recipe r, const TensorSlot& t);

struct ConvertStats {
  std::uint64_t tensors = 0;
  std::uint64_t quantized = 0;     // tensors whose type changed
  std::uint64_t bytes_in = 0;      // tensor bytes read
  std::uint64_t bytes_out = 0;     // tensor bytes written
  std::uint64_t file_bytes = 0;
  std::vector<std::pair<std::string, kernels::WType>> types;  // per tensor, in file order
};

// Adds `tv` (any Tandem type, its Hugging Face shape) to `w` as the GGUF tensor `gguf_name` of `type`, row by row
// through f32, and counts it in `stats` (the CLIP and BERT converters' per-tensor step).
Status add_converted_tensor(weights::GgufWriter& w, const weights::TensorView& tv, const std::string& gguf_name,
                            kernels::WType type, ConvertStats& stats);

// Converts the model at `in` (a HF directory, a .gguf file or a directory holding one) into a GGUF file at `out`
// with recipe `r`. `threads` splits the rows of large tensors (results do not depend on it). Errors are those of
// the readers, invalid_argument (a tensor shape the recipe cannot take), unsupported, io_error.
// The tokenizer of a Hugging Face source follows tok::load_model_tokenizer's rule, so the file tokenizes like the
// directory: tokenizer.json when present, read by tok::bpe_vocab_from_hf_json (tokenizer/hf_vocab.h) and written as
// tokenizer.ggml.* "gpt2" metadata with its pre name (weights/gguf_tokenizer.h); a tokenizer.json it refuses as
// unsupported (SentencePiece-style: Llama 2, Mistral) when tokenizer.model exists → tokenizer.model as "llama";
// otherwise that typed error (unsupported naming the pre-tokenizer that matches no llama.cpp pre name, ...).
// `bpe`: the vocabulary to write instead of reading the directory's tokenizer (tandem-mkmodel); invalid_argument
// for a GGUF source.
Result<ConvertStats> convert_to_gguf(const std::string& in, const std::string& out, Recipe r, int threads = 1,
                                     const tok::BpeVocab* bpe = nullptr);

}  // namespace tandem::modelgen
