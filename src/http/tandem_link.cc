// The real Backend: a thread with a D-Bus client and a ring session (tandem_link.h).
#include "http/tandem_link.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <map>

#include "client/ring_session.h"

namespace tandem::http {

namespace {

client::RemoteError missing(const std::string& why) {
  client::RemoteError e;
  e.name = "org.freedesktop.DBus.Error.ServiceUnknown";
  e.message = why;
  return e;
}

client::RemoteError as_remote(const Error& err, const std::optional<client::RemoteError>& last) {
  if (last) return *last;
  client::RemoteError e;
  e.name = err.code == Errc::io_error ? "org.freedesktop.DBus.Error.Disconnected"
                                      : std::string(client::kErrorPrefix) + "Internal";
  e.message = err.message;
  return e;
}

}  // namespace

// A live stream's audio, kept until its job ends: tandemd answers a chunk only when it refuses it (backpressure:
// QueueFull with retry_after_ms), and then that chunk and every later one are sent again (docs/rings.md).
struct StreamAudio {
  struct Chunk {
    std::uint64_t offset;
    std::string pcm;
    bool end;
  };
  std::vector<Chunk> chunks;
  std::uint64_t next_offset = 0;
  std::size_t resend_from = SIZE_MAX;
  std::chrono::steady_clock::time_point retry_at{};
};

struct TandemLink::State {
  std::map<std::uint64_t, StreamAudio> streams;                            // job -> its audio
  std::map<std::uint64_t, std::pair<std::uint64_t, std::size_t>> audio_ud;  // user_data -> (job, chunk index)
  std::unique_ptr<client::Client> client;
  std::unique_ptr<client::RingSession> ring;
  std::unique_ptr<sdbus::IProxy> bus_proxy;  // org.freedesktop.DBus, for GetNameOwner
  std::string owner;                         // tandemd's unique name when connected
  std::uint64_t next_ud = 1;
  std::map<std::uint64_t, std::shared_ptr<JobSink>> awaiting;  // user_data -> sink, until accepted
  std::map<std::uint64_t, std::shared_ptr<JobSink>> jobs;      // job id -> sink, until finished
  std::map<std::uint64_t, std::function<void(Outcome<client::EmbedReply>)>> embeds;  // user_data -> callback
  std::vector<std::pair<client::Request, std::shared_ptr<JobSink>>> retry;  // the ring was full
  std::vector<std::uint64_t> forget;  // D-Bus jobs that finished: drop the client's buffered updates
  std::optional<client::DegradedChange> degraded;  // the service's mode: at connect, then each change
  std::chrono::steady_clock::time_point last_owner_check{};
  std::chrono::steady_clock::time_point next_connect{};
};

TandemLink::TandemLink(Options options, Post post) : opt_(std::move(options)), post_(std::move(post)) {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

TandemLink::~TandemLink() {
  stop_ = true;
  if (wake_fd_ >= 0) {
    std::uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void TandemLink::start() { thread_ = std::thread([this] { run(); }); }

bool TandemLink::wait_connected(std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!connected_ && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return connected_;
}

void TandemLink::command(std::function<void(State&)> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(std::move(fn));
  }
  std::uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

void TandemLink::submit(const client::Request& r, std::shared_ptr<JobSink> sink) {
  command([this, r, sink](State& s) {
    if (!s.ring || !s.ring->open()) {
      post_([sink] { sink->refused(missing("tandemd is not reachable (no ring session)")); });
      return;
    }
    const std::uint64_t ud = s.next_ud++;
    auto rc = s.ring->submit(r, ud);
    if (!rc.ok()) {
      if (rc.error().code == Errc::queue_full) {
        s.retry.emplace_back(r, sink);
        return;
      }
      const auto e = missing(rc.error().message);
      post_([sink, e] { sink->refused(e); });
      return;
    }
    s.awaiting[ud] = sink;
  });
}

void TandemLink::resume(std::uint64_t job, const client::SubmitOptions& overrides, std::shared_ptr<JobSink> sink) {
  // Resume is a D-Bus call; the new job's updates come as JobUpdate signals (subscribed at connect).
  command([this, job, overrides, sink](State& s) {
    if (!s.client) return post_([sink] { sink->refused(missing("tandemd is not reachable")); });
    auto r = s.client->resume(job, overrides);
    if (!r.ok()) {
      const auto e = as_remote(r.error(), s.client->last_error());
      return post_([sink, e] { sink->refused(e); });
    }
    const client::SubmitResult res = *r;
    s.jobs[res.job_id] = sink;
    if (s.degraded) post_([sink, d = *s.degraded] { sink->degraded(d); });
    post_([sink, res] { sink->accepted(res); });
    for (auto& u : s.client->take_job_updates(res.job_id)) {
      const bool fin = u.kind == "finished";
      post_([sink, u] { sink->update(u); });
      if (fin) {
        release(std::move(s.jobs[res.job_id]));
        s.jobs.erase(res.job_id);
      }
    }
  });
}

void TandemLink::transcribe(const client::TranscribeRequest& r, std::shared_ptr<JobSink> sink) {
  // D-Bus Transcribe with the upload in a sealed-size memfd (no copy into the message, no ring-record size limit);
  // the job's updates come as JobUpdate signals, like a resumed job's.
  command([this, r, sink](State& s) {
    if (!s.client) return post_([sink] { sink->refused(missing("tandemd is not reachable")); });
    client::TranscribeRequest req = r;
    const int fd = ::memfd_create("tandem-http-upload", MFD_CLOEXEC);
    bool ok = fd >= 0;
    for (std::size_t off = 0; ok && off < req.audio.size();) {
      const ssize_t n = ::write(fd, req.audio.data() + off, req.audio.size() - off);
      if (n <= 0) ok = false;
      else off += static_cast<std::size_t>(n);
    }
    if (!ok || ::lseek(fd, 0, SEEK_SET) != 0) {
      if (fd >= 0) ::close(fd);
      client::RemoteError e;
      e.name = std::string(client::kErrorPrefix) + "Internal";
      e.message = "tandem-http could not stage the upload in memory";
      return post_([sink, e] { sink->refused(e); });
    }
    req.audio.clear();
    req.audio_fd = fd;
    auto res = s.client->transcribe(req);
    ::close(fd);
    if (!res.ok()) {
      const auto e = as_remote(res.error(), s.client->last_error());
      return post_([sink, e] { sink->refused(e); });
    }
    const client::SubmitResult sub = *res;
    s.jobs[sub.job_id] = sink;
    if (s.degraded) post_([sink, d = *s.degraded] { sink->degraded(d); });
    post_([sink, sub] { sink->accepted(sub); });
  });
}

void TandemLink::transcribe_stream(const client::TranscribeRequest& r, std::shared_ptr<JobSink> sink) {
  command([this, r, sink](State& s) {
    if (!s.ring || !s.ring->open()) return post_([sink] { sink->refused(missing("tandemd is not reachable (no ring session)")); });
    const std::uint64_t ud = s.next_ud++;
    auto rc = s.ring->transcribe(r, ud);
    if (!rc.ok()) {
      const auto e = missing(rc.error().message);
      return post_([sink, e] { sink->refused(e); });
    }
    s.awaiting[ud] = sink;
  });
}

namespace {
// Sends a stream's chunks from index `from` on; stops (to retry) when the ring is full.
void send_audio(TandemLink::State& s, std::uint64_t job, StreamAudio& st, std::size_t from);
}  // namespace

void TandemLink::audio(std::uint64_t job, std::string pcm, bool end) {
  command([job, pcm = std::move(pcm), end](State& s) {
    if (!s.ring) return;
    auto& st = s.streams[job];
    st.chunks.push_back({st.next_offset, pcm, end});
    st.next_offset += pcm.size();
    if (st.resend_from == SIZE_MAX) send_audio(s, job, st, st.chunks.size() - 1);
  });
}

namespace {
void send_audio(TandemLink::State& s, std::uint64_t job, StreamAudio& st, std::size_t from) {
  for (std::size_t i = from; i < st.chunks.size(); ++i) {
    const auto& c = st.chunks[i];
    const std::uint64_t ud = s.next_ud++;
    auto rc = s.ring->audio(job, c.offset,
                            std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(c.pcm.data()), c.pcm.size()),
                            c.end, ud);
    if (!rc.ok()) {  // no room in the ring now: resend from here on the next pass
      st.resend_from = i;
      st.retry_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(5);
      return;
    }
    s.audio_ud[ud] = {job, i};
  }
  st.resend_from = SIZE_MAX;
}
}  // namespace

void TandemLink::cancel(std::uint64_t job) {
  command([job](State& s) {
    if (s.client) (void)s.client->cancel(job);  // its "finished" (cancelled) update follows on the job's channel
  });
}

void TandemLink::embed(const client::EmbedRequest& r, std::function<void(Outcome<client::EmbedReply>)> done) {
  command([this, r, done](State& s) {
    if (!s.ring || !s.ring->open())
      return post_([done] { done(Outcome<client::EmbedReply>::failure(missing("tandemd is not reachable"))); });
    const std::uint64_t ud = s.next_ud++;
    auto rc = s.ring->embed(r, ud);
    if (!rc.ok()) {
      client::RemoteError e;
      e.name = rc.error().code == Errc::invalid_argument ? std::string(client::kErrorPrefix) + "InvalidArgument"
               : rc.error().code == Errc::queue_full     ? std::string(client::kErrorPrefix) + "QueueFull"
                                                         : "org.freedesktop.DBus.Error.Disconnected";
      e.message = rc.error().message;
      if (rc.error().code == Errc::queue_full) e.retry_after_ms = 200;
      return post_([done, e] { done(Outcome<client::EmbedReply>::failure(e)); });
    }
    s.embeds[ud] = done;
  });
}

void TandemLink::models(std::function<void(Outcome<std::vector<ModelEntry>>)> done) {
  command([this, done](State& s) {
    if (!s.client) return post_([done] { done(Outcome<std::vector<ModelEntry>>::failure(missing("tandemd is not reachable"))); });
    auto ms = s.client->list_models();
    if (!ms.ok()) {
      const auto e = as_remote(ms.error(), s.client->last_error());
      return post_([done, e] { done(Outcome<std::vector<ModelEntry>>::failure(e)); });
    }
    std::vector<ModelEntry> out;
    for (const auto& m : *ms) {
      ModelEntry e;
      e.info = m;
      if (m.name) {
        auto d = s.client->model_details(client::model_object_path(*m.name));
        if (d.ok()) e.details = *d;
      }
      out.push_back(std::move(e));
    }
    post_([done, out = std::move(out)] { done(Outcome<std::vector<ModelEntry>>::success(out)); });
  });
}

void TandemLink::status(std::function<void(Outcome<client::ServiceStatus>)> done) {
  command([this, done](State& s) {
    if (!s.client) return post_([done] { done(Outcome<client::ServiceStatus>::failure(missing("tandemd is not reachable"))); });
    auto st = s.client->status();
    if (!st.ok()) {
      const auto e = as_remote(st.error(), s.client->last_error());
      return post_([done, e] { done(Outcome<client::ServiceStatus>::failure(e)); });
    }
    post_([done, v = *st] { done(Outcome<client::ServiceStatus>::success(v)); });
  });
}

void TandemLink::get_job(std::uint64_t job, std::function<void(Outcome<client::JobInfo>)> done) {
  command([this, job, done](State& s) {
    if (!s.client) return post_([done] { done(Outcome<client::JobInfo>::failure(missing("tandemd is not reachable"))); });
    auto j = s.client->get_job(job);
    if (!j.ok()) {
      const auto e = as_remote(j.error(), s.client->last_error());
      return post_([done, e] { done(Outcome<client::JobInfo>::failure(e)); });
    }
    post_([done, v = *j] { done(Outcome<client::JobInfo>::success(v)); });
  });
}

void TandemLink::run() {
  State s;
  auto name_owner = [&]() -> std::optional<std::string> {
    try {
      std::string owner;
      s.bus_proxy->callMethod("GetNameOwner").onInterface("org.freedesktop.DBus").withArguments(opt_.service).storeResultsTo(owner);
      return owner;
    } catch (const sdbus::Error&) {
      return std::nullopt;
    }
  };
  // Everything open is reported lost; the link starts over.
  auto drop = [&](const std::string& why) {
    for (auto& [ud, sink] : s.awaiting) post_([sink = std::move(sink), why] { sink->lost(why); });
    for (auto& [id, sink] : s.jobs) post_([sink = std::move(sink), why] { sink->lost(why); });
    for (auto& [ud, done] : s.embeds)
      post_([done = std::move(done), why] { done(Outcome<client::EmbedReply>::failure(missing(why))); });
    for (auto& [r, sink] : s.retry) post_([sink = std::move(sink), why] { sink->refused(missing(why)); });
    s.awaiting.clear();
    s.jobs.clear();
    s.embeds.clear();
    s.retry.clear();
    s.streams.clear();
    s.audio_ud.clear();
    s.ring.reset();
    s.owner.clear();
    connected_ = false;
  };
  auto connect = [&]() {
    if (!s.client) {
      auto c = client::Client::connect(opt_.bus, opt_.service);
      if (!c.ok()) return;
      s.client = std::move(c).value();
      s.bus_proxy = sdbus::createProxy(s.client->connection(), "org.freedesktop.DBus", "/org/freedesktop/DBus");
      (void)s.client->subscribe();
      s.client->on_job_update([&s, this](const client::JobUpdate& u) {
        // D-Bus updates: only for resumed jobs (ring jobs' updates come through the ring).
        auto it = s.jobs.find(u.job_id);
        if (it == s.jobs.end()) return;
        const bool fin = u.kind == "finished";
        post_([sink = fin ? std::move(it->second) : it->second, u] { sink->update(u); });
        if (fin) {
          s.jobs.erase(it);
          s.forget.push_back(u.job_id);
        }
      });
    }
    auto owner = name_owner();
    if (!owner) return;
    client::Client::SessionOptions so;
    so.sq_entries = so.cq_entries = opt_.ring_entries;
    so.request_data_bytes = opt_.request_data_bytes;
    auto ring = client::RingSession::open(*s.client, so);
    if (!ring.ok()) return;
    s.ring = std::move(ring).value();
    s.owner = *owner;
    s.degraded.reset();
    if (auto st = s.client->status(); st.ok() && st->degraded()) {
      client::DegradedChange d;
      d.degraded = true;
      d.reason = st->degraded_reason.value_or("");
      s.degraded = d;
    }
    s.last_owner_check = std::chrono::steady_clock::now();
    connected_ = true;
  };

  std::vector<client::RingEvent> evs;
  while (!stop_) {
    const auto now = std::chrono::steady_clock::now();
    if (!s.ring && now >= s.next_connect) {
      connect();
      if (!s.ring) s.next_connect = now + opt_.reconnect_interval;
    }
    // Commands.
    std::vector<std::function<void(State&)>> cmds;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cmds.swap(commands_);
    }
    std::uint64_t drain;
    while (::read(wake_fd_, &drain, sizeof drain) > 0) {
    }
    for (auto& c : cmds) {
      c(s);
      release(std::move(c));  // the closure's copies of sinks and callbacks
    }
    if (!s.retry.empty() && s.ring) {
      auto retry = std::move(s.retry);
      s.retry.clear();
      for (auto& [r, sink] : retry) submit(r, std::move(sink));
    }
    // Streams waiting to resend refused audio.
    if (s.ring) {
      const auto t = std::chrono::steady_clock::now();
      for (auto& [job, st] : s.streams)
        if (st.resend_from != SIZE_MAX && t >= st.retry_at) send_audio(s, job, st, st.resend_from);
    }
    // tandemd's name: a new owner (restart) or none (stopped) ends the ring session.
    if (s.ring && std::chrono::steady_clock::now() - s.last_owner_check >= opt_.owner_check_interval) {
      s.last_owner_check = std::chrono::steady_clock::now();
      auto owner = name_owner();
      if (!owner || *owner != s.owner) drop(owner ? "tandemd restarted" : "tandemd stopped");
    }
    if (s.ring && !s.ring->open()) drop("the ring session ended: " + s.ring->state_text());
    if (!s.ring) {
      pollfd p{wake_fd_, POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(opt_.reconnect_interval.count()));
      if (s.client) (void)s.client->process(std::chrono::milliseconds(0));
      continue;
    }
    evs.clear();
    auto n = s.ring->wait(evs, std::chrono::milliseconds(100), wake_fd_);
    if (!n.ok()) {
      drop("the ring session failed: " + n.error().message);
      continue;
    }
    for (auto& ev : evs) {
      if (ev.kind == "accepted" && ev.accepted) {
        auto it = s.awaiting.find(ev.user_data);
        if (it == s.awaiting.end()) continue;
        auto& sink = s.jobs[ev.accepted->job_id];
        sink = std::move(it->second);
        s.awaiting.erase(it);
        // The service's degraded reason first, so the placement the client sees already names it.
        if (s.degraded) post_([sink, d = *s.degraded] { sink->degraded(d); });
        post_([sink, a = *ev.accepted] { sink->accepted(a); });
      } else if (ev.kind == "error" && ev.error) {
        if (auto au = s.audio_ud.find(ev.user_data); au != s.audio_ud.end()) {
          // A refused chunk: on backpressure, send it and the later ones again after the hint; otherwise the
          // job ends on tandemd's side (its "finished" says why).
          const auto [job, index] = au->second;
          s.audio_ud.erase(au);
          auto st = s.streams.find(job);
          if (st != s.streams.end() && ev.error->short_name() == "QueueFull") {
            st->second.resend_from = std::min(st->second.resend_from, index);
            st->second.retry_at = std::chrono::steady_clock::now() +
                                  std::chrono::milliseconds(ev.error->retry_after_ms.value_or(100));
          }
        } else if (auto it = s.awaiting.find(ev.user_data); it != s.awaiting.end()) {
          post_([sink = std::move(it->second), e = *ev.error] { sink->refused(e); });
          s.awaiting.erase(it);
        } else if (auto et = s.embeds.find(ev.user_data); et != s.embeds.end()) {
          post_([done = std::move(et->second), e = *ev.error] { done(Outcome<client::EmbedReply>::failure(e)); });
          s.embeds.erase(et);
        }
      } else if (ev.kind == "embedded" && ev.embedded) {
        if (auto et = s.embeds.find(ev.user_data); et != s.embeds.end()) {
          post_([done = std::move(et->second), r = std::move(*ev.embedded)] {
            done(Outcome<client::EmbedReply>::success(r));
          });
          s.embeds.erase(et);
        }
      } else if (ev.kind == "degraded_mode" && ev.degraded) {
        s.degraded = *ev.degraded;
        for (auto& [id, sink] : s.jobs) post_([sink = sink, d = *ev.degraded] { sink->degraded(d); });
      } else if (ev.update) {
        auto it = s.jobs.find(ev.job_id ? ev.job_id : ev.update->job_id);
        if (it == s.jobs.end()) continue;
        const bool fin = ev.update->kind == "finished";
        if (fin && !ev.update->text && s.client) {
          // The ring's "finished" carries no text (docs/rings.md): the whole text, as GetJob has it.
          if (auto j = s.client->get_job(it->first); j.ok() && j->text) ev.update->text = *j->text;
        }
        post_([sink = fin ? std::move(it->second) : it->second, u = *ev.update] { sink->update(u); });
        if (fin) {
          s.streams.erase(it->first);
          s.jobs.erase(it);
        }
      }
    }
    // D-Bus: signals for resumed jobs (and nothing else we act on).
    if (s.client) {
      auto p = s.client->process(std::chrono::milliseconds(0));
      for (auto id : s.forget) s.client->forget_job_updates(id);
      s.forget.clear();
      if (!p.ok()) {
        drop("the bus connection failed: " + p.error().message);
        s.client.reset();
        s.bus_proxy.reset();
      }
    }
  }
  drop("tandem-http is stopping");
}

}  // namespace tandem::http
