// Engine throughput: prefill and decode tokens/s per (model, compute dtype, threads), model load time and RSS,
// reported against a baseline measured in the same process: the memory-bandwidth bound, i.e. how fast this
// machine can stream the bytes one decode step must read (all weights once).
//
//   bench_engine [--models DIR] [--quick] [--glibc-heap] [google-benchmark flags]
// The heap is kept as tandemd keeps it (core/process_heap.h); --glibc-heap leaves glibc's defaults instead.
// Models are generated into DIR (default /tmp/tandem-bench-models) on first use.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "bench_heap.h"
#include "device/simulated.h"
#include "engine/batch_runner.h"
#include "engine/generation.h"
#include "engine/model.h"
#include "engine/replica.h"
#include "modelgen/gguf_convert.h"
#include "modelgen/modelgen.h"

namespace {

using namespace tandem;

std::string g_models = "/tmp/tandem-bench-models";
bool g_quick = false;

long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

std::string model_dir(const std::string& preset, weights::DType dt) {
  const std::string dir = g_models + "/" + preset + "-" + std::string(weights::dtype_name(dt));
  if (!std::filesystem::exists(dir + "/model.safetensors")) {
    modelgen::Options o;
    o.shape = *modelgen::preset(preset);
    o.dtype = dt;
    o.tokenizer_model = std::string(TANDEM_SOURCE_DIR) + "/data/tokenizer/llama2/tokenizer.model";
    if (auto s = modelgen::write_model(dir, o); !s) {
      std::fprintf(stderr, "bench_engine: %s\n", s.error().message.c_str());
      std::exit(1);
    }
  }
  return dir;
}

// The benchmark shape in a GGUF weight type / mix, converted from the f32 model by tandem-quantize's code (the same
// file can be timed with llama.cpp's llama-bench: its path is printed). "" when the shape cannot take the type
// (the tiny preset's 128-wide rows are no multiple of the k-quants' 256).
std::string gguf_variant(const std::string& preset, const std::string& recipe) {
  const std::string path = g_models + "/" + preset + "-" + recipe + ".gguf";
  if (!std::filesystem::exists(path)) {
    auto r = modelgen::parse_recipe(recipe);
    auto st = r ? modelgen::convert_to_gguf(model_dir(preset, weights::DType::f32), path, *r, 2)
                : Result<modelgen::ConvertStats>(fail(r.error()));
    if (!st) {
      std::fprintf(stderr, "bench_engine: %s %s skipped: %s\n", preset.c_str(), recipe.c_str(),
                   st.error().message.c_str());
      return {};
    }
  }
  std::printf("bench_engine: %s %s: %s\n", preset.c_str(), recipe.c_str(), path.c_str());
  return path;
}

// Bytes one decode step reads: every matrix and norm, not the embedding table (one row of it) unless tied.
double decode_bytes(const engine::Model& m) {
  double b = 0;
  for (const auto& t : m.files().tensors())
    if (t.name != "model.embed_tokens.weight" || m.config().tie_word_embeddings) b += static_cast<double>(t.data.size());
  return b;
}

std::shared_ptr<engine::Model> load(const std::string& dir, engine::ComputeDType dt, int threads) {
  engine::LoadOptions lo;
  lo.dtype = dt;
  lo.threads = threads;
  lo.max_context = 512;
  auto m = engine::Model::load(dir, lo);
  if (!m) {
    std::fprintf(stderr, "bench_engine: %s\n", m.error().message.c_str());
    std::exit(1);
  }
  return *m;
}

std::vector<engine::TokenId> prompt_of(const engine::Model& m, std::size_t n) {
  auto ids = m.encode_text(
      "The quick brown fox jumps over the lazy dog while the farmer counts his sheep in the morning light. ");
  std::vector<engine::TokenId> out;
  while (out.size() < n) out.insert(out.end(), ids.begin() + 1, ids.end());
  out.resize(n);
  out[0] = 1;
  return out;
}

// Prefills a 32-token prompt, then times one decode step per benchmark iteration; sets the tok/s counter.
bool time_decode(benchmark::State& state, const std::shared_ptr<engine::Model>& m) {
  engine::GenerateRequest req;
  req.prompt = prompt_of(*m, 32);
  req.max_new_tokens = 400;
  req.stop_at_eos = false;
  auto g = engine::Generation::create(m, req);
  if (!g || !(*g)->prefill().ok()) {
    state.SkipWithError("prefill failed");
    return false;
  }
  for (auto _ : state) {
    auto ev = (*g)->step();
    if (!ev) state.SkipWithError(ev.error().message.c_str());
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  return true;
}

// Drops the model's files from the page cache (clean pages only), so the next load reads from storage.
void evict(const std::string& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// Replica creation per mode, warm page cache or cold (files evicted first): what the policy's replica-mode choice
// is fed with.
void BM_Replica(benchmark::State& state, std::string dir, policy::ReplicaMode mode, bool cold) {
  engine::ReplicaTimes t;
  for (auto _ : state) {
    state.PauseTiming();
    if (cold) evict(dir);
    state.ResumeTiming();
    engine::LoadOptions lo;
    lo.max_context = 512;
    auto r = engine::Replica::create(dir, lo, mode);
    if (!r) {
      state.SkipWithError(r.error().message.c_str());
      return;
    }
    t = (*r)->times();
  }
  state.counters["load_ms"] = t.load_ms;
  state.counters["page_in_ms"] = t.page_in_ms;
  state.counters["warm_up_ms"] = t.warm_up_ms;
}

// Decode on the simulated accelerator with the first k layers there (k = layers: all; 0: none), compute dtype dt.
// Also: bytes accounted on the device against the resident-set growth the device copies really cost.
void BM_DecodeSim(benchmark::State& state, std::string dir, engine::ComputeDType dt, int k) {
  const double rss0 = static_cast<double>(rss_kib()) / 1024.0;
  device::SimulatedConfig c;
  c.capacity_bytes = 8ull << 30;
  auto dev = std::make_shared<device::SimulatedDevice>(c, std::make_shared<SteadyClock>());
  engine::LoadOptions lo;
  lo.dtype = dt;
  lo.max_context = 512;
  lo.accelerator = dev;
  lo.accel_layers = k;
  auto m = engine::Model::load(dir, lo);
  if (!m) {
    state.SkipWithError(m.error().message.c_str());
    return;
  }
  const double rss1 = static_cast<double>(rss_kib()) / 1024.0;
  if (!time_decode(state, *m)) return;
  state.counters["accounted_MiB"] = static_cast<double>((*m)->load_stats().accel_weight_bytes +
                                                        (*m)->load_stats().accel_kv_bytes) / 1048576.0;
  state.counters["weights_on_dev_MiB"] = static_cast<double>((*m)->load_stats().accel_weight_bytes) / 1048576.0;
  state.counters["rss_growth_MiB"] = rss1 - rss0;
}

// Baseline: stream-read every weight byte once (what a decode step must read at least), with 8 independent
// 16-byte vector accumulators so the loop is bound by memory, not by the adds.
void BM_WeightStream(benchmark::State& state, std::string dir, int threads) {
  auto m = load(dir, engine::ComputeDType::f32, 1);
  for (const weights::MappedFile* f : m->files().mapped_files()) f->prefault();  // page tables populated
  std::uint64_t bytes = 0;
  for (const auto& t : m->files().tensors()) bytes += t.data.size();
  // Each thread reads its share of every tensor (as the row split does).
  auto part = [&](int id) {
    typedef std::uint32_t v4 __attribute__((vector_size(16)));
    v4 acc[8] = {};
    for (const auto& t : m->files().tensors()) {
      const std::size_t blocks = t.data.size() / 128;
      const std::size_t b = blocks * static_cast<std::size_t>(id) / static_cast<std::size_t>(threads);
      const std::size_t e = blocks * static_cast<std::size_t>(id + 1) / static_cast<std::size_t>(threads);
      const std::byte* p = t.data.data();
      for (std::size_t i = b; i < e; ++i)
        for (int k = 0; k < 8; ++k) {
          v4 v;
          std::memcpy(&v, p + i * 128 + static_cast<std::size_t>(k) * 16, 16);
          acc[k] += v;
        }
    }
    benchmark::DoNotOptimize(acc);
  };
  for (auto _ : state) {
    std::vector<std::thread> ts;
    for (int i = 1; i < threads; ++i) ts.emplace_back(part, i);
    part(0);
    for (auto& t : ts) t.join();
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(bytes) * static_cast<double>(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
  state.counters["weight_MiB"] = static_cast<double>(bytes) / 1048576.0;
}

void BM_Load(benchmark::State& state, std::string dir, engine::ComputeDType dt) {
  double rss = 0;
  for (auto _ : state) {
    auto m = load(dir, dt, 1);
    rss = static_cast<double>(rss_kib()) / 1024.0;
    benchmark::DoNotOptimize(m);
  }
  state.counters["rss_MiB"] = rss;
}

void BM_Prefill(benchmark::State& state, std::string dir, engine::ComputeDType dt, int threads) {
  auto m = load(dir, dt, threads);
  const auto prompt = prompt_of(*m, 128);
  // One untimed prompt first, as llama-bench's warm-up run: the mapped weights faulted in and the buffers grown.
  {
    auto seq = m->new_sequence();
    if (auto l = m->forward(**seq, prompt); !l) return state.SkipWithError(l.error().message.c_str());
  }
  for (auto _ : state) {
    auto seq = m->new_sequence();
    auto l = m->forward(**seq, prompt);
    if (!l) state.SkipWithError(l.error().message.c_str());
  }
  state.counters["tok/s"] =
      benchmark::Counter(128.0 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void BM_Decode(benchmark::State& state, std::string dir, engine::ComputeDType dt, int threads) {
  const double rss0 = static_cast<double>(rss_kib()) / 1024.0;
  auto m = load(dir, dt, threads);
  for (const weights::MappedFile* f : m->files().mapped_files()) f->prefault();
  if (!time_decode(state, m)) return;
  state.counters["rss_MiB"] = static_cast<double>(rss_kib()) / 1024.0;
  // Resident memory beyond the mapped weights and the KV pool (the "≤ KV + 64 MiB").
  state.counters["rss_beyond_weights_kv_MiB"] =
      static_cast<double>(rss_kib()) / 1024.0 - rss0 -
      static_cast<double>(m->load_stats().weight_bytes + m->load_stats().kv_pool_bytes) / 1048576.0;
  state.counters["read_MiB"] = decode_bytes(*m) / 1048576.0;
}

// Continuous batching without the daemon: `streams` greedy generations of 64 tokens after a 5-token prompt (as
// bench/daemon/streams.sh submits them) through one BatchRunner of max batch 16, the KV cache in f16 (the
// daemon's default); per iteration from the submits to the last finish. tok/s counts every stream's tokens, so
// the summary divides streams:8 by streams:1 of the same file and threads (issue 30's target: >= 4x).
// The model as the daemon holds it for these benchmarks: the KV cache in f16, the mapped weights faulted in.
// nullptr (the benchmark skipped with the error) when it does not load.
std::shared_ptr<engine::Model> load_as_daemon(benchmark::State& state, const std::string& dir, int threads,
                                              int max_context) {
  engine::LoadOptions lo;
  lo.dtype = engine::ComputeDType::auto_;
  lo.threads = threads;
  lo.max_context = max_context;
  lo.cpu_kv = engine::KvCacheType::f16;
  auto loaded = engine::Model::load(dir, lo);
  if (!loaded) {
    state.SkipWithError(loaded.error().message.c_str());
    return nullptr;
  }
  for (const weights::MappedFile* f : (*loaded)->files().mapped_files()) f->prefault();
  return *loaded;
}

void BM_DecodeBatch(benchmark::State& state, std::string dir, int threads, int streams) {
  const std::shared_ptr<engine::Model> m = load_as_daemon(state, dir, threads, 512);
  if (!m) return;
  constexpr int kTokens = 64;
  engine::BatchLimits lim;
  lim.max_batch = 16;
  lim.step_tokens = 80;
  engine::BatchRunner runner(m, lim);
  std::mutex mu;
  std::condition_variable cv;
  std::int64_t tokens = 0;
  const auto run = [&](int n) -> bool {
    int left = n;
    for (int i = 0; i < n; ++i) {
      engine::GenerateRequest req;
      req.prompt = prompt_of(*m, 5);
      req.max_new_tokens = kTokens;
      req.stop_at_eos = false;
      auto g = engine::Generation::create(m, req);
      if (!g) return false;
      engine::BatchRunner::Callbacks cb;
      cb.token = [&](const engine::TokenEvent& ev) {
        if (ev.token >= 0) ++tokens;
      };
      cb.finished = [&](engine::FinishReason, const Status&) {
        std::lock_guard lock(mu);
        --left;
        cv.notify_all();
      };
      if (!runner.submit(std::move(g).value(), std::move(cb)).ok()) return false;
    }
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return left == 0; });
    return true;
  };
  if (!run(1)) {  // warm-up: the first step's allocations
    state.SkipWithError("a generation failed");
    return;
  }
  tokens = 0;
  for (auto _ : state)
    if (!run(streams)) state.SkipWithError("a generation failed");
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}

// The daemon's long prompt without the daemon (issue 30's "1,500-token prompt"): one sequence takes a 1,500-token
// prompt in 65-token chunks (what bench/daemon/streams.sh's daemon cuts: step_tokens 80 − concurrency 16 + 1), the KV
// cache in f16 as the daemon's; per iteration the whole prompt, so time = its prefill, attention over the growing
// context included (Prefill128 sees 128 positions at most).
void BM_PrefillLong(benchmark::State& state, std::string dir, int threads) {
  constexpr std::size_t kPrompt = 1500, kChunk = 65;
  const std::shared_ptr<engine::Model> m = load_as_daemon(state, dir, threads, 2048);
  if (!m) return;
  const auto prompt = prompt_of(*m, kPrompt);
  const auto once = [&]() -> bool {
    auto seq = m->new_sequence();
    if (!seq) return false;
    for (std::size_t at = 0; at < kPrompt; at += kChunk) {
      const std::size_t n = std::min(kChunk, kPrompt - at);
      if (!m->forward(**seq, std::span(prompt).subspan(at, n))) return false;
    }
    return true;
  };
  if (!once()) {  // warm-up: the buffers grown
    state.SkipWithError("the prompt failed");
    return;
  }
  for (auto _ : state)
    if (!once()) state.SkipWithError("the prompt failed");
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(kPrompt) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}

// Collects results so the summary can print ratios against the bandwidth baseline.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  RatioReporter() : ConsoleReporter(OO_Tabular) {}
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      if (r.run_type != Run::RT_Iteration) continue;
      for (const auto& [k, c] : r.counters) values_[r.run_name.function_name][k] = c.value;
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\nDecode against the memory-bandwidth bound (same process; bound = streaming read of one token's\n"
                "weight bytes with the same number of threads):\n");
    std::printf("%-44s %10s %12s %8s\n", "benchmark", "tok/s", "bound tok/s", "ratio");
    for (const auto& [name, c] : values_) {
      if (name.rfind("Decode/", 0) != 0) continue;
      const std::string model = name.substr(7, name.find('/', 7) - 7);
      const std::string threads = name.substr(name.rfind('/') + 1);  // "threads:N"
      const auto base = values_.find("WeightStream/" + model + "/" + threads);
      if (base == values_.end()) continue;
      const double gbs = base->second.at("GB/s");
      const double bytes_per_tok = c.at("read_MiB") * 1048576.0;
      const double bound = gbs * 1e9 / bytes_per_tok;
      std::printf("%-44s %10.1f %12.1f %7.0f%%\n", name.c_str(), c.at("tok/s"), bound, 100.0 * c.at("tok/s") / bound);
    }
    bool header = false;
    for (const auto& [name, c] : values_) {
      const auto at = name.find("/streams:");
      if (name.rfind("DecodeBatch/", 0) != 0 || at == std::string::npos || name.compare(at, 11, "/streams:1/") == 0)
        continue;
      const auto one = values_.find(name.substr(0, at) + "/streams:1" + name.substr(name.find('/', at + 1)));
      if (one == values_.end()) continue;
      if (!header) {
        std::printf("\nContinuous batching against one stream (same file and threads, same process):\n");
        std::printf("%-44s %10s %12s %8s\n", "benchmark", "tok/s", "1 stream", "ratio");
        header = true;
      }
      std::printf("%-44s %10.1f %12.1f %7.2fx\n", name.c_str(), c.at("tok/s"), one->second.at("tok/s"),
                  c.at("tok/s") / one->second.at("tok/s"));
    }
  }

 private:
  std::map<std::string, std::map<std::string, double>> values_;
};

}  // namespace

int main(int argc, char** argv) {
  if (!bench::setup_heap(argc, argv)) return 1;
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--models") == 0 && i + 1 < argc) g_models = argv[++i];
    else if (std::strcmp(argv[i], "--quick") == 0) g_quick = true;
    else rest.push_back(argv[i]);
  }
  int rargc = static_cast<int>(rest.size());
  benchmark::Initialize(&rargc, rest.data());

  const std::vector<std::string> presets = g_quick ? std::vector<std::string>{"tiny"}
                                                   : std::vector<std::string>{"tiny", "134m"};
  for (const auto& p : presets) {
    const std::string f32 = model_dir(p, weights::DType::f32);
    for (int t : {1, 2})
      benchmark::RegisterBenchmark(("WeightStream/" + p + "/threads:" + std::to_string(t)).c_str(), BM_WeightStream,
                                   f32, t)->Unit(benchmark::kMillisecond)->MinTime(0.5)->UseRealTime();
    benchmark::RegisterBenchmark(("Load/" + p + "/f32").c_str(), BM_Load, f32, engine::ComputeDType::f32)->Unit(benchmark::kMillisecond)->Iterations(3);
    benchmark::RegisterBenchmark(("Load/" + p + "/bf16-from-f32").c_str(), BM_Load, f32, engine::ComputeDType::bf16)->Unit(benchmark::kMillisecond)->Iterations(3);
    for (bool cold : {false, true})
      for (auto mode : {policy::ReplicaMode::warm, policy::ReplicaMode::mmap, policy::ReplicaMode::on_demand})
        benchmark::RegisterBenchmark(("Replica/" + p + "/" + std::string(policy::replica_mode_name(mode)) +
                                      (cold ? "/cold" : "/cached")).c_str(),
                                     BM_Replica, f32, mode, cold)
            ->Unit(benchmark::kMillisecond)->Iterations(2)->UseRealTime();
    {
      const int layers = modelgen::preset(p)->layers;
      std::vector<int> splits;
      for (int k = 0; k <= layers; k += (layers >= 8 ? layers / 4 : 1)) splits.push_back(k);
      for (int k : splits)
        benchmark::RegisterBenchmark(("DecodeSim/" + p + "/f32/k:" + std::to_string(k)).c_str(), BM_DecodeSim, f32,
                                     engine::ComputeDType::f32, k)
            ->Unit(benchmark::kMillisecond)->Iterations(g_quick ? 16 : 48)->UseRealTime();
      benchmark::RegisterBenchmark(("DecodeSim/" + p + "/bf16/k:" + std::to_string(layers)).c_str(), BM_DecodeSim,
                                   f32, engine::ComputeDType::bf16, layers)
          ->Unit(benchmark::kMillisecond)->Iterations(g_quick ? 16 : 48)->UseRealTime();
    }
    // Every weight type the CPU kernels serve: f32 from the HF directory, the others as GGUF files.
    for (const std::string v :
         {"f32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K_M", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K_M"}) {
      const std::string dir = v == "f32" ? f32 : gguf_variant(p, v);
      if (dir.empty()) continue;
      for (int t : {1, 2}) {
        const std::string tag = p + "/" + v + "/threads:" + std::to_string(t);
        benchmark::RegisterBenchmark(("Prefill128/" + tag).c_str(), BM_Prefill, dir, engine::ComputeDType::auto_, t)->Unit(benchmark::kMillisecond)->Iterations(g_quick ? 2 : 3)->UseRealTime();
        benchmark::RegisterBenchmark(("Decode/" + tag).c_str(), BM_Decode, dir, engine::ComputeDType::auto_, t)->Unit(benchmark::kMillisecond)->Iterations(g_quick ? 16 : 48)->UseRealTime();
      }
      if (p == "134m" && (v == "f32" || v == "Q8_0" || v == "Q4_K_M"))  // (tiny: the step's fixed costs only)
        for (int t : {1, 2})
          benchmark::RegisterBenchmark(("PrefillLong/" + p + "/" + v + "/threads:" + std::to_string(t)).c_str(),
                                       BM_PrefillLong, dir, t)
              ->Unit(benchmark::kMillisecond)->Iterations(g_quick ? 1 : 2)->UseRealTime();
      if (p == "134m" && (v == "f32" || v == "Q8_0" || v == "Q4_K_M"))
        for (int t : {1, 2})
          for (int s : {1, 8})
            benchmark::RegisterBenchmark(("DecodeBatch/" + p + "/" + v + "/streams:" + std::to_string(s) + "/threads:" +
                                          std::to_string(t)).c_str(),
                                         BM_DecodeBatch, dir, t, s)
                ->Unit(benchmark::kMillisecond)->Iterations(g_quick ? 1 : 3)->UseRealTime();
    }
  }
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
