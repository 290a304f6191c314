// tandemd's configuration (src/daemon/config*.cc): defaults, parsing every section, validate() on configurations
// built in code, rendering and parse_size. Errors: test_config_errors.cc; files: test_config_files.cc.
#include "test_config_util.h"

namespace tandem::daemon {
namespace {

using namespace config_test;

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
  EXPECT_EQ(r->device.poll_interval, 250ms);
  EXPECT_EQ(r->device.idle_poll_interval, 2000ms);
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
  EXPECT_EQ(c.device.idle_poll_interval, 3000ms);
  EXPECT_EQ(c.device.probe_interval, 5000ms);
  EXPECT_EQ(c.device.probe_timeout, 500ms);

  ASSERT_EQ(c.models.size(), 2u);
  const ModelConfig& big = c.models[0];
  EXPECT_EQ(big.name, "big");
  EXPECT_EQ(big.dir, "/srv/models/big");
  EXPECT_EQ(big.revision, "v1.2");
  EXPECT_EQ(big.dtype, "bf16");
  EXPECT_EQ(big.kv_cache, "f32");
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

}  // namespace
}  // namespace tandem::daemon
