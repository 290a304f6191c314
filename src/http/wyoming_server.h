// tandem-http's Wyoming listener (Home Assistant speech-to-text, default port 10300; docs/http.md "Wyoming"): each
// connection is a WyomingSession (wyoming.h) whose audio goes to tandemd's live-stream Transcribe through the
// Backend, resampled and windowed by tandemd as it arrives. Limits: the framing limits, a cap on connections, an idle
// timeout between events. A connection that closes mid-utterance cancels its job. Single-threaded (the io thread).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/result.h"
#include "http/wyoming.h"

namespace boost::asio {
class io_context;
}

namespace tandem::http {

class Backend;

struct WyomingServerLimits {
  WyomingLimits framing;
  std::size_t max_connections = 64;
  std::chrono::milliseconds idle_timeout{60000};  // no event for this long (outside a running job): closed
};

class WyomingServer {
 public:
  WyomingServer(boost::asio::io_context& io, Backend& backend, WyomingServerLimits limits, std::string version);
  ~WyomingServer();
  WyomingServer(const WyomingServer&) = delete;
  WyomingServer& operator=(const WyomingServer&) = delete;
  Result<void> add_listener(int fd);  // a listening stream socket (TCP or unix)
  void stop();
  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace tandem::http
