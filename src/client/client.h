// tandemd's client library (torch-free): bus selection, typed wrappers for every method and property of
// io.tandem.Tandem1 (+ .Testing), the signals, error mapping and a small single-threaded event loop helper.
// Used by tandemctl and tandem-validate. The method calls go through the proxies generated from the XML
// (dbus/meson.build), so a contract change that breaks the types breaks this build.
//
// Threading: a Client is single-threaded. Signal callbacks run inside process(), on the caller's thread.
// Nothing here throws: sdbus::Error is caught at this edge and returned as tandem::Error (details in last_error()).
#pragma once

#include <sdbus-c++/sdbus-c++.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "client/format.h"
#include "client/requests.h"
#include "core/result.h"

namespace tandem::client {


using VariantMap = std::map<std::string, sdbus::Variant>;

// ---------------------------------------------------------------------------------------------------------------
// Bus selection

enum class BusKind { system, session, address };

struct BusSpec {
  BusKind kind = BusKind::system;
  std::string address;  // kind == address only, e.g. "unix:path=/run/tandem-test/bus"

  std::string describe() const;  // "the system bus", "the session bus", "the bus at unix:path=..."
  std::string flag() const;      // "--system", "--session", "--address 'unix:path=...'" (for ready-to-paste commands)
  friend bool operator==(const BusSpec&, const BusSpec&) = default;
};

// "system" | "session" | "address=<dbus address>" (the address must not be empty).
Result<BusSpec> parse_bus_spec(std::string_view text);
// TANDEM_BUS if set (same syntax; an invalid value is an error naming TANDEM_BUS), else the system bus.
Result<BusSpec> bus_spec_from_env();
// The message for a failed connect: "cannot connect to the system bus (Failed to open bus: No medium found): is
// dbus running? use --session or --address".
std::string connect_error_message(const BusSpec& bus, std::string_view error_name, std::string_view error_message);
// Opens a connection (createSystemBusConnection / createSessionBusConnection / ...WithAddress).
Result<std::unique_ptr<sdbus::IConnection>> connect_bus(const BusSpec& bus);


// a{sv} of the request options (only the fields that are set).
// idempotency_key s, allow_cpu b, deadline_ms t, truncate b (only those set).
VariantMap to_dbus(const EmbedOptions& o);
// Only the options that are set.
VariantMap to_dbus(const TranscribeOptions& o);

// a{sv} with the XML's key names and types: max_tokens u, temperature d, top_k u, top_p d, repetition_penalty d,
// seed t, stop as, idempotency_key s, side_effects b, allow_cpu b, allow_reduce b, allow_fallback_model b,
// deadline_ms t, prefill_chunk u, resume_tokens ai, stream b.
VariantMap to_dbus(const SubmitOptions& o);
sdbus::Variant to_dbus(const PolicyValue& v);
VariantMap to_dbus(const std::map<std::string, PolicyValue>& policy);

// ---------------------------------------------------------------------------------------------------------------
// Replies -> plain views (lenient: any integer type is accepted for an integer key when in range; keys that are
// unknown or of another type go to `unparsed`).

Placement placement_from_dbus(const VariantMap& m);
ResidencyReply residency_from_dbus(const VariantMap& m);
PlanDecision plan_from_dbus(const VariantMap& m);
JobInfo job_from_dbus(const VariantMap& m);
ModelInfo model_from_dbus(const VariantMap& m);
EmbedInfo embed_info_from_dbus(const VariantMap& m);
JobUpdate job_update_from_dbus(std::uint64_t job_id, const std::string& kind, const VariantMap& data);
DegradedChange degraded_from_dbus(bool degraded, const std::string& reason, const VariantMap& details);
PolicySettings policy_from_dbus(const VariantMap& m);
MemoryInfo memory_from_dbus(const VariantMap& m);
HostMemoryInfo host_memory_from_dbus(const VariantMap& m);
// Properties.GetAll (or the changed part of PropertiesChanged) -> ServiceStatus. Property names not known -> unparsed.
ServiceStatus status_from_dbus(const VariantMap& properties);
// io.tandem.Tandem1.Model GetAll -> ModelDetails (path is filled by the caller).
ModelDetails model_details_from_dbus(const VariantMap& properties);
// The object path of a model: /io/tandem/Tandem1/models/<name>, every byte outside [A-Za-z0-9] as _XX (lower-case
// hex), as sd_bus_path_encode does; "" -> "_".
std::string model_object_path(std::string_view name);

// ---------------------------------------------------------------------------------------------------------------
// Interrupts: SIGINT/SIGTERM/SIGHUP end up as their signal number in a non-blocking self-pipe that process() can
// watch (pass interrupt_fd()). The signals are blocked in the calling thread (and threads it starts later) and
// taken by a small sigwait() thread, so a blocking D-Bus call is never cut short by EINTR (sd_bus_call would lose
// the reply of a request the daemon already acted on). A real sigaction handler covers threads started earlier.
// Call it from main() before starting other threads.

// second_sigint_exit_code >= 0: a second SIGINT calls _exit(code) at once (even while a call blocks); < 0: every
// SIGINT is just reported.
Result<void> install_interrupt_handler(int second_sigint_exit_code = -1);
int interrupt_fd();                  // -1 before install_interrupt_handler()
std::vector<int> take_interrupts();  // signal numbers caught since the last call (drains the pipe)

// ---------------------------------------------------------------------------------------------------------------
// Client

enum class Wake {
  dispatched,   // at least one message (signal) was processed
  interrupted,  // the extra fd (e.g. interrupt_fd()) became readable
  timed_out,    // max_wait passed without either
};

struct SessionHandles {
  std::uint64_t session_id = 0;
  int memfd = -1, submit_doorbell = -1, completion_doorbell = -1;
  std::map<std::string, sdbus::Variant> layout;
  SessionHandles() = default;
  SessionHandles(SessionHandles&& o) noexcept;
  SessionHandles& operator=(SessionHandles&& o) noexcept;
  SessionHandles(const SessionHandles&) = delete;
  ~SessionHandles();
};
struct SessionOptions {
  std::uint32_t sq_entries = 0, cq_entries = 0;  // 0 = the daemon's default
  std::uint64_t request_data_bytes = 0, response_data_bytes = 0;
};

class Client {
 public:
  // Connects to `bus` and talks to `service` (tandemd's well-known name) at kObjectPath.
  static Result<std::unique_ptr<Client>> connect(const BusSpec& bus, std::string service = kServiceName);
  // Uses an existing connection (tests, tandem-validate with its own private bus).
  static Result<std::unique_ptr<Client>> create(std::unique_ptr<sdbus::IConnection> connection,
                                                std::string service = kServiceName);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& service() const;
  std::string unique_name() const;  // our own ":1.N" (JobUpdate is unicast to it)
  sdbus::IConnection& connection();

  // -- io.tandem.Tandem1 methods
  Result<SubmitResult> submit(const Request& r);
  Result<PlanDecision> plan(const Request& r);
  Result<std::string> cancel(std::uint64_t job_id);  // the state after the call
  Result<JobInfo> get_job(std::uint64_t job_id);
  Result<SubmitResult> resume(std::uint64_t job_id, const SubmitOptions& overrides);
  Result<std::string> hold_gpu(const std::string& reason, const std::string& app_id);  // the cookie
  Result<void> release_gpu(const std::string& cookie);
  // LoadModel / UnloadModel (admin): device "gpu".
  Result<ResidencyReply> load_model(const std::string& model, const std::string& device = "gpu");
  Result<ResidencyReply> unload_model(const std::string& model, const std::string& device = "gpu");
  Result<std::vector<ModelInfo>> list_models();
  // Embed: blocks until the job ends (up to r.call_timeout). The reply is checked: one vector per input, all of the
  // result's dim (else Errc::internal naming the mismatch). Errors as the other calls (last_error() has the
  // RemoteError, e.g. InvalidArgument for an input that is not an image, Busy with retry_after_ms).
  Result<EmbedReply> embed(const EmbedRequest& r);
  // Transcribe: returns once the job is accepted (like submit); follow it with its JobUpdates or GetJob.
  Result<SubmitResult> transcribe(const TranscribeRequest& r);
  // OpenSession (docs/rings.md): the raw fds (owned by the result; RingSession::open takes them) and the layout.
  using SessionHandles = client::SessionHandles;
  using SessionOptions = client::SessionOptions;
  Result<SessionHandles> open_session(const SessionOptions& options = {});
  Result<void> close_session(std::uint64_t session_id);
  // The io.tandem.Tandem1.Model object at `object_path` (ModelInfo::path, or model_object_path(name)).
  Result<ModelDetails> model_details(const std::string& object_path);

  // -- properties
  Result<ServiceStatus> status();  // one org.freedesktop.DBus.Properties.GetAll
  Result<PolicySettings> policy();
  Result<void> set_policy(const std::map<std::string, PolicyValue>& values);  // only these keys
  Result<std::string> version();

  // -- io.tandem.Tandem1.Testing (present only when tandemd runs with testing enabled)
  Result<void> set_foreign_load(std::uint64_t bytes);
  Result<void> fail_allocations(std::uint32_t n, const std::string& site);
  Result<void> fail_probes(std::uint32_t n);
  Result<void> set_reading_lag(std::uint64_t ms);
  Result<void> lose_device();
  Result<void> recover_device();
  Result<Counters> counters();

  // -- signals. subscribe() adds the match rules (JobUpdate, DegradedModeChanged, PropertiesChanged); call it before
  // Submit so no update is missed. Idempotent. Signals are delivered during process().
  Result<void> subscribe();
  // Every JobUpdate is buffered per job id (bounded: past kMaxBufferedUpdates for one job the oldest are dropped,
  // counted in dropped_job_updates()) and also passed to the callback, if one is set. take_job_updates() is the
  // filter by job id: updates for jobs nobody takes stay buffered until forget_job_updates().
  static constexpr std::size_t kMaxBufferedUpdates = 100000;
  std::vector<JobUpdate> take_job_updates(std::uint64_t job_id);
  void forget_job_updates(std::uint64_t job_id);
  std::uint64_t dropped_job_updates(std::uint64_t job_id) const;
  void on_job_update(std::function<void(const JobUpdate&)> callback);
  void on_degraded_change(std::function<void(const DegradedChange&)> callback);
  // Invalidated-only properties are listed in PropertiesChange::invalidated; fill_invalidated() fetches them.
  void on_properties_change(std::function<void(const PropertiesChange&)> callback);
  Result<void> fill_invalidated(PropertiesChange& change);
  std::optional<DegradedChange> last_degraded_change() const;
  // Signals that did not match the XML's signature (contract drift); the last one's description.
  std::uint64_t malformed_signals() const;
  std::string last_malformed_signal() const;

  // -- event loop: dispatches what is queued; if nothing was, waits up to max_wait for the bus (or extra_fd, e.g.
  // interrupt_fd(), which is not read) and dispatches then. Errors: the connection was lost (Errc::io_error).
  Result<Wake> process(std::chrono::milliseconds max_wait, int extra_fd = -1);

  // Details of the last failed call (the parsed D-Bus error), if the last call failed remotely.
  const std::optional<RemoteError>& last_error() const;

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::client
