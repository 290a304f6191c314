// The runtime model set through the service (docs/residency.md, "Adding and removing models"): a configuration
// reload adds a model (loaded on a worker, refused with "being loaded" until then, served after), removes one (new
// jobs refused at once, its unfinished jobs finish first, then it is out of the backend and its GPU bytes are back on
// the device), replaces one whose settings changed, retunes keep_alive / priority in place, and reports a model that
// does not load — while the other models keep serving. Over the scripted FakeBackend.
#include "service_fixture.h"

namespace tandem::daemon {
namespace {

using namespace tandem::daemon::testing;

class ModelsTest : public ServiceTest {
 protected:
  ModelsTest() { EXPECT_TRUE(backend_->place_on_device()); }
  // The configuration after a reload: the start's models, then `extra` appended.
  DaemonConfig with(std::vector<ModelConfig> extra, bool keep_tiny = true) {
    DaemonConfig c = cfg_;
    if (!keep_tiny) c.models.erase(c.models.begin());  // nothing names tiny as its fallback
    for (auto& m : extra) c.models.push_back(m);
    return c;
  }
  static ModelConfig model(const std::string& name, const std::string& dir, bool gpu = false) {
    ModelConfig m;
    m.name = name;
    m.dir = dir;
    m.gpu = gpu;
    return m;
  }
  bool served(const std::string& name) {
    for (const auto& m : svc_->list_models())
      if (str(m, "name") == name) return true;
    return false;
  }
  SubmitRequest to(const std::string& model, std::uint32_t max_tokens = 4) {
    auto r = request("hello", max_tokens);
    r.model = model;
    return r;
  }
  std::uint64_t counter(const std::string& k) { return svc_->counters()[k]; }
};

TEST_F(ModelsTest, AReloadAddsAModelThatServesOnceLoaded) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(3));
  backend_->block_prepares(true);
  ASSERT_TRUE(svc_->reload(with({model("extra", "/models/extra")})));
  ASSERT_TRUE(pump_until([&] { return backend_->prepares() == 1; }));
  // Loading: refused with a typed, retryable error; the others serve meanwhile.
  auto early = svc_->submit(alice_, to("extra"));
  ASSERT_FALSE(early);
  EXPECT_EQ(early.error().code, Errc::unavailable);
  EXPECT_THAT(early.error().message, HasSubstr("being loaded"));
  EXPECT_THAT(early.error().message, HasSubstr("retry_after_ms="));
  EXPECT_FALSE(served("extra"));
  EXPECT_FALSE(svc_->idle()) << "the loop keeps its busy pace while a model is being added";
  const JobId other = submit_ok(alice_, to("tiny"));
  ASSERT_TRUE(wait_terminal(other));
  EXPECT_EQ(phase(other), "completed");

  backend_->block_prepares(false);
  ASSERT_TRUE(pump_until([&] { return served("extra"); }));
  EXPECT_EQ(svc_->catalog().find("extra")->presence, ModelPresence::serving);
  ASSERT_EQ(rec_.model_changes.size(), 1u);
  EXPECT_EQ(rec_.model_changes[0].first, std::vector<std::string>{"extra"});
  EXPECT_TRUE(rec_.model_changes[0].second.empty());
  EXPECT_EQ(counter("models_added"), 1u);
  EXPECT_EQ(str(svc_->model_view("extra"), "fingerprint"), "fp-extra-/models/extra");

  const JobId id = submit_ok(alice_, to("extra"));
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(phase(id), "completed");
  EXPECT_EQ(str(job(id), "text"), FakeBackend::text_of(0, 3));
  EXPECT_EQ(backend_->runs_of(id).at(0).route.model, "extra");
  // The same configuration again: nothing is loaded twice.
  ASSERT_TRUE(svc_->reload(with({model("extra", "/models/extra")})));
  settle();
  EXPECT_EQ(backend_->prepares(), 1);
}

TEST_F(ModelsTest, ARemovedModelRefusesNewJobsFinishesItsOwnThenGoes) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(1, 4));
  const JobId running = submit_ok(alice_, to("tiny"));
  ASSERT_TRUE(wait_blocked(running));
  ASSERT_TRUE(svc_->reload(with({}, /*keep_tiny=*/false)));
  auto refused = svc_->submit(alice_, to("tiny"));
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, Errc::not_found);
  EXPECT_THAT(refused.error().message, HasSubstr("being removed"));
  // Its job is not cut short: the model stays in the backend until it ends.
  for (int i = 0; i < 5; ++i) svc_->tick();
  settle();
  EXPECT_TRUE(served("tiny"));
  EXPECT_TRUE(backend_->removed_models().empty());
  EXPECT_EQ(svc_->catalog().find("tiny")->presence, ModelPresence::removing);

  backend_->release_all();
  ASSERT_TRUE(wait_terminal(running, /*tick=*/true));
  EXPECT_EQ(phase(running), "completed");
  EXPECT_EQ(str(job(running), "text"), FakeBackend::text_of(0, 4)) << "every token of the job that was running";
  ASSERT_TRUE(pump_until([&] { return !served("tiny"); }, /*tick=*/true));
  EXPECT_EQ(backend_->removed_models(), std::vector<std::string>{"tiny"});
  EXPECT_EQ(svc_->catalog().find("tiny"), nullptr);
  ASSERT_EQ(rec_.model_changes.size(), 1u);
  EXPECT_EQ(rec_.model_changes[0].second, std::vector<std::string>{"tiny"});
  EXPECT_EQ(counter("models_removed"), 1u);
  EXPECT_EQ(svc_->residency().find("tiny"), nullptr);
  EXPECT_EQ(sim_->accounted_bytes(), 0u) << "its GPU replica's bytes are back on the device";
  auto gone = svc_->submit(alice_, to("tiny"));
  ASSERT_FALSE(gone);
  EXPECT_EQ(gone.error().code, Errc::not_found);
  EXPECT_THAT(gone.error().message, HasSubstr("unknown model"));
  // The job of the removed model stays readable.
  EXPECT_EQ(phase(running), "completed");
}

TEST_F(ModelsTest, RemovingAGpuModelGivesItsBytesBackToTheDevice) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(2));
  const std::uint64_t before = sim_->accounted_bytes();
  ASSERT_TRUE(svc_->reload(with({model("vision", "/models/vision", /*gpu=*/true)})));
  ASSERT_TRUE(pump_until([&] { return served("vision"); }));
  EXPECT_EQ(sim_->accounted_bytes(), before + (4ull << 20));
  ASSERT_NE(svc_->residency().find("vision"), nullptr) << "its GPU replica is tracked like the start's";
  EXPECT_EQ(svc_->residency().find("vision")->state, ReplicaState::loaded);
  const JobId id = submit_ok(alice_, to("vision"));
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_NE(backend_->runs_of(id).at(0).route.device, policy::Device::cpu);

  ASSERT_TRUE(svc_->reload(cfg_));
  ASSERT_TRUE(pump_until([&] { return !served("vision"); }, /*tick=*/true));
  EXPECT_EQ(sim_->accounted_bytes(), before) << "the device's reading has the removed replica's bytes back";
  EXPECT_EQ(svc_->residency().find("vision"), nullptr);
}

TEST_F(ModelsTest, AModelAddedDuringAGpuHoldGivesItsReplicaBack) {
  ASSERT_NO_FATAL_FAILURE(start());
  auto cookie = svc_->hold_gpu(admin_, "game", "org.game");
  ASSERT_TRUE(cookie) << describe(cookie);
  ASSERT_TRUE(svc_->reload(with({model("vision", "/models/vision", /*gpu=*/true)})));
  ASSERT_TRUE(pump_until([&] { return served("vision"); }));
  ASSERT_TRUE(pump_until([&] { return svc_->residency().find("vision")->state == ReplicaState::evicted; }, true));
  EXPECT_EQ(svc_->residency().find("vision")->reason, EvictReason::hold);
  ASSERT_TRUE(svc_->release_gpu(admin_, *cookie));
  ASSERT_TRUE(pump_until([&] { return svc_->residency().find("vision")->state == ReplicaState::loaded; }, true));
}

TEST_F(ModelsTest, ChangedSettingsReplaceTheModelAfterItsJobs) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(1, 3));
  const JobId running = submit_ok(alice_, to("small"));
  ASSERT_TRUE(wait_blocked(running));
  DaemonConfig next = cfg_;
  next.models[1].dir = "/models/small-v2";
  ASSERT_TRUE(svc_->reload(next));
  auto refused = svc_->submit(alice_, to("small"));
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, Errc::unavailable) << "it comes back: retry";
  EXPECT_THAT(refused.error().message, HasSubstr("replaced"));
  settle();
  EXPECT_EQ(backend_->prepares(), 0) << "the old one serves its job first";
  backend_->release_all();
  ASSERT_TRUE(wait_terminal(running, true));
  EXPECT_EQ(phase(running), "completed");
  ASSERT_TRUE(pump_until([&] { return served("small") && backend_->fingerprint_of("small") == "fp-small-/models/small-v2"; },
                         true));
  EXPECT_EQ(counter("models_replaced"), 1u);
  ASSERT_EQ(rec_.model_changes.size(), 2u);
  EXPECT_EQ(rec_.model_changes[0].second, std::vector<std::string>{"small"});
  EXPECT_EQ(rec_.model_changes[1].first, std::vector<std::string>{"small"});
  backend_->set_script(emit(2));
  const JobId id = submit_ok(alice_, to("small"));
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(phase(id), "completed");
}

TEST_F(ModelsTest, KeepAliveAndPriorityApplyWithoutAReload) {
  ASSERT_NO_FATAL_FAILURE(start());
  DaemonConfig next = cfg_;
  next.models[0].keep_alive_s = 60;
  next.models[0].priority = 7;
  ASSERT_TRUE(svc_->reload(next));
  settle();
  EXPECT_EQ(backend_->prepares(), 0);
  EXPECT_TRUE(backend_->removed_models().empty());
  ASSERT_TRUE(svc_->residency().find("tiny")->keep_alive);
  EXPECT_EQ(*svc_->residency().find("tiny")->keep_alive, std::chrono::seconds(60));
  EXPECT_EQ(svc_->residency().find("tiny")->priority, 7);
}

TEST_F(ModelsTest, AModelThatDoesNotLoadIsReportedAndTriedAgainOnTheNextReload) {
  ASSERT_NO_FATAL_FAILURE(start());
  ASSERT_TRUE(svc_->reload(with({model("extra", "/models/broken")})));
  ASSERT_TRUE(pump_until([&] { return svc_->catalog().find("extra")->presence == ModelPresence::failed; }));
  EXPECT_FALSE(served("extra"));
  EXPECT_TRUE(rec_.model_changes.empty());
  EXPECT_EQ(counter("model_add_failures"), 1u);
  auto r = svc_->submit(alice_, to("extra"));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::unavailable);
  EXPECT_THAT(r.error().message, HasSubstr("no config.json"));
  EXPECT_TRUE(svc_->idle()) << "a failed model is not a change in progress";
  // Fixed in the configuration: loaded on the next reload.
  ASSERT_TRUE(svc_->reload(with({model("extra", "/models/extra")})));
  ASSERT_TRUE(pump_until([&] { return served("extra"); }));
  EXPECT_EQ(backend_->prepares(), 2);
}

TEST_F(ModelsTest, AModelTakenOutWhileItLoadsIsDropped) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->block_prepares(true);
  ASSERT_TRUE(svc_->reload(with({model("extra", "/models/extra")})));
  ASSERT_TRUE(pump_until([&] { return backend_->prepares() == 1; }));
  ASSERT_TRUE(svc_->reload(cfg_));
  backend_->block_prepares(false);
  ASSERT_TRUE(pump_until([&] { return svc_->catalog().find("extra") == nullptr; }));
  settle();
  EXPECT_FALSE(served("extra"));
  EXPECT_TRUE(rec_.model_changes.empty());
  EXPECT_EQ(counter("models_added"), 0u);
}

}  // namespace
}  // namespace tandem::daemon
