// Internal to the tokenizer library: CLIP's text pipeline and the tokenizer.json components of a CLIP tokenizer
// (clip_tokenizer.cc), shared by the loader (Tokenizer::from_vocab_merges) and the trainer / writers (clip_vocab.cc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::tok::detail {

// The Split regex of CLIP's pre-tokenizer (the slow tokenizer's pattern; matches are kept, the rest removed).
extern const char* const kClipSplitRegex;

// The words of `text` as raw bytes: utf8_sanitize, NFC, \s+ → " ", lowercase, the matches of kClipSplitRegex.
std::vector<std::string> clip_split(std::string_view text);

// {"normalizer", "pre_tokenizer", "post_processor", "decoder"} of a CLIP tokenizer.json, with RobertaProcessing's
// cls = (bos, bos_id) and sep = (eos, eos_id).
std::string clip_components_json(const std::string& bos, std::int64_t bos_id, const std::string& eos,
                                 std::int64_t eos_id);

}  // namespace tandem::tok::detail
