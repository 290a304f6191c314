#include "policy/unit_times.h"

#include <chrono>
#include <limits>

namespace tandem::policy {

std::string_view work_unit_name(WorkUnit u) {
  switch (u) {
    case WorkUnit::text: return "text";
    case WorkUnit::image: return "image";
    case WorkUnit::window: return "window";
  }
  return "unknown";
}

void UnitTimes::set_measured(const std::string& model, Device route, WorkUnit u, Clock::duration per_unit) {
  if (per_unit <= Clock::duration::zero()) return;
  times_[Key{model, route, u}] = std::chrono::duration<double>(per_unit).count();
}

void UnitTimes::observe(const std::string& model, Device route, WorkUnit u, std::uint64_t units, Clock::duration took) {
  if (units == 0 || took <= Clock::duration::zero()) return;
  const double sample = std::chrono::duration<double>(took).count() / static_cast<double>(units);
  auto [it, added] = times_.try_emplace(Key{model, route, u}, sample);
  if (!added) it->second += alpha_ * (sample - it->second);
}

std::optional<Clock::duration> UnitTimes::per_unit(const std::string& model, Device route, WorkUnit u) const {
  return estimate(model, route, u, 1);
}

std::optional<Clock::duration> UnitTimes::estimate(const std::string& model, Device route, WorkUnit u,
                                                   std::uint64_t units) const {
  auto it = times_.find(Key{model, route, u});
  if (it == times_.end()) return std::nullopt;
  const double s = it->second * static_cast<double>(units);
  const double max_s = std::chrono::duration<double>(Clock::duration::max()).count() / 2;
  if (!(s < max_s)) return Clock::duration::max() / 2;
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

void UnitTimes::forget(const std::string& model) {
  for (auto it = times_.begin(); it != times_.end();) {
    if (std::get<0>(it->first) == model)
      it = times_.erase(it);
    else
      ++it;
  }
}

}  // namespace tandem::policy
