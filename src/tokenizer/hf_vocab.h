// A Hugging Face byte-level BPE tokenizer.json read as a tok::BpeVocab: what a GGUF "gpt2" vocabulary
// (tokenizer.ggml.*) can hold, with the llama.cpp pre name its normalizer + pre-tokenizer equal. For converters
// (modelgen::convert_to_gguf, tandem-quantize); docs/model-format.md, the conversion section.
#pragma once

#include <string>
#include <string_view>

#include "core/result.h"
#include "tokenizer/bpe_vocab.h"

namespace tandem::tok {

// Reads a tokenizer.json with model BPE, a ByteLevel pre-tokenizer and a ByteLevel decoder (GPT-2, Llama 3, Qwen2,
// SmolLM, DeepSeek):
// - tokens: model.vocab and added_tokens by id (dense 0..n-1, else format_error naming the first missing id);
//   every token that is not an added token must be GPT-2 byte-alphabet text (format_error naming it).
// - types: special added tokens control, other added tokens user_defined, the rest normal.
// - merges in rank order ("a b" strings or ["a", "b"] pairs).
// - bos / add_bos from a TemplateProcessing post-processor (a special token before the sequence), eos / add_eos
//   after it; without one the special added tokens spelled as Tokenizer::from_hf_json documents. eot: the first
//   special of Tokenizer::eot_id()'s list when it is not the eos (-1 otherwise: readers fall back to the same id).
//   unk: model.unk_token.
// - pre: the llama.cpp pre name (bpe_pre_names()) whose regex list equals the file's pre-tokenizer: each
//   Split(Regex, Isolated) gives its pattern, Digits gives \p{N} (individual_digits) or \p{N}+, ByteLevel with
//   use_regex the GPT-2 regex; patterns compared after canonicalisation (\s / \S as the loader reads them, the regex
//   escapes \r \n \t as those characters, "(?i:'s|'t|'re|'ve|'m|'ll|'d)" as llama.cpp's spelled-out form, the GPT-2
//   regex with or without its final "|\s+"). Of names with equal lists: llama-bpe, gpt-2, starcoder.
// `tokenizer_config_json` (tokenizer_config.json's text, may be empty): add_bos_token / add_eos_token override the
// post-processor (as tok::model_adds_bos does for a directory); bos_token / eos_token / pad_token (a string or
// {"content": ..}) name BOS / EOS / padding when the tokenizer.json does not.
// Errors, each naming `origin`: those of Tokenizer::from_hf_json (parse_error, format_error, unsupported for
// WordPiece / Unigram / WordLevel models), format_error as above, and unsupported for what a GGUF "gpt2" vocabulary
// cannot express: a SentencePiece-style file (Metaspace, byte_fallback, no ByteLevel: "convert from
// tokenizer.model"), a normalizer other than none / NFC, a decoder other than ByteLevel, ByteLevel
// add_prefix_space, a pre-tokenizer whose regex list matches none of llama.cpp's pre names (naming it).
// Known approximations (llama.cpp's converter makes the same): an NFC normalizer is dropped (text not in NFC may
// tokenize differently), ignore_merges follows the pre name (on for llama-bpe), added tokens' lstrip / rstrip /
// single_word are dropped.
Result<BpeVocab> bpe_vocab_from_hf_json(std::string_view tokenizer_json, std::string origin,
                                        std::string_view tokenizer_config_json = {});

// The canonical form of a pre-tokenizer regex used for the comparison above (exposed for tests).
std::string canonical_pre_regex(std::string_view pattern);

}  // namespace tandem::tok
