// tandem-tokenize: prints the token ids a model's tokenizer gives for each line (or each llama.cpp test case) of
// standard input. For debugging and for checks against other implementations (docs/tokenizers.md).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>

#include "cli_args.h"
#include "tokenizer/model_tokenizer.h"
#include "weights/gguf_model.h"
#include "weights/gguf_tokenizer.h"
#include "weights/model_dir.h"

namespace {

const char* kUsage =
    "usage: tandem-tokenize --model DIR|FILE.gguf [--no-bos] [--special] [--cases]\n"
    "  --model    a Hugging Face model directory (tokenizer.json or tokenizer.model) or a .gguf file; a directory\n"
    "             or GGUF holding only a tokenizer works too\n"
    "  --no-bos   never add BOS (default: add it when the model's tokenizer settings say so)\n"
    "  --special  read spellings of special tokens (<|eot_id|>, <s>) in the input as those tokens\n"
    "  --cases    read cases separated by lines '__ggml_vocab_test__' (llama.cpp's .inp files), not lines\n"
    "Prints one line of space-separated ids per input.\n";

struct Loaded {
  tandem::tok::Tokenizer tok;
  bool add_bos;
};

using tandem::Result;

// A tokenizer-only GGUF file (llama.cpp's vocabulary files) or directory, when the path is not a complete model.
Result<Loaded> load_tokenizer_only(const std::string& path) {
  using namespace tandem;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    for (const char* name : {"/tokenizer.json", "/tokenizer.model"}) {
      const std::string p = path + name;
      if (!std::filesystem::is_regular_file(p, ec)) continue;
      if (std::string(name) == "/tokenizer.model") {
        auto t = tok::Tokenizer::load_file(p);
        if (!t) return fail(std::move(t).error());
        const bool bos = t->adds_bos();
        return Loaded{std::move(*t), bos};
      }
      std::ifstream in(p, std::ios::binary);
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      auto t = tok::Tokenizer::from_hf_json(text, p);
      if (!t) return fail(std::move(t).error());
      const bool bos = t->adds_bos();
      return Loaded{std::move(*t), bos};
    }
    return fail(Errc::not_found, path + ": no tokenizer.json or tokenizer.model");
  }
  auto f = weights::GgufFile::open(path);
  if (!f) return fail(std::move(f).error());
  const weights::GgufValue* m = f->find("tokenizer.ggml.model");
  if (m != nullptr && m->type == weights::GgufType::string && m->str == "gpt2") {
    auto v = weights::bpe_vocab_from_gguf(*f);
    if (!v) return fail(std::move(v).error());
    auto t = tok::Tokenizer::from_bpe_vocab(*v, path);
    if (!t) return fail(std::move(t).error());
    const bool bos = v->add_bos;
    return Loaded{std::move(*t), bos};
  }
  auto bytes = weights::sentencepiece_model_from_gguf(*f);
  if (!bytes) return fail(std::move(bytes).error());
  auto t = tok::Tokenizer::from_bytes(*bytes, path);
  if (!t) return fail(std::move(t).error());
  bool bos = t->adds_bos();
  if (const weights::GgufValue* b = f->find("tokenizer.ggml.add_bos_token");
      b != nullptr && b->type == weights::GgufType::boolean) {
    bos = b->u != 0;
  }
  return Loaded{std::move(*t), bos};
}

Result<Loaded> load(const std::string& path) {
  auto dir = tandem::weights::ModelDir::open(path);
  if (!dir) {
    auto only = load_tokenizer_only(path);
    if (only) return only;
    return tandem::fail(std::move(dir).error());  // the model's error says more than the fallback's
  }
  auto t = tandem::tok::load_model_tokenizer(*dir);
  if (!t) return tandem::fail(std::move(t).error());
  const bool bos = tandem::tok::model_adds_bos(*dir, *t);
  return Loaded{std::move(*t), bos};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem;
  std::string model;
  bool no_bos = false;
  bool special = false;
  bool cases = false;
  try {
    cli::Args a(argc, argv);
    while (a.next()) {
      const auto f = a.flag();
      if (f == "--model") {
        model = std::string(a.value());
      } else if (f == "--no-bos") {
        no_bos = true;
      } else if (f == "--special") {
        special = true;
      } else if (f == "--cases") {
        cases = true;
      } else if (f == "-h" || f == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      } else {
        throw cli::ArgError{"unknown argument " + std::string(f)};
      }
    }
    if (model.empty()) throw cli::ArgError{"--model is required"};
  } catch (const cli::ArgError& e) {
    std::fprintf(stderr, "tandem-tokenize: %s\n%s", e.message.c_str(), kUsage);
    return 2;
  }
  auto loaded = load(model);
  if (!loaded) {
    std::fprintf(stderr, "tandem-tokenize: %s: %s\n", std::string(errc_name(loaded.error().code)).c_str(),
                 loaded.error().message.c_str());
    return 1;
  }
  const tok::EncodeOptions opts{loaded->add_bos && !no_bos, false, special};
  auto emit = [&](std::string_view text) {
    const auto ids = loaded->tok.encode(text, opts);
    std::string line;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i != 0) line.push_back(' ');
      line += std::to_string(ids[i]);
    }
    line.push_back('\n');
    std::fwrite(line.data(), 1, line.size(), stdout);
  };
  if (cases) {
    const std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    const std::string sep = "__ggml_vocab_test__\n";
    std::size_t at = 0;
    while (at < input.size()) {
      if (at == 0 && input.compare(0, sep.size(), sep) == 0) {  // an empty first case
        emit("");
        at = sep.size();
        continue;
      }
      // A case is everything up to the newline before a separator line.
      const std::size_t s = input.find("\n" + sep, at);
      if (s == std::string::npos) {
        emit(std::string_view(input).substr(at));  // a last case without its separator
        break;
      }
      emit(std::string_view(input).substr(at, s - at));
      at = s + 1 + sep.size();
    }
  } else {
    std::string line;
    while (std::getline(std::cin, line)) emit(line);
  }
  std::fflush(stdout);
  return std::ferror(stdout) ? 1 : 0;
}
