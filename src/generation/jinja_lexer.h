// Jinja engine, part 4a: the lexer. Splits a template into text and tag tokens with Hugging Face's settings —
// trim_blocks and lstrip_blocks on, `-`/`+` whitespace control, a single trailing newline dropped
// (keep_trailing_newline off), "\r\n" and "\r" in text normalized to "\n" — and lexes the expressions inside tags.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::gen::jinja {

struct Token {
  enum class Kind { text, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };
  Kind kind = Kind::eof;
  std::string value;  // text, name, string (unescaped), op
  std::int64_t i = 0;
  double f = 0;
  int line = 1;
};

// Throws jinja::Error (format_error / unsupported) with the line on malformed input.
std::vector<Token> lex(std::string_view source);

}  // namespace tandem::gen::jinja
