// Encode/decode throughput of the tokenizers (not a test).
//   tokenizer_bench MODEL FILE...   encodes each file whole and line by line with a tokenizer.model, prints MB/s.
//   tokenizer_bench --mixed [SHARED_DIR]
//       encodes ~4 MB of generated mixed text (English, code, digits, CJK, emoji) in lines, 1 thread, with the
//       SentencePiece llama-spm vocabulary and the byte-level BPE gpt-2 vocabulary from SHARED_DIR/models/vocab
//       (default ../shared; a generated 50k BPE vocabulary when absent), and times loading a generated
//       150,000-entry BPE vocabulary (from_bpe_vocab and from_hf_json of its tokenizer.json).
//   tokenizer_bench --dump-mixed FILE
//       writes the same pieces to FILE, each followed by a NUL byte, for bench/tokenizer/llamacpp_side_by_side.sh
//       (llama.cpp's tokenizer on the same text).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "weights/gguf.h"
#include "weights/gguf_model.h"
#include "weights/gguf_tokenizer.h"

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

std::string mixed_text(std::size_t bytes) {
  static const char* kParts[] = {
      "The quick brown fox jumps over the lazy dog, and then it said: \"I'm not tired yet!\" ",
      "In 2024, about 1,234,567 people visited 89 cities; the average stay was 3.75 days. ",
      "for (int i = 0; i < n; ++i) {\n    total += values[i] * 2;\n}\n",
      "def tokenize(text):\n    return [t for t in text.split() if t]\n",
      "\xE4\xBB\x8A\xE5\xA4\xA9\xE5\xA4\xA9\xE6\xB0\x94\xE5\xBE\x88\xE5\xA5\xBD\xEF\xBC\x8C\xE6\x88\x91\xE4\xBB\xAC"
      "\xE5\x8E\xBB\xE5\x85\xAC\xE5\x9B\xAD\xE6\x95\xA3\xE6\xAD\xA5\xE3\x80\x82",
      "Emoji: \xF0\x9F\x98\x80 \xF0\x9F\x9A\x80 \xF0\x9F\xA6\x99 \xE2\x9D\xA4\xEF\xB8\x8F done. ",
      "Caf\xC3\xA9 na\xC3\xAFve \xC3\xBC" "ber r\xC3\xA9sum\xC3\xA9 \xE2\x80\x94 M\xC3\xBCnchen. ",
      "\n\n    indented line with    several   spaces\t\ttabs\n",
  };
  std::string out;
  std::uint64_t s = 12345;
  while (out.size() < bytes) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    out += kParts[(s >> 33) % std::size(kParts)];
    if ((s >> 20) % 5 == 0) out += "\n";
  }
  return out;
}

void bench_encode(const char* name, const tandem::tok::Tokenizer& t, const std::vector<std::string>& lines,
                  std::size_t bytes) {
  std::size_t tokens = 0;
  const auto t0 = clock_type::now();
  for (const auto& l : lines) tokens += t.encode(l).size();
  const double s = seconds_since(t0);
  std::printf("%-34s %6.2f MB  encode %7.2f MB/s  %8zu tokens  %.2f bytes/token\n", name,
              static_cast<double>(bytes) / 1e6, static_cast<double>(bytes) / 1e6 / s, tokens,
              static_cast<double>(bytes) / static_cast<double>(tokens));
}

tandem::Result<tandem::tok::Tokenizer> from_gguf(const std::string& path) {
  using namespace tandem;
  auto f = weights::GgufFile::open(path);
  if (!f) return fail(std::move(f).error());
  const weights::GgufValue* m = f->find("tokenizer.ggml.model");
  if (m != nullptr && m->str == "gpt2") {
    auto v = weights::bpe_vocab_from_gguf(*f);
    if (!v) return fail(std::move(v).error());
    return tok::Tokenizer::from_bpe_vocab(*v, path);
  }
  auto bytes = weights::sentencepiece_model_from_gguf(*f);
  if (!bytes) return fail(std::move(bytes).error());
  return tok::Tokenizer::from_bytes(*bytes, path);
}

std::vector<std::string> mixed_pieces(const std::string& text) {
  std::vector<std::string> lines;
  for (std::size_t at = 0; at < text.size();) {  // lines of up to ~2 KB (prompt-sized pieces)
    std::size_t end = text.find('\n', at + 1024);
    end = end == std::string::npos ? text.size() : end + 1;
    lines.push_back(text.substr(at, end - at));
    at = end;
  }
  return lines;
}

int dump_mixed(const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (const auto& p : mixed_pieces(mixed_text(4u << 20))) out << p << '\0';
  out.close();
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return 1;
  }
  return 0;
}

int mixed(const std::string& shared) {
  using namespace tandem;
  const std::string text = mixed_text(4u << 20);
  const std::vector<std::string> lines = mixed_pieces(text);
  std::printf("mixed text: %.2f MB in %zu pieces, 1 thread\n", static_cast<double>(text.size()) / 1e6, lines.size());
  for (const char* name : {"llama-spm", "gpt-2", "deepseek-coder"}) {
    const std::string path = shared + "/models/vocab/ggml-vocab-" + name + ".gguf";
    const auto t0 = clock_type::now();
    auto t = from_gguf(path);
    const double load = seconds_since(t0);
    if (!t) {
      std::printf("%-34s skipped: %s\n", name, t.error().message.c_str());
      if (std::string(name) == "gpt-2") {
        auto g = tok::Tokenizer::from_bpe_vocab(tok::generate_bpe_vocab(50257, "gpt-2", {"<|endoftext|>"}, 1), "gen");
        if (g) bench_encode("generated gpt-2-style BPE (50257)", *g, lines, text.size());
      }
      continue;
    }
    const std::string label = std::string(name) + (t->kind() == tok::TokenizerKind::bpe ? " (BPE" : " (SPM") +
                              ", load " + std::to_string(static_cast<int>(load * 1000)) + " ms)";
    bench_encode(label.c_str(), *t, lines, text.size());
  }
  auto t0 = clock_type::now();
  const tok::BpeVocab big = tok::generate_bpe_vocab(150000, "qwen2", {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, 1);
  const double gen = seconds_since(t0);
  t0 = clock_type::now();
  auto t = tok::Tokenizer::from_bpe_vocab(big, "generated-150k");
  const double load_vocab = seconds_since(t0);
  if (!t) {
    std::fprintf(stderr, "%s\n", t.error().message.c_str());
    return 1;
  }
  const std::string json = t->model_bytes();
  t0 = clock_type::now();
  auto tj = tok::Tokenizer::from_hf_json(json, "generated-150k.json");
  const double load_json = seconds_since(t0);
  if (!tj) {
    std::fprintf(stderr, "%s\n", tj.error().message.c_str());
    return 1;
  }
  std::printf("150k BPE vocabulary (%d tokens, %zu merges): generated in %.2f s; load from_bpe_vocab %.0f ms, "
              "from_hf_json (%.1f MB) %.0f ms\n",
              t->vocab_size(), big.merges.size(), gen, load_vocab * 1000, static_cast<double>(json.size()) / 1e6,
              load_json * 1000);
  bench_encode("generated 150k BPE (qwen2 pre)", *tj, lines, text.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--mixed") return mixed(argc >= 3 ? argv[2] : "../shared");
  if (argc == 3 && std::string(argv[1]) == "--dump-mixed") return dump_mixed(argv[2]);
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s tokenizer.model FILE... | %s --mixed [SHARED_DIR]\n", argv[0], argv[0]);
    return 2;
  }
  auto tok = tandem::tok::Tokenizer::load_file(argv[1]);
  if (!tok) {
    std::fprintf(stderr, "%s\n", tok.error().message.c_str());
    return 1;
  }
  std::vector<std::string> files, lines;
  std::size_t bytes = 0;
  for (int i = 2; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    files.push_back(ss.str());
    bytes += files.back().size();
    std::istringstream ls(files.back());
    for (std::string l; std::getline(ls, l);) lines.push_back(l);
  }
  using clock = std::chrono::steady_clock;
  const int reps = 3;
  auto run = [&](const char* what, const std::vector<std::string>& inputs) {
    std::size_t tokens = 0;
    std::string sink;
    const auto t0 = clock::now();
    for (int r = 0; r < reps; ++r) {
      for (const auto& s : inputs) tokens += tok->encode(s).size();
    }
    const double enc = std::chrono::duration<double>(clock::now() - t0).count();
    const auto t1 = clock::now();
    for (const auto& s : inputs) sink += tok->decode(tok->encode(s));
    const double both = std::chrono::duration<double>(clock::now() - t1).count();
    std::printf("%-6s %8.2f MB  encode %7.2f MB/s  (%zu tokens/pass)  encode+decode %7.2f MB/s\n", what,
                static_cast<double>(bytes) / 1e6, static_cast<double>(bytes) * reps / 1e6 / enc, tokens / reps,
                static_cast<double>(bytes) / 1e6 / both);
  };
  run("files", files);
  run("lines", lines);
  return 0;
}
