// The two sides in two processes, as in production: forked children are the clients (RingClient over the memfd and
// the pipe ends they inherit), the test process is the daemon side (EchoDaemon: consumer + writer per session).
// Thousands of jobs across several sessions arrive complete and in order; a client killed with SIGKILL mid-stream
// neither blocks nor crashes the daemon side, which keeps serving the others.
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cstdio>

#include "ring_echo.h"
#include "ring_test_util.h"

namespace tandem::ring {
namespace {

using namespace std::chrono_literals;
using test::EchoDaemon;
using test::TestSession;

// SIGPIPE ignored for the test's lifetime, as tandemd does (a dead client's CQ doorbell gives EPIPE).
class IgnoreSigpipe {
 public:
  IgnoreSigpipe() { old_ = ::signal(SIGPIPE, SIG_IGN); }
  ~IgnoreSigpipe() { ::signal(SIGPIPE, old_); }

 private:
  sighandler_t old_;
};

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Forks the client of sessions[index]. The child keeps only its own client ends, runs `body`, and _exits with its
// status (never returns into gtest).
template <class Body>
pid_t fork_client(std::vector<std::unique_ptr<TestSession>>& sessions, std::size_t index, Body body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  for (std::size_t j = 0; j < sessions.size(); ++j) {
    auto& s = *sessions[j];
    close_fd(s.sq_db[0]);
    close_fd(s.cq_db[1]);
    if (j != index) {
      close_fd(s.sq_db[1]);
      close_fd(s.cq_db[0]);
    }
  }
  int status = 1;
  try {
    status = body(*sessions[index]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "client %zu: %s\n", index, e.what());
  }
  std::fflush(nullptr);
  ::_exit(status);
}

// The daemon side gives the client's ends away: close our copies so a dead client shows as a hang-up.
void hand_over(TestSession& s) {
  close_fd(s.sq_db[1]);
  close_fd(s.cq_db[0]);
}

// Waits for a child with a bound (pidfd + poll; no sleeping loop). Returns the wait status, or -1 on timeout.
int wait_child(pid_t pid, std::chrono::milliseconds limit) {
  const int pfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pfd >= 0) {
    pollfd p{pfd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(limit.count()));
    ::close(pfd);
    if (r != 1) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      return -1;
    }
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return status;
}

int client_main(TestSession& s, std::uint64_t jobs) {
  auto c = s.client(SpinPolicy{5us, 0us, 50us});
  auto r = test::run_echo_client(*c, jobs, 90s);
  if (!r.ok) {
    std::fprintf(stderr, "session %llu: %s\n", static_cast<unsigned long long>(c->session_id()), r.error.c_str());
    return 1;
  }
  if (r.jobs_done != jobs) return 2;
  std::fprintf(stderr, "session %llu: %llu jobs, %llu events, %llu nops, %llu queue_full, %llu sleeps\n",
               static_cast<unsigned long long>(c->session_id()), static_cast<unsigned long long>(r.jobs_done),
               static_cast<unsigned long long>(r.events), static_cast<unsigned long long>(r.nops),
               static_cast<unsigned long long>(r.queue_full), static_cast<unsigned long long>(c->stats().sleeps));
  return 0;
}

TEST(TwoProcess, ThousandsOfJobsAcrossSessionsArriveExactlyOnceInOrder) {
  IgnoreSigpipe guard;
  constexpr std::size_t kSessions = 4;
  constexpr std::uint64_t kJobs = 2000;
  std::vector<std::unique_ptr<TestSession>> sessions;
  // Small rings so the SQ, the request area, the CQ and the backlog all fill up and wrap many times.
  for (std::size_t i = 0; i < kSessions; ++i) sessions.push_back(TestSession::create({32, 64, 8192, 16384}, 100 + i));
  std::vector<pid_t> pids;
  for (std::size_t i = 0; i < kSessions; ++i)
    pids.push_back(fork_client(sessions, i, [&](TestSession& s) { return client_main(s, kJobs); }));
  EchoDaemon d;
  for (auto& s : sessions) {
    hand_over(*s);
    d.add(s->view(), s->sq_db[0], s->cq_db[1]);
  }
  const std::uint64_t nops = kJobs / 64;  // one every 64 submissions
  const bool served = d.run(
      [&] {
        for (std::size_t i = 0; i < kSessions; ++i) {
          const auto& s = d.session(i);
          // A client hangs up once it has everything: that ends its session, normally.
          if ((s.ended && !s.hung_up) || s.submits < kJobs || s.nops < nops || !(d.drained(i) || s.hung_up)) return false;
        }
        return true;
      },
      120s);
  for (std::size_t i = 0; i < kSessions; ++i) {
    const int status = wait_child(pids[i], 60s);
    EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "client " << i << " status " << status << " (its stderr says why)";
  }
  ASSERT_TRUE(served) << "daemon side did not finish";
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < kSessions; ++i) {
    const auto& s = d.session(i);
    EXPECT_EQ(s.fault, Fault::none) << i << ": " << fault_name(s.fault) << " " << s.detail;
    EXPECT_EQ(s.bad_requests, 0u);
    EXPECT_EQ(s.writer.stats().dropped_tokens, 0u);
    EXPECT_EQ(s.view.sq()->entries_consumed, s.submits + s.nops);
    total += s.submits;
  }
  EXPECT_EQ(total, kSessions * kJobs);
  EXPECT_EQ(d.lost_wakeups, 0u);
  std::fprintf(stderr, "daemon: %llu passes, %llu sleeps, %llu doorbells rung\n",
               static_cast<unsigned long long>(d.passes), static_cast<unsigned long long>(d.sleeps),
               static_cast<unsigned long long>(d.doorbells_rung));
}

TEST(TwoProcess, AClientKilledMidStreamDoesNotStopTheOthers) {
  IgnoreSigpipe guard;
  std::vector<std::unique_ptr<TestSession>> sessions;
  sessions.push_back(TestSession::create({32, 64, 8192, 16384}, 1));  // the victim
  sessions.push_back(TestSession::create({32, 64, 8192, 16384}, 2));
  sessions.push_back(TestSession::create({32, 64, 8192, 16384}, 3));
  const pid_t victim = fork_client(sessions, 0, [&](TestSession& s) { return client_main(s, 1'000'000); });
  const pid_t other1 = fork_client(sessions, 1, [&](TestSession& s) { return client_main(s, 2000); });
  const pid_t other2 = fork_client(sessions, 2, [&](TestSession& s) { return client_main(s, 2000); });
  EchoDaemon d;
  for (auto& s : sessions) {
    hand_over(*s);
    d.add(s->view(), s->sq_db[0], s->cq_db[1]);
  }
  // Serve until the victim is well into its stream, then kill it.
  ASSERT_TRUE(d.run([&] { return d.session(0).submits >= 300; }, 60s));
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  const int vs = wait_child(victim, 10s);
  EXPECT_TRUE(vs != -1 && WIFSIGNALED(vs) && WTERMSIG(vs) == SIGKILL);
  // Its completions keep coming (nobody reads them: the backlog grows, tokens may be dropped) until the hang-up of
  // its doorbell is seen; the others must finish regardless.
  const std::uint64_t nops = 2000 / 64;
  const bool served = d.run(
      [&] {
        if (!d.session(0).ended) return false;
        for (std::size_t i = 1; i < 3; ++i) {
          const auto& s = d.session(i);
          if ((s.ended && !s.hung_up) || s.submits < 2000 || s.nops < nops || !(d.drained(i) || s.hung_up)) return false;
        }
        return true;
      },
      120s);
  for (pid_t p : {other1, other2}) {
    const int status = wait_child(p, 60s);
    EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
  ASSERT_TRUE(served);
  EXPECT_TRUE(d.session(0).hung_up);
  EXPECT_EQ(d.session(0).fault, Fault::none) << d.session(0).detail;
  EXPECT_EQ(load_acquire(&d.session(0).view.sq()->state), static_cast<std::uint32_t>(SessionState::closed));
  for (std::size_t i = 1; i < 3; ++i) EXPECT_EQ(d.session(i).fault, Fault::none) << d.session(i).detail;
  // Posting to the dead session's writer still never blocks (only backlog or drop).
  for (int k = 0; k < 1000; ++k)
    ASSERT_EQ(d.session(0).writer.post(token_completion(1, 1, 100000 + k, {1}, "x")), Fault::none);
}

}  // namespace
}  // namespace tandem::ring
