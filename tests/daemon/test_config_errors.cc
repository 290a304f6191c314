// tandemd's configuration errors: every range violation, wrong types, unknown keys, the first error of a
// document, syntax errors with line and column.
#include "test_config_util.h"

#include <regex>

namespace tandem::daemon {
namespace {

using namespace config_test;

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
      {"[device]\nidle_poll_interval_ms = 60001", "device.idle_poll_interval_ms: must be in [10,60000], got 60001"},
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
      {model_with("kv_cache = \"q8_0\""), "model[\"m\"].kv_cache: must be one of \"f16\", \"f32\", got \"q8_0\"", true},
      {model_with("template = \"alpaca\""),
       "model[\"m\"].template: must be one of \"\", \"raw\", \"llama2\", \"chatml\", \"zephyr\", got \"alpaca\"", true},
      {model_with("replica_mode = \"on-demand\""),
       "model[\"m\"].replica_mode: must be one of \"auto\", \"warm\", \"mmap\", \"on_demand\", got \"on-demand\"",
       true},
      {model_with("gpu_layers = -2"), "model[\"m\"].gpu_layers: must be in [-1,65536], got -2", true},
      {model_with("cpu_threads = 0"), "model[\"m\"].cpu_threads: must be in [1,256], got 0", true},
      {model_with("keep_alive_s = -2"), "model[\"m\"].keep_alive_s: must be in [-1,2592000], got -2", true},
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
       "ladder.order[1]: must be one of \"admit\", \"delay\", \"evict\", \"reduce\", \"offload\", \"route_cpu\", \"reject\", got "
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
      {"[embedding]\nmax_inputs = 0", "embedding.max_inputs: must be in [1,1024], got 0"},
      {"[embedding]\nmax_image_bytes = \"2GiB\"", "embedding.max_image_bytes: must be in [1KiB,1GiB], got 2GiB"},
      // cross-field
      {"[embedding]\ndefault_model = \"nope\"",
       "embedding.default_model: must be \"\" (the first embedding model) or the name of a [[model]] (\"m\"), got \"nope\""},
      {"[speech]\nmax_audio_seconds = 0", "speech.max_audio_seconds: must be in [1,86400], got 0"},
      {"[speech]\nmax_audio_bytes = \"5GiB\"", "speech.max_audio_bytes: must be in [1KiB,4GiB], got 5GiB"},
      {"[speech]\ndefault_model = \"nope\"",
       "speech.default_model: must be \"\" (the first speech model) or the name of a [[model]] (\"m\"), got \"nope\""},
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
idle_poll_interval_ms = 60000
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
       "runtime, embedding, speech, rings)"},
      {"[device]\nfoo = 1",
       "unknown key 'device.foo' (allowed: kind, cuda_index, sim_capacity, sim_reading_lag_ms, poll_interval_ms, "
       "idle_poll_interval_ms, probe_interval_ms, probe_timeout_ms, evict_on_hold, drain_ms, max_pressure_evictions_per_minute, recover_after_ms)"},
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
       "journal, runtime, embedding, speech, rings)"},
      {"[margin.extra]\nx = 1", "unknown key 'margin.extra' (allowed: bytes, fraction)"},
      {"[headroom]\nfresh_for = 5", "unknown key 'headroom.fresh_for' (allowed: fresh_for_ms, max_age_ms, "
                                    "stale_discount_fraction)"},
      {model_with("gpu_layer = 3"),
       "unknown key 'model[\"m\"].gpu_layer' (allowed: name, dir, revision, dtype, kv_cache, template, replica_mode, gpu, "
       "gpu_layers, fallback, cpu_threads, keep_alive_s, priority, gpu_threads, max_context, max_sequences, sampling)",
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

}  // namespace
}  // namespace tandem::daemon
