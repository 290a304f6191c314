// What the service needs from the inference engine, as a torch-free interface: the configured models with their
// shapes and fingerprints, tokenization, and a synchronous run of one job on one route (called on a route worker
// thread). The LibTorch implementation is EngineBackend (engine_backend.h); tests use a scripted fake, so the
// service's admission, queueing and failover logic builds and tests without LibTorch, D-Bus or a GPU.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/result.h"
#include "daemon/config.h"
#include "daemon/replica_state.h"
#include "device/device.h"
#include "generation/prompt_template.h"
#include "generation/sampler.h"
#include "policy/types.h"
#include "policy/unit_times.h"
#include "audio/stream.h"
#include "speech/transcriber.h"

namespace tandem::daemon {

using TokenId = std::int32_t;

// The service's scheduler is the same for every kind; the per-kind parts are its Workloads (service_internal.h,
// docs/architecture.md).
// What a model serves: text generation (Submit), embedding vectors (Embed) or transcripts (Transcribe).
enum class ModelKind : std::uint8_t { llm, embedding, speech };
inline const char* model_kind_name(ModelKind k) {
  switch (k) {
    case ModelKind::embedding: return "embedding";
    case ModelKind::speech: return "speech";
    case ModelKind::llm: break;
  }
  return "llm";
}

// An embedding model's interface (kind embedding).
struct EmbeddingInfo {
  std::uint32_t dim = 0;              // vector width (the projection)
  std::uint32_t text_positions = 0;   // tokens per text, BOS and EOS included
  std::uint32_t image_size = 0;       // pixels per side after preprocessing
  std::uint32_t image_tokens = 0;     // class token + patches
  bool text = true, image = true;     // modalities the model has towers for
};

// A speech model's interface (kind speech: a Whisper-layout model).
struct SpeechInfo {
  std::uint32_t n_mels = 80;
  std::uint32_t window_samples = 480000;   // 16-kHz samples per window (30 s for standard models)
  std::uint32_t text_positions = 448;      // decoder positions per window
  std::vector<std::string> languages;      // codes of the model's language tokens, in Whisper's order
  bool translate = false;                  // has the translate task (multilingual models)
};

struct ModelInfo {
  std::string name;
  ModelKind kind = ModelKind::llm;
  EmbeddingInfo embedding;          // kind embedding
  SpeechInfo speech;                // kind speech
  policy::ModelShape shape;         // for the estimator (element sizes from the compute dtype)
  std::string revision;
  std::string dtype;
  std::string template_name;
  std::string fallback;             // configured fallback model ("" = none)
  std::uint32_t max_context = 0;    // in force for this model (config or the model's own)
  std::uint64_t weight_bytes = 0;   // as stored in the files
  bool gpu_configured = false;      // a replica on the accelerator is wanted (and there is an accelerator)
  std::uint32_t gpu_layers = 0;     // layers placed on the accelerator by the GPU replica
  std::string fingerprint;          // of the CPU replica (same files and settings → same on the GPU)
  gen::SamplingParams default_sampling;    // config over generation_config.json
  std::uint32_t default_max_new_tokens = 256;
  std::vector<std::string> default_stop;   // config stops (every request)
  std::vector<std::string> chat_stop;      // the template's stop strings (requests with messages)
};

struct ReplicaInfo {
  std::string device;        // gpu | hybrid | cpu
  ReplicaState state = ReplicaState::loaded;  // the backend says loaded | unloaded | lost | evicted | failed; the
                                             // service overlays draining / loading / evicted from Residency
  EvictReason reason = EvictReason::none;     // draining, evicted, loading: why it was given back (the service's)
  std::string mode;          // CPU: warm | mmap | on_demand; GPU: resident
  std::uint32_t layers = 0;  // on the accelerator
  std::uint64_t accel_bytes = 0;  // weights + KV pool on the accelerator
  std::uint64_t host_bytes = 0;   // resident on the host (prefaulted / converted)
  std::string fingerprint;
  std::string error;         // last load error
};

struct RunSpec {
  policy::JobId job = 0;
  policy::Route route;                   // device + model that serves it
  std::vector<TokenId> prompt;           // tokenized for route.model
  gen::SamplingParams sampling;
  std::uint32_t max_new_tokens = 1;      // counts resumed tokens
  std::vector<std::string> stop;
  std::vector<TokenId> resume_tokens;    // checkpoint to continue from
  std::uint32_t prefill_chunk = 0;
};

// One embedding job's inputs on one route: texts already tokenized ([BOS] ... [EOS], at most text_positions),
// images as the bytes the client sent (decoded and preprocessed on the worker: decoding is not loop-thread work).
struct EmbedSpec {
  policy::JobId job = 0;
  policy::Route route;
  std::vector<std::vector<TokenId>> texts;
  std::vector<std::shared_ptr<const std::vector<std::uint8_t>>> images;
  std::vector<std::string> image_names;  // the caller's name of each image, for error messages ("image_fds[0]")
};

// One transcription job's run on one route, from a window boundary (docs/transcription.md). The audio is the bytes
// the client sent, decoded and resampled on the worker; `from` is where the job stands (a fresh job: seek 0; after a
// GPU fault: the last finished window), so a run never repeats or skips a window.
struct TranscribeSpec {
  policy::JobId job = 0;
  policy::Route route;
  std::shared_ptr<const std::vector<std::uint8_t>> audio;  // a file's bytes, or null for a live stream:
  // A live stream (ring `transcribe` with stream = true): each window waits (PcmStream::wait_window) until its
  // samples are all there or the stream ended; no chunk for `stream_idle` fails the run Errc::timeout. A stream
  // that ended because its producer went away (closed) ends the run with finish_reason "stream_closed".
  std::shared_ptr<audio::PcmStream> stream;
  std::chrono::milliseconds stream_idle{30000};
  std::string audio_name;  // the caller's name of the audio, for error messages ("audio_fd")
  speech::TranscribeOptions options;
  speech::Checkpoint from;
};

// Called on the worker thread as a transcription run progresses.
class TranscribeSink {
 public:
  virtual ~TranscribeSink() = default;
  // The audio is decoded: its length and the number of windows a whole run takes (an estimate: seeks follow the
  // timestamps).
  virtual void decoded(double audio_seconds, std::uint32_t windows_total) = 0;
  // One window finished: its segments (absolute times) and the checkpoint after it.
  virtual void window(const speech::WindowResult& w, Clock::duration took) = 0;
};

// A text tokenized for an embedding model.
struct EmbedTokens {
  std::vector<TokenId> ids;
  bool truncated = false;  // cut to the model's context (EOS kept last)
};

// Called on the worker thread while the run progresses.
class RunSink {
 public:
  virtual ~RunSink() = default;
  virtual void prefilled(std::uint32_t tokens, Clock::duration took) = 0;
  virtual void token(TokenId id, const std::string& text) = 0;  // id -1: trailing text without a token
};

struct RunResult {
  Status status;                      // ok: finished normally (or cancelled, see finish_reason)
  std::string finish_reason;          // eos | stop_string | max_tokens | context_full | cancelled | error
  bool accelerator_fault = false;     // the error came from the accelerator (allocation refused, device lost)
  std::uint32_t new_tokens = 0;
  Clock::duration decode_time{};
  // Embed: one L2-normalised vector per input (texts first, then images), when the status is ok; the time the
  // texts and the images took (the measured per-unit times, policy::UnitTimes).
  std::vector<std::vector<float>> vectors;
  Clock::duration text_time{};
  Clock::duration image_time{};
  std::uint32_t failed_input = 0;     // invalid_argument: the index of the input that could not be used
};

// One step of a replica's step loop (continuous batching): `batch` sequences, `tokens` tokens in one forward.
struct StepReport {
  policy::Device route = policy::Device::cpu;  // gpu: the GPU replica's loop (also a hybrid one)
  std::uint32_t batch = 0;
  std::uint32_t tokens = 0;
  std::uint32_t prefill_tokens = 0;
  // What the step costs the loop: its forward, plus what a step takes after it (sampling, delivering tokens) —
  // measured on the step before (engine::StepStats::after_ms).
  Clock::duration took{};
};

// A replica's warm-up when it loaded (docs/policy.md §6, "Measured at load"): one prefill of `prefill_tokens`
// and `decode_steps.size()` single-token decode steps of one sequence, after an unmeasured first run (page faults,
// lazy initialisation). The service starts its per-route rates from the default model's.
// An embedding or speech model's warm-up measures the time of its own units instead (UnitWarmup: per text, per
// image, per window; policy::UnitTimes), and leaves the token fields empty.
struct UnitWarmup {
  policy::WorkUnit unit = policy::WorkUnit::text;
  std::uint32_t units = 0;
  Clock::duration took{};  // all `units` together
};

struct WarmupReport {
  std::string model;
  policy::Device route = policy::Device::cpu;  // gpu: the GPU replica (also a hybrid one)
  std::uint32_t prefill_tokens = 0;
  Clock::duration prefill_took{};
  std::vector<Clock::duration> decode_steps;
  std::vector<StepReport> batch_steps;  // batched decode steps (an LLM whose step loop batches)
  std::vector<UnitWarmup> units;  // embedding and speech models
};

// A model whose replicas were loaded off the loop (Backend::prepare_model) and that does not serve yet: its info and
// warm-ups, and the backend's own loaded state (a subclass). Dropping it unloads what it loaded.
class PreparedModel {
 public:
  virtual ~PreparedModel() = default;
  ModelInfo info;
  std::vector<WarmupReport> warmups;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // The models served now: those of the configuration at start, then as add_model / remove_model change them (loop
  // thread only; a reference or pointer into it is valid until the next of those calls).
  virtual const std::vector<ModelInfo>& models() const = 0;
  // The runtime model set (docs/residency.md, "Adding and removing models"). Loads `mc`'s replicas as at start — the
  // CPU replica, the GPU one when it is wanted and there is an accelerator (a GPU load that fails leaves the model on
  // the CPU, as at start), their warm-ups — without serving it. Slow; a worker thread. Errors: the CPU load's;
  // duplicate when a model of that name serves. Default: unsupported.
  virtual Result<std::unique_ptr<PreparedModel>> prepare_model(const ModelConfig& mc) {
    return fail(Errc::unsupported, "this backend cannot load model " + mc.name + " at run time");
  }
  // The prepared model serves from now on (models() has it). Loop thread. Errors: duplicate (a model of that name
  // serves), invalid_argument (not this backend's). Default: unsupported.
  virtual Status add_model(std::unique_ptr<PreparedModel> m) {
    return fail(Errc::unsupported, "this backend cannot add model " + (m ? m->info.name : std::string()) + " at run time");
  }
  // `model` no longer serves (models() drops it). Runs still holding its replicas keep them until they end (the
  // service removes a model once none of its jobs is left); the GPU replica's bytes return with the last reference,
  // then the accelerator's cached blocks go back. Loop thread. Errors: not_found. Default: unsupported.
  virtual Status remove_model(const std::string& model) {
    return fail(Errc::unsupported, "this backend cannot remove model " + model + " at run time");
  }
  // Tokenizes for `model`: messages rendered with its template (with the boolean template variables `flags`, e.g.
  // enable_thinking), else [BOS] + prompt. Loop thread.
  virtual Result<std::vector<TokenId>> encode(const std::string& model, const std::string& prompt,
                                              const std::vector<gen::Message>& messages,
                                              const std::map<std::string, bool>& flags) = 0;
  // Runs one job to the end on spec.route (worker thread; thread-safe). `cancel` is polled between tokens.
  virtual RunResult run(const RunSpec& spec, RunSink& sink, const std::atomic<bool>& cancel) = 0;
  // Embedding models: tokenizes one text ([BOS] text [EOS]); longer than the model's context: cut (truncate) or
  // invalid_argument. Loop thread. Default: no embedding models.
  virtual Result<EmbedTokens> embed_tokens(const std::string& model, const std::string& text, bool truncate) {
    (void)model, (void)text, (void)truncate;
    return fail(Errc::unsupported, "this backend has no embedding models");
  }
  // Embedding models: one text given as vocabulary ids (no special tokens): each id must be a token of the model's
  // text tower other than its BOS/EOS/padding, else invalid_argument naming it; wrapped and cut like a text. Loop
  // thread. Default: no embedding models.
  virtual Result<EmbedTokens> embed_token_ids(const std::string& model, const std::vector<std::int64_t>& ids,
                                              bool truncate) {
    (void)model, (void)ids, (void)truncate;
    return fail(Errc::unsupported, "this backend has no embedding models");
  }
  // Runs one embedding job to the end on spec.route (worker thread; thread-safe): decodes and preprocesses the
  // images, runs both towers, returns the vectors. A bad image: invalid_argument with RunResult::failed_input.
  virtual RunResult embed(const EmbedSpec& spec, const std::atomic<bool>& cancel) {
    (void)spec, (void)cancel;
    RunResult r;
    r.status = fail(Errc::unsupported, "this backend has no embedding models");
    r.finish_reason = "error";
    return r;
  }
  // Speech models: runs one transcription job on spec.route from spec.from until the audio ends (worker thread;
  // thread-safe), reporting every window to `sink`. Bad audio: invalid_argument. An accelerator fault
  // (accelerator_fault) leaves the job at its last reported window. `cancel` is polled between tokens.
  virtual RunResult transcribe(const TranscribeSpec& spec, TranscribeSink& sink, const std::atomic<bool>& cancel) {
    (void)spec, (void)sink, (void)cancel;
    RunResult r;
    r.status = fail(Errc::unsupported, "this backend has no speech models");
    r.finish_reason = "error";
    return r;
  }
  virtual std::vector<ReplicaInfo> replicas(const std::string& model) const = 0;
  // The accelerator (nullptr: none). Its memory() feeds the policy; its health_probe() the breaker.
  virtual std::shared_ptr<device::Device> accelerator() const = 0;
  // Bytes the GPU replica of `model` holds on the accelerator (weights + KV pool; 0 = not loaded / lost).
  virtual std::uint64_t gpu_resident_bytes(const std::string& model) const = 0;
  // True when `model`'s GPU replica is loaded and usable.
  virtual bool gpu_ready(const std::string& model) const = 0;
  // True when the CPU can serve `model` (replica loaded or loadable on demand).
  virtual bool cpu_ready(const std::string& model) const = 0;
  // True when a job of `model` can be offloaded: its GPU replica is usable and can run a sequence's last layers on
  // the CPU (RunSpec::route.device hybrid, gpu_layers k). Default: no.
  virtual bool offload_ready(const std::string& model) const { (void)model; return false; }
  // After a device loss and recovery: (re)load the GPU replicas, except those evicted on purpose (evict_gpu). Slow;
  // worker thread.
  virtual Status reload_gpu() = 0;
  // Gives `model`'s GPU replica back (docs/residency.md): drops the backend's references to it — weights, KV pool,
  // workspaces, its step loop — and returns the accelerator's cached blocks, so the device's reading shows the bytes
  // free once no run holds the replica any more (the service drains its GPU jobs first). It stays evicted (also across
  // reload_gpu) until load_gpu. Returns the bytes it held on the accelerator. Errors: not_found (no such model),
  // unsupported (no GPU replica). Worker thread. Default: unsupported.
  virtual Result<std::uint64_t> evict_gpu(const std::string& model) {
    return fail(Errc::unsupported, "model " + model + " has no GPU replica to give back");
  }
  // Loads `model`'s GPU replica again (after evict_gpu, or after a failed load). The same files and settings: the
  // replica's fingerprint must equal the CPU replica's. Errors: the load's (out_of_memory, device_lost, ...). Slow;
  // worker thread. Default: unsupported.
  virtual Status load_gpu(const std::string& model) {
    return fail(Errc::unsupported, "model " + model + " has no GPU replica to load");
  }
  // Called after every step of a step loop, on that loop's thread (the service posts it to its loop). Default: the
  // backend has no step loop to report.
  virtual void set_step_observer(std::function<void(const StepReport&)> fn) { (void)fn; }
  // The warm-ups of the replicas loaded at start (LLMs; an on-demand CPU replica has none until it loads). Default:
  // none (the configured priors stay until jobs are observed).
  virtual std::vector<WarmupReport> warmup_reports() const { return {}; }
};

}  // namespace tandem::daemon
