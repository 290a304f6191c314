#include "generation/jinja_lexer.h"

#include <cerrno>
#include <cstdlib>

#include "generation/jinja_value.h"

namespace tandem::gen::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string normalize_newlines(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t k = 0; k < s.size(); ++k) {
    if (s[k] == '\r') {
      out += '\n';
      if (k + 1 < s.size() && s[k + 1] == '\n') ++k;
    } else {
      out += s[k];
    }
  }
  return out;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's unicode-escape decoding of a string literal body (what Jinja applies).
std::string unescape(std::string_view body, int line) {
  std::string out;
  for (std::size_t k = 0; k < body.size(); ++k) {
    char c = body[k];
    if (c != '\\' || k + 1 >= body.size()) {
      out += c;
      continue;
    }
    char e = body[++k];
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case 'a': out += '\a'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case '\n': break;  // line continuation
      case 'x':
      case 'u':
      case 'U': {
        std::size_t n = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
        std::uint32_t cp = 0;
        for (std::size_t j = 1; j <= n; ++j) {
          int h = k + j < body.size() ? hex_value(body[k + j]) : -1;
          if (h < 0) raise(Errc::format_error, line, "bad \\" + std::string(1, e) + " escape in string literal");
          cp = cp * 16 + static_cast<std::uint32_t>(h);
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
          raise(Errc::format_error, line, "escape outside Unicode in string literal");
        append_utf8(out, cp);
        k += n;
        break;
      }
      case 'N': raise(Errc::unsupported, line, "unsupported string escape '\\N{...}'");
      default:
        if (e >= '0' && e <= '7') {  // octal, up to 3 digits
          std::uint32_t cp = static_cast<std::uint32_t>(e - '0');
          for (int j = 0; j < 2 && k + 1 < body.size() && body[k + 1] >= '0' && body[k + 1] <= '7'; ++j)
            cp = cp * 8 + static_cast<std::uint32_t>(body[++k] - '0');
          append_utf8(out, cp);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  std::vector<Token> run() {
    bool lstrip_next = false;
    while (pos_ < src_.size()) {
      std::size_t start = find_tag(pos_);
      std::string text(src_.substr(pos_, start - pos_));
      std::size_t text_start = pos_;
      int text_line = line_;
      count_lines(pos_, start);
      pos_ = start;
      if (lstrip_next) {
        std::size_t k = 0;
        while (k < text.size() && is_space(text[k])) ++k;
        text.erase(0, k);
        lstrip_next = false;
      }
      if (start >= src_.size()) {
        emit_text(std::move(text), text_line);
        break;
      }
      char kind = src_[start + 1];
      char mod = start + 2 < src_.size() ? src_[start + 2] : '\0';
      if (mod == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (kind != '{' && mod != '+') {  // lstrip_blocks
        std::size_t nl = text.rfind('\n');
        std::size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        bool line_starting = l_pos > 0 || text_start == 0 || src_[text_start - 1] == '\n';
        if (line_starting && text.find_first_not_of(" \t", l_pos) == std::string::npos) text.erase(l_pos);
      }
      emit_text(std::move(text), text_line);
      pos_ = start + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (kind == '#') {
        std::size_t end = src_.find("#}", pos_);
        if (end == std::string_view::npos) raise(Errc::format_error, line_, "unclosed comment");
        bool strip = end > pos_ && src_[end - 1] == '-';
        bool keep = end > pos_ && src_[end - 1] == '+';
        count_lines(pos_, end);
        pos_ = end + 2;
        if (strip) lstrip_next = true;
        else if (!keep) skip_newline();
        continue;
      }
      bool block = kind == '%';
      push(block ? Token::Kind::block_begin : Token::Kind::var_begin, "", line_);
      char end_mod = lex_expression(block);
      push(block ? Token::Kind::block_end : Token::Kind::var_end, "", line_);
      if (end_mod == '-') lstrip_next = true;
      else if (block && end_mod != '+') skip_newline();
    }
    push(Token::Kind::eof, "", line_);
    return std::move(out_);
  }

 private:
  std::size_t find_tag(std::size_t from) const {
    for (std::size_t k = from; k + 1 < src_.size(); ++k)
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    return src_.size();
  }
  void count_lines(std::size_t a, std::size_t b) {
    for (std::size_t k = a; k < b && k < src_.size(); ++k)
      if (src_[k] == '\n') ++line_;
  }
  void skip_newline() {
    if (pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      ++line_;
    } else if (pos_ + 1 < src_.size() && src_[pos_] == '\r' && src_[pos_ + 1] == '\n') {
      pos_ += 2;
      ++line_;
    }
  }
  void emit_text(std::string text, int line) {
    if (!text.empty()) push(Token::Kind::text, normalize_newlines(text), line);
  }
  void push(Token::Kind k, std::string v, int line) {
    Token t;
    t.kind = k;
    t.value = std::move(v);
    t.line = line;
    out_.push_back(std::move(t));
  }

  // Lexes tokens up to the closing delimiter; returns its modifier ('-', '+' or '\0').
  char lex_expression(bool block) {
    int depth = 0;
    const char close = block ? '%' : '}';
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) raise(Errc::format_error, line_, block ? "unclosed '{%' tag" : "unclosed '{{' tag");
      std::string_view rest = src_.substr(pos_);
      if (depth == 0) {
        if (rest.size() >= 2 && rest[0] == close && rest[1] == '}') {
          pos_ += 2;
          return '\0';
        }
        if (rest.size() >= 3 && (rest[0] == '-' || rest[0] == '+') && rest[1] == close && rest[2] == '}') {
          pos_ += 3;
          return rest[0];
        }
      }
      char c = rest[0];
      if (is_name_start(c)) {
        std::size_t n = 1;
        while (n < rest.size() && (is_name_start(rest[n]) || is_digit(rest[n]))) ++n;
        push(Token::Kind::name, std::string(rest.substr(0, n)), line_);
        pos_ += n;
      } else if (is_digit(c)) {
        lex_number(rest);
      } else if (c == '\'' || c == '"') {
        lex_string(rest);
      } else {
        static const char* const two[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* t : two)
          if (rest.substr(0, 2) == t) op = t;
        if (op.empty()) {
          if (std::string_view("+-*/%~<>=()[]{}.,:|").find(c) == std::string_view::npos)
            raise(Errc::format_error, line_, std::string("unexpected character '") + c + "' in tag");
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        push(Token::Kind::op, op, line_);
        pos_ += op.size();
      }
    }
  }

  void lex_number(std::string_view rest) {
    std::size_t n = 0;
    while (n < rest.size() && (is_digit(rest[n]) || rest[n] == '_')) ++n;
    bool is_float = false;
    if (n + 1 < rest.size() && rest[n] == '.' && is_digit(rest[n + 1])) {
      is_float = true;
      ++n;
      while (n < rest.size() && (is_digit(rest[n]) || rest[n] == '_')) ++n;
    }
    if (n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
      std::size_t m = n + 1;
      if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) ++m;
      if (m < rest.size() && is_digit(rest[m])) {
        is_float = true;
        n = m;
        while (n < rest.size() && is_digit(rest[n])) ++n;
      }
    }
    std::string digits;
    for (char c : rest.substr(0, n))
      if (c != '_') digits += c;
    Token t;
    t.line = line_;
    errno = 0;
    if (is_float) {
      t.kind = Token::Kind::floating;
      t.f = std::strtod(digits.c_str(), nullptr);
    } else {
      t.kind = Token::Kind::integer;
      t.i = std::strtoll(digits.c_str(), nullptr, 10);
      if (errno == ERANGE) raise(Errc::unsupported, line_, "integer literal too large");
    }
    out_.push_back(std::move(t));
    pos_ += n;
  }

  void lex_string(std::string_view rest) {
    char q = rest[0];
    std::size_t k = 1;
    int start_line = line_;
    while (k < rest.size() && rest[k] != q) {
      if (rest[k] == '\\' && k + 1 < rest.size()) ++k;
      if (rest[k] == '\n') ++line_;
      ++k;
    }
    if (k >= rest.size()) raise(Errc::format_error, start_line, "unterminated string literal");
    push(Token::Kind::string, unescape(normalize_newlines(rest.substr(1, k - 1)), start_line), start_line);
    pos_ += k + 1;
  }

  std::string_view src_;
  std::size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> lex(std::string_view source) {
  // keep_trailing_newline=False: one trailing newline ("\n", "\r\n" or "\r") is dropped.
  if (source.size() >= 2 && source.substr(source.size() - 2) == "\r\n") source.remove_suffix(2);
  else if (!source.empty() && (source.back() == '\n' || source.back() == '\r')) source.remove_suffix(1);
  return Lexer(source).run();
}

}  // namespace tandem::gen::jinja
