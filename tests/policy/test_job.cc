#include <gtest/gtest.h>

#include <functional>

#include "fixtures.h"

namespace tandem::policy {
namespace {

using testing::at;
const Route kGpu{Device::gpu, 32, false, "m"};
const Route kCpu{Device::cpu, 0, false, "m"};

enum class T { start, tokens, complete, retry, migrate, fail, cancel };
constexpr T kAll[] = {T::start, T::tokens, T::complete, T::retry, T::migrate, T::fail, T::cancel};

Status apply(Job& j, T t, std::uint32_t tokens = 0) {
  switch (t) {
    case T::start: return j.start(j.phase() == JobPhase::retrying ? kCpu : kGpu, at(1s));  // a retry runs on the cpu
    case T::tokens: return j.record_tokens(tokens);
    case T::complete: return j.complete(at(2s));
    case T::retry: return j.begin_retry("device_lost", at(2s));
    case T::migrate: return j.begin_migration("device_lost", at(2s));
    case T::fail: return j.fail(Errc::device_lost, "no_cpu_route", 5s, at(2s));
    case T::cancel: return j.cancel(at(2s));
  }
  return {};
}

// Puts a job into `phase` through legal transitions (with `tokens` delivered if it passed through running).
Job job_in(JobPhase phase, std::uint32_t tokens) {
  Job j(1, 42, "m", at(0s));
  auto must = [](Status s) { EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message); };
  switch (phase) {
    case JobPhase::queued: break;
    case JobPhase::running: must(j.start(kGpu, at(1s))); must(j.record_tokens(tokens)); break;
    case JobPhase::retrying: must(j.start(kGpu, at(1s))); must(j.begin_retry("x", at(1s))); break;
    case JobPhase::migrating:
      must(j.start(kGpu, at(1s))); must(j.record_tokens(tokens == 0 ? 1 : tokens)); must(j.begin_migration("x", at(1s)));
      break;
    case JobPhase::completed: must(j.start(kGpu, at(1s))); must(j.complete(at(1s))); break;
    case JobPhase::failed: must(j.fail(Errc::rejected, "x", 1s, at(1s))); break;
    case JobPhase::cancelled: must(j.cancel(at(1s))); break;
  }
  EXPECT_EQ(j.phase(), phase);
  return j;
}

// The full transition matrix: (phase, transition, tokens delivered) → allowed?, resulting phase.
TEST(Job, TransitionMatrix) {
  struct Row {
    JobPhase from;
    T t;
    std::uint32_t tokens;
    bool ok;
    JobPhase to;
  };
  using P = JobPhase;
  const Row rows[] = {
      {P::queued, T::start, 0, true, P::running},       {P::queued, T::tokens, 0, false, P::queued},
      {P::queued, T::complete, 0, false, P::queued},    {P::queued, T::retry, 0, false, P::queued},
      {P::queued, T::migrate, 0, false, P::queued},     {P::queued, T::fail, 0, true, P::failed},
      {P::queued, T::cancel, 0, true, P::cancelled},
      {P::running, T::start, 0, false, P::running},     {P::running, T::tokens, 0, true, P::running},
      {P::running, T::complete, 0, true, P::completed}, {P::running, T::retry, 0, true, P::retrying},
      {P::running, T::retry, 3, false, P::running},     {P::running, T::migrate, 0, false, P::running},
      {P::running, T::migrate, 3, true, P::migrating},  {P::running, T::fail, 3, true, P::failed},
      {P::running, T::cancel, 3, true, P::cancelled},
      {P::retrying, T::start, 0, true, P::running},     {P::retrying, T::tokens, 0, false, P::retrying},
      {P::retrying, T::complete, 0, false, P::retrying}, {P::retrying, T::retry, 0, false, P::retrying},
      {P::retrying, T::fail, 0, true, P::failed},       {P::retrying, T::cancel, 0, true, P::cancelled},
      {P::migrating, T::start, 3, true, P::running},    {P::migrating, T::complete, 3, false, P::migrating},
      {P::migrating, T::migrate, 3, false, P::migrating}, {P::migrating, T::fail, 3, true, P::failed},
      {P::migrating, T::cancel, 3, true, P::cancelled},
  };
  for (const auto& r : rows) {
    Job j = job_in(r.from, r.tokens);
    Status s = apply(j, r.t, r.tokens);
    EXPECT_EQ(s.ok(), r.ok) << job_phase_name(r.from) << " t=" << static_cast<int>(r.t);
    if (!s.ok()) { EXPECT_EQ(s.error().code, Errc::illegal_transition) << s.error().message; }
    EXPECT_EQ(j.phase(), r.to) << job_phase_name(r.from) << " t=" << static_cast<int>(r.t);
  }
}

TEST(Job, TerminalStatesAcceptNothing) {
  for (JobPhase p : {JobPhase::completed, JobPhase::failed, JobPhase::cancelled}) {
    for (T t : kAll) {
      Job j = job_in(p, 0);
      Status s = apply(j, t, 1);
      EXPECT_FALSE(s.ok()) << job_phase_name(p) << " " << static_cast<int>(t);
      EXPECT_EQ(j.phase(), p);
      EXPECT_TRUE(j.terminal());
    }
  }
}

TEST(Job, RetryKeepsIdAndSeedAndCountsAttempts) {
  Job j(7, 1234, "m", at(0s));
  ASSERT_TRUE(j.start(kGpu, at(1s)).ok());
  ASSERT_TRUE(j.begin_retry("device_lost", at(2s)).ok());
  ASSERT_TRUE(j.start(kCpu, at(3s)).ok());
  EXPECT_EQ(j.id(), 7u);
  EXPECT_EQ(j.seed(), 1234u);
  EXPECT_EQ(j.attempts(), 2u);
  ASSERT_NE(j.route(), nullptr);
  EXPECT_EQ(j.route()->device, Device::cpu);
  ASSERT_TRUE(j.complete(at(4s)).ok());
  EXPECT_EQ(j.route(), nullptr);
  ASSERT_EQ(j.history().size(), 4u);
  EXPECT_EQ(j.history()[1].reason, "device_lost");
  EXPECT_EQ(j.history()[2].to, JobPhase::running);
  EXPECT_EQ(j.history()[3].at, at(4s));
}

TEST(Job, CheckpointCarriesWhatWasDelivered) {
  Job j(7, 99, "m", at(0s));
  ASSERT_TRUE(j.start(kGpu, at(1s)).ok());
  ASSERT_TRUE(j.record_tokens(5).ok());
  EXPECT_EQ(j.record_tokens(4).error().code, Errc::invalid_argument);  // delivered tokens never go back
  ASSERT_TRUE(j.begin_migration("device_lost", at(2s)).ok());
  ASSERT_NE(j.checkpoint(), nullptr);
  EXPECT_EQ(*j.checkpoint(), (Checkpoint{99, 5, "m"}));
  ASSERT_TRUE(j.fail(Errc::device_lost, "cpu_queue_full", 3s, at(3s)).ok());
  ASSERT_NE(j.failure(), nullptr);
  EXPECT_EQ(j.failure()->checkpoint, (Checkpoint{99, 5, "m"}));
  EXPECT_EQ(j.failure()->retry_after, 3s);
  EXPECT_EQ(j.failure()->code, Errc::device_lost);
}

// Review gap: a retry after a GPU failure runs on the CPU (the failover rule); any other route is refused
// and leaves the job retrying.
TEST(Job, RetryStartsOnlyOnTheCpu) {
  struct Row {
    Route route;
    bool ok;
  };
  const Row rows[] = {
      {kGpu, false},
      {Route{Device::hybrid, 16, false, "m"}, false},
      {kCpu, true},
      {Route{Device::cpu, 0, true, "small"}, true},  // a fallback model on the CPU is still the CPU route
  };
  for (const auto& r : rows) {
    Job j = job_in(JobPhase::retrying, 0);
    Status s = j.start(r.route, at(3s));
    EXPECT_EQ(s.ok(), r.ok) << device_name(r.route.device);
    if (!s.ok()) {
      EXPECT_EQ(s.error().code, Errc::illegal_transition);
      EXPECT_EQ(j.phase(), JobPhase::retrying);
      EXPECT_EQ(j.attempts(), 1u);
    } else {
      EXPECT_EQ(j.phase(), JobPhase::running);
    }
  }
}

// Review #6: reproducibility is something the caller must establish; an input that does not say so fails closed.
TEST(Failover, ReproducibilityDefaultsToFalse) {
  FailoverInput in;
  EXPECT_FALSE(in.sampling_reproducible);
  in.tokens_delivered = 5;
  in.cpu_route_available = true;
  FailoverDecision d = FailoverPolicy{}.decide(in);
  EXPECT_EQ(d.action, FailoverAction::fail_resumable);
  EXPECT_EQ(d.reason, "sampling_not_reproducible");
}

// Failover rule table (DESIGN §2.6).
TEST(Failover, RuleTable) {
  struct Row {
    std::uint32_t tokens;
    bool reproducible, side_effects, cpu, allow_migration;
    FailoverAction action;
    const char* reason;
  };
  using A = FailoverAction;
  const Row rows[] = {
      {0, true, false, true, true, A::retry_on_cpu, "no_tokens_delivered"},
      {0, false, true, true, false, A::retry_on_cpu, "no_tokens_delivered"},  // nothing delivered: always safe
      {0, true, false, false, true, A::fail_resumable, "no_cpu_route"},
      {5, true, false, true, true, A::migrate_at_checkpoint, "checkpoint_reproducible"},
      {5, true, true, true, true, A::fail_resumable, "side_effects"},
      {5, false, false, true, true, A::fail_resumable, "sampling_not_reproducible"},
      {5, true, false, true, false, A::fail_resumable, "migration_disabled"},
      {5, true, false, false, true, A::fail_resumable, "no_cpu_route"},
  };
  for (const auto& r : rows) {
    FailoverPolicy p(FailoverConfig{r.allow_migration});
    FailoverDecision d = p.decide(FailoverInput{r.tokens, r.reproducible, r.side_effects, r.cpu});
    EXPECT_EQ(d.action, r.action) << r.reason;
    EXPECT_EQ(d.reason, r.reason);
  }
}

}  // namespace
}  // namespace tandem::policy
