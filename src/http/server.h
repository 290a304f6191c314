// tandem-http's connections (docs/http.md "Limits"): listening sockets (TCP or unix, from socket activation or bound
// by tandem-http), HTTP/1.1 parsing with Boost.Beast (header and body limits before anything is buffered), deadlines
// for headers, bodies, idle keep-alive and stalled writers (slowloris), a cap on connections, authentication, and
// each request handed to the Gateway as an Exchange. A closed connection is noticed while a job runs (not only when
// a write fails) and reported to the Exchange's on_close. Single-threaded: one io_context thread runs everything.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/result.h"

namespace boost::asio {
class io_context;
}

namespace tandem::http {

class Gateway;
class KeyRing;

struct ServerLimits {
  std::size_t header_bytes = 16 * 1024;
  std::chrono::milliseconds header_timeout{10000};  // request line and headers, from the first byte's wait
  std::chrono::milliseconds body_timeout{120000};   // the whole body
  std::chrono::milliseconds idle_timeout{60000};    // keep-alive wait for the next request
  std::chrono::milliseconds write_timeout{30000};   // a write that makes no progress (a reader that stopped)
  std::size_t max_connections = 512;
  std::size_t max_pending_bytes = 8u << 20;  // queued for a slow reader before the connection is cut
};

struct AuthPolicy {
  const KeyRing* keys = nullptr;      // none / empty: no keys (every caller is "local")
  bool loopback_without_key = true;   // with keys: loopback and unix-socket callers may omit one ("local")
};

class Server {
 public:
  Server(boost::asio::io_context& io, Gateway& gateway, AuthPolicy auth, ServerLimits limits);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  // A listening socket (SOCK_STREAM, AF_INET/AF_INET6/AF_UNIX), owned from now on. Errors: invalid_argument.
  Result<void> add_listener(int fd);
  void stop();  // stops accepting; open connections finish
  std::size_t connections() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// A listening TCP socket on host:port (numeric IPv4/IPv6 or "localhost"), SO_REUSEADDR. Errors: io_error.
Result<int> listen_tcp(const std::string& host, std::uint16_t port);
// A listening unix socket at `path` (replaces a stale socket file), mode 0660.
Result<int> listen_unix(const std::string& path);
// Whether a listening socket's address is loopback (127.0.0.0/8, ::1) or a unix socket.
bool is_loopback_listener(int fd);

}  // namespace tandem::http
