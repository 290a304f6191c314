// tandem-mkmodel: writes a Llama-architecture model (HF layout, deterministic weights, real Llama 2 tokenizer).
#include <cstdio>
#include <string>

#include "cli_args.h"
#include "data_dir.h"
#include "modelgen/modelgen.h"

namespace {

const char* kUsage =
    "usage: tandem-mkmodel --out DIR [--preset test|tiny|134m] [--dtype f32|f16|bf16] [--seed N] [--shards N]\n"
    "                      [--tokenizer PATH] [--chat-template llama2|chatml|zephyr]\n"
    "Writes config.json, model.safetensors (or shards + index), tokenizer.model, generation_config.json and\n"
    "tokenizer_config.json. Weights are a deterministic function of (preset, seed, dtype).\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem;
  modelgen::Options o;
  std::string out, preset = "tiny";
  o.tokenizer_model = tools::bundled_data("tokenizer/llama2/tokenizer.model");
  try {
    cli::Args a(argc, argv);
    while (a.next()) {
      const auto f = a.flag();
      if (f == "--out") out = a.value();
      else if (f == "--preset") preset = a.value();
      else if (f == "--dtype") {
        const auto v = a.value();
        if (v == "f32") o.dtype = weights::DType::f32;
        else if (v == "f16") o.dtype = weights::DType::f16;
        else if (v == "bf16") o.dtype = weights::DType::bf16;
        else throw cli::ArgError{"--dtype: '" + std::string(v) + "' is not one of f32, f16, bf16"};
      } else if (f == "--seed") o.seed = cli::parse_number<std::uint64_t>(f, a.value(), 0, UINT64_MAX);
      else if (f == "--shards") o.shards = cli::parse_number<int>(f, a.value(), 1, 64);
      else if (f == "--tokenizer") o.tokenizer_model = a.value();
      else if (f == "--chat-template") {
        const auto v = a.value();
        if (v == "llama2") o.chat_template = "{{ bos_token + '[INST] ' + message['content'] + ' [/INST]' }}";
        else if (v == "chatml") o.chat_template = "{{ '<|im_start|>' + message['role'] }}";
        else if (v == "zephyr") o.chat_template = "{{ '<|user|>\\n' + message['content'] }}";
        else throw cli::ArgError{"--chat-template: '" + std::string(v) + "' is not one of llama2, chatml, zephyr"};
      } else if (f == "-h" || f == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      } else {
        throw cli::ArgError{"unknown option " + std::string(f)};
      }
    }
    if (out.empty()) throw cli::ArgError{"--out DIR is required"};
  } catch (const cli::ArgError& e) {
    std::fprintf(stderr, "tandem-mkmodel: %s\n%s", e.message.c_str(), kUsage);
    return 2;
  }
  auto shape = modelgen::preset(preset);
  if (!shape) {
    std::fprintf(stderr, "tandem-mkmodel: %s\n", shape.error().message.c_str());
    return 2;
  }
  o.shape = *shape;
  if (auto s = modelgen::write_model(out, o); !s) {
    std::fprintf(stderr, "tandem-mkmodel: %s: %s\n", std::string(errc_name(s.error().code)).c_str(),
                 s.error().message.c_str());
    return 1;
  }
  std::printf("wrote %s: preset %s, %.1fM parameters, %s\n", out.c_str(), preset.c_str(),
              static_cast<double>(o.shape.parameters()) / 1e6, std::string(weights::dtype_name(o.dtype)).c_str());
  return 0;
}
