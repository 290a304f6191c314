// Seeded randomized simulation of a daemon driving the policy library: thousands of submissions (with repeated
// idempotency keys and resumes), completions, cancels, allocation failures, device resets, late probe results,
// foreign GPU load, weights evicted and reloaded, allocator caching, and host memory that drops as our CPU jobs
// allocate (by more or less than estimated). Invariants are checked after every step and at the end.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>
#include <set>

#include "fixtures.h"

namespace tandem::policy {
namespace {

using testing::llama7b;
constexpr std::uint64_t G = kGiB;
constexpr std::uint64_t kTotal = 24 * G;

struct JobInfo {
  std::string key;
  RequestShape request;
  std::uint32_t max_new = 0;         // in force (possibly reduced)
  std::uint32_t delivered = 0;
  bool on_gpu = false;               // running on the GPU (holds a ledger reservation)
  bool on_cpu = false;               // running on the CPU (holds a host reservation)
  bool on_hybrid = false;            // running offloaded: on the GPU (ledger) and on the host (host reservation)
  std::optional<HostJobEstimate> host;
  bool reproducible = false;         // sampling reproducible on the CPU (FailoverInput)
  bool host_materialized = false;    // its host memory is allocated (inside MemAvailable)
  std::uint64_t host_actual = 0;     // what it really allocated on the host (≠ the estimate)
};

class Simulation {
 public:
  explicit Simulation(std::uint64_t seed)
      : rng_(seed),
        policy_(cfg_.ladder, cfg_.estimator, cfg_.host_guard),
        breaker_(cfg_.breaker),
        pressure_(cfg_.ladder.pressure),
        gpu_("gpu_queue", cfg_.gpu_queue, cfg_.gpu_rates),
        cpu_("cpu_queue", cfg_.cpu_queue, cfg_.cpu_rates),
        host_(cfg_.host_guard),
        service_(cfg_.service),
        failover_(cfg_.failover) {
    EXPECT_TRUE(ledger_.set_resident(model_.name, MemoryEstimator::weights_bytes(model_)).ok());
    resident_layers_ = model_.layers;
  }

  static PolicyConfig make_config() {
    PolicyConfig c;
    c.gpu_queue = QueueConfig{32, 4, 8192, 4096};
    c.cpu_queue = QueueConfig{16, 2, 4096, 1024};
    c.host_guard = HostGuardConfig{24 * G, 2 * G, 4};
    c.breaker.cooldown = 2s;
    c.breaker.max_cooldown = 20s;
    c.ladder.max_delay = 120s;
    return c;
  }

  void run(int steps) {
    for (int i = 0; i < steps; ++i) {
      step_ = i;
      now_ += std::chrono::milliseconds(pick(10, 400));
      switch (pick(0, 19)) {
        case 0: case 1: case 2: case 3: case 4: case 5: case 6: submit(); break;
        case 7: case 8: case 9: case 10: progress(); break;
        case 11: case 12: cancel_random(); break;
        case 13: alloc_failure(); break;
        case 14: if (pick(0, 4) == 0) device_reset(); break;
        case 15: foreign_ = pick(0, 6) * G / 2; cache_ = pick(0, 4) * G / 4; break;
        case 16: host_available_ = pick(8, 64) * G; break;
        case 17: stale_ = pick(0, 9) == 0; break;
        case 18: maybe_evict_weights(); break;
        default: break;
      }
      pump();
      check_invariants();
      if (::testing::Test::HasFatalFailure()) return;
    }
  }

  // Let everything finish: GPU healthy, no foreign load, plenty of host memory.
  void drain() {
    breaker_.reset(now_);
    pending_probes_.clear();
    foreign_ = 0;
    stale_ = false;
    host_available_ = 64 * G;
    for (int i = 0; i < 200000 && live() > 0; ++i) {
      now_ += 100ms;
      pump();
      progress();
      check_invariants();
      if (::testing::Test::HasFatalFailure()) return;
    }
  }

  std::size_t live() const {
    std::size_t n = 0;
    for (const auto& [id, j] : jobs_) n += j.terminal() ? 0 : 1;
    return n;
  }

  void check_final() {
    EXPECT_EQ(live(), 0u);
    EXPECT_EQ(ledger_.jobs(), 0u);
    EXPECT_EQ(ledger_.reserved_bytes(), 0u);
    EXPECT_EQ(host_.committed_bytes(), 0u);
    EXPECT_EQ(gpu_.depth() + gpu_.running() + cpu_.depth() + cpu_.running(), 0u);
    for (const auto& [id, job] : jobs_) {
      int terminal_transitions = 0;
      for (const auto& t : job.history()) terminal_transitions += is_terminal(t.to) ? 1 : 0;
      EXPECT_EQ(terminal_transitions, 1) << "job " << id;
      EXPECT_TRUE(job.terminal()) << "job " << id;
      const std::string& key = info_.at(id).key;
      auto claim = keys_.find(key);
      ASSERT_TRUE(claim.has_value());
      if (claim->job != id) {
        // Replaced by a resume: only a failed (resumable) job's key is ever handed on.
        EXPECT_EQ(job.phase(), JobPhase::failed) << "job " << id;
        continue;
      }
      ASSERT_TRUE(claim->outcome.has_value()) << "job " << id;
      EXPECT_EQ(claim->outcome->phase, job.phase());
    }
    // No key ran twice: one job per key, or a chain where each one failed before the next (a resume) was created.
    for (const auto& [key, ids] : jobs_per_key_) {
      ASSERT_FALSE(ids.empty());
      EXPECT_EQ(keys_.find(key)->job, ids.back()) << key;
      for (std::size_t i = 0; i + 1 < ids.size(); ++i) {
        EXPECT_EQ(jobs_.at(ids[i]).phase(), JobPhase::failed) << key;
      }
    }
  }

  // Figures, so the test can insist every path was exercised.
  std::map<std::string, int> counts;

 private:
  std::uint64_t pick(std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng_); }

  // Our allocator holds `cache_` bytes beyond the live tensors (reserved ≠ allocated).
  MemorySnapshot snapshot() const {
    std::uint64_t ours = std::min(kTotal, ledger_.resident_bytes() + ledger_.materialized_bytes() * 9 / 10);  // we over-predict a bit
    std::uint64_t reserved = std::min(kTotal, ours + cache_);
    std::uint64_t used = std::min(kTotal, reserved + foreign_);
    return MemorySnapshot{kTotal, kTotal - used, reserved, ours, stale_ ? now_ - 7s : now_};
  }
  // MemAvailable drops with what our jobs really allocated on the host (anonymous memory); the mmap'd weights are
  // clean page cache and stay inside MemAvailable.
  HostReading host_reading() const {
    return HostReading{host_available_ > host_anon_ ? host_available_ - host_anon_ : 0, std::nullopt, std::nullopt};
  }

  // At every host admission: what we have committed but not yet allocated fits in MemAvailable − reserve. (The
  // guard adds back the estimate of what is materialized; here it is computed from the simulation's own records.)
  void check_host_admission() {
    std::uint64_t materialized_estimate = 0;
    for (const auto& [id, ji] : info_) {
      if (ji.host_materialized) materialized_estimate += ji.host->job_bytes();
    }
    const std::uint64_t avail = *host_reading().mem_available;
    const std::uint64_t room = avail > cfg_.host_guard.mem_available_reserve ? avail - cfg_.host_guard.mem_available_reserve : 0;
    ASSERT_GE(host_.committed_bytes(), materialized_estimate);
    ASSERT_LE(host_.committed_bytes() - materialized_estimate, room) << "step " << step_;
    ASSERT_LE(host_.committed_bytes(), cfg_.host_guard.budget_bytes) << "step " << step_;
    ++counts["host_admission_checked"];
  }

  bool weights_resident() const { return resident_layers_ == model_.layers; }

  // The GPU drops the model's weights when nothing runs there (memory for a co-tenant); the next GPU start loads
  // them again, and decisions meanwhile count the weights in the plan.
  void maybe_evict_weights() {
    if (ledger_.jobs() != 0 || resident_layers_ == 0) return;
    ASSERT_TRUE(ledger_.set_resident(model_.name, 0).ok());
    resident_layers_ = 0;
    ++counts["weights_evicted"];
  }

  AdmissionSnapshot snapshot_for(JobId id) {
    const JobInfo& ji = info_.at(id);
    Headroom h = compute_headroom(snapshot(), ledger_, cfg_.headroom, now_);
    Pressure p = pressure_.update(h.fraction());
    AdmissionSnapshot s;
    s.model = model_;
    s.request = ji.request;
    s.gpu = make_gpu_view(h, p, breaker_, gpu_, ledger_, now_, weights_resident(), true, id);
    s.cpu = make_cpu_view(cpu_, host_, host_reading(), true, true, std::nullopt, id);
    // Half the jobs are decided for a step loop (continuous batching): the prefill chunk shares the step budget.
    last_step_share_ = 0;
    if (id % 2 == 1) {
      s.gpu.step_tokens = gpu_.config().step_tokens;
      s.cpu.step_tokens = cpu_.config().step_tokens;
      last_step_share_ = std::max<std::uint32_t>(1, s.gpu.step_tokens - std::min(s.gpu.step_tokens, s.gpu.running_sequences));
    }
    return s;
  }

  RequestShape request_for_key(std::uint64_t k) {
    std::mt19937_64 r(k * 7919 + 1);  // the same key always carries the same request
    RequestShape q = testing::request(static_cast<std::uint32_t>(100 + r() % 6000),
                                      static_cast<std::uint32_t>(16 + r() % 2000));
    q.allow_reduce = r() % 2;
    q.allow_cpu = r() % 5 != 0;
    q.side_effects = r() % 4 == 0;
    q.prefill_chunk = r() % 3 == 0 ? 512 : 0;
    return q;
  }
  static bool reproducible_for_key(std::uint64_t k) { return k % 3 != 0; }

  void submit() {
    const std::uint64_t k = pick(0, 2999);
    const std::string key = "key-" + std::to_string(k);
    RequestShape req = request_for_key(k);
    const JobId id = next_id_++;
    const bool resume = pick(0, 2) == 0;  // the client resubmits with its checkpoint
    auto claim = keys_.claim(key, id, k, now_, resume);
    ASSERT_TRUE(claim.ok()) << claim.error().message;
    std::vector<JobId>& chain = jobs_per_key_[key];
    if (!claim->created) {
      ++counts["resubmitted"];
      EXPECT_EQ(chain.back(), claim->job);
      return;
    }
    if (!chain.empty()) {
      // A resume: the key's previous job failed (resumable); it must not run twice, and a late outcome from it
      // must not be stored as the new job's.
      const JobId previous = chain.back();
      ASSERT_EQ(jobs_.at(previous).phase(), JobPhase::failed);
      Status late = keys_.record_outcome(key, previous, StoredOutcome{JobPhase::failed, "late", now_});
      ASSERT_FALSE(late.ok());
      EXPECT_EQ(late.error().code, Errc::illegal_transition);
      ASSERT_FALSE(keys_.find(key)->outcome.has_value());
      ++counts["resumed"];
    }
    chain.push_back(id);
    jobs_.emplace(id, Job(id, /*seed=*/id * 31, model_.name, now_));
    JobInfo ji;
    ji.key = key;
    ji.request = req;
    ji.max_new = req.max_new_tokens;
    ji.reproducible = reproducible_for_key(k);
    info_.emplace(id, std::move(ji));
    ++counts["accepted"];
    act(id, policy_.decide(snapshot_for(id)), /*queued_on_gpu=*/false);
  }

  // Carries out a decision for a job that is queued (fresh, or at the head of the GPU queue).
  void act(JobId id, const Decision& d, bool queued_on_gpu) {
    Job& job = jobs_.at(id);
    JobInfo& ji = info_.at(id);
    ++counts[std::string(rung_name(d.action))];
    switch (d.action) {
      case Rung::admit:
      case Rung::reduce:
      case Rung::offload: {
        if (last_step_share_ > 0) {
          // The estimate (the reservation) assumes at most the job's share of the step budget per prefill step.
          ASSERT_LE(d.breakdown.prefill_chunk_tokens, last_step_share_);
          if (d.prefill_chunk != ji.request.prefill_chunk) ++counts["step_chunk_capped"];
        }
        const std::uint64_t bytes = d.breakdown.job_bytes();
        ASSERT_TRUE(ledger_.reserve(id, bytes).ok());
        if (d.breakdown.weights_bytes > 0) {
          // Weights were not (fully) resident: they are loaded for this job, counted once per model.
          const std::uint64_t w = std::max(ledger_.resident_bytes(), d.breakdown.weights_bytes);
          ASSERT_TRUE(ledger_.set_resident(model_.name, w).ok());
          resident_layers_ = std::max(resident_layers_, d.route.gpu_layers);
          ++counts["weights_loaded"];
        }
        if (d.host) {  // offload: the host part of the split
          ASSERT_EQ(d.action, Rung::offload);
          auto admitted = host_.admit(id, *d.host, host_reading());
          ASSERT_TRUE(admitted.ok()) << admitted.error().message;
          ji.host = d.host;
          ji.on_hybrid = true;
          check_host_admission();
          if (::testing::Test::HasFatalFailure()) return;
          ++counts["hybrid"];
        }
        if (queued_on_gpu) {
          auto started = gpu_.start_next();
          ASSERT_TRUE(started && started->id == id);
        } else {
          Status s = gpu_.start_direct(QueueEntry{id, ji.request.prompt_tokens, d.max_new_tokens, job.accepted_at()});
          ASSERT_TRUE(s.ok()) << s.error().message;
        }
        ji.max_new = d.max_new_tokens;
        ji.on_gpu = true;
        ASSERT_TRUE(job.start(d.route, now_).ok());
        break;
      }
      case Rung::delay:
        if (!queued_on_gpu) {
          Status s = gpu_.enqueue(QueueEntry{id, ji.request.prompt_tokens, ji.request.max_new_tokens, job.accepted_at()});
          ASSERT_TRUE(s.ok()) << s.error().message;
        }
        break;
      case Rung::evict:
        FAIL() << "one model, no idle replica of another: nothing to evict";
        break;
      case Rung::route_cpu: {
        if (queued_on_gpu) { ASSERT_EQ(gpu_.remove(id), Removed::queued); }
        ji.max_new = d.max_new_tokens;
        ji.host = d.host;
        Status s = cpu_.enqueue(QueueEntry{id, ji.request.prompt_tokens, d.max_new_tokens, job.accepted_at()});
        ASSERT_TRUE(s.ok()) << s.error().message;
        if (d.waits_for_host_memory) ++counts["host_wait"];
        break;
      }
      case Rung::reject:
        if (queued_on_gpu) { ASSERT_EQ(gpu_.remove(id), Removed::queued); }
        ASSERT_TRUE(job.fail(Errc::rejected, std::string(reason_name(d.reason)), d.retry_after, now_).ok());
        finish(id);
        break;
    }
  }

  void finish(JobId id) {
    const Job& job = jobs_.at(id);
    ASSERT_TRUE(job.terminal());
    const char* what = job_phase_name(job.phase()).data();
    ++counts[what];
    Status s = keys_.record_outcome(info_.at(id).key, id, StoredOutcome{job.phase(), what, now_});
    ASSERT_TRUE(s.ok()) << s.error().message;
  }

  void release_resources(JobId id) {
    JobInfo& ji = info_.at(id);
    gpu_.remove(id);
    cpu_.remove(id);
    ledger_.release(id);
    host_.release(id);
    if (ji.host_materialized) host_anon_ -= ji.host_actual;
    ji.host_materialized = false;
    ji.host_actual = 0;
    ji.on_gpu = ji.on_cpu = ji.on_hybrid = false;
  }

  void pump() {
    breaker_.poll(now_);
    // Probe results arrive late sometimes (slowly, so that some arrive after the breaker moved on); one from an
    // earlier half-open period must change nothing.
    if (!pending_probes_.empty() && pick(0, 5) == 0) {
      const std::size_t i = pick(0, pending_probes_.size() - 1);
      const ProbeId id = pending_probes_[i];
      pending_probes_.erase(pending_probes_.begin() + static_cast<std::ptrdiff_t>(i));
      const bool current = breaker_.probe() == id;
      const BreakerState before = breaker_.state();
      const auto transitions = breaker_.history().size();
      breaker_.record(pick(0, 2) ? BreakerEvent::probe_succeeded : BreakerEvent::probe_failed, now_, id);
      if (!current) {
        ASSERT_EQ(breaker_.state(), before);
        ASSERT_EQ(breaker_.history().size(), transitions);
        ++counts["stale_probe_ignored"];
      } else {
        ++counts["probe"];
      }
    }
    if (auto probe = breaker_.try_acquire_probe(now_)) {
      if (pick(0, 1) == 0) {
        pending_probes_.push_back(*probe);
      } else {
        breaker_.record(pick(0, 2) ? BreakerEvent::probe_succeeded : BreakerEvent::probe_failed, now_, *probe);
        ++counts["probe"];
      }
    }
    // GPU queue head: decide again (it may now fit, or must move to the CPU, or be rejected).
    for (int guard = 0; guard < 64 && gpu_.head() != nullptr; ++guard) {
      JobId head = gpu_.head()->id;
      Decision d = policy_.decide(snapshot_for(head));
      act(head, d, /*queued_on_gpu=*/true);
      if (d.action == Rung::delay) break;
    }
    // CPU queue head: start when a slot is free and the host guard has room.
    while (cpu_.head() != nullptr && cpu_.has_free_slot()) {
      JobId head = cpu_.head()->id;
      JobInfo& ji = info_.at(head);
      HostCheck c = host_.check(*ji.host, host_reading());
      if (c.fit == HostFit::wait) break;
      if (c.fit == HostFit::never) {
        cpu_.remove(head);
        ASSERT_TRUE(jobs_.at(head).fail(Errc::host_memory, "host_memory", 5s, now_).ok());
        finish(head);
        continue;
      }
      auto admitted = host_.admit(head, *ji.host, host_reading());
      ASSERT_TRUE(admitted.ok()) << admitted.error().message;
      ASSERT_LE(host_.committed_bytes(), host_.budget(host_reading()).bytes);
      check_host_admission();
      if (::testing::Test::HasFatalFailure()) return;
      auto started = cpu_.start_next();
      ASSERT_TRUE(started && started->id == head);
      ji.on_cpu = true;
      ASSERT_TRUE(jobs_.at(head).start(Route{Device::cpu, 0, false, model_.name}, now_).ok());
    }
    const ReadingTrust trust = compute_headroom(snapshot(), ledger_, cfg_.headroom, now_).trust;
    service_.update(ServiceInputs{pressure_.level(), breaker_.state(), true, false, true, "", Limits{}, trust}, now_);
    for (const auto& c : service_.drain_changes()) {
      ++counts["service_change"];
      if (c.to.reason == "memory-reading-stale") ++counts["reading_stale_announced"];
      // An expired reading is never announced as memory-critical.
      if (trust == ReadingTrust::expired) { ASSERT_NE(c.to.reason, "memory-critical"); }
    }
  }

  void progress() {
    std::vector<JobId> done;
    for (auto& [id, ji] : info_) {
      if (!ji.on_gpu && !ji.on_cpu) continue;
      Job& job = jobs_.at(id);
      if (ji.on_gpu) { ASSERT_TRUE(ledger_.materialize(id).ok()); }
      if ((ji.on_cpu || ji.on_hybrid) && !ji.host_materialized) {
        ASSERT_TRUE(host_.materialize(id).ok());
        // The real allocation differs from the estimate: 60 % to 110 % of it.
        ji.host_actual = ji.host->job_bytes() / 100 * pick(60, 110);
        ji.host_materialized = true;
        host_anon_ += ji.host_actual;
      }
      ji.delivered = std::min<std::uint32_t>(ji.max_new, ji.delivered + static_cast<std::uint32_t>(pick(0, 400)));
      ASSERT_TRUE(job.record_tokens(ji.delivered).ok());
      (ji.on_gpu ? gpu_ : cpu_).update_progress(id, true, ji.delivered);
      if (ji.delivered == ji.max_new) done.push_back(id);
    }
    for (JobId id : done) {
      release_resources(id);
      ASSERT_TRUE(jobs_.at(id).complete(now_).ok());
      finish(id);
    }
  }

  JobId random_job(bool (*want)(const Job&, const JobInfo&)) {
    std::vector<JobId> ids;
    for (const auto& [id, job] : jobs_) if (want(job, info_.at(id))) ids.push_back(id);
    return ids.empty() ? 0 : ids[pick(0, ids.size() - 1)];
  }

  void cancel_random() {
    JobId id = random_job([](const Job& j, const JobInfo&) { return !j.terminal(); });
    if (id == 0) return;
    ++counts[std::string("cancel_") + std::string(job_phase_name(jobs_.at(id).phase()))];
    release_resources(id);
    ASSERT_TRUE(jobs_.at(id).cancel(now_).ok());
    finish(id);
    EXPECT_FALSE(jobs_.at(id).cancel(now_).ok());  // cancel twice is refused, state unchanged
  }

  void fail_over(JobId id) {
    Job& job = jobs_.at(id);
    JobInfo& ji = info_.at(id);
    release_resources(id);
    bool cpu_ok = ji.request.allow_cpu && !cpu_.full() && cpu_.check_limits(ji.request.prompt_tokens, ji.max_new).ok();
    HostJobEstimate est = estimate_host_job(model_, [&] { RequestShape r = ji.request; r.max_new_tokens = ji.max_new; return r; }(),
                                            cfg_.estimator, cfg_.host_guard);
    if (cpu_ok) cpu_ok = host_.check(est, host_reading()).fit != HostFit::never;
    FailoverDecision f = failover_.decide(FailoverInput{ji.delivered, ji.reproducible, ji.request.side_effects, cpu_ok});
    ++counts[std::string(failover_action_name(f.action))];
    ++counts["failover_" + f.reason];
    switch (f.action) {
      case FailoverAction::retry_on_cpu:
        ASSERT_TRUE(job.begin_retry(f.reason, now_).ok());
        break;
      case FailoverAction::migrate_at_checkpoint:
        ASSERT_TRUE(job.begin_migration(f.reason, now_).ok());
        ASSERT_EQ(job.checkpoint()->tokens_delivered, ji.delivered);
        ASSERT_EQ(job.checkpoint()->seed, id * 31);  // same seed
        break;
      case FailoverAction::fail_resumable:
        ASSERT_TRUE(job.fail(Errc::device_lost, f.reason, 5s, now_).ok());
        ASSERT_EQ(job.failure()->checkpoint.tokens_delivered, ji.delivered);
        finish(id);
        return;
    }
    ji.host = est;
    Status s = cpu_.enqueue(QueueEntry{id, ji.request.prompt_tokens, ji.max_new, job.accepted_at()});
    ASSERT_TRUE(s.ok()) << s.error().message;
  }

  void alloc_failure() {
    JobId id = random_job([](const Job&, const JobInfo& ji) { return ji.on_gpu; });
    if (id == 0) return;
    breaker_.record(BreakerEvent::alloc_failure, now_);
    fail_over(id);
  }

  void device_reset() {
    breaker_.record(BreakerEvent::driver_reset, now_);
    ++counts["device_reset"];
    std::vector<JobId> on_gpu;
    for (const auto& [id, ji] : info_) if (ji.on_gpu) on_gpu.push_back(id);
    for (JobId id : on_gpu) fail_over(id);
  }

  void check_invariants() {
    const std::uint64_t margin = cfg_.headroom.margin.for_total(kTotal);
    ASSERT_LE(ledger_.predicted_bytes(), kTotal - margin) << "step " << step_;  // never over capacity − margin
    ASSERT_LE(host_.committed_bytes(), cfg_.host_guard.budget_bytes) << "step " << step_;
    std::size_t gpu_running = 0, cpu_running = 0;
    for (const auto& [id, ji] : info_) {
      gpu_running += ji.on_gpu;
      cpu_running += ji.on_cpu;
      ASSERT_EQ(ji.on_gpu, ledger_.find(id) != nullptr) << "job " << id;
      if (ji.on_gpu || ji.on_cpu) { ASSERT_EQ(jobs_.at(id).phase(), JobPhase::running) << "job " << id; }
    }
    std::size_t hybrid_running = 0;
    for (const auto& [id, ji] : info_) hybrid_running += ji.on_hybrid;
    ASSERT_EQ(gpu_running, gpu_.running());
    ASSERT_EQ(cpu_running, cpu_.running());
    ASSERT_EQ(cpu_running + hybrid_running, host_.jobs());
    ASSERT_LE(gpu_.depth(), cfg_.gpu_queue.capacity);
    ASSERT_LE(cpu_.depth(), cfg_.cpu_queue.capacity);
    if (!breaker_.allows_gpu()) { ASSERT_GE(service_.current().level, ServiceLevel::degraded); }
  }

  PolicyConfig cfg_ = make_config();
  std::mt19937_64 rng_;
  ModelShape model_ = llama7b();
  AdmissionPolicy policy_;
  ReservationLedger ledger_;
  CircuitBreaker breaker_;
  PressureTracker pressure_;
  JobQueue gpu_;
  JobQueue cpu_;
  HostMemoryGuard host_;
  ServiceStateTracker service_;
  FailoverPolicy failover_;
  IdempotencyRegistry keys_;
  std::map<JobId, Job> jobs_;
  std::map<JobId, JobInfo> info_;
  std::map<std::string, std::vector<JobId>> jobs_per_key_;  // in claim order (resumes append)
  std::vector<ProbeId> pending_probes_;                      // probe results not delivered yet
  std::uint32_t resident_layers_ = 0;                        // model layers whose weights are on the GPU
  std::uint64_t cache_ = 0;                                  // allocator cache (reserved − allocated)
  std::uint64_t host_anon_ = 0;                              // what our jobs really allocated on the host
  Clock::time_point now_{};
  JobId next_id_ = 1;
  std::uint64_t foreign_ = 0;
  std::uint64_t host_available_ = 64 * G;
  bool stale_ = false;
  int step_ = 0;
  std::uint32_t last_step_share_ = 0;  // the last snapshot's prefill share of a step (0: no step loop)
};

class SimulationTest : public ::testing::TestWithParam<std::uint64_t> {};

TEST_P(SimulationTest, InvariantsHoldUnderRandomLoadAndFaults) {
  Simulation sim(GetParam());
  sim.run(10000);
  ASSERT_FALSE(HasFatalFailure());
  sim.drain();
  ASSERT_FALSE(HasFatalFailure());
  sim.check_final();
  // Every path was taken: a simulation that never reaches a rung proves nothing about it.
  for (const char* what : {"accepted", "resubmitted", "admit", "delay", "reduce", "offload", "route_cpu", "reject",
                           "completed", "cancelled", "failed", "retry_on_cpu", "migrate_at_checkpoint",
                           "fail_resumable", "device_reset", "probe", "service_change", "cancel_queued",
                           "cancel_running", "resumed", "hybrid", "weights_evicted", "weights_loaded",
                           "stale_probe_ignored", "host_admission_checked", "failover_sampling_not_reproducible",
                           "reading_stale_announced", "step_chunk_capped"}) {
    EXPECT_GT(sim.counts[what], 0) << what;
  }
  EXPECT_GT(sim.counts["accepted"], 2000);
  std::string figures;
  for (const auto& [what, n] : sim.counts) figures += what + "=" + std::to_string(n) + " ";
  RecordProperty("figures", figures);
  std::printf("seed %llu: %s\n", static_cast<unsigned long long>(GetParam()), figures.c_str());
}

INSTANTIATE_TEST_SUITE_P(Seeds, SimulationTest, ::testing::Values(1u, 42u, 20240601u));

}  // namespace
}  // namespace tandem::policy
