// Whisper's special tokens on top of a byte-level BPE Tokenizer (docs/tokenizers.md, "Whisper"): the language
// table, the ids of <|startoftranscript|>, the task / timestamp tokens found by their spelling, and a writer of
// Whisper-style tokenizer files for test and default models.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "tokenizer/tokenizer.h"

namespace tandem::tok {

struct WhisperLanguage {
  std::string_view code;  // "en"
  std::string_view name;  // "english" (openai/whisper's LANGUAGES)
};
// Whisper's language order (the order of the <|xx|> tokens): 99 for v1/v2 models, "yue" the 100th (large-v3).
std::span<const WhisperLanguage> whisper_languages();

inline constexpr int kWhisperTimestampCount = 1501;         // <|0.00|> … <|30.00|>
inline constexpr double kWhisperTimestampSeconds = 0.02;    // one timestamp step

struct WhisperSpecials {
  TokenId eot = -1, sot = -1, translate = -1, transcribe = -1, startoflm = -1, startofprev = -1, nospeech = -1,
          notimestamps = -1, timestamp_begin = -1;
  int timestamp_count = 0;         // 1501 for standard models (0.00 … 30.00 s)
  std::vector<TokenId> languages;  // languages[i] is whisper_languages()[i]'s token; as many as the model has
  bool multilingual() const;       // more than one language token
  TokenId language_id(std::string_view code) const;  // -1 when the model has no such language
  std::string_view language_code(TokenId id) const;  // "" when id is not a language token
  bool is_timestamp(TokenId id) const;
  double timestamp_seconds(TokenId id) const;     // (id − timestamp_begin) · 0.02
  TokenId timestamp_token(double seconds) const;  // rounded to the 0.02-s grid, clamped to the range; -1 without any
};

// Finds the specials by their spelling in `tok` (nospeech: "<|nospeech|>" or the older "<|nocaptions|>").
// Languages: the <|xx|> tokens in whisper_languages() order up to the first one absent; an English-only checkpoint
// (openai's *.en: GPT-2 text vocabulary, eot 50256, model_vocab 51864) gets none, as openai/whisper prompts it
// without language and task tokens although its tokenizer.json lists them.
// Timestamps: the added tokens "<|0.00|>", "<|0.02|>", … when present (they must be consecutive ids), else
// notimestamps + 1 … model_vocab − 1 (older tokenizer.json files; no tokenizer token may lie in that range).
// Errors: format_error naming the first missing special, non-consecutive language / timestamp ids, or model_vocab
// too small for the timestamps.
Result<WhisperSpecials> whisper_specials(const Tokenizer& tok, int model_vocab);

// A text's ids without any special token (a decoder prompt, or text compared with decoded text): no BOS / EOS,
// special spellings ("<|en|>") as plain text. Timestamp spellings stay text too where a tokenizer.json has them as
// non-special added tokens (the Hub's newer files), which Tokenizer::encode would match.
std::vector<TokenId> whisper_text_ids(const Tokenizer& tok, std::string_view text);

// Writer for test and default models (whisper_vocab.cc): trains a GPT-2-style byte-level BPE on `corpus` (the
// GPT-2 pre-tokenizer regex, learn_bpe_merges) with at most `vocab_tokens` non-special tokens (the 256 bytes in
// GPT-2's bytes_to_unicode order + merges; fewer when the corpus runs out of pairs), then appends the specials in
// Whisper's order: <|endoftext|>, <|startoftranscript|>, the first `languages` (0 … 100) language tokens,
// <|translate|>, <|transcribe|>, <|startoflm|>, <|startofprev|>, <|nospeech|>, <|notimestamps|> and the 1501
// timestamps, all special added tokens. Writes `dir`/tokenizer.json (ByteLevel pre-tokenizer and decoder,
// TemplateProcessing "<|startoftranscript|> <|notimestamps|> $A <|endoftext|>") and tokenizer_config.json, creating
// `dir` when missing. Returns the total vocabulary size (the model's vocab_size). Deterministic for the same inputs.
// Errors: invalid_argument for `languages` out of range, io_error naming the file.
struct WhisperTokenizerWrite {
  std::size_t vocab_tokens = 1000;
  int languages = 99;
};
Result<int> write_whisper_tokenizer(const std::string& dir, std::span<const std::string> corpus,
                                    const WhisperTokenizerWrite& opts = {});

}  // namespace tandem::tok
