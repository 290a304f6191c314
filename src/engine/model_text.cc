// The text side of Model: the tokenizer and its source, the prompt template, encoding, stop ids, sampling defaults
// and the fingerprint components they decide. No ATen operators here (model_impl.h brings only the Tensor type).
#include <algorithm>
#include <sstream>

#include "core/sha256.h"
#include "engine/model_impl.h"

namespace tandem::engine {

Result<LoadedTokenizer> load_tokenizer(const weights::ModelDir& dir) {
  auto bytes = dir.tokenizer_bytes();
  if (!bytes) return fail(std::move(bytes).error());
  std::string origin = dir.format() == weights::ModelDir::Format::gguf ? dir.model_path() + " (tokenizer.ggml.*)"
                                                                        : dir.tokenizer_path();
  auto t = tok::Tokenizer::from_bytes(*bytes, origin);
  if (!t) return fail(std::move(t).error());
  return LoadedTokenizer{std::move(t).value(), std::move(origin)};
}

Result<gen::TemplateKind> select_template(const weights::ModelDir& dir, const LoadOptions& opts) {
  if (!opts.template_name.empty()) return gen::parse_template(opts.template_name);
  if (!dir.tokenizer_settings().template_guess.empty()) {
    auto t = gen::parse_template(dir.tokenizer_settings().template_guess);
    if (t) return *t;
  }
  return gen::TemplateKind::raw;
}

std::vector<std::pair<std::string, std::string>> Model::Impl::text_fingerprint(const Model& m) const {
  std::ostringstream stops;
  for (auto id : m.eos_ids()) stops << "eos:" << id << ";";
  for (const auto& s : gen::template_stops(templ)) stops << "str:" << s.size() << ":" << s << ";";
  return {
      {"tokenizer", Sha256::hex(Sha256::of(tokenizer.model_bytes()))},
      {"template", std::string(gen::template_name(templ))},
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
  return out;
}

bool Model::add_bos() const {
  return impl_->dir.tokenizer_settings().add_bos_token.value_or(true) && impl_->tokenizer.bos_id() >= 0;
}

std::vector<TokenId> Model::encode(const std::vector<gen::Segment>& segments) const {
  std::vector<TokenId> out;
  for (const auto& s : segments) {
    switch (s.kind) {
      case gen::Segment::bos:
        if (add_bos()) out.push_back(impl_->tokenizer.bos_id());
        break;
      case gen::Segment::eos:
        if (impl_->tokenizer.eos_id() >= 0) out.push_back(impl_->tokenizer.eos_id());
        break;
      case gen::Segment::text: {
        auto ids = impl_->tokenizer.encode(s.content);
        out.insert(out.end(), ids.begin(), ids.end());
        break;
      }
    }
  }
  return out;
}

Result<std::vector<TokenId>> Model::encode_chat(const std::vector<gen::Message>& messages) const {
  auto segs = gen::render(impl_->templ, messages);
  if (!segs) return fail(std::move(segs).error());
  return encode(*segs);
}

std::vector<TokenId> Model::encode_text(std::string_view text) const {
  return encode({{gen::Segment::bos, {}}, {gen::Segment::text, std::string(text)}});
}

}  // namespace tandem::engine
