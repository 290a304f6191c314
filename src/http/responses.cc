// Job views, Tandem's state and the OpenAI / Ollama response shapes (responses.h).
#include "http/responses.h"

#include <cmath>
#include <cstring>
#include <ctime>

namespace tandem::http {

using nlohmann::json;

// ---------------------------------------------------------------------------------------------------------------
// JobView

void JobView::accepted(const client::SubmitResult& s) {
  job_ = s.job_id;
  const auto& p = s.placement;
  if (p.route) route_ = *p.route;
  if (p.queue) queue_ = *p.queue;
  if (p.reason) reason_ = *p.reason;
  if (p.model) model_ = *p.model;
  if (p.fallback_model) fallback_ = *p.fallback_model;
  if (p.degraded) degraded_ = *p.degraded;
  if (p.queue_position) queue_position_ = *p.queue_position;
  if (p.eta_ms) eta_ms_ = *p.eta_ms;
  if (p.expected_slowdown) slowdown_ = *p.expected_slowdown;
  if (p.prompt_tokens) prompt_tokens_ = *p.prompt_tokens;
  if (p.state) state_ = *p.state;
  if (!route_.empty()) routes_ = {route_};
}

bool JobView::update(const client::JobUpdate& u) {
  const auto before = std::make_tuple(route_, degraded_, fallback_, model_);
  auto take_route = [&] {
    if (u.route && *u.route != route_) {
      route_ = *u.route;
      routes_.push_back(route_);
    }
    if (u.reason) reason_ = *u.reason;
    if (u.model) model_ = *u.model;
    if (u.fallback_model) fallback_ = *u.fallback_model;
    if (u.degraded) degraded_ = *u.degraded;
    if (u.queue) queue_ = *u.queue;
    if (u.queue_position) queue_position_ = *u.queue_position;
    if (u.eta_ms) eta_ms_ = *u.eta_ms;
  };
  if (u.kind == "routed" || u.kind == "started") {
    take_route();
    if (u.kind == "started") queue_position_ = 0;
  } else if (u.kind == "migrated") {
    if (u.to && *u.to != route_) {
      route_ = *u.to;
      routes_.push_back(route_);
    }
    if (u.reason) reason_ = *u.reason;
    degraded_ = degraded_ || route_ != "gpu";
  } else if (u.kind == "tokens") {
    if (u.text) text_ += *u.text;
    if (u.tokens) completion_tokens_ += static_cast<std::uint32_t>(u.tokens->size());
  } else if (u.kind == "finished") {
    finished_ = true;
    if (u.state) state_ = *u.state;
    if (u.finish_reason) finish_reason_ = *u.finish_reason;
    if (u.text && u.text->size() >= text_.size()) text_ = *u.text;
    if (u.tokens_total) completion_tokens_ = *u.tokens_total;
    if (u.error_code) error_code_ = *u.error_code;
    if (u.error_message) error_message_ = *u.error_message;
    if (u.retry_after_ms) retry_after_ms_ = *u.retry_after_ms;
    if (u.reason && finish_reason_.empty()) reason_ = *u.reason;
  }
  return before != std::make_tuple(route_, degraded_, fallback_, model_);
}

bool JobView::degraded_change(const client::DegradedChange& d) {
  const auto before = std::make_tuple(degraded_reason_, slowdown_);
  degraded_reason_ = d.degraded ? d.reason : std::string();
  if (d.expected_slowdown && d.degraded) slowdown_ = d.expected_slowdown;
  // The service's mode says nothing new about a job placed on the GPU.
  return route_ != "gpu" && before != std::make_tuple(degraded_reason_, slowdown_);
}

std::string JobView::take_unsent() {
  if (sent_ >= text_.size()) return {};
  std::string s = text_.substr(sent_);
  sent_ = text_.size();
  return s;
}

ApiError JobView::failure(bool resumable) const {
  ApiError e;
  if (state_ == "cancelled") {
    e.status = 409;
    e.type = "invalid_request_error";
    e.code = "cancelled";
    e.message = "job " + std::to_string(job_) + " was cancelled";
    return e;
  }
  e.status = 503;
  e.type = "server_error";
  e.code = "resumable";
  e.job = job_;
  e.retry_after_ms = retry_after_ms_.value_or(1000);
  e.message = "job " + std::to_string(job_) + " failed" + (error_code_.empty() ? "" : " (" + error_code_ + ")") +
              (error_message_.empty() ? "" : ": " + error_message_) + "; resume it with POST " + resume_path(job_);
  if (error_code_ == "Timeout") {
    e.status = 504;
    e.code = "timeout";
  }
  if (!resumable) {
    e.job.reset();
    e.code = e.status == 504 ? "timeout" : "failed";
    e.message = "job " + std::to_string(job_) + " failed" + (error_code_.empty() ? "" : " (" + error_code_ + ")") +
                (error_message_.empty() ? "" : ": " + error_message_) + "; send the request again";
  }
  return e;
}

Headers JobView::headers() const {
  Headers h;
  h.emplace_back("Tandem-Job", std::to_string(job_));
  if (!route_.empty()) h.emplace_back("Tandem-Route", route_);
  if (degraded_)
    h.emplace_back("Tandem-Degraded", !degraded_reason_.empty() ? degraded_reason_ : reason_.empty() ? "degraded" : reason_);
  h.emplace_back("Tandem-Queue-Position", std::to_string(queue_position_));
  h.emplace_back("Tandem-ETA-Ms", std::to_string(eta_ms_));
  if (!model_.empty()) h.emplace_back("Tandem-Model", model_);
  return h;
}

json JobView::tandem_json() const {
  json t = {{"job", job_},
            {"route", route_},
            {"degraded", degraded_},
            {"reason", reason_},
            {"degraded_reason", degraded_ ? degraded_reason_ : std::string()},
            {"model", model_},
            {"fallback_model", fallback_},
            {"queue", queue_},
            {"queue_position", queue_position_},
            {"eta_ms", eta_ms_},
            {"routes", routes_}};
  if (slowdown_) t["expected_slowdown"] = *slowdown_;
  return t;
}

std::string openai_finish_reason(const std::string& r) {
  if (r == "max_tokens" || r == "context_full") return "length";
  return "stop";
}

// ---------------------------------------------------------------------------------------------------------------
// Bodies

std::string rfc3339_ns(std::int64_t unix_ns) {
  const std::time_t secs = static_cast<std::time_t>(unix_ns / 1000000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%09lldZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(unix_ns % 1000000000));
  return buf;
}

namespace {

bool is_ollama(Api a) { return a == Api::ollama_chat || a == Api::ollama_generate; }

json ollama_base(const ResponseMeta& m, std::int64_t now_ns) {
  return {{"model", m.model}, {"created_at", rfc3339_ns(now_ns)}};
}

void ollama_counts(json& j, const ResponseMeta& m, const JobView& v, std::int64_t now_ns) {
  const std::int64_t start = m.started_unix_ns;
  const std::int64_t first = m.first_token_unix_ns ? m.first_token_unix_ns : now_ns;
  j["done_reason"] = openai_finish_reason(v.finish_reason());
  j["total_duration"] = now_ns - start;
  j["load_duration"] = 0;  // Tandem's replicas are loaded before jobs reach them
  if (v.prompt_tokens()) j["prompt_eval_count"] = *v.prompt_tokens();
  j["prompt_eval_duration"] = first - start;
  j["eval_count"] = v.completion_tokens();
  j["eval_duration"] = now_ns - first;
}

}  // namespace

json usage_json(const JobView& v) {
  const std::uint32_t p = v.prompt_tokens().value_or(0);
  return {{"prompt_tokens", p}, {"completion_tokens", v.completion_tokens()},
          {"total_tokens", p + v.completion_tokens()}};
}

json completion_body(const ResponseMeta& m, const JobView& v) {
  if (is_ollama(m.api)) {
    struct timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    const std::int64_t now_ns = static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
    json j = ollama_base(m, now_ns);
    if (m.api == Api::ollama_chat) j["message"] = {{"role", "assistant"}, {"content", v.text()}};
    else j["response"] = v.text();
    j["done"] = true;
    ollama_counts(j, m, v, now_ns);
    j["tandem"] = v.tandem_json();
    return j;
  }
  json choice = {{"index", 0}, {"finish_reason", openai_finish_reason(v.finish_reason())}};
  if (m.api == Api::openai_chat) {
    choice["message"] = {{"role", "assistant"}, {"content", v.text()}, {"refusal", nullptr}};
    choice["logprobs"] = nullptr;
  } else {
    choice["text"] = v.text();
    choice["logprobs"] = nullptr;
  }
  return {{"id", m.id},
          {"object", m.api == Api::openai_chat ? "chat.completion" : "text_completion"},
          {"created", m.created},
          {"model", m.model},
          {"system_fingerprint", nullptr},
          {"choices", json::array({choice})},
          {"usage", usage_json(v)},
          {"tandem", v.tandem_json()}};
}

json stream_chunk(const ResponseMeta& m, const std::string& text, bool first) {
  if (is_ollama(m.api)) {
    struct timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    json j = ollama_base(m, static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec);
    if (m.api == Api::ollama_chat) j["message"] = {{"role", "assistant"}, {"content", text}};
    else j["response"] = text;
    j["done"] = false;
    return j;
  }
  json choice = {{"index", 0}, {"finish_reason", nullptr}, {"logprobs", nullptr}};
  if (m.api == Api::openai_chat) {
    json delta = {{"content", text}};
    if (first) delta["role"] = "assistant";
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = text;
  }
  return {{"id", m.id},
          {"object", m.api == Api::openai_chat ? "chat.completion.chunk" : "text_completion"},
          {"created", m.created},
          {"model", m.model},
          {"system_fingerprint", nullptr},
          {"choices", json::array({choice})}};
}

json stream_final(const ResponseMeta& m, const JobView& v, std::int64_t now_unix_ns) {
  if (is_ollama(m.api)) {
    json j = ollama_base(m, now_unix_ns);
    if (m.api == Api::ollama_chat) j["message"] = {{"role", "assistant"}, {"content", ""}};
    else j["response"] = "";
    j["done"] = true;
    ollama_counts(j, m, v, now_unix_ns);
    j["tandem"] = v.tandem_json();
    return j;
  }
  json j = stream_chunk(m, "", false);
  auto& choice = j["choices"][0];
  if (m.api == Api::openai_chat) choice["delta"] = json::object();
  choice["finish_reason"] = openai_finish_reason(v.finish_reason());
  return j;
}

json usage_chunk(const ResponseMeta& m, const JobView& v) {
  json j = stream_chunk(m, "", false);
  j["choices"] = json::array();
  j["usage"] = usage_json(v);
  return j;
}

std::string sse_data(const json& j) { return "data: " + j.dump() + "\n\n"; }
std::string sse_comment(const json& j) { return ": tandem " + j.dump() + "\n\n"; }

// ---------------------------------------------------------------------------------------------------------------
// Embeddings

Headers embed_headers(const client::EmbedInfo& info) {
  Headers h;
  if (info.job_id) h.emplace_back("Tandem-Job", std::to_string(*info.job_id));
  if (info.route) h.emplace_back("Tandem-Route", *info.route);
  if (info.degraded && *info.degraded) h.emplace_back("Tandem-Degraded", info.route.value_or("cpu") == "gpu" ? "degraded" : "cpu-route");
  h.emplace_back("Tandem-Queue-Position", "0");
  if (info.queued_ms) h.emplace_back("Tandem-Queued-Ms", std::to_string(*info.queued_ms));
  if (info.model) h.emplace_back("Tandem-Model", *info.model);
  return h;
}

json embed_tandem_json(const client::EmbedInfo& info) {
  json t = client::to_json(info);
  t.erase("job_id");
  if (info.job_id) t["job"] = *info.job_id;
  return t;
}

json embed_body(const EmbedCall& call, const EmbedResult& r, std::uint64_t total_ns) {
  std::vector<std::vector<float>> vecs = r.vectors;
  if (call.dimensions) {
    for (auto& v : vecs) {
      if (*call.dimensions >= v.size()) continue;
      v.resize(*call.dimensions);
      double n = 0;
      for (float x : v) n += static_cast<double>(x) * x;
      n = std::sqrt(n);
      if (n > 0)
        for (float& x : v) x = static_cast<float>(x / n);
    }
  }
  const std::string model = call.model;
  const std::uint64_t tokens = r.info.text_tokens.value_or(0);  // the text tower's tokens (images have none to count)
  if (call.api == EmbedApi::ollama_legacy)
    return {{"embedding", vecs.empty() ? std::vector<float>{} : vecs[0]}, {"tandem", embed_tandem_json(r.info)}};
  if (call.api == EmbedApi::ollama_embed)
    return {{"model", model},
            {"embeddings", vecs},
            {"total_duration", total_ns},
            {"load_duration", 0},
            {"prompt_eval_count", tokens},
            {"tandem", embed_tandem_json(r.info)}};
  json data = json::array();
  for (std::size_t i = 0; i < vecs.size(); ++i) {
    json e = {{"object", "embedding"}, {"index", i}};
    if (call.base64) {
      std::vector<std::uint8_t> bytes(vecs[i].size() * 4);
      std::memcpy(bytes.data(), vecs[i].data(), bytes.size());  // little-endian hosts only (x86-64, arm64)
      e["embedding"] = base64_encode(bytes.data(), bytes.size());
    } else {
      e["embedding"] = vecs[i];
    }
    data.push_back(std::move(e));
  }
  return {{"object", "list"},
          {"data", std::move(data)},
          {"model", model},
          {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}},
          {"tandem", embed_tandem_json(r.info)}};
}

}  // namespace tandem::http
