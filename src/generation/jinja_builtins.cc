#include "generation/jinja_builtins.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>

namespace tandem::gen::jinja {

const Value* CallArgs::get(std::size_t index, std::string_view name) const {
  if (index < pos.size()) return &pos[index];
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

namespace {

const std::set<std::string, std::less<>>& filter_names() {
  static const std::set<std::string, std::less<>> names = {
      "trim", "length", "count", "upper", "lower", "capitalize", "title", "default", "d", "tojson", "join",
      "first", "last", "list", "items", "string", "int", "float", "replace", "selectattr", "rejectattr", "map",
      "select", "reject", "safe", "reverse", "abs", "unique"};
  return names;
}
const std::set<std::string, std::less<>>& test_names() {
  static const std::set<std::string, std::less<>> names = {
      "defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "number", "integer", "float",
      "boolean", "true", "false", "equalto", "eq", "==", "ne", "!=", "odd", "even", "divisibleby", "in",
      "callable", "lower", "upper", "gt", "lt", "ge", "le", "greaterthan", "lessthan", "sameas"};
  return names;
}

[[noreturn]] void type_error(const Env& env, std::string_view what, const Value& v) {
  raise(Errc::invalid_argument, env.line,
        std::string(what) + ": unexpected value of type '" + kind_name(v.kind) + "'");
}

// Python's float() accepts decimal forms only (strtod would also take hex like "0x1").
bool hex_float(const std::string& s) { return s.find_first_of("xXpP") != std::string::npos; }

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1f); }

Text as_text(const Value& v) { return to_text(v); }

void check_size(std::size_t n, const Env& env) {
  if (n > env.max_bytes) raise(Errc::invalid_argument, env.line, "string exceeds the output limit");
}

Text ascii_case(const Text& t, int mode) {  // 0 lower, 1 upper
  std::string b = t.str();
  for (char& c : b) {
    if (mode == 0 && c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (mode == 1 && c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return t.with_bytes(std::move(b));
}

bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || static_cast<unsigned char>(c) >= 0x80; }

// Python str.title(): a letter after a non-letter is upper-cased, other letters lower-cased (ASCII letters).
Text title_case(const Text& t, bool jinja_words) {
  std::string b = t.str();
  bool prev_letter = false;
  for (char& c : b) {
    bool boundary = jinja_words ? !prev_letter : !prev_letter;
    if (c >= 'a' && c <= 'z' && boundary) c = static_cast<char>(c - 'a' + 'A');
    else if (c >= 'A' && c <= 'Z' && !boundary) c = static_cast<char>(c - 'A' + 'a');
    if (jinja_words) prev_letter = !(is_ws(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<');
    else prev_letter = is_alpha(c);
  }
  return t.with_bytes(std::move(b));
}

Text capitalize(const Text& t) {
  std::string b = t.str();
  for (std::size_t k = 0; k < b.size(); ++k) {
    char& c = b[k];
    if (k == 0 && c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    else if (k > 0 && c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return t.with_bytes(std::move(b));
}

Text replace_text(const Text& t, const std::string& old, const Text& with, std::int64_t count, const Env& env) {
  const std::string& b = t.str();
  Text out;
  std::size_t pos = 0;
  std::int64_t done = 0;
  if (old.empty()) {  // Python inserts `with` between every code point
    auto offs = utf8_offsets(b);
    for (std::size_t k = 0; k + 1 < offs.size(); ++k) {
      if (count < 0 || done < count) {
        out.append(with);
        ++done;
      }
      out.append(t.substr(offs[k], offs[k + 1] - offs[k]));
      check_size(out.size(), env);
    }
    if (count < 0 || done < count) out.append(with);
    return out;
  }
  while (count < 0 || done < count) {
    std::size_t at = b.find(old, pos);
    if (at == std::string::npos) break;
    out.append(t.substr(pos, at - pos));
    out.append(with);
    check_size(out.size(), env);
    pos = at + old.size();
    ++done;
  }
  out.append(t.substr(pos));
  check_size(out.size(), env);
  return out;
}

Value attribute_of(const Value& v, const std::string& path) {
  Value cur = v;
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const Value* next = cur.find(part);
    if (!next) {
      if (cur.is_list()) {
        char* end = nullptr;
        long long idx = std::strtoll(part.c_str(), &end, 10);
        if (!part.empty() && end && *end == '\0' && idx >= 0 && static_cast<std::size_t>(idx) < cur.list->size()) {
          cur = (*cur.list)[static_cast<std::size_t>(idx)];
          goto advanced;
        }
      }
      return Value::undefined(part);
    }
    cur = *next;
  advanced:
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

Value join(const Value& v, const CallArgs& args, const Env& env) {
  const Value* sep = args.get(0, "d");
  const Value* attr = args.get(1, "attribute");
  Text s = sep ? as_text(*sep) : Text();
  Text out;
  bool first = true;
  for (const Value& item : iterate(v, env.line)) {
    if (!first) out.append(s);
    first = false;
    out.append(as_text(attr ? attribute_of(item, as_text(*attr).str()) : item));
    check_size(out.size(), env);
  }
  return Value::string(std::move(out));
}

Value select_filter(std::string_view name, const Value& v, const CallArgs& args, const Env& env) {
  bool by_attr = name == "selectattr" || name == "rejectattr";
  bool keep_if = name == "selectattr" || name == "select";
  std::size_t first_test_arg = by_attr ? 1 : 0;
  std::string attr;
  if (by_attr) {
    if (args.pos.empty()) raise(Errc::invalid_argument, env.line, std::string(name) + ": missing attribute");
    attr = as_text(args.pos[0]).str();
  }
  std::string test;
  CallArgs test_args;
  if (args.pos.size() > first_test_arg) {
    test = as_text(args.pos[first_test_arg]).str();
    if (!is_test(test)) raise(Errc::unsupported, env.line, "unsupported test '" + test + "'");
    test_args.pos.assign(args.pos.begin() + static_cast<std::ptrdiff_t>(first_test_arg) + 1, args.pos.end());
  }
  List out;
  for (const Value& item : iterate(v, env.line)) {
    Value subject = by_attr ? attribute_of(item, attr) : item;
    bool ok = test.empty() ? truthy(subject) : apply_test(test, subject, test_args, env);
    if (ok == keep_if) out.push_back(item);
  }
  return Value::make_list(std::move(out));
}

Value map_filter(const Value& v, const CallArgs& args, const Env& env) {
  List out;
  const Value* attr = nullptr;
  for (const auto& [k, x] : args.kw)
    if (k == "attribute") attr = &x;
  if (attr) {
    const Value* dflt = nullptr;
    for (const auto& [k, x] : args.kw)
      if (k == "default") dflt = &x;
    for (const Value& item : iterate(v, env.line)) {
      Value got = attribute_of(item, as_text(*attr).str());
      out.push_back(got.is_undefined() && dflt ? *dflt : got);
    }
    return Value::make_list(std::move(out));
  }
  if (args.pos.empty()) raise(Errc::invalid_argument, env.line, "map: needs a filter name or attribute=");
  std::string filter = as_text(args.pos[0]).str();
  if (!is_filter(filter) || filter == "map") raise(Errc::unsupported, env.line, "unsupported filter '" + filter + "'");
  CallArgs rest;
  rest.pos.assign(args.pos.begin() + 1, args.pos.end());
  rest.kw = args.kw;
  for (const Value& item : iterate(v, env.line)) out.push_back(apply_filter(filter, item, rest, env));
  return Value::make_list(std::move(out));
}

std::int64_t int_arg(const Value* v, std::int64_t dflt, const Env& env, const char* what) {
  if (!v || v->is_none()) return dflt;
  if (v->kind == Value::Kind::integer) return v->i;
  if (v->kind == Value::Kind::boolean) return v->b ? 1 : 0;
  type_error(env, what, *v);
}

Value to_int(const Value& v, const CallArgs& args) {
  const Value* dflt = args.get(0, "default");
  Value fallback = dflt ? *dflt : Value::integer(0);
  switch (v.kind) {
    case Value::Kind::integer: return v;
    case Value::Kind::boolean: return Value::integer(v.b ? 1 : 0);
    case Value::Kind::floating:
      if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return fallback;
      return Value::integer(static_cast<std::int64_t>(v.f));
    case Value::Kind::string: {
      std::string s = v.s.str();
      std::size_t a = 0, b = s.size();
      while (a < b && is_ws(s[a])) ++a;
      while (b > a && is_ws(s[b - 1])) --b;
      s = s.substr(a, b - a);
      if (s.empty()) return fallback;
      errno = 0;
      char* end = nullptr;
      long long i = std::strtoll(s.c_str(), &end, 10);
      if (errno == 0 && end && *end == '\0') return Value::integer(i);
      if (hex_float(s)) return fallback;
      double d = std::strtod(s.c_str(), &end);  // Jinja falls back to int(float(s))
      if (end && *end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value::integer(static_cast<std::int64_t>(d));
      return fallback;
    }
    default: return fallback;
  }
}

Value to_float(const Value& v, const CallArgs& args) {
  const Value* dflt = args.get(0, "default");
  Value fallback = dflt ? *dflt : Value::floating(0.0);
  switch (v.kind) {
    case Value::Kind::integer: return Value::floating(static_cast<double>(v.i));
    case Value::Kind::boolean: return Value::floating(v.b ? 1.0 : 0.0);
    case Value::Kind::floating: return v;
    case Value::Kind::string: {
      std::string s = strip_text(v.s, true, true, nullptr).str();
      if (hex_float(s)) return fallback;
      char* end = nullptr;
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == '\0') return Value::floating(d);
      return fallback;
    }
    default: return fallback;
  }
}

List split_text(const Text& t, const Value* sep, std::int64_t maxsplit, const Env& env) {
  const std::string& b = t.str();
  List out;
  auto push = [&](std::size_t a, std::size_t n) {
    if (out.size() >= env.max_items) raise(Errc::invalid_argument, env.line, "split: too many parts");
    out.push_back(Value::string(t.substr(a, n)));
  };
  if (!sep || sep->is_none()) {  // runs of whitespace, no empty parts
    std::size_t k = 0;
    std::int64_t splits = 0;
    while (k < b.size()) {
      while (k < b.size() && is_ws(b[k])) ++k;
      if (k >= b.size()) break;
      if (maxsplit >= 0 && splits >= maxsplit) {
        std::size_t end = b.size();
        while (end > k && is_ws(b[end - 1])) --end;
        push(k, end - k);
        break;
      }
      std::size_t start = k;
      while (k < b.size() && !is_ws(b[k])) ++k;
      push(start, k - start);
      ++splits;
    }
    return out;
  }
  std::string s = as_text(*sep).str();
  if (s.empty()) raise(Errc::invalid_argument, env.line, "split: empty separator");
  std::size_t pos = 0;
  std::int64_t splits = 0;
  while (maxsplit < 0 || splits < maxsplit) {
    std::size_t at = b.find(s, pos);
    if (at == std::string::npos) break;
    push(pos, at - pos);
    pos = at + s.size();
    ++splits;
  }
  push(pos, b.size() - pos);
  return out;
}

bool affix_match(const std::string& s, const Value& arg, bool prefix) {
  auto one = [&](const std::string& a) {
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (arg.is_list()) {
    for (const Value& x : *arg.list)
      if (x.is_string() && one(x.s.str())) return true;
    return false;
  }
  return arg.is_string() && one(arg.s.str());
}

}  // namespace

Text strip_text(const Text& t, bool left, bool right, const std::string* chars) {
  const std::string& b = t.str();
  auto strip = [&](char c) { return chars ? chars->find(c) != std::string::npos : is_ws(c); };
  std::size_t a = 0, e = b.size();
  if (left)
    while (a < e && strip(b[a])) ++a;
  if (right)
    while (e > a && strip(b[e - 1])) --e;
  return t.substr(a, e - a);
}

bool is_filter(std::string_view name) { return filter_names().count(name) > 0; }
bool is_test(std::string_view name) { return test_names().count(name) > 0; }

Value apply_filter(std::string_view name, const Value& v, const CallArgs& args, const Env& env) {
  if (name == "default" || name == "d") {
    const Value* dflt = args.get(0, "default_value");
    const Value* boolean = args.get(1, "boolean");
    bool use = v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v));
    return use ? (dflt ? *dflt : Value::string("", true)) : v;
  }
  if (name == "safe") return v.is_string() ? v : Value::string(as_text(v));  // Markup(str(value))
  if (name == "trim") {
    const Value* chars = args.get(0, "chars");
    std::string cs = chars && !chars->is_none() ? as_text(*chars).str() : std::string();
    return Value::string(strip_text(as_text(v), true, true, chars && !chars->is_none() ? &cs : nullptr));
  }
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value::integer(static_cast<std::int64_t>(utf8_length(v.s.str())));
    if (v.is_list()) return Value::integer(static_cast<std::int64_t>(v.list->size()));
    if (v.is_mapping()) return Value::integer(static_cast<std::int64_t>(v.dict->size()));
    if (v.is_undefined()) return Value::integer(0);
    type_error(env, "length", v);
  }
  if (name == "upper") return Value::string(ascii_case(as_text(v), 1));
  if (name == "lower") return Value::string(ascii_case(as_text(v), 0));
  if (name == "capitalize") return Value::string(capitalize(as_text(v)));
  if (name == "title") return Value::string(title_case(as_text(v), true));
  if (name == "string") return Value::string(as_text(v));
  if (name == "tojson") {
    const Value* indent = args.get(0, "indent");
    const Value* sort = args.get(3, "sort_keys");
    for (const auto& [k, x] : args.kw)
      if (k == "separators" && !x.is_none()) raise(Errc::unsupported, env.line, "unsupported tojson(separators=...)");
    std::int64_t ind = int_arg(indent, -1, env, "tojson indent");
    if (ind > 64) raise(Errc::unsupported, env.line, "tojson indent too large");
    Text out = to_json(v, static_cast<int>(ind), sort && truthy(*sort), env.line);
    check_size(out.size(), env);
    return Value::string(std::move(out));
  }
  if (name == "join") return join(v, args, env);
  if (name == "first" || name == "last") {
    List items = iterate(v, env.line);
    if (items.empty()) return Value::undefined(std::string(name));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::make_list(iterate(v, env.line));
  if (name == "items") {
    if (v.is_undefined()) return Value::make_list({});
    if (!v.is_mapping()) type_error(env, "items", v);
    List out;
    for (const auto& [k, x] : *v.dict) out.push_back(Value::make_list({Value::string(k), x}));
    return Value::make_list(std::move(out));
  }
  if ((name == "int" || name == "float") && v.is_undefined())  // jinja2's Undefined refuses int()/float()
    raise(Errc::invalid_argument, env.line, "'" + (v.name.empty() ? std::string("value") : v.name) + "' is undefined");
  if (name == "int") return to_int(v, args);
  if (name == "float") return to_float(v, args);
  if (name == "abs") {
    if (v.kind == Value::Kind::integer) {
      if (v.i == INT64_MIN) raise(Errc::invalid_argument, env.line, "integer overflow");
      return Value::integer(v.i < 0 ? -v.i : v.i);
    }
    if (v.kind == Value::Kind::floating) return Value::floating(std::fabs(v.f));
    if (v.kind == Value::Kind::boolean) return Value::integer(v.b ? 1 : 0);
    type_error(env, "abs", v);
  }
  if (name == "replace") {
    const Value* old = args.get(0, "old");
    const Value* with = args.get(1, "new");
    const Value* count = args.get(2, "count");
    if (!old || !with) raise(Errc::invalid_argument, env.line, "replace: needs old and new");
    return Value::string(replace_text(as_text(v), as_text(*old).str(), as_text(*with), int_arg(count, -1, env, "replace count"), env));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      auto offs = utf8_offsets(v.s.str());
      Text out;
      for (std::size_t k = offs.size() - 1; k > 0; --k) out.append(v.s.substr(offs[k - 1], offs[k] - offs[k - 1]));
      return Value::string(std::move(out));
    }
    List items = iterate(v, env.line);
    std::reverse(items.begin(), items.end());
    return Value::make_list(std::move(items));
  }
  if (name == "unique") {
    List out;
    for (const Value& x : iterate(v, env.line)) {
      bool seen = false;
      for (const Value& y : out) seen = seen || equals(x, y);
      if (!seen) out.push_back(x);
    }
    return Value::make_list(std::move(out));
  }
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject")
    return select_filter(name, v, args, env);
  if (name == "map") return map_filter(v, args, env);
  raise(Errc::unsupported, env.line, "unsupported filter '" + std::string(name) + "'");
}

bool apply_test(std::string_view name, const Value& v, const CallArgs& args, const Env& env) {
  const Value* arg = args.get(0, "value");
  auto need_arg = [&]() -> const Value& {
    if (!arg) raise(Errc::invalid_argument, env.line, "test '" + std::string(name) + "' needs an argument");
    return *arg;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_mapping();
  if (name == "iterable") return v.is_list() || v.is_string() || v.is_mapping() || v.is_undefined();
  if (name == "sequence") return v.is_list() || v.is_string() || v.is_mapping() || v.is_undefined();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == Value::Kind::integer;
  if (name == "float") return v.kind == Value::Kind::floating;
  if (name == "boolean") return v.kind == Value::Kind::boolean;
  if (name == "true") return v.kind == Value::Kind::boolean && v.b;
  if (name == "false") return v.kind == Value::Kind::boolean && !v.b;
  if (name == "callable") return v.kind == Value::Kind::function;
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") return equals(v, need_arg());
  if (name == "ne" || name == "!=") return !equals(v, need_arg());
  if (name == "gt" || name == "greaterthan") return compare(v, need_arg(), env.line) > 0;
  if (name == "lt" || name == "lessthan") return compare(v, need_arg(), env.line) < 0;
  if (name == "ge") return compare(v, need_arg(), env.line) >= 0;
  if (name == "le") return compare(v, need_arg(), env.line) <= 0;
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.kind == Value::Kind::floating) {
      if (!std::isfinite(v.f)) return false;
      double d = name == "divisibleby" ? static_cast<double>(int_arg(&need_arg(), 0, env, "divisibleby")) : 2.0;
      if (d == 0) raise(Errc::invalid_argument, env.line, "divisibleby 0");
      double m = std::fmod(v.f, d);
      return name == "odd" ? m != 0 : m == 0;
    }
    if (v.kind != Value::Kind::integer && v.kind != Value::Kind::boolean) type_error(env, name, v);
    const std::int64_t i = v.kind == Value::Kind::boolean ? v.b : v.i;  // a Python bool is an int
    if (name == "odd") return i % 2 != 0;
    if (name == "even") return i % 2 == 0;
    std::int64_t d = int_arg(&need_arg(), 0, env, "divisibleby");
    if (d == 0) raise(Errc::invalid_argument, env.line, "divisibleby 0");
    if (d == -1) return true;
    return i % d == 0;
  }
  if (name == "in") {
    const Value& c = need_arg();
    if (c.is_string() && v.is_string()) return c.s.str().find(v.s.str()) != std::string::npos;
    if (c.is_list()) return std::any_of(c.list->begin(), c.list->end(), [&](const Value& x) { return equals(x, v); });
    if (c.is_mapping()) return v.is_string() && c.find(v.s.str()) != nullptr;
    type_error(env, "in", c);
  }
  if (name == "lower" || name == "upper") {  // str(value).islower() / .isupper()
    bool any = false;
    const Text printed = to_text(v);  // named: a range-for over a temporary's str() would dangle
    for (char c : printed.str()) {
      if (name == "lower" && c >= 'A' && c <= 'Z') return false;
      if (name == "upper" && c >= 'a' && c <= 'z') return false;
      any = any || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    }
    return any;
  }
  raise(Errc::unsupported, env.line, "unsupported test '" + std::string(name) + "'");
}

Value call_method(const Value& obj, std::string_view name, const CallArgs& args, const Env& env) {
  if (obj.is_string()) {
    const Text& t = obj.s;
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const Value* chars = args.get(0, "chars");
      std::string cs = chars && !chars->is_none() ? as_text(*chars).str() : std::string();
      return Value::string(strip_text(t, name != "rstrip", name != "lstrip", chars && !chars->is_none() ? &cs : nullptr));
    }
    if (name == "upper") return Value::string(ascii_case(t, 1));
    if (name == "lower") return Value::string(ascii_case(t, 0));
    if (name == "title") return Value::string(title_case(t, false));
    if (name == "capitalize") return Value::string(capitalize(t));
    if (name == "startswith" || name == "endswith") {
      const Value* a = args.get(0, "prefix");
      if (!a) raise(Errc::invalid_argument, env.line, std::string(name) + ": needs an argument");
      return Value::boolean(affix_match(t.str(), *a, name == "startswith"));
    }
    if (name == "split" || name == "rsplit") {
      if (name == "rsplit" && args.get(1, "maxsplit")) raise(Errc::unsupported, env.line, "unsupported rsplit(maxsplit)");
      return Value::make_list(split_text(t, args.get(0, "sep"), int_arg(args.get(1, "maxsplit"), -1, env, "maxsplit"), env));
    }
    if (name == "replace") {
      const Value* old = args.get(0, "old");
      const Value* with = args.get(1, "new");
      if (!old || !with) raise(Errc::invalid_argument, env.line, "replace: needs old and new");
      return Value::string(replace_text(t, as_text(*old).str(), as_text(*with), int_arg(args.get(2, "count"), -1, env, "count"), env));
    }
    if (name == "find") {
      const Value* a = args.get(0, "sub");
      if (!a || !a->is_string()) raise(Errc::invalid_argument, env.line, "find: needs a string");
      std::size_t at = t.str().find(a->s.str());
      if (at == std::string::npos) return Value::integer(-1);
      return Value::integer(static_cast<std::int64_t>(utf8_length(std::string_view(t.str()).substr(0, at))));
    }
    if (name == "join") {
      CallArgs j;
      j.pos.push_back(obj);
      if (args.pos.empty()) raise(Errc::invalid_argument, env.line, "join: needs an iterable");
      return join(args.pos[0], j, env);
    }
  }
  if (obj.is_mapping()) {
    if (name == "items") return apply_filter("items", obj, CallArgs{}, env);
    if (name == "keys") return Value::make_list(iterate(obj.kind == Value::Kind::ns ? Value::make_dict(*obj.dict) : obj, env.line));
    if (name == "values") {
      List out;
      for (const auto& e : *obj.dict) out.push_back(e.second);
      return Value::make_list(std::move(out));
    }
    if (name == "get") {
      const Value* key = args.get(0, "key");
      const Value* dflt = args.get(1, "default");
      if (!key) raise(Errc::invalid_argument, env.line, "get: needs a key");
      const Value* found = key->is_string() ? obj.find(key->s.str()) : nullptr;
      return found ? *found : (dflt ? *dflt : Value::none());
    }
  }
  if (obj.is_undefined())
    raise(Errc::invalid_argument, env.line, "'" + (obj.name.empty() ? std::string("value") : obj.name) + "' is undefined (calling ." + std::string(name) + "())");
  raise(Errc::unsupported, env.line, std::string("unsupported method '") + kind_name(obj.kind) + "." + std::string(name) + "'");
}

}  // namespace tandem::gen::jinja
