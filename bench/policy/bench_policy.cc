// Admission decision latency (p50/p99 per ladder outcome) and cost per job operation with 10,000 queued.
// Run: build-policy/bench/policy/bench_policy --benchmark_repetitions=1
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "fixtures.h"
#include "policy/policy.h"

namespace tandem::policy {
namespace {

constexpr std::uint64_t G = kGiB;

using testing::llama7b;  // the same Llama-2-7B shape the tests use (tests/policy/fixtures.h)

// Records one sample per iteration and reports p50/p99 (ns) as counters.
class Percentiles {
 public:
  explicit Percentiles(benchmark::State& state) : state_(state) { samples_.reserve(1 << 20); }
  template <class F>
  void time(F&& f) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    auto t1 = std::chrono::steady_clock::now();
    double s = std::chrono::duration<double>(t1 - t0).count();
    state_.SetIterationTime(s);
    if (samples_.size() < samples_.capacity()) samples_.push_back(s * 1e9);
  }
  ~Percentiles() {
    if (samples_.empty()) return;
    std::sort(samples_.begin(), samples_.end());
    auto at = [&](double q) { return samples_[std::min(samples_.size() - 1, static_cast<std::size_t>(q * samples_.size()))]; };
    state_.counters["p50_ns"] = at(0.50);
    state_.counters["p99_ns"] = at(0.99);
  }

 private:
  benchmark::State& state_;
  std::vector<double> samples_;
};

struct Setup {
  HostMemoryGuard host{HostGuardConfig{32 * G, 1 * G, 4}};
  AdmissionPolicy policy{LadderConfig{}, EstimatorConfig{}, HostGuardConfig{32 * G, 1 * G, 4}};

  AdmissionSnapshot snapshot(Rung target) {
    AdmissionSnapshot s;
    s.model = llama7b();
    s.request.prompt_tokens = 2000;
    s.request.max_new_tokens = 1000;
    s.gpu.headroom.total_bytes = 24 * G;
    s.gpu.headroom.headroom = static_cast<std::int64_t>(8 * G);
    s.gpu.headroom.drained_headroom = static_cast<std::int64_t>(8 * G);
    s.gpu.weights_resident = true;
    s.gpu.offload_supported = true;
    s.gpu.max_context = 8192;
    s.gpu.max_new_tokens = 4096;
    s.cpu.replica_present = true;
    s.cpu.fingerprint_compatible = true;
    s.cpu.max_context = 4096;
    s.cpu.max_new_tokens = 1024;
    s.cpu.host = &host;
    s.cpu.host_reading.mem_available = 64 * G;
    const auto need = static_cast<std::int64_t>(policy.estimator().estimate(s.model, s.request, true).total_bytes);
    switch (target) {
      case Rung::admit: break;
      case Rung::delay: s.gpu.headroom.headroom = need - 1; s.gpu.running = {{G, 5s}}; break;
      case Rung::evict:
        s.gpu.headroom.headroom = need - 1;
        s.gpu.evictable = {{"clip", 2 * G, 0, {}}, {"whisper", 3 * G, 0, {}}};
        s.gpu.evict_budget = 4;
        break;
      case Rung::reduce: s.gpu.headroom.headroom = need * 3 / 4; s.gpu.queue_full = true; s.request.allow_reduce = true; break;
      case Rung::offload: s.gpu.headroom.headroom = need / 2; s.gpu.queue_full = true; break;
      case Rung::route_cpu: s.gpu.breaker_allows = false; break;
      case Rung::reject: s.gpu.breaker_allows = false; s.cpu.fingerprint_compatible = false; break;
    }
    return s;
  }
};

void BM_AdmissionDecision(benchmark::State& state) {
  const auto target = static_cast<Rung>(state.range(0));
  Setup setup;
  AdmissionSnapshot s = setup.snapshot(target);
  if (setup.policy.decide(s).action != target) {
    state.SkipWithError("snapshot does not produce the intended rung");
    return;
  }
  Percentiles p(state);
  for (auto _ : state) {
    p.time([&] { benchmark::DoNotOptimize(setup.policy.decide(s)); });
  }
  state.SetLabel(std::string(rung_name(target)));
}
BENCHMARK(BM_AdmissionDecision)->DenseRange(0, 6)->UseManualTime();

// The full admission path a daemon runs per submission with 10,000 jobs queued on the GPU: headroom from the
// reading and the ledger, pressure update, views from the mechanisms, decide.
void BM_AdmissionWithViews10kQueued(benchmark::State& state) {
  Setup setup;
  JobQueue gpu("gpu_queue", QueueConfig{20000, 4, 8192, 4096});
  JobQueue cpu("cpu_queue", QueueConfig{16, 1, 4096, 1024});
  CircuitBreaker breaker;
  PressureTracker pressure;
  ReservationLedger ledger;
  (void)ledger.set_resident("llama-2-7b", 13 * G);
  for (JobId id = 1; id <= 4; ++id) {
    (void)gpu.start_direct(QueueEntry{id, 1000, 500, {}});
    (void)ledger.reserve(id, G / 4);
  }
  for (JobId id = 5; id < 10005; ++id) (void)gpu.enqueue(QueueEntry{id, 1000, 500, Clock::time_point{} + std::chrono::milliseconds(id)});
  MemorySnapshot snap{24 * G, 10 * G, 14 * G, 14 * G, Clock::time_point{} + 20s};
  AdmissionSnapshot s = setup.snapshot(Rung::admit);
  HeadroomConfig hc;
  Percentiles p(state);
  for (auto _ : state) {
    p.time([&] {
      const auto now = Clock::time_point{} + 20s;
      Headroom h = compute_headroom(snap, ledger, hc, now);
      s.gpu = make_gpu_view(h, pressure.update(h.fraction()), breaker, gpu, ledger, now, true, true);
      s.cpu = make_cpu_view(cpu, setup.host, s.cpu.host_reading, true, true, std::nullopt);
      benchmark::DoNotOptimize(setup.policy.decide(s));
    });
  }
}
BENCHMARK(BM_AdmissionWithViews10kQueued)->UseManualTime();

// One job's bookkeeping with 10,000 others queued: idempotency claim, Job, enqueue at the tail, queue position and
// ETA, ledger reserve → materialize → release, state transitions, outcome; the oldest queued job leaves so the
// depth stays at 10,000.
void BM_JobLifecycle10kQueued(benchmark::State& state) {
  JobQueue gpu("gpu_queue", QueueConfig{20000, 4, 8192, 4096});
  ReservationLedger ledger;
  IdempotencyRegistry keys(IdempotencyConfig{24h, 100'000'000});
  JobId next = 1;
  auto tp = [](JobId id) { return Clock::time_point{} + std::chrono::microseconds(id); };
  for (; next <= 10000; ++next) (void)gpu.enqueue(QueueEntry{next, 500, 200, tp(next)});
  std::vector<std::string> key_names;
  key_names.reserve(1 << 20);
  Percentiles p(state);
  for (auto _ : state) {
    key_names.push_back("key-" + std::to_string(next));  // key text made outside the timed part
    const std::string& key = key_names.back();
    p.time([&] {
      const JobId id = next;
      auto claim = keys.claim(key, id, 7, tp(id));
      Job job(id, id, "m", tp(id));
      (void)gpu.enqueue(QueueEntry{id, 500, 200, tp(id)});
      benchmark::DoNotOptimize(gpu.eta_start_for_new());
      benchmark::DoNotOptimize(gpu.oldest_age(tp(id)));
      // The oldest leaves the queue and runs.
      const JobId head = gpu.head()->id;
      gpu.remove(head);
      (void)ledger.reserve(head, G);
      (void)ledger.materialize(head);
      (void)job.start(Route{Device::gpu, 32, false, "m"}, tp(id));
      (void)job.record_tokens(200);
      (void)job.complete(tp(id));
      ledger.release(head);
      (void)keys.record_outcome(key, id, StoredOutcome{JobPhase::completed, "", tp(id)});
      benchmark::DoNotOptimize(claim);
    });
    ++next;
  }
  state.counters["queued"] = static_cast<double>(gpu.depth());
}
BENCHMARK(BM_JobLifecycle10kQueued)->UseManualTime();

// Individual queue operations at 10,000 queued.
void BM_QueueEnqueueCancel10k(benchmark::State& state) {
  JobQueue q("gpu_queue", QueueConfig{20000, 4, 8192, 4096});
  for (JobId id = 0; id < 10000; ++id) (void)q.enqueue(QueueEntry{id, 500, 200, Clock::time_point{} + std::chrono::microseconds(id)});
  JobId next = 10000;
  Percentiles p(state);
  for (auto _ : state) {
    p.time([&] {
      (void)q.enqueue(QueueEntry{next, 500, 200, Clock::time_point{} + std::chrono::microseconds(next)});
      q.cancel(next - 5000);  // cancel one from the middle
    });
    ++next;
  }
}
BENCHMARK(BM_QueueEnqueueCancel10k)->UseManualTime();

void BM_QueuePositionAndEta10k(benchmark::State& state) {
  JobQueue q("gpu_queue", QueueConfig{20000, 4, 8192, 4096});
  for (JobId id = 0; id < 10000; ++id) (void)q.enqueue(QueueEntry{id, 500, 200, Clock::time_point{} + std::chrono::microseconds(id)});
  JobId probe = 0;
  Percentiles p(state);
  for (auto _ : state) {
    p.time([&] {
      benchmark::DoNotOptimize(q.position(probe));
      benchmark::DoNotOptimize(q.eta_start(probe));
    });
    probe = (probe + 997) % 10000;  // positions spread over the queue: O(position)
  }
}
BENCHMARK(BM_QueuePositionAndEta10k)->UseManualTime();

}  // namespace
}  // namespace tandem::policy

BENCHMARK_MAIN();
