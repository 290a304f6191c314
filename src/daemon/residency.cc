#include "daemon/residency.h"

#include <algorithm>

namespace tandem::daemon {

void Residency::add(const std::string& model, Clock::time_point now, bool loaded) {
  if (replicas_.count(model)) return;
  Replica r;
  r.model = model;
  if (!loaded) {
    r.state = ReplicaState::failed;
    r.error = "the GPU replica could not be loaded at start";
  }
  r.since = now;
  r.last_used = now;
  replicas_.emplace(model, std::move(r));
}

void Residency::set_keep_alive(const std::string& model, std::optional<Clock::duration> keep) {
  if (Replica* r = get(model)) r->keep_alive = keep;
}

void Residency::set_priority(const std::string& model, int priority) {
  if (Replica* r = get(model)) r->priority = priority;
}

void Residency::used(const std::string& model, Clock::time_point now) {
  if (Replica* r = get(model)) r->last_used = now;
}

std::vector<std::string> Residency::evict_idle(const std::function<bool(const std::string&)>& busy,
                                               Clock::time_point now) {
  std::vector<std::string> out;
  for (auto& [name, r] : replicas_) {
    if (r.state != ReplicaState::loaded || !r.keep_alive || now - r.last_used < *r.keep_alive || busy(name)) continue;
    if (evict(name, EvictReason::idle, now)) out.push_back(name);
  }
  return out;
}

const Residency::Replica* Residency::find(const std::string& model) const {
  auto it = replicas_.find(model);
  return it == replicas_.end() ? nullptr : &it->second;
}

Residency::Replica* Residency::get(const std::string& model) {
  auto it = replicas_.find(model);
  return it == replicas_.end() ? nullptr : &it->second;
}

std::vector<Residency::Replica> Residency::list() const {
  std::vector<Replica> out;
  out.reserve(replicas_.size());
  for (const auto& [name, r] : replicas_) out.push_back(r);
  return out;
}

bool Residency::usable(const std::string& model) const {
  const Replica* r = find(model);
  return !r || r->state == ReplicaState::loaded || r->state == ReplicaState::failed;
}

bool Residency::given_back(const std::string& model) const {
  const Replica* r = find(model);
  return r && (r->state == ReplicaState::draining || r->state == ReplicaState::evicted ||
               r->state == ReplicaState::loading);
}

bool Residency::any_given_back() const {
  for (const auto& [name, r] : replicas_)
    if (given_back(name)) return true;
  return false;
}

bool Residency::changing() const {
  for (const auto& [name, r] : replicas_)
    if (r.state == ReplicaState::draining || r.state == ReplicaState::loading ||
        (r.state == ReplicaState::evicted && r.reason == EvictReason::pressure))
      return true;
  return false;
}

void Residency::enter(Replica& r, ReplicaState s, Clock::time_point now) {
  r.state = s;
  r.since = now;
}

Status Residency::evict(const std::string& model, EvictReason reason, Clock::time_point now) {
  Replica* r = get(model);
  if (!r) return fail(Errc::not_found, "model " + model + " has no GPU replica");
  if (r->state != ReplicaState::loaded)
    return fail(Errc::illegal_transition,
                "the GPU replica of " + model + " is " + std::string(replica_state_name(r->state)));
  enter(*r, ReplicaState::draining, now);
  if (reason == EvictReason::pressure) {
    while (!pressure_evictions_.empty() && now - pressure_evictions_.front() >= std::chrono::minutes(1))
      pressure_evictions_.pop_front();
    pressure_evictions_.push_back(now);
    ++counters_.pressure_evictions;
    calm_since_.reset();  // pressure again: the room must hold for recover_after from now
  }
  r->reason = reason;
  r->evict_began = now;
  r->freeing = r->preempted = r->restore_pending = false;
  r->given_back_bytes = 0;
  r->error.clear();
  return {};
}

std::vector<std::string> Residency::evict_all(EvictReason reason, Clock::time_point now) {
  std::vector<std::string> out;
  for (auto& [name, r] : replicas_) {
    if (r.state == ReplicaState::loaded && evict(name, reason, now)) {
      out.push_back(name);
    } else if (r.state == ReplicaState::loading) {
      r.evict_pending = reason;
    } else if (r.state == ReplicaState::draining && r.restore_pending) {
      r.restore_pending = false;
      r.reason = reason;
    }
  }
  return out;
}

Residency::DrainStep Residency::drain(const std::function<bool(const std::string&)>& busy, Clock::time_point now) {
  DrainStep step;
  for (auto& [name, r] : replicas_) {
    if (r.state != ReplicaState::draining || r.freeing) continue;
    if (!busy(name)) {
      r.freeing = true;
      step.free.push_back(name);
    } else if (!r.preempted && now - r.evict_began >= cfg_.drain) {
      r.preempted = true;
      ++counters_.preemptions;
      step.preempt.push_back(name);
    }
  }
  return step;
}

bool Residency::freed(const std::string& model, std::uint64_t bytes, Clock::time_point now) {
  Replica* r = get(model);
  if (!r || r->state != ReplicaState::draining) return false;
  r->freeing = false;
  r->given_back_bytes = bytes;
  r->last_free = now - r->evict_began;
  counters_.free_ms_total += static_cast<std::uint64_t>(
      std::max<std::int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(r->last_free).count()));
  ++counters_.evictions;
  counters_.bytes_given_back += bytes;
  if (r->restore_pending) {
    r->restore_pending = false;
    enter(*r, ReplicaState::loading, now);
    return true;
  }
  enter(*r, ReplicaState::evicted, now);
  return false;
}

Residency::RestoreStep Residency::restore_all(EvictReason reason, Clock::time_point now) {
  RestoreStep step;
  for (auto& [name, r] : replicas_) {
    if (reason != EvictReason::none && r.reason != reason) continue;
    if (r.state == ReplicaState::draining) {
      if (r.freeing) {
        r.restore_pending = true;
      } else {
        enter(r, ReplicaState::loaded, now);
        r.reason = EvictReason::none;
        step.kept.push_back(name);
      }
    } else if (r.state == ReplicaState::evicted) {
      enter(r, ReplicaState::loading, now);
      step.load.push_back(name);
    } else if (r.state == ReplicaState::loading && r.evict_pending != EvictReason::none &&
               (reason == EvictReason::none || r.evict_pending == reason)) {
      r.evict_pending = EvictReason::none;  // the eviction asked during the load is withdrawn
    }
  }
  return step;
}

Result<bool> Residency::restore(const std::string& model, Clock::time_point now) {
  Replica* r = get(model);
  if (!r) return fail(Errc::not_found, "model " + model + " has no GPU replica");
  switch (r->state) {
    case ReplicaState::draining:
      if (r->freeing) {
        r->restore_pending = true;
        return false;
      }
      enter(*r, ReplicaState::loaded, now);
      r->reason = EvictReason::none;
      return false;
    case ReplicaState::evicted:
    case ReplicaState::failed:
      enter(*r, ReplicaState::loading, now);
      if (r->reason == EvictReason::none) r->reason = EvictReason::request;
      return true;
    default:
      return fail(Errc::illegal_transition,
                  "the GPU replica of " + model + " is " + std::string(replica_state_name(r->state)));
  }
}

bool Residency::loaded(const std::string& model, const Status& st, Clock::duration took, Clock::time_point now) {
  Replica* r = get(model);
  if (!r || r->state != ReplicaState::loading) return false;
  const EvictReason pending = r->evict_pending;
  r->evict_pending = EvictReason::none;
  if (st) {
    r->last_load = took;
    counters_.load_ms_total += static_cast<std::uint64_t>(
        std::max<std::int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
    enter(*r, ReplicaState::loaded, now);
    r->last_used = now;  // its keep_alive counts from the restore
    r->reason = EvictReason::none;
    r->error.clear();
    ++counters_.restores;
    if (pending != EvictReason::none) return static_cast<bool>(evict(model, pending, now));
  } else if (r->reason == EvictReason::pressure && pending == EvictReason::none) {
    // Given back for pressure and not loaded again (the other program took the memory back meanwhile, say): it stays
    // given back and is tried again after another unbroken recover_after of room.
    enter(*r, ReplicaState::evicted, now);
    r->error = st.error().message;
    ++counters_.restore_failures;
    calm_since_.reset();
  } else {
    enter(*r, ReplicaState::failed, now);
    r->error = st.error().message;
    ++counters_.restore_failures;
  }
  return false;
}

std::uint32_t Residency::pressure_budget(Clock::time_point now) const {
  std::uint32_t used = 0;
  for (auto t : pressure_evictions_) used += now - t < std::chrono::minutes(1);
  return cfg_.max_pressure_evictions_per_minute > used ? cfg_.max_pressure_evictions_per_minute - used : 0;
}

std::vector<std::string> Residency::recover(const std::function<bool(const std::vector<std::string>&)>& room,
                                            Clock::time_point now) {
  std::vector<const Replica*> out_for;
  for (auto& [name, r] : replicas_) {
    if (r.state != ReplicaState::evicted || r.reason != EvictReason::pressure) continue;
    // Its keep_alive ran out while it was away: it would only be given back again for idleness. It stays out as an
    // idle one (the next job for it brings it back).
    if (r.keep_alive && now - r.last_used >= *r.keep_alive) {
      r.reason = EvictReason::idle;
      continue;
    }
    out_for.push_back(&r);
  }
  std::sort(out_for.begin(), out_for.end(), [](const Replica* a, const Replica* b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    if (a->last_used != b->last_used) return a->last_used > b->last_used;
    return a->model < b->model;
  });
  bool calm = false;
  for (const Replica* r : out_for) calm = calm || room({r->model});
  if (!calm) {
    calm_since_.reset();
    return {};
  }
  if (!calm_since_) calm_since_ = now;
  if (now - *calm_since_ < cfg_.recover_after) return {};
  std::vector<std::string> load;
  for (const Replica* r : out_for) {
    load.push_back(r->model);
    if (!room(load)) load.pop_back();
  }
  for (const auto& m : load) enter(*get(m), ReplicaState::loading, now);
  calm_since_.reset();
  return load;
}

void Residency::mark_loaded(const std::string& model, Clock::time_point now) {
  Replica* r = get(model);
  if (!r || r->state != ReplicaState::failed) return;
  enter(*r, ReplicaState::loaded, now);
  r->reason = EvictReason::none;
  r->error.clear();
}

}  // namespace tandem::daemon
