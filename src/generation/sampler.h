// Token sampling over a logits vector: greedy, temperature, top-k, top-p, repetition penalty. Deterministic: the
// token drawn at generation step n depends only on (seed, n), the logits and the history — never on a global
// random state — so checkpoint + resume reproduces the uninterrupted run.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"

namespace tandem::gen {

using TokenId = std::int32_t;

struct SamplingParams {
  double temperature = 0.0;         // 0 = greedy (argmax, lowest id on ties)
  int top_k = 0;                    // 0 = off
  double top_p = 1.0;               // 1 = off
  double repetition_penalty = 1.0;  // 1 = off; HF semantics: logit > 0 divided, else multiplied
  int repetition_window = 0;        // how many most recent history tokens it looks at; 0 = whole history
  std::uint64_t seed = 0;

  // Temperatures below 1e-5 are greedy: 1/T would overflow (and at that point only ties could differ anyway).
  bool greedy() const { return temperature < 1e-5 || top_k == 1; }
  // Ranges: temperature in [0, 100], top_k in [0, 1e6], top_p in (0, 1], repetition_penalty in (0, 10],
  // repetition_window >= 0.
  Status validate() const;
  std::string describe() const;  // canonical text (for fingerprints)
};

// Picks the token for generation step `step` (0 = the first new token). `logits` is modified in place (penalty;
// NaN becomes -inf so the ordering stays a strict weak order). `history` is prompt + tokens generated so far.
TokenId sample(std::span<float> logits, std::span<const TokenId> history, const SamplingParams& p,
               std::uint64_t step);

}  // namespace tandem::gen
