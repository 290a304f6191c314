// Headroom from the predicted view (ledger) and the observed view (device reading), and the pressure level
// derived from it with hysteresis. See docs/policy.md §3–4.
#pragma once

#include <cstdint>

#include "policy/config.h"
#include "policy/ledger.h"
#include "policy/types.h"

namespace tandem::policy {

enum class ReadingTrust { fresh, stale, expired };
std::string_view trust_name(ReadingTrust t) noexcept;

struct Headroom {
  std::uint64_t total_bytes = 0;
  std::uint64_t margin_bytes = 0;          // max(margin.bytes, margin.fraction × total)
  // Predicted view (ledger).
  std::uint64_t predicted_used_bytes = 0;  // resident weights + all job reservations
  std::int64_t predicted_headroom = 0;     // total − margin − predicted_used
  // Observed view (device reading).
  std::uint64_t observed_free_bytes = 0;   // driver free + our allocator cache (reserved − allocated), after staleness
  std::uint64_t unmaterialized_bytes = 0;  // reservations not yet allocated (not in the reading)
  std::int64_t observed_headroom = 0;      // observed_free − margin − unmaterialized
  // Result.
  std::int64_t headroom = 0;               // min(predicted_headroom, observed_headroom)
  bool observed_binding = false;           // the observed view was the worse one
  // Figures.
  std::uint64_t observed_used_bytes = 0;   // this process's allocator reserved bytes
  std::uint64_t foreign_used_bytes = 0;    // total − free − reserved: other processes and the driver
  std::int64_t prediction_error_bytes = 0; // observed_used − (resident + materialized reservations); > 0 = under-predicted
  std::int64_t drained_headroom = 0;       // headroom once every job reservation is gone: total − margin − resident − foreign
  ReadingTrust trust = ReadingTrust::fresh;
  Clock::duration reading_age{};

  double fraction() const;  // headroom / total (negative when over-committed)
};

// `now` is when the decision is made; the snapshot's taken_at says how old its numbers are.
Headroom compute_headroom(const MemorySnapshot& snap, const ReservationLedger& ledger, const HeadroomConfig& cfg,
                          Clock::time_point now);

enum class Pressure { normal, elevated, critical };
std::string_view pressure_name(Pressure p) noexcept;

// Hysteresis over the headroom fraction: enter a level below its enter fraction, leave it above its exit fraction.
class PressureTracker {
 public:
  explicit PressureTracker(PressureConfig cfg = {}) : cfg_(cfg) {}
  Pressure update(double headroom_fraction);
  Pressure level() const { return level_; }

 private:
  PressureConfig cfg_;
  Pressure level_ = Pressure::normal;
};

}  // namespace tandem::policy
