// multipart/form-data (RFC 7578) request bodies, as OpenAI's /v1/audio/transcriptions takes them: the boundary from
// the Content-Type, each part's Content-Disposition name and filename, its Content-Type, its bytes. Strict: a
// missing boundary, a part without a name, headers without their blank line, a body without the closing delimiter
// (a truncated upload) are errors naming what is wrong. Pure; fuzzed by tests/http/fuzz_http_request.cc.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace tandem::http {

struct FormPart {
  std::string name;
  std::optional<std::string> filename;
  std::string content_type;  // "" when the part has none
  std::string_view data;     // into the body given to parse_multipart
};

// The boundary parameter of a multipart/form-data Content-Type (quoted or not). Errors: invalid_argument.
Result<std::string> multipart_boundary(std::string_view content_type);
// Errors: parse_error naming the part. At most max_parts parts.
Result<std::vector<FormPart>> parse_multipart(std::string_view body, std::string_view boundary, std::size_t max_parts = 64);

}  // namespace tandem::http
