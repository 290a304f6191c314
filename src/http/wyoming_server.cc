// Wyoming connections (wyoming_server.h).
#include "http/wyoming_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <utility>  // before Boost.Asio (1.74's awaitable.hpp needs std::exchange)

#include <boost/asio.hpp>
#include <deque>

#include "http/backend.h"
#include "http/listeners.h"

namespace tandem::http {

namespace asio = boost::asio;
using Proto = asio::generic::stream_protocol;
using error_code = boost::system::error_code;

struct WyomingServer::Impl : std::enable_shared_from_this<WyomingServer::Impl> {
  asio::io_context& io;
  Backend& backend;
  WyomingServerLimits limits;
  std::string version;
  Listeners listeners;
  std::size_t open = 0;
  Impl(asio::io_context& i, Backend& b, WyomingServerLimits l, std::string v)
      : io(i), backend(b), limits(l), version(std::move(v)) {}
  void accept(Acceptor& acc);
};

namespace {

class WyomingConnection;

// tandemd's events for the connection's current job.
class WyomingSink : public JobSink {
 public:
  explicit WyomingSink(std::weak_ptr<WyomingConnection> c) : conn_(std::move(c)) {}
  void accepted(const client::SubmitResult& s) override;
  void update(const client::JobUpdate& u) override;
  void degraded(const client::DegradedChange&) override {}
  void refused(const client::RemoteError& e) override;
  void lost(const std::string& why) override;

 private:
  std::weak_ptr<WyomingConnection> conn_;
};

class WyomingConnection : public std::enable_shared_from_this<WyomingConnection> {
 public:
  WyomingConnection(std::shared_ptr<WyomingServer::Impl> srv, Proto::socket sock)
      : srv_(std::move(srv)), sock_(std::move(sock)), timer_(srv_->io), reader_(srv_->limits.framing) {}
  ~WyomingConnection() { --srv_->open; }

  void start() { read(); }

  void refuse_busy() {
    write(wyoming_encode(wyoming_error("tandem-http has max_connections Wyoming connections open", "busy")));
    closing_ = true;
  }

  // From the job's sink.
  void job_accepted(std::uint64_t job) {
    job_ = job;
    if (closed_) return srv_->backend.cancel(job);
    for (auto& [pcm, end] : pending_) srv_->backend.audio(job, std::move(pcm), end);
    pending_.clear();
  }
  void job_update(const client::JobUpdate& u) {
    if (u.kind == "segment" && u.text) act(session_.on_segment(*u.text));
    if (u.kind != "finished") return;
    job_ = 0;
    running_ = false;
    if (u.state.value_or("") == "completed") act(session_.on_finished(u.text.value_or(""), u.language.value_or("")));
    else act(session_.on_failed("the transcription " + u.state.value_or("failed") + ": " + u.error_message.value_or(u.reason.value_or("")),
                                u.error_code.value_or("failed")));
    arm_idle();
  }
  void job_failed(const std::string& message, const std::string& code) {
    job_ = 0;
    running_ = false;
    act(session_.on_failed(message, code));
  }

 private:
  void read() {
    arm_idle();
    sock_.async_read_some(asio::buffer(in_), [self = shared_from_this()](const error_code& ec, std::size_t n) {
      if (ec) return self->close();
      if (auto f = self->reader_.feed(std::string_view(self->in_.data(), n)); !f.ok()) return self->protocol_error(f.error().message);
      while (!self->closing_) {
        auto e = self->reader_.next();
        if (!e.ok()) return self->protocol_error(e.error().message);
        if (!*e) break;
        self->act(self->session_.on_event(**e));
      }
      if (!self->closing_) self->read();
    });
  }

  void protocol_error(const std::string& why) {
    act({WyomingAction{WyomingAction::Kind::close, wyoming_error(why, "protocol"), {}, {}, false}});
  }

  void act(const std::vector<WyomingAction>& actions) {
    for (const auto& a : actions) {
      if (closing_) return;
      switch (a.kind) {
        case WyomingAction::Kind::send: write(wyoming_encode(a.event)); break;
        case WyomingAction::Kind::close:
          write(wyoming_encode(a.event));
          closing_ = true;
          if (job_) srv_->backend.cancel(job_);
          break;
        case WyomingAction::Kind::describe:
          srv_->backend.models([self = shared_from_this()](Outcome<std::vector<ModelEntry>> o) {
            if (self->closed_) return;
            if (!o.ok()) return self->act({WyomingAction{WyomingAction::Kind::send, wyoming_error("tandemd is not reachable: " + o.error.describe(), "unavailable"), {}, {}, false}});
            std::vector<client::ModelInfo> ms;
            for (const auto& m : *o.value) ms.push_back(m.info);
            self->write(wyoming_encode(wyoming_info(ms, self->srv_->version)));
          });
          break;
        case WyomingAction::Kind::start_stream:
          running_ = true;
          srv_->backend.transcribe_stream(a.request, std::make_shared<WyomingSink>(weak_from_this()));
          break;
        case WyomingAction::Kind::audio:
          if (job_) srv_->backend.audio(job_, a.pcm, a.end);
          else pending_.emplace_back(a.pcm, a.end);
          break;
      }
    }
  }

  void write(std::string bytes) {
    out_.push_back(std::move(bytes));
    if (!writing_) pump();
  }
  void pump() {
    if (out_.empty() || closed_) {
      if (closing_ && out_.empty()) close();
      return;
    }
    writing_ = true;
    asio::async_write(sock_, asio::buffer(out_.front()), [self = shared_from_this()](const error_code& ec, std::size_t) {
      self->writing_ = false;
      if (ec) return self->close();
      self->out_.pop_front();
      self->pump();
    });
  }

  void arm_idle() {
    const std::uint64_t gen = ++timer_gen_;
    timer_.expires_after(srv_->limits.idle_timeout);
    timer_.async_wait([self = shared_from_this(), gen](const error_code& ec) {
      if (ec || gen != self->timer_gen_ || self->running_) return;
      self->protocol_error("no event for " + std::to_string(self->srv_->limits.idle_timeout.count()) + " ms");
    });
  }

 public:
  void close() {
    if (closed_) return;
    closed_ = true;
    ++timer_gen_;
    timer_.cancel();
    error_code ignored;
    sock_.close(ignored);
    if (job_) srv_->backend.cancel(job_);  // the client went away mid-utterance
  }

 private:
  std::shared_ptr<WyomingServer::Impl> srv_;
  Proto::socket sock_;
  asio::steady_timer timer_;
  std::uint64_t timer_gen_ = 0;
  std::array<char, 16384> in_{};
  WyomingReader reader_;
  WyomingSession session_;
  std::deque<std::string> out_;
  std::vector<std::pair<std::string, bool>> pending_;  // audio before the job was accepted
  std::uint64_t job_ = 0;
  bool writing_ = false, closing_ = false, closed_ = false, running_ = false;
};

void WyomingSink::accepted(const client::SubmitResult& s) {
  if (auto c = conn_.lock()) c->job_accepted(s.job_id);
}
void WyomingSink::update(const client::JobUpdate& u) {
  if (auto c = conn_.lock()) c->job_update(u);
}
void WyomingSink::refused(const client::RemoteError& e) {
  if (auto c = conn_.lock()) c->job_failed("tandemd refused the transcription: " + e.describe(), e.short_name());
}
void WyomingSink::lost(const std::string& why) {
  if (auto c = conn_.lock()) c->job_failed("lost tandemd: " + why, "unavailable");
}

}  // namespace

void WyomingServer::Impl::accept(Acceptor& acc) {
  acc.async_accept([self = shared_from_this(), &acc](const error_code& ec, Proto::socket sock) {
    if (self->listeners.stopped()) return;
    if (!ec) {
      Listeners::no_delay(sock);
      ++self->open;
      auto conn = std::make_shared<WyomingConnection>(self, std::move(sock));
      if (self->open > self->limits.max_connections) conn->refuse_busy();
      else conn->start();
    }
    self->accept(acc);
  });
}

WyomingServer::WyomingServer(asio::io_context& io, Backend& backend, WyomingServerLimits limits, std::string version)
    : impl_(std::make_shared<Impl>(io, backend, limits, std::move(version))) {}

WyomingServer::~WyomingServer() { stop(); }

Result<void> WyomingServer::add_listener(int fd) {
  auto acc = impl_->listeners.adopt(impl_->io, fd);
  if (!acc.ok()) return fail(acc.error());
  impl_->accept(**acc);
  return {};
}

void WyomingServer::stop() { impl_->listeners.close_all(); }

}  // namespace tandem::http
