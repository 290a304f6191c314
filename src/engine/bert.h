// A BERT-family text encoder for sentence embeddings (Hugging Face BertModel as sentence-transformers saves bge, e5,
// all-MiniLM; NomicBertModel for nomic-embed-text; or llama.cpp's "bert" / "nomic-bert" GGUF files): texts to
// L2-normalised vectors, pooled as the model says (mean over the tokens, or the [CLS] row). Its WordPiece tokenizer
// comes with it. The public surface is torch-free. docs/embeddings.md, "Text embedding models".
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "device/device.h"
#include "engine/model.h"
#include "tokenizer/wordpiece.h"
#include "weights/bert_layout.h"

namespace tandem::engine {

struct BertLoadOptions {
  ComputeDType dtype = ComputeDType::auto_;  // how float matrices are held (quantized GGUF types: as stored)
  int threads = 1;
  bool prefault = false;
  std::shared_ptr<device::Device> accelerator;  // null = CPU; else every weight is copied there and accounted
  std::string revision;                         // part of the fingerprint
};

struct BertLoadStats {
  std::uint64_t weight_bytes = 0;
  std::uint64_t accel_weight_bytes = 0;
  std::uint64_t resident_copy_bytes = 0;
  double total_ms = 0;
};

class BertModel {
 public:
  // `path`: a Hugging Face directory (config.json, model.safetensors or shards; tokenizer.json with a WordPiece
  // model, else vocab.txt with tokenizer_config.json's do_lower_case; the sentence-transformers pooling from
  // modules.json's Pooling module, 1_Pooling/config.json by default), or a bert / nomic-bert .gguf file (or a
  // directory without config.json holding one). BertForMaskedLM-style "bert." tensor prefixes are accepted.
  // Errors: those of the readers (format_error naming the tensor and file, unsupported naming the key),
  // invalid_argument (options), out_of_memory / device_lost from the accelerator.
  static Result<std::shared_ptr<BertModel>> load(const std::string& path, const BertLoadOptions& opts);
  ~BertModel();
  BertModel(const BertModel&) = delete;
  BertModel& operator=(const BertModel&) = delete;

  const weights::BertConfig& config() const;
  const tok::WordPieceTokenizer& tokenizer() const;
  const BertLoadStats& stats() const;
  // tfp1-... over the architecture, pooling, the weights, the held types, the tokenizer's vocabulary and the
  // revision.
  std::string fingerprint() const;
  device::Device* accelerator() const;  // nullptr on the CPU
  int dimensions() const;               // the vectors' length (hidden size)

  // [CLS] + the text's WordPiece tokens + [SEP], cut to config().positions (as sentence-transformers truncates).
  std::vector<std::int32_t> encode(std::string_view text) const;
  // Activation bytes of one call over `texts` inputs of up to `tokens` tokens each on the device it runs on.
  std::uint64_t activation_bytes(int texts, int tokens) const;

  // ids: each 2 ≤ length ≤ positions, ids < vocab (invalid_argument naming the input otherwise). One L2-normalised
  // vector of dimensions() floats per input. On the CPU an input's vector is bit-identical whatever batch it is in.
  // `cancel` is polled between layers (Errc::cancelled).
  Result<std::vector<std::vector<float>>> embed_ids(std::span<const std::vector<std::int32_t>> ids,
                                                    const std::atomic<bool>* cancel = nullptr);
  Result<std::vector<std::vector<float>>> embed_texts(std::span<const std::string> texts,
                                                      const std::atomic<bool>* cancel = nullptr);

 private:
  struct Impl;
  BertModel();
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::engine
