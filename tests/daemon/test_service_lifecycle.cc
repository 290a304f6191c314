// The service core, continued (test_service.cc has admission, failover, cancel, idempotency): GPU holds, policy
// changes, the breaker, restart, malformed requests, shutdown, ownership, the fallback model and idle. Same fixture
// (service_fixture.h), its own executable.
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
  // The hold gave the GPU replica back (evict_on_hold): it is loaded again before the GPU serves.
  ASSERT_TRUE(pump_until([&] { return svc_->residency().find("tiny")->state == ReplicaState::loaded; }));
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
  hot.options.enable_thinking = false;  // a template variable: journaled, and the resumed job renders with it too
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
  EXPECT_EQ(backend_->encoded_flags().back(), (std::map<std::string, bool>{{"enable_thinking", false}}));
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

  // A failed health probe (the breaker still closed): the normal interval, so the next probes come at their pace
  // and a failing device opens the breaker as soon as it would when busy; idle again after a probe succeeds.
  ASSERT_TRUE(svc_->testing_fail_probes(1));
  const auto failed0 = svc_->counters()["probes_failed"];
  ASSERT_TRUE(pump_until([&] {
    clock_->advance(1s);
    return svc_->counters()["probes_failed"] > failed0;
  }, /*tick=*/true));
  EXPECT_EQ(svc_->breaker_state(), "closed");
  EXPECT_FALSE(svc_->idle());
  EXPECT_EQ(svc_->poll_interval(), std::chrono::duration_cast<Clock::duration>(250ms));
  ASSERT_TRUE(pump_until([&] {
    clock_->advance(1s);
    return svc_->idle();
  }, /*tick=*/true));

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
