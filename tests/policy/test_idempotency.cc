#include <gtest/gtest.h>

#include "fixtures.h"

namespace tandem::policy {
namespace {

using testing::at;

TEST(Idempotency, SameKeyReturnsTheSameJobAndItsOutcome) {
  IdempotencyRegistry r;
  auto a = r.claim("k1", 10, 0xabc, at(0s));
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->created);
  EXPECT_EQ(a->job, 10u);
  auto b = r.claim("k1", 11, 0xabc, at(1s));
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->created);
  EXPECT_EQ(b->job, 10u);
  EXPECT_FALSE(b->outcome.has_value());
  ASSERT_TRUE(r.record_outcome("k1", 10, StoredOutcome{JobPhase::completed, "sha:1", at(2s)}).ok());
  auto c = r.claim("k1", 12, 0xabc, at(3s));
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->created);
  EXPECT_EQ(c->job, 10u);
  ASSERT_TRUE(c->outcome.has_value());
  EXPECT_EQ(c->outcome->summary, "sha:1");
  // Resume does not re-run a completed job either.
  auto d = r.claim("k1", 13, 0xabc, at(3s), /*resume=*/true);
  EXPECT_FALSE(d->created);
  EXPECT_EQ(d->job, 10u);
}

TEST(Idempotency, ErrorsAndOutcomeRules) {
  IdempotencyRegistry r;
  EXPECT_EQ(r.claim("", 1, 0, at(0s)).error().code, Errc::invalid_argument);
  EXPECT_EQ(r.claim(std::string(257, 'x'), 1, 0, at(0s)).error().code, Errc::invalid_argument);
  ASSERT_TRUE(r.claim("k", 1, 7, at(0s)).ok());
  EXPECT_EQ(r.claim("k", 2, 8, at(0s)).error().code, Errc::duplicate);  // different request, same key
  EXPECT_EQ(r.record_outcome("nope", 1, StoredOutcome{JobPhase::completed, "", at(0s)}).error().code, Errc::not_found);
  EXPECT_EQ(r.record_outcome("k", 1, StoredOutcome{JobPhase::running, "", at(0s)}).error().code, Errc::invalid_argument);
  ASSERT_TRUE(r.record_outcome("k", 1, StoredOutcome{JobPhase::cancelled, "", at(0s)}).ok());
  EXPECT_TRUE(r.record_outcome("k", 1, StoredOutcome{JobPhase::cancelled, "", at(1s)}).ok());  // same again
  EXPECT_EQ(r.record_outcome("k", 1, StoredOutcome{JobPhase::completed, "", at(1s)}).error().code,
            Errc::illegal_transition);
  EXPECT_FALSE(r.claim("k", 3, 7, at(2s), true)->created);  // cancelled is final
}

TEST(Idempotency, ResumeAfterResumableFailureStartsANewJob) {
  IdempotencyRegistry r;
  ASSERT_TRUE(r.claim("k", 1, 7, at(0s)).ok());
  ASSERT_TRUE(r.record_outcome("k", 1, StoredOutcome{JobPhase::failed, "side_effects", at(1s)}).ok());
  auto plain = r.claim("k", 2, 7, at(2s));
  EXPECT_FALSE(plain->created);
  EXPECT_EQ(plain->outcome->phase, JobPhase::failed);
  auto resumed = r.claim("k", 3, 7, at(2s), true);
  EXPECT_TRUE(resumed->created);
  EXPECT_EQ(resumed->job, 3u);
  auto again = r.claim("k", 4, 7, at(3s), true);  // the resumed job is live: no second run
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->job, 3u);
}

// Review #3: an outcome belongs to a job. After a resume claim hands the key to job 3, a late outcome from job 1 is
// refused and does not become job 3's; job 3's own outcome is stored.
TEST(Idempotency, OutcomeMustComeFromTheKeysCurrentJob) {
  struct Step {
    JobId job;
    JobPhase phase;
    bool ok;
    std::optional<JobPhase> stored;  // the key's outcome afterwards
  };
  IdempotencyRegistry r;
  ASSERT_TRUE(r.claim("k", 1, 7, at(0s)).ok());
  ASSERT_TRUE(r.record_outcome("k", 1, StoredOutcome{JobPhase::failed, "device_lost", at(1s)}).ok());
  ASSERT_TRUE(r.claim("k", 3, 7, at(2s), /*resume=*/true)->created);
  const Step steps[] = {
      {1, JobPhase::failed, false, std::nullopt},      // job 1's duplicate/late outcome
      {1, JobPhase::completed, false, std::nullopt},
      {2, JobPhase::completed, false, std::nullopt},   // a job that never held the key
      {3, JobPhase::completed, true, JobPhase::completed},
      {1, JobPhase::failed, false, JobPhase::completed},
  };
  int i = 0;
  for (const auto& s : steps) {
    Status st = r.record_outcome("k", s.job, StoredOutcome{s.phase, "", at(3s)});
    EXPECT_EQ(st.ok(), s.ok) << "step " << i;
    if (!st.ok()) { EXPECT_EQ(st.error().code, Errc::illegal_transition) << "step " << i; }
    auto found = r.find("k");
    ASSERT_TRUE(found.has_value());
    EXPECT_EQ(found->job, 3u) << "step " << i;
    EXPECT_EQ(found->outcome ? std::optional<JobPhase>(found->outcome->phase) : std::nullopt, s.stored) << "step " << i;
    ++i;
  }
}

TEST(Idempotency, ExpiryKeepsLiveKeysAndBoundsTheTable) {
  IdempotencyRegistry r(IdempotencyConfig{10s, 3});
  ASSERT_TRUE(r.claim("live", 1, 0, at(0s)).ok());
  ASSERT_TRUE(r.claim("done", 2, 0, at(0s)).ok());
  ASSERT_TRUE(r.record_outcome("done", 2, StoredOutcome{JobPhase::completed, "", at(1s)}).ok());
  ASSERT_TRUE(r.claim("x", 3, 0, at(0s)).ok());
  EXPECT_EQ(r.claim("y", 4, 0, at(5s)).error().code, Errc::rejected);  // full, nothing old enough
  auto y = r.claim("y", 4, 0, at(11s));                                   // "done" expired
  ASSERT_TRUE(y.ok());
  EXPECT_FALSE(r.find("done").has_value());
  EXPECT_TRUE(r.find("live").has_value());
  EXPECT_EQ(r.expire(at(1h)), 0u);  // live keys never expire
  EXPECT_EQ(r.size(), 3u);
}

}  // namespace
}  // namespace tandem::policy
