// ETA against the actual wait: a scripted step loop (continuous batching) on a manual clock with known step costs
// and noise; each job's eta_start at enqueue time is compared with when it actually joined the loop.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "fixtures.h"

namespace tandem::policy {
namespace {

struct Scenario {
  const char* what;
  bool eos;                 // jobs stop early (EOS) at 30–100 % of max_new_tokens
  double noise;             // step time × (1 ± noise), uniform
  double max_mean_error;    // bounds on the |relative error| of the warm jobs (eos = false): mean and 90th percentile
  double max_p90_error;
};

struct Outcome {
  std::vector<double> rel;  // (predicted − actual) / actual for jobs that waited (after the warm-up)
  std::vector<double> rel_all;
  int zero_wait = 0, zero_wait_predicted_zero = 0;
};

struct Live {
  JobId id = 0;
  std::uint32_t prompt = 0, prefilled = 0, length = 0, generated = 0;
};

// The engine's true cost: 18 ms per forward + 0.35 ms per token + 1.2 ms per sequence (the queue's prior, from
// 2000/40 tokens/s, is 24.5 ms + 0.5 ms per token: wrong on purpose).
double true_step_ms(std::uint32_t batch, std::uint32_t tokens) { return 18.0 + 0.35 * tokens + 1.2 * batch; }

Outcome replay(const Scenario& sc, std::uint64_t seed) {
  constexpr std::size_t kJobs = 160, kWarm = 20;
  const QueueConfig qc{256, 4, 8192, 4096, 256};
  JobQueue q("gpu_queue", qc, RateConfig{0.2, 2000.0, 40.0});
  ManualClock clock;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> noise(-sc.noise, sc.noise);

  // The script: arrival times (a burst, then a slower stream that lets the queue drain), sizes, EOS lengths.
  struct Arrival {
    Clock::time_point at;
    std::uint32_t prompt, max_new, length;
  };
  std::vector<Arrival> script;
  Clock::time_point t{};
  for (std::size_t i = 0; i < kJobs; ++i) {
    const double mean_gap_s = i < 60 ? 0.3 : 1.4;
    t += std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(std::exponential_distribution<double>(1.0 / mean_gap_s)(rng)));
    const auto prompt = static_cast<std::uint32_t>(std::uniform_int_distribution<int>(50, 1500)(rng));
    const auto max_new = static_cast<std::uint32_t>(std::uniform_int_distribution<int>(20, 300)(rng));
    const double keep = sc.eos ? std::uniform_real_distribution<double>(0.3, 1.0)(rng) : 1.0;
    script.push_back({t, prompt, max_new, std::max<std::uint32_t>(1, static_cast<std::uint32_t>(keep * max_new))});
  }

  std::vector<Clock::duration> predicted(kJobs), actual(kJobs);
  std::vector<Clock::time_point> enqueued(kJobs);
  std::vector<Live> live;  // in start order
  std::size_t next = 0, done = 0;
  while (done < kJobs) {
    // Arrivals up to now (between steps: a step in flight is not interrupted).
    while (next < kJobs && script[next].at <= clock.now()) {
      const JobId id = next + 1;
      EXPECT_TRUE(q.enqueue(QueueEntry{id, script[next].prompt, script[next].max_new, clock.now()}).ok());
      enqueued[next] = clock.now();
      predicted[next] = q.eta_start(id).value_or(Clock::duration::max());
      ++next;
    }
    // Free slots go to the queue's head, FIFO.
    while (q.has_free_slot() && q.head() != nullptr) {
      const QueueEntry e = *q.start_next();
      actual[e.id - 1] = clock.now() - enqueued[e.id - 1];
      live.push_back(Live{e.id, e.prompt_tokens, 0, script[e.id - 1].length, 0});
    }
    if (live.empty()) {
      clock.set(script[next].at);  // idle until the next arrival
      continue;
    }
    // One step: decoders one token each, the rest of the budget to the prompts, oldest first.
    std::uint32_t decoders = 0;
    for (const Live& l : live) decoders += l.prefilled == l.prompt ? 1 : 0;
    std::uint32_t left = qc.step_tokens - decoders, tokens = decoders, batch = decoders;
    std::vector<std::uint32_t> chunk(live.size(), 0);
    for (std::size_t i = 0; i < live.size() && left > 0; ++i) {
      if (live[i].prefilled == live[i].prompt) continue;
      chunk[i] = std::min(live[i].prompt - live[i].prefilled, left);
      left -= chunk[i];
      tokens += chunk[i];
      ++batch;
    }
    const auto took = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::milli>(true_step_ms(batch, tokens) * (1 + noise(rng))));
    clock.advance(took);
    q.rates().observe_step(batch, tokens, took);
    for (std::size_t i = 0; i < live.size(); ++i) {
      Live& l = live[i];
      if (l.prefilled == l.prompt) {
        ++l.generated;
      } else if (chunk[i] > 0) {
        l.prefilled += chunk[i];
        if (l.prefilled == l.prompt) ++l.generated;  // the last chunk yields the first token
      }
      q.update_prefill(l.id, l.prefilled);
      q.update_progress(l.id, l.prefilled == l.prompt, l.generated);
    }
    std::erase_if(live, [&](const Live& l) {
      if (l.generated < l.length) return false;
      EXPECT_EQ(q.finish(l.id), Removed::running);
      ++done;
      return true;
    });
  }

  Outcome o;
  for (std::size_t i = 0; i < kJobs; ++i) {
    if (actual[i] == Clock::duration::zero()) {
      ++o.zero_wait;
      if (predicted[i] == Clock::duration::zero()) ++o.zero_wait_predicted_zero;
      continue;
    }
    const double a = std::chrono::duration<double>(actual[i]).count();
    const double r = (std::chrono::duration<double>(predicted[i]).count() - a) / a;
    o.rel_all.push_back(r);
    if (i >= kWarm) o.rel.push_back(r);
  }
  return o;
}

struct Stats {
  double mean_abs, mean, p50_abs, p90_abs, max_abs;
};

Stats stats(std::vector<double> v) {
  Stats s{};
  if (v.empty()) return s;
  std::vector<double> a;
  for (double x : v) {
    s.mean += x / static_cast<double>(v.size());
    s.mean_abs += std::abs(x) / static_cast<double>(v.size());
    a.push_back(std::abs(x));
  }
  std::sort(a.begin(), a.end());
  s.p50_abs = a[a.size() / 2];
  s.p90_abs = a[a.size() * 9 / 10];
  s.max_abs = a.back();
  return s;
}

// Scenario (fixed seeds): 160 jobs (prompt 50–1500, max_new 20–300) arrive in a burst (mean gap 0.3 s) and then a
// slower stream (1.4 s); concurrency 4, 256 tokens per step; true step = 18 ms + 0.35 ms · tokens + 1.2 ms · batch
// with ±15 % noise per step; the queue starts from a wrong prior (24.5 ms + 0.5 ms · tokens). "Warm" leaves out the
// first 20 jobs, predicted before the model had seen steps of every shape. Measured (2026-12-03): mean |error|
// 2.5–3.0 %, p90 5.0–5.2 %, mean signed +0.0–0.6 % over the three seeds (the few large relative errors are waits of
// a step or two); the bounds below are twice that. With EOS the ETA overestimates by +41–66 % on average: it is
// "at the latest", every job counted to its max_new_tokens.
TEST(EtaReplay, PredictedStartAgainstActualStart) {
  const Scenario scenarios[] = {
      {"every job runs to max_new_tokens", false, 0.15, 0.06, 0.12},
      {"EOS at 30-100% of max_new_tokens", true, 0.15, 0.0, 0.0},
  };
  for (const auto& sc : scenarios) {
    for (std::uint64_t seed : {1u, 2u, 3u}) {
      const Outcome o = replay(sc, seed);
      ASSERT_FALSE(::testing::Test::HasFailure()) << sc.what;
      const Stats warm = stats(o.rel), all = stats(o.rel_all);
      std::printf("%s, seed %llu: %zu waited; warm: mean |err| %.1f%%, mean %+.1f%%, p50 %.1f%%, p90 %.1f%%, "
                  "max %.1f%%; all: mean |err| %.1f%%, max %.1f%%; %d started at once (%d predicted 0)\n",
                  sc.what, static_cast<unsigned long long>(seed), o.rel_all.size(), 100 * warm.mean_abs,
                  100 * warm.mean, 100 * warm.p50_abs, 100 * warm.p90_abs, 100 * warm.max_abs, 100 * all.mean_abs,
                  100 * all.max_abs, o.zero_wait, o.zero_wait_predicted_zero);
      ASSERT_GT(o.rel.size(), 50u) << sc.what << ": the queue must build up for the comparison to mean something";
      EXPECT_EQ(o.zero_wait_predicted_zero, o.zero_wait) << sc.what << ": a free slot and no queue is a wait of 0";
      if (!sc.eos) {
        EXPECT_LT(warm.mean_abs, sc.max_mean_error) << sc.what << ", seed " << seed;
        EXPECT_LT(warm.p90_abs, sc.max_p90_error) << sc.what << ", seed " << seed;
      } else {
        // Every job may run to max_new_tokens, so the ETA reads "at the latest": it overestimates, never (beyond
        // the noise) underestimates.
        EXPECT_GT(warm.mean, 0.0) << sc.what << ", seed " << seed;
        for (double r : o.rel) EXPECT_GT(r, -0.10) << sc.what << ", seed " << seed;
      }
    }
  }
}

}  // namespace
}  // namespace tandem::policy
