// Token ids and piece types shared by the tokenizer kinds and by the GGUF vocabulary code. No dependencies.
#pragma once

#include <cstdint>

namespace tandem::tok {

using TokenId = std::int32_t;

// SentencePiece's numbering, which llama.cpp's GGUF tokenizer.ggml.token_type also uses.
enum class PieceType : std::uint8_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

}  // namespace tandem::tok
