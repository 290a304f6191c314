// Pieces the GGUF reader (gguf.cc) and writer (gguf_writer.cc) share. Private to the weights library.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "weights/gguf.h"

namespace tandem::weights::gguf_detail {

inline constexpr std::uint64_t kDefaultAlignment = 32;
inline constexpr std::uint32_t kMaxDims = 4;

// "[ne0, ne1, ...]" for messages.
std::string dims_str(const std::vector<std::uint64_t>& ne);
// Bytes of a tensor of a known ggml type: row_bytes(ne0) × rows. nullopt with `why` set on a bad shape.
std::optional<std::uint64_t> tensor_bytes(const GgmlTypeInfo& ti, const std::vector<std::uint64_t>& ne,
                                          std::string& why);
// Appends the little-endian bytes of scalar `v` as type t (nothing for string and array).
void put_scalar(std::string& out, GgufType t, const GgufValue& v);

}  // namespace tandem::weights::gguf_detail
