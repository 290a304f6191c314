// Counter-based random numbers: the value for (seed, step) is a pure function of the two, so a generation that is
// checkpointed after n tokens and resumed (even on another device or in another process) draws exactly the same
// random numbers for token n, n+1, ... as an uninterrupted one. Philox-4x32-10 (Salmon et al., SC'11).
#pragma once

#include <array>
#include <cstdint>

namespace tandem::gen {

// Four 32-bit outputs for counter `ctr` under key `key`.
std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> ctr, std::array<std::uint32_t, 2> key);

// A uniform double in [0, 1) with 53 random bits, for (seed, step, lane).
double uniform01(std::uint64_t seed, std::uint64_t step, std::uint32_t lane = 0);

}  // namespace tandem::gen
