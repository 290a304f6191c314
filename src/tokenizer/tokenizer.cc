// Native SentencePiece BPE tokenizer. Behaviour follows sentencepiece (the Debian 0.1.97 library it is
// cross-checked against, tests/tokenizer/test_vs_libsentencepiece.cc): Normalizer::Normalize for the identity
// rule, bpe::Model::Encode, SentencePieceProcessor::PopulateSentencePieceText (byte fallback, merging of unknown
// runs) and SentencePieceProcessor::Decode (byte runs → UTF-8 / U+FFFD, removal of the dummy-prefix space).
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "tokenizer/model_proto.h"
#include "tokenizer/sentencepiece_impl.h"

namespace tandem::tok {

// ---------------------------------------------------------------------------------------------------------------
// Normalization (sentencepiece Normalizer::Normalize without a precompiled charsmap).

void Tokenizer::Impl::normalize(std::string_view input, std::string& out) const {
  out.clear();
  if (input.empty()) return;

  // NormalizePrefix: a user-defined symbol as is, else one character; malformed UTF-8 → U+FFFD for one byte.
  auto next = [&](std::size_t i, std::size_t* consumed) -> std::string_view {
    const std::string_view rest = input.substr(i);
    if (!user_defined.empty()) {
      bool found = false;
      const std::size_t len = prefix_match(rest, &found);
      if (found) {
        *consumed = len;
        return rest.substr(0, len);
      }
    }
    const std::size_t len = valid_char_len(input, i);
    if (len == 0) {
      *consumed = 1;
      return kReplacementChar;
    }
    *consumed = len;
    return rest.substr(0, len);
  };

  const std::string_view ws = escape_whitespaces ? kSpaceSymbol : std::string_view(" ");
  std::size_t i = 0;
  const std::size_t n = input.size();
  if (remove_extra_whitespaces) {
    while (i < n) {
      std::size_t consumed = 0;
      if (next(i, &consumed) != " ") break;
      i += consumed;
    }
    if (i == n) return;
  }
  out.reserve((n - i) * 3 + 3);

  if (!ws_as_suffix && add_dummy_prefix) out.append(ws);

  bool is_prev_space = remove_extra_whitespaces;
  while (i < n) {
    const auto c = static_cast<unsigned char>(input[i]);
    if (c < 0x80 && user_defined.empty()) {  // fast path: one ASCII byte
      ++i;
      if (c == ' ') {
        if (is_prev_space) continue;
        if (escape_whitespaces) {
          out.append(kSpaceSymbol);
        } else {
          out.push_back(' ');
        }
        is_prev_space = remove_extra_whitespaces;
      } else {
        out.push_back(static_cast<char>(c));
        is_prev_space = false;
      }
      continue;
    }
    std::size_t consumed = 0;
    std::string_view sp = next(i, &consumed);
    while (is_prev_space && !sp.empty() && sp.front() == ' ') sp.remove_prefix(1);
    if (!sp.empty()) {
      for (char ch : sp) {
        if (escape_whitespaces && ch == ' ') {
          out.append(kSpaceSymbol);
        } else {
          out.push_back(ch);
        }
      }
      is_prev_space = sp.back() == ' ';
    }
    i += consumed;
    if (!remove_extra_whitespaces) is_prev_space = false;
  }

  if (remove_extra_whitespaces) {
    while (out.size() >= ws.size() && std::string_view(out).substr(out.size() - ws.size()) == ws) {
      out.resize(out.size() - ws.size());
    }
  }
  if (ws_as_suffix && add_dummy_prefix) out.append(ws);
}

// ---------------------------------------------------------------------------------------------------------------
// BPE (sentencepiece bpe::Model::Encode) + PopulateSentencePieceText's id emission.

void Tokenizer::Impl::encode_bpe(std::string_view normalized, Scratch& scratch, std::vector<TokenId>& ids) const {
  if (normalized.empty()) return;
  EmitState state;
  if (!segmentable) {
    bpe_segment(normalized, scratch, state, ids);
    return;
  }
  // Cut before each whitespace symbol that follows a different character; no merge can cross such a cut.
  const std::string_view ws = whitespace_symbol();
  std::size_t start = 0;
  std::size_t pos = normalized.find(ws, 1);
  while (pos != std::string_view::npos) {
    if (pos - start >= ws.size() ? normalized.compare(pos - ws.size(), ws.size(), ws) != 0 : pos > start) {
      bpe_segment(normalized.substr(start, pos - start), scratch, state, ids);
      start = pos;
    }
    pos = normalized.find(ws, pos + ws.size());
  }
  bpe_segment(normalized.substr(start), scratch, state, ids);
}

void Tokenizer::Impl::bpe_segment(std::string_view text, Scratch& scratch, EmitState& state,
                                  std::vector<TokenId>& ids) const {
  auto& symbols = scratch.symbols;
  auto& heap = scratch.heap;
  symbols.clear();
  heap.clear();

  // Split into characters / user-defined symbols.
  for (std::size_t pos = 0; pos < text.size();) {
    bool freeze = false;
    const std::size_t len = prefix_match(text.substr(pos), &freeze);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back(Symbol{index - 1, -1, static_cast<std::uint32_t>(pos), static_cast<std::uint32_t>(len), freeze});
    pos += len;
    if (pos < text.size()) symbols.back().next = index + 1;
  }

  // Resegmentation of merges that produced UNUSED pieces (only filled when the model has any).
  std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>> rev_merge;

  auto piece_of = [&](const Symbol& s) { return text.substr(s.begin, s.size); };

  auto maybe_add = [&](int left, int right) {
    if (left == -1 || right == -1) return;
    const Symbol& l = symbols[static_cast<std::size_t>(left)];
    const Symbol& r = symbols[static_cast<std::size_t>(right)];
    if (l.freeze || r.freeze) return;
    const std::string_view merged = text.substr(l.begin, l.size + r.size);
    const TokenId id = piece_ids.find(merged);
    if (id < 0 || !mergeable(types[static_cast<std::size_t>(id)])) return;
    heap.push_back(Pair{scores[static_cast<std::size_t>(id)], left, right, l.size + r.size});
    std::push_heap(heap.begin(), heap.end(), PairLess{});
    if (has_unused && types[static_cast<std::size_t>(id)] == PieceType::unused) {
      rev_merge[merged] = {piece_of(l), piece_of(r)};
    }
  };

  for (std::size_t i = 1; i < symbols.size(); ++i) maybe_add(static_cast<int>(i - 1), static_cast<int>(i));

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), PairLess{});
    const Pair top = heap.back();
    heap.pop_back();
    Symbol& l = symbols[static_cast<std::size_t>(top.left)];
    Symbol& r = symbols[static_cast<std::size_t>(top.right)];
    if (l.size == 0 || r.size == 0 || l.size + r.size != top.size) continue;  // stale
    l.size += r.size;
    l.next = r.next;
    if (r.next >= 0) symbols[static_cast<std::size_t>(r.next)].prev = top.left;
    r.size = 0;
    maybe_add(l.prev, top.left);
    maybe_add(top.left, l.next);
  }

  // PopulateSentencePieceText: control ids as is, unknown → byte pieces (byte_fallback) or one <unk> per run.
  auto emit = [&](std::string_view w) {
    const TokenId id = lookup(w);
    const PieceType t = types[static_cast<std::size_t>(id)];
    if (t == PieceType::control) {
      ids.push_back(id);
      state.prev_unk = false;
    } else if (t == PieceType::unknown) {
      if (byte_fallback) {
        for (char b : w) ids.push_back(byte_ids[static_cast<unsigned char>(b)]);
      } else if (!state.prev_unk) {
        ids.push_back(id);
      }
      state.prev_unk = true;
    } else {
      ids.push_back(id);
      state.prev_unk = false;
    }
  };

  auto resegment = [&](auto&& self, std::string_view w) -> void {
    if (has_unused) {
      const TokenId id = lookup(w);
      if (types[static_cast<std::size_t>(id)] == PieceType::unused) {
        const auto p = rev_merge.find(w);
        if (p != rev_merge.end()) {
          self(self, p->second.first);
          self(self, p->second.second);
          return;
        }
      }
    }
    emit(w);
  };

  for (int index = 0; index != -1; index = symbols[static_cast<std::size_t>(index)].next) {
    resegment(resegment, piece_of(symbols[static_cast<std::size_t>(index)]));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Decoding (sentencepiece SentencePieceProcessor::Decode), as a state machine shared with StreamDecoder.

// Turns accumulated byte-piece bytes into UTF-8: each valid character as is, each malformed byte as U+FFFD.
// Unless `final`, an incomplete character at the end stays in `pending` (more byte pieces may complete it).
void Tokenizer::Impl::drain_bytes(std::string& pending, bool final, std::string& out) {
  const auto* p = reinterpret_cast<const unsigned char*>(pending.data());
  const std::size_t n = pending.size();
  std::size_t off = 0;
  while (off < n) {
    const std::size_t need = utf8_need(p[off]);
    if (need == 0) {
      out.append(kReplacementChar);
      off += 1;
      continue;
    }
    const std::size_t have = n - off;
    if (have < need) {
      bool doomed = false;  // a non-trail byte already present: malformed whatever follows
      for (std::size_t k = 1; k < have; ++k) doomed = doomed || !is_trail(p[off + k]);
      if (!final && !doomed) break;
      out.append(kReplacementChar);
      off += 1;
      continue;
    }
    if (need == 1 || utf8_valid(p + off, need)) {
      out.append(pending, off, need);
      off += need;
    } else {
      out.append(kReplacementChar);
      off += 1;
    }
  }
  pending.erase(0, off);
}

void Tokenizer::Impl::decode_step(TokenId id, std::string& pending, bool& at_start, std::string& out) const {
  if (id < 0 || static_cast<std::size_t>(id) >= pieces.size()) return;  // out of range: skipped
  const auto uid = static_cast<std::size_t>(id);
  const std::size_t before = out.size();
  if (types[uid] == PieceType::byte) {
    pending.push_back(static_cast<char>(byte_value[uid]));
    drain_bytes(pending, false, out);
  } else {
    drain_bytes(pending, true, out);  // a non-byte piece ends the byte run
    if (out.size() != before) at_start = false;
    const std::size_t mid = out.size();
    switch (types[uid]) {
      case PieceType::control:
        break;
      case PieceType::unknown:
        out.append(unk_surface);
        break;
      default:
        if (at_start && starts_ws[uid] && (add_dummy_prefix || remove_extra_whitespaces)) {
          out.append(std::string_view(surface[uid]).substr(1));  // drop the dummy-prefix space
          if (!remove_extra_whitespaces) at_start = false;      // only one leading "▁" is consumed
        } else {
          out.append(surface[uid]);
        }
    }
    if (out.size() != mid) at_start = false;
  }
  if (out.size() != before) at_start = false;
}

// ---------------------------------------------------------------------------------------------------------------
// Loading.

Result<Tokenizer> Tokenizer::load_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return fail(Errc::io_error, "tokenizer model '" + path + "' is not a readable regular file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(Errc::io_error, "cannot open tokenizer model '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return fail(Errc::io_error, "cannot read tokenizer model '" + path + "'");
  return from_bytes(std::move(ss).str(), path);
}

Result<Tokenizer> Tokenizer::from_bytes(std::string_view model_bytes, std::string origin) {
  auto where = [&](const std::string& msg) { return origin + ": " + msg; };
  auto parsed = detail::parse_model_proto(model_bytes);
  if (!parsed) {
    Error e = std::move(parsed).error();
    return fail(e.code, where(e.message));
  }
  detail::ProtoModel& m = *parsed;

  if (m.pieces.empty()) return fail(Errc::format_error, where("model has no pieces"));
  if (m.trainer_spec.model_type != detail::kModelBpe) {
    static constexpr const char* kNames[] = {"?", "UNIGRAM", "BPE", "WORD", "CHAR"};
    const int t = m.trainer_spec.model_type;
    return fail(Errc::unsupported, where(std::string("model type ") + (t >= 1 && t <= 4 ? kNames[t] : "?") + " (" +
                                         std::to_string(t) + ") is not supported; only BPE"));
  }
  if (!m.normalizer_spec.precompiled_charsmap.empty()) {
    return fail(Errc::unsupported, where("normalizer '" + m.normalizer_spec.name +
                                         "' uses a precompiled charsmap; only the identity normalizer is supported"));
  }
  if (m.has_denormalizer && !m.denormalizer_spec.precompiled_charsmap.empty()) {
    return fail(Errc::unsupported, where("denormalizer charsmaps are not supported"));
  }
  if (m.pieces.size() > static_cast<std::size_t>(INT32_MAX)) return fail(Errc::format_error, where("too many pieces"));

  auto impl = std::make_unique<Impl>();
  Impl& t = *impl;
  const auto& ts = m.trainer_spec;
  const auto& ns = m.normalizer_spec;
  t.add_dummy_prefix = ns.add_dummy_prefix;
  t.remove_extra_whitespaces = ns.remove_extra_whitespaces;
  t.escape_whitespaces = ns.escape_whitespaces;
  t.ws_as_suffix = ts.treat_whitespace_as_suffix;
  t.byte_fallback = ts.byte_fallback;
  t.unk_surface = ts.unk_surface;

  const std::size_t n = m.pieces.size();
  t.pieces.reserve(n);
  t.scores.reserve(n);
  t.types.reserve(n);
  for (auto& p : m.pieces) {
    t.pieces.push_back(std::move(p.piece));
    t.scores.push_back(p.score);
    t.types.push_back(static_cast<PieceType>(p.type >= 1 && p.type <= 6 ? p.type : 1));
  }
  t.piece_ids.build(&t.pieces, t.pieces.size());
  t.byte_value.assign(n, -1);
  std::array<bool, 256> byte_found{};
  for (std::size_t i = 0; i < n; ++i) {
    const std::string& piece = t.pieces[i];
    const int raw_type = m.pieces[i].type;
    const std::string id_str = "piece " + std::to_string(i);
    if (piece.empty()) return fail(Errc::format_error, where(id_str + " is empty"));
    if (piece.size() >= kMaxPieceSize) return fail(Errc::format_error, where(id_str + " is too long"));
    if (piece.find('\0') != std::string::npos) {
      return fail(Errc::format_error, where(id_str + " contains a NUL character"));
    }
    if (raw_type < 1 || raw_type > 6) {
      return fail(Errc::format_error, where(id_str + " has unknown type " + std::to_string(raw_type)));
    }
    if (const TokenId prev = t.piece_ids.insert(static_cast<TokenId>(i)); prev >= 0) {
      return fail(Errc::format_error, where(id_str + " '" + piece + "' is already defined (id " +
                                            std::to_string(prev) + ")"));
    }
    switch (t.types[i]) {
      case PieceType::unknown:
        if (t.unk >= 0) return fail(Errc::format_error, where("more than one unknown piece (" + id_str + ")"));
        t.unk = static_cast<TokenId>(i);
        break;
      case PieceType::byte: {
        if (!t.byte_fallback) {
          return fail(Errc::format_error, where("byte " + id_str + " '" + piece + "' but byte_fallback is false"));
        }
        const int b = piece_to_byte(piece);
        if (b < 0) return fail(Errc::format_error, where("byte " + id_str + " '" + piece + "' is invalid"));
        byte_found[static_cast<std::size_t>(b)] = true;
        t.byte_value[i] = static_cast<std::int16_t>(b);
        t.byte_ids[static_cast<std::size_t>(b)] = static_cast<TokenId>(i);
        break;
      }
      case PieceType::user_defined:
        t.user_defined.insert(piece);
        break;
      case PieceType::unused:
        t.has_unused = true;
        break;
      default:
        break;
    }
  }
  if (t.unk < 0) return fail(Errc::format_error, where("no unknown piece (<unk>) defined"));
  if (t.byte_fallback && std::find(byte_found.begin(), byte_found.end(), false) != byte_found.end()) {
    return fail(Errc::format_error, where("byte_fallback is set but the 256 byte pieces are not all present"));
  }
  for (auto [name, v] : {std::pair{"unk_id", ts.unk_id}, std::pair{"bos_id", ts.bos_id},
                         std::pair{"eos_id", ts.eos_id}, std::pair{"pad_id", ts.pad_id}}) {
    if (v < -1 || v >= static_cast<std::int64_t>(n)) {
      return fail(Errc::format_error, where(std::string("trainer_spec.") + name + " = " + std::to_string(v) +
                                            " is out of range for " + std::to_string(n) + " pieces"));
    }
  }

  // Special ids as SentencePieceProcessor reports them: looked up by piece name, must be control pieces.
  auto special = [&](const std::string& name, const char* dflt) -> TokenId {
    const TokenId id = t.lookup(name.empty() ? std::string_view(dflt) : std::string_view(name));
    return t.types[static_cast<std::size_t>(id)] == PieceType::control ? id : -1;
  };
  t.bos = special(ts.bos_piece, "<s>");
  t.eos = special(ts.eos_piece, "</s>");
  t.pad = special(ts.pad_piece, "<pad>");

  for (std::string_view ud : t.user_defined) {
    t.ud_first[static_cast<unsigned char>(ud[0])] = true;
    if (std::find(t.ud_lengths.begin(), t.ud_lengths.end(), ud.size()) == t.ud_lengths.end()) {
      t.ud_lengths.push_back(ud.size());
    }
  }
  std::sort(t.ud_lengths.rbegin(), t.ud_lengths.rend());
  for (std::size_t i = 0; i < n; ++i) {
    if (t.types[i] == PieceType::control) t.controls.emplace_back(t.pieces[i], static_cast<TokenId>(i));
  }
  std::stable_sort(t.controls.begin(), t.controls.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });

  // Segmentation is exact iff no mergeable piece holds the whitespace symbol right after another character,
  // and no UNUSED piece exists (their resegmentation depends on the global merge order).
  {
    const std::string_view ws = t.whitespace_symbol();
    bool ok = !t.has_unused;
    for (std::size_t i = 0; ok && i < n; ++i) {
      if (!Impl::mergeable(t.types[i])) continue;
      const std::string_view p = t.pieces[i];
      for (std::size_t at = p.find(ws, 1); ok && at != std::string_view::npos; at = p.find(ws, at + 1)) {
        ok = at >= ws.size() && p.compare(at - ws.size(), ws.size(), ws) == 0;
      }
    }
    t.segmentable = ok;
  }

  t.surface.resize(n);
  t.starts_ws.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    switch (t.types[i]) {
      case PieceType::control:
        break;
      case PieceType::unknown:
        t.surface[i] = t.unk_surface;
        break;
      case PieceType::byte:
        t.surface[i] = std::string(1, static_cast<char>(t.byte_value[i]));
        break;
      default:
        t.surface[i] = replace_space_symbol(t.pieces[i]);
        t.starts_ws[i] = std::string_view(t.pieces[i]).substr(0, kSpaceSymbol.size()) == kSpaceSymbol;
    }
  }

  t.model_bytes.assign(model_bytes);
  t.origin = std::move(origin);
  return Tokenizer(std::move(impl));
}

}  // namespace tandem::tok
