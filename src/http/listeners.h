// The listening sockets of tandem-http's servers (HTTP and Wyoming), shared by server.cc and wyoming_server.cc:
// adopting a passed or bound listening fd as an Asio acceptor, closing them, and TCP_NODELAY on accepted
// connections (small event writes must not wait for the peer's delayed ACK). Internal; includes Boost.Asio.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <utility>  // before Boost.Asio (1.74's awaitable.hpp needs std::exchange)

#include <boost/asio.hpp>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"

namespace tandem::http {

using StreamProto = boost::asio::generic::stream_protocol;
using Acceptor = boost::asio::basic_socket_acceptor<StreamProto>;

class Listeners {
 public:
  // A listening stream socket (AF_INET, AF_INET6, AF_UNIX), owned from now on. Errors: invalid_argument.
  Result<Acceptor*> adopt(boost::asio::io_context& io, int fd) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
      return fail(Errc::invalid_argument, "fd " + std::to_string(fd) + " is not a socket");
    int type = 0;
    socklen_t tl = sizeof type;
    if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM)
      return fail(Errc::invalid_argument, "fd " + std::to_string(fd) + " is not a stream socket");
    auto acc = std::make_unique<Acceptor>(io);
    boost::system::error_code ec;
    acc->assign(StreamProto(ss.ss_family, 0), fd, ec);
    if (ec) return fail(Errc::invalid_argument, "fd " + std::to_string(fd) + ": " + ec.message());
    all_.push_back(std::move(acc));
    return all_.back().get();
  }
  void close_all() {
    stopped_ = true;
    for (auto& a : all_) {
      boost::system::error_code ignored;
      a->close(ignored);
    }
  }
  bool stopped() const { return stopped_; }

  static void no_delay(StreamProto::socket& s) {
    const int fam = s.local_endpoint().protocol().family();
    if (fam != AF_INET && fam != AF_INET6) return;
    int one = 1;
    ::setsockopt(s.native_handle(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }

 private:
  std::vector<std::unique_ptr<Acceptor>> all_;
  bool stopped_ = false;
};

}  // namespace tandem::http
