// A replica's state and why a GPU replica was given back: enums at every boundary (Backend::replicas, Residency,
// the views); the strings are only the wire's (the model objects' Replicas, ListModels, tandemctl, GNOME).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace tandem::daemon {

// loaded: usable (a GPU replica resident on the accelerator); unloaded: a CPU replica read on demand; draining: being
// given back (no new work; running jobs finish or move); evicted: given back, the CPU serves; loading: coming back;
// lost: died with the device; failed: could not be loaded (ReplicaInfo::error says why).
enum class ReplicaState : std::uint8_t { loaded, unloaded, draining, evicted, loading, lost, failed };

inline std::string_view replica_state_name(ReplicaState s) {
  switch (s) {
    case ReplicaState::loaded: return "loaded";
    case ReplicaState::unloaded: return "unloaded";
    case ReplicaState::draining: return "draining";
    case ReplicaState::evicted: return "evicted";
    case ReplicaState::loading: return "loading";
    case ReplicaState::lost: return "lost";
    case ReplicaState::failed: return "failed";
  }
  return "failed";
}

inline std::optional<ReplicaState> parse_replica_state(std::string_view s) {
  for (auto v : {ReplicaState::loaded, ReplicaState::unloaded, ReplicaState::draining, ReplicaState::evicted,
                 ReplicaState::loading, ReplicaState::lost, ReplicaState::failed})
    if (replica_state_name(v) == s) return v;
  return std::nullopt;
}

// Why a GPU replica is off the accelerator (none: it is not, or it never was given back): a GPU hold, foreign
// pressure, idle time (keep_alive), an explicit request (UnloadModel).
enum class EvictReason : std::uint8_t { none, hold, pressure, idle, request };

inline std::string_view evict_reason_name(EvictReason r) {
  switch (r) {
    case EvictReason::none: return "";
    case EvictReason::hold: return "hold";
    case EvictReason::pressure: return "pressure";
    case EvictReason::idle: return "idle";
    case EvictReason::request: return "request";
  }
  return "";
}

}  // namespace tandem::daemon
