// RingClient (src/ring/client_ring.cc) against the daemon-side consumer and writer in one process, over a real memfd
// and two doorbell pipes: attach, submit/cancel/nop, queue_full (SQ or request area), reclaim, session end seen by
// the client, wait() timeout and wake-ups, the doorbells, and reap() refusing inconsistent completions.
#include "ring/client_ring.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "ring/completion_writer.h"
#include "ring/consumer.h"
#include "ring_test_util.h"

namespace tandem::ring {
namespace {

using namespace std::chrono_literals;
using test::TestSession;

// Waits (yielding, bounded) until `pred` holds: the condition the other thread is blocked on.
template <class F>
bool eventually(F pred, std::chrono::milliseconds limit = 10s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::yield();
  }
  return true;
}

std::vector<std::uint8_t> sized_request(std::size_t bytes, char fill) {
  const std::string p(bytes - kFieldHeaderSize - 6, fill);
  auto r = RecordWriter().add("prompt", std::string_view(p)).take();
  EXPECT_EQ(r.size(), bytes);
  return r;
}

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    s = TestSession::create({8, 8, 4096, 4096}, 77);
    consumer = SubmissionConsumer(s->view());
    writer = CompletionWriter(s->view(), 1 << 20);
    client = s->client(SpinPolicy{2us, 0us, 20us});
  }
  std::unique_ptr<TestSession> s;
  SubmissionConsumer consumer;
  CompletionWriter writer;
  std::unique_ptr<RingClient> client;
};

TEST_F(ClientTest, AttachReadsTheHeader) {
  EXPECT_EQ(client->session_id(), 77u);
  EXPECT_EQ(client->layout().sq_entries, 8u);
  EXPECT_EQ(client->layout().cq_entries, 8u);
  EXPECT_EQ(client->layout().max_request_bytes, 2048u);
  EXPECT_EQ(client->state(), SessionState::open);
  EXPECT_EQ(client->fault(), Fault::none);
  EXPECT_EQ(client->in_flight_submissions(), 0u);
}

bool fd_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

TEST_F(ClientTest, AttachFailuresCloseTheFds) {
  {
    int p[2];
    ASSERT_EQ(::pipe(p), 0);
    auto c = RingClient::attach(-1, p[0], p[1]);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.error().code, Errc::invalid_argument);
    EXPECT_FALSE(fd_open(p[0]));
    EXPECT_FALSE(fd_open(p[1]));
  }
  {
    // A memfd that is not a ring.
    int m = ::memfd_create("not-a-ring", MFD_CLOEXEC);
    ASSERT_GE(m, 0);
    ASSERT_EQ(::ftruncate(m, 8192), 0);
    int p[2];
    ASSERT_EQ(::pipe(p), 0);
    auto c = RingClient::attach(m, p[0], p[1]);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.error().code, Errc::incompatible);
    EXPECT_FALSE(fd_open(m));
    EXPECT_FALSE(fd_open(p[0]));
  }
  {
    // An empty memfd.
    int m = ::memfd_create("empty", MFD_CLOEXEC);
    int p[2];
    ASSERT_EQ(::pipe(p), 0);
    auto c = RingClient::attach(m, p[0], p[1]);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.error().code, Errc::format_error);
  }
  {
    // A session with submissions the daemon has not read: already in use.
    s->set_sq_tail(1);
    EXPECT_THROW(s->client(), std::runtime_error);
  }
}

TEST_F(ClientTest, SubmitCancelNopRoundTrip) {
  const auto rec = test::simple_request("hi");
  ASSERT_TRUE(client->submit(1, rec).ok());
  ASSERT_TRUE(client->cancel(2, 555).ok());
  ASSERT_TRUE(client->nop(3).ok());
  EXPECT_EQ(client->in_flight_submissions(), 3u);
  auto r = consumer.consume(100);
  ASSERT_EQ(r.fault, Fault::none) << r.detail;
  ASSERT_EQ(r.commands.size(), 3u);
  EXPECT_EQ(r.commands[0].op, Opcode::submit);
  EXPECT_EQ(r.commands[0].user_data, 1u);
  EXPECT_EQ(std::get<std::string>(r.commands[0].record[1].value), "hi");
  EXPECT_EQ(r.commands[1].op, Opcode::cancel);
  EXPECT_EQ(r.commands[1].job_id, 555u);
  EXPECT_EQ(r.commands[2].op, Opcode::nop);
  EXPECT_EQ(client->in_flight_submissions(), 0u);

  const auto acc = RecordWriter().add("job_id", std::uint64_t{10}).take();
  ASSERT_EQ(writer.post(record_completion(Kind::accepted, 1, 10, acc)), Fault::none);
  ASSERT_EQ(writer.post(token_completion(1, 10, 0, {4, 5}, "ab")), Fault::none);
  ASSERT_EQ(writer.post(record_completion(Kind::cancel_result, 2, 555, {})), Fault::none);
  ASSERT_EQ(writer.post(record_completion(Kind::nop, 3, 0, {})), Fault::none);
  std::vector<Event> ev;
  auto n = client->reap(ev);
  ASSERT_TRUE(n.ok());
  ASSERT_EQ(*n, 4u);
  EXPECT_EQ(ev[0].kind(), Kind::accepted);
  EXPECT_EQ(ev[0].data, acc);
  EXPECT_EQ(ev[1].kind(), Kind::tokens);
  EXPECT_EQ(ev[1].entry.count, 2u);
  EXPECT_EQ(ev[1].data.size(), 10u);
  EXPECT_EQ(ev[2].kind(), Kind::cancel_result);
  EXPECT_EQ(ev[3].kind(), Kind::nop);
  EXPECT_EQ(load_acquire(&s->cq()->head), 4u);
  ev.clear();
  EXPECT_EQ(*client->reap(ev), 0u);
}

TEST_F(ClientTest, ReapHonoursMax) {
  for (int i = 0; i < 5; ++i) ASSERT_EQ(writer.post(record_completion(Kind::nop, i, 0, {})), Fault::none);
  std::vector<Event> ev;
  EXPECT_EQ(*client->reap(ev, 2), 2u);
  EXPECT_EQ(*client->reap(ev), 3u);
  ASSERT_EQ(ev.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(ev[i].entry.user_data, static_cast<std::uint64_t>(i));
}

TEST_F(ClientTest, QueueFullWhenTheSqIsFullThenReclaimed) {
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(client->nop(i).ok());
  auto st = client->nop(8);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, Errc::queue_full);
  EXPECT_EQ(client->stats().submit_full, 1u);
  EXPECT_EQ(client->in_flight_submissions(), 8u);
  ASSERT_EQ(consumer.consume(3).commands.size(), 3u);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(client->nop(100 + i).ok());
  EXPECT_EQ(client->nop(200).error().code, Errc::queue_full);
  auto r = consumer.consume(100);
  ASSERT_EQ(r.commands.size(), 8u);
  EXPECT_EQ(r.commands.back().user_data, 102u);
}

TEST_F(ClientTest, QueueFullWhenTheRequestAreaIsFullThenReclaimed) {
  ASSERT_TRUE(client->submit(1, sized_request(1500, 'a')).ok());
  ASSERT_TRUE(client->submit(2, sized_request(1500, 'b')).ok());
  auto st = client->submit(3, sized_request(1500, 'c'));  // 3 x 1500 > 4096; SQ slots are free
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, Errc::queue_full);
  ASSERT_TRUE(client->nop(9).ok());  // no data: still fits
  ASSERT_EQ(consumer.consume(1).commands.size(), 1u);  // frees the first 1500 bytes
  ASSERT_TRUE(client->submit(3, sized_request(1500, 'c')).ok());  // wraps to offset 0
  auto r = consumer.consume(100);
  ASSERT_EQ(r.fault, Fault::none) << r.detail;
  ASSERT_EQ(r.commands.size(), 3u);
  EXPECT_EQ(std::get<std::string>(r.commands[0].record[0].value), std::string(1500 - 14, 'b'));
  EXPECT_EQ(std::get<std::string>(r.commands[2].record[0].value), std::string(1500 - 14, 'c'));
}

TEST_F(ClientTest, SubmitArgumentErrors) {
  EXPECT_EQ(client->submit(1, {}).error().code, Errc::invalid_argument);
  EXPECT_EQ(client->submit(1, sized_request(2049, 'x')).error().code, Errc::invalid_argument);
  EXPECT_TRUE(client->submit(1, sized_request(2048, 'x')).ok());
}

TEST_F(ClientTest, ManyRoundsWrapBothAreasIntact) {
  std::uint64_t ud = 0, seen = 0;
  for (int round = 0; round < 300; ++round) {
    // Fill until full, then let the daemon take a random part.
    for (;;) {
      const std::size_t size = 20 + (ud * 37) % 1200;
      auto st = client->submit(ud, sized_request(size, static_cast<char>('a' + ud % 26)));
      if (!st.ok()) {
        ASSERT_EQ(st.error().code, Errc::queue_full);
        break;
      }
      ++ud;
    }
    auto r = consumer.consume(1 + round % 5);
    ASSERT_EQ(r.fault, Fault::none) << r.detail;
    for (const auto& c : r.commands) {
      ASSERT_EQ(c.user_data, seen);
      const std::size_t size = 20 + (seen * 37) % 1200;
      ASSERT_EQ(std::get<std::string>(c.record[0].value), std::string(size - 14, static_cast<char>('a' + seen % 26)));
      ++seen;
    }
  }
  EXPECT_GT(seen, 500u);
}

TEST_F(ClientTest, SessionFailedOrClosedIsSeenByTheClient) {
  store_release(&s->sq()->fault, static_cast<std::uint32_t>(Fault::record));
  store_release(&s->sq()->state, static_cast<std::uint32_t>(SessionState::failed));
  EXPECT_EQ(client->state(), SessionState::failed);
  EXPECT_EQ(client->fault(), Fault::record);
  auto st = client->nop(1);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, Errc::unavailable);
  EXPECT_NE(st.error().message.find("record"), std::string::npos) << st.error().message;
  // wait() returns at once (no completions, session over) instead of sleeping out its timeout.
  std::vector<Event> ev;
  const auto t0 = std::chrono::steady_clock::now();
  auto n = client->wait(ev, 20s);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);

  auto s2 = TestSession::create({8, 8, 4096, 4096});
  auto c2 = s2->client();
  store_release(&s2->sq()->state, static_cast<std::uint32_t>(SessionState::closed));
  EXPECT_EQ(c2->state(), SessionState::closed);
  EXPECT_EQ(c2->submit(1, test::simple_request("x")).error().code, Errc::unavailable);
}

TEST_F(ClientTest, WaitTimesOut) {
  std::vector<Event> ev;
  const auto t0 = std::chrono::steady_clock::now();
  auto n = client->wait(ev, 60ms);
  const auto dt = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
  EXPECT_GE(dt, 60ms);
  EXPECT_LT(dt, 5s);
  EXPECT_GE(client->stats().sleeps, 1u);
  EXPECT_EQ(load_acquire(&s->cq()->client_flags) & kCqNeedWakeup, 0u) << "flag cleared after waking";
  EXPECT_EQ(client->spin_budget(), 1us) << "a sleep halves the spin budget";
}

TEST_F(ClientTest, WaitReturnsWhatIsAlreadyThereWithoutSleeping) {
  ASSERT_EQ(writer.post(record_completion(Kind::nop, 1, 0, {})), Fault::none);
  std::vector<Event> ev;
  auto n = client->wait(ev, 10s);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1u);
  EXPECT_EQ(client->stats().sleeps, 0u);
}

// The daemon side (another thread) posts only once the client has announced its sleep, then rings the CQ doorbell
// when take_wakeup() says the client asked for it. (The client may still catch the completion in its re-check after
// the fence and clear the flag first — also correct — so the doorbell path must be seen in at least one of the
// rounds, and every round must deliver.)
TEST_F(ClientTest, WaitIsWokenThroughTheDoorbell) {
  int doorbell_rounds = 0;
  for (std::uint64_t round = 0; round < 20; ++round) {
    bool wakeup = false;
    std::thread daemon([&] {
      ASSERT_TRUE(eventually([&] { return (load_acquire(&s->cq()->client_flags) & kCqNeedWakeup) != 0; }));
      ASSERT_EQ(writer.post(record_completion(Kind::nop, round, 0, {})), Fault::none);
      wakeup = writer.take_wakeup();
      if (wakeup) {
        const char one = 1;
        ASSERT_EQ(::write(s->cq_db[1], &one, 1), 1);
      }
    });
    std::vector<Event> ev;
    const auto t0 = std::chrono::steady_clock::now();
    auto n = client->wait(ev, 30s);
    daemon.join();
    ASSERT_TRUE(n.ok());
    ASSERT_EQ(*n, 1u);
    EXPECT_EQ(ev[0].entry.user_data, round);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
    EXPECT_EQ(load_acquire(&s->cq()->client_flags) & kCqNeedWakeup, 0u);
    doorbell_rounds += wakeup ? 1 : 0;
    if (doorbell_rounds >= 3) break;
  }
  EXPECT_GE(doorbell_rounds, 1);
  EXPECT_GE(client->stats().sleeps, 1u);
}

TEST_F(ClientTest, WaitReturnsWhenTheSessionEndsWhileAsleep) {
  std::thread daemon([&] {
    ASSERT_TRUE(eventually([&] { return (load_acquire(&s->cq()->client_flags) & kCqNeedWakeup) != 0; }));
    store_release(&s->sq()->state, static_cast<std::uint32_t>(SessionState::closed));
    const char one = 1;
    ASSERT_EQ(::write(s->cq_db[1], &one, 1), 1);
  });
  std::vector<Event> ev;
  const auto t0 = std::chrono::steady_clock::now();
  auto n = client->wait(ev, 30s);
  daemon.join();
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
  EXPECT_EQ(client->state(), SessionState::closed);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

TEST_F(ClientTest, WaitReturnsWhenTheExtraFdIsReadable) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  std::thread other([&] {
    ASSERT_TRUE(eventually([&] { return (load_acquire(&s->cq()->client_flags) & kCqNeedWakeup) != 0; }));
    const char one = 1;
    ASSERT_EQ(::write(p[1], &one, 1), 1);
  });
  std::vector<Event> ev;
  auto n = client->wait(ev, 30s, p[0]);
  other.join();
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
  EXPECT_TRUE(test::readable(p[0], 0)) << "the extra fd is the caller's to drain";
  ::close(p[0]);
  ::close(p[1]);
}

TEST_F(ClientTest, SqDoorbellRingsOnlyWhenTheDaemonSleeps) {
  ASSERT_TRUE(client->nop(1).ok());
  EXPECT_EQ(test::drain(s->sq_db[0]), 0u);
  EXPECT_EQ(client->stats().doorbells_rung, 0u);
  fetch_or(&s->sq()->flags, kSqNeedWakeup);
  ASSERT_TRUE(client->nop(2).ok());
  EXPECT_EQ(test::drain(s->sq_db[0]), 1u);
  EXPECT_EQ(client->stats().doorbells_rung, 1u);
  fetch_and(&s->sq()->flags, ~kSqNeedWakeup);
  ASSERT_TRUE(client->nop(3).ok());
  EXPECT_EQ(test::drain(s->sq_db[0]), 0u);
}

TEST_F(ClientTest, ReapingABackloggedCqRingsTheSqDoorbell) {
  for (int i = 0; i < 10; ++i) ASSERT_EQ(writer.post(record_completion(Kind::nop, i, 0, {})), Fault::none);
  ASSERT_TRUE(writer.backlogged());
  ASSERT_EQ(load_acquire(&s->cq()->daemon_flags) & kCqBacklog, kCqBacklog);
  fetch_or(&s->sq()->flags, kSqNeedWakeup);  // the daemon sleeps on the SQ doorbell
  std::vector<Event> ev;
  ASSERT_EQ(*client->reap(ev), 8u);
  EXPECT_EQ(test::drain(s->sq_db[0]), 1u) << "the client must tell a sleeping daemon that CQ room appeared";
  ASSERT_EQ(writer.flush(), Fault::none);
  EXPECT_EQ(*client->reap(ev), 2u);
  EXPECT_EQ(test::drain(s->sq_db[0]), 0u) << "no backlog any more";
}

TEST_F(ClientTest, ReapRefusesInconsistentCompletions) {
  auto bad = [&](auto tweak, std::uint32_t tail) {
    auto s2 = TestSession::create({8, 8, 4096, 4096});
    auto c2 = s2->client();
    CompletionEntry e{};
    e.kind = static_cast<std::uint8_t>(Kind::tokens);
    tweak(e);
    std::memcpy(s2->view().cqes(), &e, sizeof e);
    store_release(&s2->cq()->tail, tail);
    std::vector<Event> ev;
    auto n = c2->reap(ev);
    EXPECT_FALSE(n.ok());
    if (!n.ok()) {
      EXPECT_EQ(n.error().code, Errc::format_error);
    }
  };
  bad([](CompletionEntry& e) { e.data_offset = 4000, e.data_length = 200, e.count = 50; }, 1);
  bad([](CompletionEntry& e) { e.data_offset = ~std::uint64_t{0}, e.data_length = 4, e.count = 1; }, 1);
  bad([](CompletionEntry& e) { e.data_length = 8, e.count = 1, e.text_length = 5; }, 1);
  bad([](CompletionEntry& e) { e.count = 0xffffffffu, e.data_length = 4; }, 1);
  bad([](CompletionEntry&) {}, 9);  // tail ahead of capacity
}

}  // namespace
}  // namespace tandem::ring
