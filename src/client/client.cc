#include "client/client.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include "client/client_impl.h"

namespace tandem::client {

namespace {

using Pair = sdbus::Struct<std::string, std::string>;

// "Failed to open bus (No medium found)" -> "Failed to open bus: No medium found"
std::string unparen(std::string_view m) {
  auto open = m.rfind(" (");
  if (open != std::string_view::npos && !m.empty() && m.back() == ')')
    return std::string(m.substr(0, open)) + ": " + std::string(m.substr(open + 2, m.size() - open - 3));
  return std::string(m);
}

// ---------------------------------------------------------------------------------------------------------------
// Interrupt pipe

int g_pipe[2] = {-1, -1};
volatile sig_atomic_t g_sigints = 0;
int g_second_exit = -1;

// Async-signal-safe: a counter, a write() and possibly _exit().
void note_signal(int sig) {
  int saved = errno;
  if (sig == SIGINT) {
    g_sigints = g_sigints + 1;
    if (g_sigints >= 2 && g_second_exit >= 0) {
      static const char msg[] = "\ninterrupted again: exiting now\n";
      ssize_t w = ::write(STDERR_FILENO, msg, sizeof msg - 1);
      (void)w;
      _exit(g_second_exit);
    }
  }
  unsigned char b = static_cast<unsigned char>(sig);
  if (g_pipe[1] >= 0) {
    ssize_t r = ::write(g_pipe[1], &b, 1);
    (void)r;
  }
  errno = saved;
}

extern "C" void on_interrupt(int sig) { note_signal(sig); }

std::uint64_t monotonic_usec() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000u + static_cast<std::uint64_t>(ts.tv_nsec) / 1000u;
}

bool valid_object_path(std::string_view p) {
  if (p.empty() || p.front() != '/') return false;
  if (p == "/") return true;
  if (p.back() == '/') return false;
  char prev = 0;
  for (char c : p) {
    if (c == '/' && prev == '/') return false;
    if (c != '/' && !(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
    prev = c;
  }
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Bus selection

std::string BusSpec::describe() const {
  switch (kind) {
    case BusKind::system:
      return "the system bus";
    case BusKind::session:
      return "the session bus";
    case BusKind::address:
      return "the bus at " + address;
  }
  return "the bus";
}

std::string BusSpec::flag() const {
  switch (kind) {
    case BusKind::system:
      return "--system";
    case BusKind::session:
      return "--session";
    case BusKind::address: {
      std::string q = "'";
      for (char c : address) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
      return "--address " + q + "'";
    }
  }
  return "";
}

Result<BusSpec> parse_bus_spec(std::string_view text) {
  if (text == "system") return BusSpec{BusKind::system, ""};
  if (text == "session") return BusSpec{BusKind::session, ""};
  constexpr std::string_view prefix = "address=";
  if (text.starts_with(prefix)) {
    std::string_view addr = text.substr(prefix.size());
    if (addr.empty())
      return fail(Errc::invalid_argument, "bus 'address=' needs a D-Bus address, e.g. address=unix:path=/run/bus");
    if (addr.find(':') == std::string_view::npos)
      return fail(Errc::invalid_argument,
                  "bus address '" + std::string(addr) +
                      "' is not a D-Bus address (transport:key=value, e.g. unix:path=/run/bus)");
    return BusSpec{BusKind::address, std::string(addr)};
  }
  return fail(Errc::invalid_argument,
              "bus '" + std::string(text) + "' is not one of system, session, address=<dbus address>");
}

Result<BusSpec> bus_spec_from_env() {
  const char* env = std::getenv("TANDEM_BUS");
  if (env == nullptr || *env == '\0') return BusSpec{};
  auto r = parse_bus_spec(env);
  if (!r.ok()) return fail(Errc::invalid_argument, "TANDEM_BUS: " + r.error().message);
  return r;
}

std::string connect_error_message(const BusSpec& bus, std::string_view error_name, std::string_view error_message) {
  std::string what = unparen(error_message);
  const bool plain = error_name.starts_with("System.Error.") ||
                     error_name == "org.freedesktop.DBus.Error.FileNotFound" ||
                     error_name == "org.freedesktop.DBus.Error.NoServer";
  if (!plain && !error_name.empty()) what = std::string(error_name) + ": " + what;
  std::string hint;
  switch (bus.kind) {
    case BusKind::system:
      hint = "is dbus running? use --session or --address";
      break;
    case BusKind::session:
      hint = "is a session bus running (DBUS_SESSION_BUS_ADDRESS)? use --system or --address";
      break;
    case BusKind::address:
      hint = "is the address right and the bus running? use --system or --session";
      break;
  }
  return "cannot connect to " + bus.describe() + " (" + what + "): " + hint;
}

Result<std::unique_ptr<sdbus::IConnection>> connect_bus(const BusSpec& bus) {
  try {
    switch (bus.kind) {
      case BusKind::system:
        return sdbus::createSystemBusConnection();
      case BusKind::session:
        return sdbus::createSessionBusConnection();
      case BusKind::address:
        return sdbus::createSessionBusConnectionWithAddress(bus.address);
    }
  } catch (const sdbus::Error& e) {
    return fail(Errc::io_error, connect_error_message(bus, e.getName(), e.getMessage()));
  } catch (const std::exception& e) {
    return fail(Errc::io_error, connect_error_message(bus, "", e.what()));
  }
  return fail(Errc::internal, "unknown bus kind");
}


// ---------------------------------------------------------------------------------------------------------------
// Requests

VariantMap to_dbus(const SubmitOptions& o) {
  VariantMap m;
  if (o.max_tokens) m["max_tokens"] = sdbus::Variant(static_cast<std::uint32_t>(*o.max_tokens));
  if (o.temperature) m["temperature"] = sdbus::Variant(static_cast<double>(*o.temperature));
  if (o.top_k) m["top_k"] = sdbus::Variant(static_cast<std::uint32_t>(*o.top_k));
  if (o.top_p) m["top_p"] = sdbus::Variant(static_cast<double>(*o.top_p));
  if (o.repetition_penalty) m["repetition_penalty"] = sdbus::Variant(static_cast<double>(*o.repetition_penalty));
  if (o.seed) m["seed"] = sdbus::Variant(static_cast<std::uint64_t>(*o.seed));
  if (o.stop) m["stop"] = sdbus::Variant(*o.stop);
  if (o.idempotency_key) m["idempotency_key"] = sdbus::Variant(*o.idempotency_key);
  if (o.side_effects) m["side_effects"] = sdbus::Variant(*o.side_effects);
  if (o.allow_cpu) m["allow_cpu"] = sdbus::Variant(*o.allow_cpu);
  if (o.allow_reduce) m["allow_reduce"] = sdbus::Variant(*o.allow_reduce);
  if (o.allow_fallback_model) m["allow_fallback_model"] = sdbus::Variant(*o.allow_fallback_model);
  if (o.enable_thinking) m["enable_thinking"] = sdbus::Variant(*o.enable_thinking);
  if (o.deadline_ms) m["deadline_ms"] = sdbus::Variant(static_cast<std::uint64_t>(*o.deadline_ms));
  if (o.prefill_chunk) m["prefill_chunk"] = sdbus::Variant(static_cast<std::uint32_t>(*o.prefill_chunk));
  if (o.resume_tokens) m["resume_tokens"] = sdbus::Variant(*o.resume_tokens);
  if (o.stream) m["stream"] = sdbus::Variant(*o.stream);
  return m;
}

sdbus::Variant to_dbus(const PolicyValue& v) {
  return std::visit([](const auto& x) { return sdbus::Variant(x); }, v);
}

VariantMap to_dbus(const std::map<std::string, PolicyValue>& policy) {
  VariantMap m;
  for (const auto& [k, v] : policy) m[k] = to_dbus(v);
  return m;
}

// ---------------------------------------------------------------------------------------------------------------
// Interrupts

Result<void> install_interrupt_handler(int second_sigint_exit_code) {
  static std::atomic<bool> thread_started{false};
  g_second_exit = second_sigint_exit_code;
  if (g_pipe[0] < 0) {
    if (::pipe2(g_pipe, O_NONBLOCK | O_CLOEXEC) != 0)
      return fail(Errc::io_error, std::string("pipe2 for signal handling: ") + std::strerror(errno));
  }
  // A handler for threads that do not block these signals (started before this call)...
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    if (::sigaction(sig, &sa, nullptr) != 0)
      return fail(Errc::io_error, std::string("sigaction: ") + std::strerror(errno));
  }
  // ...but normally they are blocked here (and in threads started later) and taken by a sigwait() thread: a signal
  // must never land in this thread, or sd_bus_call()'s ppoll() fails with EINTR and the reply of a call that was
  // already sent (a Submit!) is lost.
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
  if (int e = ::pthread_sigmask(SIG_BLOCK, &set, nullptr); e != 0)
    return fail(Errc::io_error, std::string("pthread_sigmask: ") + std::strerror(e));
  if (!thread_started.exchange(true)) {
    try {
      std::thread([set] {
        while (true) {
          int sig = 0;
          if (::sigwait(&set, &sig) == 0) note_signal(sig);
        }
      }).detach();
    } catch (const std::system_error& e) {
      return fail(Errc::io_error, std::string("signal thread: ") + e.what());
    }
  }
  // A closed stdout pipe (tandemctl run | head) must not kill us with SIGPIPE: writes fail with EPIPE instead.
  ::signal(SIGPIPE, SIG_IGN);
  return {};
}

int interrupt_fd() { return g_pipe[0]; }

std::vector<int> take_interrupts() {
  std::vector<int> out;
  if (g_pipe[0] < 0) return out;
  unsigned char buf[64];
  while (true) {
    ssize_t n = ::read(g_pipe[0], buf, sizeof buf);
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) out.push_back(buf[i]);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Client

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() {
  if (!impl_) return;
  // Proxies before the connection they reference.
  impl_->signals.reset();
  impl_->methods.reset();
}

Result<std::unique_ptr<Client>> Client::connect(const BusSpec& bus, std::string service) {
  auto conn = connect_bus(bus);
  if (!conn.ok()) return fail(conn.error());
  auto c = create(std::move(conn).value(), std::move(service));
  if (c.ok()) c.value()->impl_->bus_description = bus.describe();
  return c;
}

Result<std::unique_ptr<Client>> Client::create(std::unique_ptr<sdbus::IConnection> connection, std::string service) {
  if (!connection) return fail(Errc::invalid_argument, "Client::create: no connection");
  auto impl = std::make_unique<Impl>();
  impl->conn = std::move(connection);
  impl->service = std::move(service);
  try {
    impl->methods = std::make_unique<MethodProxy>(*impl->conn, impl->service);
  } catch (const sdbus::Error& e) {
    return fail(Errc::internal, "creating the D-Bus proxy: " + e.getName() + ": " + e.getMessage());
  }
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

const std::string& Client::service() const { return impl_->service; }

std::string Client::unique_name() const {
  try {
    return impl_->conn->getUniqueName();
  } catch (const sdbus::Error&) {
    return "";
  }
}

sdbus::IConnection& Client::connection() { return *impl_->conn; }

namespace {

std::vector<Pair> to_pairs(const std::vector<ChatMessage>& msgs) {
  std::vector<Pair> out;
  out.reserve(msgs.size());
  for (const auto& m : msgs) out.emplace_back(m.role, m.content);
  return out;
}

}  // namespace

Result<SubmitResult> Client::submit(const Request& r) {
  return impl_->guarded<SubmitResult>("Submit", [&] {
    auto [id, placement] = impl_->methods->Submit(r.model, r.prompt, to_pairs(r.messages), to_dbus(r.options));
    return SubmitResult{id, placement_from_dbus(placement)};
  });
}

Result<PlanDecision> Client::plan(const Request& r) {
  return impl_->guarded<PlanDecision>("Plan", [&] {
    return plan_from_dbus(impl_->methods->Plan(r.model, r.prompt, to_pairs(r.messages), to_dbus(r.options)));
  });
}

Result<std::string> Client::cancel(std::uint64_t job_id) {
  return impl_->guarded<std::string>("Cancel", [&] { return impl_->methods->Cancel(job_id); });
}

Result<JobInfo> Client::get_job(std::uint64_t job_id) {
  return impl_->guarded<JobInfo>("GetJob", [&] { return job_from_dbus(impl_->methods->GetJob(job_id)); });
}

Result<SubmitResult> Client::resume(std::uint64_t job_id, const SubmitOptions& overrides) {
  return impl_->guarded<SubmitResult>("Resume", [&] {
    auto [id, placement] = impl_->methods->Resume(job_id, to_dbus(overrides));
    return SubmitResult{id, placement_from_dbus(placement)};
  });
}

Result<std::string> Client::hold_gpu(const std::string& reason, const std::string& app_id) {
  return impl_->guarded<std::string>("HoldGpu", [&] { return impl_->methods->HoldGpu(reason, app_id); });
}

Result<void> Client::release_gpu(const std::string& cookie) {
  return impl_->guarded<void>("ReleaseGpu", [&] { impl_->methods->ReleaseGpu(cookie); });
}

Result<ResidencyReply> Client::load_model(const std::string& model, const std::string& device) {
  return impl_->guarded<ResidencyReply>("LoadModel",
                                        [&] { return residency_from_dbus(impl_->methods->LoadModel(model, device)); });
}

Result<ResidencyReply> Client::unload_model(const std::string& model, const std::string& device) {
  return impl_->guarded<ResidencyReply>("UnloadModel",
                                        [&] { return residency_from_dbus(impl_->methods->UnloadModel(model, device)); });
}

SessionHandles::SessionHandles(SessionHandles&& o) noexcept
    : session_id(o.session_id),
      memfd(std::exchange(o.memfd, -1)),
      submit_doorbell(std::exchange(o.submit_doorbell, -1)),
      completion_doorbell(std::exchange(o.completion_doorbell, -1)),
      layout(std::move(o.layout)) {}

SessionHandles& SessionHandles::operator=(SessionHandles&& o) noexcept {
  if (this != &o) {
    this->~SessionHandles();
    new (this) SessionHandles(std::move(o));
  }
  return *this;
}

SessionHandles::~SessionHandles() {
  for (int fd : {memfd, submit_doorbell, completion_doorbell})
    if (fd >= 0) ::close(fd);
}

Result<Client::SessionHandles> Client::open_session(const SessionOptions& o) {
  return impl_->guarded<SessionHandles>("OpenSession", [&] {
    VariantMap opts;
    if (o.sq_entries) opts.emplace("sq_entries", sdbus::Variant(o.sq_entries));
    if (o.cq_entries) opts.emplace("cq_entries", sdbus::Variant(o.cq_entries));
    if (o.request_data_bytes) opts.emplace("request_data_bytes", sdbus::Variant(o.request_data_bytes));
    if (o.response_data_bytes) opts.emplace("response_data_bytes", sdbus::Variant(o.response_data_bytes));
    auto [id, memfd, sq, cq, layout] = impl_->methods->OpenSession(opts);
    SessionHandles h;
    h.session_id = id;
    h.memfd = memfd.release();
    h.submit_doorbell = sq.release();
    h.completion_doorbell = cq.release();
    h.layout = std::move(layout);
    return h;
  });
}

Result<void> Client::close_session(std::uint64_t session_id) {
  return impl_->guarded<void>("CloseSession", [&] { impl_->methods->CloseSession(session_id); });
}

Result<std::vector<ModelInfo>> Client::list_models() {
  return impl_->guarded<std::vector<ModelInfo>>("ListModels", [&] {
    std::vector<ModelInfo> out;
    for (const auto& m : impl_->methods->ListModels()) out.push_back(model_from_dbus(m));
    return out;
  });
}

Result<ModelDetails> Client::model_details(const std::string& object_path) {
  return impl_->guarded<ModelDetails>("Model GetAll", [&] {
    if (!valid_object_path(object_path))
      throw sdbus::Error("org.freedesktop.DBus.Error.InvalidArgs", "'" + object_path + "' is not an object path");
    ModelProxy proxy(*impl_->conn, impl_->service, object_path);
    ModelDetails d = model_details_from_dbus(proxy.GetAll(kModelInterface));
    d.path = object_path;
    return d;
  });
}

Result<ServiceStatus> Client::status() {
  return impl_->guarded<ServiceStatus>("GetAll", [&] { return status_from_dbus(impl_->methods->GetAll(kInterface)); });
}

Result<PolicySettings> Client::policy() {
  return impl_->guarded<PolicySettings>("Get Policy", [&] {
    sdbus::Variant v = impl_->methods->Get(kInterface, "Policy");
    if (!v.containsValueOfType<VariantMap>())
      throw sdbus::Error("org.freedesktop.DBus.Error.InvalidSignature",
                         "Policy has type " + v.peekValueType() + ", expected a{sv}");
    return policy_from_dbus(v.get<VariantMap>());
  });
}

Result<void> Client::set_policy(const std::map<std::string, PolicyValue>& values) {
  return impl_->guarded<void>("Set Policy",
                              [&] { impl_->methods->Set(kInterface, "Policy", sdbus::Variant(to_dbus(values))); });
}

Result<std::string> Client::version() {
  return impl_->guarded<std::string>("Get Version", [&] {
    sdbus::Variant v = impl_->methods->Get(kInterface, "Version");
    if (!v.containsValueOfType<std::string>())
      throw sdbus::Error("org.freedesktop.DBus.Error.InvalidSignature", "Version is not a string");
    return v.get<std::string>();
  });
}

Result<void> Client::set_foreign_load(std::uint64_t bytes) {
  return impl_->guarded<void>("Testing.SetForeignLoad", [&] { impl_->methods->SetForeignLoad(bytes); });
}
Result<void> Client::fail_allocations(std::uint32_t n, const std::string& site) {
  return impl_->guarded<void>("Testing.FailAllocations", [&] { impl_->methods->FailAllocations(n, site); });
}
Result<void> Client::fail_probes(std::uint32_t n) {
  return impl_->guarded<void>("Testing.FailProbes", [&] { impl_->methods->FailProbes(n); });
}
Result<void> Client::set_reading_lag(std::uint64_t ms) {
  return impl_->guarded<void>("Testing.SetReadingLag", [&] { impl_->methods->SetReadingLag(ms); });
}
Result<void> Client::lose_device() {
  return impl_->guarded<void>("Testing.LoseDevice", [&] { impl_->methods->LoseDevice(); });
}
Result<void> Client::recover_device() {
  return impl_->guarded<void>("Testing.RecoverDevice", [&] { impl_->methods->RecoverDevice(); });
}
Result<Counters> Client::counters() {
  return impl_->guarded<Counters>("Testing.GetCounters", [&] { return impl_->methods->GetCounters(); });
}

Result<void> Client::subscribe() {
  if (impl_->signals) return {};
  Impl* impl = impl_.get();
  return impl_->guarded<void>("subscribe", [&] {
    auto proxy = sdbus::createProxy(*impl->conn, impl->service, kObjectPath);
    proxy->registerSignalHandler(kInterface, "JobUpdate", [impl](sdbus::Signal& sig) {
      std::uint64_t id = 0;
      std::string kind;
      VariantMap data;
      try {
        sig >> id >> kind >> data;
      } catch (const std::exception& e) {
        impl->note_malformed(std::string("JobUpdate: ") + e.what());
        return;
      }
      try {
        impl->deliver(job_update_from_dbus(id, kind, data));
      } catch (...) {
        impl->note_malformed("JobUpdate: the callback threw");
      }
    });
    proxy->registerSignalHandler(kInterface, "DegradedModeChanged", [impl](sdbus::Signal& sig) {
      bool degraded = false;
      std::string reason;
      VariantMap details;
      try {
        sig >> degraded >> reason >> details;
      } catch (const std::exception& e) {
        impl->note_malformed(std::string("DegradedModeChanged: ") + e.what());
        return;
      }
      DegradedChange d = degraded_from_dbus(degraded, reason, details);
      impl->last_degraded = d;
      try {
        if (impl->degraded_cb) impl->degraded_cb(d);
      } catch (...) {
        impl->note_malformed("DegradedModeChanged: the callback threw");
      }
    });
    proxy->registerSignalHandler("org.freedesktop.DBus.Properties", "PropertiesChanged", [impl](sdbus::Signal& sig) {
      std::string iface;
      VariantMap changed;
      std::vector<std::string> invalidated;
      try {
        sig >> iface >> changed >> invalidated;
      } catch (const std::exception& e) {
        impl->note_malformed(std::string("PropertiesChanged: ") + e.what());
        return;
      }
      if (iface != kInterface) return;
      PropertiesChange c;
      c.values = status_from_dbus(changed);
      for (const auto& [k, v] : changed) c.changed.push_back(k);
      c.invalidated = std::move(invalidated);
      try {
        if (impl->props_cb) impl->props_cb(c);
      } catch (...) {
        impl->note_malformed("PropertiesChanged: the callback threw");
      }
    });
    proxy->finishRegistration();
    impl->signals = std::move(proxy);
  });
}

std::vector<JobUpdate> Client::take_job_updates(std::uint64_t job_id) {
  std::vector<JobUpdate> out;
  auto it = impl_->updates.find(job_id);
  if (it == impl_->updates.end()) return out;
  out.assign(std::make_move_iterator(it->second.begin()), std::make_move_iterator(it->second.end()));
  impl_->updates.erase(it);
  return out;
}

void Client::forget_job_updates(std::uint64_t job_id) {
  impl_->updates.erase(job_id);
  impl_->dropped.erase(job_id);
}

std::uint64_t Client::dropped_job_updates(std::uint64_t job_id) const {
  auto it = impl_->dropped.find(job_id);
  return it == impl_->dropped.end() ? 0 : it->second;
}

void Client::on_job_update(std::function<void(const JobUpdate&)> callback) { impl_->job_cb = std::move(callback); }
void Client::on_degraded_change(std::function<void(const DegradedChange&)> callback) {
  impl_->degraded_cb = std::move(callback);
}
void Client::on_properties_change(std::function<void(const PropertiesChange&)> callback) {
  impl_->props_cb = std::move(callback);
}

Result<void> Client::fill_invalidated(PropertiesChange& change) {
  if (change.invalidated.empty()) return {};
  auto all = impl_->guarded<VariantMap>("GetAll", [&] { return impl_->methods->GetAll(kInterface); });
  if (!all.ok()) return fail(all.error());
  VariantMap picked;
  for (const auto& name : change.invalidated) {
    auto it = all->find(name);
    if (it != all->end()) picked.emplace(name, it->second);
  }
  ServiceStatus fresh = status_from_dbus(picked);
  ServiceStatus& s = change.values;
  for (const auto& [name, v] : picked) {
    if (name == "State")
      s.state = fresh.state;
    else if (name == "DegradedReason")
      s.degraded_reason = fresh.degraded_reason;
    else if (name == "GpuBreaker")
      s.gpu_breaker = fresh.gpu_breaker;
    else if (name == "Policy")
      s.policy = fresh.policy;
    else if (name == "Memory")
      s.memory = fresh.memory;
    else if (name == "HostMemory")
      s.host_memory = fresh.host_memory;
    else if (name == "Queues")
      s.queues = fresh.queues;
    else if (name == "Limits")
      s.limits = fresh.limits;
    else if (name == "Holds")
      s.holds = fresh.holds;
    else if (name == "FallbackModel")
      s.fallback_model = fresh.fallback_model;
    else if (name == "Version")
      s.version = fresh.version;
    change.changed.push_back(name);
  }
  std::vector<std::string> still;
  for (const auto& name : change.invalidated)
    if (!picked.count(name)) still.push_back(name);
  change.invalidated = std::move(still);
  return {};
}

std::optional<DegradedChange> Client::last_degraded_change() const { return impl_->last_degraded; }
std::uint64_t Client::malformed_signals() const { return impl_->malformed; }
std::string Client::last_malformed_signal() const { return impl_->last_malformed; }
const std::optional<RemoteError>& Client::last_error() const { return impl_->last_error; }

Result<Wake> Client::process(std::chrono::milliseconds max_wait, int extra_fd) {
  const std::uint64_t deadline =
      monotonic_usec() + static_cast<std::uint64_t>(std::max<std::int64_t>(0, max_wait.count())) * 1000u;
  auto lost = [&](const std::string& what) {
    return fail(Errc::io_error, "lost the connection to " + impl_->bus_description + ": " + what);
  };
  auto drain = [&]() -> Result<bool> {
    bool any = false;
    try {
      while (impl_->conn->processPendingRequest()) any = true;
    } catch (const sdbus::Error& e) {
      return lost(e.getName() + ": " + unparen(e.getMessage()));
    }
    return any;
  };
  while (true) {
    auto any = drain();
    if (!any.ok()) return fail(any.error());
    if (*any) return Wake::dispatched;

    sdbus::IConnection::PollData pd{};
    try {
      pd = impl_->conn->getEventLoopPollData();
    } catch (const sdbus::Error& e) {
      return lost(e.getName() + ": " + unparen(e.getMessage()));
    }
    const std::uint64_t now = monotonic_usec();
    std::uint64_t until = deadline;
    if (pd.timeout_usec != std::numeric_limits<std::uint64_t>::max()) until = std::min(until, pd.timeout_usec);
    int timeout_ms = until <= now ? 0 : static_cast<int>(std::min<std::uint64_t>((until - now + 999) / 1000, 1u << 30));

    pollfd fds[2] = {{pd.fd, pd.events, 0}, {extra_fd, POLLIN, 0}};
    const nfds_t n = extra_fd >= 0 ? 2 : 1;
    int r = ::poll(fds, n, timeout_ms);
    if (r < 0 && errno != EINTR) return fail(Errc::io_error, std::string("poll: ") + std::strerror(errno));
    if (n == 2) {
      pollfd check{extra_fd, POLLIN, 0};
      if (::poll(&check, 1, 0) > 0 && (check.revents & (POLLIN | POLLHUP | POLLERR))) return Wake::interrupted;
    }
    if (r > 0 && (fds[0].revents & (POLLERR | POLLHUP | POLLNVAL)) && !(fds[0].revents & POLLIN)) {
      auto d = drain();
      if (!d.ok()) return fail(d.error());
      if (*d) return Wake::dispatched;
      return lost("the bus closed the connection");
    }
    if (monotonic_usec() >= deadline) {
      auto d = drain();
      if (!d.ok()) return fail(d.error());
      return *d ? Wake::dispatched : Wake::timed_out;
    }
  }
}

}  // namespace tandem::client
