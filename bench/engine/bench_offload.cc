// The offload rung's cost: one greedy generation on a simulated-accelerator replica with all layers there, with
// only the first k there and the rest on the CPU (an offloaded sequence: Model::new_sequence(k)), and on the CPU
// replica; decode tokens/s of each as a ratio to all-on-the-accelerator, measured in the same process.
// The simulated accelerator computes with ATen on this CPU, so the ratios show what the split costs here, not what a
// real GPU would gain.
//   bench_offload --model DIR [--tokens N] [--threads N]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "device/simulated.h"
#include "engine/generation.h"
#include "engine/model.h"

using namespace tandem;
using Clock = std::chrono::steady_clock;

namespace {

double decode_tps(const std::shared_ptr<engine::Model>& m, int tokens, int gpu_layers) {
  engine::GenerateRequest r;
  r.prompt = m->encode_text("Once upon a time in a small village by the sea");
  r.max_new_tokens = tokens;
  r.stop_at_eos = false;
  r.gpu_layers = gpu_layers;
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    auto g = engine::generate(m, r);
    if (!g) {
      std::fprintf(stderr, "generate: %s\n", g.error().message.c_str());
      std::exit(1);
    }
    best = std::max(best, (*g)->stats().decode_tokens_per_s());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  int tokens = 64, threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--model") dir = argv[i + 1];
    else if (f == "--tokens") tokens = std::atoi(argv[i + 1]);
    else if (f == "--threads") threads = std::atoi(argv[i + 1]);
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: bench_offload --model DIR [--tokens N] [--threads N]\n");
    return 2;
  }
  engine::LoadOptions lo;
  lo.threads = threads;
  lo.max_context = 512;
  auto cpu = engine::Model::load(dir, lo);
  if (!cpu) {
    std::fprintf(stderr, "%s\n", cpu.error().message.c_str());
    return 1;
  }
  device::SimulatedConfig sc;
  sc.capacity_bytes = 16ull << 30;
  lo.accelerator = std::make_shared<device::SimulatedDevice>(sc, std::make_shared<SteadyClock>());
  auto gpu = engine::Model::load(dir, lo);
  if (!gpu) {
    std::fprintf(stderr, "%s\n", gpu.error().message.c_str());
    return 1;
  }
  const int n = (*gpu)->config().num_layers;
  std::printf("model %s: %d layers, %d new tokens, %d thread(s), best of 3\n", dir.c_str(), n, tokens, threads);
  const double all = decode_tps(*gpu, tokens, -1);
  std::printf("%-44s %8.1f tok/s  %.2f\n", "all layers on the (simulated) accelerator", all, 1.0);
  for (int k : {3 * n / 4, n / 2, n / 4}) {
    if (k < 1 || k >= n) continue;
    const double t = decode_tps(*gpu, tokens, k);
    char label[64];
    std::snprintf(label, sizeof label, "offloaded: %d of %d layers there, rest on CPU", k, n);
    std::printf("%-44s %8.1f tok/s  %.2f\n", label, t, t / all);
  }
  const double c = decode_tps(*cpu, tokens, -1);
  std::printf("%-44s %8.1f tok/s  %.2f\n", "all on the CPU replica", c, c / all);
  return 0;
}
