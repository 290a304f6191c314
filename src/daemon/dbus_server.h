// The D-Bus front end of the service: the io.tandem.Tandem1 object (+ Testing with --testing) and one
// io.tandem.Tandem1.Model object per model, generated adaptors from dbus/*.xml, argument validation from a{sv},
// caller credentials → authorization, unicast job updates, one PropertiesChanged per batch, NameOwnerChanged →
// holds released. Runs on the daemon's event-loop thread (sdbus-c++'s poll data, no sdbus thread).
#pragma once

#include <map>
#include <memory>
#include <string>

#include <sdbus-c++/sdbus-c++.h>

#include "core/result.h"
#include "daemon/config.h"
#include "daemon/ring_hub.h"
#include "daemon/service.h"

namespace tandem::daemon {

// a{sv} options → SubmitOptions with strict key/type checks (InvalidArgument naming the key).
Result<SubmitOptions> parse_submit_options(const std::map<std::string, sdbus::Variant>& options);
// Dict → a{sv}.
std::map<std::string, sdbus::Variant> to_variant_map(const Dict& d);
// a{sv} → Dict (Policy setter): integers become uint64 (negative: int64), doubles, bools, strings, string arrays.
Result<Dict> from_variant_map(const std::map<std::string, sdbus::Variant>& m);
// Error → io.tandem.Tandem1.Error.<Name>; `not_found_name` is UnknownJob or UnknownModel by method.
sdbus::Error to_dbus_error(const Error& e, const char* not_found_name = "UnknownJob");
// "/io/tandem/Tandem1/models/" + escaped name (bytes outside [A-Za-z0-9] → _XX).
std::string model_object_path(const std::string& name);

class DbusServer final : public ServiceObserver {
 public:
  // Connects to the configured bus (does not own the name yet). Errors: unavailable with a readable message.
  static Result<std::unique_ptr<DbusServer>> connect(const BusConfig& bus);
  ~DbusServer() override;

  // Registers the objects for `service` and `rings` (both must outlive this; rings may be null) and then requests
  // the well-known name. Job updates for "ring:<id>" destinations go to `rings`, the others are unicast signals.
  Status serve(Service* service, const DaemonConfig& cfg, bool testing, RingHub* rings);
  // For the event loop: the fd to poll, its events and the bus's own timeout (µs, UINT64_MAX = none).
  sdbus::IConnection::PollData poll_data() const;
  // Processes everything pending on the bus (method calls run the service).
  void process();
  void release_name();
  // SIGHUP: new auth settings; open ring sessions are re-authorized (and get the new [rings] settings).
  void reload_auth(const AuthConfig& auth, const RingConfig& rings);

  // ServiceObserver
  void job_update(const std::string& destination, JobId id, const std::string& kind, const Dict& data) override;
  void degraded_changed(bool degraded, const std::string& reason, const Dict& details) override;
  void properties_changed(const std::vector<std::string>& names) override;
  // Exports the added models' objects, unexports the removed ones', broadcasts ModelsChanged.
  void models_changed(const std::vector<std::string>& added, const std::vector<std::string>& removed) override;

  struct Impl;

 private:
  DbusServer() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::daemon
