// The gateway's endpoints (docs/http.md): routes an HTTP exchange to its handler, maps it onto Backend calls and
// answers in the caller's API shape with Tandem's state attached. No sockets here: the connection layer (server.h,
// Boost.Beast) gives each request as an Exchange, and tests give fake ones.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "http/api.h"
#include "http/backend.h"
#include "http/metrics.h"
#include "http/responses.h"

namespace tandem::http {

// One request as the connection layer read it (header names lower-case).
struct RequestInfo {
  std::string method;
  std::string path;   // without the query
  std::string query;  // after '?', or ""
  std::map<std::string, std::string> headers;
  std::string body;
  std::string client;  // the caller's identity for limits and idempotency: the API key's name, or "local"
  std::string peer;    // address, for logs
};

// The response side of one request. A reply, or a stream (start, send..., end). on_close fires when the client
// goes away before the response ended (a closed connection, a write that failed or timed out).
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual const RequestInfo& request() const = 0;
  virtual void reply(int status, std::string content_type, std::string body, Headers headers) = 0;
  virtual void start_stream(int status, std::string content_type, Headers headers) = 0;
  virtual void send(std::string data) = 0;
  virtual void end_stream() = 0;
  virtual void on_close(std::function<void()> callback) = 0;
  virtual bool closed() const = 0;
};

struct GatewayConfig {
  BodyLimits body;
  std::size_t max_body_bytes = 8u << 20;      // JSON bodies
  std::size_t max_audio_bytes = 25u << 20;    // audio uploads (OpenAI's own limit is 25 MB)
  std::size_t max_streams_per_client = 64;    // generation/embedding requests in flight per client (429 beyond)
  std::vector<std::string> cors_origins;      // empty: no CORS headers at all
  std::string version = "0";                  // Tandem's version (tandem-http's)
  std::string ollama_version = "0.6.4";       // the Ollama API level answered by /api/version (docs/http.md)
  std::chrono::milliseconds models_ttl{2000}; // how long a ListModels answer is reused
};

class Gateway {
 public:
  Gateway(Backend& backend, GatewayConfig config);
  void handle(std::shared_ptr<Exchange> ex);
  Metrics& metrics() { return metrics_; }
  const GatewayConfig& config() const { return cfg_; }
  // The largest body the route takes (the connection layer reads no more).
  std::size_t body_limit(const std::string& method, const std::string& path) const;
  // CORS headers for a request's Origin (none unless it is configured).
  Headers cors_headers(const RequestInfo& r) const;
  // Public so the generation and embedding flows (gateway.cc) can reach them.
  void with_models(std::function<void(Outcome<std::vector<ModelEntry>>)> done);
  void error(const std::shared_ptr<Exchange>& ex, const std::string& endpoint, Flavor f, const ApiError& e);
  void json_reply(const std::shared_ptr<Exchange>& ex, const std::string& endpoint, const std::string& route,
                  int status, const nlohmann::json& body, Headers h = {});
  // Per-client in-flight counter (streams_per_client).
  bool take_slot(const std::string& client);
  void give_slot(const std::string& client);
  Backend& backend() { return backend_; }
  // Runs `fn` on the I/O thread after `delay` (the connection layer's timer; set by main and by tests). Without one,
  // `fn` runs at once.
  using Defer = std::function<void(std::chrono::milliseconds, std::function<void()>)>;
  void set_defer(Defer d) { defer_ = std::move(d); }
  void defer(std::chrono::milliseconds delay, std::function<void()> fn) {
    if (defer_) defer_(delay, std::move(fn));
    else fn();
  }
  // Which client a job was submitted by (through this gateway): /tandem/v1/jobs/{id} answers only its owner when
  // clients are told apart by API keys.
  void note_job(std::uint64_t job, const std::string& client);
  bool may_see_job(std::uint64_t job, const std::string& client) const;
  // Expires with the Gateway: handlers that tandemd's link may keep past it (at shutdown) check it.
  std::weak_ptr<void> life() const { return life_; }

 private:
  void route(const std::shared_ptr<Exchange>& ex);
  void generate(const std::shared_ptr<Exchange>& ex, Api api, const std::string& endpoint);
  void embeddings(const std::shared_ptr<Exchange>& ex, EmbedApi api, const std::string& endpoint);
  void transcriptions(const std::shared_ptr<Exchange>& ex, bool translate);  // gateway_audio.cc
  void openai_models(const std::shared_ptr<Exchange>& ex, const std::string& one);
  void ollama_tags(const std::shared_ptr<Exchange>& ex, bool ps);
  void ollama_show(const std::shared_ptr<Exchange>& ex);
  void health(const std::shared_ptr<Exchange>& ex);
  void metrics_endpoint(const std::shared_ptr<Exchange>& ex);
  void job_endpoint(const std::shared_ptr<Exchange>& ex, const std::string& rest);

  Backend& backend_;
  std::shared_ptr<int> life_ = std::make_shared<int>(0);
  Defer defer_;
  GatewayConfig cfg_;
  Metrics metrics_;
  std::map<std::string, std::size_t> in_flight_;
  std::map<std::uint64_t, std::string> job_owner_;  // bounded: the newest kMaxOwners jobs
  std::optional<std::vector<ModelEntry>> models_cache_;
  std::chrono::steady_clock::time_point models_at_{};
};

// The model an API call names, among those tandemd serves: exact name, else the name without an Ollama tag
// (":latest"), else "" for tandemd's default when `name` is empty. nullptr when none matches.
// An Idempotency-Key header scoped to the client ("http:<client>:<key>"), within tandemd's 240-byte limit.
ApiResult<std::string> scoped_key(const std::string& client, const std::string& key);

const ModelEntry* resolve_model(const std::vector<ModelEntry>& models, const std::string& name, bool embedding);

}  // namespace tandem::http
