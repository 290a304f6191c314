// Service: the embed workload — Embed requests (validation, tokenizing, idempotency), and the EmbedWorkload's part
// of the scheduler (a run of both towers on one route; a GPU failure always re-runs it on the CPU: an embedding
// job has no side effects and no partial output; the reply to every waiting caller when the job ends).
// docs/embeddings.md, docs/architecture.md.
#include "daemon/service.h"

#include "core/sha256.h"
#include "daemon/service_internal.h"
#include "image/image.h"

namespace tandem::daemon {

// ---------------------------------------------------------------------------------------------------------------
// Requests

Result<Service::Prepared> Service::prepare_embed(const Caller& c, const EmbedRequest& req) {
  if (!c.may_submit && !c.admin)
    return fail(Errc::permission_denied, "uid " + std::to_string(c.uid) + " may not submit (needs group '" +
                                             cfg_.auth.submit_group + "')");
  if (draining_) return fail(Errc::unavailable, "tandemd is stopping; retry_after_ms=5000");
  const auto& lim = cfg_.embedding;
  (void)lim;
  Prepared p;
  p.kind = WorkloadKind::embed;
  const std::string name = req.model.empty() ? default_embedding_model() : req.model;
  if (name.empty()) return fail(Errc::not_found, "no embedding model is configured");
  auto model = serving_model(name);
  if (!model) return fail(std::move(model).error());
  p.model = *model;
  if (p.model->kind != ModelKind::embedding)
    return fail(Errc::unsupported, "model " + name + " is not an embedding model (kind " +
                                       model_kind_name(p.model->kind) + "): call Submit");
  p.req.model = name;
  // Inputs.
  const std::size_t inputs = req.texts.size() + req.tokens.size() + req.images.size();
  if (inputs == 0) return fail(Errc::invalid_argument, "no inputs: give at least one text, token input or image");
  if (inputs > lim.max_inputs)
    return fail(Errc::invalid_argument, "at most " + std::to_string(lim.max_inputs) + " inputs per call, got " +
                                            std::to_string(inputs));
  if ((!req.texts.empty() || !req.tokens.empty()) && !p.model->embedding.text)
    return fail(Errc::unsupported, "model " + name + " has no text tower");
  if (!req.images.empty() && !p.model->embedding.image)
    return fail(Errc::unsupported, "model " + name + " has no image tower");
  const auto& o = req.options;
  if (o.idempotency_key && (o.idempotency_key->empty() || o.idempotency_key->size() > 240 || !valid_utf8(*o.idempotency_key)))
    return fail(Errc::invalid_argument, "idempotency_key must be 1..240 bytes of UTF-8");
  if (o.deadline_ms && (*o.deadline_ms == 0 || *o.deadline_ms > 7ull * 24 * 3600 * 1000))
    return fail(Errc::invalid_argument, "deadline_ms must be in [1,604800000]");
  auto work = std::make_shared<EmbedWork>();
  const bool truncate = o.truncate.value_or(true);
  std::uint32_t longest = 1;
  const auto add = [&](EmbedTokens&& ids) {  // one text-tower input, [BOS] ... [EOS]
    if (ids.truncated) ++work->truncated;
    longest = std::max(longest, static_cast<std::uint32_t>(ids.ids.size()));
    work->tokens += ids.ids.size();
    work->texts.push_back(std::move(ids.ids));
  };
  json texts = json::array();
  for (std::size_t i = 0; i < req.texts.size(); ++i) {
    const auto& t = req.texts[i];
    if (t.size() > lim.max_text_bytes)
      return fail(Errc::invalid_argument, "texts[" + std::to_string(i) + "] is " + std::to_string(t.size()) +
                                              " bytes; at most " + std::to_string(lim.max_text_bytes));
    if (!valid_utf8(t)) return fail(Errc::invalid_argument, "texts[" + std::to_string(i) + "] is not valid UTF-8");
    auto ids = backend_->embed_tokens(name, t, truncate);
    if (!ids) return fail(ids.error().code, "texts[" + std::to_string(i) + "]: " + ids.error().message);
    add(std::move(ids).value());
    texts.push_back(t);
  }
  json tokens = json::array();
  for (std::size_t i = 0; i < req.tokens.size(); ++i) {
    const auto& t = req.tokens[i];
    if (t.empty()) return fail(Errc::invalid_argument, "tokens[" + std::to_string(i) + "] is empty");
    if (t.size() > lim.max_text_bytes)  // a token is at least a byte of text
      return fail(Errc::invalid_argument, "tokens[" + std::to_string(i) + "] has " + std::to_string(t.size()) +
                                              " ids; at most " + std::to_string(lim.max_text_bytes));
    auto ids = backend_->embed_token_ids(name, t, truncate);
    if (!ids) return fail(ids.error().code, "tokens[" + std::to_string(i) + "]: " + ids.error().message);
    add(std::move(ids).value());
    tokens.push_back(t);
  }
  json images = json::array();
  for (std::size_t i = 0; i < req.images.size(); ++i) {
    const auto& b = req.images[i];
    const std::string which = i < req.image_names.size() && !req.image_names[i].empty()
                                  ? req.image_names[i]
                                  : "images[" + std::to_string(i) + "]";
    if (!b || b->empty()) return fail(Errc::invalid_argument, which + " is empty");
    if (b->size() > lim.max_image_bytes)
      return fail(Errc::invalid_argument, which + " is " + std::to_string(b->size()) + " bytes; at most " +
                                              std::to_string(lim.max_image_bytes) + " ([embedding] max_image_bytes)");
    if (auto f = image::sniff(*b); !f) return fail(Errc::invalid_argument, which + ": " + f.error().message);
    images.push_back({{"sha256", bytes_sha256(*b)}, {"bytes", b->size()}});
    work->images.push_back(b);
    work->image_names.push_back(which);
  }
  if (!req.images.empty()) longest = std::max(longest, p.model->embedding.image_tokens);
  work->dim = p.model->embedding.dim;
  p.embed = std::move(work);
  p.req.options.idempotency_key = o.idempotency_key;
  p.req.options.allow_cpu = o.allow_cpu;
  p.req.options.deadline_ms = o.deadline_ms;
  p.req.options.stream = false;
  // The estimate: one forward of every input through the wider tower (policy::ModelShape::encoder_only).
  p.shape.prompt_tokens = longest;
  p.shape.max_new_tokens = 1;
  p.shape.batch = static_cast<std::uint32_t>(inputs);
  p.shape.allow_cpu = o.allow_cpu.value_or(true);
  p.max_new_tokens = 1;
  // Stored (and digested: the same key must name the same inputs). Images by digest: their bytes are not kept.
  p.request_json = json{{"kind", "embed"}, {"model", name}, {"texts", texts}, {"images", images},
                        {"truncate", truncate}, {"allow_cpu", p.shape.allow_cpu}};
  if (!tokens.empty()) p.request_json["tokens"] = std::move(tokens);  // absent when none: older journals' digests hold
  const auto dig = Sha256::of(p.request_json.dump());
  for (int i = 0; i < 8; ++i) p.digest = (p.digest << 8) | dig[i];
  return p;
}

void Service::embed(const Caller& c, EmbedRequest req, EmbedDone done) {
  auto p = prepare_embed(c, req);
  if (!p) {
    done(fail(std::move(p).error()));
    return;
  }
  // Idempotency: a running job with the key gets this caller as one more waiter; a completed one whose vectors are
  // still held answers at once; a failed, cancelled or forgotten one is run again (no side effects: a re-run is
  // the same job).
  if (const auto& key = p->req.options.idempotency_key) {
    if (auto found = idempotency_.find(scoped_key(c.uid, *key))) {
      if (JobRecord* j = find(found->job)) {
        if (j->digest != p->digest) {
          done(fail(Errc::duplicate, "idempotency_key '" + key->substr(0, 64) + "' names job " +
                                         std::to_string(j->id) + " with different inputs"));
          return;
        }
        if (j->kind == WorkloadKind::embed && j->embed && !j->terminal()) {  // accept pending too: withdraw answers it
          j->embed->waiters.push_back(std::move(done));
          return;
        }
        if (j->kind == WorkloadKind::embed && j->embed && j->phase == JobPhase::completed &&
            !j->embed->vectors.empty()) {
          EmbedReply r;
          r.vectors = j->embed->vectors;
          r.result = embed_result(*j);
          r.result["existing"] = true;
          done(std::move(r));
          return;
        }
      }
      p->reclaim_key = true;
    }
  }
  if (active_jobs_of(c.bus_name) >= cfg_.runtime.max_jobs_per_client) {
    done(fail(Errc::queue_full, "at most " + std::to_string(cfg_.runtime.max_jobs_per_client) +
                                    " unfinished jobs per client; retry_after_ms=1000"));
    return;
  }
  wake_replica(p->model->name);  // keep_alive: a replica given back while idle comes back
  refresh_readings();
  update_service_state();
  const Decision d = decide(*p, std::nullopt, {});
  if (!d.accepted()) {
    ++counters_["jobs_rejected"];
    done(rejected_error(d));
    return;
  }
  auto work = p->embed;
  work->waiters.push_back(std::move(done));  // before accept: a job that ends inside accept still answers
  auto placed = accept(c, std::move(p).value(), d, std::nullopt);
  if (!placed) {
    auto waiters = std::move(work->waiters);
    work->waiters.clear();
    for (auto& w : waiters) w(fail(placed.error()));
  }
}

std::string Service::default_embedding_model() const {
  if (!cfg_.embedding.default_model.empty()) return cfg_.embedding.default_model;
  for (const auto& m : backend_->models())
    if (m.kind == ModelKind::embedding) return m.name;
  return {};
}

Dict Service::embed_result(const JobRecord& j) const {
  Dict r;
  r["job_id"] = j.id;
  r["model"] = j.route.model.empty() ? j.model : j.route.model;
  r["route"] = route_name(j.route);
  r["dim"] = j.embed ? j.embed->dim : 0u;
  const auto texts = j.embed ? j.embed->n_texts : 0u;
  const auto images = j.embed ? j.embed->n_images : 0u;
  r["inputs"] = texts + images;
  r["texts"] = texts;
  r["images"] = images;
  r["truncated"] = j.embed ? j.embed->truncated : 0u;
  r["text_tokens"] = j.embed ? j.embed->tokens : std::uint64_t{0};
  r["attempts"] = static_cast<std::uint32_t>(j.fsm ? j.fsm->attempts() : j.attempts_restored);
  r["degraded"] = j.degraded;
  std::string fp;
  for (const auto& m : backend_->models())
    if (m.name == j.model) fp = m.fingerprint;
  r["fingerprint"] = fp;
  r["queued_ms"] = j.embed ? to_ms(j.embed->queued) : 0;
  r["run_ms"] = j.embed ? to_ms(j.embed->run_time) : 0;
  r["existing"] = false;
  return r;
}

// ---------------------------------------------------------------------------------------------------------------
// The workload

bool Service::EmbedWorkload::start(Service& s, JobRecord& j) {
  EmbedSpec spec;
  spec.job = j.id;
  spec.route = j.route;
  spec.route.gpu_layers = 0;
  spec.texts = j.embed->texts;
  spec.images = j.embed->images;
  spec.image_names = j.embed->image_names;
  if (j.embed->queued == Clock::duration::zero()) j.embed->queued = s.clock_->now() - j.accepted_at;
  auto cancel = j.cancel;
  const auto attempt = j.attempt;
  auto task = [&s, spec = std::move(spec), cancel, attempt] {
    RunResult r = s.backend_->embed(spec, *cancel);
    WorkerEvent ev;
    ev.kind = WorkerEvent::finished;
    ev.job = spec.job;
    ev.attempt = attempt;
    ev.result = std::move(r);
    s.post(std::move(ev));
  };
  (j.route.device == policy::Device::cpu ? s.cpu_pool_ : s.gpu_pool_)->post(std::move(task));
  return true;
}

std::optional<Clock::duration> Service::EmbedWorkload::fixed_time(const Service& s, const JobRecord& j,
                                                                  policy::Device route) const {
  if (!j.embed) return std::nullopt;
  const auto d = route == policy::Device::cpu ? policy::Device::cpu : policy::Device::gpu;
  Clock::duration total{};
  const std::pair<policy::WorkUnit, std::uint32_t> parts[] = {{policy::WorkUnit::text, j.embed->n_texts},
                                                              {policy::WorkUnit::image, j.embed->n_images}};
  for (const auto& [unit, n] : parts) {
    if (n == 0) continue;
    const auto t = s.unit_times_.estimate(j.serving_model_name(), d, unit, n);
    if (!t) return std::nullopt;
    total += *t;
  }
  return total;
}

Status Service::EmbedWorkload::completed(Service& s, JobRecord& j, const RunResult& r) {
  // The run's times move the model's per-text and per-image figures (policy::UnitTimes).
  const auto d = j.route.device == policy::Device::cpu ? policy::Device::cpu : policy::Device::gpu;
  s.unit_times_.observe(j.serving_model_name(), d, policy::WorkUnit::text, j.embed->n_texts, r.text_time);
  s.unit_times_.observe(j.serving_model_name(), d, policy::WorkUnit::image, j.embed->n_images, r.image_time);
  const std::size_t want = j.embed->n_texts + j.embed->n_images;
  if (r.vectors.size() != want)
    return fail(Errc::internal, "the backend returned " + std::to_string(r.vectors.size()) + " vectors for " +
                                    std::to_string(want) + " inputs");
  for (const auto& v : r.vectors)
    if (v.size() != j.embed->dim)
      return fail(Errc::internal, "the backend returned a vector of dim " + std::to_string(v.size()) + ", not " +
                                      std::to_string(j.embed->dim));
  j.embed->vectors = r.vectors;
  j.embed->run_time = r.decode_time;
  return {};
}

// Nothing was delivered and nothing acts on a partial result: the CPU always runs it again when it can.
policy::FailoverDecision Service::EmbedWorkload::failover(const Service& s, const JobRecord& j) const {
  policy::FailoverDecision d;
  if (s.cpu_can_serve(j)) {
    d.action = policy::FailoverAction::retry_on_cpu;
    d.reason = "idempotent";
  } else {
    d.action = policy::FailoverAction::fail_resumable;
    d.reason = "cpu_unavailable";
  }
  return d;
}

void Service::EmbedWorkload::ended(Service& s, JobRecord& j, JobPhase phase, Errc code, const std::string& message) {
  // A degraded answer is never the first news of degraded mode: the service's state (and DegradedModeChanged, the
  // rings' degraded_mode completion) goes out before the vectors do.
  if (j.degraded) s.update_service_state();
  auto waiters = std::move(j.embed->waiters);
  j.embed->waiters.clear();
  for (auto& w : waiters) {
    if (phase == JobPhase::completed) {
      EmbedReply r;
      r.vectors = j.embed->vectors;
      r.result = s.embed_result(j);
      w(std::move(r));
    } else if (phase == JobPhase::cancelled) {
      w(fail(Errc::cancelled, "embedding job " + std::to_string(j.id) + " was cancelled"));
    } else {
      // (end_job made Resumable Unavailable: the caller simply calls again; Busy keeps retry_after_ms.)
      const Errc c = code;
      std::string msg = "embedding job " + std::to_string(j.id) + " failed (" + j.reason + "): " + message;
      if (j.retry_after_ms) msg += "; retry_after_ms=" + std::to_string(j.retry_after_ms);
      w(fail(c, msg));
    }
  }
  // The inputs go (nothing can run it again: a caller calls Embed again); the vectors stay only where a retry with
  // the key can ask for them again.
  j.embed->texts.clear();
  j.embed->images.clear();
  j.embed->image_names.clear();
  if (j.key.empty()) j.embed->vectors.clear();
  j.request_json = json{{"kind", "embed"}, {"model", j.model}};
}

void Service::EmbedWorkload::outcome(const JobRecord& j, Dict& fin) const {
  fin["vectors"] = static_cast<std::uint32_t>(j.embed ? j.embed->vectors.size() : 0);
}

void Service::EmbedWorkload::view(const JobRecord& j, Dict& d) const {
  d["kind"] = std::string("embed");
  if (!j.embed) return;
  d["inputs"] = j.embed->n_texts + j.embed->n_images;
  d["texts"] = j.embed->n_texts;
  d["images"] = j.embed->n_images;
  d["dim"] = j.embed->dim;
  d["truncated"] = j.embed->truncated;
  d["text_tokens"] = j.embed->tokens;  // not "tokens": GetJob's generated ids (au)
}

}  // namespace tandem::daemon
