// Tiny strict command-line parsing shared by the tools: every value is checked, errors name the flag.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

namespace tandem::cli {

struct ArgError {
  std::string message;
};

template <class T>
T parse_number(std::string_view flag, std::string_view text, T lo, T hi) {
  T v{};
  const char* b = text.data();
  const char* e = text.data() + text.size();
  auto r = std::from_chars(b, e, v);
  if (text.empty() || r.ec != std::errc{} || r.ptr != e)
    throw ArgError{std::string(flag) + ": '" + std::string(text) + "' is not a number"};
  if (v < lo || v > hi)
    throw ArgError{std::string(flag) + ": " + std::string(text) + " is outside [" + std::to_string(lo) + ", " +
                   std::to_string(hi) + "]"};
  return v;
}

// Walks argv; `value()` returns the flag's argument or throws.
class Args {
 public:
  Args(int argc, char** argv) : argc_(argc), argv_(argv) {}
  bool next() { return ++i_ < argc_; }
  std::string_view flag() const { return argv_[i_]; }
  std::string_view value() {
    if (i_ + 1 >= argc_) throw ArgError{std::string(flag()) + " needs a value"};
    return argv_[++i_];
  }

 private:
  int argc_;
  char** argv_;
  int i_ = 0;
};

}  // namespace tandem::cli
