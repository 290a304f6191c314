// A Whisper speech model (Hugging Face WhisperForConditionalGeneration): the encoder over 30-s log-mel windows and
// the text decoder with cross-attention, as engine::WhisperSession implements speech::DecoderSession. The public
// surface is torch-free. docs/speech-model.md.
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
#include "speech/session.h"
#include "weights/whisper_layout.h"

namespace tandem::engine {

using WhisperConfig = weights::WhisperConfig;

struct WhisperLoadOptions {
  // How float matrices are held (auto = as stored; f32/bf16/f16 converted once at load). Activations are f32.
  ComputeDType dtype = ComputeDType::auto_;
  int threads = 1;  // the model's WorkerPool for CPU matrix products and attention
  bool prefault = false;
  std::shared_ptr<device::Device> accelerator;  // null = CPU; else every weight is copied there and accounted
  std::string revision;                         // part of the fingerprint
};

struct WhisperLoadStats {
  std::uint64_t weight_bytes = 0;         // tensor bytes in the files
  std::uint64_t accel_weight_bytes = 0;   // weights accounted on the accelerator
  std::uint64_t resident_copy_bytes = 0;  // bytes copied by a dtype conversion or a misaligned mapping
  double total_ms = 0;
};

class WhisperSession;

class WhisperModel : public std::enable_shared_from_this<WhisperModel> {
 public:
  // `path`: a Hugging Face directory (config.json + model.safetensors, or model.safetensors.index.json + shards),
  // or a Tandem Whisper .gguf (weights::whisper_config_from_gguf; the file, or a directory without config.json
  // holding exactly one), whose matrices may be quantized (q8_0 …).
  // Every tensor the config implies must be there with its shape (format_error naming the tensor and file);
  // proj_out.weight is used when present (else the head is tied to the token embedding); extra tensors are ignored.
  // Errors: those of the readers, parse_whisper_config's, invalid_argument (options), out_of_memory / device_lost
  // from the accelerator.
  static Result<std::shared_ptr<WhisperModel>> load(const std::string& path, const WhisperLoadOptions& opts);
  ~WhisperModel();
  WhisperModel(const WhisperModel&) = delete;
  WhisperModel& operator=(const WhisperModel&) = delete;

  const WhisperConfig& config() const;
  const WhisperLoadStats& stats() const;
  // tfp1-... over the architecture, the weights (header + sampled content digest), the held types and the revision.
  std::string fingerprint() const;
  device::Device* accelerator() const;  // nullptr on the CPU
  int window_frames() const;            // 2 · max_source_positions (mel frames per window)

  // Bytes one session needs on the device it runs on, for admission: the larger of the encoder's activation peak
  // for one window and a decode call's over max_target_positions tokens (they never overlap), plus the
  // cross-attention K/V of every decoder layer and the self-attention KV for max_target_positions tokens (f32).
  std::uint64_t session_bytes() const;
  // The persistent part of session_bytes (cross K/V + self KV): accounted by new_session at Site::kv_pool for the
  // session's life; the activation part is accounted per encode (Site::prefill) / decode (Site::decode) call.
  std::uint64_t session_kv_bytes() const;

  // A session for one job. On an accelerator its K/V buffers are accounted (out_of_memory when refused,
  // device_lost when the device is gone) and freed with the session.
  Result<std::unique_ptr<WhisperSession>> new_session();

  // The encoder's output for one window (source positions × d_model floats, row-major), for tests and
  // diagnostics; sessions keep only the cross-attention K/V. Errors as WhisperSession::encode.
  Result<std::vector<float>> encoder_output(std::span<const float> mel, const std::atomic<bool>* cancel = nullptr);

  struct Impl;

 private:
  friend class WhisperSession;
  WhisperModel();
  std::unique_ptr<Impl> impl_;
};

// One job's encoder output and decoder state. Not thread-safe; sessions of one model may be used from different
// threads (the model serialises compute). See speech::DecoderSession for the contract.
class WhisperSession : public speech::DecoderSession {
 public:
  ~WhisperSession() override;
  WhisperSession(const WhisperSession&) = delete;
  WhisperSession& operator=(const WhisperSession&) = delete;

  // mel: n_mels × window_frames floats, mel-bin major. invalid_argument for another size.
  Status encode(std::span<const float> mel, const std::atomic<bool>* cancel) override;
  Result<std::vector<float>> decode(std::span<const std::int32_t> tokens, const std::atomic<bool>* cancel) override;
  void rewind(std::size_t n) override;  // n > fed() is clamped to fed()
  std::size_t fed() const override;

  struct State;

 private:
  friend class WhisperModel;
  explicit WhisperSession(std::unique_ptr<State> st);
  std::unique_ptr<State> st_;
};

}  // namespace tandem::engine
