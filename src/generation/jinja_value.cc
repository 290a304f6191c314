#include "generation/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace tandem::gen::jinja {

void raise(Errc code, int line, std::string message) { throw Error{code, line, std::move(message)}; }

Value Value::undefined(std::string name) {
  Value v;
  v.name = std::move(name);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::none;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind = Kind::boolean;
  v.b = b;
  return v;
}
Value Value::integer(std::int64_t i) {
  Value v;
  v.kind = Kind::integer;
  v.i = i;
  return v;
}
Value Value::floating(double f) {
  Value v;
  v.kind = Kind::floating;
  v.f = f;
  return v;
}
Value Value::string(Text t) {
  Value v;
  v.kind = Kind::string;
  v.s = std::move(t);
  return v;
}
Value Value::string(std::string s, bool trusted) { return string(Text(std::move(s), trusted)); }
namespace {
int nested_depth(const Value& child, int depth) {
  int d = std::max(depth, child.depth + 1);
  if (d > kMaxValueDepth) raise(Errc::invalid_argument, 0, "value nested deeper than " + std::to_string(kMaxValueDepth));
  return d;
}
}  // namespace

Value Value::make_list(List items) {
  Value v;
  v.kind = Kind::list;
  v.depth = 1;
  for (const Value& x : items) v.depth = nested_depth(x, v.depth);
  v.list = std::make_shared<const List>(std::move(items));
  return v;
}
Value Value::make_dict(Dict items) {
  Value v;
  v.kind = Kind::dict;
  v.depth = 1;
  for (const auto& e : items) v.depth = nested_depth(e.second, v.depth);
  v.dict = std::make_shared<Dict>(std::move(items));
  return v;
}
Value Value::make_namespace(Dict items) {
  Value v = make_dict(std::move(items));
  v.kind = Kind::ns;
  return v;
}

const Value* Value::find(std::string_view key) const {
  if (!is_mapping()) return nullptr;
  for (const auto& [k, v] : *dict)
    if (k.str() == key) return &v;
  return nullptr;
}

const char* kind_name(Value::Kind k) {
  switch (k) {
    case Value::Kind::undefined: return "undefined";
    case Value::Kind::none: return "NoneType";
    case Value::Kind::boolean: return "bool";
    case Value::Kind::integer: return "int";
    case Value::Kind::floating: return "float";
    case Value::Kind::string: return "str";
    case Value::Kind::list: return "list";
    case Value::Kind::dict: return "dict";
    case Value::Kind::ns: return "Namespace";
    case Value::Kind::function: return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined:
    case Value::Kind::none: return false;
    case Value::Kind::boolean: return v.b;
    case Value::Kind::integer: return v.i != 0;
    case Value::Kind::floating: return v.f != 0;
    case Value::Kind::string: return !v.s.empty();
    case Value::Kind::list: return !v.list->empty();
    case Value::Kind::dict: return !v.dict->empty();
    case Value::Kind::ns:
    case Value::Kind::function: return true;
  }
  return false;
}

namespace {
double as_double(const Value& v) {
  if (v.kind == Value::Kind::floating) return v.f;
  if (v.kind == Value::Kind::boolean) return v.b ? 1 : 0;
  return static_cast<double>(v.i);
}
bool both_integral(const Value& a, const Value& b) {
  return a.kind != Value::Kind::floating && b.kind != Value::Kind::floating;
}
std::int64_t as_int(const Value& v) { return v.kind == Value::Kind::boolean ? (v.b ? 1 : 0) : v.i; }
}  // namespace

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (both_integral(a, b)) return as_int(a) == as_int(b);
    return as_double(a) == as_double(b);
  }
  if (a.kind != b.kind) {
    if (a.is_mapping() && b.is_mapping() && a.kind != Value::Kind::ns && b.kind != Value::Kind::ns) {
    } else {
      return false;
    }
  }
  switch (a.kind) {
    case Value::Kind::undefined:
    case Value::Kind::none: return true;
    case Value::Kind::string: return a.s.str() == b.s.str();
    case Value::Kind::list: {
      if (a.list->size() != b.list->size()) return false;
      for (std::size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case Value::Kind::dict: {
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : *a.dict) {
        const Value* o = b.find(k.str());
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    case Value::Kind::ns: return a.dict == b.dict;
    case Value::Kind::function: return a.macro == b.macro && a.builtin == b.builtin;
    default: return false;
  }
}

int compare(const Value& a, const Value& b, int line) {
  if (a.is_number() && b.is_number()) {
    if (both_integral(a, b)) return as_int(a) < as_int(b) ? -1 : (as_int(a) > as_int(b) ? 1 : 0);
    double x = as_double(a), y = as_double(b);
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.s.str().compare(b.s.str());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list()) {
    std::size_t n = std::min(a.list->size(), b.list->size());
    for (std::size_t k = 0; k < n; ++k) {
      if (equals((*a.list)[k], (*b.list)[k])) continue;
      return compare((*a.list)[k], (*b.list)[k], line);
    }
    return a.list->size() < b.list->size() ? -1 : (a.list->size() > b.list->size() ? 1 : 0);
  }
  raise(Errc::invalid_argument, line,
        std::string("cannot order '") + kind_name(a.kind) + "' and '" + kind_name(b.kind) + "'");
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // e.g. "-1.2345e+02"
  bool neg = !sci.empty() && sci[0] == '-';
  if (neg) sci.erase(0, 1);
  std::size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exp = std::atoi(sci.c_str() + e + 1);
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {  // Python repr: fixed notation when -4 <= exponent < 16
    if (exp < 0) {
      out += "0." + std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<std::size_t>(exp) + 1 >= digits.size()) {
      out += digits + std::string(static_cast<std::size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<std::size_t>(exp) + 1) + "." + digits.substr(static_cast<std::size_t>(exp) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char eb[16];
  std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return out + eb;
}

Text to_text(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined: return Text();
    case Value::Kind::string: return v.s;
    case Value::Kind::function: return Text("<function " + v.name + ">", true);
    case Value::Kind::ns: return Text("<Namespace>", true);
    default: return repr(v);
  }
}

namespace {
void repr_string(const Text& s, Text& out) {
  const std::string& b = s.str();
  char q = (b.find('\'') != std::string::npos && b.find('"') == std::string::npos) ? '"' : '\'';
  out.append(std::string(1, q), true);
  std::size_t pos = 0;
  for (const Text::Run& r : s.runs()) {
    std::string esc;
    for (std::size_t k = pos; k < pos + r.length; ++k) {
      unsigned char c = static_cast<unsigned char>(b[k]);
      if (c == '\\') esc += "\\\\";
      else if (c == static_cast<unsigned char>(q)) esc += std::string("\\") + q;
      else if (c == '\n') esc += "\\n";
      else if (c == '\r') esc += "\\r";
      else if (c == '\t') esc += "\\t";
      else if (c < 0x20 || c == 0x7f) {
        char h[8];
        std::snprintf(h, sizeof h, "\\x%02x", c);
        esc += h;
      } else {
        esc += static_cast<char>(c);
      }
    }
    out.append(esc, r.trusted);
    pos += r.length;
  }
  out.append(std::string(1, q), true);
}
}  // namespace

Text repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined: return Text("Undefined", true);  // jinja2's repr inside a printed container
    case Value::Kind::none: return Text("None", true);
    case Value::Kind::boolean: return Text(v.b ? "True" : "False", true);
    case Value::Kind::integer: return Text(std::to_string(v.i), true);
    case Value::Kind::floating: return Text(format_float(v.f), true);
    case Value::Kind::string: {
      Text out;
      repr_string(v.s, out);
      return out;
    }
    case Value::Kind::list: {
      Text out("[", true);
      for (std::size_t k = 0; k < v.list->size(); ++k) {
        if (k) out.append(", ", true);
        out.append(repr((*v.list)[k]));
      }
      out.append("]", true);
      return out;
    }
    case Value::Kind::dict: {
      Text out("{", true);
      bool first = true;
      for (const auto& [k, x] : *v.dict) {
        if (!first) out.append(", ", true);
        first = false;
        repr_string(k, out);
        out.append(": ", true);
        out.append(repr(x));
      }
      out.append("}", true);
      return out;
    }
    default: return to_text(v);
  }
}

namespace {
void json_string(const Text& s, Text& out) {
  out.append("\"", true);
  const std::string& b = s.str();
  std::size_t pos = 0;
  for (const Text::Run& r : s.runs()) {
    std::string esc;
    for (std::size_t k = pos; k < pos + r.length; ++k) {
      unsigned char c = static_cast<unsigned char>(b[k]);
      switch (c) {
        case '"': esc += "\\\""; break;
        case '\\': esc += "\\\\"; break;
        case '\n': esc += "\\n"; break;
        case '\r': esc += "\\r"; break;
        case '\t': esc += "\\t"; break;
        case '\b': esc += "\\b"; break;
        case '\f': esc += "\\f"; break;
        default:
          if (c < 0x20) {
            char h[8];
            std::snprintf(h, sizeof h, "\\u%04x", c);
            esc += h;
          } else {
            esc += static_cast<char>(c);
          }
      }
    }
    out.append(esc, r.trusted);
    pos += r.length;
  }
  out.append("\"", true);
}

void json_value(const Value& v, int indent, bool sort_keys, int level, int line, Text& out) {
  if (level > 64) raise(Errc::invalid_argument, line, "tojson: value nested too deeply");
  auto newline = [&](int lvl) {
    if (indent >= 0) out.append("\n" + std::string(static_cast<std::size_t>(indent) * static_cast<std::size_t>(lvl), ' '), true);
  };
  const char* item_sep = indent >= 0 ? "," : ", ";
  switch (v.kind) {
    case Value::Kind::none: out.append("null", true); return;
    case Value::Kind::boolean: out.append(v.b ? "true" : "false", true); return;
    case Value::Kind::integer: out.append(std::to_string(v.i), true); return;
    case Value::Kind::floating:
      if (std::isnan(v.f)) out.append("NaN", true);
      else if (std::isinf(v.f)) out.append(v.f < 0 ? "-Infinity" : "Infinity", true);
      else out.append(format_float(v.f), true);
      return;
    case Value::Kind::string: json_string(v.s, out); return;
    case Value::Kind::list: {
      if (v.list->empty()) { out.append("[]", true); return; }
      out.append("[", true);
      for (std::size_t k = 0; k < v.list->size(); ++k) {
        if (k) out.append(item_sep, true);
        newline(level + 1);
        json_value((*v.list)[k], indent, sort_keys, level + 1, line, out);
      }
      newline(level);
      out.append("]", true);
      return;
    }
    case Value::Kind::dict:
    case Value::Kind::ns: {
      if (v.dict->empty()) { out.append("{}", true); return; }
      std::vector<const std::pair<Text, Value>*> items;
      for (const auto& e : *v.dict) items.push_back(&e);
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first.str() < b->first.str(); });
      out.append("{", true);
      for (std::size_t k = 0; k < items.size(); ++k) {
        if (k) out.append(item_sep, true);
        newline(level + 1);
        json_string(items[k]->first, out);
        out.append(": ", true);
        json_value(items[k]->second, indent, sort_keys, level + 1, line, out);
      }
      newline(level);
      out.append("}", true);
      return;
    }
    default:
      raise(Errc::invalid_argument, line, std::string("tojson: object of type '") + kind_name(v.kind) +
                                              "' is not JSON serializable");
  }
}
}  // namespace

Text to_json(const Value& v, int indent, bool sort_keys, int line) {
  Text out;
  json_value(v, indent, sort_keys, 0, line, out);
  return out;
}

List iterate(const Value& v, int line) {
  switch (v.kind) {
    case Value::Kind::undefined: return {};
    case Value::Kind::list: return *v.list;
    case Value::Kind::dict: {
      List keys;
      for (const auto& e : *v.dict) keys.push_back(Value::string(e.first));
      return keys;
    }
    case Value::Kind::string: {
      List chars;
      auto offs = utf8_offsets(v.s.str());
      for (std::size_t k = 0; k + 1 < offs.size(); ++k)
        chars.push_back(Value::string(v.s.substr(offs[k], offs[k + 1] - offs[k])));
      return chars;
    }
    default:
      raise(Errc::invalid_argument, line, std::string("'") + kind_name(v.kind) + "' object is not iterable");
  }
}

}  // namespace tandem::gen::jinja
