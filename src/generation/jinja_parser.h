// Jinja engine, part 4b: the parser — tokens to a syntax tree. Rejects, with the line, every construct outside
// the supported subset (unknown statements, filters and tests, extends/include/import, call blocks, recursive
// loops) so an unusable template fails at load, not mid-conversation. Nesting depth is bounded.
#pragma once

#include <string_view>

#include "generation/jinja_ast.h"

namespace tandem::gen::jinja {

inline constexpr int kMaxNesting = 64;  // blocks inside blocks, and expression depth

// Throws jinja::Error (format_error for bad syntax, unsupported for constructs outside the subset).
Body parse_template(std::string_view source);

}  // namespace tandem::gen::jinja
