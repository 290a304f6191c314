// tandemctl transcribe: one audio file through Transcribe, its segments printed as they arrive, progress (windows
// done / total, ETA, route) on a terminal's stderr, and the transcript as text, SRT, WebVTT or JSON at the end
// (docs/tandemctl.md, docs/transcription.md). With --raw, FILE is raw PCM (a microphone: arecord ... | tandemctl
// transcribe --raw 16000 -) streamed through a ring session as it is read (docs/rings.md "Transcribe").
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "client/ring_session.h"
#include "tandemctl_common.h"

namespace tandemctl {

namespace {

enum class Output { text, srt, vtt };

std::string stamp(std::uint64_t ms) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%02llu:%02llu:%02llu.%03llu", static_cast<unsigned long long>(ms / 3600000),
                static_cast<unsigned long long>((ms / 60000) % 60), static_cast<unsigned long long>((ms / 1000) % 60),
                static_cast<unsigned long long>(ms % 1000));
  return buf;
}

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\n");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\n") - b + 1);
}

class Follower {
 public:
  Follower(const Global& g, tc::Client& c, std::uint64_t job, Output out, std::uint64_t timeout_ms)
      : g_(g), c_(c), job_(job), out_(out), timeout_ms_(timeout_ms), tty_(::isatty(2) == 1) {}

  int run(const tc::Placement& p) {
    if (p.route) route_ = *p.route;
    if (p.existing.value_or(false)) polling_ = true;  // its updates go to the first caller: follow GetJob
    const auto t0 = std::chrono::steady_clock::now();
    auto last_poll = t0;
    while (!done_) {
      for (auto& u : c_.take_job_updates(job_)) handle(u);
      if (done_) break;
      if (!polling_ && c_.dropped_job_updates(job_) > 0) polling_ = true;
      const auto now = std::chrono::steady_clock::now();
      if (timeout_ms_ > 0 && now - t0 >= std::chrono::milliseconds(timeout_ms_)) {
        (void)c_.cancel(job_);
        clear_progress();
        err_line("tandemctl: timed out after " + tc::format_duration_ms(timeout_ms_) + " waiting for job " +
                 std::to_string(job_) + "; cancelled it");
        return kFailed;
      }
      // GetJob every 2 s as well: a lost signal cannot leave us waiting for ever.
      if (now - last_poll >= std::chrono::milliseconds(polling_ ? 500 : 2000)) {
        last_poll = now;
        auto j = c_.get_job(job_);
        if (!j.ok()) return bus_error(g_, j.error(), c_.last_error());
        if (j->state && tc::is_terminal_state(*j->state)) break;
      }
      auto w = c_.process(std::chrono::milliseconds(100), tc::interrupt_fd());
      if (!w.ok()) return bus_error(g_, w.error());
      if (*w == tc::Wake::interrupted && !tc::take_interrupts().empty()) {
        clear_progress();
        auto st = c_.cancel(job_);
        err_line("tandemctl: interrupted; job " + std::to_string(job_) + " " + (st.ok() ? *st : std::string("?")));
        return kCancelled;
      }
    }
    return finish();
  }

  // For the ring path: updates come from the session's events, not from D-Bus signals.
  void handle(const tc::JobUpdate& u) {
    if (u.kind == "audio") {
      if (u.windows_total) windows_total_ = *u.windows_total;
      if (u.seconds) audio_ms_ = static_cast<std::uint64_t>(std::llround(*u.seconds * 1000));
      // Before the first window: the windows at the replica's measured time per window, when it has one.
      if (u.eta_known.value_or(false) && u.eta_ms) {
        eta_ms_ = *u.eta_ms;
        eta_before_first_ = true;
      }
      show_progress();
    } else if (u.kind == "segment") {
      if (!polling_ && out_ == Output::text && !g_.json) {
        clear_progress();
        out_text("[" + stamp(u.start_ms.value_or(0)) + " --> " + stamp(u.end_ms.value_or(0)) + "]  " +
                 trimmed(u.text.value_or("")) + "\n");
      }
      ++segments_;
    } else if (u.kind == "progress") {
      if (u.windows_done) windows_done_ = *u.windows_done;
      if (u.windows_total) windows_total_ = *u.windows_total;
      if (u.audio_done_ms) audio_done_ms_ = *u.audio_done_ms;
      if (u.audio_ms) audio_ms_ = *u.audio_ms;
      if (u.eta_ms) eta_ms_ = *u.eta_ms;
      live_ = u.stream.value_or(false);
      if (u.route && *u.route != route_) {
        if (!route_.empty() && !g_.json) {
          clear_progress();
          err_line("tandemctl: job " + std::to_string(job_) + " continues on the " + *u.route + " at window " +
                   std::to_string(windows_done_ + (u.windows_done ? 0 : 1)));
        }
        route_ = *u.route;
      }
      show_progress();
    } else if (u.kind == "migrated" || u.kind == "routed" || u.kind == "started") {
      if (u.kind == "migrated" && !g_.json) {
        clear_progress();
        err_line("tandemctl: the " + u.from.value_or("gpu") + " run failed (" + u.reason.value_or("") +
                 "); moving to the " + u.to.value_or("cpu") + " at window " + std::to_string(windows_done_));
      }
      if (u.route) route_ = *u.route;
      if (u.to) route_ = *u.to;
    } else if (u.kind == "finished") {
      done_ = true;
    }
  }

  bool done() const { return done_; }

  void show_progress() {
    if (!tty_ || g_.json) return;
    std::string line =
        live_ ? "transcribing a live stream: window " + std::to_string(windows_done_ + 1) + ", " + stamp(audio_done_ms_) +
                    " done"
              : "transcribing: window " + std::to_string(std::min(windows_done_ + 1, std::max(windows_total_, 1u))) +
                    "/" + std::to_string(std::max(windows_total_, 1u)) + ", " + stamp(audio_done_ms_) + " of " +
                    stamp(audio_ms_);
    if ((windows_done_ > 0 || eta_before_first_) && !live_) line += ", ETA " + tc::format_duration_ms(eta_ms_);
    if (!route_.empty()) line += " (" + route_ + ")";
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    std::fflush(stderr);
    progress_shown_ = true;
  }
  void clear_progress() {
    if (!progress_shown_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    progress_shown_ = false;
  }

  int finish() {
    clear_progress();
    if (!done_) polling_ = true;  // stopped before `finished` (the ring path): print what GetJob has
    auto j = c_.get_job(job_);
    if (!j.ok()) return bus_error(g_, j.error(), c_.last_error());
    const std::string state = j->state.value_or("");
    std::vector<tc::TranscriptSegment> segs;
    if (j->segments_json) {
      auto s = tc::segments_from_json(*j->segments_json);
      if (!s.ok()) return bus_error(g_, s.error());
      segs = std::move(s).value();
    }
    if (g_.json) {
      json arr = json::array();
      for (const auto& s : segs)
        arr.push_back({{"start", s.start}, {"end", s.end}, {"text", s.text}, {"avg_logprob", s.avg_logprob},
                       {"no_speech_prob", s.no_speech_prob}, {"temperature", s.temperature}});
      json doc{{"job_id", job_},
               {"state", state},
               {"model", j->model.value_or("")},
               {"text", j->text.value_or("")},
               {"segments", arr},
               {"language", j->language.value_or("")},
               {"audio_seconds", static_cast<double>(j->audio_ms.value_or(0)) / 1000.0},
               {"windows", j->windows_done.value_or(0)},
               {"windows_on_cpu", j->windows_on_cpu.value_or(0)},
               {"routes", j->routes.value_or(std::vector<std::string>{})},
               {"degraded", j->degraded.value_or(false)},
               {"realtime_factor", j->realtime_factor.value_or(0.0)}};
      if (state == "failed") doc["error"] = {{"code", j->error_code.value_or("")}, {"message", j->error_message.value_or("")}};
      out_json(doc);
    } else if (state == "completed") {
      if (out_ == Output::srt) out_text(tc::segments_to_srt(segs));
      else if (out_ == Output::vtt) out_text(tc::segments_to_vtt(segs));
      else if (polling_)
        for (const auto& s : segs)
          out_text("[" + stamp(static_cast<std::uint64_t>(std::llround(s.start * 1000))) + " --> " +
                   stamp(static_cast<std::uint64_t>(std::llround(s.end * 1000))) + "]  " + trimmed(s.text) + "\n");
    }
    if (state == "completed") return kOk;
    if (state == "cancelled") {
      if (!g_.json) err_line("tandemctl: job " + std::to_string(job_) + " was cancelled");
      return kCancelled;
    }
    if (!g_.json)
      err_line("tandemctl: job " + std::to_string(job_) + " failed: " + j->error_code.value_or("?") + ": " +
               j->error_message.value_or(""));
    return kFailed;
  }

 private:
  const Global& g_;
  tc::Client& c_;
  std::uint64_t job_;
  Output out_;
  std::uint64_t timeout_ms_;
  bool tty_;
  bool polling_ = false, done_ = false, progress_shown_ = false, live_ = false;
  std::string route_;
  std::uint32_t windows_done_ = 0, windows_total_ = 0, segments_ = 0;
  bool eta_before_first_ = false;  // the audio update carried a measured ETA
  std::uint64_t audio_done_ms_ = 0, audio_ms_ = 0, eta_ms_ = 0;
};

// --raw RATE[:CHANNELS[:FORMAT]]
tc::AudioStreamFormat parse_raw(const std::string& flag, const std::string& v) {
  tc::AudioStreamFormat f;
  const auto c1 = v.find(':');
  f.sample_rate = static_cast<std::uint32_t>(parse_u64(flag, v.substr(0, c1)));
  if (c1 != std::string::npos) {
    const auto c2 = v.find(':', c1 + 1);
    f.channels = static_cast<std::uint32_t>(parse_u64(flag, v.substr(c1 + 1, c2 == std::string::npos ? c2 : c2 - c1 - 1)));
    if (c2 != std::string::npos) f.sample_format = v.substr(c2 + 1);
  }
  if (f.sample_format != "s16le" && f.sample_format != "f32le")
    throw ArgError{flag + ": sample format '" + f.sample_format + "' is not s16le or f32le"};
  if (f.channels == 0 || f.sample_rate == 0) throw ArgError{flag + ": RATE and CHANNELS must be positive"};
  return f;
}

// Raw PCM from `fd` through a ring session as it is read: one transcribe (stream), then audio chunks of ~0.25 s.
// Each chunk is followed by a nop: the nop's answer says the chunk was taken (a refused chunk is answered with an
// error before it); QueueFull (the daemon is behind) waits retry_after_ms and sends the same chunk again.
int stream_pcm(Global& g, tc::Client& client, tc::TranscribeRequest req, int fd, Output out, std::uint64_t timeout_ms) {
  tc::SessionOptions so;
  so.request_data_bytes = 4u << 20;
  auto opened = tc::RingSession::open(client, so);
  if (!opened.ok()) return bus_error(g, opened.error(), client.last_error());
  auto& ring = **opened;
  std::uint64_t ud = 1;
  if (auto s = ring.transcribe(req, ud); !s.ok()) return bus_error(g, s.error());
  std::vector<tc::RingEvent> evs;
  std::vector<tc::JobUpdate> pending;  // updates that came before the Follower existed
  std::uint64_t job = 0;
  while (job == 0) {
    evs.clear();
    auto n = ring.wait(evs, std::chrono::seconds(1), tc::interrupt_fd());
    if (!n.ok()) return bus_error(g, n.error());
    if (!tc::take_interrupts().empty()) return kCancelled;
    for (auto& e : evs) {
      if (e.kind == "error" && e.user_data == ud && e.error) return bus_error(g, tc::to_error(*e.error), *e.error);
      if (e.kind == "accepted" && e.user_data == ud) job = e.job_id;
      else if (e.update) pending.push_back(*e.update);
    }
    if (!ring.open()) {
      err_line("tandemctl: the ring session ended: " + ring.state_text());
      return kBusError;
    }
  }
  Follower f(g, client, job, out, timeout_ms);
  for (const auto& u : pending) f.handle(u);
  const tc::AudioStreamFormat& fmt = *req.stream;
  const std::size_t frame = fmt.channels * (fmt.sample_format == "s16le" ? 2u : 4u);
  const std::size_t chunk = std::max<std::size_t>(frame, fmt.sample_rate / 4 * frame);
  std::vector<std::uint8_t> buf, carry;
  std::uint64_t offset = 0;
  bool eof = false, ended = false;
  std::uint64_t nop_seen = 0;  // the highest nop answered (user_data grows)
  const auto t0 = std::chrono::steady_clock::now();
  auto cancel = [&](const std::string& why) {
    (void)client.cancel(job);
    err_line("tandemctl: " + why + "; job " + std::to_string(job) + " cancelled");
    return why.starts_with("interrupted") ? kCancelled : kFailed;
  };
  // Handles events until `until` holds; a refusal of chunk `chunk_ud` is returned through `refused`.
  auto drain = [&](std::uint64_t chunk_ud, std::optional<tc::RemoteError>& refused, const std::function<bool()>& until)
      -> std::optional<int> {
    while (!until() && !refused) {
      evs.clear();
      auto n = ring.wait(evs, std::chrono::milliseconds(100), tc::interrupt_fd());
      if (!n.ok()) return bus_error(g, n.error());
      if (!tc::take_interrupts().empty()) return cancel("interrupted");
      for (auto& e : evs) {
        if (e.kind == "error" && e.user_data == chunk_ud && e.error) refused = *e.error;
        else if (e.update && e.job_id == job) f.handle(*e.update);
        else if (e.kind == "nop") nop_seen = std::max(nop_seen, e.user_data);
      }
      if (!ring.open()) return f.finish();
      if (timeout_ms > 0 && std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(timeout_ms))
        return cancel("timed out after " + tc::format_duration_ms(timeout_ms));
    }
    return std::nullopt;
  };
  while (!ended) {
    // The next chunk: whole frames only (a partial frame waits for the next read).
    buf = std::move(carry);
    carry.clear();
    while (!eof && buf.size() < chunk) {
      std::uint8_t tmp[65536];
      const ssize_t n = ::read(fd, tmp, std::min(sizeof tmp, chunk - buf.size()));
      if (n < 0 && errno == EINTR) {
        if (!tc::take_interrupts().empty()) return cancel("interrupted");
        continue;
      }
      if (n < 0) return cancel(std::string("reading the audio: ") + std::strerror(errno));
      if (n == 0) eof = true;
      buf.insert(buf.end(), tmp, tmp + n);
    }
    const std::size_t whole = buf.size() / frame * frame;
    if (whole < buf.size()) {
      carry.assign(buf.begin() + static_cast<std::ptrdiff_t>(whole), buf.end());
      buf.resize(whole);
      if (eof) {
        err_line("tandemctl: the input ends with " + std::to_string(carry.size()) + " bytes of a partial frame; dropped");
        carry.clear();
      }
    }
    const bool end = eof && carry.empty();
    for (;;) {
      const std::uint64_t chunk_ud = ++ud, nop_ud = ++ud;
      auto s = ring.audio(job, offset, buf, end, chunk_ud);
      if (!s.ok() && s.error().code == tandem::Errc::queue_full) {  // no room in the ring: let the daemon read
        std::optional<tc::RemoteError> none;
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
        if (auto rc = drain(0, none, [&] { return std::chrono::steady_clock::now() >= until; })) return *rc;
        continue;
      }
      if (!s.ok()) return bus_error(g, s.error());
      (void)ring.nop(nop_ud);
      std::optional<tc::RemoteError> refused;
      if (auto rc = drain(chunk_ud, refused, [&] { return nop_seen >= nop_ud; })) return *rc;
      if (!refused) break;
      if (refused->name.ends_with(".QueueFull")) {  // the transcription is behind: the same chunk again, later
        const auto wait_until = std::chrono::steady_clock::now() +
                                std::chrono::milliseconds(std::max<std::uint64_t>(refused->retry_after_ms.value_or(200), 20));
        std::optional<tc::RemoteError> none;
        if (auto rc = drain(0, none, [&] { return std::chrono::steady_clock::now() >= wait_until; })) return *rc;
        continue;
      }
      err_line("tandemctl: chunk at byte " + std::to_string(offset) + " refused: " + refused->message);
      return cancel("the stream cannot continue");
    }
    offset += buf.size();
    ended = end;
  }
  // The end was sent: the rest of the windows, then `finished`.
  std::optional<tc::RemoteError> none;
  if (auto rc = drain(0, none, [&] { return f.done(); })) return *rc;
  return f.finish();
}

}  // namespace

int cmd_transcribe(Global& g, ArgList& a) {
  tc::TranscribeRequest req;
  Output out = Output::text;
  std::string path;
  std::uint64_t timeout_ms = 0;
  bool detach = false;
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json") g.json = true;
    else if (f == "--srt") out = Output::srt;
    else if (f == "--vtt") out = Output::vtt;
    else if (f == "--model") req.model = a.value(f);
    else if (f == "--language") req.options.language = a.value(f);
    else if (f == "--translate") req.options.translate = true;
    else if (f == "--no-timestamps") req.options.timestamps = false;
    else if (f == "--temperature") req.options.temperature = parse_double(f, a.value(f), 0, 2);
    else if (f == "--no-fallback") req.options.temperature_fallback = false;
    else if (f == "--seed") req.options.seed = parse_u64(f, a.value(f));
    else if (f == "--prompt") req.options.initial_prompt = a.value(f);
    else if (f == "--no-condition") req.options.condition_on_previous_text = false;
    else if (f == "--key") req.options.idempotency_key = a.value(f);
    else if (f == "--no-cpu") req.options.allow_cpu = false;
    else if (f == "--deadline") req.options.deadline_ms = parse_ms_arg(f, a.value(f));
    else if (f == "--timeout") timeout_ms = parse_seconds_arg(f, a.value(f));
    else if (f == "--detach") detach = true;
    else if (f == "--raw") req.stream = parse_raw(f, a.value(f));
    else if (f == "-" || f.empty() || f[0] != '-') {
      if (!path.empty()) throw ArgError{"transcribe: one FILE only (got " + path + " and " + f + ")"};
      path = f;
    } else throw ArgError{"transcribe: unknown option " + f};
  }
  if (path.empty()) throw ArgError{"transcribe: give an audio FILE (\"-\" reads stdin)"};
  if (req.stream && detach) throw ArgError{"transcribe: --raw streams as it reads: it cannot --detach"};
  int fd = -1;
  if (req.stream) {
    fd = path == "-" ? ::dup(0) : ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) throw ArgError{"transcribe: " + path + ": " + std::strerror(errno)};
  } else if (path == "-") {
    const std::string bytes = read_stdin();
    req.audio.assign(bytes.begin(), bytes.end());
    if (req.audio.empty()) throw ArgError{"transcribe: stdin is empty"};
  } else {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) throw ArgError{"transcribe: " + path + ": " + std::strerror(errno)};
    req.audio_fd = fd;
  }
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } closer{fd};

  if (auto s = tc::install_interrupt_handler(kCancelled); !s.ok()) return bus_error(g, s.error());
  int rc = kOk;
  auto client = open_client(g, rc);
  if (!client) return rc;
  if (req.stream) return stream_pcm(g, *client, std::move(req), fd, out, timeout_ms);
  if (!detach)
    if (auto s = client->subscribe(); !s.ok()) return bus_error(g, s.error());
  auto r = client->transcribe(req);
  if (!r.ok()) return bus_error(g, r.error(), client->last_error());
  note_unparsed("placement", r->placement.unparsed);
  if (detach) {
    if (g.json) out_json({{"job_id", r->job_id}, {"route", r->placement.route.value_or("")}});
    else out_text(std::to_string(r->job_id) + "\n");
    return kOk;
  }
  if (!g.json && r->placement.route && *r->placement.route != "gpu")
    err_line("tandemctl: job " + std::to_string(r->job_id) + " runs on the " + *r->placement.route + " (" +
             r->placement.reason.value_or("") + ")");
  Follower f(g, *client, r->job_id, out, timeout_ms);
  return f.run(r->placement);
}

}  // namespace tandemctl
