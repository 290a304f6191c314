// The public Tokenizer API and StreamDecoder: dispatch between the SentencePiece kind (Impl, tokenizer.cc) and the
// BPE kind (detail::BpeModel, bpe_model.cc).
#include "tokenizer/bpe_model.h"
#include "tokenizer/sentencepiece_impl.h"
#include "tokenizer/tokenizer.h"

namespace tandem::tok {

// ---------------------------------------------------------------------------------------------------------------
// Public API.

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(std::unique_ptr<detail::BpeModel> bpe) : bpe_(std::move(bpe)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_bos, bool add_eos) const {
  return encode(text, EncodeOptions{add_bos, add_eos, false});
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, const EncodeOptions& opts) const {
  const TextPiece piece{text, false};
  return encode_pieces(std::span<const TextPiece>(&piece, 1), opts);
}

namespace {

// EncodeOptions::max_tokens: keep the first max - 1 ids and the EOS when one was added, else the first max.
void truncate(std::vector<TokenId>& ids, const EncodeOptions& opts, TokenId eos) {
  if (opts.max_tokens == 0 || ids.size() <= opts.max_tokens) return;
  const bool keep_eos = opts.add_eos && eos >= 0 && !ids.empty() && ids.back() == eos;
  ids.resize(opts.max_tokens - (keep_eos ? 1 : 0));
  if (keep_eos) ids.push_back(eos);
}

}  // namespace

std::vector<TokenId> Tokenizer::encode_pieces(std::span<const TextPiece> pieces, const EncodeOptions& opts) const {
  std::vector<TokenId> ids = encode_pieces_whole(pieces, opts);
  truncate(ids, opts, eos_id());
  return ids;
}

std::vector<TokenId> Tokenizer::encode_pieces_whole(std::span<const TextPiece> pieces,
                                                    const EncodeOptions& opts) const {
  std::vector<TokenId> ids;
  if (bpe_) {
    bpe_->encode(pieces, opts, ids);
    return ids;
  }
  thread_local Scratch scratch;
  if (opts.add_bos && impl_->bos >= 0) ids.push_back(impl_->bos);
  // Control pieces are recognised in trusted text only; the text between them is one run.
  std::string text;
  std::vector<std::pair<std::size_t, std::size_t>> specials;  // [begin, end) in `text`, with the id in ids order
  std::vector<TokenId> special_id;
  for (const TextPiece& p : pieces) {
    const std::size_t base = text.size();
    text.append(p.text);
    if (!(p.trusted || opts.parse_special) || impl_->controls.empty()) continue;
    for (std::size_t i = 0; i < p.text.size(); ++i) {
      for (const auto& [spelling, id] : impl_->controls) {
        if (p.text.compare(i, spelling.size(), spelling) == 0) {
          specials.emplace_back(base + i, base + i + spelling.size());
          special_id.push_back(id);
          i += spelling.size() - 1;
          break;
        }
      }
    }
  }
  auto run = [&](std::string_view t) {
    if (t.empty()) return;
    impl_->normalize(t, scratch.normalized);
    impl_->encode_bpe(scratch.normalized, scratch, ids);
  };
  std::size_t at = 0;
  for (std::size_t k = 0; k < specials.size(); ++k) {
    run(std::string_view(text).substr(at, specials[k].first - at));
    ids.push_back(special_id[k]);
    at = specials[k].second;
  }
  run(std::string_view(text).substr(at));
  if (opts.add_eos && impl_->eos >= 0) ids.push_back(impl_->eos);
  return ids;
}

std::string Tokenizer::decode(std::span<const TokenId> ids) const {
  StreamDecoder d(*this);
  std::string out;
  for (TokenId id : ids) out += d.push(id);
  out += d.flush();
  return out;
}

std::string Tokenizer::token_bytes(TokenId id) const {
  if (id < 0 || id >= vocab_size()) return {};
  if (bpe_) return bpe_->surface(id);
  return impl_->surface[static_cast<std::size_t>(id)];
}

const std::string& Tokenizer::piece(TokenId id) const {
  static const std::string kEmpty;
  if (id < 0 || id >= vocab_size()) return kEmpty;
  return bpe_ ? bpe_->tokens[static_cast<std::size_t>(id)] : impl_->pieces[static_cast<std::size_t>(id)];
}

PieceType Tokenizer::type(TokenId id) const {
  if (id < 0 || id >= vocab_size()) return PieceType::unused;
  return bpe_ ? bpe_->types[static_cast<std::size_t>(id)] : impl_->types[static_cast<std::size_t>(id)];
}

float Tokenizer::score(TokenId id) const {
  if (id < 0 || id >= vocab_size()) return 0.0F;
  if (bpe_) return -static_cast<float>(id);  // no scores: earlier tokens rank first, as llama.cpp reports them
  return impl_->scores[static_cast<std::size_t>(id)];
}

std::optional<TokenId> Tokenizer::piece_to_id(std::string_view piece) const {
  if (bpe_) return bpe_->find(piece);
  const TokenId id = impl_->piece_ids.find(piece);
  if (id < 0) return std::nullopt;
  return id;
}

int Tokenizer::vocab_size() const {
  return static_cast<int>(bpe_ ? bpe_->tokens.size() : impl_->pieces.size());
}
TokenId Tokenizer::bos_id() const { return bpe_ ? bpe_->bos : impl_->bos; }
TokenId Tokenizer::eos_id() const { return bpe_ ? bpe_->eos : impl_->eos; }
TokenId Tokenizer::unk_id() const { return bpe_ ? bpe_->unk : impl_->unk; }
TokenId Tokenizer::pad_id() const { return bpe_ ? bpe_->pad : impl_->pad; }
bool Tokenizer::add_dummy_prefix() const { return bpe_ ? false : impl_->add_dummy_prefix; }
const std::string& Tokenizer::model_bytes() const { return bpe_ ? bpe_->model_bytes : impl_->model_bytes; }
TokenizerKind Tokenizer::kind() const { return bpe_ ? TokenizerKind::bpe : TokenizerKind::sentencepiece; }
bool Tokenizer::adds_bos() const { return bpe_ ? bpe_->adds_bos : impl_->bos >= 0; }

const std::string& Tokenizer::pre_tokenizer_name() const {
  static const std::string kSentencePiece = "sentencepiece";
  return bpe_ ? bpe_->pre_name : kSentencePiece;
}

std::vector<TokenId> Tokenizer::special_ids() const {
  if (bpe_) return bpe_->special_ids();
  std::vector<TokenId> out;
  for (std::size_t i = 0; i < impl_->types.size(); ++i) {
    if (impl_->types[i] == PieceType::control) out.push_back(static_cast<TokenId>(i));
  }
  return out;
}

TokenId Tokenizer::eot_id() const {
  if (bpe_ && bpe_->eot >= 0) return bpe_->eot;
  for (std::string_view name : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|eot|>", "<end_of_turn>", "<|endoftext|>"}) {
    const auto id = piece_to_id(name);
    if (id && type(*id) == PieceType::control) return *id;
  }
  return eos_id();
}

// ---------------------------------------------------------------------------------------------------------------

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool at_text_start) : tok_(&tok), at_start_(at_text_start) {}
// bpe kind: at_start_ means "the decoder's leading Strip still applies"; it is armed on the first push.

std::string StreamDecoder::push(TokenId id) {
  std::string out;
  if (const detail::BpeModel* b = tok_->bpe_.get()) {
    if (at_start_) {
      strip_left_ = b->strip_count();
      at_start_ = false;
    }
    b->decode_bytes(id, pending_, &space_owed_);
    detail::drain_utf8_lossy(pending_, false, out);
    b->strip_start(out, &strip_left_);
    return out;
  }
  tok_->impl_->decode_step(id, pending_, at_start_, out);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  if (const detail::BpeModel* b = tok_->bpe_.get()) {
    space_owed_ = false;  // the space after the text's last word (BPEDecoder) is dropped
    detail::drain_utf8_lossy(pending_, true, out);
    if (at_start_) {
      strip_left_ = b->strip_count();
      at_start_ = false;
    }
    b->strip_start(out, &strip_left_);
    return out;
  }
  Tokenizer::Impl::drain_bytes(pending_, true, out);
  if (!out.empty()) at_start_ = false;
  return out;
}

void StreamDecoder::reset() {
  pending_.clear();
  at_start_ = true;
  strip_left_ = 0;
  space_owed_ = false;
}

}  // namespace tandem::tok
