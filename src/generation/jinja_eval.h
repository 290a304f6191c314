// Jinja engine, part 5b: the evaluator — walks the syntax tree against a global context and writes Text.
// Bounded: output bytes, evaluation steps (so loops and macro recursion end), macro call depth, list sizes.
#pragma once

#include <cstddef>
#include <ctime>
#include <functional>
#include <map>
#include <string>

#include "generation/jinja_ast.h"

namespace tandem::gen::jinja {

struct Limits {
  std::size_t max_output_bytes = 1 << 20;  // the rendered text, and any one string or captured block
  std::size_t max_steps = 1'000'000;       // statements + expression nodes evaluated, loop iterations included
  std::size_t max_items = 100'000;         // any one list (range(), split(), list repetition, concatenation)
  int max_call_depth = 32;                 // nested macro calls
};

// Renders `body` with `globals` (plus range, namespace, dict, raise_exception, strftime_now unless shadowed).
// `clock` serves strftime_now (local time, as HF's datetime.now()); null = the real clock.
// Throws jinja::Error.
Text render(const Body& body, const std::map<std::string, Value>& globals, const Limits& limits,
            const std::function<std::time_t()>& clock);

}  // namespace tandem::gen::jinja
