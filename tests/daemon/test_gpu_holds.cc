// GpuHolds (src/daemon/gpu_holds.h): the state behind HoldGpu / ReleaseGpu, without a daemon.
#include "daemon/gpu_holds.h"

#include <gtest/gtest.h>

#include <optional>
#include <set>

namespace tandem::daemon {
namespace {

TEST(GpuHolds, AddListRelease) {
  GpuHolds h;
  EXPECT_TRUE(h.empty());
  auto a = h.add(":1.5", "a game", "steam", 1000);
  auto b = h.add(":1.6", "", "", 2000);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->rfind("hold-", 0), 0u);
  EXPECT_EQ(a->size(), 5u + 24u);
  EXPECT_NE(*a, *b);
  ASSERT_EQ(h.size(), 2u);
  for (const auto& x : h.list()) {
    if (x.cookie == *a) {
      EXPECT_EQ(x.owner, ":1.5");
      EXPECT_EQ(x.app_id, "steam");
      EXPECT_EQ(x.reason, "a game");
      EXPECT_EQ(x.since_unix_ms, 1000);
    } else {
      EXPECT_EQ(x.cookie, *b);
    }
  }
  auto gone = h.release(*a, ":1.5", false);
  ASSERT_TRUE(gone);
  EXPECT_EQ(gone->app_id, "steam");
  EXPECT_EQ(h.size(), 1u);
}

TEST(GpuHolds, OnlyTheOwnerOrAnyOwnerReleases) {
  struct Case {
    std::string who;
    bool any_owner;
    std::optional<Errc> want;  // none: released
  };
  for (const Case& c : std::vector<Case>{{":1.5", false, std::nullopt},
                                         {":1.9", false, Errc::permission_denied},
                                         {":1.9", true, std::nullopt}}) {
    GpuHolds h;
    auto cookie = h.add(":1.5", "r", "app", 1);
    ASSERT_TRUE(cookie);
    auto r = h.release(*cookie, c.who, c.any_owner);
    if (!c.want) {
      EXPECT_TRUE(r) << c.who;
      EXPECT_TRUE(h.empty());
    } else {
      ASSERT_FALSE(r) << c.who;
      EXPECT_EQ(r.error().code, *c.want);
      EXPECT_EQ(h.size(), 1u) << "a refused release keeps the hold";
    }
  }
  GpuHolds h;
  auto r = h.release("hold-000000000000000000000000", ":1.5", true);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::not_found);
}

TEST(GpuHolds, AVanishedOwnerLosesItsHoldsOnly) {
  GpuHolds h;
  ASSERT_TRUE(h.add(":1.5", "one", "a", 1));
  ASSERT_TRUE(h.add(":1.6", "other", "b", 2));
  ASSERT_TRUE(h.add(":1.5", "two", "a", 3));
  auto gone = h.release_owner(":1.5");
  ASSERT_EQ(gone.size(), 2u);
  std::set<std::string> reasons{gone[0].reason, gone[1].reason};
  EXPECT_EQ(reasons, (std::set<std::string>{"one", "two"}));
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h.list()[0].owner, ":1.6");
  EXPECT_TRUE(h.release_owner(":1.5").empty());
}

TEST(GpuHolds, LimitsAreTypedErrors) {
  GpuHolds h;
  const std::string long_text(GpuHolds::kMaxTextBytes + 1, 'x');
  for (const auto& [reason, app] : std::vector<std::pair<std::string, std::string>>{
           {long_text, ""}, {"", long_text}, {"\xff", ""}, {"", "\xc3"}}) {
    auto r = h.add(":1.5", reason, app, 1);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, Errc::invalid_argument);
  }
  EXPECT_TRUE(h.add(":1.5", std::string(GpuHolds::kMaxTextBytes, 'x'), "", 1)) << "256 bytes is allowed";
  for (std::size_t i = h.size(); i < GpuHolds::kMaxHolds; ++i) ASSERT_TRUE(h.add(":1.5", "", "", 1));
  auto full = h.add(":1.5", "", "", 1);
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().code, Errc::queue_full);
  EXPECT_NE(full.error().message.find("retry_after_ms="), std::string::npos);
  EXPECT_EQ(h.size(), GpuHolds::kMaxHolds);
}

}  // namespace
}  // namespace tandem::daemon
