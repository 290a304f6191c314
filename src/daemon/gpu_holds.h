// The GPU holds (HoldGpu / ReleaseGpu, docs/dbus.md): who asked Tandem to keep new work off the accelerator, since
// when and why. A concern of its own, out of Service: the residency work (evicting on a hold, restoring when the last
// one goes) reads it, and it is tested without a daemon. Pure: no D-Bus, no clock of its own (callers pass the time),
// no logging; the service logs and reacts to what these methods return.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/result.h"

namespace tandem::daemon {

class GpuHolds {
 public:
  static constexpr std::size_t kMaxHolds = 64;
  static constexpr std::size_t kMaxTextBytes = 256;  // reason, app_id

  struct Hold {
    std::string cookie;  // "hold-" + 24 hex digits: the handle ReleaseGpu takes
    std::string owner;   // the holder's bus name (its holds go when it leaves the bus)
    std::string app_id, reason;
    std::int64_t since_unix_ms = 0;
  };

  // A new hold for `owner`; returns its cookie (unguessable by other clients: a digest of the owner, a counter, the
  // time and the pid). Errors: invalid_argument (reason or app_id over 256 bytes or not UTF-8), queue_full (64 holds
  // already; "retry_after_ms=1000" in the message).
  Result<std::string> add(const std::string& owner, const std::string& reason, const std::string& app_id,
                          std::int64_t now_unix_ms);
  // Removes the hold named by `cookie` and returns it. Errors: not_found (no such cookie), permission_denied (`who`
  // is not its owner and `any_owner` is false: only the holder, or root, releases a hold).
  Result<Hold> release(const std::string& cookie, const std::string& who, bool any_owner);
  // Removes every hold of `owner` (it left the bus) and returns them, in cookie order.
  std::vector<Hold> release_owner(const std::string& owner);

  bool empty() const { return holds_.empty(); }
  std::size_t size() const { return holds_.size(); }
  std::vector<Hold> list() const;  // in cookie order

 private:
  std::map<std::string, Hold> holds_;  // by cookie
  std::uint64_t counter_ = 0;
};

}  // namespace tandem::daemon
