// CLIP's tokenizer vocabulary as plain data (openai/clip-vit-* layout), a trainer for writers of small CLIP models,
// and the writers of its files (docs/tokenizers.md, "CLIP"). Tokenizer::from_vocab_merges and
// Tokenizer::from_hf_json read what these write.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"

namespace tandem::tok {

inline constexpr std::string_view kClipBos = "<|startoftext|>";
inline constexpr std::string_view kClipEos = "<|endoftext|>";
inline constexpr std::string_view kClipWordEnd = "</w>";
inline constexpr std::size_t kClipContextLength = 77;  // CLIP's text context: BOS + 75 tokens + EOS

struct ClipVocab {
  // id = index. Spellings in GPT-2's byte-level alphabet ("é" is "Ã©"); word-final tokens end with "</w>";
  // "<|startoftext|>" and "<|endoftext|>" are the special tokens (the last two ids in the real vocabulary).
  std::vector<std::string> tokens;
  // Merge rules in rank order (first = applied first), as the two token spellings; each result is a token.
  std::vector<std::pair<std::string, std::string>> merges;
};

// CLIP's text pipeline up to BPE, for trainers and tests: NFC, whitespace runs → " ", lowercase, the CLIP regex
// ('s|'t|'re|'ve|'m|'ll|'d|letter runs|single digits|runs of other non-space characters; the two specials as
// words), each word mapped to byte-level characters (no "</w>" yet).
std::vector<std::string> clip_words(std::string_view text);

// Trains a CLIP-style byte-level BPE vocabulary on `corpus` (captions, ...): the 256 byte characters in the order
// of GPT-2's bytes_to_unicode ("!" first, as the real vocab.json), the same 256 with "</w>", one token per learned
// merge in rank order (token 512 + r is merge r's result), then "<|startoftext|>" and "<|endoftext|>" as the last
// two ids. Words are counted over the corpus after clip_words(); each step merges the most frequent adjacent pair
// (ties: the pair of lower ids), skipping a pair whose result is already a token. Training stops at vocab_size tokens
// or when no pair is left, so the result may be smaller than vocab_size (tokens.size() is the model's vocab size).
// Deterministic: the same corpus and size give the same vocabulary. vocab_size < 514 gives the 514 base tokens.
ClipVocab train_clip_bpe(const std::vector<std::string>& corpus, std::size_t vocab_size);

// The slow tokenizer's files: vocab.json ({"token": id, ...}, ids in order) and merges.txt ("#version: 0.2" then
// "a b" per line).
std::string clip_vocab_json(const ClipVocab& v);
std::string clip_merges_txt(const ClipVocab& v);
// The equivalent Hugging Face tokenizer.json, as transformers' CLIPConverter writes it: BPE with
// end_of_word_suffix "</w>" and unk <|endoftext|>, normalizer NFC + Replace(\s+ → " ") + Lowercase, pre-tokenizer
// Split(CLIP regex, Removed, invert) + ByteLevel, ByteLevel decoder, RobertaProcessing (cls <|startoftext|>, sep
// <|endoftext|>), the two specials as added tokens. Requires both specials in v.tokens (else format_error).
Result<std::string> clip_hf_json(const ClipVocab& v);
// Writes vocab.json, merges.txt and (with_tokenizer_json) tokenizer.json into the existing directory `dir`.
// io_error naming the file; format_error as clip_hf_json.
Status write_clip_tokenizer_files(const std::string& dir, const ClipVocab& v, bool with_tokenizer_json = true);

}  // namespace tandem::tok
