// The engine's CPU matrix products (engine/weight.h): cpu_linears, several weights in one pass of the worker pool,
// gives each weight's cpu_linear result bit for bit, whatever the pool size, the weights' types and row counts.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/weight.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

namespace tandem::engine {
namespace {

using kernels::WType;

// A weight of `rows` x `cols` random values stored as `t` (the bytes kept in `store`), made as the engine makes
// one from a file's tensor (its side table included).
Weight random_weight(WType t, std::int64_t rows, std::int64_t cols, std::uint32_t seed, std::vector<std::byte>& store) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 0.5f);
  const std::size_t rb = kernels::row_bytes(t, cols);
  store.assign(rb * static_cast<std::size_t>(rows) + 64, std::byte{0});
  std::byte* base = store.data() + (64 - reinterpret_cast<std::uintptr_t>(store.data()) % 64) % 64;
  std::vector<float> row(static_cast<std::size_t>(cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = dist(rng);
    kernels::quantize_row(t, row.data(), base + static_cast<std::size_t>(r) * rb, cols);
  }
  weights::TensorView tv;
  tv.name = "w";
  tv.shape = {rows, cols};
  tv.type = t;
  tv.data = std::span<const std::byte>(base, rb * static_cast<std::size_t>(rows));
  std::uint64_t copied = 0;
  return make_weight(tv, ComputeDType::auto_, copied);
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && std::memcmp(a.data_ptr<float>(), b.data_ptr<float>(), a.numel() * sizeof(float)) == 0;
}

struct Case {
  const char* name;
  std::vector<WType> types;
  std::vector<std::int64_t> rows;
  std::int64_t cols;
};

TEST(CpuLinears, EachWeightsResultIsCpuLinearsBitForBit) {
  const std::vector<Case> cases = {
      {"q4_K q4_K q6_K (a Q4_K_M layer's q, k, v)", {WType::q4_K, WType::q4_K, WType::q6_K}, {96, 40, 40}, 512},
      {"q8_0 gate and up", {WType::q8_0, WType::q8_0}, {150, 150}, 256},
      {"f32 and f16, odd rows", {WType::f32, WType::f16, WType::f32}, {33, 70, 17}, 96},
      {"q4_0 q5_1 iq4_nl", {WType::q4_0, WType::q5_1, WType::iq4_nl}, {64, 48, 130}, 320},
      {"one small weight (on the caller)", {WType::q8_0}, {20}, 64},
  };
  for (const Case& c : cases) {
    std::vector<std::vector<std::byte>> stores(c.types.size());
    std::vector<Weight> ws;
    for (std::size_t i = 0; i < c.types.size(); ++i)
      ws.push_back(random_weight(c.types[i], c.rows[i], c.cols, 17 + static_cast<std::uint32_t>(i), stores[i]));
    for (std::int64_t n : {1, 3, 20}) {
      const at::Tensor x = at::randn({n, c.cols}, at::TensorOptions().dtype(at::kFloat));
      std::vector<at::Tensor> alone;  // one thread, one weight at a time
      {
        WorkerPool one(1);
        std::vector<std::byte> buf;
        for (const Weight& w : ws) alone.push_back(cpu_linear(x, w, one, buf));
      }
      for (int threads : {1, 2, 3}) {
        WorkerPool pool(threads);
        std::vector<std::byte> buf;
        std::vector<at::Tensor> together;
        if (ws.size() == 3) together = cpu_linears(x, {&ws[0], &ws[1], &ws[2]}, pool, buf);
        else if (ws.size() == 2) together = cpu_linears(x, {&ws[0], &ws[1]}, pool, buf);
        else together = cpu_linears(x, {&ws[0]}, pool, buf);
        ASSERT_EQ(together.size(), ws.size());
        for (std::size_t i = 0; i < ws.size(); ++i) {
          EXPECT_TRUE(same_bits(together[i], alone[i]))
              << c.name << ": weight " << i << ", " << n << " rows, " << threads << " threads";
          EXPECT_TRUE(same_bits(cpu_linear(x, ws[i], pool, buf), alone[i]))
              << c.name << ": cpu_linear, weight " << i << ", " << n << " rows, " << threads << " threads";
        }
      }
    }
  }
}

// The activations of a weight are prepared where its tiles want them: an f32 weight reads x in place when x lies on
// the weight's phase, a prepared copy otherwise; both give the same floats.
TEST(CpuLinears, F32InPlaceAndPreparedAgree) {
  std::vector<std::byte> s0, s1;
  const std::vector<Weight> ws = {random_weight(WType::f32, 80, 128, 3, s0), random_weight(WType::q8_0, 80, 128, 4, s1)};
  const at::Tensor big = at::randn({4, 129}, at::TensorOptions().dtype(at::kFloat));
  WorkerPool pool(2);
  std::vector<std::byte> buf;
  const at::Tensor aligned = big.narrow(1, 0, 128).contiguous();
  const at::Tensor shifted = at::empty({4 * 128 + 1}, at::TensorOptions().dtype(at::kFloat)).narrow(0, 1, 4 * 128).view({4, 128});
  shifted.copy_(aligned);
  const auto a = cpu_linears(aligned, {&ws[0], &ws[1]}, pool, buf);
  const auto b = cpu_linears(shifted, {&ws[0], &ws[1]}, pool, buf);
  EXPECT_TRUE(same_bits(a[0], b[0]));
  EXPECT_TRUE(same_bits(a[1], b[1]));
}

}  // namespace
}  // namespace tandem::engine
