// Inside the speech library: one window's decode at one temperature — Whisper's logit rules (suppression and
// timestamp rules), greedy / seeded sampling, the token loop over a DecoderSession. docs/speech-decoding.md.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/result.h"
#include "speech/session.h"
#include "speech/transcriber.h"
#include "tokenizer/whisper_tokens.h"

namespace tandem::speech::detail {

struct Rules {
  const tok::WhisperSpecials* sp = nullptr;
  const Transcriber::Config* cfg = nullptr;
  bool timestamps = true;
};

// Applies, in openai/whisper's order, to the logits of the next token after the `sampled` tokens of this window
// (sampled = tokens after the prompt): NaN → −inf; begin_suppress (first step only); suppress; then with timestamps:
// <|notimestamps|> and timestamps past the window off, timestamps in pairs (after a lone timestamp only timestamps
// or eot; after a pair no timestamp), never decreasing (after text strictly later), the first token a timestamp at
// most max_initial_timestamp_index, and only timestamps when their summed probability beats every other token's.
// Without timestamps every timestamp token is off.
void apply_rules(std::span<float> logits, std::span<const TokenId> sampled, const Rules& rules);

// log Σ exp(logits) (−inf when all are −inf).
double log_sum_exp(std::span<const float> logits);

// Greedy: the lowest id of the maximum. Sampling: a draw from softmax(logits / temperature) with the uniform
// number gen::uniform01(seed, step). −1 when every logit is −inf.
TokenId pick_token(std::span<const float> logits, double temperature, std::uint64_t seed, std::uint64_t step);

// The seed of one window's decode at ladder position `temperature_index`: a mix of the options' seed, the window's
// first sample and the index, so each window draws its own numbers wherever it runs.
std::uint64_t window_seed(std::uint64_t seed, std::uint64_t seek, std::size_t temperature_index);

struct Attempt {
  std::vector<TokenId> tokens;  // sampled tokens, eot excluded
  double sum_logprob = 0;       // log-probs (after the rules, before temperature) of the sampled tokens and eot
  double avg_logprob = 0;       // sum_logprob / (tokens + 1), as openai/whisper
  double temperature = 0;
};

struct AttemptParams {
  double temperature = 0;
  std::uint64_t seed = 0;
  std::size_t max_new_tokens = 224;
  std::size_t max_positions = 448;  // the session never holds more
  TokenId eot = -1;
};

// Samples until eot, max_new_tokens or the text positions are full. The session holds the prompt (its fed() is
// where the tokens go); `first_logits` are the logits after the prompt. Polls `cancel` before every token.
Result<Attempt> run_attempt(DecoderSession& session, std::span<const float> first_logits, const Rules& rules,
                            const AttemptParams& params, const std::atomic<bool>* cancel);

}  // namespace tandem::speech::detail
