// The incremental BPE merge learner shared by the vocabulary writers of tests and tools (bpe_train.cc: GPT-2 style
// vocabularies; clip_vocab.cc: CLIP's). Internal to tandem_tokenizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tandem::tok::detail {

// Learns merges over words given as token ids (`syms`, changed in place) with their counts (`freq`): each step
// merges the most frequent adjacent pair (ties: the pair (a, b) with the lower a, then the lower b); a pair whose
// concatenated spelling is already a token is never merged. Each merge appends its spelling to `tokens`, registers
// it in `id_of` and appends (a's spelling, b's spelling) to `merges`. Stops when `tokens` holds `target_tokens`,
// after `max_merges` merges, or when the most frequent pair occurs fewer than `min_count` times. Deterministic.
// Returns the number of merges learned.
std::size_t learn_bpe_merges(std::vector<std::vector<int>>& syms, const std::vector<std::int64_t>& freq,
                             std::vector<std::string>& tokens, std::unordered_map<std::string, int>& id_of,
                             std::vector<std::pair<std::string, std::string>>& merges, std::size_t target_tokens,
                             std::int64_t min_count, std::size_t max_merges);

}  // namespace tandem::tok::detail
