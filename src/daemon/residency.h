// GPU residency (docs/residency.md): which models' GPU replicas are on the accelerator, which are being given back
// and why, and which are coming back. A concern of its own, out of Service: the service asks it whether a GPU route
// may be used, tells it what happened (a hold began, a run ended, a replica was freed or loaded), and carries out
// what it answers (free this replica now, move that model's running jobs off the GPU, load this one). Pure: no
// backend, no clock of its own (callers pass the time), no logging; tested without a daemon.
//
// A replica's lifecycle: loaded → draining → (freeing) → evicted → loading → loaded. Draining: new work no longer
// goes to the GPU; jobs already running there finish, or after the drain time move to the CPU at their next
// checkpoint. Lost (the device died) and failed (a load did not succeed) are the backend's states; Residency keeps
// `failed` for a restore that did not load.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "core/result.h"
#include "daemon/replica_state.h"

namespace tandem::daemon {

struct ResidencyConfig {
  Clock::duration drain{std::chrono::seconds(5)};  // how long running jobs may stay on a draining replica
  // Foreign pressure: at most this many replicas given back for it in any minute (0: never), and a replica given back
  // for it comes back once there was room for it for `recover_after` without a break.
  std::uint32_t max_pressure_evictions_per_minute = 4;
  Clock::duration recover_after{std::chrono::seconds(30)};
};

class Residency {
 public:
  struct Replica {
    std::string model;
    ReplicaState state = ReplicaState::loaded;  // loaded | draining | evicted | loading | failed
    EvictReason reason = EvictReason::none;      // draining, evicted, loading: why it was given back
    Clock::time_point since{};                   // when it entered `state`
    Clock::time_point evict_began{};             // when the draining began (time to free = freed − this)
    bool freeing = false;                        // draining: the free was handed out (freed() comes next)
    bool preempted = false;                      // draining: its running jobs were told to move
    bool restore_pending = false;                // freeing when a restore was asked: load right after
    EvictReason evict_pending = EvictReason::none;  // loading when an eviction was asked: give back once loaded
    std::uint64_t given_back_bytes = 0;          // evicted: what the free returned
    Clock::duration last_free{};                 // the last eviction's time from draining to freed
    Clock::duration last_load{};                 // the last restore's load time
    std::string error;                           // failed: the load error
    std::optional<Clock::duration> keep_alive;   // idle time before it is given back (nullopt: for ever)
    Clock::time_point last_used{};               // a GPU run of the model last started or ended
    int priority = 0;                            // foreign pressure gives back the lower priority first
  };

  struct Counters {
    std::uint64_t evictions = 0;        // replicas freed
    std::uint64_t restores = 0;         // replicas loaded again
    std::uint64_t restore_failures = 0;
    std::uint64_t preemptions = 0;      // drains that moved running jobs off the GPU
    std::uint64_t bytes_given_back = 0;
    std::uint64_t pressure_evictions = 0;  // evictions begun for foreign pressure
    std::uint64_t free_ms_total = 0;       // time from draining to freed, summed over the evictions
    std::uint64_t load_ms_total = 0;       // load time, summed over the restores (mean = load_ms_total / restores)
  };

  // What the service carries out after drain(): free these replicas now (their last GPU job ended), and move the
  // running GPU jobs of those models to the CPU at their next checkpoint (the drain time passed).
  struct DrainStep {
    std::vector<std::string> free;
    std::vector<std::string> preempt;
  };

  explicit Residency(ResidencyConfig cfg = {}) : cfg_(cfg) {}

  // A model with a GPU replica: loaded, or failed when its load at start did not succeed (LoadModel retries it).
  // Adding a model twice keeps its state.
  void add(const std::string& model, Clock::time_point now, bool loaded = true);
  // keep_alive: how long a loaded replica may go without a GPU run before it is given back (reason idle); nullopt
  // = for ever, 0 = after each job.
  void set_keep_alive(const std::string& model, std::optional<Clock::duration> keep);
  void set_priority(const std::string& model, int priority);
  // A GPU run of `model` started or ended: its idle time starts again.
  void used(const std::string& model, Clock::time_point now);
  // Begins giving back the loaded replicas idle past their keep_alive (no GPU run: `busy(model)` false); returns
  // them (draining, reason idle).
  std::vector<std::string> evict_idle(const std::function<bool(const std::string&)>& busy, Clock::time_point now);
  const Replica* find(const std::string& model) const;
  std::vector<Replica> list() const;  // in model-name order

  // True when Residency does not keep new work off `model`'s GPU replica: loaded, failed (whether a replica is there
  // is the backend's answer), or not tracked here (a model without a GPU replica).
  bool usable(const std::string& model) const;
  // True while a model's replica is out on purpose (draining, evicted, loading): the device itself is fine.
  bool given_back(const std::string& model) const;
  bool any_given_back() const;
  // A drain, free or load is under way, or a replica given back for pressure waits for room to come back (the
  // service keeps polling at its busy rate until it settles).
  bool changing() const;

  // Begins giving back `model`'s replica for `reason` (loaded → draining). Errors: not_found (no GPU replica),
  // illegal_transition (already draining, evicted or loading; the message names the state).
  Status evict(const std::string& model, EvictReason reason, Clock::time_point now);
  // Begins giving back every loaded replica for `reason`; returns the models that began draining. A replica being
  // loaded is given back as soon as its load ends (loaded() → draining); one being freed with a restore pending
  // stays given back (the restore is dropped).
  std::vector<std::string> evict_all(EvictReason reason, Clock::time_point now);

  // Advances the drains: a draining replica that `busy(model)` says has no GPU job left is handed out to be freed
  // (once: freeing); one whose drain time passed with jobs still running has them preempted (once).
  DrainStep drain(const std::function<bool(const std::string&)>& busy, Clock::time_point now);
  // The free of `model` finished: `bytes` went back to the device (→ evicted). Returns true when a restore was asked
  // meanwhile: the caller loads it right away (→ loading).
  bool freed(const std::string& model, std::uint64_t bytes, Clock::time_point now);

  // Brings back the replicas given back for `reason` (all reasons with EvictReason::none): a draining one whose free
  // was not handed out yet is loaded again at once (returned in `kept`), an evicted one is to be loaded (returned in
  // `load`, now loading), a freeing one loads after its free (restore_pending).
  struct RestoreStep {
    std::vector<std::string> kept;
    std::vector<std::string> load;
  };
  RestoreStep restore_all(EvictReason reason, Clock::time_point now);
  // One model (an explicit load): evicted or failed → loading; draining → loaded. Errors: not_found,
  // illegal_transition (already loaded or loading).
  Result<bool> restore(const std::string& model, Clock::time_point now);  // true: the caller loads it
  // A load finished: ok → loaded (or draining when an eviction was asked meanwhile: returns true, the caller
  // advances the drains), else failed (with the error) — except a replica given back for pressure, which stays
  // evicted (reason pressure, the error kept) and is tried again after another recover_after of room. `took` becomes the expected load time only when it succeeded.
  bool loaded(const std::string& model, const Status& st, Clock::duration took, Clock::time_point now);
  // Foreign pressure. How many more replicas may be given back for it now (the cap over the last minute).
  std::uint32_t pressure_budget(Clock::time_point now) const;
  // Brings back replicas given back for foreign pressure (evicted → loading, returned to be loaded): once `room`
  // said yes for one of them without a break for `recover_after`, as many as `room` takes together, the highest
  // priority first, then the most recently used. `room(models)`: the device can take those replicas' weights and
  // stay out of pressure. The wait starts again after each restore. One whose keep_alive ran out meanwhile is not
  // loaded: it stays evicted with reason idle (the next job for its model wakes it).
  std::vector<std::string> recover(const std::function<bool(const std::vector<std::string>&)>& room,
                                   Clock::time_point now);

  // `model` no longer serves (removed from the configuration): forgotten (its counters stay).
  void remove(const std::string& model) { replicas_.erase(model); }

  // A failed replica was loaded by other means (the reload after a device recovery): failed → loaded.
  void mark_loaded(const std::string& model, Clock::time_point now);

  const Counters& counters() const { return counters_; }
  const ResidencyConfig& config() const { return cfg_; }

 private:
  Replica* get(const std::string& model);
  void enter(Replica& r, ReplicaState s, Clock::time_point now);

  ResidencyConfig cfg_;
  std::map<std::string, Replica> replicas_;
  Counters counters_;
  std::deque<Clock::time_point> pressure_evictions_;  // when, within the last minute
  std::optional<Clock::time_point> calm_since_;       // room for a pressure-evicted replica since then
};

}  // namespace tandem::daemon
