// The daemon side of ring sessions (src/daemon/ring_hub.cc, docs/rings.md) over a real Service with the scripted
// FakeBackend: RingHub::open hands out the fds, a ring::RingClient in this process attaches to them (and the test maps
// the memfd a second time to write hand-made, hostile entries), and the test drives the loop the way tandemd does —
// Service::process_events()/flush_changes() and RingHub::process() — until a condition holds. No D-Bus, no LibTorch.
#include "ring_hub_fixture.h"

namespace tandem::daemon {
namespace {

using namespace tandem::daemon::ring_testing;

// --- open ------------------------------------------------------------------------------------------------------------

TEST_F(RingHubTest, OpenRefusals) {
  ASSERT_NO_FATAL_FAILURE(start());
  struct Case {
    const char* name;
    Caller caller;
    Dict options;
    bool enabled;
    Errc want;
    const char* message_has;
  };
  const std::vector<Case> cases = {
      {"rings disabled", alice_, {}, false, Errc::unavailable, "disabled"},
      {"may not submit", mallory_, {}, true, Errc::permission_denied, "may not submit"},
      {"unknown option", alice_, {{"bogus", std::uint64_t{1}}}, true, Errc::invalid_argument, "bogus"},
      {"option of the wrong type", alice_, {{"sq_entries", std::string("8")}}, true, Errc::invalid_argument,
       "sq_entries"},
      {"sq_entries above max", alice_, {{"sq_entries", std::uint32_t{8192}}}, true, Errc::invalid_argument,
       "sq_entries"},
      {"sq_entries past 32 bits", alice_, {{"sq_entries", std::uint64_t{1} << 33}}, true, Errc::invalid_argument,
       "sq_entries"},
      {"cq_entries above max", alice_, {{"cq_entries", std::uint64_t{1} << 20}}, true, Errc::invalid_argument,
       "cq_entries"},
      {"request area above max", alice_, {{"request_data_bytes", std::uint64_t{32} * kMiB}}, true,
       Errc::invalid_argument, "request_data_bytes"},
      {"response area above max", alice_, {{"response_data_bytes", std::uint64_t{17} * kMiB}}, true,
       Errc::invalid_argument, "response_data_bytes"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    RingConfig rc;
    rc.enabled = c.enabled;
    RingHub hub(svc_.get(), rc);
    auto r = hub.open(c.caller, c.options);
    ASSERT_FALSE(r) << c.name << ": want " << errc_name(c.want) << ", got a session";
    EXPECT_EQ(r.error().code, c.want) << c.name << ": want " << errc_name(c.want) << ", got " << describe(r);
    EXPECT_THAT(r.error().message, HasSubstr(c.message_has)) << c.name;
    EXPECT_FALSE(hub.any_sessions()) << c.name;
    EXPECT_EQ(hub.counters()["ring_sessions_opened"], 0u) << c.name;
  }
}

TEST_F(RingHubTest, SessionLimitsPerUserAndInAll) {
  RingConfig rc;
  rc.max_sessions = 3;
  rc.max_sessions_per_user = 2;
  ASSERT_NO_FATAL_FAILURE(start(rc));
  Peer* a1 = open(alice_);
  Peer* a2 = open(alice2_);  // same uid, other bus name: counts for alice
  ASSERT_TRUE(a1 && a2);
  auto third = hub_->open(alice_, {});
  ASSERT_FALSE(third) << "alice's third session: want queue_full (per user), got a session";
  EXPECT_EQ(third.error().code, Errc::queue_full) << describe(third);
  EXPECT_THAT(third.error().message, HasSubstr("max_sessions_per_user"));
  Peer* b = open(bob_);  // 3 in all
  ASSERT_TRUE(b);
  auto fourth = hub_->open(carol_, {});
  ASSERT_FALSE(fourth) << "a fourth session: want queue_full (in all), got a session";
  EXPECT_EQ(fourth.error().code, Errc::queue_full) << describe(fourth);
  EXPECT_THAT(fourth.error().message, HasSubstr("[rings] max_sessions)"));
  EXPECT_EQ(counter("ring_sessions_open"), 3u);
  // A closed session frees its place.
  ASSERT_TRUE(hub_->close(alice_, a1->id)) << "owner close";
  ASSERT_TRUE(open(carol_));
  ASSERT_TRUE(hub_->close(bob_, b->id)) << "owner close";
  ASSERT_TRUE(open(alice_)) << "alice has one session now, the limit is 2; 2 open in all, the limit is 3";
  EXPECT_EQ(counter("ring_sessions_opened"), 5u);
  EXPECT_EQ(counter("ring_sessions_closed"), 2u);
}

TEST_F(RingHubTest, LayoutDictMatchesTheSealedMapping) {
  RingConfig rc;
  rc.max_backlog_bytes = 256 * 1024;
  ASSERT_NO_FATAL_FAILURE(start(rc));
  auto r = hub_->open(alice_, {{"sq_entries", std::uint32_t{10}},
                               {"cq_entries", std::uint64_t{20}},
                               {"request_data_bytes", std::uint64_t{5000}}});
  ASSERT_TRUE(r) << describe(r);
  const Dict& d = r->layout;
  auto u64 = [&](const char* k) -> std::uint64_t {
    auto it = d.find(k);
    if (it == d.end()) {
      ADD_FAILURE() << "layout has no '" << k << "'";
      return 0;
    }
    if (auto* v = std::get_if<std::uint64_t>(&it->second)) return *v;
    if (auto* v = std::get_if<std::uint32_t>(&it->second)) return *v;
    ADD_FAILURE() << "layout '" << k << "' is not an unsigned integer";
    return 0;
  };
  EXPECT_EQ(u64("session_id"), r->session_id);
  EXPECT_EQ(u64("abi_major"), ring::kAbiMajor);
  EXPECT_EQ(u64("abi_minor"), ring::kAbiMinor);
  EXPECT_EQ(u64("features"), 0u);
  EXPECT_EQ(u64("sq_entries"), 16u) << "10 rounds up to a power of two";
  EXPECT_EQ(u64("cq_entries"), 32u) << "20 rounds up to a power of two";
  EXPECT_EQ(u64("request_data_bytes"), 8192u) << "5000 rounds up to 4 KiB";
  EXPECT_EQ(u64("response_data_bytes"), rc.default_data_bytes) << "absent = the default";
  EXPECT_EQ(u64("max_request_bytes"), 4096u) << "half the request area";
  EXPECT_EQ(u64("max_backlog_bytes"), rc.max_backlog_bytes);

  struct stat st{};
  ASSERT_EQ(::fstat(r->fds.memfd, &st), 0);
  EXPECT_EQ(static_cast<std::uint64_t>(st.st_size), u64("total_size"));
  const int seals = ::fcntl(r->fds.memfd, F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
      << "seals 0x" << std::hex << seals;
  EXPECT_NE(::ftruncate(r->fds.memfd, 4096), 0) << "a client must not be able to shrink the memfd";
  EXPECT_NE(::fcntl(r->fds.sq_doorbell_write, F_GETFL) & O_NONBLOCK, 0) << "submit doorbell is non-blocking";
  EXPECT_NE(::fcntl(r->fds.cq_doorbell_read, F_GETFL) & O_NONBLOCK, 0) << "completion doorbell is non-blocking";
  EXPECT_EQ(::fcntl(r->fds.sq_doorbell_write, F_GETFL) & O_ACCMODE, O_WRONLY) << "the client gets the write end";
  EXPECT_EQ(::fcntl(r->fds.cq_doorbell_read, F_GETFL) & O_ACCMODE, O_RDONLY) << "the client gets the read end";

  void* base = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_SHARED, r->fds.memfd, 0);
  ASSERT_NE(base, MAP_FAILED);
  auto l = ring::read_header(base, static_cast<std::size_t>(st.st_size));
  ASSERT_TRUE(l) << describe(l);
  EXPECT_EQ(l->session_id, r->session_id);
  EXPECT_EQ(l->sq_entries, u64("sq_entries"));
  EXPECT_EQ(l->cq_entries, u64("cq_entries"));
  EXPECT_EQ(l->request_data_size, u64("request_data_bytes"));
  EXPECT_EQ(l->response_data_size, u64("response_data_bytes"));
  EXPECT_EQ(l->max_request_bytes, u64("max_request_bytes"));
  EXPECT_EQ(l->total_size, u64("total_size"));
  const auto* sq = reinterpret_cast<const ring::SqControl*>(static_cast<const std::uint8_t*>(base) + l->sq_control_offset);
  EXPECT_EQ(sq->state, static_cast<std::uint32_t>(SessionState::open));
  ::munmap(base, static_cast<std::size_t>(st.st_size));
  r->fds.close_all();
}

// --- submissions ---------------------------------------------------------------------------------------------------

TEST_F(RingHubTest, SubmitIsAcceptedFirstThenOrderedUpdatesWithUserData) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(6));
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  const std::vector<std::uint64_t> uds = {0xABCDEF0123ull, 7, 0};
  for (auto ud : uds) ASSERT_TRUE(p->client->submit(ud, submit_record("hello " + std::to_string(ud), 10)));
  std::vector<JobId> jobs;
  for (auto ud : uds) jobs.push_back(wait_accepted(*p, ud));
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_NE(jobs[i], 0u) << "submit " << uds[i];
    ASSERT_TRUE(wait_finished(*p, jobs[i])) << "job " << jobs[i] << " got only: " << p->kinds_of_job(jobs[i]);
  }
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE("job " + std::to_string(jobs[i]));
    const auto evs = p->of_job(jobs[i]);
    EXPECT_EQ(p->kinds_of_job(jobs[i]),
              "accepted,routed,started,tokens,tokens,tokens,tokens,tokens,tokens,finished");
    for (const auto& e : evs) EXPECT_EQ(e.entry.user_data, uds[i]) << kind_name(e) << " echoes another user_data";
    // accepted: the placement.
    const auto& acc = evs.front();
    ASSERT_EQ(acc.kind(), Kind::accepted);
    EXPECT_EQ(ru64(acc, "job_id"), jobs[i]);
    EXPECT_EQ(rstr(acc, "route"), "gpu");
    EXPECT_EQ(rstr(acc, "action"), "admit");
    EXPECT_FALSE(rbool(acc, "existing"));
    EXPECT_EQ(rstr(acc, "fingerprint"), "fp-tiny");
    EXPECT_EQ(rstr(evs[1], "route"), "gpu") << "routed";
    // tokens: contiguous steps, the backend's ids and text.
    std::uint32_t next = 0;
    std::string text;
    std::vector<std::int32_t> ids;
    for (const auto& e : evs) {
      if (e.kind() != Kind::tokens) continue;
      EXPECT_EQ(e.entry.step, next) << "token steps not contiguous";
      EXPECT_EQ(e.entry.flags & ring::kCqeGap, 0) << "gap without overflow";
      next = e.entry.step + e.entry.count;
      const auto t = token_ids(e);
      ids.insert(ids.end(), t.begin(), t.end());
      EXPECT_EQ(e.entry.text_length, token_text(e).size());
      text += token_text(e);
    }
    EXPECT_EQ(ids, FakeBackend::tokens_of(kSeed, 0, 6));
    EXPECT_EQ(text, FakeBackend::text_of(0, 6));
    auto info = svc_->get_job(alice_, jobs[i]);
    ASSERT_TRUE(info) << describe(info);
    EXPECT_EQ(std::get<std::string>(info->at("text")), text) << "streamed text != GetJob text";
    const auto& fin = evs.back();
    EXPECT_EQ(rstr(fin, "state"), "completed");
    EXPECT_EQ(rstr(fin, "finish_reason"), "eos");
    EXPECT_EQ(parse(fin).find("text"), nullptr) << "finished must not repeat the text";
  }
  // Nothing went to the bus: the updates of ring jobs go to the ring only.
  EXPECT_TRUE(fwd_.bus_updates.empty()) << fwd_.bus_updates.front();
  EXPECT_EQ(counter("ring_submissions"), 3u);
  EXPECT_EQ(counter("ring_tokens"), 18u);
  EXPECT_EQ(counter("ring_completions"), p->events.size());
  const auto rows = hub_->sessions_view();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(std::get<std::uint64_t>(rows[0].at("jobs")), 3u);
  EXPECT_EQ(std::get<std::string>(rows[0].at("owner")), alice_.bus_name);
}

TEST_F(RingHubTest, MigrationIsStreamedInOrderWithContiguousSteps) {
  ASSERT_NO_FATAL_FAILURE(start());
  Script gpu;
  gpu.tokens = 100;
  gpu.fail = Errc::device_lost;
  gpu.fail_after = 3;
  backend_->set_scripter([gpu](const RunSpec& spec) {
    return spec.route.device == policy::Device::cpu ? emit(100) : gpu;
  });
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->client->submit(9, submit_record("migrate me", 8)));
  const JobId job = wait_accepted(*p, 9);
  ASSERT_NE(job, 0u);
  ASSERT_TRUE(wait_finished(*p, job)) << p->kinds_of_job(job);
  const auto evs = p->of_job(job);
  int migrated = 0;
  std::uint32_t next = 0;
  std::string text;
  for (const auto& e : evs) {
    EXPECT_EQ(e.entry.user_data, 9u) << kind_name(e);
    if (e.kind() == Kind::migrated) {
      ++migrated;
      EXPECT_EQ(next, 3u) << "migrated after the 3 tokens of the GPU run";
      EXPECT_EQ(ru64(e, "tokens_delivered"), 3u);
      EXPECT_EQ(rstr(e, "reason"), std::string(errc_name(Errc::device_lost)));
    }
    if (e.kind() != Kind::tokens) continue;
    EXPECT_EQ(e.entry.step, next) << "steps across the migration";
    next = e.entry.step + e.entry.count;
    text += token_text(e);
  }
  EXPECT_EQ(migrated, 1) << p->kinds_of_job(job);
  EXPECT_EQ(text, FakeBackend::text_of(0, 8));
  EXPECT_EQ(evs.front().kind(), Kind::accepted);
  EXPECT_EQ(rstr(evs.back(), "state"), "completed");
}

TEST_F(RingHubTest, SemanticErrorsAreErrorCompletionsAndTheSessionStaysOpen) {
  ASSERT_NO_FATAL_FAILURE(start());
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  struct Case {
    const char* name;
    std::vector<std::uint8_t> record;
    ring::ErrorCode code;
    const char* message_has;
  };
  const std::vector<Case> cases = {
      {"max_tokens as a string",
       ring::RecordWriter().add("prompt", "x").add("max_tokens", "ten").take(), ring::ErrorCode::invalid_argument,
       "max_tokens"},
      {"unknown key", ring::RecordWriter().add("prompt", "x").add("bogus_option", std::uint64_t{1}).take(),
       ring::ErrorCode::invalid_argument, "bogus_option"},
      {"temperature out of range", ring::RecordWriter().add("prompt", "x").add("temperature", -1.0).take(),
       ring::ErrorCode::invalid_argument, "temperature"},
      {"unknown model", ring::RecordWriter().add("model", "nope").add("prompt", "x").take(),
       ring::ErrorCode::unknown_model, "nope"},
  };
  std::uint64_t ud = 100;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    ++ud;
    ASSERT_TRUE(p->client->submit(ud, c.record));
    ASSERT_TRUE(pump_until([&] { return p->find(Kind::error, ud) || p->find(Kind::accepted, ud); }))
        << c.name << ": no answer";
    const auto* e = p->find(Kind::error, ud);
    ASSERT_NE(e, nullptr) << c.name << ": want an error completion, got accepted";
    EXPECT_EQ(e->entry.job_id, 0u);
    EXPECT_EQ(e->entry.error, static_cast<std::uint16_t>(c.code))
        << c.name << ": want " << ring::error_code_name(c.code) << ", got " << rstr(*e, "error");
    EXPECT_EQ(rstr(*e, "error"), ring::error_code_name(c.code));
    EXPECT_THAT(rstr(*e, "message"), HasSubstr(c.message_has));
    EXPECT_EQ(p->state(), SessionState::open) << c.name << " ended the session";
    EXPECT_TRUE(nop_round_trip(*p, ud + 1000)) << "after " << c.name;
  }
  EXPECT_EQ(counter("ring_sessions_failed"), 0u);
}

TEST_F(RingHubTest, CancelAnswersWithTheStateAndTheJobFinishesCancelled) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(1, 10));
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->client->submit(1, submit_record("cancel me", 10)));
  const JobId job = wait_accepted(*p, 1);
  ASSERT_NE(job, 0u);
  ASSERT_TRUE(pump_until([&] { return backend_->is_blocked(job); }));
  ASSERT_TRUE(p->client->cancel(2, job));
  ASSERT_TRUE(pump_until([&] { return p->find(Kind::cancel_result, 2) || p->find(Kind::error, 2); }));
  const auto* cr = p->find(Kind::cancel_result, 2);
  ASSERT_NE(cr, nullptr) << "want cancel_result, got error";
  EXPECT_EQ(cr->entry.job_id, job);
  EXPECT_EQ(rstr(*cr, "state"), "cancelling") << "a running job is being cancelled";
  ASSERT_TRUE(wait_finished(*p, job)) << p->kinds_of_job(job);
  const auto evs = p->of_job(job);
  EXPECT_EQ(rstr(evs.back(), "state"), "cancelled");
  EXPECT_EQ(evs.back().entry.user_data, 1u) << "job events carry the submit's user_data";

  // Errors: an unknown job, a job of another user.
  ASSERT_TRUE(p->client->cancel(3, 999999));
  auto bobs = svc_->submit(bob_, [] {
    SubmitRequest r;
    r.prompt = "bob's";
    r.options.max_tokens = 4;
    return r;
  }());
  ASSERT_TRUE(bobs) << describe(bobs);
  const auto bob_job = std::get<std::uint64_t>(bobs->at("job_id"));
  ASSERT_TRUE(p->client->cancel(4, bob_job));
  ASSERT_TRUE(pump_until([&] { return p->find(Kind::error, 3) && p->find(Kind::error, 4); }))
      << "want error completions for both cancels";
  EXPECT_EQ(p->find(Kind::error, 3)->entry.error, static_cast<std::uint16_t>(ring::ErrorCode::unknown_job))
      << rstr(*p->find(Kind::error, 3), "error");
  EXPECT_EQ(p->find(Kind::error, 4)->entry.error, static_cast<std::uint16_t>(ring::ErrorCode::not_authorized))
      << rstr(*p->find(Kind::error, 4), "error");
  backend_->release_all();
  ASSERT_TRUE(pump_until([&] { return terminal(bob_job); }));
  EXPECT_EQ(phase(bob_job), "completed") << "alice's cancel must not touch bob's job";
}

TEST_F(RingHubTest, NopIsAnsweredWithItsUserData) {
  ASSERT_NO_FATAL_FAILURE(start());
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  for (std::uint64_t ud : {std::uint64_t{0}, std::uint64_t{1}, ~std::uint64_t{0}}) {
    ASSERT_TRUE(nop_round_trip(*p, ud)) << "nop " << ud;
    const auto* e = p->find(Kind::nop, ud);
    EXPECT_EQ(e->entry.job_id, 0u);
    EXPECT_EQ(e->entry.data_length, 0u);
    EXPECT_EQ(e->entry.error, 0u);
  }
  EXPECT_EQ(p->events.size(), 3u);
}

TEST_F(RingHubTest, IdempotencyKeyOfAnEndedJobIsAcceptedExistingThenFinishedAtOnce) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(3));
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->client->submit(1, submit_record("once", 8, "key-1")));
  const JobId job = wait_accepted(*p, 1);
  ASSERT_NE(job, 0u);
  ASSERT_TRUE(wait_finished(*p, job));
  const std::size_t before = p->events.size();
  ASSERT_TRUE(p->client->submit(2, submit_record("once", 8, "key-1")));
  // One hub pass, no service events in between: accepted(existing) and finished both come from that pass.
  bool got = false;
  for (int i = 0; i < 1000 && !got; ++i) {
    hub_->process();
    ASSERT_TRUE(p->client->reap(p->events));
    got = p->find(Kind::finished, 2) != nullptr;
    if (!got && p->find(Kind::accepted, 2)) break;
  }
  ASSERT_TRUE(got) << "want accepted(existing) then finished from one pass, got: "
                   << [&] {
                        std::string s;
                        for (std::size_t i = before; i < p->events.size(); ++i) s += kind_name(p->events[i]) + " ";
                        return s;
                      }();
  ASSERT_EQ(p->events.size(), before + 2);
  const auto& acc = p->events[before];
  const auto& fin = p->events[before + 1];
  ASSERT_EQ(acc.kind(), Kind::accepted);
  EXPECT_EQ(acc.entry.job_id, job);
  EXPECT_TRUE(rbool(acc, "existing"));
  ASSERT_EQ(fin.kind(), Kind::finished);
  EXPECT_EQ(fin.entry.job_id, job);
  EXPECT_EQ(fin.entry.user_data, 2u);
  EXPECT_EQ(rstr(fin, "state"), "completed");
  EXPECT_EQ(ru64(fin, "tokens_total"), 3u);
  EXPECT_EQ(backend_->runs_of(job).size(), 1u) << "an idempotent resubmit must not run again";
}

TEST_F(RingHubTest, IdempotencyKeyOfARunningJobMovesItsStreamToTheNewSession) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(2, 5));
  Peer* a = open(alice_);
  Peer* b = open(alice2_);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->client->submit(10, submit_record("retry me", 8, "key-2")));
  const JobId job = wait_accepted(*a, 10);
  ASSERT_NE(job, 0u);
  ASSERT_TRUE(pump_until([&] { return backend_->is_blocked(job); }));
  ASSERT_TRUE(pump_until([&] {
    std::uint32_t n = 0;
    for (const auto& e : a->of_job(job)) n += e.kind() == Kind::tokens ? e.entry.count : 0;
    return n == 2;
  })) << a->kinds_of_job(job);
  ASSERT_TRUE(b->client->submit(20, submit_record("retry me", 8, "key-2")));
  ASSERT_EQ(wait_accepted(*b, 20), job);
  EXPECT_TRUE(rbool(*b->find(Kind::accepted, 20), "existing"));
  const std::size_t a_before = a->events.size();
  backend_->release(job);
  ASSERT_TRUE(wait_finished(*b, job)) << "session b got: " << b->kinds_of_job(job);
  std::uint32_t next = 2;
  for (const auto& e : b->of_job(job)) {
    EXPECT_EQ(e.entry.user_data, 20u) << kind_name(e);
    if (e.kind() != Kind::tokens) continue;
    EXPECT_EQ(e.entry.step, next) << "the rest of the stream continues at step 2";
    next = e.entry.step + e.entry.count;
  }
  EXPECT_EQ(next, 5u);
  EXPECT_EQ(a->events.size(), a_before) << "the first session must not get the rest";
}

TEST_F(RingHubTest, IdempotencyKeyOfAFailedJobIsAResumableErrorWithItsFacts) {
  ASSERT_NO_FATAL_FAILURE(start());
  Script gpu;
  gpu.tokens = 100;
  gpu.fail = Errc::device_lost;
  gpu.fail_after = 2;
  backend_->set_scripter([gpu](const RunSpec& spec) {
    return spec.route.device == policy::Device::cpu ? emit(100) : gpu;
  });
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  auto rec = [] {
    return ring::RecordWriter()
        .add("model", "tiny")
        .add("prompt", "fragile")
        .add("max_tokens", std::uint64_t{8})
        .add("seed", kSeed)
        .add("idempotency_key", "key-f")
        .add("side_effects", true)
        .take();
  };
  ASSERT_TRUE(p->client->submit(1, rec()));
  const JobId job = wait_accepted(*p, 1);
  ASSERT_NE(job, 0u);
  ASSERT_TRUE(wait_finished(*p, job)) << p->kinds_of_job(job);
  const auto fin = p->of_job(job).back();
  EXPECT_EQ(rstr(fin, "state"), "failed");
  EXPECT_EQ(rstr(fin, "error_code"), std::string(errc_name(Errc::resumable)));
  EXPECT_EQ(ru64(fin, "tokens_total"), 2u);
  ASSERT_TRUE(p->client->submit(2, rec()));
  ASSERT_TRUE(pump_until([&] { return p->find(Kind::error, 2) || p->find(Kind::accepted, 2); }));
  const auto* e = p->find(Kind::error, 2);
  ASSERT_NE(e, nullptr) << "want a Resumable error, got accepted";
  EXPECT_EQ(e->entry.error, static_cast<std::uint16_t>(ring::ErrorCode::resumable)) << rstr(*e, "error");
  EXPECT_EQ(rstr(*e, "error"), "Resumable");
  EXPECT_EQ(ru64(*e, "job"), job) << "the fact job= is a field";
  EXPECT_EQ(ru64(*e, "tokens"), 2u) << "the fact tokens= is a field";
  EXPECT_NE(parse(*e).find("retry_after_ms"), nullptr) << "the fact retry_after_ms= is a field";
  EXPECT_THAT(rstr(*e, "message"), ::testing::Not(HasSubstr("job="))) << "facts are cut from the message";
  EXPECT_EQ(backend_->runs().size(), 1u) << "never a second run";
}

// --- protocol faults -----------------------------------------------------------------------------------------------

struct FaultCase {
  const char* name;
  Fault fault;
  // Writes the bad input at SQ index `at` (a valid submit sits at index 0, already consumed). Returns the new tail.
  std::function<std::uint32_t(Peer&, std::uint32_t at)> write;
};

std::vector<FaultCase> fault_cases() {
  using ring::Opcode;
  auto one = [](ring::SubmissionEntry e) {
    return [e](Peer& p, std::uint32_t at) {
      p.put(at, e);
      return at + 1;
    };
  };
  auto with_payload = [](std::vector<std::uint8_t> bytes) {
    return [bytes](Peer& p, std::uint32_t at) {
      const std::uint64_t off = 2048;
      p.put_data(off, bytes);
      auto e = entry(Opcode::submit, 66);
      e.data_offset = off;
      e.data_length = static_cast<std::uint32_t>(bytes.size());
      p.put(at, e);
      return at + 1;
    };
  };
  std::vector<FaultCase> v;
  {
    auto e = entry(Opcode::nop, 66);
    e.opcode = 0x42;
    v.push_back({"opcode", Fault::opcode, one(e)});
  }
  {
    auto e = entry(Opcode::nop, 66);
    e.flags = 1;
    v.push_back({"reserved (flags)", Fault::reserved, one(e)});
  }
  {
    auto e = entry(Opcode::nop, 66);
    e.reserved[31] = 1;
    v.push_back({"reserved (bytes)", Fault::reserved, one(e)});
  }
  {
    auto e = entry(Opcode::nop, 66);
    e.job_id = 5;
    v.push_back({"reserved (job id on nop)", Fault::reserved, one(e)});
  }
  {
    auto e = entry(Opcode::nop, 66);
    e.data_length = 8;
    v.push_back({"length (nop with data)", Fault::length, one(e)});
  }
  {
    auto e = entry(Opcode::submit, 66);
    v.push_back({"length (empty submit)", Fault::length, one(e)});
  }
  v.push_back({"length (past max_request_bytes)", Fault::length, [](Peer& p, std::uint32_t at) {
                 auto e = entry(ring::Opcode::submit, 66);
                 e.data_length = p.raw.layout.max_request_bytes + 1;
                 p.put(at, e);
                 return at + 1;
               }});
  v.push_back({"offset", Fault::offset, [](Peer& p, std::uint32_t at) {
                 auto e = entry(ring::Opcode::submit, 66);
                 e.data_offset = p.raw.layout.request_data_size - 8;
                 e.data_length = 64;
                 p.put(at, e);
                 return at + 1;
               }});
  {
    auto rec = ring::RecordWriter().add("prompt", "x").take();
    rec.pop_back();  // value shorter than its length
    v.push_back({"record (truncated)", Fault::record, with_payload(rec)});
  }
  {
    auto rec = ring::RecordWriter().add("prompt", "x").take();
    rec[0] = 99;  // unknown field type
    v.push_back({"record (unknown type)", Fault::record, with_payload(rec)});
  }
  v.push_back({"utf8", Fault::utf8, with_payload(ring::RecordWriter().add("prompt", "bad \xc3\x28 utf8").take())});
  v.push_back({"sq_index (tail ahead)", Fault::sq_index, [](Peer& p, std::uint32_t at) {
                 return at + p.raw.layout.sq_entries + 1;
               }});
  v.push_back({"cq_index (head past the tail)", Fault::cq_index, [](Peer& p, std::uint32_t at) {
                 ring::store_release(&p.cq()->head, p.cq_tail() + 3);
                 p.put(at, entry(ring::Opcode::nop, 66));  // answering it makes the daemon look at the head
                 return at + 1;
               }});
  return v;
}

TEST_F(RingHubTest, EveryProtocolFaultFailsOnlyThatSessionAndItsJobsContinue) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(1, 4));
  Peer* other = open(bob_);
  ASSERT_TRUE(other);
  std::uint64_t other_ud = 1;
  for (const auto& c : fault_cases()) {
    SCOPED_TRACE(c.name);
    const std::string fname(ring::fault_name(c.fault));
    const auto failed_before = counter("ring_sessions_failed");
    const auto kind_before = counter("ring_fault_" + fname);
    const auto fds_before = hub_->fds().size();
    Peer* p = open(alice_);
    ASSERT_TRUE(p);
    // A valid submit first (hand-written at index 0): accepted, then the job blocks after one token.
    const auto rec = submit_record(std::string("before the fault: ") + c.name, 4);
    p->put_data(0, rec);
    auto e = entry(ring::Opcode::submit, 55);
    e.data_length = static_cast<std::uint32_t>(rec.size());
    p->put(0, e);
    p->set_tail(1);
    const JobId job = wait_accepted(*p, 55);
    ASSERT_NE(job, 0u);
    ASSERT_TRUE(pump_until([&] { return backend_->is_blocked(job); }));
    // The bad input; the client stops reading (its head is what the daemon judges in the cq_index case).
    p->reading = false;
    ASSERT_TRUE(p->client->reap(p->events));
    p->set_tail(c.write(*p, 1));
    ASSERT_TRUE(pump_until([&] { return p->state() != SessionState::open; }, 5s))
        << c.name << ": want the session failed (" << fname << "), it stays open";
    EXPECT_EQ(p->state(), SessionState::failed) << c.name;
    EXPECT_EQ(p->fault(), c.fault) << c.name << ": want fault " << fname << ", got "
                                   << ring::fault_name(p->fault());
    EXPECT_EQ(p->client->state(), SessionState::failed) << "the client library sees it";
    EXPECT_EQ(p->client->fault(), c.fault);
    EXPECT_EQ(counter("ring_sessions_failed"), failed_before + 1);
    EXPECT_EQ(counter("ring_fault_" + fname), kind_before + 1) << "counter ring_fault_" << fname;
    EXPECT_EQ(hub_->fds().size(), fds_before) << "the failed session is gone from the loop's fds";
    EXPECT_THAT(log_.str(), HasSubstr("ring session " + std::to_string(p->id) + " of " + alice_.bus_name +
                                      " (uid 1000) failed: " + fname))
        << "warning in the log";
    // Other sessions still work.
    ASSERT_TRUE(nop_round_trip(*other, other_ud++)) << "bob's session after " << c.name;
    // The failed session's job continues to a terminal state (GetJob), sending nothing more to the ring.
    const auto cq_tail = p->cq_tail();
    backend_->release(job);
    ASSERT_TRUE(pump_until([&] { return terminal(job); })) << "job " << job << " is " << phase(job);
    EXPECT_EQ(phase(job), "completed");
    auto info = svc_->get_job(alice_, job);
    ASSERT_TRUE(info);
    EXPECT_EQ(std::get<std::string>(info->at("text")), FakeBackend::text_of(0, 4));
    EXPECT_EQ(p->cq_tail(), cq_tail) << "completions written to a failed session";
    EXPECT_TRUE(fwd_.bus_updates.empty()) << "updates of a failed session's job went to the bus: "
                                          << fwd_.bus_updates.front();
  }
  EXPECT_EQ(other->state(), SessionState::open);
}

}  // namespace
}  // namespace tandem::daemon
