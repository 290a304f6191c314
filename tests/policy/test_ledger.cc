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
      case Op::resident: l.set_resident("m", s.bytes); break;
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
  l.set_resident("a", 100);
  l.set_resident("a", 100);
  l.set_resident("b", 30);
  EXPECT_EQ(l.resident_bytes(), 130u);
  l.set_resident("a", 60);  // re-measured
  EXPECT_EQ(l.resident_bytes(), 90u);
  EXPECT_TRUE(l.is_resident("a"));
  l.set_resident("a", 0);
  EXPECT_FALSE(l.is_resident("a"));
  EXPECT_EQ(l.resident_bytes(), 30u);
}

}  // namespace
}  // namespace tandem::policy
