// The gateway's Prometheus metrics (GET /metrics, docs/http.md "Metrics"): its own counters (requests by endpoint,
// route and status; streamed tokens and time by route; connections, streams, refusals) and tandemd's state at the
// time of the scrape (queues, memory accounted and observed, breaker, degraded, each model's replicas: where they
// are, in which residency state and why, what they hold on the accelerator and the host). Names are prefixed tandem_ and
// follow the conventions vLLM and TGI use (_total counters, _seconds, _bytes). Single-threaded (the I/O thread).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "client/format.h"

namespace tandem::http {

class Metrics {
 public:
  void request(const std::string& endpoint, const std::string& route, int status);
  void tokens(const std::string& route, std::uint64_t n);
  void generation_seconds(const std::string& route, double s);  // first token to last
  void first_token_seconds(const std::string& route, double s);  // request to first token
  void connection_opened() { ++connections_total_, ++connections_open_; }
  void connection_closed() { --connections_open_; }
  void stream_opened() { ++streams_open_; }
  void stream_closed() { --streams_open_; }
  void refused(const std::string& why) { ++refusals_[why]; }  // limits, auth, timeouts
  void client_cancel() { ++client_cancels_; }

  std::uint64_t streams_open() const { return streams_open_; }
  // The exposition text (format 0.0.4). `status` is tandemd's at the scrape (absent: tandemd unreachable); `models`
  // its models with their details (Replicas), when they could be read.
  std::string render(const std::optional<client::ServiceStatus>& status, bool link_up,
                     const std::vector<std::pair<std::string, std::vector<client::ReplicaInfo>>>& models = {}) const;

 private:
  std::map<std::tuple<std::string, std::string, int>, std::uint64_t> requests_;
  std::map<std::string, std::uint64_t> tokens_;
  std::map<std::string, std::pair<double, std::uint64_t>> gen_seconds_, ttft_seconds_;  // sum, count
  std::map<std::string, std::uint64_t> refusals_;
  std::uint64_t connections_total_ = 0, connections_open_ = 0, streams_open_ = 0, client_cancels_ = 0;
};

}  // namespace tandem::http
