// The service core when journal writes fail (docs/journal.md, "Failed writes"): JobJournal::testing_fail_writes
// through Service::testing_fail_journal_writes makes the next n appends fail with EIO before they write anything.
// Checkpoints that fail leave no hole (the next one carries every token) and never fail the job; a transition that
// fails is written again before the job's next record; an accept that fails refuses the job; an outcome that fails
// holds the job's end until it is written again. Same fixture (service_fixture.h), its own executable.
#include "daemon/service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "daemon/journal.h"
#include "fake_backend.h"
#include "service_fixture.h"

namespace tandem::daemon {
namespace {

using namespace tandem::daemon::testing;

std::uint64_t write_errors(Service& s) { return s.counters()["journal_write_errors"]; }

// --- checkpoints -----------------------------------------------------------------------------------------------------

TEST_F(ServiceTest, FailedCheckpointsNeverFailTheJobAndLeaveNoHole) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(100));
  const JobId id = submit_ok(alice_, request("long run", 100));
  // Accepted and started (both written inside Submit); the next two appends are the checkpoints at 32 and 33
  // tokens (a failed one is tried again at the next tokens event), then 34 is written, then 66 and 98.
  svc_->testing_fail_journal_writes(2);
  ASSERT_TRUE(wait_terminal(id));
  const Dict j = job(id);
  EXPECT_EQ(str(j, "state"), "completed");
  EXPECT_EQ(at<std::vector<std::int32_t>>(j, "tokens"), FakeBackend::tokens_of(kSeed, 0, 100));
  EXPECT_EQ(write_errors(*svc_), 2u);
  EXPECT_EQ(svc_->counters()["journal_append_failures"], 2u);
  EXPECT_EQ(rec_.count(id, "finished"), 1);
  // The journal holds the whole result.
  ASSERT_NO_FATAL_FAILURE(restart());
  const Dict r = job(id);
  EXPECT_EQ(str(r, "state"), "completed");
  EXPECT_EQ(at<std::vector<std::int32_t>>(r, "tokens"), FakeBackend::tokens_of(kSeed, 0, 100));
}

TEST_F(ServiceTest, ACrashAfterFailedCheckpointsRestoresTheLastGoodOneAndResumesFromIt) {
  struct Case {
    const char* name;
    std::uint32_t fail_writes;  // appends failing once the job runs (checkpoint attempts at 32, 33, ...)
    std::uint32_t block_at;     // the run stops here (tokens delivered) when the daemon dies
    std::uint32_t checkpoint;   // what the restored job holds
    std::uint64_t errors;
  };
  const std::vector<Case> cases = {
      {"no failure", 0, 40, 32, 0},
      {"two failures: written at 34", 2, 40, 34, 2},
      {"every attempt fails: nothing journaled", 20, 40, 0, 9},  // attempts at 32..40
      {"three failures, then the next regular one", 3, 70, 67, 3},  // 35 written, then 67
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    cfg_.journal.dir = dir.path();
    backend_ = std::make_shared<FakeBackend>(sim_);  // no runs, gates or scripts of the case before
    ASSERT_NO_FATAL_FAILURE(start());
    backend_->set_script(block_at(c.block_at, 100));
    const JobId id = submit_ok(alice_, request("interrupted", 100));
    svc_->testing_fail_journal_writes(c.fail_writes);
    ASSERT_TRUE(wait_blocked(id));
    ASSERT_TRUE(pump_until([&] { return at<std::vector<std::int32_t>>(job(id), "tokens").size() == c.block_at; }));
    EXPECT_EQ(write_errors(*svc_), c.errors);
    EXPECT_EQ(str(job(id), "state"), "running");
    // A crash as far as the job knows: the service goes without a drain.
    ASSERT_NO_FATAL_FAILURE(restart());
    svc_->testing_fail_journal_writes(0);
    const Dict r = job(id);
    EXPECT_EQ(str(r, "state"), "failed");
    EXPECT_EQ(str(r, "reason"), "daemon_restart");
    EXPECT_EQ(str(r, "error_code"), code(Errc::resumable));
    EXPECT_EQ(u32(r, "checkpoint_tokens"), c.checkpoint);
    EXPECT_EQ(at<std::vector<std::int32_t>>(r, "tokens"), FakeBackend::tokens_of(kSeed, 0, c.checkpoint))
        << "the checkpoint is a prefix of what the run produced";
    // Resuming continues exactly from it.
    backend_->set_script(emit(100));
    auto resumed = svc_->resume(alice_, id, {});
    ASSERT_TRUE(resumed) << describe(resumed);
    const JobId next = u64(*resumed, "job_id");
    ASSERT_TRUE(wait_terminal(next));
    const auto runs = backend_->runs_of(next);
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_EQ(runs[0].resume_tokens, FakeBackend::tokens_of(kSeed, 0, c.checkpoint));
    EXPECT_EQ(str(job(next), "state"), "completed");
    EXPECT_EQ(at<std::vector<std::int32_t>>(job(next), "tokens"), FakeBackend::tokens_of(kSeed, 0, 100));
    backend_->release_all();
    svc_.reset();
  }
}

// --- transitions -----------------------------------------------------------------------------------------------------

TEST_F(ServiceTest, AFailedTransitionIsWrittenAgainBeforeTheJobsNextRecord) {
  struct Case {
    const char* name;
    bool group_commit;
    std::uint32_t fail_writes;  // from the dispatch on: the `running` transition, then its retry with the checkpoint
    std::uint32_t checkpoint;   // restored
    std::uint64_t errors;
  };
  const std::vector<Case> cases = {
      {"group commit, transition fails once", true, 1, 32, 1},
      {"group commit, transition and its first retry fail", true, 2, 33, 2},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    cfg_.journal.dir = dir.path();
    backend_ = std::make_shared<FakeBackend>(sim_);  // no runs, gates or scripts of the case before
    ASSERT_NO_FATAL_FAILURE(start());
    svc_->set_group_commit(c.group_commit);
    backend_->set_script(block_at(36, 100));
    const JobId id = submit_ok(alice_, request("moves", 100));
    svc_->testing_fail_journal_writes(c.fail_writes);
    ASSERT_TRUE(svc_->commit());  // the accept is durable: the job is dispatched, its transition fails
    ASSERT_TRUE(wait_blocked(id));
    ASSERT_TRUE(pump_until([&] { return at<std::vector<std::int32_t>>(job(id), "tokens").size() == 36; }));
    EXPECT_EQ(write_errors(*svc_), c.errors);
    ASSERT_NO_FATAL_FAILURE(restart());
    const Dict r = job(id);
    EXPECT_EQ(str(r, "state"), "failed");
    EXPECT_EQ(u32(r, "checkpoint_tokens"), c.checkpoint);
    // The transition reached the journal with the checkpoint: the route and the attempt are known.
    EXPECT_EQ(u32(r, "attempts"), 1u);
    EXPECT_EQ(at<std::vector<std::string>>(r, "routes"), std::vector<std::string>{"gpu"});
    EXPECT_EQ(at<std::vector<std::int32_t>>(r, "tokens"), FakeBackend::tokens_of(kSeed, 0, c.checkpoint));
    backend_->release_all();
    svc_.reset();
  }
}

TEST_F(ServiceTest, ATransitionStillUnwrittenAtTheEndIsWrittenBeforeTheOutcome) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(5));
  svc_->set_group_commit(true);
  const JobId id = submit_ok(alice_, request("short", 8));
  // The transition, the final checkpoint (its transition first, then nothing more), and nothing else: the outcome
  // goes through and carries the result.
  svc_->testing_fail_journal_writes(2);
  ASSERT_TRUE(svc_->commit());
  ASSERT_TRUE(pump_until([&] { return terminal(id); }));
  EXPECT_EQ(phase(id), "completed");
  ASSERT_TRUE(svc_->commit());
  EXPECT_EQ(rec_.count(id, "finished"), 1);
  EXPECT_EQ(write_errors(*svc_), 2u);
  ASSERT_NO_FATAL_FAILURE(restart());
  const Dict r = job(id);
  EXPECT_EQ(str(r, "state"), "completed");
  EXPECT_EQ(at<std::vector<std::int32_t>>(r, "tokens"), FakeBackend::tokens_of(kSeed, 0, 5));
  EXPECT_EQ(at<std::vector<std::string>>(r, "routes"), std::vector<std::string>{"gpu"})
      << "the outcome wrote the transition it was missing first";
}

// --- accepts ---------------------------------------------------------------------------------------------------------

TEST_F(ServiceTest, AFailedAcceptWriteIsAnInternalErrorNothingRunsAndTheKeyIsFree) {
  for (const bool group : {false, true}) {
    SCOPED_TRACE(group ? "group commit" : "commit per record");
    TempDir dir;
    cfg_.journal.dir = dir.path();
    backend_ = std::make_shared<FakeBackend>(sim_);  // no runs, gates or scripts of the case before
    ASSERT_NO_FATAL_FAILURE(start());
    svc_->set_group_commit(group);
    backend_->set_script(emit(3));
    SubmitRequest r = request("refused then accepted");
    r.options.idempotency_key = "key-1";
    svc_->testing_fail_journal_writes(1);
    auto refused = svc_->submit(alice_, r);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code, Errc::internal);
    EXPECT_THAT(refused.error().message, HasSubstr("not accepted"));
    ASSERT_TRUE(svc_->commit());
    settle();
    EXPECT_TRUE(backend_->runs().empty()) << "a job that was never journaled ran";
    EXPECT_TRUE(rec_.updates.empty());
    auto counters = svc_->counters();
    EXPECT_EQ(counters["jobs_accepted"], 0u);
    EXPECT_EQ(counters["jobs_waiting"], 0u);
    EXPECT_EQ(counters["journal_write_errors"], 1u);
    // The same key again: a new job, which runs.
    Dict placement;
    const JobId id = submit_ok(alice_, r, &placement);
    ASSERT_NE(id, 0u);
    EXPECT_FALSE(flag(placement, "existing"));
    ASSERT_TRUE(svc_->commit());
    ASSERT_TRUE(wait_terminal(id));
    ASSERT_TRUE(svc_->commit());
    EXPECT_EQ(phase(id), "completed");
    ASSERT_NO_FATAL_FAILURE(restart());
    EXPECT_EQ(svc_->replay_stats().jobs, 1u) << "only the accepted job is in the journal";
    backend_->release_all();
    svc_.reset();
    rec_.updates.clear();
  }
}

// --- outcomes --------------------------------------------------------------------------------------------------------

TEST_F(ServiceTest, AFailedOutcomeWriteHoldsTheEndUntilItIsWrittenAgain) {
  struct Case {
    const char* name;
    bool group_commit;
    std::uint32_t fail_writes;  // once it runs: the final checkpoint, the outcome, then retries of the outcome
    int retries_failing;        // commits whose retry fails again (each then waits a poll interval)
  };
  const std::vector<Case> cases = {
      {"commit per record", false, 2, 0},
      {"commit per record, the first retry fails too", false, 3, 1},
      {"group commit", true, 2, 0},
      {"group commit, two retries fail", true, 4, 2},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    cfg_.journal.dir = dir.path();
    backend_ = std::make_shared<FakeBackend>(sim_);  // no runs, gates or scripts of the case before
    ASSERT_NO_FATAL_FAILURE(start());
    svc_->set_group_commit(c.group_commit);
    backend_->set_script(emit(5));
    const JobId id = submit_ok(alice_, request("ends", 8));
    ASSERT_TRUE(svc_->commit());  // group commit: accepted and dispatched now
    svc_->testing_fail_journal_writes(c.fail_writes);
    ASSERT_TRUE(pump_until([&] { return terminal(id); }));
    EXPECT_EQ(phase(id), "completed");
    settle();
    EXPECT_EQ(rec_.count(id, "finished"), 0) << "the end went out before its outcome was durable";
    EXPECT_EQ(rec_.count(id, "tokens"), 5);
    EXPECT_FALSE(svc_->idle());
    for (int i = 0; i < c.retries_failing; ++i) {
      ASSERT_TRUE(svc_->commit_pending());
      ASSERT_TRUE(svc_->commit());
      EXPECT_EQ(rec_.count(id, "finished"), 0) << "retry " << i;
      EXPECT_FALSE(svc_->commit_pending()) << "a failed retry waits a poll interval (no busy loop)";
      ASSERT_TRUE(svc_->commit());
      EXPECT_EQ(rec_.count(id, "finished"), 0);
      clock_->advance(std::chrono::duration_cast<Clock::duration>(cfg_.device.poll_interval));
    }
    ASSERT_TRUE(svc_->commit_pending());
    ASSERT_TRUE(svc_->commit());
    ASSERT_EQ(rec_.count(id, "finished"), 1);
    EXPECT_EQ(rec_.kinds(id).back(), "finished");
    EXPECT_EQ(str(rec_.of(id).back().data, "state"), "completed");
    EXPECT_FALSE(svc_->commit_pending());
    EXPECT_EQ(write_errors(*svc_), c.fail_writes);
    // What was acknowledged is in the journal.
    ASSERT_NO_FATAL_FAILURE(restart());
    const Dict r = job(id);
    EXPECT_EQ(str(r, "state"), "completed");
    EXPECT_EQ(at<std::vector<std::int32_t>>(r, "tokens"), FakeBackend::tokens_of(kSeed, 0, 5));
    backend_->release_all();
    svc_.reset();
    rec_.updates.clear();
  }
}

TEST_F(ServiceTest, ACrashWhileAnOutcomeIsUnwrittenLosesNothingThatWasAcknowledged) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(5));
  const JobId id = submit_ok(alice_, request("ends, then the daemon dies", 8));
  svc_->testing_fail_journal_writes(2);  // the final checkpoint and the outcome
  ASSERT_TRUE(pump_until([&] { return terminal(id); }));
  settle();
  ASSERT_EQ(rec_.count(id, "finished"), 0);
  ASSERT_NO_FATAL_FAILURE(restart());  // without a commit: the outcome was never durable, and never announced
  const Dict r = job(id);
  EXPECT_EQ(str(r, "state"), "failed");
  EXPECT_EQ(str(r, "reason"), "daemon_restart");
  EXPECT_EQ(str(r, "error_code"), code(Errc::resumable));
  EXPECT_EQ(u32(r, "checkpoint_tokens"), 0u);
}

}  // namespace
}  // namespace tandem::daemon
