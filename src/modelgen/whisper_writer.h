// Writes Whisper speech models (Hugging Face WhisperForConditionalGeneration layout: config.json, model.safetensors,
// preprocessor_config.json, generation_config.json) with deterministic random weights or weights from a caller's
// source (a trainer). Torch-free. docs/speech-model.md.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "modelgen/gguf_convert.h"
#include "tokenizer/whisper_tokens.h"
#include "weights/safetensors.h"
#include "weights/whisper_layout.h"

namespace tandem::modelgen {

// Fields mirror weights::WhisperConfig (plus the generation ids). Defaults: openai/whisper-tiny.
struct WhisperShape {
  int d_model = 384;
  int encoder_layers = 4, decoder_layers = 4;
  int encoder_heads = 6, decoder_heads = 6;
  int encoder_ffn = 1536, decoder_ffn = 1536;
  int n_mels = 80;
  int source_positions = 1500, target_positions = 448;
  int vocab = 51865;
  bool scale_embedding = false;
  // <|endoftext|> (eos, pad, bos), <|startoftranscript|> and <|notimestamps|> of the multilingual vocabulary.
  std::int32_t eos_id = 50257, bos_id = 50257, pad_id = 50257, decoder_start_id = 50258, no_timestamps_id = 50363;

  weights::WhisperConfig config() const;
  std::uint64_t parameters() const;
};

// "whisper-test" (d 32, 2+2 layers, 2 heads, ffn 64, 80 mels, 1500 source / 64 target positions, vocab 300 with
// eos 296, start 297, no-timestamps 299 until a tokenizer sets them), "whisper-tiny" (384, 4+4, 6 heads, 1536,
// 80 mels, 1500/448, vocab 51865), "whisper-base" (512, 6+6, 8, 2048), "whisper-small" (768, 12+12, 12, 3072) and
// "whisper-large-v3" (1280, 32+32, 20, 5120, 128 mels, vocab 51866, no-timestamps 50364). invalid_argument names
// the known presets.
Result<WhisperShape> whisper_preset(std::string_view name);

struct WhisperWriteOptions {
  WhisperShape shape;
  weights::DType dtype = weights::DType::f32;  // f32, f16 or bf16
  std::uint64_t seed = 1;
  // Optional weight source: fills `out` (numel floats, HF layout and names, weights::whisper_required_tensors) for
  // tensor `name`. Default: model.encoder.embed_positions.weight = Whisper's sinusoids; everything else uniform
  // random (std 0.02 for matrices, embeddings and biases; layer norms 1 ± std 0.1 / std 0.1), keyed by
  // (seed, tensor index).
  std::function<void(const std::string& name, std::vector<float>& out)> source;
};

// Creates `dir` if needed and writes config.json (architectures ["WhisperForConditionalGeneration"], model_type
// whisper, every key parse_whisper_config reads), model.safetensors, preprocessor_config.json (feature_size =
// n_mels, 16 kHz, hop 160, n_fft 400, 30-s chunks) and generation_config.json (decoder_start_token_id,
// no_timestamps_token_id, max_initial_timestamp_index 50, begin_suppress_tokens [220, eot] where valid). No
// tokenizer. Errors: invalid_argument (bad shape, a source returning the wrong size), io_error.
Status write_whisper_model(const std::string& dir, const WhisperWriteOptions& opts);

// Whisper's encoder position table: [length, channels], row t = [sin(t·inv_k) | cos(t·inv_k)], inv_k =
// exp(−k·ln(10000)/(channels/2 − 1)), k < channels/2 (channels even, ≥ 4).
std::vector<float> whisper_sinusoids(int length, int channels);

// A complete Whisper model directory for tests and benchmarks: a Whisper tokenizer trained on `corpus`
// (tok::write_whisper_tokenizer with `tok_opts`: byte-level BPE + <|endoftext|>, <|startoftranscript|>, languages,
// task, <|notimestamps|> and the 1501 timestamps), then write_whisper_model with the shape's vocab set to the
// tokenizer's size and eos / bos / pad = <|endoftext|>, decoder start = <|startoftranscript|>, no-timestamps =
// <|notimestamps|> (found by tok::whisper_specials). The weights are random: the model transcribes nothing. Returns
// the shape written. Errors: those of the tokenizer writer and loader, and of write_whisper_model.
Result<WhisperShape> write_whisper_test_model(const std::string& dir, WhisperWriteOptions opts,
                                              const std::vector<std::string>& corpus,
                                              const tok::WhisperTokenizerWrite& tok_opts = {});

// Converts a Hugging Face Whisper directory (config.json + model.safetensors, sharded or not) into Tandem's Whisper
// GGUF (weights::whisper_config_from_gguf: general.architecture "whisper", whisper.* keys, Hugging Face tensor
// names; proj_out.weight carried when present). `r`: F32 (every tensor f32), F16 / BF16 (2-D matrices and the
// convolutions in that type, vectors f32), or Q8_0 (2-D matrices with 32-divisible rows q8_0 except the position
// tables, which with the convolutions are f16; vectors f32). The tokenizer stays in tokenizer.json next to the file.
// Errors: those of the reader, unsupported (another recipe), io_error.
Result<ConvertStats> convert_whisper_to_gguf(const std::string& hf_dir, const std::string& out_file, Recipe r);

// Fixed English sentences (a few hundred, deterministic) for write_whisper_test_model's tokenizer.
std::vector<std::string> whisper_test_corpus();

}  // namespace tandem::modelgen
