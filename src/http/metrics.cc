// Prometheus text exposition of the gateway's metrics (metrics.h).
#include "http/metrics.h"

#include <cstdio>

namespace tandem::http {

void Metrics::request(const std::string& endpoint, const std::string& route, int status) {
  ++requests_[{endpoint, route, status}];
}
void Metrics::tokens(const std::string& route, std::uint64_t n) { tokens_[route] += n; }
void Metrics::generation_seconds(const std::string& route, double s) {
  auto& e = gen_seconds_[route];
  e.first += s;
  ++e.second;
}
void Metrics::first_token_seconds(const std::string& route, double s) {
  auto& e = ttft_seconds_[route];
  e.first += s;
  ++e.second;
}

namespace {

// A label value with \, " and newline escaped.
std::string esc(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\' || c == '"') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

void head(std::string& o, const char* name, const char* type, const char* help) {
  o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

std::string Metrics::render(const std::optional<client::ServiceStatus>& st, bool link_up,
                            const std::vector<std::pair<std::string, std::vector<client::ReplicaInfo>>>& models) const {
  std::string o;
  head(o, "tandem_http_requests_total", "counter", "HTTP requests answered, by endpoint, route and status.");
  for (const auto& [k, n] : requests_) {
    const auto& [ep, route, status] = k;
    o += "tandem_http_requests_total{endpoint=\"" + esc(ep) + "\",route=\"" + esc(route) + "\",status=\"" +
         std::to_string(status) + "\"} " + std::to_string(n) + "\n";
  }
  head(o, "tandem_generation_tokens_total", "counter", "Tokens delivered to HTTP clients, by the route that made them.");
  for (const auto& [r, n] : tokens_) o += "tandem_generation_tokens_total{route=\"" + esc(r) + "\"} " + std::to_string(n) + "\n";
  head(o, "tandem_generation_seconds", "summary", "First token to last, per job, by route.");
  for (const auto& [r, e] : gen_seconds_) {
    o += "tandem_generation_seconds_sum{route=\"" + esc(r) + "\"} " + num(e.first) + "\n";
    o += "tandem_generation_seconds_count{route=\"" + esc(r) + "\"} " + std::to_string(e.second) + "\n";
  }
  head(o, "tandem_time_to_first_token_seconds", "summary", "Request to first token, by route.");
  for (const auto& [r, e] : ttft_seconds_) {
    o += "tandem_time_to_first_token_seconds_sum{route=\"" + esc(r) + "\"} " + num(e.first) + "\n";
    o += "tandem_time_to_first_token_seconds_count{route=\"" + esc(r) + "\"} " + std::to_string(e.second) + "\n";
  }
  head(o, "tandem_http_connections_total", "counter", "Connections accepted.");
  o += "tandem_http_connections_total " + std::to_string(connections_total_) + "\n";
  head(o, "tandem_http_connections", "gauge", "Connections open.");
  o += "tandem_http_connections " + std::to_string(connections_open_) + "\n";
  head(o, "tandem_http_streams", "gauge", "Generation requests in flight.");
  o += "tandem_http_streams " + std::to_string(streams_open_) + "\n";
  head(o, "tandem_http_refusals_total", "counter", "Requests or connections refused by the gateway's own limits.");
  for (const auto& [w, n] : refusals_) o += "tandem_http_refusals_total{reason=\"" + esc(w) + "\"} " + std::to_string(n) + "\n";
  head(o, "tandem_http_client_cancels_total", "counter", "Jobs cancelled because their HTTP client went away.");
  o += "tandem_http_client_cancels_total " + std::to_string(client_cancels_) + "\n";
  head(o, "tandem_up", "gauge", "1 when tandemd answered this scrape.");
  o += std::string("tandem_up ") + (st && link_up ? "1" : "0") + "\n";
  if (!st) return o;

  head(o, "tandem_degraded", "gauge", "1 while tandemd is degraded or unavailable (reason as a label).");
  o += "tandem_degraded{reason=\"" + esc(st->degraded_reason.value_or("")) + "\"} " + (st->degraded() ? "1" : "0") + "\n";
  if (st->state) {
    head(o, "tandem_state", "gauge", "tandemd's state: 1 for the current one.");
    for (const char* s : {"normal", "pressure", "degraded", "unavailable"})
      o += std::string("tandem_state{state=\"") + s + "\"} " + (*st->state == s ? "1" : "0") + "\n";
  }
  if (st->gpu_breaker) {
    head(o, "tandem_gpu_breaker", "gauge", "The GPU circuit breaker: 1 for its current state.");
    for (const char* s : {"closed", "open", "half_open"})
      o += std::string("tandem_gpu_breaker{state=\"") + s + "\"} " + (*st->gpu_breaker == s ? "1" : "0") + "\n";
  }
  if (st->queues) {
    head(o, "tandem_queue_depth", "gauge", "Jobs waiting, per queue.");
    for (const auto& q : *st->queues) o += "tandem_queue_depth{queue=\"" + esc(q.name) + "\"} " + std::to_string(q.depth) + "\n";
    head(o, "tandem_queue_capacity", "gauge", "Queue capacity.");
    for (const auto& q : *st->queues) o += "tandem_queue_capacity{queue=\"" + esc(q.name) + "\"} " + std::to_string(q.capacity) + "\n";
    head(o, "tandem_queue_running", "gauge", "Jobs running, per queue.");
    for (const auto& q : *st->queues) o += "tandem_queue_running{queue=\"" + esc(q.name) + "\"} " + std::to_string(q.running) + "\n";
    head(o, "tandem_queue_oldest_wait_seconds", "gauge", "Age of the oldest waiting job, per queue.");
    for (const auto& q : *st->queues)
      o += "tandem_queue_oldest_wait_seconds{queue=\"" + esc(q.name) + "\"} " + num(q.oldest_age_ms / 1000.0) + "\n";
  }
  if (st->memory) {
    const auto& m = *st->memory;
    head(o, "tandem_gpu_memory_bytes", "gauge", "Accelerator memory: total, free (observed), used by Tandem (observed), "
                                                "predicted by the ledger, foreign, margin.");
    auto g = [&](const char* kind, const std::optional<std::uint64_t>& v) {
      if (v) o += std::string("tandem_gpu_memory_bytes{kind=\"") + kind + "\"} " + std::to_string(*v) + "\n";
    };
    g("total", m.total);
    g("free", m.free);
    g("observed_used", m.observed_used);
    g("predicted_used", m.predicted_used);
    g("foreign", m.foreign);
    g("margin", m.margin);
    if (m.prediction_error) {
      head(o, "tandem_gpu_memory_prediction_error_bytes", "gauge", "Predicted minus observed bytes used by Tandem.");
      o += "tandem_gpu_memory_prediction_error_bytes " + std::to_string(*m.prediction_error) + "\n";
    }
  }
  if (st->host_memory && st->host_memory->used) {
    head(o, "tandem_host_memory_bytes", "gauge", "Host memory: used by jobs, budget.");
    o += "tandem_host_memory_bytes{kind=\"used\"} " + std::to_string(*st->host_memory->used) + "\n";
    if (st->host_memory->budget)
      o += "tandem_host_memory_bytes{kind=\"budget\"} " + std::to_string(*st->host_memory->budget) + "\n";
  }
  if (st->holds) {
    head(o, "tandem_gpu_holds", "gauge", "Applications holding Tandem off the GPU.");
    o += "tandem_gpu_holds " + std::to_string(st->holds->size()) + "\n";
  }
  if (!models.empty()) {
    // One series per replica, its current state and reason as labels (value 1): a GPU replica given back for a game
    // reads {device="gpu",state="evicted",reason="pressure"} (docs/residency.md).
    head(o, "tandem_replica_info", "gauge", "Each model's replicas: 1, with their device, residency state and reason.");
    for (const auto& [name, reps] : models)
      for (const auto& r : reps)
        o += "tandem_replica_info{model=\"" + esc(name) + "\",device=\"" + esc(r.device.value_or("")) + "\",state=\"" +
             esc(r.state.value_or("")) + "\",reason=\"" + esc(r.reason.value_or("")) + "\"} 1\n";
    head(o, "tandem_replica_bytes", "gauge", "Bytes each replica holds: on the accelerator (weights + KV pool), on the host.");
    for (const auto& [name, reps] : models)
      for (const auto& r : reps) {
        const std::string l = "model=\"" + esc(name) + "\",device=\"" + esc(r.device.value_or("")) + "\"";
        if (r.accel_bytes) o += "tandem_replica_bytes{" + l + ",on=\"accelerator\"} " + std::to_string(*r.accel_bytes) + "\n";
        if (r.host_bytes) o += "tandem_replica_bytes{" + l + ",on=\"host\"} " + std::to_string(*r.host_bytes) + "\n";
      }
  }
  return o;
}

}  // namespace tandem::http
