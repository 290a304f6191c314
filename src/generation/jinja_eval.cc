#include "generation/jinja_eval.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <optional>
#include <vector>

#include "generation/jinja_builtins.h"

namespace tandem::gen::jinja {

namespace {

enum class Flow { normal, break_, continue_ };

Value builtin_fn(Builtin b, const char* name) {
  Value v;
  v.kind = Value::Kind::function;
  v.builtin = b;
  v.name = name;
  return v;
}

class Evaluator {
 public:
  Evaluator(const Limits& limits, const std::function<std::time_t()>& clock) : limits_(limits), clock_(clock) {}

  Text run(const Body& body, const std::map<std::string, Value>& globals) {
    frames_.emplace_back();
    auto& root = frames_.back();
    root["range"] = builtin_fn(Builtin::range, "range");
    root["namespace"] = builtin_fn(Builtin::namespace_, "namespace");
    root["dict"] = builtin_fn(Builtin::dict, "dict");
    root["raise_exception"] = builtin_fn(Builtin::raise_exception, "raise_exception");
    root["strftime_now"] = builtin_fn(Builtin::strftime_now, "strftime_now");
    for (const auto& [k, v] : globals) root[k] = v;
    Text out;
    exec(body, out);
    return out;
  }

 private:
  using Frame = std::map<std::string, Value>;

  Env env(int line) const { return Env{limits_.max_output_bytes, limits_.max_items, line}; }

  void tick(int line) {
    if (++steps_ > limits_.max_steps)
      raise(Errc::invalid_argument, line, "template exceeded its evaluation budget (" + std::to_string(limits_.max_steps) + " steps)");
  }

  void write(Text& out, const Text& t, int line) {
    if (out.size() + t.size() > limits_.max_output_bytes)
      raise(Errc::invalid_argument, line, "output exceeds " + std::to_string(limits_.max_output_bytes) + " bytes");
    out.append(t);
  }

  // ---- variables ---------------------------------------------------------------------------------------------
  Value lookup(const std::string& name) const {
    for (std::size_t k = frames_.size(); k-- > base_;) {
      auto it = frames_[k].find(name);
      if (it != frames_[k].end()) return it->second;
    }
    if (base_ > 0) {
      auto it = frames_[0].find(name);
      if (it != frames_[0].end()) return it->second;
    }
    return Value::undefined(name);
  }
  void assign(const std::string& name, Value v) { frames_.back()[name] = std::move(v); }

  // ---- statements ------------------------------------------------------------------------------------------
  Flow exec(const Body& body, Text& out) {
    for (const StmtPtr& s : body) {
      Flow f = exec(*s, out);
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

  Flow exec(const Stmt& s, Text& out) {
    tick(s.line);
    switch (s.kind) {
      case Stmt::Kind::text: write(out, Text(s.text, true), s.line); return Flow::normal;
      case Stmt::Kind::output: write(out, to_text(eval(*s.expr)), s.line); return Flow::normal;
      case Stmt::Kind::if_:
        for (const auto& [cond, body] : s.branches)
          if (!cond || truthy(eval(*cond))) return exec(body, out);
        return Flow::normal;
      case Stmt::Kind::for_: exec_for(s, out); return Flow::normal;
      case Stmt::Kind::set: exec_set(s); return Flow::normal;
      case Stmt::Kind::set_block: {
        Text captured;
        exec(s.body, captured);
        assign(s.targets[0], Value::string(std::move(captured)));
        return Flow::normal;
      }
      case Stmt::Kind::macro: {
        Value m;
        m.kind = Value::Kind::function;
        m.macro = &s;
        m.name = s.name;
        assign(s.name, m);
        return Flow::normal;
      }
      case Stmt::Kind::filter_block: {
        Text captured;
        exec(s.body, captured);
        Value v = Value::string(std::move(captured));
        for (const ExprPtr& f : s.filters) v = apply(*f, v);
        write(out, to_text(v), s.line);
        return Flow::normal;
      }
      case Stmt::Kind::generation: return exec(s.body, out);
      case Stmt::Kind::break_: return Flow::break_;
      case Stmt::Kind::continue_: return Flow::continue_;
    }
    return Flow::normal;
  }

  void bind_targets(const std::vector<std::string>& targets, const Value& item, int line) {
    if (targets.size() == 1) {
      assign(targets[0], item);
      return;
    }
    List parts = iterate(item, line);
    if (parts.size() != targets.size())
      raise(Errc::invalid_argument, line, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                                              std::to_string(targets.size()) + " names");
    for (std::size_t k = 0; k < targets.size(); ++k) assign(targets[k], parts[k]);
  }

  void exec_for(const Stmt& s, Text& out) {
    Value seq = eval(*s.expr);  // a list is iterated in place (it is immutable); others are expanded first
    std::shared_ptr<const List> held = seq.is_list() ? seq.list : std::make_shared<const List>(iterate(seq, s.line));
    frames_.emplace_back();
    if (s.cond) {
      List kept;
      for (const Value& item : *held) {
        tick(s.line);
        bind_targets(s.targets, item, s.line);
        if (truthy(eval(*s.cond))) kept.push_back(item);
      }
      held = std::make_shared<const List>(std::move(kept));
    }
    const List& items = *held;
    const auto n = static_cast<std::int64_t>(items.size());
    // The `loop` dict is built once and updated in place while nobody else holds it (cheap per iteration).
    static const char* const kKeys[] = {"index", "index0", "revindex", "revindex0", "first", "last",
                                        "length", "depth", "depth0", "previtem", "nextitem"};
    Value loop;
    for (std::int64_t k = 0; k < n; ++k) {
      tick(s.line);
      const Value& item = items[static_cast<std::size_t>(k)];
      if (!loop.dict || loop.dict.use_count() > 2) {  // held by `loop` here and the frame only
        Dict fresh;
        for (const char* key : kKeys) fresh.emplace_back(Text(key, true), Value());
        loop = Value::make_dict(std::move(fresh));
      }
      Dict& d = *loop.dict;
      d[0].second = Value::integer(k + 1);
      d[1].second = Value::integer(k);
      d[2].second = Value::integer(n - k);
      d[3].second = Value::integer(n - k - 1);
      d[4].second = Value::boolean(k == 0);
      d[5].second = Value::boolean(k == n - 1);
      d[6].second = Value::integer(n);
      d[7].second = Value::integer(1);
      d[8].second = Value::integer(0);
      d[9].second = k > 0 ? items[static_cast<std::size_t>(k - 1)] : Value::undefined("previtem");
      d[10].second = k + 1 < n ? items[static_cast<std::size_t>(k + 1)] : Value::undefined("nextitem");
      loop.depth = std::max({1, d[9].second.depth + 1, d[10].second.depth + 1});
      assign("loop", loop);
      bind_targets(s.targets, item, s.line);
      if (exec(s.body, out) == Flow::break_) break;
    }
    frames_.pop_back();
    if (items.empty()) exec(s.else_body, out);
  }

  static bool holds_namespace(const Value& v) {
    if (v.kind == Value::Kind::ns) return true;
    if (v.is_list())
      for (const Value& x : *v.list)
        if (holds_namespace(x)) return true;
    if (v.kind == Value::Kind::dict)
      for (const auto& e : *v.dict)
        if (holds_namespace(e.second)) return true;
    return false;
  }

  void exec_set(const Stmt& s) {
    Value v = eval(*s.expr);
    if (!s.attr.empty()) {
      // A namespace holding a namespace could form a cycle (a leak, and endless recursion in tojson/repr).
      if (holds_namespace(v)) raise(Errc::unsupported, s.line, "unsupported: storing a namespace inside a namespace");
      Value ns = lookup(s.targets[0]);
      if (ns.kind != Value::Kind::ns)
        raise(Errc::invalid_argument, s.line, "cannot assign attribute '" + s.attr + "' of non-namespace '" + s.targets[0] + "'");
      for (auto& [k, x] : *ns.dict)
        if (k.str() == s.attr) {
          x = std::move(v);
          return;
        }
      if (ns.dict->size() >= limits_.max_items) raise(Errc::invalid_argument, s.line, "namespace too large");
      ns.dict->emplace_back(Text(s.attr, true), std::move(v));
      return;
    }
    bind_targets(s.targets, v, s.line);
  }

  // ---- expressions -----------------------------------------------------------------------------------------
  CallArgs eval_args(const std::vector<Arg>& args) {
    CallArgs out;
    for (const Arg& a : args) {
      if (a.name.empty()) out.pos.push_back(eval(*a.value));
      else out.kw.emplace_back(a.name, eval(*a.value));
    }
    return out;
  }

  Value apply(const Expr& f, const Value& subject) {
    CallArgs args = eval_args(f.args);
    return apply_filter(f.name, subject, args, env(f.line));
  }

  [[noreturn]] void undefined_error(const Value& v, int line, const std::string& what) {
    raise(Errc::invalid_argument, line, "'" + (v.name.empty() ? std::string("value") : v.name) + "' is undefined" +
                                            (what.empty() ? "" : " (" + what + ")"));
  }

  Value eval(const Expr& e) {
    tick(e.line);
    switch (e.kind) {
      case Expr::Kind::literal: return e.value;
      case Expr::Kind::name: return lookup(e.name);
      case Expr::Kind::list:
      case Expr::Kind::tuple: {
        List items;
        for (const ExprPtr& x : e.items) items.push_back(eval(*x));
        return Value::make_list(std::move(items));
      }
      case Expr::Kind::dict: {
        Dict d;
        for (std::size_t k = 0; k + 1 < e.items.size(); k += 2) {
          Value key = eval(*e.items[k]);
          if (!key.is_string()) raise(Errc::unsupported, e.line, "unsupported non-string dict key");
          Value val = eval(*e.items[k + 1]);
          bool replaced = false;
          for (auto& [dk, dv] : d)
            if (dk.str() == key.s.str()) {
              dv = val;
              replaced = true;
            }
          if (!replaced) d.emplace_back(key.s, std::move(val));
        }
        return Value::make_dict(std::move(d));
      }
      case Expr::Kind::attr: return get_attr(eval(*e.a), e.name, e.line);
      case Expr::Kind::item: return get_item(eval(*e.a), eval(*e.b), e.line);
      case Expr::Kind::slice: return slice(e);
      case Expr::Kind::unary: return unary(e);
      case Expr::Kind::binary: return binary(e);
      case Expr::Kind::chain: {
        Value left = eval(*e.a);
        for (const Arg& step : e.args) {
          Value right = eval(*step.value);
          if (!truthy(compare_op(step.name, left, right, e.line))) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::ternary:
        if (truthy(eval(*e.b))) return eval(*e.a);
        return e.c ? eval(*e.c) : Value::undefined();
      case Expr::Kind::call: return call(e);
      case Expr::Kind::filter: return apply(e, eval(*e.a));
      case Expr::Kind::test: {
        Value v = eval(*e.a);
        CallArgs args = eval_args(e.args);
        bool r = apply_test(e.name, v, args, env(e.line));
        return Value::boolean(e.negated ? !r : r);
      }
    }
    return Value::undefined();
  }

  Value get_attr(const Value& obj, const std::string& name, int line) {
    if (obj.is_undefined()) undefined_error(obj, line, "reading ." + name);
    if (obj.is_mapping()) {
      const Value* v = obj.find(name);
      return v ? *v : Value::undefined(name);
    }
    if (obj.is_list() && !name.empty() && name.find_first_not_of("0123456789") == std::string::npos && name.size() < 10) {
      std::size_t idx = static_cast<std::size_t>(std::stoll(name));
      return idx < obj.list->size() ? (*obj.list)[idx] : Value::undefined(name);
    }
    return Value::undefined(name);
  }

  Value get_item(const Value& obj, const Value& key, int line) {
    if (obj.is_undefined()) undefined_error(obj, line, "subscripting it");
    if (obj.is_mapping()) {
      if (!key.is_string()) return Value::undefined();
      const Value* v = obj.find(key.s.str());
      return v ? *v : Value::undefined(key.s.str());
    }
    if ((obj.is_list() || obj.is_string()) && (key.kind == Value::Kind::integer || key.kind == Value::Kind::boolean)) {
      std::int64_t i = key.kind == Value::Kind::boolean ? key.b : key.i;
      if (obj.is_list()) {
        auto n = static_cast<std::int64_t>(obj.list->size());
        if (i < 0) i += n;
        return (i >= 0 && i < n) ? (*obj.list)[static_cast<std::size_t>(i)] : Value::undefined();
      }
      auto offs = utf8_offsets(obj.s.str());
      auto n = static_cast<std::int64_t>(offs.size()) - 1;
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined();
      auto a = offs[static_cast<std::size_t>(i)], b = offs[static_cast<std::size_t>(i) + 1];
      return Value::string(obj.s.substr(a, b - a));
    }
    return Value::undefined();
  }

  Value slice(const Expr& e) {
    Value obj = eval(*e.a);
    auto bound = [&](const ExprPtr& x, const char* what) -> std::optional<std::int64_t> {
      if (!x) return std::nullopt;
      Value v = eval(*x);
      if (v.is_none()) return std::nullopt;
      if (v.kind != Value::Kind::integer) raise(Errc::invalid_argument, e.line, std::string("slice ") + what + " must be an integer");
      return v.i;
    };
    auto lo = bound(e.b, "start"), hi = bound(e.c, "stop"), st = bound(e.d, "step");
    std::int64_t step = st.value_or(1);
    if (step == 0) raise(Errc::invalid_argument, e.line, "slice step cannot be zero");
    if (obj.is_undefined()) undefined_error(obj, e.line, "slicing it");
    std::vector<std::size_t> offs;
    std::int64_t n;
    if (obj.is_list()) {
      n = static_cast<std::int64_t>(obj.list->size());
    } else if (obj.is_string()) {
      offs = utf8_offsets(obj.s.str());
      n = static_cast<std::int64_t>(offs.size()) - 1;
    } else {  // jinja2 slices bypass getitem's fallback to undefined: a TypeError there too
      raise(Errc::invalid_argument, e.line, std::string("cannot slice '") + kind_name(obj.kind) + "'");
    }
    auto clamp = [&](std::optional<std::int64_t> v, std::int64_t dflt) {  // Python's PySlice_AdjustIndices
      if (!v) return dflt;
      std::int64_t x = *v;
      if (x < 0) {
        x += n;
        if (x < 0) x = step < 0 ? -1 : 0;
      } else if (x >= n) {
        x = step < 0 ? n - 1 : n;
      }
      return x;
    };
    std::int64_t a = clamp(lo, step < 0 ? n - 1 : 0), b = clamp(hi, step < 0 ? -1 : n);
    List items;
    Text text;
    for (std::int64_t k = a; step > 0 ? k < b : k > b; k += step) {
      auto u = static_cast<std::size_t>(k);
      if (obj.is_list()) items.push_back((*obj.list)[u]);
      else text.append(obj.s.substr(offs[u], offs[u + 1] - offs[u]));
    }
    return obj.is_list() ? Value::make_list(std::move(items)) : Value::string(std::move(text));
  }

  Value unary(const Expr& e) {
    Value v = eval(*e.a);
    if (e.name == "not") return Value::boolean(!truthy(v));
    if (v.kind == Value::Kind::boolean) v = Value::integer(v.b ? 1 : 0);
    if (v.kind == Value::Kind::integer) {
      if (e.name == "-" && v.i == INT64_MIN) raise(Errc::invalid_argument, e.line, "integer overflow");
      return e.name == "-" ? Value::integer(-v.i) : v;
    }
    if (v.kind == Value::Kind::floating) return e.name == "-" ? Value::floating(-v.f) : v;
    if (v.is_undefined()) undefined_error(v, e.line, "in arithmetic");
    raise(Errc::invalid_argument, e.line, std::string("bad operand type for unary ") + e.name + ": '" + kind_name(v.kind) + "'");
  }

  bool contains(const Value& c, const Value& x, int line) {
    if (c.is_string()) {
      if (!x.is_string()) raise(Errc::invalid_argument, line, "'in <string>' requires a string on the left");
      return c.s.str().find(x.s.str()) != std::string::npos;
    }
    if (c.is_list()) {
      for (const Value& y : *c.list)
        if (equals(x, y)) return true;
      return false;
    }
    if (c.is_mapping()) return x.is_string() && c.find(x.s.str()) != nullptr;
    if (c.is_undefined()) return false;
    raise(Errc::invalid_argument, line, std::string("argument of type '") + kind_name(c.kind) + "' is not iterable");
  }

  Value binary(const Expr& e);
  Value compare_op(const std::string& op, const Value& a, const Value& b, int line);
  Value arithmetic(const std::string& op, const Value& a, const Value& b, int line);
  Value call(const Expr& e);
  Value call_macro(const Stmt& m, CallArgs args, int line);
  Value call_builtin(const Value& fn, const CallArgs& args, int line);

  const Limits& limits_;
  const std::function<std::time_t()>& clock_;
  std::vector<Frame> frames_;
  std::size_t base_ = 0;
  std::size_t steps_ = 0;
  int call_depth_ = 0;
};


Value Evaluator::binary(const Expr& e) {
  const std::string& op = e.name;
  if (op == "and") {
    Value a = eval(*e.a);
    return truthy(a) ? eval(*e.b) : a;
  }
  if (op == "or") {
    Value a = eval(*e.a);
    return truthy(a) ? a : eval(*e.b);
  }
  Value a = eval(*e.a);
  Value b = eval(*e.b);
  if (op == "~") {
    Text t = to_text(a);
    if (t.size() + to_text(b).size() > limits_.max_output_bytes) raise(Errc::invalid_argument, e.line, "string exceeds the output limit");
    t.append(to_text(b));
    return Value::string(std::move(t));
  }
  return compare_op(op, a, b, e.line);
}

Value Evaluator::compare_op(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "==") return Value::boolean(equals(a, b));
  if (op == "!=") return Value::boolean(!equals(a, b));
  if (op == "<") return Value::boolean(compare(a, b, line) < 0);
  if (op == ">") return Value::boolean(compare(a, b, line) > 0);
  if (op == "<=") return Value::boolean(compare(a, b, line) <= 0);
  if (op == ">=") return Value::boolean(compare(a, b, line) >= 0);
  if (op == "in") return Value::boolean(contains(b, a, line));
  if (op == "notin") return Value::boolean(!contains(b, a, line));
  return arithmetic(op, a, b, line);
}

Value Evaluator::arithmetic(const std::string& op, const Value& a, const Value& b, int line) {
  if (a.is_undefined()) undefined_error(a, line, "operand of " + op);
  if (b.is_undefined()) undefined_error(b, line, "operand of " + op);
  auto fail_types = [&]() {
    raise(Errc::invalid_argument, line, "unsupported operand types for " + op + ": '" + kind_name(a.kind) + "' and '" +
                                            kind_name(b.kind) + "'");
  };
  if (op == "+" && a.is_string() && b.is_string()) {
    if (a.s.size() + b.s.size() > limits_.max_output_bytes) raise(Errc::invalid_argument, line, "string exceeds the output limit");
    Text t = a.s;
    t.append(b.s);
    return Value::string(std::move(t));
  }
  if (op == "+" && a.is_list() && b.is_list()) {
    if (a.list->size() + b.list->size() > limits_.max_items) raise(Errc::invalid_argument, line, "list too long");
    List l = *a.list;
    l.insert(l.end(), b.list->begin(), b.list->end());
    return Value::make_list(std::move(l));
  }
  if (op == "*" && (a.is_string() || a.is_list() || b.is_string() || b.is_list())) {
    const Value& seq = (a.is_string() || a.is_list()) ? a : b;
    const Value& cnt = (&seq == &a) ? b : a;
    if (cnt.kind != Value::Kind::integer && cnt.kind != Value::Kind::boolean) fail_types();
    std::int64_t n = cnt.kind == Value::Kind::boolean ? cnt.b : cnt.i;
    if (n < 0) n = 0;
    std::size_t unit = seq.is_string() ? seq.s.size() : seq.list->size();
    std::size_t cap = seq.is_string() ? limits_.max_output_bytes : limits_.max_items;
    if (unit > 0 && static_cast<std::uint64_t>(n) > cap / unit) raise(Errc::invalid_argument, line, "repetition exceeds the limits");
    if (seq.is_string()) {
      Text t;
      for (std::int64_t k = 0; k < n; ++k) t.append(seq.s);
      return Value::string(std::move(t));
    }
    List l;
    for (std::int64_t k = 0; k < n; ++k) l.insert(l.end(), seq.list->begin(), seq.list->end());
    return Value::make_list(std::move(l));
  }
  if (!a.is_number() || !b.is_number()) fail_types();
  bool ints = a.kind != Value::Kind::floating && b.kind != Value::Kind::floating;
  auto ival = [](const Value& v) -> std::int64_t { return v.kind == Value::Kind::boolean ? v.b : v.i; };
  auto fval = [](const Value& v) -> double {
    return v.kind == Value::Kind::floating ? v.f : static_cast<double>(v.kind == Value::Kind::boolean ? v.b : v.i);
  };
  auto overflow = [&]() -> Value { raise(Errc::invalid_argument, line, "integer overflow in " + op); };
  if (op == "/") {
    if (fval(b) == 0) raise(Errc::invalid_argument, line, "division by zero");
    return Value::floating(fval(a) / fval(b));
  }
  if (ints) {
    std::int64_t x = ival(a), y = ival(b), r = 0;
    if (op == "+") return __builtin_add_overflow(x, y, &r) ? overflow() : Value::integer(r);
    if (op == "-") return __builtin_sub_overflow(x, y, &r) ? overflow() : Value::integer(r);
    if (op == "*") return __builtin_mul_overflow(x, y, &r) ? overflow() : Value::integer(r);
    if (op == "//" || op == "%") {
      if (y == 0) raise(Errc::invalid_argument, line, "division by zero");
      if (x == INT64_MIN && y == -1) return op == "%" ? Value::integer(0) : overflow();
      std::int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {  // Python floors toward negative infinity
        --q;
        m += y;
      }
      return Value::integer(op == "//" ? q : m);
    }
    if (op == "**") {
      if (y < 0) return Value::floating(std::pow(static_cast<double>(x), static_cast<double>(y)));
      std::int64_t acc = 1;
      for (std::int64_t k = 0; k < y; ++k) {
        if (__builtin_mul_overflow(acc, x, &acc)) return overflow();
        if (acc == 0 || acc == 1) break;
        if (acc == -1) {
          acc = ((y - k - 1) % 2 == 0) ? -1 : 1;
          break;
        }
      }
      return Value::integer(acc);
    }
  } else {
    double x = fval(a), y = fval(b);
    if (op == "+") return Value::floating(x + y);
    if (op == "-") return Value::floating(x - y);
    if (op == "*") return Value::floating(x * y);
    if (op == "**") return Value::floating(std::pow(x, y));
    if (op == "//" || op == "%") {
      if (y == 0) raise(Errc::invalid_argument, line, "division by zero");
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::floating(op == "%" ? m : std::floor((x - m) / y + 0.5));
    }
  }
  fail_types();
  return Value::undefined();
}

Value Evaluator::call(const Expr& e) {
  CallArgs args;
  if (e.a->kind == Expr::Kind::attr) {  // obj.method(...)
    Value obj = eval(*e.a->a);
    const Value* member = obj.is_mapping() ? obj.find(e.a->name) : nullptr;
    args = eval_args(e.args);
    if (member && member->kind == Value::Kind::function) {
      Value fn = *member;
      return fn.macro ? call_macro(*fn.macro, std::move(args), e.line) : call_builtin(fn, args, e.line);
    }
    return call_method(obj, e.a->name, args, env(e.line));
  }
  Value fn = eval(*e.a);
  args = eval_args(e.args);
  if (fn.kind != Value::Kind::function) {
    if (fn.is_undefined()) undefined_error(fn, e.line, "called as a function");
    raise(Errc::invalid_argument, e.line, std::string("'") + kind_name(fn.kind) + "' object is not callable");
  }
  return fn.macro ? call_macro(*fn.macro, std::move(args), e.line) : call_builtin(fn, args, e.line);
}

Value Evaluator::call_macro(const Stmt& m, CallArgs args, int line) {
  if (call_depth_ >= limits_.max_call_depth) raise(Errc::invalid_argument, line, "macro calls nested too deeply");
  if (args.pos.size() > m.params.size()) raise(Errc::invalid_argument, line, "macro '" + m.name + "' takes " + std::to_string(m.params.size()) + " arguments");
  for (const auto& [k, v] : args.kw) {
    bool known = false;
    for (const auto& p : m.params) known = known || p == k;
    if (!known) raise(Errc::invalid_argument, line, "macro '" + m.name + "' has no parameter '" + k + "'");
  }
  std::size_t saved_base = base_;
  frames_.emplace_back();
  base_ = frames_.size() - 1;
  ++call_depth_;
  for (std::size_t k = 0; k < m.params.size(); ++k) {
    Value v;
    bool have = false;
    if (k < args.pos.size()) {
      v = args.pos[k];
      have = true;
    }
    for (const auto& [name, x] : args.kw)
      if (name == m.params[k]) {
        v = x;
        have = true;
      }
    if (!have) v = m.defaults[k] ? eval(*m.defaults[k]) : Value::undefined(m.params[k]);
    assign(m.params[k], std::move(v));
  }
  Text out;
  exec(m.body, out);
  --call_depth_;
  frames_.pop_back();
  base_ = saved_base;
  return Value::string(std::move(out));
}

Value Evaluator::call_builtin(const Value& fn, const CallArgs& args, int line) {
  switch (fn.builtin) {
    case Builtin::range: {
      std::int64_t v[3] = {0, 0, 1};
      std::size_t n = args.pos.size();
      if (n < 1 || n > 3 || !args.kw.empty()) raise(Errc::invalid_argument, line, "range() takes 1 to 3 integers");
      for (std::size_t k = 0; k < n; ++k) {
        const Value& a = args.pos[k];
        if (a.kind != Value::Kind::integer && a.kind != Value::Kind::boolean) raise(Errc::invalid_argument, line, "range() takes integers");
        std::int64_t x = a.kind == Value::Kind::boolean ? a.b : a.i;
        if (n == 1) v[1] = x;
        else v[k] = x;
      }
      if (v[2] == 0) raise(Errc::invalid_argument, line, "range() step must not be zero");
      long double span = (static_cast<long double>(v[1]) - v[0]) / v[2];
      if (span > static_cast<long double>(limits_.max_items)) raise(Errc::invalid_argument, line, "range() longer than " + std::to_string(limits_.max_items));
      List out;
      for (std::int64_t x = v[0]; v[2] > 0 ? x < v[1] : x > v[1]; x += v[2]) {
        out.push_back(Value::integer(x));
        if ((v[2] > 0 && x > INT64_MAX - v[2]) || (v[2] < 0 && x < INT64_MIN - v[2])) break;
      }
      return Value::make_list(std::move(out));
    }
    case Builtin::namespace_:
    case Builtin::dict: {
      Dict d;
      for (const Value& p : args.pos) {
        if (!p.is_mapping()) raise(Errc::invalid_argument, line, fn.name + "() takes keyword arguments or a dict");
        for (const auto& e : *p.dict) d.push_back(e);
      }
      for (const auto& [k, v] : args.kw) d.emplace_back(Text(k, true), v);
      return fn.builtin == Builtin::dict ? Value::make_dict(std::move(d)) : Value::make_namespace(std::move(d));
    }
    case Builtin::raise_exception: {
      std::string msg = args.pos.empty() ? std::string() : to_text(args.pos[0]).str();
      raise(Errc::invalid_argument, line, "template raised: " + msg);
    }
    case Builtin::strftime_now: {
      if (args.pos.empty() || !args.pos[0].is_string()) raise(Errc::invalid_argument, line, "strftime_now() takes a format string");
      std::string fmt = args.pos[0].s.str();
      if (fmt.size() > 256) raise(Errc::invalid_argument, line, "strftime_now() format too long");
      std::time_t t = clock_ ? clock_() : std::time(nullptr);
      std::tm tm{};
      if (!localtime_r(&t, &tm)) raise(Errc::invalid_argument, line, "strftime_now(): bad time");
      char buf[1024];
      std::size_t n = fmt.empty() ? 0 : std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
      return Value::string(std::string(buf, n), true);
    }
    case Builtin::none: break;
  }
  raise(Errc::internal, line, "unknown builtin");
}

}  // namespace

Text render(const Body& body, const std::map<std::string, Value>& globals, const Limits& limits,
            const std::function<std::time_t()>& clock) {
  return Evaluator(limits, clock).run(body, globals);
}

}  // namespace tandem::gen::jinja
