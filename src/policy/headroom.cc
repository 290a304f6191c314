#include "policy/headroom.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "policy/estimator.h"

namespace tandem::policy {

namespace {

std::int64_t to_signed(std::uint64_t v) {
  return v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ? std::numeric_limits<std::int64_t>::max()
                                                                                   : static_cast<std::int64_t>(v);
}

std::uint64_t sub_sat(std::uint64_t a, std::uint64_t b) { return a > b ? a - b : 0; }

// Saturating int64 arithmetic: with unvalidated inputs (a margin of UINT64_MAX, huge ledger totals) the headroom
// becomes very negative, never wraps to a large positive value.
std::int64_t ssub(std::int64_t a, std::int64_t b) {
  std::int64_t r;
  if (!__builtin_sub_overflow(a, b, &r)) return r;
  return b > 0 ? std::numeric_limits<std::int64_t>::min() : std::numeric_limits<std::int64_t>::max();
}

std::int64_t ssub(std::int64_t a, std::int64_t b, std::int64_t c) { return ssub(ssub(a, b), c); }

}  // namespace

std::string_view trust_name(ReadingTrust t) noexcept {
  switch (t) {
    case ReadingTrust::fresh: return "fresh";
    case ReadingTrust::stale: return "stale";
    case ReadingTrust::expired: return "expired";
  }
  return "expired";
}

std::string_view pressure_name(Pressure p) noexcept {
  switch (p) {
    case Pressure::normal: return "normal";
    case Pressure::elevated: return "elevated";
    case Pressure::critical: return "critical";
  }
  return "critical";
}

double Headroom::fraction() const {
  if (total_bytes == 0) return -1.0;
  return static_cast<double>(headroom) / static_cast<double>(total_bytes);
}

Headroom compute_headroom(const MemorySnapshot& snap, const ReservationLedger& ledger, const HeadroomConfig& cfg,
                          Clock::time_point now) {
  Headroom h;
  h.total_bytes = snap.total_bytes;
  h.margin_bytes = cfg.margin.for_total(snap.total_bytes);
  h.reading_age = now > snap.taken_at ? now - snap.taken_at : Clock::duration::zero();
  h.trust = h.reading_age <= cfg.fresh_for  ? ReadingTrust::fresh
            : h.reading_age <= cfg.max_age ? ReadingTrust::stale
                                           : ReadingTrust::expired;

  const std::int64_t total = to_signed(snap.total_bytes), margin = to_signed(h.margin_bytes);

  h.predicted_used_bytes = ledger.predicted_bytes();
  h.predicted_headroom = ssub(total, margin, to_signed(h.predicted_used_bytes));

  const std::uint64_t reserved = std::min(snap.reserved_bytes, snap.total_bytes);
  const std::uint64_t cached = sub_sat(reserved, snap.allocated_bytes);
  std::uint64_t free_for_us = std::min(snap.total_bytes, sat_add(snap.free_bytes, cached));
  if (h.trust == ReadingTrust::stale) {
    auto discount = static_cast<std::uint64_t>(std::ceil(cfg.stale_discount_fraction * static_cast<double>(snap.total_bytes)));
    free_for_us = sub_sat(free_for_us, discount);
  } else if (h.trust == ReadingTrust::expired) {
    free_for_us = 0;
  }
  h.observed_free_bytes = free_for_us;
  h.unmaterialized_bytes = ledger.unmaterialized_bytes();
  h.observed_headroom = ssub(to_signed(free_for_us), margin, to_signed(h.unmaterialized_bytes));

  h.observed_binding = h.observed_headroom < h.predicted_headroom;
  h.headroom = std::min(h.predicted_headroom, h.observed_headroom);

  h.observed_used_bytes = reserved;
  h.foreign_used_bytes = sub_sat(sub_sat(snap.total_bytes, snap.free_bytes), reserved);
  h.prediction_error_bytes =
      ssub(to_signed(reserved), to_signed(sat_add(ledger.resident_bytes(), ledger.materialized_bytes())));
  h.drained_headroom =
      ssub(ssub(total, margin), to_signed(ledger.resident_bytes()), to_signed(h.foreign_used_bytes));
  return h;
}

Pressure PressureTracker::update(double f) {
  if (std::isnan(f)) f = -1.0;  // an unusable figure is treated as no headroom
  if (f < cfg_.critical_enter_fraction || (level_ == Pressure::critical && f < cfg_.critical_exit_fraction)) {
    level_ = Pressure::critical;
  } else if (f < cfg_.elevated_enter_fraction || (level_ != Pressure::normal && f < cfg_.elevated_exit_fraction)) {
    level_ = Pressure::elevated;
  } else {
    level_ = Pressure::normal;
  }
  return level_;
}

}  // namespace tandem::policy
