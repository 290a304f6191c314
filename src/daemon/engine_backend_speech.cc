// EngineBackend, speech models (kind speech; docs/transcription.md): a Whisper-layout model per [[model]] whose
// config.json says so (model_type "whisper" / architectures WhisperForConditionalGeneration), a CPU replica and —
// when there is an accelerator and the model wants it — a GPU replica. A job's run decodes the audio (here, on the
// worker), then runs the window loop (speech::Transcriber) from the job's checkpoint with one engine session,
// reporting every finished window.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "audio/audio.h"
#include "audio/mel.h"
#include "daemon/engine_backend.h"
#include "daemon/engine_backend_replicas.h"
#include "daemon/log.h"
#include "engine/whisper.h"
#include "speech/transcriber.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/whisper_tokens.h"

namespace tandem::daemon {

using SteadyTime = std::chrono::steady_clock;

struct EngineBackend::SpeechEntry : ReplicaPair<engine::WhisperModel> {
  engine::WhisperLoadOptions cpu_opts, gpu_opts;
  std::unique_ptr<tok::Tokenizer> tokenizer;
  tok::WhisperSpecials specials;
  std::string generation_config;  // generation_config.json's text ("" = none)
  speech::ModelSpeechInfo info;
};

namespace {

// The decoder's shape for the estimator: a request's "prompt" is one window's encoder positions and its tokens the
// decoder's positions, so the KV term covers the cross-attention K/V plus the self-attention cache (f32) and the
// activation term the encoder's peak (docs/transcription.md, "Admission").
policy::ModelShape speech_shape(const std::string& name, const engine::WhisperConfig& c, std::uint32_t weight_bits,
                                std::uint64_t weight_bytes) {
  policy::ModelShape s;
  s.name = name;
  s.layers = static_cast<std::uint32_t>(std::max(c.encoder_layers, c.decoder_layers));
  s.hidden = static_cast<std::uint32_t>(c.d_model);
  s.intermediate = static_cast<std::uint32_t>(std::max(c.encoder_ffn, c.decoder_ffn));
  s.heads = static_cast<std::uint32_t>(std::max(c.encoder_heads, c.decoder_heads));
  s.kv_heads = s.heads;
  s.head_dim = static_cast<std::uint32_t>(c.d_model / std::max(1, s.heads == 0 ? 1 : static_cast<int>(s.heads)));
  s.vocab = static_cast<std::uint32_t>(c.vocab);
  s.weight_bits = weight_bits;
  s.kv_elem_bytes = 4;
  s.act_elem_bytes = 4;
  s.weights_bytes_override = weight_bytes;
  return s;
}

// The session's measured bytes replace the shape-derived KV and activation terms (policy::ModelShape::
// fixed_job_bytes): the estimator would count logits for every encoder position, which a Whisper encoder never has.
std::uint64_t session_bytes_of(const engine::WhisperModel& m) { return m.session_bytes(); }

// A speech replica's warm-up (WarmupReport::units, docs/policy.md §6 "Fixed-duration jobs"): one window's encoder
// and a few decoder steps unmeasured (page faults, lazy initialisation, the accelerator's kernels), then one window
// timed: the encoder, the decoder's prompt (start of transcript, language, task) and 16 single-token steps. The
// window's figure is the encoder and prompt plus the tokens a window of speech holds: about 3.3 per second of audio
// (150 words a minute at ~1.3 tokens a word: ~100 for a 30-s window), at most the decoder's positions. A window's
// real time depends on what it holds (silence is skipped, a hard one is decoded again at a higher temperature): the
// windows jobs run move the figure from there (policy::UnitTimes).
std::optional<WarmupReport> warm_up_whisper(const std::string& name, engine::WhisperModel& m,
                                            const tok::WhisperSpecials& sp, policy::Device route) {
  constexpr int kSteps = 16;
  const auto& c = m.config();
  const char* where = route == policy::Device::cpu ? "CPU" : "GPU";
  std::vector<speech::TokenId> prompt{sp.sot};
  if (!sp.languages.empty()) prompt.push_back(sp.languages.front());
  if (sp.transcribe >= 0) prompt.push_back(sp.transcribe);
  if (sp.notimestamps >= 0) prompt.push_back(sp.notimestamps);
  if (sp.sot < 0 || c.vocab < 4 || static_cast<int>(prompt.size()) + kSteps + 1 > c.target_positions) return std::nullopt;
  const std::size_t frames = static_cast<std::size_t>(m.window_frames());
  std::vector<float> mel(static_cast<std::size_t>(c.n_mels) * frames);
  for (std::size_t i = 0; i < mel.size(); ++i) mel[i] = static_cast<float>(static_cast<int>((i * 37) % 41) - 20) / 40.0F;
  auto fail_note = [&](const Error& e) {
    log::warn("speech model {}: no {} warm-up ({}): its ETAs come from its first windows", name, where, e.message);
    return std::nullopt;
  };
  auto session = m.new_session();
  if (!session) return fail_note(session.error());
  auto& s = **session;
  {  // unmeasured
    if (auto st = s.encode(mel, nullptr); !st) return fail_note(st.error());
    if (auto l = s.decode(prompt, nullptr); !l) return fail_note(l.error());
  }
  auto t0 = SteadyTime::now();
  if (auto st = s.encode(mel, nullptr); !st) return fail_note(st.error());
  auto logits = s.decode(prompt, nullptr);
  if (!logits) return fail_note(logits.error());
  const auto head = SteadyTime::now() - t0;
  t0 = SteadyTime::now();
  for (int k = 0; k < kSteps; ++k) {
    // A text token, not the end: the steps must run whatever the logits say.
    const speech::TokenId next = static_cast<speech::TokenId>(1 + (k * 7919) % std::max(1, std::min(sp.eot, c.vocab) - 1));
    logits = s.decode(std::span<const speech::TokenId>(&next, 1), nullptr);
    if (!logits) return fail_note(logits.error());
  }
  const auto per_token = (SteadyTime::now() - t0) / kSteps;
  const double window_s = static_cast<double>(frames) / 100.0;  // 10-ms mel frames
  const int tokens = std::clamp(static_cast<int>(std::ceil(3.3 * window_s)), 1,
                                c.target_positions - static_cast<int>(prompt.size()));
  WarmupReport w;
  w.model = name;
  w.route = route;
  w.units.push_back({policy::WorkUnit::window, 1,
                     std::chrono::duration_cast<Clock::duration>(head + per_token * tokens)});
  log::info("speech model {}: {} replica measured at load: encoder + prompt {:.1f} ms, {:.2f} ms per token: "
            "~{:.0f} ms per {:.0f}-s window of speech ({} tokens)",
            name, where, std::chrono::duration<double, std::milli>(head).count(),
            std::chrono::duration<double, std::milli>(per_token).count(),
            std::chrono::duration<double, std::milli>(w.units[0].took).count(), window_s, tokens);
  return w;
}

}  // namespace

bool EngineBackend::is_speech_model(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return false;
  const std::string cfg = path + "/config.json";
  if (!std::filesystem::exists(cfg, ec)) return false;
  auto j = nlohmann::json::parse(read_small_file(cfg), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return false;
  if (j.value("model_type", std::string()) == "whisper") return true;
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const auto& a : j["architectures"])
      if (a.is_string() && a.get<std::string>() == "WhisperForConditionalGeneration") return true;
  return false;
}

Result<ModelInfo> EngineBackend::prepare_speech(const ModelConfig& mc, const std::function<void(const std::string&)>& progress,
                                            std::shared_ptr<SpeechEntry>& out, std::vector<WarmupReport>& warmups) {
  const DaemonConfig& cfg = cfg_;
  auto e = std::make_shared<SpeechEntry>();
  e->cfg = mc;
  auto ro = replica_options<engine::WhisperLoadOptions>(mc, accel_);
  if (!ro) return fail(std::move(ro).error());
  const auto* dt = &ro->dtype;
  e->cpu_opts = ro->cpu;
  e->gpu_opts = ro->gpu;
  // The decoder's KV pool holds as many full sessions as the route runs jobs at once ([[model]] max_sequences
  // overrides): a job past that would find the pool exhausted (docs/speech-model.md "KV pool").
  auto sessions = [&](std::uint32_t concurrency) {
    return static_cast<int>(std::clamp<std::uint32_t>(mc.max_sequences ? mc.max_sequences : concurrency, 1, 4096));
  };
  e->cpu_opts.max_sessions = sessions(cfg.policy.cpu_queue.concurrency);
  e->gpu_opts.max_sessions = sessions(cfg.policy.gpu_queue.concurrency);
  e->gpu_wanted = ro->gpu_wanted;

  if (progress) progress("loading speech model " + mc.name + " (CPU replica)");
  const auto t0 = SteadyTime::now();
  auto m = engine::WhisperModel::load(mc.dir, e->cpu_opts);
  if (!m) return fail(m.error().code, "model " + mc.name + ": " + m.error().message);
  e->cpu = std::move(m).value();
  const auto& c = e->cpu->config();
  auto tk = tok::load_tokenizer_files(mc.dir);
  if (!tk) return fail(tk.error().code, "model " + mc.name + ": its tokenizer: " + tk.error().message);
  e->tokenizer = std::make_unique<tok::Tokenizer>(std::move(tk).value());
  auto sp = tok::whisper_specials(*e->tokenizer, c.vocab);
  if (!sp) return fail(sp.error().code, "model " + mc.name + ": " + sp.error().message);
  e->specials = std::move(sp).value();
  std::error_code ec;
  audio::MelSpec mel;
  const std::string pp = mc.dir + "/preprocessor_config.json";
  if (std::filesystem::exists(pp, ec)) {
    auto ms = audio::mel_spec_from_preprocessor_json(read_small_file(pp));
    if (!ms) return fail(ms.error().code, "model " + mc.name + ": " + pp + ": " + ms.error().message);
    mel = *ms;
  }
  if (mel.n_mels != c.n_mels)
    return fail(Errc::format_error, "model " + mc.name + ": preprocessor feature_size " + std::to_string(mel.n_mels) +
                                        " differs from the encoder's num_mel_bins " + std::to_string(c.n_mels));
  const std::string gc = mc.dir + "/generation_config.json";
  if (std::filesystem::exists(gc, ec)) e->generation_config = read_small_file(gc);
  e->info.n_mels = c.n_mels;
  e->info.window_frames = e->cpu->window_frames();
  e->info.max_target_positions = c.target_positions;
  e->info.vocab = c.vocab;
  // The decoding configuration is checked now: a model whose generation_config.json is broken fails to load, not
  // its first job.
  if (auto t = speech::Transcriber::create(*e->tokenizer, e->specials, e->info, e->generation_config, {}); !t)
    return fail(t.error().code, "model " + mc.name + ": " + t.error().message);

  ModelInfo info;
  info.name = mc.name;
  info.kind = ModelKind::speech;
  info.speech.n_mels = static_cast<std::uint32_t>(c.n_mels);
  info.speech.window_samples = static_cast<std::uint32_t>(e->cpu->window_frames()) * 160u;
  info.speech.text_positions = static_cast<std::uint32_t>(c.target_positions);
  const auto langs = tok::whisper_languages();
  for (std::size_t i = 0; i < e->specials.languages.size() && i < langs.size(); ++i)
    info.speech.languages.emplace_back(langs[i].code);
  info.speech.translate = e->specials.translate >= 0 && e->specials.multilingual();
  const std::uint32_t bits = *dt == engine::ComputeDType::bf16 || *dt == engine::ComputeDType::f16 ? 16 : 32;
  info.shape = speech_shape(mc.name, c, bits, e->cpu->stats().weight_bytes);
  info.shape.fixed_job_bytes = session_bytes_of(*e->cpu);
  info.revision = mc.revision;
  info.dtype = std::string(engine::compute_dtype_name(*dt));
  info.max_context = static_cast<std::uint32_t>(c.target_positions);
  info.weight_bytes = e->cpu->stats().weight_bytes;
  info.gpu_configured = e->gpu_wanted;
  info.gpu_layers = static_cast<std::uint32_t>(c.encoder_layers + c.decoder_layers);
  info.fingerprint = e->cpu->fingerprint();
  log::info("speech model {}: CPU replica ready in {} ms ({} languages, {}-s windows, fingerprint {})", mc.name,
            std::chrono::duration_cast<std::chrono::milliseconds>(SteadyTime::now() - t0).count(),
            info.speech.languages.size(), info.speech.window_samples / 16000, info.fingerprint);
  if (auto w = warm_up_whisper(mc.name, *e->cpu, e->specials, policy::Device::cpu)) warmups.push_back(std::move(*w));
  if (e->gpu_wanted) {
    if (progress) progress("loading speech model " + mc.name + " (GPU replica)");
    if (auto st = load_speech_gpu(*e); !st) {
      log::warn("speech model {}: no GPU replica ({}); it serves on the CPU", mc.name, st.error().message);
    } else {
      std::shared_ptr<engine::WhisperModel> g;
      {
        std::lock_guard lock(e->gpu_mu);  // on a device a session also holds the weights' expansion workspace
        info.shape.fixed_job_bytes = std::max(info.shape.fixed_job_bytes, session_bytes_of(*e->gpu));
        g = e->gpu;
      }
      if (g)
        if (auto w = warm_up_whisper(mc.name, *g, e->specials, policy::Device::gpu)) warmups.push_back(std::move(*w));
    }
  }
  out = std::move(e);
  return info;
}

Status EngineBackend::load_speech_gpu(SpeechEntry& e) {
  return e.load_gpu(accel_.get(), "speech", [&] { return engine::WhisperModel::load(e.cfg.dir, e.gpu_opts); });
}

bool EngineBackend::speech_gpu_lost(const SpeechEntry& e) const { return e.gpu_lost(accel_.get()); }

std::shared_ptr<EngineBackend::SpeechEntry> EngineBackend::speech_entry(const std::string& name) const {
  std::shared_lock lock(set_mu_);
  for (const auto& e : speech_entries_)
    if (e->cfg.name == name) return e;
  return nullptr;
}

RunResult EngineBackend::transcribe(const TranscribeSpec& spec, TranscribeSink& sink, const std::atomic<bool>& cancel) {
  RunResult out;
  out.finish_reason = "error";
  auto e = speech_entry(spec.route.model);
  if (!e) {
    out.status = fail(Errc::not_found, "unknown speech model '" + spec.route.model + "'");
    return out;
  }
  const bool on_gpu = spec.route.device != policy::Device::cpu;
  std::shared_ptr<engine::WhisperModel> m;
  if (on_gpu) {
    m = e->gpu_for_run(accel_.get());
    if (!m) {
      out.status = fail(Errc::device_lost, "the GPU replica of " + spec.route.model + " is not available");
      out.accelerator_fault = true;
      return out;
    }
  } else {
    m = e->cpu;
  }
  auto cancelled = [&] {
    out.status = {};
    out.finish_reason = "cancelled";
    return out;
  };
  auto fail_with = [&](Error err) {
    if (err.code == Errc::cancelled) return cancelled();
    out.accelerator_fault = on_gpu && (accel_fault(err.code) || speech_gpu_lost(*e));
    out.status = fail(std::move(err));
    return out;
  };
  auto tr = speech::Transcriber::create(*e->tokenizer, e->specials, e->info, e->generation_config, spec.options);
  if (!tr) {
    out.status = fail(tr.error().code == Errc::invalid_argument ? Errc::invalid_argument : tr.error().code,
                      tr.error().message);
    return out;
  }
  // A file: decoded and resampled for every run (the job keeps only the file's bytes); a body that does not decode
  // fails the job as the header check would have. A stream: each window waits below for its samples.
  audio::Pcm pcm;
  if (spec.stream) {
    sink.decoded(spec.stream->seconds(), 1);
  } else {
    audio::AudioLimits lim;
    lim.max_bytes = max_audio_bytes_;
    lim.max_seconds = max_audio_seconds_;
    auto decoded = audio::decode_audio(*spec.audio, lim);
    if (!decoded) {
      out.status = fail(Errc::invalid_argument, spec.audio_name + ": " + decoded.error().message);
      return out;
    }
    pcm = std::move(decoded).value();
    sink.decoded(pcm.seconds(), speech::Transcriber::windows_estimate(pcm.samples.size(), e->info.window_frames));
  }
  if (cancel.load(std::memory_order_relaxed)) return cancelled();
  auto session = m->new_session();
  if (!session) return fail_with(std::move(session).error());
  speech::Checkpoint ck = spec.from;
  bool closed = false;
  Clock::duration busy{};
  while (!ck.finished) {
    if (cancel.load(std::memory_order_relaxed)) return cancelled();
    audio::StreamWindow got;
    speech::AudioView view = speech::AudioView::whole(pcm.samples);
    if (spec.stream) {
      auto waited = spec.stream->wait_window(ck.seek, tr->window_samples(), cancel, spec.stream_idle);
      if (!waited) {
        if (waited.error().code == Errc::cancelled) return cancelled();
        out.status = fail(std::move(waited).error());  // timeout (no audio) or a released seek: not the device's
        return out;
      }
      got = std::move(waited).value();
      closed = got.closed;
      if (got.complete && ck.seek >= got.total) break;  // the end came after the last whole window
      view = speech::AudioView{got.samples, got.first, got.total, got.complete};
    }
    const auto w0 = SteadyTime::now();  // a window's time excludes the wait for its audio
    auto w = tr->window(view, ck, **session, &cancel);
    if (!w) return fail_with(std::move(w).error());
    const auto took = SteadyTime::now() - w0;
    busy += took;
    sink.window(*w, took);
    ck = w->next;
  }
  out.decode_time = busy;
  out.finish_reason = closed ? "stream_closed" : "end_of_audio";
  return out;
}

std::vector<ReplicaInfo> EngineBackend::speech_replicas(const SpeechEntry& e) const {
  return e.infos(accel_.get(), [](const engine::WhisperModel& m) { return m.config().encoder_layers + m.config().decoder_layers; });
}

std::uint64_t EngineBackend::speech_gpu_bytes(const SpeechEntry& e) const { return e.gpu_bytes(accel_.get()); }

bool EngineBackend::speech_gpu_ready(const SpeechEntry& e) const { return e.gpu_ready(accel_.get()); }

Status EngineBackend::reload_speech_gpu() {
  Status first;
  for (auto& e : snapshot(speech_entries_))
    if (auto st = e->reload(accel_.get(), "speech", [&] { return engine::WhisperModel::load(e->cfg.dir, e->gpu_opts); });
        !st && first)
      first = st;
  return first;
}

Result<std::uint64_t> EngineBackend::evict_speech_gpu(SpeechEntry& e) { return e.evict(accel_.get()); }

}  // namespace tandem::daemon
