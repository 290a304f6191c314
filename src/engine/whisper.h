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
  // The decoder's self-attention KV pool (docs/speech-model.md, "Sessions"): blocks of kv_block_size tokens, handed
  // to sessions as they decode. kv_blocks = 0: enough for max_sessions sessions of max_target_positions tokens each,
  // so that many sessions never see Errc::kv_exhausted. Allocated at load (on the accelerator when there is one,
  // accounted at Site::kv_pool).
  int kv_block_size = 16;       // [1, 4096]
  std::int64_t kv_blocks = 0;   // >= 0
  int max_sessions = 4;         // [1, 4096]
};

struct WhisperLoadStats {
  std::uint64_t weight_bytes = 0;         // tensor bytes in the files
  std::uint64_t accel_weight_bytes = 0;   // weights accounted on the accelerator
  std::uint64_t resident_copy_bytes = 0;  // bytes copied by a dtype conversion or a misaligned mapping
  std::uint64_t kv_pool_bytes = 0;        // the self-attention KV pool (host or device)
  std::uint64_t accel_kv_bytes = 0;       // the pool's bytes accounted on the accelerator (0 on the CPU)
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
  // for one window and a decode call's over max_target_positions tokens (they never overlap), plus
  // session_kv_bytes(). Like the LLM's estimate, which counts a job's KV blocks although the pool is allocated at
  // load, it counts a full session's share of the self-attention pool.
  std::uint64_t session_bytes() const;
  // The persistent part of session_bytes: the cross-attention K/V of every decoder layer (f32; accounted by
  // new_session at Site::kv_pool for the session's life) plus the self-attention KV blocks one session can hold
  // (ceil(max_target_positions / kv_block_size) blocks, f32; taken from the pool, which is accounted once at load).
  // The activation part is accounted per encode (Site::prefill) / decode (Site::decode) call.
  std::uint64_t session_kv_bytes() const;
  // The self-attention KV pool: block size, blocks total / used, sessions holding a block table, bytes.
  KvStats kv_stats() const;

  // A session for one job: its own cross-attention K/V and an empty block table in the model's pool. On an
  // accelerator the cross K/V are accounted (out_of_memory when refused, device_lost when the device is gone) and
  // freed with the session, which also returns its blocks.
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
  // Takes the blocks the new positions need from the model's pool first: Errc::kv_exhausted when it has too few
  // free (the session unchanged and usable: decode again once blocks are back, rewind, or destroy it).
  Result<std::vector<float>> decode(std::span<const std::int32_t> tokens, const std::atomic<bool>* cancel) override;
  void rewind(std::size_t n) override;  // n > fed() is clamped to fed(); blocks past the first n tokens go back
  std::size_t fed() const override;

  struct State;

 private:
  friend class WhisperModel;
  explicit WhisperSession(std::unique_ptr<State> st);
  std::unique_ptr<State> st_;
};

}  // namespace tandem::engine
