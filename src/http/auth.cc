// API keys (auth.h).
#include "http/auth.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "core/sha256.h"

namespace tandem::http {

namespace {

bool valid_name(std::string_view n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
  return true;
}

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Result<KeyRing> KeyRing::parse(std::string_view text) {
  KeyRing ring;
  std::size_t lineno = 0;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++lineno;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.remove_suffix(1);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    if (line.empty() || line.front() == '#') continue;
    const std::string where = "line " + std::to_string(lineno) + ": ";
    const auto sp = line.find_first_of(" \t");
    if (sp == std::string_view::npos) return fail(Errc::format_error, where + "expected \"NAME sha256:HEX\"");
    std::string_view name = line.substr(0, sp);
    std::string_view rest = line.substr(sp);
    while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
    if (!valid_name(name)) return fail(Errc::format_error, where + "the name must be 1 to 64 of A-Z a-z 0-9 . _ -");
    if (!rest.starts_with("sha256:") || rest.size() != 7 + 64)
      return fail(Errc::format_error, where + "expected sha256: and 64 hex digits after the name");
    Key k;
    k.name = std::string(name);
    for (std::size_t i = 0; i < 32; ++i) {
      const int hi = hexval(rest[7 + 2 * i]), lo = hexval(rest[8 + 2 * i]);
      if (hi < 0 || lo < 0) return fail(Errc::format_error, where + "the digest is not hexadecimal");
      k.digest[i] = static_cast<std::uint8_t>(hi * 16 + lo);
    }
    for (const auto& o : ring.keys_) {
      if (o.name == k.name) return fail(Errc::format_error, where + "the name '" + k.name + "' is used twice");
      if (o.digest == k.digest) return fail(Errc::format_error, where + "the same key is listed twice");
    }
    ring.keys_.push_back(std::move(k));
  }
  return ring;
}

Result<KeyRing> KeyRing::load(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return fail(Errc::io_error, "cannot read the key file " + path);
  if (st.st_mode & 077)
    return fail(Errc::invalid_argument, "the key file " + path + " may be read or written by others (chmod 600 it)");
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(Errc::io_error, "cannot open the key file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  auto r = parse(ss.str());
  if (!r.ok()) return fail(r.error().code, path + ": " + r.error().message);
  return r;
}

std::optional<std::string> KeyRing::authenticate(std::string_view authorization) const {
  constexpr std::string_view kBearer = "Bearer ";
  if (!authorization.starts_with(kBearer)) return std::nullopt;
  const std::string_view key = authorization.substr(kBearer.size());
  if (key.empty()) return std::nullopt;
  const auto d = Sha256::of(key);
  std::optional<std::string> who;
  for (const auto& k : keys_) {
    std::uint8_t diff = 0;  // constant time in the digest
    for (std::size_t i = 0; i < 32; ++i) diff |= static_cast<std::uint8_t>(d[i] ^ k.digest[i]);
    if (diff == 0) who = k.name;
  }
  return who;
}

std::string KeyRing::line_for(std::string_view name, std::string_view key) {
  return std::string(name) + " sha256:" + Sha256::hex(Sha256::of(key));
}

}  // namespace tandem::http
