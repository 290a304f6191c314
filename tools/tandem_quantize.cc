// tandem-quantize: converts a model (Hugging Face directory or GGUF file) into a GGUF file of a llama.cpp
// quantization type or mix. From a GGUF source the output is byte for byte what `llama-quantize IN OUT TYPE` writes
// (no importance matrix); docs/kernels.md lists the recipes.
#include <cstdio>
#include <map>
#include <string>

#include "cli_args.h"
#include "modelgen/gguf_convert.h"

namespace {

const char* kUsage =
    "usage: tandem-quantize [--threads N] [--quiet] IN OUT TYPE\n"
    "  IN    a Hugging Face model directory (config.json, safetensors, tokenizer.json and/or tokenizer.model)\n"
    "        or a .gguf file\n"
    "  OUT   the GGUF file to write (replaced atomically)\n"
    "  TYPE  F32 | F16 | BF16 | Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q4_K_S | Q4_K_M | Q5_K_S | Q5_K_M | Q6_K |\n"
    "        IQ4_NL | IQ4_XS (llama.cpp's names; the mixes give some tensors more bits exactly as llama-quantize does\n"
    "        without an importance matrix; rows that are not multiples of 256 fall back as llama-quantize's do: q4_K to\n"
    "        q5_0, q5_K to q5_1, q6_K to q8_0, iq4_xs to iq4_nl)\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem;
  std::vector<std::string> pos;
  int threads = 1;
  bool quiet = false;
  try {
    cli::Args a(argc, argv);
    while (a.next()) {
      const auto f = a.flag();
      if (f == "--threads") threads = cli::parse_number<int>(f, a.value(), 1, 256);
      else if (f == "--quiet") quiet = true;
      else if (f == "-h" || f == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      } else if (!f.empty() && f[0] == '-') {
        throw cli::ArgError{"unknown option " + std::string(f)};
      } else {
        pos.emplace_back(f);
      }
    }
    if (pos.size() != 3) throw cli::ArgError{"expected IN OUT TYPE"};
  } catch (const cli::ArgError& e) {
    std::fprintf(stderr, "tandem-quantize: %s\n%s", e.message.c_str(), kUsage);
    return 2;
  }
  auto recipe = modelgen::parse_recipe(pos[2]);
  if (!recipe) {
    std::fprintf(stderr, "tandem-quantize: %s\n", recipe.error().message.c_str());
    return 2;
  }
  auto st = modelgen::convert_to_gguf(pos[0], pos[1], *recipe, threads);
  if (!st) {
    std::fprintf(stderr, "tandem-quantize: %s: %s\n", std::string(errc_name(st.error().code)).c_str(),
                 st.error().message.c_str());
    return 1;
  }
  if (!quiet) {
    std::map<std::string, int> by_type;
    for (const auto& [name, t] : st->types) by_type[std::string(kernels::wtype_name(t))]++;
    std::string types;
    for (const auto& [t, n] : by_type) types += (types.empty() ? "" : ", ") + t + " " + std::to_string(n);
    std::printf("wrote %s: %s, %llu tensors (%s), %.2f MiB of tensors from %.2f MiB, file %.2f MiB\n", pos[1].c_str(),
                std::string(modelgen::recipe_name(*recipe)).c_str(), static_cast<unsigned long long>(st->tensors),
                types.c_str(), static_cast<double>(st->bytes_out) / 1048576.0,
                static_cast<double>(st->bytes_in) / 1048576.0, static_cast<double>(st->file_bytes) / 1048576.0);
  }
  return 0;
}
