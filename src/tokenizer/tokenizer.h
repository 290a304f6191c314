// The tokenizer: two kinds behind one interface (docs/tokenizers.md).
// - sentencepiece: SentencePiece tokenizer.model, implemented natively: Debian's libsentencepiece bundles a
//   protobuf that clashes with LibTorch's (TOOLCHAIN.md), so the engine never links it. Supports the BPE model type
//   used by Llama-family checkpoints, with byte fallback.
// - bpe: Hugging Face tokenizer.json (model BPE: GPT-2-style byte-level BPE as Llama 3 / Qwen2 / SmolLM / DeepSeek
//   ship it, and the SentencePiece-as-BPE style of Llama 2 / Mistral / Phi-3), or a GGUF "gpt2" vocabulary
//   (BpeVocab). Regexes and normalization through ICU.
// Special tokens are safe by default: text that spells a control token ("<s>", "<|eot_id|>") is encoded as text;
// only EncodeOptions::parse_special or trusted TextPieces (chat-template text) turn such spellings into their ids.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "tokenizer/bpe_vocab.h"
#include "tokenizer/piece_type.h"

namespace tandem::tok {

namespace detail {
class BpeModel;
}

enum class TokenizerKind : std::uint8_t { sentencepiece, bpe };

struct EncodeOptions {
  bool add_bos = false;
  bool add_eos = false;
  // Recognise spellings of special (control) tokens in the text as those tokens. Off: they are plain text.
  bool parse_special = false;
  // 0: no limit. Else at most this many ids: the text's tokens are cut so that BOS (when added) stays first and
  // EOS (when added) stays last, as Hugging Face's truncation=True with max_length does (CLIP: 77).
  std::size_t max_tokens = 0;
};

// How Tokenizer::from_vocab_merges reads a vocab.json + merges.txt pair.
enum class VocabMergesFlavor : std::uint8_t {
  detect,  // CLIP when vocab.json holds word-final "</w>" tokens; otherwise unsupported
  clip,    // the CLIP layout (openai/clip-vit-*): see docs/tokenizers.md, "CLIP"
};
struct VocabMergesOptions {
  VocabMergesFlavor flavor = VocabMergesFlavor::detect;
  std::string vocab_origin = "vocab.json";    // names vocab.json in errors (a path)
  std::string merges_origin = "merges.txt";   // names merges.txt in errors
};

// A part of a text for encode_pieces(): `trusted` text (a chat template's own text) may contain special tokens;
// untrusted text (message content) never produces one.
struct TextPiece {
  std::string_view text;
  bool trusted = false;
};

class Tokenizer {
 public:
  // Reads and validates a SentencePiece ModelProto. Errors: io_error, parse_error (not a valid protobuf,
  // truncated), format_error (duplicate pieces, bad byte pieces, ids out of range), unsupported (not BPE).
  static Result<Tokenizer> load_file(const std::string& path);
  static Result<Tokenizer> from_bytes(std::string_view model_bytes, std::string origin);
  // A Hugging Face tokenizer.json with model "BPE", including CLIP's (end_of_word_suffix, Lowercase, BPEDecoder,
  // RobertaProcessing) (docs/tokenizers.md lists the normalizers, pre-tokenizers,
  // decoders and post-processors read). Errors: parse_error (not JSON, a regex that does not compile), format_error
  // (a missing or mistyped key, ids out of range, duplicate tokens, merges naming unknown tokens, invalid UTF-8),
  // unsupported (WordPiece / Unigram / WordLevel models, an unknown normalizer / pre-tokenizer / decoder type),
  // each naming `origin` and the key.
  static Result<Tokenizer> from_hf_json(std::string_view tokenizer_json, std::string origin);
  // A GGUF "gpt2" vocabulary (weights/gguf_tokenizer.h reads one). unsupported for an unknown pre name,
  // format_error for inconsistent data. model_bytes() is then hf_json_from_bpe_vocab(v).
  static Result<Tokenizer> from_bpe_vocab(const BpeVocab& v, std::string origin);
  // A CLIP tokenizer from its slow-tokenizer files (clip_tokenizer.cc): vocab.json ({"token": id}, ids dense from 0,
  // "<|startoftext|>" and "<|endoftext|>" present) and merges.txt ("a b" per line, an optional "#version" first
  // line). Encodes as the equivalent tokenizer.json (tok::clip_hf_json): NFC, whitespace runs → " ", lowercase; the
  // CLIP regex; byte-level; BPE with "</w>" word ends; BOS <|startoftext|> / EOS <|endoftext|> (adds_bos and
  // adds_eos); decode puts a space between words. Errors: parse_error (vocab.json not JSON / not UTF-8),
  // format_error naming the file and key or line (not an object of integers, ids duplicated or not dense, a malformed
  // merge line, a merge naming an unknown token or whose result is not in the vocabulary, a missing special token),
  // unsupported (no "</w>" tokens with flavor detect). model_bytes() is the equivalent tokenizer.json.
  static Result<Tokenizer> from_vocab_merges(std::string_view vocab_json, std::string_view merges_txt,
                                             const VocabMergesOptions& options = {});

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Encodes like sentencepiece's EncodeAsIds (dummy prefix, whitespace → "▁", BPE by piece score, byte fallback
  // for characters not in the vocabulary), then optionally prepends BOS / appends EOS.
  // The bpe kind: Hugging Face's encode of the text (added tokens, normalizer, pre-tokenizer, BPE), BOS / EOS
  // when asked and the tokenizer has them. Special-token spellings are text for both kinds.
  std::vector<TokenId> encode(std::string_view text, bool add_bos = false, bool add_eos = false) const;
  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& opts) const;
  // The pieces' text concatenated and encoded as one text, except that a special token is recognised only where
  // its whole spelling lies in trusted pieces (anywhere with opts.parse_special); the text between recognised
  // specials is encoded as one run across piece boundaries. Non-special added tokens (bpe kind) and SentencePiece
  // user-defined pieces are matched everywhere, as Hugging Face and sentencepiece do.
  std::vector<TokenId> encode_pieces(std::span<const TextPiece> pieces, const EncodeOptions& opts = {}) const;

  // Decodes like sentencepiece's DecodeIds: control tokens (BOS/EOS/...) produce nothing, byte pieces are joined
  // into UTF-8 (invalid sequences become U+FFFD), "▁" becomes a space and the dummy-prefix space at the very
  // start is removed. Ids out of range are skipped.
  // The bpe kind: Hugging Face's decoder chain (ByteLevel bytes, ByteFallback, Replace, Strip, Metaspace); special
  // tokens produce nothing, non-special added tokens their content; invalid UTF-8 becomes U+FFFD per maximal
  // subpart.
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

  TokenizerKind kind() const;
  // Whether the tokenizer's own configuration adds BOS (tokenizer.json TemplateProcessing, GGUF add_bos_token;
  // sentencepiece: it has a BOS piece). A model's tokenizer_config.json add_bos_token takes precedence.
  bool adds_bos() const;
  // The end-of-turn token: GGUF tokenizer.ggml.eot_token_id when set; else the first special token present of
  // "<|eot_id|>", "<|im_end|>", "<|end|>", "<|eot|>", "<end_of_turn>", "<|endoftext|>"; else eos_id(); -1 none.
  TokenId eot_id() const;
  // Every control / special token id, ascending (BOS, EOS, <|im_start|>, ...).
  std::vector<TokenId> special_ids() const;
  // For fingerprints: the GGUF pre name ("llama-bpe", ...), or a canonical JSON description of tokenizer.json's
  // normalizer + pre-tokenizer; "sentencepiece" for the sentencepiece kind.
  const std::string& pre_tokenizer_name() const;

  // The exact bytes the model was loaded from (for fingerprints): tokenizer.model, tokenizer.json, or for a GGUF
  // BPE vocabulary its canonical tokenizer.json (hf_json_from_bpe_vocab).
  const std::string& model_bytes() const;

 private:
  friend class StreamDecoder;  // shares the decoding state machine (tokenizer.cc)
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  explicit Tokenizer(std::unique_ptr<detail::BpeModel> bpe);
  std::vector<TokenId> encode_pieces_whole(std::span<const TextPiece> pieces, const EncodeOptions& opts) const;
  std::unique_ptr<Impl> impl_;              // sentencepiece kind
  std::unique_ptr<detail::BpeModel> bpe_;   // bpe kind
};

// The tokenizer files of a directory (tokenizer_files.cc): tokenizer.json if present (as Hugging Face's
// AutoTokenizer prefers the fast tokenizer), else vocab.json + merges.txt (CLIP's slow-tokenizer files,
// Tokenizer::from_vocab_merges), else tokenizer.model (SentencePiece). not_found naming the directory when none is
// there; else io_error reading and the loader's errors, naming the file.
Result<Tokenizer> load_tokenizer_files(const std::string& dir);
// The same without the tokenizer.model step: not_found when there is neither tokenizer.json nor vocab.json +
// merges.txt (tok::load_model_tokenizer then reads tokenizer.model through the ModelDir).
Result<Tokenizer> load_hf_tokenizer_files(const std::string& dir);

// Streaming-safe detokenization: feed token ids one at a time, get back only complete UTF-8 text. A multi-byte
// character split across byte-fallback / byte-level tokens is held back until it is complete; the concatenation
// of all push() results plus flush() equals Tokenizer::decode() of the whole sequence (both kinds).
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
  int strip_left_ = 0;   // bpe: decoder Strip characters still to drop at the text start
  bool space_owed_ = false;  // bpe with a BPEDecoder suffix: the space after the last word, written before the next
};

}  // namespace tandem::tok
