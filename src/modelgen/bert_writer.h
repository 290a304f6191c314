// Writes BERT-family sentence-embedding models (Hugging Face BertModel / NomicBertModel layouts as
// sentence-transformers saves them: config.json, model.safetensors, vocab.txt, tokenizer_config.json, modules.json,
// 1_Pooling/config.json) with deterministic random weights, and converts such a directory to llama.cpp's "bert" /
// "nomic-bert" GGUF. Torch-free. docs/embeddings.md, "Text embedding models".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "modelgen/gguf_convert.h"
#include "weights/bert_layout.h"
#include "weights/safetensors.h"

namespace tandem::modelgen {

// "bert-test" (BertModel: hidden 64, 2 layers, 4 heads, FFN 128, 64 positions, CLS pooling), "nomic-test"
// (NomicBertModel: the same widths, rotary base 1000, SwiGLU, mean pooling), "bert-base" (BertModel at
// bert-base's shape: 768, 12 layers, 12 heads, FFN 3072, 512 positions, mean pooling; for benchmarks). The
// vocabulary size is set from the tokens written. invalid_argument names the known presets.
Result<weights::BertConfig> bert_preset(std::string_view name);

// A small WordPiece vocabulary for the generated models: [PAD] [UNK] [CLS] [SEP] [MASK], ASCII punctuation and
// digits, a-z and their ## continuations, and a few hundred common English words and suffixes.
std::vector<std::string> generated_wordpiece_vocab();

struct BertWriteOptions {
  weights::BertConfig config;
  std::vector<std::string> vocab;  // empty: generated_wordpiece_vocab(); config.vocab is set to its size
  weights::DType dtype = weights::DType::f32;
  std::uint64_t seed = 1;
};

// Creates `dir` and writes the directory. Weights: uniform with std 0.02 (matrices, embeddings), 0.02 (biases),
// layer norms 1 ± 0.1 and 0 ± 0.02, keyed by (seed, tensor). Errors: invalid_argument (bad shape), io_error.
Status write_bert_model(const std::string& dir, const BertWriteOptions& opts);

// A BERT-family directory as llama.cpp's convert_hf_to_gguf.py writes it: general.architecture bert / nomic-bert,
// <arch>.context_length, embedding_length, feed_forward_length, block_count, attention.head_count,
// attention.layer_norm_epsilon, attention.causal false, pooling_type (1 mean, 2 cls), rope.freq_base (nomic);
// tokenizer.ggml.model "bert" with the tokens in its phantom-space spelling, token types (specials control),
// token_type_count, the [UNK] / [SEP] / [PAD] / [CLS] / [MASK] ids; tensors under its names. `r`: F32, F16 (2-D
// weights f16; embeddings, norms and biases f32 except the word embedding, f16 too) or Q8_0 (the matrices of the
// layers whose rows hold 32-blocks; embeddings f16). Errors: those of the reader, unsupported (another recipe).
Result<ConvertStats> convert_bert_to_gguf(const std::string& hf_dir, const std::string& out_file, Recipe r);

}  // namespace tandem::modelgen
