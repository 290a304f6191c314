// The service core (src/daemon/service.cc) driven like tandemd drives it — methods on the test thread, then the
// workers' `wake` and process_events()/tick() — over a scripted FakeBackend, a SimulatedDevice and a ManualClock.
// No LibTorch, no D-Bus. Each test is one scenario of DESIGN §2 (admission, failover, breaker, holds, journal).
#include "daemon/service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "device/simulated.h"
#include "fake_backend.h"
#include "service_fixture.h"

namespace tandem::daemon {
namespace {

using namespace tandem::daemon::testing;

// --- the happy path ------------------------------------------------------------------------------------------------

TEST_F(ServiceTest, SubmitSendsOrderedUpdatesOnlyToTheSubmitter) {
  ASSERT_NO_FATAL_FAILURE(start());
  EXPECT_TRUE(rec_.degraded_events.empty());  // starting normal announces nothing
  backend_->set_script(emit(5));
  Dict placement;
  const JobId a = submit_ok(alice_, request("for alice"), &placement);
  const JobId b = submit_ok(bob_, request("for bob"));
  ASSERT_NE(a, 0u);
  ASSERT_NE(b, a);
  EXPECT_EQ(str(placement, "route"), "gpu");
  EXPECT_EQ(str(placement, "action"), "admit");
  EXPECT_EQ(str(placement, "reason"), "fits");
  EXPECT_FALSE(flag(placement, "existing"));
  EXPECT_FALSE(flag(placement, "degraded"));
  EXPECT_EQ(str(placement, "fingerprint"), "fp-tiny");
  ASSERT_TRUE(wait_terminal(a));
  ASSERT_TRUE(wait_terminal(b));

  EXPECT_THAT(rec_.kinds(a), ElementsAre("accepted", "routed", "started", "tokens", "tokens", "tokens", "tokens",
                                         "tokens", "finished"));
  for (const auto& u : rec_.updates) EXPECT_EQ(u.destination, u.id == a ? alice_.bus_name : bob_.bus_name) << u.kind;
  std::uint32_t step = 0;
  for (const auto& u : rec_.of(a)) {
    if (u.kind != "tokens") continue;
    EXPECT_EQ(u32(u.data, "step"), step++);
  }
  const auto fin = rec_.of(a).back().data;
  EXPECT_EQ(str(fin, "state"), "completed");
  EXPECT_EQ(str(fin, "finish_reason"), "eos");
  EXPECT_EQ(u32(fin, "tokens_total"), 5u);
  EXPECT_EQ(str(fin, "text"), FakeBackend::text_of(0, 5));
  EXPECT_EQ(rec_.streamed_text(a), str(fin, "text"));
  EXPECT_EQ(rec_.streamed_tokens(a), FakeBackend::tokens_of(kSeed, 0, 5));
  EXPECT_EQ(str(rec_.of(a)[1].data, "route"), "gpu");

  const auto runs = backend_->runs_of(a);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].route.device, policy::Device::gpu);
  EXPECT_EQ(runs[0].route.model, "tiny");
  EXPECT_EQ(runs[0].sampling.seed, kSeed);
  EXPECT_EQ(runs[0].max_new_tokens, 8u);
  EXPECT_TRUE(runs[0].resume_tokens.empty());
  EXPECT_EQ(runs[0].prompt.size(), 1 + std::string("for alice").size());
  const auto c = svc_->counters();
  EXPECT_EQ(c.at("jobs_accepted"), 2u);
  EXPECT_EQ(c.at("jobs_completed"), 2u);
  EXPECT_EQ(c.at("jobs_running"), 0u);
  EXPECT_EQ(svc_->state(), "normal");
}

TEST_F(ServiceTest, GetJobReadsACompletedJob) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(3));
  const JobId id = submit_ok(alice_, request("read me"));
  ASSERT_TRUE(wait_terminal(id));
  auto r = svc_->get_job(alice2_, id);  // same uid, another connection
  ASSERT_TRUE(r) << describe(r);
  const Dict& j = *r;
  EXPECT_EQ(u64(j, "id"), id);
  EXPECT_EQ(str(j, "state"), "completed");
  EXPECT_EQ(str(j, "reason"), "eos");
  EXPECT_EQ(str(j, "finish_reason"), "eos");
  EXPECT_EQ(str(j, "text"), FakeBackend::text_of(0, 3));
  EXPECT_EQ(at<std::vector<std::int32_t>>(j, "tokens"), FakeBackend::tokens_of(kSeed, 0, 3));
  EXPECT_EQ(u32(j, "attempts"), 1u);
  EXPECT_EQ(at<std::vector<std::string>>(j, "routes"), std::vector<std::string>{"gpu"});
  EXPECT_EQ(str(j, "error_code"), "");
  EXPECT_EQ(str(j, "model"), "tiny");
  EXPECT_EQ(u32(j, "queue_position"), 0u);
  EXPECT_EQ(j.count("checkpoint_tokens"), 0u);
  EXPECT_GT(at<std::int64_t>(j, "accepted_unix_ms"), 0);
  EXPECT_GE(at<std::int64_t>(j, "finished_unix_ms"), at<std::int64_t>(j, "accepted_unix_ms"));
  const auto history = at<std::vector<HistoryRow>>(j, "history");
  ASSERT_EQ(history.size(), 3u);
  EXPECT_EQ(std::get<1>(history[0]), "queued");
  EXPECT_EQ(std::get<0>(history[1]), "queued");
  EXPECT_EQ(std::get<1>(history[1]), "running");
  EXPECT_EQ(std::get<1>(history[2]), "completed");

  auto missing = svc_->get_job(alice_, id + 100);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, Errc::not_found);
}

// --- Plan is the same decision, without acting ---------------------------------------------------------------------

TEST_F(ServiceTest, PlanPredictsSubmitAndChangesNothing) {
  struct Case {
    const char* name;
    std::function<void()> setup;
    const char* action;
    const char* route;
  };
  const std::vector<Case> cases = {
      {"idle gpu", [] {}, "admit", "gpu"},
      {"foreign load", [this] { sim_->set_foreign_bytes(8 * kGiB - 256 * kMiB); }, "route_cpu", "cpu"},
      {"gpu held", [this] { ASSERT_TRUE(svc_->hold_gpu(admin_, "game", "org.game")); }, "route_cpu", "cpu"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    cfg_.journal.dir = dir.path();
    sim_->set_foreign_bytes(0);
    ASSERT_NO_FATAL_FAILURE(start());
    backend_->set_script(emit(2));
    c.setup();
    const auto counters = svc_->counters();
    const auto queues = svc_->queues_view();
    const auto bytes = fs::file_size(fs::path(dir.path()) / "journal");
    const auto updates = rec_.updates.size();

    auto plan = svc_->plan(alice_, request("plan me"));
    ASSERT_TRUE(plan) << describe(plan);
    EXPECT_EQ(str(*plan, "action"), c.action);
    EXPECT_EQ(str(*plan, "route"), c.route);
    EXPECT_GT(u32(*plan, "prompt_tokens"), 0u);
    EXPECT_GT((at<std::map<std::string, std::uint64_t>>(*plan, "breakdown").at("total")), 0u);
    EXPECT_EQ(svc_->counters(), counters);
    const auto q2 = svc_->queues_view();
    ASSERT_EQ(q2.size(), queues.size());
    for (std::size_t i = 0; i < q2.size(); ++i) {
      EXPECT_EQ(q2[i].depth, queues[i].depth);
      EXPECT_EQ(q2[i].running, queues[i].running);
    }
    EXPECT_EQ(fs::file_size(fs::path(dir.path()) / "journal"), bytes);
    EXPECT_EQ(rec_.updates.size(), updates);

    Dict placement;
    const JobId id = submit_ok(alice_, request("plan me"), &placement);
    EXPECT_EQ(str(placement, "action"), str(*plan, "action"));
    EXPECT_EQ(str(placement, "route"), str(*plan, "route"));
    EXPECT_EQ(str(placement, "model"), str(*plan, "model"));
    EXPECT_EQ(str(placement, "reason"), str(*plan, "reason"));
    EXPECT_TRUE(wait_terminal(id));
    svc_.reset();
  }
}

// --- memory pressure: the CPU route, announced before the first token ----------------------------------------------

TEST_F(ServiceTest, ForeignLoadRoutesNewJobsToTheCpuAnnouncedBeforeTheirTokens) {
  // Without the evict rung: the idle replica stays (giving it back: test_service_residency.cc, PressureTest).
  cfg_.policy.ladder.order = ladder_without_evict();
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(4));
  sim_->set_foreign_bytes(8 * kGiB - 256 * kMiB);  // another program took almost all of the device
  Dict placement;
  const JobId id = submit_ok(alice_, request("squeezed"), &placement);
  EXPECT_EQ(str(placement, "route"), "cpu");
  EXPECT_EQ(str(placement, "action"), "route_cpu");
  EXPECT_EQ(str(placement, "reason"), "routed_cpu");
  EXPECT_THAT(str(placement, "detail"), HasSubstr("critical_pressure"));
  EXPECT_GT(u64(placement, "eta_ms"), 0u);
  EXPECT_TRUE(flag(placement, "degraded"));
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(phase(id), "completed");

  ASSERT_FALSE(rec_.degraded_events.empty());
  const auto& deg = rec_.degraded_events.front();
  EXPECT_TRUE(deg.degraded);
  EXPECT_EQ(deg.reason, "memory-critical");
  std::size_t routed_seq = SIZE_MAX, tokens_seq = SIZE_MAX;
  for (const auto& u : rec_.of(id)) {
    if (u.kind == "routed" && routed_seq == SIZE_MAX) {
      routed_seq = u.seq;
      EXPECT_EQ(str(u.data, "route"), "cpu");
      EXPECT_EQ(str(u.data, "reason"), "routed_cpu");
      EXPECT_TRUE(flag(u.data, "degraded"));
      EXPECT_EQ(u.data.count("eta_ms"), 1u);
    }
    if (u.kind == "tokens" && tokens_seq == SIZE_MAX) tokens_seq = u.seq;
  }
  ASSERT_NE(tokens_seq, SIZE_MAX);
  EXPECT_LT(deg.seq, tokens_seq);
  EXPECT_LT(routed_seq, tokens_seq);
  EXPECT_EQ(svc_->state(), "pressure");
  EXPECT_EQ(svc_->degraded_reason(), "memory-critical");
  const auto runs = backend_->runs_of(id);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].route.device, policy::Device::cpu);
  EXPECT_EQ(str(svc_->memory_view(), "pressure"), "critical");

  // The load goes away: the better state is announced only after it held for recover_after (10 s).
  sim_->set_foreign_bytes(0);
  svc_->tick();
  EXPECT_EQ(svc_->state(), "pressure");
  clock_->advance(11s);
  svc_->tick();
  EXPECT_EQ(svc_->state(), "normal");
  ASSERT_GE(rec_.degraded_events.size(), 2u);
  EXPECT_FALSE(rec_.degraded_events.back().degraded);
  Dict p2;
  const JobId again = submit_ok(alice_, request("room again"), &p2);
  EXPECT_EQ(str(p2, "route"), "gpu");
  EXPECT_TRUE(wait_terminal(again));
}

// --- failover ------------------------------------------------------------------------------------------------------

TEST_F(ServiceTest, GpuOutOfMemoryBeforeAnyTokenRetriesTheSameJobOnTheCpu) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_scripter(by_route(fail_after(Errc::out_of_memory, 0), emit(4)));
  const JobId id = submit_ok(alice_, request("oom"));
  ASSERT_TRUE(wait_terminal(id));
  const Dict j = job(id);
  EXPECT_EQ(str(j, "state"), "completed");
  EXPECT_EQ(u32(j, "attempts"), 2u);
  EXPECT_EQ(at<std::vector<std::string>>(j, "routes"), (std::vector<std::string>{"gpu", "cpu"}));
  EXPECT_EQ(str(j, "text"), FakeBackend::text_of(0, 4));
  EXPECT_EQ(rec_.count(id, "finished"), 1);
  EXPECT_EQ(rec_.count(id, "accepted"), 1);
  EXPECT_EQ(rec_.count(id, "started"), 2);
  EXPECT_EQ(rec_.streamed_text(id), FakeBackend::text_of(0, 4));
  const auto runs = backend_->runs_of(id);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].route.device, policy::Device::gpu);
  EXPECT_EQ(runs[1].route.device, policy::Device::cpu);
  EXPECT_EQ(runs[1].sampling.seed, runs[0].sampling.seed);
  EXPECT_EQ(runs[1].prompt, runs[0].prompt);
  EXPECT_TRUE(runs[1].resume_tokens.empty());
  auto c = svc_->counters();
  EXPECT_EQ(c["gpu_alloc_failures"], 1u);
  EXPECT_EQ(c["retries"], 1u);
  EXPECT_EQ(c["jobs_completed"], 1u);
  EXPECT_EQ(c["jobs_failed"], 0u);
  EXPECT_EQ(svc_->breaker_state(), "closed");  // 1 of 3 in the window

  // The breaker counts them: the third allocation failure in the window opens it.
  for (int i = 0; i < 2; ++i) {
    const JobId more = submit_ok(alice_, request("oom again"));
    ASSERT_TRUE(wait_terminal(more));
    EXPECT_EQ(phase(more), "completed");
  }
  EXPECT_EQ(svc_->breaker_state(), "open");
  EXPECT_EQ(svc_->state(), "degraded");
  EXPECT_EQ(svc_->degraded_reason(), "gpu-breaker-open");
  Dict placement;
  const JobId after = submit_ok(alice_, request("after"), &placement);
  EXPECT_EQ(str(placement, "route"), "cpu");
  EXPECT_THAT(str(placement, "detail"), HasSubstr("breaker_open"));
  ASSERT_TRUE(wait_terminal(after));
  EXPECT_EQ(backend_->runs_of(after).size(), 1u);
}

TEST_F(ServiceTest, DeviceLostMidGenerationMigratesAtTheCheckpoint) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_scripter(by_route(fail_after(Errc::device_lost, 3), emit(100)));
  const JobId id = submit_ok(alice_, request("migrate me"));
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(svc_->breaker_state(), "open");
  EXPECT_EQ(svc_->state(), "degraded");
  const Dict j = job(id);
  EXPECT_EQ(str(j, "state"), "completed");
  EXPECT_EQ(str(j, "finish_reason"), "max_tokens");
  EXPECT_EQ(at<std::vector<std::int32_t>>(j, "tokens"), FakeBackend::tokens_of(kSeed, 0, 8));
  EXPECT_EQ(str(j, "text"), FakeBackend::text_of(0, 8));
  EXPECT_EQ(u32(j, "attempts"), 2u);
  const auto runs = backend_->runs_of(id);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[1].route.device, policy::Device::cpu);
  EXPECT_EQ(runs[1].resume_tokens, FakeBackend::tokens_of(kSeed, 0, 3));
  EXPECT_EQ(runs[1].sampling.seed, kSeed);
  EXPECT_EQ(runs[1].prompt, runs[0].prompt);
  EXPECT_EQ(runs[1].max_new_tokens, runs[0].max_new_tokens);
  EXPECT_EQ(rec_.count(id, "migrated"), 1);
  EXPECT_EQ(rec_.count(id, "finished"), 1);
  for (const auto& u : rec_.of(id)) {
    if (u.kind != "migrated") continue;
    EXPECT_EQ(u32(u.data, "tokens_delivered"), 3u);
    EXPECT_EQ(str(u.data, "reason"), code(Errc::device_lost));
  }
  // The client saw every token exactly once, in order.
  EXPECT_EQ(rec_.streamed_tokens(id), FakeBackend::tokens_of(kSeed, 0, 8));
  EXPECT_EQ(rec_.streamed_text(id), FakeBackend::text_of(0, 8));
  auto c = svc_->counters();
  EXPECT_EQ(c["migrations"], 1u);
  EXPECT_EQ(c["gpu_device_lost"], 1u);
  EXPECT_FALSE(flag(svc_->memory_view(), "present"));
}

TEST_F(ServiceTest, DeviceLostWithSideEffectsFailsResumableWithoutMigrating) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_scripter(by_route(fail_after(Errc::device_lost, 3), emit(100)));
  SubmitRequest r = request("acts on tokens");
  r.options.side_effects = true;
  const JobId id = submit_ok(alice_, r);
  ASSERT_TRUE(wait_terminal(id));
  settle();
  const Dict j = job(id);
  EXPECT_EQ(str(j, "state"), "failed");
  EXPECT_EQ(str(j, "error_code"), code(Errc::resumable));
  EXPECT_EQ(str(j, "reason"), "side_effects");
  EXPECT_EQ(u32(j, "checkpoint_tokens"), 3u);
  EXPECT_EQ(u64(j, "checkpoint_seed"), kSeed);
  EXPECT_EQ(str(j, "checkpoint_model"), "tiny");
  EXPECT_EQ(at<std::vector<std::int32_t>>(j, "tokens"), FakeBackend::tokens_of(kSeed, 0, 3));
  EXPECT_GT(u64(j, "retry_after_ms"), 0u);
  EXPECT_TRUE(flag(j, "side_effects"));
  EXPECT_EQ(backend_->runs_of(id).size(), 1u);
  EXPECT_EQ(rec_.count(id, "migrated"), 0);
  ASSERT_EQ(rec_.count(id, "finished"), 1);
  const auto fin = rec_.of(id).back().data;
  EXPECT_EQ(str(fin, "error_code"), code(Errc::resumable));
  EXPECT_EQ(u32(fin, "tokens_total"), 3u);
  EXPECT_EQ(svc_->breaker_state(), "open");
}

// --- cancel and deadlines ------------------------------------------------------------------------------------------

TEST_F(ServiceTest, CancelWhileQueuedInTheCpuQueueNeverRuns) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_gpu_enabled(false);  // every job goes to the CPU queue (concurrency 1)
  backend_->set_scripter([](const RunSpec& s) { return s.job == 1 ? block_at(0) : emit(2); });
  const JobId first = submit_ok(alice_, request("first"));
  ASSERT_EQ(first, 1u);
  ASSERT_TRUE(wait_blocked(first));
  Dict placement;
  const JobId second = submit_ok(alice_, request("second"), &placement);
  EXPECT_EQ(str(placement, "state"), "queued");
  EXPECT_EQ(str(placement, "queue"), "cpu");
  EXPECT_EQ(u32(placement, "queue_position"), 1u);
  EXPECT_GT(u64(placement, "eta_ms"), 0u);
  EXPECT_EQ(svc_->queues_view()[1].depth, 1u);

  auto c = svc_->cancel(alice_, second);
  ASSERT_TRUE(c) << describe(c);
  EXPECT_EQ(*c, "cancelled");
  EXPECT_EQ(phase(second), "cancelled");
  EXPECT_EQ(svc_->queues_view()[1].depth, 0u);
  ASSERT_EQ(rec_.count(second, "finished"), 1);
  EXPECT_EQ(str(rec_.of(second).back().data, "state"), "cancelled");

  backend_->release(first);
  ASSERT_TRUE(wait_terminal(first));
  settle();
  EXPECT_EQ(phase(first), "completed");
  EXPECT_TRUE(backend_->runs_of(second).empty());
  EXPECT_EQ(rec_.count(second, "started"), 0);
  auto again = svc_->cancel(alice_, second);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, "cancelled");
}

// The first ETA is a measured figure: the per-route rates start from the default model's warm-up, not from the
// configured priors (1000 prefill / 20 decode tok/s in base_config's policy defaults).
TEST_F(ServiceTest, RatesMeasuredAtLoadGiveTheFirstEta) {
  backend_->set_gpu_enabled(false);  // the CPU queue
  // The first job of each round blocks (ids go on across the restart: 1, 2, then 3, 4).
  backend_->set_scripter([](const RunSpec& s) { return s.job % 2 == 1 ? block_at(0) : emit(2); });
  auto eta_of_second = [&]() {
    const JobId first = submit_ok(alice_, request("first", 40));
    EXPECT_TRUE(wait_blocked(first));
    Dict placement;
    const JobId second = submit_ok(alice_, request("second", 40), &placement);  // behind the first: its wait counts
    const std::uint64_t eta = u64(placement, "eta_ms");
    backend_->release(first);
    EXPECT_TRUE(wait_terminal(first));
    EXPECT_TRUE(wait_terminal(second));
    return eta;
  };
  ASSERT_NO_FATAL_FAILURE(start());
  const std::uint64_t from_priors = eta_of_second();
  // A CPU replica measured at 400 tok/s decode (8 steps of 2.5 ms) and 8000 tok/s prefill (32 tokens in 4 ms); a
  // warm-up of another model and one of the GPU route change nothing here.
  WarmupReport w;
  w.model = "tiny";
  w.route = policy::Device::cpu;
  w.prefill_tokens = 32;
  w.prefill_took = 4ms;
  w.decode_steps.assign(8, std::chrono::microseconds(2500));
  WarmupReport other = w;
  other.model = "small";
  other.decode_steps.assign(8, 500ms);
  backend_->warmups = {other, w};
  ASSERT_NO_FATAL_FAILURE(restart());
  const std::uint64_t measured = eta_of_second();
  // Two jobs of 40 new tokens one after the other at 400 tok/s: about 200 ms (the priors' 20 tok/s gave seconds).
  EXPECT_GE(from_priors, 3000u);
  EXPECT_GE(measured, 150u);
  EXPECT_LE(measured, 300u) << "from priors: " << from_priors;
}

// A job placed alone hears when a job placed after it moves its finish: an "eta" update with the new time left (a
// burst's first jobs cannot see the jobs placed after them; docs/policy.md §6, "Jobs that join later"). A job that
// only queues behind it changes nothing: no update.
TEST_F(ServiceTest, AJobHearsWhenAJobPlacedAfterItMovesItsFinish) {
  backend_->set_gpu_enabled(false);  // the CPU queue
  cfg_.policy.cpu_queue.concurrency = 2;
  WarmupReport w;
  w.model = "tiny";
  w.route = policy::Device::cpu;
  w.prefill_tokens = 32;
  w.prefill_took = 32ms;  // ~1 ms per prompt token
  w.decode_steps.assign(8, std::chrono::microseconds(2500));
  backend_->warmups = {w};
  backend_->set_scripter([](const RunSpec&) { return block_at(0); });
  ASSERT_NO_FATAL_FAILURE(start());
  Dict placed;
  const JobId a = submit_ok(alice_, request("first", 400), &placed);
  EXPECT_TRUE(wait_blocked(a));
  EXPECT_EQ(rec_.count(a, "eta"), 0);
  // A second sequence decoding beside a for all of a's 400 steps: ~3.4 ms a step instead of 2.5 (1.0 → 1.4 s).
  const JobId b = submit_ok(alice_, request("second", 400));
  settle();
  ASSERT_EQ(rec_.count(a, "eta"), 1);
  Dict eta;
  for (const auto& u : rec_.of(a))
    if (u.kind == "eta") eta = u.data;
  EXPECT_GT(u64(eta, "eta_ms"), u64(placed, "eta_ms") + 250) << "placed with " << u64(placed, "eta_ms");
  EXPECT_EQ(u64(eta, "previous_eta_ms"), u64(placed, "eta_ms"));
  EXPECT_TRUE(flag(eta, "eta_known"));
  EXPECT_EQ(str(eta, "queue"), "cpu");
  EXPECT_EQ(u32(eta, "queue_position"), 0u);
  EXPECT_EQ(rec_.count(b, "eta"), 0) << "b was placed knowing a";
  // Both slots are taken: c queues and joins only when one frees, after a and b: it moves neither.
  const JobId c = submit_ok(alice_, request("third", 2));
  settle();
  EXPECT_EQ(rec_.count(a, "eta"), 1);
  EXPECT_EQ(rec_.count(b, "eta"), 0);
  for (JobId id : {a, b, c}) backend_->release(id);
  for (JobId id : {a, b, c}) EXPECT_TRUE(wait_terminal(id));
  EXPECT_GE(svc_->counters()["eta_reannounced"], 1u);
}

// Priors are shown as such (docs/policy.md §6): until a route has a warm-up or an observed run, its placements say
// eta_known = false and the CPU route's expected slowdown is 0 (unknown), not a number made of the priors.
TEST_F(ServiceTest, EtaIsUnavailableUntilTheRouteIsMeasured) {
  backend_->set_gpu_enabled(false);  // the CPU queue
  backend_->set_script(emit(3));
  ASSERT_NO_FATAL_FAILURE(start());
  Dict first;
  const JobId a = submit_ok(alice_, request("first", 8), &first);
  EXPECT_EQ(str(first, "route"), "cpu");
  EXPECT_FALSE(flag(first, "eta_known")) << "nothing of the CPU route has run: the ETA is the priors' guess";
  EXPECT_EQ(at<double>(first, "expected_slowdown"), 0.0);
  for (const auto& u : rec_.of(a)) {
    if (u.kind == "routed") {
      EXPECT_FALSE(flag(u.data, "eta_known"));
    }
  }
  ASSERT_TRUE(wait_terminal(a));
  Dict second;
  const JobId b = submit_ok(alice_, request("second", 8), &second);
  EXPECT_TRUE(flag(second, "eta_known")) << "the first job's run was observed";
  EXPECT_EQ(at<double>(second, "expected_slowdown"), 0.0) << "the GPU route has not run: no factor";
  ASSERT_TRUE(wait_terminal(b));
  // With warm-ups of both routes the factor is a measured one.
  WarmupReport cpu;
  cpu.model = "tiny";
  cpu.route = policy::Device::cpu;
  cpu.prefill_tokens = 32;
  cpu.prefill_took = 4ms;
  cpu.decode_steps.assign(8, 10ms);  // 100 tok/s
  WarmupReport gpu = cpu;
  gpu.route = policy::Device::gpu;
  gpu.decode_steps.assign(8, 2ms);  // 500 tok/s
  backend_->warmups = {cpu, gpu};
  ASSERT_NO_FATAL_FAILURE(restart());
  Dict third;
  const JobId c = submit_ok(alice_, request("third", 8), &third);
  EXPECT_TRUE(flag(third, "eta_known"));
  EXPECT_NEAR(at<double>(third, "expected_slowdown"), 5.0, 0.01);
  ASSERT_TRUE(wait_terminal(c));
}

TEST_F(ServiceTest, CancelWhileRunningStopsTheRun) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(2, 10));
  const JobId id = submit_ok(alice_, request("long"));
  ASSERT_TRUE(wait_blocked(id));
  ASSERT_TRUE(pump_until([&] { return at<std::vector<std::int32_t>>(job(id), "tokens").size() == 2; }));
  auto c = svc_->cancel(alice_, id);
  ASSERT_TRUE(c) << describe(c);
  EXPECT_EQ(*c, "cancelling");
  ASSERT_TRUE(wait_terminal(id));
  const Dict j = job(id);
  EXPECT_EQ(str(j, "state"), "cancelled");
  EXPECT_EQ(at<std::vector<std::int32_t>>(j, "tokens").size(), 2u);
  EXPECT_EQ(rec_.count(id, "finished"), 1);
  EXPECT_EQ(svc_->breaker_state(), "closed");
  EXPECT_EQ(svc_->counters()["jobs_cancelled"], 1u);
  EXPECT_EQ(svc_->queues_view()[0].running, 0u);
}

TEST_F(ServiceTest, DeadlinePassingWhileQueuedFailsTheJobWithoutRunningIt) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_gpu_enabled(false);
  backend_->set_scripter([](const RunSpec& s) { return s.job == 1 ? block_at(0) : emit(2); });
  const JobId first = submit_ok(alice_, request("first"));
  ASSERT_TRUE(wait_blocked(first));
  SubmitRequest r = request("in a hurry");
  r.options.deadline_ms = 500;
  const JobId late = submit_ok(alice_, r);
  EXPECT_EQ(phase(late), "queued");
  clock_->advance(400ms);
  svc_->tick();
  EXPECT_EQ(phase(late), "queued");
  clock_->advance(200ms);
  ASSERT_TRUE(pump_until([&] { return terminal(late); }, /*tick=*/true));
  const Dict j = job(late);
  EXPECT_EQ(str(j, "state"), "failed");
  EXPECT_EQ(str(j, "reason"), "deadline");
  EXPECT_EQ(str(j, "error_code"), code(Errc::timeout));
  EXPECT_EQ(rec_.count(late, "finished"), 1);
  backend_->release(first);
  ASSERT_TRUE(wait_terminal(first));
  settle();
  EXPECT_TRUE(backend_->runs_of(late).empty());
}

TEST_F(ServiceTest, DeadlinePassingWhileRunningStopsTheRunWithItsTokens) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(2, 10));
  SubmitRequest r = request("slow");
  r.options.deadline_ms = 1000;
  const JobId id = submit_ok(alice_, r);
  ASSERT_TRUE(wait_blocked(id));
  ASSERT_TRUE(pump_until([&] { return at<std::vector<std::int32_t>>(job(id), "tokens").size() == 2; }));
  clock_->advance(2s);
  ASSERT_TRUE(wait_terminal(id, /*tick=*/true));
  const Dict j = job(id);
  EXPECT_EQ(str(j, "state"), "failed");
  EXPECT_EQ(str(j, "reason"), "deadline");
  EXPECT_EQ(str(j, "error_code"), code(Errc::timeout));
  EXPECT_EQ(u32(j, "checkpoint_tokens"), 2u);
}

// --- idempotency and resume ----------------------------------------------------------------------------------------

TEST_F(ServiceTest, IdempotencyKeyReturnsTheSameJobAndNeverRunsItTwice) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(3));
  SubmitRequest r = request("once");
  r.options.idempotency_key = "key-1";
  const JobId id = submit_ok(alice_, r);
  ASSERT_TRUE(wait_terminal(id));
  Dict again;
  EXPECT_EQ(submit_ok(alice_, r, &again), id);
  EXPECT_TRUE(flag(again, "existing"));
  EXPECT_EQ(str(again, "state"), "completed");
  settle();
  EXPECT_EQ(backend_->runs().size(), 1u);
  EXPECT_EQ(svc_->counters()["jobs_accepted"], 1u);

  // While the job still runs, too.
  backend_->set_script(block_at(1));
  SubmitRequest r2 = request("while running");
  r2.options.idempotency_key = "key-2";
  const JobId running = submit_ok(alice_, r2);
  ASSERT_TRUE(wait_blocked(running));
  Dict dup;
  EXPECT_EQ(submit_ok(alice_, r2, &dup), running);
  EXPECT_TRUE(flag(dup, "existing"));
  backend_->release(running);
  ASSERT_TRUE(wait_terminal(running));
  settle();
  EXPECT_EQ(backend_->runs_of(running).size(), 1u);
  EXPECT_EQ(rec_.count(running, "accepted"), 1);
}

TEST_F(ServiceTest, IdempotencyKeyWithAnotherRequestIsDuplicate) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(2));
  SubmitRequest r = request("original");
  r.options.idempotency_key = "key-d";
  const JobId id = submit_ok(alice_, r);
  ASSERT_TRUE(wait_terminal(id));
  SubmitRequest other = request("something else");
  other.options.idempotency_key = "key-d";
  auto res = svc_->submit(alice_, other);
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code, Errc::duplicate);
  EXPECT_THAT(res.error().message, HasSubstr(std::to_string(id)));
  EXPECT_EQ(svc_->counters()["jobs_accepted"], 1u);
}

TEST_F(ServiceTest, IdempotencyKeyOfAFailedJobAsksForResume) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_scripter(by_route(fail_after(Errc::device_lost, 2), emit(100)));
  SubmitRequest r = request("fragile");
  r.options.idempotency_key = "key-f";
  r.options.side_effects = true;
  const JobId id = submit_ok(alice_, r);
  ASSERT_TRUE(wait_terminal(id));
  ASSERT_EQ(phase(id), "failed");
  auto res = svc_->submit(alice_, r);
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code, Errc::resumable);
  EXPECT_THAT(res.error().message, HasSubstr("job=" + std::to_string(id)));
  EXPECT_THAT(res.error().message, HasSubstr("tokens=2"));
  EXPECT_EQ(backend_->runs().size(), 1u);
}

TEST_F(ServiceTest, ResumeContinuesFromTheCheckpointWithTheSameSeed) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_scripter(by_route(fail_after(Errc::device_lost, 3), emit(100)));
  SubmitRequest r = request("resume me");
  r.options.side_effects = true;
  r.options.idempotency_key = "key-r";
  r.options.temperature = 0.7;
  const JobId id = submit_ok(alice_, r);
  ASSERT_TRUE(wait_terminal(id));
  ASSERT_EQ(phase(id), "failed");

  auto denied = svc_->resume(bob_, id, {});
  ASSERT_FALSE(denied);
  EXPECT_EQ(denied.error().code, Errc::permission_denied);

  auto res = svc_->resume(alice_, id, {});
  ASSERT_TRUE(res) << describe(res);
  const JobId next = u64(*res, "job_id");
  EXPECT_NE(next, id);
  EXPECT_EQ(str(*res, "route"), "cpu");  // the breaker is open
  ASSERT_TRUE(wait_terminal(next));
  const auto runs = backend_->runs_of(next);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].resume_tokens, FakeBackend::tokens_of(kSeed, 0, 3));
  EXPECT_EQ(runs[0].sampling.seed, kSeed);
  EXPECT_DOUBLE_EQ(runs[0].sampling.temperature, 0.7);
  EXPECT_EQ(runs[0].prompt, backend_->runs_of(id)[0].prompt);
  const Dict j = job(next);
  EXPECT_EQ(str(j, "state"), "completed");
  EXPECT_EQ(at<std::vector<std::int32_t>>(j, "tokens"), FakeBackend::tokens_of(kSeed, 0, 8));
  EXPECT_EQ(str(j, "text"), FakeBackend::text_of(3, 8));
  EXPECT_EQ(svc_->counters()["jobs_resumed"], 1u);

  // The key now names the resumed job; the old one stays failed and cannot be resumed twice into a second run.
  Dict placement;
  EXPECT_EQ(submit_ok(alice_, r, &placement), next);
  EXPECT_TRUE(flag(placement, "existing"));
  auto twice = svc_->resume(alice_, next, {});
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.error().code, Errc::illegal_transition);
}

TEST_F(ServiceTest, ResumingTheSameFailedJobTwiceUnderAKeyRunsOnce) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_scripter(by_route(fail_after(Errc::device_lost, 2), block_at(0)));
  SubmitRequest r = request("resume twice");
  r.options.side_effects = true;
  r.options.idempotency_key = "key-twice";
  const JobId id = submit_ok(alice_, r);
  ASSERT_TRUE(wait_terminal(id));
  ASSERT_EQ(phase(id), "failed");
  auto first = svc_->resume(alice_, id, {});
  ASSERT_TRUE(first) << describe(first);
  const JobId resumed = u64(*first, "job_id");
  ASSERT_TRUE(wait_blocked(resumed));
  // The old job is still failed, but its key now names the resumed job: a second Resume must not start another run.
  auto second = svc_->resume(alice_, id, {});
  if (second) {
    EXPECT_EQ(u64(*second, "job_id"), resumed);
    EXPECT_TRUE(flag(*second, "existing"));
  }
  backend_->release_all();
  ASSERT_TRUE(wait_terminal(resumed));
  settle();
  EXPECT_EQ(backend_->runs().size(), 2u);  // the failed GPU run and one resumed run
  EXPECT_EQ(svc_->counters()["jobs_accepted"], 2u);
}

TEST_F(ServiceTest, IdempotencyKeyOfAPrunedJobNeverRunsAgain) {
  cfg_.journal.max_jobs = 1;  // the service keeps max_jobs + 64 finished jobs in memory
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(1));
  SubmitRequest keyed = request("keyed");
  keyed.options.idempotency_key = "key-old";
  const JobId first = submit_ok(alice_, keyed);
  ASSERT_TRUE(wait_terminal(first));
  for (int i = 0; i < 70; ++i) {
    const JobId id = submit_ok(alice_, request("filler " + std::to_string(i)));
    ASSERT_TRUE(wait_terminal(id));
  }
  svc_->tick();  // prunes the oldest finished jobs
  const auto runs = backend_->runs().size();
  auto again = svc_->submit(alice_, keyed);
  if (again) {
    EXPECT_EQ(u64(*again, "job_id"), first);
    EXPECT_TRUE(flag(*again, "existing"));
  } else {
    EXPECT_EQ(again.error().code, Errc::duplicate) << again.error().message;
  }
  settle();
  EXPECT_EQ(backend_->runs().size(), runs);  // never a second run under one key
}

TEST_F(ServiceTest, HostMemoryOfRunningCpuJobsSurvivesAPolicyChange) {
  ASSERT_NO_FATAL_FAILURE(start());
  // A CPU job that got there by failing over from the GPU (its admission decision had no host estimate).
  backend_->set_scripter(by_route(fail_after(Errc::out_of_memory, 0), block_at(0)));
  const JobId id = submit_ok(alice_, request("failed over"));
  ASSERT_TRUE(wait_blocked(id));
  const auto used = u64(svc_->host_memory_view(), "used");
  EXPECT_GT(used, 0u);
  ASSERT_TRUE(svc_->set_policy(admin_, Dict{{"margin_bytes", std::uint64_t{256 * kMiB}}}));
  EXPECT_EQ(u64(svc_->host_memory_view(), "used"), used);
  backend_->release_all();
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(u64(svc_->host_memory_view(), "used"), 0u);
}

}  // namespace
}  // namespace tandem::daemon
