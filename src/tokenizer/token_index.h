// Open-addressing spelling → id table over a token vector, shared by both tokenizer kinds (the SentencePiece piece
// table and the BPE vocabulary): stored 64-bit hashes, so the many lookups that miss (BPE pair candidates) rarely
// touch the token text; no per-entry allocation. Keys are the strings of the vector it is built over, which must
// not change afterwards. Internal to src/tokenizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/piece_type.h"

namespace tandem::tok::detail {

inline std::uint64_t mum(std::uint64_t a, std::uint64_t b) {
  const unsigned __int128 r = static_cast<unsigned __int128>(a) * b;
  return static_cast<std::uint64_t>(r) ^ static_cast<std::uint64_t>(r >> 64);
}

inline std::uint64_t hash_bytes(std::string_view s) {
  const char* p = s.data();
  std::size_t n = s.size();
  std::uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xA0761D6478BD642FULL);
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    h = mum(h ^ w, 0xE7037ED1A0B428DBULL);
    p += 8;
    n -= 8;
  }
  std::uint64_t w = 0;
  if (n > 0) std::memcpy(&w, p, n);
  return mum(h ^ w, 0x8EBC6AF09C88C6E3ULL);
}

class TokenIndex {
 public:
  // Sized for `n` entries of `*tokens` (inserted afterwards with insert()).
  void build(const std::vector<std::string>* tokens, std::size_t n) {
    tokens_ = tokens;
    std::size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Slot{0, -1});
    mask_ = cap - 1;
  }
  // Inserts tokens[id]; returns the id already holding that spelling, or -1.
  TokenId insert(TokenId id) {
    const std::string& key = (*tokens_)[static_cast<std::size_t>(id)];
    const std::uint64_t h = hash_bytes(key);
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.id < 0) {
        s = Slot{h, id};
        return -1;
      }
      if (s.hash == h && (*tokens_)[static_cast<std::size_t>(s.id)] == key) return s.id;
    }
  }
  TokenId find(std::string_view key) const {
    if (slots_.empty()) return -1;
    const std::uint64_t h = hash_bytes(key);
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.hash == h && (*tokens_)[static_cast<std::size_t>(s.id)] == key) return s.id;
    }
  }

 private:
  struct Slot {
    std::uint64_t hash;
    TokenId id;
  };
  const std::vector<std::string>* tokens_ = nullptr;
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
};

}  // namespace tandem::tok::detail
