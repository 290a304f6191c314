// Jinja engine, part 5a: the filters, tests and methods of the supported subset (the ones the chat templates of
// the common open model families use). Every result string keeps the trust flags of the bytes it came from.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "generation/jinja_value.h"

namespace tandem::gen::jinja {

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;

  // Positional argument `index`, else keyword `name`, else nullptr.
  const Value* get(std::size_t index, std::string_view name) const;
};

struct Env {
  std::size_t max_bytes = 1 << 20;  // any one string
  std::size_t max_items = 100000;   // any one list (range, split, repetition)
  int line = 0;
};

bool is_filter(std::string_view name);
bool is_test(std::string_view name);

Value apply_filter(std::string_view name, const Value& v, const CallArgs& args, const Env& env);
bool apply_test(std::string_view name, const Value& v, const CallArgs& args, const Env& env);
// `obj.name(args)` for str (strip, split, startswith, ...) and dict (items, keys, values, get); unsupported for
// anything else.
Value call_method(const Value& obj, std::string_view name, const CallArgs& args, const Env& env);

// Python whitespace stripping on Text (ASCII whitespace, or the bytes of `chars`): bytes kept keep their flags.
Text strip_text(const Text& t, bool left, bool right, const std::string* chars);

}  // namespace tandem::gen::jinja
