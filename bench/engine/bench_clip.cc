// CLIP embedding throughput (engine/clip.h): texts/s and images/s at batch 1 and 16, on the CPU (Tandem's kernels,
// 1 thread) and on the simulated accelerator (ATen on this CPU), for clip-b32 with random weights in f32 and f16
// and for clip-small in f32. Models are written once to /tmp/tandem-bench-models/clip-*. docs/embeddings.md.
//   bench_clip [--glibc-heap] [--benchmark_filter=...]
// The heap is kept as tandemd keeps it (core/process_heap.h); --glibc-heap leaves glibc's defaults instead.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_heap.h"
#include "core/clock.h"
#include "device/simulated.h"
#include "engine/clip.h"
#include "modelgen/clip_writer.h"

using namespace tandem;

namespace {

std::shared_ptr<engine::ClipModel> model(const std::string& preset, weights::DType dt, bool sim) {
  static std::map<std::string, std::shared_ptr<engine::ClipModel>> cache;
  const std::string dname = dt == weights::DType::f16 ? "f16" : "f32";
  const std::string key = preset + "-" + dname + (sim ? "-sim" : "-cpu");
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const std::string dir = "/tmp/tandem-bench-models/" + preset + "-" + dname;
  if (!std::filesystem::exists(dir + "/model.safetensors")) {
    modelgen::ClipWriteOptions o;
    o.shape = *modelgen::clip_preset(preset);
    o.dtype = dt;
    if (!modelgen::write_clip_model(dir, o).ok()) return nullptr;
  }
  engine::ClipLoadOptions lo;
  if (sim) {
    device::SimulatedConfig sc;
    sc.capacity_bytes = 16ull << 30;
    lo.accelerator = std::make_shared<device::SimulatedDevice>(sc, std::make_shared<SteadyClock>());
  }
  auto m = engine::ClipModel::load(dir, lo);
  if (!m) return nullptr;
  return cache[key] = *m;
}

void run(benchmark::State& state, const std::string& preset, weights::DType dt, bool sim, bool images) {
  auto m = model(preset, dt, sim);
  if (!m) {
    state.SkipWithError("model");
    return;
  }
  const auto& c = m->config();
  const int batch = static_cast<int>(state.range(0));
  std::vector<std::vector<std::int32_t>> ids;
  std::vector<std::vector<float>> px;
  for (int i = 0; i < batch; ++i) {
    // A typical caption: BOS, 12 tokens, EOS.
    std::vector<std::int32_t> t{c.bos_id >= 0 ? c.bos_id : 0};
    for (int j = 0; j < 12; ++j) t.push_back((i * 131 + j * 17) % (c.vocab - 2));
    t.push_back(c.vocab - 1);
    ids.push_back(std::move(t));
    std::vector<float> p(static_cast<std::size_t>(c.channels) * c.image_size * c.image_size);
    for (std::size_t k = 0; k < p.size(); ++k) p[k] = static_cast<float>((k * 7 + i) % 13) / 6.5F - 1.0F;
    px.push_back(std::move(p));
  }
  for (auto _ : state) {
    auto r = images ? m->embed_images(px) : m->embed_texts(ids);
    if (!r) {
      state.SkipWithError(r.error().message.c_str());
      return;
    }
    benchmark::DoNotOptimize(r->data());
  }
  state.counters[images ? "images/s" : "texts/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * batch, benchmark::Counter::kIsRate);
}

void register_all() {
  struct Case { const char* preset; weights::DType dt; const char* dname; };
  for (const Case& k : {Case{"clip-b32", weights::DType::f32, "f32"}, Case{"clip-b32", weights::DType::f16, "f16"},
                        Case{"clip-small", weights::DType::f32, "f32"}})
    for (bool sim : {false, true})
      for (bool images : {false, true}) {
        const std::string name = std::string("Clip/") + k.preset + "/" + k.dname + "/" + (sim ? "sim" : "cpu") + "/" +
                                 (images ? "images" : "texts");
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { run(s, k.preset, k.dt, sim, images); })
            ->Arg(1)
            ->Arg(16)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
}

}  // namespace

int main(int argc, char** argv) {
  if (!bench::setup_heap(argc, argv)) return 1;
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
