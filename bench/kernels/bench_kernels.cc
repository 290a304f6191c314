// CPU kernel throughput on one thread, against baselines measured in the same process:
//   Decode/<type>/<rows>x<cols>: one activation row (a GEMV). GB/s of weight bytes read with the weights cold: the
//     benchmark cycles through copies of the matrix filling 256 MiB (8x a 32 MiB L3; 96 MiB with --quick), as a
//     decode step streams a whole model. bound = a plain streaming read of those same bytes (best of 1, 4 and 8
//     side-by-side streams), measured right after the kernel; x_bound = GB/s / bound.
//   Prefill/<type>/<rows>x<cols>/n:128: 128 activation rows, activation quantization included, weights warm.
//     GFLOP/s (2 * rows * cols * n per call); x_f32 = over the f32 kernels' prefill of the same shape.
//
//   Attention/f16/<heads>x<hd>/pos:<p>: a decode row's attention (kernels.h attention_decode) over p + 1 positions
//     of an f16 pool in shuffled 16-position blocks as the engine's pool gives them (the 134M shape: 12 heads of 64); heads·keys/s and the key and value bytes'
//     GB/s. The pool's rows cycle through copies filling 64 MiB, so each call reads them from memory as a decode
//     step does.
//
//   bench_kernels [--quick] [--warm] [--rows] [google-benchmark flags]   TANDEM_KERNELS=scalar|avx2|avxvnni|avx512|avx512bf16|amx
//   picks the kernels
// Times are this thread's CPU time. --warm decodes one copy of each matrix (cache-resident: kernel speed alone).
// --rows: no side tables (the packed copies the engine makes at load), so the kernels read the rows as stored.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <time.h>

#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/types.h"

namespace {

using namespace tandem::kernels;

bool g_quick = false;
bool g_warm = false;  // --warm: decode weights that fit in L3 (kernel speed without the memory bound)
bool g_rows = false;  // --rows: no side tables
std::size_t g_cold_bytes = std::size_t{256} << 20;
double g_stream_gbps = 0;
double g_f32_prefill_gflops = 0;
constexpr std::int64_t kPrefillRows = 128;

struct Shape {
  std::int64_t rows;
  std::int64_t cols;
};

std::string shape_name(Shape s) { return std::to_string(s.rows) + "x" + std::to_string(s.cols); }

std::vector<float> gaussian(std::size_t n, float sigma, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = nd(rng);
  return x;
}

// `copies` copies of a rows x cols matrix of type t, back to back. One 64-row tile is quantized by the reference
// and repeated (the kernels' speed does not depend on the values).
std::vector<std::uint8_t> make_weights(WType t, Shape s, std::size_t copies) {
  const std::size_t rb = row_bytes(t, s.cols);
  const std::int64_t tile_rows = std::min<std::int64_t>(64, s.rows);
  const std::vector<float> x = gaussian(static_cast<std::size_t>(tile_rows * s.cols), 0.05f, 7);
  std::vector<std::uint8_t> tile(rb * static_cast<std::size_t>(tile_rows));
  for (std::int64_t r = 0; r < tile_rows; ++r) quantize_row(t, x.data() + r * s.cols, tile.data() + r * rb, s.cols);
  const std::size_t matrix = rb * static_cast<std::size_t>(s.rows);
  std::vector<std::uint8_t> w(matrix * copies);
  for (std::size_t off = 0; off < w.size(); off += tile.size()) {
    std::memcpy(w.data() + off, tile.data(), std::min(tile.size(), w.size() - off));
  }
  return w;
}

std::vector<std::uint8_t> make_acts(WType t, std::int64_t n, std::int64_t cols) {
  const std::vector<float> x = gaussian(static_cast<std::size_t>(n * cols), 1.f, 9);
  std::vector<std::uint8_t> a(act_row_bytes(t, cols) * static_cast<std::size_t>(n));
  quantize_act(t, x.data(), cols, n, cols, a.data());
  return a;
}

// CPU time of this thread: on a shared machine, wall time would count other processes' turns on the core. The
// benchmarks below use Google Benchmark's CPU time for the same reason, so both sides of each ratio are CPU time.
double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// The bound: plain 16-byte loads over `bytes`, split into `streams` parts read side by side (the kernels read
// several weight rows at once, and one stream alone does not reach the prefetchers' best). Best of a few passes.
double stream_read_gbps(const std::vector<std::uint8_t>& buf, std::size_t streams, int passes) {
  typedef std::uint32_t v4 __attribute__((vector_size(16)));
  const std::size_t part = buf.size() / streams / 128 * 128;
  double best = 0;
  for (int pass = 0; pass < passes; ++pass) {
    v4 acc[8] = {};
    const double t0 = thread_seconds();
    for (std::size_t i = 0; i < part; i += 128) {
      for (std::size_t s = 0; s < streams; ++s) {
        const std::uint8_t* p = buf.data() + s * part + i;
        for (int k = 0; k < 8; ++k) {
          v4 v;
          std::memcpy(&v, p + static_cast<std::size_t>(k) * 16, 16);
          acc[k] += v;
        }
      }
    }
    benchmark::DoNotOptimize(acc);
    const double sec = thread_seconds() - t0;
    best = std::max(best, static_cast<double>(part * streams) / sec / 1e9);
  }
  return best;
}

// A decode step of n activation rows (n = 1: one stream; 4 - 16: continuous batching's steps) over cold weights:
// GB/s of matrix read, and x_bound against the streaming read right after. A batched step at x_bound near 1 costs
// what one row costs: the kernels keep up with memory.
void BM_Decode(benchmark::State& state, WType t, Shape s, std::int64_t n) {
  const std::size_t matrix = row_bytes(t, s.cols) * static_cast<std::size_t>(s.rows);
  const std::size_t copies = g_warm ? 1 : std::max<std::size_t>(2, g_cold_bytes / matrix);
  const std::vector<std::uint8_t> w = make_weights(t, s, copies);
  const std::vector<std::uint8_t> a = make_acts(t, n, s.cols);
  // The side table the active kernels read beside each matrix (the engine makes it at load; none on most paths).
  const std::size_t aux = g_rows ? 0 : aux_bytes(t, s.rows, s.cols);
  std::vector<std::uint8_t> x(aux * copies);
  const double tp = thread_seconds();
  for (std::size_t c = 0; aux != 0 && c < copies; ++c) prepare_aux(t, w.data() + c * matrix, s.rows, s.cols, x.data() + c * aux);
  // How fast the load makes it (bytes of the matrix per second, cold: each copy is read once).
  if (aux != 0) state.counters["aux_GB/s"] = static_cast<double>(matrix * copies) / 1e9 / (thread_seconds() - tp);
  std::vector<float> y(static_cast<std::size_t>(s.rows * n));
  std::size_t k = 0;
  const double t0 = thread_seconds();
  for (auto _ : state) {
    matmul_rows(t, w.data() + k * matrix, s.cols, a.data(), n, y.data(), s.rows, 0, s.rows,
                aux != 0 ? x.data() + k * aux : nullptr);
    benchmark::DoNotOptimize(y.data());
    k = k + 1 == copies ? 0 : k + 1;
  }
  const double gbps = static_cast<double>(matrix) * static_cast<double>(state.iterations()) / 1e9 /
                      (thread_seconds() - t0);
  // The bound, measured right after on the same bytes, so a busy moment on a shared machine hits both sides.
  double bound = 0;  // (the timed loop has ended)
  for (std::size_t streams : {1, 4, 8}) bound = std::max(bound, stream_read_gbps(w, streams, 1));
  state.counters["GB/s"] = gbps;
  state.counters["bound"] = bound;
  state.counters["x_bound"] = gbps / bound;
  state.counters["MiB"] = static_cast<double>(matrix) / 1048576.0;
}

// A copy of `bytes` whose first byte lies `phase` bytes past a 64-byte boundary, as the engine places them: its
// prepared activation rows on a boundary (phase 0), a GGUF file's tensors on a multiple of 32 (phase 32, the case
// where every 64-byte load of a row of 64-byte multiples splits across two cache lines).
struct Placed {
  std::vector<std::uint8_t> buf;
  std::uint8_t* p;
  Placed(const std::vector<std::uint8_t>& bytes, std::size_t phase) : buf(bytes.size() + 128) {
    const auto base = reinterpret_cast<std::uintptr_t>(buf.data());
    p = buf.data() + ((64 - base % 64) % 64 + phase);
    std::memcpy(p, bytes.data(), bytes.size());
  }
  std::uint8_t* data() { return p; }
};

// One prefill call: quantize n activation rows, multiply. Returns GFLOP per call.
struct Prefill {
  WType t;
  Shape s;
  Placed w;
  std::vector<float> x;
  Placed a;
  std::vector<float> y;
  std::vector<std::uint8_t> aux;

  Prefill(WType type, Shape shape)
      : t(type),
        s(shape),
        w(make_weights(type, shape, 1), 32),
        x(gaussian(static_cast<std::size_t>(kPrefillRows * shape.cols), 1.f, 5)),
        a(std::vector<std::uint8_t>(act_row_bytes(type, shape.cols) * static_cast<std::size_t>(kPrefillRows)),
          type == WType::f32 || type == WType::bf16 ? 32 : 0),  // at the weight rows' offset, as cpu_linear does
        y(static_cast<std::size_t>(kPrefillRows * shape.rows)),
        aux(g_rows ? 0 : aux_bytes(type, shape.rows, shape.cols)) {
    if (!aux.empty()) prepare_aux(t, w.data(), s.rows, s.cols, aux.data());
  }

  void run() {
    quantize_act(t, x.data(), s.cols, kPrefillRows, s.cols, a.data());
    matmul_rows(t, w.data(), s.cols, a.data(), kPrefillRows, y.data(), s.rows, 0, s.rows,
                aux.empty() ? nullptr : aux.data());
    benchmark::DoNotOptimize(y.data());
  }
  double gflop() const { return 2.0 * static_cast<double>(s.rows * s.cols * kPrefillRows) / 1e9; }
};

void BM_Prefill(benchmark::State& state, WType t, Shape s) {
  Prefill p(t, s);
  for (auto _ : state) p.run();
  const double gf = p.gflop() * static_cast<double>(state.iterations());
  state.counters["GFLOP/s"] = benchmark::Counter(gf, benchmark::Counter::kIsRate);
  state.counters["x_f32"] = benchmark::Counter(gf / g_f32_prefill_gflops, benchmark::Counter::kIsRate);
}

void BM_Attention(benchmark::State& state, std::int64_t heads, std::int64_t hd, std::int64_t pos) {
  const std::int64_t positions = pos + 1, pool_rows = 2 * positions, row = heads * hd;
  const std::size_t pool_bytes = static_cast<std::size_t>(pool_rows * row) * sizeof(std::uint16_t) * 2;
  const std::size_t copies = std::max<std::size_t>(1, (std::size_t{64} << 20) / pool_bytes);
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.F, 1.F);
  std::vector<std::uint16_t> k(copies * static_cast<std::size_t>(pool_rows * row)), v(k.size());
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = f32_to_f16(g(rng));
    v[i] = f32_to_f16(g(rng));
  }
  // The pool's layout (engine KvPool, 16-position blocks): the sequence's blocks shuffled among the pool's.
  constexpr std::int64_t kBlock = 16;
  std::vector<std::int64_t> blocks(static_cast<std::size_t>(pool_rows / kBlock));
  for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<std::int64_t>(i);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  std::vector<std::int64_t> slots(static_cast<std::size_t>(positions));
  for (std::int64_t p = 0; p < positions; ++p)
    slots[static_cast<std::size_t>(p)] = blocks[static_cast<std::size_t>(p / kBlock)] * kBlock + p % kBlock;
  std::vector<float> q(static_cast<std::size_t>(row)), out(q.size()), scratch(static_cast<std::size_t>(positions));
  for (float& x : q) x = g(rng);
  const float scale = 1.F / std::sqrt(static_cast<float>(hd));
  std::size_t c = 0;
  for (auto _ : state) {
    const std::size_t off = c * static_cast<std::size_t>(pool_rows * row);
    attention_decode(q.data(), heads, heads, hd, k.data() + off, v.data() + off, slots.data(), pos, 0, scale, 0.F,
                     scratch.data(), out.data());
    benchmark::DoNotOptimize(out.data());
    c = (c + 1) % copies;
  }
  const auto it = static_cast<double>(state.iterations());
  state.counters["head_keys/s"] =
      benchmark::Counter(it * static_cast<double>(heads * positions), benchmark::Counter::kIsRate);
  state.counters["GB/s"] = benchmark::Counter(it * static_cast<double>(positions * row * 2 * 2) / 1e9,
                                              benchmark::Counter::kIsRate);
}

double f32_prefill_gflops(Shape s) {
  Prefill p(WType::f32, s);
  p.run();
  int calls = 0;
  const double t0 = thread_seconds();
  double elapsed = 0;
  while (elapsed < (g_quick ? 0.2 : 0.5)) {
    p.run();
    ++calls;
    elapsed = thread_seconds() - t0;
  }
  return p.gflop() * calls / elapsed;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) g_quick = true;
    else if (std::strcmp(argv[i], "--warm") == 0) g_warm = true;
    else if (std::strcmp(argv[i], "--rows") == 0) g_rows = true;
    else rest.push_back(argv[i]);
  }
  int rargc = static_cast<int>(rest.size());
  benchmark::Initialize(&rargc, rest.data());
  if (g_quick) g_cold_bytes = std::size_t{96} << 20;

  // The 134M preset's matrices: FFN up/gate (2048 x 768), FFN down (768 x 2048), the output head (32000 x 768).
  const std::vector<Shape> decode_shapes = g_quick ? std::vector<Shape>{{2048, 768}}
                                                   : std::vector<Shape>{{2048, 768}, {768, 2048}, {32000, 768}};
  const Shape prefill_shape{2048, 768};
  {
    const std::vector<std::uint8_t> buf(g_cold_bytes, 1);
    for (std::size_t streams : {1, 2, 4, 8}) g_stream_gbps = std::max(g_stream_gbps, stream_read_gbps(buf, streams, 4));
  }
  g_f32_prefill_gflops = f32_prefill_gflops(prefill_shape);
  std::printf("cpu: %s\nkernels: %s\nstreaming read of %zu MiB at start (best of 1/2/4/8 streams): %.2f GB/s\n"
              "f32 prefill %s n=%lld: %.2f GFLOP/s (prefill baseline)\n\n",
              cpu_model().c_str(), std::string(isa_name(active_isa())).c_str(), g_cold_bytes >> 20, g_stream_gbps,
              shape_name(prefill_shape).c_str(), static_cast<long long>(kPrefillRows), g_f32_prefill_gflops);

  const double min_time = g_quick ? 0.1 : 0.3;
  // With --benchmark_repetitions=N, the "_best_rate" row's counters (GB/s, GFLOP/s and the ratios) are the best
  // repetition's, the same best-of rule as the baselines: on a shared machine, the run least disturbed by other
  // processes. (Its time column is the largest time; read the counters.)
  const auto best = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  for (WType t : kAllWTypes) {
    const std::string tn(wtype_name(t));
    for (Shape s : decode_shapes) {
      benchmark::RegisterBenchmark(("Decode/" + tn + "/" + shape_name(s)).c_str(), BM_Decode, t, s, 1)
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(min_time)
          ->ComputeStatistics("best_rate", best);
    }
  }
  for (WType t : kAllWTypes) {
    const std::string tn(wtype_name(t));
    for (std::int64_t n : {4, 8, 16}) {
      benchmark::RegisterBenchmark(("Batch/" + tn + "/" + shape_name(prefill_shape) + "/n:" + std::to_string(n)).c_str(),
                                   BM_Decode, t, prefill_shape, n)
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(min_time)
          ->ComputeStatistics("best_rate", best);
    }
  }
  for (WType t : kAllWTypes) {
    const std::string tn(wtype_name(t));
    benchmark::RegisterBenchmark(
        ("Prefill/" + tn + "/" + shape_name(prefill_shape) + "/n:" + std::to_string(kPrefillRows)).c_str(),
        BM_Prefill, t, prefill_shape)
        ->Unit(benchmark::kMillisecond)
        ->MinTime(min_time)
        ->ComputeStatistics("best_rate", best);
  }
  for (std::int64_t pos : {63, 255, 1023})
    benchmark::RegisterBenchmark(("Attention/f16/12x64/pos:" + std::to_string(pos)).c_str(), BM_Attention, 12, 64, pos)
        ->Unit(benchmark::kMicrosecond)
        ->MinTime(min_time)
        ->ComputeStatistics("best_rate", best);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
