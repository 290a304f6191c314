// The model side of Whisper decoding as the torch-free decoder (speech/transcriber.h) sees it: one job's encoder
// output and decoder state on one replica. engine::WhisperSession implements it on the CPU kernels or the
// accelerator; tests implement it with scripted logits. docs/transcription.md.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/result.h"

namespace tandem::speech {

using TokenId = std::int32_t;

class DecoderSession {
 public:
  virtual ~DecoderSession() = default;
  // Starts a window: `mel` is n_mels × window_frames floats, row-major (mel bin major), as audio::LogMel::window
  // writes it. Runs the encoder and computes every decoder layer's cross-attention K/V once for the window; empties
  // the decoder (fed() becomes 0). `cancel` (when set) is polled between layers: Errc::cancelled. Errors from the
  // device (out_of_memory, device_lost) are returned as such.
  virtual Status encode(std::span<const float> mel, const std::atomic<bool>* cancel) = 0;
  // Feeds `tokens` (at least one) after the fed() tokens already in the decoder's self-attention cache and returns
  // the logits (vocab floats, before any suppression) at the last of them. invalid_argument when an id is out of
  // range or fed() + tokens.size() exceeds the model's text positions; failed_precondition-like misuse (decode
  // before encode) is invalid_argument too.
  virtual Result<std::vector<float>> decode(std::span<const TokenId> tokens, const std::atomic<bool>* cancel) = 0;
  // Keeps only the first `n` fed tokens (n ≤ fed()): the next decode continues after them.
  virtual void rewind(std::size_t n) = 0;
  virtual std::size_t fed() const = 0;
};

}  // namespace tandem::speech
