// The offload rung in the service core: a job that does not fit on the GPU runs its first k layers there and the
// rest on the CPU (Route hybrid, k from the headroom), with its host part held by the host guard; Plan and the
// placement show k, JobUpdate "started" says it is partly on the CPU; the configured ladder order decides whether
// offload comes before route_cpu. Also: the step loops' step reports feed the queues' step-cost model.
#include "service_fixture.h"

namespace tandem::daemon {
namespace {

using namespace tandem::daemon::testing;
using policy::Rung;

SubmitRequest strict(std::string prompt) {
  SubmitRequest r = request(std::move(prompt), 64);
  r.options.allow_reduce = false;
  return r;
}

class OffloadTest : public ServiceTest {
 protected:
  OffloadTest() {
    // A small job on an 8 GiB device: keep pressure out of the way, so the job's own size decides.
    cfg_.policy.ladder.pressure.critical_enter_fraction = 0.0001;
    cfg_.policy.ladder.pressure.critical_exit_fraction = 0.0002;
    cfg_.policy.ladder.pressure.elevated_enter_fraction = 0.0003;
    cfg_.policy.ladder.pressure.elevated_exit_fraction = 0.0004;
  }
  std::string action_at(std::uint64_t foreign) {
    sim_->set_foreign_bytes(foreign);
    svc_->tick();  // a fresh reading
    auto p = svc_->plan(alice_, strict(prompt_));
    EXPECT_TRUE(p) << describe(p);
    return p ? str(*p, "action") : "";
  }
  // Memory taken step by step (as another program grows), on a fresh service: the first foreign load at which the
  // job no longer fits whole, and what the ladder does then. Coarse, then fine from the last coarse load that fit.
  std::pair<std::uint64_t, std::string> first_non_admit() {
    std::uint64_t from = 0;
    for (const std::uint64_t step : {std::uint64_t{64} * kMiB, std::uint64_t{256} << 10}) {
      svc_.reset();
      sim_->set_foreign_bytes(0);
      start();
      for (std::uint64_t f = from; f < 8 * kGiB; f += step) {
        const std::string a = action_at(f);
        if (a != "admit") {
          if (step != (std::uint64_t{256} << 10)) {
            from = f - step;
            break;
          }
          return {f, a};
        }
      }
    }
    ADD_FAILURE() << "the job always fits";
    return {0, ""};
  }
  std::string prompt_ = std::string(400, 'x');  // long enough for its KV to matter
};

TEST_F(OffloadTest, AJobThatDoesNotFitWholeRunsItsLastLayersOnTheCpu) {
  backend_->set_offload(true);
  cfg_.policy.ladder.order = {Rung::admit, Rung::offload, Rung::route_cpu, Rung::reject};
  backend_->set_script(block_at(2, 6));
  const auto [f, action] = first_non_admit();
  if (action != "offload") {
    auto p = svc_->plan(alice_, strict(prompt_));
    ADD_FAILURE() << "at " << f << ": " << (p ? str(*p, "detail") + " / " + str(*p, "reason") : describe(p));
  }
  ASSERT_EQ(action, "offload");
  auto plan = svc_->plan(alice_, strict(prompt_));
  ASSERT_TRUE(plan);
  const std::uint32_t k = u32(*plan, "gpu_layers");
  EXPECT_GE(k, 1u);
  EXPECT_LT(k, 4u);  // the fake model has 4 layers
  EXPECT_EQ(str(*plan, "route"), "hybrid");

  const auto host_before = at<std::uint64_t>(svc_->host_memory_view(), "used");
  Dict placement;
  const JobId id = submit_ok(alice_, strict(prompt_), &placement);
  EXPECT_EQ(str(placement, "action"), "offload");
  EXPECT_EQ(str(placement, "route"), "hybrid");
  EXPECT_EQ(u32(placement, "gpu_layers"), k);
  EXPECT_TRUE(at<bool>(placement, "degraded"));
  ASSERT_TRUE(wait_blocked(id));
  // The run: the GPU replica, hybrid, k layers there.
  const auto runs = backend_->runs();
  ASSERT_FALSE(runs.empty());
  EXPECT_EQ(runs.back().route.device, policy::Device::hybrid);
  EXPECT_EQ(runs.back().route.gpu_layers, k);
  // Its host part is held by the host guard while it runs.
  EXPECT_GT(at<std::uint64_t>(svc_->host_memory_view(), "used"), host_before);
  bool said = false;
  for (const auto& u : rec_.updates)
    if (u.id == id && u.kind == "started") {
      said = true;
      EXPECT_EQ(str(u.data, "route"), "hybrid");
      EXPECT_EQ(u32(u.data, "gpu_layers"), k);
      EXPECT_TRUE(at<bool>(u.data, "partly_on_cpu"));
    }
  EXPECT_TRUE(said) << "no started update";
  backend_->release(id);
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(phase(id), "completed");
  EXPECT_EQ(at<std::uint64_t>(svc_->host_memory_view(), "used"), host_before);
}

TEST_F(OffloadTest, TheLadderOrderDecidesWhetherOffloadComesBeforeTheCpuRoute) {
  backend_->set_offload(true);
  cfg_.policy.ladder.order = {Rung::admit, Rung::offload, Rung::route_cpu, Rung::reject};
  EXPECT_EQ(first_non_admit().second, "offload");
  cfg_.policy.ladder.order = {Rung::admit, Rung::route_cpu, Rung::offload, Rung::reject};
  EXPECT_EQ(first_non_admit().second, "route_cpu");
}

TEST_F(OffloadTest, WithoutAnEngineThatCanSplitThePlanSaysSo) {
  backend_->set_offload(false);
  cfg_.policy.ladder.order = {Rung::admit, Rung::offload, Rung::route_cpu, Rung::reject};
  const auto [f, action] = first_non_admit();
  EXPECT_EQ(action, "route_cpu");
  auto plan = svc_->plan(alice_, strict(prompt_));
  ASSERT_TRUE(plan);
  EXPECT_NE(str(*plan, "detail").find("offload_unsupported"), std::string::npos) << str(*plan, "detail");
}

TEST_F(ServiceTest, StepReportsOfTheStepLoopsFeedTheQueuesStepCosts) {
  ASSERT_NO_FATAL_FAILURE(start());
  ASSERT_TRUE(backend_->step_observer());
  const auto before = svc_->counters();
  for (int i = 0; i < 5; ++i) {
    backend_->step_observer()(StepReport{policy::Device::cpu, 4, 4, 0, std::chrono::milliseconds(20)});
    backend_->step_observer()(StepReport{policy::Device::gpu, 2, 130, 128, std::chrono::milliseconds(9)});
  }
  ASSERT_TRUE(pump_until([&] { return svc_->counters()["cpu_steps"] >= 5 && svc_->counters()["gpu_steps"] >= 5; }));
  EXPECT_EQ(before.count("cpu_steps") ? before.at("cpu_steps") : 0u, 0u);
}

}  // namespace
}  // namespace tandem::daemon
