// Text primitives of the BPE tokenizer: UTF-8 helpers, GPT-2's byte <-> unicode alphabet, and ICU for regexes
// (Unicode properties: \p{L}, \p{N}, ...) and normalization (NFC / NFKC). Internal to the tokenizer library.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"

namespace tandem::tok::detail {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length of the valid UTF-8 character at s[i] (1-4), 0 when malformed there (bad lead/trail, overlong, surrogate,
// > U+10FFFF, truncated).
std::size_t utf8_char_len(std::string_view s, std::size_t i);
bool utf8_valid(std::string_view s);
// `s` with every malformed byte replaced by U+FFFD (valid text is returned unchanged).
std::string utf8_sanitize(std::string_view s);
// Appends the UTF-8 of code point cp.
void append_utf8(std::string& out, std::uint32_t cp);
// Decodes the character at s[i] (valid UTF-8 assumed, as utf8_char_len says); sets *len.
std::uint32_t utf8_decode(std::string_view s, std::size_t i, std::size_t* len);

// Moves the complete UTF-8 text at the front of `pending` to `out`, malformed sequences as one U+FFFD per maximal
// subpart (as Rust's String::from_utf8_lossy, which Hugging Face's decoders use). Unless `final`, an incomplete but
// still possible character at the end stays in `pending`.
void drain_utf8_lossy(std::string& pending, bool final, std::string& out);

// GPT-2's byte-level alphabet: every byte as a printable character (bytes 33-126, 161-172, 174-255 as themselves,
// the others as U+0100 + n in byte order).
struct ByteAlphabet {
  std::array<std::string, 256> byte_to_utf8;  // byte → its character's UTF-8
  // Code point → byte; -1 when the code point is not in the alphabet (index < 324).
  std::array<std::int16_t, 324> cp_to_byte;
  static const ByteAlphabet& get();
};
// Maps every byte of `text` to its alphabet character.
std::string bytes_to_alphabet(std::string_view text);
// The bytes a byte-level token stands for: each character mapped back; a token holding any character outside the
// alphabet is returned as is (Hugging Face's ByteLevel decoder does the same).
std::string alphabet_to_bytes(std::string_view token);

// A compiled ICU regex. `\s` / `\S` are read as \p{White_Space} / \P{White_Space} (what Oniguruma and Rust's regex
// crate mean; ICU's own \s lacks U+000B and U+0085). Thread-safe: matching creates its own matcher.
class Regex {
 public:
  // parse_error naming `what` and ICU's reason when the pattern does not compile.
  static Result<Regex> compile(std::string_view pattern_utf8, const std::string& what);
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();
  // Byte ranges [begin, end) of the non-empty, non-overlapping matches in `text` (valid UTF-8), left to right.
  void find_all(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>& out) const;

 private:
  Regex() = default;
  struct State;  // the pattern and a pool of matchers (unicode.cc)
  std::unique_ptr<State> state_;
};

enum class NormalForm : std::uint8_t { nfc, nfkc, nfd, nfkd };
// Unicode normalization of valid UTF-8 text through ICU's Normalizer2.
std::string normalize(std::string_view text, NormalForm form);
// Full Unicode lowercasing (ICU, root locale: SpecialCasing mappings such as U+0130 → "i\u0307", final sigma), what
// Rust's str::to_lowercase (Hugging Face's Lowercase normalizer) and Python's str.lower() do. ASCII fast path.
std::string to_lower(std::string_view text);
// Rust's char::is_numeric: general category Nd, Nl or No.
bool is_numeric_cp(std::uint32_t cp);
// Rust's char::is_alphanumeric (L* or N*), for single_word added tokens.
bool is_alnum_cp(std::uint32_t cp);
bool is_whitespace_cp(std::uint32_t cp);  // \p{White_Space}

}  // namespace tandem::tok::detail
