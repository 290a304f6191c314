// Hugging Face BPE encoding and decoding (bpe_model.h): added-token extraction, normalizers, pre-tokenizers, the
// BPE merge loop (tokenizers/src/models/bpe/word.rs: lowest rank first, leftmost on ties), and the decoder chain
// reduced to per-token bytes so that streaming and whole decoding agree.
#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <cstring>
#include <queue>

#include "tokenizer/tokenizer.h"

namespace tandem::tok::detail {
namespace {

constexpr std::size_t kMaxTokens = 4u << 20;
constexpr std::size_t kMaxTokenBytes = 4096;

std::string replace_all(std::string_view s, std::string_view pat, std::string_view with) {
  if (pat.empty()) return std::string(s);
  std::string out;
  out.reserve(s.size());
  std::size_t at = 0;
  for (std::size_t hit = s.find(pat); hit != std::string_view::npos; hit = s.find(pat, at)) {
    out.append(s.substr(at, hit - at));
    out.append(with);
    at = hit + pat.size();
  }
  out.append(s.substr(at));
  return out;
}

int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(t[3]);
  const int lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// Segments of `text` given the match ranges: (begin, end, is_match), covering the text in order.
struct Seg {
  std::size_t b, e;
  bool match;
};

void apply_behavior(std::string_view text, const std::vector<std::pair<std::size_t, std::size_t>>& matches,
                    bool invert, SplitBehavior behavior, std::vector<std::string>& out) {
  std::vector<Seg> segs;
  std::size_t at = 0;
  for (auto [b, e] : matches) {
    if (b > at) segs.push_back({at, b, false});
    segs.push_back({b, e, true});
    at = e;
  }
  if (at < text.size()) segs.push_back({at, text.size(), false});
  if (invert) {
    for (auto& s : segs) s.match = !s.match;
  }
  std::vector<Seg> res;
  switch (behavior) {
    case SplitBehavior::isolated:
      res = segs;
      break;
    case SplitBehavior::removed:
      for (const auto& s : segs) {
        if (!s.match) res.push_back(s);
      }
      break;
    case SplitBehavior::merged_with_previous: {
      bool prev_match = false;
      for (const auto& s : segs) {
        if (s.match && !prev_match && !res.empty()) {
          res.back().e = s.e;
        } else {
          res.push_back(s);
        }
        prev_match = s.match;
      }
      break;
    }
    case SplitBehavior::merged_with_next: {
      bool prev_match = false;
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->match && !prev_match && !res.empty()) {
          res.back().b = it->b;
        } else {
          res.push_back(*it);
        }
        prev_match = it->match;
      }
      std::reverse(res.begin(), res.end());
      break;
    }
    case SplitBehavior::contiguous: {
      bool prev_match = false;
      for (const auto& s : segs) {
        if (s.match && prev_match && !res.empty()) {
          res.back().e = s.e;
        } else {
          res.push_back(s);
        }
        prev_match = s.match;
      }
      break;
    }
  }
  for (const auto& s : res) {
    if (s.e > s.b) out.emplace_back(text.substr(s.b, s.e - s.b));
  }
}

void find_string(std::string_view text, std::string_view pat, std::vector<std::pair<std::size_t, std::size_t>>& out) {
  if (pat.empty()) return;
  for (std::size_t hit = text.find(pat); hit != std::string_view::npos; hit = text.find(pat, hit + pat.size())) {
    out.emplace_back(hit, hit + pat.size());
  }
}

// Start of the character before position i (i > 0) in valid UTF-8.
std::size_t prev_char(std::string_view s, std::size_t i) {
  std::size_t j = i - 1;
  while (j > 0 && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;
  return j;
}

}  // namespace

void PairTable::build(std::size_t n) {
  std::size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  slots_.assign(cap, Slot{kEmpty, 0});
  mask_ = cap - 1;
}

void PairTable::insert_first(std::uint64_t key, std::uint64_t value) {
  for (std::size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == key) return;
    if (s.key == kEmpty) {
      s = Slot{key, value};
      return;
    }
  }
}

// --- tables ---------------------------------------------------------------------------------------------------------

Status BpeModel::finish() {
  auto err = [&](const std::string& m) { return fail(Errc::format_error, origin + ": " + m); };
  const std::size_t n = tokens.size();
  if (n == 0) return err("the vocabulary is empty");
  if (n > kMaxTokens) return err("the vocabulary has " + std::to_string(n) + " tokens, more than the limit");
  if (types.size() != n) types.resize(n, PieceType::normal);
  ids_.build(&tokens, n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::string& t = tokens[i];
    if (t.empty()) return err("token " + std::to_string(i) + " is empty (ids must be dense)");
    if (t.size() > kMaxTokenBytes) return err("token " + std::to_string(i) + " is longer than the limit");
    if (!utf8_valid(t)) return err("token " + std::to_string(i) + " is not valid UTF-8");
    if (const TokenId prev = ids_.insert(static_cast<TokenId>(i)); prev >= 0) {
      return err("token " + std::to_string(i) + " '" + t + "' duplicates token " + std::to_string(prev));
    }
  }
  for (auto [name, v] : {std::pair{"unk", unk}, std::pair{"bos", bos}, std::pair{"eos", eos}, std::pair{"eot", eot},
                         std::pair{"pad", pad}}) {
    if (v < -1 || v >= static_cast<TokenId>(n)) {
      return err(std::string(name) + " id " + std::to_string(v) + " is out of range for " + std::to_string(n) +
                 " tokens");
    }
  }
  merge_map_.build(merge_text.size());
  std::string joined;
  for (std::size_t r = 0; r < merge_text.size(); ++r) {
    const auto& [ta, tb] = merge_text[r];
    const TokenId ia = ids_.find(ta);
    const TokenId ib = ids_.find(tb);
    if (ia < 0 || ib < 0) {
      return err("merge " + std::to_string(r) + " '" + ta + " " + tb + "' names a token that is not in the vocabulary");
    }
    joined.assign(ta);
    joined += tb;
    const TokenId res = ids_.find(joined);
    if (res < 0) {
      return err("merge " + std::to_string(r) + " '" + ta + " " + tb + "': '" + joined + "' is not in the vocabulary");
    }
    const std::uint64_t key = (static_cast<std::uint64_t>(ia) << 32) | static_cast<std::uint32_t>(ib);
    merge_map_.insert_first(key, (static_cast<std::uint64_t>(r) << 32) | static_cast<std::uint32_t>(res));
  }
  byte_tokens_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    static constexpr char kHex[] = "0123456789ABCDEF";
    const std::string name = std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
    if (const TokenId id = ids_.find(name); id >= 0) byte_tokens_[static_cast<std::size_t>(b)] = id;
  }
  for (auto& v : added_by_first_) v.clear();
  for (std::size_t k = 0; k < added.size(); ++k) {
    const AddedToken& a = added[k];
    if (a.id < 0 || static_cast<std::size_t>(a.id) >= n) return err("added token id out of range");
    if (a.content.empty()) return err("added token " + std::to_string(a.id) + " has empty content");
    added_by_first_[static_cast<unsigned char>(a.content[0])].push_back(static_cast<std::uint32_t>(k));
  }
  for (auto& v : added_by_first_) {
    std::stable_sort(v.begin(), v.end(),
                     [&](std::uint32_t x, std::uint32_t y) { return added[x].content.size() > added[y].content.size(); });
  }
  is_special_.assign(n, 0);
  for (std::size_t i = 0; i < n; ++i) is_special_[i] = types[i] == PieceType::control ? 1 : 0;

  // Decoder: per-token bytes, and the Strip that follows a Fuse (applied to the text start).
  strip_count_ = 0;
  strip_content_.clear();
  bool fused = false;
  for (const auto& d : decoders) {
    if (d.kind == DecodeStep::Kind::fuse) fused = true;
    if (d.kind == DecodeStep::Kind::strip && fused) {
      strip_count_ += d.count;
      strip_content_ = d.a;
    }
  }
  surface_.assign(n, std::string());
  word_final_.assign(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    if (is_special_[i]) continue;
    std::string s = tokens[i];
    if (types[i] == PieceType::user_defined) {  // added tokens decode to their content, as llama.cpp and HF do
      surface_[i] = std::move(s);
      continue;
    }
    // BPEDecoder: the word-final suffix becomes the space between words (owed until a next word follows).
    const bool word_final = !decode_suffix.empty() && s.size() >= decode_suffix.size() &&
                            s.compare(s.size() - decode_suffix.size(), decode_suffix.size(), decode_suffix) == 0;
    if (word_final) s.resize(s.size() - decode_suffix.size());
    bool step_fused = false;
    for (const auto& d : decoders) {
      switch (d.kind) {
        case DecodeStep::Kind::byte_level:
          s = alphabet_to_bytes(s);
          break;
        case DecodeStep::Kind::byte_fallback:
          if (const int b = parse_byte_token(s); b >= 0) s.assign(1, static_cast<char>(b));
          break;
        case DecodeStep::Kind::replace:
          s = replace_all(s, d.a, d.b);
          break;
        case DecodeStep::Kind::fuse:
          step_fused = true;
          break;
        case DecodeStep::Kind::strip:
          if (!step_fused) {
            for (int k = 0; k < d.count && s.compare(0, d.a.size(), d.a) == 0 && !d.a.empty(); ++k) {
              s.erase(0, d.a.size());
            }
          }
          break;
      }
    }
    if (word_final) {
      s += ' ';
      word_final_[i] = 1;
    }
    surface_[i] = std::move(s);
  }
  return {};
}

std::optional<TokenId> BpeModel::find(std::string_view spelling) const {
  const TokenId id = ids_.find(spelling);
  if (id < 0) return std::nullopt;
  return id;
}

std::vector<TokenId> BpeModel::special_ids() const {
  std::vector<TokenId> out;
  for (std::size_t i = 0; i < is_special_.size(); ++i) {
    if (is_special_[i]) out.push_back(static_cast<TokenId>(i));
  }
  return out;
}

// --- encoding -------------------------------------------------------------------------------------------------------

void BpeModel::encode(std::span<const TextPiece> pieces, const EncodeOptions& opts, std::vector<TokenId>& out) const {
  std::string text;
  std::vector<std::uint8_t> trusted;
  bool any_trusted = opts.parse_special;
  for (const TextPiece& p : pieces) {
    const std::string clean = utf8_sanitize(p.text);
    text += clean;
    trusted.insert(trusted.end(), clean.size(), p.trusted || opts.parse_special ? 1 : 0);
    any_trusted = any_trusted || p.trusted;
  }
  if (opts.add_bos && bos >= 0) {
    out.push_back(bos);
    out.insert(out.end(), bos_extra.begin(), bos_extra.end());
  }

  auto is_ws_before = [&](std::size_t i, std::size_t lo) -> std::size_t {  // start of whitespace run ending at i
    while (i > lo) {
      const std::size_t j = prev_char(text, i);
      std::size_t len = 0;
      if (!is_whitespace_cp(utf8_decode(text, j, &len))) break;
      i = j;
    }
    return i;
  };
  auto ws_after = [&](std::size_t i) -> std::size_t {
    while (i < text.size()) {
      std::size_t len = 0;
      if (!is_whitespace_cp(utf8_decode(text, i, &len))) break;
      i += len;
    }
    return i;
  };

  std::size_t seg_start = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    const auto& cands = added_by_first_[static_cast<unsigned char>(text[i])];
    const AddedToken* hit = nullptr;
    for (std::uint32_t k : cands) {
      const AddedToken& a = added[k];
      if (text.compare(i, a.content.size(), a.content) != 0) continue;
      if (types[static_cast<std::size_t>(a.id)] == PieceType::control) {
        if (!any_trusted) continue;
        bool ok = true;
        for (std::size_t j = i; ok && j < i + a.content.size(); ++j) ok = trusted[j] != 0;
        if (!ok) continue;
      }
      if (a.single_word) {
        std::size_t len = 0;
        if (i > 0 && is_alnum_cp(utf8_decode(text, prev_char(text, i), &len))) continue;
        const std::size_t e = i + a.content.size();
        if (e < text.size() && is_alnum_cp(utf8_decode(text, e, &len))) continue;
      }
      hit = &a;
      break;
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    std::size_t b = i;
    std::size_t e = i + hit->content.size();
    if (hit->lstrip) b = is_ws_before(b, seg_start);
    if (hit->rstrip) e = ws_after(e);
    if (b > seg_start) encode_text(std::string_view(text).substr(seg_start, b - seg_start), seg_start == 0, out);
    out.push_back(hit->id);
    seg_start = e;
    i = e;
  }
  if (seg_start < text.size()) encode_text(std::string_view(text).substr(seg_start), seg_start == 0, out);
  if (opts.add_eos && eos >= 0) out.push_back(eos);
}

void BpeModel::encode_text(std::string_view segment, bool first_segment, std::vector<TokenId>& out) const {
  std::string s(segment);
  for (const NormStep& n : normalizers) {
    switch (n.kind) {
      case NormStep::Kind::unicode:
        s = normalize(s, n.form);
        break;
      case NormStep::Kind::prepend:
        if (!s.empty()) s.insert(0, n.a);
        break;
      case NormStep::Kind::lowercase:
        s = to_lower(s);
        break;
      case NormStep::Kind::replace_string:
        s = replace_all(s, n.a, n.b);
        break;
      case NormStep::Kind::replace_regex: {
        std::vector<std::pair<std::size_t, std::size_t>> m;
        n.regex->find_all(s, m);
        if (m.empty()) break;
        std::string r;
        std::size_t at = 0;
        for (auto [b, e] : m) {
          r.append(s, at, b - at);
          r.append(n.b);
          at = e;
        }
        r.append(s, at, std::string::npos);
        s = std::move(r);
        break;
      }
    }
  }
  thread_local std::vector<std::string> pieces;
  std::vector<std::string> local;
  local.swap(pieces);  // re-entrancy safe: the thread-local buffer is only borrowed
  local.clear();
  pre_tokenize(std::move(s), first_segment, local);
  for (const std::string& w : local) bpe_word(w, out);
  local.swap(pieces);
}

void BpeModel::pre_tokenize(std::string text, bool first_segment, std::vector<std::string>& pieces) const {
  pieces.clear();
  if (text.empty()) return;
  pieces.push_back(std::move(text));
  std::vector<std::string> next;
  std::vector<std::pair<std::size_t, std::size_t>> m;
  for (const PreStep& st : pre_steps) {
    next.clear();
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      std::string& p = pieces[k];
      m.clear();
      switch (st.kind) {
        case PreStep::Kind::byte_level: {
          if (st.add_prefix_space && p[0] != ' ') p.insert(0, " ");
          if (st.use_regex) {
            st.regex->find_all(p, m);
            std::vector<std::string> parts;
            apply_behavior(p, m, false, SplitBehavior::isolated, parts);
            for (auto& q : parts) next.push_back(bytes_to_alphabet(q));
          } else {
            next.push_back(bytes_to_alphabet(p));
          }
          break;
        }
        case PreStep::Kind::split:
          if (st.regex) {
            st.regex->find_all(p, m);
          } else {
            find_string(p, st.pattern, m);
          }
          apply_behavior(p, m, st.invert, st.behavior, next);
          break;
        case PreStep::Kind::digits: {
          for (std::size_t i = 0; i < p.size();) {
            std::size_t len = 0;
            if (!is_numeric_cp(utf8_decode(p, i, &len))) {
              i += len;
              continue;
            }
            std::size_t e = i + len;
            if (!st.individual_digits) {
              while (e < p.size()) {
                std::size_t l2 = 0;
                if (!is_numeric_cp(utf8_decode(p, e, &l2))) break;
                e += l2;
              }
            }
            m.emplace_back(i, e);
            i = e;
          }
          apply_behavior(p, m, false, SplitBehavior::isolated, next);
          break;
        }
        case PreStep::Kind::metaspace: {
          std::string q = replace_all(p, " ", st.replacement);
          const bool starts = q.compare(0, st.replacement.size(), st.replacement) == 0;
          const bool prepend = st.prepend == PreStep::Prepend::always ||
                               (st.prepend == PreStep::Prepend::first && first_segment && k == 0);
          if (prepend && !starts) q.insert(0, st.replacement);
          if (st.split_on_replacement) {
            find_string(q, st.replacement, m);
            apply_behavior(q, m, false, SplitBehavior::merged_with_next, next);
          } else {
            next.push_back(std::move(q));
          }
          break;
        }
      }
    }
    pieces.swap(next);
    if (pieces.empty()) return;
  }
}

void BpeModel::bpe_word(std::string_view word, std::vector<TokenId>& out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    if (const TokenId id = ids_.find(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  struct Sym {
    TokenId id;
    int prev, next;
  };
  thread_local std::vector<Sym> syms;
  syms.clear();
  thread_local std::string last;
  for (std::size_t i = 0; i < word.size();) {
    std::size_t len = utf8_char_len(word, i);
    if (len == 0) len = 1;
    std::string_view ch = word.substr(i, len);
    i += len;
    if (i >= word.size() && !end_of_word_suffix.empty()) {  // the word's last character carries the suffix
      last.assign(ch);
      last += end_of_word_suffix;
      ch = last;
    }
    if (const TokenId id = ids_.find(ch); id >= 0) {
      syms.push_back({id, 0, 0});
      continue;
    }
    if (byte_fallback) {
      bool all = true;
      for (char c : ch) all = all && byte_tokens_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : ch) syms.push_back({byte_tokens_[static_cast<unsigned char>(c)], 0, 0});
        continue;
      }
    }
    if (unk >= 0) {
      if (fuse_unk && !syms.empty() && syms.back().id == unk) continue;
      syms.push_back({unk, 0, 0});
    }
  }
  const int n = static_cast<int>(syms.size());
  for (int k = 0; k < n; ++k) {
    syms[static_cast<std::size_t>(k)].prev = k - 1;
    syms[static_cast<std::size_t>(k)].next = k + 1 < n ? k + 1 : -1;
  }
  struct Cand {
    std::uint32_t rank;
    int pos;
    TokenId left, right, result;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<Cand> heap;
  heap.clear();
  auto consider = [&](int pos) {
    if (pos < 0) return;
    const Sym& l = syms[static_cast<std::size_t>(pos)];
    if (l.next < 0) return;
    const Sym& r = syms[static_cast<std::size_t>(l.next)];
    const std::uint64_t key = (static_cast<std::uint64_t>(l.id) << 32) | static_cast<std::uint32_t>(r.id);
    const std::uint64_t* v = merge_map_.find(key);
    if (v == nullptr) return;
    heap.push_back({static_cast<std::uint32_t>(*v >> 32), pos, l.id, r.id, static_cast<TokenId>(*v & 0xFFFFFFFFu)});
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (int k = 0; k + 1 < n; ++k) consider(k);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const Cand c = heap.back();
    heap.pop_back();
    Sym& l = syms[static_cast<std::size_t>(c.pos)];
    if (l.id != c.left || l.next < 0) continue;  // stale
    Sym& r = syms[static_cast<std::size_t>(l.next)];
    if (r.id != c.right) continue;
    l.id = c.result;
    r.id = -2;  // dead
    l.next = r.next;
    if (r.next >= 0) syms[static_cast<std::size_t>(r.next)].prev = c.pos;
    consider(l.prev);
    consider(c.pos);
  }
  for (int k = n > 0 ? 0 : -1; k >= 0; k = syms[static_cast<std::size_t>(k)].next) {
    out.push_back(syms[static_cast<std::size_t>(k)].id);
  }
}

// --- decoding -------------------------------------------------------------------------------------------------------

void BpeModel::decode_bytes(TokenId id, std::string& pending, bool* space_owed) const {
  if (id < 0 || static_cast<std::size_t>(id) >= surface_.size()) return;
  const auto u = static_cast<std::size_t>(id);
  const std::string& s = surface_[u];
  if (s.empty()) return;
  if (*space_owed) pending += ' ';
  *space_owed = word_final_[u] != 0;
  pending.append(s, 0, s.size() - (*space_owed ? 1 : 0));
}

void BpeModel::strip_start(std::string& text, int* strip_left) const {
  while (*strip_left > 0 && !strip_content_.empty() && text.compare(0, strip_content_.size(), strip_content_) == 0) {
    text.erase(0, strip_content_.size());
    --*strip_left;
  }
  if (!text.empty()) *strip_left = 0;
}

}  // namespace tandem::tok::detail
