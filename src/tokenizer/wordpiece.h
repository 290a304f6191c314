// BERT's WordPiece tokenizer, as Hugging Face's BertTokenizer(Fast) encodes: the BertNormalizer (clean the text,
// space out CJK ideographs, strip accents, lowercase), the BertPreTokenizer (split on whitespace, isolate
// punctuation), greedy longest-match-first WordPiece with "##" continuations and [UNK] for a word it cannot cover
// (or one longer than 100 characters), and [CLS] ... [SEP] around the result. The text encoders of sentence
// embedding models (BERT, MiniLM, bge, e5, nomic-embed-text) use it. Its own class: it only encodes (embedding
// inputs are never decoded) and has none of the chat machinery of Tokenizer. docs/tokenizers.md, "WordPiece".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace tandem::tok {

struct WordPieceOptions {
  bool lowercase = true;      // BertNormalizer.lowercase (do_lower_case)
  bool strip_accents = true;  // BertNormalizer.strip_accents (null in tokenizer.json: follows lowercase)
  bool handle_chinese_chars = true;
  bool clean_text = true;
  std::string unk = "[UNK]", cls = "[CLS]", sep = "[SEP]", pad = "[PAD]";
  std::string continuing_prefix = "##";
  int max_input_chars_per_word = 100;
};

class WordPieceTokenizer {
 public:
  // vocab.txt: one token per line, the line number is the id (a trailing "\r" is dropped). Errors: format_error
  // naming `origin` and the line (a duplicate token, an empty vocabulary, a missing [UNK] / [CLS] / [SEP]).
  static Result<WordPieceTokenizer> from_vocab_txt(std::string_view text, std::string origin,
                                                   const WordPieceOptions& o = {});
  // A tokenizer.json whose model is WordPiece (its vocab, unk_token, continuing_subword_prefix,
  // max_input_chars_per_word; the BertNormalizer's flags; the TemplateProcessing / BertProcessing [CLS] and [SEP]).
  // Errors: parse_error (not JSON), format_error naming the key, unsupported (another model or normalizer type).
  static Result<WordPieceTokenizer> from_hf_json(std::string_view json, std::string origin);
  // The token list by id (what GGUF's tokenizer.ggml.tokens holds once llama.cpp's "phantom space" spelling is
  // undone: weights::wordpiece_tokens_from_gguf).
  static Result<WordPieceTokenizer> from_tokens(std::vector<std::string> tokens, std::string origin,
                                                const WordPieceOptions& o = {});

  WordPieceTokenizer(WordPieceTokenizer&&) noexcept;
  WordPieceTokenizer& operator=(WordPieceTokenizer&&) noexcept;
  ~WordPieceTokenizer();

  // [CLS] + the text's pieces + [SEP]; with max_tokens > 0 the pieces are cut so that [CLS] and [SEP] stay
  // (Hugging Face's truncation=True, max_length=max_tokens). Any text is accepted (malformed UTF-8 becomes U+FFFD).
  std::vector<std::int32_t> encode(std::string_view text, std::size_t max_tokens = 0) const;
  // The pieces of the text without [CLS] / [SEP] (for tests and tandem-tokenize).
  std::vector<std::string> pieces(std::string_view text) const;

  int vocab_size() const;
  const std::string& token(std::int32_t id) const;  // "" out of range
  std::int32_t id_of(std::string_view token) const;  // -1 when absent
  std::int32_t cls_id() const;
  std::int32_t sep_id() const;
  std::int32_t unk_id() const;
  std::int32_t pad_id() const;  // -1 when the vocabulary has none
  const WordPieceOptions& options() const;
  const std::string& origin() const;

 private:
  struct Impl;
  WordPieceTokenizer();
  std::unique_ptr<Impl> impl_;
};

namespace detail {
// The BertNormalizer + BertPreTokenizer words of `text` (exposed for tests).
std::vector<std::string> bert_words(std::string_view text, const WordPieceOptions& o);
}  // namespace detail

}  // namespace tandem::tok
