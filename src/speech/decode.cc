// One window's decode at one temperature: Whisper's logit rules and the token loop (decode.h).
#include "speech/decode.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "generation/rng.h"

namespace tandem::speech::detail {
namespace {

constexpr float kOff = -std::numeric_limits<float>::infinity();

struct TimestampRange {
  TokenId begin = 0, end = 0;  // [begin, end) clamped to the logits
  bool contains(TokenId id) const { return id >= begin && id < end; }
};

TimestampRange timestamp_range(const tok::WhisperSpecials& sp, std::size_t vocab) {
  if (sp.timestamp_begin < 0 || sp.timestamp_count <= 0) return {};
  const auto v = static_cast<TokenId>(vocab);
  return {std::min(sp.timestamp_begin, v), std::min<TokenId>(sp.timestamp_begin + sp.timestamp_count, v)};
}

void off(std::span<float> logits, TokenId id) {
  if (id >= 0 && static_cast<std::size_t>(id) < logits.size()) logits[static_cast<std::size_t>(id)] = kOff;
}

void off_range(std::span<float> logits, TokenId from, TokenId to) {
  from = std::max<TokenId>(from, 0);
  to = std::min<TokenId>(to, static_cast<TokenId>(logits.size()));
  for (TokenId i = from; i < to; ++i) logits[static_cast<std::size_t>(i)] = kOff;
}

// Every id outside the timestamps, except `keep` (−1: none).
void off_non_timestamps(std::span<float> logits, const TimestampRange& ts, TokenId keep) {
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const auto id = static_cast<TokenId>(i);
    if (!ts.contains(id) && id != keep) logits[i] = kOff;
  }
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

void apply_rules(std::span<float> logits, std::span<const TokenId> sampled, const Rules& rules) {
  const tok::WhisperSpecials& sp = *rules.sp;
  const Transcriber::Config& cfg = *rules.cfg;
  for (float& x : logits) {
    if (std::isnan(x)) x = kOff;
  }
  if (sampled.empty()) {
    for (TokenId id : cfg.begin_suppress) off(logits, id);
  }
  for (TokenId id : cfg.suppress) off(logits, id);

  const TimestampRange ts = timestamp_range(sp, logits.size());
  if (!rules.timestamps) {
    off_range(logits, ts.begin, ts.end);
    return;
  }
  off(logits, sp.notimestamps);
  off_range(logits, ts.begin + cfg.max_timestamp_index + 1, ts.end);  // past the window's end

  const bool last_ts = !sampled.empty() && ts.contains(sampled.back());
  const bool penultimate_ts = sampled.size() < 2 || ts.contains(sampled[sampled.size() - 2]);
  if (last_ts) {
    if (penultimate_ts) {
      off_range(logits, ts.begin, ts.end);  // a pair is closed (or the first token was one): text or eot next
    } else {
      off_non_timestamps(logits, ts, sp.eot);  // a lone timestamp: its partner (or eot) next
    }
  }
  const auto last_stamp = std::find_if(sampled.rbegin(), sampled.rend(), [&](TokenId id) { return ts.contains(id); });
  if (last_stamp != sampled.rend()) {
    // Never decreasing; after text strictly later, so every segment has a nonzero length.
    const TokenId floor = (last_ts && !penultimate_ts) ? *last_stamp : *last_stamp + 1;
    off_range(logits, ts.begin, floor);
  }
  if (sampled.empty()) {
    off_non_timestamps(logits, ts, -1);
    off_range(logits, ts.begin + cfg.max_initial_timestamp_index + 1, ts.end);
  }
  // When the timestamps together are likelier than any single other token, a timestamp it is. The log-softmax
  // normaliser is common to both sides, so raw logits compare the same.
  double ts_lse = -std::numeric_limits<double>::infinity();
  {
    const std::span<const float> stamps = std::span<const float>(logits).subspan(
        static_cast<std::size_t>(ts.begin), static_cast<std::size_t>(ts.end - ts.begin));
    ts_lse = log_sum_exp(stamps);
  }
  double max_other = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (!ts.contains(static_cast<TokenId>(i))) max_other = std::max(max_other, static_cast<double>(logits[i]));
  }
  if (ts_lse > max_other) off_non_timestamps(logits, ts, -1);
}

double log_sum_exp(std::span<const float> logits) {
  double mx = -std::numeric_limits<double>::infinity();
  for (float x : logits) mx = std::max(mx, static_cast<double>(x));
  if (!std::isfinite(mx)) return mx;
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - mx);
  return mx + std::log(sum);
}

TokenId pick_token(std::span<const float> logits, double temperature, std::uint64_t seed, std::uint64_t step) {
  TokenId best = -1;
  float best_v = kOff;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > best_v) {
      best_v = logits[i];
      best = static_cast<TokenId>(i);
    }
  }
  if (best < 0 || temperature < 1e-5) return best;
  // softmax(logits / T) with the maximum subtracted; the cumulative sum meets u · total at the drawn token.
  std::vector<double> w(logits.size());
  double total = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    w[i] = logits[i] == kOff ? 0.0 : std::exp((static_cast<double>(logits[i]) - best_v) / temperature);
    total += w[i];
  }
  const double target = gen::uniform01(seed, step) * total;
  double acc = 0;
  TokenId last_positive = best;
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (w[i] <= 0) continue;
    acc += w[i];
    last_positive = static_cast<TokenId>(i);
    if (acc > target) return last_positive;
  }
  return last_positive;  // rounding left target at the very top
}

std::uint64_t window_seed(std::uint64_t seed, std::uint64_t seek, std::size_t temperature_index) {
  return splitmix64(splitmix64(seed) ^ splitmix64(seek ^ (static_cast<std::uint64_t>(temperature_index) << 56)));
}

Result<Attempt> run_attempt(DecoderSession& session, std::span<const float> first_logits, const Rules& rules,
                            const AttemptParams& params, const std::atomic<bool>* cancel) {
  Attempt a;
  a.temperature = params.temperature;
  std::vector<float> logits(first_logits.begin(), first_logits.end());
  const std::size_t vocab = logits.size();
  for (std::uint64_t step = 0;; ++step) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      return fail(Errc::cancelled, "transcription cancelled");
    }
    apply_rules(logits, a.tokens, rules);
    const TokenId next = pick_token(logits, params.temperature, params.seed, step);
    if (next < 0) {
      // Every token ruled out (a model whose suppression lists cover everything): end the window here.
      break;
    }
    a.sum_logprob += static_cast<double>(logits[static_cast<std::size_t>(next)]) - log_sum_exp(logits);
    if (next == params.eot) break;
    a.tokens.push_back(next);
    if (a.tokens.size() >= params.max_new_tokens || session.fed() + 1 > params.max_positions) break;
    auto r = session.decode(std::span<const TokenId>(&next, 1), cancel);
    if (!r.ok()) return fail(std::move(r).error());
    if (r->size() != vocab) {
      return fail(Errc::internal, "decoder session returned " + std::to_string(r->size()) + " logits, expected " +
                                      std::to_string(vocab));
    }
    logits = std::move(r).value();
  }
  a.avg_logprob = a.sum_logprob / static_cast<double>(a.tokens.size() + 1);
  return a;
}

}  // namespace tandem::speech::detail
