// tandem-validate runner: the transcription workload clients (kind = "transcribe"; docs/validate.md "Transcription
// workloads") and the scenario's speech model (daemon.speech_preset).
// Each request is one Transcribe call (D-Bus, or a ring `transcribe` with transport = "ring") with a mono 16-bit WAV made in
// memory: tones whose pitch changes every second plus a little noise, deterministic from (workload, client,
// request), sent as the `audio` bytes or as a memfd in `audio_fd`. The client follows the job through its JobUpdates
// (recorded as "update" events, like the LLM clients'), polls GetJob after a second of silence, and records:
//   transcribe_call      req, key, model, audio_seconds, sample_rate, bytes, input, language, workload
//   transcribe_rejected  req, key, error (the typed error's short name), message      — the call was refused
//   transcribe_accepted  req, key, route, queue, existing, degraded (job = the job id)
//   transcribe_final     req, key, state, error_code, reason, routes, history, text, segments [{index, start, end,
//                        text}], segments_error, windows_done/total/on_cpu, audio_ms, language, followed_by
//                        (finished | poll | timeout)                                    — GetJob after the end
// The verdict rule transcribe_outcomes (metrics_transcribe.cc) judges them.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>

#include "modelgen/whisper_writer.h"
#include "validate/runner_internal.h"

namespace tandem::validate::detail {

namespace {

// FNV-1a: a seed that depends on the workload's name and the request only (not on the run).
std::uint64_t seed_of(const std::string& workload, std::uint64_t request) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : workload) h = (h ^ ch) * 1099511628211ull;
  for (int i = 0; i < 8; ++i) h = (h ^ ((request >> (8 * i)) & 0xff)) * 1099511628211ull;
  return h;
}

void put_u32(std::vector<std::uint8_t>& b, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void put_u16(std::vector<std::uint8_t>& b, std::uint16_t v) {
  b.push_back(static_cast<std::uint8_t>(v));
  b.push_back(static_cast<std::uint8_t>(v >> 8));
}

// A mono 16-bit PCM WAV: a tone whose pitch is drawn again every second, plus noise.
std::vector<std::uint8_t> make_wav(std::uint64_t seed, double seconds, std::uint32_t rate) {
  std::mt19937_64 rnd(seed);
  static const double kFreqs[] = {220, 330, 440, 660, 880, 1200};
  const std::size_t n = static_cast<std::size_t>(seconds * rate);
  std::vector<double> freq(static_cast<std::size_t>(seconds) + 2);
  for (auto& f : freq) f = kFreqs[rnd() % 6];
  std::uniform_real_distribution<double> noise(-0.5, 0.5);
  const std::uint32_t data_bytes = static_cast<std::uint32_t>(n * 2);
  std::vector<std::uint8_t> b;
  b.reserve(44 + data_bytes);
  for (char ch : std::string("RIFF")) b.push_back(static_cast<std::uint8_t>(ch));
  put_u32(b, 36 + data_bytes);
  for (char ch : std::string("WAVEfmt ")) b.push_back(static_cast<std::uint8_t>(ch));
  put_u32(b, 16);
  put_u16(b, 1);  // PCM
  put_u16(b, 1);  // mono
  put_u32(b, rate);
  put_u32(b, rate * 2);
  put_u16(b, 2);
  put_u16(b, 16);
  for (char ch : std::string("data")) b.push_back(static_cast<std::uint8_t>(ch));
  put_u32(b, data_bytes);
  for (std::size_t i = 0; i < n; ++i) {
    const double t = static_cast<double>(i) / rate;
    double v = 0.3 * std::sin(2 * M_PI * freq[static_cast<std::size_t>(t)] * t) + 0.05 * noise(rnd);
    v = std::clamp(v, -1.0, 1.0);
    put_u16(b, static_cast<std::uint16_t>(static_cast<std::int16_t>(std::lround(v * 32000))));
  }
  return b;
}

// A memfd holding `bytes`, at offset 0 (a regular file, as Transcribe's audio_fd requires).
Result<int> memfd_with(const std::vector<std::uint8_t>& bytes) {
  const int fd = ::memfd_create("tandem-validate-audio", MFD_CLOEXEC);
  if (fd < 0) return fail(Errc::io_error, std::string("memfd_create: ") + std::strerror(errno));
  std::size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = errno;
      ::close(fd);
      return fail(Errc::io_error, std::string("write to the memfd: ") + std::strerror(e));
    }
    off += static_cast<std::size_t>(w);
  }
  if (::lseek(fd, 0, SEEK_SET) != 0) {
    const int e = errno;
    ::close(fd);
    return fail(Errc::io_error, std::string("lseek on the memfd: ") + std::strerror(e));
  }
  return fd;
}

json final_json(const client::JobInfo& j) {
  json d;
  d["state"] = j.state.value_or("");
  if (j.error_code) d["error_code"] = *j.error_code;
  if (j.error_message) d["error_message"] = *j.error_message;
  if (j.reason) d["reason"] = *j.reason;
  if (j.finish_reason) d["finish_reason"] = *j.finish_reason;
  d["kind"] = j.kind.value_or("");
  d["routes"] = j.routes.value_or(std::vector<std::string>{});
  std::vector<std::string> hist;
  if (j.history)
    for (const auto& h : *j.history) hist.push_back(h.to);
  d["history"] = hist;
  d["text"] = j.text.value_or("");
  json segs = json::array();
  if (j.segments_json) {
    auto parsed = client::segments_from_json(*j.segments_json);
    if (parsed) {
      for (const auto& s : *parsed) segs.push_back({{"index", s.index}, {"start", s.start}, {"end", s.end}, {"text", s.text}});
    } else {
      d["segments_error"] = parsed.error().message;
    }
  } else {
    d["segments_error"] = "GetJob has no segments_json";
  }
  d["segments"] = segs;
  if (j.windows_done) d["windows_done"] = *j.windows_done;
  if (j.windows_total) d["windows_total"] = *j.windows_total;
  if (j.windows_on_cpu) d["windows_on_cpu"] = *j.windows_on_cpu;
  if (j.audio_ms) d["audio_ms"] = *j.audio_ms;
  if (j.language) d["language"] = *j.language;
  if (j.degraded) d["degraded"] = *j.degraded;
  return d;
}

class TranscribeWorker : public WorkloadClient {
 public:
  TranscribeWorker(Campaign& c, const Phase& ph, const Workload& w, std::int32_t id, std::uint32_t idx)
      : c_(c), ph_(ph), w_(w), id_(id), idx_(idx) {}

  void run(Clock::time_point phase_t0) override {
    auto t = make_transport(w_.transport, c_.bus);
    if (!t) {
      c_.rec("client_error", id_, 0, {{"error", t.error().message}});
      return;
    }
    cl_ = std::move(*t);
    cl_->on_update = [this](const client::JobUpdate& u) { on_update(u); };
    cl_->on_degraded = [this](const client::DegradedChange& d) {
      c_.rec("degraded_changed", id_, 0, {{"degraded", d.degraded}, {"reason", d.reason}, {"level", d.level.value_or("")}});
    };
    if (auto s = cl_->subscribe(); !s) c_.rec("client_error", id_, 0, {{"error", s.error().message}});
    if (auto s = cl_->status(); s && s->state)
      c_.rec("state_seen", id_, 0, {{"state", *s->state}, {"reason", s->degraded_reason.value_or("")}});
    if (!sleep_until(phase_t0 + std::chrono::milliseconds(w_.start_ms))) return;
    for (std::uint32_t n = 0; n < w_.requests && !interrupted(); ++n) {
      call(n);
      if (w_.interval_ms > 0 && !sleep_until(Clock::now() + std::chrono::milliseconds(w_.interval_ms))) break;
    }
  }

 private:
  void on_update(const client::JobUpdate& u) {
    c_.rec("update", id_, u.job_id, update_json(u));
    {
      std::lock_guard lk(c_.reg_mu);
      auto it = c_.reg.find(u.job_id);
      if (it != c_.reg.end()) {
        Tracked& t = it->second;
        if (u.kind == "routed") t.queued_cpu = u.queue && *u.queue == "cpu", t.started = false;
        if (u.kind == "started") t.started = true;
        if (u.kind == "segment" || u.kind == "progress") t.tokens = true;  // output delivered: "generating"
        if (u.kind == "finished") t.finished = true;
      }
    }
    if (u.kind == "finished") finished_jobs_.insert(u.job_id);  // may come before Transcribe's reply is read
    if (u.job_id == job_) last_activity_ = Clock::now();
  }

  void call(std::uint32_t n) {
    const std::uint64_t global = static_cast<std::uint64_t>(idx_) * 100000 + n;
    client::TranscribeRequest r;
    if (!w_.models.empty()) r.model = w_.models[global % w_.models.size()];
    if (r.model == "default") r.model.clear();
    const std::vector<std::uint8_t> wav = make_wav(seed_of(w_.name, global), w_.audio_seconds, w_.sample_rate);
    int fd = -1;
    if (w_.audio_input == "memfd") {
      auto m = memfd_with(wav);
      if (!m) {
        c_.rec("client_error", id_, 0, {{"error", m.error().message}});
        return;
      }
      fd = *m;
      r.audio_fd = fd;
    } else {
      r.audio = wav;
    }
    if (!w_.language.empty()) r.options.language = w_.language;
    if (!w_.allow_cpu) r.options.allow_cpu = false;
    std::string key;
    if (w_.idempotency_keys) {
      key = c_.nonce + "-" + ph_.name + "-" + w_.name + "-c" + std::to_string(idx_) + "-t" + std::to_string(n);
      r.options.idempotency_key = key;
    }
    const std::uint64_t req = c_.next_req++;
    c_.rec("transcribe_call", id_, 0,
           {{"req", req}, {"key", key}, {"model", r.model}, {"audio_seconds", w_.audio_seconds},
            {"sample_rate", w_.sample_rate}, {"bytes", wav.size()}, {"input", w_.audio_input},
            {"language", w_.language}, {"workload", w_.name}, {"transport", w_.transport}});
    job_ = 0;
    auto res = cl_->transcribe(r);
    if (fd >= 0) ::close(fd);
    if (!res) {
      auto le = cl_->last_error();
      json d{{"req", req}, {"key", key}, {"error", le ? le->short_name() : std::string(errc_name(res.error().code))},
             {"message", res.error().message}};
      if (le && le->retry_after_ms) d["retry_after_ms"] = *le->retry_after_ms;
      c_.rec("transcribe_rejected", id_, 0, d);
      return;
    }
    job_ = res->job_id;
    const auto& p = res->placement;
    c_.rec("transcribe_accepted", id_, job_,
           {{"req", req}, {"key", key}, {"route", p.route.value_or("")}, {"queue", p.queue.value_or("")},
            {"existing", p.existing.value_or(false)}, {"degraded", p.degraded.value_or(false)},
            {"eta_ms", p.eta_ms.value_or(0)}, {"eta_known", p.eta_known.value_or(false)}});
    c_.track(job_, id_);
    follow(req, key);
  }

  // Until the job's "finished" update (or GetJob says terminal after a second of silence, or the drain timeout),
  // then GetJob for the whole record.
  void follow(std::uint64_t req, const std::string& key) {
    const auto until = Clock::now() + std::chrono::milliseconds(std::max<std::uint64_t>(ph_.drain_timeout_ms, 1000));
    last_activity_ = Clock::now();
    std::string how = "timeout";
    while (Clock::now() < until && !interrupted()) {
      (void)cl_->poll(50ms);
      if (finished_jobs_.count(job_)) {
        how = "finished";
        break;
      }
      if (Clock::now() - last_activity_ > 1000ms) {  // silence: GetJob is the truth (an existing job, a lost signal)
        last_activity_ = Clock::now();
        auto j = cl_->get_job(job_);
        if (j && j->state && client::is_terminal_state(*j->state)) {
          (void)cl_->poll(0ms);  // a finished update already queued is still recorded
          how = finished_jobs_.count(job_) ? "finished" : "poll";
          break;
        }
      }
    }
    auto j = cl_->get_job(job_);
    if (!j) {
      auto le = cl_->last_error();
      c_.rec("transcribe_final", id_, job_,
             {{"req", req}, {"key", key}, {"state", ""}, {"followed_by", how},
              {"error", (le ? le->short_name() + ": " : std::string()) + j.error().message}});
      return;
    }
    json d = final_json(*j);
    d["req"] = req;
    d["key"] = key;
    d["followed_by"] = how;
    c_.rec("transcribe_final", id_, job_, d);
  }

  Campaign& c_;
  const Phase& ph_;
  const Workload& w_;
  std::int32_t id_;
  std::uint32_t idx_;
  std::unique_ptr<Transport> cl_;
  std::uint64_t job_ = 0;
  std::set<std::uint64_t> finished_jobs_;
  Clock::time_point last_activity_;
};

}  // namespace

Status prepare_speech_model(Campaign& c) {
  const DaemonSettings& d = c.sc.daemon;
  if (d.speech_preset.empty()) return {};
  const std::string base = c.opts.model_cache.empty() ? "/tmp/tandem-validate-model" : c.opts.model_cache;
  c.speech_dir = base + "-" + d.speech_preset;
  if (exists(c.speech_dir + "/model.safetensors") && exists(c.speech_dir + "/tokenizer.json")) return {};
  auto shape = modelgen::whisper_preset(d.speech_preset);
  if (!shape) return fail(shape.error());
  modelgen::WhisperWriteOptions o;
  o.shape = *shape;
  o.seed = 7;
  const std::string tmp = c.speech_dir + ".tmp." + std::to_string(::getpid());
  if (auto s = modelgen::write_whisper_test_model(tmp, o, modelgen::whisper_test_corpus()); !s) return fail(s.error());
  if (std::rename(tmp.c_str(), c.speech_dir.c_str()) != 0 && !exists(c.speech_dir + "/model.safetensors"))
    return fail(Errc::io_error, "cannot move the speech model to " + c.speech_dir + ": " + std::strerror(errno));
  return {};
}

std::unique_ptr<WorkloadClient> make_transcribe_client(Campaign& c, const Phase& ph, const Workload& w,
                                                       std::int32_t id, std::uint32_t index_in_workload) {
  return std::make_unique<TranscribeWorker>(c, ph, w, id, index_in_workload);
}

}  // namespace tandem::validate::detail
