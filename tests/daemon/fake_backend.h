// A scripted Backend for the service tests: two small Llama-shaped models ("tiny" with a GPU replica and "small" as
// its CPU fallback), a deterministic byte tokenizer, and run() driven by a per-run Script (emit N tokens, block
// until released, fail with out_of_memory / device_lost after k tokens, honour cancel). Every RunSpec is recorded.
// Tokens are a function of (seed, step), like the engine's counter-based sampler, so a run resumed at step k emits
// the same continuation as the run that broke. Thread-safe: run() and reload_gpu() are called on worker threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "audio/audio.h"
#include "daemon/backend.h"
#include "device/simulated.h"

namespace tandem::daemon::fake {

inline policy::ModelShape llama_shape(std::string name, std::uint32_t layers, std::uint32_t hidden) {
  policy::ModelShape s;
  s.name = std::move(name);
  s.layers = layers;
  s.hidden = hidden;
  s.intermediate = hidden * 11 / 4;
  s.heads = 4;
  s.kv_heads = 4;
  s.head_dim = hidden / 4;
  s.vocab = 512;
  s.weight_bits = 32;
  s.kv_elem_bytes = 4;
  s.act_elem_bytes = 4;
  return s;
}

// What one embedding run does.
struct EmbedScript {
  std::optional<Errc> gpu_fail;  // on the GPU route: fail with this (an accelerator fault); device_lost loses the device
  std::optional<Errc> fail;      // on any route: a run failure that is not an accelerator fault
  std::uint32_t drop = 0;        // a faulty backend: return this many vectors fewer than inputs
  bool block = false;            // block until released or cancelled
};

// What one transcription run does: one window per 30 s of audio (at least one), one segment per window with the text
// " w<index>" from <index>·30 s to <index>·30 s + 2 s.
struct TranscribeScript {
  std::optional<std::uint32_t> gpu_fail_at;  // on the GPU route: fail before this window (device_lost loses the device)
  Errc gpu_fail = Errc::device_lost;
  std::optional<std::uint32_t> block_at;     // block before this window until released or cancelled
  std::optional<Errc> fail;                  // on any route, before any window: a run failure (e.g. invalid_argument)
};

// What one run does. Steps are counted from 0 within the run (resumed tokens not included).
struct Script {
  std::uint32_t tokens = 4;                 // tokens to emit (capped at max_new_tokens - resume_tokens)
  std::optional<Errc> fail;                 // after `fail_after` tokens: fail with this code (accelerator fault)
  std::uint32_t fail_after = 0;
  std::optional<std::uint32_t> block_at;    // after this many tokens: block until released or cancelled
  std::string finish_reason = "eos";        // when fewer than the cap were emitted
};

class FakeBackend final : public Backend {
 public:
  explicit FakeBackend(std::shared_ptr<device::SimulatedDevice> sim) : sim_(std::move(sim)) {
    ModelInfo tiny;
    tiny.name = "tiny";
    tiny.shape = llama_shape("tiny", 4, 256);
    tiny.revision = "r1";
    tiny.dtype = "f32";
    tiny.template_name = "raw";
    tiny.fallback = "small";
    tiny.max_context = 512;
    tiny.weight_bytes = 16ull << 20;
    tiny.gpu_configured = true;
    tiny.gpu_layers = 4;
    tiny.fingerprint = "fp-tiny";
    tiny.default_max_new_tokens = 16;
    tiny.chat_stop = {"</s>"};
    ModelInfo small = tiny;
    small.name = "small";
    small.shape = llama_shape("small", 2, 128);
    small.fallback = "";
    small.weight_bytes = 4ull << 20;
    small.gpu_configured = false;
    small.gpu_layers = 0;
    small.fingerprint = "fp-small";
    models_ = {tiny, small};
  }

  void add_embedding_model() {
    ModelInfo e;
    e.name = "emb";
    e.kind = ModelKind::embedding;
    e.shape = llama_shape("emb", 4, 128);
    e.shape.encoder_only = true;
    e.revision = "r1";
    e.dtype = "f32";
    e.max_context = 8;
    e.weight_bytes = 2ull << 20;
    e.gpu_configured = true;
    e.gpu_layers = 4;
    e.fingerprint = "fp-emb";
    e.embedding.dim = 4;
    e.embedding.text_positions = 8;
    e.embedding.image_size = 32;
    e.embedding.image_tokens = 17;
    models_.push_back(e);
    std::lock_guard lock(mu_);
    cpu_ready_.insert("emb");
  }

  // "asr": a speech model with a GPU replica, English-only unless `multilingual`.
  void add_speech_model(bool multilingual = false) {
    ModelInfo m;
    m.name = "asr";
    m.kind = ModelKind::speech;
    m.shape = llama_shape("asr", 4, 128);
    m.revision = "r1";
    m.dtype = "f32";
    m.max_context = 448;
    m.weight_bytes = 2ull << 20;
    m.gpu_configured = true;
    m.gpu_layers = 8;
    m.fingerprint = "fp-asr";
    m.speech.n_mels = 80;
    m.speech.window_samples = 480000;
    m.speech.text_positions = 448;
    m.speech.languages = multilingual ? std::vector<std::string>{"en", "de", "fr"} : std::vector<std::string>{"en"};
    m.speech.translate = multilingual;
    models_.push_back(m);
    std::lock_guard lock(mu_);
    cpu_ready_.insert("asr");
  }

  // --- the runtime model set: prepare_model (worker) builds a "tiny"-like LLM named after the config; a dir with
  // "broken" in it fails to load; block_prepares(true) holds loads until it is called with false. ---
  Result<std::unique_ptr<PreparedModel>> prepare_model(const ModelConfig& mc) override {
    {
      std::unique_lock lock(mu_);
      ++prepares_;
      while (prepare_blocked_) gate_cv_.wait_for(lock, std::chrono::milliseconds(1));
    }
    if (mc.dir.find("broken") != std::string::npos)
      return ::tandem::fail(Errc::format_error, "fake: " + mc.dir + ": no config.json");
    auto p = std::make_unique<PreparedModel>();
    ModelInfo& i = p->info;
    i.name = mc.name;
    i.shape = llama_shape(mc.name, 2, 128);
    i.revision = mc.revision;
    i.dtype = "f32";
    i.template_name = "raw";
    i.fallback = mc.fallback;
    i.max_context = 512;
    i.weight_bytes = 4ull << 20;
    i.gpu_configured = mc.gpu;
    i.gpu_layers = mc.gpu ? 2 : 0;
    i.fingerprint = "fp-" + mc.name + "-" + mc.dir;
    i.default_max_new_tokens = 16;
    return std::unique_ptr<PreparedModel>(std::move(p));
  }
  Status add_model(std::unique_ptr<PreparedModel> m) override {
    for (const auto& x : models_)
      if (x.name == m->info.name) return ::tandem::fail(Errc::duplicate, "fake: " + x.name + " is served");
    models_.push_back(m->info);
    std::lock_guard lock(mu_);
    cpu_ready_.insert(m->info.name);
    if (m->info.gpu_configured) {
      gpu_models_.insert(m->info.name);
      if (place_) {
        auto a = sim_->allocate(m->info.weight_bytes, device::Site::weights);
        if (!a) return ::tandem::fail(std::move(a).error());
        placed_[m->info.name] = std::move(a).value();
      }
    }
    return {};
  }
  Status remove_model(const std::string& model) override {
    auto it = std::find_if(models_.begin(), models_.end(), [&](const ModelInfo& m) { return m.name == model; });
    if (it == models_.end()) return ::tandem::fail(Errc::not_found, "fake: unknown model " + model);
    models_.erase(it);
    std::lock_guard lock(mu_);
    cpu_ready_.erase(model);
    gpu_models_.erase(model);
    evicted_.erase(model);
    placed_.erase(model);  // the simulated device gets the bytes back
    removed_.push_back(model);
    return {};
  }
  void block_prepares(bool on) {
    {
      std::lock_guard lock(mu_);
      prepare_blocked_ = on;
    }
    gate_cv_.notify_all();
  }
  int prepares() const {
    std::lock_guard lock(mu_);
    return prepares_;
  }
  std::vector<std::string> removed_models() const {
    std::lock_guard lock(mu_);
    return removed_;
  }
  std::string fingerprint_of(const std::string& model) const {
    for (const auto& m : models_)
      if (m.name == model) return m.fingerprint;
    return {};
  }

  // Sets a model's weight bytes (before place_on_device and the service's start).
  void set_weight_bytes(const std::string& model, std::uint64_t bytes) {
    for (auto& m : models_)
      if (m.name == model) m.weight_bytes = bytes;
  }

  // --- Backend ---
  const std::vector<ModelInfo>& models() const override { return models_; }

  RunResult transcribe(const TranscribeSpec& spec, TranscribeSink& sink, const std::atomic<bool>& cancel) override {
    TranscribeScript s;
    {
      std::lock_guard lock(mu_);
      transcribes_.push_back(spec);
      s = transcribe_script_;
    }
    RunResult r;
    r.finish_reason = "error";
    if (s.fail) {
      r.status = ::tandem::fail(*s.fail, "fake: injected " + std::string(errc_name(*s.fail)));
      return r;
    }
    // A file: its length from the header. A stream: each window waits for its 30 s (or the end), as the engine's.
    std::uint64_t samples = 0;
    bool complete = true, closed = false;
    if (spec.stream) {
      sink.decoded(spec.stream->seconds(), 1);
    } else {
      auto info = audio::probe_audio(*spec.audio);
      if (!info) {
        r.status = ::tandem::fail(Errc::invalid_argument, spec.audio_name + ": " + info.error().message);
        return r;
      }
      samples = static_cast<std::uint64_t>(std::llround(info->seconds() * 16000.0));
      const auto windows = static_cast<std::uint32_t>(std::max<std::uint64_t>(1, (samples + 479999) / 480000));
      sink.decoded(info->seconds(), windows);
    }
    const bool on_gpu = spec.route.device != policy::Device::cpu;
    speech::Checkpoint ck = spec.from;
    while (!ck.finished) {
      const std::uint32_t w = ck.windows_done;
      if (spec.stream) {
        auto got = spec.stream->wait_window(ck.seek, 480000, cancel, spec.stream_idle);
        if (!got) {
          if (got.error().code == Errc::cancelled) {
            r.finish_reason = "cancelled";
            return r;
          }
          r.status = ::tandem::fail(got.error());
          return r;
        }
        samples = got->total;
        complete = got->complete;
        closed = got->closed;
        if (complete && ck.seek >= samples) break;  // the end came after the last whole window
      }
      if (s.block_at && *s.block_at == w) wait_gate(spec.job, cancel);
      if (cancel.load()) {
        r.finish_reason = "cancelled";
        return r;
      }
      if (on_gpu && s.gpu_fail_at && *s.gpu_fail_at == w) {
        if (s.gpu_fail == Errc::device_lost) {
          {
            std::lock_guard lock(mu_);
            gpu_loaded_ = false;
          }
          sim_->lose();
        }
        r.status = ::tandem::fail(s.gpu_fail, "fake: injected " + std::string(errc_name(s.gpu_fail)));
        r.accelerator_fault = true;
        return r;
      }
      speech::WindowResult wr;
      speech::Segment seg;
      seg.start = w * 30.0;
      seg.end = w * 30.0 + 2.0;
      seg.text = " w" + std::to_string(w);
      wr.segments.push_back(seg);
      wr.next = ck;
      wr.next.windows_done = w + 1;
      wr.next.segments_done = ck.segments_done + 1;
      wr.next.seek = std::min<std::uint64_t>(samples, ck.seek + 480000);
      wr.next.finished = complete && wr.next.seek >= samples;
      wr.next.language = "en";
      sink.window(wr, std::chrono::milliseconds(5));
      ck = wr.next;
    }
    r.status = {};
    r.finish_reason = closed ? "stream_closed" : "end_of_audio";
    r.decode_time = std::chrono::milliseconds(5);
    return r;
  }
  void set_transcribe_script(TranscribeScript s) {
    std::lock_guard lock(mu_);
    transcribe_script_ = s;
  }
  std::vector<TranscribeSpec> transcribes() const {
    std::lock_guard lock(mu_);
    return transcribes_;
  }

  Result<EmbedTokens> embed_tokens(const std::string& model, const std::string& text, bool truncate) override {
    if (model != "emb") return ::tandem::fail(Errc::unsupported, "fake: " + model + " is not an embedding model");
    std::vector<TokenId> ids;
    for (unsigned char c : text) ids.push_back(3 + static_cast<TokenId>(c % 200));
    return wrap(std::move(ids), truncate);
  }
  // [BOS=1] ids [EOS=2], cut to the fake's context of 8 (EOS kept last).
  static Result<EmbedTokens> wrap(std::vector<TokenId> ids, bool truncate) {
    EmbedTokens t;
    t.ids.push_back(1);
    t.ids.insert(t.ids.end(), ids.begin(), ids.end());
    t.ids.push_back(2);
    if (t.ids.size() > 8) {
      if (!truncate) return ::tandem::fail(Errc::invalid_argument, "fake: text over 8 tokens");
      t.ids.resize(7);
      t.ids.push_back(2);
      t.truncated = true;
    }
    return t;
  }

  // Token inputs: the ids a text's bytes would give (3 + byte % 200), so a text and its ids embed alike; vocabulary
  // 0..202, BOS 1 and EOS 2 refused.
  Result<EmbedTokens> embed_token_ids(const std::string& model, const std::vector<std::int64_t>& ids,
                                      bool truncate) override {
    if (model != "emb") return ::tandem::fail(Errc::unsupported, "fake: " + model + " is not an embedding model");
    std::vector<TokenId> out;
    for (auto id : ids) {
      if (id < 0 || id > 202 || id == 1 || id == 2)
        return ::tandem::fail(Errc::invalid_argument, "fake: id " + std::to_string(id) + " is not a text token");
      out.push_back(static_cast<TokenId>(id));
    }
    return wrap(std::move(out), truncate);
  }

  // The vector of one input: a function of its ids or bytes only (batch-independent), unit length.
  static std::vector<float> vector_of(const std::vector<std::uint8_t>& bytes) {
    std::uint64_t h = 1469598103934665603ull;
    for (auto b : bytes) h = (h ^ b) * 1099511628211ull;
    std::vector<float> v(4);
    double n = 0;
    for (int k = 0; k < 4; ++k) {
      v[static_cast<std::size_t>(k)] = static_cast<float>(static_cast<std::int64_t>((h >> (k * 16)) & 0xffff) - 32768) + 0.5f;
      n += double(v[static_cast<std::size_t>(k)]) * v[static_cast<std::size_t>(k)];
    }
    for (auto& x : v) x = static_cast<float>(x / std::sqrt(n));
    return v;
  }
  static std::vector<float> vector_of_ids(const std::vector<TokenId>& ids) {
    std::vector<std::uint8_t> b;
    for (auto id : ids) b.push_back(static_cast<std::uint8_t>(id));
    b.push_back(0xee);  // texts and images never collide
    return vector_of(b);
  }

  RunResult embed(const EmbedSpec& spec, const std::atomic<bool>& cancel) override {
    EmbedScript s;
    {
      std::lock_guard lock(mu_);
      embeds_.push_back(spec);
      s = embed_script_;
    }
    RunResult r;
    const bool on_gpu = spec.route.device != policy::Device::cpu;
    if (s.block) wait_gate(spec.job, cancel);
    if (cancel.load()) {
      r.finish_reason = "cancelled";
      return r;
    }
    if (on_gpu && s.gpu_fail) {
      if (*s.gpu_fail == Errc::device_lost) {
        {
          std::lock_guard lock(mu_);
          gpu_loaded_ = false;
        }
        sim_->lose();
      }
      r.status = ::tandem::fail(*s.gpu_fail, "fake: injected " + std::string(errc_name(*s.gpu_fail)));
      r.finish_reason = "error";
      r.accelerator_fault = true;
      return r;
    }
    if (s.fail) {
      r.status = ::tandem::fail(*s.fail, "fake: injected " + std::string(errc_name(*s.fail)));
      r.finish_reason = "error";
      return r;
    }
    for (const auto& t : spec.texts) r.vectors.push_back(vector_of_ids(t));
    for (std::size_t i = 0; i < spec.images.size(); ++i) {
      const auto& b = *spec.images[i];
      const std::string_view sv(reinterpret_cast<const char*>(b.data()), b.size());
      if (sv.find("BROKEN") != std::string_view::npos) {  // decodes to nothing: the worker's typed refusal
        r.vectors.clear();
        r.status = ::tandem::fail(Errc::invalid_argument, "image " + std::to_string(i) + ": fake: corrupt");
        r.failed_input = static_cast<std::uint32_t>(spec.texts.size() + i);
        r.finish_reason = "error";
        return r;
      }
      r.vectors.push_back(vector_of(b));
    }
    for (std::uint32_t k = 0; k < s.drop && !r.vectors.empty(); ++k) r.vectors.pop_back();
    r.decode_time = std::chrono::milliseconds(1);
    r.finish_reason = "embedded";
    return r;
  }

  Result<std::vector<TokenId>> encode(const std::string& model, const std::string& prompt,
                                      const std::vector<gen::Message>& messages,
                                      const std::map<std::string, bool>& flags) override {
    {
      std::lock_guard lock(mu_);
      encoded_for_.push_back(model);
      encoded_flags_.push_back(flags);
    }
    std::string text = prompt;
    for (const auto& [k, v] : flags) text += k + (v ? "=true\n" : "=false\n");  // (visible in the token count)
    for (const auto& m : messages) text += m.role + ": " + m.content + "\n";
    std::vector<TokenId> ids{1};  // BOS
    for (unsigned char c : text) ids.push_back(2 + static_cast<TokenId>(c % 500));
    return ids;
  }

  RunResult run(const RunSpec& spec, RunSink& sink, const std::atomic<bool>& cancel) override {
    Script s;
    {
      std::lock_guard lock(mu_);
      runs_.push_back(spec);
      s = scripter_ ? scripter_(spec) : default_;
    }
    const auto base = static_cast<std::uint32_t>(spec.resume_tokens.size());
    const std::uint32_t cap = spec.max_new_tokens > base ? spec.max_new_tokens - base : 0;
    const std::uint32_t n = std::min(s.tokens, cap);
    sink.prefilled(static_cast<std::uint32_t>(spec.prompt.size()) + base, std::chrono::milliseconds(1));
    RunResult r;
    for (std::uint32_t i = 0;; ++i) {
      if (s.block_at && *s.block_at == i) wait_gate(spec.job, cancel);
      if (cancel.load()) {
        r.finish_reason = "cancelled";
        return r;
      }
      if (s.fail && s.fail_after == i) {
        if (*s.fail == Errc::device_lost) {
          {
            std::lock_guard lock(mu_);
            gpu_loaded_ = false;
          }
          sim_->lose();
        }
        r.status = ::tandem::fail(*s.fail, "fake: injected " + std::string(errc_name(*s.fail)) + " after " +
                                               std::to_string(i) + " tokens");
        r.finish_reason = "error";
        r.accelerator_fault = true;
        return r;
      }
      if (i == n) break;
      const std::uint32_t step = base + i;
      sink.token(token_for(spec.sampling.seed, step), text_for(step));
      ++r.new_tokens;
      r.decode_time += std::chrono::milliseconds(1);
    }
    r.finish_reason = n == cap ? "max_tokens" : s.finish_reason;
    return r;
  }

  std::vector<ReplicaInfo> replicas(const std::string& model) const override {
    std::vector<ReplicaInfo> out;
    ReplicaInfo cpu;
    cpu.device = "cpu";
    cpu.state = cpu_ready(model) ? ReplicaState::loaded : ReplicaState::unloaded;
    cpu.mode = "warm";
    out.push_back(cpu);
    if (model == "tiny") {
      ReplicaInfo gpu;
      gpu.device = "gpu";
      gpu.state = evicted(model) ? ReplicaState::evicted : gpu_ready(model) ? ReplicaState::loaded : ReplicaState::lost;
      gpu.mode = "resident";
      gpu.accel_bytes = gpu_resident_bytes(model);
      out.push_back(gpu);
    }
    return out;
  }

  std::shared_ptr<device::Device> accelerator() const override { return sim_; }

  void set_embed_script(EmbedScript s) {
    std::lock_guard lock(mu_);
    embed_script_ = s;
  }
  std::vector<EmbedSpec> embeds() const {
    std::lock_guard lock(mu_);
    return embeds_;
  }

  std::uint64_t gpu_resident_bytes(const std::string& model) const override {
    if (!gpu_ready(model)) return 0;
    for (const auto& m : models_)
      if (m.name == model) return m.weight_bytes;
    return 0;
  }

  bool gpu_ready(const std::string& model) const override {
    std::lock_guard lock(mu_);
    return is_gpu_model(model) && gpu_loaded_ && gpu_enabled_ && !evicted_.count(model);
  }

  // --- residency: evict_gpu / load_gpu (worker threads) ---
  Result<std::uint64_t> evict_gpu(const std::string& model) override {
    std::lock_guard lock(mu_);
    if (!is_gpu_model(model)) return ::tandem::fail(Errc::unsupported, "fake: " + model + " has no GPU replica");
    ++evictions_;
    const bool held = gpu_loaded_ && gpu_enabled_ && !evicted_.count(model);
    evicted_.insert(model);
    placed_.erase(model);  // the simulated device gets the bytes back
    return held ? weight_bytes_of(model) : 0;
  }
  Status load_gpu(const std::string& model) override {
    std::chrono::milliseconds delay{0};
    {
      std::lock_guard lock(mu_);
      ++gpu_loads_;
      delay = load_delay_;
    }
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    std::lock_guard lock(mu_);
    if (!is_gpu_model(model)) return ::tandem::fail(Errc::unsupported, "fake: " + model + " has no GPU replica");
    if (load_fail_) return ::tandem::fail(*load_fail_, "fake: injected load failure");
    if (sim_->lost()) return ::tandem::fail(Errc::device_lost, "fake: device lost");
    if (place_) {
      auto a = sim_->allocate(weight_bytes_of(model), device::Site::weights);
      if (!a) return ::tandem::fail(std::move(a).error());
      placed_[model] = std::move(a).value();
    }
    evicted_.erase(model);
    return {};
  }
  // Accounts each GPU model's weights on the simulated device (before the service starts), so that the device's
  // reading shows what an eviction gives back.
  Status place_on_device() {
    std::lock_guard lock(mu_);
    place_ = true;
    for (const auto& m : models_) {
      if (!is_gpu_model(m.name)) continue;
      auto a = sim_->allocate(m.weight_bytes, device::Site::weights);
      if (!a) return ::tandem::fail(std::move(a).error());
      placed_[m.name] = std::move(a).value();
    }
    return {};
  }
  bool evicted(const std::string& model) const {
    std::lock_guard lock(mu_);
    return evicted_.count(model) != 0;
  }
  int evictions() const {
    std::lock_guard lock(mu_);
    return evictions_;
  }
  int gpu_loads() const {
    std::lock_guard lock(mu_);
    return gpu_loads_;
  }
  void set_load(std::optional<Errc> fail, std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
    std::lock_guard lock(mu_);
    load_fail_ = fail;
    load_delay_ = delay;
  }

  bool cpu_ready(const std::string& model) const override {
    std::lock_guard lock(mu_);
    return cpu_ready_.count(model) != 0;
  }

  bool offload_ready(const std::string& model) const override { return offload_ && gpu_ready(model); }

  // What warmup_reports() answers (the service reads it once, when it is created).
  std::vector<WarmupReport> warmups;
  std::vector<WarmupReport> warmup_reports() const override { return warmups; }

  void set_step_observer(std::function<void(const StepReport&)> fn) override {
    std::lock_guard lock(mu_);
    step_observer_ = std::move(fn);
  }
  std::function<void(const StepReport&)> step_observer() const {
    std::lock_guard lock(mu_);
    return step_observer_;
  }

  Status reload_gpu() override {
    std::lock_guard lock(mu_);
    ++reloads_;
    if (sim_->lost()) return ::tandem::fail(Errc::device_lost, "fake: device still lost");
    gpu_loaded_ = true;
    return {};
  }

  // --- scripting (test thread) ---
  void set_script(Script s) {
    std::lock_guard lock(mu_);
    default_ = std::move(s);
    scripter_ = nullptr;
  }
  void set_scripter(std::function<Script(const RunSpec&)> f) {
    std::lock_guard lock(mu_);
    scripter_ = std::move(f);
  }
  void set_offload(bool on) { offload_ = on; }  // before the service starts
  void set_gpu_enabled(bool on) {
    std::lock_guard lock(mu_);
    gpu_enabled_ = on;
  }
  void set_cpu_ready(const std::string& model, bool on) {
    std::lock_guard lock(mu_);
    if (on) cpu_ready_.insert(model);
    else cpu_ready_.erase(model);
  }
  // Lets blocked runs of `job` (or every run, now and later) continue.
  void release(policy::JobId job) {
    {
      std::lock_guard lock(mu_);
      released_.insert(job);
    }
    gate_cv_.notify_all();
  }
  void release_all() {
    {
      std::lock_guard lock(mu_);
      release_all_ = true;
    }
    gate_cv_.notify_all();
  }

  // --- observations ---
  std::vector<RunSpec> runs() const {
    std::lock_guard lock(mu_);
    return runs_;
  }
  std::vector<RunSpec> runs_of(policy::JobId job) const {
    std::vector<RunSpec> out;
    for (auto& r : runs())
      if (r.job == job) out.push_back(r);
    return out;
  }
  std::size_t blocked() const {
    std::lock_guard lock(mu_);
    return blocked_.size();
  }
  bool is_blocked(policy::JobId job) const {
    std::lock_guard lock(mu_);
    return blocked_.count(job) != 0;
  }
  int reloads() const {
    std::lock_guard lock(mu_);
    return reloads_;
  }
  // The template flags of every encode, in order.
  std::vector<std::map<std::string, bool>> encoded_flags() const {
    std::lock_guard lock(mu_);
    return encoded_flags_;
  }
  std::vector<std::string> encoded_for() const {
    std::lock_guard lock(mu_);
    return encoded_for_;
  }

  // The token and text a run emits at `step` for `seed` (what the engine's (seed, step) sampler would do).
  static TokenId token_for(std::uint64_t seed, std::uint32_t step) {
    return static_cast<TokenId>((seed * 131 + std::uint64_t{step} * 17 + 3) % 512);
  }
  static std::string text_for(std::uint32_t step) { return " w" + std::to_string(step); }
  static std::string text_of(std::uint32_t from, std::uint32_t to) {
    std::string s;
    for (std::uint32_t i = from; i < to; ++i) s += text_for(i);
    return s;
  }
  static std::vector<TokenId> tokens_of(std::uint64_t seed, std::uint32_t from, std::uint32_t to) {
    std::vector<TokenId> v;
    for (std::uint32_t i = from; i < to; ++i) v.push_back(token_for(seed, i));
    return v;
  }

 private:
  void wait_gate(policy::JobId job, const std::atomic<bool>& cancel) {
    std::unique_lock lock(mu_);
    blocked_.insert(job);
    while (!release_all_ && !released_.count(job) && !cancel.load())
      gate_cv_.wait_for(lock, std::chrono::milliseconds(1));
    blocked_.erase(blocked_.find(job));
  }

  std::shared_ptr<device::SimulatedDevice> sim_;
  std::vector<ModelInfo> models_;
  mutable std::mutex mu_;
  std::condition_variable gate_cv_;
  Script default_;
  std::function<Script(const RunSpec&)> scripter_;
  std::vector<RunSpec> runs_;
  std::vector<EmbedSpec> embeds_;
  EmbedScript embed_script_;
  std::vector<TranscribeSpec> transcribes_;
  TranscribeScript transcribe_script_;
  std::vector<std::string> encoded_for_;
  std::vector<std::map<std::string, bool>> encoded_flags_;
  std::set<policy::JobId> released_;
  std::multiset<policy::JobId> blocked_;
  bool release_all_ = false;
  bool gpu_loaded_ = true;
  bool gpu_enabled_ = true;
  std::atomic<bool> offload_{false};
  std::function<void(const StepReport&)> step_observer_;
  std::set<std::string> cpu_ready_{"tiny", "small"};
  int reloads_ = 0;
  std::set<std::string> evicted_;
  std::map<std::string, device::Allocation> placed_;
  bool place_ = false;
  int evictions_ = 0, gpu_loads_ = 0;
  std::optional<Errc> load_fail_;
  std::chrono::milliseconds load_delay_{0};

  std::set<std::string> gpu_models_{"tiny", "emb", "asr"};  // guarded by mu_
  bool prepare_blocked_ = false;
  int prepares_ = 0;
  std::vector<std::string> removed_;
  bool is_gpu_model(const std::string& m) const { return gpu_models_.count(m) != 0; }
  std::uint64_t weight_bytes_of(const std::string& model) const {
    for (const auto& m : models_)
      if (m.name == model) return m.weight_bytes;
    return 0;
  }
};

}  // namespace tandem::daemon::fake
