// multipart/form-data (multipart.h).
#include "http/multipart.h"

#include <algorithm>
#include <cctype>

namespace tandem::http {

namespace {

std::string lower(std::string_view s) {
  std::string o(s);
  for (auto& c : o) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return o;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The value of `key` among "; key=value" parameters (quoted values unquoted, \" and \\ unescaped).
std::optional<std::string> param(std::string_view header, std::string_view key) {
  std::size_t i = header.find(';');
  while (i != std::string_view::npos) {
    std::string_view rest = header.substr(i + 1);
    const auto eq = rest.find('=');
    if (eq == std::string_view::npos) return std::nullopt;
    const std::string k = lower(trim(rest.substr(0, eq)));
    std::string_view v = rest.substr(eq + 1);
    while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
    std::string value;
    std::size_t used = 0;
    if (!v.empty() && v.front() == '"') {
      std::size_t j = 1;
      for (; j < v.size() && v[j] != '"'; ++j) {
        if (v[j] == '\\' && j + 1 < v.size()) ++j;
        value += v[j];
      }
      if (j >= v.size()) return std::nullopt;  // unterminated quote
      used = j + 1;
    } else {
      used = std::min(v.find(';'), v.size());
      value = std::string(trim(v.substr(0, used)));
    }
    if (k == key) return value;
    const auto next = v.find(';', used);
    i = next == std::string_view::npos ? std::string_view::npos : header.size() - v.size() + next;
  }
  return std::nullopt;
}

}  // namespace

Result<std::string> multipart_boundary(std::string_view content_type) {
  if (!lower(content_type).starts_with("multipart/form-data"))
    return fail(Errc::invalid_argument, "expected Content-Type multipart/form-data");
  auto b = param(content_type, "boundary");
  if (!b || b->empty() || b->size() > 70) return fail(Errc::invalid_argument, "the multipart boundary is missing or longer than 70 characters");
  return *b;
}

Result<std::vector<FormPart>> parse_multipart(std::string_view body, std::string_view boundary, std::size_t max_parts) {
  const std::string delim = "--" + std::string(boundary);
  std::vector<FormPart> parts;
  // The body starts with the first delimiter (a preamble before it is allowed and ignored).
  std::size_t pos = body.find(delim);
  if (pos == std::string_view::npos) return fail(Errc::parse_error, "no multipart delimiter in the body");
  if (pos != 0 && (pos < 2 || body.substr(pos - 2, 2) != "\r\n")) return fail(Errc::parse_error, "the first delimiter is not at a line start");
  pos += delim.size();
  const std::string next_delim = "\r\n" + delim;
  while (true) {
    if (body.substr(pos, 2) == "--") return parts;  // the closing delimiter
    if (body.substr(pos, 2) != "\r\n") return fail(Errc::parse_error, "a delimiter is not followed by a line break");
    pos += 2;
    if (parts.size() >= max_parts) return fail(Errc::parse_error, "more than " + std::to_string(max_parts) + " parts");
    const std::string where = "part " + std::to_string(parts.size() + 1);
    const auto hend = body.find("\r\n\r\n", pos);
    const auto dend = body.find(next_delim, pos);
    if (hend == std::string_view::npos || (dend != std::string_view::npos && hend > dend))
      return fail(Errc::parse_error, where + ": its headers do not end with a blank line");
    FormPart p;
    bool disposition = false;
    std::string_view headers = body.substr(pos, hend - pos);
    while (!headers.empty()) {
      const auto nl = headers.find("\r\n");
      std::string_view line = headers.substr(0, nl);
      headers = nl == std::string_view::npos ? std::string_view{} : headers.substr(nl + 2);
      const auto colon = line.find(':');
      if (colon == std::string_view::npos) return fail(Errc::parse_error, where + ": a header line without ':'");
      const std::string key = lower(trim(line.substr(0, colon)));
      std::string_view value = trim(line.substr(colon + 1));
      if (key == "content-disposition") {
        if (!lower(value).starts_with("form-data")) return fail(Errc::parse_error, where + ": Content-Disposition is not form-data");
        auto n = param(value, "name");
        if (!n || n->empty()) return fail(Errc::parse_error, where + ": Content-Disposition has no name");
        p.name = *n;
        p.filename = param(value, "filename");
        disposition = true;
      } else if (key == "content-type") {
        p.content_type = std::string(value);
      }
    }
    if (!disposition) return fail(Errc::parse_error, where + ": no Content-Disposition header");
    const std::size_t data_start = hend + 4;
    const auto data_end = body.find(next_delim, data_start);
    if (data_end == std::string_view::npos)
      return fail(Errc::parse_error, where + " ('" + p.name + "'): the body ends before its closing delimiter (a truncated upload?)");
    p.data = body.substr(data_start, data_end - data_start);
    parts.push_back(std::move(p));
    pos = data_end + next_delim.size();
  }
}

}  // namespace tandem::http
