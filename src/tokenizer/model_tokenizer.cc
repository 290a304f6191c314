// load_model_tokenizer (model_tokenizer.h).
#include "tokenizer/model_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "weights/gguf_tokenizer.h"

namespace tandem::tok {
namespace {

constexpr std::uintmax_t kMaxTokenizerJson = 512u << 20;

Result<std::string> read_file(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return fail(Errc::io_error, path + ": cannot read (" + ec.message() + ")");
  if (size > kMaxTokenizerJson) return fail(Errc::format_error, path + ": is larger than 512 MiB");
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(Errc::io_error, path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return fail(Errc::io_error, path + ": read error");
  return std::move(ss).str();
}

// tokenizer.json, else vocab.json + merges.txt; not_found when neither is there.
Result<Tokenizer> load_hf_files(const std::string& dir) {
  std::error_code ec;
  const std::string json_path = dir + "/tokenizer.json";
  if (std::filesystem::is_regular_file(json_path, ec)) {
    auto text = read_file(json_path);
    if (!text) return fail(std::move(text).error());
    return Tokenizer::from_hf_json(*text, json_path);
  }
  const std::string vocab_path = dir + "/vocab.json";
  const std::string merges_path = dir + "/merges.txt";
  if (std::filesystem::is_regular_file(vocab_path, ec) && std::filesystem::is_regular_file(merges_path, ec)) {
    auto vocab = read_file(vocab_path);
    if (!vocab) return fail(std::move(vocab).error());
    auto merges = read_file(merges_path);
    if (!merges) return fail(std::move(merges).error());
    VocabMergesOptions o;
    o.vocab_origin = vocab_path;
    o.merges_origin = merges_path;
    return Tokenizer::from_vocab_merges(*vocab, *merges, o);
  }
  return fail(Errc::not_found, dir + ": no tokenizer.json or vocab.json + merges.txt");
}

}  // namespace

Result<Tokenizer> load_tokenizer_files(const std::string& dir) {
  if (auto t = load_hf_files(dir); t.ok() || t.error().code != Errc::not_found) return t;
  std::error_code ec;
  const std::string model_path = dir + "/tokenizer.model";
  if (std::filesystem::is_regular_file(model_path, ec)) return Tokenizer::load_file(model_path);
  return fail(Errc::not_found, dir + ": no tokenizer.json, vocab.json + merges.txt or tokenizer.model");
}

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
  if (auto t = load_hf_files(dir.dir()); t.ok() || t.error().code != Errc::not_found) return t;
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
