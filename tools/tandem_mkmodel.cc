// tandem-mkmodel: writes a Llama-family model (HF layout or GGUF, deterministic weights, real Llama 2 tokenizer).
#include <cstdio>
#include <filesystem>
#include <string>
#include <unistd.h>

#include "cli_args.h"
#include "data_dir.h"
#include "generation/prompt_template.h"
#include "modelgen/gguf_convert.h"
#include "modelgen/modelgen.h"

namespace {

const char* kUsage =
    "usage: tandem-mkmodel --out DIR [--preset test|tiny|134m|llama3|qwen2|mistral|phi3] [--dtype f32|f16|bf16]\n"
    "                      [--seed N] [--shards N]\n"
    "                      [--tokenizer PATH] [--chat-template llama2|chatml|zephyr] [--format hf|gguf [--type T]]\n"
    "Writes config.json, model.safetensors (or shards + index), tokenizer.model, generation_config.json and\n"
    "tokenizer_config.json. Weights are a deterministic function of (preset, seed, dtype). The presets llama3,\n"
    "qwen2, mistral and phi3 are tiny models of those architectures (Llama 3.2 rope scaling and tied head; Qwen2\n"
    "q/k/v biases; Mistral sliding window 32; Phi-3 fused projections and LongRoPE).\n"
    "--format gguf writes one GGUF file at --out instead (llama.cpp's layout), in the --dtype or in --type T\n"
    "(Q8_0, Q4_0, Q4_K_M, ... as tandem-quantize takes them).\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem;
  modelgen::Options o;
  std::string out, preset = "tiny", format = "hf", type;
  o.tokenizer_model = tools::bundled_data("tokenizer/llama2/tokenizer.model");
  try {
    cli::Args a(argc, argv);
    while (a.next()) {
      const auto f = a.flag();
      if (f == "--out") out = a.value();
      else if (f == "--preset") preset = a.value();
      else if (f == "--format") {
        format = a.value();
        if (format != "hf" && format != "gguf") throw cli::ArgError{"--format: '" + format + "' is not one of hf, gguf"};
      } else if (f == "--type") type = a.value();
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
        // The family's real Jinja template (rendered by the engine as the model's own).
        const auto v = a.value();
        auto k = gen::parse_template(v);
        if (!k || gen::builtin_template_source(*k).empty())
          throw cli::ArgError{"--chat-template: '" + std::string(v) + "' is not one of llama2, chatml, zephyr"};
        o.chat_template = std::string(gen::builtin_template_source(*k));
      } else if (f == "-h" || f == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      } else {
        throw cli::ArgError{"unknown option " + std::string(f)};
      }
    }
    if (out.empty()) throw cli::ArgError{"--out DIR is required"};
    if (!type.empty() && format != "gguf") throw cli::ArgError{"--type needs --format gguf"};
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
  if (format == "gguf") {
    // The HF layout first (into a private temporary directory), then converted as tandem-quantize does.
    if (type.empty()) type = o.dtype == weights::DType::f32 ? "F32" : o.dtype == weights::DType::f16 ? "F16" : "BF16";
    auto recipe = modelgen::parse_recipe(type);
    if (!recipe) {
      std::fprintf(stderr, "tandem-mkmodel: --type: %s\n", recipe.error().message.c_str());
      return 2;
    }
    const std::string tmp = out + ".hf." + std::to_string(::getpid());
    Status s = modelgen::write_model(tmp, o);
    Result<modelgen::ConvertStats> st = s ? modelgen::convert_to_gguf(tmp, out, *recipe) : Result<modelgen::ConvertStats>(fail(s.error()));
    std::error_code ec;
    std::filesystem::remove_all(tmp, ec);
    if (!st) {
      std::fprintf(stderr, "tandem-mkmodel: %s: %s\n", std::string(errc_name(st.error().code)).c_str(),
                   st.error().message.c_str());
      return 1;
    }
    std::printf("wrote %s: preset %s, %.1fM parameters, GGUF %s, %.1f MiB\n", out.c_str(), preset.c_str(),
                static_cast<double>(o.shape.parameters()) / 1e6, std::string(modelgen::recipe_name(*recipe)).c_str(),
                static_cast<double>(st->file_bytes) / 1048576.0);
    return 0;
  }
  if (auto s = modelgen::write_model(out, o); !s) {
    std::fprintf(stderr, "tandem-mkmodel: %s: %s\n", std::string(errc_name(s.error().code)).c_str(),
                 s.error().message.c_str());
    return 1;
  }
  std::printf("wrote %s: preset %s, %.1fM parameters, %s\n", out.c_str(), preset.c_str(),
              static_cast<double>(o.shape.parameters()) / 1e6, std::string(weights::dtype_name(o.dtype)).c_str());
  return 0;
}
