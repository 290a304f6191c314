#include "policy/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <utility>

#include "policy/format.h"

namespace tandem::policy {

namespace {

Failure bad(const std::string& path, const char* rule, const std::string& got) {
  return fail(Errc::invalid_argument, path + " must be " + rule + ", got " + got);
}

// Checks `lo <op> v <op> hi` with open/closed ends; NaN always fails.
Status check_range(const std::string& path, double v, double lo, bool lo_open, double hi, bool hi_open) {
  bool ok = !std::isnan(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  if (ok) return {};
  std::string rule = "in ";
  rule += lo_open ? "(" : "[";
  rule += format_double(lo) + "," + format_double(hi);
  rule += hi_open ? ")" : "]";
  return bad(path, rule.c_str(), format_double(v));
}

Status check_min(const std::string& path, std::uint64_t v, std::uint64_t lo) {
  if (v >= lo) return {};
  return bad(path, (">= " + std::to_string(lo)).c_str(), std::to_string(v));
}

Status check_between(const std::string& path, std::uint64_t v, std::uint64_t lo, std::uint64_t hi) {
  if (v >= lo && v <= hi) return {};
  return bad(path, ("in [" + std::to_string(lo) + "," + std::to_string(hi) + "]").c_str(), std::to_string(v));
}

Status check_positive(const std::string& path, Clock::duration d) {
  if (d > Clock::duration::zero()) return {};
  return bad(path, "> 0", format_duration(d));
}

Status check_non_negative(const std::string& path, Clock::duration d) {
  if (d >= Clock::duration::zero()) return {};
  return bad(path, ">= 0", format_duration(d));
}

}  // namespace

std::string_view rung_name(Rung r) noexcept {
  switch (r) {
    case Rung::admit: return "admit";
    case Rung::delay: return "delay";
    case Rung::evict: return "evict";
    case Rung::reduce: return "reduce";
    case Rung::offload: return "offload";
    case Rung::route_cpu: return "route_cpu";
    case Rung::reject: return "reject";
  }
  return "reject";
}

std::uint64_t MarginConfig::for_total(std::uint64_t total_bytes) const {
  const double f = std::ceil(fraction * static_cast<double>(total_bytes));
  // Unvalidated fractions (NaN, negative, > 1) must not make the cast undefined.
  const std::uint64_t frac = !(f > 0.0) ? 0 : f >= 1.8e19 ? ~std::uint64_t{0} : static_cast<std::uint64_t>(f);
  return std::max(bytes, frac);
}

Status MarginConfig::validate(const std::string& path) const {
  TANDEM_TRY(check_between(path + ".bytes", bytes, 0, kPiB));
  return check_range(path + ".fraction", fraction, 0.0, false, 0.5, false);
}

Status EstimatorConfig::validate(const std::string& path) const {
  TANDEM_TRY(check_between(path + ".kv_block_tokens", kv_block_tokens, 1, 4096));
  return check_range(path + ".fragmentation_fraction", fragmentation_fraction, 0.0, false, 1.0, false);
}

Status HeadroomConfig::validate(const std::string& path) const {
  TANDEM_TRY(margin.validate(path + ".margin"));
  TANDEM_TRY(check_non_negative(path + ".fresh_for", fresh_for));
  if (max_age < fresh_for) {
    return bad(path + ".max_age", (">= " + path + ".fresh_for (" + format_duration(fresh_for) + ")").c_str(),
               format_duration(max_age));
  }
  return check_range(path + ".stale_discount_fraction", stale_discount_fraction, 0.0, false, 1.0, false);
}

Status PressureConfig::validate(const std::string& path) const {
  TANDEM_TRY(check_range(path + ".elevated_enter_fraction", elevated_enter_fraction, 0.0, false, 1.0, true));
  TANDEM_TRY(check_range(path + ".elevated_exit_fraction", elevated_exit_fraction, 0.0, true, 1.0, false));
  TANDEM_TRY(check_range(path + ".critical_enter_fraction", critical_enter_fraction, 0.0, false, 1.0, true));
  TANDEM_TRY(check_range(path + ".critical_exit_fraction", critical_exit_fraction, 0.0, true, 1.0, false));
  if (!(elevated_exit_fraction > elevated_enter_fraction)) {
    return bad(path + ".elevated_exit_fraction",
               ("> elevated_enter_fraction (" + format_double(elevated_enter_fraction) + ")").c_str(),
               format_double(elevated_exit_fraction));
  }
  if (!(critical_exit_fraction > critical_enter_fraction)) {
    return bad(path + ".critical_exit_fraction",
               ("> critical_enter_fraction (" + format_double(critical_enter_fraction) + ")").c_str(),
               format_double(critical_exit_fraction));
  }
  if (!(critical_enter_fraction < elevated_enter_fraction)) {
    return bad(path + ".critical_enter_fraction",
               ("< elevated_enter_fraction (" + format_double(elevated_enter_fraction) + ")").c_str(),
               format_double(critical_enter_fraction));
  }
  if (critical_exit_fraction > elevated_exit_fraction) {
    return bad(path + ".critical_exit_fraction",
               ("<= elevated_exit_fraction (" + format_double(elevated_exit_fraction) + ")").c_str(),
               format_double(critical_exit_fraction));
  }
  return {};
}

Status LadderConfig::validate(const std::string& path) const {
  if (order.empty()) return bad(path + ".order", "non-empty", "[]");
  for (std::size_t i = 0; i < order.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (order[i] == order[j]) {
        return bad(path + ".order", "free of duplicates", "'" + std::string(rung_name(order[i])) + "' twice");
      }
    }
  }
  if (order.back() != Rung::reject) {
    return bad(path + ".order", "ending in 'reject' (the ladder must always answer)",
               "'" + std::string(rung_name(order.back())) + "' last");
  }
  TANDEM_TRY(pressure.validate(path + ".pressure"));
  TANDEM_TRY(check_non_negative(path + ".max_delay", max_delay));
  TANDEM_TRY(check_min(path + ".min_reduced_new_tokens", min_reduced_new_tokens, 1));
  TANDEM_TRY(check_min(path + ".min_prefill_chunk", min_prefill_chunk, 1));
  TANDEM_TRY(check_min(path + ".min_gpu_layers", min_gpu_layers, 1));
  TANDEM_TRY(check_positive(path + ".default_retry_after", default_retry_after));
  if (max_retry_after < default_retry_after) {
    return bad(path + ".max_retry_after",
               (">= default_retry_after (" + format_duration(default_retry_after) + ")").c_str(),
               format_duration(max_retry_after));
  }
  return {};
}

Status BreakerConfig::validate(const std::string& path) const {
  TANDEM_TRY(check_positive(path + ".window", window));
  TANDEM_TRY(check_between(path + ".alloc_failure_threshold", alloc_failure_threshold, 1, 1000));
  TANDEM_TRY(check_between(path + ".probe_failure_threshold", probe_failure_threshold, 1, 1000));
  TANDEM_TRY(check_positive(path + ".cooldown", cooldown));
  TANDEM_TRY(check_range(path + ".backoff_factor", backoff_factor, 1.0, false, 16.0, false));
  if (max_cooldown < cooldown) {
    return bad(path + ".max_cooldown", (">= cooldown (" + format_duration(cooldown) + ")").c_str(),
               format_duration(max_cooldown));
  }
  return {};
}

Status QueueConfig::validate(const std::string& path) const {
  TANDEM_TRY(check_between(path + ".capacity", capacity, 1, 1'000'000));
  TANDEM_TRY(check_between(path + ".concurrency", concurrency, 1, 4096));
  TANDEM_TRY(check_between(path + ".max_context", max_context, 2, 1u << 24));
  TANDEM_TRY(check_min(path + ".max_new_tokens", max_new_tokens, 1));
  if (max_new_tokens >= max_context) {
    return bad(path + ".max_new_tokens", ("< max_context (" + std::to_string(max_context) + ")").c_str(),
               std::to_string(max_new_tokens));
  }
  TANDEM_TRY(check_between(path + ".step_tokens", step_tokens, 1, 1u << 24));
  if (step_tokens < concurrency) {
    return bad(path + ".step_tokens", (">= concurrency (" + std::to_string(concurrency) + ")").c_str(),
               std::to_string(step_tokens));
  }
  return {};
}

Status RateConfig::validate(const std::string& path) const {
  TANDEM_TRY(check_range(path + ".ewma_alpha", ewma_alpha, 0.0, true, 1.0, false));
  TANDEM_TRY(check_range(path + ".prior_prefill_tps", prior_prefill_tps, 0.0, true, 1e9, false));
  TANDEM_TRY(check_range(path + ".prior_decode_tps", prior_decode_tps, 0.0, true, 1e9, false));
  return check_range(path + ".occupancy_seconds", occupancy_seconds, 0.0, false, 3600.0, false);
}

Status HostGuardConfig::validate(const std::string& path) const {
  if (budget_bytes != 0 && budget_bytes < 64 * kMiB) {
    return bad(path + ".budget_bytes", ("0 (no configured cap) or >= " + std::to_string(64 * kMiB)).c_str(),
               std::to_string(budget_bytes));
  }
  TANDEM_TRY(check_min(path + ".mem_available_reserve", mem_available_reserve, 1));
  if (cpu_act_elem_bytes != 2 && cpu_act_elem_bytes != 4) {
    return bad(path + ".cpu_act_elem_bytes", "2 or 4", std::to_string(cpu_act_elem_bytes));
  }
  return {};
}

Status ServiceStateConfig::validate(const std::string& path) const {
  return check_non_negative(path + ".recover_after", recover_after);
}

Status ReplicaModeConfig::validate(const std::string& path) const {
  TANDEM_TRY(check_positive(path + ".recovery_budget", recovery_budget));
  return check_range(path + ".switch_margin", switch_margin, 0.0, false, 1.0, true);
}

Status FailoverConfig::validate(const std::string&) const { return {}; }

Status IdempotencyConfig::validate(const std::string& path) const {
  TANDEM_TRY(check_positive(path + ".retention", retention));
  return check_between(path + ".max_keys", max_keys, 1, 100'000'000);
}

Status PolicyConfig::validate() const {
  TANDEM_TRY(estimator.validate());
  TANDEM_TRY(headroom.validate());
  TANDEM_TRY(ladder.validate());
  TANDEM_TRY(breaker.validate());
  TANDEM_TRY(gpu_queue.validate("gpu_queue"));
  TANDEM_TRY(cpu_queue.validate("cpu_queue"));
  TANDEM_TRY(gpu_rates.validate("gpu_rates"));
  TANDEM_TRY(cpu_rates.validate("cpu_rates"));
  // Cross-field: reduce must be able to reach its floor within each queue's limits.
  for (const auto& [name, q] : {std::pair<const char*, const QueueConfig*>{"gpu_queue", &gpu_queue}, {"cpu_queue", &cpu_queue}}) {
    if (ladder.min_reduced_new_tokens > q->max_new_tokens) {
      return bad("ladder.min_reduced_new_tokens",
                 ("<= " + std::string(name) + ".max_new_tokens (" + std::to_string(q->max_new_tokens) + ")").c_str(),
                 std::to_string(ladder.min_reduced_new_tokens));
    }
  }
  TANDEM_TRY(host_guard.validate());
  TANDEM_TRY(service.validate());
  TANDEM_TRY(replica.validate());
  TANDEM_TRY(failover.validate());
  return idempotency.validate();
}

}  // namespace tandem::policy
