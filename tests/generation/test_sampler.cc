#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "generation/rng.h"
#include "generation/sampler.h"

using namespace tandem::gen;

TEST(Rng, PhiloxKnownAnswer) {
  // Random123 known-answer test for philox4x32_10: counter = key = 0.
  const auto r = philox4x32({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[1], 0xe169c58du);
  EXPECT_EQ(r[2], 0xbc57ac4cu);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
  const auto r2 = philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(r2[0], 0x408f276du);
  EXPECT_EQ(r2[1], 0x41c83b0eu);
  EXPECT_EQ(r2[2], 0xa20bc7c6u);
  EXPECT_EQ(r2[3], 0x6d5451fdu);
}

TEST(Rng, PureFunctionOfSeedAndStep) {
  EXPECT_EQ(uniform01(42, 7), uniform01(42, 7));
  EXPECT_NE(uniform01(42, 7), uniform01(42, 8));
  EXPECT_NE(uniform01(42, 7), uniform01(43, 7));
  double sum = 0;
  for (int i = 0; i < 20000; ++i) {
    const double u = uniform01(5, static_cast<std::uint64_t>(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 20000, 0.5, 0.01);
}

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  std::vector<float> l{0.1f, 3.0f, 3.0f, -1.0f};
  EXPECT_EQ(sample(l, {}, SamplingParams{}, 0), 1);
}

TEST(Sampler, RepetitionPenaltyHfSemantics) {
  SamplingParams p;
  p.repetition_penalty = 2.0;
  std::vector<float> l{4.0f, 3.0f, -1.0f};
  std::vector<TokenId> hist{0, 0, 2};
  EXPECT_EQ(sample(l, hist, p, 0), 1);  // token 0: 4/2 = 2 < 3
  EXPECT_FLOAT_EQ(l[0], 2.0f);
  EXPECT_FLOAT_EQ(l[2], -2.0f);  // negative logits are multiplied
  p.repetition_window = 1;       // only the last history token (2) is penalised
  std::vector<float> l2{4.0f, 3.0f, -1.0f};
  EXPECT_EQ(sample(l2, hist, p, 0), 0);
}

TEST(Sampler, TopKOneIsGreedy) {
  SamplingParams p;
  p.temperature = 1.0;
  p.top_k = 1;
  for (std::uint64_t s = 0; s < 50; ++s) {
    std::vector<float> l{0.0f, 0.5f, 0.4f};
    EXPECT_EQ(sample(l, {}, p, s), 1);
  }
}

TEST(Sampler, TopPKeepsSmallestNucleus) {
  // probabilities ~ [0.665, 0.245, 0.090]: top_p 0.6 keeps only token 0; 0.8 keeps {0, 1}.
  SamplingParams p;
  p.temperature = 1.0;
  p.top_p = 0.6;
  std::map<TokenId, int> seen;
  for (std::uint64_t s = 0; s < 300; ++s) {
    std::vector<float> l{2.0f, 1.0f, 0.0f};
    seen[sample(l, {}, p, s)]++;
  }
  EXPECT_EQ(seen.size(), 1u);
  p.top_p = 0.8;
  seen.clear();
  for (std::uint64_t s = 0; s < 300; ++s) {
    std::vector<float> l{2.0f, 1.0f, 0.0f};
    seen[sample(l, {}, p, s)]++;
  }
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen.count(2), 0u);
}

TEST(Sampler, TemperatureSamplingMatchesDistribution) {
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = 99;
  std::vector<int> count(3, 0);
  const int n = 30000;
  for (int s = 0; s < n; ++s) {
    std::vector<float> l{std::log(0.5f), std::log(0.3f), std::log(0.2f)};
    count[static_cast<std::size_t>(sample(l, {}, p, static_cast<std::uint64_t>(s)))]++;
  }
  EXPECT_NEAR(count[0] / double(n), 0.5, 0.015);
  EXPECT_NEAR(count[1] / double(n), 0.3, 0.015);
  EXPECT_NEAR(count[2] / double(n), 0.2, 0.015);
}

TEST(Sampler, SameSeedAndStepSameTokenDifferentSeedsDiffer) {
  SamplingParams a, b;
  a.temperature = b.temperature = 1.0;
  a.seed = 1;
  b.seed = 2;
  int differ = 0;
  for (std::uint64_t s = 0; s < 200; ++s) {
    std::vector<float> l(100, 0.0f), l2(100, 0.0f), l3(100, 0.0f);
    const auto t1 = sample(l, {}, a, s);
    const auto t2 = sample(l2, {}, a, s);
    const auto t3 = sample(l3, {}, b, s);
    EXPECT_EQ(t1, t2);
    differ += t1 != t3;
  }
  EXPECT_GT(differ, 150);
}

struct BadParams {
  SamplingParams p;
  const char* field;
};

TEST(Sampler, ValidateNamesTheBadField) {
  std::vector<BadParams> cases;
  SamplingParams p;
  p.temperature = -1; cases.push_back({p, "temperature"}); p = {};
  p.top_k = -3; cases.push_back({p, "top_k"}); p = {};
  p.top_p = 0; cases.push_back({p, "top_p"}); p = {};
  p.top_p = 1.5; cases.push_back({p, "top_p"}); p = {};
  p.repetition_penalty = 0; cases.push_back({p, "repetition_penalty"}); p = {};
  p.repetition_window = -1; cases.push_back({p, "repetition_window"}); p = {};
  for (const auto& c : cases) {
    auto s = c.p.validate();
    ASSERT_FALSE(s.ok()) << c.field;
    EXPECT_EQ(s.error().code, tandem::Errc::invalid_argument);
    EXPECT_NE(s.error().message.find(c.field), std::string::npos) << s.error().message;
  }
  EXPECT_TRUE(SamplingParams{}.validate().ok());
}

TEST(Sampler, TinyTemperatureIsGreedyAndNanLogitsNeverWin) {
  SamplingParams p;
  p.temperature = 1e-310;  // 1/T overflows: must not turn into "pick the worst"
  std::vector<float> l{0.0f, 5.0f, 1.0f, 2.0f};
  EXPECT_EQ(sample(l, {}, p, 0), 1);
  p.temperature = 1.0;
  for (std::uint64_t s = 0; s < 200; ++s) {
    std::vector<float> n{std::nanf(""), 3.0f, std::nanf(""), 2.5f};
    const auto t = sample(n, {}, p, s);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
  std::vector<float> g{std::nanf(""), 1.0f};
  EXPECT_EQ(sample(g, {}, SamplingParams{}, 0), 1);
}

// Greedy over vocabulary-sized logits (the 4-lane pass and its tail): the lowest id holding the largest value, NaN
// never winning, ties anywhere (in a lane, across lanes, in the tail), all -inf or all NaN giving 0, and the
// repetition penalty moving the maximum.
TEST(Sampler, GreedyOverLongLogitsIsTheLowestArgmax) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-10.F, 10.F);
  const auto naive = [](const std::vector<float>& l) {  // the scalar rule: NaN as -inf, strict > from id 0
    const auto clean = [](float x) { return std::isnan(x) ? -std::numeric_limits<float>::infinity() : x; };
    std::size_t best = 0;
    for (std::size_t i = 1; i < l.size(); ++i)
      if (clean(l[i]) > clean(l[best])) best = i;
    return static_cast<TokenId>(best);
  };
  for (std::size_t n : {1U, 3U, 4U, 5U, 7U, 8U, 31U, 32000U, 32003U}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> l(n);
      for (float& x : l) x = u(rng);
      if (trial % 3 == 0)
        for (std::size_t i = 0; i < n; i += 7) l[i] = std::nanf("");
      if (trial % 4 == 1 && n > 2) {  // a tie for the maximum at two random places
        const std::size_t a = rng() % n, b = rng() % n;
        l[a] = l[b] = 11.F;
      }
      if (trial == 19) l[n - 1] = std::nanf("");
      const TokenId want = naive(l);
      std::vector<float> c = l;
      ASSERT_EQ(sample(c, {}, SamplingParams{}, 0), want) << "n=" << n << " trial " << trial;
      for (float x : c) ASSERT_FALSE(std::isnan(x));
    }
  }
  std::vector<float> all_inf(33, -std::numeric_limits<float>::infinity()), all_nan(33, std::nanf(""));
  EXPECT_EQ(sample(all_inf, {}, SamplingParams{}, 0), 0);
  EXPECT_EQ(sample(all_nan, {}, SamplingParams{}, 0), 0);
  // A penalty on the top token hands the win to the runner-up.
  std::vector<float> l(100, 1.F);
  l[40] = 5.F;
  l[70] = 4.F;
  SamplingParams p;
  p.repetition_penalty = 2.0;
  const std::vector<TokenId> history{40};
  EXPECT_EQ(sample(l, history, p, 0), 70);
}
