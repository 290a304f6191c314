// Jinja engine, part 1 of 5: Text — a string that remembers, byte range by byte range, whether it came from the
// template itself (trusted) or from the caller's data (untrusted). Every string operation of the engine goes
// through Text so the flag survives concatenation, slicing, trimming, case changes, replace, split and join.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::gen::jinja {

class Text {
 public:
  struct Run {
    std::size_t length = 0;
    bool trusted = false;
  };

  Text() = default;
  Text(std::string s, bool trusted);

  const std::string& str() const { return flat_; }
  const std::vector<Run>& runs() const { return runs_; }
  std::size_t size() const { return flat_.size(); }
  bool empty() const { return flat_.empty(); }
  bool all_trusted() const;

  void append(const Text& t);
  void append(std::string_view s, bool trusted);

  // Bytes [pos, pos + n) (clamped), each keeping its flag.
  Text substr(std::size_t pos, std::size_t n = std::string::npos) const;
  // The same runs over new bytes of the same length (ASCII case mapping).
  Text with_bytes(std::string bytes) const;

 private:
  std::string flat_;
  std::vector<Run> runs_;  // adjacent runs differ in flag; lengths sum to flat_.size()
};

// UTF-8 helpers (invalid bytes count as one code point each, so every input has a defined length).
std::size_t utf8_length(std::string_view s);
// Byte offset of each code point start, plus s.size() at the end.
std::vector<std::size_t> utf8_offsets(std::string_view s);

}  // namespace tandem::gen::jinja
