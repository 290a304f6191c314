// The fixture of the ring-hub tests (test_ring_hub*.cc): a real Service over the scripted FakeBackend, a RingHub,
// ring::RingClient peers in this process, and a loop driven the way tandemd drives it. No D-Bus, no LibTorch.
#pragma once

#include "core/temp_dir.h"
#include "daemon/ring_hub.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/service.h"
#include "device/simulated.h"
#include "fake_backend.h"
#include "ring/client_ring.h"
#include "ring/layout.h"
#include "ring/record.h"

namespace tandem::daemon::ring_testing {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using fake::FakeBackend;
using fake::Script;
using ring::Fault;
using ring::Kind;
using ring::SessionState;
using ::testing::HasSubstr;

constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::uint64_t kGiB = 1ull << 30;
constexpr std::uint64_t kSeed = 42;

// Scratch space removed with its contents when the test ends.
using TempDir = ::tandem::core::TempDir;

template <class T>
std::string describe(const Result<T>& r) {
  if (r) return "ok";
  return std::string(errc_name(r.error().code)) + ": " + r.error().message;
}

// --- records -------------------------------------------------------------------------------------------------------
ring::ParsedRecord parse(const ring::Event& e) { return ring::parse_record(e.data); }
template <class T>
T field(const ring::ParsedRecord& r, std::string_view key) {
  const ring::Field* f = r.find(key);
  if (!f) {
    ADD_FAILURE() << "record has no field '" << key << "'";
    return T{};
  }
  if (const T* v = std::get_if<T>(&f->value)) return *v;
  ADD_FAILURE() << "record field '" << key << "' is a " << ring::field_type_name(f->value);
  return T{};
}
std::string rstr(const ring::Event& e, std::string_view k) { return field<std::string>(parse(e), k); }
std::uint64_t ru64(const ring::Event& e, std::string_view k) { return field<std::uint64_t>(parse(e), k); }
bool rbool(const ring::Event& e, std::string_view k) { return field<bool>(parse(e), k); }

std::vector<std::uint8_t> submit_record(const std::string& prompt, std::uint64_t max_tokens,
                                        const std::string& key = "") {
  ring::RecordWriter w;
  w.add("model", "tiny").add("prompt", std::string_view(prompt)).add("max_tokens", max_tokens).add("seed", kSeed);
  if (!key.empty()) w.add("idempotency_key", std::string_view(key));
  return w.take();
}

// Token batch payload: count ids, then text.
std::vector<std::int32_t> token_ids(const ring::Event& e) {
  std::vector<std::int32_t> v(e.entry.count);
  if (e.data.size() >= v.size() * 4) std::memcpy(v.data(), e.data.data(), v.size() * 4);
  return v;
}
std::string token_text(const ring::Event& e) {
  const std::size_t off = std::size_t{e.entry.count} * 4;
  if (e.data.size() < off) return {};
  return std::string(reinterpret_cast<const char*>(e.data.data() + off), e.data.size() - off);
}

std::string kind_name(const ring::Event& e) { return std::string(ring::kind_name(e.kind())); }

// --- the loop's observer: ring destinations go to the hub, the rest is recorded ----------------------------------
class Forwarder final : public ServiceObserver {
 public:
  void job_update(const std::string& destination, JobId id, const std::string& kind, const Dict& data) override {
    if (RingHub::is_ring_destination(destination)) {
      if (hub) hub->job_update(destination, id, kind, data);
    } else {
      bus_updates.push_back(destination + " " + std::to_string(id) + " " + kind);
    }
  }
  void degraded_changed(bool degraded, const std::string& reason, const Dict& details) override {
    if (hub) hub->degraded_changed(degraded, reason, details);  // as DbusServer forwards it
  }
  void properties_changed(const std::vector<std::string>&) override {}

  RingHub* hub = nullptr;
  std::vector<std::string> bus_updates;
};

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

Script emit(std::uint32_t n) {
  Script s;
  s.tokens = n;
  return s;
}
Script block_at(std::uint32_t k, std::uint32_t tokens) {
  Script s;
  s.tokens = tokens;
  s.block_at = k;
  return s;
}

// One client of a session: the RingClient over the fds open() returned, plus a second mapping of the memfd for
// hand-written entries and for reading the control blocks.
struct Peer {
  std::uint64_t id = 0;
  Dict layout;
  std::unique_ptr<ring::RingClient> client;
  ring::View raw;
  bool reading = true;              // the pump reaps this peer's completions
  std::vector<ring::Event> events;  // everything reaped so far, in order

  ~Peer() {
    if (raw.base) ::munmap(raw.base, raw.layout.total_size);
  }
  ring::SqControl* sq() const { return raw.sq(); }
  ring::CqControl* cq() const { return raw.cq(); }
  SessionState state() const { return static_cast<SessionState>(ring::load_acquire(&sq()->state)); }
  Fault fault() const { return static_cast<Fault>(ring::load_acquire(&sq()->fault)); }
  std::uint32_t cq_tail() const { return ring::load_acquire(&cq()->tail); }

  // Hand-written submission i (the test owns the SQ tail when it uses these; never mixed with client->submit()).
  void put(std::uint32_t index, const ring::SubmissionEntry& e) const {
    std::memcpy(raw.sqes() + (index & (raw.layout.sq_entries - 1)), &e, sizeof e);
  }
  void put_data(std::uint64_t offset, const std::vector<std::uint8_t>& bytes) const {
    std::memcpy(raw.request_data() + offset, bytes.data(), bytes.size());
  }
  void set_tail(std::uint32_t t) const { ring::store_release(&sq()->tail, t); }

  std::vector<ring::Event> of_user(std::uint64_t ud) const {
    std::vector<ring::Event> out;
    for (const auto& e : events)
      if (e.entry.user_data == ud) out.push_back(e);
    return out;
  }
  std::vector<ring::Event> of_job(std::uint64_t job) const {
    std::vector<ring::Event> out;
    for (const auto& e : events)
      if (e.entry.job_id == job) out.push_back(e);
    return out;
  }
  const ring::Event* find(Kind k, std::uint64_t ud) const {
    for (const auto& e : events)
      if (e.kind() == k && e.entry.user_data == ud) return &e;
    return nullptr;
  }
  std::string kinds_of_job(std::uint64_t job) const {
    std::string s;
    for (const auto& e : of_job(job)) s += (s.empty() ? "" : ",") + kind_name(e);
    return s;
  }
};

ring::SubmissionEntry entry(ring::Opcode op, std::uint64_t user_data) {
  ring::SubmissionEntry e{};
  e.opcode = static_cast<std::uint8_t>(op);
  e.user_data = user_data;
  return e;
}

class RingHubTest : public ::testing::Test {
 protected:
  RingHubTest()
      : clock_(std::make_shared<ManualClock>(ManualClock::time_point{} + 1000s)),
        sim_(std::make_shared<device::SimulatedDevice>(device::SimulatedConfig{"sim0", 8 * kGiB, {}}, clock_)),
        backend_(std::make_shared<FakeBackend>(sim_)),
        cfg_(base_config(dir_.path())) {
    log_sink_ = std::make_shared<spdlog::sinks::ostream_sink_mt>(log_);
    auto logger = std::make_shared<spdlog::logger>("ring-hub-test", log_sink_);
    logger->set_level(spdlog::level::debug);
    previous_logger_ = spdlog::default_logger();
    spdlog::set_default_logger(logger);
  }

  ~RingHubTest() override {
    backend_->release_all();
    peers_.clear();
    hub_.reset();
    svc_.reset();
    spdlog::set_default_logger(previous_logger_);
  }

  void start(RingConfig rc = {}) {
    auto s = Service::create(cfg_, backend_, clock_, &fwd_, [this] { waker_.wake(); });
    ASSERT_TRUE(s) << describe(s);
    svc_ = std::move(s).value();
    svc_->set_group_commit(true);  // as tandemd runs it: pass() commits once per loop iteration
    svc_->flush_changes();
    ring_cfg_ = rc;
    hub_ = std::make_unique<RingHub>(svc_.get(), rc);
    fwd_.hub = hub_.get();
  }

  // Opens a session for `c` and attaches a client (fails the test when open() fails).
  Peer* open(const Caller& c, const Dict& options = {}) {
    auto r = hub_->open(c, options);
    EXPECT_TRUE(r) << "RingHub::open for " << c.bus_name << ": want a session, got " << describe(r);
    if (!r) return nullptr;
    auto p = std::make_unique<Peer>();
    p->id = r->session_id;
    p->layout = r->layout;
    const int memfd_copy = ::fcntl(r->fds.memfd, F_DUPFD_CLOEXEC, 0);
    EXPECT_GE(memfd_copy, 0);
    struct stat st{};
    EXPECT_EQ(::fstat(memfd_copy, &st), 0);
    void* base = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, memfd_copy, 0);
    ::close(memfd_copy);
    EXPECT_NE(base, MAP_FAILED);
    if (base == MAP_FAILED) return nullptr;
    auto l = ring::read_header(base, static_cast<std::size_t>(st.st_size));
    EXPECT_TRUE(l) << describe(l);
    p->raw = ring::View{static_cast<std::uint8_t*>(base), l ? *l : ring::Layout{}};
    p->raw.layout.total_size = static_cast<std::uint64_t>(st.st_size);
    auto cl = ring::RingClient::attach(r->fds.memfd, r->fds.sq_doorbell_write, r->fds.cq_doorbell_read);
    EXPECT_TRUE(cl) << describe(cl);
    if (!cl) return nullptr;
    p->client = std::move(cl).value();
    peers_.push_back(std::move(p));
    return peers_.back().get();
  }

  // One pass of tandemd's loop (with its one group commit), then the readers reap.
  void pass() {
    svc_->process_events();
    svc_->flush_changes();
    if (hub_) hub_->process();
    (void)svc_->commit();
    for (auto& p : peers_) {
      if (!p->reading) continue;
      auto n = p->client->reap(p->events);
      EXPECT_TRUE(n) << "reap on session " << p->id << ": " << describe(n);
    }
  }
  bool pump_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 10s) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      pass();
      if (pred()) return true;
      if (std::chrono::steady_clock::now() > end) return false;
      waker_.wait(1ms);
    }
  }

  std::string phase(JobId id) {
    auto j = svc_->get_job(admin_, id);
    return j ? std::get<std::string>(j->at("state")) : "missing";
  }
  bool terminal(JobId id) {
    const auto p = phase(id);
    return p == "completed" || p == "failed" || p == "cancelled";
  }
  std::uint64_t counter(const std::string& name) const {
    const auto c = hub_->counters();
    const auto it = c.find(name);
    return it == c.end() ? 0 : it->second;
  }
  // Waits for the submit of `ud` to be answered; returns the job id (0 when it was an error or nothing came).
  JobId wait_accepted(Peer& p, std::uint64_t ud) {
    const bool got = pump_until([&] { return p.find(Kind::accepted, ud) || p.find(Kind::error, ud); });
    EXPECT_TRUE(got) << "no accepted/error for user_data " << ud << " on session " << p.id;
    if (const auto* e = p.find(Kind::accepted, ud)) return e->entry.job_id;
    if (const auto* e = p.find(Kind::error, ud))
      ADD_FAILURE() << "submit " << ud << " answered with error " << rstr(*e, "error") << ": " << rstr(*e, "message");
    return 0;
  }
  bool wait_finished(Peer& p, JobId job) {
    return pump_until([&] {
      for (const auto& e : p.events)
        if (e.entry.job_id == job && e.kind() == Kind::finished) return true;
      return false;
    });
  }
  // nop round trip: the session serves.
  bool nop_round_trip(Peer& p, std::uint64_t ud) {
    auto s = p.client->nop(ud);
    if (!s) {
      ADD_FAILURE() << "nop on session " << p.id << ": " << describe(s);
      return false;
    }
    return pump_until([&] { return p.find(Kind::nop, ud) != nullptr; }, 5s);
  }

  const Caller alice_{":1.10", 1000, true, false, ""};
  const Caller alice2_{":1.12", 1000, true, false, ""};  // the same user on another connection
  const Caller bob_{":1.11", 1001, true, false, ""};
  const Caller carol_{":1.13", 1003, true, false, ""};
  const Caller mallory_{":1.14", 1004, false, false, ""};  // may not submit
  const Caller admin_{":1.2", 0, true, true, ""};

  TempDir dir_;
  std::shared_ptr<ManualClock> clock_;
  std::shared_ptr<device::SimulatedDevice> sim_;
  std::shared_ptr<FakeBackend> backend_;
  DaemonConfig cfg_;
  Forwarder fwd_;
  Waker waker_;
  std::unique_ptr<Service> svc_;
  RingConfig ring_cfg_;
  std::unique_ptr<RingHub> hub_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::ostringstream log_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> log_sink_;
  std::shared_ptr<spdlog::logger> previous_logger_;
};

}  // namespace tandem::daemon::ring_testing
