// The Whisper speech-model layout (Hugging Face WhisperForConditionalGeneration): the configuration and the tensors
// a configuration implies (names and shapes). Torch-free: shared by the engine (engine/whisper.h) and the writer
// (modelgen/whisper_writer.h). docs/speech-model.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"
#include "weights/gguf.h"
#include "weights/model_dir.h"

namespace tandem::weights {

struct WhisperConfig {
  int d_model = 0;
  int encoder_layers = 0, decoder_layers = 0;
  int encoder_heads = 0, decoder_heads = 0;
  int encoder_ffn = 0, decoder_ffn = 0;
  int n_mels = 80;
  int source_positions = 1500;  // max_source_positions: encoder output rows per 30-s window
  int target_positions = 448;   // max_target_positions: decoder tokens
  int vocab = 0;
  std::string act = "gelu";     // activation_function: only "gelu" (erf form)
  bool scale_embedding = false; // token embeddings × sqrt(d_model) when true
  double eps = 1e-5;            // every layer norm (Whisper's fixed value)
  std::int32_t decoder_start_id = -1, eos_id = -1, pad_id = -1, bos_id = -1;  // -1: none

  int window_frames() const { return 2 * source_positions; }  // mel frames in (conv2 has stride 2)
};

// Parses a Hugging Face Whisper config.json. Errors: parse_error (not JSON), format_error naming the key (missing,
// mistyped, out of range, heads not dividing d_model, a token id outside the vocabulary), unsupported
// (activation_function other than gelu, model_type other than whisper).
Result<WhisperConfig> parse_whisper_config(std::string_view json_text, const std::string& origin = "config.json");

// The tensors a configuration implies, Hugging Face names and shapes, in a stable order (encoder, decoder). The
// convolutions are [d, n_mels, 3] and [d, d, 3]; k_proj has no bias. proj_out.weight is not listed (tied to
// model.decoder.embed_tokens.weight; the engine uses it when the file has it).
std::vector<std::pair<std::string, std::vector<std::int64_t>>> whisper_required_tensors(const WhisperConfig& c);

// Tandem's Whisper GGUF (there is no llama.cpp convention for Whisper; whisper.cpp's files are not GGUF):
// general.architecture "whisper"; keys whisper.embedding_length, whisper.{encoder,decoder}.{block_count,
// attention.head_count, feed_forward_length, context_length}, whisper.n_mels, whisper.scale_embedding (optional),
// whisper.{decoder_start,eos,pad,bos}_token_id (optional, i32); tensors under their Hugging Face names. The
// vocabulary size is the rows of model.decoder.embed_tokens.weight. Errors: format_error naming the key or
// tensor, unsupported (another architecture).
Result<WhisperConfig> whisper_config_from_gguf(const GgufFile& f);
// The tensors of a Whisper GGUF file (names as stored, Hugging Face shapes), zero-copy, sorted by name.
std::vector<TensorView> whisper_tensor_views_from_gguf(const GgufFile& f);

}  // namespace tandem::weights
