// Encode/decode throughput of the native tokenizer (not a test): tokenizer_bench MODEL FILE...
// Encodes each file whole and line by line, several times, and prints MB/s.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s tokenizer.model FILE...\n", argv[0]);
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
