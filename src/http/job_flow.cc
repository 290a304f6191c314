// One HTTP request following one tandemd job (job_flow.h).
#include "http/job_flow.h"

namespace tandem::http {

using nlohmann::json;

JobFlow::JobFlow(Gateway& gw, std::shared_ptr<Exchange> ex, std::string endpoint, Flavor flavor)
    : gw_(gw), ex_(std::move(ex)), endpoint_(std::move(endpoint)), flavor_(flavor), life_(gw.life()) {}

JobFlow::~JobFlow() {
  if (!life_.expired()) release();  // tandemd's link may let go of a flow after the Gateway is gone (shutdown)
}

bool JobFlow::begin() {
  client_ = ex_->request().client;
  if (!gw_.take_slot(client_)) {
    gw_.metrics().refused("streams_per_client");
    fail({429, "rate_limit_error", "too_many_requests", "",
          "this client has " + std::to_string(gw_.config().max_streams_per_client) +
              " requests in flight (max_streams_per_client)",
          1000, std::nullopt});
    return false;
  }
  slot_ = true;
  // Weak: the flow lives while tandemd's link (or a pending call) holds it; the exchange must not keep it alive
  // (the flow holds the exchange: a strong capture would be a cycle for a request that never completes).
  ex_->on_close([weak = weak_from_this()] {
    if (auto self = weak.lock()) self->client_gone();
  });
  return true;
}

void JobFlow::accepted(const client::SubmitResult& s) {
  view_.accepted(s);
  if (!life_.expired()) gw_.note_job(s.job_id, client_);
  if (gone_) return cancel_job();
  on_accepted();
  // An Idempotency-Key that named an earlier job: that job's updates went to its first submitter (or are over), so
  // its outcome is read with GetJob until it is terminal.
  if (s.placement.existing.value_or(false)) follow_existing();
}

void JobFlow::follow_existing() {
  if (done_ || gone_ || life_.expired()) return;
  std::weak_ptr<JobFlow> weak = weak_from_this();
  gw_.backend().get_job(view_.job(), [weak](Outcome<client::JobInfo> j) {
    auto self = weak.lock();
    if (!self || self->done_ || self->gone_) return;
    if (!j.ok()) return self->fail(error_from_remote(j.error));
    const client::JobInfo& info = *j.value;
    if (!client::is_terminal_state(info.state.value_or(""))) {
      // Still running for its first submitter: look again in a moment.
      return self->gw_.defer(std::chrono::milliseconds(250), [weak] {
        if (auto s = weak.lock()) s->follow_existing();
      });
    }
    client::JobUpdate u;
    u.job_id = self->view_.job();
    u.kind = "finished";
    u.state = info.state;
    u.finish_reason = info.finish_reason;
    u.reason = info.reason;
    u.text = info.text;
    if (info.tokens) u.tokens_total = static_cast<std::uint32_t>(info.tokens->size());
    u.error_code = info.error_code;
    u.error_message = info.error_message;
    u.retry_after_ms = info.retry_after_ms;
    u.language = info.language;
    self->update(u);
  });
}

void JobFlow::update(const client::JobUpdate& u) {
  const bool changed = view_.update(u);
  if (gone_ || done_) return;
  on_update(u, changed);
}

void JobFlow::degraded(const client::DegradedChange& d) {
  if (view_.degraded_change(d) && streaming_ && !done_ && !gone_) announce("change");
}

void JobFlow::lost(const std::string& why) {
  if (done_) return;
  if (!view_.job())
    return fail({503, "server_error", "tandemd_unavailable", "", "lost tandemd before the job was accepted: " + why, 1000,
                 std::nullopt});
  if (!resumable())
    return fail({503, "server_error", "failed", "",
                 "lost tandemd while job " + std::to_string(view_.job()) + " was open (" + why +
                     "); it cannot be resumed: send the request again",
                 1000, std::nullopt});
  fail({503, "server_error", "resumable", "",
        "lost tandemd while job " + std::to_string(view_.job()) + " was open (" + why +
            "); the job is kept in tandemd's journal: GET /tandem/v1/jobs/" + std::to_string(view_.job()) +
            " reads it, POST " + resume_path(view_.job()) + " resumes it",
        1000, view_.job()});
}

void JobFlow::start_stream(const std::string& content_type) {
  Headers h = gw_.cors_headers(ex_->request());
  for (auto& kv : view_.headers()) h.push_back(std::move(kv));
  h.emplace_back("Cache-Control", "no-cache");
  h.emplace_back("X-Accel-Buffering", "no");
  ex_->start_stream(200, content_type, std::move(h));
  streaming_ = stream_counted_ = true;
  gw_.metrics().stream_opened();
  announce("placement");
}

void JobFlow::announce(const char* event) {
  json t = view_.tandem_json();
  t["event"] = event;
  if (flavor_ == Flavor::ollama) ex_->send(ndjson(ndjson_state(std::move(t))));
  else ex_->send(sse_comment(t));
}

void JobFlow::fail(const ApiError& e) {
  done_ = true;
  if (!gone_) {
    if (streaming_) {
      // The stream's last event: the official clients raise it (OpenAI: no [DONE] follows; Ollama: an {"error"} line).
      gw_.metrics().request(endpoint_, view_.route(), e.status);
      json body = error_json(e, flavor_);
      json t = view_.tandem_json();
      if (body.contains("tandem"))
        for (auto it = body["tandem"].begin(); it != body["tandem"].end(); ++it) t[it.key()] = it.value();
      body["tandem"] = std::move(t);
      ex_->send(flavor_ == Flavor::ollama ? ndjson(body) : sse_data(body));
      ex_->end_stream();
    } else {
      gw_.error(ex_, endpoint_, flavor_, e);
    }
  }
  release();
}

void JobFlow::release() {
  if (slot_) gw_.give_slot(client_);
  if (stream_counted_) gw_.metrics().stream_closed();
  slot_ = stream_counted_ = false;
}

void JobFlow::client_gone() {
  if (gone_ || done_) return;
  gone_ = true;
  release();
  if (view_.job()) cancel_job();
}

void JobFlow::cancel_job() {
  if (cancelled_ || view_.finished()) return;
  cancelled_ = true;
  gw_.metrics().client_cancel();
  gw_.backend().cancel(view_.job());
}

}  // namespace tandem::http
