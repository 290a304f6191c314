// Measured times of the work that is not a token step loop (docs/policy.md §6, "Fixed-duration jobs"): an embedding
// model's time per text and per image, a speech model's time per window — per model and route. A replica's warm-up
// sets them when it loads (set_measured: the figure replaces whatever was there); each job run afterwards moves them
// by an EWMA (observe). The queue simulation turns them into a job's duration (QueueEntry::fixed), so that an
// embedding or a transcription gets an ETA of its own kind instead of an LLM's token estimate.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include "core/clock.h"
#include "policy/types.h"

namespace tandem::policy {

enum class WorkUnit : std::uint8_t { text, image, window };
std::string_view work_unit_name(WorkUnit u);

class UnitTimes {
 public:
  // alpha: the EWMA weight of one observed run, in (0, 1]; other values count as 0.2.
  explicit UnitTimes(double alpha = 0.2) : alpha_(alpha > 0 && alpha <= 1 ? alpha : 0.2) {}

  // A replica's warm-up measured `per_unit`: it replaces the figure (≤ 0: ignored).
  void set_measured(const std::string& model, Device route, WorkUnit u, Clock::duration per_unit);
  // A run did `units` units in `took`: the figure moves toward took / units by alpha (the first figure of a key
  // is taken as it is). Ignored when units is 0 or took ≤ 0.
  void observe(const std::string& model, Device route, WorkUnit u, std::uint64_t units, Clock::duration took);
  // The time per unit; nullopt when neither measured nor observed.
  std::optional<Clock::duration> per_unit(const std::string& model, Device route, WorkUnit u) const;
  // `units` units at the time per unit (saturating); nullopt when it is unknown.
  std::optional<Clock::duration> estimate(const std::string& model, Device route, WorkUnit u,
                                          std::uint64_t units) const;
  // Every figure of a model (it was removed, or its replicas reloaded: the next warm-up measures again).
  void forget(const std::string& model);
  std::size_t size() const { return times_.size(); }

 private:
  using Key = std::tuple<std::string, Device, WorkUnit>;
  double alpha_;
  std::map<Key, double> times_;  // seconds per unit
};

}  // namespace tandem::policy
