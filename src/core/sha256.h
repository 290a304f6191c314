// SHA-256 (FIPS 180-4), used for fingerprints and file identities. No external dependency.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace tandem {

class Sha256 {
 public:
  using Digest = std::array<std::uint8_t, 32>;

  Sha256();
  Sha256& update(std::span<const std::byte> data);
  Sha256& update(std::string_view text);
  Digest finish();  // the object must not be updated afterwards

  static Digest of(std::string_view text);
  static std::string hex(const Digest& d);

 private:
  void block(const std::uint8_t* p);
  std::array<std::uint32_t, 8> h_;
  std::array<std::uint8_t, 64> buf_{};
  std::size_t buf_len_ = 0;
  std::uint64_t total_ = 0;
};

}  // namespace tandem
