// The SentencePiece kind of Tokenizer: its data (Tokenizer::Impl) and the helpers it uses, shared by
// tokenizer.cc (normalization, BPE, decoding, loading) and tokenizer_api.cc (the public API). Internal to the
// tokenizer library.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tokenizer/token_index.h"
#include "tokenizer/tokenizer.h"

namespace tandem::tok {

namespace spm {

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK
constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD
constexpr std::size_t kMaxPieceSize = 8000;                    // as sentencepiece's ModelInterface

// sentencepiece's string_util::OneCharLen: length of a UTF-8 sequence from its lead byte, 1 for anything else.
inline std::size_t one_char_len(unsigned char b) {
  static constexpr unsigned char kTable[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kTable[b >> 4];
}

inline bool is_trail(unsigned char b) { return (b & 0xC0) == 0x80; }

// Expected sequence length by lead byte, as sentencepiece's DecodeUTF8 branches; 0 = never valid.
inline std::size_t utf8_need(unsigned char b) {
  if (b < 0x80) return 1;
  if ((b & 0xE0) == 0xC0) return 2;
  if ((b & 0xF0) == 0xE0) return 3;
  if ((b & 0xF8) == 0xF0) return 4;
  return 0;
}

// Whether p[0..need) (need = utf8_need(p[0]) >= 2, all present) is a valid character: trail bytes, no overlong
// form, no surrogate, <= U+10FFFF. Same acceptance as sentencepiece's IsValidDecodeUTF8.
inline bool utf8_valid(const unsigned char* p, std::size_t need) {
  for (std::size_t i = 1; i < need; ++i) {
    if (!is_trail(p[i])) return false;
  }
  std::uint32_t cp = 0;
  switch (need) {
    case 2:
      cp = ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
      return cp >= 0x80;
    case 3:
      cp = ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
      return cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF);
    case 4:
      cp = ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
      return cp >= 0x10000 && cp <= 0x10FFFF;
    default:
      return need == 1;
  }
}

// Length of one valid character at s[i], or 0 when the bytes there are malformed (sentencepiece then consumes
// one byte and substitutes U+FFFD).
inline std::size_t valid_char_len(std::string_view s, std::size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  const std::size_t need = utf8_need(p[0]);
  if (need == 0 || need > s.size() - i) return 0;
  if (need == 1) return 1;
  return utf8_valid(p, need) ? need : 0;
}

// Parses "<0xXX>" (upper-case hex, exactly as sentencepiece's ByteToPiece writes it); -1 otherwise.
inline int piece_to_byte(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(piece[3]);
  const int lo = hex(piece[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

inline std::string replace_space_symbol(std::string_view piece) {
  std::string out;
  out.reserve(piece.size());
  std::size_t i = 0;
  while (i < piece.size()) {
    if (piece.compare(i, kSpaceSymbol.size(), kSpaceSymbol) == 0) {
      out.push_back(' ');
      i += kSpaceSymbol.size();
    } else {
      out.push_back(piece[i++]);
    }
  }
  return out;
}

struct Symbol {
  int prev;
  int next;
  std::uint32_t begin;  // byte range in the normalized text
  std::uint32_t size;   // 0 once merged into its left neighbour
  bool freeze;          // user-defined symbol: never merged
};

struct Pair {
  float score;
  int left;
  int right;
  std::uint32_t size;
};

// Priority: higher score first; on equal score the leftmost pair (sentencepiece's SymbolPairComparator).
struct PairLess {
  bool operator()(const Pair& a, const Pair& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

struct Scratch {
  std::string normalized;
  std::vector<Symbol> symbols;
  std::vector<Pair> heap;
};

}  // namespace spm

// Internal header of two files of this library: the helpers are used unqualified, as before the split.
using namespace spm;

struct Tokenizer::Impl {
  std::string model_bytes;
  std::string origin;

  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<PieceType> types;
  detail::TokenIndex piece_ids;  // over `pieces` (never modified after load)
  // BPE may run on each segment separately: the text is cut before every whitespace symbol that follows
  // another character, which is exact when no mergeable piece spans such a cut (checked at load).
  bool segmentable = false;

  // Decoding tables.
  std::vector<std::string> surface;        // piece with "▁" → " " (control: "", byte: the byte, unk: unk_surface)
  std::vector<std::uint8_t> starts_ws;     // piece starts with "▁"
  std::vector<std::int16_t> byte_value;    // byte pieces: 0..255, others -1
  std::array<TokenId, 256> byte_ids{};     // byte → id of "<0xXX>" (byte_fallback only)

  TokenId unk = -1, bos = -1, eos = -1, pad = -1;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
  bool ws_as_suffix = false;
  bool byte_fallback = false;
  bool has_unused = false;
  std::string unk_surface;

  // User-defined symbols: longest-prefix match (sentencepiece's PrefixMatcher).
  std::unordered_set<std::string_view> user_defined;
  std::vector<std::size_t> ud_lengths;  // distinct lengths, longest first
  std::array<bool, 256> ud_first{};
  // Control pieces (spelling, id), longest first: recognised in trusted text by encode_pieces.
  std::vector<std::pair<std::string, TokenId>> controls;

  TokenId lookup(std::string_view piece) const {  // ModelInterface::PieceToId: unknown → unk
    const TokenId id = piece_ids.find(piece);
    return id < 0 ? unk : id;
  }

  static bool mergeable(PieceType t) {
    return t == PieceType::normal || t == PieceType::user_defined || t == PieceType::unused;
  }

  // Longest user-defined symbol at the start of `s`, else one UTF-8 character (OneCharLen, clipped).
  std::size_t prefix_match(std::string_view s, bool* found) const {
    if (!user_defined.empty() && ud_first[static_cast<unsigned char>(s[0])]) {
      for (std::size_t len : ud_lengths) {
        if (len <= s.size() && user_defined.count(s.substr(0, len)) != 0) {
          *found = true;
          return len;
        }
      }
    }
    *found = false;
    return std::min(s.size(), one_char_len(static_cast<unsigned char>(s[0])));
  }

  void normalize(std::string_view input, std::string& out) const;
  std::string_view whitespace_symbol() const { return escape_whitespaces ? kSpaceSymbol : std::string_view(" "); }

  struct EmitState {
    bool prev_unk = false;
  };
  void encode_bpe(std::string_view normalized, Scratch& scratch, std::vector<TokenId>& ids) const;
  void bpe_segment(std::string_view text, Scratch& scratch, EmitState& state, std::vector<TokenId>& ids) const;
  void decode_step(TokenId id, std::string& pending, bool& at_start, std::string& out) const;
  static void drain_bytes(std::string& pending, bool final, std::string& out);
};

}  // namespace tandem::tok
