#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "fixtures.h"

namespace tandem::policy {
namespace {

using testing::llama7b;
using testing::request;
using testing::small_model;
constexpr std::uint64_t G = kGiB;

class AdmissionTest : public ::testing::Test {
 public:
  AdmissionTest() : host_(HostGuardConfig{32 * G, 1 * G, 4}) {}

  AdmissionSnapshot base() const {
    AdmissionSnapshot s;
    s.model = llama7b();
    s.request = request(1000, 1000);
    s.gpu.headroom.total_bytes = 24 * G;
    s.gpu.headroom.headroom = static_cast<std::int64_t>(8 * G);
    s.gpu.headroom.drained_headroom = static_cast<std::int64_t>(8 * G);
    s.gpu.weights_resident = true;
    s.gpu.offload_supported = true;
    s.gpu.max_context = 8192;
    s.gpu.max_new_tokens = 4096;
    s.cpu.replica_present = true;
    s.cpu.fingerprint_compatible = true;
    s.cpu.fallback = small_model();
    s.cpu.max_context = 4096;
    s.cpu.max_new_tokens = 1024;
    s.cpu.host = &host_;
    s.cpu.host_reading.mem_available = 64 * G;
    return s;
  }
  std::int64_t need(const AdmissionSnapshot& s) const {
    return static_cast<std::int64_t>(policy_.estimator().estimate(s.model, s.request, s.gpu.weights_resident).total_bytes);
  }
  void no_fit(AdmissionSnapshot& s) const { s.gpu.headroom.headroom = need(s) - 1; }

  HostMemoryGuard host_;
  AdmissionPolicy policy_{LadderConfig{}, EstimatorConfig{}, HostGuardConfig{32 * G, 1 * G, 4}};
};

struct Row {
  const char* what;
  std::function<void(const AdmissionTest&, AdmissionSnapshot&)> mutate;
  Rung action;
  Reason reason;
  std::vector<Reason> skipped;
};

TEST_F(AdmissionTest, LadderTable) {
  using R = Reason;
  const std::vector<Row> rows = {
      {"fits", [](auto&, auto&) {}, Rung::admit, R::fits, {}},
      {"does not fit, waits for memory",
       [](auto& t, auto& s) { t.no_fit(s); }, Rung::delay, R::waiting_for_memory, {R::does_not_fit}},
      {"queue full, reduce not allowed -> offload",
       [](auto& t, auto& s) { t.no_fit(s); s.gpu.queue_full = true; }, Rung::offload, R::fits_offloaded,
       {R::does_not_fit, R::gpu_queue_full, R::reduce_not_allowed}},
      {"queue full, reduce allowed -> reduce",
       [](auto& t, auto& s) { t.no_fit(s); s.gpu.queue_full = true; s.request.allow_reduce = true; }, Rung::reduce,
       R::fits_reduced, {R::does_not_fit, R::gpu_queue_full}},
      {"wait too long, offload unsupported -> cpu",
       [](auto& t, auto& s) { t.no_fit(s); s.gpu.queue_wait = 60s; s.gpu.offload_supported = false; },
       Rung::route_cpu, R::routed_cpu,
       {R::does_not_fit, R::wait_too_long, R::reduce_not_allowed, R::offload_unsupported}},
      {"breaker open -> cpu",
       [](auto&, auto& s) { s.gpu.breaker_allows = false; s.gpu.breaker_retry_in = 7s; }, Rung::route_cpu,
       R::routed_cpu, {R::breaker_open, R::breaker_open, R::reduce_not_allowed, R::breaker_open}},
      {"breaker open, incompatible replica, fallback not allowed -> reject",
       [](auto&, auto& s) { s.gpu.breaker_allows = false; s.gpu.breaker_retry_in = 7s; s.cpu.fingerprint_compatible = false; },
       Rung::reject, R::breaker_open,
       {R::breaker_open, R::breaker_open, R::reduce_not_allowed, R::breaker_open, R::cpu_incompatible}},
      {"breaker open, incompatible replica, fallback allowed -> fallback model",
       [](auto&, auto& s) {
         s.gpu.breaker_allows = false;
         s.cpu.fingerprint_compatible = false;
         s.request.allow_fallback_model = true;
       },
       Rung::route_cpu, R::routed_fallback,
       {R::breaker_open, R::breaker_open, R::reduce_not_allowed, R::breaker_open}},
      {"no cpu replica, no fallback -> reject",
       [](auto&, auto& s) { s.gpu.breaker_allows = false; s.cpu.replica_present = false; s.cpu.fallback.reset(); },
       Rung::reject, R::breaker_open,
       {R::breaker_open, R::breaker_open, R::reduce_not_allowed, R::breaker_open, R::cpu_unavailable}},
      {"gpu absent -> cpu", [](auto&, auto& s) { s.gpu.present = false; }, Rung::route_cpu, R::routed_cpu,
       {R::gpu_absent, R::gpu_absent, R::reduce_not_allowed, R::gpu_absent}},
      {"critical pressure waits even if it fits",
       [](auto&, auto& s) { s.gpu.pressure = Pressure::critical; }, Rung::delay, R::waiting_for_memory,
       {R::critical_pressure}},
      {"elevated pressure still admits what fits", [](auto&, auto& s) { s.gpu.pressure = Pressure::elevated; },
       Rung::admit, R::fits, {}},
      {"expired reading waits for a fresh one",
       [](auto&, auto& s) { s.gpu.headroom.trust = ReadingTrust::expired; }, Rung::delay,
       R::waiting_for_fresh_reading, {R::reading_expired}},
      {"jobs ahead: FIFO, no overtaking", [](auto&, auto& s) { s.gpu.jobs_ahead = 3; s.gpu.queue_wait = 2s; },
       Rung::delay, R::queued_behind, {R::queued_ahead}},
      {"no free slot", [](auto&, auto& s) { s.gpu.slot_free = false; }, Rung::delay, R::waiting_for_slot,
       {R::no_free_slot}},
      {"never fits on this device, cpu not allowed -> reject",
       [](auto& t, auto& s) {
         t.no_fit(s);
         s.gpu.headroom.drained_headroom = s.gpu.headroom.headroom;
         s.gpu.offload_supported = false;
         s.request.allow_cpu = false;
       },
       Rung::reject, R::does_not_fit,
       {R::does_not_fit, R::exceeds_device, R::reduce_not_allowed, R::offload_unsupported, R::cpu_not_allowed}},
      {"cpu limits exceeded without reduce",
       [](auto&, auto& s) { s.request.max_new_tokens = 2000; s.gpu.breaker_allows = false; }, Rung::reject,
       R::breaker_open,
       {R::breaker_open, R::breaker_open, R::reduce_not_allowed, R::breaker_open, R::exceeds_cpu_limits}},
      {"cpu limits exceeded with reduce -> capped on cpu",
       [](auto&, auto& s) { s.request.max_new_tokens = 2000; s.request.allow_reduce = true; s.gpu.breaker_allows = false; },
       Rung::route_cpu, R::routed_cpu, {R::breaker_open, R::breaker_open, R::breaker_open, R::breaker_open}},
      {"cpu queue full",
       [](auto&, auto& s) { s.gpu.breaker_allows = false; s.cpu.queue_full = true; }, Rung::reject, R::breaker_open,
       {R::breaker_open, R::breaker_open, R::reduce_not_allowed, R::breaker_open, R::cpu_queue_full}},
      {"host memory can never fit",
       [](auto&, auto& s) { s.gpu.breaker_allows = false; s.cpu.host_reading.mem_available = 2 * G; }, Rung::reject,
       R::breaker_open, {R::breaker_open, R::breaker_open, R::reduce_not_allowed, R::breaker_open, R::host_memory}},
      {"no host guard wired", [](auto&, auto& s) { s.gpu.breaker_allows = false; s.cpu.host = nullptr; },
       Rung::reject, R::breaker_open,
       {R::breaker_open, R::breaker_open, R::reduce_not_allowed, R::breaker_open, R::host_guard_missing}},
      {"invalid request", [](auto&, auto& s) { s.request.prompt_tokens = 0; }, Rung::reject, R::invalid_request, {}},
      {"invalid model", [](auto&, auto& s) { s.model.layers = 0; }, Rung::reject, R::invalid_request, {}},
      {"over gpu limits, reduce caps to the limit",
       [](auto&, auto& s) { s.request = request(8000, 1000); s.request.allow_reduce = true; }, Rung::reduce,
       R::fits_reduced, {R::exceeds_gpu_limits, R::exceeds_gpu_limits}},
      {"offload cannot place a single layer",
       [](auto&, auto& s) {
         s.gpu.weights_resident = false;
         s.gpu.headroom.headroom = 64 * static_cast<std::int64_t>(kMiB);
         s.gpu.queue_full = true;
         s.request.allow_cpu = false;
       },
       Rung::reject, R::does_not_fit,
       {R::does_not_fit, R::exceeds_device, R::reduce_not_allowed, R::offload_insufficient, R::cpu_not_allowed}},
  };
  for (const auto& row : rows) {
    AdmissionSnapshot s = base();
    row.mutate(*this, s);
    Decision d = policy_.decide(s);
    EXPECT_EQ(d.action, row.action) << row.what << ": " << d.detail;
    EXPECT_EQ(d.reason, row.reason) << row.what << ": " << d.detail;
    std::vector<Reason> skipped;
    for (const auto& n : d.skipped) skipped.push_back(n.reason);
    EXPECT_EQ(skipped, row.skipped) << row.what << ": " << d.detail;
    EXPECT_FALSE(d.detail.empty()) << row.what;
    if (d.action == Rung::reject) {
      EXPECT_GT(d.retry_after, Clock::duration::zero()) << row.what;
      EXPECT_EQ(d.to_error().code, Errc::rejected);
    }
  }
}

TEST_F(AdmissionTest, AdmitCarriesTheBreakdown) {
  AdmissionSnapshot s = base();
  Decision d = policy_.decide(s);
  ASSERT_EQ(d.action, Rung::admit);
  EXPECT_EQ(d.breakdown, policy_.estimator().estimate(s.model, s.request, true));
  EXPECT_EQ(d.route.device, Device::gpu);
  EXPECT_EQ(d.route.model, "llama-2-7b");
  EXPECT_EQ(d.max_new_tokens, 1000u);
  // Exactly at the limit still fits; one byte less does not.
  s.gpu.headroom.headroom = need(s);
  EXPECT_EQ(policy_.decide(s).action, Rung::admit);
}

TEST_F(AdmissionTest, ReduceChunksThePrefillBeforeCappingTokens) {
  AdmissionSnapshot s = base();
  s.request = request(4000, 1000);
  s.request.allow_reduce = true;
  s.gpu.queue_full = true;
  const std::int64_t full = need(s);
  // Room for everything but part of the prefill activations: chunking alone must do.
  RequestShape chunked = s.request;
  chunked.prefill_chunk = 1000;
  const auto with_chunk = static_cast<std::int64_t>(policy_.estimator().estimate(s.model, chunked, true).total_bytes);
  ASSERT_LT(with_chunk, full);
  s.gpu.headroom.headroom = with_chunk;
  Decision d = policy_.decide(s);
  ASSERT_EQ(d.action, Rung::reduce) << d.detail;
  EXPECT_EQ(d.max_new_tokens, 1000u);  // not capped
  EXPECT_EQ(d.prefill_chunk, 1000u);   // 4000 → 2000 → 1000
  EXPECT_LE(static_cast<std::int64_t>(d.breakdown.total_bytes), s.gpu.headroom.headroom);

  // Less room: chunk goes to the floor (128) and max_new_tokens is capped to the largest that fits.
  RequestShape floor = s.request;
  floor.prefill_chunk = 128;
  floor.max_new_tokens = 500;
  s.gpu.headroom.headroom = static_cast<std::int64_t>(policy_.estimator().estimate(s.model, floor, true).total_bytes);
  d = policy_.decide(s);
  ASSERT_EQ(d.action, Rung::reduce) << d.detail;
  EXPECT_EQ(d.prefill_chunk, 128u);
  EXPECT_GE(d.max_new_tokens, 500u);
  EXPECT_LT(d.max_new_tokens, 1000u);
  RequestShape one_more = floor;
  one_more.max_new_tokens = d.max_new_tokens + 1;
  EXPECT_GT(static_cast<std::int64_t>(policy_.estimator().estimate(s.model, one_more, true).total_bytes),
            s.gpu.headroom.headroom);

  // Room only for 40 new tokens, below the floor of 64 (and in a smaller KV block count): insufficient.
  floor.max_new_tokens = 40;
  s.gpu.headroom.headroom = static_cast<std::int64_t>(policy_.estimator().estimate(s.model, floor, true).total_bytes);
  s.gpu.offload_supported = false;
  s.request.allow_cpu = false;
  d = policy_.decide(s);
  EXPECT_EQ(d.action, Rung::reject);
  EXPECT_EQ(d.skipped.at(2).reason, Reason::reduce_insufficient);
}

TEST_F(AdmissionTest, OffloadReportsHowManyLayersFit) {
  AdmissionSnapshot s = base();
  s.gpu.weights_resident = false;
  s.gpu.queue_full = true;
  s.gpu.headroom.headroom = static_cast<std::int64_t>(6 * G);  // 7B fp16 needs ~13.5 GB of weights
  Decision d = policy_.decide(s);
  ASSERT_EQ(d.action, Rung::offload) << d.detail;
  EXPECT_EQ(d.route.device, Device::hybrid);
  EXPECT_EQ(d.route.gpu_layers, policy_.estimator().layers_that_fit(s.model, s.request, false, 6 * G));
  EXPECT_GT(d.route.gpu_layers, 5u);
  EXPECT_LT(d.route.gpu_layers, 16u);
  EXPECT_LE(d.breakdown.total_bytes, 6 * G);
  EXPECT_EQ(d.breakdown.layers, d.route.gpu_layers);
}

TEST_F(AdmissionTest, RetryHintFollowsTheBlockingCause) {
  AdmissionSnapshot s = base();
  s.request.allow_cpu = false;
  s.gpu.breaker_allows = false;
  s.gpu.breaker_retry_in = 12s;
  EXPECT_EQ(policy_.decide(s).retry_after, 12s);
  s.gpu.breaker_retry_in = 1h;  // clamped
  EXPECT_EQ(policy_.decide(s).retry_after, 300s);
  s = base();
  s.request.allow_cpu = false;
  no_fit(s);
  s.gpu.queue_full = true;
  s.gpu.offload_supported = false;
  s.gpu.queue_wait = 42s;
  EXPECT_EQ(policy_.decide(s).retry_after, 42s);
  s.gpu.queue_wait = 0s;
  EXPECT_EQ(policy_.decide(s).retry_after, 5s);  // default
}

TEST_F(AdmissionTest, HostMemoryWaitStillRoutesButSaysSo) {
  AdmissionSnapshot s = base();
  s.gpu.breaker_allows = false;
  s.cpu.host_reading.mem_available.reset();
  // Occupy most of the 32 GiB configured budget with another CPU job.
  HostJobEstimate big{"other", 0, 30 * G, 0};
  ASSERT_TRUE(host_.admit(99, big, s.cpu.host_reading).ok());
  Decision d = policy_.decide(s);
  ASSERT_EQ(d.action, Rung::route_cpu) << d.detail;
  EXPECT_TRUE(d.waits_for_host_memory);
  ASSERT_TRUE(d.host.has_value());
  EXPECT_EQ(d.host->model, "llama-2-7b");
  host_.release(99);
  EXPECT_FALSE(policy_.decide(s).waits_for_host_memory);
}

TEST_F(AdmissionTest, ConfiguredOrderIsFollowed) {
  LadderConfig cpu_first;
  cpu_first.order = {Rung::route_cpu, Rung::admit, Rung::reject};
  AdmissionPolicy p(cpu_first, EstimatorConfig{}, HostGuardConfig{32 * G, 1 * G, 4});
  EXPECT_EQ(p.decide(base()).action, Rung::route_cpu);

  LadderConfig strict;
  strict.order = {Rung::admit, Rung::reject};
  AdmissionPolicy q(strict, EstimatorConfig{}, HostGuardConfig{32 * G, 1 * G, 4});
  AdmissionSnapshot s = base();
  no_fit(s);
  Decision d = q.decide(s);
  EXPECT_EQ(d.action, Rung::reject);
  EXPECT_EQ(d.reason, Reason::does_not_fit);
  ASSERT_EQ(d.skipped.size(), 1u);
  EXPECT_EQ(d.skipped[0], (RungNote{Rung::admit, Reason::does_not_fit}));
}

TEST_F(AdmissionTest, DecideIsAPureFunctionOfTheSnapshot) {
  AdmissionSnapshot s = base();
  no_fit(s);
  s.gpu.queue_full = true;
  Decision a = policy_.decide(s), b = policy_.decide(s);
  EXPECT_EQ(a.action, b.action);
  EXPECT_EQ(a.detail, b.detail);
  EXPECT_EQ(a.route, b.route);
  EXPECT_EQ(a.breakdown, b.breakdown);
}

// Whatever the snapshot, a GPU decision never plans more than the headroom, and reductions only reduce.
TEST_F(AdmissionTest, RandomSnapshotsNeverOvercommit) {
  std::mt19937_64 rng(20240601);
  auto pick = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
  int counts[6] = {};
  for (int i = 0; i < 3000; ++i) {
    AdmissionSnapshot s = base();
    s.request = request(static_cast<std::uint32_t>(pick(1, 7000)), static_cast<std::uint32_t>(pick(1, 3000)));
    s.request.allow_reduce = pick(0, 1);
    s.request.allow_cpu = pick(0, 1);
    s.request.allow_fallback_model = pick(0, 1);
    s.request.prefill_chunk = static_cast<std::uint32_t>(pick(0, 1) ? 0 : pick(1, 4096));
    s.gpu.weights_resident = pick(0, 1);
    s.gpu.headroom.headroom = static_cast<std::int64_t>(pick(0, 20 * G)) - static_cast<std::int64_t>(G);
    s.gpu.headroom.drained_headroom = s.gpu.headroom.headroom + static_cast<std::int64_t>(pick(0, 8 * G));
    s.gpu.breaker_allows = pick(0, 5) != 0;
    s.gpu.queue_full = pick(0, 3) == 0;
    s.gpu.pressure = static_cast<Pressure>(pick(0, 2));
    s.cpu.fingerprint_compatible = pick(0, 1);
    s.cpu.host_reading.mem_available = pick(0, 64 * G);
    Decision d = policy_.decide(s);
    ++counts[static_cast<int>(d.action)];
    const std::int64_t room = s.gpu.headroom.headroom;
    switch (d.action) {
      case Rung::admit:
      case Rung::reduce:
      case Rung::offload:
        EXPECT_LE(static_cast<std::int64_t>(d.breakdown.total_bytes), room) << i << " " << d.detail;
        EXPECT_TRUE(s.gpu.breaker_allows);
        EXPECT_NE(s.gpu.pressure, Pressure::critical);
        EXPECT_LE(d.max_new_tokens, s.request.max_new_tokens);
        EXPECT_LE(std::uint64_t{s.request.prompt_tokens} + d.max_new_tokens, s.gpu.max_context);
        if (d.action != Rung::reduce) { EXPECT_EQ(d.max_new_tokens, s.request.max_new_tokens); }
        break;
      case Rung::route_cpu:
        EXPECT_TRUE(s.request.allow_cpu);
        EXPECT_LE(std::uint64_t{s.request.prompt_tokens} + d.max_new_tokens, s.cpu.max_context);
        if (d.route.fallback_model) { EXPECT_TRUE(s.request.allow_fallback_model); }
        if (!d.route.fallback_model) { EXPECT_TRUE(s.cpu.fingerprint_compatible); }
        break;
      case Rung::delay:
        EXPECT_FALSE(s.gpu.queue_full);
        EXPECT_LE(static_cast<std::int64_t>(d.breakdown.total_bytes), s.gpu.headroom.drained_headroom);
        break;
      case Rung::reject:
        EXPECT_GT(d.retry_after, Clock::duration::zero());
        break;
    }
  }
  for (int a = 0; a < 6; ++a) EXPECT_GT(counts[a], 0) << "rung " << rung_name(static_cast<Rung>(a)) << " never chosen";
}

TEST(AdmissionViews, BuiltFromMechanisms) {
  CircuitBreaker breaker;
  JobQueue gpu("gpu_queue", QueueConfig{2, 1, 8192, 4096}, RateConfig{0.2, 1000, 10});
  ASSERT_TRUE(gpu.start_direct(QueueEntry{1, 100, 100, {}}).ok());
  ASSERT_TRUE(gpu.enqueue(QueueEntry{2, 100, 100, testing::at(1s)}).ok());
  ASSERT_TRUE(gpu.enqueue(QueueEntry{3, 100, 100, testing::at(2s)}).ok());
  Headroom h;
  GpuView v = make_gpu_view(h, Pressure::normal, breaker, gpu, testing::at(3s), true, false);
  EXPECT_EQ(v.jobs_ahead, 2u);
  EXPECT_TRUE(v.queue_full);
  EXPECT_FALSE(v.slot_free);
  EXPECT_GT(v.queue_wait, Clock::duration::zero());
  GpuView self = make_gpu_view(h, Pressure::normal, breaker, gpu, testing::at(3s), true, false, JobId{3});
  EXPECT_EQ(self.jobs_ahead, 1u);
  EXPECT_FALSE(self.queue_full);  // it is already in
  breaker.record(BreakerEvent::driver_reset, testing::at(3s));
  EXPECT_FALSE(make_gpu_view(h, Pressure::normal, breaker, gpu, testing::at(4s), true, false).breaker_allows);

  JobQueue cpu("cpu_queue", QueueConfig{1, 1, 4096, 1024});
  HostMemoryGuard guard;
  CpuView c = make_cpu_view(cpu, guard, HostReading{}, true, true, std::nullopt);
  EXPECT_EQ(c.host, &guard);
  EXPECT_EQ(c.max_context, 4096u);
  EXPECT_FALSE(c.queue_full);
}

}  // namespace
}  // namespace tandem::policy
