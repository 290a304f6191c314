// The ring transport: a workload client submits through a shared-memory ring session (docs/rings.md) and reads its
// job updates from the completion ring; GetJob, Resume, Cancel and the properties go over the same client's D-Bus
// connection (its signals still bring PropertiesChanged). Degraded mode comes in order inside the ring
// (`degraded_mode` completions), ahead of the first completion of a job placed under it.
#include <deque>
#include <functional>
#include <set>

#include "client/ring_session.h"
#include "validate/transport.h"

namespace tandem::validate {

namespace {

class RingTransport final : public Transport {
 public:
  RingTransport(std::unique_ptr<client::Client> c, std::unique_ptr<client::RingSession> r)
      : c_(std::move(c)), ring_(std::move(r)) {
    c_->on_job_update([this](const client::JobUpdate& u) {
      c_->forget_job_updates(u.job_id);  // Resume'd jobs are D-Bus jobs: their updates come as signals
      if (on_update) on_update(u);
    });
    c_->on_properties_change([this](const client::PropertiesChange& p) {
      if (on_properties) on_properties(p);
    });
    // DegradedModeChanged signals are not used: the ring carries the same announcement in order.
  }
  ~RingTransport() override {
    ring_.reset();  // CloseSession before the connection goes
  }

  std::string name() const override { return "ring"; }
  Status subscribe() override { return c_->subscribe(); }

  Result<client::SubmitResult> submit(const client::Request& r) override {
    return place([&](std::uint64_t ud) { return ring_->submit(r, ud); });
  }
  Result<client::SubmitResult> transcribe(const client::TranscribeRequest& r) override {
    return place([&](std::uint64_t ud) { return ring_->transcribe(r, ud); });
  }

  // A job-creating entry (submit, transcribe) and its answer: `accepted` or `error`.
  Result<client::SubmitResult> place(const std::function<Result<void>(std::uint64_t)>& send) {
    last_error_.reset();
    const std::uint64_t ud = ++next_user_data_;
    for (int attempt = 0;; ++attempt) {
      auto st = send(ud);
      if (st) break;
      if (st.error().code != Errc::queue_full || attempt > 1000) return fail(st.error());
      if (auto p = read(std::chrono::milliseconds(10)); !p) return fail(p.error());  // room comes as we reap
    }
    for (;;) {
      for (auto it = pending_.begin(); it != pending_.end(); ++it) {
        if (it->user_data != ud || !(it->accepted || it->error)) continue;
        client::RingEvent ev = std::move(*it);
        pending_.erase(it);
        if (ev.error) {
          last_error_ = *ev.error;
          return fail(client::to_error(*ev.error));
        }
        // The D-Bus path delivers an "accepted" JobUpdate before the others: so does this one.
        client::JobUpdate u;
        u.job_id = ev.job_id;
        u.kind = "accepted";
        u.route = ev.accepted->placement.route;
        u.model = ev.accepted->placement.model;
        synthesized_.push_back(std::move(u));
        return *ev.accepted;
      }
      if (!ring_->open()) return fail(Errc::unavailable, "the ring session ended: " + ring_->state_text());
      if (auto p = read(std::chrono::seconds(1)); !p) return fail(p.error());
    }
  }
  Result<client::EmbedReply> embed(const client::EmbedRequest& r) override {
    last_error_.reset();
    const std::uint64_t ud = ++next_user_data_;
    for (int attempt = 0;; ++attempt) {
      auto st = ring_->embed(r, ud);
      if (st) break;
      if (st.error().code != Errc::queue_full || attempt > 1000) return fail(st.error());
      if (auto p = read(std::chrono::milliseconds(10)); !p) return fail(p.error());
    }
    embeds_.insert(ud);
    const auto until = std::chrono::steady_clock::now() + r.call_timeout;
    for (;;) {
      for (auto it = pending_.begin(); it != pending_.end(); ++it) {
        if (it->user_data != ud || !(it->embedded || it->error)) continue;
        client::RingEvent ev = std::move(*it);
        pending_.erase(it);
        embeds_.erase(ud);
        if (ev.error) {
          last_error_ = *ev.error;
          return fail(client::to_error(*ev.error));
        }
        return std::move(*ev.embedded);
      }
      if (!ring_->open()) return fail(Errc::unavailable, "the ring session ended: " + ring_->state_text());
      if (std::chrono::steady_clock::now() > until)
        return fail(Errc::timeout, "no answer to the ring embed within the call timeout");
      if (auto p = read(std::chrono::milliseconds(200)); !p) return fail(p.error());
    }
  }
  Result<client::SubmitResult> resume(std::uint64_t job, const client::SubmitOptions& o) override {
    auto r = c_->resume(job, o);
    last_error_ = c_->last_error();
    return r;
  }
  Result<std::string> cancel(std::uint64_t job) override {
    auto r = c_->cancel(job);
    last_error_ = c_->last_error();
    return r;
  }
  Result<client::JobInfo> get_job(std::uint64_t job) override {
    auto r = c_->get_job(job);
    last_error_ = c_->last_error();
    return r;
  }
  Result<client::ServiceStatus> status() override { return c_->status(); }

  Status poll(std::chrono::milliseconds max_wait) override {
    deliver();
    if (auto r = c_->process(std::chrono::milliseconds(0)); !r) return fail(r.error());
    if (auto p = read(max_wait); !p) return fail(p.error());
    deliver();
    if (!ring_->open()) return fail(Errc::unavailable, "the ring session ended: " + ring_->state_text());
    return {};
  }
  std::optional<client::RemoteError> last_error() const override { return last_error_; }

 private:
  Status read(std::chrono::milliseconds max_wait) {
    std::vector<client::RingEvent> evs;
    auto n = ring_->wait(evs, max_wait);
    if (!n) return fail(n.error());
    for (auto& e : evs) pending_.push_back(std::move(e));
    return {};
  }

  // Hands out what is pending, in ring order (submit answers stay until submit() takes them).
  void deliver() {
    for (auto& u : synthesized_)
      if (on_update) on_update(u);
    synthesized_.clear();
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->accepted || (it->error && it->job_id == 0) || embeds_.count(it->user_data)) {
        // a submit's or an embed's answer: submit() / embed() takes it
        ++it;
        continue;
      }
      client::RingEvent ev = std::move(*it);
      it = pending_.erase(it);
      if (ev.degraded && on_degraded) on_degraded(*ev.degraded);
      if (ev.update && on_update) on_update(*ev.update);
    }
  }

  std::unique_ptr<client::Client> c_;
  std::unique_ptr<client::RingSession> ring_;
  std::deque<client::RingEvent> pending_;
  std::vector<client::JobUpdate> synthesized_;
  std::optional<client::RemoteError> last_error_;
  std::uint64_t next_user_data_ = 0;
  std::set<std::uint64_t> embeds_;  // embeds waiting for their answer
};

}  // namespace

Result<std::unique_ptr<Transport>> make_ring_transport(const client::BusSpec& bus) {
  auto c = client::Client::connect(bus);
  if (!c) return fail(c.error());
  // A request area of 8 MiB: a transcription's whole file rides in one record (at most half the area).
  client::SessionOptions so;
  so.request_data_bytes = 8u << 20;
  auto r = client::RingSession::open(**c, so);
  if (!r) return fail(r.error());
  return std::unique_ptr<Transport>(std::make_unique<RingTransport>(std::move(*c), std::move(*r)));
}

Result<std::unique_ptr<Transport>> make_transport(const std::string& kind, const client::BusSpec& bus) {
  if (kind == "ring") return make_ring_transport(bus);
  return make_dbus_transport(bus);
}

}  // namespace tandem::validate
