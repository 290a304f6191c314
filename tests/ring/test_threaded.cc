// Client threads and a daemon thread over shared rings, both sides spinning then sleeping on the doorbells: the
// test ThreadSanitizer runs (build-tsan-ring) to check the index/flag protocol's memory ordering. The same checks as
// the two-process test: every job's completions arrive once, in order, with contiguous token steps.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "ring_echo.h"
#include "ring_test_util.h"

namespace tandem::ring {
namespace {

using namespace std::chrono_literals;
using test::EchoDaemon;
using test::TestSession;

void run_threads(std::size_t sessions_n, std::uint64_t jobs, SpinPolicy client_spin,
                 std::chrono::microseconds daemon_spin, LayoutRequest req) {
  std::vector<std::unique_ptr<TestSession>> sessions;
  for (std::size_t i = 0; i < sessions_n; ++i) sessions.push_back(TestSession::create(req, i + 1));
  // Clients attach before the daemon thread starts (as after OpenSession).
  std::vector<std::unique_ptr<RingClient>> clients;
  for (auto& s : sessions) clients.push_back(s->client(client_spin));
  EchoDaemon d;
  for (auto& s : sessions) d.add(s->view(), s->sq_db[0], s->cq_db[1]);
  std::atomic<std::size_t> clients_done{0};
  std::vector<test::EchoClientResult> results(sessions_n);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < sessions_n; ++i)
    threads.emplace_back([&, i] {
      results[i] = test::run_echo_client(*clients[i], jobs, 120s);
      ++clients_done;
      // Wake the daemon so it sees clients_done (its own doorbell, like a client's ring).
      const char one = 1;
      (void)!::write(sessions[i]->sq_db[1], &one, 1);
    });
  bool served = false;
  std::thread daemon([&] { served = d.run([&] { return clients_done.load() == sessions_n; }, 150s, daemon_spin); });
  for (auto& t : threads) t.join();
  daemon.join();
  EXPECT_TRUE(served);
  for (std::size_t i = 0; i < sessions_n; ++i) {
    EXPECT_TRUE(results[i].ok) << "session " << i << ": " << results[i].error;
    EXPECT_EQ(results[i].jobs_done, jobs);
    EXPECT_FALSE(d.session(i).ended) << fault_name(d.session(i).fault) << " " << d.session(i).detail;
    EXPECT_EQ(d.session(i).submits, jobs);
  }
  EXPECT_EQ(d.lost_wakeups, 0u);
  std::printf("threads: %zu sessions x %llu jobs; daemon %llu passes, %llu sleeps, %llu doorbells; client sleeps:",
              sessions_n, static_cast<unsigned long long>(jobs), static_cast<unsigned long long>(d.passes),
              static_cast<unsigned long long>(d.sleeps), static_cast<unsigned long long>(d.doorbells_rung));
  for (auto& c : clients) std::printf(" %llu", static_cast<unsigned long long>(c->stats().sleeps));
  std::printf("\n");
}

TEST(Threaded, TwoClientsOneDaemonSpinThenSleep) {
  run_threads(2, 4000, SpinPolicy{10us, 0us, 100us}, 50us, {16, 32, 4096, 8192});
}

// No spinning at all: every wait goes through the NEED_WAKEUP flags and the doorbells (the lost-wake-up path).
TEST(Threaded, AlwaysSleepThroughTheDoorbells) {
  run_threads(1, 4000, SpinPolicy{0us, 0us, 0us}, 0us, {8, 16, 4096, 4096});
}

}  // namespace
}  // namespace tandem::ring
