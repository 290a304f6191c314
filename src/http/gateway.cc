// The gateway's endpoints (gateway.h): routing, the generation flow (placement -> tokens -> final, cancel on
// close, resumable failures), embeddings, models, health, metrics and the /tandem/v1 job endpoints.
#include "http/gateway.h"

#include "http/job_flow.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <ctime>

namespace tandem::http {

using nlohmann::json;

namespace {

std::int64_t unix_ns() {
  struct timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::optional<std::uint64_t> parse_id(std::string_view s) {
  std::uint64_t v = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || r.ec != std::errc{} || r.ptr != s.data() + s.size() || v == 0) return std::nullopt;
  return v;
}

bool is_embedding(const ModelEntry& m) { return m.info.kind.value_or("llm") == "embedding"; }
bool is_llm(const ModelEntry& m) { return m.info.kind.value_or("llm") == "llm"; }

std::vector<std::string> names_of(const std::vector<ModelEntry>& ms, bool embedding) {
  std::vector<std::string> out;
  for (const auto& m : ms)
    if (m.info.name && (embedding ? is_embedding(m) : is_llm(m))) out.push_back(*m.info.name);
  return out;
}


Headers merge(Headers a, const Headers& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

ApiResult<std::string> scoped_key(const std::string& client, const std::string& key) {
  // tandemd takes keys of up to 240 bytes; the scope ("http:<client>:") comes out of that.
  const std::string scope = "http:" + client + ":";
  const std::size_t max = 240 - std::min<std::size_t>(scope.size(), 240);
  const bool visible = std::all_of(key.begin(), key.end(), [](char c) { return c > 0x20 && c < 0x7f; });
  if (key.empty() || key.size() > max || !visible)
    return invalid_field("Idempotency-Key", "expected 1 to " + std::to_string(max) + " visible ASCII characters");
  return scope + key;
}

const ModelEntry* resolve_model(const std::vector<ModelEntry>& models, const std::string& name, bool embedding) {
  auto kind_ok = [&](const ModelEntry& m) { return embedding ? is_embedding(m) : is_llm(m); };
  if (name.empty()) {
    for (const auto& m : models)
      if (kind_ok(m) && m.info.is_default.value_or(false)) return &m;
    for (const auto& m : models)
      if (kind_ok(m)) return &m;
    return nullptr;
  }
  for (const auto& m : models)
    if (kind_ok(m) && m.info.name == name) return &m;
  const auto colon = name.rfind(':');
  if (colon != std::string::npos && name.substr(colon) == ":latest")
    for (const auto& m : models)
      if (kind_ok(m) && m.info.name == name.substr(0, colon)) return &m;
  return nullptr;
}

Gateway::Gateway(Backend& backend, GatewayConfig config) : backend_(backend), cfg_(std::move(config)) {}

std::size_t Gateway::body_limit(const std::string& method, const std::string& path) const {
  if (method == "GET" || method == "HEAD" || method == "DELETE" || method == "OPTIONS") return 0;
  if (path == "/v1/audio/transcriptions" || path == "/v1/audio/translations") return cfg_.max_audio_bytes;
  return cfg_.max_body_bytes;
}

Headers Gateway::cors_headers(const RequestInfo& r) const {
  auto it = r.headers.find("origin");
  if (it == r.headers.end() || cfg_.cors_origins.empty()) return {};
  const bool any = std::find(cfg_.cors_origins.begin(), cfg_.cors_origins.end(), "*") != cfg_.cors_origins.end();
  if (!any && std::find(cfg_.cors_origins.begin(), cfg_.cors_origins.end(), it->second) == cfg_.cors_origins.end())
    return {};
  return {{"Access-Control-Allow-Origin", any ? "*" : it->second},
          {"Vary", "Origin"},
          {"Access-Control-Expose-Headers",
           "Tandem-Job, Tandem-Route, Tandem-Degraded, Tandem-Queue-Position, Tandem-ETA-Ms, Tandem-Model, Retry-After"}};
}

bool Gateway::take_slot(const std::string& client) {
  auto& n = in_flight_[client];
  if (n >= cfg_.max_streams_per_client) return false;
  ++n;
  return true;
}

void Gateway::give_slot(const std::string& client) {
  auto it = in_flight_.find(client);
  if (it == in_flight_.end()) return;
  if (it->second <= 1) in_flight_.erase(it);
  else --it->second;
}

void Gateway::note_job(std::uint64_t job, const std::string& client) {
  constexpr std::size_t kMaxOwners = 100000;
  job_owner_[job] = client;
  while (job_owner_.size() > kMaxOwners) job_owner_.erase(job_owner_.begin());
}

bool Gateway::may_see_job(std::uint64_t job, const std::string& client) const {
  if (client == "local") return true;  // no keys: one identity (local processes reach tandemd's D-Bus anyway)
  auto it = job_owner_.find(job);
  return it != job_owner_.end() && it->second == client;
}

void Gateway::with_models(std::function<void(Outcome<std::vector<ModelEntry>>)> done) {
  const auto now = std::chrono::steady_clock::now();
  if (models_cache_ && now - models_at_ < cfg_.models_ttl) {
    done(Outcome<std::vector<ModelEntry>>::success(*models_cache_));
    return;
  }
  backend_.models([this, done = std::move(done)](Outcome<std::vector<ModelEntry>> o) {
    if (o.ok()) {
      models_cache_ = *o.value;
      models_at_ = std::chrono::steady_clock::now();
    }
    done(std::move(o));
  });
}

void Gateway::error(const std::shared_ptr<Exchange>& ex, const std::string& endpoint, Flavor f, const ApiError& e) {
  Headers h = cors_headers(ex->request());
  if (e.retry_after_ms) h.emplace_back("Retry-After", retry_after_seconds(*e.retry_after_ms));
  if (e.job) h.emplace_back("Tandem-Job", std::to_string(*e.job));
  if (e.status == 401) h.emplace_back("WWW-Authenticate", "Bearer");
  metrics_.request(endpoint, "", e.status);
  ex->reply(e.status, "application/json", error_json(e, f).dump(), std::move(h));
}

void Gateway::json_reply(const std::shared_ptr<Exchange>& ex, const std::string& endpoint, const std::string& route,
                         int status, const json& body, Headers h) {
  metrics_.request(endpoint, route, status);
  ex->reply(status, "application/json", body.dump(), merge(cors_headers(ex->request()), h));
}

// ---------------------------------------------------------------------------------------------------------------
// Routing

void Gateway::handle(std::shared_ptr<Exchange> ex) {
  try {
    route(ex);
  } catch (const std::exception& e) {
    // A bug, not the client's fault: answered as such (500) rather than ending the gateway.
    error(ex, "internal", Flavor::openai, {500, "server_error", "internal", "", std::string("internal error: ") + e.what()});
  }
}

void Gateway::route(const std::shared_ptr<Exchange>& ex) {
  const RequestInfo& r = ex->request();
  const std::string& m = r.method;
  const std::string& p = r.path;
  const Flavor f = p.starts_with("/api/") ? Flavor::ollama : Flavor::openai;
  auto method_not_allowed = [&](const char* allowed) {
    ApiError e{405, "invalid_request_error", "method_not_allowed", "", m + " is not allowed on " + p + " (use " + allowed + ")"};
    error(ex, p, f, e);
  };
  if (m == "OPTIONS") {
    Headers h = cors_headers(r);
    if (h.empty()) return error(ex, "OPTIONS", f, {403, "permission_error", "cors", "", "this origin is not allowed (cors_origins in tandem-http.toml)"});
    h.emplace_back("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
    h.emplace_back("Access-Control-Allow-Headers", "Authorization, Content-Type, Idempotency-Key");
    h.emplace_back("Access-Control-Max-Age", "600");
    metrics_.request("OPTIONS", "", 204);
    return ex->reply(204, "", "", std::move(h));
  }
  struct Route {
    const char* path;
    const char* method;
    std::function<void()> run;
  };
  const std::vector<Route> routes = {
      {"/", "GET", [&] { json_reply(ex, "/", "", 200, {{"status", "Tandem is running"}, {"version", cfg_.version}}); }},
      {"/health", "GET", [&] { health(ex); }},
      {"/metrics", "GET", [&] { metrics_endpoint(ex); }},
      {"/v1/models", "GET", [&] { openai_models(ex, ""); }},
      {"/v1/chat/completions", "POST", [&] { generate(ex, Api::openai_chat, p); }},
      {"/v1/completions", "POST", [&] { generate(ex, Api::openai_completion, p); }},
      {"/v1/embeddings", "POST", [&] { embeddings(ex, EmbedApi::openai, p); }},
      {"/v1/audio/transcriptions", "POST", [&] { transcriptions(ex, false); }},
      {"/v1/audio/translations", "POST", [&] { transcriptions(ex, true); }},
      {"/api/version", "GET", [&] { json_reply(ex, p, "", 200, {{"version", cfg_.ollama_version}, {"tandem_version", cfg_.version}}); }},
      {"/api/tags", "GET", [&] { ollama_tags(ex, false); }},
      {"/api/ps", "GET", [&] { ollama_tags(ex, true); }},
      {"/api/show", "POST", [&] { ollama_show(ex); }},
      {"/api/chat", "POST", [&] { generate(ex, Api::ollama_chat, p); }},
      {"/api/generate", "POST", [&] { generate(ex, Api::ollama_generate, p); }},
      {"/api/embed", "POST", [&] { embeddings(ex, EmbedApi::ollama_embed, p); }},
      {"/api/embeddings", "POST", [&] { embeddings(ex, EmbedApi::ollama_legacy, p); }},
  };
  for (const auto& route : routes) {
    if (p != route.path) continue;
    if (m == route.method || (m == "HEAD" && std::strcmp(route.method, "GET") == 0)) return route.run();
    return method_not_allowed(route.method);
  }
  if (p.starts_with("/v1/models/")) {
    if (m != "GET") return method_not_allowed("GET");
    return openai_models(ex, p.substr(std::strlen("/v1/models/")));
  }
  if (p.starts_with("/tandem/v1/jobs/")) return job_endpoint(ex, p.substr(std::strlen("/tandem/v1/jobs/")));
  error(ex, "unknown", f, {404, "not_found_error", "unknown_endpoint", "", "no endpoint " + m + " " + p + " (docs/http.md lists them)"});
}

// ---------------------------------------------------------------------------------------------------------------
// Generation

namespace {

class GenerationFlow : public JobFlow {
 public:
  GenerationFlow(Gateway& gw, std::shared_ptr<Exchange> ex, GenerateCall call, std::string endpoint)
      : JobFlow(gw, std::move(ex), std::move(endpoint), flavor_of(call.api)), call_(std::move(call)) {
    meta_.api = call_.api;
    meta_.created = std::time(nullptr);
    meta_.model = call_.model;
    meta_.started_unix_ns = unix_ns();
  }

  // Resolves the model, then submits (or resumes `resume_of`).
  void start(std::uint64_t resume_of = 0) {
    if (!begin()) return;
    if (auto it = ex_->request().headers.find("idempotency-key"); it != ex_->request().headers.end()) {
      auto key = scoped_key(client_, it->second);
      if (!key.ok()) return fail(*key.error);
      call_.request.options.idempotency_key = *key;
    }
    // Token updates even for a plain reply: its first-token time and eval durations are measured, not guessed.
    call_.request.options.stream = true;
    auto self = std::static_pointer_cast<GenerationFlow>(shared_from_this());
    if (resume_of) return gw_.backend().resume(resume_of, call_.request.options, self);
    gw_.with_models([self](Outcome<std::vector<ModelEntry>> o) { self->with_models(std::move(o)); });
  }

 private:
  bool streams() const override { return call_.stream; }

  void on_accepted() override {
    meta_.id = (call_.api == Api::openai_chat ? "chatcmpl-" : "cmpl-") + std::to_string(view_.job());
    if (meta_.model.empty() && !view_.model().empty()) meta_.model = view_.model();
    if (call_.stream) start_stream(flavor_ == Flavor::ollama ? "application/x-ndjson" : "text/event-stream");
  }

  void on_update(const client::JobUpdate& u, bool changed) override {
    if (u.kind == "tokens" && u.text && !u.text->empty()) first_token();
    if (call_.stream) {
      if (changed) announce("change");
      send_text();
    }
    if (u.kind == "finished") finish();
  }

  // The first token's time (plain replies too: their Ollama eval durations and the TTFT metric are measured).
  void first_token() {
    if (meta_.first_token_unix_ns) return;
    meta_.first_token_unix_ns = unix_ns();
    first_token_ = std::chrono::steady_clock::now();
    gw_.metrics().first_token_seconds(view_.route(), std::chrono::duration<double>(first_token_ - t0_).count());
  }

  nlohmann::json ndjson_state(nlohmann::json tandem) const override {
    json j = stream_chunk(meta_, "", false);
    j["tandem"] = std::move(tandem);
    return j;
  }

  void with_models(Outcome<std::vector<ModelEntry>> o) {
    if (gone_) return;
    if (!o.ok()) return fail(error_from_remote(o.error));
    const ModelEntry* m = resolve_model(*o.value, call_.model, false);
    if (!m) {
      if (resolve_model(*o.value, call_.model, true))
        return fail(invalid_field("model", "'" + call_.model + "' is an embedding model (use /v1/embeddings or /api/embed)"));
      for (const auto& e : *o.value)
        if (e.info.name == call_.model && e.info.kind.value_or("") == "speech")
          return fail(invalid_field("model", "'" + call_.model + "' is a speech model (use /v1/audio/transcriptions)"));
      return fail(unknown_model(call_.model, names_of(*o.value, false)));
    }
    call_.request.model = m->info.name.value_or("");
    if (call_.num_ctx && m->info.max_context && *call_.num_ctx > *m->info.max_context)
      return fail(invalid_field("options.num_ctx", "the model's context is " + std::to_string(*m->info.max_context) +
                                                       " tokens; Tandem does not run it with a larger one"));
    if (call_.model.empty()) meta_.model = call_.request.model;
    if (call_.load_only) {
      // Ollama's "load" request: tandemd's replicas are loaded at start, so it is answered at once.
      json j = {{"model", meta_.model}, {"created_at", rfc3339_ns(unix_ns())}, {"done", true}, {"done_reason", "load"}};
      if (call_.api == Api::ollama_chat) j["message"] = {{"role", "assistant"}, {"content", ""}};
      else j["response"] = "";
      done_ = true;
      gw_.json_reply(ex_, endpoint_, "", 200, j);
      return release();
    }
    gw_.backend().submit(call_.request, shared_from_this());
  }

  void send_text() {
    std::string text = view_.take_unsent();
    if (text.empty()) return;
    first_token();
    const json chunk = stream_chunk(meta_, text, !sent_any_);
    sent_any_ = true;
    ex_->send(flavor_ == Flavor::ollama ? ndjson(chunk) : sse_data(chunk));
  }

  void finish() {
    const std::string route = view_.route();
    gw_.metrics().tokens(route, view_.completion_tokens());
    if (first_token_.time_since_epoch().count())
      gw_.metrics().generation_seconds(route, std::chrono::duration<double>(std::chrono::steady_clock::now() - first_token_).count());
    if (view_.state() != "completed") return fail(view_.failure());
    done_ = true;
    if (!call_.stream) {
      gw_.json_reply(ex_, endpoint_, route, 200, completion_body(meta_, view_), view_.headers());
      return release();
    }
    gw_.metrics().request(endpoint_, route, 200);
    if (flavor_ == Flavor::ollama) {
      ex_->send(ndjson(stream_final(meta_, view_, unix_ns())));
    } else {
      json fin = stream_final(meta_, view_, unix_ns());
      fin["tandem"] = view_.tandem_json();
      ex_->send(sse_data(fin));
      if (call_.include_usage) ex_->send(sse_data(usage_chunk(meta_, view_)));
      ex_->send(sse_done());
    }
    ex_->end_stream();
    release();
  }

  GenerateCall call_;
  ResponseMeta meta_;
  bool sent_any_ = false;
  std::chrono::steady_clock::time_point first_token_{};
};

}  // namespace

void Gateway::generate(const std::shared_ptr<Exchange>& ex, Api api, const std::string& endpoint) {
  const std::string& body = ex->request().body;
  ApiResult<GenerateCall> call = api == Api::openai_chat         ? parse_openai_chat(body, cfg_.body)
                                 : api == Api::openai_completion ? parse_openai_completion(body, cfg_.body)
                                 : api == Api::ollama_chat       ? parse_ollama_chat(body, cfg_.body)
                                                                 : parse_ollama_generate(body, cfg_.body);
  if (!call.ok()) return error(ex, endpoint, flavor_of(api), *call.error);
  auto flow = std::make_shared<GenerationFlow>(*this, ex, std::move(*call), endpoint);
  flow->start();
}

// ---------------------------------------------------------------------------------------------------------------
// Embeddings

void Gateway::embeddings(const std::shared_ptr<Exchange>& ex, EmbedApi api, const std::string& endpoint) {
  const Flavor f = api == EmbedApi::openai ? Flavor::openai : Flavor::ollama;
  const std::string& body = ex->request().body;
  ApiResult<EmbedCall> parsed = api == EmbedApi::openai ? parse_openai_embeddings(body, cfg_.body)
                                                        : parse_ollama_embed(body, api == EmbedApi::ollama_legacy, cfg_.body);
  if (!parsed.ok()) return error(ex, endpoint, f, *parsed.error);
  auto call = std::make_shared<EmbedCall>(std::move(*parsed));
  with_models([this, ex, call, endpoint, f](Outcome<std::vector<ModelEntry>> o) {
    if (!o.ok()) return error(ex, endpoint, f, error_from_remote(o.error));
    const ModelEntry* m = resolve_model(*o.value, call->model, true);
    if (!m) {
      if (resolve_model(*o.value, call->model, false))
        return error(ex, endpoint, f, invalid_field("model", "'" + call->model + "' is a language model, not an embedding model"));
      return error(ex, endpoint, f, unknown_model(call->model, names_of(*o.value, true)));
    }
    const auto& mods = m->info.modalities;
    const bool images_ok = mods && std::find(mods->begin(), mods->end(), "image") != mods->end();
    const bool texts_ok = !mods || std::find(mods->begin(), mods->end(), "text") != mods->end();
    for (std::size_t i = 0; i < call->inputs.size(); ++i) {
      const auto& in = call->inputs[i];
      if ((in.image() && !images_ok) || (!in.image() && !texts_ok))
        return error(ex, endpoint, f, invalid_field("input[" + std::to_string(i) + "]",
                                                    std::string("the model '") + m->info.name.value_or("") + "' does not embed " +
                                                        (in.image() ? "images" : "texts")));
    }
    if (call->dimensions && m->info.dim && *call->dimensions > *m->info.dim)
      return error(ex, endpoint, f, invalid_field("dimensions", "the model's vectors have " + std::to_string(*m->info.dim) +
                                                                    " dimensions; ask for at most that many"));
    EmbedPlan plan = plan_embed(*call);
    plan.request.model = m->info.name.value_or("");
    if (auto it = ex->request().headers.find("idempotency-key"); it != ex->request().headers.end()) {
      auto key = scoped_key(ex->request().client, it->second);
      if (!key.ok()) return error(ex, endpoint, f, *key.error);
      plan.request.options.idempotency_key = *key;
    }
    const std::string client = ex->request().client;
    if (!take_slot(client)) {
      metrics_.refused("streams_per_client");
      return error(ex, endpoint, f, {429, "rate_limit_error", "too_many_requests", "",
                                     "this client has " + std::to_string(cfg_.max_streams_per_client) +
                                         " requests in flight (max_streams_per_client)", 1000, std::nullopt});
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto shape = std::make_shared<EmbedPlan>();  // the inputs' counts and order, to name a bad input as sent
    shape->order = std::move(plan.order);
    shape->request.texts.resize(plan.request.texts.size());
    shape->request.tokens.resize(plan.request.tokens.size());
    shape->request.images.resize(plan.request.images.size());
    backend_.embed(plan.request, [this, ex, call, endpoint, f, client, shape, t0](Outcome<client::EmbedReply> r) {
      give_slot(client);
      if (ex->closed()) return;
      if (!r.ok()) {
        ApiError e = error_from_remote(r.error);
        if (auto j = embed_input_index(e.message, *shape); j && e.status == 400) {
          // "tokens[1]: token 0 is 99999 ..." -> "input[3]: token 0 is 99999 ..." (the request's own numbering)
          e.param = "input[" + std::to_string(*j) + "]";
          e.message = e.param + e.message.substr(e.message.find(']') + 1);
        }
        return error(ex, endpoint, f, e);
      }
      const auto& order = shape->order;
      if (r.value->vectors.size() != order.size())
        return error(ex, endpoint, f, {500, "server_error", "internal", "", "tandemd returned " +
                                           std::to_string(r.value->vectors.size()) + " vectors for " +
                                           std::to_string(order.size()) + " inputs"});
      EmbedResult res;
      res.info = r.value->info;
      for (std::size_t i = 0; i < order.size(); ++i) res.vectors.push_back(r.value->vectors[order[i]]);
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
      json_reply(ex, endpoint, res.info.route.value_or(""), 200, embed_body(*call, res, static_cast<std::uint64_t>(ns)),
                 embed_headers(res.info));
    });
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Models

namespace {

json model_tandem(const ModelEntry& m) {
  json t = client::to_json(m.info);
  if (m.details) {
    if (m.details->placement) t["placement_bytes"] = *m.details->placement;
    if (m.details->replicas) {
      json reps = json::array();
      for (const auto& r : *m.details->replicas) {
        json e = json::object();
        if (r.device) e["device"] = *r.device;
        if (r.state) e["state"] = *r.state;
        if (r.reason && !r.reason->empty()) e["reason"] = *r.reason;  // given back: hold, request, idle
        if (r.mode) e["mode"] = *r.mode;
        if (r.accel_bytes) e["accel_bytes"] = *r.accel_bytes;
        if (r.host_bytes) e["host_bytes"] = *r.host_bytes;
        reps.push_back(std::move(e));
      }
      t["replicas"] = std::move(reps);
    }
  }
  return t;
}

std::uint64_t placement_bytes(const ModelEntry& m, const char* where) {
  const auto& p = m.info.placement_bytes ? m.info.placement_bytes
                  : m.details             ? m.details->placement
                                          : std::nullopt;
  if (!p) return 0;
  auto it = p->find(where);
  return it == p->end() ? 0 : it->second;
}

// Ollama's "details": what tandemd knows (the weight type); the rest of Ollama's keys are left out rather than made up.
json ollama_details(const ModelEntry& m) {
  json d = json::object();
  if (m.info.dtype) d["quantization_level"] = *m.info.dtype;
  return d;
}

}  // namespace

void Gateway::openai_models(const std::shared_ptr<Exchange>& ex, const std::string& one) {
  with_models([this, ex, one](Outcome<std::vector<ModelEntry>> o) {
    const std::string ep = one.empty() ? "/v1/models" : "/v1/models/{id}";
    if (!o.ok()) return error(ex, ep, Flavor::openai, error_from_remote(o.error));
    json data = json::array();
    for (const auto& m : *o.value) {
      if (!m.info.name) continue;
      json e = {{"id", *m.info.name}, {"object", "model"}, {"owned_by", "tandem"}, {"tandem", model_tandem(m)}};
      if (!one.empty() && *m.info.name == one) return json_reply(ex, ep, "", 200, e);
      data.push_back(std::move(e));
    }
    if (!one.empty()) return error(ex, ep, Flavor::openai, unknown_model(one, names_of(*o.value, false)));
    json_reply(ex, ep, "", 200, {{"object", "list"}, {"data", std::move(data)}});
  });
}

void Gateway::ollama_tags(const std::shared_ptr<Exchange>& ex, bool ps) {
  with_models([this, ex, ps](Outcome<std::vector<ModelEntry>> o) {
    const std::string ep = ps ? "/api/ps" : "/api/tags";
    if (!o.ok()) return error(ex, ep, Flavor::ollama, error_from_remote(o.error));
    json models = json::array();
    for (const auto& m : *o.value) {
      if (!m.info.name) continue;
      json e = {{"name", *m.info.name}, {"model", *m.info.name}, {"digest", m.info.fingerprint.value_or("")},
                {"details", ollama_details(m)}, {"tandem", model_tandem(m)}};
      if (ps) {
        // What is loaded: host and GPU bytes; size_vram is what Tandem really holds on the GPU for the model.
        const std::uint64_t gpu = placement_bytes(m, "gpu"), host = placement_bytes(m, "host");
        if (gpu + host == 0) continue;
        e["size"] = gpu + host;
        e["size_vram"] = gpu;
      } else {
        e["size"] = placement_bytes(m, "storage");
      }
      models.push_back(std::move(e));
    }
    json_reply(ex, ep, "", 200, {{"models", std::move(models)}});
  });
}

void Gateway::ollama_show(const std::shared_ptr<Exchange>& ex) {
  auto j = parse_json_object(ex->request().body, cfg_.body);
  if (!j.ok()) return error(ex, "/api/show", Flavor::ollama, *j.error);
  FieldReader f(*j);
  auto name = f.str("model", false);
  auto legacy = f.str("name", false);  // older clients send "name"
  f.boolean("verbose");
  if (auto e = f.finish({})) return error(ex, "/api/show", Flavor::ollama, *e);
  if (!name) name = legacy;
  if (!name) return error(ex, "/api/show", Flavor::ollama, invalid_field("model", "missing"));
  with_models([this, ex, n = *name](Outcome<std::vector<ModelEntry>> o) {
    if (!o.ok()) return error(ex, "/api/show", Flavor::ollama, error_from_remote(o.error));
    const ModelEntry* m = resolve_model(*o.value, n, false);
    if (!m) m = resolve_model(*o.value, n, true);
    if (!m)
      for (const auto& e : *o.value)
        if (e.info.name == n) m = &e;  // a speech model (listed by /api/tags too)
    if (!m) {
      auto all = names_of(*o.value, false);
      for (auto& e : names_of(*o.value, true)) all.push_back(e);
      return error(ex, "/api/show", Flavor::ollama, unknown_model(n, all));
    }
    json info = json::object();
    if (m->info.max_context) info["tandem.context_length"] = *m->info.max_context;
    if (m->info.dim) info["tandem.embedding_length"] = *m->info.dim;
    json body = {{"modelfile", ""},
                 {"parameters", ""},
                 {"template", m->info.template_name.value_or("")},
                 {"details", ollama_details(*m)},
                 {"model_info", info},
                 {"capabilities", is_embedding(*m) ? json::array({"embedding"})
                                  : is_llm(*m)     ? json::array({"completion"})
                                                   : json::array()},  // speech: /v1/audio/transcriptions, Wyoming
                 {"tandem", model_tandem(*m)}};
    json_reply(ex, "/api/show", "", 200, body);
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Health, metrics, jobs

void Gateway::health(const std::shared_ptr<Exchange>& ex) {
  backend_.status([this, ex](Outcome<client::ServiceStatus> o) {
    if (!o.ok() || !backend_.connected()) {
      ApiError e = o.ok() ? ApiError{503, "server_error", "tandemd_unavailable", "", "no ring session to tandemd yet", 1000, std::nullopt}
                          : error_from_remote(o.error);
      if (e.status < 500) e.status = 503;
      return json_reply(ex, "/health", "", 503, {{"status", "unavailable"}, {"error", e.message}},
                        {{"Retry-After", retry_after_seconds(e.retry_after_ms.value_or(1000))}});
    }
    const auto& s = *o.value;
    json_reply(ex, "/health", "", 200,
               {{"status", s.degraded() ? "degraded" : "ok"},
                {"tandem", {{"state", s.state.value_or("")},
                            {"degraded_reason", s.degraded_reason.value_or("")},
                            {"gpu_breaker", s.gpu_breaker.value_or("")},
                            {"fallback_model", s.fallback_model.value_or("")},
                            {"version", s.version.value_or("")}}}});
  });
}

void Gateway::metrics_endpoint(const std::shared_ptr<Exchange>& ex) {
  backend_.status([this, ex](Outcome<client::ServiceStatus> o) {
    std::optional<client::ServiceStatus> st;
    if (o.ok()) st = *o.value;
    if (!st) {
      metrics_.request("/metrics", "", 200);
      ex->reply(200, "text/plain; version=0.0.4; charset=utf-8", metrics_.render(st, backend_.connected()), {});
      return;
    }
    // The models' replicas (where each one is, given back or not, and what it holds) from ListModels + Replicas.
    backend_.models([this, ex, st](Outcome<std::vector<ModelEntry>> mo) {
      std::vector<std::pair<std::string, std::vector<client::ReplicaInfo>>> reps;
      if (mo.ok())
        for (const auto& m : *mo.value)
          if (m.info.name && m.details && m.details->replicas) reps.emplace_back(*m.info.name, *m.details->replicas);
      metrics_.request("/metrics", "", 200);
      ex->reply(200, "text/plain; version=0.0.4; charset=utf-8", metrics_.render(st, backend_.connected(), reps), {});
    });
  });
}

void Gateway::job_endpoint(const std::shared_ptr<Exchange>& ex, const std::string& rest) {
  const std::string& m = ex->request().method;
  const auto slash = rest.find('/');
  const auto id = parse_id(rest.substr(0, slash));
  const std::string tail = slash == std::string::npos ? "" : rest.substr(slash);
  const std::string ep = "/tandem/v1/jobs/{id}" + tail;
  if (!id) return error(ex, ep, Flavor::tandem, invalid_field("id", "expected a job id (a positive integer)"));
  if (!may_see_job(*id, ex->request().client))
    return error(ex, ep, Flavor::tandem, {404, "not_found_error", "job_not_found", "id",
                                          "no job " + std::to_string(*id) + " submitted by this client"});
  if (tail.empty() && m == "GET") {
    return backend_.get_job(*id, [this, ex, ep](Outcome<client::JobInfo> o) {
      if (!o.ok()) return error(ex, ep, Flavor::tandem, error_from_remote(o.error));
      json_reply(ex, ep, o.value->route.value_or(""), 200, client::to_json(*o.value));
    });
  }
  if (tail.empty() && m == "DELETE") {
    backend_.cancel(*id);
    return json_reply(ex, ep, "", 202, {{"job", *id}, {"cancel", "requested"}});
  }
  if (tail == "/resume" && m == "POST") {
    // {"format": "openai_chat" | "openai_completion" | "ollama_chat" | "ollama_generate", "stream": bool}
    GenerateCall call;
    call.api = Api::openai_chat;
    call.stream = false;
    if (!ex->request().body.empty()) {
      auto j = parse_json_object(ex->request().body, cfg_.body);
      if (!j.ok()) return error(ex, ep, Flavor::tandem, *j.error);
      FieldReader f(*j);
      if (auto fm = f.str("format")) {
        if (*fm == "openai_chat") call.api = Api::openai_chat;
        else if (*fm == "openai_completion") call.api = Api::openai_completion;
        else if (*fm == "ollama_chat") call.api = Api::ollama_chat;
        else if (*fm == "ollama_generate") call.api = Api::ollama_generate;
        else f.fail(invalid_field("format", "expected openai_chat, openai_completion, ollama_chat or ollama_generate"));
      }
      call.stream = f.boolean("stream").value_or(false);
      if (auto e = f.finish({})) return error(ex, ep, Flavor::tandem, *e);
    }
    auto flow = std::make_shared<GenerationFlow>(*this, ex, std::move(call), ep);
    return flow->start(*id);
  }
  error(ex, ep, Flavor::tandem, {405, "invalid_request_error", "method_not_allowed", "",
                                 "use GET or DELETE /tandem/v1/jobs/{id}, or POST /tandem/v1/jobs/{id}/resume"});
}

}  // namespace tandem::http
