// The fixture of the service-core tests (test_service*.cc): a Service driven like tandemd drives it — methods on
// the test thread, then the workers' `wake` and process_events()/tick() — over a scripted FakeBackend, a
// SimulatedDevice and a ManualClock, with helpers to read its Dicts and submit. No LibTorch, no D-Bus.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "core/temp_dir.h"
#include "daemon/service.h"
#include "device/simulated.h"
#include "fake_backend.h"

namespace tandem::daemon::testing {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using fake::FakeBackend;
using fake::Script;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::uint64_t kGiB = 1ull << 30;
constexpr std::uint64_t kSeed = 42;

// Scratch space removed with its contents when the test ends.
using TempDir = ::tandem::core::TempDir;

// --- Dict access ---------------------------------------------------------------------------------------------------
template <class T>
T at(const Dict& d, const std::string& key) {
  auto it = d.find(key);
  if (it == d.end()) {
    ADD_FAILURE() << "missing key '" << key << "'";
    return T{};
  }
  if (const T* v = std::get_if<T>(&it->second)) return *v;
  ADD_FAILURE() << "key '" << key << "' holds another type (alternative " << it->second.index() << ")";
  return T{};
}
std::string str(const Dict& d, const std::string& k) { return at<std::string>(d, k); }
std::uint32_t u32(const Dict& d, const std::string& k) { return at<std::uint32_t>(d, k); }
std::uint64_t u64(const Dict& d, const std::string& k) { return at<std::uint64_t>(d, k); }
bool flag(const Dict& d, const std::string& k) { return at<bool>(d, k); }

std::string code(Errc c) { return std::string(errc_name(c)); }

template <class T>
std::string describe(const Result<T>& r) {
  if (r) return "ok";
  return std::string(errc_name(r.error().code)) + ": " + r.error().message;
}

// --- observer ------------------------------------------------------------------------------------------------------
class Recorder final : public ServiceObserver {
 public:
  struct Update {
    std::size_t seq;
    std::string destination;
    JobId id;
    std::string kind;
    Dict data;
  };
  struct Degraded {
    std::size_t seq;
    bool degraded;
    std::string reason;
    Dict details;
  };

  void job_update(const std::string& destination, JobId id, const std::string& kind, const Dict& data) override {
    updates.push_back({seq++, destination, id, kind, data});
  }
  void degraded_changed(bool degraded, const std::string& reason, const Dict& details) override {
    degraded_events.push_back({seq++, degraded, reason, details});
  }
  void properties_changed(const std::vector<std::string>& names) override {
    ++seq;
    properties.push_back(names);
  }
  void models_changed(const std::vector<std::string>& added, const std::vector<std::string>& removed) override {
    ++seq;
    model_changes.push_back({added, removed});
  }

  std::vector<Update> of(JobId id) const {
    std::vector<Update> out;
    for (const auto& u : updates)
      if (u.id == id) out.push_back(u);
    return out;
  }
  std::vector<std::string> kinds(JobId id) const {
    std::vector<std::string> out;
    for (const auto& u : of(id)) out.push_back(u.kind);
    return out;
  }
  int count(JobId id, const std::string& kind) const {
    int n = 0;
    for (const auto& u : of(id)) n += u.kind == kind;
    return n;
  }
  std::string streamed_text(JobId id) const {
    std::string s;
    for (const auto& u : of(id))
      if (u.kind == "tokens") s += str(u.data, "text");
    return s;
  }
  std::vector<std::int32_t> streamed_tokens(JobId id) const {
    std::vector<std::int32_t> v;
    for (const auto& u : of(id))
      if (u.kind == "tokens") {
        auto t = at<std::vector<std::int32_t>>(u.data, "tokens");
        v.insert(v.end(), t.begin(), t.end());
      }
    return v;
  }
  bool property_changed(const std::string& name) const {
    for (const auto& batch : properties)
      for (const auto& n : batch)
        if (n == name) return true;
    return false;
  }

  std::size_t seq = 0;
  std::vector<Update> updates;
  std::vector<Degraded> degraded_events;
  std::vector<std::vector<std::string>> properties;
  std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> model_changes;  // (added, removed)
};

// The daemon's eventfd: workers call wake(); the loop waits for it.
class Waker {
 public:
  void wake() {
    {
      std::lock_guard lock(mu_);
      ++n_;
    }
    cv_.notify_all();
  }
  void wait(std::chrono::milliseconds d) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, d, [&] { return n_ != seen_; });
    seen_ = n_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t n_ = 0, seen_ = 0;
};

DaemonConfig base_config(const std::string& dir) {
  DaemonConfig cfg;
  ModelConfig tiny;
  tiny.name = "tiny";
  tiny.dir = "/nonexistent/tiny";
  tiny.fallback = "small";
  ModelConfig small;
  small.name = "small";
  small.dir = "/nonexistent/small";
  small.gpu = false;
  cfg.models = {tiny, small};
  cfg.device.kind = AccelKind::simulated;
  cfg.journal.dir = dir;
  cfg.journal.fsync = false;
  cfg.runtime.token_flush_interval = std::chrono::milliseconds(0);  // one tokens update per token
  cfg.runtime.max_messages = 8;
  cfg.policy.host_guard.mem_available_reserve = 256 * kMiB;
  return cfg;
}

// The default ladder without the evict rung (tests of what the ladder does when no replica is given back).
std::vector<policy::Rung> ladder_without_evict() {
  using policy::Rung;
  return {Rung::admit, Rung::delay, Rung::reduce, Rung::offload, Rung::route_cpu, Rung::reject};
}

SubmitRequest request(std::string prompt = "hello tandem", std::uint32_t max_tokens = 8) {
  SubmitRequest r;
  r.prompt = std::move(prompt);
  r.options.max_tokens = max_tokens;
  r.options.seed = kSeed;
  return r;
}

// Scripts by route: what a GPU run and a CPU run do.
std::function<Script(const RunSpec&)> by_route(Script gpu, Script cpu) {
  return [gpu, cpu](const RunSpec& s) { return s.route.device == policy::Device::cpu ? cpu : gpu; };
}

Script emit(std::uint32_t n) {
  Script s;
  s.tokens = n;
  return s;
}
Script fail_after(Errc code, std::uint32_t k, std::uint32_t tokens = 100) {
  Script s;
  s.tokens = tokens;
  s.fail = code;
  s.fail_after = k;
  return s;
}
Script block_at(std::uint32_t k, std::uint32_t tokens = 4) {
  Script s;
  s.tokens = tokens;
  s.block_at = k;
  return s;
}

class ServiceTest : public ::testing::Test {
 protected:
  ServiceTest()
      : clock_(std::make_shared<ManualClock>(ManualClock::time_point{} + 1000s)),
        sim_(std::make_shared<device::SimulatedDevice>(device::SimulatedConfig{"sim0", 8 * kGiB, {}}, clock_)),
        backend_(std::make_shared<FakeBackend>(sim_)),
        cfg_(base_config(dir_.path())) {}

  ~ServiceTest() override {
    backend_->release_all();
    svc_.reset();
  }

  void start() {
    auto s = Service::create(cfg_, backend_, clock_, &rec_, [this] { waker_.wake(); });
    ASSERT_TRUE(s) << describe(s);
    svc_ = std::move(s).value();
    svc_->flush_changes();  // the first call only records
  }
  void restart() {
    svc_.reset();
    ASSERT_NO_FATAL_FAILURE(start());
  }

  // One loop iteration after another until `pred` holds: apply worker events, optionally tick, publish changes.
  bool pump_until(const std::function<bool()>& pred, bool tick = false, std::chrono::milliseconds timeout = 10s) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      svc_->process_events();
      if (tick) svc_->tick();
      svc_->flush_changes();
      if (pred()) return true;
      if (std::chrono::steady_clock::now() > end) return false;
      waker_.wait(1ms);
    }
  }
  // Keeps the loop running a little (nothing should happen).
  void settle(std::chrono::milliseconds d = 30ms) {
    const auto end = std::chrono::steady_clock::now() + d;
    pump_until([&] { return std::chrono::steady_clock::now() > end; });
  }

  Dict job(JobId id) {
    auto j = svc_->get_job(admin_, id);
    EXPECT_TRUE(j) << describe(j);
    return j ? *j : Dict{};
  }
  std::string phase(JobId id) {
    auto j = svc_->get_job(admin_, id);
    return j ? str(*j, "state") : "missing";
  }
  bool terminal(JobId id) {
    const auto p = phase(id);
    return p == "completed" || p == "failed" || p == "cancelled";
  }
  bool wait_terminal(JobId id, bool tick = false) { return pump_until([&] { return terminal(id); }, tick); }
  bool wait_blocked(JobId id) { return pump_until([&] { return backend_->is_blocked(id); }); }

  JobId submit_ok(const Caller& c, const SubmitRequest& r, Dict* placement = nullptr) {
    auto p = svc_->submit(c, r);
    EXPECT_TRUE(p) << describe(p);
    if (!p) return 0;
    if (placement) *placement = *p;
    return u64(*p, "job_id");
  }

  std::uint64_t journal_bytes() const { return fs::file_size(fs::path(dir_.path()) / "journal"); }

  const Caller alice_{":1.10", 1000, true, false, ""};
  const Caller alice2_{":1.12", 1000, true, false, ""};  // the same user on another connection
  const Caller bob_{":1.11", 1001, true, false, ""};
  const Caller admin_{":1.2", 0, true, true, ""};

  TempDir dir_;
  std::shared_ptr<ManualClock> clock_;
  std::shared_ptr<device::SimulatedDevice> sim_;
  std::shared_ptr<FakeBackend> backend_;
  DaemonConfig cfg_;
  Recorder rec_;
  Waker waker_;
  std::unique_ptr<Service> svc_;
};

}  // namespace tandem::daemon::testing
