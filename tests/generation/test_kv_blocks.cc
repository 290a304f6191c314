#include <gtest/gtest.h>

#include <random>
#include <set>

#include "generation/kv_blocks.h"

using tandem::Errc;
using tandem::gen::KvBlockAllocator;

TEST(KvBlocks, GrowsBlockByBlock) {
  KvBlockAllocator a(8, 4);
  ASSERT_TRUE(a.create(1).ok());
  struct Step {
    std::int64_t tokens;
    std::size_t blocks;
  };
  for (auto [tokens, blocks] : std::vector<Step>{{1, 1}, {4, 1}, {5, 2}, {5, 2}, {16, 4}, {3, 4}}) {
    ASSERT_TRUE(a.reserve(1, tokens).ok());
    EXPECT_EQ(a.table(1)->size(), blocks) << tokens;
  }
  EXPECT_EQ(a.used_blocks(), 4);
  EXPECT_EQ(a.capacity_tokens(1), 16);
}

TEST(KvBlocks, ExhaustionIsTypedAndAllOrNothing) {
  KvBlockAllocator a(4, 16);
  ASSERT_TRUE(a.create(1).ok());
  ASSERT_TRUE(a.create(2).ok());
  ASSERT_TRUE(a.reserve(1, 40).ok());  // 3 blocks
  auto s = a.reserve(2, 33);           // needs 3, 1 free
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::kv_exhausted);
  EXPECT_EQ(a.table(2)->size(), 0u);  // nothing partially taken
  EXPECT_EQ(a.free_blocks(), 1);
  EXPECT_TRUE(a.release(1));
  EXPECT_TRUE(a.reserve(2, 33).ok());
}

TEST(KvBlocks, TruncateReturnsTheBlocksPastTheKeptTokens) {
  KvBlockAllocator a(6, 4);
  ASSERT_TRUE(a.create(1).ok());
  ASSERT_TRUE(a.create(2).ok());
  ASSERT_TRUE(a.reserve(1, 17).ok());  // 5 blocks
  const std::vector<std::int32_t> before = *a.table(1);
  EXPECT_EQ(a.truncate(1, 9), 2);  // tokens 0..8 live in 3 blocks
  ASSERT_EQ(a.table(1)->size(), 3u);
  EXPECT_EQ(std::vector<std::int32_t>(before.begin(), before.begin() + 3), *a.table(1));  // kept in place
  EXPECT_EQ(a.free_blocks(), 3);
  EXPECT_EQ(a.truncate(1, 12), 0);  // still within the kept blocks
  EXPECT_EQ(a.truncate(1, 100), 0);  // never grows
  EXPECT_EQ(a.table(1)->size(), 3u);
  // The freed blocks serve another sequence.
  ASSERT_TRUE(a.reserve(2, 12).ok());
  EXPECT_EQ(a.free_blocks(), 0);
  EXPECT_EQ(a.truncate(1, 0), 3);
  EXPECT_TRUE(a.table(1)->empty());
  EXPECT_EQ(a.free_blocks(), 3);
  EXPECT_EQ(a.sequences(), 2u);  // an empty table, not a released sequence
  EXPECT_EQ(a.truncate(99, 0), 0);  // unknown
  ASSERT_TRUE(a.reserve(1, 5).ok());
  EXPECT_EQ(a.used_blocks(), 5);
}

TEST(KvBlocks, ErrorsAndIdempotentRelease) {
  KvBlockAllocator a(2, 2);
  ASSERT_TRUE(a.create(7).ok());
  EXPECT_EQ(a.create(7).error().code, Errc::duplicate);
  EXPECT_EQ(a.reserve(8, 1).error().code, Errc::not_found);
  EXPECT_TRUE(a.release(7));
  EXPECT_FALSE(a.release(7));
  EXPECT_EQ(a.free_blocks(), 2);
}

TEST(KvBlocks, RandomisedNoLeakNoDoubleUse) {
  KvBlockAllocator a(64, 8);
  std::mt19937_64 rng(12345);
  std::map<tandem::gen::SeqId, std::int64_t> live;
  tandem::gen::SeqId next = 1;
  for (int i = 0; i < 20000; ++i) {
    const int op = static_cast<int>(rng() % 3);
    if (op == 0 || live.empty()) {
      ASSERT_TRUE(a.create(next).ok());
      live[next++] = 0;
    } else {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      if (op == 1) {
        const std::int64_t want = it->second + static_cast<std::int64_t>(rng() % 40);
        auto s = a.reserve(it->first, want);
        if (s.ok()) it->second = want;
        else ASSERT_EQ(s.error().code, Errc::kv_exhausted);
      } else {
        ASSERT_TRUE(a.release(it->first));
        live.erase(it);
      }
    }
    // Invariant: blocks in tables are distinct, and used + free == total.
    std::set<int> used;
    std::size_t n = 0;
    for (auto& [id, len] : live) {
      for (int b : *a.table(id)) used.insert(b);
      n += a.table(id)->size();
      ASSERT_GE(a.capacity_tokens(id), len);
    }
    ASSERT_EQ(used.size(), n);
    ASSERT_EQ(static_cast<int>(n) + a.free_blocks(), a.total_blocks());
  }
  for (auto& [id, len] : live) a.release(id);
  EXPECT_EQ(a.free_blocks(), 64);
}
