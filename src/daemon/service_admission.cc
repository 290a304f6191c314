// Service: requests and admission — validate and tokenize (prepare), the admission snapshot and decision, Plan,
// Submit, accepting a job into the journal and a queue, and its placement reply.
#include "daemon/service.h"

#include "core/sha256.h"
#include "daemon/service_internal.h"

namespace tandem::daemon {

// ---------------------------------------------------------------------------------------------------------------
// Requests

Result<Service::Prepared> Service::prepare(const Caller& c, const SubmitRequest& req, bool for_plan) {
  if (!c.may_submit && !c.admin)
    return fail(Errc::permission_denied, "uid " + std::to_string(c.uid) + " may not submit (needs group '" +
                                             cfg_.auth.submit_group + "')");
  if (draining_ && !for_plan) return fail(Errc::unavailable, "tandemd is stopping; retry_after_ms=5000");
  Prepared p;
  p.req = req;
  const std::string name = req.model.empty() ? default_llm() : req.model;
  auto model = serving_model(name);
  if (!model) return fail(std::move(model).error());
  p.model = *model;
  if (p.model->kind != ModelKind::llm)
    return fail(Errc::unsupported, "model " + name + (p.model->kind == ModelKind::speech
                                                         ? " is a speech model: call Transcribe"
                                                         : " is an embedding model: call Embed"));
  p.req.model = name;
  const auto& rt = cfg_.runtime;
  const auto& o = req.options;
  // Prompt.
  if (req.prompt.size() > rt.max_prompt_bytes)
    return fail(Errc::invalid_argument, "prompt must be at most " + std::to_string(rt.max_prompt_bytes) + " bytes, got " +
                                            std::to_string(req.prompt.size()));
  if (!req.messages.empty() && !req.prompt.empty())
    return fail(Errc::invalid_argument, "give either prompt or messages, not both");
  if (req.messages.empty() && req.prompt.empty() && !(o.resume_tokens && !o.resume_tokens->empty()))
    return fail(Errc::invalid_argument, "prompt and messages are both empty");
  if (req.messages.size() > rt.max_messages)
    return fail(Errc::invalid_argument, "at most " + std::to_string(rt.max_messages) + " messages, got " +
                                            std::to_string(req.messages.size()));
  std::size_t total = req.prompt.size();
  if (!valid_utf8(req.prompt)) return fail(Errc::invalid_argument, "prompt is not valid UTF-8");
  for (const auto& m : req.messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
      return fail(Errc::invalid_argument, "message role must be system, user or assistant, got '" +
                                              m.role.substr(0, 32) + "'");
    if (!valid_utf8(m.content)) return fail(Errc::invalid_argument, "message content is not valid UTF-8");
    total += m.content.size();
  }
  if (total > rt.max_prompt_bytes)
    return fail(Errc::invalid_argument, "prompt must be at most " + std::to_string(rt.max_prompt_bytes) +
                                            " bytes in all, got " + std::to_string(total));
  // Sampling and limits.
  p.sampling = p.model->default_sampling;
  if (o.temperature) p.sampling.temperature = *o.temperature;
  if (o.top_k) p.sampling.top_k = static_cast<int>(std::min<std::uint32_t>(*o.top_k, 2000000));
  if (o.top_p) p.sampling.top_p = *o.top_p;
  if (o.repetition_penalty) p.sampling.repetition_penalty = *o.repetition_penalty;
  p.sampling.seed = o.seed.value_or(0);
  if (auto st = p.sampling.validate(); !st) return fail(Errc::invalid_argument, st.error().message);
  p.max_new_tokens = o.max_tokens.value_or(p.model->default_max_new_tokens);
  if (p.max_new_tokens < 1 || p.max_new_tokens > p.model->max_context)
    return fail(Errc::invalid_argument, "max_tokens must be in [1," + std::to_string(p.model->max_context) +
                                            "], got " + std::to_string(p.max_new_tokens));
  p.stop = p.model->default_stop;
  if (!req.messages.empty()) p.stop.insert(p.stop.end(), p.model->chat_stop.begin(), p.model->chat_stop.end());
  if (o.stop) {
    if (o.stop->size() > 16) return fail(Errc::invalid_argument, "stop: at most 16 strings");
    for (const auto& s : *o.stop) {
      if (s.empty() || s.size() > 256) return fail(Errc::invalid_argument, "stop strings must be 1..256 bytes");
      if (!valid_utf8(s)) return fail(Errc::invalid_argument, "stop string is not valid UTF-8");
      p.stop.push_back(s);
    }
  }
  {  // config stops + template stops + the request's: deduplicated, at most 16 (the engine's limit)
    std::vector<std::string> merged;
    for (auto& st : p.stop)
      if (std::find(merged.begin(), merged.end(), st) == merged.end()) merged.push_back(st);
    if (merged.size() > 16)
      return fail(Errc::invalid_argument, "stop: at most 16 strings in all (with the model's " +
                                              std::to_string(merged.size() - (o.stop ? o.stop->size() : 0)) + "), got " +
                                              std::to_string(merged.size()));
    p.stop = std::move(merged);
  }
  if (o.idempotency_key && (o.idempotency_key->empty() || o.idempotency_key->size() > 240 || !valid_utf8(*o.idempotency_key)))
    return fail(Errc::invalid_argument, "idempotency_key must be 1..240 bytes of UTF-8");
  if (o.deadline_ms && (*o.deadline_ms == 0 || *o.deadline_ms > 7ull * 24 * 3600 * 1000))
    return fail(Errc::invalid_argument, "deadline_ms must be in [1,604800000]");
  p.prefill_chunk = o.prefill_chunk.value_or(0);
  if (p.prefill_chunk > p.model->max_context)
    return fail(Errc::invalid_argument, "prefill_chunk must be in [0," + std::to_string(p.model->max_context) + "]");
  if (o.resume_tokens) {
    if (o.resume_tokens->size() >= p.max_new_tokens)
      return fail(Errc::invalid_argument, "resume_tokens (" + std::to_string(o.resume_tokens->size()) +
                                              ") must be fewer than max_tokens");
    for (auto t : *o.resume_tokens)
      if (t < 0 || static_cast<std::uint32_t>(t) >= p.model->shape.vocab)
        return fail(Errc::invalid_argument, "resume_tokens: id " + std::to_string(t) + " outside the vocabulary");
    p.resume = *o.resume_tokens;
  }
  // Tokenize (the prompt the model sees).
  auto ids = backend_->encode(p.model->name, req.prompt, req.messages, o.template_flags());
  if (!ids) return fail(std::move(ids).error());
  p.prompt = std::move(ids).value();
  if (p.prompt.size() + p.max_new_tokens > p.model->max_context)
    return fail(Errc::invalid_argument, "prompt (" + std::to_string(p.prompt.size()) + " tokens) + max_tokens (" +
                                            std::to_string(p.max_new_tokens) + ") exceed the model's context of " +
                                            std::to_string(p.model->max_context));
  p.shape.prompt_tokens = static_cast<std::uint32_t>(p.prompt.size() + p.resume.size());
  p.shape.max_new_tokens = p.max_new_tokens - static_cast<std::uint32_t>(p.resume.size());
  p.shape.prefill_chunk = p.prefill_chunk;
  p.shape.allow_reduce = o.allow_reduce.value_or(false);
  p.shape.allow_cpu = o.allow_cpu.value_or(true);
  // A checkpoint's ids are the requested model's: a resumed request never goes to a fallback model.
  p.shape.allow_fallback_model = o.allow_fallback_model.value_or(false) && p.resume.empty();
  p.shape.side_effects = o.side_effects.value_or(false);
  // The request as stored (and digested for idempotency: the same key must name the same request).
  json msgs = json::array();
  for (const auto& m : req.messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
  p.request_json = json{{"model", p.req.model}, {"prompt", req.prompt}, {"messages", msgs},
                        {"max_new_tokens", p.max_new_tokens}, {"temperature", p.sampling.temperature},
                        {"top_k", p.sampling.top_k}, {"top_p", p.sampling.top_p},
                        {"repetition_penalty", p.sampling.repetition_penalty}, {"seed", p.sampling.seed},
                        {"stop", o.stop.value_or(std::vector<std::string>{})}, {"side_effects", p.shape.side_effects},
                        {"allow_cpu", p.shape.allow_cpu}, {"allow_reduce", p.shape.allow_reduce},
                        {"allow_fallback_model", p.shape.allow_fallback_model}, {"prefill_chunk", p.prefill_chunk}};
  // (Only when given: the digests of requests without it stay those journaled before the option existed.)
  if (o.enable_thinking) p.request_json["enable_thinking"] = *o.enable_thinking;
  json digest_input = p.request_json;
  const auto dig = Sha256::of(digest_input.dump());
  for (int i = 0; i < 8; ++i) p.digest = (p.digest << 8) | dig[i];
  p.request_json["resume_tokens"] = p.resume;
  return p;
}

std::string Service::default_llm() const {
  if (!cfg_.default_model.empty()) return cfg_.default_model;
  for (const auto& m : backend_->models())
    if (m.kind == ModelKind::llm) return m.name;
  return cfg_.models.front().name;
}

policy::AdmissionSnapshot Service::snapshot(const ModelInfo& m, const policy::RequestShape& r,
                                            std::optional<JobId> self, Clock::duration waited) const {
  const auto now = clock_->now();
  policy::AdmissionSnapshot s;
  s.model = m.shape;
  s.request = r;
  s.gpu = policy::make_gpu_view(readings_.headroom(), readings_.pressure(), breaker_, gpu_queue_, ledger_, now, ledger_.is_resident(m.name),
                                backend_->offload_ready(m.name), self);
  s.gpu.present = gpu_usable(m.name);
  s.gpu.waited = waited;
  if (s.gpu.present) {
    s.gpu.evictable = evict_candidates(m.name);
    s.gpu.evicting_bytes = evicting_bytes();
    s.gpu.evict_budget = residency_.pressure_budget(now);
  }
  // Its GPU replica is coming back (docs/residency.md): the job may wait for it, or start on the CPU, whichever
  // finishes sooner by the measured rates.
  if (auto loading = replica_loading_eta(m, now)) {
    s.gpu.present = true;
    s.gpu.replica_loading = *loading;
    auto run_time = [&](const policy::JobQueue& q) {
      const double pf = q.rates().prefill_tps(), dc = q.rates().decode_tps();
      if (pf <= 0 || dc <= 0) return Clock::duration::zero();
      const double s = r.prompt_tokens / pf + r.max_new_tokens / dc;
      return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
    };
    s.gpu.gpu_run = run_time(gpu_queue_);
    s.gpu.cpu_run = run_time(cpu_queue_);
  }
  std::optional<policy::ModelShape> fallback;
  if (!m.fallback.empty() && backend_->cpu_ready(m.fallback))
    for (const auto& f : backend_->models())
      if (f.name == m.fallback) fallback = f.shape;
  // Same files and settings → same fingerprint; a CPU-only model is its own reference.
  s.cpu = policy::make_cpu_view(cpu_queue_, host_guard_, readings_.host(), backend_->cpu_ready(m.name),
                                /*fingerprint_compatible=*/true, fallback, self);
  // Both routes run a step loop (continuous batching) whose prompt chunks never exceed the policy's cap
  // (engine::BatchLimits::chunk_for: step_tokens − max_batch + 1 ≤ step_tokens − running), so the estimates may
  // count on it.
  s.gpu.step_tokens = gpu_queue_.config().step_tokens;
  s.cpu.step_tokens = cpu_queue_.config().step_tokens;
  return s;
}

std::optional<Clock::duration> Service::replica_loading_eta(const ModelInfo& m, Clock::time_point now) const {
  const Residency::Replica* r = residency_.find(m.name);
  if (!r || r->state != ReplicaState::loading || readings_.device_lost() || !holds_.empty()) return std::nullopt;
  // The last load of this replica, else its weights at 1 GiB/s (a warm page cache is faster, a cold disk slower).
  Clock::duration expect = r->last_load;
  if (expect <= Clock::duration::zero())
    expect = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(static_cast<double>(m.weight_bytes) / static_cast<double>(1ull << 30)));
  const auto elapsed = now - r->since;
  return expect > elapsed ? expect - elapsed : Clock::duration::zero();
}

bool Service::gpu_usable(const std::string& model) const {
  auto acc = backend_->accelerator();
  return acc && !readings_.device_lost() && holds_.empty() && residency_.usable(model) && backend_->gpu_ready(model);
}

policy::Decision Service::decide(const Prepared& p, std::optional<JobId> self, Clock::duration waited) {
  return admission_.decide(snapshot(*p.model, p.shape, self, waited));
}

Result<Dict> Service::plan(const Caller& c, const SubmitRequest& req) {
  auto p = prepare(c, req, /*for_plan=*/true);
  if (!p) return fail(std::move(p).error());
  refresh_readings();
  const Decision d = decide(*p, std::nullopt, {});
  Dict out;
  out["action"] = action_name(d.action);
  out["reason"] = std::string(policy::reason_name(d.reason));
  out["detail"] = d.detail;
  out["route"] = route_name(d.route);
  out["model"] = d.route.model.empty() ? p->model->name : d.route.model;
  out["fallback_model"] = d.route.fallback_model;
  out["max_new_tokens"] = d.max_new_tokens;
  out["prefill_chunk"] = d.prefill_chunk;
  out["gpu_layers"] = d.route.gpu_layers;
  out["eta_ms"] = to_ms(d.eta);
  out["eta_known"] = eta_known(d.route.device);
  out["retry_after_ms"] = to_ms(d.retry_after);
  out["permanent"] = d.permanent;
  out["pressure"] = std::string(policy::pressure_name(d.pressure));
  out["prompt_tokens"] = p->shape.prompt_tokens;
  std::vector<std::pair<std::string, std::string>> skipped;
  for (const auto& s : d.skipped) skipped.emplace_back(action_name(s.rung), std::string(policy::reason_name(s.reason)));
  out["skipped"] = skipped;
  const auto& b = d.breakdown;
  out["breakdown"] = std::map<std::string, std::uint64_t>{
      {"weights", b.weights_bytes}, {"kv_cache", b.kv_bytes}, {"activations", b.activation_bytes},
      {"fragmentation", b.fragmentation_bytes}, {"total", b.total_bytes}, {"kv_blocks", b.kv_blocks},
      {"layers", b.layers}};
  const auto& h = d.headroom;
  out["headroom"] = std::map<std::string, std::int64_t>{
      {"total", static_cast<std::int64_t>(h.total_bytes)}, {"margin", static_cast<std::int64_t>(h.margin_bytes)},
      {"predicted_headroom", h.predicted_headroom}, {"observed_headroom", h.observed_headroom},
      {"headroom", h.headroom}, {"unmaterialized", static_cast<std::int64_t>(h.unmaterialized_bytes)}};
  if (d.host)
    out["host"] = std::map<std::string, std::uint64_t>{{"mapped_weights", d.host->mapped_weights_bytes},
                                                       {"kv", d.host->kv_bytes},
                                                       {"activations", d.host->activation_bytes}};
  return out;
}

Result<Dict> Service::submit(const Caller& c, const SubmitRequest& req) {
  auto p = prepare(c, req, /*for_plan=*/false);
  if (!p) return fail(std::move(p).error());
  const auto now = clock_->now();
  // Idempotency: the same key returns the job it named (never a second run).
  if (const auto& key = p->req.options.idempotency_key) {
    if (auto found = idempotency_.find(scoped_key(c.uid, *key))) {
      JobRecord* j = find(found->job);
      if (j) {
        if (j->digest != p->digest)
          return fail(Errc::duplicate, "idempotency_key '" + key->substr(0, 64) + "' names job " +
                                           std::to_string(j->id) + " with a different request");
        if (j->phase == JobPhase::failed)
          return fail(Errc::resumable, "job " + std::to_string(j->id) + " for this idempotency key failed (" +
                                           j->reason + "): call Resume; job=" + std::to_string(j->id) +
                                           "; tokens=" + std::to_string(j->tokens.size()) +
                                           "; retry_after_ms=" + std::to_string(j->retry_after_ms));
        Dict out = placement(*j);
        out["existing"] = true;
        if (!j->terminal()) {  // the client that retries (often after a crash) gets the rest of the updates
          j->owner = c.bus_name;
          j->reply_to = c.reply_to;
          j->muted = false;
        }
        return out;
      }
    }
  }
  if (active_jobs_of(c.bus_name) >= cfg_.runtime.max_jobs_per_client)
    return fail(Errc::queue_full, "at most " + std::to_string(cfg_.runtime.max_jobs_per_client) +
                                      " unfinished jobs per client; retry_after_ms=1000");
  wake_replica(p->model->name);  // keep_alive: a replica given back while idle comes back
  refresh_readings();
  update_service_state();  // a degraded-mode change is announced before this job's placement
  const Decision d = decide(*p, std::nullopt, {});
  if (!d.accepted()) {
    ++counters_["jobs_rejected"];
    return rejected_error(d);
  }
  (void)now;
  return accept(c, std::move(p).value(), d, std::nullopt);
}

Result<Dict> Service::accept(const Caller& c, Prepared p, const Decision& d, std::optional<JobId> resumed_from) {
  const auto now = clock_->now();
  auto rec = std::make_unique<JobRecord>();
  JobRecord& j = *rec;
  j.id = next_id_;
  j.kind = p.kind;
  j.embed = p.embed;
  j.transcribe = p.transcribe;
  if (j.embed) {
    j.embed->n_texts = static_cast<std::uint32_t>(j.embed->texts.size());
    j.embed->n_images = static_cast<std::uint32_t>(j.embed->images.size());
  }
  j.fsm.emplace(j.id, p.sampling.seed, p.model->name, now);
  j.req = p.req;
  j.request_json = p.request_json;
  j.owner = c.bus_name;
  j.reply_to = c.reply_to;
  j.uid = c.uid;
  j.model = p.model->name;
  j.prompts[p.model->name] = p.prompt;
  j.sampling = p.sampling;
  j.max_new_tokens = d.max_new_tokens ? d.max_new_tokens + static_cast<std::uint32_t>(p.resume.size()) : p.max_new_tokens;
  j.stop = p.stop;
  j.prefill_chunk = d.prefill_chunk;
  j.resume = p.resume;
  j.tokens = p.resume;
  j.shape = p.shape;
  j.digest = p.digest;
  j.key = p.req.options.idempotency_key ? scoped_key(c.uid, *p.req.options.idempotency_key) : "";
  j.side_effects = p.shape.side_effects;
  j.stream = p.req.options.stream.value_or(true);
  j.muted = j.kind == WorkloadKind::embed;  // an Embed call's answer is its reply (EmbedWork::waiters), not updates
  j.route = d.route;
  if (j.route.model.empty()) j.route.model = p.model->name;
  j.decision = d;
  j.accepted_unix_ms = unix_ms();
  j.accepted_at = now;
  if (p.req.options.deadline_ms) j.deadline = now + std::chrono::milliseconds(*p.req.options.deadline_ms);
  j.degraded = d.route.device != policy::Device::gpu || d.route.fallback_model;
  if (d.host) j.host = d.host;

  bool key_freed = false;  // the key's job was withdrawn by a failed commit: it was never accepted
  if (!j.key.empty()) {  // would the key be ours? (checked before the journal write; claimed after it)
    auto found = idempotency_.find(j.key);
    const bool failed = found && found->outcome && found->outcome->phase == JobPhase::failed;
    key_freed = failed && found->outcome->summary == kNotAccepted;
    const bool can_claim = !found || (resumed_from && failed) || key_freed || p.reclaim_key;
    auto claim = can_claim ? Result<policy::Claim>(policy::Claim{j.id, true, std::nullopt})
                           : Result<policy::Claim>(policy::Claim{found->job, false, found->outcome});
    if (!claim) return fail(std::move(claim).error());
    if (!claim->created) {  // the key names another job (a second Resume, a pruned record): never a second run
      if (const JobRecord* other = find(claim->job)) {
        Dict out = placement(*other);
        out["existing"] = true;
        return out;
      }
      return fail(Errc::duplicate, "idempotency_key '" + j.key.substr(0, 64) + "' names job " +
                                       std::to_string(claim->job) + ", which is no longer kept");
    }
  }
  // Durable before acknowledged.
  JournalJob jj;
  jj.id = j.id;
  jj.model = j.model;
  jj.idempotency_key = j.key;
  jj.request_digest = j.digest;
  jj.owner_uid = j.uid;
  jj.request_json = j.request_json.dump();
  jj.accepted_unix_ms = j.accepted_unix_ms;
  Status journaled = journal_->accepted(jj);
  if (!journaled) {
    ++counters_["journal_write_errors"];
  } else if (!group_commit_) {  // else: the loop's commit() (group commit)
    journaled = journal_->commit();
    if (!journaled) resync_journaled_tokens();  // the commit undid checkpoints of running jobs too
  }
  if (!journaled) {
    log::error("journal write failed, job not accepted: {}", journaled.error().message);
    return fail(Errc::internal, "could not journal the job (" + journaled.error().message + "); it was not accepted");
  }
  j.durable_at = journal_->appended_seq();
  if (group_commit_) {  // not durable yet: not dispatched, not announced, not shown (see commit())
    j.accept_pending = true;
    pending_accepts_.push_back(j.id);
  }
  ++next_id_;
  ++counters_["jobs_accepted"];
  if (!j.key.empty())
    if (auto claim = idempotency_.claim(j.key, j.id, j.digest, now, resumed_from.has_value() || key_freed || p.reclaim_key);
        !claim)
      log::error("job {}: idempotency key not recorded: {}", j.id, claim.error().message);
  j.history.emplace_back("", "queued", "accepted", j.accepted_unix_ms);
  JobRecord* jp = rec.get();
  jobs_.emplace(j.id, std::move(rec));
  active_.insert(jp->id);

  // Place it.
  const policy::QueueEntry entry =
      queue_entry(*jp, d.action == Rung::route_cpu ? policy::Device::cpu : policy::Device::gpu, now);
  Status placed;
  if (d.action == Rung::route_cpu) {
    jp->queue = QueueId::cpu;
    placed = cpu_queue_.enqueue(entry);
  } else if (d.action == Rung::delay || d.action == Rung::evict) {
    jp->queue = QueueId::gpu;
    placed = gpu_queue_.enqueue(entry);
  } else {  // admit, reduce, offload: the policy checked the slot, the memory and that nothing is queued ahead
    jp->queue = QueueId::gpu;
    placed = gpu_queue_.enqueue(entry);
  }
  if (!placed) {
    end_job(*jp, JobPhase::failed, "queue_error", Errc::internal, placed.error().message, 1s);
  } else {
    emit(*jp, "accepted", {{"model", jp->model}, {"route", route_name(jp->route)}});
    Dict routed{{"route", route_name(jp->route)},
                {"reason", std::string(policy::reason_name(d.reason))},
                {"model", jp->route.model},
                {"fallback_model", jp->route.fallback_model},
                {"degraded", jp->degraded},
                {"queue", queue_name(jp->queue)},
                {"eta_ms", to_ms(d.eta)},
                {"eta_known", eta_known(*jp)}};
    emit(*jp, "routed", routed);
    if (jp->degraded)
      log::info("job {} routed {}: {} ({})", jp->id, route_name(jp->route), policy::reason_name(d.reason), d.detail);
    evict_for(d, jp->model);
    etas_dirty_ = true;  // the jobs ahead of it now share their steps with it
    pump();
  }
  Dict out = placement(*jp);
  out["existing"] = false;
  if (!jp->terminal()) jp->announced_finish = now + std::chrono::milliseconds(std::get<std::uint64_t>(out["eta_ms"]));
  return out;
}

Dict Service::placement(const JobRecord& j) const {
  Dict out;
  out["job_id"] = j.id;
  out["state"] = phase_name(j.phase);
  out["action"] = action_name(j.decision.action);
  out["reason"] = std::string(policy::reason_name(j.decision.reason));
  out["detail"] = j.decision.detail;
  out["route"] = route_name(j.route);
  out["queue"] = queue_name(j.queue);
  std::uint32_t pos = 0;
  std::uint64_t eta = 0;
  const policy::JobQueue* q = queue_of(j.queue);
  if (q) {
    if (auto p = q->position(j.id)) pos = static_cast<std::uint32_t>(*p + 1);
    // When it finishes at the latest, by the simulation of the route's step loop at its measured step costs.
    if (auto e = q->eta_done(j.id)) eta = to_ms(*e);
  }
  out["queue_position"] = pos;  // 1 = next; 0 = running or not queued
  out["eta_ms"] = std::max(eta, to_ms(j.decision.eta));
  out["eta_known"] = eta_known(j);
  out["model"] = j.route.model.empty() ? j.model : j.route.model;
  out["fallback_model"] = j.route.fallback_model;
  std::string fp;
  for (const auto& m : backend_->models())
    if (m.name == (j.route.model.empty() ? j.model : j.route.model)) fp = m.fingerprint;
  out["fingerprint"] = fp;
  out["max_new_tokens"] = j.max_new_tokens;
  out["prefill_chunk"] = j.prefill_chunk;
  out["gpu_layers"] = j.route.gpu_layers;
  out["degraded"] = j.degraded;
  if (j.kind == WorkloadKind::generate) out["prompt_tokens"] = j.shape.prompt_tokens;
  // How much slower than the GPU this route is expected to be (smoothed decode rates; 1 on the GPU; 0 = unknown).
  out["expected_slowdown"] = j.route.device == policy::Device::cpu ? expected_slowdown() : 1.0;
  return out;
}

bool Service::eta_known(policy::Device route) const {
  return !(route == policy::Device::cpu ? cpu_queue_ : gpu_queue_).rates().from_priors();
}

bool Service::eta_known(const JobRecord& j) const {
  if (j.kind == WorkloadKind::generate) return eta_known(j.route.device);
  return workload(j).fixed_time(*this, j, j.route.device).has_value();  // its units' measured times
}

double Service::expected_slowdown() const {
  const auto& cpu = cpu_queue_.rates();
  const auto& gpu = gpu_queue_.rates();
  if (cpu.from_priors() || gpu.from_priors() || cpu.decode_tps() <= 0) return 0.0;
  return gpu.decode_tps() / cpu.decode_tps();
}

}  // namespace tandem::daemon
