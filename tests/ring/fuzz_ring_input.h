// The input format of fuzz_ring_consumer (shared with fuzz_ring_make_corpus): the fuzzer's bytes become the
// client-writable parts of a small session. Bytes past the end of the input leave the session as initialize() made it
// (zero). All offsets are into the input.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ring/abi.h"
#include "ring/layout.h"

namespace tandem::ring::fuzz {

// The session: 8 SQ / 8 CQ entries, 4 KiB request and response areas (the smallest compute_layout allows).
inline constexpr LayoutRequest kRequest{8, 8, 4096, 4096};

inline constexpr std::size_t kSqControlAt = 0;                            // SqControl, 192 bytes (tail first)
inline constexpr std::size_t kCqHead1At = kSqControlAt + sizeof(SqControl);  // u32: CQ head after the first pass
inline constexpr std::size_t kCqHead2At = kCqHead1At + 4;                 // u32: CQ head before the final flush
inline constexpr std::size_t kKnobsAt = kCqHead2At + 4;                   // u8 consume max, u8 backlog limit, 2 spare
inline constexpr std::size_t kSqesAt = kKnobsAt + 4;                      // 8 SubmissionEntry, 512 bytes
inline constexpr std::size_t kRequestDataAt = kSqesAt + 8 * sizeof(SubmissionEntry);  // up to 4096 bytes
inline constexpr std::size_t kMaxInput = kRequestDataAt + 4096;

}  // namespace tandem::ring::fuzz
