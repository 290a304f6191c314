// Jinja engine, part 2 of 5: values (Python-like: undefined, none, bool, int, float, str, list, dict, namespace,
// callable) with Python's truthiness, equality, ordering, str()/repr() and json.dumps() — each producing Text so
// trust flags survive. Errors inside the engine are thrown as jinja::Error and turned into Result at the edge
// (ChatTemplate::parse/render); nothing escapes the engine as an exception.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/result.h"
#include "generation/jinja_text.h"

namespace tandem::gen::jinja {

// Thrown inside the engine only; `line` is the template line (0 = unknown). Caught in chat_template.cc.
struct Error {
  Errc code = Errc::invalid_argument;
  int line = 0;
  std::string message;
};
[[noreturn]] void raise(Errc code, int line, std::string message);

struct Stmt;
struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<Text, Value>>;  // insertion-ordered, keys unique by bytes

inline constexpr int kMaxValueDepth = 64;

enum class Builtin { none, range, namespace_, raise_exception, strftime_now, dict };

struct Value {
  enum class Kind { undefined, none, boolean, integer, floating, string, list, dict, ns, function };
  Kind kind = Kind::undefined;
  bool b = false;
  std::int64_t i = 0;
  double f = 0;
  Text s;
  std::shared_ptr<const List> list;
  std::shared_ptr<Dict> dict;  // dict (never mutated after construction) or namespace (mutable by `set ns.x`)
  const Stmt* macro = nullptr;  // function: a macro (else a builtin)
  Builtin builtin = Builtin::none;
  std::string name;  // undefined: the missing name (for messages); function: its name
  int depth = 0;     // container nesting (0 for scalars); bounded by kMaxValueDepth so recursion stays shallow

  static Value undefined(std::string name = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(std::int64_t v);
  static Value floating(double v);
  static Value string(Text t);
  static Value string(std::string s, bool trusted);
  static Value make_list(List items);
  static Value make_dict(Dict items);
  static Value make_namespace(Dict items);

  bool is_undefined() const { return kind == Kind::undefined; }
  bool is_none() const { return kind == Kind::none; }
  bool is_string() const { return kind == Kind::string; }
  bool is_list() const { return kind == Kind::list; }
  bool is_mapping() const { return kind == Kind::dict || kind == Kind::ns; }
  bool is_number() const { return kind == Kind::integer || kind == Kind::floating || kind == Kind::boolean; }

  // Dict/namespace lookup by key bytes; nullptr when absent or not a mapping.
  const Value* find(std::string_view key) const;
};

const char* kind_name(Value::Kind k);
bool truthy(const Value& v);
bool equals(const Value& a, const Value& b);
// <0, 0, >0; throws for types Python cannot order.
int compare(const Value& a, const Value& b, int line);
// Python str(): what `{{ v }}` prints. Undefined prints as nothing. Numbers/bools/None are trusted text.
Text to_text(const Value& v);
// Python repr() (for str() of containers).
Text repr(const Value& v);
// Python json.dumps(v, ensure_ascii=False, indent=indent<0 ? None : indent, sort_keys) as HF's tojson does.
Text to_json(const Value& v, int indent, bool sort_keys, int line);
// Python float repr: shortest round-trip digits, "1.0", "1e+16", "inf", "nan".
std::string format_float(double d);
// Items as iterated by `for x in v` (code points of a string, keys of a dict; undefined → empty).
List iterate(const Value& v, int line);

}  // namespace tandem::gen::jinja
