// The image index (src/client/image_index.h): search latency over 10,000 vectors (dim 512 and 128; the scoring loop
// alone and the whole search), loading the vectors from the file, and update throughput (SQLite rows/s, one
// transaction per batch as tandemctl index writes them). Figures: docs/image-search.md.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/image_index.h"

namespace tc = tandem::client;
namespace fs = std::filesystem;

namespace {

std::vector<float> random_unit(std::mt19937& rng, std::size_t dim) {
  std::normal_distribution<float> nd;
  std::vector<float> v(dim);
  double n = 0;
  for (float& x : v) {
    x = nd(rng);
    n += double(x) * x;
  }
  for (float& x : v) x = static_cast<float>(x / std::sqrt(n));
  return v;
}

std::string temp_dir() {
  char tmpl[] = "/tmp/tandem-bench-index-XXXXXX";
  return ::mkdtemp(tmpl);
}

// An index of `rows` random vectors, built once per dim and kept for the process.
tc::ImageIndex& filled_index(std::uint32_t dim, std::size_t rows) {
  static std::map<std::uint32_t, std::unique_ptr<tc::ImageIndex>> cache;
  auto& ix = cache[dim];
  if (!ix) {
    std::string file = temp_dir() + "/index.sqlite3";
    ix = std::move(tc::ImageIndex::open(file, {"bench", "fp", dim}, {}).value());
    std::mt19937 rng(dim);
    std::vector<tc::IndexUpdate> batch;
    for (std::size_t i = 0; i < rows; ++i) {
      batch.push_back({{"/pics/img" + std::to_string(i) + ".jpg", 1, 1}, random_unit(rng, dim), ""});
      if (batch.size() == 1000 || i + 1 == rows) {
        if (!ix->apply(batch).ok()) std::abort();
        batch.clear();
      }
    }
    if (!ix->load_vectors().ok()) std::abort();
  }
  return *ix;
}

void BM_DotRows(benchmark::State& state) {
  const auto dim = static_cast<std::size_t>(state.range(0));
  const std::size_t rows = 10000;
  std::mt19937 rng(1);
  std::vector<float> m;
  for (std::size_t r = 0; r < rows; ++r) {
    auto v = random_unit(rng, dim);
    m.insert(m.end(), v.begin(), v.end());
  }
  auto q = random_unit(rng, dim);
  std::vector<float> scores(rows);
  for (auto _ : state) {
    tc::dot_rows(m.data(), rows, dim, q.data(), scores.data());
    benchmark::DoNotOptimize(scores.data());
  }
  state.SetItemsProcessed(state.iterations() * rows);
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(rows * dim * 4), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DotRows)->Arg(512)->Arg(128)->Unit(benchmark::kMicrosecond);

// search(): scoring + top-10 selection, vectors already in memory.
void BM_Search10k(benchmark::State& state) {
  const auto dim = static_cast<std::uint32_t>(state.range(0));
  auto& ix = filled_index(dim, 10000);
  std::mt19937 rng(2);
  auto q = random_unit(rng, dim);
  for (auto _ : state) {
    auto hits = ix.search(q, 10);
    if (!hits.ok() || hits->size() != 10) std::abort();
    benchmark::DoNotOptimize(hits->data());
  }
}
BENCHMARK(BM_Search10k)->Arg(512)->Arg(128)->Unit(benchmark::kMillisecond);

// What a `tandemctl search` pays once per run: reading 10,000 vectors out of SQLite.
void BM_LoadVectors10k(benchmark::State& state) {
  const auto dim = static_cast<std::uint32_t>(state.range(0));
  auto& ix = filled_index(dim, 10000);
  for (auto _ : state)
    if (!ix.load_vectors().ok()) std::abort();
}
BENCHMARK(BM_LoadVectors10k)->Arg(512)->Arg(128)->Unit(benchmark::kMillisecond);

// Opening the file (layout checks + PRAGMA quick_check) of 10,000 vectors.
void BM_Open10k(benchmark::State& state) {
  const auto dim = static_cast<std::uint32_t>(state.range(0));
  std::string file = filled_index(dim, 10000).file();
  for (auto _ : state) {
    auto ix = tc::ImageIndex::open(file, {"bench", "fp", dim}, {.create = false});
    if (!ix.ok()) std::abort();
  }
}
BENCHMARK(BM_Open10k)->Arg(512)->Unit(benchmark::kMillisecond);

// Update throughput: batches of state.range(1) rows of dim state.range(0), one transaction each (rows/s).
void BM_Apply(benchmark::State& state) {
  const auto dim = static_cast<std::uint32_t>(state.range(0));
  const auto batch_size = static_cast<std::size_t>(state.range(1));
  std::string dir = temp_dir();
  auto ix = std::move(tc::ImageIndex::open(dir + "/index.sqlite3", {"bench", "fp", dim}, {}).value());
  std::mt19937 rng(3);
  std::vector<tc::IndexUpdate> batch;
  for (std::size_t i = 0; i < batch_size; ++i) batch.push_back({{"", 1, 1}, random_unit(rng, dim), ""});
  std::size_t n = 0;
  for (auto _ : state) {
    for (auto& u : batch) u.file.path = "/pics/img" + std::to_string(n++) + ".jpg";
    if (!ix->apply(batch).ok()) std::abort();
  }
  state.SetItemsProcessed(state.iterations() * batch_size);
  ix.reset();
  fs::remove_all(dir);
}
BENCHMARK(BM_Apply)->Args({512, 16})->Args({512, 256})->Args({128, 256})->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
