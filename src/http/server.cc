// Connections of tandem-http (server.h): Beast parses, we frame the responses (fixed-length or chunked), and
// deadlines guard every phase.
#include "http/server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstring>
#include <deque>
#include <limits>
#include <set>

#include "http/auth.h"
#include "http/gateway.h"
#include "http/listeners.h"

namespace tandem::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using Proto = asio::generic::stream_protocol;
using error_code = boost::system::error_code;

namespace {

const char* reason_phrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Status";
  }
}

// Header values from our own strings: anything outside visible ASCII and space is dropped (no CR/LF injection).
std::string clean(const std::string& v) {
  std::string o;
  for (char c : v)
    if (c == ' ' || c == '\t' || (c > 0x20 && c < 0x7f)) o += c;
  return o;
}

std::string head_block(int status, const std::string& content_type, const Headers& headers, bool keep_alive,
                        std::optional<std::size_t> content_length) {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
  h += "Server: tandem-http\r\n";
  if (!content_type.empty()) h += "Content-Type: " + clean(content_type) + "\r\n";
  if (content_length) h += "Content-Length: " + std::to_string(*content_length) + "\r\n";
  else h += "Transfer-Encoding: chunked\r\n";
  h += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (const auto& [k, v] : headers) h += clean(k) + ": " + clean(v) + "\r\n";
  h += "\r\n";
  return h;
}

std::string peer_of(int fd, bool& loopback) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  loopback = false;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_UNIX) {
    loopback = true;
    return "unix";
  }
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    loopback = (ntohl(a->sin_addr.s_addr) >> 24) == 127;
    return buf;
  }
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    loopback = IN6_IS_ADDR_LOOPBACK(&a->sin6_addr) ||
               (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr) && a->sin6_addr.s6_addr[12] == 127);
    return buf;
  }
  return "?";
}

}  // namespace

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  asio::io_context& io;
  Gateway& gw;
  AuthPolicy auth;
  ServerLimits limits;
  Listeners listeners;
  std::size_t open = 0;

  std::weak_ptr<void> gw_life;  // connections held by pending handlers may outlive the Gateway at shutdown
  Impl(asio::io_context& i, Gateway& g, AuthPolicy a, ServerLimits l) : io(i), gw(g), auth(a), limits(l), gw_life(g.life()) {}
  void accept(Acceptor& acc);
};

namespace {

class Connection;

class ExchangeImpl : public Exchange {
 public:
  ExchangeImpl(std::weak_ptr<Connection> c, RequestInfo r) : conn_(std::move(c)), req_(std::move(r)) {}
  const RequestInfo& request() const override { return req_; }
  void reply(int status, std::string content_type, std::string body, Headers headers) override;
  void start_stream(int status, std::string content_type, Headers headers) override;
  void send(std::string data) override;
  void end_stream() override;
  void on_close(std::function<void()> cb) override { on_close_ = std::move(cb); }
  bool closed() const override { return closed_; }

  // From the connection: the client went away before the response ended.
  void fire_close() {
    if (closed_ || done_) return;
    closed_ = true;
    auto cb = std::move(on_close_);
    on_close_ = nullptr;
    if (cb) cb();
  }
  bool done() const { return done_; }

 private:
  std::weak_ptr<Connection> conn_;
  RequestInfo req_;
  std::function<void()> on_close_;
  bool closed_ = false, done_ = false, streaming_ = false;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<Server::Impl> srv, Proto::socket sock)
      : srv_(std::move(srv)), sock_(std::move(sock)), timer_(srv_->io) {
    peer_ = peer_of(sock_.native_handle(), loopback_);
  }
  ~Connection() {
    --srv_->open;
    if (!srv_->gw_life.expired()) srv_->gw.metrics().connection_closed();
  }

  void start() { read_header(srv_->limits.header_timeout); }
  void refuse_busy() {
    keep_alive_ = false;
    const std::string body = R"({"error":{"message":"tandem-http has max_connections connections open","type":"server_error","param":null,"code":"too_many_connections"}})";
    write_full(503, "application/json", body, {{"Retry-After", "1"}});
  }

  // Response framing, called by the ExchangeImpl of the current request.
  void write_full(int status, const std::string& ct, std::string body, const Headers& h) {
    const bool ka = keep_alive_ && !srv_->listeners.stopped();
    // HEAD: the headers GET would send, no body (a body would be read as the next response on a kept connection).
    enqueue(head_block(status, ct, h, ka, body.size()) + (head_request_ ? std::string() : body));
    response_done_ = true;
    keep_after_ = ka;
    pump();
  }
  void write_head(int status, const std::string& ct, const Headers& h) {
    enqueue(head_block(status, ct, h, keep_alive_, std::nullopt));
    pump();
  }
  void write_chunk(const std::string& data) {
    if (data.empty()) return;
    char len[32];
    std::snprintf(len, sizeof len, "%zx\r\n", data.size());
    enqueue(std::string(len) + data + "\r\n");
    pump();
  }
  void write_end() {
    enqueue("0\r\n\r\n");
    response_done_ = true;
    keep_after_ = keep_alive_ && !srv_->listeners.stopped();
    pump();
  }

 private:
  void arm(std::chrono::milliseconds d, const char* why) {
    const std::uint64_t gen = ++timer_gen_;
    timer_.expires_after(d);
    timer_.async_wait([self = shared_from_this(), gen, why](const error_code& ec) {
      if (ec || gen != self->timer_gen_) return;
      self->srv_->gw.metrics().refused(why);
      self->close();
    });
  }
  void disarm() {
    ++timer_gen_;
    timer_.cancel();
  }

  void read_header(std::chrono::milliseconds deadline) {
    head_request_ = false;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(srv_->limits.header_bytes));
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());  // checked per route once the header is in
    arm(deadline, "header_timeout");
    bhttp::async_read_header(sock_, buf_, *parser_, [self = shared_from_this()](const error_code& ec, std::size_t) {
      self->on_header(ec);
    });
  }

  void on_header(const error_code& ec) {
    if (ec) {
      if (ec == bhttp::error::header_limit) return fail_early(431, "the request headers exceed header_bytes");
      if (ec == asio::error::eof || ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
          ec == asio::error::bad_descriptor)
        return close();
      return fail_early(400, std::string("malformed HTTP request: ") + ec.message());
    }
    auto& req = parser_->get();
    keep_alive_ = req.keep_alive();
    head_request_ = req.method() == bhttp::verb::head;
    info_ = RequestInfo{};
    info_.method = std::string(req.method_string());
    std::string target(req.target());
    const auto q = target.find('?');
    info_.path = target.substr(0, q);
    if (q != std::string::npos) info_.query = target.substr(q + 1);
    for (const auto& f : req) {
      std::string name(f.name_string());
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      info_.headers[name] = std::string(f.value());
    }
    info_.peer = peer_;
    // Authentication before the body is read.
    info_.client = "local";
    const bool has_keys = srv_->auth.keys && !srv_->auth.keys->empty();
    // /health stays public (monitors), and so do CORS preflights (browsers send them without credentials).
    if (has_keys && info_.path != "/health" && info_.method != "OPTIONS") {
      auto it = info_.headers.find("authorization");
      std::optional<std::string> who;
      if (it != info_.headers.end()) who = srv_->auth.keys->authenticate(it->second);
      if (who) {
        info_.client = *who;
      } else if (!(loopback_ && srv_->auth.loopback_without_key && it == info_.headers.end())) {
        srv_->gw.metrics().refused("auth");
        return fail_early(401, "a valid API key is required (Authorization: Bearer KEY)");
      }
    }
    const std::size_t limit = srv_->gw.body_limit(info_.method, info_.path);
    if (auto len = parser_->content_length(); len && *len > limit) {
      srv_->gw.metrics().refused("body_bytes");
      return fail_early(limit == 0 ? 400 : 413, limit == 0 ? info_.method + " " + info_.path + " takes no body"
                                                          : "the body is larger than " + std::to_string(limit) +
                                                                " bytes, this endpoint's limit (max_body_bytes, or "
                                                                "max_audio_bytes for audio uploads)");
    }
    parser_->body_limit(limit);
    if (parser_->is_done()) return on_body({});
    arm(srv_->limits.body_timeout, "body_timeout");
    bhttp::async_read(sock_, buf_, *parser_, [self = shared_from_this()](const error_code& e, std::size_t) {
      self->on_body(e);
    });
  }

  void on_body(const error_code& ec) {
    if (ec) {
      if (ec == bhttp::error::body_limit) {
        srv_->gw.metrics().refused("body_bytes");
        return fail_early(413, "the body is larger than this endpoint takes (max_body_bytes, or max_audio_bytes for "
                               "audio uploads)");
      }
      if (ec == asio::error::operation_aborted || ec == asio::error::eof || ec == bhttp::error::partial_message ||
          ec == asio::error::connection_reset)
        return close();
      return fail_early(400, std::string("malformed HTTP body: ") + ec.message());
    }
    disarm();
    info_.body = std::move(parser_->get().body());
    response_done_ = false;
    auto ex = std::make_shared<ExchangeImpl>(weak_from_this(), std::move(info_));
    current_ = ex;
    watch_close();
    srv_->gw.handle(ex);
  }

  // An error answered before the Gateway sees the request; the connection closes after it.
  void fail_early(int status, const std::string& message) {
    keep_alive_ = false;
    const nlohmann::json body = {{"error", {{"message", message}, {"type", status == 401 ? "authentication_error" : "invalid_request_error"},
                                            {"param", nullptr}, {"code", nullptr}}}};
    Headers h;
    if (status == 401) h.emplace_back("WWW-Authenticate", "Bearer");
    write_full(status, "application/json", body.dump(), h);
  }

  // While a response is pending: notice the peer closing (EOF on a read that would not consume a request).
  void watch_close() {
    sock_.async_wait(Proto::socket::wait_read, [self = shared_from_this()](const error_code& ec) {
      if (ec || self->response_done_ || !self->current_) return;
      char c;
      const ssize_t n = ::recv(self->sock_.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return self->close();
      if (n < 0) return self->watch_close();
      // Data: a pipelined next request. It waits in the socket until this response ends.
    });
  }

  void enqueue(std::string s) {
    pending_ += s.size();
    out_.push_back(std::move(s));
    if (pending_ > srv_->limits.max_pending_bytes) {
      srv_->gw.metrics().refused("slow_reader");
      close();
    }
  }

  void pump() {
    if (writing_ || out_.empty() || closed_) return;
    writing_ = true;
    arm(srv_->limits.write_timeout, "write_timeout");
    asio::async_write(sock_, asio::buffer(out_.front()), [self = shared_from_this()](const error_code& ec, std::size_t n) {
      self->writing_ = false;
      if (ec) return self->close();
      self->pending_ -= n;
      self->out_.pop_front();
      if (!self->out_.empty()) return self->pump();
      self->disarm();
      if (self->response_done_) self->after_response();
    });
  }

  void after_response() {
    current_.reset();
    if (!keep_after_) {
      error_code ignored;
      sock_.shutdown(Proto::socket::shutdown_send, ignored);
      return close();
    }
    read_header(srv_->limits.idle_timeout);
  }

 public:
  void close() {
    if (closed_) return;
    closed_ = true;
    disarm();
    error_code ignored;
    sock_.close(ignored);
    if (auto ex = current_) {
      current_.reset();
      ex->fire_close();
    }
  }

 private:
  std::shared_ptr<Server::Impl> srv_;
  Proto::socket sock_;
  asio::steady_timer timer_;
  std::uint64_t timer_gen_ = 0;
  beast::flat_buffer buf_;  // grows up to the header limit (Beast's parser checks it) and per body piece
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  RequestInfo info_;
  std::shared_ptr<ExchangeImpl> current_;
  std::deque<std::string> out_;
  std::size_t pending_ = 0;
  bool head_request_ = false;
  bool writing_ = false, keep_alive_ = true, keep_after_ = true, response_done_ = true, closed_ = false, loopback_ = false;
  std::string peer_;
};

void ExchangeImpl::reply(int status, std::string content_type, std::string body, Headers headers) {
  if (done_ || streaming_) return;
  done_ = true;
  on_close_ = nullptr;  // breaks the cycle handler -> exchange -> handler
  if (closed_) return;
  if (auto c = conn_.lock()) c->write_full(status, content_type, std::move(body), headers);
}

void ExchangeImpl::start_stream(int status, std::string content_type, Headers headers) {
  if (done_ || streaming_ || closed_) return;
  streaming_ = true;
  if (auto c = conn_.lock()) c->write_head(status, content_type, headers);
}

void ExchangeImpl::send(std::string data) {
  if (!streaming_ || done_ || closed_) return;
  if (auto c = conn_.lock()) c->write_chunk(data);
}

void ExchangeImpl::end_stream() {
  if (!streaming_ || done_) return;
  done_ = true;
  on_close_ = nullptr;
  if (closed_) return;
  if (auto c = conn_.lock()) c->write_end();
}

}  // namespace

void Server::Impl::accept(Acceptor& acc) {
  acc.async_accept([self = shared_from_this(), &acc](const error_code& ec, Proto::socket sock) {
    if (self->listeners.stopped()) return;
    if (!ec) {
      Listeners::no_delay(sock);  // a placement event then a token must not wait for the client's delayed ACK
      ++self->open;
      self->gw.metrics().connection_opened();
      auto conn = std::make_shared<Connection>(self, std::move(sock));
      if (self->open > self->limits.max_connections) {
        self->gw.metrics().refused("max_connections");
        conn->refuse_busy();  // answered, not dropped: the client sees why and when to come back
      } else {
        conn->start();
      }
    }
    self->accept(acc);
  });
}

Server::Server(asio::io_context& io, Gateway& gateway, AuthPolicy auth, ServerLimits limits)
    : impl_(std::make_shared<Impl>(io, gateway, auth, limits)) {}

Server::~Server() { stop(); }

Result<void> Server::add_listener(int fd) {
  auto acc = impl_->listeners.adopt(impl_->io, fd);
  if (!acc.ok()) return fail(acc.error());
  impl_->accept(**acc);
  return {};
}

void Server::stop() { impl_->listeners.close_all(); }

std::size_t Server::connections() const { return impl_->open; }

Result<int> listen_tcp(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string h = host == "localhost" ? "127.0.0.1" : host;
  if (int rc = ::getaddrinfo(h.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
    return fail(Errc::invalid_argument, "listen address " + host + ": " + gai_strerror(rc));
  int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ::freeaddrinfo(res);
    return fail(Errc::io_error, std::string("socket: ") + std::strerror(errno));
  }
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
    const std::string why = std::strerror(errno);
    ::freeaddrinfo(res);
    ::close(fd);
    return fail(Errc::io_error, "cannot listen on " + host + ":" + std::to_string(port) + ": " + why);
  }
  ::freeaddrinfo(res);
  return fd;
}

Result<int> listen_unix(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof a.sun_path) return fail(Errc::invalid_argument, "unix socket path too long: " + path);
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  struct stat st{};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return fail(Errc::invalid_argument, path + " exists and is not a socket");
    ::unlink(path.c_str());
  }
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(Errc::io_error, std::string("socket: ") + std::strerror(errno));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 128) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return fail(Errc::io_error, "cannot listen on " + path + ": " + why);
  }
  ::chmod(path.c_str(), 0660);
  return fd;
}

bool is_loopback_listener(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return false;
  if (ss.ss_family == AF_UNIX) return true;
  if (ss.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<sockaddr_in*>(&ss)->sin_addr.s_addr) >> 24) == 127;
  if (ss.ss_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr);
  return false;
}

}  // namespace tandem::http
