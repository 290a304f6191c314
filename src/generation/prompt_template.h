// Prompt templates: turn a conversation into the text + special tokens a chat model was trained on.
// Rendering yields segments (text, BOS, EOS) so special tokens are inserted as ids and never spelled as text that
// a user could forge inside their message.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace tandem::gen {

enum class TemplateKind { raw, llama2, chatml, zephyr };

std::string_view template_name(TemplateKind k);
Result<TemplateKind> parse_template(std::string_view name);  // "raw", "llama2", "chatml", "zephyr"

struct Message {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

struct Segment {
  enum Kind { text, bos, eos } kind = text;
  std::string content;  // for text
};

// raw: the concatenated contents of all messages, preceded by BOS. Others render the model family's chat format
// and end with the assistant prefix (so the model answers). Errors: invalid_argument for an unknown role, an empty
// conversation, or (llama2) roles not alternating user/assistant after an optional system message.
Result<std::vector<Segment>> render(TemplateKind kind, const std::vector<Message>& messages);

// Stop strings a template implies in addition to EOS (e.g. "<|im_end|>" for ChatML).
std::vector<std::string> template_stops(TemplateKind kind);

}  // namespace tandem::gen
