// One request's token loop on a Model: prefill (chunked), sample, stop rules, streaming-safe text, checkpoints.
// Torch-free: it only talks to Model's plain-vector API.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "engine/model.h"
#include "generation/sampler.h"
#include "generation/stop.h"

namespace tandem::engine {

struct GenerateRequest {
  std::vector<TokenId> prompt;             // already tokenized (template rendered, BOS included)
  gen::SamplingParams sampling;
  int max_new_tokens = 128;                // counts resumed tokens too: it is the same request
  std::vector<std::string> stop_strings;   // matched across token boundaries, never emitted
  bool stop_at_eos = true;                 // the model's EOS ids end the generation (the EOS is not emitted)
  std::vector<TokenId> resume_tokens;      // checkpoint: tokens already generated (and delivered) earlier
  int prefill_chunk = 0;                   // 0 = the whole prompt in one forward; else at most this many tokens
  // Resume reproduces the interrupted run exactly (same build, same thread count, same prefill_chunk) by feeding
  // the checkpoint one token at a time, as the original decode did. false: one batched forward — faster, but its
  // rounding differs and a near-tie in sampling can then go the other way.
  bool exact_resume = true;
  // Offload (the ladder's offload rung): run layers [0, gpu_layers) on the replica's accelerator and the rest on
  // the CPU (Model::new_sequence). -1 = as the replica places them.
  int gpu_layers = -1;
};

enum class FinishReason { running, eos, stop_string, max_tokens, context_full, cancelled, error };
std::string_view finish_reason_name(FinishReason r);

struct TokenEvent {
  TokenId token = 0;       // -1 for a final text-only event (see generate())
  std::uint64_t step = 0;  // 0-based index of this token among the generated tokens
  std::string text;        // text that became safe to show with this token (may be empty)
};

struct GenerationStats {
  std::int64_t prompt_tokens = 0;   // prefilled (prompt + resumed tokens)
  std::int64_t new_tokens = 0;      // generated in this run (not counting resumed ones)
  double prefill_ms = 0;
  double decode_ms = 0;             // sampling + forward of generated tokens
  double prefill_tokens_per_s() const { return prefill_ms > 0 ? prompt_tokens * 1000.0 / prefill_ms : 0; }
  double decode_tokens_per_s() const { return decode_ms > 0 ? new_tokens * 1000.0 / decode_ms : 0; }
};

class Generation {
 public:
  // Validates the request (sampling ranges, max_new_tokens in [1, max context], non-empty prompt, stop strings
  // at most 16 × 256 bytes) and opens a KV sequence. Nothing runs yet.
  static Result<std::unique_ptr<Generation>> create(std::shared_ptr<Model> model, GenerateRequest req);

  // Runs the prompt (+ resumed tokens) through the model. kv_exhausted / context overflow come back as errors;
  // the generation is then finished with FinishReason::error and its blocks released.
  Status prefill();
  // Samples and returns the next token. Call only while !finished(). After the last token, finished() is true.
  Result<TokenEvent> step();
  // Ends the generation now (releases the KV blocks). Text held back for a possible stop string is dropped.
  void cancel();

  // --- Driving by a BatchRunner (continuous batching): the runner runs one forward for many generations per step.
  // The same forwards, in the same chunks, as prefill() + step() with the same prefill_chunk: each token comes from
  // the logits of the same inputs, so the tokens do not depend on how generations were grouped.
  // The tokens the next forward must take: the next prompt chunk (of `chunk` tokens, 0 = the rest of the prompt),
  // the next checkpoint token(s) (one at a time with exact_resume), or the last sampled token. Empty once finished.
  std::span<const TokenId> next_input(int chunk) const;
  bool prefilling() const { return !prefilled_; }
  // The forward of next_input(chunk) returned `logits` (of its last position). Advances past that input; once the
  // prompt and the checkpoint are in, samples the next token and returns its event (nullopt while prefilling, or
  // when the generation ended without a new token: a complete checkpoint).
  std::optional<TokenEvent> advance(int chunk, std::vector<float> logits);
  // The forward of next_input() failed: finishes with FinishReason::error (the sequence's blocks released).
  void fail_step();
  Sequence& sequence() { return *seq_; }

  bool finished() const { return reason_ != FinishReason::running; }
  FinishReason finish_reason() const { return reason_; }
  // All generated tokens, resumed ones included: a checkpoint to resume from.
  const std::vector<TokenId>& tokens() const { return generated_; }
  // Text emitted by this run. It continues the prompt's text: a first token "▁word" keeps its space.
  const std::string& text() const { return text_; }
  // Text of text() not yet handed out in a TokenEvent (step() hands out everything up to its token, including the
  // tail released when the generation finishes).
  std::string take_text();
  const GenerationStats& stats() const { return stats_; }
  const GenerateRequest& request() const { return req_; }

 private:
  Generation(std::shared_ptr<Model> m, GenerateRequest r, std::unique_ptr<Sequence> s);
  void finish(FinishReason r);
  std::string emit_text(TokenId id);
  void consumed(std::size_t n, std::vector<float> logits);  // n input tokens went through a forward
  void end_prefill();                                       // prompt and checkpoint are in
  TokenEvent sample_next();                                 // samples from logits_, applies the stop rules

  std::shared_ptr<Model> model_;
  GenerateRequest req_;
  std::unique_ptr<Sequence> seq_;
  tok::StreamDecoder decoder_;
  gen::StopMatcher stops_;
  std::vector<TokenId> eos_;
  std::vector<TokenId> history_;   // prompt + generated, for the repetition penalty
  std::vector<TokenId> generated_;
  std::vector<float> logits_;
  std::string text_;
  std::size_t delivered_ = 0;
  std::size_t fed_prompt_ = 0;  // prompt tokens through the model
  std::size_t fed_resume_ = 0;  // checkpoint tokens through the model
  std::size_t resume_feed_ = 0; // checkpoint tokens to feed (the last one may not fit the context)
  bool prefilled_ = false;
  FinishReason reason_ = FinishReason::running;
  GenerationStats stats_;
};

// Runs a whole generation; `on_token` may return false to cancel. Returns the finished Generation. If text is
// left when the generation ends without a new token (a complete checkpoint), it comes as a last event with token -1.
Result<std::unique_ptr<Generation>> generate(std::shared_ptr<Model> model, GenerateRequest req,
                                             const std::function<bool(const TokenEvent&)>& on_token = {});

}  // namespace tandem::engine
