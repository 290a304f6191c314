// Loading a tokenizer from the files of a directory (tokenizer.h: load_tokenizer_files, load_hf_tokenizer_files).
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer/tokenizer.h"

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

Result<Tokenizer> load_hf_tokenizer_files(const std::string& dir) {
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

Result<Tokenizer> load_tokenizer_files(const std::string& dir) {
  if (auto t = load_hf_tokenizer_files(dir); t.ok() || t.error().code != Errc::not_found) return t;
  std::error_code ec;
  const std::string model_path = dir + "/tokenizer.model";
  if (std::filesystem::is_regular_file(model_path, ec)) return Tokenizer::load_file(model_path);
  return fail(Errc::not_found, dir + ": no tokenizer.json, vocab.json + merges.txt or tokenizer.model");
}

}  // namespace tandem::tok
