// GPU residency figures (docs/validate.md "GPU residency"): from the monitor's samples (our bytes on the device,
// Memory.observed_used, and the gpu_* counters) and the memory steps the runner applied. Pure.
#include <algorithm>
#include <optional>

#include "validate/event_fields.h"
#include "validate/metrics.h"

namespace tandem::validate {

namespace {

using nlohmann::json;

// A counter over the samples: the increase from its first to its last value (a restarted daemon starts again at 0:
// each run of it counts on its own).
struct CounterDelta {
  std::optional<std::uint64_t> last;
  std::uint64_t total = 0;
  void add(std::uint64_t v) {
    if (last && v >= *last) total += v - *last;
    else if (last) total += v;  // restarted
    last = v;
  }
};

}  // namespace

void compute_residency_metrics(const std::vector<Event>& events, Metrics& m) {
  CounterDelta evictions, pressure, restores, failures;
  std::uint64_t foreign = 0;
  std::optional<std::uint64_t> ours;          // the last sample's bytes
  constexpr std::int64_t kNone = -1;
  std::int64_t rise_t = kNone, fall_t = kNone;  // a memory step raised / lowered the foreign load; not yet seen to act
  std::uint64_t ours_at_rise = 0, evictions_at_rise = 0, evictions_at_fall = 0, restores_at_fall = 0;
  bool risen = false, low_seen = false;
  for (const Event& e : events) {
    const json& d = e.data;
    if (e.type == "memory_step" || e.type == "sample") {
      if (auto v = field_u64(d, "gpu_evictions")) evictions.add(*v);
      if (auto v = field_u64(d, "gpu_pressure_evictions")) pressure.add(*v);
      if (auto v = field_u64(d, "gpu_restores")) restores.add(*v);
      if (auto v = field_u64(d, "gpu_restore_failures")) failures.add(*v);
    }
    if (e.type == "memory_step") {
      if (auto o = field_u64(d, "observed_used")) ours = *o;
      const std::uint64_t f = field_u64(d, "foreign").value_or(0);
      if (f > foreign && ours) {
        if (!risen) m.ours_before_bytes = *ours;
        risen = true;
        rise_t = e.t_us;
        ours_at_rise = *ours;
        evictions_at_rise = evictions.total;
      } else if (f < foreign) {
        fall_t = e.t_us;
        evictions_at_fall = evictions.total;
        restores_at_fall = restores.total;
      }
      foreign = f;
      continue;
    }
    if (e.type != "sample") continue;
    const auto o = field_u64(d, "mem_ours");
    if (!o) continue;
    ours = *o;
    if (risen) {
      m.ours_low_bytes = low_seen ? std::min(m.ours_low_bytes, *o) : *o;
      low_seen = true;
    }
    // Freed: a replica was given back since the rise and our bytes on the device are below what they were then.
    if (rise_t != kNone && evictions.total > evictions_at_rise && *o < ours_at_rise) {
      m.time_to_free_ms.push_back(static_cast<double>(e.t_us - rise_t) / 1000.0);
      rise_t = kNone;
    }
    // Restored: as many replicas loaded again since the fall as were given back before it.
    if (fall_t != kNone && evictions_at_fall > restores_at_fall && restores.total >= evictions_at_fall) {
      m.time_to_restore_ms.push_back(static_cast<double>(e.t_us - fall_t) / 1000.0);
      fall_t = kNone;
    }
  }
  m.gpu_evictions = evictions.total;
  m.gpu_pressure_evictions = pressure.total;
  m.gpu_restores = restores.total;
  m.gpu_restore_failures = failures.total;
}

}  // namespace tandem::validate
