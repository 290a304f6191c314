// GPU residency through the service (docs/residency.md): a hold gives the GPU replica's memory back — at once when
// it is idle, after its running jobs when it is busy, and by moving them to the CPU at their checkpoint once the
// drain time passed (the same tokens as an uninterrupted run) — and releasing the last hold loads it again. Over the
// scripted FakeBackend with its weights accounted on the simulated device, so the device's reading shows the bytes.
#include "service_fixture.h"
#include "square_wav.h"

namespace tandem::daemon {
namespace {

using namespace tandem::daemon::testing;

class ResidencyTest : public ServiceTest {
 protected:
  ResidencyTest() {
    cfg_.device.drain = std::chrono::milliseconds(1000);
    EXPECT_TRUE(backend_->place_on_device());
  }
  ReplicaState state() { return svc_->residency().find("tiny")->state; }
  std::optional<ReplicaInfo> gpu_replica() {
    for (const auto& r : svc_->replicas("tiny"))
      if (r.device != "cpu") return r;
    return std::nullopt;
  }
  std::uint64_t ours_on_device() { return sim_->accounted_bytes(); }
  std::uint64_t counter(const std::string& k) { return svc_->counters()[k]; }
  // A GPU hold by org.game, then the loop until the replica is given back; `cookie` gets the hold's cookie.
  void hold_until_evicted(std::string& cookie, const std::string& reason = "game") {
    auto c = svc_->hold_gpu(admin_, reason, "org.game");
    ASSERT_TRUE(c) << describe(c);
    cookie = *c;
    ASSERT_TRUE(pump_until([&] { return state() == ReplicaState::evicted; }));
  }
};

TEST_F(ResidencyTest, AHoldGivesTheIdleReplicaBackAndTheLastReleaseRestoresIt) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(2));
  const std::uint64_t weights = 16 * kMiB;  // tiny's, as the fake accounts them
  ASSERT_EQ(ours_on_device(), weights);

  auto cookie = svc_->hold_gpu(admin_, "playing a game", "org.game");
  ASSERT_TRUE(cookie) << describe(cookie);
  EXPECT_EQ(state(), ReplicaState::draining) << "no job on it: freed at once, on the maintenance thread";
  ASSERT_TRUE(pump_until([&] { return state() == ReplicaState::evicted; }));
  EXPECT_EQ(ours_on_device(), 0u) << "the device's reading has the bytes back";
  EXPECT_EQ(sim_->memory()->free_bytes, sim_->memory()->total_bytes) << "the reading: all free";
  EXPECT_TRUE(backend_->evicted("tiny"));
  auto r = gpu_replica();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state, ReplicaState::evicted);
  EXPECT_EQ(r->reason, EvictReason::hold);
  EXPECT_EQ(r->accel_bytes, 0u);
  EXPECT_EQ(svc_->residency().find("tiny")->given_back_bytes, weights);
  EXPECT_EQ(counter("gpu_evictions"), 1u);
  EXPECT_EQ(counter("gpu_bytes_given_back"), weights);
  EXPECT_THAT(str(svc_->model_view("tiny"), "placement"), HasSubstr("[evicted]"));
  // Held, not lost: the service says why it is degraded.
  EXPECT_EQ(svc_->degraded_reason(), "gpu-held");

  // A second hold, then its release: the first still holds, nothing comes back.
  auto second = svc_->hold_gpu(admin_, "a render", "org.render");
  ASSERT_TRUE(second);
  ASSERT_TRUE(svc_->release_gpu(admin_, *second));
  settle();
  EXPECT_EQ(state(), ReplicaState::evicted);
  EXPECT_EQ(backend_->gpu_loads(), 0);

  Dict placement;
  const JobId held = submit_ok(alice_, request("while held"), &placement);
  EXPECT_EQ(str(placement, "route"), "cpu");
  ASSERT_TRUE(wait_terminal(held));

  ASSERT_TRUE(svc_->release_gpu(admin_, *cookie));
  ASSERT_TRUE(pump_until([&] { return state() == ReplicaState::loaded; }));
  EXPECT_EQ(ours_on_device(), weights);
  EXPECT_EQ(gpu_replica()->state, ReplicaState::loaded);
  EXPECT_EQ(gpu_replica()->reason, EvictReason::none);
  EXPECT_EQ(counter("gpu_restores"), 1u);
  EXPECT_EQ(backend_->gpu_loads(), 1);
  Dict p2;
  const JobId back = submit_ok(alice_, request("released"), &p2);
  EXPECT_EQ(str(p2, "route"), "gpu");
  ASSERT_TRUE(wait_terminal(back));
}

TEST_F(ResidencyTest, ARunningJobKeepsTheReplicaUntilItEndsWithinTheDrainTime) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(2, 6));
  const JobId id = submit_ok(alice_, request("long answer", 6));
  ASSERT_TRUE(wait_blocked(id));
  auto cookie = svc_->hold_gpu(admin_, "game", "org.game");
  ASSERT_TRUE(cookie);
  settle();
  EXPECT_EQ(state(), ReplicaState::draining);
  EXPECT_EQ(gpu_replica()->state, ReplicaState::draining);
  EXPECT_EQ(gpu_replica()->reason, EvictReason::hold);
  EXPECT_EQ(ours_on_device(), 16 * kMiB) << "not freed under a running job";
  // New work goes to the CPU while it drains.
  backend_->set_scripter(by_route(block_at(2, 6), emit(2)));
  Dict placement;
  const JobId other = submit_ok(alice_, request("meanwhile"), &placement);
  EXPECT_EQ(str(placement, "route"), "cpu");
  ASSERT_TRUE(wait_terminal(other));

  backend_->release(id);
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(phase(id), "completed");
  EXPECT_EQ(backend_->runs_of(id).size(), 1u) << "it finished where it ran";
  ASSERT_TRUE(pump_until([&] { return state() == ReplicaState::evicted; }, /*tick=*/true));
  EXPECT_EQ(ours_on_device(), 0u);
  EXPECT_EQ(counter("gpu_drain_preemptions"), 0u);
  ASSERT_TRUE(svc_->release_gpu(admin_, *cookie));
}

TEST_F(ResidencyTest, PastTheDrainTimeARunningJobMovesToTheCpuWithTheSameTokens) {
  ASSERT_NO_FATAL_FAILURE(start());
  // The GPU run stops after 3 tokens until told; the CPU run goes on from the checkpoint.
  backend_->set_scripter(by_route(block_at(3, 10), emit(10)));
  const JobId id = submit_ok(alice_, request("a long story", 10));
  ASSERT_TRUE(wait_blocked(id));
  ASSERT_TRUE(svc_->hold_gpu(admin_, "game", "org.game"));
  clock_->advance(500ms);
  svc_->tick();
  EXPECT_EQ(state(), ReplicaState::draining) << "within the drain time";
  clock_->advance(600ms);
  ASSERT_TRUE(wait_terminal(id, /*tick=*/true));
  EXPECT_EQ(phase(id), "completed");
  const auto runs = backend_->runs_of(id);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].route.device, policy::Device::gpu);
  EXPECT_EQ(runs[1].route.device, policy::Device::cpu);
  EXPECT_EQ(runs[1].resume_tokens.size(), 3u) << "continued at the checkpoint";
  EXPECT_EQ(rec_.streamed_tokens(id), FakeBackend::tokens_of(kSeed, 0, 10)) << "as an uninterrupted run";
  EXPECT_EQ(rec_.count(id, "migrated"), 1);
  EXPECT_EQ(counter("gpu_drain_preemptions"), 1u);
  EXPECT_EQ(counter("gpu_evict_moves"), 1u);
  EXPECT_EQ(counter("retries") + counter("migrations"), 1u);
  ASSERT_TRUE(pump_until([&] { return state() == ReplicaState::evicted; }, /*tick=*/true));
  EXPECT_EQ(ours_on_device(), 0u);
  // The breaker was not fed: the device did nothing wrong.
  EXPECT_EQ(svc_->breaker_state(), "closed");
}

TEST_F(ResidencyTest, AUserCancelDuringTheDrainIsACancelNotAMove) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(1, 8));
  const JobId id = submit_ok(alice_, request("x", 8));
  ASSERT_TRUE(wait_blocked(id));
  ASSERT_TRUE(svc_->hold_gpu(admin_, "game", "org.game"));
  clock_->advance(2s);
  svc_->tick();  // preempted: the cancel flag is up
  ASSERT_TRUE(svc_->cancel(alice_, id));
  ASSERT_TRUE(wait_terminal(id, true));
  EXPECT_EQ(phase(id), "cancelled");
  EXPECT_EQ(backend_->runs_of(id).size(), 1u);
}

TEST_F(ResidencyTest, ReleasedBeforeTheFreeTheReplicaStays) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(1, 4));
  const JobId id = submit_ok(alice_, request("x", 4));
  ASSERT_TRUE(wait_blocked(id));
  auto cookie = svc_->hold_gpu(admin_, "game", "org.game");
  ASSERT_TRUE(cookie);
  EXPECT_EQ(state(), ReplicaState::draining);
  ASSERT_TRUE(svc_->release_gpu(admin_, *cookie));
  EXPECT_EQ(state(), ReplicaState::loaded);
  backend_->release(id);
  ASSERT_TRUE(wait_terminal(id, true));
  settle();
  EXPECT_EQ(backend_->evictions(), 0);
  EXPECT_EQ(backend_->gpu_loads(), 0);
  EXPECT_EQ(ours_on_device(), 16 * kMiB);
}

TEST_F(ResidencyTest, AFailedRestoreLeavesTheCpuServingAndSaysWhy) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(2));
  std::string cookie;
  ASSERT_NO_FATAL_FAILURE(hold_until_evicted(cookie));
  backend_->set_load(Errc::out_of_memory);
  ASSERT_TRUE(svc_->release_gpu(admin_, cookie));
  ASSERT_TRUE(pump_until([&] { return state() == ReplicaState::failed; }));
  EXPECT_EQ(counter("gpu_restore_failures"), 1u);
  EXPECT_THAT(svc_->residency().find("tiny")->error, HasSubstr("injected load failure"));
  Dict placement;
  const JobId id = submit_ok(alice_, request("after"), &placement);
  EXPECT_EQ(str(placement, "route"), "cpu");
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(phase(id), "completed");
}

TEST_F(ResidencyTest, WithoutEvictOnHoldAHoldOnlyRoutesNewWork) {
  cfg_.device.evict_on_hold = false;
  ASSERT_NO_FATAL_FAILURE(start());
  auto cookie = svc_->hold_gpu(admin_, "game", "org.game");
  ASSERT_TRUE(cookie);
  settle();
  EXPECT_EQ(state(), ReplicaState::loaded);
  EXPECT_EQ(ours_on_device(), 16 * kMiB);
  EXPECT_EQ(backend_->evictions(), 0);
  ASSERT_TRUE(svc_->release_gpu(admin_, *cookie));
}

TEST_F(ResidencyTest, AnEvictedReplicaIsNotReloadedByADeviceRecovery) {
  ASSERT_NO_FATAL_FAILURE(start());
  std::string cookie;
  ASSERT_NO_FATAL_FAILURE(hold_until_evicted(cookie));
  ASSERT_TRUE(svc_->testing_lose_device());
  ASSERT_TRUE(svc_->testing_recover_device());
  clock_->advance(120s);
  ASSERT_TRUE(pump_until([&] { return svc_->breaker_state() == "closed" && backend_->reloads() > 0; }, true));
  settle();
  EXPECT_TRUE(backend_->evicted("tiny")) << "still given back while held";
  EXPECT_EQ(state(), ReplicaState::evicted);
  ASSERT_TRUE(svc_->release_gpu(admin_, cookie));
  ASSERT_TRUE(pump_until([&] { return state() == ReplicaState::loaded; }, true));
}

// Restore fast, and let the job decide (docs/residency.md): while the replica loads back, a job that the GPU would
// finish sooner after the load waits for it in the GPU queue; a short one starts on the CPU now. Both are told.
TEST_F(ResidencyTest, WhileTheReplicaLoadsALongJobWaitsForItAndAShortOneStartsOnTheCpu) {
  cfg_.policy.gpu_rates.prior_prefill_tps = 2000;
  cfg_.policy.gpu_rates.prior_decode_tps = 40;
  cfg_.policy.cpu_rates.prior_prefill_tps = 500;
  cfg_.policy.cpu_rates.prior_decode_tps = 5;
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(16));
  backend_->set_load(std::nullopt, 400ms);
  // A first give-back and restore measures the load.
  std::string c1;
  ASSERT_NO_FATAL_FAILURE(hold_until_evicted(c1));
  ASSERT_TRUE(svc_->release_gpu(admin_, c1));
  ASSERT_TRUE(pump_until([&] { return state() == ReplicaState::loaded; }));
  EXPECT_GE(svc_->residency().find("tiny")->last_load, 400ms);

  std::string c2;
  ASSERT_NO_FATAL_FAILURE(hold_until_evicted(c2, "game again"));
  ASSERT_TRUE(svc_->release_gpu(admin_, c2));
  ASSERT_EQ(state(), ReplicaState::loading);
  // The CPU run holds until the GPU job is done: its measured (fake, instant) rate must not re-plan the waiting job.
  backend_->set_scripter(by_route(emit(16), block_at(0, 1)));
  // 1 token: ~0.2 s on the CPU now beats ~0.4 s of load + the GPU run.
  Dict p_short;
  const JobId short_job = submit_ok(alice_, request("hi", 1), &p_short);
  EXPECT_EQ(str(p_short, "route"), "cpu");
  EXPECT_THAT(str(p_short, "detail"), HasSubstr("cpu_sooner"));
  // 16 tokens: ~3.2 s on the CPU; the GPU after its load is sooner: it waits, and says for what.
  Dict p_long;
  const JobId long_job = submit_ok(alice_, request("a longer answer", 16), &p_long);
  EXPECT_EQ(str(p_long, "action"), "delay");
  EXPECT_EQ(str(p_long, "reason"), "waiting_for_replica");
  EXPECT_EQ(str(p_long, "route"), "gpu");
  ASSERT_TRUE(wait_terminal(long_job));
  backend_->release(short_job);
  ASSERT_TRUE(wait_terminal(short_job));
  EXPECT_EQ(phase(long_job), "completed");
  EXPECT_EQ(state(), ReplicaState::loaded);
  ASSERT_EQ(backend_->runs_of(long_job).size(), 1u);
  EXPECT_EQ(backend_->runs_of(long_job)[0].route.device, policy::Device::gpu);
  EXPECT_EQ(backend_->runs_of(short_job)[0].route.device, policy::Device::cpu);
}

// LoadModel / UnloadModel: admin only, typed errors, a replica unloaded on request stays out across holds.
TEST_F(ResidencyTest, UnloadAndLoadModelOnRequest) {
  ASSERT_NO_FATAL_FAILURE(start());
  struct Case {
    const char* what;
    const Caller* who;
    const char* model;
    const char* device;
    Errc code;
  };
  const std::vector<Case> bad = {
      {"not an admin", &alice_, "tiny", "gpu", Errc::permission_denied},
      {"unknown model", &admin_, "nope", "gpu", Errc::not_found},
      {"unknown device", &admin_, "tiny", "tpu", Errc::invalid_argument},
      {"the CPU replica stays", &admin_, "tiny", "cpu", Errc::unsupported},
      {"a model without a GPU replica", &admin_, "small", "gpu", Errc::unsupported},
  };
  for (const auto& c : bad) {
    SCOPED_TRACE(c.what);
    for (bool unload : {true, false}) {
      auto r = unload ? svc_->unload_model(*c.who, c.model, c.device) : svc_->load_model(*c.who, c.model, c.device);
      ASSERT_FALSE(r);
      EXPECT_EQ(r.error().code, c.code) << r.error().message;
    }
  }
  auto loaded_again = svc_->load_model(admin_, "tiny", "gpu");
  ASSERT_FALSE(loaded_again);
  EXPECT_EQ(loaded_again.error().code, Errc::illegal_transition);

  auto r = svc_->unload_model(admin_, "tiny", "gpu");
  ASSERT_TRUE(r) << describe(r);
  EXPECT_EQ(str(*r, "state"), "draining");
  EXPECT_EQ(str(*r, "reason"), "request");
  ASSERT_TRUE(pump_until([&] { return state() == ReplicaState::evicted; }));
  EXPECT_EQ(ours_on_device(), 0u);
  EXPECT_EQ(gpu_replica()->reason, EvictReason::request);
  auto twice = svc_->unload_model(admin_, "tiny", "gpu");
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.error().code, Errc::illegal_transition);
  EXPECT_THAT(twice.error().message, HasSubstr("evicted"));

  // A hold and its release do not bring back what was unloaded on request; LoadModel under a hold is refused.
  auto cookie = svc_->hold_gpu(admin_, "game", "org.game");
  ASSERT_TRUE(cookie);
  auto held = svc_->load_model(admin_, "tiny", "gpu");
  ASSERT_FALSE(held);
  EXPECT_EQ(held.error().code, Errc::illegal_transition);
  EXPECT_THAT(held.error().message, HasSubstr("org.game"));
  ASSERT_TRUE(svc_->release_gpu(admin_, *cookie));
  settle();
  EXPECT_EQ(state(), ReplicaState::evicted);
  EXPECT_EQ(backend_->gpu_loads(), 0);

  auto l = svc_->load_model(admin_, "tiny", "gpu");
  ASSERT_TRUE(l) << describe(l);
  EXPECT_EQ(str(*l, "state"), "loading");
  ASSERT_TRUE(pump_until([&] { return state() == ReplicaState::loaded; }));
  EXPECT_EQ(ours_on_device(), 16 * kMiB);
  Dict again;
  const JobId id = submit_ok(alice_, request("back"), &again);
  EXPECT_EQ(str(again, "route"), "gpu");
  ASSERT_TRUE(wait_terminal(id));
}

// keep_alive_s: 0 gives the replica back after each job; the next job wakes it (and waits for it or starts on the
// CPU); N gives it back after N seconds without a job; -1 (the default) never.
TEST_F(ResidencyTest, KeepAliveGivesAnIdleReplicaBackAndTheNextJobBringsItBack) {
  cfg_.models[0].keep_alive_s = 0;
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(2));
  const JobId a = submit_ok(alice_, request("first"));
  ASSERT_TRUE(wait_terminal(a));
  EXPECT_EQ(backend_->runs_of(a).at(0).route.device, policy::Device::gpu);
  ASSERT_TRUE(pump_until([&] { return state() == ReplicaState::evicted; }));
  EXPECT_EQ(gpu_replica()->reason, EvictReason::idle);
  EXPECT_EQ(ours_on_device(), 0u);
  // The next job starts its load; with unknown rates it waits for it and runs on the GPU.
  Dict placement;
  const JobId b = submit_ok(alice_, request("second"), &placement);
  EXPECT_NE(state(), ReplicaState::evicted);
  ASSERT_TRUE(wait_terminal(b));
  EXPECT_EQ(phase(b), "completed");
  EXPECT_EQ(backend_->gpu_loads(), 1);
  // Plan does not wake it.
  ASSERT_TRUE(pump_until([&] { return state() == ReplicaState::evicted; }));
  ASSERT_TRUE(svc_->plan(alice_, request("just asking")));
  settle();
  EXPECT_EQ(state(), ReplicaState::evicted);
}

TEST_F(ResidencyTest, KeepAliveSecondsCountFromTheLastJob) {
  cfg_.models[0].keep_alive_s = 60;
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(2));
  clock_->advance(59s);
  svc_->tick();
  EXPECT_EQ(state(), ReplicaState::loaded);
  const JobId a = submit_ok(alice_, request("keeps it warm"));
  ASSERT_TRUE(wait_terminal(a));
  clock_->advance(59s);
  svc_->tick();
  EXPECT_EQ(state(), ReplicaState::loaded) << "59 s after the last job";
  clock_->advance(2s);
  ASSERT_TRUE(pump_until([&] { return state() == ReplicaState::evicted; }, /*tick=*/true));
  EXPECT_EQ(gpu_replica()->reason, EvictReason::idle);
}

TEST_F(ResidencyTest, WithoutKeepAliveAnIdleReplicaStays) {
  ASSERT_NO_FATAL_FAILURE(start());
  clock_->advance(std::chrono::hours(24 * 30));
  svc_->tick();
  settle();
  EXPECT_EQ(state(), ReplicaState::loaded);
  EXPECT_EQ(backend_->evictions(), 0);
}

// A job that cannot move (allow_cpu = false) is not stopped by the drain: it finishes on the GPU, then the replica
// is freed. A voluntary eviction never fails a job.
TEST_F(ResidencyTest, AJobThatCannotMoveFinishesOnTheGpuPastTheDrainTime) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(2, 6));
  SubmitRequest req = request("gpu only", 6);
  req.options.allow_cpu = false;
  const JobId id = submit_ok(alice_, req);
  ASSERT_TRUE(wait_blocked(id));
  ASSERT_TRUE(svc_->hold_gpu(admin_, "game", "org.game"));
  clock_->advance(5s);
  svc_->tick();
  settle();
  EXPECT_EQ(state(), ReplicaState::draining);
  EXPECT_FALSE(terminal(id)) << "not stopped";
  backend_->release(id);
  ASSERT_TRUE(wait_terminal(id, true));
  EXPECT_EQ(phase(id), "completed");
  EXPECT_EQ(backend_->runs_of(id).size(), 1u);
  ASSERT_TRUE(pump_until([&] { return state() == ReplicaState::evicted; }, true));
}

// A hold that comes while the replica loads back: it is given back as soon as the load ends.
TEST_F(ResidencyTest, AHoldDuringALoadGivesTheReplicaBackOnceLoaded) {
  ASSERT_NO_FATAL_FAILURE(start());
  std::string c1;
  ASSERT_NO_FATAL_FAILURE(hold_until_evicted(c1));
  backend_->set_load(std::nullopt, 200ms);
  ASSERT_TRUE(svc_->release_gpu(admin_, c1));
  ASSERT_EQ(state(), ReplicaState::loading);
  auto c2 = svc_->hold_gpu(admin_, "game again", "org.game");
  ASSERT_TRUE(c2);
  ASSERT_TRUE(pump_until([&] { return state() == ReplicaState::evicted && backend_->gpu_loads() == 1; }));
  EXPECT_EQ(ours_on_device(), 0u) << "nothing stays on the GPU under the hold";
  EXPECT_EQ(gpu_replica()->reason, EvictReason::hold);
  ASSERT_TRUE(svc_->release_gpu(admin_, *c2));
  ASSERT_TRUE(pump_until([&] { return state() == ReplicaState::loaded; }));
}

// A hold released while the device is lost: the replica comes back when the device does.
TEST_F(ResidencyTest, AHoldReleasedWhileTheDeviceIsLostRestoresAfterTheRecovery) {
  ASSERT_NO_FATAL_FAILURE(start());
  std::string cookie;
  ASSERT_NO_FATAL_FAILURE(hold_until_evicted(cookie));
  ASSERT_TRUE(svc_->testing_lose_device());
  ASSERT_TRUE(svc_->release_gpu(admin_, cookie));
  settle();
  EXPECT_EQ(state(), ReplicaState::evicted) << "no load onto a lost device";
  EXPECT_EQ(backend_->gpu_loads(), 0);
  ASSERT_TRUE(svc_->testing_recover_device());
  clock_->advance(120s);
  ASSERT_TRUE(pump_until([&] { return state() == ReplicaState::loaded; }, true));
  EXPECT_EQ(backend_->gpu_loads(), 1);
}

// Foreign pressure (docs/residency.md): an 8 GiB device with three GPU replicas — the chat model "tiny" (2 GiB), image
// search "emb" (1 GiB) and transcription "asr" (1 GiB) — while another program's usage grows.
class PressureTest : public ResidencyTest {
 protected:
  PressureTest() {
    backend_->add_embedding_model();
    backend_->add_speech_model();
    for (const char* m : {"emb", "asr"}) {
      ModelConfig mc;
      mc.name = m;
      mc.dir = std::string("/nonexistent/") + m;
      cfg_.models.push_back(mc);
    }
    backend_->set_weight_bytes("tiny", 2 * kGiB);
    backend_->set_weight_bytes("emb", 1 * kGiB);
    backend_->set_weight_bytes("asr", 1 * kGiB);
    EXPECT_TRUE(backend_->place_on_device());
    cfg_.device.recover_after = std::chrono::milliseconds(10000);
  }
  ReplicaState state_of(const std::string& m) { return svc_->residency().find(m)->state; }
  // A transcription on "asr" (its replica is then the most recently used).
  void use_asr() {
    TranscribeRequest r;
    r.model = "asr";
    r.audio = std::make_shared<const std::vector<std::uint8_t>>(square_wav(10, 1000, 1));
    r.audio_name = "audio_fd[0]";
    auto p = svc_->transcribe(alice_, r);
    ASSERT_TRUE(p) << describe(p);
    ASSERT_TRUE(wait_terminal(u64(*p, "job_id")));
  }
  void foreign(std::uint64_t bytes) { ASSERT_TRUE(svc_->testing_foreign_load(bytes)); }
};

TEST_F(PressureTest, GrowingForeignLoadEvictsTheLeastRecentlyUsedIdleReplicaAndTheJobStaysOnTheGpu) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(2));
  clock_->advance(1s);
  ASSERT_NO_FATAL_FAILURE(use_asr());  // emb is now the least recently used
  // 7 of 8 GiB in use (ours 4, a game's 3): elevated, the job fits, nothing is given back.
  ASSERT_NO_FATAL_FAILURE(foreign(3 * kGiB));
  Dict p1;
  const JobId a = submit_ok(alice_, request("fits"), &p1);
  EXPECT_EQ(str(p1, "route"), "gpu");
  ASSERT_TRUE(wait_terminal(a));
  EXPECT_EQ(counter("gpu_pressure_evictions"), 0u);

  // The game takes 3.4 GiB (92.5 % in use): critical. Instead of the CPU, the idle replica used least recently goes.
  ASSERT_NO_FATAL_FAILURE(foreign(3 * kGiB + 400 * kMiB));
  auto plan = svc_->plan(alice_, request("under pressure"));
  ASSERT_TRUE(plan) << describe(plan);
  EXPECT_EQ(str(*plan, "action"), "evict");
  EXPECT_EQ(counter("gpu_pressure_evictions"), 0u) << "Plan is a dry run: it gives nothing back";
  EXPECT_EQ(state_of("emb"), ReplicaState::loaded);
  Dict p2;
  const JobId b = submit_ok(alice_, request("under pressure"), &p2);
  EXPECT_EQ(str(p2, "route"), "gpu") << str(p2, "detail");
  EXPECT_EQ(str(p2, "action"), "evict");
  EXPECT_EQ(str(p2, "reason"), "evicting_idle");
  EXPECT_THAT(str(p2, "detail"), HasSubstr("emb"));
  ASSERT_TRUE(wait_terminal(b));
  EXPECT_EQ(phase(b), "completed");
  const auto runs = backend_->runs_of(b);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].route.device, policy::Device::gpu) << "nothing went to the CPU that could stay";
  EXPECT_EQ(state_of("emb"), ReplicaState::evicted);
  EXPECT_EQ(svc_->residency().find("emb")->reason, EvictReason::pressure);
  EXPECT_EQ(state_of("asr"), ReplicaState::loaded) << "one eviction was enough";
  EXPECT_EQ(state_of("tiny"), ReplicaState::loaded);
  EXPECT_EQ(counter("gpu_pressure_evictions"), 1u);
  EXPECT_EQ(ours_on_device(), 3 * kGiB);

  // The game leaves: after recover_after of room without a break, the replica comes back.
  ASSERT_NO_FATAL_FAILURE(foreign(0));
  clock_->advance(1s);
  svc_->tick();
  clock_->advance(5s);
  svc_->tick();
  EXPECT_EQ(state_of("emb"), ReplicaState::evicted) << "not before recover_after";
  clock_->advance(6s);
  ASSERT_TRUE(pump_until([&] { return state_of("emb") == ReplicaState::loaded; }, /*tick=*/true));
  EXPECT_EQ(ours_on_device(), 4 * kGiB);
  EXPECT_EQ(counter("gpu_restores"), 1u);
}

TEST_F(PressureTest, WithoutAJobCriticalForeignPressureGivesIdleReplicasBackLowestPriorityFirst) {
  cfg_.models[2].priority = 10;  // emb: kept longer than asr, although asr was used more recently
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(2));
  clock_->advance(1s);
  ASSERT_NO_FATAL_FAILURE(use_asr());
  clock_->advance(1s);
  ASSERT_TRUE(wait_terminal(submit_ok(alice_, request("chat"))));  // tiny: used after asr
  ASSERT_NO_FATAL_FAILURE(foreign(3 * kGiB + 400 * kMiB));
  clock_->advance(1s);
  ASSERT_TRUE(pump_until([&] { return state_of("asr") == ReplicaState::evicted; }, /*tick=*/true));
  EXPECT_EQ(state_of("emb"), ReplicaState::loaded);
  EXPECT_EQ(state_of("tiny"), ReplicaState::loaded);
  EXPECT_EQ(counter("gpu_pressure_evictions"), 1u);
  EXPECT_EQ(sim_->memory()->free_bytes, 8 * kGiB - 3 * kGiB - 3 * kGiB - 400 * kMiB);
}

TEST_F(PressureTest, OscillatingForeignLoadStaysUnderTheEvictionCap) {
  cfg_.device.recover_after = std::chrono::milliseconds(1000);  // would thrash without the cap
  cfg_.device.max_pressure_evictions_per_minute = 2;
  ASSERT_NO_FATAL_FAILURE(start());
  // A game that grabs and frees 3.4 GiB every 3 s, for 3 minutes; the loop ticks every 500 ms.
  std::vector<Clock::time_point> evictions;
  std::uint64_t seen = 0;
  for (int step = 0; step < 360; ++step) {
    if (step % 6 == 0) {
      ASSERT_NO_FATAL_FAILURE(foreign((step / 6) % 2 == 0 ? 3 * kGiB + 400 * kMiB : 0));
    }
    clock_->advance(500ms);
    svc_->tick();
    settle(2ms);
    for (; seen < counter("gpu_pressure_evictions"); ++seen) evictions.push_back(clock_->now());
  }
  ASSERT_GE(evictions.size(), 2u) << "it did give memory back";
  for (std::size_t i = 2; i < evictions.size(); ++i)
    EXPECT_GE(evictions[i] - evictions[i - 2], 60s) << "more than 2 evictions within a minute, at #" << i;
  EXPECT_LE(evictions.size(), 6u) << "at most 2 per minute over 3 minutes";
  EXPECT_EQ(counter("gpu_restore_failures"), 0u);
  std::cout << "[ figure ] oscillating foreign load (3.4 GiB on/off every 3 s, 3 min): " << evictions.size()
            << " evictions, " << counter("gpu_restores") << " restores (cap 2/min, recover_after 1 s)\n";
}

}  // namespace
}  // namespace tandem::daemon
