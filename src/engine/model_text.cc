// The text side of Model: the tokenizer and its source, the prompt template, encoding, stop ids, sampling defaults
// and the fingerprint components they decide. No ATen operators here (model_impl.h brings only the Tensor type).
#include <algorithm>
#include <filesystem>
#include <sstream>

#include "core/sha256.h"
#include "engine/model_impl.h"
#include "tokenizer/model_tokenizer.h"

namespace tandem::engine {

Result<LoadedTokenizer> load_tokenizer(const weights::ModelDir& dir) {
  auto t = tok::load_model_tokenizer(dir);
  if (!t) return fail(std::move(t).error());
  std::string origin;
  if (dir.format() == weights::ModelDir::Format::gguf) {
    origin = dir.model_path() + " (tokenizer.ggml.*)";
  } else {
    std::error_code ec;
    origin = std::filesystem::is_regular_file(dir.tokenizer_json_path(), ec) ? dir.tokenizer_json_path()
                                                                              : dir.tokenizer_path();
  }
  return LoadedTokenizer{std::move(t).value(), std::move(origin)};
}

Status Model::Impl::select_template() {
  adds_bos = tok::model_adds_bos(dir, tokenizer);
  const std::string& source = dir.tokenizer_settings().chat_template;
  const std::string origin = dir.format() == weights::ModelDir::Format::gguf
                                 ? dir.model_path() + " (tokenizer.chat_template)"
                                 : dir.dir() + "/tokenizer_config.json chat_template";
  if (!opts.template_name.empty()) {
    auto t = gen::parse_template(opts.template_name);
    if (!t) return fail(std::move(t).error());
    templ = *t;
    if (templ != gen::TemplateKind::model) return {};
    // Asked for explicitly: a missing or unusable template fails the load.
    if (source.empty())
      return fail(Errc::invalid_argument,
                  "template 'model': " + dir.model_path() + " has no chat_template (tokenizer_config.json / GGUF)");
    auto ct = gen::ChatTemplate::parse(source, origin);
    if (!ct) return fail(std::move(ct).error());
    chat_template = std::make_shared<const gen::ChatTemplate>(std::move(ct).value());
    return {};
  }
  if (source.empty()) {
    templ = gen::TemplateKind::raw;
    return {};
  }
  templ = gen::TemplateKind::model;
  auto ct = gen::ChatTemplate::parse(source, origin);
  if (ct) {
    chat_template = std::make_shared<const gen::ChatTemplate>(std::move(ct).value());
  } else {
    Error e = std::move(ct).error();
    e.message += " (set the model's template to raw, llama2, chatml or zephyr to use a built-in one)";
    chat_template_error = std::move(e);
  }
  return {};
}

std::vector<std::pair<std::string, std::string>> Model::Impl::text_fingerprint(const Model& m) const {
  std::ostringstream stops;
  for (auto id : m.eos_ids()) stops << "eos:" << id << ";";
  for (const auto& s : gen::template_stops(templ)) stops << "str:" << s.size() << ":" << s << ";";
  std::string templ_desc(gen::template_name(templ));
  if (templ == gen::TemplateKind::model) {
    // The template text decides the prompt ids; an unusable one is a different replica from a usable one.
    templ_desc += ":" + Sha256::hex(Sha256::of(dir.tokenizer_settings().chat_template));
    if (chat_template_error) templ_desc += ":unusable";
  }
  std::ostringstream specials;
  for (auto id : tokenizer.special_ids()) specials << id << ",";
  specials << ";bos=" << tokenizer.bos_id() << ";eos=" << tokenizer.eos_id() << ";eot=" << tokenizer.eot_id();
  return {
      {"tokenizer", Sha256::hex(Sha256::of(tokenizer.model_bytes()))},
      {"pre_tokenizer", tokenizer.pre_tokenizer_name()},
      {"special_ids", specials.str()},
      {"template", templ_desc},
      {"add_bos", m.add_bos() ? "1" : "0"},
      {"sampling_defaults", m.default_sampling().describe()},
      {"stop_rules", stops.str()},
  };
}

const tok::Tokenizer& Model::tokenizer() const { return impl_->tokenizer; }
gen::TemplateKind Model::prompt_template() const { return impl_->templ; }

gen::SamplingParams Model::default_sampling() const {
  gen::SamplingParams p;
  const auto& g = impl_->dir.generation();
  const bool sample = g.do_sample.value_or(false);
  p.temperature = sample ? g.temperature.value_or(1.0) : 0.0;
  if (g.top_k) p.top_k = *g.top_k;
  if (g.top_p) p.top_p = *g.top_p;
  if (g.repetition_penalty) p.repetition_penalty = *g.repetition_penalty;
  return p;
}

std::vector<TokenId> Model::eos_ids() const {
  std::vector<TokenId> out;
  auto add = [&](int id) {
    if (id >= 0 && std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  };
  for (int id : impl_->dir.generation().eos_token_ids) add(id);
  for (int id : impl_->cfg().eos_token_ids) add(id);
  add(impl_->tokenizer.eos_id());
  // The end-of-turn token (GGUF eot_token_id, or <|eot_id|> / <|im_end|> / <|end|> ...): a chat model ends its
  // answer with it even where eos is another token (Llama 3's <|end_of_text|>).
  add(impl_->tokenizer.eot_id());
  return out;
}

bool Model::add_bos() const { return impl_->adds_bos; }

// Built-in templates: BOS / EOS become ids; the text between them is one run for the tokenizer, in which only the
// template's markup may spell special tokens (tok::Tokenizer::encode_pieces).
std::vector<TokenId> Model::encode(const std::vector<gen::Segment>& segments) const {
  const tok::Tokenizer& t = impl_->tokenizer;
  std::vector<TokenId> out;
  std::vector<tok::TextPiece> run;
  auto flush = [&] {
    if (run.empty()) return;
    auto ids = t.encode_pieces(run);
    out.insert(out.end(), ids.begin(), ids.end());
    run.clear();
  };
  for (const auto& s : segments) {
    switch (s.kind) {
      case gen::Segment::bos:
        flush();
        if (add_bos()) out.push_back(t.bos_id());
        break;
      case gen::Segment::eos:
        flush();
        if (t.eos_id() >= 0) out.push_back(t.eos_id());
        break;
      case gen::Segment::text:
      case gen::Segment::markup:
        if (!s.content.empty()) run.push_back({s.content, s.kind == gen::Segment::markup});
        break;
    }
  }
  flush();
  return out;
}

Result<std::vector<TokenId>> Model::encode_chat(const std::vector<gen::Message>& messages,
                                                const std::map<std::string, bool>& flags) const {
  const Impl& im = *impl_;
  if (im.templ != gen::TemplateKind::model) {
    auto segs = gen::render(im.templ, messages);
    if (!segs) return fail(std::move(segs).error());
    return encode(*segs);
  }
  if (im.chat_template_error) return fail(*im.chat_template_error);
  if (messages.empty()) return fail(Errc::invalid_argument, "empty conversation: at least one message is needed");
  // As transformers' apply_chat_template: the special tokens' spellings as template variables, the rendered text
  // tokenized without adding BOS/EOS (the template writes bos_token where the model wants it).
  const tok::Tokenizer& t = im.tokenizer;
  gen::ChatTemplateOptions o;
  o.add_generation_prompt = true;
  if (t.bos_id() >= 0) o.bos_token = t.piece(t.bos_id());
  if (t.eos_id() >= 0) o.eos_token = t.piece(t.eos_id());
  if (t.unk_id() >= 0) o.special_vars["unk_token"] = t.piece(t.unk_id());
  if (t.pad_id() >= 0) o.special_vars["pad_token"] = t.piece(t.pad_id());
  o.flag_vars = flags;
  auto rendered = im.chat_template->render(messages, o);
  if (!rendered) return fail(std::move(rendered).error());
  std::vector<tok::TextPiece> pieces;
  pieces.reserve(rendered->size());
  for (const auto& p : *rendered) pieces.push_back({p.text, p.trusted});
  return t.encode_pieces(pieces);
}

std::vector<TokenId> Model::encode_text(std::string_view text) const {
  tok::EncodeOptions o;
  o.add_bos = add_bos();
  return impl_->tokenizer.encode(text, o);
}

}  // namespace tandem::engine
