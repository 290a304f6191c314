// The engine on the simulated accelerator: capacity, foreign load, injected faults, device loss, hybrid splits,
// checkpoint migration to the CPU, replica modes, and the copies to the simulated device's memory.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include <ATen/ATen.h>

#include "device/host_pages.h"
#include "device/simulated.h"
#include "engine/generation.h"
#include "engine/replica.h"
#include "engine/upload.h"
#include "model_fixture.h"

using namespace tandem;
using namespace tandem::testing;

namespace {

std::shared_ptr<device::SimulatedDevice> sim(std::uint64_t capacity = 1ull << 30,
                                             std::shared_ptr<const Clock> clock = std::make_shared<SteadyClock>()) {
  device::SimulatedConfig c;
  c.capacity_bytes = capacity;
  return std::make_shared<device::SimulatedDevice>(c, std::move(clock));
}

engine::LoadOptions on(std::shared_ptr<device::Device> d, int layers = -1,
                       engine::ComputeDType dt = engine::ComputeDType::f32) {
  engine::LoadOptions lo;
  lo.accelerator = std::move(d);
  lo.accel_layers = layers;
  lo.dtype = dt;
  lo.max_context = 256;
  return lo;
}

engine::GenerateRequest greedy(const engine::Model& m, int n = 16) {
  engine::GenerateRequest req;
  req.prompt = m.encode_text("The GPU ran out of memory while");
  req.max_new_tokens = n;
  req.stop_at_eos = false;
  return req;
}

engine::GenerateRequest sampled(const engine::Model& m, int n = 16) {
  auto req = greedy(m, n);
  req.sampling.temperature = 0.8;
  req.sampling.top_k = 40;
  req.sampling.seed = 77;
  return req;
}

std::vector<engine::TokenId> tokens_of(std::shared_ptr<engine::Model> m, engine::GenerateRequest req) {
  auto g = engine::generate(std::move(m), std::move(req));
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message);
  return g.ok() ? (*g)->tokens() : std::vector<engine::TokenId>{};
}

}  // namespace

TEST(SimulatedEngine, LoadPastCapacityFailsTypedAndLeavesNothingAccounted) {
  const std::string dir = make_model("f32");
  auto d = sim(4ull << 20);  // 4 MiB: the test model's weights are ~17 MiB
  auto r = engine::Model::load(dir, on(d));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::out_of_memory);
  EXPECT_NE(r.error().message.find("sim0"), std::string::npos) << r.error().message;
  EXPECT_EQ(d->accounted_bytes(), 0u);
  // The same load fits once the device is big enough; a foreign load then makes it fail again.
  auto big = sim(64ull << 20);
  auto m = load(dir, on(big));
  ASSERT_TRUE(m);
  const auto used = big->accounted_bytes();
  EXPECT_EQ(used, m->load_stats().accel_weight_bytes + m->load_stats().accel_kv_bytes);
  auto before = *big->memory();
  big->set_foreign_bytes(10ull << 20);
  auto after = *big->memory();
  EXPECT_EQ(before.free_bytes - after.free_bytes, 10ull << 20);
  big->set_foreign_bytes(64ull << 20);
  EXPECT_EQ(engine::Model::load(dir, on(big)).error().code, Errc::out_of_memory);
  EXPECT_EQ(big->accounted_bytes(), used);  // the failed second load released its partial allocations
}

TEST(SimulatedEngine, EveryHybridSplitMatchesTheCpu) {
  const std::string dir = make_model("f32");
  auto cpu = load(dir);
  const std::vector<engine::TokenId> toks{1, 450, 4996, 17354, 1701, 29916, 432, 17204, 975, 278};
  auto ref = cpu->forward_reference(toks);
  const int L = cpu->config().num_layers;
  for (int k = 0; k <= L; ++k) {
    auto d = sim(256ull << 20);
    auto m = load(dir, on(d, k));
    ASSERT_TRUE(m) << k;
    EXPECT_EQ(m->accel_layers(), k);
    auto seq = m->new_sequence();
    auto pre = m->forward(**seq, std::span(toks).first(6), true);
    ASSERT_TRUE(pre.ok()) << pre.error().message;
    EXPECT_LT(max_abs_diff(*pre, *ref, 0, 0, pre->size()), 1e-5) << "split k=" << k;
    const std::size_t V = static_cast<std::size_t>(m->config().vocab_size);
    for (std::size_t t = 6; t < toks.size(); ++t) {
      auto l = m->forward(**seq, std::span(toks).subspan(t, 1));
      ASSERT_TRUE(l.ok());
      EXPECT_LT(max_abs_diff(*l, *ref, 0, t * V, V), 1e-5) << "split k=" << k << " decode " << t;
    }
    EXPECT_EQ(m->load_stats().accel_kv_bytes, m->load_stats().kv_pool_bytes * static_cast<std::uint64_t>(k) /
                                                    static_cast<std::uint64_t>(L));
    EXPECT_EQ(m->fingerprint().digest, cpu->fingerprint().digest) << "placement is not part of the fingerprint";
  }
}

TEST(SimulatedEngine, InjectedAllocationFailuresAtEachSiteAreTypedAndTheEngineStaysUsable) {
  const std::string dir = make_model("f32");
  auto d = sim(256ull << 20);
  auto m = load(dir, on(d));
  const auto baseline = d->accounted_bytes();
  const auto want = tokens_of(m, greedy(*m));

  d->fail_at_site(device::Site::prefill);
  auto g = engine::generate(m, greedy(*m));
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().code, Errc::out_of_memory);
  EXPECT_NE(g.error().message.find("prefill"), std::string::npos);
  EXPECT_EQ(d->accounted_bytes(), baseline);
  EXPECT_EQ(m->kv_stats().used_blocks, 0);

  d->fail_at_site(device::Site::decode);
  auto gen = engine::Generation::create(m, greedy(*m));
  ASSERT_TRUE(gen.ok());
  ASSERT_TRUE((*gen)->prefill().ok());
  auto first = (*gen)->step();  // samples from the prefill logits, then the decode forward fails
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.error().code, Errc::out_of_memory);
  EXPECT_EQ((*gen)->finish_reason(), engine::FinishReason::error);
  EXPECT_EQ((*gen)->tokens().size(), 1u) << "the token sampled before the failure is a checkpoint";
  EXPECT_EQ(d->accounted_bytes(), baseline);
  EXPECT_EQ(m->kv_stats().used_blocks, 0);

  EXPECT_EQ(tokens_of(m, greedy(*m)), want) << "usable after the faults";
  // Workspace past capacity (a foreign load leaves too little) is the same typed error.
  d->set_foreign_bytes(d->capacity() - baseline - 1024);
  EXPECT_EQ(engine::generate(m, greedy(*m)).error().code, Errc::out_of_memory);
  d->set_foreign_bytes(0);
  EXPECT_EQ(tokens_of(m, greedy(*m)), want);
}

TEST(SimulatedEngine, DeviceLostMidGenerationFailsCleanlyAndTheCpuReplicaContinues) {
  const std::string dir = make_model("f32");
  auto d = sim(256ull << 20);
  auto gpu = load(dir, on(d));
  auto cpu = load(dir);
  const auto uninterrupted = tokens_of(cpu, sampled(*cpu, 20));

  auto g = engine::Generation::create(gpu, sampled(*gpu, 20));
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE((*g)->prefill().ok());
  for (int i = 0; i < 7; ++i) ASSERT_TRUE((*g)->step().ok());
  d->lose();
  auto ev = (*g)->step();
  ASSERT_FALSE(ev.ok());
  EXPECT_EQ(ev.error().code, Errc::device_lost);
  EXPECT_EQ(d->accounted_bytes(), 0u) << "a driver reset frees everything";
  EXPECT_TRUE(gpu->device_lost());
  EXPECT_EQ(gpu->kv_stats().used_blocks, 0);

  // Failover at the token checkpoint: the CPU re-prefills prompt + delivered tokens and continues identically.
  auto resume = sampled(*cpu, 20);
  resume.resume_tokens = (*g)->tokens();
  EXPECT_EQ(resume.resume_tokens.size(), 8u);
  EXPECT_EQ(tokens_of(cpu, resume), uninterrupted);

  // The lost replica stays dead even after the driver is back; a new one loads.
  d->recover();
  EXPECT_TRUE(gpu->device_lost());
  EXPECT_EQ(engine::generate(gpu, greedy(*gpu)).error().code, Errc::device_lost);
  gpu.reset();  // releasing void allocations must not disturb the new accounting
  auto fresh = load(dir, on(d));
  ASSERT_TRUE(fresh);
  EXPECT_EQ(d->accounted_bytes(), fresh->load_stats().accel_weight_bytes + fresh->load_stats().accel_kv_bytes);
  EXPECT_EQ(tokens_of(fresh, sampled(*fresh, 20)), uninterrupted);
  EXPECT_EQ(d->counters().losses, 1u);
}

TEST(SimulatedEngine, CheckpointMigrationFromSimulatedF32ToCpuIsExact) {
  const std::string dir = make_model("f32");
  auto cpu = load(dir);
  auto d = sim(256ull << 20);
  auto gpu = load(dir, on(d, 1));  // hybrid: 1 layer on the device
  const auto want = tokens_of(cpu, sampled(*cpu, 24));
  for (int n : {1, 9, 23}) {
    auto part = sampled(*gpu, n);
    const auto head = tokens_of(gpu, part);
    ASSERT_EQ(head.size(), static_cast<std::size_t>(n));
    auto rest = sampled(*cpu, 24);
    rest.resume_tokens = head;
    EXPECT_EQ(tokens_of(cpu, rest), want) << "migrated after " << n << " tokens";
  }
}

TEST(SimulatedEngine, Bf16AcceleratorTokenEquivalenceIsReported) {
  // Real GPUs compute in bf16; equality with the f32 CPU path is measured, not assumed.
  const std::string dir = make_model("f32");
  auto cpu = load(dir);
  auto d = sim(256ull << 20);
  auto gpu = load(dir, on(d, -1, engine::ComputeDType::bf16));
  EXPECT_EQ(gpu->fingerprint().diff(cpu->fingerprint()), (std::vector<std::string>{"weights_types", "accel_activations"}));
  int same = 0, total = 0, first_divergence_sum = 0, runs = 0;
  for (const char* prompt : {"The GPU ran out of memory while", "Once upon a time", "Free software is", "Hello"}) {
    auto a = greedy(*cpu, 24), b = greedy(*gpu, 24);
    a.prompt = b.prompt = cpu->encode_text(prompt);
    const auto ta = tokens_of(cpu, a), tb = tokens_of(gpu, b);
    ASSERT_EQ(ta.size(), tb.size());
    std::size_t first = ta.size();
    for (std::size_t i = 0; i < ta.size(); ++i) {
      same += ta[i] == tb[i];
      if (ta[i] != tb[i] && first == ta.size()) first = i;
    }
    total += static_cast<int>(ta.size());
    first_divergence_sum += static_cast<int>(first);
    ++runs;
  }
  std::printf("[ REPORT ] bf16 simulated vs f32 CPU, greedy, 4 prompts x 24 tokens: %d/%d positions equal (%.0f%%), "
              "mean first divergence at token %.1f\n",
              same, total, 100.0 * same / total, static_cast<double>(first_divergence_sum) / runs);
  RecordProperty("bf16_token_equivalence_percent", std::to_string(100 * same / total));
  EXPECT_GT(total, 0);
}

TEST(SimulatedEngine, LaggedReadingsDifferFromTheLedgerAsConfigured) {
  auto clock = std::make_shared<ManualClock>();
  device::SimulatedConfig c;
  c.capacity_bytes = 1000;
  c.reading_lag = std::chrono::seconds(2);
  auto d = std::make_shared<device::SimulatedDevice>(c, clock);
  auto a = d->allocate(300, device::Site::kv_pool);
  ASSERT_TRUE(a.ok());
  struct Step {
    int advance_ms;
    std::uint64_t foreign;
    std::uint64_t want_free;
  };
  // t=0: +300 ours → reading still 1000 (2 s lag); t=1: foreign 200; t=2: 700; t=3: 500.
  const std::vector<Step> steps{{0, 0, 1000}, {1000, 200, 1000}, {1000, 200, 700}, {1000, 200, 500}, {5000, 200, 500}};
  for (const auto& s : steps) {
    clock->advance(std::chrono::milliseconds(s.advance_ms));
    if (s.foreign != d->foreign_bytes()) d->set_foreign_bytes(s.foreign);
    auto m = d->memory();
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->free_bytes, s.want_free);
    EXPECT_EQ(m->allocated_bytes, 300u) << "our own allocator statistics do not lag";
  }
}

TEST(SimulatedEngine, ReplicaModesMeasureAndShareTheFingerprint) {
  const std::string dir = make_model("f32");
  engine::LoadOptions lo;
  lo.max_context = 128;
  auto warm = engine::Replica::create(dir, lo, policy::ReplicaMode::warm);
  auto mapped = engine::Replica::create(dir, lo, policy::ReplicaMode::mmap);
  auto lazy = engine::Replica::create(dir, lo, policy::ReplicaMode::on_demand);
  ASSERT_TRUE(warm.ok() && mapped.ok() && lazy.ok());
  EXPECT_TRUE((*warm)->loaded());
  EXPECT_TRUE((*mapped)->loaded());
  EXPECT_FALSE((*lazy)->loaded());
  for (auto* r : {warm->get(), mapped->get(), lazy->get()}) {
    const auto t = r->times();
    EXPECT_GE(t.load_ms, 0);
    EXPECT_GE(t.page_in_ms, 0);
    EXPECT_GE(t.warm_up_ms, 0);
    const auto m = r->measurements(1ull << 30);
    EXPECT_TRUE(m.load_time && m.page_in_time && m.warm_up_time);
    EXPECT_GT(m.model_bytes, 0u);
  }
  // The accelerator replica and every CPU replica mode report the same fingerprint.
  auto d = sim(256ull << 20);
  auto gpu = load(dir, on(d));
  EXPECT_EQ((*warm)->fingerprint().digest, gpu->fingerprint().digest);
  EXPECT_EQ((*lazy)->fingerprint().digest, gpu->fingerprint().digest);
  auto m = (*lazy)->get();
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE((*lazy)->loaded());
  EXPECT_EQ(tokens_of(*m, greedy(**m)), tokens_of(gpu, greedy(*gpu)));
  ASSERT_TRUE((*lazy)->set_mode(policy::ReplicaMode::on_demand).ok());
  EXPECT_FALSE((*lazy)->loaded());
  ASSERT_TRUE((*mapped)->set_mode(policy::ReplicaMode::warm).ok());
  EXPECT_EQ((*mapped)->mode(), policy::ReplicaMode::warm);
  // The policy core decides from these measurements.
  policy::ReplicaModePolicy pol;
  const auto decision = pol.decide((*warm)->measurements(1ull << 30));
  EXPECT_FALSE(decision.reason.empty());
}

// A GPU replica restored beside the CPU one (docs/residency.md, "Restoring fast"): it shares the CPU replica's
// opened files (the same ModelDir, no second mapping), has load()'s fingerprint and placement, gives the same greedy
// tokens as a replica loaded from the files, and keeps the mapping alive when the CPU replica goes first.
TEST(SimulatedEngine, ReplicaBesideTheCpuOneSharesItsFilesAndMatchesALoadFromThem) {
  const std::string dir = make_model("f32");
  engine::LoadOptions cpu_opts;
  cpu_opts.max_context = 256;
  auto loaded = engine::Model::load(dir, cpu_opts);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  std::shared_ptr<engine::Model> cpu = std::move(loaded).value();
  auto d = sim(256ull << 20);
  auto from_files = load(dir, on(d, 2));
  const std::uint64_t one_replica = d->accounted_bytes();
  from_files.reset();
  ASSERT_EQ(d->accounted_bytes(), 0u);
  auto beside = engine::Model::load_beside(cpu, on(d, 2));
  ASSERT_TRUE(beside.ok()) << beside.error().message;
  EXPECT_EQ(&(*beside)->files(), &cpu->files()) << "the files are shared, not opened again";
  EXPECT_EQ(&(*beside)->tokenizer(), &cpu->tokenizer()) << "and so is the tokenizer parsed from them";
  EXPECT_EQ((*beside)->fingerprint().digest, cpu->fingerprint().digest);
  EXPECT_EQ((*beside)->accel_layers(), 2);
  EXPECT_EQ(d->accounted_bytes(), one_replica) << "the same bytes on the device as a load from the files";
  auto again = load(dir, on(d, 2));
  EXPECT_EQ(tokens_of(*beside, greedy(**beside)), tokens_of(again, greedy(*again)));
  again.reset();
  // The CPU replica goes first: the mapping stays with the GPU replica.
  const auto want = tokens_of(*beside, greedy(**beside));
  cpu.reset();
  EXPECT_EQ(tokens_of(*beside, greedy(**beside)), want);
  EXPECT_FALSE(engine::Model::load_beside(nullptr, on(d)).ok());
  engine::LoadOptions bad = on(d);
  bad.threads = 0;
  auto refused = engine::Model::load_beside(*beside, bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, Errc::invalid_argument);
}

// engine::to_accelerator on the simulated device: a group of 2 MiB or more lands in one HostPages mapping (2 MiB
// aligned, each tensor at the next 64-byte offset), a copy that outlives the source and the group's other tensors; a
// smaller group is cloned. Equal values either way.
TEST(SimulatedEngine, UploadsToTheSimulatedDeviceCopyGroupsIntoOneMappingOfHugePages) {
  const std::uint64_t huge = device::HostPages::kHugePage;
  at::manual_seed(5);
  std::vector<at::Tensor> group = {
      at::randn({256, 1024}),                                        // 1 MiB f32
      at::randn({3, 5}).to(at::kBFloat16),                           // 30 bytes: the next one starts 64 bytes on
      at::empty({0}, at::kFloat),                                    // empty
      at::randint(0, 255, {1100, 1000}, at::TensorOptions().dtype(at::kByte)),  // 1.05 MiB of raw blocks
  };
  std::vector<at::Tensor> want;
  for (const auto& t : group) want.push_back(t.clone());
  std::vector<at::Tensor> dev = engine::to_accelerator(group, at::Device(at::kCPU));
  ASSERT_EQ(dev.size(), group.size());
  const auto base = reinterpret_cast<std::uintptr_t>(dev[0].data_ptr());
  EXPECT_EQ(base % huge, 0u) << "the group starts a huge page";
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(dev[1].data_ptr()), base + (1u << 20));
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(dev[3].data_ptr()), base + (1u << 20) + 64);
  for (std::size_t i = 0; i < dev.size(); ++i) {
    if (group[i].numel() > 0) EXPECT_NE(dev[i].data_ptr(), group[i].data_ptr()) << i;
    EXPECT_EQ(dev[i].sizes(), group[i].sizes()) << i;
    EXPECT_EQ(dev[i].scalar_type(), group[i].scalar_type()) << i;
    EXPECT_TRUE(at::equal(dev[i], want[i])) << i;
  }
  for (auto& t : group) t.zero_();  // a copy, not a view of the source
  EXPECT_TRUE(at::equal(dev[0], want[0]));
  const at::Tensor last = dev[3];
  dev.clear();  // the others freed: the mapping stays while one of its tensors lives
  EXPECT_TRUE(at::equal(last, want[3]));

  // One tensor of 2 MiB or more: its own mapping. A group under 2 MiB: clones.
  at::Tensor big = at::randn({3, 1 << 18});
  at::Tensor one = engine::to_accelerator(big, at::Device(at::kCPU));
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(one.data_ptr()) % huge, 0u);
  EXPECT_TRUE(at::equal(one, big));
  std::vector<at::Tensor> small = {at::randn({64, 64}), at::randn({7})};
  std::vector<at::Tensor> small_dev = engine::to_accelerator(small, at::Device(at::kCPU));
  for (std::size_t i = 0; i < small.size(); ++i) {
    EXPECT_NE(small_dev[i].data_ptr(), small[i].data_ptr());
    EXPECT_TRUE(at::equal(small_dev[i], small[i]));
  }
  // A non-contiguous source is copied as its values.
  at::Tensor strided = at::randn({1024, 1024}).t();
  at::Tensor strided_dev = engine::to_accelerator(strided, at::Device(at::kCPU));
  EXPECT_TRUE(strided_dev.is_contiguous());
  EXPECT_TRUE(at::equal(strided_dev, strided));
}

TEST(SimulatedEngine, ProbesFailAsScriptedAndDeviceLossFailsThem) {
  auto d = sim();
  d->fail_probes(2);
  EXPECT_EQ(d->health_probe(std::chrono::milliseconds(100)).error().code, Errc::timeout);
  EXPECT_EQ(d->health_probe(std::chrono::milliseconds(100)).error().code, Errc::timeout);
  EXPECT_TRUE(d->health_probe(std::chrono::milliseconds(100)).ok());
  d->lose();
  EXPECT_EQ(d->health_probe(std::chrono::milliseconds(100)).error().code, Errc::device_lost);
  EXPECT_EQ(d->memory().error().code, Errc::device_lost);
  EXPECT_EQ(d->allocate(1, device::Site::weights).error().code, Errc::device_lost);
  d->recover();
  EXPECT_TRUE(d->health_probe(std::chrono::milliseconds(100)).ok());
  EXPECT_EQ(d->counters().probes_failed, 3u);
}

TEST(SimulatedEngine, ReplicaRefusesFilesChangedUnderneath) {
  const std::string dir = temp_root() + "/replica-swap";
  modelgen::Options o;
  o.shape = *modelgen::preset("test");
  o.tokenizer_model = tokenizer_path();
  o.seed = 1;
  ASSERT_TRUE(modelgen::write_model(dir, o).ok());
  engine::LoadOptions lo;
  lo.max_context = 64;
  auto r = engine::Replica::create(dir, lo, policy::ReplicaMode::on_demand);
  ASSERT_TRUE(r.ok());
  o.seed = 2;  // same shapes, other weights
  std::filesystem::remove(dir + "/model.safetensors");
  ASSERT_TRUE(modelgen::write_model(dir, o).ok());
  EXPECT_EQ((*r)->set_mode(policy::ReplicaMode::warm).error().code, Errc::incompatible);
  EXPECT_EQ((*r)->get().error().code, Errc::incompatible);
  EXPECT_FALSE((*r)->loaded());
}
