#include "daemon/engine_backend.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <shared_mutex>

#include <condition_variable>
#include <deque>

#include "daemon/log.h"
#include "engine/batch_runner.h"
#include "engine/generation.h"
#include "engine/model.h"
#include "engine/replica.h"
#include "policy/replica_mode.h"

namespace tandem::daemon {

using SteadyTime = std::chrono::steady_clock;

struct EngineBackend::Entry {
  ModelConfig cfg;
  engine::LoadOptions cpu_opts;
  engine::LoadOptions gpu_opts;
  std::unique_ptr<engine::Replica> cpu;
  mutable std::mutex gpu_mu;
  std::shared_ptr<engine::Model> gpu;  // guarded by gpu_mu
  std::string gpu_error;               // guarded by gpu_mu
  bool gpu_wanted = false;
  bool evicted = false;                // given back on purpose (evict_gpu); guarded by gpu_mu
  std::string chat_template;
  // One step loop per replica in use (continuous batching), made when the first job of that replica runs; a
  // replaced replica (GPU reload, on-demand CPU reload) gets a new one, the old one ends with its last job.
  engine::BatchLimits cpu_limits, gpu_limits;
  std::mutex runner_mu;
  std::shared_ptr<engine::BatchRunner> cpu_runner, gpu_runner;  // guarded by runner_mu
};

struct EngineBackend::Prepared final : PreparedModel {
  const EngineBackend* owner = nullptr;
  std::shared_ptr<Entry> llm;              // one of the three
  std::shared_ptr<EmbedEntry> embedding;
  std::shared_ptr<SpeechEntry> speech;
};

namespace {

// Activation / KV element size on the accelerator (engine/model.h: f32 unless a 16-bit dtype is asked for).
std::uint32_t dtype_bytes(engine::ComputeDType d) {
  return d == engine::ComputeDType::bf16 || d == engine::ComputeDType::f16 ? 2 : 4;
}

policy::ModelShape shape_of(const std::string& name, const engine::Model& model, engine::ComputeDType d) {
  const weights::ModelConfig& c = model.config();
  policy::ModelShape s;
  s.name = name;
  s.layers = static_cast<std::uint32_t>(c.num_layers);
  s.hidden = static_cast<std::uint32_t>(c.hidden_size);
  s.intermediate = static_cast<std::uint32_t>(c.intermediate_size);
  s.heads = static_cast<std::uint32_t>(c.num_heads);
  s.kv_heads = static_cast<std::uint32_t>(c.num_kv_heads);
  s.head_dim = static_cast<std::uint32_t>(c.head_dim);
  s.vocab = static_cast<std::uint32_t>(c.vocab_size);
  s.weight_bits = dtype_bytes(d) * 8;
  s.kv_elem_bytes = dtype_bytes(d);
  s.act_elem_bytes = dtype_bytes(d);
  s.tied_embeddings = c.tie_word_embeddings;
  // Weights at their held size (quantized blocks as stored), and the workspace to expand one matrix.
  s.weights_bytes_override = model.held_weight_bytes();
  s.dequant_workspace_bytes = model.dequant_workspace_bytes(dtype_bytes(d));
  return s;
}

bool accel_fault(Errc c) { return c == Errc::out_of_memory || c == Errc::device_lost || c == Errc::kv_exhausted; }

// A replica's warm-up (WarmupReport, docs/policy.md §6): a short unmeasured run first (page faults of the mapped
// weights, lazy initialisation, the accelerator's kernels), then one prefill of up to 64 tokens and 8 greedy decode
// steps of one sequence, timed; then, when its step loop batches (max_batch > 1), min(max_batch, 8) sequences of 4
// prompt tokens prefilled together and 2 batched decode steps, timed (WarmupReport::batch_steps: the step model's
// cost per sequence from the start, not extrapolated from one sequence). No warm-up (nullopt, logged) when the
// context is too short or a forward fails: the priors then stay; a batched part that fails is left out.
// The batched part of warm_up: `batch` sequences, their 4-token prompts in one forward, then 2 decode steps of all
// of them (the first prompt forward and step unmeasured: the batch's scratch is sized then).
void warm_up_batch(const std::string& name, engine::Model& m, policy::Device route, int batch, WarmupReport& w) {
  constexpr int kPrompt = 4;
  constexpr int kSteps = 3;  // the first unmeasured
  const int vocab = m.config().vocab_size;
  if (batch < 2 || kPrompt + kSteps + 1 > m.max_context() || vocab < 4) return;
  std::vector<std::unique_ptr<engine::Sequence>> seqs;
  std::vector<std::vector<engine::TokenId>> inputs(static_cast<std::size_t>(batch));
  for (int b = 0; b < batch; ++b) {
    auto s = m.new_sequence();
    if (!s) {
      log::warn("model {}: no batched warm-up ({})", name, s.error().message);
      return;
    }
    seqs.push_back(std::move(s).value());
    for (int i = 0; i < kPrompt; ++i)
      inputs[static_cast<std::size_t>(b)].push_back(static_cast<engine::TokenId>(3 + (b * 131 + i * 7919) % (vocab - 3)));
  }
  auto forward = [&]() -> Status {
    std::vector<engine::Model::BatchItem> items;
    for (int b = 0; b < batch; ++b)
      items.push_back({seqs[static_cast<std::size_t>(b)].get(), inputs[static_cast<std::size_t>(b)], false});
    auto out = m.forward_batch(items);
    if (!out) return fail(std::move(out).error());
    for (std::size_t b = 0; b < out->size(); ++b) {
      auto& r = (*out)[b];
      if (!r) return fail(std::move(r).error());
      inputs[b] = {static_cast<engine::TokenId>(std::max_element(r->begin(), r->end()) - r->begin())};
    }
    return {};
  };
  for (int s = 0; s <= kSteps; ++s) {  // s = 0: the prompts
    const auto t0 = SteadyTime::now();
    const std::uint32_t tokens = static_cast<std::uint32_t>(s == 0 ? batch * kPrompt : batch);
    if (auto st = forward(); !st) {
      log::warn("model {}: no batched warm-up ({})", name, st.error().message);
      w.batch_steps.clear();
      return;
    }
    if (s >= 2)
      w.batch_steps.push_back(StepReport{route, static_cast<std::uint32_t>(batch), tokens, 0,
                                         std::chrono::duration_cast<Clock::duration>(SteadyTime::now() - t0)});
  }
  if (!w.batch_steps.empty())
    log::info("model {}: {} replica: a decode step of {} sequences takes {:.1f} ms (one: {:.1f} ms)", name,
              route == policy::Device::cpu ? "CPU" : "GPU", batch,
              std::chrono::duration<double, std::milli>(w.batch_steps.back().took).count(),
              w.decode_steps.empty() ? 0.0 : std::chrono::duration<double, std::milli>(w.decode_steps.back()).count());
}

std::optional<WarmupReport> warm_up(const std::string& name, engine::Model& m, policy::Device route, int max_batch) {
  constexpr int kSteps = 8;
  const int ctx = m.max_context();
  const int n = std::min(64, ctx / 2);
  const int vocab = m.config().vocab_size;
  if (n < 4 || n + kSteps + 1 > ctx || vocab < 4) return std::nullopt;
  std::vector<engine::TokenId> prompt(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) prompt[static_cast<std::size_t>(i)] = static_cast<engine::TokenId>(3 + (i * 7919) % (vocab - 3));
  const char* where = route == policy::Device::cpu ? "CPU" : "GPU";
  auto fail_note = [&](const Error& e) {
    log::warn("model {}: no {} warm-up ({}): the configured rates stay until jobs are measured", name, where, e.message);
    return std::nullopt;
  };
  {  // unmeasured: touches every weight once
    auto seq = m.new_sequence();
    if (!seq) return fail_note(seq.error());
    auto l = m.forward(**seq, std::span<const engine::TokenId>(prompt.data(), 4));
    if (!l) return fail_note(l.error());
    const engine::TokenId t = 3;
    if (auto d = m.forward(**seq, std::span<const engine::TokenId>(&t, 1)); !d) return fail_note(d.error());
  }
  auto seq = m.new_sequence();
  if (!seq) return fail_note(seq.error());
  WarmupReport w;
  w.model = name;
  w.route = route;
  w.prefill_tokens = static_cast<std::uint32_t>(n);
  auto t0 = SteadyTime::now();
  auto logits = m.forward(**seq, prompt);
  w.prefill_took = std::chrono::duration_cast<Clock::duration>(SteadyTime::now() - t0);
  if (!logits) return fail_note(logits.error());
  for (int s = 0; s < kSteps; ++s) {
    const auto& l = *logits;
    const engine::TokenId next = static_cast<engine::TokenId>(std::max_element(l.begin(), l.end()) - l.begin());
    t0 = SteadyTime::now();
    logits = m.forward(**seq, std::span<const engine::TokenId>(&next, 1));
    w.decode_steps.push_back(std::chrono::duration_cast<Clock::duration>(SteadyTime::now() - t0));
    if (!logits) return fail_note(logits.error());
  }
  Clock::duration decode{};
  for (auto d : w.decode_steps) decode += d;
  const double ps = std::chrono::duration<double>(w.prefill_took).count(), ds = std::chrono::duration<double>(decode).count();
  log::info("model {}: {} replica measured at load: prefill {:.0f} tok/s ({} tokens), decode {:.1f} tok/s ({} steps)",
            name, where, ps > 0 ? n / ps : 0.0, n, ds > 0 ? kSteps / ds : 0.0, kSteps);
  warm_up_batch(name, m, route, std::min(max_batch, 8), w);
  return w;
}

// What a GPU replica holds on the accelerator: its weights and its KV pool.
std::uint64_t held_accel_bytes(const engine::Model& m) {
  return m.load_stats().accel_weight_bytes + m.load_stats().accel_kv_bytes;
}

}  // namespace

EngineBackend::~EngineBackend() = default;

Result<std::shared_ptr<EngineBackend>> EngineBackend::create(const DaemonConfig& cfg,
                                                             std::shared_ptr<device::Device> accelerator,
                                                             std::function<void(const std::string&)> progress) {
  std::shared_ptr<EngineBackend> b(new EngineBackend());
  b->cfg_ = cfg;
  b->accel_ = std::move(accelerator);
  b->max_image_bytes_ = cfg.embedding.max_image_bytes;
  b->max_image_pixels_ = cfg.embedding.max_image_pixels;
  b->max_audio_bytes_ = cfg.speech.max_audio_bytes;
  b->max_audio_seconds_ = cfg.speech.max_audio_seconds;
  for (const auto& mc : cfg.models) {
    auto p = b->prepare(mc, progress);
    if (!p) return fail(std::move(p).error());
    for (const auto& w : (*p)->warmups) b->warmups_.push_back(w);
    TANDEM_TRY(b->add_model(std::move(p).value()));
  }
  return b;
}

Result<std::unique_ptr<PreparedModel>> EngineBackend::prepare(const ModelConfig& mc,
                                                              const std::function<void(const std::string&)>& progress) {
  // An embedding or speech model: its kind's prepare fills `slot` (an entry of out) and returns the info.
  auto of_kind = [&](auto slot, auto prepare_kind) -> Result<std::unique_ptr<PreparedModel>> {
    auto out = std::make_unique<Prepared>();
    out->owner = this;
    auto info = (this->*prepare_kind)(mc, progress, (*out).*slot, out->warmups);
    if (!info) return fail(std::move(info).error());
    out->info = std::move(info).value();
    return std::unique_ptr<PreparedModel>(std::move(out));
  };
  if (auto emb = is_embedding_model(mc.dir); emb && *emb)
    return of_kind(&Prepared::embedding, &EngineBackend::prepare_embedding);
  if (is_speech_model(mc.dir)) return of_kind(&Prepared::speech, &EngineBackend::prepare_speech);
  return prepare_llm(mc, progress);
}

// An LLM's replicas: the CPU one (its mode by config or by the ReplicaModePolicy from measured load times), its
// warm-up, then the GPU one when wanted.
Result<std::unique_ptr<PreparedModel>> EngineBackend::prepare_llm(const ModelConfig& mc,
                                                                  const std::function<void(const std::string&)>& progress) {
  auto e = std::make_shared<Entry>();
  auto out = std::make_unique<Prepared>();
  out->owner = this;
  e->cfg = mc;
  auto dt = engine::parse_compute_dtype(mc.dtype);
  if (!dt) return fail(Errc::invalid_argument, "model " + mc.name + ": " + dt.error().message);
  auto kv = engine::parse_kv_cache_type(mc.kv_cache);
  if (!kv) return fail(Errc::invalid_argument, "model " + mc.name + ": " + kv.error().message);
  engine::LoadOptions o;
  o.dtype = *dt;
  o.cpu_kv = *kv;
  o.kv_block_size = static_cast<int>(cfg_.policy.estimator.kv_block_tokens);
  o.max_context = static_cast<int>(mc.max_context);
  o.revision = mc.revision;
  o.template_name = mc.template_name;
  e->cpu_opts = o;
  e->cpu_opts.threads = mc.cpu_threads;
  e->cpu_opts.max_sequences =
      static_cast<int>(mc.max_sequences ? mc.max_sequences : cfg_.policy.cpu_queue.concurrency);
  e->gpu_opts = o;
  e->gpu_opts.threads = mc.gpu_threads;
  e->gpu_opts.max_sequences =
      static_cast<int>(mc.max_sequences ? mc.max_sequences : cfg_.policy.gpu_queue.concurrency);
  e->gpu_opts.accelerator = accel_;
  e->gpu_opts.accel_layers = mc.gpu_layers;
  e->gpu_wanted = mc.gpu && accel_ != nullptr;
  e->cpu_limits.max_batch = static_cast<int>(cfg_.policy.cpu_queue.concurrency);
  e->cpu_limits.step_tokens = static_cast<int>(cfg_.policy.cpu_queue.step_tokens);
  e->gpu_limits.max_batch = static_cast<int>(cfg_.policy.gpu_queue.concurrency);
  e->gpu_limits.step_tokens = static_cast<int>(cfg_.policy.gpu_queue.step_tokens);

  if (progress) progress("loading model " + mc.name + " (CPU replica)");
  const auto t0 = SteadyTime::now();
  // The CPU replica: created measured; "auto" picks the cheapest mode meeting the recovery budget.
  policy::ReplicaMode mode = mc.replica_mode.value_or(policy::ReplicaMode::mmap);
  auto rep = engine::Replica::create(mc.dir, e->cpu_opts, mode);
  if (!rep) return fail(rep.error().code, "model " + mc.name + ": " + rep.error().message);
  e->cpu = std::move(rep).value();
  if (!mc.replica_mode) {
    policy::ReplicaModePolicy rp(cfg_.policy.replica);
    const auto budget = cfg_.policy.host_guard.budget_bytes;
    const auto d = rp.decide(e->cpu->measurements(budget), e->cpu->mode());
    if (d.mode != e->cpu->mode()) TANDEM_TRY(e->cpu->set_mode(d.mode));
    log::info("model {}: CPU replica mode {} ({}; expected recovery {} ms)", mc.name,
              policy::replica_mode_name(d.mode), d.reason,
              std::chrono::duration_cast<std::chrono::milliseconds>(d.expected_recovery).count());
  } else if (mode == policy::ReplicaMode::warm) {
    TANDEM_TRY(e->cpu->set_mode(policy::ReplicaMode::warm));
  }
  auto m = e->cpu->get();
  if (!m) return fail(m.error().code, "model " + mc.name + ": " + m.error().message);
  const auto& model = *m;
  ModelInfo info;
  info.name = mc.name;
  info.shape = shape_of(mc.name, *model, *dt);
  info.shape.cpu_kv_elem_bytes = *kv == engine::KvCacheType::f16 ? 2 : 4;
  info.revision = mc.revision;
  info.dtype = std::string(engine::compute_dtype_name(*dt));
  info.template_name = std::string(gen::template_name(model->prompt_template()));
  info.fallback = mc.fallback;
  info.max_context = static_cast<std::uint32_t>(model->max_context());
  info.weight_bytes = model->load_stats().weight_bytes;
  info.gpu_configured = e->gpu_wanted;
  info.fingerprint = e->cpu->fingerprint().digest;
  info.default_sampling.temperature = mc.sampling.temperature;
  info.default_sampling.top_k = mc.sampling.top_k;
  info.default_sampling.top_p = mc.sampling.top_p;
  info.default_sampling.repetition_penalty = mc.sampling.repetition_penalty;
  info.default_max_new_tokens = mc.sampling.max_new_tokens;
  info.default_stop = mc.sampling.stop;
  info.chat_stop = gen::template_stops(model->prompt_template());
  const int layers = model->config().num_layers;
  info.gpu_layers = static_cast<std::uint32_t>(mc.gpu_layers < 0 ? layers : std::min(mc.gpu_layers, layers));
  if (e->cpu->mode() == policy::ReplicaMode::on_demand) {
    // Created measured, then dropped: loaded at first use (a CPU job, or tokenizing without a GPU replica).
    TANDEM_TRY(e->cpu->set_mode(policy::ReplicaMode::on_demand));
  } else if (auto w = warm_up(mc.name, *model, policy::Device::cpu, e->cpu_limits.max_batch)) {
    out->warmups.push_back(std::move(*w));
  }
  log::info("model {}: CPU replica ready in {} ms (fingerprint {})", mc.name,
            std::chrono::duration_cast<std::chrono::milliseconds>(SteadyTime::now() - t0).count(), info.fingerprint);
  if (e->gpu_wanted) {
    if (progress) progress("loading model " + mc.name + " (GPU replica)");
    if (auto st = load_llm_gpu(*e); !st) {
      log::warn("model {}: no GPU replica ({}); it serves on the CPU", mc.name, st.error().message);
    } else {
      std::shared_ptr<engine::Model> g;
      {
        std::lock_guard lock(e->gpu_mu);
        g = e->gpu;
      }
      if (g)
        if (auto w = warm_up(mc.name, *g,
                             g->accel_layers() < model->config().num_layers ? policy::Device::hybrid : policy::Device::gpu,
                             e->gpu_limits.max_batch))
          out->warmups.push_back(std::move(*w));
    }
  }
  out->info = std::move(info);
  out->llm = std::move(e);
  return std::unique_ptr<PreparedModel>(std::move(out));
}

Result<std::unique_ptr<PreparedModel>> EngineBackend::prepare_model(const ModelConfig& mc) {
  if (entry(mc.name) || embed_entry(mc.name) || speech_entry(mc.name))
    return fail(Errc::duplicate, "model " + mc.name + " is already served (remove it first)");
  return prepare(mc, {});
}

Status EngineBackend::add_model(std::unique_ptr<PreparedModel> m) {
  auto* p = dynamic_cast<Prepared*>(m.get());
  if (!p || p->owner != this) return fail(Errc::invalid_argument, "add_model: not a model this backend prepared");
  for (const auto& i : infos_)
    if (i.name == p->info.name) return fail(Errc::duplicate, "model " + i.name + " is already served");
  {
    std::unique_lock lock(set_mu_);
    if (p->llm) entries_.push_back(p->llm);
    if (p->embedding) embed_entries_.push_back(p->embedding);
    if (p->speech) speech_entries_.push_back(p->speech);
  }
  infos_.push_back(p->info);
  return {};
}

Status EngineBackend::remove_model(const std::string& model) {
  auto it = std::find_if(infos_.begin(), infos_.end(), [&](const ModelInfo& i) { return i.name == model; });
  if (it == infos_.end()) return fail(Errc::not_found, "unknown model '" + model + "'");
  const std::uint64_t accel_bytes = gpu_resident_bytes(model);
  // Taken out under the lock, dropped after it: the last reference (here, or a run's) unloads the replicas.
  // (Found by name first: EmbedEntry and SpeechEntry are complete only in their own files.)
  std::shared_ptr<Entry> llm = entry(model);
  std::shared_ptr<EmbedEntry> emb = embed_entry(model);
  std::shared_ptr<SpeechEntry> sp = speech_entry(model);
  {
    std::unique_lock lock(set_mu_);
    auto take = [](auto& v, const auto& which) {
      if (which) v.erase(std::remove(v.begin(), v.end(), which), v.end());
    };
    take(entries_, llm);
    take(embed_entries_, emb);
    take(speech_entries_, sp);
  }
  infos_.erase(it);
  const long holders = llm ? llm.use_count() : emb ? emb.use_count() : sp ? sp.use_count() : 0;
  llm.reset();
  emb.reset();
  sp.reset();
  if (accel_) accel_->release_cached();
  log::info("model {}: removed ({} MiB on the accelerator given back{})", model, accel_bytes >> 20,
            holders > 1 ? "; a run still holds it: freed when it ends" : "");
  return {};
}

// Beside a loaded CPU replica, the GPU replica shares its opened files (engine::Model::load_beside: the mapped pages
// are read once more from memory, not faulted in from a new mapping); an on-demand CPU replica that is not loaded is
// not loaded for it: the GPU replica then opens the files itself.
Status EngineBackend::load_llm_gpu(Entry& e) {
  const auto t0 = SteadyTime::now();
  std::shared_ptr<const engine::Model> beside;
  if (e.cpu->loaded())
    if (auto c = e.cpu->get()) beside = *c;
  auto m = beside ? engine::Model::load_beside(beside, e.gpu_opts) : engine::Model::load(e.cfg.dir, e.gpu_opts);
  std::lock_guard lock(e.gpu_mu);
  e.evicted = false;  // loaded, or failed (with its error): no longer given back on purpose
  if (!m) {
    e.gpu.reset();
    e.gpu_error = m.error().message;
    return fail(std::move(m).error());
  }
  if ((*m)->fingerprint().digest != e.cpu->fingerprint().digest) {
    e.gpu_error = "GPU replica fingerprint differs from the CPU replica's";
    return fail(Errc::incompatible, e.gpu_error);
  }
  e.gpu = std::move(m).value();
  e.gpu_error.clear();
  const auto& ls = e.gpu->load_stats();
  log::info("model {}: GPU replica ready in {} ms ({} layers, {} MiB weights + {} MiB KV on {})", e.cfg.name,
            std::chrono::duration_cast<std::chrono::milliseconds>(SteadyTime::now() - t0).count(),
            e.gpu->accel_layers(), ls.accel_weight_bytes >> 20, ls.accel_kv_bytes >> 20,
            accel_ ? accel_->name() : "none");
  return {};
}

std::shared_ptr<EngineBackend::Entry> EngineBackend::entry(const std::string& name) const {
  std::shared_lock lock(set_mu_);
  for (const auto& e : entries_)
    if (e->cfg.name == name) return e;
  return nullptr;
}

Result<std::vector<TokenId>> EngineBackend::encode(const std::string& model, const std::string& prompt,
                                                   const std::vector<gen::Message>& messages,
                                                   const std::map<std::string, bool>& flags) {
  auto e = entry(model);
  if (!e && embed_entry(model)) return fail(Errc::unsupported, "model " + model + " is an embedding model (call Embed)");
  if (!e) return fail(Errc::not_found, "unknown model '" + model + "'");
  std::shared_ptr<engine::Model> m;
  {
    std::lock_guard lock(e->gpu_mu);
    m = e->gpu;
  }
  if (!m) {
    auto r = e->cpu->get();
    if (!r) return fail(std::move(r).error());
    m = *r;
  }
  if (messages.empty()) return m->encode_text(prompt);
  return m->encode_chat(messages, flags);
}

std::shared_ptr<engine::BatchRunner> EngineBackend::runner_for(Entry& e, bool gpu,
                                                                const std::shared_ptr<engine::Model>& m) {
  std::lock_guard lock(e.runner_mu);
  auto& slot = gpu ? e.gpu_runner : e.cpu_runner;
  if (!slot || slot->model() != m) {
    const policy::Device dev = gpu ? policy::Device::gpu : policy::Device::cpu;
    slot = std::make_shared<engine::BatchRunner>(m, gpu ? e.gpu_limits : e.cpu_limits,
                                                 [this, dev](const engine::StepStats& st) {
                                                   std::function<void(const StepReport&)> obs;
                                                   {
                                                     std::lock_guard l(observer_mu_);
                                                     obs = step_observer_;
                                                   }
                                                   if (obs)
                                                     obs(StepReport{dev, static_cast<std::uint32_t>(st.batch),
                                                                    static_cast<std::uint32_t>(st.tokens),
                                                                    static_cast<std::uint32_t>(st.prefill_tokens),
                                                                    std::chrono::duration_cast<Clock::duration>(
                                                                        std::chrono::duration<double, std::milli>(
                                                                            st.ms + st.after_ms))});
                                                 });
  }
  return slot;
}

void EngineBackend::set_step_observer(std::function<void(const StepReport&)> fn) {
  std::lock_guard lock(observer_mu_);
  step_observer_ = std::move(fn);
}

// The job joins its replica's step loop (continuous batching) and this worker thread relays its events to the sink
// until it finishes.
RunResult EngineBackend::run(const RunSpec& spec, RunSink& sink, const std::atomic<bool>& cancel) {
  RunResult out;
  auto e = entry(spec.route.model);
  if (!e) {
    out.status = embed_entry(spec.route.model)
                     ? fail(Errc::unsupported, "model " + spec.route.model + " is an embedding model")
                     : fail(Errc::not_found, "unknown model '" + spec.route.model + "'");
    out.finish_reason = "error";
    return out;
  }
  const bool on_gpu = spec.route.device != policy::Device::cpu;
  std::shared_ptr<engine::Model> m;
  if (on_gpu) {
    std::lock_guard lock(e->gpu_mu);
    m = e->gpu;
    if (!m || m->device_lost()) {
      out.status = fail(Errc::device_lost, "the GPU replica of " + spec.route.model + " is not available");
      out.accelerator_fault = true;
      out.finish_reason = "error";
      return out;
    }
  } else {
    auto r = e->cpu->get();
    if (!r) {
      out.status = fail(std::move(r).error());
      out.finish_reason = "error";
      return out;
    }
    m = *r;
  }
  engine::GenerateRequest req;
  req.prompt = spec.prompt;
  req.sampling = spec.sampling;
  req.max_new_tokens = static_cast<int>(spec.max_new_tokens);
  req.stop_strings = spec.stop;
  req.resume_tokens = spec.resume_tokens;
  req.prefill_chunk = static_cast<int>(spec.prefill_chunk);
  // Offloaded (route hybrid): layers [0, k) on the accelerator, the rest of this job on the CPU.
  if (spec.route.device == policy::Device::hybrid && spec.route.gpu_layers > 0)
    req.gpu_layers = static_cast<int>(spec.route.gpu_layers);
  auto fail_with = [&](Error err) {
    out.accelerator_fault = on_gpu && (accel_fault(err.code) || m->device_lost());
    out.status = fail(std::move(err));
    out.finish_reason = "error";
    return out;
  };
  auto g = engine::Generation::create(m, req);
  if (!g) return fail_with(std::move(g).error());

  // Events from the runner's thread, relayed here in order.
  struct Event {
    enum Kind { prefilled, token, finished } kind;
    std::uint32_t prompt_tokens = 0;
    double ms = 0;
    TokenId id = 0;
    std::string text;
    engine::FinishReason reason = engine::FinishReason::running;
    Status status;
  };
  struct Channel {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Event> q;
    void push(Event ev) {
      {
        std::lock_guard lock(mu);
        q.push_back(std::move(ev));
      }
      cv.notify_one();
    }
  };
  auto ch = std::make_shared<Channel>();
  engine::BatchRunner::Callbacks cb;
  cb.prefilled = [ch](std::uint32_t n, double ms) { ch->push(Event{Event::prefilled, n, ms, 0, {}, {}, {}}); };
  cb.token = [ch](const engine::TokenEvent& ev) { ch->push(Event{Event::token, 0, 0, ev.token, ev.text, {}, {}}); };
  cb.finished = [ch](engine::FinishReason r, const Status& st) { ch->push(Event{Event::finished, 0, 0, 0, {}, r, st}); };
  const auto t_submit = SteadyTime::now();
  auto runner = runner_for(*e, on_gpu, m);
  if (auto st = runner->submit(std::move(g).value(), cb, &cancel); !st) return fail_with(std::move(st).error());
  auto t_decode = t_submit;
  for (;;) {
    Event ev;
    {
      std::unique_lock lock(ch->mu);
      ch->cv.wait(lock, [&] { return !ch->q.empty(); });
      ev = std::move(ch->q.front());
      ch->q.pop_front();
    }
    if (ev.kind == Event::prefilled) {
      t_decode = SteadyTime::now();
      sink.prefilled(ev.prompt_tokens, std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double, std::milli>(ev.ms)));
    } else if (ev.kind == Event::token) {
      if (ev.id >= 0) ++out.new_tokens;
      sink.token(ev.id, ev.text);
    } else {
      out.decode_time = SteadyTime::now() - t_decode;
      if (!ev.status) return fail_with(std::move(ev.status).error());
      out.finish_reason = std::string(engine::finish_reason_name(ev.reason));
      return out;
    }
  }
}

std::vector<ReplicaInfo> EngineBackend::replicas(const std::string& model) const {
  std::vector<ReplicaInfo> out;
  if (const auto x = embed_entry(model)) return embed_replicas(*x);
  if (const auto x = speech_entry(model)) return speech_replicas(*x);
  auto e = entry(model);
  if (!e) return out;
  if (e->gpu_wanted) {
    ReplicaInfo r;
    std::lock_guard lock(e->gpu_mu);
    if (e->evicted) {
      r.device = "gpu";
      for (const auto& i : infos_)
        if (i.name == model && i.gpu_layers < i.shape.layers) r.device = "hybrid";
      r.state = ReplicaState::evicted;
    } else if (e->gpu) {
      const bool all = e->gpu->accel_layers() >= e->gpu->config().num_layers;
      r.device = all ? "gpu" : "hybrid";
      r.state = e->gpu->device_lost() ? ReplicaState::lost : ReplicaState::loaded;
      r.layers = static_cast<std::uint32_t>(e->gpu->accel_layers());
      r.accel_bytes = e->gpu->device_lost() ? 0 : held_accel_bytes(*e->gpu);
      r.fingerprint = e->gpu->fingerprint().digest;
    } else {
      r.device = "gpu";
      r.state = ReplicaState::failed;
      r.error = e->gpu_error;
    }
    r.mode = "resident";
    out.push_back(r);
  }
  ReplicaInfo c;
  c.device = "cpu";
  c.state = e->cpu->loaded() ? ReplicaState::loaded : ReplicaState::unloaded;
  c.mode = std::string(policy::replica_mode_name(e->cpu->mode()));
  c.fingerprint = e->cpu->fingerprint().digest;
  if (e->cpu->mode() == policy::ReplicaMode::warm) c.host_bytes = e->cpu->measurements(0).model_bytes;
  out.push_back(c);
  return out;
}

std::uint64_t EngineBackend::gpu_resident_bytes(const std::string& model) const {
  if (const auto x = embed_entry(model)) return embed_gpu_bytes(*x);
  if (const auto x = speech_entry(model)) return speech_gpu_bytes(*x);
  auto e = entry(model);
  if (!e) return 0;
  std::lock_guard lock(e->gpu_mu);
  if (!e->gpu || e->gpu->device_lost()) return 0;
  return held_accel_bytes(*e->gpu);
}

bool EngineBackend::gpu_ready(const std::string& model) const {
  if (const auto x = embed_entry(model)) return embed_gpu_ready(*x);
  if (const auto x = speech_entry(model)) return speech_gpu_ready(*x);
  auto e = entry(model);
  if (!e) return false;
  std::lock_guard lock(e->gpu_mu);
  return e->gpu && !e->gpu->device_lost();
}

bool EngineBackend::cpu_ready(const std::string& model) const {
  return entry(model) != nullptr || embed_entry(model) != nullptr || speech_entry(model) != nullptr;
}

// A sequence of the GPU replica can run its last layers on the CPU (engine::Model::new_sequence(gpu_layers)).
bool EngineBackend::offload_ready(const std::string& model) const {
  auto e = entry(model);
  if (!e) return false;
  std::lock_guard lock(e->gpu_mu);
  return e->gpu && !e->gpu->device_lost() && e->gpu->accel_layers() > 0;
}

Status EngineBackend::reload_gpu() {
  if (!accel_ || accel_->lost()) return fail(Errc::device_lost, "the accelerator is not back");
  Status first;
  for (auto& e : snapshot(entries_)) {
    if (!e->gpu_wanted) continue;
    {
      std::lock_guard lock(e->gpu_mu);
      if (e->evicted || (e->gpu && !e->gpu->device_lost())) continue;
      e->gpu.reset();  // frees nothing on the device (void since the loss); the tensors go with the last run
    }
    if (auto st = load_llm_gpu(*e); !st && first) first = st;
  }
  if (auto st = reload_embed_gpu(); !st && first) first = st;
  if (auto st = reload_speech_gpu(); !st && first) first = st;
  return first;
}

// Drops every reference the backend holds to the GPU replica (the model, its step loop); its accelerator bytes return
// when the last run holding it ends (the service drained them), then the allocator's cache goes back to the driver.
Result<std::uint64_t> EngineBackend::evict_gpu(const std::string& model) {
  std::uint64_t bytes = 0;
  const auto emb = embed_entry(model);
  const auto sp = emb ? nullptr : speech_entry(model);
  if (emb || sp) {
    auto r = emb ? evict_embed_gpu(*emb) : evict_speech_gpu(*sp);
    if (!r) return fail(std::move(r).error());
    bytes = *r;
  } else {
    auto e = entry(model);
    if (!e) return fail(Errc::not_found, "unknown model '" + model + "'");
    if (!e->gpu_wanted) return fail(Errc::unsupported, "model " + model + " has no GPU replica");
    {
      std::lock_guard lock(e->gpu_mu);
      if (e->gpu && !e->gpu->device_lost())
        bytes = held_accel_bytes(*e->gpu);
      e->gpu.reset();
      e->evicted = true;
    }
    std::lock_guard lock(e->runner_mu);
    e->gpu_runner.reset();
  }
  if (accel_) accel_->release_cached();
  log::info("model {}: GPU replica given back ({} MiB)", model, bytes >> 20);
  return bytes;
}

Status EngineBackend::load_gpu(const std::string& model) {
  if (const auto x = embed_entry(model)) return load_embed_gpu(*x);
  if (const auto x = speech_entry(model)) return load_speech_gpu(*x);
  auto e = entry(model);
  if (!e) return fail(Errc::not_found, "unknown model '" + model + "'");
  if (!e->gpu_wanted) return fail(Errc::unsupported, "model " + model + " has no GPU replica");
  if (!accel_ || accel_->lost()) return fail(Errc::device_lost, "the accelerator is not available");
  return load_llm_gpu(*e);
}

}  // namespace tandem::daemon
