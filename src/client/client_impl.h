// Private to src/client: the generated proxies and Client's state, shared by client.cc and client_embed.cc.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "client/client.h"
#include "io_tandem_Tandem1_Model_proxy.h"
#include "io_tandem_Tandem1_Testing_proxy.h"
#include "io_tandem_Tandem1_proxy.h"

namespace tandem::client {

// ---------------------------------------------------------------------------------------------------------------
// The generated proxies, for method calls only: registerProxy() is never called, so their signal handlers (which
// would throw through sd-bus on a malformed signal) are never installed; Client::subscribe() has its own.

class MethodProxy final : public sdbus::ProxyInterfaces<io::tandem::Tandem1_proxy, io::tandem::Tandem1::Testing_proxy,
                                                        sdbus::Properties_proxy> {
 public:
  MethodProxy(sdbus::IConnection& connection, std::string service)
      : ProxyInterfaces(connection, std::move(service), kObjectPath) {}
  ~MethodProxy() { unregisterProxy(); }
  // The untyped proxy, for calls that need more than the generated methods give (Embed's timeout).
  sdbus::IProxy& raw() { return getProxy(); }

 private:
  void onJobUpdate(const uint64_t&, const std::string&, const std::map<std::string, sdbus::Variant>&) override {}
  void onDegradedModeChanged(const bool&, const std::string&, const std::map<std::string, sdbus::Variant>&) override {}
  void onModelsChanged(const std::vector<std::string>&, const std::vector<std::string>&) override {}
  void onPropertiesChanged(const std::string&, const std::map<std::string, sdbus::Variant>&,
                           const std::vector<std::string>&) override {}
};

class ModelProxy final : public sdbus::ProxyInterfaces<io::tandem::Tandem1::Model_proxy, sdbus::Properties_proxy> {
 public:
  ModelProxy(sdbus::IConnection& connection, std::string service, std::string path)
      : ProxyInterfaces(connection, std::move(service), std::move(path)) {}
  ~ModelProxy() { unregisterProxy(); }

 private:
  void onPropertiesChanged(const std::string&, const std::map<std::string, sdbus::Variant>&,
                           const std::vector<std::string>&) override {}
};

struct Client::Impl {
  std::unique_ptr<sdbus::IConnection> conn;  // declared first: destroyed last
  std::string service;
  std::string bus_description = "the bus";
  std::unique_ptr<MethodProxy> methods;
  std::unique_ptr<sdbus::IProxy> signals;
  std::optional<RemoteError> last_error;

  std::map<std::uint64_t, std::deque<JobUpdate>> updates;
  std::map<std::uint64_t, std::uint64_t> dropped;
  std::function<void(const JobUpdate&)> job_cb;
  std::function<void(const DegradedChange&)> degraded_cb;
  std::function<void(const PropertiesChange&)> props_cb;
  std::optional<DegradedChange> last_degraded;
  std::uint64_t malformed = 0;
  std::string last_malformed;

  // Runs one D-Bus call; sdbus::Error becomes a tandem::Error (and last_error).
  template <class T, class F>
  Result<T> guarded(std::string_view what, F&& f) {
    last_error.reset();
    try {
      if constexpr (std::is_void_v<T>) {
        f();
        return Result<void>{};
      } else {
        return Result<T>(f());
      }
    } catch (const sdbus::Error& e) {
      RemoteError re = parse_remote_error(e.getName(), e.getMessage());
      last_error = re;
      Error err = to_error(re);
      if (re.daemon_missing()) {
        err.message =
            "tandemd (" + service + ") is not running on " + bus_description + " (" + re.name + ": " + re.message + ")";
      } else if (what.starts_with("Testing.") && (re.name == "org.freedesktop.DBus.Error.UnknownMethod" ||
                                                  re.name == "org.freedesktop.DBus.Error.UnknownInterface" ||
                                                  re.name == "org.freedesktop.DBus.Error.UnknownObject")) {
        err.message = std::string(kTestingInterface) + " is not available: tandemd runs without testing enabled (" +
                      re.name + ")";
      } else if (re.name == "org.freedesktop.DBus.Error.AccessDenied") {
        err.message = "the bus policy does not allow this call: " + re.message;
      } else if (!re.is_tandem()) {
        err.message = re.name + ": " + re.message;
      }
      err.message = std::string(what) + ": " + err.message;
      return fail(std::move(err));
    } catch (const std::exception& e) {
      return fail(Errc::internal, std::string(what) + ": " + e.what());
    }
  }

  void note_malformed(const std::string& what) {
    ++malformed;
    last_malformed = what;
  }

  void deliver(JobUpdate u) {
    if (job_cb) job_cb(u);
    const std::uint64_t job = u.job_id;
    auto& q = updates[job];
    q.push_back(std::move(u));
    while (q.size() > kMaxBufferedUpdates) {
      q.pop_front();
      ++dropped[job];
    }
  }
};

}  // namespace tandem::client
