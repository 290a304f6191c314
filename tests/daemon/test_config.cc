#include "daemon/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <unistd.h>

namespace tandem::daemon {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr const char* kFile = "/etc/tandem/tandemd.toml";
constexpr const char* kModel = "\n[[model]]\nname = \"m\"\ndir = \"/srv/models/m\"\n";

std::string message(const Status& s) { return s.ok() ? std::string("ok") : s.error().message; }
template <class T>
std::string message(const Result<T>& r) {
  return r.ok() ? std::string("ok") : r.error().message;
}

// Every field, so "equal" means equal (policy structs have no operator==).
void expect_same_model(const ModelConfig& a, const ModelConfig& b) {
  SCOPED_TRACE("model " + a.name);
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.dir, b.dir);
  EXPECT_EQ(a.revision, b.revision);
  EXPECT_EQ(a.dtype, b.dtype);
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

void expect_same_queue(const policy::QueueConfig& a, const policy::QueueConfig& b) {
  EXPECT_EQ(a.capacity, b.capacity);
  EXPECT_EQ(a.concurrency, b.concurrency);
  EXPECT_EQ(a.max_context, b.max_context);
  EXPECT_EQ(a.max_new_tokens, b.max_new_tokens);
}

void expect_same_rates(const policy::RateConfig& a, const policy::RateConfig& b) {
  EXPECT_EQ(a.ewma_alpha, b.ewma_alpha);
  EXPECT_EQ(a.prior_prefill_tps, b.prior_prefill_tps);
  EXPECT_EQ(a.prior_decode_tps, b.prior_decode_tps);
}

// All but `sources`.
void expect_same(const DaemonConfig& a, const DaemonConfig& b) {
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
probe_interval_ms = 5000
probe_timeout_ms = 500

[[model]]
name = "big"
dir = "/srv/models/big"
revision = "v1.2"
dtype = "bf16"
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

// ---- defaults and full parse ------------------------------------------------------------------------------------

TEST(DaemonConfig, DefaultsApplyToEveryKeyNotGiven) {
  auto r = parse_config(kModel, kFile);
  ASSERT_TRUE(r.ok()) << message(r);
  DaemonConfig want;
  ModelConfig m;
  m.name = "m";
  m.dir = "/srv/models/m";
  want.models.push_back(m);
  expect_same(*r, want);
  EXPECT_EQ(r->sources, std::vector<std::string>{kFile});
  EXPECT_EQ(r->device.kind, AccelKind::auto_detect);
  EXPECT_EQ(r->bus.kind, BusKind::system);
  EXPECT_EQ(r->models[0].replica_mode, std::nullopt);
  EXPECT_TRUE(r->validate().ok());
}

TEST(DaemonConfig, ParsesEverySection) {
  auto r = parse_config(kEverything, kFile);
  ASSERT_TRUE(r.ok()) << message(r);
  const DaemonConfig& c = *r;
  EXPECT_EQ(c.default_model, "small");
  EXPECT_EQ(c.bus.kind, BusKind::address);
  EXPECT_EQ(c.bus.address, "unix:path=/run/tandem/bus");
  EXPECT_EQ(c.bus.name, "org.example.Tandem");
  EXPECT_EQ(c.auth.submit_group, "users");
  EXPECT_TRUE(c.auth.allow_any_local_user);
  EXPECT_EQ(c.auth.admin_group, "wheel");
  EXPECT_EQ(c.device.kind, AccelKind::simulated);
  EXPECT_EQ(c.device.cuda_index, 3);
  EXPECT_EQ(c.device.sim_capacity_bytes, 2ull << 30);
  EXPECT_EQ(c.device.sim_reading_lag, 40ms);
  EXPECT_EQ(c.device.poll_interval, 100ms);
  EXPECT_EQ(c.device.probe_interval, 5000ms);
  EXPECT_EQ(c.device.probe_timeout, 500ms);

  ASSERT_EQ(c.models.size(), 2u);
  const ModelConfig& big = c.models[0];
  EXPECT_EQ(big.name, "big");
  EXPECT_EQ(big.dir, "/srv/models/big");
  EXPECT_EQ(big.revision, "v1.2");
  EXPECT_EQ(big.dtype, "bf16");
  EXPECT_EQ(big.template_name, "chatml");
  EXPECT_EQ(big.replica_mode, policy::ReplicaMode::on_demand);
  EXPECT_TRUE(big.gpu);
  EXPECT_EQ(big.gpu_layers, 20);
  EXPECT_EQ(big.fallback, "small");
  EXPECT_EQ(big.cpu_threads, 8);
  EXPECT_EQ(big.gpu_threads, 2);
  EXPECT_EQ(big.max_context, 4096u);
  EXPECT_EQ(big.max_sequences, 6u);
  EXPECT_EQ(big.sampling.temperature, 0.7);
  EXPECT_EQ(big.sampling.top_k, 40);
  EXPECT_EQ(big.sampling.top_p, 0.9);
  EXPECT_EQ(big.sampling.repetition_penalty, 1.1);
  EXPECT_EQ(big.sampling.max_new_tokens, 512u);
  EXPECT_EQ(big.sampling.stop, (std::vector<std::string>{"</s>", "\n\nUser:"}));
  const ModelConfig& small = c.models[1];
  EXPECT_EQ(small.replica_mode, policy::ReplicaMode::mmap);
  EXPECT_FALSE(small.gpu);
  EXPECT_EQ(small.sampling.max_new_tokens, 256u);  // per-model sampling defaults are independent
  EXPECT_EQ(c.find_model("small"), &small);
  EXPECT_EQ(c.find_model("nope"), nullptr);

  const auto& p = c.policy;
  EXPECT_EQ(p.headroom.margin.bytes, 256ull << 20);
  EXPECT_EQ(p.headroom.margin.fraction, 0.1);
  EXPECT_EQ(p.estimator.kv_block_tokens, 32u);
  EXPECT_EQ(p.estimator.fragmentation_fraction, 0.2);
  EXPECT_EQ(p.headroom.fresh_for, 250ms);
  EXPECT_EQ(p.headroom.max_age, 2s);
  EXPECT_EQ(p.headroom.stale_discount_fraction, 0.1);
  using policy::Rung;
  EXPECT_EQ(p.ladder.order, (std::vector<Rung>{Rung::admit, Rung::reduce, Rung::route_cpu, Rung::reject}));
  EXPECT_EQ(p.ladder.max_delay, 10s);
  EXPECT_EQ(p.ladder.min_reduced_new_tokens, 32u);
  EXPECT_EQ(p.ladder.min_prefill_chunk, 64u);
  EXPECT_FALSE(p.ladder.offload_enabled);
  EXPECT_EQ(p.ladder.min_gpu_layers, 2u);
  EXPECT_EQ(p.ladder.default_retry_after, 2500ms);
  EXPECT_EQ(p.ladder.max_retry_after, 60s);
  EXPECT_EQ(p.ladder.pressure.elevated_enter_fraction, 0.25);
  EXPECT_EQ(p.ladder.pressure.elevated_exit_fraction, 0.3);
  EXPECT_EQ(p.ladder.pressure.critical_enter_fraction, 0.1);
  EXPECT_EQ(p.ladder.pressure.critical_exit_fraction, 0.12);
  EXPECT_EQ(p.breaker.window, 30s);
  EXPECT_EQ(p.breaker.alloc_failure_threshold, 5u);
  EXPECT_EQ(p.breaker.probe_failure_threshold, 3u);
  EXPECT_EQ(p.breaker.cooldown, 5s);
  EXPECT_EQ(p.breaker.backoff_factor, 1.5);
  EXPECT_EQ(p.breaker.max_cooldown, 120s);
  EXPECT_EQ(p.gpu_queue.capacity, 32u);
  EXPECT_EQ(p.gpu_queue.concurrency, 8u);
  EXPECT_EQ(p.gpu_queue.max_context, 16384u);
  EXPECT_EQ(p.gpu_queue.max_new_tokens, 2048u);
  EXPECT_EQ(p.cpu_queue.capacity, 8u);
  EXPECT_EQ(p.cpu_queue.concurrency, 2u);
  EXPECT_EQ(p.cpu_queue.max_context, 2048u);
  EXPECT_EQ(p.cpu_queue.max_new_tokens, 512u);
  EXPECT_EQ(p.gpu_rates.ewma_alpha, 0.3);
  EXPECT_EQ(p.gpu_rates.prior_prefill_tps, 3000.0);  // an integer where a number is expected is fine
  EXPECT_EQ(p.gpu_rates.prior_decode_tps, 50.5);
  EXPECT_EQ(p.cpu_rates.ewma_alpha, 0.5);
  EXPECT_EQ(p.cpu_rates.prior_prefill_tps, 150.25);
  EXPECT_EQ(p.cpu_rates.prior_decode_tps, 7.0);
  EXPECT_EQ(p.host_guard.budget_bytes, 12ull << 30);
  EXPECT_EQ(p.host_guard.mem_available_reserve, 512ull << 20);
  EXPECT_EQ(p.service.recover_after, 20s);
  EXPECT_EQ(p.replica.recovery_budget, 15s);
  EXPECT_EQ(p.replica.switch_margin, 0.25);
  EXPECT_FALSE(p.failover.allow_migration);
  EXPECT_EQ(p.idempotency.retention, 1h);
  EXPECT_EQ(p.idempotency.max_keys, 5000u);
  EXPECT_EQ(c.journal.dir, "/var/lib/tandem-test");
  EXPECT_EQ(c.journal.max_bytes, 128ull << 20);
  EXPECT_EQ(c.journal.retention, 2h);
  EXPECT_EQ(c.journal.max_jobs, 500u);
  EXPECT_FALSE(c.journal.fsync);
  EXPECT_EQ(c.runtime.drain_timeout, 10s);
  EXPECT_EQ(c.runtime.status_interval, 2s);
  EXPECT_EQ(c.runtime.max_prompt_bytes, 65536u);
  EXPECT_EQ(c.runtime.max_messages, 64u);
  EXPECT_EQ(c.runtime.max_jobs_per_client, 8u);
  EXPECT_EQ(c.runtime.token_flush_interval, 50ms);
}

TEST(DaemonConfig, InlineTablesAndDottedKeysAreTheSameKeys) {
  auto r = parse_config(std::string("bus = { kind = \"session\" }\ndevice.cuda_index = 2\n") + kModel, kFile);
  ASSERT_TRUE(r.ok()) << message(r);
  EXPECT_EQ(r->bus.kind, BusKind::session);
  EXPECT_EQ(r->device.cuda_index, 2);
}

TEST(DaemonConfig, RelativeDirsResolveAgainstTheFile) {
  auto r = parse_config("[journal]\ndir = \"state\"\n[[model]]\nname = \"m\"\ndir = \"../models/./m\"\n",
                        "/etc/tandem/tandemd.toml");
  ASSERT_TRUE(r.ok()) << message(r);
  EXPECT_EQ(r->models[0].dir, "/etc/models/m");
  EXPECT_EQ(r->journal.dir, "/etc/tandem/state");
  // An origin that is not a path leaves them relative (and nothing checks that a directory exists).
  auto s = parse_config("[[model]]\nname = \"m\"\ndir = \"models/m\"\n", "<string>");
  ASSERT_TRUE(s.ok()) << message(s);
  EXPECT_EQ(s->models[0].dir, "models/m");
}

// ---- errors: ranges ---------------------------------------------------------------------------------------------

struct BadCase {
  std::string toml;  // a document; kModel is appended unless `own_model`
  std::string want;  // the full message after "<file>: "
  bool own_model = false;
};

std::string model_with(const std::string& lines, const std::string& sampling = "") {
  std::string t = "[[model]]\nname = \"m\"\ndir = \"/srv/models/m\"\n" + lines + "\n";
  if (!sampling.empty()) t += "[model.sampling]\n" + sampling + "\n";
  return t;
}

void expect_all_fail(const std::vector<BadCase>& cases, Errc code = Errc::invalid_argument) {
  for (const auto& c : cases) {
    const std::string doc = c.own_model ? c.toml : c.toml + kModel;
    auto r = parse_config(doc, kFile);
    ASSERT_FALSE(r.ok()) << "accepted:\n" << doc;
    EXPECT_EQ(r.error().code, code) << doc;
    EXPECT_EQ(r.error().message, std::string(kFile) + ": " + c.want) << doc;
  }
}

TEST(DaemonConfig, EveryRangeViolationNamesFileKeyAndRange) {
  const std::string long_revision(129, 'r');
  std::string many_stops = "stop = [";
  for (int i = 0; i < 17; ++i) many_stops += "\"s" + std::to_string(i) + "\", ";
  many_stops += "]";
  const std::vector<BadCase> cases = {
      // daemon keys
      {"[bus]\nkind = \"tcp\"", "bus.kind: must be one of \"system\", \"session\", \"address\", got \"tcp\""},
      {"[bus]\nname = \"tandem\"",
       "bus.name: must be a well-known D-Bus name like \"io.tandem.Tandem1\", got \"tandem\""},
      {"[bus]\nname = \"io.2tandem.X\"",
       "bus.name: must be a well-known D-Bus name like \"io.tandem.Tandem1\", got \"io.2tandem.X\""},
      {"[bus]\nkind = \"address\"\naddress = \"nonsense\"",
       "bus.address: must be a D-Bus address like \"unix:path=/run/tandem/bus\", got \"nonsense\""},
      {"[bus]\nkind = \"address\"", "bus.address: must be set when bus.kind = \"address\", got \"\""},
      {"[bus]\naddress = \"unix:path=/x\"",
       "bus.address: must be \"\" unless bus.kind = \"address\" (it is \"system\"), got \"unix:path=/x\""},
      {"[auth]\nsubmit_group = \"-x\"",
       "auth.submit_group: must be a group name (1-32 characters of [A-Za-z0-9_.-], not starting with '-'), got "
       "\"-x\""},
      {"[auth]\nadmin_group = \"\"",
       "auth.admin_group: must be a group name (1-32 characters of [A-Za-z0-9_.-], not starting with '-'), got \"\""},
      {"[device]\nkind = \"rocm\"",
       "device.kind: must be one of \"auto\", \"none\", \"simulated\", \"cuda\", got \"rocm\""},
      {"[device]\ncuda_index = 64", "device.cuda_index: must be in [0,63], got 64"},
      {"[device]\ncuda_index = -1", "device.cuda_index: must be in [0,63], got -1"},
      {"[device]\nsim_capacity = \"32MiB\"", "device.sim_capacity: must be in [64MiB,1PiB], got 32MiB"},
      {"[device]\nsim_capacity = \"2PiB\"", "device.sim_capacity: must be in [64MiB,1PiB], got 2PiB"},
      {"[device]\nsim_reading_lag_ms = 60001", "device.sim_reading_lag_ms: must be in [0,60000], got 60001"},
      {"[device]\npoll_interval_ms = 5", "device.poll_interval_ms: must be in [10,60000], got 5"},
      {"[device]\nprobe_interval_ms = 99", "device.probe_interval_ms: must be in [100,3600000], got 99"},
      {"[device]\nprobe_timeout_ms = 0", "device.probe_timeout_ms: must be in [10,60000], got 0"},
      {model_with("", "temperature = 101"), "model[\"m\"].sampling.temperature: must be in [0,100], got 101", true},
      {model_with("", "top_k = -1"), "model[\"m\"].sampling.top_k: must be in [0,1000000], got -1", true},
      {model_with("", "top_p = 0"), "model[\"m\"].sampling.top_p: must be in (0,1], got 0", true},
      {model_with("", "top_p = 1.5"), "model[\"m\"].sampling.top_p: must be in (0,1], got 1.5", true},
      {model_with("", "top_p = nan"), "model[\"m\"].sampling.top_p: must be in (0,1], got nan", true},
      {model_with("", "repetition_penalty = 10.5"),
       "model[\"m\"].sampling.repetition_penalty: must be in (0,10], got 10.5", true},
      {model_with("", "max_new_tokens = 0"), "model[\"m\"].sampling.max_new_tokens: must be in [1,1048576], got 0",
       true},
      {model_with("", many_stops), "model[\"m\"].sampling.stop: must be at most 16 strings, got 17", true},
      {model_with("", "stop = [\"ok\", \"\"]"), "model[\"m\"].sampling.stop[1]: must be 1-256 bytes, got \"\"", true},
      {"[[model]]\nname = \"bad name\"\ndir = \"/m\"",
       "model[0].name: must be 1-64 characters of [A-Za-z0-9_.-], got \"bad name\"", true},
      {model_with("dtype = \"f64\""),
       "model[\"m\"].dtype: must be one of \"auto\", \"f32\", \"bf16\", \"f16\", got \"f64\"", true},
      {model_with("template = \"alpaca\""),
       "model[\"m\"].template: must be one of \"\", \"raw\", \"llama2\", \"chatml\", \"zephyr\", got \"alpaca\"", true},
      {model_with("replica_mode = \"on-demand\""),
       "model[\"m\"].replica_mode: must be one of \"auto\", \"warm\", \"mmap\", \"on_demand\", got \"on-demand\"",
       true},
      {model_with("gpu_layers = -2"), "model[\"m\"].gpu_layers: must be in [-1,65536], got -2", true},
      {model_with("cpu_threads = 0"), "model[\"m\"].cpu_threads: must be in [1,256], got 0", true},
      {model_with("gpu_threads = 257"), "model[\"m\"].gpu_threads: must be in [1,256], got 257", true},
      {model_with("max_context = 8"), "model[\"m\"].max_context: must be 0 or in [16,1048576], got 8", true},
      {model_with("max_sequences = 5000"), "model[\"m\"].max_sequences: must be in [0,4096], got 5000", true},
      {model_with("revision = \"" + long_revision + "\""),
       "model[\"m\"].revision: must be at most 128 bytes, got \"" + long_revision + "\"", true},
      {"[[model]]\nname = \"m\"\ndir = \"\"", "model[\"m\"].dir: must be a non-empty path, got \"\"", true},
      {"[journal]\ndir = \"\"", "journal.dir: must be a non-empty path, got \"\""},
      {"[journal]\nmax_bytes = 1000", "journal.max_bytes: must be in [1MiB,64GiB], got 1000"},
      {"[journal]\nmax_bytes = \"65GiB\"", "journal.max_bytes: must be in [1MiB,64GiB], got 65GiB"},
      {"[journal]\nretention_s = 31536001", "journal.retention_s: must be in [0,31536000], got 31536001"},
      {"[journal]\nmax_jobs = 0", "journal.max_jobs: must be in [1,10000000], got 0"},
      {"[runtime]\ndrain_timeout_ms = 3600001", "runtime.drain_timeout_ms: must be in [0,3600000], got 3600001"},
      {"[runtime]\nstatus_interval_ms = 50", "runtime.status_interval_ms: must be in [100,3600000], got 50"},
      {"[runtime]\nmax_prompt_bytes = 0", "runtime.max_prompt_bytes: must be in [1,67108864], got 0"},
      {"[runtime]\nmax_messages = 65537", "runtime.max_messages: must be in [1,65536], got 65537"},
      {"[runtime]\nmax_jobs_per_client = 0", "runtime.max_jobs_per_client: must be in [1,1000000], got 0"},
      {"[runtime]\ntoken_flush_interval_ms = 10001",
       "runtime.token_flush_interval_ms: must be in [0,10000], got 10001"},
      // policy keys: policy::PolicyConfig::validate()'s rule, under the TOML key
      {"[margin]\nfraction = 0.6", "margin.fraction: must be in [0,0.5], got 0.6"},
      {"[margin]\nbytes = \"2PiB\"", "margin.bytes: must be in [0,1125899906842624], got 2251799813685248"},
      {"[estimator]\nkv_block_tokens = 0", "estimator.kv_block_tokens: must be in [1,4096], got 0"},
      {"[estimator]\nkv_block_tokens = 4294967296",
       "estimator.kv_block_tokens: must be in [0,4294967295], got 4294967296"},
      {"[estimator]\nfragmentation_fraction = 1.5", "estimator.fragmentation_fraction: must be in [0,1], got 1.5"},
      {"[headroom]\nfresh_for_ms = 1000\nmax_age_ms = 500",
       "headroom.max_age_ms: must be >= headroom.fresh_for_ms (1s), got 500ms"},
      {"[headroom]\nfresh_for_ms = -1", "headroom.fresh_for_ms: must be in [0,31536000000], got -1"},
      {"[headroom]\nstale_discount_fraction = -0.1", "headroom.stale_discount_fraction: must be in [0,1], got -0.1"},
      {"[ladder]\norder = [\"admit\", \"delay\"]",
       "ladder.order: must be ending in 'reject' (the ladder must always answer), got 'delay' last"},
      {"[ladder]\norder = []", "ladder.order: must be non-empty, got []"},
      {"[ladder]\norder = [\"admit\", \"admit\", \"reject\"]",
       "ladder.order: must be free of duplicates, got 'admit' twice"},
      {"[ladder]\norder = [\"admit\", \"jump\", \"reject\"]",
       "ladder.order[1]: must be one of \"admit\", \"delay\", \"reduce\", \"offload\", \"route_cpu\", \"reject\", got "
       "\"jump\""},
      {"[ladder]\ndefault_retry_after_ms = 400000",
       "ladder.max_retry_after_ms: must be >= default_retry_after_ms (400s), got 300s"},
      {"[ladder]\ndefault_retry_after_ms = 0", "ladder.default_retry_after_ms: must be > 0, got 0s"},
      {"[ladder]\nmin_gpu_layers = 0", "ladder.min_gpu_layers: must be >= 1, got 0"},
      {"[ladder.pressure]\nelevated_enter_fraction = 1.5",
       "ladder.pressure.elevated_enter_fraction: must be in [0,1), got 1.5"},
      {"[ladder.pressure]\nelevated_exit_fraction = 0.1",
       "ladder.pressure.elevated_exit_fraction: must be > elevated_enter_fraction (0.15), got 0.1"},
      {"[breaker]\ncooldown_ms = 400000", "breaker.max_cooldown_ms: must be >= cooldown_ms (400s), got 300s"},
      {"[breaker]\nwindow_ms = 0", "breaker.window_ms: must be > 0, got 0s"},
      {"[breaker]\nbackoff_factor = 20", "breaker.backoff_factor: must be in [1,16], got 20"},
      {"[breaker]\nalloc_failure_threshold = 1001", "breaker.alloc_failure_threshold: must be in [1,1000], got 1001"},
      {"[gpu_queue]\nconcurrency = 0", "gpu_queue.concurrency: must be in [1,4096], got 0"},
      {"[cpu_queue]\nmax_new_tokens = 5000", "cpu_queue.max_new_tokens: must be < max_context (4096), got 5000"},
      {"[gpu_queue]\nmax_new_tokens = 32",
       "ladder.min_reduced_new_tokens: must be <= gpu_queue.max_new_tokens (32), got 64"},
      {"[cpu_rates]\newma_alpha = 0", "cpu_rates.ewma_alpha: must be in (0,1], got 0"},
      {"[gpu_rates]\nprior_decode_tps = -3", "gpu_rates.prior_decode_tps: must be in (0,1e+09], got -3"},
      {"[host]\nbudget = \"1MiB\"", "host.budget: must be 0 (no configured cap) or >= 67108864, got 1048576"},
      {"[host]\nmem_available_reserve = 0", "host.mem_available_reserve: must be >= 1, got 0"},
      {"[service]\nrecover_after_ms = 31536000001",
       "service.recover_after_ms: must be in [0,31536000000], got 31536000001"},
      {"[replica]\nrecovery_budget_ms = 0", "replica.recovery_budget_ms: must be > 0, got 0s"},
      {"[replica]\nswitch_margin = 1", "replica.switch_margin: must be in [0,1), got 1"},
      {"[idempotency]\nretention_s = 0", "idempotency.retention_s: must be > 0, got 0s"},
      {"[idempotency]\nmax_keys = 0", "idempotency.max_keys: must be in [1,100000000], got 0"},
      // cross-field
      {"default_model = \"nope\"",
       "default_model: must be \"\" (the first [[model]]) or the name of a [[model]] (\"m\"), got \"nope\""},
      {model_with("fallback = \"nope\""),
       "model[\"m\"].fallback: must be \"\" or the name of another [[model]] (none), got \"nope\"", true},
      {model_with("fallback = \"m\"") + "[[model]]\nname = \"n\"\ndir = \"/n\"\n",
       "model[\"m\"].fallback: must be \"\" or the name of another [[model]] (\"n\"), got \"m\"", true},
      {"[bus]\nkind = \"session\"", "model: must be at least one [[model]] table with name and dir, got none", true},
      {"[[model]]\ndir = \"/m\"", "model[0].name: must be set (every [[model]] needs a name), got nothing", true},
      {"[[model]]\nname = \"m\"", "model[\"m\"].dir: must be a non-empty path, got \"\"", true},
      {model_with("") + model_with(""), "model[1].name: must be unique within a file, got \"m\" twice", true},
  };
  EXPECT_GE(cases.size(), 25u);
  expect_all_fail(cases);
}

TEST(DaemonConfig, BoundaryValuesAreAccepted) {
  const std::string doc = R"(
[device]
cuda_index = 63
sim_capacity = "1PiB"
sim_reading_lag_ms = 60000
poll_interval_ms = 10
probe_interval_ms = 3600000
probe_timeout_ms = 10
[journal]
max_bytes = "1MiB"
retention_s = 0
[runtime]
drain_timeout_ms = 0
token_flush_interval_ms = 0
[[model]]
name = "A-z_0.9"
dir = "/m"
gpu_layers = -1
max_context = 0
[model.sampling]
top_p = 1
repetition_penalty = 10
temperature = 100
)";
  auto r = parse_config(doc, kFile);
  ASSERT_TRUE(r.ok()) << message(r);
  EXPECT_EQ(r->device.sim_capacity_bytes, 1ull << 50);
}

// ---- errors: types and unknown keys -----------------------------------------------------------------------------

TEST(DaemonConfig, WrongTypesNameTheExpectedType) {
  const std::vector<BadCase> cases = {
      {"[device]\ncuda_index = 1.5", "device.cuda_index: must be an integer in [0,63], got float 1.5"},
      {"[device]\ncuda_index = \"1\"", "device.cuda_index: must be an integer in [0,63], got string \"1\""},
      {"[runtime]\nmax_messages = true", "runtime.max_messages: must be an integer in [1,65536], got boolean true"},
      {"[device]\npoll_interval_ms = 2.5", "device.poll_interval_ms: must be an integer in [10,60000], got float 2.5"},
      {"[estimator]\nkv_block_tokens = 16.0",
       "estimator.kv_block_tokens: must be an integer in [0,4294967295], got float 16"},
      {"[journal]\nmax_jobs = 1979-05-27", "journal.max_jobs: must be an integer in [1,10000000], got a date"},
      {"[device]\nsim_capacity = 1.5",
       "device.sim_capacity: must be a size (integer bytes or a string like \"8GiB\") in [64MiB,1PiB], got float 1.5"},
      {"[device]\nsim_capacity = -5",
       "device.sim_capacity: must be a size (integer bytes or a string like \"8GiB\") in [64MiB,1PiB], got -5"},
      {"[device]\nsim_capacity = \"8 gigs\"",
       "device.sim_capacity: must be a size (integer bytes or a string like \"8GiB\") in [64MiB,1PiB], got \"8 gigs\" "
       "(unknown unit \"gigs\"; allowed: B, KiB, MiB, GiB, TiB, PiB, KB, MB, GB, TB, PB)"},
      {"[host]\nbudget = \"0.1KiB\"",
       "host.budget: must be a size (integer bytes or a string like \"8GiB\") in [0,18446744073709551615], got "
       "\"0.1KiB\" (not a whole number of bytes)"},
      {"[auth]\nallow_any_local_user = \"yes\"",
       "auth.allow_any_local_user: must be a boolean (true or false), got string \"yes\""},
      {"[journal]\nfsync = 1", "journal.fsync: must be a boolean (true or false), got integer 1"},
      {model_with("", "temperature = \"hot\""),
       "model[\"m\"].sampling.temperature: must be a number in [0,100], got string \"hot\"", true},
      {"[margin]\nfraction = \"x\"", "margin.fraction: must be a number, got string \"x\""},
      {"[bus]\nname = 5", "bus.name: must be a string, got integer 5"},
      {"[bus]\nkind = 1", "bus.kind: must be one of \"system\", \"session\", \"address\", got integer 1"},
      {"[ladder]\norder = \"admit\"", "ladder.order: must be an array of strings, got string \"admit\""},
      {"[ladder]\norder = [\"admit\", 1]", "ladder.order[1]: must be a string, got integer 1"},
      {model_with("", "stop = [\"a\", 1]"), "model[\"m\"].sampling.stop[1]: must be a string, got integer 1", true},
      {model_with("", "stop = \"a\""),
       "model[\"m\"].sampling.stop: must be an array of strings, got string \"a\"", true},
      {"bus = 5", "bus: must be a table, got integer 5"},
      {"[ladder]\npressure = 1", "ladder.pressure: must be a table, got integer 1"},
      {"[model]\nname = \"m\"\ndir = \"/m\"",
       "model: must be an array of tables ([[model]] with name and dir), got a table",
       true},
      {"model = []", "model: must be an array of tables ([[model]] with name and dir), got an array", true},
      {"[[model]]\nname = 7\ndir = \"/m\"", "model[0].name: must be a string, got integer 7", true},
  };
  expect_all_fail(cases);
}

TEST(DaemonConfig, UnknownKeysAreErrorsListingTheAllowedOnes) {
  const std::vector<BadCase> cases = {
      {"foo = 1",
       "unknown key 'foo' (allowed: default_model, bus, auth, device, model, margin, estimator, headroom, ladder, "
       "breaker, gpu_queue, cpu_queue, gpu_rates, cpu_rates, host, service, replica, failover, idempotency, journal, "
       "runtime, rings)"},
      {"[device]\nfoo = 1",
       "unknown key 'device.foo' (allowed: kind, cuda_index, sim_capacity, sim_reading_lag_ms, poll_interval_ms, "
       "probe_interval_ms, probe_timeout_ms)"},
      {"[ladder.pressure]\nelevated = 0.1",
       "unknown key 'ladder.pressure.elevated' (allowed: elevated_enter_fraction, elevated_exit_fraction, "
       "critical_enter_fraction, critical_exit_fraction)"},
      {"[ladder]\nfoo.bar = 1",
       "unknown key 'ladder.foo' (allowed: order, max_delay_ms, min_reduced_new_tokens, min_prefill_chunk, "
       "offload_enabled, min_gpu_layers, default_retry_after_ms, max_retry_after_ms, pressure)"},
      {"[host]\nbudget_bytes = 0", "unknown key 'host.budget_bytes' (allowed: budget, mem_available_reserve)"},
      {"[host_guard]\nbudget = 0",
       "unknown key 'host_guard' (allowed: default_model, bus, auth, device, model, margin, estimator, headroom, "
       "ladder, breaker, gpu_queue, cpu_queue, gpu_rates, cpu_rates, host, service, replica, failover, idempotency, "
       "journal, runtime, rings)"},
      {"[margin.extra]\nx = 1", "unknown key 'margin.extra' (allowed: bytes, fraction)"},
      {"[headroom]\nfresh_for = 5", "unknown key 'headroom.fresh_for' (allowed: fresh_for_ms, max_age_ms, "
                                    "stale_discount_fraction)"},
      {model_with("gpu_layer = 3"),
       "unknown key 'model[\"m\"].gpu_layer' (allowed: name, dir, revision, dtype, template, replica_mode, gpu, "
       "gpu_layers, fallback, cpu_threads, gpu_threads, max_context, max_sequences, sampling)",
       true},
      {model_with("", "temp = 1"),
       "unknown key 'model[\"m\"].sampling.temp' (allowed: temperature, top_k, top_p, repetition_penalty, "
       "max_new_tokens, stop)",
       true},
  };
  expect_all_fail(cases);
}

TEST(DaemonConfig, TheFirstErrorInTheDocumentIsReported) {
  auto r = parse_config("[device]\nprobe_timeout_ms = 0\ncuda_index = 99\n" + std::string(kModel), kFile);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message, HasSubstr("device.probe_timeout_ms"));
}

TEST(DaemonConfig, SyntaxErrorsCarryLineAndColumn) {
  auto r = parse_config("[bus]\nkind = \"session\"\nname = io.tandem\n", kFile);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::parse_error);
  EXPECT_THAT(r.error().message, StartsWith(std::string(kFile) + ":3:"));
  EXPECT_TRUE(std::regex_search(r.error().message, std::regex(R"(^/etc/tandem/tandemd\.toml:3:[0-9]+: \S)")))
      << r.error().message;

  auto dup = parse_config("[device]\ncuda_index = 1\ncuda_index = 2\n", kFile);
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.error().code, Errc::parse_error);
  EXPECT_THAT(dup.error().message, StartsWith(std::string(kFile) + ":3:"));

  auto unterminated = parse_config("[[model]]\nname = \"m\ndir = \"/m\"\n", "x.toml");
  ASSERT_FALSE(unterminated.ok());
  EXPECT_EQ(unterminated.error().code, Errc::parse_error);
  EXPECT_THAT(unterminated.error().message, StartsWith("x.toml:2:"));
}

// ---- validate() on configurations built in code -----------------------------------------------------------------

TEST(DaemonConfig, ValidateChecksConfigurationsBuiltInCode) {
  DaemonConfig c;
  EXPECT_EQ(message(c.validate()), "model: must be at least one [[model]] table with name and dir, got none");
  ModelConfig m;
  m.name = "a";
  m.dir = "/a";
  c.models = {m, m};
  EXPECT_EQ(message(c.validate()), "model[\"a\"].name: must be unique, got \"a\" twice");
  c.models[1].name = "b";
  EXPECT_TRUE(c.validate().ok()) << message(c.validate());
  c.models[1].sampling.top_p = 2;
  EXPECT_EQ(message(c.validate()), "model[\"b\"].sampling.top_p: must be in (0,1], got 2");
  c.models[1].sampling.top_p = 1;
  c.models[0].name = "no spaces please";
  EXPECT_EQ(message(c.validate()),
            "model[0].name: must be 1-64 characters of [A-Za-z0-9_.-], got \"no spaces please\"");
  c.models[0].name = "a";
  c.device.probe_interval = 10ms;
  EXPECT_EQ(message(c.validate()), "device.probe_interval_ms: must be in [100,3600000], got 10");
  c.device.probe_interval = 100ms;
  c.policy.breaker.max_cooldown = 1s;
  EXPECT_EQ(message(c.validate()), "breaker.max_cooldown_ms: must be >= cooldown_ms (10s), got 1s");
  c.policy.breaker.max_cooldown = 10s;
  c.policy.host_guard.cpu_act_elem_bytes = 3;  // not a TOML key: keeps the policy's name
  EXPECT_EQ(message(c.validate()), "host_guard.cpu_act_elem_bytes: must be 2 or 4, got 3");
  c.policy.host_guard.cpu_act_elem_bytes = 4;
  EXPECT_TRUE(c.validate().ok()) << message(c.validate());
}

TEST(DaemonConfig, KindNames) {
  EXPECT_EQ(bus_kind_name(BusKind::system), "system");
  EXPECT_EQ(bus_kind_name(BusKind::session), "session");
  EXPECT_EQ(bus_kind_name(BusKind::address), "address");
  EXPECT_EQ(accel_kind_name(AccelKind::auto_detect), "auto");
  EXPECT_EQ(accel_kind_name(AccelKind::none), "none");
  EXPECT_EQ(accel_kind_name(AccelKind::simulated), "simulated");
  EXPECT_EQ(accel_kind_name(AccelKind::cuda), "cuda");
}

// ---- files and drop-ins -----------------------------------------------------------------------------------------

TEST(DaemonConfig, DropInsOverrideKeyByKeyAndMergeModelsByName) {
  TempDir tmp;
  const std::string main = tmp.write("etc/tandemd.toml", R"(
default_model = "big"
[device]
kind = "simulated"
poll_interval_ms = 100
[ladder]
order = ["admit", "delay", "reduce", "reject"]
max_delay_ms = 1000
[[model]]
name = "big"
dir = "models/big"
cpu_threads = 2
[model.sampling]
temperature = 0.7
stop = ["A", "B"]
)");
  const std::string first = tmp.write("etc/tandemd.d/10-first.toml", R"(
[device]
poll_interval_ms = 200
[ladder]
order = ["admit", "reject"]
[[model]]
name = "big"
cpu_threads = 4
[model.sampling]
stop = ["C"]
[[model]]
name = "small"
dir = "small"
)");
  const std::string second = tmp.write("etc/tandemd.d/20-second.toml", R"(
[device]
poll_interval_ms = 300
[[model]]
name = "big"
fallback = "small"
)");
  tmp.write("etc/tandemd.d/README", "not toml = [");
  tmp.write("etc/tandemd.d/.hidden.toml", "not toml = [");
  tmp.write("etc/tandemd.d/30-old.toml.dpkg-old", "not toml = [");
  fs::create_directories(tmp.path() / "etc/tandemd.d/40-dir.toml");

  auto r = load_config(main);
  ASSERT_TRUE(r.ok()) << message(r);
  const DaemonConfig& c = *r;
  EXPECT_EQ(c.sources, (std::vector<std::string>{main, first, second}));
  EXPECT_EQ(c.device.kind, AccelKind::simulated);  // untouched by the drop-ins
  EXPECT_EQ(c.device.poll_interval, 300ms);        // the last file wins
  EXPECT_EQ(c.policy.ladder.order, (std::vector<policy::Rung>{policy::Rung::admit, policy::Rung::reject}));
  EXPECT_EQ(c.policy.ladder.max_delay, 1s);
  ASSERT_EQ(c.models.size(), 2u);
  const ModelConfig& big = c.models[0];
  EXPECT_EQ(big.name, "big");
  EXPECT_EQ(big.dir, (tmp.path() / "etc/models/big").string());  // relative to the main file
  EXPECT_EQ(big.cpu_threads, 4);
  EXPECT_EQ(big.sampling.temperature, 0.7);                    // merged, not replaced
  EXPECT_EQ(big.sampling.stop, std::vector<std::string>{"C"});  // lists replace
  EXPECT_EQ(big.fallback, "small");
  const ModelConfig& small = c.models[1];
  EXPECT_EQ(small.name, "small");
  EXPECT_EQ(small.dir, (tmp.path() / "etc/tandemd.d/small").string());  // relative to the drop-in
  EXPECT_EQ(c.default_model, "big");
}

TEST(DaemonConfig, DropInsAreReadInNameOrder) {
  TempDir tmp;
  const std::string main = tmp.write("tandemd.toml", std::string("[device]\npoll_interval_ms = 50\n") + kModel);
  tmp.write("tandemd.d/2-x.toml", "[device]\npoll_interval_ms = 2000\n");
  tmp.write("tandemd.d/10-y.toml", "[device]\npoll_interval_ms = 1000\n");
  auto r = load_config(main);
  ASSERT_TRUE(r.ok()) << message(r);
  EXPECT_EQ(r->device.poll_interval, 2000ms);  // "2-x" sorts after "10-y"
  ASSERT_EQ(r->sources.size(), 3u);
  EXPECT_THAT(r->sources[1], testing::EndsWith("10-y.toml"));
  EXPECT_THAT(r->sources[2], testing::EndsWith("2-x.toml"));
}

TEST(DaemonConfig, AnExplicitDropInDirectoryReplacesTheDefaultOne) {
  TempDir tmp;
  const std::string main = tmp.write("tandemd.toml", kModel);
  tmp.write("tandemd.d/10.toml", "[device]\ncuda_index = 1\n");
  tmp.write("other/10.toml", "[device]\ncuda_index = 2\n");
  auto r = load_config(main, (tmp.path() / "other").string());
  ASSERT_TRUE(r.ok()) << message(r);
  EXPECT_EQ(r->device.cuda_index, 2);
}

TEST(DaemonConfig, ErrorsNameTheFileThatSetTheKey) {
  TempDir tmp;
  const std::string main = tmp.write("tandemd.toml", std::string("default_model = \"m\"\n") + kModel);
  {
    const std::string bad = tmp.write("tandemd.d/30-bad.toml", "[device]\ncuda_index = 99\n");
    auto r = load_config(main);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message, bad + ": device.cuda_index: must be in [0,63], got 99");
    fs::remove(bad);
  }
  {
    // Cross-field: the default max_retry_after_ms is now too small; blame the file that moved the other bound.
    const std::string bad = tmp.write("tandemd.d/40-retry.toml", "[ladder]\ndefault_retry_after_ms = 400000\n");
    auto r = load_config(main);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message,
              bad + ": ladder.max_retry_after_ms: must be >= default_retry_after_ms (400s), got 300s");
    fs::remove(bad);
  }
  {
    const std::string bad = tmp.write("tandemd.d/50-fallback.toml", "[[model]]\nname = \"m\"\nfallback = \"x\"\n");
    auto r = load_config(main);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message,
              bad + ": model[\"m\"].fallback: must be \"\" or the name of another [[model]] (none), got \"x\"");
    fs::remove(bad);
  }
  {
    const std::string bad = tmp.write("tandemd.d/60-syntax.toml", "[device\n");
    auto r = load_config(main);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, Errc::parse_error);
    EXPECT_THAT(r.error().message, StartsWith(bad + ":1:"));
    fs::remove(bad);
  }
  {
    // A model added by a drop-in without a dir: blame the drop-in that named it.
    const std::string bad = tmp.write("tandemd.d/70-nodir.toml", "[[model]]\nname = \"n\"\n");
    auto r = load_config(main);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message, bad + ": model[\"n\"].dir: must be a non-empty path, got \"\"");
    fs::remove(bad);
  }
  auto ok = load_config(main);
  EXPECT_TRUE(ok.ok()) << message(ok);
}

TEST(DaemonConfig, MissingFiles) {
  TempDir tmp;
  auto missing = load_config((tmp.path() / "nope.toml").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, Errc::not_found);
  EXPECT_THAT(missing.error().message, HasSubstr("nope.toml"));

  const std::string main = tmp.write("tandemd.toml", kModel);
  auto no_dropins = load_config(main);  // tandemd.d does not exist: fine
  ASSERT_TRUE(no_dropins.ok()) << message(no_dropins);
  EXPECT_EQ(no_dropins->sources, std::vector<std::string>{main});
  auto explicit_missing = load_config(main, (tmp.path() / "nowhere").string());
  EXPECT_TRUE(explicit_missing.ok()) << message(explicit_missing);

  const std::string not_a_dir = tmp.write("file.d", "x");
  auto bad_dir = load_config(main, not_a_dir);
  ASSERT_FALSE(bad_dir.ok());
  EXPECT_EQ(bad_dir.error().code, Errc::io_error);
  EXPECT_THAT(bad_dir.error().message, HasSubstr("not a directory"));

  auto dir_as_file = load_config(tmp.path().string());
  ASSERT_FALSE(dir_as_file.ok());
  EXPECT_EQ(dir_as_file.error().code, Errc::io_error);
}

// ---- rendering --------------------------------------------------------------------------------------------------

TEST(DaemonConfig, RenderReadsBackToAnEqualConfig) {
  auto r = parse_config(kEverything, kFile);
  ASSERT_TRUE(r.ok()) << message(r);
  const std::string text = render_config(*r);
  auto back = parse_config(text, kFile);
  ASSERT_TRUE(back.ok()) << message(back) << "\n" << text;
  expect_same(*back, *r);
  EXPECT_EQ(render_config(*back), text);
  EXPECT_THAT(text, HasSubstr("sim_capacity = \"2GiB\"\n"));
  EXPECT_THAT(text, HasSubstr("mem_available_reserve = \"512MiB\"\n"));
  EXPECT_THAT(text, HasSubstr("poll_interval_ms = 100\n"));
  EXPECT_THAT(text, HasSubstr("retention_s = 3600\n"));
  EXPECT_THAT(text, HasSubstr("replica_mode = \"on_demand\"\n"));
  EXPECT_THAT(text, HasSubstr("prior_prefill_tps = 3000.0\n"));
  EXPECT_THAT(text, HasSubstr("order = [\"admit\", \"reduce\", \"route_cpu\", \"reject\"]\n"));
}

TEST(DaemonConfig, RenderRoundTripsAwkwardValues) {
  DaemonConfig c;
  ModelConfig a;
  a.name = "a.b-c_1";
  a.dir = "/srv/models/with \"quotes\" and \\ backslash";
  a.revision = "tab\there, newline\nhere, unicode \xC3\xA9, control \x01";
  a.template_name = "";
  a.replica_mode = policy::ReplicaMode::warm;
  a.sampling.temperature = 0.1;
  a.sampling.top_p = 1.0 / 3.0;
  a.sampling.repetition_penalty = 1e-7;
  a.sampling.stop = {"\n\n", "###", "'single'"};
  ModelConfig b;
  b.name = "b";
  b.dir = "relative/dir";
  b.max_context = 16;
  b.gpu_layers = 0;
  c.models = {a, b};
  c.device.sim_capacity_bytes = 64 * (1ull << 20) + 1;  // not a whole unit: rendered as bytes
  c.policy.headroom.margin.bytes = 0;
  c.policy.host_guard.budget_bytes = 3 * (1ull << 40);
  c.policy.ladder.max_delay = 1500ms;
  c.journal.max_bytes = 1'000'000'000;
  ASSERT_TRUE(c.validate().ok()) << message(c.validate());
  const std::string text = render_config(c);
  auto back = parse_config(text);
  ASSERT_TRUE(back.ok()) << message(back) << "\n" << text;
  expect_same(*back, c);
  EXPECT_THAT(text, HasSubstr("sim_capacity = 67108865\n"));
  EXPECT_THAT(text, HasSubstr("budget = \"3TiB\"\n"));
  EXPECT_THAT(text, HasSubstr("max_delay_ms = 1500\n"));
  EXPECT_THAT(text, HasSubstr("bytes = 0\n"));
}

TEST(DaemonConfig, RenderOfTheDefaultsListsEveryKey) {
  DaemonConfig c;
  ModelConfig m;
  m.name = "m";
  m.dir = "/m";
  c.models = {m};
  c.sources = {"/etc/tandem/tandemd.toml"};
  const std::string text = render_config(c);
  EXPECT_THAT(text, HasSubstr("# source: /etc/tandem/tandemd.toml\n"));
  EXPECT_THAT(text, HasSubstr("[ladder.pressure]\n"));
  EXPECT_THAT(text, HasSubstr("[model.sampling]\n"));
  EXPECT_THAT(text, HasSubstr("replica_mode = \"auto\"\n"));
  EXPECT_THAT(text, HasSubstr("kind = \"auto\"\n"));
  EXPECT_THAT(text, HasSubstr("budget = 0\n"));
  auto back = parse_config(text);
  ASSERT_TRUE(back.ok()) << message(back);
  expect_same(*back, c);
}

// ---- parse_size -------------------------------------------------------------------------------------------------

TEST(ParseSize, Accepts) {
  const std::pair<const char*, std::uint64_t> rows[] = {
      {"0", 0},
      {"1024", 1024},
      {"7B", 7},
      {" 7 B ", 7},
      {"8GiB", 8ull << 30},
      {"512 MiB", 512ull << 20},
      {"1.5GiB", 3ull << 29},
      {"1.50GiB", 3ull << 29},
      {"0.5KiB", 512},
      {"1KiB", 1024},
      {"1TiB", 1ull << 40},
      {"1PiB", 1ull << 50},
      {"1KB", 1000},
      {"2.5MB", 2'500'000},
      {"3GB", 3'000'000'000ull},
      {"1TB", 1'000'000'000'000ull},
      {"1PB", 1'000'000'000'000'000ull},
      {"18446744073709551615", 18446744073709551615ull},
      {"16383PiB", 16383ull << 50},
      {"0.25MiB", 262144},
      {"1.125KiB", 1152},
      {"8.000GiB", 8ull << 30},
  };
  for (const auto& [text, want] : rows) {
    auto r = parse_size(text);
    ASSERT_TRUE(r.ok()) << text << ": " << message(r);
    EXPECT_EQ(*r, want) << text;
  }
}

TEST(ParseSize, Rejects) {
  const std::pair<const char*, const char*> rows[] = {
      {"", "empty"},
      {"   ", "empty"},
      {"-1", "negative"},
      {"-1GiB", "negative"},
      {"+5", "does not start with a number"},
      {"abc", "does not start with a number"},
      {".5GiB", "does not start with a number"},
      {"1.", "no digits after '.'"},
      {"1.GiB", "no digits after '.'"},
      {"8 gigs", "unknown unit \"gigs\""},
      {"8gib", "unknown unit \"gib\""},
      {"1e3", "unknown unit \"e3\""},
      {"5 5", "unknown unit \"5\""},
      {"1.3KiB", "not a whole number of bytes"},
      {"0.5B", "not a whole number of bytes"},
      {"0.000000000931322574615478515625GiB", "more than 18 decimal digits"},
      {"18446744073709551616", "larger than 18446744073709551615 bytes"},
      {"99999999999999999999999", "larger than 18446744073709551615 bytes"},
      {"16384PiB", "larger than 18446744073709551615 bytes"},
      {"17179869184GiB", "larger than 18446744073709551615 bytes"},
      {"16384.5PiB", "larger than 18446744073709551615 bytes"},
  };
  for (const auto& [text, why] : rows) {
    auto r = parse_size(text);
    ASSERT_FALSE(r.ok()) << "accepted " << text;
    EXPECT_EQ(r.error().code, Errc::invalid_argument);
    EXPECT_THAT(r.error().message, HasSubstr(why)) << text;
    EXPECT_THAT(r.error().message, StartsWith("size \"")) << text;
  }
}

// ---- the shipped files ------------------------------------------------------------------------------------------

const fs::path kSourceRoot = TANDEM_SOURCE_ROOT;

// Turns the commented-out settings ("#key = value", "#[section]": '#' directly followed by the key) into settings;
// prose comments start with "# ".
std::string uncomment_settings(const std::string& text) {
  std::istringstream in(text);
  std::string out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > 1 && line[0] == '#' && ((line[1] >= 'a' && line[1] <= 'z') || line[1] == '[')) line.erase(0, 1);
    out += line + "\n";
  }
  return out;
}

// "section.key" for every "key = value" line.
std::set<std::string> keys_of(const std::string& text) {
  std::set<std::string> keys;
  std::istringstream in(text);
  std::string line;
  std::string section;
  static const std::regex header(R"(^\[\[?([a-z_.]+)\]\]?\s*(#.*)?$)");
  static const std::regex setting(R"(^([a-z_]+) = )");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, header)) {
      section = m[1];
    } else if (std::regex_search(line, m, setting)) {
      keys.insert(section.empty() ? std::string(m[1]) : section + "." + std::string(m[1]));
    }
  }
  return keys;
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ShippedConfig, TheDefaultFileLoads) {
  TempDir empty;
  const fs::path file = kSourceRoot / "config/tandemd.toml";
  auto r = load_config(file.string(), empty.path().string());
  ASSERT_TRUE(r.ok()) << message(r);
  ASSERT_FALSE(r->models.empty());
  EXPECT_TRUE(r->validate().ok());
}

// The commented-out values in config/tandemd.toml are the defaults, and every key is shown.
TEST(ShippedConfig, TheDefaultFileShowsEveryKeyWithItsDefault) {
  const fs::path file = kSourceRoot / "config/tandemd.toml";
  const std::string uncommented = uncomment_settings(read(file));
  auto r = parse_config(uncommented, file.string());
  ASSERT_TRUE(r.ok()) << message(r);
  ASSERT_EQ(r->models.size(), 1u);
  DaemonConfig want;
  ModelConfig m;
  m.name = r->models[0].name;
  m.dir = r->models[0].dir;
  want.models = {m};
  want.default_model = r->default_model;
  expect_same(*r, want);

  const std::set<std::string> shown = keys_of(uncommented);
  EXPECT_GE(keys_of(render_config(want)).size(), 91u);  // the scanner sees every key (91 when this was written)
  for (const auto& key : keys_of(render_config(want))) EXPECT_TRUE(shown.count(key)) << key << " is not shown";
  for (const auto& key : shown) EXPECT_TRUE(keys_of(render_config(want)).count(key)) << key << " is not a key";
}

TEST(ShippedConfig, EveryExampleLoads) {
  TempDir empty;
  std::map<std::string, DaemonConfig> loaded;
  for (const auto& entry : fs::directory_iterator(kSourceRoot / "config/examples")) {
    if (entry.path().extension() != ".toml") continue;
    auto r = load_config(entry.path().string(), empty.path().string());
    ASSERT_TRUE(r.ok()) << message(r);
    // Loading does not look at model directories (the daemon checks them at start).
    loaded.emplace(entry.path().filename().string(), std::move(*r));
  }
  for (const char* name : {"workstation-cuda.toml", "home-server-two-models.toml", "cpu-only.toml",
                           "simulated-demo.toml"}) {
    EXPECT_TRUE(loaded.count(name)) << name;
  }
  if (loaded.count("workstation-cuda.toml")) {
    EXPECT_EQ(loaded["workstation-cuda.toml"].device.kind, AccelKind::cuda);
  }
  if (loaded.count("cpu-only.toml")) {
    const auto& c = loaded["cpu-only.toml"];
    EXPECT_EQ(c.device.kind, AccelKind::none);
    for (const auto& m : c.models) EXPECT_FALSE(m.gpu) << m.name;
  }
  if (loaded.count("home-server-two-models.toml")) {
    const auto& c = loaded["home-server-two-models.toml"];
    ASSERT_GE(c.models.size(), 2u);
    bool has_fallback = false;
    for (const auto& m : c.models) has_fallback |= !m.fallback.empty() && c.find_model(m.fallback) != nullptr;
    EXPECT_TRUE(has_fallback);
  }
  if (loaded.count("simulated-demo.toml")) {
    const auto& c = loaded["simulated-demo.toml"];
    EXPECT_EQ(c.device.kind, AccelKind::simulated);
    EXPECT_EQ(c.device.sim_capacity_bytes, 2ull << 30);
    EXPECT_NE(c.bus.kind, BusKind::system);
  }
}

}  // namespace
}  // namespace tandem::daemon
