// Prompt templates: turn a conversation into the text + special tokens a chat model was trained on.
// Rendering yields segments (text, markup, BOS, EOS) so special tokens are inserted as ids and never spelled as text
// that a user could forge inside their message: `text` is caller content (encoded as plain text even where it spells
// "<|im_end|>"), `markup` is the template's own text, in which the tokenizer recognises special-token spellings
// (ChatML's "<|im_start|>" becomes its id when the vocabulary has it as a special token). Adjacent text and markup
// are tokenized as one run (tok::Tokenizer::encode_pieces), so the ids equal the model's own tokenizer on the whole
// string whenever the content spells no special token.
//
// `model` is the model's own Jinja chat_template (tokenizer_config.json or GGUF tokenizer.chat_template), rendered by
// gen::ChatTemplate (chat_template.h) in the engine, which knows the template text; render() refuses it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace tandem::gen {

enum class TemplateKind { raw, llama2, chatml, zephyr, model };

std::string_view template_name(TemplateKind k);
Result<TemplateKind> parse_template(std::string_view name);  // "raw", "llama2", "chatml", "zephyr", "model"

struct Message {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

struct Segment {
  enum Kind { text, bos, eos, markup } kind = text;
  std::string content;  // for text and markup
};

// raw: the concatenated contents of all messages, preceded by BOS. Others render the model family's chat format
// and end with the assistant prefix (so the model answers). Errors: invalid_argument for an unknown role, an empty
// conversation, or (llama2) roles not alternating user/assistant after an optional system message, and for `model`
// (rendered by the engine with the model's template).
Result<std::vector<Segment>> render(TemplateKind kind, const std::vector<Message>& messages);

// The Hugging Face chat_template (Jinja) text of a built-in kind as its model family ships it — Meta's Llama 2 chat
// template, plain ChatML, HuggingFaceH4's Zephyr — for writers of test models (tandem-mkmodel --chat-template), so
// a model carries a real template that gen::ChatTemplate renders. "" for raw and model.
std::string_view builtin_template_source(TemplateKind kind);

// Stop strings a template implies in addition to EOS (e.g. "<|im_end|>" for ChatML).
std::vector<std::string> template_stops(TemplateKind kind);

}  // namespace tandem::gen
