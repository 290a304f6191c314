// Chat templates: render a model's own Hugging Face `chat_template` (Jinja) — the text from tokenizer_config.json
// or the GGUF key tokenizer.chat_template — the way transformers' apply_chat_template does, with a bounded
// Jinja-subset engine (src/generation/jinja_*; the subset is in docs/chat-templates.md).
//
// Trust: the result is a list of pieces, each marked trusted (written by the template itself, or a special
// variable such as bos_token the caller passed in ChatTemplateOptions) or untrusted (bytes that came from the
// messages). The tokenizer must recognise special tokens (<|eot_id|>, <|im_end|>, [INST], ...) only inside
// trusted pieces, so a user who types "<|eot_id|>" in a message gets plain text. Flags survive every string
// operation (concatenation, ~, trim/strip, slicing, replace, split, join, case changes, tojson): a byte keeps
// the flag of where it came from; numbers/booleans/None printed by the template are trusted.
#pragma once

#include <cstddef>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "generation/prompt_template.h"

namespace tandem::gen {

namespace jinja {
struct Stmt;
}

struct RenderedPiece {
  std::string text;
  bool trusted = false;

  friend bool operator==(const RenderedPiece&, const RenderedPiece&) = default;
};

struct ChatTemplateOptions {
  // HF's add_generation_prompt: end with the assistant's header so the model answers.
  bool add_generation_prompt = true;
  // Passed as the template variables bos_token / eos_token (trusted). Empty strings are passed as "" (defined).
  std::string bos_token, eos_token;
  // Further trusted variables, e.g. {"pad_token", "<pad>"}, {"unk_token", "<unk>"}; they override the above.
  std::map<std::string, std::string> special_vars;
  // Boolean variables a template tests (HF's apply_chat_template(**kwargs)), e.g. {"enable_thinking", false} for
  // Qwen3's "thinking off" (an empty <think></think> after the assistant header); undefined when absent.
  std::map<std::string, bool> flag_vars;
  // Time source for strftime_now() (formatted in local time like HF's datetime.now()); null = the real clock.
  std::function<std::time_t()> clock;
  // Bound on the rendered bytes (and on any single string built while rendering).
  std::size_t max_output_bytes = 1 << 20;
};

class ChatTemplate {
 public:
  static constexpr std::size_t kMaxSourceBytes = 256 * 1024;

  // Parses `source` once; `origin` prefixes error messages ("chat_template:12: unsupported filter 'wordwrap'").
  // Errors: invalid_argument (source over kMaxSourceBytes), format_error (syntax), unsupported (a statement,
  // filter, test or form outside the subset, or nesting deeper than 64).
  static Result<ChatTemplate> parse(std::string_view source, std::string origin = "chat_template");

  // Renders with the variables HF passes: messages (a list of {role, content} dicts; strings untrusted),
  // add_generation_prompt, bos_token, eos_token, special_vars, tools = None, documents = None. Adjacent pieces
  // of the same flag are merged; empty pieces are dropped.
  // Errors, messages "<origin>:<line>: ...":
  //   invalid_argument — this conversation cannot be rendered: the template's raise_exception(msg) (message
  //     "<origin>:<line>: template raised: <msg>"), runtime type errors, undefined values used the way jinja2's
  //     default Undefined refuses them, division by zero, integer overflow, and the limits (max_output_bytes,
  //     1M evaluation steps, 100k-item lists/range, value nesting 64, macro depth 32);
  //   unsupported — a construct met only at run time outside the subset (a method such as str.format, tojson
  //     separators, a namespace stored in a namespace);
  //   out_of_memory / internal — allocation failure / a bug (never expected). Never throws.
  // Deterministic for equal inputs (strftime_now aside); safe to call concurrently on one ChatTemplate.
  Result<std::vector<RenderedPiece>> render(const std::vector<Message>& messages,
                                            const ChatTemplateOptions& options) const;

  const std::string& source() const { return source_; }
  const std::string& origin() const { return origin_; }

 private:
  ChatTemplate() = default;
  std::string source_, origin_;
  std::shared_ptr<const std::vector<std::unique_ptr<jinja::Stmt>>> body_;
};

// The pieces' texts concatenated (for logs, tests and the fingerprint; NOT for tokenizing).
std::string flatten(const std::vector<RenderedPiece>& pieces);

}  // namespace tandem::gen
