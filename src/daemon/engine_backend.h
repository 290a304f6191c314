// The Backend on the real engine (LibTorch): per configured model a CPU replica (warm / mmap / on-demand, chosen by
// config or by the ReplicaModePolicy from measured load times) over the mmap'd files, and — when there is an
// accelerator and the model wants it — a GPU replica with `gpu_layers` layers (weights + KV pool) on it. Only this
// file's .cc links the engine; the header is torch-free.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>

#include "daemon/backend.h"
#include "daemon/config.h"

namespace tandem::engine {
class BatchRunner;
class Model;
}  // namespace tandem::engine

namespace tandem::daemon {

class EngineBackend final : public Backend {
 public:
  // Loads every model (EXTEND_TIMEOUT callback `progress` is called before each load with a time estimate).
  // A model whose GPU replica cannot be loaded still serves on the CPU (logged); a model whose CPU replica cannot be
  // loaded is an error.
  static Result<std::shared_ptr<EngineBackend>> create(const DaemonConfig& cfg,
                                                       std::shared_ptr<device::Device> accelerator,
                                                       std::function<void(const std::string&)> progress = {});
  ~EngineBackend() override;

  const std::vector<ModelInfo>& models() const override { return infos_; }
  Result<std::unique_ptr<PreparedModel>> prepare_model(const ModelConfig& mc) override;
  Status add_model(std::unique_ptr<PreparedModel> m) override;
  Status remove_model(const std::string& model) override;
  Result<std::vector<TokenId>> encode(const std::string& model, const std::string& prompt,
                                      const std::vector<gen::Message>& messages,
                                      const std::map<std::string, bool>& flags) override;
  RunResult run(const RunSpec& spec, RunSink& sink, const std::atomic<bool>& cancel) override;
  Result<EmbedTokens> embed_tokens(const std::string& model, const std::string& text, bool truncate) override;
  Result<EmbedTokens> embed_token_ids(const std::string& model, const std::vector<std::int64_t>& ids,
                                      bool truncate) override;
  RunResult embed(const EmbedSpec& spec, const std::atomic<bool>& cancel) override;
  // Whether the model at `path` (a directory or a .gguf) is an embedding model (CLIP layout): config.json's
  // model_type "clip" / architectures CLIPModel, or a GGUF general.architecture "clip". Unreadable: false (the
  // LLM loader then reports what is wrong).
  static Result<bool> is_embedding_model(const std::string& path);
  RunResult transcribe(const TranscribeSpec& spec, TranscribeSink& sink, const std::atomic<bool>& cancel) override;
  // Whether the model at `path` is a speech model (Whisper layout): config.json's model_type "whisper" /
  // architectures WhisperForConditionalGeneration. Unreadable: false (the LLM loader then reports what is wrong).
  static bool is_speech_model(const std::string& path);
  std::vector<ReplicaInfo> replicas(const std::string& model) const override;
  std::shared_ptr<device::Device> accelerator() const override { return accel_; }
  std::uint64_t gpu_resident_bytes(const std::string& model) const override;
  bool gpu_ready(const std::string& model) const override;
  bool cpu_ready(const std::string& model) const override;
  bool offload_ready(const std::string& model) const override;
  Status reload_gpu() override;
  Result<std::uint64_t> evict_gpu(const std::string& model) override;
  Status load_gpu(const std::string& model) override;
  void set_step_observer(std::function<void(const StepReport&)> fn) override;
  std::vector<WarmupReport> warmup_reports() const override { return warmups_; }

 private:
  struct Entry;
  struct Prepared;
  std::shared_ptr<engine::BatchRunner> runner_for(Entry& e, bool gpu, const std::shared_ptr<engine::Model>& m);
  EngineBackend() = default;
  // The entries of the model set: looked up under a shared lock from any thread; the shared_ptr keeps a removed
  // model's entry (its replicas) alive until the last run holding it ends.
  std::shared_ptr<Entry> entry(const std::string& name) const;
  template <class E>
  std::vector<std::shared_ptr<E>> snapshot(const std::vector<std::shared_ptr<E>>& v) const {
    std::shared_lock lock(set_mu_);
    return v;
  }
  Result<std::unique_ptr<PreparedModel>> prepare_llm(const ModelConfig& mc,
                                                     const std::function<void(const std::string&)>& progress);
  Result<std::unique_ptr<PreparedModel>> prepare(const ModelConfig& mc,
                                                 const std::function<void(const std::string&)>& progress);
  Status load_llm_gpu(Entry& e);

  // Embedding models (engine_backend_embed.cc).
  // (A shared_ptr made where EmbedEntry is complete, so engine_backend.cc, where only Entry is, can hold and drop it.)
  struct EmbedEntry;
  // The replicas, then their warm-ups (per text and per image: WarmupReport::units) into `warmups`.
  Result<ModelInfo> prepare_embedding(const ModelConfig& mc, const std::function<void(const std::string&)>& progress,
                                      std::shared_ptr<EmbedEntry>& out, std::vector<WarmupReport>& warmups);
  Status load_embed_gpu(EmbedEntry& e);
  std::shared_ptr<EmbedEntry> embed_entry(const std::string& name) const;
  bool embed_gpu_lost(const EmbedEntry& e) const;
  std::vector<ReplicaInfo> embed_replicas(const EmbedEntry& e) const;
  std::uint64_t embed_gpu_bytes(const EmbedEntry& e) const;
  bool embed_gpu_ready(const EmbedEntry& e) const;
  Status reload_embed_gpu();
  Result<std::uint64_t> evict_embed_gpu(EmbedEntry& e);
  std::vector<std::shared_ptr<EmbedEntry>> embed_entries_;  // guarded by set_mu_
  std::uint64_t max_image_bytes_ = 32ull << 20;
  std::uint64_t max_image_pixels_ = 40'000'000;

  // Speech models (engine_backend_speech.cc).
  struct SpeechEntry;
  // The replicas, then their warm-ups (per window: WarmupReport::units) into `warmups`.
  Result<ModelInfo> prepare_speech(const ModelConfig& mc, const std::function<void(const std::string&)>& progress,
                                   std::shared_ptr<SpeechEntry>& out, std::vector<WarmupReport>& warmups);
  Status load_speech_gpu(SpeechEntry& e);
  std::shared_ptr<SpeechEntry> speech_entry(const std::string& name) const;
  bool speech_gpu_lost(const SpeechEntry& e) const;
  std::vector<ReplicaInfo> speech_replicas(const SpeechEntry& e) const;
  std::uint64_t speech_gpu_bytes(const SpeechEntry& e) const;
  bool speech_gpu_ready(const SpeechEntry& e) const;
  Status reload_speech_gpu();
  Result<std::uint64_t> evict_speech_gpu(SpeechEntry& e);
  std::vector<std::shared_ptr<SpeechEntry>> speech_entries_;  // guarded by set_mu_
  std::uint64_t max_audio_bytes_ = 512ull << 20;
  std::uint32_t max_audio_seconds_ = 4 * 3600;

  DaemonConfig cfg_;  // the start's (limits, queue and estimator settings a model's replicas are loaded with)
  std::shared_ptr<device::Device> accel_;
  mutable std::shared_mutex set_mu_;  // the entry vectors (written by add_model / remove_model on the loop thread)
  std::vector<std::shared_ptr<Entry>> entries_;  // guarded by set_mu_
  std::vector<ModelInfo> infos_;       // loop thread only (models())
  std::vector<WarmupReport> warmups_;  // written by create() only
  std::mutex observer_mu_;
  std::function<void(const StepReport&)> step_observer_;  // guarded by observer_mu_
};

}  // namespace tandem::daemon
