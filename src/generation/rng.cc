#include "generation/rng.h"

namespace tandem::gen {

std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> ctr, std::array<std::uint32_t, 2> key) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = std::uint64_t{kM0} * ctr[0];
    const std::uint64_t p1 = std::uint64_t{kM1} * ctr[2];
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
    key[0] += kW0;
    key[1] += kW1;
  }
  return ctr;
}

double uniform01(std::uint64_t seed, std::uint64_t step, std::uint32_t lane) {
  const auto out = philox4x32(
      {static_cast<std::uint32_t>(step), static_cast<std::uint32_t>(step >> 32), lane, 0x7A4E0D31u},
      {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
  const std::uint64_t bits = (std::uint64_t{out[0]} << 21) ^ (std::uint64_t{out[1]} >> 11);  // 53 bits
  return static_cast<double>(bits & ((std::uint64_t{1} << 53) - 1)) * 0x1.0p-53;
}

}  // namespace tandem::gen
