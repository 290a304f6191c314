#include "generation/sampler.h"

#include <algorithm>
#include <limits>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>
#include <unordered_set>

#include "generation/rng.h"

namespace tandem::gen {

Status SamplingParams::validate() const {
  auto bad = [](const std::string& m) { return fail(Errc::invalid_argument, m); };
  if (!(temperature >= 0.0 && temperature <= 100.0))
    return bad("temperature must be in [0, 100], got " + std::to_string(temperature));
  if (top_k < 0 || top_k > 1000000) return bad("top_k must be in [0, 1000000], got " + std::to_string(top_k));
  if (!(top_p > 0.0 && top_p <= 1.0)) return bad("top_p must be in (0, 1], got " + std::to_string(top_p));
  if (!(repetition_penalty > 0.0 && repetition_penalty <= 10.0))
    return bad("repetition_penalty must be in (0, 10], got " + std::to_string(repetition_penalty));
  if (repetition_window < 0) return bad("repetition_window must be >= 0, got " + std::to_string(repetition_window));
  return {};
}

std::string SamplingParams::describe() const {
  std::ostringstream o;
  o.precision(17);
  o << "temperature=" << temperature << ";top_k=" << top_k << ";top_p=" << top_p
    << ";repetition_penalty=" << repetition_penalty << ";repetition_window=" << repetition_window;
  return o.str();
}

namespace {

// NaN logits become -inf (so the ordering stays a strict weak order); returns the largest value. Four lanes at a
// time (GCC vectors: a vocabulary's pass per stream and step is a few percent of a batched decode step).
float clean_and_max(std::span<float> logits) {
  using V4 = float __attribute__((vector_size(16)));
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const V4 neg_inf = {kNegInf, kNegInf, kNegInf, kNegInf};
  V4 mx = neg_inf;
  std::size_t i = 0;
  for (; i + 4 <= logits.size(); i += 4) {
    V4 v;
    std::memcpy(&v, logits.data() + i, sizeof v);
    v = v == v ? v : neg_inf;
    std::memcpy(logits.data() + i, &v, sizeof v);
    mx = v > mx ? v : mx;
  }
  float m = std::max(std::max(mx[0], mx[1]), std::max(mx[2], mx[3]));
  for (; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) logits[i] = kNegInf;
    m = std::max(m, logits[i]);
  }
  return m;
}

// The lowest id holding the largest logit (ties: lowest id wins).
TokenId argmax(std::span<const float> logits, float max) {
  return static_cast<TokenId>(std::find(logits.begin(), logits.end(), max) - logits.begin());
}

// Whether it applies (a penalty other than 1 and a history): then the logits of the window's tokens are changed.
bool apply_repetition_penalty(std::span<float> logits, std::span<const TokenId> history, const SamplingParams& p) {
  if (p.repetition_penalty == 1.0 || history.empty()) return false;
  std::size_t from = 0;
  if (p.repetition_window > 0 && history.size() > static_cast<std::size_t>(p.repetition_window))
    from = history.size() - static_cast<std::size_t>(p.repetition_window);
  std::unordered_set<TokenId> seen;
  const auto pen = static_cast<float>(p.repetition_penalty);
  for (std::size_t i = from; i < history.size(); ++i) {
    const TokenId t = history[i];
    if (t < 0 || static_cast<std::size_t>(t) >= logits.size() || !seen.insert(t).second) continue;
    float& l = logits[static_cast<std::size_t>(t)];
    l = l > 0.0f ? l / pen : l * pen;
  }
  return true;
}

}  // namespace

TokenId sample(std::span<float> logits, std::span<const TokenId> history, const SamplingParams& p,
               std::uint64_t step) {
  if (logits.empty()) return 0;
  float max = clean_and_max(logits);
  if (apply_repetition_penalty(logits, history, p)) max = *std::max_element(logits.begin(), logits.end());
  if (p.greedy()) return argmax(logits, max);

  // Candidates sorted by logit descending, ties by id ascending: a total order, so the result is reproducible.
  std::vector<TokenId> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto by_logit = [&](TokenId a, TokenId b) {
    const float la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  std::size_t keep = idx.size();
  if (p.top_k > 0 && static_cast<std::size_t>(p.top_k) < keep) {
    keep = static_cast<std::size_t>(p.top_k);
    std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(keep), idx.end(), by_logit);
  } else {
    std::sort(idx.begin(), idx.end(), by_logit);
  }
  idx.resize(keep);

  // Softmax at temperature, in double for stable sums.
  const double inv_t = 1.0 / p.temperature;
  const double top = logits[static_cast<std::size_t>(idx[0])];
  std::vector<double> prob(keep);
  double sum = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    prob[i] = std::exp((logits[static_cast<std::size_t>(idx[i])] - top) * inv_t);
    sum += prob[i];
  }
  // Nucleus: the smallest prefix whose mass reaches top_p (at least one token).
  if (p.top_p < 1.0) {
    double acc = 0.0;
    std::size_t n = 0;
    while (n < keep) {
      acc += prob[n] / sum;
      ++n;
      if (acc >= p.top_p) break;
    }
    keep = n;
    sum = 0.0;
    for (std::size_t i = 0; i < keep; ++i) sum += prob[i];
  }
  const double u = uniform01(p.seed, step) * sum;
  double acc = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    acc += prob[i];
    if (u < acc) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace tandem::gen
