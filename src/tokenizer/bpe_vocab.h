// A byte-level BPE vocabulary as plain data: what GGUF `tokenizer.ggml.model = "gpt2"` files hold. Both the
// tokenizer library (Tokenizer::from_bpe_vocab) and the GGUF code (weights/gguf_tokenizer.h) use it; it depends on
// nothing but the standard library, so neither library depends on the other through it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/piece_type.h"

namespace tandem::tok {

struct BpeVocab {
  // Token spellings in the GPT-2 byte-to-unicode alphabet ("Ġthe" is " the"), id = index.
  std::vector<std::string> tokens;
  // One per token: normal, control (special: BOS/EOS/<|im_end|>...), user_defined (added, matched everywhere),
  // unused / unknown / byte as llama.cpp types them. Empty = all normal.
  std::vector<PieceType> types;
  // Merge rules in rank order (first = applied first), as the two token spellings.
  std::vector<std::pair<std::string, std::string>> merges;
  // llama.cpp's pre-tokenizer name (tokenizer.ggml.pre): "llama-bpe", "qwen2", "gpt-2", ... (bpe_pre_names()).
  std::string pre = "default";
  TokenId bos = -1, eos = -1, eot = -1, unk = -1, pad = -1;  // -1: none
  bool add_bos = false;
  bool add_eos = false;
};

// The pre-tokenizer names from_bpe_vocab accepts, and the regexes (llama.cpp's lists, applied in order, each
// splitting every piece into matches and the text between them) of one; empty for an unknown name.
std::vector<std::string> bpe_pre_names();
std::vector<std::string> bpe_pre_regexes(const std::string& pre);

// A Hugging Face tokenizer.json equivalent to `v`: model BPE (vocab + merges as pairs, ignore_merges for the
// llama3 names), the pre name's regexes as a Sequence of Split(Regex, Isolated) followed by ByteLevel(use_regex
// false), ByteLevel decoder, added_tokens for the
// control (special) and user_defined (not special) tokens, and a TemplateProcessing post-processor with BOS / EOS
// when add_bos / add_eos. Tokenizer::from_hf_json on it encodes exactly as from_bpe_vocab(v). For tests and model
// writers; also the canonical model_bytes() of a GGUF BPE tokenizer.
std::string hf_json_from_bpe_vocab(const BpeVocab& v);

// A real byte-level BPE vocabulary trained on a deterministic generated English-like corpus (words, punctuation,
// digits, code-ish lines, some accented and CJK text): the 256 byte tokens first (in the GPT-2 byte order), then
// one token per learned merge up to vocab_size - specials.size(), then the `specials` as control tokens (the first
// is BOS when it looks like one: "<s>", "<|begin_of_text|>", ...; the others as eos / eot by name). `pre` selects
// the pre-tokenizer used for training and recorded in the result. Same arguments → the same vocabulary. vocab_size
// must be >= 256 + specials.size(). Training stops after a few thousand merges (or when the corpus has no pair
// left); further tokens, up to exactly vocab_size (150,000 for load-time measurements), are deterministic
// pseudo-random merges of two existing tokens, so every token still has its merge rule.
BpeVocab generate_bpe_vocab(int vocab_size, std::string pre, std::vector<std::string> specials, std::uint64_t seed);

}  // namespace tandem::tok
