// API keys for tandem-http (docs/http.md "Authentication"): a file of hashed keys, one per line, readable by the
// service's user only (owned by tandem-http, mode 0600),
// "NAME sha256:HEX" (HEX = the SHA-256 of the key; `tandem-http --hash-key` prints a line for a key read from
// standard input). A request's "Authorization: Bearer KEY" is hashed and compared in constant time; its NAME is the
// client's identity for per-client limits and idempotency keys. Without a key file, only loopback binds are allowed
// and every caller is "local".
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace tandem::http {

class KeyRing {
 public:
  // Parses the file's text. Errors (format_error) name the line: a bad name (1..64 of [A-Za-z0-9._-]), a digest
  // that is not 64 hex digits, a duplicate name or digest. Blank lines and lines starting with '#' are skipped.
  static Result<KeyRing> parse(std::string_view text);
  // Reads `path`; refuses a file that others may write or read (mode & 0o077), as ssh does for its keys.
  static Result<KeyRing> load(const std::string& path);

  bool empty() const { return keys_.empty(); }
  std::size_t size() const { return keys_.size(); }
  // The key's name for an Authorization header value ("Bearer KEY"), or nullopt.
  std::optional<std::string> authenticate(std::string_view authorization) const;
  // "NAME sha256:HEX" for a key (what --hash-key prints).
  static std::string line_for(std::string_view name, std::string_view key);

 private:
  struct Key {
    std::string name;
    std::array<std::uint8_t, 32> digest;
  };
  std::vector<Key> keys_;
};

}  // namespace tandem::http
