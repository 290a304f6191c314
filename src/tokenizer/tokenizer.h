// SentencePiece tokenizer (tokenizer.model), implemented natively: Debian's libsentencepiece bundles a protobuf
// that clashes with LibTorch's (TOOLCHAIN.md), so the engine never links it. Supports the BPE model type used by
// Llama-family checkpoints, with byte fallback.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace tandem::tok {

using TokenId = std::int32_t;

enum class PieceType : std::uint8_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

class Tokenizer {
 public:
  // Reads and validates a SentencePiece ModelProto. Errors: io_error, parse_error (not a valid protobuf,
  // truncated), format_error (duplicate pieces, bad byte pieces, ids out of range), unsupported (not BPE).
  static Result<Tokenizer> load_file(const std::string& path);
  static Result<Tokenizer> from_bytes(std::string_view model_bytes, std::string origin);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Encodes like sentencepiece's EncodeAsIds (dummy prefix, whitespace → "▁", BPE by piece score, byte fallback
  // for characters not in the vocabulary), then optionally prepends BOS / appends EOS.
  std::vector<TokenId> encode(std::string_view text, bool add_bos = false, bool add_eos = false) const;

  // Decodes like sentencepiece's DecodeIds: control tokens (BOS/EOS/...) produce nothing, byte pieces are joined
  // into UTF-8 (invalid sequences become U+FFFD), "▁" becomes a space and the dummy-prefix space at the very
  // start is removed. Ids out of range are skipped.
  std::string decode(std::span<const TokenId> ids) const;

  // The bytes a token contributes in the middle of a text ("▁the" -> " the", "<0x0A>" -> "\n", control -> "").
  std::string token_bytes(TokenId id) const;

  const std::string& piece(TokenId id) const;  // raw piece text; id must be < vocab_size()
  PieceType type(TokenId id) const;
  float score(TokenId id) const;
  std::optional<TokenId> piece_to_id(std::string_view piece) const;

  int vocab_size() const;
  TokenId bos_id() const;  // -1 when the model has none
  TokenId eos_id() const;
  TokenId unk_id() const;
  TokenId pad_id() const;
  bool add_dummy_prefix() const;

  // The exact bytes the model was loaded from (for fingerprints).
  const std::string& model_bytes() const;

 private:
  friend class StreamDecoder;  // shares the decoding state machine (tokenizer.cc)
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streaming-safe detokenization: feed token ids one at a time, get back only complete UTF-8 text. A multi-byte
// character split across byte-fallback tokens is held back until it is complete; the concatenation of all
// push() results plus flush() equals Tokenizer::decode() of the whole sequence.
class StreamDecoder {
 public:
  // `at_text_start`: the first token begins the text, so the dummy-prefix space is dropped as decode() does. Pass
  // false when the tokens continue text shown earlier (a generation after its prompt) to keep that space.
  explicit StreamDecoder(const Tokenizer& tok, bool at_text_start = true);
  std::string push(TokenId id);
  std::string flush();  // emits any incomplete tail as U+FFFD
  void reset();

 private:
  const Tokenizer* tok_;
  std::string pending_;  // bytes of an incomplete UTF-8 sequence
  bool at_start_ = true;
};

}  // namespace tandem::tok
