#include "engine/generation.h"

#include <algorithm>

namespace tandem::engine {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
}  // namespace

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::running: return "running";
    case FinishReason::eos: return "eos";
    case FinishReason::stop_string: return "stop_string";
    case FinishReason::max_tokens: return "max_tokens";
    case FinishReason::context_full: return "context_full";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
  }
  return "error";
}

Generation::Generation(std::shared_ptr<Model> m, GenerateRequest r, std::unique_ptr<Sequence> s)
    : model_(std::move(m)), req_(std::move(r)), seq_(std::move(s)), decoder_(model_->tokenizer(), /*at_text_start=*/false),
      stops_(req_.stop_strings) {
  if (req_.stop_at_eos) eos_ = model_->eos_ids();
}

Result<std::unique_ptr<Generation>> Generation::create(std::shared_ptr<Model> model, GenerateRequest req) {
  TANDEM_TRY(req.sampling.validate());
  if (req.prompt.empty()) return fail(Errc::invalid_argument, "empty prompt: at least one token is needed");
  const int ctx = model->max_context();
  if (req.max_new_tokens < 1 || req.max_new_tokens > ctx)
    return fail(Errc::invalid_argument, "max_new_tokens must be in [1, " + std::to_string(ctx) + "], got " +
                                            std::to_string(req.max_new_tokens));
  if (req.prefill_chunk < 0) return fail(Errc::invalid_argument, "prefill_chunk must be >= 0");
  if (req.stop_strings.size() > 16) return fail(Errc::invalid_argument, "at most 16 stop strings");
  for (const auto& s : req.stop_strings)
    if (s.size() > 256) return fail(Errc::invalid_argument, "a stop string is longer than 256 bytes");
  if (static_cast<int>(req.resume_tokens.size()) > req.max_new_tokens)
    return fail(Errc::invalid_argument, "checkpoint holds more tokens than max_new_tokens");
  if (static_cast<std::int64_t>(req.prompt.size()) >= ctx)
    return fail(Errc::invalid_argument, "prompt (" + std::to_string(req.prompt.size()) +
                                            " tokens) leaves no room in the context of " + std::to_string(ctx));
  // A run ends with context_full once prompt + generated = ctx + 1 (the last token is sampled, not cached), so a
  // checkpoint may be that long.
  if (static_cast<std::int64_t>(req.prompt.size() + req.resume_tokens.size()) > ctx + 1)
    return fail(Errc::invalid_argument, "prompt (" + std::to_string(req.prompt.size()) + " tokens) + checkpoint (" +
                                            std::to_string(req.resume_tokens.size()) +
                                            ") exceed the context of " + std::to_string(ctx) + " by more than one");
  const int vocab = model->config().vocab_size;
  for (auto t : req.resume_tokens)
    if (t < 0 || t >= vocab) return fail(Errc::invalid_argument, "checkpoint token outside the vocabulary");
  auto seq = model->new_sequence(req.gpu_layers);
  if (!seq) return fail(std::move(seq).error());
  // The original run may have sampled one token past the cache (context_full): that one is not fed.
  const std::int64_t room = ctx - static_cast<std::int64_t>(req.prompt.size());
  const std::size_t resume_feed =
      std::min<std::size_t>(req.resume_tokens.size(), static_cast<std::size_t>(std::max<std::int64_t>(room, 0)));
  std::unique_ptr<Generation> g(new Generation(std::move(model), std::move(req), std::move(seq).value()));
  g->resume_feed_ = resume_feed;
  return g;
}

void Generation::finish(FinishReason r) {
  if (finished()) return;
  reason_ = r;
  if (r != FinishReason::cancelled && r != FinishReason::error) {
    text_ += stops_.flush();
    const std::string tail = decoder_.flush();
    text_ += tail;  // an incomplete UTF-8 tail at the very end: emitted as U+FFFD by the decoder
  }
  seq_->release();
}

void Generation::cancel() { finish(FinishReason::cancelled); }

std::string Generation::emit_text(TokenId id) {
  const auto out = stops_.push(decoder_.push(id));
  return out.emit;
}

std::span<const TokenId> Generation::next_input(int chunk) const {
  if (finished()) return {};
  if (!prefilled_) {
    const std::span<const TokenId> prompt(req_.prompt);
    if (fed_prompt_ < prompt.size()) {
      const std::size_t rest = prompt.size() - fed_prompt_;
      return prompt.subspan(fed_prompt_, chunk > 0 ? std::min(rest, static_cast<std::size_t>(chunk)) : rest);
    }
    const std::span<const TokenId> resume(req_.resume_tokens);
    return resume.subspan(fed_resume_, req_.exact_resume ? 1 : resume_feed_ - fed_resume_);
  }
  return std::span<const TokenId>(&generated_.back(), 1);
}

void Generation::consumed(std::size_t n, std::vector<float> logits) {
  logits_ = std::move(logits);
  if (prefilled_) return;
  if (fed_prompt_ < req_.prompt.size())
    fed_prompt_ += n;
  else
    fed_resume_ += n;
  if (fed_prompt_ == req_.prompt.size() && fed_resume_ == resume_feed_) end_prefill();
}

// The prompt and the fed part of the checkpoint are in: replay the checkpoint's tokens through the decoder and stop
// matcher without emitting (the client already has that text; held-back bytes and stop-string prefixes end up in
// the same state as in the first run), then apply the stop rules to it.
void Generation::end_prefill() {
  history_ = req_.prompt;
  for (TokenId t : req_.resume_tokens) {
    generated_.push_back(t);
    history_.push_back(t);
    if (std::find(eos_.begin(), eos_.end(), t) == eos_.end()) (void)emit_text(t);
  }
  prefilled_ = true;
  stats_.prompt_tokens = static_cast<std::int64_t>(history_.size());
  if (!generated_.empty() && std::find(eos_.begin(), eos_.end(), generated_.back()) != eos_.end())
    finish(FinishReason::eos);
  else if (stops_.stopped())
    finish(FinishReason::stop_string);
  else if (static_cast<int>(generated_.size()) >= req_.max_new_tokens)
    finish(FinishReason::max_tokens);
  else if (resume_feed_ < req_.resume_tokens.size())
    finish(FinishReason::context_full);
}

Status Generation::prefill() {
  if (prefilled_ || finished()) return fail(Errc::illegal_transition, "prefill: already prefilled or finished");
  const auto t0 = Clock::now();
  // The prompt in the request's chunks, then the checkpoint. Exact resume feeds it one token at a time — the
  // kernels of the original decode steps — so the logits, and with them every later draw, are bit-identical on the
  // same build. A batched re-prefill is faster but its rounding differs, which can flip a near-tie in sampling.
  while (!prefilled_ && !finished()) {
    const std::span<const TokenId> in = next_input(req_.prefill_chunk);
    if (in.empty()) {  // an empty checkpoint feed: nothing more to run
      end_prefill();
      break;
    }
    auto logits = model_->forward(*seq_, in);
    if (!logits) {
      finish(FinishReason::error);
      return fail(std::move(logits).error());
    }
    consumed(in.size(), std::move(logits).value());
  }
  stats_.prefill_ms = ms_since(t0);
  return {};
}

std::string Generation::take_text() {
  std::string out = text_.substr(delivered_);
  delivered_ = text_.size();
  return out;
}

TokenEvent Generation::sample_next() {
  TokenEvent ev;
  ev.step = generated_.size();
  ev.token = gen::sample(logits_, history_, req_.sampling, ev.step);
  generated_.push_back(ev.token);
  history_.push_back(ev.token);
  ++stats_.new_tokens;
  if (std::find(eos_.begin(), eos_.end(), ev.token) != eos_.end()) {
    finish(FinishReason::eos);  // releases any text held back for a possible stop string
  } else {
    text_ += emit_text(ev.token);
    if (stops_.stopped())
      finish(FinishReason::stop_string);
    else if (static_cast<int>(generated_.size()) >= req_.max_new_tokens)
      finish(FinishReason::max_tokens);
    else if (seq_->length() + 1 > model_->max_context())
      finish(FinishReason::context_full);
  }
  return ev;
}

Result<TokenEvent> Generation::step() {
  if (!prefilled_) TANDEM_TRY(prefill());
  if (finished()) return fail(Errc::illegal_transition, "step: the generation has finished");
  const auto t0 = Clock::now();
  TokenEvent ev = sample_next();
  if (!finished()) {
    const TokenId t = ev.token;
    auto logits = model_->forward(*seq_, std::span(&t, 1));
    if (!logits) {
      finish(FinishReason::error);
      stats_.decode_ms += ms_since(t0);
      return fail(std::move(logits).error());
    }
    consumed(1, std::move(logits).value());
  }
  ev.text = take_text();
  stats_.decode_ms += ms_since(t0);
  return ev;
}

std::optional<TokenEvent> Generation::advance(int chunk, std::vector<float> logits) {
  if (finished()) return std::nullopt;
  const std::size_t n = next_input(chunk).size();
  consumed(n, std::move(logits));
  if (finished() || !prefilled_) return std::nullopt;
  TokenEvent ev = sample_next();
  ev.text = take_text();
  return ev;
}

void Generation::fail_step() { finish(FinishReason::error); }

Result<std::unique_ptr<Generation>> generate(std::shared_ptr<Model> model, GenerateRequest req,
                                             const std::function<bool(const TokenEvent&)>& on_token) {
  auto g = Generation::create(std::move(model), std::move(req));
  if (!g) return g;
  TANDEM_TRY((*g)->prefill());
  while (!(*g)->finished()) {
    auto ev = (*g)->step();
    if (!ev) return fail(std::move(ev).error());
    if (on_token && !on_token(*ev)) (*g)->cancel();
  }
  // A generation that ended in prefill (a checkpoint already complete) still releases its held-back text.
  if (std::string tail = (*g)->take_text(); !tail.empty() && on_token) {
    TokenEvent ev;
    ev.token = -1;
    ev.step = (*g)->tokens().size();
    ev.text = std::move(tail);
    on_token(ev);
  }
  return g;
}

}  // namespace tandem::engine
