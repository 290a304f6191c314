#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "fixtures.h"

namespace tandem::policy {
namespace {

TEST(Config, DefaultsAreValid) {
  Status s = PolicyConfig{}.validate();
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
}

struct Row {
  std::function<void(PolicyConfig&)> mutate;
  const char* message;
};

// Every bound, with the exact message the operator will read.
TEST(Config, EveryBoundHasAPreciseMessage) {
  const Row rows[] = {
      {[](auto& c) { c.estimator.kv_block_tokens = 0; }, "estimator.kv_block_tokens must be in [1,4096], got 0"},
      {[](auto& c) { c.estimator.fragmentation_fraction = 1.5; },
       "estimator.fragmentation_fraction must be in [0,1], got 1.5"},
      {[](auto& c) { c.estimator.fragmentation_fraction = std::nan(""); },
       "estimator.fragmentation_fraction must be in [0,1], got nan"},
      {[](auto& c) { c.headroom.margin.fraction = 0.6; }, "headroom.margin.fraction must be in [0,0.5], got 0.6"},
      {[](auto& c) { c.headroom.fresh_for = -1ms; }, "headroom.fresh_for must be >= 0, got -1ms"},
      {[](auto& c) { c.headroom.max_age = 100ms; }, "headroom.max_age must be >= headroom.fresh_for (500ms), got 100ms"},
      {[](auto& c) { c.headroom.stale_discount_fraction = -0.1; },
       "headroom.stale_discount_fraction must be in [0,1], got -0.1"},
      {[](auto& c) { c.ladder.pressure.elevated_enter_fraction = 1.5; },
       "ladder.pressure.elevated_enter_fraction must be in [0,1), got 1.5"},
      {[](auto& c) { c.ladder.pressure.elevated_exit_fraction = 0; },
       "ladder.pressure.elevated_exit_fraction must be in (0,1], got 0"},
      {[](auto& c) { c.ladder.pressure.elevated_exit_fraction = 0.1; },
       "ladder.pressure.elevated_exit_fraction must be > elevated_enter_fraction (0.15), got 0.1"},
      {[](auto& c) { c.ladder.pressure.critical_exit_fraction = 0.05; },
       "ladder.pressure.critical_exit_fraction must be > critical_enter_fraction (0.05), got 0.05"},
      {[](auto& c) { c.ladder.pressure.critical_enter_fraction = 0.15; c.ladder.pressure.critical_exit_fraction = 0.18; },
       "ladder.pressure.critical_enter_fraction must be < elevated_enter_fraction (0.15), got 0.15"},
      {[](auto& c) { c.ladder.pressure.critical_exit_fraction = 0.25; },
       "ladder.pressure.critical_exit_fraction must be <= elevated_exit_fraction (0.2), got 0.25"},
      {[](auto& c) { c.ladder.order = {}; }, "ladder.order must be non-empty, got []"},
      {[](auto& c) { c.ladder.order = {Rung::admit, Rung::admit, Rung::reject}; },
       "ladder.order must be free of duplicates, got 'admit' twice"},
      {[](auto& c) { c.ladder.order = {Rung::admit, Rung::delay}; },
       "ladder.order must be ending in 'reject' (the ladder must always answer), got 'delay' last"},
      {[](auto& c) { c.ladder.max_delay = -1s; }, "ladder.max_delay must be >= 0, got -1s"},
      {[](auto& c) { c.ladder.min_reduced_new_tokens = 0; }, "ladder.min_reduced_new_tokens must be >= 1, got 0"},
      {[](auto& c) { c.ladder.min_prefill_chunk = 0; }, "ladder.min_prefill_chunk must be >= 1, got 0"},
      {[](auto& c) { c.ladder.min_gpu_layers = 0; }, "ladder.min_gpu_layers must be >= 1, got 0"},
      {[](auto& c) { c.ladder.default_retry_after = 0s; }, "ladder.default_retry_after must be > 0, got 0s"},
      {[](auto& c) { c.ladder.max_retry_after = 1s; },
       "ladder.max_retry_after must be >= default_retry_after (5s), got 1s"},
      {[](auto& c) { c.breaker.window = 0s; }, "breaker.window must be > 0, got 0s"},
      {[](auto& c) { c.breaker.alloc_failure_threshold = 0; }, "breaker.alloc_failure_threshold must be in [1,1000], got 0"},
      {[](auto& c) { c.breaker.probe_failure_threshold = 5000; },
       "breaker.probe_failure_threshold must be in [1,1000], got 5000"},
      {[](auto& c) { c.breaker.cooldown = 0s; }, "breaker.cooldown must be > 0, got 0s"},
      {[](auto& c) { c.breaker.backoff_factor = 0.5; }, "breaker.backoff_factor must be in [1,16], got 0.5"},
      {[](auto& c) { c.breaker.max_cooldown = 1s; }, "breaker.max_cooldown must be >= cooldown (10s), got 1s"},
      {[](auto& c) { c.gpu_queue.capacity = 0; }, "gpu_queue.capacity must be in [1,1000000], got 0"},
      {[](auto& c) { c.cpu_queue.concurrency = 0; }, "cpu_queue.concurrency must be in [1,4096], got 0"},
      {[](auto& c) { c.cpu_queue.max_context = 1; }, "cpu_queue.max_context must be in [2,16777216], got 1"},
      {[](auto& c) { c.cpu_queue.max_new_tokens = 0; }, "cpu_queue.max_new_tokens must be >= 1, got 0"},
      {[](auto& c) { c.cpu_queue.max_new_tokens = 4096; }, "cpu_queue.max_new_tokens must be < max_context (4096), got 4096"},
      {[](auto& c) { c.gpu_queue.step_tokens = 0; }, "gpu_queue.step_tokens must be in [1,16777216], got 0"},
      {[](auto& c) { c.gpu_queue.step_tokens = (1u << 24) + 1; },
       "gpu_queue.step_tokens must be in [1,16777216], got 16777217"},
      {[](auto& c) { c.gpu_queue.step_tokens = 3; }, "gpu_queue.step_tokens must be >= concurrency (4), got 3"},
      {[](auto& c) { c.cpu_queue.concurrency = 600; }, "cpu_queue.step_tokens must be >= concurrency (600), got 512"},
      {[](auto& c) { c.gpu_rates.ewma_alpha = 0; }, "gpu_rates.ewma_alpha must be in (0,1], got 0"},
      {[](auto& c) { c.cpu_rates.prior_prefill_tps = 0; }, "cpu_rates.prior_prefill_tps must be in (0,1e+09], got 0"},
      {[](auto& c) { c.cpu_rates.prior_decode_tps = -3; }, "cpu_rates.prior_decode_tps must be in (0,1e+09], got -3"},
      {[](auto& c) { c.host_guard.budget_bytes = 1024; },
       "host_guard.budget_bytes must be 0 (no configured cap) or >= 67108864, got 1024"},
      // Review #7: every bound, including the ones that used to be missing.
      {[](auto& c) { c.headroom.margin.bytes = ~0ull; },
       "headroom.margin.bytes must be in [0,1125899906842624], got 18446744073709551615"},
      {[](auto& c) { c.host_guard.mem_available_reserve = 0; }, "host_guard.mem_available_reserve must be >= 1, got 0"},
      {[](auto& c) { c.ladder.min_reduced_new_tokens = 5000; },
       "ladder.min_reduced_new_tokens must be <= gpu_queue.max_new_tokens (4096), got 5000"},
      {[](auto& c) { c.ladder.min_reduced_new_tokens = 2000; },
       "ladder.min_reduced_new_tokens must be <= cpu_queue.max_new_tokens (1024), got 2000"},
      {[](auto& c) { c.host_guard.cpu_act_elem_bytes = 8; }, "host_guard.cpu_act_elem_bytes must be 2 or 4, got 8"},
      {[](auto& c) { c.service.recover_after = -5s; }, "service.recover_after must be >= 0, got -5s"},
      {[](auto& c) { c.replica.recovery_budget = 0s; }, "replica.recovery_budget must be > 0, got 0s"},
      {[](auto& c) { c.replica.switch_margin = 1.0; }, "replica.switch_margin must be in [0,1), got 1"},
      {[](auto& c) { c.idempotency.retention = 0s; }, "idempotency.retention must be > 0, got 0s"},
      {[](auto& c) { c.idempotency.max_keys = 0; }, "idempotency.max_keys must be in [1,100000000], got 0"},
  };
  for (const auto& r : rows) {
    PolicyConfig c;
    r.mutate(c);
    Status s = c.validate();
    ASSERT_FALSE(s.ok()) << r.message;
    EXPECT_EQ(s.error().code, Errc::invalid_argument);
    EXPECT_EQ(s.error().message, r.message);
  }
}

TEST(Config, BoundaryValuesAreAccepted) {
  PolicyConfig c;
  c.headroom.margin.bytes = 1ull << 50;  // 1 PiB: the largest margin
  c.host_guard.budget_bytes = 0;         // no configured cap (the default)
  c.host_guard.mem_available_reserve = 1;
  c.ladder.min_reduced_new_tokens = 1024;  // == cpu_queue.max_new_tokens
  c.gpu_queue.step_tokens = c.gpu_queue.concurrency;  // a full batch of decoders and nothing else
  c.cpu_queue.step_tokens = 1u << 24;
  Status s = c.validate();
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
}

TEST(Config, NamesAndFormatting) {
  EXPECT_EQ(rung_name(Rung::route_cpu), "route_cpu");
  EXPECT_EQ(format_duration(1500ms), "1.5s");
  EXPECT_EQ(format_duration(250ms), "250ms");
  EXPECT_EQ(format_duration(3us), "3us");
  EXPECT_EQ(format_duration(std::chrono::nanoseconds(16915696528)), "16.9s");  // a measured ETA, rounded
  EXPECT_EQ(format_duration(std::chrono::nanoseconds(12345678)), "12.3ms");
  EXPECT_EQ(format_bytes(512 * kMiB), "512.0 MiB");
  EXPECT_EQ(format_bytes(3 * kGiB / 2), "1.50 GiB");
  EXPECT_EQ(format_bytes(100), "100 B");
}

}  // namespace
}  // namespace tandem::policy
