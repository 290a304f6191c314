// Upper bounds for a model's hyper-parameters, shared by config.json (model_dir.cc) and GGUF metadata
// (gguf_model.cc); documented in docs/model-format.md. Generous for today's Llama-family models, small enough that
// products of them cannot overflow 64 bits. Private to the weights library.
#pragma once

#include <cstdint>

namespace tandem::weights::limits {

inline constexpr std::int64_t kMaxHidden = 65536;
inline constexpr std::int64_t kMaxIntermediate = 4 * 65536;
inline constexpr std::int64_t kMaxLayers = 1024;
inline constexpr std::int64_t kMaxHeads = 1024;
inline constexpr std::int64_t kMaxHeadDim = 1024;
inline constexpr std::int64_t kMaxVocab = 1 << 24;
inline constexpr std::int64_t kMaxPositions = 1 << 24;
inline constexpr std::int64_t kMaxTokenId = (std::int64_t{1} << 31) - 1;
inline constexpr double kMaxRopeTheta = 1e12;
inline constexpr double kMaxRopeFactor = 1024.0;

}  // namespace tandem::weights::limits
