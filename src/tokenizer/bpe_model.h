// The byte-level / Hugging Face BPE tokenizer behind Tokenizer (kind bpe): its configuration as read from a
// tokenizer.json (hf_json.cc) and the encode / decode machinery (bpe_model.cc). Internal to the tokenizer library.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/token_index.h"
#include "core/result.h"
#include "tokenizer/bpe_vocab.h"
#include "tokenizer/piece_type.h"
#include "tokenizer/unicode.h"

namespace tandem::tok {
struct EncodeOptions;
struct TextPiece;
}  // namespace tandem::tok

namespace tandem::tok::detail {

struct AddedToken {
  TokenId id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

struct NormStep {
  enum class Kind : std::uint8_t { unicode, prepend, replace_string, replace_regex, lowercase };
  Kind kind = Kind::unicode;
  NormalForm form = NormalForm::nfc;
  std::string a;  // prepend: the text; replace: the pattern string
  std::string b;  // replace: the content
  std::optional<Regex> regex;
};

enum class SplitBehavior : std::uint8_t { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct PreStep {
  enum class Kind : std::uint8_t { byte_level, split, digits, metaspace };
  Kind kind = Kind::split;
  // byte_level
  bool add_prefix_space = false;
  bool use_regex = false;  // byte_level: split with the GPT-2 regex first (`regex` holds it)
  // split
  std::string pattern;  // String pattern (regex unset) or the regex text
  std::optional<Regex> regex;
  SplitBehavior behavior = SplitBehavior::isolated;
  bool invert = false;
  // digits
  bool individual_digits = false;
  // metaspace
  std::string replacement;
  enum class Prepend : std::uint8_t { always, first, never } prepend = Prepend::always;
  bool split_on_replacement = true;
};

class BpeModel;
// bpe_vocab.cc: whether the pre name's tokenizer.json sets ignore_merges (llama3), and the JSON object holding only
// the normalizer / pre_tokenizer / post_processor / decoder that hf_json_from_bpe_vocab writes for `v`.
bool bpe_pre_ignores_merges(const std::string& pre);
std::string hf_json_components(const BpeVocab& v);
// Parses tokenizer.json text into `m` (m.origin names it in errors) and calls finish() (hf_json.cc).
Status read_hf_json(std::string_view text, BpeModel& m);
// Reads the normalizer / pre_tokenizer / decoder / post_processor of a JSON object (a tokenizer.json's components,
// m.tokens already set) into `m` and sets m.pre_name as read_hf_json does; does not call finish() (hf_json.cc).
Status read_hf_components(std::string_view json_text, BpeModel& m);

// Open-addressing (left id, right id) → (rank, result id) table for the merge loop.
class PairTable {
 public:
  void build(std::size_t n);
  void insert_first(std::uint64_t key, std::uint64_t value);  // keeps an existing key's value
  const std::uint64_t* find(std::uint64_t key) const {
    if (slots_.empty()) return nullptr;
    for (std::size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.value;
      if (s.key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr std::uint64_t kEmpty = ~0ULL;
  static std::uint64_t mix(std::uint64_t k) {
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDULL;
    k ^= k >> 33;
    return k;
  }
  struct Slot {
    std::uint64_t key;
    std::uint64_t value;
  };
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
};

class BpeModel {
 public:
  // --- configuration (filled by the loaders, then finish() builds the tables) ---
  std::vector<std::string> tokens;  // id → spelling (model vocab and added tokens)
  std::vector<PieceType> types;
  std::vector<std::pair<std::string, std::string>> merge_text;  // rank order, as spellings
  std::vector<AddedToken> added;
  std::vector<NormStep> normalizers;
  std::vector<PreStep> pre_steps;
  bool byte_fallback = false;
  bool ignore_merges = false;
  // BPE end_of_word_suffix (CLIP: "</w>"): the last character of each word starts as that character + suffix.
  std::string end_of_word_suffix;
  // The suffix the decoder turns into a space between words (BPEDecoder, or end_of_word_suffix as transformers'
  // CLIPTokenizerFast does); the space after the last word of the text is dropped.
  std::string decode_suffix;
  bool fuse_unk = false;
  TokenId unk = -1, bos = -1, eos = -1, eot = -1, pad = -1;
  bool adds_bos = false;  // the post-processor / GGUF add_bos_token adds BOS
  std::vector<TokenId> bos_extra;  // TemplateProcessing: further specials after BOS (Whisper: <|notimestamps|>)
  bool adds_eos = false;
  // Decoder, reduced to a per-token byte mapping plus stripping at the text start (bpe_model.cc).
  struct DecodeStep {
    enum class Kind : std::uint8_t { byte_level, byte_fallback, replace, strip, fuse } kind;
    std::string a, b;  // replace: pattern → content; strip: the content character
    int count = 0;     // strip: leading occurrences
  };
  std::vector<DecodeStep> decoders;
  std::string pre_name;     // GGUF pre name, or a canonical description of tokenizer.json's pre-tokenizer
  std::string model_bytes;  // the tokenizer.json text
  std::string origin;

  // Builds the lookup tables and the decode surfaces; format_error naming origin for inconsistent data
  // (duplicate spellings, merges whose result is not in the vocabulary, ...).
  Status finish();

  // --- use ---
  void encode(std::span<const TextPiece> pieces, const EncodeOptions& opts, std::vector<TokenId>& out) const;
  // Appends the bytes of token `id` to `pending` (nothing for special tokens and out-of-range ids). A word-final
  // token (decode_suffix) leaves its space owed in *space_owed: it is written before the next token's bytes, and
  // dropped at the end of the text.
  void decode_bytes(TokenId id, std::string& pending, bool* space_owed) const;
  // Drops the decoder's leading Strip characters while *strip_left > 0 and text is at its start.
  void strip_start(std::string& text, int* strip_left) const;
  int strip_count() const { return strip_count_; }
  const std::string& surface(TokenId id) const { return surface_[static_cast<std::size_t>(id)]; }
  std::optional<TokenId> find(std::string_view spelling) const;
  std::vector<TokenId> special_ids() const;

 private:
  void encode_text(std::string_view text, bool first_segment, std::vector<TokenId>& out) const;
  void pre_tokenize(std::string text, bool first_segment, std::vector<std::string>& pieces) const;
  void bpe_word(std::string_view word, std::vector<TokenId>& out) const;

  TokenIndex ids_;
  PairTable merge_map_;  // (left << 32 | right) → (rank << 32 | result)
  std::vector<std::string> surface_;                            // decoded bytes of each token ("" for specials)
  std::vector<std::uint8_t> is_special_;
  std::vector<std::uint8_t> word_final_;                        // decode_suffix: surface ends with the owed space
  std::array<TokenId, 256> byte_tokens_{};                      // <0xXX> ids for byte_fallback (-1 absent)
  std::array<std::vector<std::uint32_t>, 256> added_by_first_;  // indices into `added` by first byte, longest first
  std::string strip_content_;
  int strip_count_ = 0;
};

}  // namespace tandem::tok::detail
