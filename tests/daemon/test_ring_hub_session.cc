// Ring sessions, continued (test_ring_hub.cc has opening, submissions and protocol faults): the end of a session,
// completion overflow, the loop's sleep protocol and group commit. Same fixture (ring_hub_fixture.h).
#include "ring_hub_fixture.h"

namespace tandem::daemon {
namespace {

using namespace tandem::daemon::ring_testing;

// --- the end of a session ------------------------------------------------------------------------------------------

TEST_F(RingHubTest, CloseByTheOwnerOrRootOnly) {
  ASSERT_NO_FATAL_FAILURE(start());
  const Caller admin_not_root{":1.3", 1005, true, true, ""};
  struct Case {
    const char* name;
    Caller by;
    bool ok;
    Errc want;
  };
  const std::vector<Case> cases = {
      {"same user, other bus name", alice2_, false, Errc::permission_denied},
      {"another user", bob_, false, Errc::permission_denied},
      {"admin group, not root", admin_not_root, false, Errc::permission_denied},
      {"root", admin_, true, Errc::permission_denied /* unused */},
      {"the owner", alice_, true, Errc::permission_denied /* unused */},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Peer* p = open(alice_);
    ASSERT_TRUE(p);
    auto st = hub_->close(c.by, p->id);
    if (!c.ok) {
      ASSERT_FALSE(st) << c.name << ": want " << errc_name(c.want) << ", got ok";
      EXPECT_EQ(st.error().code, c.want) << describe(st);
      EXPECT_EQ(p->state(), SessionState::open);
      EXPECT_TRUE(nop_round_trip(*p, 1)) << "still serving after a refused close";
      ASSERT_TRUE(hub_->close(alice_, p->id));
      continue;
    }
    ASSERT_TRUE(st) << c.name << ": want ok, got " << describe(st);
    EXPECT_EQ(p->state(), SessionState::closed);
    EXPECT_EQ(p->fault(), Fault::none);
    EXPECT_EQ(p->client->state(), SessionState::closed);
    auto again = hub_->close(alice_, p->id);
    ASSERT_FALSE(again) << "closing twice";
    EXPECT_EQ(again.error().code, Errc::not_found);
  }
  auto unknown = hub_->close(alice_, 987654);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, Errc::not_found);
  EXPECT_FALSE(hub_->any_sessions());
  EXPECT_EQ(counter("ring_sessions_closed"), cases.size());
  EXPECT_EQ(counter("ring_sessions_failed"), 0u);
}

TEST_F(RingHubTest, ClosedSessionsJobKeepsRunningAndSendsNothing) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(1, 6));
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->client->submit(1, submit_record("outlives its session", 6)));
  const JobId job = wait_accepted(*p, 1);
  ASSERT_NE(job, 0u);
  ASSERT_TRUE(pump_until([&] { return backend_->is_blocked(job); }));
  ASSERT_TRUE(hub_->close(alice_, p->id));
  const auto tail = p->cq_tail();
  backend_->release(job);
  ASSERT_TRUE(pump_until([&] { return terminal(job); }));
  EXPECT_EQ(phase(job), "completed");
  EXPECT_EQ(p->cq_tail(), tail) << "completions after the close";
  EXPECT_TRUE(fwd_.bus_updates.empty()) << fwd_.bus_updates.front();
}

TEST_F(RingHubTest, ClientVanishedClosesItsSessionsOnly) {
  ASSERT_NO_FATAL_FAILURE(start());
  Peer* a1 = open(alice_);
  Peer* a2 = open(alice_);
  Peer* a3 = open(alice2_);
  Peer* b = open(bob_);
  ASSERT_TRUE(a1 && a2 && a3 && b);
  hub_->client_vanished(":1.99");
  EXPECT_EQ(counter("ring_sessions_open"), 4u) << "a stranger's name leaving changes nothing";
  (void)hub_->take_changed();
  hub_->client_vanished(alice_.bus_name);
  EXPECT_TRUE(hub_->take_changed());
  EXPECT_EQ(a1->state(), SessionState::closed);
  EXPECT_EQ(a2->state(), SessionState::closed);
  EXPECT_EQ(a3->state(), SessionState::open) << "same uid, other bus name";
  EXPECT_EQ(b->state(), SessionState::open);
  EXPECT_EQ(counter("ring_sessions_open"), 2u);
  EXPECT_EQ(counter("ring_sessions_closed"), 2u);
  EXPECT_EQ(hub_->fds().size(), 2u);
  EXPECT_TRUE(nop_round_trip(*a3, 1));
  EXPECT_TRUE(nop_round_trip(*b, 1));
}

TEST_F(RingHubTest, ReauthorizeClosesSessionsOfUsersThatMayNoLongerSubmit) {
  ASSERT_NO_FATAL_FAILURE(start());
  Peer* a = open(alice_);
  Peer* b = open(bob_);
  Peer* c = open(carol_);
  ASSERT_TRUE(a && b && c);
  RingConfig tighter;
  tighter.max_sessions_per_user = 1;
  hub_->reauthorize([](std::uint32_t uid) { return uid != 1000; }, tighter);
  EXPECT_EQ(a->state(), SessionState::closed);
  EXPECT_EQ(a->fault(), Fault::none);
  EXPECT_EQ(b->state(), SessionState::open);
  EXPECT_EQ(c->state(), SessionState::open);
  EXPECT_TRUE(nop_round_trip(*b, 1));
  auto second = hub_->open(bob_, {});
  ASSERT_FALSE(second) << "the new per-user limit (1) applies to new sessions";
  EXPECT_EQ(second.error().code, Errc::queue_full);
  RingConfig off;
  off.enabled = false;
  hub_->reauthorize([](std::uint32_t) { return true; }, off);
  EXPECT_EQ(b->state(), SessionState::closed);
  EXPECT_EQ(c->state(), SessionState::closed);
  EXPECT_FALSE(hub_->any_sessions());
  auto disabled = hub_->open(bob_, {});
  ASSERT_FALSE(disabled);
  EXPECT_EQ(disabled.error().code, Errc::unavailable);
}

TEST_F(RingHubTest, CloseAllEndsEverySessionAndChangesAreReported) {
  ASSERT_NO_FATAL_FAILURE(start());
  EXPECT_FALSE(hub_->take_changed()) << "nothing happened yet";
  Peer* a = open(alice_);
  ASSERT_TRUE(a);
  EXPECT_TRUE(hub_->take_changed()) << "a session opened";
  EXPECT_FALSE(hub_->take_changed()) << "reported once";
  ASSERT_TRUE(nop_round_trip(*a, 1));
  EXPECT_FALSE(hub_->take_changed()) << "traffic is not a change of the session set";
  Peer* b = open(bob_);
  ASSERT_TRUE(b);
  (void)hub_->take_changed();
  hub_->close_all("tandemd is stopping");
  EXPECT_TRUE(hub_->take_changed()) << "sessions ended";
  EXPECT_EQ(a->state(), SessionState::closed);
  EXPECT_EQ(b->state(), SessionState::closed);
  EXPECT_EQ(a->client->state(), SessionState::closed);
  EXPECT_FALSE(hub_->any_sessions());
  EXPECT_TRUE(hub_->fds().empty());
  EXPECT_EQ(counter("ring_sessions_closed"), 2u);
  EXPECT_THAT(log_.str(), HasSubstr("closed: tandemd is stopping"));
  // A submission written after the end is never read.
  const auto subs = counter("ring_submissions");
  EXPECT_FALSE(a->client->nop(2)) << "the client library refuses to submit to a closed session";
  pass();
  EXPECT_EQ(counter("ring_submissions"), subs);
}

// --- completion overflow -------------------------------------------------------------------------------------------

TEST_F(RingHubTest, SlowReaderLosesTokensNotOutcomes) {
  RingConfig rc;
  rc.max_backlog_bytes = 2048;  // below the config minimum on purpose: overflow with a few hundred tokens
  ASSERT_NO_FATAL_FAILURE(start(rc));
  constexpr std::uint32_t kTokens = 480;
  constexpr std::uint32_t kBlockAt = 400;
  // 400 tokens while the client does not read (many are dropped), a pause, then the client reads and the last 80
  // tokens stream to a reader that keeps up: the first batch after the drop carries GAP.
  backend_->set_script(block_at(kBlockAt, kTokens));
  Peer* p = open(alice_, {{"cq_entries", std::uint32_t{8}}, {"response_data_bytes", std::uint64_t{4096}}});
  ASSERT_TRUE(p);
  p->reading = false;
  ASSERT_TRUE(p->client->submit(1, submit_record("flood", kTokens)));
  // The reader does not read; the first CQ entry (accepted) names the job.
  ASSERT_TRUE(pump_until([&] { return p->cq_tail() > 0; }));
  const ring::CompletionEntry first = p->raw.cqes()[0];
  ASSERT_EQ(first.kind, static_cast<std::uint8_t>(Kind::accepted));
  const JobId job = first.job_id;
  ASSERT_TRUE(pump_until([&] { return backend_->is_blocked(job); })) << "job " << job << " is " << phase(job);
  pass();  // the loop applies the last token events
  EXPECT_EQ(p->state(), SessionState::open) << "a slow reader is not a protocol error";
  const std::uint64_t dropped = p->client->overflow_tokens();
  EXPECT_GT(dropped, 0u) << "want tokens dropped with a 2 KiB backlog and a 4 KiB area";
  const auto dflags = ring::load_acquire(&p->cq()->daemon_flags);
  EXPECT_NE(dflags & ring::kCqOverflowed, 0u) << "OVERFLOWED flag";
  EXPECT_NE(dflags & ring::kCqBacklog, 0u) << "BACKLOG flag while the reader is behind";
  EXPECT_GT(ring::load_relaxed64(&p->cq()->backlog_entries), 0u);
  // The client catches up: the backlog drains.
  p->reading = true;
  ASSERT_TRUE(pump_until([&] { return (ring::load_acquire(&p->cq()->daemon_flags) & ring::kCqBacklog) == 0; }))
      << "the backlog does not drain while the client reads";
  EXPECT_EQ(ring::load_relaxed64(&p->cq()->backlog_entries), 0u);
  backend_->release(job);
  ASSERT_TRUE(wait_finished(*p, job)) << p->kinds_of_job(job);
  const auto evs = p->of_job(job);
  ASSERT_FALSE(evs.empty());
  EXPECT_EQ(evs.front().kind(), Kind::accepted);
  EXPECT_EQ(evs.back().kind(), Kind::finished);
  EXPECT_EQ(rstr(evs.back(), "state"), "completed");
  EXPECT_EQ(ru64(evs.back(), "tokens_total"), kTokens);
  std::uint32_t next = 0, received = 0, gaps = 0;
  for (const auto& e : evs) {
    if (e.kind() != Kind::tokens) continue;
    if (e.entry.flags & ring::kCqeGap) {
      ++gaps;
      EXPECT_GT(e.entry.step, next) << "a GAP batch resumes past what was delivered";
    } else {
      EXPECT_EQ(e.entry.step, next) << "steps without GAP must be contiguous";
    }
    EXPECT_EQ(token_ids(e), FakeBackend::tokens_of(kSeed, e.entry.step, e.entry.step + e.entry.count));
    EXPECT_EQ(token_text(e), FakeBackend::text_of(e.entry.step, e.entry.step + e.entry.count));
    next = e.entry.step + e.entry.count;
    received += e.entry.count;
  }
  EXPECT_GT(gaps, 0u) << "the batch after a drop carries GAP";
  EXPECT_EQ(received + p->client->overflow_tokens(), kTokens)
      << "received " << received << " + dropped " << p->client->overflow_tokens();
  EXPECT_EQ(next, kTokens) << "the stream ends at the last token";
  EXPECT_EQ(ring::load_acquire(&p->cq()->daemon_flags) & ring::kCqBacklog, 0u) << "backlog flushed";
  auto info = svc_->get_job(alice_, job);
  ASSERT_TRUE(info);
  EXPECT_EQ(std::get<std::vector<std::int32_t>>(info->at("tokens")).size(), kTokens) << "GetJob has every token";
  EXPECT_EQ(std::get<std::string>(info->at("text")), FakeBackend::text_of(0, kTokens));
  const auto rows = hub_->sessions_view();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(std::get<std::uint64_t>(rows[0].at("tokens_dropped")), p->client->overflow_tokens());
}

// --- the loop's sleep protocol ---------------------------------------------------------------------------------------

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

TEST_F(RingHubTest, PrepareSleepSetsNeedWakeupAndRefusesWithPendingWork) {
  RingConfig rc;
  rc.max_spin = std::chrono::microseconds(123);
  ASSERT_NO_FATAL_FAILURE(start(rc));
  EXPECT_TRUE(hub_->fds().empty());
  EXPECT_EQ(hub_->spin_budget(), std::chrono::nanoseconds{0}) << "no sessions: no spinning";
  EXPECT_TRUE(hub_->prepare_sleep());
  hub_->finish_sleep();

  Peer* a = open(alice_);
  Peer* b = open(bob_, {{"cq_entries", std::uint32_t{8}}});
  ASSERT_TRUE(a && b);
  EXPECT_EQ(hub_->spin_budget(), std::chrono::nanoseconds(123'000));
  const auto fds = hub_->fds();
  ASSERT_EQ(fds.size(), 2u);
  EXPECT_NE(fds[0], fds[1]);
  for (int fd : fds) EXPECT_EQ(::fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY) << "the loop polls the read ends";

  // Idle: sleep allowed, NEED_WAKEUP set on every session; a submission then rings the doorbell.
  ASSERT_TRUE(hub_->prepare_sleep()) << "nothing pending";
  EXPECT_NE(ring::load_acquire(&a->sq()->flags) & ring::kSqNeedWakeup, 0u);
  EXPECT_NE(ring::load_acquire(&b->sq()->flags) & ring::kSqNeedWakeup, 0u);
  const auto rung = a->client->stats().doorbells_rung;
  ASSERT_TRUE(a->client->nop(1));
  EXPECT_EQ(a->client->stats().doorbells_rung, rung + 1) << "the client rings a sleeping daemon";
  EXPECT_TRUE(readable(fds[0]) || readable(fds[1])) << "a doorbell is readable";
  hub_->finish_sleep();
  EXPECT_EQ(ring::load_acquire(&a->sq()->flags) & ring::kSqNeedWakeup, 0u) << "finish_sleep clears NEED_WAKEUP";
  EXPECT_FALSE(readable(fds[0]) || readable(fds[1])) << "finish_sleep drains the doorbells";
  ASSERT_TRUE(pump_until([&] { return a->find(Kind::nop, 1) != nullptr; }));

  // A submission published without a doorbell (the daemon was awake): prepare_sleep must refuse.
  const auto rung2 = a->client->stats().doorbells_rung;
  ASSERT_TRUE(a->client->nop(2));
  EXPECT_EQ(a->client->stats().doorbells_rung, rung2) << "no doorbell while the daemon is awake";
  EXPECT_FALSE(hub_->prepare_sleep()) << "a submission is pending";
  EXPECT_EQ(ring::load_acquire(&a->sq()->flags) & ring::kSqNeedWakeup, 0u) << "no sleep: flags cleared again";
  ASSERT_TRUE(pump_until([&] { return a->find(Kind::nop, 2) != nullptr; }));

  // A backlog: 12 nops into an 8-entry CQ. While the client does not read, sleeping is fine; once it consumed,
  // prepare_sleep flushes and refuses.
  b->reading = false;
  for (std::uint64_t i = 0; i < 12; ++i) ASSERT_TRUE(b->client->nop(100 + i));
  pass();
  EXPECT_NE(ring::load_acquire(&b->cq()->daemon_flags) & ring::kCqBacklog, 0u);
  EXPECT_EQ(ring::load_relaxed64(&b->cq()->backlog_entries), 4u);
  ASSERT_TRUE(hub_->prepare_sleep()) << "backlogged, but the client has not consumed";
  hub_->finish_sleep();
  ASSERT_TRUE(b->client->reap(b->events));
  EXPECT_EQ(b->events.size(), 8u);
  EXPECT_FALSE(hub_->prepare_sleep()) << "the client consumed while a backlog waits";
  ASSERT_TRUE(b->client->reap(b->events));
  ASSERT_EQ(b->events.size(), 12u) << "prepare_sleep wrote the backlog";
  for (std::size_t i = 0; i < 12; ++i) EXPECT_EQ(b->events[i].entry.user_data, 100 + i) << "order kept";
  EXPECT_EQ(ring::load_acquire(&b->cq()->daemon_flags) & ring::kCqBacklog, 0u);
  EXPECT_TRUE(hub_->prepare_sleep());
  hub_->finish_sleep();
}

// docs/rings.md: "When the backlog's payload passes max_backlog_bytes, token batches are dropped instead of queued".
// (Found by this test: the writer used to merge a token batch into the last waiting one before checking the limit, so
// 295 tokens (2555 bytes) waited with a 2048-byte limit and nothing was dropped.)
TEST_F(RingHubTest, BacklogPayloadStaysWithinMaxBacklogBytes) {
  RingConfig rc;
  rc.max_backlog_bytes = 2048;
  ASSERT_NO_FATAL_FAILURE(start(rc));
  constexpr std::uint32_t kBlockAt = 300;
  backend_->set_script(block_at(kBlockAt, 310));
  Peer* p = open(alice_, {{"cq_entries", std::uint32_t{8}}, {"response_data_bytes", std::uint64_t{4096}}});
  ASSERT_TRUE(p);
  p->reading = false;
  ASSERT_TRUE(p->client->submit(1, submit_record("flood", 310)));
  ASSERT_TRUE(pump_until([&] { return p->cq_tail() > 0; }));
  const JobId job = p->raw.cqes()[0].job_id;
  ASSERT_TRUE(pump_until([&] { return backend_->is_blocked(job); }));
  pass();
  // Tokens in the CQ, dropped ones, and the rest: waiting in the daemon's backlog (contiguous after the CQ's).
  std::uint32_t cq_end = 0;
  for (std::uint32_t i = 0; i < p->cq_tail(); ++i) {
    const auto& e = p->raw.cqes()[i & 7];
    if (e.kind == static_cast<std::uint8_t>(Kind::tokens)) cq_end = e.step + e.count;
  }
  const auto dropped = static_cast<std::uint32_t>(p->client->overflow_tokens());
  std::uint64_t held_bytes = 0;
  for (std::uint32_t step = cq_end; step < kBlockAt - dropped; ++step) held_bytes += 4 + FakeBackend::text_for(step).size();
  EXPECT_LE(held_bytes, rc.max_backlog_bytes)
      << "the backlog holds " << (kBlockAt - dropped - cq_end) << " tokens (" << held_bytes
      << " bytes of payload) with max_backlog_bytes " << rc.max_backlog_bytes << "; dropped " << dropped;
}

// A client that closes its submit doorbell (the write end) but stays connected: the daemon's read end reports POLLHUP
// for ever, so tandemd's poll() (which waits on hub.fds()) returns at once on every iteration — a busy loop for as
// long as the session lives. Expected: the hub notices the hang-up (read() == 0 in finish_sleep/process) and ends the
// session, as tests/ring/ring_echo.h does, so the fd leaves the poll set.
// --- group commit (docs/journal.md) --------------------------------------------------------------------------------

std::uint64_t svc_counter(const Service& svc, const std::string& name) {
  const auto c = svc.counters();
  const auto it = c.find(name);
  return it == c.end() ? 0 : it->second;
}

TEST_F(RingHubTest, GroupCommitOneFdatasyncForARingDrainAndNothingLeavesBeforeIt) {
  cfg_.journal.fsync = true;
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(2));
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  constexpr std::uint64_t kJobs = 16;
  for (std::uint64_t ud = 1; ud <= kJobs; ++ud) ASSERT_TRUE(p->client->submit(ud, submit_record("g" + std::to_string(ud), 4)));
  const auto syncs = svc_counter(*svc_, "journal_fdatasyncs");
  hub_->process();  // the whole drain: 16 accepts written, none synced
  EXPECT_EQ(svc_counter(*svc_, "journal_fdatasyncs"), syncs);
  EXPECT_EQ(svc_counter(*svc_, "jobs_accepted"), kJobs);
  EXPECT_TRUE(svc_->commit_pending());
  // Nothing acknowledged, announced or run before the commit.
  std::this_thread::sleep_for(20ms);
  svc_->process_events();
  ASSERT_TRUE(p->client->reap(p->events));
  for (const auto& e : p->events) ADD_FAILURE() << "before the commit: a " << kind_name(e) << " completion";
  EXPECT_TRUE(backend_->runs().empty()) << "a job was dispatched before its accept was durable";
  const auto shown = svc_->get_job(admin_, 1);
  EXPECT_TRUE(!shown && shown.error().code == Errc::not_found) << "GetJob shows a job whose accept is not durable";
  ASSERT_TRUE(svc_->commit());
  EXPECT_EQ(svc_counter(*svc_, "journal_fdatasyncs"), syncs + 1);
  EXPECT_EQ(svc_counter(*svc_, "journal_max_records_per_commit"), kJobs);
  EXPECT_FALSE(svc_->commit_pending());
  std::vector<JobId> jobs;
  for (std::uint64_t ud = 1; ud <= kJobs; ++ud) jobs.push_back(wait_accepted(*p, ud));
  for (JobId j : jobs) ASSERT_TRUE(wait_finished(*p, j)) << "job " << j << ": " << p->kinds_of_job(j);
  for (JobId j : jobs) EXPECT_EQ(p->kinds_of_job(j), "accepted,routed,started,tokens,tokens,finished");
  // The outcomes of jobs ending in one iteration share a sync too: far fewer syncs than accepts + outcomes.
  EXPECT_LT(svc_counter(*svc_, "journal_fdatasyncs") - syncs, 2 * kJobs);
}

TEST_F(RingHubTest, GroupCommitFailureIsAnInternalErrorPerSubmitAndTheJobsAreWithdrawn) {
  cfg_.journal.fsync = true;
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(2));
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  for (std::uint64_t ud = 1; ud <= 3; ++ud)
    ASSERT_TRUE(p->client->submit(ud, submit_record("w" + std::to_string(ud), 4, "key-" + std::to_string(ud))));
  hub_->process();
  svc_->testing_fail_journal_syncs(1);
  const Status st = svc_->commit();
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::internal);
  EXPECT_THAT(st.error().message, HasSubstr("it was not accepted"));
  ASSERT_TRUE(pump_until([&] { return p->find(Kind::error, 3) != nullptr; }));
  for (std::uint64_t ud = 1; ud <= 3; ++ud) {
    const auto* e = p->find(Kind::error, ud);
    ASSERT_NE(e, nullptr) << "submit " << ud;
    EXPECT_EQ(rstr(*e, "error"), "Internal");
    EXPECT_THAT(rstr(*e, "message"), HasSubstr("not accepted"));
    EXPECT_EQ(p->find(Kind::accepted, ud), nullptr);
  }
  const auto until = std::chrono::steady_clock::now() + 30ms;
  pump_until([&] { return std::chrono::steady_clock::now() > until; });
  for (const auto& e : p->events)
    EXPECT_EQ(e.kind(), Kind::error) << "a withdrawn job announced " << kind_name(e);
  EXPECT_TRUE(backend_->runs().empty()) << "a withdrawn job ran";
  EXPECT_EQ(svc_counter(*svc_, "jobs_withdrawn"), 3u);
  EXPECT_EQ(svc_counter(*svc_, "jobs_accepted"), 0u);
  EXPECT_EQ(svc_counter(*svc_, "journal_commit_failures"), 1u);
  EXPECT_EQ(svc_counter(*svc_, "jobs_waiting"), 0u);
  // The client retries with the same keys: accepted as new jobs (the keys were freed), and they run.
  for (std::uint64_t ud = 1; ud <= 3; ++ud)
    ASSERT_TRUE(p->client->submit(10 + ud, submit_record("w" + std::to_string(ud), 4, "key-" + std::to_string(ud))));
  for (std::uint64_t ud = 11; ud <= 13; ++ud) {
    const JobId j = wait_accepted(*p, ud);
    ASSERT_NE(j, 0u);
    ASSERT_TRUE(wait_finished(*p, j));
    EXPECT_FALSE(rbool(*p->find(Kind::accepted, ud), "existing"));
  }
  // Nothing of the withdrawn jobs is in the journal.
  svc_.reset();
  JobJournal::Options o;
  o.dir = dir_.path();
  o.fsync = false;
  auto jr = JobJournal::open(o);
  ASSERT_TRUE(jr) << describe(jr);
  EXPECT_EQ((*jr)->jobs().size(), 3u);
  for (const auto& [id, j] : (*jr)->jobs()) EXPECT_EQ(j.phase, "completed") << "job " << id;
}

TEST_F(RingHubTest, HungUpSubmitDoorbellDoesNotKeepTheLoopAwake) {
  ASSERT_NO_FATAL_FAILURE(start());
  auto r = hub_->open(alice_, {});
  ASSERT_TRUE(r) << describe(r);
  ::close(r->fds.sq_doorbell_write);  // the client hangs up its doorbell; it keeps the memfd and its bus name
  r->fds.sq_doorbell_write = -1;
  for (int i = 0; i < 3; ++i) {  // a few loop iterations as tandemd runs them
    hub_->process();
    if (hub_->prepare_sleep()) {
      std::vector<pollfd> pfds;
      for (int fd : hub_->fds()) pfds.push_back({fd, POLLIN, 0});
      (void)::poll(pfds.data(), pfds.size(), 0);
      hub_->finish_sleep();
    }
  }
  std::vector<pollfd> pfds;
  for (int fd : hub_->fds()) pfds.push_back({fd, POLLIN, 0});
  const int ready = pfds.empty() ? 0 : ::poll(pfds.data(), pfds.size(), 0);
  EXPECT_EQ(ready, 0) << "after the client closed its submit doorbell, " << ready
                      << " of the loop's ring fds stay ready (POLLHUP) for ever: tandemd's poll() returns at once "
                         "on every iteration (busy loop) while the session lives; want the session ended";
  r->fds.close_all();
}

}  // namespace
}  // namespace tandem::daemon
