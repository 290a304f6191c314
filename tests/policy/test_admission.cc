#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "admission_fixture.h"

namespace tandem::policy {
namespace {

using testing::AdmissionTest;
using testing::llama7b;
using testing::request;
using testing::small_model;
constexpr std::uint64_t G = kGiB;

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
      {"does not fit, waits for memory a running job frees",
       [](auto& t, auto& s) { t.no_fit(s); s.gpu.running = {{G, 5s}}; }, Rung::delay, R::waiting_for_memory,
       {R::does_not_fit}},
      {"does not fit and nothing of ours frees memory -> offload",
       [](auto& t, auto& s) { t.no_fit(s); }, Rung::offload, R::fits_offloaded,
       {R::does_not_fit, R::wait_unknown, R::no_idle_replica, R::reduce_not_allowed}},
      {"queue full, reduce not allowed -> offload",
       [](auto& t, auto& s) { t.no_fit(s); s.gpu.queue_full = true; }, Rung::offload, R::fits_offloaded,
       {R::does_not_fit, R::gpu_queue_full, R::gpu_queue_full, R::reduce_not_allowed}},
      {"queue full, reduce allowed -> reduce",
       [](auto& t, auto& s) { t.no_fit(s); s.gpu.queue_full = true; s.request.allow_reduce = true; }, Rung::reduce,
       R::fits_reduced, {R::does_not_fit, R::gpu_queue_full, R::gpu_queue_full}},
      {"wait too long, offload unsupported -> cpu",
       [](auto& t, auto& s) { t.no_fit(s); s.gpu.queue_wait = 60s; s.gpu.offload_supported = false; },
       Rung::route_cpu, R::routed_cpu,
       {R::does_not_fit, R::wait_too_long, R::wait_too_long, R::reduce_not_allowed, R::offload_unsupported}},
      {"breaker open -> cpu",
       [](auto&, auto& s) { s.gpu.breaker_allows = false; s.gpu.breaker_retry_in = 7s; }, Rung::route_cpu,
       R::routed_cpu, {R::breaker_open, R::breaker_open, R::breaker_open, R::reduce_not_allowed, R::breaker_open}},
      {"breaker open, incompatible replica, fallback not allowed -> reject",
       [](auto&, auto& s) { s.gpu.breaker_allows = false; s.gpu.breaker_retry_in = 7s; s.cpu.fingerprint_compatible = false; },
       Rung::reject, R::breaker_open,
       {R::breaker_open, R::breaker_open, R::breaker_open, R::reduce_not_allowed, R::breaker_open, R::cpu_incompatible}},
      {"breaker open, incompatible replica, fallback allowed -> fallback model",
       [](auto&, auto& s) {
         s.gpu.breaker_allows = false;
         s.cpu.fingerprint_compatible = false;
         s.request.allow_fallback_model = true;
       },
       Rung::route_cpu, R::routed_fallback,
       {R::breaker_open, R::breaker_open, R::breaker_open, R::reduce_not_allowed, R::breaker_open}},
      {"no cpu replica, no fallback -> reject",
       [](auto&, auto& s) { s.gpu.breaker_allows = false; s.cpu.replica_present = false; s.cpu.fallback.reset(); },
       Rung::reject, R::breaker_open,
       {R::breaker_open, R::breaker_open, R::breaker_open, R::reduce_not_allowed, R::breaker_open, R::cpu_unavailable}},
      {"gpu absent -> cpu", [](auto&, auto& s) { s.gpu.present = false; }, Rung::route_cpu, R::routed_cpu,
       {R::gpu_absent, R::gpu_absent, R::gpu_absent, R::reduce_not_allowed, R::gpu_absent}},
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
      // The replica is being loaded back (docs/residency.md): wait for it, or start on the CPU, by the earlier finish.
      {"replica loading, run times unknown -> waits for it",
       [](auto&, auto& s) { s.gpu.replica_loading = 2s; }, Rung::delay, R::waiting_for_replica, {R::replica_loading}},
      {"replica loading, a long job: the GPU after the load finishes first -> waits",
       [](auto&, auto& s) {
         s.gpu.replica_loading = 2s;
         s.gpu.gpu_run = 3s;
         s.gpu.cpu_run = 40s;
       },
       Rung::delay, R::waiting_for_replica, {R::replica_loading}},
      {"replica loading, a short job: the CPU finishes first -> cpu now",
       [](auto&, auto& s) {
         s.gpu.replica_loading = 2s;
         s.gpu.gpu_run = 100ms;
         s.gpu.cpu_run = 800ms;
       },
       Rung::route_cpu, R::routed_cpu,
       {R::replica_loading, R::cpu_sooner, R::replica_loading, R::reduce_not_allowed, R::replica_loading}},
      {"replica loading, a short job the CPU may not take -> waits",
       [](auto&, auto& s) {
         s.gpu.replica_loading = 2s;
         s.gpu.gpu_run = 100ms;
         s.gpu.cpu_run = 800ms;
         s.request.allow_cpu = false;
       },
       Rung::delay, R::waiting_for_replica, {R::replica_loading}},
      {"replica loading longer than max_delay -> cpu",
       [](auto&, auto& s) { s.gpu.replica_loading = 90s; }, Rung::route_cpu, R::routed_cpu,
       {R::replica_loading, R::wait_too_long, R::replica_loading, R::reduce_not_allowed, R::replica_loading}},
      {"never fits on this device, cpu not allowed -> reject",
       [](auto& t, auto& s) {
         t.no_fit(s);
         s.gpu.headroom.drained_headroom = s.gpu.headroom.headroom;
         s.gpu.offload_supported = false;
         s.request.allow_cpu = false;
       },
       Rung::reject, R::does_not_fit,
       {R::does_not_fit, R::exceeds_device, R::no_idle_replica, R::reduce_not_allowed, R::offload_unsupported, R::cpu_not_allowed}},
      {"cpu limits exceeded without reduce",
       [](auto&, auto& s) { s.request.max_new_tokens = 2000; s.gpu.breaker_allows = false; }, Rung::reject,
       R::breaker_open,
       {R::breaker_open, R::breaker_open, R::breaker_open, R::reduce_not_allowed, R::breaker_open, R::exceeds_cpu_limits}},
      {"cpu limits exceeded with reduce -> capped on cpu",
       [](auto&, auto& s) { s.request.max_new_tokens = 2000; s.request.allow_reduce = true; s.gpu.breaker_allows = false; },
       Rung::route_cpu, R::routed_cpu, {R::breaker_open, R::breaker_open, R::breaker_open, R::breaker_open, R::breaker_open}},
      {"cpu queue full",
       [](auto&, auto& s) { s.gpu.breaker_allows = false; s.cpu.queue_full = true; }, Rung::reject, R::breaker_open,
       {R::breaker_open, R::breaker_open, R::breaker_open, R::reduce_not_allowed, R::breaker_open, R::cpu_queue_full}},
      {"host memory can never fit",
       [](auto&, auto& s) { s.gpu.breaker_allows = false; s.cpu.host_reading.mem_available = 2 * G; }, Rung::reject,
       R::breaker_open, {R::breaker_open, R::breaker_open, R::breaker_open, R::reduce_not_allowed, R::breaker_open, R::host_memory}},
      {"no host guard wired", [](auto&, auto& s) { s.gpu.breaker_allows = false; s.cpu.host = nullptr; },
       Rung::reject, R::breaker_open,
       {R::breaker_open, R::breaker_open, R::breaker_open, R::reduce_not_allowed, R::breaker_open, R::host_guard_missing}},
      {"invalid request", [](auto&, auto& s) { s.request.prompt_tokens = 0; }, Rung::reject, R::invalid_request, {}},
      {"larger than the device itself, cpu not allowed",
       [](auto&, auto& s) {
         s.request = request(4000, 4000);
         s.request.batch = 8;
         s.request.allow_cpu = false;
       },
       Rung::reject, R::exceeds_device,
       {R::exceeds_device, R::exceeds_device, R::exceeds_device, R::reduce_not_allowed, R::offload_insufficient, R::cpu_not_allowed}},
      {"invalid model", [](auto&, auto& s) { s.model.layers = 0; }, Rung::reject, R::invalid_request, {}},
      {"over gpu limits, reduce caps to the limit",
       [](auto&, auto& s) { s.request = request(8000, 1000); s.request.allow_reduce = true; }, Rung::reduce,
       R::fits_reduced, {R::exceeds_gpu_limits, R::exceeds_gpu_limits, R::exceeds_gpu_limits}},
      {"offload cannot place a single layer",
       [](auto&, auto& s) {
         s.gpu.weights_resident = false;
         s.gpu.headroom.headroom = 64 * static_cast<std::int64_t>(kMiB);
         s.gpu.queue_full = true;
         s.request.allow_cpu = false;
       },
       Rung::reject, R::does_not_fit,
       {R::does_not_fit, R::exceeds_device, R::gpu_queue_full, R::reduce_not_allowed, R::offload_insufficient, R::cpu_not_allowed}},
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
    if (d.action == Rung::reject && !d.permanent) {
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
  EXPECT_EQ(d.skipped.at(3).reason, Reason::reduce_insufficient);
}

// The real batch (continuous batching): the job joins a step loop of `running_sequences` others, each taking one
// token of every step while it decodes, under a budget of `step_tokens`; its prefill chunk (and with it the
// activation term of its estimate) is what is left: max(1, step_tokens − running_sequences), or its own smaller
// chunk. No step loop (step_tokens 0): the whole prompt in one forward, as before.
TEST_F(AdmissionTest, RealBatchCapsThePrefillChunk) {
  struct BatchRow {
    const char* what;
    std::uint32_t prompt, own_chunk, running, step_tokens;
    std::uint32_t chunk;  // Decision::prefill_chunk (0 = whole prompt)
  };
  const BatchRow rows[] = {
      {"no step loop", 1000, 0, 3, 0, 0},
      {"alone: the whole budget", 1000, 0, 0, 512, 512},
      {"three decoders share the step", 1000, 0, 3, 512, 509},
      {"the prompt fits what is left", 300, 0, 3, 512, 0},
      {"its own chunk is smaller", 1000, 200, 3, 512, 200},
      {"its own chunk is larger", 1000, 600, 3, 512, 509},
      {"a budget used up by decoders still leaves one token", 1000, 0, 600, 512, 1},
  };
  for (const auto& row : rows) {
    AdmissionSnapshot s = base();
    s.request = request(row.prompt, 1000);
    s.request.prefill_chunk = row.own_chunk;
    s.gpu.running_sequences = row.running;
    s.gpu.step_tokens = row.step_tokens;
    const Decision d = policy_.decide(s);
    ASSERT_EQ(d.action, Rung::admit) << row.what << ": " << d.detail;
    EXPECT_EQ(d.prefill_chunk, row.chunk) << row.what;
    RequestShape expect = s.request;
    expect.prefill_chunk = row.chunk;
    EXPECT_EQ(d.breakdown, policy_.estimator().estimate(s.model, expect, true)) << row.what;
  }
  // A long prompt that does not fit as one forward fits as the step's chunk: admitted instead of reduced.
  AdmissionSnapshot s = base();
  s.request = request(6000, 1000);
  RequestShape in_steps = s.request;
  in_steps.prefill_chunk = 509;
  s.gpu.headroom.headroom = static_cast<std::int64_t>(policy_.estimator().estimate(s.model, in_steps, true).total_bytes);
  ASSERT_LT(s.gpu.headroom.headroom, need(s));
  s.gpu.queue_full = true;
  s.request.allow_cpu = false;
  EXPECT_EQ(policy_.decide(s).action, Rung::reject);
  s.gpu.running_sequences = 3;
  s.gpu.step_tokens = 512;
  const Decision d = policy_.decide(s);
  EXPECT_EQ(d.action, Rung::admit) << d.detail;
  EXPECT_EQ(d.prefill_chunk, 509u);
  // The CPU loop caps the host estimate's chunk the same way.
  AdmissionSnapshot c = base();
  c.request = request(3000, 500);
  c.gpu.present = false;
  c.cpu.running_sequences = 1;
  c.cpu.step_tokens = 256;
  const Decision dc = policy_.decide(c);
  ASSERT_EQ(dc.action, Rung::route_cpu) << dc.detail;
  EXPECT_EQ(dc.prefill_chunk, 255u);
  RequestShape host_req = c.request;
  host_req.prefill_chunk = 255;
  EXPECT_EQ(dc.host, estimate_host_job(c.model, host_req, policy_.estimator().config(), HostGuardConfig{32 * G, 1 * G, 4}));
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

// Review #1: delay's wait is bounded and its ETA honest when memory, not a slot, is what the job waits for. The
// wait for memory is when enough running jobs (soonest first) will have freed the missing bytes; it counts against
// max_delay together with the time already waited; if nothing of ours frees enough, the wait is unknown and the
// ladder moves on.
TEST_F(AdmissionTest, DelayWaitIsBoundedAndHonest) {
  struct DelayRow {
    const char* what;
    std::function<void(const AdmissionTest&, AdmissionSnapshot&)> mutate;
    Rung action;
    Reason reason;
    Clock::duration eta;  // delay only
    std::vector<Reason> skipped;
  };
  using R = Reason;
  // Short of half a GiB; the running jobs' reservations are in quarters of a GiB.
  auto short_by_half_g = [](const AdmissionTest& t, AdmissionSnapshot& s) {
    s.gpu.headroom.headroom = t.need(s) - static_cast<std::int64_t>(G / 2);
  };
  constexpr std::uint64_t Q = G / 4;
  const std::vector<DelayRow> rows = {
      {"one running job frees enough in 10 s",
       [&](auto& t, auto& s) { short_by_half_g(t, s); s.gpu.running = {{2 * Q, 10s}}; }, Rung::delay,
       R::waiting_for_memory, 10s, {R::does_not_fit}},
      {"two must finish: the later one's time",
       [&](auto& t, auto& s) { short_by_half_g(t, s); s.gpu.running = {{10 * G, 50s}, {Q, 12s}, {Q, 5s}}; },
       Rung::delay, R::waiting_for_memory, 12s, {R::does_not_fit}},
      {"slot wait longer than the memory wait",
       [&](auto& t, auto& s) { short_by_half_g(t, s); s.gpu.running = {{2 * Q, 10s}}; s.gpu.queue_wait = 20s; },
       Rung::delay, R::waiting_for_memory, 20s, {R::does_not_fit}},
      {"memory wait beyond max_delay",
       [&](auto& t, auto& s) { short_by_half_g(t, s); s.gpu.running = {{2 * Q, 31s}}; }, Rung::offload,
       R::fits_offloaded, 0s, {R::does_not_fit, R::wait_too_long, R::no_idle_replica, R::reduce_not_allowed}},
      {"already waited max_delay",
       [&](auto& t, auto& s) { short_by_half_g(t, s); s.gpu.running = {{2 * Q, 1s}}; s.gpu.waited = 31s; },
       Rung::offload, R::fits_offloaded, 0s, {R::does_not_fit, R::wait_too_long, R::wait_too_long, R::reduce_not_allowed}},
      {"waited + memory wait over max_delay",
       [&](auto& t, auto& s) { short_by_half_g(t, s); s.gpu.running = {{2 * Q, 6s}}; s.gpu.waited = 25s; },
       Rung::offload, R::fits_offloaded, 0s, {R::does_not_fit, R::wait_too_long, R::no_idle_replica, R::reduce_not_allowed}},
      {"waited + memory wait within max_delay",
       [&](auto& t, auto& s) { short_by_half_g(t, s); s.gpu.running = {{2 * Q, 5s}}; s.gpu.waited = 25s; },
       Rung::delay, R::waiting_for_memory, 5s, {R::does_not_fit}},
      {"nothing of ours frees enough (foreign memory)",
       [&](auto& t, auto& s) { short_by_half_g(t, s); s.gpu.running = {{Q / 2, 1s}, {Q, 2s}}; }, Rung::offload,
       R::fits_offloaded, 0s, {R::does_not_fit, R::wait_unknown, R::no_idle_replica, R::reduce_not_allowed}},
      {"critical pressure: waits until the headroom leaves critical",
       [](auto&, auto& s) {
         s.gpu.pressure = Pressure::critical;
         s.gpu.headroom.headroom = static_cast<std::int64_t>(G / 2);  // exit level: 8 % of 24 GiB = 1.92 GiB
         s.gpu.running = {{1 * G, 3s}, {2 * G, 8s}};
       },
       Rung::delay, R::waiting_for_memory, 8s, {R::critical_pressure}},
      {"slot wait only: memory is there", [](auto&, auto& s) { s.gpu.slot_free = false; s.gpu.queue_wait = 7s; },
       Rung::delay, R::waiting_for_slot, 7s, {R::no_free_slot}},
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
    if (d.action == Rung::delay) { EXPECT_EQ(d.eta, row.eta) << row.what << ": " << d.detail; }
  }
}

// The review's demonstration, end to end through the mechanisms: one 4000+4000-token job running (~102 s left at the
// GPU's prior rates), 1.9 GB of headroom, a second such request (7.08 GB) that allows reduce and the CPU. It used to
// be delayed "waiting_for_memory, eta 0s" forever; now the memory wait (102 s) exceeds max_delay and the ladder goes
// on to the CPU.
TEST_F(AdmissionTest, MemoryBlockedDelayMovesOnToTheCpu) {
  PolicyConfig cfg;
  JobQueue gpu("gpu_queue", cfg.gpu_queue, cfg.gpu_rates);
  CircuitBreaker breaker;
  ReservationLedger ledger;
  const RequestShape big = request(4000, 4000);
  const std::uint64_t job_bytes = policy_.estimator().estimate(llama7b(), big, true).job_bytes();
  ASSERT_GT(job_bytes, 7'000'000'000u);
  ASSERT_TRUE(gpu.start_direct(QueueEntry{1, 4000, 4000, {}}).ok());
  ASSERT_TRUE(ledger.reserve(1, job_bytes).ok());
  Headroom h;
  h.total_bytes = 24 * G;
  h.headroom = h.drained_headroom = 1'900'000'000;
  h.drained_headroom = static_cast<std::int64_t>(job_bytes) + h.headroom;
  AdmissionSnapshot s = base();
  s.request = big;
  s.request.allow_reduce = true;
  s.gpu = make_gpu_view(h, Pressure::normal, breaker, gpu, ledger, testing::at(1s), true, false);
  ASSERT_EQ(s.gpu.running.size(), 1u);
  // Prior step = 24.5 ms + 0.5 ms · tokens: 7 prefill chunks of 512 (280.5 ms each), the last 416 (232.5 ms, the
  // first token), 3999 decode steps alone (25 ms).
  EXPECT_EQ(s.gpu.running[0].remaining, 102171ms);
  Decision d = policy_.decide(s);
  EXPECT_EQ(d.action, Rung::route_cpu) << d.detail;
  ASSERT_GE(d.skipped.size(), 2u);
  EXPECT_EQ(d.skipped[1], (RungNote{Rung::delay, Reason::wait_too_long})) << d.detail;

  // Once the running job is nearly done, waiting is the honest answer, with its ETA.
  gpu.update_progress(1, true, 3800);  // 200 tokens left: 5 s
  s.gpu = make_gpu_view(h, Pressure::normal, breaker, gpu, ledger, testing::at(1s), true, false);
  d = policy_.decide(s);
  EXPECT_EQ(d.action, Rung::delay) << d.detail;
  EXPECT_EQ(d.reason, Reason::waiting_for_memory);
  EXPECT_EQ(d.eta, 5s);
}

// Review #4: the offload rung puts layers k..L (with lm_head, their KV and the activations) on the host, so it must
// pass the host-memory guard like the CPU route does.
TEST_F(AdmissionTest, OffloadRespectsTheHostGuard) {
  struct OffloadRow {
    const char* what;
    std::optional<std::uint64_t> mem_available;
    bool host_wired;
    Rung action;
    std::vector<Reason> skipped;
  };
  using R = Reason;
  const OffloadRow rows[] = {
      {"plenty of host memory", 64 * G, true, Rung::offload, {R::does_not_fit, R::exceeds_device, R::gpu_queue_full, R::reduce_not_allowed}},
      {"MemAvailable 0", 0, true, Rung::reject,
       {R::does_not_fit, R::exceeds_device, R::gpu_queue_full, R::reduce_not_allowed, R::host_memory, R::host_memory}},
      {"MemAvailable below the host part", 5 * G, true, Rung::reject,
       {R::does_not_fit, R::exceeds_device, R::gpu_queue_full, R::reduce_not_allowed, R::host_memory, R::host_memory}},
      {"no host guard wired", 64 * G, false, Rung::reject,
       {R::does_not_fit, R::exceeds_device, R::gpu_queue_full, R::reduce_not_allowed, R::host_guard_missing, R::host_guard_missing}},
  };
  for (const auto& row : rows) {
    AdmissionSnapshot s = base();
    s.gpu.weights_resident = false;
    s.gpu.queue_full = true;
    s.gpu.headroom.headroom = static_cast<std::int64_t>(6 * G);
    s.cpu.host_reading.mem_available = row.mem_available;
    if (!row.host_wired) s.cpu.host = nullptr;
    Decision d = policy_.decide(s);
    EXPECT_EQ(d.action, row.action) << row.what << ": " << d.detail;
    std::vector<Reason> skipped;
    for (const auto& n : d.skipped) skipped.push_back(n.reason);
    EXPECT_EQ(skipped, row.skipped) << row.what << ": " << d.detail;
    if (d.action == Rung::offload) {
      ASSERT_TRUE(d.host.has_value()) << row.what;
      const std::uint32_t k = d.route.gpu_layers;
      EXPECT_EQ(*d.host, estimate_host_hybrid(s.model, s.request, k, EstimatorConfig{}, HostGuardConfig{32 * G, 1 * G, 4}));
      EXPECT_EQ(d.host->kv_bytes, 2000ull * (32 - k) * 16 * 1024);  // 16 KiB of fp16 KV per layer and token
      EXPECT_GT(d.host->mapped_weights_bytes, (32 - k) * MemoryEstimator::layer_weights_bytes(s.model));
      EXPECT_EQ(host_.check(*d.host, s.cpu.host_reading).fit, HostFit::fits);
    }
  }
}

// Review #11: what resubmitting cannot fix is not a resumable rejection: Errc::invalid_argument, no retry hint.
TEST_F(AdmissionTest, PermanentRejectsCarryNoRetryHint) {
  struct PermRow {
    const char* what;
    std::function<void(AdmissionSnapshot&)> mutate;
    Reason reason;
    bool permanent;
  };
  auto huge = [](AdmissionSnapshot& s) {
    s.request = request(4000, 4000);
    s.request.batch = 8;  // 32 GiB of KV on a 24 GiB device
  };
  const PermRow rows[] = {
      {"prompt_tokens = 0", [](auto& s) { s.request.prompt_tokens = 0; }, Reason::invalid_request, true},
      {"invalid model", [](auto& s) { s.model.layers = 0; }, Reason::invalid_request, true},
      {"larger than the device, cpu not allowed", [&](auto& s) { huge(s); s.request.allow_cpu = false; },
       Reason::exceeds_device, true},
      {"larger than the device, over the cpu limits", [&](auto& s) { huge(s); }, Reason::exceeds_device, true},
      {"over both queues' limits", [](auto& s) { s.request = request(8000, 1000); }, Reason::exceeds_gpu_limits, true},
      {"larger than the device, cpu queue full (transient)",
       [](auto& s) { s.request.batch = 32; s.cpu.queue_full = true; },  // 32 GiB of KV
       Reason::exceeds_device, false},
      {"breaker open (transient)",
       [](auto& s) { s.gpu.breaker_allows = false; s.gpu.breaker_retry_in = 9s; s.request.allow_cpu = false; },
       Reason::breaker_open, false},
  };
  for (const auto& row : rows) {
    AdmissionSnapshot s = base();
    row.mutate(s);
    Decision d = policy_.decide(s);
    ASSERT_EQ(d.action, Rung::reject) << row.what << ": " << d.detail;
    EXPECT_EQ(d.reason, row.reason) << row.what << ": " << d.detail;
    EXPECT_EQ(d.permanent, row.permanent) << row.what << ": " << d.detail;
    Error e = d.to_error();
    if (row.permanent) {
      EXPECT_EQ(e.code, Errc::invalid_argument) << row.what;
      EXPECT_EQ(d.retry_after, Clock::duration::zero()) << row.what;
      EXPECT_EQ(e.message.find("retry after"), std::string::npos) << e.message;
    } else {
      EXPECT_EQ(e.code, Errc::rejected) << row.what;
      EXPECT_GT(d.retry_after, Clock::duration::zero()) << row.what;
      EXPECT_NE(e.message.find("retry after"), std::string::npos) << e.message;
    }
  }
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
  int counts[7] = {};
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
    if (pick(0, 1)) s.gpu.running = {{pick(0, 8 * G), std::chrono::seconds(pick(0, 60))}};
    s.gpu.waited = std::chrono::seconds(pick(0, 40));
    for (std::uint64_t k = pick(0, 3); k > 0; --k)
      s.gpu.evictable.push_back({"m" + std::to_string(k), pick(0, 6 * G), static_cast<int>(pick(0, 2)),
                                 testing::at(std::chrono::seconds(pick(0, 100)))});
    s.gpu.evicting_bytes = pick(0, 1) ? 0 : pick(0, 4 * G);
    s.gpu.evict_budget = static_cast<std::uint32_t>(pick(0, 3));
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
        EXPECT_LE(s.gpu.waited + d.eta, policy_.ladder().max_delay) << i << " " << d.detail;  // bounded in total
        EXPECT_GE(d.eta, s.gpu.queue_wait);
        break;
      case Rung::evict: {
        // What it gives back, with what is already on its way back, covers what is missing; within the cap.
        EXPECT_FALSE(s.gpu.queue_full);
        EXPECT_TRUE(s.gpu.breaker_allows);
        EXPECT_LE(d.evict.size(), s.gpu.evict_budget);
        std::uint64_t freed = s.gpu.evicting_bytes;
        for (const auto& m : d.evict)
          for (const auto& e : s.gpu.evictable)
            if (e.model == m) freed += e.bytes;
        EXPECT_GE(static_cast<std::int64_t>(freed) + room, static_cast<std::int64_t>(d.breakdown.total_bytes))
            << i << " " << d.detail;
        EXPECT_EQ(d.reason, d.evict.empty() ? Reason::waiting_for_eviction : Reason::evicting_idle);
        break;
      }
      case Rung::reject:
        if (d.permanent) {
          EXPECT_EQ(d.retry_after, Clock::duration::zero());
          EXPECT_EQ(d.to_error().code, Errc::invalid_argument);
        } else {
          EXPECT_GT(d.retry_after, Clock::duration::zero());
          EXPECT_EQ(d.to_error().code, Errc::rejected);
        }
        break;
    }
  }
  for (int a = 0; a < 7; ++a) EXPECT_GT(counts[a], 0) << "rung " << rung_name(static_cast<Rung>(a)) << " never chosen";
}

TEST(AdmissionViews, BuiltFromMechanisms) {
  CircuitBreaker breaker;
  JobQueue gpu("gpu_queue", QueueConfig{2, 1, 8192, 4096}, RateConfig{0.2, 1000, 10});
  ASSERT_TRUE(gpu.start_direct(QueueEntry{1, 100, 100, {}}).ok());
  ASSERT_TRUE(gpu.enqueue(QueueEntry{2, 100, 100, testing::at(1s)}).ok());
  ASSERT_TRUE(gpu.enqueue(QueueEntry{3, 100, 100, testing::at(2s)}).ok());
  Headroom h;
  ReservationLedger ledger;
  ASSERT_TRUE(ledger.reserve(1, 3 * G).ok());
  GpuView v = make_gpu_view(h, Pressure::normal, breaker, gpu, ledger, testing::at(3s), true, false);
  EXPECT_EQ(v.jobs_ahead, 2u);
  EXPECT_TRUE(v.queue_full);
  EXPECT_FALSE(v.slot_free);
  EXPECT_GT(v.queue_wait, Clock::duration::zero());
  EXPECT_EQ(v.waited, 0s);  // a new job has not waited
  // Job 1 runs alone (the queued ones wait for its slot). Prior step = 99 ms + 1 ms · tokens: its 100-token prompt
  // in one step (199 ms, the first token), then 99 decode steps (100 ms each).
  EXPECT_EQ(v.running, (std::vector<RunningGpuJob>{{3 * G, 10099ms}}));
  EXPECT_EQ(v.running_sequences, 1u);
  EXPECT_EQ(v.step_tokens, 0u);  // no step loop until the caller says so
  GpuView self = make_gpu_view(h, Pressure::normal, breaker, gpu, ledger, testing::at(3s), true, false, JobId{3});
  EXPECT_EQ(self.jobs_ahead, 1u);
  EXPECT_FALSE(self.queue_full);  // it is already in
  EXPECT_EQ(self.waited, 1s);     // accepted at 2 s
  breaker.record(BreakerEvent::driver_reset, testing::at(3s));
  EXPECT_FALSE(make_gpu_view(h, Pressure::normal, breaker, gpu, ledger, testing::at(4s), true, false).breaker_allows);

  JobQueue cpu("cpu_queue", QueueConfig{1, 1, 4096, 1024});
  HostMemoryGuard guard;
  CpuView c = make_cpu_view(cpu, guard, HostReading{}, true, true, std::nullopt);
  EXPECT_EQ(c.host, &guard);
  EXPECT_EQ(c.running_sequences, 0u);
  EXPECT_EQ(c.step_tokens, 0u);
  EXPECT_EQ(c.max_context, 4096u);
  EXPECT_FALSE(c.queue_full);
}

}  // namespace
}  // namespace tandem::policy
