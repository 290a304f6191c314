// Jinja engine, part 3 of 5: the syntax tree the parser builds and the evaluator walks. Nodes own their children;
// every node carries its template line for error messages.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "generation/jinja_value.h"

namespace tandem::gen::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Arg {
  std::string name;  // empty: positional
  ExprPtr value;
};

struct Expr {
  enum class Kind {
    literal,  // value
    name,     // name
    list,     // items
    tuple,    // items (evaluates to a list)
    dict,     // items: key0, value0, key1, value1, ...
    attr,     // a.name
    item,     // a[b]
    slice,    // a[b:c:d] — b, c, d may be null
    unary,    // name in {"-", "+", "not"} applied to a
    binary,   // a name b; name in {+ - * / // % ** ~ == != < > <= >= in notin and or}
    chain,    // a op1 x1 op2 x2 ...: a chained comparison (args[i].name = op, args[i].value = operand)
    ternary,  // a if b else c (c may be null: undefined)
    call,     // a(args)
    filter,   // a | name(args); a is null inside a {% filter %} block head
    test,     // a is [not] name(args)
  };
  Kind kind = Kind::literal;
  int line = 0;
  Value value;
  std::string name;
  std::vector<ExprPtr> items;
  ExprPtr a, b, c, d;
  std::vector<Arg> args;
  bool negated = false;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    text,          // text
    output,        // {{ expr }}
    if_,           // branches (cond null = else)
    for_,          // for targets in expr [if cond]: body [else else_body]
    set,           // set targets = expr, or set targets[0].attr = expr (attr non-empty)
    set_block,     // set targets[0] %}body{% endset
    macro,         // macro name(params = defaults): body
    filter_block,  // filter filters: body
    generation,    // HF's {% generation %}: renders its body
    break_,
    continue_,
  };
  Kind kind = Kind::text;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::string> targets;
  std::string attr;
  Body body, else_body;
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per param, null when none
  std::vector<ExprPtr> filters;   // filter nodes with a == null
};

}  // namespace tandem::gen::jinja
