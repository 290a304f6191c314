// Test audio for the transcription tests of the service core and the ring hub: a mono 16-bit PCM WAV of a quiet
// square wave (a real file: the service reads its header at the call; the fake backend's windows follow its length).
#pragma once

#include <cstdint>
#include <vector>

namespace tandem::daemon::testing {

inline std::vector<std::uint8_t> square_wav(double seconds, std::uint32_t rate = 1000, std::uint16_t tone = 1) {
  const auto n = static_cast<std::uint32_t>(seconds * rate);
  std::vector<std::uint8_t> b;
  auto u32 = [&](std::uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  };
  auto u16 = [&](std::uint16_t v) {
    b.push_back(static_cast<std::uint8_t>(v));
    b.push_back(static_cast<std::uint8_t>(v >> 8));
  };
  b.insert(b.end(), {'R', 'I', 'F', 'F'});
  u32(36 + n * 2);
  b.insert(b.end(), {'W', 'A', 'V', 'E', 'f', 'm', 't', ' '});
  u32(16);
  u16(1);  // PCM
  u16(1);  // mono
  u32(rate);
  u32(rate * 2);
  u16(2);
  u16(16);
  b.insert(b.end(), {'d', 'a', 't', 'a'});
  u32(n * 2);
  for (std::uint32_t i = 0; i < n; ++i) u16(static_cast<std::uint16_t>(((i / 8) % 2 ? 300 : -300) * tone));
  return b;
}

}  // namespace tandem::daemon::testing
