// The connection layer on real loopback sockets (Boost.Beast underneath): keep-alive, header/body limits, the
// slow-header deadline, the connection cap, chunked streaming, authentication, and a client that hangs up while its
// job is queued being noticed without any write (its job is cancelled).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <utility>  // before Boost.Asio (1.74's awaitable.hpp needs std::exchange)

#include <boost/asio.hpp>
#include <chrono>
#include <string>

#include "fakes.h"
#include "http/auth.h"
#include "http/server.h"

namespace tandem::http {
namespace {

using namespace std::chrono_literals;

struct ServerTest : ::testing::Test {
  boost::asio::io_context io;
  testing::FakeBackend be;
  std::unique_ptr<Gateway> gw;
  std::unique_ptr<Server> srv;
  std::uint16_t port = 0;
  ServerLimits limits;
  AuthPolicy auth;

  void start() {
    ModelEntry m;
    m.info.name = "tiny";
    m.info.kind = "llm";
    be.model_list = {m};
    client::ServiceStatus st;
    st.state = "normal";
    be.service_status = st;
    gw = std::make_unique<Gateway>(be, GatewayConfig{});
    srv = std::make_unique<Server>(io, *gw, auth, limits);
    auto fd = listen_tcp("127.0.0.1", 0);
    ASSERT_TRUE(fd.ok());
    sockaddr_in a{};
    socklen_t len = sizeof a;
    ::getsockname(*fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    ASSERT_TRUE(srv->add_listener(*fd).ok());
  }
  int connect_client() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    return fd;
  }
  void put(int fd, const std::string& s) { ASSERT_EQ(::send(fd, s.data(), s.size(), MSG_NOSIGNAL), static_cast<ssize_t>(s.size())); }
  void spin(std::chrono::milliseconds d = 50ms) {
    io.restart();
    io.run_for(d);
  }
  // What the server sent so far (non-blocking read after spinning); eof set when it closed.
  std::string take(int fd, bool* eof = nullptr) {
    std::string out;
    char buf[65536];
    while (true) {
      ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        out.append(buf, static_cast<std::size_t>(n));
        continue;
      }
      if (n == 0 && eof) *eof = true;
      break;
    }
    return out;
  }
};

TEST_F(ServerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  start();
  int c = connect_client();
  put(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n");
  spin();
  spin();
  const std::string r = take(c);
  EXPECT_EQ(r.find("HTTP/1.1 200 OK"), 0u);
  EXPECT_NE(r.find("HTTP/1.1 200 OK", 10), std::string::npos) << r;
  EXPECT_NE(r.find("\"tiny\""), std::string::npos);
  ::close(c);
}

TEST_F(ServerTest, SlowHeadersAreCutAtTheDeadline) {
  limits.header_timeout = 150ms;
  start();
  int c = connect_client();
  put(c, "GET /health HTTP/1.1\r\nHost: x\r\n");  // never finishes its headers
  spin(400ms);
  bool eof = false;
  take(c, &eof);
  EXPECT_TRUE(eof);
  // Others are still served.
  int d = connect_client();
  put(d, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  spin();
  EXPECT_EQ(take(d).find("HTTP/1.1 200"), 0u);
  ::close(c);
  ::close(d);
}

TEST_F(ServerTest, HeaderAndBodyLimits) {
  limits.header_bytes = 20 * 1024;
  start();
  int ok = connect_client();  // 12 KiB of headers: within the limit (past any 8-KiB read buffer)
  put(ok, "GET /health HTTP/1.1\r\nX-Big: " + std::string(12 * 1024, 'a') + "\r\n\r\n");
  spin();
  EXPECT_EQ(take(ok).find("HTTP/1.1 200"), 0u);
  ::close(ok);
  int c = connect_client();
  put(c, "GET /health HTTP/1.1\r\nX-Big: " + std::string(24 * 1024, 'a') + "\r\n\r\n");
  spin();
  EXPECT_EQ(take(c).find("HTTP/1.1 431"), 0u);
  int d = connect_client();
  put(d, "POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n");
  spin();
  const std::string r = take(d);
  EXPECT_EQ(r.find("HTTP/1.1 413"), 0u) << r;
  int e = connect_client();
  put(e, "GARBAGE\r\n\r\n");
  spin();
  EXPECT_EQ(take(e).find("HTTP/1.1 400"), 0u);
  ::close(c);
  ::close(d);
  ::close(e);
}

TEST_F(ServerTest, ConnectionCapAnswers503) {
  limits.max_connections = 2;
  start();
  int a = connect_client(), b = connect_client();
  spin();
  int c = connect_client();
  spin();
  const std::string r = take(c);
  EXPECT_EQ(r.find("HTTP/1.1 503"), 0u) << r;
  EXPECT_NE(r.find("Retry-After: 1"), std::string::npos);
  ::close(a);
  ::close(b);
  ::close(c);
}

TEST_F(ServerTest, StreamsChunkedSse) {
  start();
  int c = connect_client();
  const std::string body = R"({"model":"tiny","messages":[{"role":"user","content":"Hi"}],"stream":true})";
  put(c, "POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: " +
             std::to_string(body.size()) + "\r\n\r\n" + body);
  spin();
  ASSERT_EQ(be.submitted.size(), 1u);
  client::SubmitResult s;
  s.job_id = 5;
  s.placement.route = "gpu";
  be.submitted[0].sink->accepted(s);
  client::JobUpdate t;
  t.job_id = 5;
  t.kind = "tokens";
  t.text = "hello";
  be.submitted[0].sink->update(t);
  client::JobUpdate f;
  f.job_id = 5;
  f.kind = "finished";
  f.state = "completed";
  f.finish_reason = "eos";
  be.submitted[0].sink->update(f);
  spin();
  const std::string r = take(c);
  EXPECT_NE(r.find("Transfer-Encoding: chunked"), std::string::npos) << r;
  EXPECT_NE(r.find("Tandem-Job: 5"), std::string::npos);
  EXPECT_NE(r.find("\"content\":\"hello\""), std::string::npos);
  EXPECT_NE(r.find("data: [DONE]"), std::string::npos);
  EXPECT_NE(r.find("\r\n0\r\n\r\n"), std::string::npos);  // the last chunk
  ::close(c);
}

TEST_F(ServerTest, HangUpWhileQueuedCancelsTheJob) {
  start();
  int c = connect_client();
  const std::string body = R"({"model":"tiny","messages":[{"role":"user","content":"Hi"}]})";
  put(c, "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  spin();
  ASSERT_EQ(be.submitted.size(), 1u);
  client::SubmitResult s;
  s.job_id = 77;
  s.placement.route = "gpu";
  s.placement.queue_position = 3;
  be.submitted[0].sink->accepted(s);
  spin();
  EXPECT_TRUE(be.cancelled.empty());
  ::close(c);  // nothing was written to this client yet: the server must notice by itself
  spin(100ms);
  EXPECT_EQ(be.cancelled, std::vector<std::uint64_t>{77});
}

TEST_F(ServerTest, KeysAreRequiredWhenConfigured) {
  auto ring = KeyRing::parse(KeyRing::line_for("ci", "k3y"));
  ASSERT_TRUE(ring.ok());
  auth.keys = &*ring;
  auth.loopback_without_key = false;
  start();
  int a = connect_client();
  put(a, "GET /v1/models HTTP/1.1\r\n\r\n");
  spin();
  const std::string ra = take(a);
  EXPECT_EQ(ra.find("HTTP/1.1 401"), 0u) << ra;
  EXPECT_NE(ra.find("WWW-Authenticate: Bearer"), std::string::npos);
  int b = connect_client();
  put(b, "GET /v1/models HTTP/1.1\r\nAuthorization: Bearer k3y\r\n\r\n");
  spin();
  EXPECT_EQ(take(b).find("HTTP/1.1 200"), 0u);
  int h = connect_client();
  put(h, "GET /health HTTP/1.1\r\n\r\n");  // health stays public
  spin();
  EXPECT_EQ(take(h).find("HTTP/1.1 200"), 0u);
  ::close(a);
  ::close(b);
  ::close(h);
}

}  // namespace
}  // namespace tandem::http
