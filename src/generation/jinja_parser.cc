#include "generation/jinja_parser.h"

#include <set>

#include "generation/jinja_builtins.h"
#include "generation/jinja_lexer.h"

namespace tandem::gen::jinja {

namespace {

using TK = Token::Kind;

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body parse_all() {
    std::string end;
    Body body = parse_body({}, end);
    return body;
  }

 private:
  // ---- token helpers -------------------------------------------------------------------------------------------
  const Token& peek(std::size_t ahead = 0) const {
    std::size_t k = p_ + ahead;
    return k < t_.size() ? t_[k] : t_.back();
  }
  const Token& next() {
    const Token& tok = peek();
    if (p_ < t_.size() - 1) ++p_;
    return tok;
  }
  bool is_op(const char* op, std::size_t ahead = 0) const {
    return peek(ahead).kind == TK::op && peek(ahead).value == op;
  }
  bool is_name(const char* n, std::size_t ahead = 0) const {
    return peek(ahead).kind == TK::name && peek(ahead).value == n;
  }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  [[noreturn]] void error(const std::string& what) const {
    const Token& tok = peek();
    std::string got;
    switch (tok.kind) {
      case TK::block_end: got = "end of tag"; break;
      case TK::var_end: got = "'}}'"; break;
      case TK::eof: got = "end of template"; break;
      case TK::text: got = "text"; break;
      default: got = "'" + tok.value + "'";
    }
    raise(Errc::format_error, tok.line, what + " (found " + got + ")");
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) error(std::string("expected '") + op + "'");
  }
  std::string expect_name() {
    if (peek().kind != TK::name) error("expected a name");
    return next().value;
  }
  void expect_block_end() {
    if (peek().kind != TK::block_end) error("expected end of tag");
    next();
  }
  void enter() {
    if (++depth_ > kMaxNesting) raise(Errc::unsupported, peek().line, "template nested too deeply");
  }
  void leave() { --depth_; }

  // ---- statements ----------------------------------------------------------------------------------------------
  // Parses until a block tag whose keyword is in `ends` (consumed up to the keyword; stored in `found`).
  Body parse_body(const std::set<std::string>& ends, std::string& found) {
    enter();
    Body body;
    while (true) {
      const Token& tok = peek();
      if (tok.kind == TK::eof) {
        if (!ends.empty()) raise(Errc::format_error, tok.line, "missing '{% " + *ends.rbegin() + " %}'");
        break;
      }
      if (tok.kind == TK::text) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::text;
        s->line = tok.line;
        s->text = next().value;
        body.push_back(std::move(s));
      } else if (tok.kind == TK::var_begin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::output;
        s->line = tok.line;
        s->expr = parse_tuple(true);
        if (peek().kind != TK::var_end) error("expected '}}'");
        next();
        body.push_back(std::move(s));
      } else if (tok.kind == TK::block_begin) {
        const Token& kw = peek(1);
        if (kw.kind != TK::name) {
          next();
          error("expected a statement keyword");
        }
        if (ends.count(kw.value)) {
          next();
          next();
          found = kw.value;
          leave();
          return body;
        }
        next();
        body.push_back(parse_statement());
      } else {
        error("unexpected token");
      }
    }
    leave();
    return body;
  }

  StmtPtr make(Stmt::Kind k, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->line = line;
    return s;
  }

  StmtPtr parse_statement() {
    const Token& kw = next();
    int line = kw.line;
    const std::string& w = kw.value;
    if (w == "if") return parse_if(line);
    if (w == "for") return parse_for(line);
    if (w == "set") return parse_set(line);
    if (w == "macro") return parse_macro(line);
    if (w == "filter") return parse_filter_block(line);
    if (w == "generation") {
      auto s = make(Stmt::Kind::generation, line);
      expect_block_end();
      std::string found;
      s->body = parse_body({"endgeneration"}, found);
      expect_block_end();
      return s;
    }
    if (w == "break" || w == "continue") {
      if (loop_depth_ == 0) raise(Errc::format_error, line, "'" + w + "' outside a loop");
      auto s = make(w == "break" ? Stmt::Kind::break_ : Stmt::Kind::continue_, line);
      expect_block_end();
      return s;
    }
    static const std::set<std::string> refused = {"extends", "include", "import", "from", "block", "call", "raw",
                                                  "with", "autoescape", "do", "trans", "endblock"};
    if (refused.count(w)) raise(Errc::unsupported, line, "unsupported statement '" + w + "'");
    raise(Errc::format_error, line, "unknown or misplaced statement '" + w + "'");
  }

  StmtPtr parse_if(int line) {
    auto s = make(Stmt::Kind::if_, line);
    ExprPtr cond = parse_tuple(true);
    expect_block_end();
    while (true) {
      std::string found;
      Body body = parse_body({"elif", "else", "endif"}, found);
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (found == "elif") {
        cond = parse_tuple(true);
        expect_block_end();
      } else if (found == "else") {
        expect_block_end();
        Body els = parse_body({"endif"}, found);
        s->branches.emplace_back(nullptr, std::move(els));
        expect_block_end();
        return s;
      } else {
        expect_block_end();
        return s;
      }
    }
  }

  StmtPtr parse_for(int line) {
    auto s = make(Stmt::Kind::for_, line);
    bool paren = accept_op("(");
    s->targets.push_back(expect_name());
    while (accept_op(",")) {
      if (is_name("in")) break;
      s->targets.push_back(expect_name());
    }
    if (paren) expect_op(")");
    if (!accept_name("in")) error("expected 'in' in for loop");
    s->expr = parse_or();
    if (accept_name("if")) s->cond = parse_or();
    if (is_name("recursive")) raise(Errc::unsupported, line, "unsupported recursive for loop");
    expect_block_end();
    ++loop_depth_;
    std::string found;
    s->body = parse_body({"else", "endfor"}, found);
    --loop_depth_;
    if (found == "else") {
      expect_block_end();
      int saved = loop_depth_;
      loop_depth_ = 0;  // break/continue in a loop's else refer to an outer loop, which Jinja rejects too
      s->else_body = parse_body({"endfor"}, found);
      loop_depth_ = saved;
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set(int line) {
    std::string first = expect_name();
    if (accept_op(".")) {
      auto s = make(Stmt::Kind::set, line);
      s->targets.push_back(first);
      s->attr = expect_name();
      expect_op("=");
      s->expr = parse_tuple(false);
      expect_block_end();
      return s;
    }
    std::vector<std::string> targets{first};
    while (accept_op(",")) targets.push_back(expect_name());
    if (peek().kind == TK::block_end && targets.size() == 1) {
      auto s = make(Stmt::Kind::set_block, line);
      next();
      s->targets = std::move(targets);
      std::string found;
      s->body = parse_body({"endset"}, found);
      expect_block_end();
      return s;
    }
    if (is_op("|") && targets.size() == 1) raise(Errc::unsupported, line, "unsupported filtered block set");
    auto s = make(Stmt::Kind::set, line);
    s->targets = std::move(targets);
    expect_op("=");
    s->expr = parse_tuple(false);
    expect_block_end();
    return s;
  }

  StmtPtr parse_macro(int line) {
    auto s = make(Stmt::Kind::macro, line);
    s->name = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      s->params.push_back(expect_name());
      s->defaults.push_back(accept_op("=") ? parse_expression(true) : nullptr);
      if (!accept_op(",")) break;
    }
    expect_op(")");
    expect_block_end();
    int saved = loop_depth_;
    loop_depth_ = 0;
    std::string found;
    s->body = parse_body({"endmacro"}, found);
    loop_depth_ = saved;
    if (peek().kind == TK::name) next();  // {% endmacro name %}
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block(int line) {
    auto s = make(Stmt::Kind::filter_block, line);
    do {
      s->filters.push_back(parse_filter_call(nullptr));
    } while (accept_op("|"));
    expect_block_end();
    std::string found;
    s->body = parse_body({"endfilter"}, found);
    expect_block_end();
    return s;
  }

  // ---- expressions ---------------------------------------------------------------------------------------------
  ExprPtr node(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // `a, b` without brackets is a tuple (in {{ }}, if conditions and set values).
  ExprPtr parse_tuple(bool with_condexpr) {
    int line = peek().line;
    ExprPtr first = with_condexpr ? parse_expression(true) : parse_expression(true);
    if (!is_op(",")) return first;
    auto t = node(Expr::Kind::tuple, line);
    t->items.push_back(std::move(first));
    while (accept_op(",")) {
      if (peek().kind == TK::block_end || peek().kind == TK::var_end) break;
      t->items.push_back(parse_expression(true));
    }
    return t;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    enter();
    ExprPtr e = with_condexpr ? parse_condexpr() : parse_or();
    leave();
    return e;
  }

  ExprPtr parse_condexpr() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      int line = next().line;
      auto t = node(Expr::Kind::ternary, line);
      t->a = std::move(e);
      t->b = parse_or();
      if (accept_name("else")) t->c = parse_condexpr();
      e = std::move(t);
    }
    return e;
  }

  ExprPtr binary(std::string op, ExprPtr l, ExprPtr r, int line) {
    auto b = node(Expr::Kind::binary, line);
    b->name = std::move(op);
    b->a = std::move(l);
    b->b = std::move(r);
    return b;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      int line = next().line;
      e = binary("or", std::move(e), parse_and(), line);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      int line = next().line;
      e = binary("and", std::move(e), parse_not(), line);
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      int line = next().line;
      enter();
      auto u = node(Expr::Kind::unary, line);
      u->name = "not";
      u->a = parse_not();
      leave();
      return u;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    ExprPtr chain;          // Python chains `a < b < c` as `a < b and b < c`
    bool compared = false;  // e is this function's first comparison
    while (true) {
      int line = peek().line;
      std::string op;
      if (peek().kind == TK::op && (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">="))) {
        op = next().value;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "notin";
      } else {
        return chain ? std::move(chain) : std::move(e);
      }
      ExprPtr rhs = parse_math1();
      if (!chain && compared) {
        chain = node(Expr::Kind::chain, e->line);
        chain->a = std::move(e->a);
        chain->args.push_back(Arg{e->name, std::move(e->b)});
      }
      if (chain) {
        chain->args.push_back(Arg{op, std::move(rhs)});
      } else {
        e = binary(op, std::move(e), std::move(rhs), line);
        compared = true;
      }
    }
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      e = binary(t.value, std::move(e), parse_concat(), t.line);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      int line = next().line;
      e = binary("~", std::move(e), parse_math2(), line);
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      e = binary(t.value, std::move(e), parse_pow(), t.line);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      int line = next().line;
      e = binary("**", std::move(e), parse_unary(true), line);
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      enter();
      e = node(Expr::Kind::unary, t.line);
      e->name = t.value;
      e->a = parse_unary(false);
      leave();
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    int line = t.line;
    switch (t.kind) {
      case TK::name: {
        next();
        auto e = node(Expr::Kind::literal, line);
        if (t.value == "true" || t.value == "True") e->value = Value::boolean(true);
        else if (t.value == "false" || t.value == "False") e->value = Value::boolean(false);
        else if (t.value == "none" || t.value == "None") e->value = Value::none();
        else {
          e->kind = Expr::Kind::name;
          e->name = t.value;
        }
        return e;
      }
      case TK::string: {
        std::string s = next().value;
        while (peek().kind == TK::string) s += next().value;  // adjacent literals concatenate
        auto e = node(Expr::Kind::literal, line);
        e->value = Value::string(std::move(s), true);
        return e;
      }
      case TK::integer: {
        auto e = node(Expr::Kind::literal, line);
        e->value = Value::integer(next().i);
        return e;
      }
      case TK::floating: {
        auto e = node(Expr::Kind::literal, line);
        e->value = Value::floating(next().f);
        return e;
      }
      case TK::op:
        if (t.value == "(") {
          next();
          if (accept_op(")")) return node(Expr::Kind::tuple, line);
          enter();
          ExprPtr e = parse_expression(true);
          if (is_op(",")) {
            auto tup = node(Expr::Kind::tuple, line);
            tup->items.push_back(std::move(e));
            while (accept_op(",") && !is_op(")")) tup->items.push_back(parse_expression(true));
            e = std::move(tup);
          }
          expect_op(")");
          leave();
          return e;
        }
        if (t.value == "[") {
          next();
          enter();
          auto e = node(Expr::Kind::list, line);
          while (!is_op("]")) {
            e->items.push_back(parse_expression(true));
            if (!accept_op(",")) break;
          }
          expect_op("]");
          leave();
          return e;
        }
        if (t.value == "{") {
          next();
          enter();
          auto e = node(Expr::Kind::dict, line);
          while (!is_op("}")) {
            e->items.push_back(parse_expression(true));
            expect_op(":");
            e->items.push_back(parse_expression(true));
            if (!accept_op(",")) break;
          }
          expect_op("}");
          leave();
          return e;
        }
        break;
      default: break;
    }
    error("expected an expression");
  }

  void parse_args(std::vector<Arg>& args) {  // after '(' up to and including ')'
    while (!is_op(")")) {
      Arg a;
      if (peek().kind == TK::name && is_op("=", 1)) {
        a.name = next().value;
        next();
      } else if (is_op("*") || is_op("**")) {
        raise(Errc::unsupported, peek().line, "unsupported *args/**kwargs in call");
      }
      a.value = parse_expression(true);
      args.push_back(std::move(a));
      if (!accept_op(",")) break;
    }
    expect_op(")");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    int n = 0;
    while (true) {
      if (++n > kMaxNesting) raise(Errc::unsupported, peek().line, "expression nested too deeply");
      int line = peek().line;
      if (accept_op(".")) {
        auto a = node(Expr::Kind::attr, line);
        if (peek().kind == TK::integer) a->name = std::to_string(next().i);
        else a->name = expect_name();
        a->a = std::move(e);
        e = std::move(a);
      } else if (accept_op("[")) {
        enter();
        ExprPtr lo, hi, step;
        bool is_slice = false;
        if (!is_op(":")) lo = parse_expression(true);
        if (accept_op(":")) {
          is_slice = true;
          if (!is_op("]") && !is_op(":")) hi = parse_expression(true);
          if (accept_op(":") && !is_op("]")) step = parse_expression(true);
        }
        expect_op("]");
        leave();
        auto it = node(is_slice ? Expr::Kind::slice : Expr::Kind::item, line);
        it->a = std::move(e);
        it->b = std::move(lo);
        it->c = std::move(hi);
        it->d = std::move(step);
        if (!is_slice && !it->b) error("expected a subscript");
        e = std::move(it);
      } else if (accept_op("(")) {
        enter();
        auto c = node(Expr::Kind::call, line);
        c->a = std::move(e);
        parse_args(c->args);
        leave();
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filter_call(ExprPtr subject) {
    int line = peek().line;
    std::string name = expect_name();
    while (accept_op(".")) name += "." + expect_name();
    if (!is_filter(name)) raise(Errc::unsupported, line, "unsupported filter '" + name + "'");
    auto f = node(Expr::Kind::filter, line);
    f->name = name;
    f->a = std::move(subject);
    if (accept_op("(")) parse_args(f->args);
    return f;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    int n = 0;
    while (true) {
      if (++n > kMaxNesting) raise(Errc::unsupported, peek().line, "expression nested too deeply");
      if (accept_op("|")) {
        e = parse_filter_call(std::move(e));
      } else if (is_name("is")) {
        int line = next().line;
        auto t = node(Expr::Kind::test, line);
        t->negated = accept_name("not");
        t->name = expect_name();
        if (!is_test(t->name)) raise(Errc::unsupported, line, "unsupported test '" + t->name + "'");
        t->a = std::move(e);
        if (accept_op("(")) {
          parse_args(t->args);
        } else if (starts_test_arg()) {
          Arg a;
          a.value = parse_unary(false);
          t->args.push_back(std::move(a));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_postfix(std::move(e));
      } else {
        return e;
      }
    }
  }

  bool starts_test_arg() const {
    const Token& t = peek();
    if (t.kind == TK::string || t.kind == TK::integer || t.kind == TK::floating) return true;
    if (t.kind == TK::name) {
      static const std::set<std::string> stop = {"and", "or", "not", "in", "is", "if", "else"};
      return !stop.count(t.value);
    }
    return t.kind == TK::op && (t.value == "[" || t.value == "{" || t.value == "-");
  }

  std::vector<Token> t_;
  std::size_t p_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse_template(std::string_view source) { return Parser(lex(source)).parse_all(); }

}  // namespace tandem::gen::jinja
