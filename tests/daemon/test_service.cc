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

// --- GPU holds -----------------------------------------------------------------------------------------------------

TEST_F(ServiceTest, HoldGpuSendsNewJobsToTheCpuUntilTheHolderLeaves) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(2));
  auto denied = svc_->hold_gpu(alice_, "mine", "org.alice");
  ASSERT_FALSE(denied);
  EXPECT_EQ(denied.error().code, Errc::permission_denied);

  auto cookie = svc_->hold_gpu(admin_, "playing a game", "org.game");
  ASSERT_TRUE(cookie) << describe(cookie);
  EXPECT_EQ(svc_->state(), "degraded");
  EXPECT_EQ(svc_->degraded_reason(), "gpu-held");
  ASSERT_EQ(svc_->holds_view().size(), 1u);
  EXPECT_EQ(svc_->holds_view()[0].app_id, "org.game");
  ASSERT_FALSE(rec_.degraded_events.empty());
  EXPECT_EQ(rec_.degraded_events.back().reason, "gpu-held");
  svc_->flush_changes();
  EXPECT_TRUE(rec_.property_changed("Holds"));
  EXPECT_TRUE(rec_.property_changed("State"));

  Dict placement;
  const JobId id = submit_ok(alice_, request("held"), &placement);
  EXPECT_EQ(str(placement, "route"), "cpu");
  EXPECT_TRUE(flag(placement, "degraded"));
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(backend_->runs_of(id).at(0).route.device, policy::Device::cpu);

  const Caller other_admin{":1.77", 1000, true, true, ""};
  for (const Caller* c : {&alice_, &other_admin}) {
    auto st = svc_->release_gpu(*c, *cookie);
    ASSERT_FALSE(st);
    EXPECT_EQ(st.error().code, Errc::permission_denied);
  }
  auto unknown = svc_->release_gpu(admin_, "hold-nope");
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, Errc::not_found);
  EXPECT_EQ(svc_->holds_view().size(), 1u);

  svc_->client_vanished(admin_.bus_name);
  EXPECT_TRUE(svc_->holds_view().empty());
  Dict p2;
  const JobId back = submit_ok(alice_, request("released"), &p2);
  EXPECT_EQ(str(p2, "route"), "gpu");
  ASSERT_TRUE(wait_terminal(back));

  // Released by its holder.
  auto c2 = svc_->hold_gpu(admin_, "again", "org.game");
  ASSERT_TRUE(c2);
  EXPECT_TRUE(svc_->release_gpu(admin_, *c2));
  EXPECT_TRUE(svc_->holds_view().empty());
}

// --- policy --------------------------------------------------------------------------------------------------------

TEST_F(ServiceTest, SetPolicyChecksTheCallerAndEveryValue) {
  ASSERT_NO_FATAL_FAILURE(start());
  auto denied = svc_->set_policy(alice_, Dict{{"margin_bytes", std::uint64_t{256 * kMiB}}});
  ASSERT_FALSE(denied);
  EXPECT_EQ(denied.error().code, Errc::permission_denied);

  struct Case {
    const char* name;
    Dict changes;
    const char* key_in_message;
  };
  const std::vector<Case> bad = {
      {"fraction out of range", {{"margin_fraction", 0.9}}, "margin_fraction"},
      {"wrong type", {{"margin_bytes", std::string("lots")}}, "margin_bytes"},
      {"delay too long", {{"max_delay_ms", std::uint64_t{4000000}}}, "max_delay_ms"},
      {"unknown rung", {{"ladder_order", std::vector<std::string>{"admit", "bogus", "reject"}}}, "ladder_order"},
      {"ladder without reject", {{"ladder_order", std::vector<std::string>{"admit", "delay"}}}, "ladder_order"},
      {"budget too small", {{"host_budget_bytes", std::uint64_t{kMiB}}}, "host_budget_bytes"},
      {"read-only key", {{"gpu_concurrency", std::uint32_t{8}}}, "gpu_concurrency"},
  };
  const Dict before = svc_->policy_view();
  for (const auto& c : bad) {
    SCOPED_TRACE(c.name);
    auto st = svc_->set_policy(admin_, c.changes);
    ASSERT_FALSE(st);
    EXPECT_EQ(st.error().code, Errc::invalid_argument);
    EXPECT_THAT(st.error().message, HasSubstr(c.key_in_message));
    EXPECT_EQ(svc_->policy_view(), before);
  }

  auto ok = svc_->set_policy(admin_, Dict{{"margin_bytes", std::uint64_t{256 * kMiB}}, {"allow_migration", false}});
  ASSERT_TRUE(ok) << describe(ok);
  EXPECT_EQ(u64(svc_->policy_view(), "margin_bytes"), 256 * kMiB);
  EXPECT_FALSE(flag(svc_->policy_view(), "allow_migration"));
  svc_->flush_changes();
  EXPECT_TRUE(rec_.property_changed("Policy"));

  // It applies: with migration off, a device loss mid-generation ends resumable instead of migrating.
  backend_->set_scripter(by_route(fail_after(Errc::device_lost, 2), emit(100)));
  const JobId id = submit_ok(alice_, request("no migration"));
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(phase(id), "failed");
  EXPECT_EQ(str(job(id), "reason"), "migration_disabled");
  EXPECT_EQ(backend_->runs_of(id).size(), 1u);
}

// --- breaker -------------------------------------------------------------------------------------------------------

TEST_F(ServiceTest, BreakerHalfOpenProbeClosesItAgainAfterRecovery) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_scripter(by_route(fail_after(Errc::device_lost, 1), emit(100)));
  const JobId id = submit_ok(alice_, request("lost"));
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(phase(id), "completed");
  ASSERT_EQ(svc_->breaker_state(), "open");
  EXPECT_EQ(backend_->reloads(), 0);

  // Still lost when the cooldown ends: the half-open probe fails and the breaker reopens with a longer cooldown.
  clock_->advance(11s);
  ASSERT_TRUE(pump_until([&] { return svc_->counters()["probes_failed"] >= 1; }, /*tick=*/true));
  EXPECT_EQ(svc_->breaker_state(), "open");
  EXPECT_EQ(backend_->reloads(), 0);

  sim_->recover();
  clock_->advance(11s);  // less than the doubled cooldown (20 s)
  svc_->tick();
  settle();
  EXPECT_EQ(svc_->breaker_state(), "open");
  clock_->advance(10s);
  ASSERT_TRUE(pump_until([&] { return svc_->breaker_state() == "closed" && backend_->reloads() >= 1; },
                         /*tick=*/true));
  ASSERT_TRUE(pump_until([&] { return flag(svc_->memory_view(), "present"); }, /*tick=*/true));
  EXPECT_GE(svc_->counters()["probes"], 2u);
  EXPECT_EQ(backend_->reloads(), 1);

  backend_->set_script(emit(2));
  Dict placement;
  const JobId after = submit_ok(alice_, request("back on gpu"), &placement);
  EXPECT_EQ(str(placement, "route"), "gpu");
  ASSERT_TRUE(wait_terminal(after));
  EXPECT_EQ(backend_->runs_of(after).at(0).route.device, policy::Device::gpu);
  // Normal again once the better state held for recover_after.
  clock_->advance(11s);
  ASSERT_TRUE(pump_until([&] { return svc_->state() == "normal"; }, /*tick=*/true));
}

// --- restart -------------------------------------------------------------------------------------------------------

TEST_F(ServiceTest, RestartKeepsEveryAcceptedJobReadableInATerminalState) {
  cfg_.policy.gpu_queue.concurrency = 1;
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_scripter([](const RunSpec& s) {
    if (s.job == 1) return emit(3);
    if (s.job == 2) return block_at(36, 60);
    return emit(4);
  });
  SubmitRequest done = request("done before the restart");
  done.options.idempotency_key = "key-done";
  const JobId j1 = submit_ok(alice_, done);
  ASSERT_TRUE(wait_terminal(j1));
  SubmitRequest hot = request("in flight", 60);
  hot.options.temperature = 0.7;
  hot.options.top_k = 40;
  hot.options.idempotency_key = "key-hot";
  const JobId j2 = submit_ok(alice_, hot);
  ASSERT_TRUE(wait_blocked(j2));
  ASSERT_TRUE(pump_until([&] { return at<std::vector<std::int32_t>>(job(j2), "tokens").size() == 36; }));
  Dict queued;
  const JobId j3 = submit_ok(bob_, request("waiting"), &queued);
  EXPECT_EQ(str(queued, "state"), "queued");
  EXPECT_EQ(str(queued, "queue"), "gpu");

  // The old service is destroyed with j2 running and j3 queued (a crash, as far as those jobs know).
  ASSERT_NO_FATAL_FAILURE(restart());
  EXPECT_EQ(svc_->replay_stats().recovered_nonterminal, 2u);
  EXPECT_EQ(svc_->counters()["jobs_recovered_failed"], 2u);
  const Dict r1 = job(j1);
  EXPECT_EQ(str(r1, "state"), "completed");
  EXPECT_EQ(str(r1, "text"), FakeBackend::text_of(0, 3));
  const Dict r2 = job(j2);
  EXPECT_EQ(str(r2, "state"), "failed");
  EXPECT_EQ(str(r2, "reason"), "daemon_restart");
  EXPECT_EQ(str(r2, "error_code"), code(Errc::resumable));
  EXPECT_EQ(u32(r2, "checkpoint_tokens"), 32u);  // checkpoints ride along every 32 tokens
  EXPECT_EQ(at<std::vector<std::int32_t>>(r2, "tokens"), FakeBackend::tokens_of(kSeed, 0, 32));
  const Dict r3 = job(j3);
  EXPECT_EQ(str(r3, "state"), "failed");
  EXPECT_EQ(str(r3, "reason"), "daemon_restart");
  EXPECT_EQ(u32(r3, "checkpoint_tokens"), 0u);
  auto foreign = svc_->get_job(bob_, j2);
  ASSERT_FALSE(foreign);
  EXPECT_EQ(foreign.error().code, Errc::permission_denied);

  // Keys resolve to their jobs.
  Dict same;
  EXPECT_EQ(submit_ok(alice_, done, &same), j1);
  EXPECT_TRUE(flag(same, "existing"));
  auto hot_again = svc_->submit(alice_, hot);
  ASSERT_FALSE(hot_again);
  EXPECT_EQ(hot_again.error().code, Errc::resumable);

  // New ids continue after the old ones; the interrupted job resumes with its sampling parameters.
  auto resumed = svc_->resume(alice_, j2, {});
  ASSERT_TRUE(resumed) << describe(resumed);
  const JobId j4 = u64(*resumed, "job_id");
  EXPECT_GT(j4, j3);
  ASSERT_TRUE(wait_terminal(j4));
  const auto runs = backend_->runs_of(j4);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].resume_tokens, FakeBackend::tokens_of(kSeed, 0, 32));
  EXPECT_EQ(runs[0].sampling.seed, kSeed);
  EXPECT_DOUBLE_EQ(runs[0].sampling.temperature, 0.7);
  EXPECT_EQ(runs[0].sampling.top_k, 40);
  EXPECT_EQ(runs[0].max_new_tokens, 60u);
  EXPECT_EQ(phase(j4), "completed");

  ASSERT_NO_FATAL_FAILURE(restart());  // nothing in flight now: nothing to recover, everything still readable
  EXPECT_EQ(svc_->replay_stats().recovered_nonterminal, 0u);
  for (JobId id : {j1, j2, j3, j4}) EXPECT_TRUE(terminal(id)) << id;
  EXPECT_EQ(phase(j4), "completed");
}

TEST_F(ServiceTest, RestartRecoversInFlightJobsWhenTheJournalCompactsOnTheFirstOutcome) {
  // max_jobs 4: a journal holding more than 6 jobs compacts at its first append after opening, which is the outcome
  // of the first job recovered as failed — while the service still walks the replayed jobs.
  cfg_.journal.max_jobs = 4;
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(1, 4));
  std::vector<JobId> ids;
  for (int i = 0; i < 7; ++i) ids.push_back(submit_ok(alice_, request("job " + std::to_string(i))));
  ASSERT_TRUE(pump_until([&] { return backend_->blocked() == 4; }));
  ASSERT_NO_FATAL_FAILURE(restart());
  EXPECT_EQ(svc_->replay_stats().recovered_nonterminal, 7u);
  for (JobId id : ids) {
    SCOPED_TRACE(id);
    const Dict j = job(id);
    EXPECT_EQ(str(j, "state"), "failed");
    EXPECT_EQ(str(j, "reason"), "daemon_restart");
  }
  const JobId next = submit_ok(alice_, request("after"));
  EXPECT_GT(next, ids.back());
  backend_->release_all();
  EXPECT_TRUE(wait_terminal(next));
  // Recovery did compact the journal (dropping the one job finished at that moment) while walking the replay.
  svc_.reset();
  JobJournal::Options o;
  o.dir = dir_.path();
  o.fsync = false;
  o.max_jobs = 4;
  auto journal = JobJournal::open(o);
  ASSERT_TRUE(journal) << describe(journal);
  EXPECT_EQ((*journal)->jobs().count(ids.front()), 0u);
  EXPECT_EQ((*journal)->jobs().count(ids.back()), 1u);
}

// --- malformed requests --------------------------------------------------------------------------------------------

TEST_F(ServiceTest, MalformedRequestsAreRefusedAndTheServiceKeepsServing) {
  cfg_.runtime.max_prompt_bytes = 256;
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(2));
  struct Case {
    const char* name;
    std::function<void(SubmitRequest&)> edit;
    Errc code;
    const char* message;
  };
  auto msgs = [](std::size_t n) {
    std::vector<gen::Message> v;
    for (std::size_t i = 0; i < n; ++i) v.push_back({"user", "m" + std::to_string(i)});
    return v;
  };
  const std::vector<Case> cases = {
      {"bad role", [](SubmitRequest& r) { r.prompt.clear(); r.messages = {{"robot", "hi"}}; }, Errc::invalid_argument,
       "role"},
      {"invalid utf-8 prompt", [](SubmitRequest& r) { r.prompt = "ok \xff\xfe"; }, Errc::invalid_argument, "UTF-8"},
      {"overlong utf-8", [](SubmitRequest& r) { r.prompt = "\xc0\xaf"; }, Errc::invalid_argument, "UTF-8"},
      {"invalid utf-8 message", [](SubmitRequest& r) { r.prompt.clear(); r.messages = {{"user", "\xed\xa0"}}; },
       Errc::invalid_argument, "UTF-8"},
      {"too many messages", [&](SubmitRequest& r) { r.prompt.clear(); r.messages = msgs(9); }, Errc::invalid_argument,
       "at most 8 messages"},
      {"prompt and messages", [&](SubmitRequest& r) { r.messages = msgs(1); }, Errc::invalid_argument, "either"},
      {"empty", [](SubmitRequest& r) { r.prompt.clear(); }, Errc::invalid_argument, "empty"},
      {"prompt too long", [](SubmitRequest& r) { r.prompt = std::string(300, 'x'); }, Errc::invalid_argument,
       "at most 256 bytes"},
      {"max_tokens 0", [](SubmitRequest& r) { r.options.max_tokens = 0u; }, Errc::invalid_argument, "max_tokens"},
      {"max_tokens past the context", [](SubmitRequest& r) { r.options.max_tokens = 100000u; },
       Errc::invalid_argument, "max_tokens"},
      {"prompt + max_tokens past the context", [](SubmitRequest& r) { r.options.max_tokens = 505u; },
       Errc::invalid_argument, "context"},
      {"unknown model", [](SubmitRequest& r) { r.model = "nope"; }, Errc::not_found, "nope"},
      {"stop string too long",
       [](SubmitRequest& r) { r.options.stop = std::vector<std::string>{std::string(257, 's')}; },
       Errc::invalid_argument, "stop"},
      {"empty stop string", [](SubmitRequest& r) { r.options.stop = std::vector<std::string>{""}; },
       Errc::invalid_argument, "stop"},
      {"too many stop strings", [](SubmitRequest& r) { r.options.stop = std::vector<std::string>(17, "x"); },
       Errc::invalid_argument, "stop"},
      {"resume token past the vocabulary", [](SubmitRequest& r) { r.options.resume_tokens = std::vector<int>{5, 512}; },
       Errc::invalid_argument, "vocabulary"},
      {"negative resume token", [](SubmitRequest& r) { r.options.resume_tokens = std::vector<int>{-1}; },
       Errc::invalid_argument, "vocabulary"},
      {"more resume tokens than max_tokens",
       [](SubmitRequest& r) { r.options.resume_tokens = std::vector<int>(9, 7); }, Errc::invalid_argument,
       "resume_tokens"},
      {"temperature", [](SubmitRequest& r) { r.options.temperature = -1.0; }, Errc::invalid_argument, "temperature"},
      {"top_p", [](SubmitRequest& r) { r.options.top_p = 0.0; }, Errc::invalid_argument, "top_p"},
      {"deadline 0", [](SubmitRequest& r) { r.options.deadline_ms = std::uint64_t{0}; }, Errc::invalid_argument,
       "deadline_ms"},
      {"empty idempotency key", [](SubmitRequest& r) { r.options.idempotency_key = std::string(); },
       Errc::invalid_argument, "idempotency_key"},
      {"prefill chunk", [](SubmitRequest& r) { r.options.prefill_chunk = 100000u; }, Errc::invalid_argument,
       "prefill_chunk"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    SubmitRequest r = request("valid prompt");
    c.edit(r);
    auto res = svc_->submit(alice_, r);
    ASSERT_FALSE(res);
    EXPECT_EQ(res.error().code, c.code) << res.error().message;
    EXPECT_THAT(res.error().message, HasSubstr(c.message));
    auto plan = svc_->plan(alice_, r);
    ASSERT_FALSE(plan);
    EXPECT_EQ(plan.error().code, c.code);
  }
  const Caller stranger{":1.99", 4242, false, false, ""};
  auto res = svc_->submit(stranger, request());
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code, Errc::permission_denied);

  EXPECT_EQ(svc_->counters()["jobs_accepted"], 0u);
  EXPECT_TRUE(rec_.updates.empty());
  EXPECT_TRUE(backend_->runs().empty());
  // Still serving.
  SubmitRequest chat;
  chat.messages = {{"system", "be brief"}, {"user", "hi"}};
  chat.options.max_tokens = 4u;
  const JobId id = submit_ok(alice_, chat);
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(phase(id), "completed");
  const auto runs = backend_->runs_of(id);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_THAT(runs[0].stop, ::testing::Contains("</s>"));  // the template's stop strings for chat requests
}

// --- shutdown ------------------------------------------------------------------------------------------------------

TEST_F(ServiceTest, DrainFailsQueuedJobsResumableAndRefusesNewOnes) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_gpu_enabled(false);
  backend_->set_scripter([](const RunSpec& s) { return s.job == 1 ? block_at(1) : emit(2); });
  const JobId running = submit_ok(alice_, request("running"));
  ASSERT_TRUE(wait_blocked(running));
  const JobId queued = submit_ok(alice_, request("queued"));
  EXPECT_EQ(phase(queued), "queued");

  svc_->begin_drain();
  const Dict q = job(queued);
  EXPECT_EQ(str(q, "state"), "failed");
  EXPECT_EQ(str(q, "reason"), "daemon_stopping");
  EXPECT_EQ(str(q, "error_code"), code(Errc::resumable));
  EXPECT_EQ(rec_.count(queued, "finished"), 1);
  EXPECT_EQ(phase(running), "running");
  EXPECT_FALSE(svc_->drained());
  auto refused = svc_->submit(alice_, request("too late"));
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, Errc::unavailable);
  EXPECT_THAT(svc_->status_line(), HasSubstr("draining"));

  backend_->release(running);
  ASSERT_TRUE(wait_terminal(running));
  EXPECT_EQ(phase(running), "completed");
  EXPECT_TRUE(svc_->drained());
  settle();
  EXPECT_TRUE(backend_->runs_of(queued).empty());
}

TEST_F(ServiceTest, AbortRunningEndsRunningJobsResumableWithTheirCheckpoint) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(3, 10));
  const JobId id = submit_ok(alice_, request("interrupted"));
  ASSERT_TRUE(wait_blocked(id));
  svc_->begin_drain();
  svc_->abort_running();
  ASSERT_TRUE(pump_until([&] { return svc_->drained(); }));
  const Dict j = job(id);
  EXPECT_EQ(str(j, "state"), "failed");
  EXPECT_EQ(str(j, "reason"), "daemon_stopping");
  EXPECT_EQ(str(j, "error_code"), code(Errc::resumable));
  EXPECT_EQ(u32(j, "checkpoint_tokens"), 3u);
  // The checkpoint is durable: a new service reads it.
  ASSERT_NO_FATAL_FAILURE(restart());
  EXPECT_EQ(u32(job(id), "checkpoint_tokens"), 3u);
}

// --- ownership -----------------------------------------------------------------------------------------------------

TEST_F(ServiceTest, OtherUsersCannotReadOrCancelAJob) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(0));
  const JobId id = submit_ok(alice_, request("private"));
  ASSERT_TRUE(wait_blocked(id));
  auto read = svc_->get_job(bob_, id);
  ASSERT_FALSE(read);
  EXPECT_EQ(read.error().code, Errc::permission_denied);
  auto cancel = svc_->cancel(bob_, id);
  ASSERT_FALSE(cancel);
  EXPECT_EQ(cancel.error().code, Errc::permission_denied);
  EXPECT_EQ(phase(id), "running");
  EXPECT_TRUE(svc_->get_job(alice2_, id));
  EXPECT_TRUE(svc_->get_job(admin_, id));
  auto mine = svc_->cancel(alice2_, id);  // the same user from another connection may
  ASSERT_TRUE(mine) << describe(mine);
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(phase(id), "cancelled");
}

TEST_F(ServiceTest, AVanishedClientsJobsStillFinishAndStayReadable) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(1, 3));
  const JobId id = submit_ok(alice_, request("orphan"));
  ASSERT_TRUE(wait_blocked(id));
  const auto before = rec_.updates.size();
  svc_->client_vanished(alice_.bus_name);
  backend_->release(id);
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(phase(id), "completed");
  EXPECT_EQ(rec_.updates.size(), before);  // nobody to send them to
  auto j = svc_->get_job(alice2_, id);
  ASSERT_TRUE(j);
  EXPECT_EQ(str(*j, "text"), FakeBackend::text_of(0, 3));
}

TEST_F(ServiceTest, UnfinishedJobsPerClientAreBounded) {
  cfg_.runtime.max_jobs_per_client = 2;
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(0));
  const JobId a = submit_ok(alice_, request("a"));
  const JobId b = submit_ok(alice_, request("b"));
  auto c = svc_->submit(alice_, request("c"));
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, Errc::queue_full);
  EXPECT_TRUE(svc_->submit(bob_, request("bob's")));  // per bus name
  backend_->release_all();
  ASSERT_TRUE(wait_terminal(a));
  ASSERT_TRUE(wait_terminal(b));
  EXPECT_TRUE(svc_->submit(alice_, request("c")));
}

// --- fallback model ------------------------------------------------------------------------------------------------

TEST_F(ServiceTest, FallbackModelServesOnTheCpuOnlyWhenTheClientAllowsIt) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(2));
  backend_->set_gpu_enabled(false);
  backend_->set_cpu_ready("tiny", false);
  auto refused = svc_->submit(alice_, request("strict"));
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().code, Errc::internal);

  SubmitRequest r = request("any model will do");
  r.options.allow_fallback_model = true;
  Dict placement;
  const JobId id = submit_ok(alice_, r, &placement);
  EXPECT_EQ(str(placement, "route"), "cpu");
  EXPECT_EQ(str(placement, "model"), "small");
  EXPECT_TRUE(flag(placement, "fallback_model"));
  EXPECT_EQ(str(placement, "fingerprint"), "fp-small");
  EXPECT_EQ(str(placement, "reason"), "routed_fallback");
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(phase(id), "completed");
  const auto runs = backend_->runs_of(id);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].route.model, "small");
  EXPECT_TRUE(runs[0].route.fallback_model);
  EXPECT_THAT(backend_->encoded_for(), ::testing::Contains("small"));
  EXPECT_EQ(at<std::vector<std::string>>(job(id), "routes"), std::vector<std::string>{"cpu(small)"});
}

// --- idle: the loop's timer slows down when there is nothing to watch; admission still reads afresh ---------------

TEST_F(ServiceTest, PollIntervalIsTheIdleOneOnlyWhileThereIsNothingToWatch) {
  cfg_.device.poll_interval = 250ms;
  cfg_.device.idle_poll_interval = 2000ms;
  ASSERT_NO_FATAL_FAILURE(start());
  svc_->tick();  // the first routine probe goes out; idle again once it is back
  ASSERT_TRUE(pump_until([&] { return svc_->idle(); }));
  EXPECT_EQ(svc_->poll_interval(), std::chrono::duration_cast<Clock::duration>(2000ms));

  // A queued, then running job: the normal interval until it ended.
  backend_->set_script(block_at(1));
  const JobId id = submit_ok(alice_, request("busy"));
  EXPECT_FALSE(svc_->idle());
  EXPECT_EQ(svc_->poll_interval(), std::chrono::duration_cast<Clock::duration>(250ms));
  ASSERT_TRUE(wait_blocked(id));
  EXPECT_EQ(svc_->poll_interval(), std::chrono::duration_cast<Clock::duration>(250ms));
  backend_->release(id);
  ASSERT_TRUE(wait_terminal(id));
  ASSERT_TRUE(pump_until([&] { return svc_->idle(); }));
  EXPECT_EQ(svc_->poll_interval(), std::chrono::duration_cast<Clock::duration>(2000ms));

  // Memory pressure (seen at the next tick): the normal interval until it is gone.
  sim_->set_foreign_bytes(8 * kGiB - 256 * kMiB);
  svc_->tick();
  EXPECT_FALSE(svc_->idle());
  EXPECT_EQ(svc_->poll_interval(), std::chrono::duration_cast<Clock::duration>(250ms));
  sim_->set_foreign_bytes(0);
  ASSERT_TRUE(pump_until([&] {
    clock_->advance(1s);
    return svc_->idle();
  }, /*tick=*/true));
  EXPECT_EQ(svc_->poll_interval(), std::chrono::duration_cast<Clock::duration>(2000ms));

  // The breaker not closed (a lost device): the normal interval.
  ASSERT_TRUE(svc_->testing_lose_device());
  EXPECT_NE(svc_->breaker_state(), "closed");
  EXPECT_FALSE(svc_->idle());
  EXPECT_EQ(svc_->poll_interval(), std::chrono::duration_cast<Clock::duration>(250ms));
}

TEST_F(ServiceTest, AnIdleIntervalBelowThePollIntervalMeansThePollInterval) {
  cfg_.device.poll_interval = 500ms;
  cfg_.device.idle_poll_interval = 100ms;
  ASSERT_NO_FATAL_FAILURE(start());
  ASSERT_TRUE(pump_until([&] { return svc_->idle(); }));
  EXPECT_EQ(svc_->poll_interval(), std::chrono::duration_cast<Clock::duration>(500ms));
}

TEST_F(ServiceTest, SubmitAndPlanTakeAFreshReadingWhileTheTimerIsIdle) {
  cfg_.device.idle_poll_interval = 60000ms;
  ASSERT_NO_FATAL_FAILURE(start());
  svc_->tick();
  ASSERT_TRUE(pump_until([&] { return svc_->idle(); }));
  // Another program takes the device between two idle ticks: no tick has seen it yet.
  sim_->set_foreign_bytes(8 * kGiB - 256 * kMiB);
  EXPECT_EQ(str(svc_->memory_view(), "pressure"), "normal");
  auto plan = svc_->plan(alice_, request("planned"));
  ASSERT_TRUE(plan) << describe(plan);
  EXPECT_EQ(str(*plan, "action"), "route_cpu");
  EXPECT_EQ(str(svc_->memory_view(), "pressure"), "critical");
}

TEST_F(ServiceTest, SubmitTakesAFreshReadingWhileTheTimerIsIdle) {
  cfg_.device.idle_poll_interval = 60000ms;
  ASSERT_NO_FATAL_FAILURE(start());
  svc_->tick();
  ASSERT_TRUE(pump_until([&] { return svc_->idle(); }));
  backend_->set_script(emit(2));
  sim_->set_foreign_bytes(8 * kGiB - 256 * kMiB);  // unseen by the idle timer
  EXPECT_EQ(str(svc_->memory_view(), "pressure"), "normal");
  Dict placement;
  const JobId id = submit_ok(alice_, request("squeezed"), &placement);
  EXPECT_EQ(str(placement, "route"), "cpu");
  EXPECT_EQ(str(placement, "action"), "route_cpu");
  EXPECT_TRUE(wait_terminal(id));
}

}  // namespace
}  // namespace tandem::daemon
