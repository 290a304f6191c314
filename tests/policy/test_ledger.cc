#include <gtest/gtest.h>

#include "policy/ledger.h"

namespace tandem::policy {
namespace {

enum class Op { reserve, resize, materialize, release, resident };

struct Step {
  Op op;
  JobId job;
  std::uint64_t bytes;  // reserve/resize/resident
  bool ok;              // expected status (release: returned bool)
  std::uint64_t reserved, materialized, resident;
};

TEST(Ledger, PerStepTable) {
  const Step steps[] = {
      {Op::reserve, 1, 100, true, 100, 0, 0},
      {Op::reserve, 1, 100, true, 100, 0, 0},       // same again: no-op
      {Op::reserve, 1, 150, false, 100, 0, 0},      // different size: duplicate, unchanged
      {Op::reserve, 2, 50, true, 150, 0, 0},
      {Op::materialize, 1, 0, true, 150, 100, 0},
      {Op::materialize, 1, 0, true, 150, 100, 0},   // idempotent
      {Op::materialize, 9, 0, false, 150, 100, 0},  // unknown job
      {Op::resize, 1, 80, true, 130, 80, 0},        // keeps materialized flag
      {Op::resize, 9, 80, false, 130, 80, 0},
      {Op::resident, 0, 1000, true, 130, 80, 1000},
      {Op::release, 1, 0, true, 50, 0, 1000},
      {Op::release, 1, 0, false, 50, 0, 1000},      // twice: no-op
      {Op::release, 2, 0, true, 0, 0, 1000},
      {Op::resident, 0, 0, true, 0, 0, 0},           // evicted
      {Op::release, 3, 0, false, 0, 0, 0},           // never reserved: totals stay at 0
      {Op::reserve, 4, 0, true, 0, 0, 0},            // zero-byte reservation is allowed
      {Op::materialize, 4, 0, true, 0, 0, 0},
  };
  ReservationLedger l;
  int i = 0;
  for (const auto& s : steps) {
    bool ok = true;
    switch (s.op) {
      case Op::reserve: ok = l.reserve(s.job, s.bytes).ok(); break;
      case Op::resize: ok = l.resize(s.job, s.bytes).ok(); break;
      case Op::materialize: ok = l.materialize(s.job).ok(); break;
      case Op::release: ok = l.release(s.job); break;
      case Op::resident: ok = l.set_resident("m", s.bytes).ok(); break;
    }
    EXPECT_EQ(ok, s.ok) << "step " << i;
    EXPECT_EQ(l.reserved_bytes(), s.reserved) << "step " << i;
    EXPECT_EQ(l.materialized_bytes(), s.materialized) << "step " << i;
    EXPECT_EQ(l.unmaterialized_bytes(), s.reserved - s.materialized) << "step " << i;
    EXPECT_EQ(l.resident_bytes(), s.resident) << "step " << i;
    EXPECT_EQ(l.predicted_bytes(), s.reserved + s.resident) << "step " << i;
    ++i;
  }
}

// Review #8: totals never wrap. A reservation (or resize, or resident weights) that would overflow a total is refused
// with Errc::invalid_argument and changes nothing.
TEST(Ledger, OverflowIsRefusedPerStep) {
  constexpr std::uint64_t H = 1ull << 63;
  enum class Op { reserve, resize, resident };
  struct Step {
    Op op;
    JobId job;
    std::uint64_t bytes;
    bool ok;
    std::uint64_t reserved, resident, predicted;
  };
  const Step steps[] = {
      {Op::reserve, 1, H, true, H, 0, H},
      {Op::reserve, 2, H, false, H, 0, H},            // H + H wraps to 0: refused
      {Op::reserve, 2, H - 1, true, ~0ull, 0, ~0ull},
      {Op::reserve, 3, 1, false, ~0ull, 0, ~0ull},
      {Op::resize, 2, H, false, ~0ull, 0, ~0ull},     // H + H again
      {Op::resident, 0, 5, true, ~0ull, 5, ~0ull},    // model m0; predicted = resident + reserved saturates
      {Op::resident, 1, ~0ull, false, ~0ull, 5, ~0ull},  // model m1: 5 + UINT64_MAX wraps: refused
      {Op::resize, 2, 0, true, H, 5, H + 5},
  };
  ReservationLedger l;
  int i = 0;
  for (const auto& s : steps) {
    Status st;
    switch (s.op) {
      case Op::reserve: st = l.reserve(s.job, s.bytes); break;
      case Op::resize: st = l.resize(s.job, s.bytes); break;
      case Op::resident: st = l.set_resident("m" + std::to_string(s.job), s.bytes); break;
    }
    EXPECT_EQ(st.ok(), s.ok) << "step " << i;
    if (!st.ok()) { EXPECT_EQ(st.error().code, Errc::invalid_argument) << "step " << i; }
    EXPECT_EQ(l.reserved_bytes(), s.reserved) << "step " << i;
    EXPECT_EQ(l.resident_bytes(), s.resident) << "step " << i;
    EXPECT_EQ(l.predicted_bytes(), s.predicted) << "step " << i;
    ++i;
  }
  ASSERT_TRUE(l.materialize(1).ok());
  ASSERT_TRUE(l.materialize(2).ok());
  EXPECT_EQ(l.materialized_bytes(), H);
  EXPECT_TRUE(l.release(1));
  EXPECT_TRUE(l.release(2));
  EXPECT_EQ(l.reserved_bytes(), 0u);
  EXPECT_EQ(l.materialized_bytes(), 0u);
}

TEST(Ledger, ErrorsAreTyped) {
  ReservationLedger l;
  ASSERT_TRUE(l.reserve(7, 10).ok());
  Status dup = l.reserve(7, 11);
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.error().code, Errc::duplicate);
  EXPECT_EQ(l.materialize(8).error().code, Errc::not_found);
  EXPECT_EQ(l.resize(8, 1).error().code, Errc::not_found);
}

TEST(Ledger, ResidentWeightsCountOncePerModel) {
  ReservationLedger l;
  ASSERT_TRUE(l.set_resident("a", 100).ok());
  ASSERT_TRUE(l.set_resident("a", 100).ok());
  ASSERT_TRUE(l.set_resident("b", 30).ok());
  EXPECT_EQ(l.resident_bytes(), 130u);
  ASSERT_TRUE(l.set_resident("a", 60).ok());  // re-measured
  EXPECT_EQ(l.resident_bytes(), 90u);
  EXPECT_TRUE(l.is_resident("a"));
  ASSERT_TRUE(l.set_resident("a", 0).ok());
  EXPECT_FALSE(l.is_resident("a"));
  EXPECT_EQ(l.resident_bytes(), 30u);
}

}  // namespace
}  // namespace tandem::policy
