// How a tandem-validate workload client talks to tandemd: submit, resume, cancel, GetJob and the stream of its
// job updates. Two implementations: D-Bus (make_dbus_transport: Submit + JobUpdate signals) and a shared-memory
// ring session (make_ring_transport: submit and updates through the ring, docs/rings.md; GetJob, Resume, Cancel and
// the properties over D-Bus). The runner never depends on how updates travel. One Transport per client thread (not
// thread-safe, like tandem::client::Client).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "client/client.h"
#include "core/result.h"

namespace tandem::validate {

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;  // "dbus"
  // Must be called before the first submit (updates that come before the submit's reply are not lost).
  virtual Status subscribe() = 0;
  virtual Result<client::SubmitResult> submit(const client::Request& r) = 0;
  // One Embed call, answered when its job ends (vectors or a typed error); blocks up to r.call_timeout. D-Bus:
  // Client::embed. Ring: an `embed` entry, answered by one `embedded` or `error` completion (other completions that
  // arrive meanwhile are kept for poll()).
  virtual Result<client::EmbedReply> embed(const client::EmbedRequest& r) = 0;
  // One Transcribe call (a file), answered with the placement like submit; the job's audio/segment/progress
  // updates follow through on_update. D-Bus: Client::transcribe. Ring: a `transcribe` entry (ABI 1.2).
  virtual Result<client::SubmitResult> transcribe(const client::TranscribeRequest& r) = 0;
  virtual Result<client::SubmitResult> resume(std::uint64_t job, const client::SubmitOptions& overrides) = 0;
  virtual Result<std::string> cancel(std::uint64_t job) = 0;
  virtual Result<client::JobInfo> get_job(std::uint64_t job) = 0;
  virtual Result<client::ServiceStatus> status() = 0;
  // Waits up to max_wait and dispatches what arrived to the handlers below.
  virtual Status poll(std::chrono::milliseconds max_wait) = 0;
  // The D-Bus (or ring) error of the last failed call, if it came from the other side.
  virtual std::optional<client::RemoteError> last_error() const = 0;

  std::function<void(const client::JobUpdate&)> on_update;
  std::function<void(const client::DegradedChange&)> on_degraded;
  std::function<void(const client::PropertiesChange&)> on_properties;
};

Result<std::unique_ptr<Transport>> make_dbus_transport(const client::BusSpec& bus);
Result<std::unique_ptr<Transport>> make_ring_transport(const client::BusSpec& bus);
// "dbus" | "ring"
Result<std::unique_ptr<Transport>> make_transport(const std::string& kind, const client::BusSpec& bus);

}  // namespace tandem::validate
