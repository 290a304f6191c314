// BERT-family text embedding throughput (engine/bert.h): texts/s at batch 1 and 32 for the bert-base shape (768 wide,
// 12 layers, FFN 3072; random weights) as a GGUF file in F32, F16 and Q8_0, on the CPU with 1 and 2 threads, for
// passages of 128 tokens (a RAG chunk) and queries of 16. The files are written once to
// /tmp/tandem-bench-models/bert-base-*.gguf; llama.cpp's llama-embedding on the same files is the baseline
// (bench/engine/bert_side_by_side.sh). docs/embeddings.md, "Text embedding models".
//   bench_bert [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/bert.h"
#include "modelgen/bert_writer.h"

using namespace tandem;

namespace {

std::shared_ptr<engine::BertModel> model(modelgen::Recipe r, int threads) {
  static std::map<std::string, std::shared_ptr<engine::BertModel>> cache;
  const std::string rname(modelgen::recipe_name(r));
  const std::string key = rname + "-" + std::to_string(threads);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const std::string dir = "/tmp/tandem-bench-models/bert-base", file = dir + "-" + rname + ".gguf";
  if (!std::filesystem::exists(file)) {
    if (!std::filesystem::exists(dir + "/model.safetensors")) {
      modelgen::BertWriteOptions o;
      o.config = *modelgen::bert_preset("bert-base");
      if (!modelgen::write_bert_model(dir, o).ok()) return nullptr;
    }
    if (!modelgen::convert_bert_to_gguf(dir, file, r).ok()) return nullptr;
  }
  engine::BertLoadOptions lo;
  lo.threads = threads;
  auto m = engine::BertModel::load(file, lo);
  if (!m) return nullptr;
  return cache[key] = *m;
}

void run(benchmark::State& state, modelgen::Recipe r, int threads, int tokens) {
  auto m = model(r, threads);
  if (!m) {
    state.SkipWithError("model");
    return;
  }
  const auto& tk = m->tokenizer();
  const int batch = static_cast<int>(state.range(0));
  std::vector<std::vector<std::int32_t>> ids;
  for (int i = 0; i < batch; ++i) {
    std::vector<std::int32_t> t{tk.cls_id()};
    for (int j = 0; j < tokens - 2; ++j) t.push_back(5 + (i * 131 + j * 17) % (tk.vocab_size() - 5));
    t.push_back(tk.sep_id());
    ids.push_back(std::move(t));
  }
  for (auto _ : state) {
    auto v = m->embed_ids(ids);
    if (!v) {
      state.SkipWithError(v.error().message.c_str());
      return;
    }
    benchmark::DoNotOptimize(v->data());
  }
  state.counters["texts/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * batch, benchmark::Counter::kIsRate);
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * batch * tokens, benchmark::Counter::kIsRate);
}

void register_all() {
  for (modelgen::Recipe r : {modelgen::Recipe::f32, modelgen::Recipe::f16, modelgen::Recipe::q8_0})
    for (int threads : {1, 2})
      for (int tokens : {128, 16}) {
        const std::string name = "Bert/bert-base/" + std::string(modelgen::recipe_name(r)) + "/t" +
                                 std::to_string(threads) + "/" + std::to_string(tokens) + "tok";
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { run(s, r, threads, tokens); })
            ->Arg(1)
            ->Arg(32)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
