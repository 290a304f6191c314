// Service: the transcribe workload — Transcribe requests (validation: the audio's header is read on the loop thread,
// its samples on the worker), and the TranscribeWorkload's part of the scheduler: a Whisper window loop on one
// route whose checkpoint is the last finished window. A GPU fault continues the job on the CPU at that window
// boundary; segments go to the caller as each window finishes. docs/transcription.md, docs/architecture.md.
#include <cmath>

#include "audio/audio.h"
#include "core/sha256.h"
#include "daemon/service.h"
#include "daemon/service_internal.h"

namespace tandem::daemon {

namespace {

// The fallback ladder from a first temperature: Whisper's 0, 0.2, ..., 1.0 (from `first` on), or `first` alone.
std::vector<double> temperature_ladder(double first, bool fallback) {
  std::vector<double> t{first};
  if (!fallback) return t;
  for (int i = 1; i <= 5; ++i) {
    const double next = std::round((first + 0.2 * i) * 10.0) / 10.0;
    if (next > 1.0 + 1e-9) break;
    t.push_back(next);
  }
  return t;
}

std::uint64_t seconds_ms(double s) { return s <= 0 ? 0 : static_cast<std::uint64_t>(std::llround(s * 1000.0)); }

json segment_json(const speech::Segment& s, std::size_t index) {
  return json{{"index", index},
              {"start", s.start},
              {"end", s.end},
              {"text", s.text},
              {"avg_logprob", s.avg_logprob},
              {"no_speech_prob", s.no_speech_prob},
              {"compression_ratio", s.compression_ratio},
              {"temperature", s.temperature}};
}

}  // namespace

// Posts a run's progress to the loop (worker thread).
class Service::TranscribeSinkImpl final : public TranscribeSink {
 public:
  TranscribeSinkImpl(Service* s, JobId id, std::uint64_t attempt) : s_(s), id_(id), attempt_(attempt) {}
  void decoded(double audio_seconds, std::uint32_t windows_total) override {
    WorkerEvent ev;
    ev.kind = WorkerEvent::audio_decoded;
    ev.job = id_;
    ev.attempt = attempt_;
    ev.audio_seconds = audio_seconds;
    ev.windows_total = windows_total;
    s_->post(std::move(ev));
  }
  void window(const speech::WindowResult& w, Clock::duration took) override {
    WorkerEvent ev;
    ev.kind = WorkerEvent::window;
    ev.job = id_;
    ev.attempt = attempt_;
    ev.took = took;
    ev.window_result = std::make_shared<speech::WindowResult>(w);
    s_->post(std::move(ev));
  }

 private:
  Service* s_;
  JobId id_;
  std::uint64_t attempt_;
};

// ---------------------------------------------------------------------------------------------------------------
// Requests

std::string Service::default_speech_model() const {
  if (!cfg_.speech.default_model.empty()) return cfg_.speech.default_model;
  for (const auto& m : backend_->models())
    if (m.kind == ModelKind::speech) return m.name;
  return {};
}

Result<Service::Prepared> Service::prepare_transcribe(const Caller& c, const TranscribeRequest& req) {
  if (!c.may_submit && !c.admin)
    return fail(Errc::permission_denied, "uid " + std::to_string(c.uid) + " may not submit (needs group '" +
                                             cfg_.auth.submit_group + "')");
  if (draining_) return fail(Errc::unavailable, "tandemd is stopping; retry_after_ms=5000");
  Prepared p;
  p.kind = WorkloadKind::transcribe;
  const std::string name = req.model.empty() ? default_speech_model() : req.model;
  if (name.empty()) return fail(Errc::not_found, "no speech model is configured");
  auto model = serving_model(name);
  if (!model) return fail(std::move(model).error());
  p.model = *model;
  if (p.model->kind != ModelKind::speech)
    return fail(Errc::unsupported, "model " + name + " is not a speech model (kind " + model_kind_name(p.model->kind) +
                                       (p.model->kind == ModelKind::llm ? "): call Submit" : "): call Embed"));
  p.req.model = name;
  const SpeechInfo& sp = p.model->speech;
  const std::string& which = req.audio_name.empty() ? std::string("audio") : req.audio_name;

  // The audio: size, then the header (format, rate, channels, duration) against the configured limits. Its samples
  // are decoded on the worker: a file whose body is broken fails the job there, typed the same way. A live stream:
  // its format now, its chunks (append_audio) checked as they come.
  std::shared_ptr<audio::PcmStream> stream;
  audio::AudioInfo info;
  json audio_json;
  if (req.stream) {
    if (req.audio && !req.audio->empty())
      return fail(Errc::invalid_argument, "a stream carries no file: its PCM comes in audio chunks");
    audio::StreamLimits sl;
    sl.max_seconds = cfg_.speech.max_audio_seconds;
    sl.max_ahead_seconds = cfg_.speech.max_stream_ahead_seconds;
    auto st = audio::PcmStream::create(*req.stream, sl);
    if (!st) return fail(std::move(st).error());
    stream = std::move(st).value();
    info.format = std::string(audio::sample_format_name(req.stream->sample)) + " " + std::to_string(req.stream->rate) +
                  " Hz " + std::to_string(req.stream->channels) + " ch";
    info.source_rate = req.stream->rate;
    info.channels = req.stream->channels;
    audio_json = json{{"stream", true}, {"sample_rate", req.stream->rate}, {"channels", req.stream->channels},
                      {"sample_format", audio::sample_format_name(req.stream->sample)}};
  } else {
    if (!req.audio || req.audio->empty()) return fail(Errc::invalid_argument, which + " is empty");
    if (req.audio->size() > cfg_.speech.max_audio_bytes)
      return fail(Errc::invalid_argument, which + " is " + std::to_string(req.audio->size()) + " bytes; at most " +
                                              std::to_string(cfg_.speech.max_audio_bytes) + " ([speech] max_audio_bytes)");
    audio::AudioLimits lim;
    lim.max_bytes = cfg_.speech.max_audio_bytes;
    lim.max_seconds = cfg_.speech.max_audio_seconds;
    auto probed = audio::probe_audio(*req.audio, lim);
    if (!probed) return fail(Errc::invalid_argument, which + ": " + probed.error().message);
    info = std::move(probed).value();
    audio_json = json{{"sha256", bytes_sha256(*req.audio)}, {"bytes", req.audio->size()},
                      {"seconds", info.seconds()}, {"format", info.format}};
  }

  const auto& o = req.options;
  if (o.idempotency_key && (o.idempotency_key->empty() || o.idempotency_key->size() > 240 || !valid_utf8(*o.idempotency_key)))
    return fail(Errc::invalid_argument, "idempotency_key must be 1..240 bytes of UTF-8");
  if (o.deadline_ms && (*o.deadline_ms == 0 || *o.deadline_ms > 7ull * 24 * 3600 * 1000))
    return fail(Errc::invalid_argument, "deadline_ms must be in [1,604800000]");
  speech::TranscribeOptions so;
  so.language = o.language;
  if (!so.language.empty()) {
    bool known = false;
    for (const auto& l : sp.languages) known = known || l == so.language;
    if (!known) {
      std::string list;
      for (std::size_t i = 0; i < sp.languages.size() && i < 12; ++i) list += (i ? ", " : "") + sp.languages[i];
      if (sp.languages.size() > 12) list += ", ...";
      return fail(Errc::invalid_argument, "language '" + so.language.substr(0, 16) + "' is not one of model " + name +
                                              "'s (" + list + ")");
    }
  } else if (sp.languages.size() == 1) {
    so.language = sp.languages.front();
  }
  if (o.translate && !sp.translate)
    return fail(Errc::unsupported, "model " + name + " has no translate task (an English-only model)");
  so.task = o.translate ? speech::Task::translate : speech::Task::transcribe;
  so.timestamps = o.timestamps;
  const double t0 = o.temperature.value_or(0.0);
  if (!(t0 >= 0.0 && t0 <= 2.0)) return fail(Errc::invalid_argument, "temperature must be in [0,2]");
  so.temperatures = temperature_ladder(t0, o.temperature_fallback);
  so.seed = o.seed;
  if (o.initial_prompt.size() > 4096 || !valid_utf8(o.initial_prompt))
    return fail(Errc::invalid_argument, "initial_prompt must be at most 4096 bytes of UTF-8");
  so.initial_prompt = o.initial_prompt;
  so.condition_on_previous_text = o.condition_on_previous_text;

  auto work = std::make_shared<TranscribeWork>();
  work->audio = stream ? nullptr : req.audio;
  work->stream = stream;
  work->audio_name = which;
  work->audio_bytes = stream ? 0 : req.audio->size();
  work->format = info.format;
  work->audio_seconds = stream ? 0.0 : info.seconds();
  work->options = so;
  work->checkpoint.language = so.language;
  const double window_s = static_cast<double>(std::max<std::uint32_t>(1, sp.window_samples)) / audio::kSampleRate;
  work->windows_total = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(std::ceil(work->audio_seconds / window_s)));
  p.transcribe = work;

  p.req.options.idempotency_key = o.idempotency_key;
  p.req.options.allow_cpu = o.allow_cpu;
  p.req.options.deadline_ms = o.deadline_ms;
  p.req.options.stream = true;
  // The estimate: one window's encoder forward (its positions as the "prompt") and the decoder's positions as the
  // tokens it may write; the KV term covers the cross-attention K/V and the self-attention cache.
  p.shape.prompt_tokens = std::max<std::uint32_t>(1, sp.window_samples / 320);
  p.shape.max_new_tokens = std::max<std::uint32_t>(1, sp.text_positions);
  p.shape.batch = 1;
  p.shape.allow_cpu = o.allow_cpu.value_or(true);
  p.max_new_tokens = p.shape.max_new_tokens;
  p.request_json = json{{"kind", "transcribe"},
                        {"model", name},
                        {"audio", audio_json},
                        {"language", so.language},
                        {"translate", o.translate},
                        {"timestamps", o.timestamps},
                        {"temperature", t0},
                        {"temperature_fallback", o.temperature_fallback},
                        {"seed", o.seed},
                        {"initial_prompt", o.initial_prompt},
                        {"condition_on_previous_text", o.condition_on_previous_text},
                        {"allow_cpu", p.shape.allow_cpu}};
  const auto dig = Sha256::of(p.request_json.dump());
  for (int i = 0; i < 8; ++i) p.digest = (p.digest << 8) | dig[i];
  return p;
}

Result<Dict> Service::transcribe(const Caller& c, const TranscribeRequest& req) {
  auto p = prepare_transcribe(c, req);
  if (!p) return fail(std::move(p).error());
  // Idempotency: the same key returns the job it named (never a second run); a failed one is run again (its audio
  // is not kept, so there is nothing to resume: the retry is the same request).
  if (const auto& key = p->req.options.idempotency_key) {
    if (auto found = idempotency_.find(scoped_key(c.uid, *key))) {
      if (JobRecord* j = find(found->job)) {
        if (j->digest != p->digest)
          return fail(Errc::duplicate, "idempotency_key '" + key->substr(0, 64) + "' names job " +
                                           std::to_string(j->id) + " with a different request");
        if (j->phase != JobPhase::failed && j->phase != JobPhase::cancelled) {
          Dict out = placement(*j);
          out["existing"] = true;
          if (!j->terminal()) {  // the caller that retries gets the rest of the updates
            j->owner = c.bus_name;
            j->reply_to = c.reply_to;
            j->muted = false;
          }
          return out;
        }
      }
      p->reclaim_key = true;
    }
  }
  if (active_jobs_of(c.bus_name) >= cfg_.runtime.max_jobs_per_client)
    return fail(Errc::queue_full, "at most " + std::to_string(cfg_.runtime.max_jobs_per_client) +
                                      " unfinished jobs per client; retry_after_ms=1000");
  wake_replica(p->model->name);  // keep_alive: a replica given back while idle comes back
  refresh_readings();
  update_service_state();
  const Decision d = decide(*p, std::nullopt, {});
  if (!d.accepted()) {
    ++counters_["jobs_rejected"];
    return rejected_error(d);
  }
  return accept(c, std::move(p).value(), d, std::nullopt);
}

// ---------------------------------------------------------------------------------------------------------------
// Worker events

void Service::on_transcribe_event(JobRecord& j, WorkerEvent& ev) {
  if (j.kind != WorkloadKind::transcribe || !j.transcribe || j.terminal()) return;
  TranscribeWork& w = *j.transcribe;
  if (ev.kind == WorkerEvent::audio_decoded) {
    const bool first = w.checkpoint.windows_done == 0 && j.attempt <= 1;
    w.audio_seconds = ev.audio_seconds;
    w.windows_total = std::max(ev.windows_total, w.checkpoint.windows_done);
    update_fixed_time(j);
    if (first) {
      // Before its first window: the windows at the replica's measured time per window (policy::UnitTimes).
      const auto eta = workload(j).fixed_time(*this, j, j.route.device);
      emit(j, "audio", {{"seconds", w.audio_seconds}, {"windows_total", w.windows_total},
                        {"format", w.format}, {"route", route_name(j.route)}, {"stream", w.stream != nullptr},
                        {"eta_ms", eta && !w.stream ? to_ms(*eta) : std::uint64_t{0}},
                        {"eta_known", eta.has_value() && !w.stream}});
    }
    return;
  }
  if (!ev.window_result) return;
  const speech::WindowResult& wr = *ev.window_result;
  // A window that does not continue where the job stands is a backend bug: never deliver text twice.
  if (wr.next.windows_done != w.checkpoint.windows_done + 1 || wr.next.seek < w.checkpoint.seek) {
    log::error("job {}: window {} reported after window {} (seek {} after {}); ignored", j.id, wr.next.windows_done,
               w.checkpoint.windows_done, wr.next.seek, w.checkpoint.seek);
    ++counters_["transcribe_window_mismatch"];
    return;
  }
  // The run's session exists once a window is done: its reservation is now real device (or host) memory.
  if (ledger_.find(j.id)) (void)ledger_.materialize(j.id);
  if (j.host_admitted && !j.host_materialized) {
    (void)host_guard_.materialize(j.id);
    j.host_materialized = true;
  }
  const auto window_index = w.checkpoint.windows_done;
  for (const auto& seg : wr.segments) {
    const std::size_t index = w.segments.size();
    w.segments.push_back(seg);
    j.text += seg.text;
    emit(j, "segment", {{"index", static_cast<std::uint32_t>(index)},
                        {"start_ms", seconds_ms(seg.start)},
                        {"end_ms", seconds_ms(seg.end)},
                        {"text", seg.text},
                        {"window", window_index},
                        {"temperature", seg.temperature},
                        {"avg_logprob", seg.avg_logprob},
                        {"no_speech_prob", seg.no_speech_prob}});
  }
  w.checkpoint = wr.next;
  if (w.stream) {  // the samples before the checkpoint are never read again (a failover resumes at it)
    w.stream->release_before(w.checkpoint.seek);
    w.audio_seconds = std::max(w.audio_seconds, w.stream->seconds());
  }
  w.run_time += ev.took;
  unit_times_.observe(j.serving_model_name(), j.route.device == policy::Device::cpu ? policy::Device::cpu : policy::Device::gpu,
                      policy::WorkUnit::window, 1, ev.took);
  if (j.route.device == policy::Device::cpu) ++w.windows_on_cpu;
  if (wr.skipped_silence) ++w.windows_skipped;
  if (!w.options.temperatures.empty() && wr.temperature > w.options.temperatures.front() + 1e-9) ++w.fallbacks;
  w.windows_total = std::max(w.windows_total, w.checkpoint.windows_done + (w.checkpoint.finished ? 0u : 1u));
  if (j.fsm && j.phase == JobPhase::running) (void)j.fsm->record_tokens(w.checkpoint.windows_done);
  journal_checkpoint(j);  // the transcript so far rides with the next commit
  update_fixed_time(j);
  const auto done = w.checkpoint.windows_done;
  const auto remaining = w.windows_total > done ? w.windows_total - done : 0u;
  const auto per_window = done ? w.run_time / done : Clock::duration::zero();
  const double audio_done = std::min(w.audio_seconds, static_cast<double>(w.checkpoint.seek) / audio::kSampleRate);
  const double run_s = std::chrono::duration<double>(w.run_time).count();
  const bool live = w.stream && !w.stream->complete();  // more audio may come: no total, no ETA
  emit(j, "progress", {{"windows_done", done},
                       {"stream", live},
                       {"windows_total", w.windows_total},
                       {"audio_done_ms", seconds_ms(audio_done)},
                       {"audio_ms", seconds_ms(w.audio_seconds)},
                       {"eta_ms", live ? std::uint64_t{0} : to_ms(per_window * remaining)},
                       {"route", route_name(j.route)},
                       {"language", w.checkpoint.language},
                       {"realtime_factor", run_s > 0 ? audio_done / run_s : 0.0}});
}

Status Service::append_audio(const Caller& c, JobId id, std::uint64_t offset, std::span<const std::uint8_t> pcm,
                             bool end) {
  JobRecord* j = find(id);
  if (!j) return fail(Errc::not_found, "no job " + std::to_string(id));
  TANDEM_TRY(check_owner(c, *j));
  if (j->kind != WorkloadKind::transcribe || !j->transcribe || !j->transcribe->stream)
    return fail(Errc::illegal_transition, "job " + std::to_string(id) + " is not a streamed transcription");
  if (j->terminal())
    return fail(Errc::illegal_transition, "job " + std::to_string(id) + " has ended (" + phase_name(j->phase) + ")");
  auto st = j->transcribe->stream->append(offset, pcm, end);
  if (!st) {
    ++counters_[st.error().code == Errc::queue_full ? "stream_chunks_deferred" : "stream_chunks_refused"];
    return st;
  }
  ++counters_["stream_chunks"];
  counters_["stream_bytes"] += pcm.size();
  return {};
}

void Service::close_audio_stream(JobId id) {
  JobRecord* j = find(id);
  if (!j || j->terminal() || !j->transcribe || !j->transcribe->stream) return;
  if (!j->transcribe->stream->complete()) {
    log::info("job {}: its stream's producer went away; transcribing the {:.1f} s that arrived", j->id,
              j->transcribe->stream->seconds());
    j->transcribe->stream->close();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The workload

bool Service::TranscribeWorkload::start(Service& s, JobRecord& j) {
  TranscribeWork& w = *j.transcribe;
  TranscribeSpec spec;
  spec.job = j.id;
  spec.route = j.route;
  spec.route.gpu_layers = 0;
  spec.audio = w.audio;
  spec.stream = w.stream;
  spec.stream_idle = std::chrono::seconds(s.cfg_.speech.stream_idle_seconds);
  spec.audio_name = w.audio_name;
  spec.options = w.options;
  spec.from = w.checkpoint;
  if (w.queued == Clock::duration::zero()) w.queued = s.clock_->now() - j.accepted_at;
  if (w.checkpoint.windows_done > 0) {  // a migrated job: where it continues, and its windows left on this route
    const auto eta = w.stream && !w.stream->complete() ? std::nullopt : fixed_time(s, j, j.route.device);
    s.emit(j, "progress", {{"windows_done", w.checkpoint.windows_done},
                           {"windows_total", w.windows_total},
                           {"audio_done_ms", seconds_ms(static_cast<double>(w.checkpoint.seek) / audio::kSampleRate)},
                           {"audio_ms", seconds_ms(w.audio_seconds)},
                           {"eta_ms", eta ? to_ms(*eta) : std::uint64_t{0}},
                           {"route", route_name(j.route)},
                           {"language", w.checkpoint.language},
                           {"realtime_factor", 0.0}});
  }
  auto sink = std::make_shared<TranscribeSinkImpl>(&s, j.id, j.attempt);
  auto cancel = j.cancel;
  const auto attempt = j.attempt;
  auto task = [&s, spec = std::move(spec), sink, cancel, attempt] {
    RunResult r = s.backend_->transcribe(spec, *sink, *cancel);
    WorkerEvent ev;
    ev.kind = WorkerEvent::finished;
    ev.job = spec.job;
    ev.attempt = attempt;
    ev.result = std::move(r);
    s.post(std::move(ev));
  };
  (j.route.device == policy::Device::cpu ? s.cpu_pool_ : s.gpu_pool_)->post(std::move(task));
  return true;
}

std::optional<Clock::duration> Service::TranscribeWorkload::fixed_time(const Service& s, const JobRecord& j,
                                                                       policy::Device route) const {
  if (!j.transcribe) return std::nullopt;
  const TranscribeWork& w = *j.transcribe;
  const std::uint32_t done = w.checkpoint.windows_done;
  const std::uint32_t left = std::max<std::uint32_t>(1, w.windows_total > done ? w.windows_total - done : 0);
  return s.unit_times_.estimate(j.serving_model_name(), route == policy::Device::cpu ? policy::Device::cpu : policy::Device::gpu,
                                policy::WorkUnit::window, left);
}

Status Service::TranscribeWorkload::completed(Service& s, JobRecord& j, const RunResult& r) {
  (void)s, (void)r;
  // A stream whose end came after its last whole window: the run saw the end and ran no further window.
  TranscribeWork& w = *j.transcribe;
  if (w.stream && !w.checkpoint.finished && w.stream->complete() && w.checkpoint.seek >= w.stream->samples_total())
    w.checkpoint.finished = true;
  if (w.stream) w.audio_seconds = std::max(w.audio_seconds, w.stream->seconds());
  // The window events come before the run's end (one queue): a run that says it finished must have reported the
  // window that reached the end of the audio.
  if (!j.transcribe->checkpoint.finished)
    return fail(Errc::internal, "the backend ended the run at window " +
                                    std::to_string(j.transcribe->checkpoint.windows_done) +
                                    " before the end of the audio");
  return {};
}

// Windows already delivered stay delivered: the CPU continues at the last finished window (the checkpoint).
policy::FailoverDecision Service::TranscribeWorkload::failover(const Service& s, const JobRecord& j) const {
  policy::FailoverDecision d;
  if (!s.cpu_can_serve(j)) {
    d.action = policy::FailoverAction::fail_resumable;
    d.reason = "cpu_unavailable";
  } else if (j.transcribe->checkpoint.windows_done == 0) {
    d.action = policy::FailoverAction::retry_on_cpu;
    d.reason = "no_window_delivered";
  } else {
    d.action = policy::FailoverAction::migrate_at_checkpoint;
    d.reason = "window_boundary";
  }
  return d;
}

std::uint32_t Service::TranscribeWorkload::delivered(const JobRecord& j) const {
  return j.transcribe ? j.transcribe->checkpoint.windows_done : 0;
}

void Service::TranscribeWorkload::ended(Service& s, JobRecord& j, JobPhase phase, Errc code, const std::string& message) {
  (void)s, (void)phase, (void)code, (void)message;
  // The audio goes (nothing can run it again: the caller calls Transcribe again); the segments stay for GetJob. A
  // stream's producer learns from its next chunk that the job has ended.
  if (j.transcribe) {
    j.transcribe->audio.reset();
    if (j.transcribe->stream) j.transcribe->stream->abandon();
  }
}

void Service::TranscribeWorkload::outcome(const JobRecord& j, Dict& fin) const {
  if (!j.transcribe) return;
  const TranscribeWork& w = *j.transcribe;
  fin["text"] = j.text;
  fin["segments"] = static_cast<std::uint32_t>(w.segments.size());
  fin["windows_done"] = w.checkpoint.windows_done;
  fin["audio_ms"] = seconds_ms(w.audio_seconds);
  fin["language"] = w.checkpoint.language;
  const double run_s = std::chrono::duration<double>(w.run_time).count();
  fin["realtime_factor"] = run_s > 0 ? w.audio_seconds / run_s : 0.0;
}

void Service::TranscribeWorkload::view(const JobRecord& j, Dict& d) const {
  d["kind"] = std::string("transcribe");
  if (!j.transcribe) return;
  const TranscribeWork& w = *j.transcribe;
  json segs = json::array();
  for (std::size_t i = 0; i < w.segments.size(); ++i) segs.push_back(segment_json(w.segments[i], i));
  d["segments_json"] = segs.dump();
  d["segments"] = static_cast<std::uint32_t>(w.segments.size());
  d["windows_done"] = w.checkpoint.windows_done;
  d["windows_total"] = w.windows_total;
  d["windows_on_cpu"] = w.windows_on_cpu;
  d["windows_skipped"] = w.windows_skipped;
  d["fallbacks"] = w.fallbacks;
  d["audio_ms"] = seconds_ms(w.audio_seconds);
  d["audio_done_ms"] = seconds_ms(std::min(w.audio_seconds, static_cast<double>(w.checkpoint.seek) / audio::kSampleRate));
  d["audio_format"] = w.format;
  if (w.stream) {
    d["stream"] = true;
    d["stream_bytes"] = w.stream->bytes_received();  // where the next chunk's offset must be
    d["stream_complete"] = w.stream->complete();
  }
  d["language"] = w.checkpoint.language;
  d["queued_ms"] = to_ms(w.queued);
  d["run_ms"] = to_ms(w.run_time);
  const double run_s = std::chrono::duration<double>(w.run_time).count();
  d["realtime_factor"] = run_s > 0 ? std::min(w.audio_seconds, static_cast<double>(w.checkpoint.seek) / audio::kSampleRate) / run_s : 0.0;
}

}  // namespace tandem::daemon
