// A CLIP dual encoder (Hugging Face CLIPModel, or llama.cpp's "clip" GGUF) for embeddings: texts and images to
// L2-normalised vectors in one projection space. The public surface is torch-free. docs/embeddings.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "device/device.h"
#include "engine/model.h"
#include "weights/clip_layout.h"

namespace tandem::engine {

using ClipTowerShape = weights::ClipTowerShape;
using ClipConfig = weights::ClipConfig;

// A Hugging Face CLIPModel config.json (text_config, vision_config, projection_dim). Errors as
// weights::parse_clip_config: parse_error, format_error naming the key, unsupported (hidden_act, model_type).
Result<ClipConfig> parse_clip_config(const std::string& config_json_text);

struct ClipLoadOptions {
  // How float matrices are held (as for Model: auto = as stored; f32/bf16/f16 converted once at load); q8_0 and
  // the other quantized GGUF types are used as stored. Activations are f32 on every device.
  ComputeDType dtype = ComputeDType::auto_;
  int threads = 1;  // the model's WorkerPool for CPU matrix products
  bool prefault = false;
  std::shared_ptr<device::Device> accelerator;  // null = CPU; else every weight is copied there and accounted
  std::string revision;                         // part of the fingerprint
};

struct ClipLoadStats {
  std::uint64_t weight_bytes = 0;         // tensor bytes in the files
  std::uint64_t accel_weight_bytes = 0;   // weights accounted on the accelerator
  std::uint64_t resident_copy_bytes = 0;  // bytes copied by a dtype conversion or a misaligned mapping
  double total_ms = 0;
};

class ClipModel {
 public:
  // `path`: a Hugging Face directory (config.json + model.safetensors or an index and shards; optional
  // preprocessor_config.json), or a CLIP .gguf file (or a directory without config.json holding one). Every tensor
  // the config implies must be there with its shape (format_error naming the tensor and file); *.position_ids
  // buffers and other extra tensors are ignored. Errors: those of the readers, invalid_argument (options),
  // out_of_memory / device_lost from the accelerator.
  static Result<std::shared_ptr<ClipModel>> load(const std::string& path, const ClipLoadOptions& opts);
  ~ClipModel();
  ClipModel(const ClipModel&) = delete;
  ClipModel& operator=(const ClipModel&) = delete;

  const ClipConfig& config() const;
  const ClipLoadStats& stats() const;
  // tfp1-... over the architecture, the weights (header + sampled content digest), the held weight types and the
  // revision: equal for replicas that give the same vectors up to the device's rounding.
  std::string fingerprint() const;
  device::Device* accelerator() const;  // nullptr on the CPU

  // Activation bytes one embed call for `texts` texts (each at most text.positions tokens) and `images` images
  // needs on the device it runs on (for admission). On the accelerator embed_* accounts this (Site::prefill) for
  // the call; on the CPU it is host memory.
  std::uint64_t activation_bytes(int texts, int images) const;

  // ids: each already [BOS] ... [EOS], 1 ≤ length ≤ text.positions, ids < vocab (invalid_argument naming the
  // input otherwise). One L2-normalised projection_dim vector per input; the EOT position is chosen as
  // transformers does (config.eos_token_id == 2: argmax of the ids; else the first position holding eos_id; with
  // none, the last position). On the CPU an input's vector is bit-identical whatever batch it is in. `cancel`
  // (when set) is polled between layers: Errc::cancelled.
  Result<std::vector<std::vector<float>>> embed_texts(std::span<const std::vector<std::int32_t>> ids,
                                                      const std::atomic<bool>* cancel = nullptr);
  // pixels: each channels × image_size × image_size floats (CHW), already normalised with image_mean / image_std.
  Result<std::vector<std::vector<float>>> embed_images(std::span<const std::vector<float>> pixels,
                                                       const std::atomic<bool>* cancel = nullptr);

 private:
  struct Impl;
  ClipModel();
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::engine
