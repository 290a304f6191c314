#include "generation/jinja_text.h"

#include <algorithm>

namespace tandem::gen::jinja {

Text::Text(std::string s, bool trusted) : flat_(std::move(s)) {
  if (!flat_.empty()) runs_.push_back(Run{flat_.size(), trusted});
}

bool Text::all_trusted() const {
  return std::all_of(runs_.begin(), runs_.end(), [](const Run& r) { return r.trusted; });
}

void Text::append(std::string_view s, bool trusted) {
  if (s.empty()) return;
  flat_.append(s);
  if (!runs_.empty() && runs_.back().trusted == trusted)
    runs_.back().length += s.size();
  else
    runs_.push_back(Run{s.size(), trusted});
}

void Text::append(const Text& t) {
  std::size_t pos = 0;
  for (const Run& r : t.runs_) {
    append(std::string_view(t.flat_).substr(pos, r.length), r.trusted);
    pos += r.length;
  }
}

Text Text::substr(std::size_t pos, std::size_t n) const {
  Text out;
  if (pos >= flat_.size()) return out;
  std::size_t end = n > flat_.size() - pos ? flat_.size() : pos + n;
  std::size_t at = 0;
  for (const Run& r : runs_) {
    std::size_t a = std::max(at, pos), b = std::min(at + r.length, end);
    if (a < b) out.append(std::string_view(flat_).substr(a, b - a), r.trusted);
    at += r.length;
    if (at >= end) break;
  }
  return out;
}

Text Text::with_bytes(std::string bytes) const {
  Text out;
  if (bytes.size() != flat_.size()) return Text(std::move(bytes), all_trusted());
  out.flat_ = std::move(bytes);
  out.runs_ = runs_;
  return out;
}

namespace {
std::size_t seq_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;
}
}  // namespace

std::vector<std::size_t> utf8_offsets(std::string_view s) {
  std::vector<std::size_t> out;
  std::size_t i = 0;
  while (i < s.size()) {
    out.push_back(i);
    std::size_t n = seq_len(static_cast<unsigned char>(s[i]));
    std::size_t j = 1;
    while (j < n && i + j < s.size() && (static_cast<unsigned char>(s[i + j]) & 0xC0) == 0x80) ++j;
    i += (j == n) ? n : 1;
  }
  out.push_back(s.size());
  return out;
}

std::size_t utf8_length(std::string_view s) { return utf8_offsets(s).size() - 1; }

}  // namespace tandem::gen::jinja
