// UTF-8 helpers, the GPT-2 byte alphabet and the ICU regex / normalizer wrappers (unicode.h).
#include "tokenizer/unicode.h"

#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/ucasemap.h>
#include <unicode/unistr.h>
#include <unicode/utext.h>

#include <mutex>

namespace tandem::tok::detail {

std::size_t utf8_char_len(std::string_view s, std::size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  const std::size_t avail = s.size() - i;
  const unsigned char b = p[0];
  if (b < 0x80) return 1;
  std::size_t need = 0;
  std::uint32_t cp = 0;
  if ((b & 0xE0) == 0xC0) {
    need = 2;
    cp = b & 0x1Fu;
  } else if ((b & 0xF0) == 0xE0) {
    need = 3;
    cp = b & 0x0Fu;
  } else if ((b & 0xF8) == 0xF0) {
    need = 4;
    cp = b & 0x07u;
  } else {
    return 0;
  }
  if (need > avail) return 0;
  for (std::size_t k = 1; k < need; ++k) {
    if ((p[k] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (p[k] & 0x3Fu);
  }
  if (need == 2 && cp < 0x80) return 0;
  if (need == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
  if (need == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
  return need;
}

bool utf8_valid(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_char_len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_sanitize(std::string_view s) {
  if (utf8_valid(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_char_len(s, i);
    if (n == 0) {
      out.append(kReplacementChar);
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::uint32_t utf8_decode(std::string_view s, std::size_t i, std::size_t* len) {
  const std::size_t n = utf8_char_len(s, i);
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  *len = n == 0 ? 1 : n;
  switch (n) {
    case 1:
      return p[0];
    case 2:
      return ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    case 3:
      return ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    case 4:
      return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
    default:
      return 0xFFFD;
  }
}

void drain_utf8_lossy(std::string& pending, bool final, std::string& out) {
  const auto* p = reinterpret_cast<const unsigned char*>(pending.data());
  const std::size_t n = pending.size();
  std::size_t off = 0;
  while (off < n) {
    const std::size_t len = utf8_char_len(pending, off);
    if (len != 0) {
      out.append(pending, off, len);
      off += len;
      continue;
    }
    // Malformed or incomplete: the length of the maximal valid prefix of a character (Unicode's "maximal subpart").
    const unsigned char b = p[off];
    std::size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b >= 0xC2 && b <= 0xDF) {
      need = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 3;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 4;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    }
    std::size_t good = 1;  // bytes of a possible prefix
    if (need != 0) {
      while (good < need && off + good < n) {
        const unsigned char c = p[off + good];
        const bool ok = good == 1 ? (c >= lo && c <= hi) : (c & 0xC0) == 0x80;
        if (!ok) break;
        ++good;
      }
      if (off + good == n && good < need && !final) break;  // may still complete
    }
    out.append(kReplacementChar);
    off += good;
  }
  pending.erase(0, off);
}

const ByteAlphabet& ByteAlphabet::get() {
  static const ByteAlphabet table = [] {
    ByteAlphabet a;
    a.cp_to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const std::uint32_t cp = printable ? static_cast<std::uint32_t>(b) : static_cast<std::uint32_t>(256 + extra++);
      append_utf8(a.byte_to_utf8[static_cast<std::size_t>(b)], cp);
      a.cp_to_byte[cp] = static_cast<std::int16_t>(b);
    }
    return a;
  }();
  return table;
}

std::string bytes_to_alphabet(std::string_view text) {
  const ByteAlphabet& a = ByteAlphabet::get();
  std::string out;
  out.reserve(text.size() * 2);
  for (char c : text) out.append(a.byte_to_utf8[static_cast<unsigned char>(c)]);
  return out;
}

std::string alphabet_to_bytes(std::string_view token) {
  const ByteAlphabet& a = ByteAlphabet::get();
  std::string out;
  out.reserve(token.size());
  for (std::size_t i = 0; i < token.size();) {
    std::size_t len = 0;
    const std::uint32_t cp = utf8_char_len(token, i) == 0 ? 0xFFFFFFFFu : utf8_decode(token, i, &len);
    if (cp >= a.cp_to_byte.size() || a.cp_to_byte[cp] < 0) return std::string(token);
    out.push_back(static_cast<char>(a.cp_to_byte[cp]));
    i += len;
  }
  return out;
}

// --- ICU ------------------------------------------------------------------------------------------------------------

namespace {

// \s → \p{White_Space}, \S → \P{White_Space}; every other escape is copied with its backslash.
std::string translate_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 16);
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (p[i] == '\\' && i + 1 < p.size()) {
      const char c = p[i + 1];
      if (c == 's') {
        out.append("\\p{White_Space}");
      } else if (c == 'S') {
        out.append("\\P{White_Space}");
      } else {
        out.push_back('\\');
        out.push_back(c);
      }
      ++i;
    } else {
      out.push_back(p[i]);
    }
  }
  return out;
}

}  // namespace

struct Regex::State {
  std::unique_ptr<icu::RegexPattern> pattern;
  std::mutex mu;
  std::vector<std::unique_ptr<icu::RegexMatcher>> free;  // destroyed before the pattern they point to
};

Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

Result<Regex> Regex::compile(std::string_view pattern_utf8, const std::string& what) {
  if (!utf8_valid(pattern_utf8)) return fail(Errc::format_error, what + ": the regex is not valid UTF-8");
  const std::string translated = translate_pattern(pattern_utf8);
  const icu::UnicodeString upat = icu::UnicodeString::fromUTF8(icu::StringPiece(translated.data(),
                                                                                 static_cast<int32_t>(translated.size())));
  UErrorCode status = U_ZERO_ERROR;
  UParseError perr{};
  std::unique_ptr<icu::RegexPattern> pat(icu::RegexPattern::compile(upat, 0, perr, status));
  if (U_FAILURE(status) || !pat) {
    return fail(Errc::parse_error, what + ": regex '" + std::string(pattern_utf8) + "' does not compile (ICU: " +
                                       u_errorName(status) + " at offset " + std::to_string(perr.offset) + ")");
  }
  Regex r;
  r.state_ = std::make_unique<State>();
  r.state_->pattern = std::move(pat);
  return r;
}

void Regex::find_all(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>& out) const {
  if (text.empty() || !state_) return;
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> m;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->free.empty()) {
      m = std::move(state_->free.back());
      state_->free.pop_back();
    }
  }
  if (!m) {
    m.reset(state_->pattern->matcher(status));
    if (U_FAILURE(status) || !m) return;
  }
  UText* ut = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &status);
  if (U_SUCCESS(status)) {
    m->reset(ut);
    while (m->find(status) && U_SUCCESS(status)) {
      const int64_t b = m->start64(status);
      const int64_t e = m->end64(status);
      if (U_FAILURE(status)) break;
      if (e > b) out.emplace_back(static_cast<std::size_t>(b), static_cast<std::size_t>(e));
    }
    static const icu::UnicodeString kEmpty;
    m->reset(kEmpty);  // drop the reference to `ut` before closing it
  }
  utext_close(ut);
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->free.push_back(std::move(m));
}

std::string normalize(std::string_view text, NormalForm form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case NormalForm::nfc:
      n = icu::Normalizer2::getNFCInstance(status);
      break;
    case NormalForm::nfkc:
      n = icu::Normalizer2::getNFKCInstance(status);
      break;
    case NormalForm::nfd:
      n = icu::Normalizer2::getNFDInstance(status);
      break;
    case NormalForm::nfkd:
      n = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  if (U_FAILURE(status) || n == nullptr) return std::string(text);
  const icu::UnicodeString in =
      icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  if (n->isNormalized(in, status) && U_SUCCESS(status)) return std::string(text);
  status = U_ZERO_ERROR;
  const icu::UnicodeString res = n->normalize(in, status);
  if (U_FAILURE(status)) return std::string(text);
  std::string out;
  res.toUTF8String(out);
  return out;
}

std::string to_lower(std::string_view text) {
  bool ascii = true;
  for (char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) {
    std::string out(text);
    for (char& c : out) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    return out;
  }
  UErrorCode status = U_ZERO_ERROR;
  UCaseMap* map = ucasemap_open("", 0, &status);  // root locale: full mappings, final sigma, no tr/lt rules
  if (U_FAILURE(status) || map == nullptr) return std::string(text);
  std::string out(text.size() + 16, '\0');
  for (int attempt = 0; attempt < 2; ++attempt) {
    status = U_ZERO_ERROR;
    const int32_t n = ucasemap_utf8ToLower(map, out.data(), static_cast<int32_t>(out.size()), text.data(),
                                           static_cast<int32_t>(text.size()), &status);
    if (status == U_BUFFER_OVERFLOW_ERROR && attempt == 0) {
      out.resize(static_cast<std::size_t>(n));
      continue;
    }
    if (U_FAILURE(status)) break;
    out.resize(static_cast<std::size_t>(n));
    ucasemap_close(map);
    return out;
  }
  ucasemap_close(map);
  return std::string(text);
}

bool is_numeric_cp(std::uint32_t cp) {
  const auto t = u_charType(static_cast<UChar32>(cp));
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

bool is_alnum_cp(std::uint32_t cp) { return u_isalpha(static_cast<UChar32>(cp)) || is_numeric_cp(cp); }

bool is_whitespace_cp(std::uint32_t cp) { return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE); }

}  // namespace tandem::tok::detail
