// Group commit (docs/journal.md, "Sync points and group commit"): appends only write(), one commit() makes all of
// them durable with one fdatasync, a failed fdatasync undoes the whole window (file and memory), a process killed
// between write and commit loses no committed record. Plus the timing figures of docs/journal.md.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <vector>

#include "daemon/journal.h"
#include "test_journal_util.h"

namespace tandem::daemon {
namespace {

using namespace journal_test;

// Options with fsync on and a counting (and optionally failing) fdatasync.
struct SyncProbe {
  int calls = 0;
  int fail = 0;  // how many of the next calls fail with EIO
  JobJournal::Options options(const TempDir& d) {
    auto o = opts_for(d);
    o.fsync = true;
    o.sync_hook = [this](int fd) {
      ++calls;
      if (fail > 0) {
        --fail;
        errno = EIO;
        return -1;
      }
      return ::fdatasync(fd);
    };
    return o;
  }
};

TEST(JournalGroupCommit, ManyAcceptsShareOneFdatasync) {
  TempDir d;
  SyncProbe probe;
  auto jr = open_ok(probe.options(d));
  ASSERT_TRUE(jr);
  const int at_open = probe.calls;
  for (std::uint64_t id = 1; id <= 48; ++id) ASSERT_TRUE(jr->accepted(make_job(id)).ok());
  EXPECT_EQ(probe.calls, at_open);  // appends never sync
  EXPECT_EQ(jr->appended_seq(), 48u);
  EXPECT_EQ(jr->durable_seq(), 0u);
  EXPECT_TRUE(jr->commit_pending());
  const auto before = jr->write_stats();
  ASSERT_TRUE(jr->commit().ok());
  EXPECT_EQ(probe.calls, at_open + 1);
  EXPECT_EQ(jr->write_stats().fdatasyncs, before.fdatasyncs + 1);
  EXPECT_EQ(jr->write_stats().commits, before.commits + 1);
  EXPECT_EQ(jr->write_stats().records_committed, before.records_committed + 48);
  EXPECT_EQ(jr->write_stats().max_records_per_commit, 48u);
  EXPECT_EQ(jr->durable_seq(), 48u);
  EXPECT_FALSE(jr->commit_pending());
  // Nothing pending: no fdatasync at all.
  ASSERT_TRUE(jr->commit().ok());
  EXPECT_EQ(probe.calls, at_open + 1);
  // sync() always syncs.
  ASSERT_TRUE(jr->sync().ok());
  EXPECT_EQ(probe.calls, at_open + 2);
}

TEST(JournalGroupCommit, OutcomesAndTransitionsShareTheSyncToo) {
  TempDir d;
  SyncProbe probe;
  auto jr = open_ok(probe.options(d));
  ASSERT_TRUE(jr);
  for (std::uint64_t id = 1; id <= 8; ++id) ASSERT_TRUE(jr->accepted(make_job(id)).ok());
  ASSERT_TRUE(jr->commit().ok());
  const int calls = probe.calls;
  // One loop iteration's worth: eight jobs finish, two more arrive.
  for (std::uint64_t id = 1; id <= 8; ++id) {
    ASSERT_TRUE(jr->transition(id, "running", "admitted", R"({"device":"gpu"})", 1100, 1).ok());
    ASSERT_TRUE(jr->outcome(id, "completed", "done", {1, 2}, "ab", "", "", 0, "eos", 1200).ok());
  }
  ASSERT_TRUE(jr->accepted(make_job(9)).ok());
  ASSERT_TRUE(jr->accepted(make_job(10)).ok());
  ASSERT_TRUE(jr->commit().ok());
  EXPECT_EQ(probe.calls, calls + 1);
  EXPECT_EQ(jr->write_stats().max_records_per_commit, 18u);
}

TEST(JournalGroupCommit, WithoutFsyncACommitAdvancesWithoutSyncing) {
  TempDir d;
  SyncProbe probe;
  auto o = probe.options(d);
  o.fsync = false;
  auto jr = open_ok(o);
  ASSERT_TRUE(jr);
  ASSERT_TRUE(jr->accepted(make_job(1)).ok());
  ASSERT_TRUE(jr->commit().ok());
  EXPECT_EQ(probe.calls, 0);
  EXPECT_EQ(jr->durable_seq(), 1u);
}

TEST(JournalGroupCommit, FailedSyncUndoesTheWholeWindowInFileAndMemory) {
  TempDir d;
  SyncProbe probe;
  std::map<std::uint64_t, JournalJob> committed;
  std::uint64_t committed_bytes = 0;
  {
    auto jr = open_ok(probe.options(d));
    ASSERT_TRUE(jr);
    run_to_completion(*jr, 1, 1000);
    ASSERT_TRUE(jr->accepted(make_job(2)).ok());
    ASSERT_TRUE(jr->commit().ok());
    committed = jr->jobs();
    committed_bytes = jr->file_bytes();
    const auto seq = jr->durable_seq();
    // The window: two new jobs, job 2 runs and ends.
    ASSERT_TRUE(jr->accepted(make_job(3)).ok());
    ASSERT_TRUE(jr->accepted(make_job(4)).ok());
    ASSERT_TRUE(jr->transition(2, "running", "admitted", "", 2000, 1).ok());
    ASSERT_TRUE(jr->outcome(2, "failed", "oom", {}, "", "resumable", "x", 5, "", 2001).ok());
    ASSERT_EQ(jr->jobs().size(), 4u);
    probe.fail = 1;
    const int calls = probe.calls;
    const Status st = jr->commit();
    EXPECT_EQ(code_of(st), Errc::io_error);
    EXPECT_NE(st.error().message.find("undone"), std::string::npos) << st.error().message;
    EXPECT_EQ(probe.calls, calls + 2);  // the failed sync, then the sync of the cut
    EXPECT_EQ(jr->jobs(), committed);   // jobs 3 and 4 are gone, job 2 is queued again
    EXPECT_EQ(jr->file_bytes(), committed_bytes);
    EXPECT_EQ(fs::file_size(d.journal()), committed_bytes);
    EXPECT_EQ(jr->appended_seq(), seq);
    EXPECT_EQ(jr->durable_seq(), seq);
    EXPECT_EQ(jr->write_stats().commit_failures, 1u);
    EXPECT_EQ(jr->write_stats().records_rolled_back, 4u);
    // The journal goes on from the committed state (id 3 may be accepted again).
    ASSERT_TRUE(jr->accepted(make_job(3)).ok());
    ASSERT_TRUE(jr->commit().ok());
    committed = jr->jobs();
  }
  auto jr = open_ok(opts_for(d));
  ASSERT_TRUE(jr);
  EXPECT_EQ(jr->jobs(), committed);
  EXPECT_EQ(jr->replay_stats().torn_tail_bytes + jr->replay_stats().corrupt_records, 0u);
}

TEST(JournalGroupCommit, CompactionCoversThePendingWindow) {
  TempDir d;
  SyncProbe probe;
  auto jr = open_ok(probe.options(d));
  ASSERT_TRUE(jr);
  run_to_completion(*jr, 1, 1000);
  ASSERT_TRUE(jr->accepted(make_job(2)).ok());
  EXPECT_TRUE(jr->commit_pending());
  ASSERT_TRUE(jr->compact(2000).ok());  // journal.tmp is fsynced with every record in it
  EXPECT_FALSE(jr->commit_pending());
  probe.fail = 1;
  EXPECT_TRUE(jr->commit().ok());  // nothing left to sync or undo
  EXPECT_EQ(probe.fail, 1);
  EXPECT_EQ(jr->jobs().size(), 2u);
}

TEST(JournalGroupCommit, ACutThatCannotBeSyncedBreaksTheJournalUntilACompaction) {
  TempDir d;
  SyncProbe probe;
  auto jr = open_ok(probe.options(d));
  ASSERT_TRUE(jr);
  ASSERT_TRUE(jr->accepted(make_job(1)).ok());
  ASSERT_TRUE(jr->commit().ok());
  ASSERT_TRUE(jr->accepted(make_job(2)).ok());
  probe.fail = 2;  // the commit and the sync of the cut
  const Status st = jr->commit();
  ASSERT_EQ(code_of(st), Errc::io_error);
  EXPECT_NE(st.error().message.find("syncing the cut failed too"), std::string::npos) << st.error().message;
  EXPECT_EQ(jr->jobs().size(), 1u);
  EXPECT_EQ(code_of(jr->accepted(make_job(3))), Errc::io_error);  // nothing more is written
  EXPECT_EQ(code_of(jr->commit()), Errc::io_error);
  ASSERT_TRUE(jr->compact(5000).ok());  // rewrites the file from memory (the committed state): whole again
  ASSERT_TRUE(jr->accepted(make_job(3)).ok());
  ASSERT_TRUE(jr->commit().ok());
  EXPECT_EQ(jr->jobs().size(), 2u);
}

// testing_fail_writes(n): the next n appends of any type fail with io_error (EIO) and write nothing; a record that
// fails validation does not use one up; the journal goes on as if they had never been tried.
TEST(JournalGroupCommit, InjectedWriteFailuresWriteNothing) {
  TempDir d;
  std::map<std::uint64_t, JournalJob> kept;
  {
    auto jr = open_ok(opts_for(d));
    ASSERT_TRUE(jr);
    ASSERT_TRUE(jr->accepted(make_job(1)).ok());
    ASSERT_TRUE(jr->transition(1, "running", "admitted", R"({"device":"gpu"})", 1100, 1).ok());
    ASSERT_TRUE(jr->checkpoint(1, {1, 2}, "ab").ok());
    ASSERT_TRUE(jr->commit().ok());
    const auto jobs = jr->jobs();
    const auto bytes = jr->file_bytes();
    const auto seq = jr->appended_seq();
    jr->testing_fail_writes(4);
    // Invalid: refused before the injection is reached (does not use one up).
    EXPECT_EQ(code_of(jr->checkpoint(99, {1}, "x")), Errc::invalid_argument);
    EXPECT_EQ(code_of(jr->accepted(make_job(2))), Errc::io_error);
    EXPECT_EQ(code_of(jr->transition(1, "migrating", "oom", "", 1200, 1)), Errc::io_error);
    EXPECT_EQ(code_of(jr->checkpoint(1, {1, 2, 3}, "abc")), Errc::io_error);
    const Status st = jr->outcome(1, "completed", "eos", {1, 2, 3}, "abc", "", "", 0, "eos", 1300);
    ASSERT_EQ(code_of(st), Errc::io_error);
    EXPECT_NE(st.error().message.find(std::strerror(EIO)), std::string::npos) << st.error().message;
    EXPECT_EQ(jr->jobs(), jobs);
    EXPECT_EQ(jr->file_bytes(), bytes);
    EXPECT_EQ(fs::file_size(d.journal()), bytes);
    EXPECT_EQ(jr->appended_seq(), seq);
    EXPECT_FALSE(jr->commit_pending());
    EXPECT_EQ(jr->write_stats().append_failures, 4u);
    // The fifth append is written: the journal goes on.
    ASSERT_TRUE(jr->checkpoint(1, {1, 2, 3}, "abc").ok());
    ASSERT_TRUE(jr->outcome(1, "completed", "eos", {1, 2, 3}, "abc", "", "", 0, "eos", 1300).ok());
    ASSERT_TRUE(jr->commit().ok());
    kept = jr->jobs();
  }
  auto jr = open_ok(opts_for(d));
  ASSERT_TRUE(jr);
  EXPECT_EQ(jr->jobs(), kept);
  EXPECT_EQ(jr->jobs().at(1).phase, "completed");
  EXPECT_EQ(jr->replay_stats().torn_tail_bytes + jr->replay_stats().corrupt_records, 0u);
}

// A writer killed (SIGKILL) between write() and its commit: every record it committed before is there at the next
// open; the uncommitted ones may be there too (they reached the page cache) and are ordinary records then.
TEST(JournalGroupCommit, KilledBetweenWriteAndCommitLosesNoCommittedRecord) {
  TempDir d;
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // the writer: batches of 5 accepts, each committed, then a batch written and killed unsynced
    ::close(pipefd[0]);
    auto o = opts_for(d);
    o.fsync = true;
    auto r = JobJournal::open(o);
    if (!r.ok()) ::_exit(2);
    auto& jr = **r;
    std::uint64_t id = 0;
    for (int batch = 0; batch < 4; ++batch) {
      for (int k = 0; k < 5; ++k)
        if (!jr.accepted(make_job(++id)).ok()) ::_exit(3);
      if (!jr.commit().ok()) ::_exit(4);
      for (std::uint64_t acked = id - 4; acked <= id; ++acked)  // "acknowledged": told to the client (the parent)
        if (::write(pipefd[1], &acked, sizeof acked) != sizeof acked) ::_exit(5);
    }
    for (int k = 0; k < 5; ++k) (void)jr.accepted(make_job(++id));
    ::kill(::getpid(), SIGKILL);  // between write and sync
    ::_exit(6);
  }
  ::close(pipefd[1]);
  std::set<std::uint64_t> acked;
  std::uint64_t v;
  while (::read(pipefd[0], &v, sizeof v) == sizeof v) acked.insert(v);
  ::close(pipefd[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_EQ(acked.size(), 20u);
  auto jr = open_ok(opts_for(d));
  ASSERT_TRUE(jr);
  for (std::uint64_t id : acked) EXPECT_TRUE(jr->jobs().count(id)) << "acknowledged job " << id << " is missing";
  EXPECT_EQ(jr->replay_stats().corrupt_records, 0u);
}

// --- figures for docs/journal.md (printed, never asserted) -------------------------------------------------------

TEST(JobJournalTiming, AppendLatencyAndReplayTime) {
  const char* dir_env = std::getenv("TANDEM_JOURNAL_TIMING_DIR");
  if (dir_env == nullptr) GTEST_SKIP() << "set TANDEM_JOURNAL_TIMING_DIR=<dir on the disk to measure> to run";
  using Clk = std::chrono::steady_clock;
  const std::string dir = std::string(dir_env) + "/tandem-journal-timing-" + std::to_string(::getpid());
  {
    JobJournal::Options o;
    o.dir = dir;
    o.fsync = true;
    auto jr = open_ok(o);
    ASSERT_TRUE(jr);
    std::vector<double> us;
    for (std::uint64_t id = 1; id <= 1000; ++id) {
      JournalJob j = make_job(id, 1000, "key-" + std::to_string(id));
      const auto t0 = Clk::now();
      ASSERT_TRUE(jr->accepted(j).ok());
      ASSERT_TRUE(jr->commit().ok());
      us.push_back(std::chrono::duration<double, std::micro>(Clk::now() - t0).count());
    }
    std::sort(us.begin(), us.end());
    std::printf("[timing] accepted + commit (one fdatasync each), 1000 appends: p50 %.0f us, p99 %.0f us, max %.0f us\n",
                us[499], us[989], us.back());
    // Group commit: 48 accepts, one commit.
    std::vector<double> per_record;
    for (int round = 0; round < 20; ++round) {
      const auto t0 = Clk::now();
      for (int k = 0; k < 48; ++k) {
        const std::uint64_t id = 1001 + static_cast<std::uint64_t>(round) * 48 + static_cast<std::uint64_t>(k);
        ASSERT_TRUE(jr->accepted(make_job(id, 1000, "key-" + std::to_string(id))).ok());
      }
      ASSERT_TRUE(jr->commit().ok());
      per_record.push_back(std::chrono::duration<double, std::micro>(Clk::now() - t0).count() / 48);
    }
    std::sort(per_record.begin(), per_record.end());
    std::printf("[timing] 48 accepted + one commit, 20 rounds: p50 %.1f us per record\n", per_record[10]);
  }
  std::filesystem::remove_all(dir);
  {
    JobJournal::Options o;
    o.dir = dir;
    o.fsync = false;
    auto jr = open_ok(o);
    const std::string text(400, 'w');
    std::vector<std::int32_t> tokens(100, 1234);
    for (std::uint64_t id = 1; id <= 10000; ++id) {
      const auto t = static_cast<std::int64_t>(id);
      ASSERT_TRUE(jr->accepted(make_job(id, t, "key-" + std::to_string(id))).ok());
      ASSERT_TRUE(jr->transition(id, "running", "admitted", R"({"device":"gpu","replica":0})", t, 1).ok());
      ASSERT_TRUE(jr->checkpoint(id, std::vector<std::int32_t>(50, 1234), text.substr(0, 200)).ok());
      ASSERT_TRUE(jr->outcome(id, "completed", "done", tokens, text, "", "", 0, "eos", t).ok());
    }
    ASSERT_TRUE(jr->sync().ok());
    std::printf("[timing] 10000 jobs, 40000 records: %.1f MiB\n", jr->file_bytes() / 1048576.0);
  }
  for (int rep = 0; rep < 3; ++rep) {
    JobJournal::Options o;
    o.dir = dir;
    o.fsync = false;
    const auto t0 = Clk::now();
    auto jr = open_ok(o);
    const double ms = std::chrono::duration<double, std::milli>(Clk::now() - t0).count();
    ASSERT_EQ(jr->jobs().size(), 10000u);
    std::printf("[timing] open + replay of 10000 jobs (40000 records, page cache warm): %.0f ms\n", ms);
    if (rep == 2) {
      const auto t1 = Clk::now();
      ASSERT_TRUE(jr->compact(10001).ok());
      std::printf("[timing] compact (10000 jobs kept, no fsync): %.0f ms, %.1f MiB\n",
                  std::chrono::duration<double, std::milli>(Clk::now() - t1).count(), jr->file_bytes() / 1048576.0);
    }
  }
  {
    JobJournal::Options o;
    o.dir = dir;
    o.fsync = false;
    const auto t0 = Clk::now();
    auto jr = open_ok(o);
    std::printf("[timing] open + replay of the compacted 10000 jobs: %.0f ms\n",
                std::chrono::duration<double, std::milli>(Clk::now() - t0).count());
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::daemon
