#include <gtest/gtest.h>

#include "fixtures.h"

namespace tandem::policy {
namespace {

constexpr std::uint64_t G = kGiB;

struct BudgetRow {
  const char* what;
  HostReading reading;
  std::uint64_t materialized;         // of our jobs (KV + activations: anonymous memory), before the reading
  std::uint64_t budget;
  HostBound bound;
  std::uint64_t materialized_mapped;  // their model's mmap'd weights (clean file pages)
};

TEST(HostGuard, BudgetIsTheSmallestTerm) {
  const BudgetRow rows[] = {
      {"config only", {}, 0, 16 * G, HostBound::configured, 0},
      {"MemAvailable − reserve binds", {10 * G, std::nullopt, std::nullopt}, 0, 9 * G, HostBound::mem_available, 0},
      {"MemAvailable below reserve", {G / 2, std::nullopt, std::nullopt}, 0, 0, HostBound::mem_available, 0},
      {"cgroup max − current binds", {64 * G, 12 * G, 8 * G}, 0, 4 * G, HostBound::cgroup, 0},
      {"cgroup over its max", {64 * G, 12 * G, 13 * G}, 0, 0, HostBound::cgroup, 0},
      {"cgroup max = 'max' is no limit", {64 * G, std::nullopt, 8 * G}, 0, 16 * G, HostBound::configured, 0},
      {"our materialized jobs are added back", {10 * G, 12 * G, 10 * G}, 3 * G, 5 * G, HostBound::cgroup, 0},
      // Review #9: clean mmap'd pages are already inside MemAvailable (reclaimable page cache), so only anonymous
      // bytes are added back there; memory.current charges the page cache, so the cgroup term adds back both.
      {"MemAvailable adds back anonymous bytes only", {10 * G, std::nullopt, std::nullopt}, 3 * G, 12 * G,
       HostBound::mem_available, 4 * G},
      {"cgroup adds back the mapping too", {64 * G, 12 * G, 10 * G}, 3 * G, 9 * G, HostBound::cgroup, 4 * G},
  };
  for (const auto& r : rows) {
    HostMemoryGuard g(HostGuardConfig{16 * G, 1 * G, 4});
    if (r.materialized) {
      ASSERT_TRUE(g.admit(1, HostJobEstimate{"m", r.materialized_mapped, r.materialized, 0}, HostReading{}).ok())
          << r.what;
      ASSERT_TRUE(g.materialize(1).ok());
    }
    HostBudget b = g.budget(r.reading);
    EXPECT_EQ(b.bytes, r.budget) << r.what;
    EXPECT_EQ(b.bound, r.bound) << r.what;
  }
}

TEST(HostGuard, MappedWeightsCountOncePerModel) {
  HostMemoryGuard g(HostGuardConfig{10 * G, 1 * G, 4});
  HostReading none;
  HostJobEstimate a{"m", 4 * G, 1 * G, 0};
  auto c1 = g.admit(1, a, none);
  ASSERT_TRUE(c1.ok());
  EXPECT_EQ(c1->need_bytes, 5 * G);
  auto c2 = g.admit(2, a, none);
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ(c2->need_bytes, 1 * G);  // weights already counted
  EXPECT_EQ(g.committed_bytes(), 6 * G);
  EXPECT_TRUE(g.admit(2, a, none).ok());  // idempotent
  EXPECT_EQ(g.committed_bytes(), 6 * G);
  EXPECT_TRUE(g.release(1));
  EXPECT_EQ(g.committed_bytes(), 5 * G);  // mapping stays with job 2
  EXPECT_TRUE(g.release(2));
  EXPECT_EQ(g.committed_bytes(), 0u);
  EXPECT_FALSE(g.release(2));
  EXPECT_EQ(g.committed_bytes(), 0u);
}

struct FitRow {
  std::uint64_t committed;  // another model's job
  HostJobEstimate job;
  HostFit fit;
};

TEST(HostGuard, FitsWaitsOrNever) {
  const FitRow rows[] = {
      {0, {"m", 4 * G, 2 * G, 1 * G}, HostFit::fits},
      {2 * G, {"m", 4 * G, 2 * G, 1 * G}, HostFit::fits},   // 2 + 7 ≤ 10
      {4 * G, {"m", 4 * G, 2 * G, 1 * G}, HostFit::wait},   // 4 + 7 > 10, 7 alone fits
      {0, {"m", 8 * G, 2 * G, 1 * G}, HostFit::never},      // 11 > 10 even alone
      {0, {"m", 0, 10 * G, 0}, HostFit::fits},              // exactly the budget
      {0, {"m", 0, 10 * G, 1}, HostFit::never},
  };
  for (const auto& r : rows) {
    HostMemoryGuard g(HostGuardConfig{10 * G, 1 * G, 4});
    if (r.committed) { ASSERT_TRUE(g.admit(100, HostJobEstimate{"other", 0, r.committed, 0}, {}).ok()); }
    EXPECT_EQ(g.check(r.job, {}).fit, r.fit) << r.committed << " + " << r.job.job_bytes();
    auto admitted = g.admit(1, r.job, {});
    EXPECT_EQ(admitted.ok(), r.fit == HostFit::fits);
    if (!admitted.ok()) {
      EXPECT_EQ(admitted.error().code, Errc::host_memory);
      EXPECT_EQ(g.committed_bytes(), r.committed);  // a refused job leaves nothing behind
    }
  }
}

TEST(HostGuard, MaterializeAndRelease) {
  HostMemoryGuard g(HostGuardConfig{10 * G, 1 * G, 4});
  EXPECT_EQ(g.materialize(5).error().code, Errc::not_found);
  ASSERT_TRUE(g.admit(1, HostJobEstimate{"m", 3 * G, 1 * G, 0}, {}).ok());
  ASSERT_TRUE(g.admit(2, HostJobEstimate{"m", 3 * G, 1 * G, 0}, {}).ok());
  ASSERT_TRUE(g.materialize(1).ok());
  ASSERT_TRUE(g.materialize(1).ok());
  EXPECT_EQ(g.materialized_bytes(), 4 * G);  // job + mapping
  ASSERT_TRUE(g.materialize(2).ok());
  EXPECT_EQ(g.materialized_bytes(), 5 * G);
  g.release(1);
  EXPECT_EQ(g.materialized_bytes(), 4 * G);
  g.release(2);
  EXPECT_EQ(g.materialized_bytes(), 0u);
  EXPECT_EQ(g.jobs(), 0u);
}

// Review #10: the default configuration (budget_bytes = 0: no configured cap) serves the fixtures' own 7B fp16 model
// on the CPU when the host has the memory; with no reading at all there is no budget (fail closed).
TEST(HostGuard, DefaultBudgetServesThe7bFixtureOnCpu) {
  HostGuardConfig cfg;
  EXPECT_EQ(cfg.budget_bytes, 0u);
  HostMemoryGuard g(cfg);
  HostJobEstimate e = estimate_host_job(testing::llama7b(), testing::request(1000, 1000), EstimatorConfig{}, cfg);
  ASSERT_GT(e.mapped_weights_bytes, 12 * G);
  HostReading plenty{64 * G, std::nullopt, std::nullopt};
  EXPECT_EQ(g.check(e, plenty).fit, HostFit::fits);
  EXPECT_EQ(g.budget(plenty).bound, HostBound::mem_available);
  EXPECT_EQ(g.budget(plenty).bytes, 63 * G);
  HostReading cgroup{64 * G, 20 * G, 2 * G};
  EXPECT_EQ(g.budget(cgroup).bytes, 18 * G);
  EXPECT_EQ(g.check(e, HostReading{}).fit, HostFit::never);
  EXPECT_EQ(g.budget(HostReading{}).bytes, 0u);
  EXPECT_EQ(g.budget(HostReading{}).bound, HostBound::no_reading);
}

// Review #8: host byte totals never wrap.
TEST(HostGuard, ByteTotalsSaturateOrRefuse) {
  EXPECT_EQ((HostJobEstimate{"m", 0, ~0ull, 5}.job_bytes()), ~0ull);
  HostMemoryGuard g(HostGuardConfig{0, 1, 4});
  HostReading huge{~0ull, std::nullopt, std::nullopt};
  ASSERT_TRUE(g.admit(1, HostJobEstimate{"m", 0, 1ull << 63, 0}, huge).ok());
  ASSERT_TRUE(g.materialize(1).ok());  // budget = MemAvailable − 1 + 2^63: saturates at UINT64_MAX
  auto second = g.admit(2, HostJobEstimate{"m", 0, 1ull << 63, 0}, huge);
  EXPECT_FALSE(second.ok());
  EXPECT_EQ(g.committed_bytes(), 1ull << 63);
  EXPECT_EQ(g.jobs(), 1u);
}

TEST(HostGuard, EstimateUsesF32ActivationsAndHostKv) {
  ModelShape m = testing::llama7b();
  RequestShape r = testing::request(1000, 1000);
  HostJobEstimate e = estimate_host_job(m, r, EstimatorConfig{16, 0.0}, HostGuardConfig{});
  EXPECT_EQ(e.model, "llama-2-7b");
  EXPECT_EQ(e.mapped_weights_bytes, MemoryEstimator::weights_bytes(m));
  EXPECT_EQ(e.kv_bytes, 2000ull * 512 * 1024);
  ModelShape f32 = m;
  f32.act_elem_bytes = 4;
  EXPECT_EQ(e.activation_bytes, MemoryEstimator(EstimatorConfig{16, 0.0}).estimate(f32, r, true).activation_bytes);
  // The host KV is the CPU layers' cache type (kv_cache = "f32": twice the f16 default), whatever the accelerator's.
  m.cpu_kv_elem_bytes = 4;
  m.kv_elem_bytes = 2;
  EXPECT_EQ(estimate_host_job(m, r, EstimatorConfig{16, 0.0}, HostGuardConfig{}).kv_bytes, 2000ull * 1024 * 1024);
  m.cpu_kv_elem_bytes = 3;
  EXPECT_FALSE(m.validate().ok());
}

// --- procfs parsers --------------------------------------------------------------------------------------------

constexpr const char* kMeminfo =
    "MemTotal:       65838044 kB\n"
    "MemFree:         1234567 kB\n"
    "MemAvailable:   40000000 kB\n"
    "Buffers:          123456 kB\n";

TEST(Procfs, MeminfoAvailable) {
  auto v = parse_meminfo_available(kMeminfo);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 40000000ull * 1024);
  EXPECT_EQ(parse_meminfo_available("MemTotal: 1 kB\n").error().code, Errc::not_found);
  EXPECT_EQ(parse_meminfo_available("MemAvailable: lots kB\n").error().code, Errc::parse_error);
  EXPECT_EQ(parse_meminfo_available("MemAvailable: -5 kB\n").error().code, Errc::parse_error);
  EXPECT_EQ(parse_meminfo_available("MemAvailable:\n").error().code, Errc::parse_error);
  EXPECT_EQ(parse_meminfo_available("MemAvailable: 99999999999999999999 kB\n").error().code, Errc::parse_error);
  EXPECT_EQ(parse_meminfo_available("MemAvailable: 18014398509481984 kB\n").error().code, Errc::parse_error);
  EXPECT_EQ(*parse_meminfo_available("MemAvailable: 7"), 7u);  // no unit, no newline
  EXPECT_EQ(parse_meminfo_available("").error().code, Errc::not_found);
}

TEST(Procfs, CgroupFiles) {
  EXPECT_EQ(*parse_cgroup_memory_max("max\n"), std::nullopt);
  EXPECT_EQ(*parse_cgroup_memory_max("8589934592\n"), std::optional<std::uint64_t>(8589934592ull));
  EXPECT_EQ(parse_cgroup_memory_max("").error().code, Errc::parse_error);
  EXPECT_EQ(parse_cgroup_memory_max("12 34").error().code, Errc::parse_error);
  EXPECT_EQ(*parse_cgroup_memory_current("  4096 \n"), 4096u);
  EXPECT_EQ(parse_cgroup_memory_current("4k").error().message, "cgroup memory.current: expected an unsigned integer, got '4k'");
}

TEST(Procfs, HostReadingFromTexts) {
  auto r = parse_host_reading(kMeminfo, "8589934592\n", "4294967296\n");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->cgroup_max, 8589934592ull);
  EXPECT_EQ(r->cgroup_current, 4294967296ull);
  HostMemoryGuard g(HostGuardConfig{64 * G, 1 * G, 4});
  EXPECT_EQ(g.budget(*r).bytes, 4 * G);
  auto none = parse_host_reading(std::nullopt, std::nullopt, std::nullopt);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->mem_available.has_value());
  EXPECT_EQ(parse_host_reading("garbage", std::nullopt, std::nullopt).error().code, Errc::not_found);
  EXPECT_EQ(parse_host_reading(kMeminfo, "max", "x").error().code, Errc::parse_error);
  EXPECT_EQ(parse_host_reading(kMeminfo, "100", std::nullopt).error().code, Errc::invalid_argument);
}

}  // namespace
}  // namespace tandem::policy
