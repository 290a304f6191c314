// GGUF "gpt2" (byte-level BPE) vocabularies <-> tok::BpeVocab: reading `tokenizer.ggml.*` for
// tok::Tokenizer::from_bpe_vocab, and writing a BpeVocab as that metadata (tandem-mkmodel, tests). Lives in its own
// library (tandem_gguf_tokenizer: weights + the dependency-free tokenizer/bpe_vocab.h), so weights does not depend
// on the tokenizer library.
#pragma once

#include <string>
#include <vector>

#include "core/result.h"
#include "tokenizer/bpe_vocab.h"
#include "weights/gguf.h"

namespace tandem::weights {

// tokenizer.ggml.model must be "gpt2" (unsupported otherwise, naming it); tokens (strings), token_type (integers
// 0-6, one per token; absent = all normal), merges (strings "a b", each naming two tokens), pre (absent =
// "default"), the bos / eos / eot / unknown / padding ids (in range) and add_bos_token / add_eos_token.
// format_error naming the file and key for anything missing, mistyped or inconsistent. Spelling checks (UTF-8,
// merge results in the vocabulary) are made by Tokenizer::from_bpe_vocab.
Result<tok::BpeVocab> bpe_vocab_from_gguf(const GgufFile& f);

// Sets tokenizer.ggml.model "gpt2", .pre, .tokens, .token_type (i32), .merges, the special ids that are >= 0
// (u32) and add_bos_token / add_eos_token (bool) on `w`.
void write_bpe_vocab_to_gguf(GgufWriter& w, const tok::BpeVocab& v);

// A GGUF "bert" vocabulary (tokenizer.ggml.model "bert", as llama.cpp's converter writes BERT-family models) as
// WordPiece's token list: the converter's "phantom space" spelling undone — a token starting with U+2581 was a
// word-initial piece (the mark dropped), a bracketed token ([CLS], [unused0]) is kept, any other token was a "##"
// continuation. unsupported for another tokenizer model; format_error for a missing or mistyped token list.
Result<std::vector<std::string>> wordpiece_tokens_from_gguf(const GgufFile& f);
// The converter's spelling of a WordPiece token list (the inverse), for writing tokenizer.ggml.tokens.
std::vector<std::string> wordpiece_tokens_to_gguf(const std::vector<std::string>& tokens);

}  // namespace tandem::weights
