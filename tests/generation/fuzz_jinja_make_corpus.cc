// Writes the seed corpus of fuzz_jinja: the chat templates of the supported model families, one file each, into the
// directory given as the only argument (scripts/fuzz.sh calls it; nothing is checked in).
#include <cstdio>
#include <fstream>
#include <string>

#include "test_chat_template_families.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_jinja_make_corpus DIR\n");
    return 2;
  }
  for (const auto& f : tandem::gen::testdata::kFamilyTemplates) {
    std::string path = std::string(argv[1]) + "/" + std::string(f.family) + ".jinja";
    std::ofstream out(path, std::ios::binary);
    out << f.source;
    if (!out) {
      std::fprintf(stderr, "fuzz_jinja_make_corpus: cannot write %s\n", path.c_str());
      return 1;
    }
  }
  return 0;
}
