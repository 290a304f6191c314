// The C API (tandem_ring.h) over client::Client + client::RingSession. Nothing throws across it.
#include "client/tandem_ring.h"

#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <string>

#include "client/client.h"
#include "client/ring_session.h"

namespace tc = tandem::client;

struct tandem_session {
  std::unique_ptr<tc::Client> client;
  std::unique_ptr<tc::RingSession> ring;
  std::deque<tc::RingEvent> pending;
  tc::RingEvent current;  // backs the strings of the last event handed out
  std::string error;
};

namespace {

void copy_error(char* err, std::size_t size, const std::string& msg) {
  if (!err || size == 0) return;
  std::snprintf(err, size, "%s", msg.c_str());
}

int code_for(const tandem::Error& e) {
  switch (e.code) {
    case tandem::Errc::queue_full: return TANDEM_E_AGAIN;
    case tandem::Errc::unavailable: return TANDEM_E_CLOSED;
    case tandem::Errc::invalid_argument: return TANDEM_E_INVALID;
    default: return TANDEM_E_INTERNAL;
  }
}

const char* c_str_or_empty(const std::optional<std::string>& s) { return s ? s->c_str() : ""; }

}  // namespace

extern "C" {

void tandem_request_init(tandem_request* r) {
  if (!r) return;
  std::memset(r, 0, sizeof *r);
  r->max_tokens = 0;
  r->temperature = -1.0;
  r->seed = -1;
  r->allow_cpu = -1;
}

int tandem_session_open(const char* bus, tandem_session** out, char* err, std::size_t err_size) {
  if (!out) return TANDEM_E_INVALID;
  *out = nullptr;
  try {
    auto spec = bus ? tc::parse_bus_spec(bus) : tc::bus_spec_from_env();
    if (!spec) {
      copy_error(err, err_size, spec.error().message);
      return TANDEM_E_INVALID;
    }
    auto client = tc::Client::connect(*spec);
    if (!client) {
      copy_error(err, err_size, client.error().message);
      return TANDEM_E_BUS;
    }
    auto ring = tc::RingSession::open(**client);
    if (!ring) {
      copy_error(err, err_size, ring.error().message);
      return ring.error().code == tandem::Errc::unavailable ? TANDEM_E_REFUSED
             : (*client)->last_error() && (*client)->last_error()->daemon_missing() ? TANDEM_E_BUS
                                                                                    : TANDEM_E_REFUSED;
    }
    auto s = std::make_unique<tandem_session>();
    s->client = std::move(client).value();
    s->ring = std::move(ring).value();
    *out = s.release();
    return TANDEM_OK;
  } catch (const std::exception& e) {
    copy_error(err, err_size, e.what());
    return TANDEM_E_INTERNAL;
  }
}

void tandem_session_close(tandem_session* s) {
  if (!s) return;
  try {
    s->ring.reset();
    s->client.reset();
  } catch (...) {
  }
  delete s;
}

uint64_t tandem_session_id(const tandem_session* s) { return s && s->ring ? s->ring->id() : 0; }

const char* tandem_session_error(const tandem_session* s) { return s ? s->error.c_str() : "no session"; }

int tandem_session_submit(tandem_session* s, const tandem_request* r, uint64_t user_data) {
  if (!s || !r || !r->prompt) return TANDEM_E_INVALID;
  try {
    tc::Request req;
    if (r->model) req.model = r->model;
    req.prompt = r->prompt;
    if (r->max_tokens > 0) req.options.max_tokens = static_cast<std::uint32_t>(r->max_tokens);
    if (r->temperature >= 0) req.options.temperature = r->temperature;
    if (r->seed >= 0) req.options.seed = static_cast<std::uint64_t>(r->seed);
    if (r->idempotency_key) req.options.idempotency_key = r->idempotency_key;
    if (r->side_effects) req.options.side_effects = true;
    if (r->allow_cpu >= 0) req.options.allow_cpu = r->allow_cpu != 0;
    auto st = s->ring->submit(req, user_data);
    if (!st) {
      s->error = st.error().message;
      return code_for(st.error());
    }
    return TANDEM_OK;
  } catch (const std::exception& e) {
    s->error = e.what();
    return TANDEM_E_INTERNAL;
  }
}

int tandem_session_cancel(tandem_session* s, uint64_t job_id, uint64_t user_data) {
  if (!s) return TANDEM_E_INVALID;
  auto st = s->ring->cancel(job_id, user_data);
  if (!st) {
    s->error = st.error().message;
    return code_for(st.error());
  }
  return TANDEM_OK;
}

int tandem_session_wait(tandem_session* s, tandem_event* ev, int timeout_ms) {
  if (!s || !ev) return TANDEM_E_INVALID;
  try {
    const auto deadline = timeout_ms < 0 ? std::chrono::steady_clock::time_point::max()
                                         : std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (s->pending.empty()) {
      std::vector<tc::RingEvent> got;
      const auto left = deadline - std::chrono::steady_clock::now();
      if (left <= std::chrono::steady_clock::duration::zero()) return TANDEM_E_TIMEOUT;
      auto n = s->ring->wait(got, std::min<std::chrono::nanoseconds>(left, std::chrono::seconds(1)));
      if (!n) {
        s->error = n.error().message;
        return TANDEM_E_INTERNAL;
      }
      for (auto& e : got) s->pending.push_back(std::move(e));
      if (s->pending.empty() && !s->ring->open()) {
        s->error = "the ring session ended: " + s->ring->state_text();
        return TANDEM_E_CLOSED;
      }
    }
    s->current = std::move(s->pending.front());
    s->pending.pop_front();
    const auto& e = s->current;
    std::memset(ev, 0, sizeof *ev);
    static const std::pair<const char*, tandem_event_kind> kinds[] = {
        {"accepted", TANDEM_EVENT_ACCEPTED}, {"routed", TANDEM_EVENT_ROUTED},     {"started", TANDEM_EVENT_STARTED},
        {"tokens", TANDEM_EVENT_TOKENS},     {"migrated", TANDEM_EVENT_MIGRATED}, {"finished", TANDEM_EVENT_FINISHED},
        {"error", TANDEM_EVENT_ERROR},       {"cancel_result", TANDEM_EVENT_CANCEL_RESULT}, {"nop", TANDEM_EVENT_NOP}};
    ev->kind = TANDEM_EVENT_ERROR;
    for (const auto& [name, k] : kinds)
      if (e.kind == name) ev->kind = k;
    ev->user_data = e.user_data;
    ev->job_id = e.job_id;
    ev->text = "";
    ev->route = ev->state = ev->finish_reason = ev->error_name = ev->error_message = "";
    ev->gap = e.gap;
    if (e.accepted) {
      const auto& p = e.accepted->placement;
      ev->route = c_str_or_empty(p.route);
      ev->degraded = p.degraded.value_or(false);
      ev->eta_ms = p.eta_ms.value_or(0);
      ev->state = c_str_or_empty(p.state);
    }
    if (e.update) {
      const auto& u = *e.update;
      if (u.text) {
        ev->text = u.text->c_str();
        ev->text_length = u.text->size();
      }
      if (u.tokens) {
        ev->tokens = u.tokens->data();
        ev->token_count = u.tokens->size();
      }
      ev->step = u.step.value_or(0);
      ev->route = c_str_or_empty(u.route ? u.route : u.to);
      ev->degraded = u.degraded.value_or(false);
      ev->eta_ms = u.eta_ms.value_or(0);
      ev->state = c_str_or_empty(u.state);
      ev->finish_reason = c_str_or_empty(u.finish_reason);
      ev->tokens_total = u.tokens_total.value_or(0);
      ev->error_name = c_str_or_empty(u.error_code);
      ev->error_message = c_str_or_empty(u.error_message);
      ev->retry_after_ms = u.retry_after_ms.value_or(0);
    }
    if (e.error) {
      // "io.tandem.Tandem1.Error.Busy" -> "Busy": short_name() returns a temporary; keep it in the event's storage.
      s->current.cancel_state = e.error->short_name();
      ev->error_name = s->current.cancel_state->c_str();
      ev->error_message = e.error->message.c_str();
      ev->retry_after_ms = e.error->retry_after_ms.value_or(0);
    } else if (e.cancel_state) {
      ev->state = e.cancel_state->c_str();
    }
    return TANDEM_OK;
  } catch (const std::exception& ex) {
    s->error = ex.what();
    return TANDEM_E_INTERNAL;
  }
}

}  // extern "C"
