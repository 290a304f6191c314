// The D-Bus transport: one tandem::client::Client (its own bus connection) per workload client.
#include "validate/transport.h"

namespace tandem::validate {

namespace {

class DbusTransport final : public Transport {
 public:
  explicit DbusTransport(std::unique_ptr<client::Client> c) : c_(std::move(c)) {
    c_->on_job_update([this](const client::JobUpdate& u) {
      c_->forget_job_updates(u.job_id);  // the runner keeps its own record; don't grow the client's buffer
      if (on_update) on_update(u);
    });
    c_->on_degraded_change([this](const client::DegradedChange& d) {
      if (on_degraded) on_degraded(d);
    });
    c_->on_properties_change([this](const client::PropertiesChange& p) {
      if (on_properties) on_properties(p);
    });
  }
  std::string name() const override { return "dbus"; }
  Status subscribe() override { return c_->subscribe(); }
  Result<client::SubmitResult> submit(const client::Request& r) override { return c_->submit(r); }
  Result<client::EmbedReply> embed(const client::EmbedRequest& r) override { return c_->embed(r); }
  Result<client::SubmitResult> transcribe(const client::TranscribeRequest& r) override { return c_->transcribe(r); }
  Result<client::SubmitResult> resume(std::uint64_t job, const client::SubmitOptions& o) override {
    return c_->resume(job, o);
  }
  Result<std::string> cancel(std::uint64_t job) override { return c_->cancel(job); }
  Result<client::JobInfo> get_job(std::uint64_t job) override { return c_->get_job(job); }
  Result<client::ServiceStatus> status() override { return c_->status(); }
  Status poll(std::chrono::milliseconds max_wait) override {
    auto r = c_->process(max_wait);
    if (!r) return fail(r.error());
    return {};
  }
  std::optional<client::RemoteError> last_error() const override { return c_->last_error(); }

 private:
  std::unique_ptr<client::Client> c_;
};

}  // namespace

Result<std::unique_ptr<Transport>> make_dbus_transport(const client::BusSpec& bus) {
  auto c = client::Client::connect(bus);
  if (!c) return fail(c.error());
  return std::unique_ptr<Transport>(std::make_unique<DbusTransport>(std::move(*c)));
}

}  // namespace tandem::validate
