// The Whisper model on accelerators (engine/whisper.h): the simulated one (the CPU's results, accounting of weights,
// KV pool and sessions, refusal, loss mid-encode) and CUDA (skips without a GPU); refused weights fail the load.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <span>
#include <thread>

#include "device/simulated.h"
#include "engine/whisper.h"
#include "engine_test_util.h"
#include "whisper_fixture.h"

namespace tandem::engine {
namespace {

using namespace whisper_test;

TEST(Whisper, SimulatedAcceleratorMatchesTheCpuAndAccounts) {
  const std::string dir = write_model("sim");
  auto cpu = load(dir);
  auto sim = test::simulated_device(1ull << 30);
  WhisperLoadOptions o;
  o.accelerator = sim;
  o.kv_block_size = 3;  // the decodes below cross blocks on the device
  auto acc = load(dir, o);
  ASSERT_TRUE(cpu && acc);
  EXPECT_EQ(acc->accelerator(), sim.get());
  const std::uint64_t wbytes = acc->stats().accel_weight_bytes, pool = acc->stats().accel_kv_bytes;
  const std::uint64_t cross = 4ull * 2 * 2 * 32 * 1500;  // one session's cross K/V, accounted by new_session
  EXPECT_GT(wbytes, 0U);
  // The pool (4 sessions of ceil(64 / 3) = 22 blocks) is accounted at load.
  EXPECT_EQ(pool, 4ull * 22 * 3 * 32 * 4 * 2 * 2);
  EXPECT_EQ(acc->kv_stats().bytes_total, pool);
  EXPECT_EQ(sim->accounted_bytes(), wbytes + pool);
  EXPECT_EQ(acc->fingerprint(), cpu->fingerprint());
  EXPECT_GT(acc->session_bytes(), cpu->session_bytes());  // + the matrix expansion workspace
  const auto mw = mel(cpu->config(), 6);
  {
    auto a = session(*acc), c = session(*cpu);
    ASSERT_TRUE(a && c);
    EXPECT_EQ(sim->accounted_bytes(), wbytes + pool + cross);
    EXPECT_EQ(acc->session_kv_bytes(), cross + 4ull * 2 * 2 * 32 * 66);  // + 22 blocks of 3 tokens
    ASSERT_TRUE(a->encode(mw, nullptr).ok());
    ASSERT_TRUE(c->encode(mw, nullptr).ok());
    EXPECT_EQ(sim->accounted_bytes(), wbytes + pool + cross);  // the encoder workspace is released
    auto la = a->decode(std::span(kTokens).subspan(0, 6), nullptr), lc = c->decode(std::span(kTokens).subspan(0, 6), nullptr);
    ASSERT_TRUE(la.ok() && lc.ok()) << (la.ok() ? "" : la.error().message);
    EXPECT_LT(rel_diff(*la, *lc), 1e-4);
    // Incremental on the device too.
    auto lb = a->decode(std::span(kTokens).subspan(6, 1), nullptr), ld = c->decode(std::span(kTokens).subspan(6, 1), nullptr);
    ASSERT_TRUE(lb.ok() && ld.ok());
    EXPECT_LT(rel_diff(*lb, *ld), 1e-4);
    // Several tokens after a prefix (the causal mask offset by fed()).
    auto le = a->decode(std::span(kTokens).subspan(7, 3), nullptr), lf = c->decode(std::span(kTokens).subspan(7, 3), nullptr);
    ASSERT_TRUE(le.ok() && lf.ok());
    EXPECT_LT(rel_diff(*le, *lf), 1e-4);
    a->rewind(7);
    auto lg = a->decode(std::span(kTokens).subspan(7, 1), nullptr);
    c->rewind(7);
    auto lh = c->decode(std::span(kTokens).subspan(7, 1), nullptr);
    ASSERT_TRUE(lg.ok() && lh.ok());
    EXPECT_LT(rel_diff(*lg, *lh), 1e-4);
    EXPECT_GT(rel_diff(*lg, *le), 1e-3);  // position 7's logits, not position 9's
    // A refused encoder workspace is out_of_memory.
    sim->fail_at_site(device::Site::prefill);
    auto refused = a->encode(mw, nullptr);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().code, Errc::out_of_memory);
  }
  EXPECT_EQ(sim->accounted_bytes(), wbytes + pool);  // sessions' buffers freed with them
  EXPECT_EQ(acc->kv_stats().used_blocks, 0);          // and their blocks back in the pool
  sim->fail_at_site(device::Site::kv_pool);
  auto no_kv = acc->new_session();
  ASSERT_FALSE(no_kv.ok());
  EXPECT_EQ(no_kv.error().code, Errc::out_of_memory);
  sim->fail_at_site(device::Site::kv_pool);  // a refused pool fails the load
  auto no_pool = WhisperModel::load(dir, o);
  ASSERT_FALSE(no_pool.ok());
  EXPECT_EQ(no_pool.error().code, Errc::out_of_memory);
  EXPECT_NE(no_pool.error().message.find("KV pool"), std::string::npos) << no_pool.error().message;
  EXPECT_EQ(sim->accounted_bytes(), wbytes + pool);  // the failed load's weights released

  // Device loss during an encode (whenever it lands) → device_lost, and every later call too.
  auto s = session(*acc);
  auto early = session(*acc);
  ASSERT_TRUE(early->encode(mw, nullptr).ok());
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    sim->lose();
  });
  auto lost = s->encode(mw, nullptr);
  killer.join();
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.error().code, Errc::device_lost) << lost.error().message;
  auto d = early->decode(kTokens, nullptr);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code, Errc::device_lost);
  auto ns = acc->new_session();
  ASSERT_FALSE(ns.ok());
  EXPECT_EQ(ns.error().code, Errc::device_lost);
}

#if defined(TANDEM_HAVE_CUDA)
// The encoder and the decoder (prefill, incremental, after a rewind) on the GPU against the CPU (skips without one).
TEST(Whisper, CudaAcceleratorMatchesTheCpu) {
  TANDEM_REQUIRE_GPU(dev);
  const std::string dir = write_model("cuda");
  auto cpu = load(dir);
  WhisperLoadOptions o;
  o.accelerator = dev;
  o.kv_block_size = 3;
  const std::uint64_t before = dev->accounted_bytes();
  auto acc = load(dir, o);
  ASSERT_TRUE(cpu && acc);
  EXPECT_EQ(dev->accounted_bytes() - before, acc->stats().accel_weight_bytes + acc->stats().accel_kv_bytes);
  const auto mw = mel(cpu->config(), 6);
  double worst = 0;
  {
    auto a = session(*acc), c = session(*cpu);
    ASSERT_TRUE(a && c);
    ASSERT_TRUE(a->encode(mw, nullptr).ok());
    ASSERT_TRUE(c->encode(mw, nullptr).ok());
    auto la = a->decode(std::span(kTokens).subspan(0, 6), nullptr), lc = c->decode(std::span(kTokens).subspan(0, 6), nullptr);
    ASSERT_TRUE(la.ok() && lc.ok()) << (la.ok() ? "" : la.error().message);
    worst = std::max(worst, rel_diff(*la, *lc));
    auto lb = a->decode(std::span(kTokens).subspan(6, 1), nullptr), ld = c->decode(std::span(kTokens).subspan(6, 1), nullptr);
    ASSERT_TRUE(lb.ok() && ld.ok());
    worst = std::max(worst, rel_diff(*lb, *ld));
    a->rewind(6);
    c->rewind(6);
    auto le = a->decode(std::span(kTokens).subspan(6, 3), nullptr), lf = c->decode(std::span(kTokens).subspan(6, 3), nullptr);
    ASSERT_TRUE(le.ok() && lf.ok());
    worst = std::max(worst, rel_diff(*le, *lf));
  }
  EXPECT_LT(worst, 1e-4);
  std::printf("[ report ] Whisper on %s vs CPU: max relative logit difference %.2e\n", dev->name().c_str(), worst);
  acc.reset();
  EXPECT_EQ(dev->accounted_bytes(), before);
}
#endif

TEST(Whisper, RefusedWeightsFailTheLoad) {
  test::expect_weights_refused<WhisperModel, WhisperLoadOptions>(write_model("small-dev"));
}

}  // namespace
}  // namespace tandem::engine
