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

}  // namespace

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
  const std::string json_path = dir.dir() + "/tokenizer.json";
  std::error_code ec;
  if (std::filesystem::is_regular_file(json_path, ec)) {
    auto text = read_file(json_path);
    if (!text) return fail(std::move(text).error());
    return Tokenizer::from_hf_json(*text, json_path);
  }
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
