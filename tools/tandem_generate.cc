// tandem-generate: the engine on the command line. Streams text to stdout, statistics to stderr.
#include <sys/resource.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli_args.h"
#include "device/simulated.h"
#ifdef TANDEM_HAVE_CUDA
#include "device/cuda.h"
#endif
#include "engine/generation.h"
#include "engine/model.h"

namespace {

const char* kUsage =
    "usage: tandem-generate --model DIR [--prompt TEXT | --prompt-file FILE] [options]\n"
    "  --chat               treat the prompt as a user message and apply the model's prompt template\n"
    "  --system TEXT        system message (with --chat)\n"
    "  --template NAME      raw | llama2 | chatml | zephyr | model (default: the model's own chat_template from\n"
    "                       tokenizer_config.json / GGUF, rendered with its Jinja; raw when it has none)\n"
    "  --max-tokens N       new tokens to generate (default 64)\n"
    "  --temperature T      0 = greedy (default: the model's generation_config.json, else 0)\n"
    "  --top-k K  --top-p P  --repeat-penalty R  --repeat-window N  --seed S\n"
    "  --stop TEXT          stop string (repeatable); it is not printed\n"
    "  --no-eos             do not stop at the model's EOS token\n"
    "  --resume IDS         comma-separated token ids generated earlier (checkpoint): continue after them\n"
    "  --threads N          intra-op threads (default 1)\n"
    "  --device D           cpu (default) | sim[:BYTES] (simulated accelerator, default 8G) | cuda[:INDEX]\n"
    "  --accel-layers K     with --device sim/cuda: the first K layers run there, the rest on the CPU (default all)\n"
    "  --dtype auto|f32|bf16|f16  how float weights are held (default auto: as stored)\n"
    "  --block-size N       KV cache block size in tokens (default 16)\n"
    "  --prefill-chunk N    prefill at most N tokens per forward (default: all at once)\n"
    "  --ids                print the generated token ids to stderr\n"
    "  --fingerprint        print the replica fingerprint and its components, then exit\n"
    "  --quiet              no statistics on stderr\n";

std::uint64_t parse_bytes(std::string_view flag, std::string_view v) {
  std::uint64_t mult = 1;
  if (!v.empty()) {
    switch (v.back()) {
      case 'K': case 'k': mult = 1ull << 10; break;
      case 'M': case 'm': mult = 1ull << 20; break;
      case 'G': case 'g': mult = 1ull << 30; break;
      default: break;
    }
    if (mult != 1) v.remove_suffix(1);
  }
  return tandem::cli::parse_number<std::uint64_t>(flag, v, 1, (1ull << 50) / mult) * mult;
}

std::vector<tandem::engine::TokenId> parse_ids(std::string_view s) {
  std::vector<tandem::engine::TokenId> out;
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t j = s.find(',', i);
    if (j == std::string_view::npos) j = s.size();
    out.push_back(tandem::cli::parse_number<tandem::engine::TokenId>("--resume", s.substr(i, j - i), 0, 1 << 30));
    i = j + 1;
  }
  return out;
}

long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem;
  std::string model_dir, prompt, system_msg, prompt_file;
  bool chat = false, show_ids = false, print_fp = false, quiet = false, temp_set = false;
  engine::LoadOptions lo;
  engine::GenerateRequest req;
  req.max_new_tokens = 64;
  gen::SamplingParams sp;
  std::vector<engine::TokenId> resume;
  std::string device_spec = "cpu";
  try {
    cli::Args a(argc, argv);
    while (a.next()) {
      const auto f = a.flag();
      if (f == "--model") model_dir = a.value();
      else if (f == "--prompt") prompt = a.value();
      else if (f == "--prompt-file") prompt_file = a.value();
      else if (f == "--chat") chat = true;
      else if (f == "--system") system_msg = a.value();
      else if (f == "--template") lo.template_name = a.value();
      else if (f == "--max-tokens") req.max_new_tokens = cli::parse_number<int>(f, a.value(), 1, 1 << 20);
      else if (f == "--temperature") { sp.temperature = cli::parse_number<double>(f, a.value(), 0, 100); temp_set = true; }
      else if (f == "--top-k") sp.top_k = cli::parse_number<int>(f, a.value(), 0, 1000000);
      else if (f == "--top-p") sp.top_p = cli::parse_number<double>(f, a.value(), 1e-9, 1);
      else if (f == "--repeat-penalty") sp.repetition_penalty = cli::parse_number<double>(f, a.value(), 1e-9, 10);
      else if (f == "--repeat-window") sp.repetition_window = cli::parse_number<int>(f, a.value(), 0, 1 << 20);
      else if (f == "--seed") sp.seed = cli::parse_number<std::uint64_t>(f, a.value(), 0, UINT64_MAX);
      else if (f == "--stop") req.stop_strings.emplace_back(a.value());
      else if (f == "--no-eos") req.stop_at_eos = false;
      else if (f == "--resume") resume = parse_ids(a.value());
      else if (f == "--device") device_spec = a.value();
      else if (f == "--accel-layers") lo.accel_layers = cli::parse_number<int>(f, a.value(), 0, 1 << 20);
      else if (f == "--threads") lo.threads = cli::parse_number<int>(f, a.value(), 1, 256);
      else if (f == "--dtype") {
        auto d = engine::parse_compute_dtype(a.value());
        if (!d) throw cli::ArgError{"--dtype: " + d.error().message};
        lo.dtype = *d;
      } else if (f == "--block-size") lo.kv_block_size = cli::parse_number<int>(f, a.value(), 1, 4096);
      else if (f == "--prefill-chunk") req.prefill_chunk = cli::parse_number<int>(f, a.value(), 0, 1 << 20);
      else if (f == "--ids") show_ids = true;
      else if (f == "--fingerprint") print_fp = true;
      else if (f == "--quiet") quiet = true;
      else if (f == "-h" || f == "--help") { std::fputs(kUsage, stdout); return 0; }
      else throw cli::ArgError{"unknown option " + std::string(f)};
    }
    if (model_dir.empty()) throw cli::ArgError{"--model DIR is required"};
    if (!prompt_file.empty()) {
      std::ifstream in(prompt_file, std::ios::binary);
      if (!in) throw cli::ArgError{"--prompt-file: cannot read " + prompt_file};
      std::ostringstream ss;
      ss << in.rdbuf();
      prompt = ss.str();
    }
  } catch (const cli::ArgError& e) {
    std::fprintf(stderr, "tandem-generate: %s\n%s", e.message.c_str(), kUsage);
    return 2;
  }

  try {
    if (device_spec.rfind("sim", 0) == 0) {
      device::SimulatedConfig sc;
      sc.capacity_bytes = 8ull << 30;
      if (device_spec.size() > 3) {
        if (device_spec[3] != ':') throw cli::ArgError{"--device: expected sim or sim:BYTES, got " + device_spec};
        sc.capacity_bytes = parse_bytes("--device", std::string_view(device_spec).substr(4));
      }
      lo.accelerator = std::make_shared<device::SimulatedDevice>(sc, std::make_shared<SteadyClock>());
    } else if (device_spec.rfind("cuda", 0) == 0) {
#ifdef TANDEM_HAVE_CUDA
      int index = 0;
      if (device_spec.size() > 4) {
        if (device_spec[4] != ':') throw cli::ArgError{"--device: expected cuda or cuda:INDEX, got " + device_spec};
        index = cli::parse_number<int>("--device", std::string_view(device_spec).substr(5), 0, 1023);
      }
      auto d = device::CudaDevice::open(index, std::make_shared<SteadyClock>());
      if (!d) {
        std::fprintf(stderr, "tandem-generate: %s\n", d.error().message.c_str());
        return 1;
      }
      lo.accelerator = *d;
#else
      throw cli::ArgError{"--device cuda: this build has no CUDA runtime (meson -Dcuda)"};
#endif
    } else if (device_spec != "cpu") {
      throw cli::ArgError{"--device: '" + device_spec + "' is not cpu, sim[:BYTES] or cuda[:INDEX]"};
    } else if (lo.accel_layers != -1) {
      throw cli::ArgError{"--accel-layers needs --device sim or cuda"};
    }
  } catch (const cli::ArgError& e) {
    std::fprintf(stderr, "tandem-generate: %s\n%s", e.message.c_str(), kUsage);
    return 2;
  }

  auto model = engine::Model::load(model_dir, lo);
  if (!model) {
    std::fprintf(stderr, "tandem-generate: cannot load %s: %s: %s\n", model_dir.c_str(),
                 std::string(errc_name(model.error().code)).c_str(), model.error().message.c_str());
    return 1;
  }
  const auto& m = *model;
  if (print_fp) {
    std::printf("%s\n", m->fingerprint().digest.c_str());
    for (const auto& [k, v] : m->fingerprint().components) std::printf("  %-18s %s\n", k.c_str(), v.c_str());
    return 0;
  }
  if (chat) {
    std::vector<gen::Message> msgs;
    if (!system_msg.empty()) msgs.push_back({"system", system_msg});
    msgs.push_back({"user", prompt});
    auto ids = m->encode_chat(msgs);
    if (!ids) {
      std::fprintf(stderr, "tandem-generate: %s\n", ids.error().message.c_str());
      return 2;
    }
    req.prompt = std::move(ids).value();
    for (auto& s : gen::template_stops(m->prompt_template())) req.stop_strings.push_back(s);
  } else {
    req.prompt = m->encode_text(prompt);
  }
  if (!temp_set) {
    const auto d = m->default_sampling();
    sp.temperature = d.temperature;
    if (sp.top_k == 0) sp.top_k = d.top_k;
    if (sp.top_p == 1.0) sp.top_p = d.top_p;
    if (sp.repetition_penalty == 1.0) sp.repetition_penalty = d.repetition_penalty;
  }
  req.sampling = sp;
  req.resume_tokens = resume;

  auto result = engine::generate(m, req, [&](const engine::TokenEvent& ev) {
    std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!result) {
    std::fprintf(stderr, "tandem-generate: generation failed: %s: %s\n",
                 std::string(errc_name(result.error().code)).c_str(), result.error().message.c_str());
    return 1;
  }
  const auto& g = **result;
  if (show_ids) {
    std::fprintf(stderr, "ids:");
    for (auto t : g.tokens()) std::fprintf(stderr, " %d", t);
    std::fputc('\n', stderr);
  }
  if (!quiet) {
    const auto& st = g.stats();
    const auto& ls = m->load_stats();
    const auto kv = m->kv_stats();
    std::fprintf(stderr,
                 "model: %s (%.1fM params, %s weights, compute %s, %d thread(s)) fingerprint %s\n"
                 "load: %.1f ms (open %.1f, weights %.1f; %.1f MiB mapped, %.1f MiB copied; KV pool %.1f MiB, "
                 "%d blocks of %d)\n"
                 "prompt: %lld tokens, prefill %.1f ms (%.1f tok/s)\n"
                 "generated: %lld tokens, decode %.1f ms (%.1f tok/s), finish: %s\n"
                 "rss: %.1f MiB\n"
                 "device: %s, %d of %d layers there, %.1f MiB weights + %.1f MiB KV accounted there\n",
                 model_dir.c_str(), static_cast<double>(m->files().parameter_count()) / 1e6,
                 m->files().type_summary().c_str(),
                 std::string(engine::compute_dtype_name(lo.dtype)).c_str(), lo.threads,
                 m->fingerprint().digest.c_str(), ls.total_ms, ls.open_ms, ls.weights_ms,
                 static_cast<double>(ls.weight_bytes) / 1048576.0,
                 static_cast<double>(ls.resident_copy_bytes) / 1048576.0,
                 static_cast<double>(ls.kv_pool_bytes) / 1048576.0, kv.total_blocks, kv.block_size,
                 static_cast<long long>(st.prompt_tokens), st.prefill_ms, st.prefill_tokens_per_s(),
                 static_cast<long long>(st.new_tokens), st.decode_ms, st.decode_tokens_per_s(),
                 std::string(engine::finish_reason_name(g.finish_reason())).c_str(), rss_kib() / 1024.0,
                 m->accelerator() ? m->accelerator()->name().c_str() : "cpu", m->accel_layers(),
                 m->config().num_layers, static_cast<double>(ls.accel_weight_bytes) / 1048576.0,
                 static_cast<double>(ls.accel_kv_bytes) / 1048576.0);
  }
  return 0;
}
