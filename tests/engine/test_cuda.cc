// The engine on a real CUDA device (docs/cuda.md, "The engine's CUDA path"): the ATen dequantization equals the CPU
// kernels bit for bit on the GPU; a model on the GPU computes what the same ATen code computes on the CPU (the
// simulated accelerator) and stays as close to the CPU kernels as that code does, for every weight type, for the
// three compute dtypes and in the hybrid split; the device's readings follow LibTorch's caching allocator and show
// a dropped replica's bytes free again (what eviction relies on); the peak memory of a forward stays within what
// admission reserved for it; admission refuses what the device does not have, with a typed error.
//
// Every test skips where there is no GPU (CudaDevice::open fails) or where LibTorch has no CUDA (Debian's CPU
// LibTorch): it runs on the GPU machine (tests/gpu/run.sh), and is built wherever the CUDA runtime is found.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#if defined(TANDEM_HAVE_TORCH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "device/cuda.h"
#include "engine_test_util.h"
#include "device/simulated.h"
#include "engine/dequant.h"
#include "kernels/quant.h"
#include "model_fixture.h"
#include "modelgen/gguf_convert.h"

namespace tandem {
namespace {

using kernels::WType;
using testing::greedy;
using testing::load;
using testing::make_model;
using testing::max_abs_diff;

constexpr std::uint64_t kMiB = 1ull << 20;

std::shared_ptr<device::SimulatedDevice> sim(std::uint64_t bytes = 2ull << 30) {
  device::SimulatedConfig sc;
  sc.capacity_bytes = bytes;
  return std::make_shared<device::SimulatedDevice>(sc, std::make_shared<SteadyClock>());
}

// A small random model whose matrices all have a multiple of 256 columns (the K-quants' block; the "tiny" preset's
// 128 would make llama.cpp's recipes fall back to q5_0/q5_1), written once.
std::string quantizable_model() {
  static const std::string dir = [] {
    modelgen::Options o;
    o.shape = *modelgen::preset("tiny");
    o.shape.hidden = 256;
    o.shape.intermediate = 512;
    o.shape.layers = 3;
    o.shape.heads = 4;
    o.shape.kv_heads = 2;
    o.seed = 11;
    o.tokenizer_model = testing::tokenizer_path();
    const std::string d = testing::temp_root() + "/cuda-src";
    auto s = modelgen::write_model(d, o);
    EXPECT_TRUE(s.ok()) << s.error().message;
    return d;
  }();
  return dir;
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

TEST(CudaEngine, DequantizationEqualsTheKernelsBitForBitForEveryType) {
  TANDEM_REQUIRE_GPU(dev);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::int64_t rows = 7, cols = 512;
  const at::Device cuda(at::kCUDA, 0);
  for (WType t : kernels::kAllWTypes) {
    std::vector<float> x(static_cast<std::size_t>(rows * cols));
    for (auto& v : x) v = nd(rng) * (t == WType::q4_0 ? 3.0f : 0.5f);
    x[3] = 0;
    x[9] = 40.0f;
    const std::size_t rb = kernels::row_bytes(t, cols);
    std::vector<std::byte> blocks(rb * rows);
    for (std::int64_t r = 0; r < rows; ++r) kernels::quantize_row(t, x.data() + r * cols, blocks.data() + r * rb, cols);
    std::vector<float> ref(x.size());
    for (std::int64_t r = 0; r < rows; ++r) kernels::dequantize_row(t, blocks.data() + r * rb, ref.data() + r * cols, cols);
    at::Tensor stored;
    if (t == WType::f32 || t == WType::f16 || t == WType::bf16) {
      const auto st = t == WType::f32 ? at::kFloat : t == WType::f16 ? at::kHalf : at::kBFloat16;
      stored = at::from_blob(blocks.data(), {rows, cols}, at::TensorOptions().dtype(st)).to(cuda);
    } else {
      stored = at::from_blob(blocks.data(), {rows, static_cast<std::int64_t>(rb)}, at::TensorOptions().dtype(at::kByte))
                   .to(cuda);
    }
    const at::Tensor y = engine::dequantize_aten(stored, t, cols, at::kFloat);
    ASSERT_TRUE(y.is_cuda()) << kernels::wtype_name(t);
    const at::Tensor host = y.to(at::kCPU).contiguous();
    ASSERT_EQ(host.numel(), rows * cols) << kernels::wtype_name(t);
    std::vector<float> got(host.data_ptr<float>(), host.data_ptr<float>() + host.numel());
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0)
        << kernels::wtype_name(t) << ": dequantized on the GPU differs from kernels::dequantize_row, max |diff| "
        << max_abs_diff(got, ref);
  }
}

// One model in every weight type: the GPU replica against the same code on the simulated accelerator (ATen on the
// CPU) and against the CPU kernels. Reports the prefill logits' differences and the greedy agreement.
TEST(CudaEngine, EveryWeightTypeAgreesWithTheSimulatedAcceleratorAndTheCpu) {
  TANDEM_REQUIRE_GPU(dev);
  const std::string hf = quantizable_model();
  const std::vector<std::vector<int>> prompts = {{1, 15043, 3186, 29892, 2748, 2501, 263, 931},
                                                 {1, 9038, 2501, 263, 931, 727, 471},
                                                 {1, 450, 4996, 17354, 1701, 29916, 432, 17204, 975, 278}};
  for (const char* name : {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K"}) {
    const std::string path = testing::temp_root() + "/cuda-" + name + ".gguf";
    auto r = modelgen::parse_recipe(name);
    ASSERT_TRUE(r.ok());
    auto st = modelgen::convert_to_gguf(hf, path, *r, 2);
    ASSERT_TRUE(st.ok()) << name << ": " << st.error().message;
    engine::LoadOptions lo;
    lo.max_context = 128;
    auto cpu = load(path, lo);
    lo.accelerator = sim();
    auto simulated = load(path, lo);
    lo.accelerator = dev;
    auto g = load(path, lo);
    ASSERT_TRUE(cpu && simulated && g) << name;
    EXPECT_EQ(g->fingerprint().digest, cpu->fingerprint().digest) << name;
    EXPECT_GT(g->load_stats().accel_weight_bytes, 0u) << name;
    float worst_sim = 0, worst_cpu = 0, worst_ref = 0, scale = 0;
    int agree = 0, total = 0;
    for (const auto& ids : prompts) {
      std::vector<float> lc, ls, lg;
      const auto a = greedy(*cpu, ids, 16, &lc), b = greedy(*simulated, ids, 16, &ls), c = greedy(*g, ids, 16, &lg);
      ASSERT_FALSE(a.empty() || b.empty() || c.empty()) << name;
      scale = std::max(scale, max_abs(lc));
      worst_sim = std::max(worst_sim, max_abs_diff(lg, ls));
      worst_cpu = std::max(worst_cpu, max_abs_diff(lg, lc));
      worst_ref = std::max(worst_ref, max_abs_diff(ls, lc));
      for (std::size_t i = 0; i < a.size() && i < c.size() && a[i] == c[i]; ++i) ++agree;
      total += 16;
    }
    // The same ATen operations on two processors: only summation order differs (fp32 cuBLAS, no TF32).
    EXPECT_LT(worst_sim, 1e-3f * std::max(1.0f, scale)) << name;
    // As close to the CPU kernels as the simulated accelerator is (+ that summation-order slack).
    EXPECT_LE(worst_cpu, worst_ref + 1e-3f * std::max(1.0f, scale)) << name;
    std::printf("[ report ] %-6s GPU vs simulated max|dlogit| %.2e, GPU vs CPU %.2e (simulated vs CPU %.2e; logits "
                "up to %.2f), greedy prefix agreement GPU vs CPU %d / %d\n",
                name, worst_sim, worst_cpu, worst_ref, scale, agree, total);
  }
}

// The compute dtypes (bf16, and f16, which only CUDA offers) and the hybrid split on the GPU.
TEST(CudaEngine, ComputeDtypesAndTheHybridSplitRunOnTheGpu) {
  TANDEM_REQUIRE_GPU(dev);
  const std::string hf = quantizable_model();
  const std::string path = testing::temp_root() + "/cuda-dtypes-Q4_K_M.gguf";
  auto r = modelgen::parse_recipe("Q4_K_M");
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(modelgen::convert_to_gguf(hf, path, *r, 2).ok());
  const std::vector<int> ids = {1, 15043, 3186, 29892, 2748, 2501, 263, 931};
  engine::LoadOptions lo;
  lo.max_context = 128;
  lo.accelerator = dev;
  auto f32 = load(path, lo);
  ASSERT_TRUE(f32);
  std::vector<float> l32;
  (void)greedy(*f32, ids, 4, &l32);
  const float scale = std::max(1.0f, max_abs(l32));
  for (auto dt : {engine::ComputeDType::bf16, engine::ComputeDType::f16}) {
    lo.dtype = dt;
    auto m = load(path, lo);
    ASSERT_TRUE(m) << static_cast<int>(dt);
    std::vector<float> l;
    const auto g = greedy(*m, ids, 8, &l);
    ASSERT_EQ(g.size(), 8u);
    const float d = max_abs_diff(l, l32);
    // Half-precision activations: about 3 significant digits per operation.
    EXPECT_LT(d, 0.1f * scale) << static_cast<int>(dt);
    for (float x : l) ASSERT_TRUE(std::isfinite(x)) << static_cast<int>(dt);
    std::printf("[ report ] %s activations on the GPU: max|dlogit| vs f32 %.3e (logits up to %.2f)\n",
                dt == engine::ComputeDType::bf16 ? "bf16" : "f16", d, scale);
  }
  lo.dtype = engine::ComputeDType::auto_;
  for (int k : {1, 2}) {
    lo.accel_layers = k;
    auto m = load(path, lo);
    ASSERT_TRUE(m) << k;
    std::vector<float> l;
    (void)greedy(*m, ids, 4, &l);
    EXPECT_LT(max_abs_diff(l, l32), 0.05f * scale) << "hybrid split at layer " << k;
  }
}

// The readings see LibTorch's caching allocator, and a replica dropped with its cached blocks released shows its
// bytes free again in cudaMemGetInfo — what Backend::evict_gpu promises (docs/residency.md).
TEST(CudaEngine, ReadingsFollowTheReplicaAndShowItGivenBack) {
  TANDEM_REQUIRE_GPU(dev);
  const std::string dir = make_model("cuda-readings", "134m");
  engine::LoadOptions lo;
  lo.max_context = 512;
  lo.accelerator = dev;
  const std::vector<int> ids = {1, 15043, 3186, 29892, 2748, 2501, 263, 931};
  // A first cycle creates what stays for the process (cuBLAS handles and their workspaces).
  {
    auto warm = load(dir, lo);
    ASSERT_TRUE(warm);
    (void)greedy(*warm, ids, 4);
  }
  dev->release_cached();
  auto before = dev->memory();
  ASSERT_TRUE(before.ok());
  auto m = load(dir, lo);
  ASSERT_TRUE(m);
  (void)greedy(*m, ids, 4);
  auto during = dev->memory();
  ASSERT_TRUE(during.ok());
  const std::uint64_t held = m->load_stats().accel_weight_bytes + m->load_stats().accel_kv_bytes;
  EXPECT_GE(during->allocated_bytes, held) << "the allocator hook reports the replica's tensors";
  EXPECT_GE(during->reserved_bytes, during->allocated_bytes);
  EXPECT_GE(before->free_bytes - during->free_bytes, held) << "cudaMemGetInfo shows the replica";
  EXPECT_EQ(dev->accounted_bytes(), held) << "accounting: weights + KV pool, the forward's workspace returned";
  const auto t0 = std::chrono::steady_clock::now();
  m.reset();
  dev->release_cached();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  auto after = dev->memory();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(dev->accounted_bytes(), 0u);
  const double dropped = static_cast<double>(before->free_bytes) - static_cast<double>(during->free_bytes);
  const double back = static_cast<double>(after->free_bytes) - static_cast<double>(during->free_bytes);
  // Everything the load took comes back (within 2 MiB: the driver's page granularity).
  EXPECT_GE(back, dropped - 2.0 * kMiB);
  std::printf("[ report ] 134m replica: %.1f MiB accounted, free reading dropped %.1f MiB, %.1f MiB back in %.2f ms "
              "(reserved %.1f / allocated %.1f MiB while loaded; %.1f / %.1f after)\n",
              static_cast<double>(held) / kMiB, dropped / kMiB, back / kMiB, ms,
              static_cast<double>(during->reserved_bytes) / kMiB, static_cast<double>(during->allocated_bytes) / kMiB,
              static_cast<double>(after->reserved_bytes) / kMiB, static_cast<double>(after->allocated_bytes) / kMiB);
}

#if defined(TANDEM_HAVE_TORCH_CUDA)
// Admission reserves Model::workspace_bytes (which includes one matrix's dequantization workspace) for a forward:
// the caching allocator's peak during the forward must stay within it, or admission under-reserves.
TEST(CudaEngine, ForwardPeakStaysWithinTheAdmittedWorkspace) {
  TANDEM_REQUIRE_GPU(dev);
  const std::string hf = quantizable_model();
  for (const char* name : {"F32", "Q8_0", "Q4_K_M", "Q6_K"}) {
    const std::string path = testing::temp_root() + "/cuda-ws-" + name + ".gguf";
    auto r = modelgen::parse_recipe(name);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(modelgen::convert_to_gguf(hf, path, *r, 2).ok());
    engine::LoadOptions lo;
    lo.max_context = 256;
    lo.accelerator = dev;
    auto m = load(path, lo);
    ASSERT_TRUE(m);
    for (std::int64_t n : {1, 7, 64, 200}) {
      std::vector<int> ids(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = static_cast<int>(1 + (i * 37) % 3000);
      auto seq = m->new_sequence();
      ASSERT_TRUE(seq.ok());
      c10::cuda::CUDACachingAllocator::emptyCache();
      constexpr std::size_t agg = 0;  // StatType::AGGREGATE
      const auto base = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[agg].current;
      c10::cuda::CUDACachingAllocator::resetPeakStats(0);
      auto out = m->forward(**seq, ids);
      ASSERT_TRUE(out.ok()) << out.error().message;
      const auto peak = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[agg].peak;
      const std::uint64_t used = static_cast<std::uint64_t>(peak - base);
      const std::uint64_t admitted = m->workspace_bytes(n, n);  // includes the dequantization workspace
      EXPECT_LE(used, admitted) << name << " n=" << n;
      std::printf("[ report ] %-6s forward of %3lld tokens: allocator peak above the replica %.2f MiB, admitted %.2f "
                  "MiB (of which dequantization %.2f)\n",
                  name, static_cast<long long>(n), static_cast<double>(used) / kMiB,
                  static_cast<double>(admitted) / kMiB, static_cast<double>(m->dequant_workspace_bytes(4)) / kMiB);
    }
  }
}
#endif

// With the device's memory taken (here by our own tensor, which the readings count as allocated), a load that
// does not fit is refused by admission as out_of_memory before any allocation, and nothing stays accounted.
TEST(CudaEngine, AdmissionRefusesWhatTheDeviceDoesNotHave) {
  TANDEM_REQUIRE_GPU(dev);
  const std::string dir = make_model("cuda-readings", "134m");
  auto m0 = dev->memory();
  ASSERT_TRUE(m0.ok());
  const std::uint64_t keep_free = 128 * kMiB;  // less than the 134m model's weights (~500 MiB)
  ASSERT_GT(m0->free_bytes, keep_free + (1ull << 30));
  const std::int64_t take = static_cast<std::int64_t>(m0->free_bytes - keep_free - (256 * kMiB));
  at::Tensor ballast = at::empty({take}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, 0));
  engine::LoadOptions lo;
  lo.max_context = 512;
  lo.accelerator = dev;
  const std::uint64_t accounted = dev->accounted_bytes();
  auto m = engine::Model::load(dir, lo);
  ASSERT_FALSE(m.ok()) << "a 134m f32 replica fit in about 384 MiB?";
  EXPECT_EQ(m.error().code, Errc::out_of_memory) << m.error().message;
  std::printf("[ report ] refused: %s\n", m.error().message.c_str());
  EXPECT_EQ(dev->accounted_bytes(), accounted);
  ballast = at::Tensor();
  dev->release_cached();
  auto ok = engine::Model::load(dir, lo);
  EXPECT_TRUE(ok.ok()) << (ok.ok() ? "" : ok.error().message);
}

}  // namespace
}  // namespace tandem
