// load_model_tokenizer (model_tokenizer.h).
#include "tokenizer/model_tokenizer.h"

#include "weights/gguf_tokenizer.h"

namespace tandem::tok {

Result<Tokenizer> load_model_tokenizer(const weights::ModelDir& dir) {
  if (dir.format() == weights::ModelDir::Format::gguf) {
    const weights::GgufFile* g = dir.gguf();
    if (g == nullptr) return fail(Errc::internal, dir.model_path() + ": GGUF model without its file");
    const weights::GgufValue* model = g->find("tokenizer.ggml.model");
    if (model != nullptr && model->type == weights::GgufType::string && model->str == "gpt2") {
      auto v = weights::bpe_vocab_from_gguf(*g);
      if (!v) return fail(std::move(v).error());
      return Tokenizer::from_bpe_vocab(*v, g->path());
    }
    auto bytes = dir.tokenizer_bytes();
    if (!bytes) return fail(std::move(bytes).error());
    return Tokenizer::from_bytes(*bytes, g->path());
  }
  if (auto t = load_hf_tokenizer_files(dir.dir()); t.ok() || t.error().code != Errc::not_found) return t;
  auto bytes = dir.tokenizer_bytes();
  if (!bytes) return fail(std::move(bytes).error());
  return Tokenizer::from_bytes(*bytes, dir.tokenizer_path());
}

bool model_adds_bos(const weights::ModelDir& dir, const Tokenizer& tok) {
  const auto& s = dir.tokenizer_settings();
  if (s.add_bos_token) return *s.add_bos_token && tok.bos_id() >= 0;
  return tok.adds_bos();
}

}  // namespace tandem::tok
