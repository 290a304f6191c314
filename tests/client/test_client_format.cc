// The client library without a bus: the a{sv} conversions in both directions (names and D-Bus types exactly as
// dbus/io.tandem.Tandem1.xml says), remote error parsing, and the text/JSON output. Parsing what users type:
// test_client_parse.cc.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/format.h"

namespace tandem::client {
namespace {

using sdbus::Variant;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// ---------------------------------------------------------------------------------------------------------------
// BusSpec

TEST(BusSpec, ParsesTheThreeForms) {
  auto s = parse_bus_spec("system");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->kind, BusKind::system);
  auto e = parse_bus_spec("session");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->kind, BusKind::session);
  auto a = parse_bus_spec("address=unix:path=/run/tandem/bus");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kind, BusKind::address);
  EXPECT_EQ(a->address, "unix:path=/run/tandem/bus");
  // "=" inside the address is kept.
  auto g = parse_bus_spec("address=unix:path=/tmp/x,guid=abc");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->address, "unix:path=/tmp/x,guid=abc");
}

TEST(BusSpec, RejectsOtherText) {
  for (const char* bad : {"", "System", "sessionx", "address=", "address=nocolon", "addr=unix:path=/x", "tcp"}) {
    auto r = parse_bus_spec(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.error().code, Errc::invalid_argument) << bad;
    }
  }
}

TEST(BusSpec, DescribeAndFlag) {
  EXPECT_EQ(BusSpec{}.describe(), "the system bus");
  EXPECT_EQ(BusSpec{}.flag(), "--system");
  EXPECT_EQ((BusSpec{BusKind::session, ""}).flag(), "--session");
  BusSpec a{BusKind::address, "unix:path=/x"};
  EXPECT_EQ(a.describe(), "the bus at unix:path=/x");
  EXPECT_EQ(a.flag(), "--address 'unix:path=/x'");
}

TEST(BusSpec, FromEnvironment) {
  ::unsetenv("TANDEM_BUS");
  auto d = bus_spec_from_env();
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->kind, BusKind::system);
  ::setenv("TANDEM_BUS", "session", 1);
  auto s = bus_spec_from_env();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->kind, BusKind::session);
  ::setenv("TANDEM_BUS", "nonsense", 1);
  auto bad = bus_spec_from_env();
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.error().message, "TANDEM_BUS")) << bad.error().message;
  ::unsetenv("TANDEM_BUS");
}

TEST(BusSpec, ConnectErrorIsActionable) {
  std::string m = connect_error_message(BusSpec{}, "System.Error.ENOMEDIUM", "Failed to open bus (No medium found)");
  EXPECT_EQ(m,
            "cannot connect to the system bus (Failed to open bus: No medium found): is dbus running? use "
            "--session or --address");
  std::string s = connect_error_message(BusSpec{BusKind::session, ""}, "org.freedesktop.DBus.Error.FileNotFound",
                                        "Failed to open bus (No such file or directory)");
  EXPECT_TRUE(contains(s, "the session bus")) << s;
  EXPECT_TRUE(contains(s, "No such file or directory")) << s;
  EXPECT_TRUE(contains(s, "--system or --address")) << s;
  // An unusual error keeps its name.
  std::string x = connect_error_message(BusSpec{}, "org.freedesktop.DBus.Error.AccessDenied", "nope");
  EXPECT_TRUE(contains(x, "org.freedesktop.DBus.Error.AccessDenied: nope")) << x;
}

// ---------------------------------------------------------------------------------------------------------------
// Submit options -> a{sv}

TEST(SubmitOptions, EmptySendsNothing) { EXPECT_TRUE(to_dbus(SubmitOptions{}).empty()); }

TEST(SubmitOptions, NamesAndTypesAsTheXmlSays) {
  SubmitOptions o;
  o.max_tokens = 64;
  o.temperature = 0.7;
  o.top_k = 40;
  o.top_p = 0.9;
  o.repetition_penalty = 1.1;
  o.seed = 1234567890123ull;
  o.stop = std::vector<std::string>{"END", "\n\n"};
  o.idempotency_key = "k-1";
  o.side_effects = true;
  o.allow_cpu = false;
  o.allow_reduce = true;
  o.allow_fallback_model = true;
  o.deadline_ms = 30000;
  o.prefill_chunk = 256;
  o.resume_tokens = std::vector<std::int32_t>{1, 2, 3};
  o.stream = false;
  VariantMap m = to_dbus(o);

  const std::map<std::string, std::string> want = {
      {"max_tokens", "u"},         {"temperature", "d"},   {"top_k", "u"},          {"top_p", "d"},
      {"repetition_penalty", "d"}, {"seed", "t"},          {"stop", "as"},          {"idempotency_key", "s"},
      {"side_effects", "b"},       {"allow_cpu", "b"},     {"allow_reduce", "b"},   {"allow_fallback_model", "b"},
      {"deadline_ms", "t"},        {"prefill_chunk", "u"}, {"resume_tokens", "ai"}, {"stream", "b"},
  };
  ASSERT_EQ(m.size(), want.size());
  for (const auto& [k, sig] : want) {
    ASSERT_TRUE(m.count(k)) << k;
    EXPECT_EQ(m.at(k).peekValueType(), sig) << k;
  }
  EXPECT_EQ(m.at("max_tokens").get<std::uint32_t>(), 64u);
  EXPECT_DOUBLE_EQ(m.at("temperature").get<double>(), 0.7);
  EXPECT_EQ(m.at("seed").get<std::uint64_t>(), 1234567890123ull);
  EXPECT_EQ(m.at("stop").get<std::vector<std::string>>(), (std::vector<std::string>{"END", "\n\n"}));
  EXPECT_EQ(m.at("idempotency_key").get<std::string>(), "k-1");
  EXPECT_FALSE(m.at("allow_cpu").get<bool>());
  EXPECT_EQ(m.at("deadline_ms").get<std::uint64_t>(), 30000u);
  EXPECT_EQ(m.at("resume_tokens").get<std::vector<std::int32_t>>(), (std::vector<std::int32_t>{1, 2, 3}));
}

TEST(SubmitOptions, OnlyTheGivenFields) {
  SubmitOptions o;
  o.allow_cpu = false;
  VariantMap m = to_dbus(o);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m.count("allow_cpu"), 1u);
}

// ---------------------------------------------------------------------------------------------------------------
// Remote errors

TEST(RemoteError, RetryAfterAndJob) {
  auto e = parse_remote_error("io.tandem.Tandem1.Error.Busy", "all GPU slots are busy; retry_after_ms=1500");
  EXPECT_EQ(e.message, "all GPU slots are busy");
  ASSERT_TRUE(e.retry_after_ms.has_value());
  EXPECT_EQ(*e.retry_after_ms, 1500u);
  EXPECT_FALSE(e.job.has_value());
  EXPECT_EQ(e.short_name(), "Busy");
  EXPECT_TRUE(e.is_tandem());
  EXPECT_EQ(errc_for_error_name(e.name), Errc::rejected);

  auto r = parse_remote_error("io.tandem.Tandem1.Error.Resumable",
                              "the GPU was reset mid-generation; retry_after_ms=2000; job=7; tokens=12");
  EXPECT_EQ(r.message, "the GPU was reset mid-generation");
  EXPECT_EQ(r.retry_after_ms.value_or(0), 2000u);
  EXPECT_EQ(r.job.value_or(0), 7u);
  EXPECT_EQ(r.tokens.value_or(0), 12u);
  EXPECT_EQ(r.facts.size(), 3u);
}

TEST(RemoteError, MessagesWithoutFactsStayWhole) {
  auto e = parse_remote_error("io.tandem.Tandem1.Error.InvalidArgument", "option top_k=5000 is outside [0, 1000]");
  EXPECT_EQ(e.message, "option top_k=5000 is outside [0, 1000]");
  EXPECT_TRUE(e.facts.empty());
  auto s = parse_remote_error("io.tandem.Tandem1.Error.InvalidArgument", "first; second part");
  EXPECT_EQ(s.message, "first; second part");
  // Facts only.
  auto f = parse_remote_error("io.tandem.Tandem1.Error.QueueFull", "retry_after_ms=5");
  EXPECT_EQ(f.message, "");
  EXPECT_EQ(f.retry_after_ms.value_or(0), 5u);
  // A fact that is not a number is kept as text but not as a number.
  auto n = parse_remote_error("io.tandem.Tandem1.Error.Resumable", "lost; job=abc");
  EXPECT_FALSE(n.job.has_value());
  EXPECT_EQ(n.facts.at("job"), "abc");
  EXPECT_EQ(n.message, "lost");
}

TEST(RemoteError, ErrcMapping) {
  const std::vector<std::pair<std::string, Errc>> cases = {
      {"io.tandem.Tandem1.Error.InvalidArgument", Errc::invalid_argument},
      {"io.tandem.Tandem1.Error.NotAuthorized", Errc::rejected},
      {"io.tandem.Tandem1.Error.UnknownJob", Errc::not_found},
      {"io.tandem.Tandem1.Error.UnknownModel", Errc::not_found},
      {"io.tandem.Tandem1.Error.QueueFull", Errc::queue_full},
      {"io.tandem.Tandem1.Error.HostMemory", Errc::host_memory},
      {"io.tandem.Tandem1.Error.Incompatible", Errc::incompatible},
      {"io.tandem.Tandem1.Error.Duplicate", Errc::duplicate},
      {"io.tandem.Tandem1.Error.IllegalState", Errc::illegal_transition},
      {"io.tandem.Tandem1.Error.NotSupported", Errc::unsupported},
      {"io.tandem.Tandem1.Error.Timeout", Errc::timeout},
      {"io.tandem.Tandem1.Error.Internal", Errc::internal},
      {"io.tandem.Tandem1.Error.SomethingNew", Errc::internal},
      {"org.freedesktop.DBus.Error.ServiceUnknown", Errc::io_error},
      {"org.freedesktop.DBus.Error.NoReply", Errc::timeout},
      {"org.freedesktop.DBus.Error.AccessDenied", Errc::rejected},
      {"org.freedesktop.DBus.Error.UnknownInterface", Errc::unsupported},
      {"System.Error.ECONNRESET", Errc::io_error},
  };
  for (const auto& [name, code] : cases) EXPECT_EQ(errc_for_error_name(name), code) << name;
}

TEST(RemoteError, DaemonMissingAndDescribe) {
  EXPECT_TRUE(parse_remote_error("org.freedesktop.DBus.Error.ServiceUnknown", "x").daemon_missing());
  EXPECT_TRUE(parse_remote_error("org.freedesktop.DBus.Error.NameHasNoOwner", "x").daemon_missing());
  EXPECT_FALSE(parse_remote_error("io.tandem.Tandem1.Error.Busy", "x").daemon_missing());
  auto e = parse_remote_error("io.tandem.Tandem1.Error.QueueFull", "the gpu queue is full; retry_after_ms=2000");
  EXPECT_EQ(e.describe(), "QueueFull: the gpu queue is full (retry after 2.0 s)");
  Error err = to_error(e);
  EXPECT_EQ(err.code, Errc::queue_full);
  EXPECT_EQ(err.message, e.describe());
}

// ---------------------------------------------------------------------------------------------------------------
// a{sv} -> plain

TEST(Convert, PlacementLenientIntegersAndUnknownKeys) {
  VariantMap m = {
      {"state", Variant(std::string("queued"))},
      {"action", Variant(std::string("route_cpu"))},
      {"route", Variant(std::string("cpu"))},
      {"queue_position", Variant(std::uint64_t{3})},  // "t" where the XML says "u": accepted, in range
      {"eta_ms", Variant(std::int32_t{-5})},          // negative for a "t": not accepted
      {"degraded", Variant(true)},
      {"fallback_model", Variant(std::string("yes"))},  // wrong kind
      {"brand_new", Variant(std::uint32_t{1})},
  };
  Placement p = placement_from_dbus(m);
  EXPECT_EQ(p.state.value_or(""), "queued");
  EXPECT_EQ(p.action.value_or(""), "route_cpu");
  EXPECT_EQ(p.queue_position.value_or(0), 3u);
  EXPECT_FALSE(p.eta_ms.has_value());
  EXPECT_TRUE(p.degraded.value_or(false));
  EXPECT_FALSE(p.fallback_model.has_value());
  EXPECT_FALSE(p.model.has_value()) << "absent keys stay empty";
  ASSERT_EQ(p.unparsed.size(), 3u);
  EXPECT_TRUE(contains(p.unparsed.at("eta_ms"), "expected t"));
  EXPECT_TRUE(contains(p.unparsed.at("fallback_model"), "expected b"));
  EXPECT_TRUE(contains(p.unparsed.at("brand_new"), "unknown key"));
}

TEST(Convert, JobWithHistoryAndCheckpoint) {
  using H = sdbus::Struct<std::string, std::string, std::string, std::int64_t>;
  VariantMap m = {
      {"id", Variant(std::uint64_t{7})},
      {"state", Variant(std::string("failed"))},
      {"tokens", Variant(std::vector<std::int32_t>{5, 6, 7})},
      {"text", Variant(std::string("abc"))},
      {"history", Variant(std::vector<H>{H{"", "queued", "submitted", 1000}, H{"queued", "running", "admit", 1100}})},
      {"routes", Variant(std::vector<std::string>{"gpu", "cpu"})},
      // A failed job's checkpoint comes as flat keys (dbus/io.tandem.Tandem1.xml, GetJob).
      {"checkpoint_seed", Variant(std::uint64_t{42})},
      {"checkpoint_tokens", Variant(std::uint32_t{30})},
      {"checkpoint_model", Variant(std::string("tiny"))},
      {"accepted_unix_ms", Variant(std::int64_t{1000})},
      {"error_code", Variant(std::string("device_lost"))},
  };
  JobInfo j = job_from_dbus(m);
  EXPECT_EQ(j.id.value_or(0), 7u);
  EXPECT_EQ(j.tokens->size(), 3u);
  ASSERT_TRUE(j.history.has_value());
  ASSERT_EQ(j.history->size(), 2u);
  EXPECT_EQ((*j.history)[1].to, "running");
  EXPECT_EQ((*j.history)[1].at_unix_ms, 1100);
  ASSERT_TRUE(j.checkpoint.has_value());
  EXPECT_EQ(j.checkpoint->seed.value_or(0), 42u);
  EXPECT_EQ(j.checkpoint->tokens_delivered.value_or(0), 30u);
  EXPECT_TRUE(j.unparsed.empty());
  nlohmann::json js = to_json(j);
  EXPECT_TRUE(js["resumable"].get<bool>());
  EXPECT_EQ(js["checkpoint"]["seed"], 42);
  EXPECT_EQ(js["history"][0]["to"], "queued");
}

TEST(Convert, StatusFromGetAll) {
  using Q = sdbus::Struct<std::string, std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t, std::uint64_t>;
  using Hold = sdbus::Struct<std::string, std::string, std::string, std::int64_t>;
  VariantMap mem = {{"total", Variant(std::uint64_t{8} << 30)},
                    {"headroom", Variant(std::int64_t{-(1 << 20)})},
                    {"trust", Variant(std::string("stale"))}};
  VariantMap props = {
      {"State", Variant(std::string("degraded"))},
      {"DegradedReason", Variant(std::string("gpu-breaker-open"))},
      {"GpuBreaker", Variant(std::string("open"))},
      {"Memory", Variant(mem)},
      {"Queues", Variant(std::vector<Q>{Q{"gpu", 2, 64, 1, 1, 3200}})},
      {"Limits", Variant(std::map<std::string, std::uint32_t>{{"cpu_max_new_tokens", 256}})},
      {"Holds", Variant(std::vector<Hold>{Hold{"c1", "game", "playing", 5}})},
      {"FallbackModel", Variant(std::string("small"))},
      {"Version", Variant(std::string("0.1.0"))},
      {"Extra", Variant(true)},
  };
  ServiceStatus s = status_from_dbus(props);
  EXPECT_TRUE(s.degraded());
  EXPECT_EQ(s.memory->total.value_or(0), 8ull << 30);
  EXPECT_EQ(s.memory->headroom.value_or(0), -(1 << 20));
  ASSERT_EQ(s.queues->size(), 1u);
  EXPECT_EQ((*s.queues)[0].capacity, 64u);
  EXPECT_EQ((*s.queues)[0].oldest_age_ms, 3200u);
  EXPECT_EQ(s.limits->at("cpu_max_new_tokens"), 256u);
  EXPECT_EQ((*s.holds)[0].app_id, "game");
  EXPECT_FALSE(s.policy.has_value());
  EXPECT_EQ(s.unparsed.count("Extra"), 1u);
}

TEST(Convert, SignalsToPlain) {
  JobUpdate u = job_update_from_dbus(9, "tokens",
                                     {{"text", Variant(std::string(" world"))},
                                      {"tokens", Variant(std::vector<std::int32_t>{11, 12})},
                                      {"step", Variant(std::uint32_t{4})}});
  EXPECT_EQ(u.job_id, 9u);
  EXPECT_EQ(u.kind, "tokens");
  EXPECT_EQ(u.text.value_or(""), " world");
  EXPECT_EQ(u.tokens->size(), 2u);
  nlohmann::json j = to_json(u);
  EXPECT_EQ(j["job"], 9);
  EXPECT_EQ(j["kind"], "tokens");
  EXPECT_EQ(j["text"], " world");
  EXPECT_FALSE(j.contains("route"));

  DegradedChange d =
      degraded_from_dbus(true, "gpu-absent",
                         {{"expected_slowdown", Variant(6.5)},
                          {"limits", Variant(std::map<std::string, std::uint32_t>{{"cpu_max_context", 1024}})},
                          {"since_unix_ms", Variant(std::int64_t{77})}});
  EXPECT_DOUBLE_EQ(d.expected_slowdown.value_or(0), 6.5);
  EXPECT_EQ(d.limits->at("cpu_max_context"), 1024u);
  EXPECT_EQ(d.since_unix_ms.value_or(0), 77);
  EXPECT_TRUE(contains(format_degraded_change(d), "expect ~6.5x slower"));
}

TEST(Convert, ModelObjectAndPath) {
  EXPECT_EQ(model_object_path("tiny"), "/io/tandem/Tandem1/models/tiny");
  EXPECT_EQ(model_object_path("llama-2.7b"), "/io/tandem/Tandem1/models/llama_2d2_2e7b");
  EXPECT_EQ(model_object_path("a_b"), "/io/tandem/Tandem1/models/a_5fb");
  EXPECT_EQ(model_object_path(""), "/io/tandem/Tandem1/models/_");

  VariantMap replica = {{"device", Variant(std::string("cpu"))},
                        {"state", Variant(std::string("loaded"))},
                        {"mode", Variant(std::string("mmap"))},
                        {"accel_bytes", Variant(std::uint64_t{0})},
                        {"host_bytes", Variant(std::uint64_t{3} << 20)}};  // the keys tandemd's Replicas carry
  VariantMap props = {{"Name", Variant(std::string("tiny"))},
                      {"Replicas", Variant(std::vector<VariantMap>{replica})},
                      {"Placement", Variant(std::map<std::string, std::uint64_t>{{"host", 1}, {"gpu", 2}})},
                      {"MaxContext", Variant(std::uint32_t{2048})},
                      {"Template", Variant(std::string("chatml"))}};
  ModelDetails d = model_details_from_dbus(props);
  EXPECT_EQ(d.name.value_or(""), "tiny");
  ASSERT_EQ(d.replicas->size(), 1u);
  EXPECT_EQ((*d.replicas)[0].mode.value_or(""), "mmap");
  EXPECT_EQ(d.placement->at("gpu"), 2u);
  EXPECT_TRUE(d.unparsed.empty());
  nlohmann::json j = to_json(d);
  EXPECT_EQ(j["template"], "chatml");
  EXPECT_TRUE((*d.replicas)[0].unparsed.empty());
  EXPECT_EQ(j["replicas"][0]["host_bytes"], 3u << 20);
  EXPECT_TRUE(contains(format_model_details(d), "cpu: loaded, mode mmap, 3.0 MiB on the host"));
}

// ---------------------------------------------------------------------------------------------------------------
// Text

ServiceStatus sample_status() {
  ServiceStatus s;
  s.state = "normal";
  s.degraded_reason = "";
  s.gpu_breaker = "closed";
  MemoryInfo m;
  m.device = "cuda:0";
  m.present = true;
  m.total = 80ull << 30;
  m.free = 60ull << 30;
  m.observed_used = 12ull << 30;
  m.predicted_used = 11ull << 30;
  m.margin = 4ull << 30;
  m.foreign = 1ull << 30;
  m.unmaterialized = 0;
  m.headroom = 62ll << 30;
  m.prediction_error = 300ll << 20;
  m.reading_age_ms = 120;
  m.trust = "fresh";
  m.pressure = "normal";
  s.memory = m;
  HostMemoryInfo h;
  h.budget = 16ull << 30;
  h.used = 4ull << 30;
  s.host_memory = h;
  s.queues = std::vector<QueueInfo>{{"gpu", 2, 64, 1, 1, 3200}, {"cpu", 16, 16, 2, 2, 100}};
  s.limits = std::map<std::string, std::uint32_t>{
      {"gpu_max_context", 4096}, {"gpu_max_new_tokens", 1024}, {"cpu_max_context", 2048}, {"cpu_max_new_tokens", 256}};
  s.holds = std::vector<HoldInfo>{};
  s.fallback_model = "";
  s.version = "0.1.0";
  return s;
}

TEST(FormatStatus, NormalAtAGlance) {
  std::string t = format_status(sample_status(), 0);
  EXPECT_FALSE(contains(t, "DEGRADED")) << t;
  EXPECT_TRUE(contains(t, "State         normal")) << t;
  EXPECT_TRUE(contains(t, "GPU breaker   closed")) << t;
  EXPECT_TRUE(contains(t, "total 80.00 GiB")) << t;
  EXPECT_TRUE(contains(t, "used by us 12.00 GiB, predicted 11.00 GiB (error +300.0 MiB)")) << t;
  EXPECT_TRUE(contains(t, "foreign 1.00 GiB, margin 4.00 GiB")) << t;
  EXPECT_TRUE(contains(t, "headroom 62.00 GiB")) << t;
  EXPECT_TRUE(contains(t, "reading 120 ms old (fresh)")) << t;
  EXPECT_TRUE(contains(t, "budget 16.00 GiB, used 4.00 GiB (25%)")) << t;
  EXPECT_TRUE(contains(t, "gpu  2/64 queued, 1/1 running, oldest 3.2 s")) << t;
  EXPECT_TRUE(contains(t, "cpu  16/16 queued, 2/2 running, oldest 100 ms (FULL)")) << t;
  EXPECT_TRUE(contains(t, "gpu: context 4096, new tokens 1024; cpu: context 2048, new tokens 256")) << t;
  EXPECT_TRUE(contains(t, "GPU holds     none")) << t;
  EXPECT_TRUE(contains(t, "Fallback      none")) << t;
}

TEST(FormatStatus, DegradedIsLoudAndFirst) {
  ServiceStatus s = sample_status();
  s.state = "degraded";
  s.degraded_reason = "gpu-breaker-open";
  s.gpu_breaker = "open";
  s.fallback_model = "tiny-1b";
  s.memory->trust = "stale";
  s.holds = std::vector<HoldInfo>{{"c1", "steam", "game running", 1000}};
  std::string t = format_status(s, 61000);
  EXPECT_EQ(t.rfind("!!! DEGRADED: the GPU circuit breaker is open after GPU failures", 0), 0u) << t;
  EXPECT_TRUE(contains(t, "fallback model tiny-1b")) << t;
  EXPECT_TRUE(contains(t, "State         degraded (gpu-breaker-open)")) << t;
  EXPECT_TRUE(contains(t, "(stale — NOT TRUSTED AS IS)")) << t;
  EXPECT_TRUE(contains(t, "steam: game running (cookie c1, since 1 min 0 s ago)")) << t;
  EXPECT_TRUE(contains(t, "Fallback      tiny-1b (in use)")) << t;

  s.state = "unavailable";
  s.degraded_reason = "gpu-absent";
  EXPECT_EQ(format_status(s, 0).rfind("!!! UNAVAILABLE: no GPU is available", 0), 0u);
  s.state = "degraded";
  s.degraded_reason = "a-reason-from-the-future";
  EXPECT_TRUE(contains(format_status(s, 0), "!!! DEGRADED: a-reason-from-the-future"))
      << "unknown reasons pass through";
}

TEST(FormatStatus, MissingPartsDoNotInventNumbers) {
  ServiceStatus s;
  s.state = "normal";
  s.memory = MemoryInfo{};
  std::string t = format_status(s, 0);
  EXPECT_TRUE(contains(t, "total ?")) << t;
  EXPECT_FALSE(contains(t, "Queues")) << t;
}

TEST(StatusJson, Shape) {
  nlohmann::json j = to_json(sample_status());
  EXPECT_EQ(j["state"], "normal");
  EXPECT_EQ(j["degraded"], false);
  EXPECT_EQ(j["gpu_breaker"], "closed");
  EXPECT_EQ(j["memory"]["total"], 80ull << 30);
  EXPECT_EQ(j["memory"]["headroom"], 62ll << 30);
  EXPECT_EQ(j["memory"]["trust"], "fresh");
  EXPECT_EQ(j["host_memory"]["budget"], 16ull << 30);
  EXPECT_FALSE(j["host_memory"].contains("cgroup_max")) << "absent keys are omitted";
  ASSERT_TRUE(j["queues"].is_array());
  EXPECT_EQ(j["queues"][0]["name"], "gpu");
  EXPECT_EQ(j["queues"][0]["oldest_age_ms"], 3200);
  EXPECT_EQ(j["limits"]["cpu_max_new_tokens"], 256);
  EXPECT_TRUE(j["holds"].is_array());
  EXPECT_FALSE(j.contains("policy"));
  EXPECT_FALSE(j.contains("_unparsed"));

  ServiceStatus d = sample_status();
  d.state = "degraded";
  d.unparsed["Extra"] = "unknown key (b)";
  nlohmann::json dj = to_json(d);
  EXPECT_EQ(dj["degraded"], true);
  EXPECT_EQ(dj["_unparsed"]["Extra"], "unknown key (b)");
}

TEST(PropertiesChange, TextAndJson) {
  PropertiesChange c;
  c.values.memory = MemoryInfo{};
  c.values.memory->headroom = 1ll << 30;
  c.values.state = "pressure";
  c.changed = {"Memory", "State"};
  c.invalidated = {"Queues"};
  std::string t = format_properties_change(c);
  EXPECT_EQ(t.rfind("properties: State=pressure Memory{headroom 1.00 GiB", 0), 0u) << t;
  EXPECT_TRUE(contains(t, "Queues (invalidated)")) << t;
  nlohmann::json j = to_json(c);
  EXPECT_EQ(j["changed"]["state"], "pressure");
  EXPECT_EQ(j["changed"]["memory"]["headroom"], 1ll << 30);
  EXPECT_FALSE(j["changed"].contains("degraded")) << "only what changed";
  EXPECT_EQ(j["invalidated"][0], "Queues");
  EXPECT_EQ(property_json_key("DegradedReason"), "degraded_reason");
  EXPECT_EQ(property_json_key("GpuBreaker"), "gpu_breaker");
  EXPECT_EQ(property_json_key("State"), "state");
}

TEST(Banner, DegradedPlacement) {
  Placement p;
  p.route = "cpu";
  p.degraded = true;
  p.reason = "gpu-breaker-open";
  EXPECT_EQ(degraded_banner(p, 6.5, ""),
            "DEGRADED: running on the CPU because the GPU circuit breaker is open after GPU failures — expect ~6.5x "
            "slower; Ctrl-C cancels");
  EXPECT_EQ(degraded_banner(p, std::nullopt, "gpu-held"),
            "DEGRADED: running on the CPU because an application holds the GPU — expect it to be slower; Ctrl-C "
            "cancels");
  Placement f = p;
  f.degraded = false;
  f.fallback_model = true;
  f.model = "tiny-1b";
  EXPECT_TRUE(contains(degraded_banner(f, 4.0, ""), "with fallback model tiny-1b")) << degraded_banner(f, 4.0, "");
  EXPECT_TRUE(contains(degraded_banner(f, 4.0, ""), "expect ~4x slower"));
  Placement ok;
  ok.route = "gpu";
  ok.degraded = false;
  EXPECT_EQ(degraded_banner(ok, 6.0, ""), "");
  EXPECT_FALSE(contains(format_placement(1, ok, std::nullopt), "DEGRADED"));
  EXPECT_TRUE(contains(format_placement(1, p, 3.0), "DEGRADED: running on the CPU"));
}

TEST(FormatPlacement, QueueEtaAndExisting) {
  Placement p;
  p.action = "delay";
  p.route = "gpu";
  p.model = "tiny";
  p.queue = "gpu";
  p.queue_position = 3;
  p.eta_ms = 1500;
  p.existing = true;
  std::string t = format_placement(12, p, std::nullopt);
  EXPECT_TRUE(contains(t, "job 12 already exists for this idempotency key")) << t;
  EXPECT_TRUE(contains(t, "job 12: delay → route gpu, model tiny, queue gpu #3, ETA 1.5 s")) << t;
  nlohmann::json j = to_json(p);
  EXPECT_EQ(j["queue_position"], 3);
  EXPECT_EQ(j["existing"], true);
  EXPECT_FALSE(j.contains("degraded"));
}

TEST(FormatPlan, DecisionBreakdownInMiBAndSkippedRungs) {
  PlanDecision d;
  d.action = "offload";
  d.reason = "fits_hybrid";
  d.route = "hybrid";
  d.gpu_layers = 10;
  d.breakdown = std::map<std::string, std::uint64_t>{{"weights", 100ull << 20},
                                                     {"kv_cache", 20ull << 20},
                                                     {"activations", 5ull << 20},
                                                     {"fragmentation", 12ull << 20},
                                                     {"total", 137ull << 20}};
  d.headroom = std::map<std::string, std::int64_t>{{"total", 8ll << 30}, {"headroom", -(5ll << 20)}};
  d.skipped = std::vector<SkippedRung>{{"admit", "does_not_fit"}, {"delay", "wait_too_long"}};
  std::string t = format_plan(d);
  EXPECT_TRUE(contains(t, "Decision      offload (fits_hybrid)")) << t;
  EXPECT_TRUE(contains(t, "Route         hybrid, 10 GPU layers")) << t;
  EXPECT_TRUE(contains(t,
                       "weights 100.0 MiB, kv_cache 20.0 MiB, activations 5.0 MiB, fragmentation 12.0 MiB, "
                       "total 137.0 MiB"))
      << t;
  EXPECT_TRUE(contains(t, "total 8.00 GiB, headroom -5.0 MiB")) << t;
  EXPECT_TRUE(contains(t, "Skipped       admit: does_not_fit\n              delay: wait_too_long")) << t;
  nlohmann::json j = to_json(d);
  EXPECT_EQ(j["skipped"][1]["rung"], "delay");
  EXPECT_EQ(j["breakdown"]["total"], 137ull << 20);
  EXPECT_EQ(j["headroom"]["headroom"], -(5ll << 20));
}

TEST(FormatJob, StateHistoryErrorCheckpointText) {
  JobInfo j;
  j.id = 7;
  j.state = "failed";
  j.route = "cpu";
  j.routes = std::vector<std::string>{"gpu", "cpu"};
  j.accepted_unix_ms = 1000;
  j.history = std::vector<HistoryEntry>{{"", "queued", "submitted", 1000}, {"queued", "running", "admit", 1250}};
  j.error_code = "device_lost";
  j.error_message = "the GPU was reset";
  Checkpoint c;
  c.seed = 42;
  c.tokens_delivered = 30;
  c.model = "tiny";
  j.checkpoint = c;
  j.tokens = std::vector<std::int32_t>(30, 1);
  j.text = "partial text";
  std::string t = format_job(j, 5000);
  EXPECT_TRUE(contains(t, "Job           7: failed")) << t;
  EXPECT_TRUE(contains(t, "cpu (routes gpu → cpu)")) << t;
  EXPECT_TRUE(contains(t, "+250 ms  queued → running (admit)")) << t;
  EXPECT_TRUE(contains(t, "Error         device_lost: the GPU was reset")) << t;
  EXPECT_TRUE(contains(t, "seed 42, 30 tokens delivered, model tiny (resumable: tandemctl resume 7)")) << t;
  EXPECT_TRUE(contains(t, "Text:\npartial text\n")) << t;

  std::string hint = format_resume_hint(7, j, "tandemctl --session");
  EXPECT_TRUE(contains(hint, "resume with: tandemctl --session resume 7")) << hint;
  EXPECT_TRUE(contains(hint, "seed 42")) << hint;
}

TEST(FormatRun, Summary) {
  RunSummary s;
  s.job_id = 12;
  s.state = "completed";
  s.finish_reason = "stop";
  s.tokens = 50;
  s.elapsed_ms = 3000;
  s.generate_ms = 2500;
  s.routes = {"gpu", "cpu"};
  EXPECT_EQ(format_run_summary(s), "job 12 completed (stop): 50 tokens in 3.0 s, 20.0 tok/s, route gpu → cpu");
  s.state = "failed";
  s.finish_reason = "";
  s.error_code = "out_of_memory";
  s.error_message = "no room";
  EXPECT_TRUE(contains(format_run_summary(s), "error out_of_memory: no room"));
  nlohmann::json j = to_json(s);
  EXPECT_EQ(j["state"], "failed");
  EXPECT_EQ(j["routes"][1], "cpu");
}

TEST(FormatUpdates, ProgressLines) {
  JobUpdate r;
  r.job_id = 3;
  r.kind = "routed";
  r.route = "cpu";
  r.reason = "gpu-held";
  r.queue = "cpu";
  r.queue_position = 2;
  r.eta_ms = 4000;
  r.degraded = true;
  EXPECT_EQ(format_job_update(r), "job 3: routed to cpu (gpu-held), queue cpu #2, ETA 4.0 s, DEGRADED");
  JobUpdate m;
  m.job_id = 3;
  m.kind = "migrated";
  m.from = "gpu";
  m.to = "cpu";
  m.reason = "device_lost";
  m.tokens_delivered = 17;
  EXPECT_EQ(format_job_update(m), "job 3: migrated gpu → cpu (device_lost) after 17 tokens");
}

TEST(FormatOther, ModelsCountersPolicy) {
  ModelInfo m;
  m.name = "tiny";
  m.is_default = true;
  m.placement = "gpu+cpu(warm)";
  m.fingerprint = "0123456789abcdef";
  m.max_context = 2048;
  std::string t = format_models({m});
  EXPECT_TRUE(contains(t, "NAME")) << t;
  EXPECT_TRUE(contains(t, "0123456789ab\n")) << "fingerprint shortened: " << t;
  EXPECT_EQ(to_json(m)["default"], true);
  EXPECT_EQ(format_counters({{"allocations", 5}, {"losses", 0}}), "allocations  5\nlosses       0\n");
  PolicySettings p;
  p.margin_bytes = 512ull << 20;
  p.offload_enabled = false;
  std::string pt = format_policy(p);
  EXPECT_TRUE(contains(pt, "536870912 (512.0 MiB)")) << pt;
  EXPECT_TRUE(contains(pt, "offload_enabled      false")) << pt;
  EXPECT_EQ(to_json(p)["margin_bytes"], 512ull << 20);
  EXPECT_FALSE(to_json(p).contains("gpu_concurrency"));
}

TEST(Embed, OptionsNamesAndTypesAsTheXmlSays) {
  EXPECT_TRUE(to_dbus(EmbedOptions{}).empty());
  EmbedOptions o;
  o.idempotency_key = "k";
  o.allow_cpu = false;
  o.deadline_ms = 5000;
  o.truncate = false;
  VariantMap m = to_dbus(o);
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m.at("idempotency_key").peekValueType(), "s");
  EXPECT_EQ(m.at("allow_cpu").peekValueType(), "b");
  EXPECT_EQ(m.at("deadline_ms").peekValueType(), "t");
  EXPECT_EQ(m.at("deadline_ms").get<std::uint64_t>(), 5000u);
  EXPECT_EQ(m.at("truncate").peekValueType(), "b");
  EXPECT_EQ(EmbedRequest{}.call_timeout, std::chrono::minutes(10));
}

TEST(Embed, ResultAndEmbeddingModels) {
  VariantMap r = {{"job_id", Variant(std::uint64_t{12})},  {"model", Variant(std::string("clip"))},
                  {"route", Variant(std::string("cpu"))},   {"dim", Variant(std::uint32_t{512})},
                  {"inputs", Variant(std::uint32_t{3})},    {"images", Variant(std::uint32_t{3})},
                  {"fingerprint", Variant(std::string("f"))}, {"queued_ms", Variant(std::uint64_t{7})},
                  {"existing", Variant(false)},             {"new_key", Variant(std::string("x"))}};
  EmbedInfo e = embed_info_from_dbus(r);
  EXPECT_EQ(e.job_id, 12u);
  EXPECT_EQ(e.dim, 512u);
  EXPECT_EQ(e.route, "cpu");
  EXPECT_EQ(e.fingerprint, "f");
  EXPECT_EQ(e.unparsed.count("new_key"), 1u);
  EXPECT_EQ(to_json(e)["queued_ms"], 7);

  VariantMap clip = {{"name", Variant(std::string("clip"))},
                     {"kind", Variant(std::string("embedding"))},
                     {"dim", Variant(std::uint32_t{512})},
                     {"image_size", Variant(std::uint32_t{224})},
                     {"modalities", Variant(std::vector<std::string>{"text", "image"})}};
  ModelInfo m = model_from_dbus(clip);
  EXPECT_TRUE(m.unparsed.empty());
  EXPECT_EQ(m.kind, "embedding");
  EXPECT_EQ(m.dim, 512u);
  EXPECT_EQ(m.image_size, 224u);
  EXPECT_EQ(to_json(m)["modalities"].size(), 2u);
  ModelInfo llm;
  llm.name = "tiny";
  EXPECT_FALSE(contains(format_models({llm}), "KIND"));  // an LLM-only table is as before
  std::string t = format_models({llm, m});
  EXPECT_TRUE(contains(t, "KIND")) << t;
  EXPECT_TRUE(contains(t, "embedding  512")) << t;
}

TEST(FormatUnits, BytesAndDurations) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(512ull << 20), "512.0 MiB");
  EXPECT_EQ(format_bytes(3ull << 29), "1.50 GiB");
  EXPECT_EQ(format_signed_bytes(-(300ll << 20)), "-300.0 MiB");
  EXPECT_EQ(format_signed_bytes(0), "+0 B");
  EXPECT_EQ(format_duration_ms(250), "250 ms");
  EXPECT_EQ(format_duration_ms(1500), "1.5 s");
  EXPECT_EQ(format_duration_ms(125000), "2 min 5 s");
  EXPECT_EQ(format_duration_ms(3720000), "1 h 2 min");
  EXPECT_EQ(format_count(6.0), "6");
  EXPECT_EQ(format_count(6.5), "6.5");
  EXPECT_TRUE(is_terminal_state("completed"));
  EXPECT_TRUE(is_terminal_state("cancelled"));
  EXPECT_TRUE(is_terminal_state("failed"));
  EXPECT_FALSE(is_terminal_state("migrating"));
}

}  // namespace
}  // namespace tandem::client
