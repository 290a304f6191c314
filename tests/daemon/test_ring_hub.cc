// The daemon side of ring sessions (src/daemon/ring_hub.cc, docs/rings.md) over a real Service with the scripted
// FakeBackend: RingHub::open hands out the fds, a ring::RingClient in this process attaches to them (and the test maps
// the memfd a second time to write hand-made, hostile entries), and the test drives the loop the way tandemd does —
// Service::process_events()/flush_changes() and RingHub::process() — until a condition holds. No D-Bus, no LibTorch.
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

namespace tandem::daemon {
namespace {

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

class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/tmp/tandem-ringhub-XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    if (p == nullptr) std::abort();
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

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
  void degraded_changed(bool, const std::string&, const Dict&) override {}
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

// --- open ------------------------------------------------------------------------------------------------------------

TEST_F(RingHubTest, OpenRefusals) {
  ASSERT_NO_FATAL_FAILURE(start());
  struct Case {
    const char* name;
    Caller caller;
    Dict options;
    bool enabled;
    Errc want;
    const char* message_has;
  };
  const std::vector<Case> cases = {
      {"rings disabled", alice_, {}, false, Errc::unavailable, "disabled"},
      {"may not submit", mallory_, {}, true, Errc::permission_denied, "may not submit"},
      {"unknown option", alice_, {{"bogus", std::uint64_t{1}}}, true, Errc::invalid_argument, "bogus"},
      {"option of the wrong type", alice_, {{"sq_entries", std::string("8")}}, true, Errc::invalid_argument,
       "sq_entries"},
      {"sq_entries above max", alice_, {{"sq_entries", std::uint32_t{8192}}}, true, Errc::invalid_argument,
       "sq_entries"},
      {"sq_entries past 32 bits", alice_, {{"sq_entries", std::uint64_t{1} << 33}}, true, Errc::invalid_argument,
       "sq_entries"},
      {"cq_entries above max", alice_, {{"cq_entries", std::uint64_t{1} << 20}}, true, Errc::invalid_argument,
       "cq_entries"},
      {"request area above max", alice_, {{"request_data_bytes", std::uint64_t{32} * kMiB}}, true,
       Errc::invalid_argument, "request_data_bytes"},
      {"response area above max", alice_, {{"response_data_bytes", std::uint64_t{17} * kMiB}}, true,
       Errc::invalid_argument, "response_data_bytes"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    RingConfig rc;
    rc.enabled = c.enabled;
    RingHub hub(svc_.get(), rc);
    auto r = hub.open(c.caller, c.options);
    ASSERT_FALSE(r) << c.name << ": want " << errc_name(c.want) << ", got a session";
    EXPECT_EQ(r.error().code, c.want) << c.name << ": want " << errc_name(c.want) << ", got " << describe(r);
    EXPECT_THAT(r.error().message, HasSubstr(c.message_has)) << c.name;
    EXPECT_FALSE(hub.any_sessions()) << c.name;
    EXPECT_EQ(hub.counters()["ring_sessions_opened"], 0u) << c.name;
  }
}

TEST_F(RingHubTest, SessionLimitsPerUserAndInAll) {
  RingConfig rc;
  rc.max_sessions = 3;
  rc.max_sessions_per_user = 2;
  ASSERT_NO_FATAL_FAILURE(start(rc));
  Peer* a1 = open(alice_);
  Peer* a2 = open(alice2_);  // same uid, other bus name: counts for alice
  ASSERT_TRUE(a1 && a2);
  auto third = hub_->open(alice_, {});
  ASSERT_FALSE(third) << "alice's third session: want queue_full (per user), got a session";
  EXPECT_EQ(third.error().code, Errc::queue_full) << describe(third);
  EXPECT_THAT(third.error().message, HasSubstr("max_sessions_per_user"));
  Peer* b = open(bob_);  // 3 in all
  ASSERT_TRUE(b);
  auto fourth = hub_->open(carol_, {});
  ASSERT_FALSE(fourth) << "a fourth session: want queue_full (in all), got a session";
  EXPECT_EQ(fourth.error().code, Errc::queue_full) << describe(fourth);
  EXPECT_THAT(fourth.error().message, HasSubstr("[rings] max_sessions)"));
  EXPECT_EQ(counter("ring_sessions_open"), 3u);
  // A closed session frees its place.
  ASSERT_TRUE(hub_->close(alice_, a1->id)) << "owner close";
  ASSERT_TRUE(open(carol_));
  ASSERT_TRUE(hub_->close(bob_, b->id)) << "owner close";
  ASSERT_TRUE(open(alice_)) << "alice has one session now, the limit is 2; 2 open in all, the limit is 3";
  EXPECT_EQ(counter("ring_sessions_opened"), 5u);
  EXPECT_EQ(counter("ring_sessions_closed"), 2u);
}

TEST_F(RingHubTest, LayoutDictMatchesTheSealedMapping) {
  RingConfig rc;
  rc.max_backlog_bytes = 256 * 1024;
  ASSERT_NO_FATAL_FAILURE(start(rc));
  auto r = hub_->open(alice_, {{"sq_entries", std::uint32_t{10}},
                               {"cq_entries", std::uint64_t{20}},
                               {"request_data_bytes", std::uint64_t{5000}}});
  ASSERT_TRUE(r) << describe(r);
  const Dict& d = r->layout;
  auto u64 = [&](const char* k) -> std::uint64_t {
    auto it = d.find(k);
    if (it == d.end()) {
      ADD_FAILURE() << "layout has no '" << k << "'";
      return 0;
    }
    if (auto* v = std::get_if<std::uint64_t>(&it->second)) return *v;
    if (auto* v = std::get_if<std::uint32_t>(&it->second)) return *v;
    ADD_FAILURE() << "layout '" << k << "' is not an unsigned integer";
    return 0;
  };
  EXPECT_EQ(u64("session_id"), r->session_id);
  EXPECT_EQ(u64("abi_major"), ring::kAbiMajor);
  EXPECT_EQ(u64("abi_minor"), ring::kAbiMinor);
  EXPECT_EQ(u64("features"), 0u);
  EXPECT_EQ(u64("sq_entries"), 16u) << "10 rounds up to a power of two";
  EXPECT_EQ(u64("cq_entries"), 32u) << "20 rounds up to a power of two";
  EXPECT_EQ(u64("request_data_bytes"), 8192u) << "5000 rounds up to 4 KiB";
  EXPECT_EQ(u64("response_data_bytes"), rc.default_data_bytes) << "absent = the default";
  EXPECT_EQ(u64("max_request_bytes"), 4096u) << "half the request area";
  EXPECT_EQ(u64("max_backlog_bytes"), rc.max_backlog_bytes);

  struct stat st{};
  ASSERT_EQ(::fstat(r->fds.memfd, &st), 0);
  EXPECT_EQ(static_cast<std::uint64_t>(st.st_size), u64("total_size"));
  const int seals = ::fcntl(r->fds.memfd, F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
      << "seals 0x" << std::hex << seals;
  EXPECT_NE(::ftruncate(r->fds.memfd, 4096), 0) << "a client must not be able to shrink the memfd";
  EXPECT_NE(::fcntl(r->fds.sq_doorbell_write, F_GETFL) & O_NONBLOCK, 0) << "submit doorbell is non-blocking";
  EXPECT_NE(::fcntl(r->fds.cq_doorbell_read, F_GETFL) & O_NONBLOCK, 0) << "completion doorbell is non-blocking";
  EXPECT_EQ(::fcntl(r->fds.sq_doorbell_write, F_GETFL) & O_ACCMODE, O_WRONLY) << "the client gets the write end";
  EXPECT_EQ(::fcntl(r->fds.cq_doorbell_read, F_GETFL) & O_ACCMODE, O_RDONLY) << "the client gets the read end";

  void* base = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_SHARED, r->fds.memfd, 0);
  ASSERT_NE(base, MAP_FAILED);
  auto l = ring::read_header(base, static_cast<std::size_t>(st.st_size));
  ASSERT_TRUE(l) << describe(l);
  EXPECT_EQ(l->session_id, r->session_id);
  EXPECT_EQ(l->sq_entries, u64("sq_entries"));
  EXPECT_EQ(l->cq_entries, u64("cq_entries"));
  EXPECT_EQ(l->request_data_size, u64("request_data_bytes"));
  EXPECT_EQ(l->response_data_size, u64("response_data_bytes"));
  EXPECT_EQ(l->max_request_bytes, u64("max_request_bytes"));
  EXPECT_EQ(l->total_size, u64("total_size"));
  const auto* sq = reinterpret_cast<const ring::SqControl*>(static_cast<const std::uint8_t*>(base) + l->sq_control_offset);
  EXPECT_EQ(sq->state, static_cast<std::uint32_t>(SessionState::open));
  ::munmap(base, static_cast<std::size_t>(st.st_size));
  r->fds.close_all();
}

// --- submissions ---------------------------------------------------------------------------------------------------

TEST_F(RingHubTest, SubmitIsAcceptedFirstThenOrderedUpdatesWithUserData) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(6));
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  const std::vector<std::uint64_t> uds = {0xABCDEF0123ull, 7, 0};
  for (auto ud : uds) ASSERT_TRUE(p->client->submit(ud, submit_record("hello " + std::to_string(ud), 10)));
  std::vector<JobId> jobs;
  for (auto ud : uds) jobs.push_back(wait_accepted(*p, ud));
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_NE(jobs[i], 0u) << "submit " << uds[i];
    ASSERT_TRUE(wait_finished(*p, jobs[i])) << "job " << jobs[i] << " got only: " << p->kinds_of_job(jobs[i]);
  }
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE("job " + std::to_string(jobs[i]));
    const auto evs = p->of_job(jobs[i]);
    EXPECT_EQ(p->kinds_of_job(jobs[i]),
              "accepted,routed,started,tokens,tokens,tokens,tokens,tokens,tokens,finished");
    for (const auto& e : evs) EXPECT_EQ(e.entry.user_data, uds[i]) << kind_name(e) << " echoes another user_data";
    // accepted: the placement.
    const auto& acc = evs.front();
    ASSERT_EQ(acc.kind(), Kind::accepted);
    EXPECT_EQ(ru64(acc, "job_id"), jobs[i]);
    EXPECT_EQ(rstr(acc, "route"), "gpu");
    EXPECT_EQ(rstr(acc, "action"), "admit");
    EXPECT_FALSE(rbool(acc, "existing"));
    EXPECT_EQ(rstr(acc, "fingerprint"), "fp-tiny");
    EXPECT_EQ(rstr(evs[1], "route"), "gpu") << "routed";
    // tokens: contiguous steps, the backend's ids and text.
    std::uint32_t next = 0;
    std::string text;
    std::vector<std::int32_t> ids;
    for (const auto& e : evs) {
      if (e.kind() != Kind::tokens) continue;
      EXPECT_EQ(e.entry.step, next) << "token steps not contiguous";
      EXPECT_EQ(e.entry.flags & ring::kCqeGap, 0) << "gap without overflow";
      next = e.entry.step + e.entry.count;
      const auto t = token_ids(e);
      ids.insert(ids.end(), t.begin(), t.end());
      EXPECT_EQ(e.entry.text_length, token_text(e).size());
      text += token_text(e);
    }
    EXPECT_EQ(ids, FakeBackend::tokens_of(kSeed, 0, 6));
    EXPECT_EQ(text, FakeBackend::text_of(0, 6));
    auto info = svc_->get_job(alice_, jobs[i]);
    ASSERT_TRUE(info) << describe(info);
    EXPECT_EQ(std::get<std::string>(info->at("text")), text) << "streamed text != GetJob text";
    const auto& fin = evs.back();
    EXPECT_EQ(rstr(fin, "state"), "completed");
    EXPECT_EQ(rstr(fin, "finish_reason"), "eos");
    EXPECT_EQ(parse(fin).find("text"), nullptr) << "finished must not repeat the text";
  }
  // Nothing went to the bus: the updates of ring jobs go to the ring only.
  EXPECT_TRUE(fwd_.bus_updates.empty()) << fwd_.bus_updates.front();
  EXPECT_EQ(counter("ring_submissions"), 3u);
  EXPECT_EQ(counter("ring_tokens"), 18u);
  EXPECT_EQ(counter("ring_completions"), p->events.size());
  const auto rows = hub_->sessions_view();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(std::get<std::uint64_t>(rows[0].at("jobs")), 3u);
  EXPECT_EQ(std::get<std::string>(rows[0].at("owner")), alice_.bus_name);
}

TEST_F(RingHubTest, MigrationIsStreamedInOrderWithContiguousSteps) {
  ASSERT_NO_FATAL_FAILURE(start());
  Script gpu;
  gpu.tokens = 100;
  gpu.fail = Errc::device_lost;
  gpu.fail_after = 3;
  backend_->set_scripter([gpu](const RunSpec& spec) {
    return spec.route.device == policy::Device::cpu ? emit(100) : gpu;
  });
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->client->submit(9, submit_record("migrate me", 8)));
  const JobId job = wait_accepted(*p, 9);
  ASSERT_NE(job, 0u);
  ASSERT_TRUE(wait_finished(*p, job)) << p->kinds_of_job(job);
  const auto evs = p->of_job(job);
  int migrated = 0;
  std::uint32_t next = 0;
  std::string text;
  for (const auto& e : evs) {
    EXPECT_EQ(e.entry.user_data, 9u) << kind_name(e);
    if (e.kind() == Kind::migrated) {
      ++migrated;
      EXPECT_EQ(next, 3u) << "migrated after the 3 tokens of the GPU run";
      EXPECT_EQ(ru64(e, "tokens_delivered"), 3u);
      EXPECT_EQ(rstr(e, "reason"), std::string(errc_name(Errc::device_lost)));
    }
    if (e.kind() != Kind::tokens) continue;
    EXPECT_EQ(e.entry.step, next) << "steps across the migration";
    next = e.entry.step + e.entry.count;
    text += token_text(e);
  }
  EXPECT_EQ(migrated, 1) << p->kinds_of_job(job);
  EXPECT_EQ(text, FakeBackend::text_of(0, 8));
  EXPECT_EQ(evs.front().kind(), Kind::accepted);
  EXPECT_EQ(rstr(evs.back(), "state"), "completed");
}

TEST_F(RingHubTest, SemanticErrorsAreErrorCompletionsAndTheSessionStaysOpen) {
  ASSERT_NO_FATAL_FAILURE(start());
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  struct Case {
    const char* name;
    std::vector<std::uint8_t> record;
    ring::ErrorCode code;
    const char* message_has;
  };
  const std::vector<Case> cases = {
      {"max_tokens as a string",
       ring::RecordWriter().add("prompt", "x").add("max_tokens", "ten").take(), ring::ErrorCode::invalid_argument,
       "max_tokens"},
      {"unknown key", ring::RecordWriter().add("prompt", "x").add("bogus_option", std::uint64_t{1}).take(),
       ring::ErrorCode::invalid_argument, "bogus_option"},
      {"temperature out of range", ring::RecordWriter().add("prompt", "x").add("temperature", -1.0).take(),
       ring::ErrorCode::invalid_argument, "temperature"},
      {"unknown model", ring::RecordWriter().add("model", "nope").add("prompt", "x").take(),
       ring::ErrorCode::unknown_model, "nope"},
  };
  std::uint64_t ud = 100;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    ++ud;
    ASSERT_TRUE(p->client->submit(ud, c.record));
    ASSERT_TRUE(pump_until([&] { return p->find(Kind::error, ud) || p->find(Kind::accepted, ud); }))
        << c.name << ": no answer";
    const auto* e = p->find(Kind::error, ud);
    ASSERT_NE(e, nullptr) << c.name << ": want an error completion, got accepted";
    EXPECT_EQ(e->entry.job_id, 0u);
    EXPECT_EQ(e->entry.error, static_cast<std::uint16_t>(c.code))
        << c.name << ": want " << ring::error_code_name(c.code) << ", got " << rstr(*e, "error");
    EXPECT_EQ(rstr(*e, "error"), ring::error_code_name(c.code));
    EXPECT_THAT(rstr(*e, "message"), HasSubstr(c.message_has));
    EXPECT_EQ(p->state(), SessionState::open) << c.name << " ended the session";
    EXPECT_TRUE(nop_round_trip(*p, ud + 1000)) << "after " << c.name;
  }
  EXPECT_EQ(counter("ring_sessions_failed"), 0u);
}

TEST_F(RingHubTest, CancelAnswersWithTheStateAndTheJobFinishesCancelled) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(1, 10));
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->client->submit(1, submit_record("cancel me", 10)));
  const JobId job = wait_accepted(*p, 1);
  ASSERT_NE(job, 0u);
  ASSERT_TRUE(pump_until([&] { return backend_->is_blocked(job); }));
  ASSERT_TRUE(p->client->cancel(2, job));
  ASSERT_TRUE(pump_until([&] { return p->find(Kind::cancel_result, 2) || p->find(Kind::error, 2); }));
  const auto* cr = p->find(Kind::cancel_result, 2);
  ASSERT_NE(cr, nullptr) << "want cancel_result, got error";
  EXPECT_EQ(cr->entry.job_id, job);
  EXPECT_EQ(rstr(*cr, "state"), "cancelling") << "a running job is being cancelled";
  ASSERT_TRUE(wait_finished(*p, job)) << p->kinds_of_job(job);
  const auto evs = p->of_job(job);
  EXPECT_EQ(rstr(evs.back(), "state"), "cancelled");
  EXPECT_EQ(evs.back().entry.user_data, 1u) << "job events carry the submit's user_data";

  // Errors: an unknown job, a job of another user.
  ASSERT_TRUE(p->client->cancel(3, 999999));
  auto bobs = svc_->submit(bob_, [] {
    SubmitRequest r;
    r.prompt = "bob's";
    r.options.max_tokens = 4;
    return r;
  }());
  ASSERT_TRUE(bobs) << describe(bobs);
  const auto bob_job = std::get<std::uint64_t>(bobs->at("job_id"));
  ASSERT_TRUE(p->client->cancel(4, bob_job));
  ASSERT_TRUE(pump_until([&] { return p->find(Kind::error, 3) && p->find(Kind::error, 4); }))
      << "want error completions for both cancels";
  EXPECT_EQ(p->find(Kind::error, 3)->entry.error, static_cast<std::uint16_t>(ring::ErrorCode::unknown_job))
      << rstr(*p->find(Kind::error, 3), "error");
  EXPECT_EQ(p->find(Kind::error, 4)->entry.error, static_cast<std::uint16_t>(ring::ErrorCode::not_authorized))
      << rstr(*p->find(Kind::error, 4), "error");
  backend_->release_all();
  ASSERT_TRUE(pump_until([&] { return terminal(bob_job); }));
  EXPECT_EQ(phase(bob_job), "completed") << "alice's cancel must not touch bob's job";
}

TEST_F(RingHubTest, NopIsAnsweredWithItsUserData) {
  ASSERT_NO_FATAL_FAILURE(start());
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  for (std::uint64_t ud : {std::uint64_t{0}, std::uint64_t{1}, ~std::uint64_t{0}}) {
    ASSERT_TRUE(nop_round_trip(*p, ud)) << "nop " << ud;
    const auto* e = p->find(Kind::nop, ud);
    EXPECT_EQ(e->entry.job_id, 0u);
    EXPECT_EQ(e->entry.data_length, 0u);
    EXPECT_EQ(e->entry.error, 0u);
  }
  EXPECT_EQ(p->events.size(), 3u);
}

TEST_F(RingHubTest, IdempotencyKeyOfAnEndedJobIsAcceptedExistingThenFinishedAtOnce) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(3));
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->client->submit(1, submit_record("once", 8, "key-1")));
  const JobId job = wait_accepted(*p, 1);
  ASSERT_NE(job, 0u);
  ASSERT_TRUE(wait_finished(*p, job));
  const std::size_t before = p->events.size();
  ASSERT_TRUE(p->client->submit(2, submit_record("once", 8, "key-1")));
  // One hub pass, no service events in between: accepted(existing) and finished both come from that pass.
  bool got = false;
  for (int i = 0; i < 1000 && !got; ++i) {
    hub_->process();
    ASSERT_TRUE(p->client->reap(p->events));
    got = p->find(Kind::finished, 2) != nullptr;
    if (!got && p->find(Kind::accepted, 2)) break;
  }
  ASSERT_TRUE(got) << "want accepted(existing) then finished from one pass, got: "
                   << [&] {
                        std::string s;
                        for (std::size_t i = before; i < p->events.size(); ++i) s += kind_name(p->events[i]) + " ";
                        return s;
                      }();
  ASSERT_EQ(p->events.size(), before + 2);
  const auto& acc = p->events[before];
  const auto& fin = p->events[before + 1];
  ASSERT_EQ(acc.kind(), Kind::accepted);
  EXPECT_EQ(acc.entry.job_id, job);
  EXPECT_TRUE(rbool(acc, "existing"));
  ASSERT_EQ(fin.kind(), Kind::finished);
  EXPECT_EQ(fin.entry.job_id, job);
  EXPECT_EQ(fin.entry.user_data, 2u);
  EXPECT_EQ(rstr(fin, "state"), "completed");
  EXPECT_EQ(ru64(fin, "tokens_total"), 3u);
  EXPECT_EQ(backend_->runs_of(job).size(), 1u) << "an idempotent resubmit must not run again";
}

TEST_F(RingHubTest, IdempotencyKeyOfARunningJobMovesItsStreamToTheNewSession) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(2, 5));
  Peer* a = open(alice_);
  Peer* b = open(alice2_);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->client->submit(10, submit_record("retry me", 8, "key-2")));
  const JobId job = wait_accepted(*a, 10);
  ASSERT_NE(job, 0u);
  ASSERT_TRUE(pump_until([&] { return backend_->is_blocked(job); }));
  ASSERT_TRUE(pump_until([&] {
    std::uint32_t n = 0;
    for (const auto& e : a->of_job(job)) n += e.kind() == Kind::tokens ? e.entry.count : 0;
    return n == 2;
  })) << a->kinds_of_job(job);
  ASSERT_TRUE(b->client->submit(20, submit_record("retry me", 8, "key-2")));
  ASSERT_EQ(wait_accepted(*b, 20), job);
  EXPECT_TRUE(rbool(*b->find(Kind::accepted, 20), "existing"));
  const std::size_t a_before = a->events.size();
  backend_->release(job);
  ASSERT_TRUE(wait_finished(*b, job)) << "session b got: " << b->kinds_of_job(job);
  std::uint32_t next = 2;
  for (const auto& e : b->of_job(job)) {
    EXPECT_EQ(e.entry.user_data, 20u) << kind_name(e);
    if (e.kind() != Kind::tokens) continue;
    EXPECT_EQ(e.entry.step, next) << "the rest of the stream continues at step 2";
    next = e.entry.step + e.entry.count;
  }
  EXPECT_EQ(next, 5u);
  EXPECT_EQ(a->events.size(), a_before) << "the first session must not get the rest";
}

TEST_F(RingHubTest, IdempotencyKeyOfAFailedJobIsAResumableErrorWithItsFacts) {
  ASSERT_NO_FATAL_FAILURE(start());
  Script gpu;
  gpu.tokens = 100;
  gpu.fail = Errc::device_lost;
  gpu.fail_after = 2;
  backend_->set_scripter([gpu](const RunSpec& spec) {
    return spec.route.device == policy::Device::cpu ? emit(100) : gpu;
  });
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  auto rec = [] {
    return ring::RecordWriter()
        .add("model", "tiny")
        .add("prompt", "fragile")
        .add("max_tokens", std::uint64_t{8})
        .add("seed", kSeed)
        .add("idempotency_key", "key-f")
        .add("side_effects", true)
        .take();
  };
  ASSERT_TRUE(p->client->submit(1, rec()));
  const JobId job = wait_accepted(*p, 1);
  ASSERT_NE(job, 0u);
  ASSERT_TRUE(wait_finished(*p, job)) << p->kinds_of_job(job);
  const auto fin = p->of_job(job).back();
  EXPECT_EQ(rstr(fin, "state"), "failed");
  EXPECT_EQ(rstr(fin, "error_code"), std::string(errc_name(Errc::resumable)));
  EXPECT_EQ(ru64(fin, "tokens_total"), 2u);
  ASSERT_TRUE(p->client->submit(2, rec()));
  ASSERT_TRUE(pump_until([&] { return p->find(Kind::error, 2) || p->find(Kind::accepted, 2); }));
  const auto* e = p->find(Kind::error, 2);
  ASSERT_NE(e, nullptr) << "want a Resumable error, got accepted";
  EXPECT_EQ(e->entry.error, static_cast<std::uint16_t>(ring::ErrorCode::resumable)) << rstr(*e, "error");
  EXPECT_EQ(rstr(*e, "error"), "Resumable");
  EXPECT_EQ(ru64(*e, "job"), job) << "the fact job= is a field";
  EXPECT_EQ(ru64(*e, "tokens"), 2u) << "the fact tokens= is a field";
  EXPECT_NE(parse(*e).find("retry_after_ms"), nullptr) << "the fact retry_after_ms= is a field";
  EXPECT_THAT(rstr(*e, "message"), ::testing::Not(HasSubstr("job="))) << "facts are cut from the message";
  EXPECT_EQ(backend_->runs().size(), 1u) << "never a second run";
}

// --- protocol faults -----------------------------------------------------------------------------------------------

struct FaultCase {
  const char* name;
  Fault fault;
  // Writes the bad input at SQ index `at` (a valid submit sits at index 0, already consumed). Returns the new tail.
  std::function<std::uint32_t(Peer&, std::uint32_t at)> write;
};

std::vector<FaultCase> fault_cases() {
  using ring::Opcode;
  auto one = [](ring::SubmissionEntry e) {
    return [e](Peer& p, std::uint32_t at) {
      p.put(at, e);
      return at + 1;
    };
  };
  auto with_payload = [](std::vector<std::uint8_t> bytes) {
    return [bytes](Peer& p, std::uint32_t at) {
      const std::uint64_t off = 2048;
      p.put_data(off, bytes);
      auto e = entry(Opcode::submit, 66);
      e.data_offset = off;
      e.data_length = static_cast<std::uint32_t>(bytes.size());
      p.put(at, e);
      return at + 1;
    };
  };
  std::vector<FaultCase> v;
  {
    auto e = entry(Opcode::nop, 66);
    e.opcode = 0x42;
    v.push_back({"opcode", Fault::opcode, one(e)});
  }
  {
    auto e = entry(Opcode::nop, 66);
    e.flags = 1;
    v.push_back({"reserved (flags)", Fault::reserved, one(e)});
  }
  {
    auto e = entry(Opcode::nop, 66);
    e.reserved[31] = 1;
    v.push_back({"reserved (bytes)", Fault::reserved, one(e)});
  }
  {
    auto e = entry(Opcode::nop, 66);
    e.job_id = 5;
    v.push_back({"reserved (job id on nop)", Fault::reserved, one(e)});
  }
  {
    auto e = entry(Opcode::nop, 66);
    e.data_length = 8;
    v.push_back({"length (nop with data)", Fault::length, one(e)});
  }
  {
    auto e = entry(Opcode::submit, 66);
    v.push_back({"length (empty submit)", Fault::length, one(e)});
  }
  v.push_back({"length (past max_request_bytes)", Fault::length, [](Peer& p, std::uint32_t at) {
                 auto e = entry(ring::Opcode::submit, 66);
                 e.data_length = p.raw.layout.max_request_bytes + 1;
                 p.put(at, e);
                 return at + 1;
               }});
  v.push_back({"offset", Fault::offset, [](Peer& p, std::uint32_t at) {
                 auto e = entry(ring::Opcode::submit, 66);
                 e.data_offset = p.raw.layout.request_data_size - 8;
                 e.data_length = 64;
                 p.put(at, e);
                 return at + 1;
               }});
  {
    auto rec = ring::RecordWriter().add("prompt", "x").take();
    rec.pop_back();  // value shorter than its length
    v.push_back({"record (truncated)", Fault::record, with_payload(rec)});
  }
  {
    auto rec = ring::RecordWriter().add("prompt", "x").take();
    rec[0] = 99;  // unknown field type
    v.push_back({"record (unknown type)", Fault::record, with_payload(rec)});
  }
  v.push_back({"utf8", Fault::utf8, with_payload(ring::RecordWriter().add("prompt", "bad \xc3\x28 utf8").take())});
  v.push_back({"sq_index (tail ahead)", Fault::sq_index, [](Peer& p, std::uint32_t at) {
                 return at + p.raw.layout.sq_entries + 1;
               }});
  v.push_back({"cq_index (head past the tail)", Fault::cq_index, [](Peer& p, std::uint32_t at) {
                 ring::store_release(&p.cq()->head, p.cq_tail() + 3);
                 p.put(at, entry(ring::Opcode::nop, 66));  // answering it makes the daemon look at the head
                 return at + 1;
               }});
  return v;
}

TEST_F(RingHubTest, EveryProtocolFaultFailsOnlyThatSessionAndItsJobsContinue) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(1, 4));
  Peer* other = open(bob_);
  ASSERT_TRUE(other);
  std::uint64_t other_ud = 1;
  for (const auto& c : fault_cases()) {
    SCOPED_TRACE(c.name);
    const std::string fname(ring::fault_name(c.fault));
    const auto failed_before = counter("ring_sessions_failed");
    const auto kind_before = counter("ring_fault_" + fname);
    const auto fds_before = hub_->fds().size();
    Peer* p = open(alice_);
    ASSERT_TRUE(p);
    // A valid submit first (hand-written at index 0): accepted, then the job blocks after one token.
    const auto rec = submit_record(std::string("before the fault: ") + c.name, 4);
    p->put_data(0, rec);
    auto e = entry(ring::Opcode::submit, 55);
    e.data_length = static_cast<std::uint32_t>(rec.size());
    p->put(0, e);
    p->set_tail(1);
    const JobId job = wait_accepted(*p, 55);
    ASSERT_NE(job, 0u);
    ASSERT_TRUE(pump_until([&] { return backend_->is_blocked(job); }));
    // The bad input; the client stops reading (its head is what the daemon judges in the cq_index case).
    p->reading = false;
    ASSERT_TRUE(p->client->reap(p->events));
    p->set_tail(c.write(*p, 1));
    ASSERT_TRUE(pump_until([&] { return p->state() != SessionState::open; }, 5s))
        << c.name << ": want the session failed (" << fname << "), it stays open";
    EXPECT_EQ(p->state(), SessionState::failed) << c.name;
    EXPECT_EQ(p->fault(), c.fault) << c.name << ": want fault " << fname << ", got "
                                   << ring::fault_name(p->fault());
    EXPECT_EQ(p->client->state(), SessionState::failed) << "the client library sees it";
    EXPECT_EQ(p->client->fault(), c.fault);
    EXPECT_EQ(counter("ring_sessions_failed"), failed_before + 1);
    EXPECT_EQ(counter("ring_fault_" + fname), kind_before + 1) << "counter ring_fault_" << fname;
    EXPECT_EQ(hub_->fds().size(), fds_before) << "the failed session is gone from the loop's fds";
    EXPECT_THAT(log_.str(), HasSubstr("ring session " + std::to_string(p->id) + " of " + alice_.bus_name +
                                      " (uid 1000) failed: " + fname))
        << "warning in the log";
    // Other sessions still work.
    ASSERT_TRUE(nop_round_trip(*other, other_ud++)) << "bob's session after " << c.name;
    // The failed session's job continues to a terminal state (GetJob), sending nothing more to the ring.
    const auto cq_tail = p->cq_tail();
    backend_->release(job);
    ASSERT_TRUE(pump_until([&] { return terminal(job); })) << "job " << job << " is " << phase(job);
    EXPECT_EQ(phase(job), "completed");
    auto info = svc_->get_job(alice_, job);
    ASSERT_TRUE(info);
    EXPECT_EQ(std::get<std::string>(info->at("text")), FakeBackend::text_of(0, 4));
    EXPECT_EQ(p->cq_tail(), cq_tail) << "completions written to a failed session";
    EXPECT_TRUE(fwd_.bus_updates.empty()) << "updates of a failed session's job went to the bus: "
                                          << fwd_.bus_updates.front();
  }
  EXPECT_EQ(other->state(), SessionState::open);
}

// --- the end of a session ------------------------------------------------------------------------------------------

TEST_F(RingHubTest, CloseByTheOwnerOrRootOnly) {
  ASSERT_NO_FATAL_FAILURE(start());
  const Caller admin_not_root{":1.3", 1005, true, true, ""};
  struct Case {
    const char* name;
    Caller by;
    bool ok;
    Errc want;
  };
  const std::vector<Case> cases = {
      {"same user, other bus name", alice2_, false, Errc::permission_denied},
      {"another user", bob_, false, Errc::permission_denied},
      {"admin group, not root", admin_not_root, false, Errc::permission_denied},
      {"root", admin_, true, Errc::permission_denied /* unused */},
      {"the owner", alice_, true, Errc::permission_denied /* unused */},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Peer* p = open(alice_);
    ASSERT_TRUE(p);
    auto st = hub_->close(c.by, p->id);
    if (!c.ok) {
      ASSERT_FALSE(st) << c.name << ": want " << errc_name(c.want) << ", got ok";
      EXPECT_EQ(st.error().code, c.want) << describe(st);
      EXPECT_EQ(p->state(), SessionState::open);
      EXPECT_TRUE(nop_round_trip(*p, 1)) << "still serving after a refused close";
      ASSERT_TRUE(hub_->close(alice_, p->id));
      continue;
    }
    ASSERT_TRUE(st) << c.name << ": want ok, got " << describe(st);
    EXPECT_EQ(p->state(), SessionState::closed);
    EXPECT_EQ(p->fault(), Fault::none);
    EXPECT_EQ(p->client->state(), SessionState::closed);
    auto again = hub_->close(alice_, p->id);
    ASSERT_FALSE(again) << "closing twice";
    EXPECT_EQ(again.error().code, Errc::not_found);
  }
  auto unknown = hub_->close(alice_, 987654);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, Errc::not_found);
  EXPECT_FALSE(hub_->any_sessions());
  EXPECT_EQ(counter("ring_sessions_closed"), cases.size());
  EXPECT_EQ(counter("ring_sessions_failed"), 0u);
}

TEST_F(RingHubTest, ClosedSessionsJobKeepsRunningAndSendsNothing) {
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(block_at(1, 6));
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->client->submit(1, submit_record("outlives its session", 6)));
  const JobId job = wait_accepted(*p, 1);
  ASSERT_NE(job, 0u);
  ASSERT_TRUE(pump_until([&] { return backend_->is_blocked(job); }));
  ASSERT_TRUE(hub_->close(alice_, p->id));
  const auto tail = p->cq_tail();
  backend_->release(job);
  ASSERT_TRUE(pump_until([&] { return terminal(job); }));
  EXPECT_EQ(phase(job), "completed");
  EXPECT_EQ(p->cq_tail(), tail) << "completions after the close";
  EXPECT_TRUE(fwd_.bus_updates.empty()) << fwd_.bus_updates.front();
}

TEST_F(RingHubTest, ClientVanishedClosesItsSessionsOnly) {
  ASSERT_NO_FATAL_FAILURE(start());
  Peer* a1 = open(alice_);
  Peer* a2 = open(alice_);
  Peer* a3 = open(alice2_);
  Peer* b = open(bob_);
  ASSERT_TRUE(a1 && a2 && a3 && b);
  hub_->client_vanished(":1.99");
  EXPECT_EQ(counter("ring_sessions_open"), 4u) << "a stranger's name leaving changes nothing";
  (void)hub_->take_changed();
  hub_->client_vanished(alice_.bus_name);
  EXPECT_TRUE(hub_->take_changed());
  EXPECT_EQ(a1->state(), SessionState::closed);
  EXPECT_EQ(a2->state(), SessionState::closed);
  EXPECT_EQ(a3->state(), SessionState::open) << "same uid, other bus name";
  EXPECT_EQ(b->state(), SessionState::open);
  EXPECT_EQ(counter("ring_sessions_open"), 2u);
  EXPECT_EQ(counter("ring_sessions_closed"), 2u);
  EXPECT_EQ(hub_->fds().size(), 2u);
  EXPECT_TRUE(nop_round_trip(*a3, 1));
  EXPECT_TRUE(nop_round_trip(*b, 1));
}

TEST_F(RingHubTest, ReauthorizeClosesSessionsOfUsersThatMayNoLongerSubmit) {
  ASSERT_NO_FATAL_FAILURE(start());
  Peer* a = open(alice_);
  Peer* b = open(bob_);
  Peer* c = open(carol_);
  ASSERT_TRUE(a && b && c);
  RingConfig tighter;
  tighter.max_sessions_per_user = 1;
  hub_->reauthorize([](std::uint32_t uid) { return uid != 1000; }, tighter);
  EXPECT_EQ(a->state(), SessionState::closed);
  EXPECT_EQ(a->fault(), Fault::none);
  EXPECT_EQ(b->state(), SessionState::open);
  EXPECT_EQ(c->state(), SessionState::open);
  EXPECT_TRUE(nop_round_trip(*b, 1));
  auto second = hub_->open(bob_, {});
  ASSERT_FALSE(second) << "the new per-user limit (1) applies to new sessions";
  EXPECT_EQ(second.error().code, Errc::queue_full);
  RingConfig off;
  off.enabled = false;
  hub_->reauthorize([](std::uint32_t) { return true; }, off);
  EXPECT_EQ(b->state(), SessionState::closed);
  EXPECT_EQ(c->state(), SessionState::closed);
  EXPECT_FALSE(hub_->any_sessions());
  auto disabled = hub_->open(bob_, {});
  ASSERT_FALSE(disabled);
  EXPECT_EQ(disabled.error().code, Errc::unavailable);
}

TEST_F(RingHubTest, CloseAllEndsEverySessionAndChangesAreReported) {
  ASSERT_NO_FATAL_FAILURE(start());
  EXPECT_FALSE(hub_->take_changed()) << "nothing happened yet";
  Peer* a = open(alice_);
  ASSERT_TRUE(a);
  EXPECT_TRUE(hub_->take_changed()) << "a session opened";
  EXPECT_FALSE(hub_->take_changed()) << "reported once";
  ASSERT_TRUE(nop_round_trip(*a, 1));
  EXPECT_FALSE(hub_->take_changed()) << "traffic is not a change of the session set";
  Peer* b = open(bob_);
  ASSERT_TRUE(b);
  (void)hub_->take_changed();
  hub_->close_all("tandemd is stopping");
  EXPECT_TRUE(hub_->take_changed()) << "sessions ended";
  EXPECT_EQ(a->state(), SessionState::closed);
  EXPECT_EQ(b->state(), SessionState::closed);
  EXPECT_EQ(a->client->state(), SessionState::closed);
  EXPECT_FALSE(hub_->any_sessions());
  EXPECT_TRUE(hub_->fds().empty());
  EXPECT_EQ(counter("ring_sessions_closed"), 2u);
  EXPECT_THAT(log_.str(), HasSubstr("closed: tandemd is stopping"));
  // A submission written after the end is never read.
  const auto subs = counter("ring_submissions");
  EXPECT_FALSE(a->client->nop(2)) << "the client library refuses to submit to a closed session";
  pass();
  EXPECT_EQ(counter("ring_submissions"), subs);
}

// --- completion overflow -------------------------------------------------------------------------------------------

TEST_F(RingHubTest, SlowReaderLosesTokensNotOutcomes) {
  RingConfig rc;
  rc.max_backlog_bytes = 2048;  // below the config minimum on purpose: overflow with a few hundred tokens
  ASSERT_NO_FATAL_FAILURE(start(rc));
  constexpr std::uint32_t kTokens = 480;
  constexpr std::uint32_t kBlockAt = 400;
  // 400 tokens while the client does not read (many are dropped), a pause, then the client reads and the last 80
  // tokens stream to a reader that keeps up: the first batch after the drop carries GAP.
  backend_->set_script(block_at(kBlockAt, kTokens));
  Peer* p = open(alice_, {{"cq_entries", std::uint32_t{8}}, {"response_data_bytes", std::uint64_t{4096}}});
  ASSERT_TRUE(p);
  p->reading = false;
  ASSERT_TRUE(p->client->submit(1, submit_record("flood", kTokens)));
  // The reader does not read; the first CQ entry (accepted) names the job.
  ASSERT_TRUE(pump_until([&] { return p->cq_tail() > 0; }));
  const ring::CompletionEntry first = p->raw.cqes()[0];
  ASSERT_EQ(first.kind, static_cast<std::uint8_t>(Kind::accepted));
  const JobId job = first.job_id;
  ASSERT_TRUE(pump_until([&] { return backend_->is_blocked(job); })) << "job " << job << " is " << phase(job);
  pass();  // the loop applies the last token events
  EXPECT_EQ(p->state(), SessionState::open) << "a slow reader is not a protocol error";
  const std::uint64_t dropped = p->client->overflow_tokens();
  EXPECT_GT(dropped, 0u) << "want tokens dropped with a 2 KiB backlog and a 4 KiB area";
  const auto dflags = ring::load_acquire(&p->cq()->daemon_flags);
  EXPECT_NE(dflags & ring::kCqOverflowed, 0u) << "OVERFLOWED flag";
  EXPECT_NE(dflags & ring::kCqBacklog, 0u) << "BACKLOG flag while the reader is behind";
  EXPECT_GT(ring::load_relaxed64(&p->cq()->backlog_entries), 0u);
  // The client catches up: the backlog drains.
  p->reading = true;
  ASSERT_TRUE(pump_until([&] { return (ring::load_acquire(&p->cq()->daemon_flags) & ring::kCqBacklog) == 0; }))
      << "the backlog does not drain while the client reads";
  EXPECT_EQ(ring::load_relaxed64(&p->cq()->backlog_entries), 0u);
  backend_->release(job);
  ASSERT_TRUE(wait_finished(*p, job)) << p->kinds_of_job(job);
  const auto evs = p->of_job(job);
  ASSERT_FALSE(evs.empty());
  EXPECT_EQ(evs.front().kind(), Kind::accepted);
  EXPECT_EQ(evs.back().kind(), Kind::finished);
  EXPECT_EQ(rstr(evs.back(), "state"), "completed");
  EXPECT_EQ(ru64(evs.back(), "tokens_total"), kTokens);
  std::uint32_t next = 0, received = 0, gaps = 0;
  for (const auto& e : evs) {
    if (e.kind() != Kind::tokens) continue;
    if (e.entry.flags & ring::kCqeGap) {
      ++gaps;
      EXPECT_GT(e.entry.step, next) << "a GAP batch resumes past what was delivered";
    } else {
      EXPECT_EQ(e.entry.step, next) << "steps without GAP must be contiguous";
    }
    EXPECT_EQ(token_ids(e), FakeBackend::tokens_of(kSeed, e.entry.step, e.entry.step + e.entry.count));
    EXPECT_EQ(token_text(e), FakeBackend::text_of(e.entry.step, e.entry.step + e.entry.count));
    next = e.entry.step + e.entry.count;
    received += e.entry.count;
  }
  EXPECT_GT(gaps, 0u) << "the batch after a drop carries GAP";
  EXPECT_EQ(received + p->client->overflow_tokens(), kTokens)
      << "received " << received << " + dropped " << p->client->overflow_tokens();
  EXPECT_EQ(next, kTokens) << "the stream ends at the last token";
  EXPECT_EQ(ring::load_acquire(&p->cq()->daemon_flags) & ring::kCqBacklog, 0u) << "backlog flushed";
  auto info = svc_->get_job(alice_, job);
  ASSERT_TRUE(info);
  EXPECT_EQ(std::get<std::vector<std::int32_t>>(info->at("tokens")).size(), kTokens) << "GetJob has every token";
  EXPECT_EQ(std::get<std::string>(info->at("text")), FakeBackend::text_of(0, kTokens));
  const auto rows = hub_->sessions_view();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(std::get<std::uint64_t>(rows[0].at("tokens_dropped")), p->client->overflow_tokens());
}

// --- the loop's sleep protocol ---------------------------------------------------------------------------------------

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

TEST_F(RingHubTest, PrepareSleepSetsNeedWakeupAndRefusesWithPendingWork) {
  RingConfig rc;
  rc.max_spin = std::chrono::microseconds(123);
  ASSERT_NO_FATAL_FAILURE(start(rc));
  EXPECT_TRUE(hub_->fds().empty());
  EXPECT_EQ(hub_->spin_budget(), std::chrono::nanoseconds{0}) << "no sessions: no spinning";
  EXPECT_TRUE(hub_->prepare_sleep());
  hub_->finish_sleep();

  Peer* a = open(alice_);
  Peer* b = open(bob_, {{"cq_entries", std::uint32_t{8}}});
  ASSERT_TRUE(a && b);
  EXPECT_EQ(hub_->spin_budget(), std::chrono::nanoseconds(123'000));
  const auto fds = hub_->fds();
  ASSERT_EQ(fds.size(), 2u);
  EXPECT_NE(fds[0], fds[1]);
  for (int fd : fds) EXPECT_EQ(::fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY) << "the loop polls the read ends";

  // Idle: sleep allowed, NEED_WAKEUP set on every session; a submission then rings the doorbell.
  ASSERT_TRUE(hub_->prepare_sleep()) << "nothing pending";
  EXPECT_NE(ring::load_acquire(&a->sq()->flags) & ring::kSqNeedWakeup, 0u);
  EXPECT_NE(ring::load_acquire(&b->sq()->flags) & ring::kSqNeedWakeup, 0u);
  const auto rung = a->client->stats().doorbells_rung;
  ASSERT_TRUE(a->client->nop(1));
  EXPECT_EQ(a->client->stats().doorbells_rung, rung + 1) << "the client rings a sleeping daemon";
  EXPECT_TRUE(readable(fds[0]) || readable(fds[1])) << "a doorbell is readable";
  hub_->finish_sleep();
  EXPECT_EQ(ring::load_acquire(&a->sq()->flags) & ring::kSqNeedWakeup, 0u) << "finish_sleep clears NEED_WAKEUP";
  EXPECT_FALSE(readable(fds[0]) || readable(fds[1])) << "finish_sleep drains the doorbells";
  ASSERT_TRUE(pump_until([&] { return a->find(Kind::nop, 1) != nullptr; }));

  // A submission published without a doorbell (the daemon was awake): prepare_sleep must refuse.
  const auto rung2 = a->client->stats().doorbells_rung;
  ASSERT_TRUE(a->client->nop(2));
  EXPECT_EQ(a->client->stats().doorbells_rung, rung2) << "no doorbell while the daemon is awake";
  EXPECT_FALSE(hub_->prepare_sleep()) << "a submission is pending";
  EXPECT_EQ(ring::load_acquire(&a->sq()->flags) & ring::kSqNeedWakeup, 0u) << "no sleep: flags cleared again";
  ASSERT_TRUE(pump_until([&] { return a->find(Kind::nop, 2) != nullptr; }));

  // A backlog: 12 nops into an 8-entry CQ. While the client does not read, sleeping is fine; once it consumed,
  // prepare_sleep flushes and refuses.
  b->reading = false;
  for (std::uint64_t i = 0; i < 12; ++i) ASSERT_TRUE(b->client->nop(100 + i));
  pass();
  EXPECT_NE(ring::load_acquire(&b->cq()->daemon_flags) & ring::kCqBacklog, 0u);
  EXPECT_EQ(ring::load_relaxed64(&b->cq()->backlog_entries), 4u);
  ASSERT_TRUE(hub_->prepare_sleep()) << "backlogged, but the client has not consumed";
  hub_->finish_sleep();
  ASSERT_TRUE(b->client->reap(b->events));
  EXPECT_EQ(b->events.size(), 8u);
  EXPECT_FALSE(hub_->prepare_sleep()) << "the client consumed while a backlog waits";
  ASSERT_TRUE(b->client->reap(b->events));
  ASSERT_EQ(b->events.size(), 12u) << "prepare_sleep wrote the backlog";
  for (std::size_t i = 0; i < 12; ++i) EXPECT_EQ(b->events[i].entry.user_data, 100 + i) << "order kept";
  EXPECT_EQ(ring::load_acquire(&b->cq()->daemon_flags) & ring::kCqBacklog, 0u);
  EXPECT_TRUE(hub_->prepare_sleep());
  hub_->finish_sleep();
}

// docs/rings.md: "When the backlog's payload passes max_backlog_bytes, token batches are dropped instead of queued".
// (Found by this test: the writer used to merge a token batch into the last waiting one before checking the limit, so
// 295 tokens (2555 bytes) waited with a 2048-byte limit and nothing was dropped.)
TEST_F(RingHubTest, BacklogPayloadStaysWithinMaxBacklogBytes) {
  RingConfig rc;
  rc.max_backlog_bytes = 2048;
  ASSERT_NO_FATAL_FAILURE(start(rc));
  constexpr std::uint32_t kBlockAt = 300;
  backend_->set_script(block_at(kBlockAt, 310));
  Peer* p = open(alice_, {{"cq_entries", std::uint32_t{8}}, {"response_data_bytes", std::uint64_t{4096}}});
  ASSERT_TRUE(p);
  p->reading = false;
  ASSERT_TRUE(p->client->submit(1, submit_record("flood", 310)));
  ASSERT_TRUE(pump_until([&] { return p->cq_tail() > 0; }));
  const JobId job = p->raw.cqes()[0].job_id;
  ASSERT_TRUE(pump_until([&] { return backend_->is_blocked(job); }));
  pass();
  // Tokens in the CQ, dropped ones, and the rest: waiting in the daemon's backlog (contiguous after the CQ's).
  std::uint32_t cq_end = 0;
  for (std::uint32_t i = 0; i < p->cq_tail(); ++i) {
    const auto& e = p->raw.cqes()[i & 7];
    if (e.kind == static_cast<std::uint8_t>(Kind::tokens)) cq_end = e.step + e.count;
  }
  const auto dropped = static_cast<std::uint32_t>(p->client->overflow_tokens());
  std::uint64_t held_bytes = 0;
  for (std::uint32_t step = cq_end; step < kBlockAt - dropped; ++step) held_bytes += 4 + FakeBackend::text_for(step).size();
  EXPECT_LE(held_bytes, rc.max_backlog_bytes)
      << "the backlog holds " << (kBlockAt - dropped - cq_end) << " tokens (" << held_bytes
      << " bytes of payload) with max_backlog_bytes " << rc.max_backlog_bytes << "; dropped " << dropped;
}

// A client that closes its submit doorbell (the write end) but stays connected: the daemon's read end reports POLLHUP
// for ever, so tandemd's poll() (which waits on hub.fds()) returns at once on every iteration — a busy loop for as
// long as the session lives. Expected: the hub notices the hang-up (read() == 0 in finish_sleep/process) and ends the
// session, as tests/ring/ring_echo.h does, so the fd leaves the poll set.
// --- group commit (docs/journal.md) --------------------------------------------------------------------------------

std::uint64_t svc_counter(const Service& svc, const std::string& name) {
  const auto c = svc.counters();
  const auto it = c.find(name);
  return it == c.end() ? 0 : it->second;
}

TEST_F(RingHubTest, GroupCommitOneFdatasyncForARingDrainAndNothingLeavesBeforeIt) {
  cfg_.journal.fsync = true;
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(2));
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  constexpr std::uint64_t kJobs = 16;
  for (std::uint64_t ud = 1; ud <= kJobs; ++ud) ASSERT_TRUE(p->client->submit(ud, submit_record("g" + std::to_string(ud), 4)));
  const auto syncs = svc_counter(*svc_, "journal_fdatasyncs");
  hub_->process();  // the whole drain: 16 accepts written, none synced
  EXPECT_EQ(svc_counter(*svc_, "journal_fdatasyncs"), syncs);
  EXPECT_EQ(svc_counter(*svc_, "jobs_accepted"), kJobs);
  EXPECT_TRUE(svc_->commit_pending());
  // Nothing acknowledged, announced or run before the commit.
  std::this_thread::sleep_for(20ms);
  svc_->process_events();
  ASSERT_TRUE(p->client->reap(p->events));
  for (const auto& e : p->events) ADD_FAILURE() << "before the commit: a " << kind_name(e) << " completion";
  EXPECT_TRUE(backend_->runs().empty()) << "a job was dispatched before its accept was durable";
  const auto shown = svc_->get_job(admin_, 1);
  EXPECT_TRUE(!shown && shown.error().code == Errc::not_found) << "GetJob shows a job whose accept is not durable";
  ASSERT_TRUE(svc_->commit());
  EXPECT_EQ(svc_counter(*svc_, "journal_fdatasyncs"), syncs + 1);
  EXPECT_EQ(svc_counter(*svc_, "journal_max_records_per_commit"), kJobs);
  EXPECT_FALSE(svc_->commit_pending());
  std::vector<JobId> jobs;
  for (std::uint64_t ud = 1; ud <= kJobs; ++ud) jobs.push_back(wait_accepted(*p, ud));
  for (JobId j : jobs) ASSERT_TRUE(wait_finished(*p, j)) << "job " << j << ": " << p->kinds_of_job(j);
  for (JobId j : jobs) EXPECT_EQ(p->kinds_of_job(j), "accepted,routed,started,tokens,tokens,finished");
  // The outcomes of jobs ending in one iteration share a sync too: far fewer syncs than accepts + outcomes.
  EXPECT_LT(svc_counter(*svc_, "journal_fdatasyncs") - syncs, 2 * kJobs);
}

TEST_F(RingHubTest, GroupCommitFailureIsAnInternalErrorPerSubmitAndTheJobsAreWithdrawn) {
  cfg_.journal.fsync = true;
  ASSERT_NO_FATAL_FAILURE(start());
  backend_->set_script(emit(2));
  Peer* p = open(alice_);
  ASSERT_TRUE(p);
  for (std::uint64_t ud = 1; ud <= 3; ++ud)
    ASSERT_TRUE(p->client->submit(ud, submit_record("w" + std::to_string(ud), 4, "key-" + std::to_string(ud))));
  hub_->process();
  svc_->testing_fail_journal_syncs(1);
  const Status st = svc_->commit();
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::internal);
  EXPECT_THAT(st.error().message, HasSubstr("it was not accepted"));
  ASSERT_TRUE(pump_until([&] { return p->find(Kind::error, 3) != nullptr; }));
  for (std::uint64_t ud = 1; ud <= 3; ++ud) {
    const auto* e = p->find(Kind::error, ud);
    ASSERT_NE(e, nullptr) << "submit " << ud;
    EXPECT_EQ(rstr(*e, "error"), "Internal");
    EXPECT_THAT(rstr(*e, "message"), HasSubstr("not accepted"));
    EXPECT_EQ(p->find(Kind::accepted, ud), nullptr);
  }
  const auto until = std::chrono::steady_clock::now() + 30ms;
  pump_until([&] { return std::chrono::steady_clock::now() > until; });
  for (const auto& e : p->events)
    EXPECT_EQ(e.kind(), Kind::error) << "a withdrawn job announced " << kind_name(e);
  EXPECT_TRUE(backend_->runs().empty()) << "a withdrawn job ran";
  EXPECT_EQ(svc_counter(*svc_, "jobs_withdrawn"), 3u);
  EXPECT_EQ(svc_counter(*svc_, "jobs_accepted"), 0u);
  EXPECT_EQ(svc_counter(*svc_, "journal_commit_failures"), 1u);
  EXPECT_EQ(svc_counter(*svc_, "jobs_waiting"), 0u);
  // The client retries with the same keys: accepted as new jobs (the keys were freed), and they run.
  for (std::uint64_t ud = 1; ud <= 3; ++ud)
    ASSERT_TRUE(p->client->submit(10 + ud, submit_record("w" + std::to_string(ud), 4, "key-" + std::to_string(ud))));
  for (std::uint64_t ud = 11; ud <= 13; ++ud) {
    const JobId j = wait_accepted(*p, ud);
    ASSERT_NE(j, 0u);
    ASSERT_TRUE(wait_finished(*p, j));
    EXPECT_FALSE(rbool(*p->find(Kind::accepted, ud), "existing"));
  }
  // Nothing of the withdrawn jobs is in the journal.
  svc_.reset();
  JobJournal::Options o;
  o.dir = dir_.path();
  o.fsync = false;
  auto jr = JobJournal::open(o);
  ASSERT_TRUE(jr) << describe(jr);
  EXPECT_EQ((*jr)->jobs().size(), 3u);
  for (const auto& [id, j] : (*jr)->jobs()) EXPECT_EQ(j.phase, "completed") << "job " << id;
}

TEST_F(RingHubTest, HungUpSubmitDoorbellDoesNotKeepTheLoopAwake) {
  ASSERT_NO_FATAL_FAILURE(start());
  auto r = hub_->open(alice_, {});
  ASSERT_TRUE(r) << describe(r);
  ::close(r->fds.sq_doorbell_write);  // the client hangs up its doorbell; it keeps the memfd and its bus name
  r->fds.sq_doorbell_write = -1;
  for (int i = 0; i < 3; ++i) {  // a few loop iterations as tandemd runs them
    hub_->process();
    if (hub_->prepare_sleep()) {
      std::vector<pollfd> pfds;
      for (int fd : hub_->fds()) pfds.push_back({fd, POLLIN, 0});
      (void)::poll(pfds.data(), pfds.size(), 0);
      hub_->finish_sleep();
    }
  }
  std::vector<pollfd> pfds;
  for (int fd : hub_->fds()) pfds.push_back({fd, POLLIN, 0});
  const int ready = pfds.empty() ? 0 : ::poll(pfds.data(), pfds.size(), 0);
  EXPECT_EQ(ready, 0) << "after the client closed its submit doorbell, " << ready
                      << " of the loop's ring fds stay ready (POLLHUP) for ever: tandemd's poll() returns at once "
                         "on every iteration (busy loop) while the session lives; want the session ended";
  r->fds.close_all();
}

}  // namespace
}  // namespace tandem::daemon
