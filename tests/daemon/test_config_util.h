// Shared by the tandemd configuration tests (test_config.cc: defaults, full parse, validate(), rendering,
// parse_size; test_config_errors.cc: ranges, types, unknown keys, syntax errors; test_config_files.cc: files,
// drop-ins and the shipped config files): messages, field-by-field comparison, a scratch directory and a
// document that sets every key.
#pragma once

#include "daemon/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

namespace tandem::daemon::config_test {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr const char* kFile = "/etc/tandem/tandemd.toml";
constexpr const char* kModel = "\n[[model]]\nname = \"m\"\ndir = \"/srv/models/m\"\n";

inline std::string message(const Status& s) { return s.ok() ? std::string("ok") : s.error().message; }
template <class T>
inline std::string message(const Result<T>& r) {
  return r.ok() ? std::string("ok") : r.error().message;
}

// Every field, so "equal" means equal (policy structs have no operator==).
inline void expect_same_model(const ModelConfig& a, const ModelConfig& b) {
  SCOPED_TRACE("model " + a.name);
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.dir, b.dir);
  EXPECT_EQ(a.revision, b.revision);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.kv_cache, b.kv_cache);
  EXPECT_EQ(a.template_name, b.template_name);
  EXPECT_EQ(a.sampling.temperature, b.sampling.temperature);
  EXPECT_EQ(a.sampling.top_k, b.sampling.top_k);
  EXPECT_EQ(a.sampling.top_p, b.sampling.top_p);
  EXPECT_EQ(a.sampling.repetition_penalty, b.sampling.repetition_penalty);
  EXPECT_EQ(a.sampling.max_new_tokens, b.sampling.max_new_tokens);
  EXPECT_EQ(a.sampling.stop, b.sampling.stop);
  EXPECT_EQ(a.replica_mode, b.replica_mode);
  EXPECT_EQ(a.gpu, b.gpu);
  EXPECT_EQ(a.gpu_layers, b.gpu_layers);
  EXPECT_EQ(a.fallback, b.fallback);
  EXPECT_EQ(a.cpu_threads, b.cpu_threads);
  EXPECT_EQ(a.gpu_threads, b.gpu_threads);
  EXPECT_EQ(a.max_context, b.max_context);
  EXPECT_EQ(a.max_sequences, b.max_sequences);
}

inline void expect_same_queue(const policy::QueueConfig& a, const policy::QueueConfig& b) {
  EXPECT_EQ(a.capacity, b.capacity);
  EXPECT_EQ(a.concurrency, b.concurrency);
  EXPECT_EQ(a.max_context, b.max_context);
  EXPECT_EQ(a.max_new_tokens, b.max_new_tokens);
}

inline void expect_same_rates(const policy::RateConfig& a, const policy::RateConfig& b) {
  EXPECT_EQ(a.ewma_alpha, b.ewma_alpha);
  EXPECT_EQ(a.prior_prefill_tps, b.prior_prefill_tps);
  EXPECT_EQ(a.prior_decode_tps, b.prior_decode_tps);
}

// All but `sources`.
inline void expect_same(const DaemonConfig& a, const DaemonConfig& b) {
  EXPECT_EQ(a.bus.kind, b.bus.kind);
  EXPECT_EQ(a.bus.address, b.bus.address);
  EXPECT_EQ(a.bus.name, b.bus.name);
  EXPECT_EQ(a.auth.submit_group, b.auth.submit_group);
  EXPECT_EQ(a.auth.allow_any_local_user, b.auth.allow_any_local_user);
  EXPECT_EQ(a.auth.admin_group, b.auth.admin_group);
  EXPECT_EQ(a.device.kind, b.device.kind);
  EXPECT_EQ(a.device.cuda_index, b.device.cuda_index);
  EXPECT_EQ(a.device.sim_capacity_bytes, b.device.sim_capacity_bytes);
  EXPECT_EQ(a.device.sim_reading_lag, b.device.sim_reading_lag);
  EXPECT_EQ(a.device.poll_interval, b.device.poll_interval);
  EXPECT_EQ(a.device.idle_poll_interval, b.device.idle_poll_interval);
  EXPECT_EQ(a.device.probe_interval, b.device.probe_interval);
  EXPECT_EQ(a.device.probe_timeout, b.device.probe_timeout);
  ASSERT_EQ(a.models.size(), b.models.size());
  for (std::size_t i = 0; i < a.models.size(); ++i) expect_same_model(a.models[i], b.models[i]);
  EXPECT_EQ(a.default_model, b.default_model);
  const auto& p = a.policy;
  const auto& q = b.policy;
  EXPECT_EQ(p.estimator.kv_block_tokens, q.estimator.kv_block_tokens);
  EXPECT_EQ(p.estimator.fragmentation_fraction, q.estimator.fragmentation_fraction);
  EXPECT_EQ(p.headroom.margin.bytes, q.headroom.margin.bytes);
  EXPECT_EQ(p.headroom.margin.fraction, q.headroom.margin.fraction);
  EXPECT_EQ(p.headroom.fresh_for, q.headroom.fresh_for);
  EXPECT_EQ(p.headroom.max_age, q.headroom.max_age);
  EXPECT_EQ(p.headroom.stale_discount_fraction, q.headroom.stale_discount_fraction);
  EXPECT_EQ(p.ladder.order, q.ladder.order);
  EXPECT_EQ(p.ladder.pressure.elevated_enter_fraction, q.ladder.pressure.elevated_enter_fraction);
  EXPECT_EQ(p.ladder.pressure.elevated_exit_fraction, q.ladder.pressure.elevated_exit_fraction);
  EXPECT_EQ(p.ladder.pressure.critical_enter_fraction, q.ladder.pressure.critical_enter_fraction);
  EXPECT_EQ(p.ladder.pressure.critical_exit_fraction, q.ladder.pressure.critical_exit_fraction);
  EXPECT_EQ(p.ladder.max_delay, q.ladder.max_delay);
  EXPECT_EQ(p.ladder.min_reduced_new_tokens, q.ladder.min_reduced_new_tokens);
  EXPECT_EQ(p.ladder.min_prefill_chunk, q.ladder.min_prefill_chunk);
  EXPECT_EQ(p.ladder.offload_enabled, q.ladder.offload_enabled);
  EXPECT_EQ(p.ladder.min_gpu_layers, q.ladder.min_gpu_layers);
  EXPECT_EQ(p.ladder.default_retry_after, q.ladder.default_retry_after);
  EXPECT_EQ(p.ladder.max_retry_after, q.ladder.max_retry_after);
  EXPECT_EQ(p.breaker.window, q.breaker.window);
  EXPECT_EQ(p.breaker.alloc_failure_threshold, q.breaker.alloc_failure_threshold);
  EXPECT_EQ(p.breaker.probe_failure_threshold, q.breaker.probe_failure_threshold);
  EXPECT_EQ(p.breaker.cooldown, q.breaker.cooldown);
  EXPECT_EQ(p.breaker.backoff_factor, q.breaker.backoff_factor);
  EXPECT_EQ(p.breaker.max_cooldown, q.breaker.max_cooldown);
  expect_same_queue(p.gpu_queue, q.gpu_queue);
  expect_same_queue(p.cpu_queue, q.cpu_queue);
  expect_same_rates(p.gpu_rates, q.gpu_rates);
  expect_same_rates(p.cpu_rates, q.cpu_rates);
  EXPECT_EQ(p.host_guard.budget_bytes, q.host_guard.budget_bytes);
  EXPECT_EQ(p.host_guard.mem_available_reserve, q.host_guard.mem_available_reserve);
  EXPECT_EQ(p.host_guard.cpu_act_elem_bytes, q.host_guard.cpu_act_elem_bytes);
  EXPECT_EQ(p.service.recover_after, q.service.recover_after);
  EXPECT_EQ(p.replica.recovery_budget, q.replica.recovery_budget);
  EXPECT_EQ(p.replica.switch_margin, q.replica.switch_margin);
  EXPECT_EQ(p.failover.allow_migration, q.failover.allow_migration);
  EXPECT_EQ(p.idempotency.retention, q.idempotency.retention);
  EXPECT_EQ(p.idempotency.max_keys, q.idempotency.max_keys);
  EXPECT_EQ(a.journal.dir, b.journal.dir);
  EXPECT_EQ(a.journal.max_bytes, b.journal.max_bytes);
  EXPECT_EQ(a.journal.retention, b.journal.retention);
  EXPECT_EQ(a.journal.max_jobs, b.journal.max_jobs);
  EXPECT_EQ(a.journal.fsync, b.journal.fsync);
  EXPECT_EQ(a.runtime.drain_timeout, b.runtime.drain_timeout);
  EXPECT_EQ(a.runtime.status_interval, b.runtime.status_interval);
  EXPECT_EQ(a.runtime.max_prompt_bytes, b.runtime.max_prompt_bytes);
  EXPECT_EQ(a.runtime.max_messages, b.runtime.max_messages);
  EXPECT_EQ(a.runtime.max_jobs_per_client, b.runtime.max_jobs_per_client);
  EXPECT_EQ(a.runtime.token_flush_interval, b.runtime.token_flush_interval);
}

// A scratch directory, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::path(::testing::TempDir()) /
            ("tandem-config-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string write(const std::string& rel, const std::string& text) const {
    const fs::path p = path_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }

 private:
  fs::path path_;
};

// Every key set to a value other than its default.
constexpr const char* kEverything = R"(
default_model = "small"

[bus]
kind = "address"
address = "unix:path=/run/tandem/bus"
name = "org.example.Tandem"

[auth]
submit_group = "users"
allow_any_local_user = true
admin_group = "wheel"

[device]
kind = "simulated"
cuda_index = 3
sim_capacity = "2GiB"
sim_reading_lag_ms = 40
poll_interval_ms = 100
idle_poll_interval_ms = 3000
probe_interval_ms = 5000
probe_timeout_ms = 500

[[model]]
name = "big"
dir = "/srv/models/big"
revision = "v1.2"
dtype = "bf16"
kv_cache = "f32"
template = "chatml"
replica_mode = "on_demand"
gpu = true
gpu_layers = 20
fallback = "small"
cpu_threads = 8
gpu_threads = 2
max_context = 4096
max_sequences = 6

[model.sampling]
temperature = 0.7
top_k = 40
top_p = 0.9
repetition_penalty = 1.1
max_new_tokens = 512
stop = ["</s>", "\n\nUser:"]

[[model]]
name = "small"
dir = "/srv/models/small"
replica_mode = "mmap"
gpu = false

[margin]
bytes = "256MiB"
fraction = 0.1

[estimator]
kv_block_tokens = 32
fragmentation_fraction = 0.2

[headroom]
fresh_for_ms = 250
max_age_ms = 2000
stale_discount_fraction = 0.1

[ladder]
order = ["admit", "reduce", "route_cpu", "reject"]
max_delay_ms = 10000
min_reduced_new_tokens = 32
min_prefill_chunk = 64
offload_enabled = false
min_gpu_layers = 2
default_retry_after_ms = 2500
max_retry_after_ms = 60000

[ladder.pressure]
elevated_enter_fraction = 0.25
elevated_exit_fraction = 0.3
critical_enter_fraction = 0.1
critical_exit_fraction = 0.12

[breaker]
window_ms = 30000
alloc_failure_threshold = 5
probe_failure_threshold = 3
cooldown_ms = 5000
backoff_factor = 1.5
max_cooldown_ms = 120000

[gpu_queue]
capacity = 32
concurrency = 8
max_context = 16384
max_new_tokens = 2048

[cpu_queue]
capacity = 8
concurrency = 2
max_context = 2048
max_new_tokens = 512

[gpu_rates]
ewma_alpha = 0.3
prior_prefill_tps = 3000
prior_decode_tps = 50.5

[cpu_rates]
ewma_alpha = 0.5
prior_prefill_tps = 150.25
prior_decode_tps = 7

[host]
budget = "12GiB"
mem_available_reserve = 536870912

[service]
recover_after_ms = 20000

[replica]
recovery_budget_ms = 15000
switch_margin = 0.25

[failover]
allow_migration = false

[idempotency]
retention_s = 3600
max_keys = 5000

[journal]
dir = "/var/lib/tandem-test"
max_bytes = "128MiB"
retention_s = 7200
max_jobs = 500
fsync = false

[runtime]
drain_timeout_ms = 10000
status_interval_ms = 2000
max_prompt_bytes = 65536
max_messages = 64
max_jobs_per_client = 8
token_flush_interval_ms = 50
)";

}  // namespace tandem::daemon::config_test
