#include "daemon/dbus_server.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "daemon/dbus_requests.h"
#include "daemon/log.h"
#include "io_tandem_Tandem1_Model_adaptor.h"
#include "io_tandem_Tandem1_Testing_adaptor.h"
#include "io_tandem_Tandem1_adaptor.h"

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "0.0.0"
#endif

namespace tandem::daemon {

namespace {

constexpr const char* kIface = "io.tandem.Tandem1";
constexpr const char* kPath = "/io/tandem/Tandem1";
constexpr const char* kErrPrefix = "io.tandem.Tandem1.Error.";

[[noreturn]] void throw_error(const Error& e, const char* not_found = "UnknownJob") { throw to_dbus_error(e, not_found); }

template <class T>
T unwrap(Result<T>&& r, const char* not_found = "UnknownJob") {
  if (!r) throw_error(r.error(), not_found);
  return std::move(r).value();
}

void unwrap(Status&& s, const char* not_found = "UnknownJob") {
  if (!s) throw_error(s.error(), not_found);
}

std::string escape_path_element(const std::string& s) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  bool first = true;
  for (unsigned char c : s) {
    // As sd_bus_path_encode: [A-Za-z0-9] kept, except a leading digit; every other byte as _xx.
    const bool digit = c >= '0' && c <= '9';
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (digit && !first)) {
      out += static_cast<char>(c);
    } else {
      out += '_';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
    first = false;
  }
  return out.empty() ? "_" : out;
}

std::vector<gen::Message> to_messages(const std::vector<sdbus::Struct<std::string, std::string>>& in) {
  std::vector<gen::Message> out;
  out.reserve(in.size());
  for (const auto& m : in) out.push_back({std::get<0>(m), std::get<1>(m)});
  return out;
}

}  // namespace

std::string model_object_path(const std::string& name) {
  return std::string(kPath) + "/models/" + escape_path_element(name);
}

sdbus::Error to_dbus_error(const Error& e, const char* not_found_name) {
  const char* name = "Internal";
  switch (e.code) {
    case Errc::invalid_argument:
    case Errc::parse_error:
    case Errc::format_error: name = "InvalidArgument"; break;
    case Errc::not_found: name = not_found_name; break;
    case Errc::permission_denied: name = "NotAuthorized"; break;
    case Errc::rejected: name = "Busy"; break;
    case Errc::queue_full: name = "QueueFull"; break;
    case Errc::host_memory: name = "HostMemory"; break;
    case Errc::resumable: name = "Resumable"; break;
    case Errc::incompatible: name = "Incompatible"; break;
    case Errc::duplicate: name = "Duplicate"; break;
    case Errc::illegal_transition:
    case Errc::cancelled: name = "IllegalState"; break;
    case Errc::unavailable:
    case Errc::device_lost: name = "Unavailable"; break;
    case Errc::unsupported: name = "NotSupported"; break;
    case Errc::timeout: name = "Timeout"; break;
    default: name = "Internal"; break;
  }
  return sdbus::Error(std::string(kErrPrefix) + name, e.message);
}

Result<SubmitOptions> parse_submit_options(const std::map<std::string, sdbus::Variant>& options) {
  SubmitOptions o;
  if (options.size() > kMaxOptions) return fail(Errc::invalid_argument, "at most 64 options");
  for (const auto& [k, v] : options) {
    const std::string t = v.peekValueType();
    const std::string got = "D-Bus type '" + t + "'";
    OptionValue x;
    if (t == "b") x = v.get<bool>();
    else if (t == "y") x = std::uint64_t{v.get<std::uint8_t>()};
    else if (t == "q") x = std::uint64_t{v.get<std::uint16_t>()};
    else if (t == "u") x = std::uint64_t{v.get<std::uint32_t>()};
    else if (t == "t") x = v.get<std::uint64_t>();
    else if (t == "n") x = std::int64_t{v.get<std::int16_t>()};
    else if (t == "i") x = std::int64_t{v.get<std::int32_t>()};
    else if (t == "x") x = v.get<std::int64_t>();
    else if (t == "d") x = v.get<double>();
    else if (t == "s") x = v.get<std::string>();
    else if (t == "as") x = v.get<std::vector<std::string>>();
    else if (t == "ai") x = v.get<std::vector<std::int32_t>>();
    else if (!is_option(k)) return fail(apply_option(o, k, x).error());  // "unknown option ..."
    else return fail(Errc::invalid_argument, "option '" + k + "' cannot be of " + got);
    if (auto st = apply_option(o, k, x, got); !st) return fail(std::move(st).error());
  }
  return o;
}

std::map<std::string, sdbus::Variant> to_variant_map(const Dict& d) {
  std::map<std::string, sdbus::Variant> out;
  for (const auto& [k, v] : d) {
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::vector<std::pair<std::string, std::string>>>) {
            std::vector<sdbus::Struct<std::string, std::string>> s;
            for (const auto& [a, b] : x) s.emplace_back(a, b);
            out.emplace(k, sdbus::Variant(s));
          } else if constexpr (std::is_same_v<T, std::vector<HistoryRow>>) {
            std::vector<sdbus::Struct<std::string, std::string, std::string, std::int64_t>> s;
            for (const auto& [a, b, c, t] : x) s.emplace_back(a, b, c, t);
            out.emplace(k, sdbus::Variant(s));
          } else {
            out.emplace(k, sdbus::Variant(x));
          }
        },
        v);
  }
  return out;
}

Result<Dict> from_variant_map(const std::map<std::string, sdbus::Variant>& m) {
  Dict d;
  for (const auto& [k, v] : m) {
    const std::string t = v.peekValueType();
    if (t == "b") d[k] = v.get<bool>();
    else if (t == "d") d[k] = v.get<double>();
    else if (t == "s") d[k] = v.get<std::string>();
    else if (t == "as") d[k] = v.get<std::vector<std::string>>();
    else if (t == "y" || t == "q" || t == "u" || t == "t" || t == "n" || t == "i" || t == "x") {
      auto u = get_uint(k, v, std::numeric_limits<std::uint64_t>::max());
      if (!u) return fail(std::move(u).error());
      d[k] = *u;
    } else {
      return fail(Errc::invalid_argument, "Policy." + k.substr(0, 64) + ": unsupported D-Bus type '" + t + "'");
    }
  }
  return d;
}

// ---------------------------------------------------------------------------------------------------------------

struct Creds {
  std::uint32_t uid = 0;
  bool may_submit = false;
  bool admin = false;
};

struct DbusServer::Impl {
  std::unique_ptr<sdbus::IConnection> conn;
  std::string bus_name;
  Service* service = nullptr;
  RingHub* rings = nullptr;
  AuthConfig auth;
  std::map<std::string, Creds> creds_cache;  // by unique name; dropped on NameOwnerChanged
  std::unique_ptr<sdbus::IProxy> bus_proxy;
  class Main;
  class Testing;
  class Model;
  std::unique_ptr<Main> main;
  std::unique_ptr<Testing> testing;
  std::vector<std::unique_ptr<Model>> models;

  Caller caller(const sdbus::IObject& obj);
  Creds resolve(const sdbus::Message& msg);
  // From the user database only (re-authorizing open ring sessions after SIGHUP).
  Creds resolve_uid(std::uint32_t uid, std::vector<gid_t> extra_gids);
};

// The caller's uid is the EUID the bus itself reports (GetConnectionCredentials "UnixUserID": SO_PEERCRED at
// connect time, the same uid the bus policy applies). sd-bus fills the *real* UID, the GID and the supplementary
// groups only by reading the caller's /proc/PID/status, which the unit hides (ProtectProc=invisible, and
// PrivateUsers=yes maps other users to nobody): under systemd getCredsUid() fails for every caller
// (tests/system/run.sh). Groups come from the user database in resolve_uid(); /proc's are a bonus when visible.
Creds DbusServer::Impl::resolve(const sdbus::Message& msg) {
  std::vector<gid_t> extra;
  try {
    for (auto g : msg.getCredsSupplementaryGids()) extra.push_back(g);
    extra.push_back(msg.getCredsGid());
  } catch (const sdbus::Error&) {
  }
  return resolve_uid(msg.getCredsEuid(), std::move(extra));
}

Creds DbusServer::Impl::resolve_uid(std::uint32_t uid, std::vector<gid_t> extra_gids) {
  Creds c;
  c.uid = uid;
  std::vector<gid_t> gids;
  gid_t primary = static_cast<gid_t>(-1);
  // Group membership from the user database (the bus's supplementary-group credentials are not always present).
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (getpwuid_r(c.uid, &pw, buf.data(), buf.size(), &found) == 0 && found) {
    primary = pw.pw_gid;
    int n = 64;
    gids.resize(static_cast<std::size_t>(n));
    if (getgrouplist(pw.pw_name, pw.pw_gid, gids.data(), &n) < 0) {
      gids.resize(static_cast<std::size_t>(n));
      getgrouplist(pw.pw_name, pw.pw_gid, gids.data(), &n);
    }
    gids.resize(static_cast<std::size_t>(std::max(n, 0)));
  }
  gids.insert(gids.end(), extra_gids.begin(), extra_gids.end());
  if (primary != static_cast<gid_t>(-1)) gids.push_back(primary);
  auto in_group = [&](const std::string& name) {
    if (name.empty()) return false;
    std::vector<char> gb(16384);
    group gr{};
    group* g = nullptr;
    if (getgrnam_r(name.c_str(), &gr, gb.data(), gb.size(), &g) != 0 || !g) return false;
    return std::find(gids.begin(), gids.end(), g->gr_gid) != gids.end();
  };
  c.admin = c.uid == 0 || in_group(auth.admin_group);
  c.may_submit = c.admin || auth.allow_any_local_user || in_group(auth.submit_group);
  return c;
}

Caller DbusServer::Impl::caller(const sdbus::IObject& obj) {
  const sdbus::Message* msg = obj.getCurrentlyProcessedMessage();
  Caller c;
  if (!msg) return c;
  c.bus_name = msg->getSender();
  auto it = creds_cache.find(c.bus_name);
  if (it == creds_cache.end()) {
    Creds cr;
    try {
      cr = resolve(*msg);
    } catch (const sdbus::Error& e) {
      throw sdbus::Error(std::string(kErrPrefix) + "NotAuthorized", "cannot read the caller's credentials: " + e.getMessage());
    }
    it = creds_cache.emplace(c.bus_name, cr).first;
  }
  c.uid = it->second.uid;
  c.may_submit = it->second.may_submit;
  c.admin = it->second.admin;
  return c;
}

class DbusServer::Impl::Main final
    : public sdbus::AdaptorInterfaces<io::tandem::Tandem1_adaptor, sdbus::Properties_adaptor> {
 public:
  Main(Impl& impl, sdbus::IConnection& conn) : AdaptorInterfaces(conn, kPath), impl_(impl) { registerAdaptor(); }
  ~Main() { unregisterAdaptor(); }

  sdbus::IObject& object() { return getObject(); }

 private:
  Caller who() { return impl_.caller(getObject()); }
  Service& s() { return *impl_.service; }
  // The reply is the acknowledgement: what this call journaled (an accept, a cancelled job's outcome) is made
  // durable first. The commit covers everything pending (ring accepts, outcomes: they share the fdatasync); if it
  // fails, the jobs accepted since the last commit are withdrawn and the caller gets Internal (docs/journal.md).
  void commit() { unwrap(s().commit()); }

  SubmitRequest request(const std::string& model, const std::string& prompt,
                        const std::vector<sdbus::Struct<std::string, std::string>>& messages,
                        const std::map<std::string, sdbus::Variant>& options) {
    SubmitRequest r;
    r.model = model;
    r.prompt = prompt;
    r.messages = to_messages(messages);
    r.options = unwrap(parse_submit_options(options));
    return r;
  }

  std::tuple<uint64_t, std::map<std::string, sdbus::Variant>> Submit(
      const std::string& model, const std::string& prompt,
      const std::vector<sdbus::Struct<std::string, std::string>>& messages,
      const std::map<std::string, sdbus::Variant>& options) override {
    const Caller c = who();
    auto placement = unwrap(s().submit(c, request(model, prompt, messages, options)), "UnknownModel");
    commit();
    const auto id = std::get<std::uint64_t>(placement.at("job_id"));
    return {id, to_variant_map(placement)};
  }
  std::map<std::string, sdbus::Variant> Plan(const std::string& model, const std::string& prompt,
                                             const std::vector<sdbus::Struct<std::string, std::string>>& messages,
                                             const std::map<std::string, sdbus::Variant>& options) override {
    const Caller c = who();
    return to_variant_map(unwrap(s().plan(c, request(model, prompt, messages, options)), "UnknownModel"));
  }
  std::string Cancel(const uint64_t& job_id) override {
    auto state = unwrap(s().cancel(who(), job_id));
    commit();
    return state;
  }
  std::map<std::string, sdbus::Variant> GetJob(const uint64_t& job_id) override {
    if (s().commit_pending()) commit();  // a state that is not durable yet is not shown
    return to_variant_map(unwrap(s().get_job(who(), job_id)));
  }
  std::tuple<uint64_t, std::map<std::string, sdbus::Variant>> Resume(
      const uint64_t& job_id, const std::map<std::string, sdbus::Variant>& options) override {
    const Caller c = who();
    auto o = unwrap(parse_submit_options(options));
    auto placement = unwrap(s().resume(c, job_id, o));
    commit();
    const auto id = std::get<std::uint64_t>(placement.at("job_id"));
    return {id, to_variant_map(placement)};
  }
  std::string HoldGpu(const std::string& reason, const std::string& app_id) override {
    return unwrap(s().hold_gpu(who(), reason, app_id));
  }
  void ReleaseGpu(const std::string& cookie) override { unwrap(s().release_gpu(who(), cookie), "InvalidArgument"); }
  std::map<std::string, sdbus::Variant> UnloadModel(const std::string& model, const std::string& device) override {
    return to_variant_map(unwrap(s().unload_model(who(), model, device), "UnknownModel"));
  }
  std::map<std::string, sdbus::Variant> LoadModel(const std::string& model, const std::string& device) override {
    return to_variant_map(unwrap(s().load_model(who(), model, device), "UnknownModel"));
  }
  std::tuple<uint64_t, sdbus::UnixFd, sdbus::UnixFd, sdbus::UnixFd, std::map<std::string, sdbus::Variant>> OpenSession(
      const std::map<std::string, sdbus::Variant>& options) override {
    if (!impl_.rings) throw_error(make_error(Errc::unavailable, "ring sessions are not available"));
    const Caller c = who();
    auto opts = unwrap(from_variant_map(options), "InvalidArgument");
    auto opened = unwrap(impl_.rings->open(c, opts));
    // The UnixFds own our copies of the client's ends; the reply carries duplicates and ours close after sending.
    sdbus::UnixFd memfd(opened.fds.memfd, sdbus::adopt_fd);
    sdbus::UnixFd sq(opened.fds.sq_doorbell_write, sdbus::adopt_fd);
    sdbus::UnixFd cq(opened.fds.cq_doorbell_read, sdbus::adopt_fd);
    return {opened.session_id, std::move(memfd), std::move(sq), std::move(cq), to_variant_map(opened.layout)};
  }
  void CloseSession(const uint64_t& session_id) override {
    if (!impl_.rings) throw_error(make_error(Errc::not_found, "no ring session " + std::to_string(session_id)));
    unwrap(impl_.rings->close(who(), session_id));
  }
  std::tuple<uint64_t, std::map<std::string, sdbus::Variant>> Transcribe(
      const std::string& model, const std::vector<sdbus::UnixFd>& audio_fd, const std::vector<uint8_t>& audio,
      const std::map<std::string, sdbus::Variant>& options) override {
    const Caller c = who();
    auto req = unwrap(transcribe_request(model, audio_fd, audio, options, s().config().speech), "UnknownModel");
    auto placement = unwrap(s().transcribe(c, req), "UnknownModel");
    commit();
    const auto id = std::get<std::uint64_t>(placement.at("job_id"));
    return {id, to_variant_map(placement)};
  }
  // The reply comes when the job ends (an async method): the Result moves into the job's completion callback.
  void Embed(sdbus::Result<std::vector<std::vector<double>>, std::map<std::string, sdbus::Variant>>&& result,
             std::string model, std::vector<std::string> texts, std::vector<sdbus::UnixFd> image_fds,
             std::vector<std::vector<uint8_t>> images, std::map<std::string, sdbus::Variant> options) override {
    auto reply = std::make_shared<sdbus::Result<std::vector<std::vector<double>>, std::map<std::string, sdbus::Variant>>>(
        std::move(result));
    auto done = [reply](Result<EmbedReply> r) {
      try {
        if (!r) {
          reply->returnError(to_dbus_error(r.error(), "UnknownModel"));
          return;
        }
        std::vector<std::vector<double>> v;
        v.reserve(r->vectors.size());
        for (const auto& x : r->vectors) v.emplace_back(x.begin(), x.end());
        reply->returnResults(v, to_variant_map(r->result));
      } catch (const sdbus::Error& e) {
        log::debug("Embed reply not sent: {}", e.getMessage());
      }
    };
    Caller c;
    try {
      c = who();
    } catch (const sdbus::Error& e) {
      reply->returnError(e);
      return;
    }
    auto req = embed_request(std::move(model), std::move(texts), image_fds, std::move(images), options);
    if (!req) {
      done(fail(std::move(req).error()));
      return;
    }
    s().embed(c, std::move(req).value(), std::move(done));
    try {
      commit();
    } catch (const sdbus::Error& e) {  // the failed commit already answered the withdrawn job's call
      log::debug("Embed: {}", e.getMessage());
    }
  }
  // Validates the call's shape and reads the image fds (bounded: max_image_bytes + 1 bytes each).
  Result<EmbedRequest> embed_request(std::string model, std::vector<std::string> texts,
                                     const std::vector<sdbus::UnixFd>& fds, std::vector<std::vector<uint8_t>> images,
                                     const std::map<std::string, sdbus::Variant>& options) {
    EmbedRequest r;
    r.model = std::move(model);
    r.texts = std::move(texts);
    for (const auto& [k, v] : options) {
      const std::string t = v.peekValueType();
      if (k == "idempotency_key") {
        if (t != "s") return bad_type(k, "a string", t);
        r.options.idempotency_key = v.get<std::string>();
      } else if (k == "allow_cpu" || k == "truncate") {
        if (t != "b") return bad_type(k, "a boolean", t);
        (k == "allow_cpu" ? r.options.allow_cpu : r.options.truncate) = v.get<bool>();
      } else if (k == "deadline_ms") {
        auto u = get_uint(k, v, 7ull * 24 * 3600 * 1000);
        if (!u) return fail(std::move(u).error());
        r.options.deadline_ms = *u;
      } else if (k == "tokens") {
        if (t != "aau") return bad_type(k, "an array of token-id arrays (aau)", t);
        for (const auto& ids : v.get<std::vector<std::vector<std::uint32_t>>>())
          r.tokens.emplace_back(ids.begin(), ids.end());
      } else {
        return fail(Errc::invalid_argument, "unknown Embed option '" + k.substr(0, 64) +
                                                "' (allowed: idempotency_key, allow_cpu, deadline_ms, truncate, tokens)");
      }
    }
    const auto& lim = s().config().embedding;
    const std::size_t inputs = r.texts.size() + r.tokens.size() + fds.size() + images.size();
    if (inputs > lim.max_inputs)  // before reading any fd
      return fail(Errc::invalid_argument, "at most " + std::to_string(lim.max_inputs) + " inputs per call, got " +
                                              std::to_string(inputs));
    for (std::size_t i = 0; i < fds.size(); ++i) {
      auto bytes = read_regular_fd(fds[i].get(), lim.max_image_bytes, "[embedding] max_image_bytes");
      if (!bytes) return fail(Errc::invalid_argument, "image_fds[" + std::to_string(i) + "]: " + bytes.error().message);
      r.images.push_back(std::make_shared<const std::vector<std::uint8_t>>(std::move(bytes).value()));
      r.image_names.push_back("image_fds[" + std::to_string(i) + "]");
    }
    for (std::size_t i = 0; i < images.size(); ++i) {
      r.images.push_back(std::make_shared<const std::vector<std::uint8_t>>(std::move(images[i])));
      r.image_names.push_back("images[" + std::to_string(i) + "]");
    }
    return r;
  }
  std::vector<std::map<std::string, sdbus::Variant>> ListModels() override {
    std::vector<std::map<std::string, sdbus::Variant>> out;
    for (const auto& d : s().list_models()) {
      auto m = to_variant_map(d);
      m.emplace("path", sdbus::Variant(sdbus::ObjectPath(model_object_path(std::get<std::string>(d.at("name"))))));
      out.push_back(std::move(m));
    }
    return out;
  }
  std::string State() override { return s().state(); }
  std::string DegradedReason() override { return s().degraded_reason(); }
  std::string GpuBreaker() override { return s().breaker_state(); }
  std::map<std::string, sdbus::Variant> Policy() override { return to_variant_map(s().policy_view()); }
  void Policy(const std::map<std::string, sdbus::Variant>& value) override {
    const Caller c = who();
    auto d = unwrap(from_variant_map(value));
    unwrap(s().set_policy(c, d));
  }
  std::map<std::string, sdbus::Variant> Memory() override { return to_variant_map(s().memory_view()); }
  std::map<std::string, sdbus::Variant> HostMemory() override { return to_variant_map(s().host_memory_view()); }
  std::vector<sdbus::Struct<std::string, uint32_t, uint32_t, uint32_t, uint32_t, uint64_t>> Queues() override {
    std::vector<sdbus::Struct<std::string, uint32_t, uint32_t, uint32_t, uint32_t, uint64_t>> out;
    for (const auto& q : s().queues_view())
      out.emplace_back(q.name, q.depth, q.capacity, q.running, q.concurrency, q.oldest_age_ms);
    return out;
  }
  std::map<std::string, uint32_t> Limits() override { return s().limits_view(); }
  std::vector<sdbus::Struct<std::string, std::string, std::string, int64_t>> Holds() override {
    std::vector<sdbus::Struct<std::string, std::string, std::string, int64_t>> out;
    for (const auto& h : s().holds_view()) out.emplace_back(h.cookie, h.app_id, h.reason, h.since_unix_ms);
    return out;
  }
  std::string FallbackModel() override { return s().fallback_model(); }
  std::map<std::string, uint64_t> Rings() override {
    return impl_.rings ? impl_.rings->counters() : std::map<std::string, uint64_t>{};
  }
  std::string Version() override { return TANDEM_VERSION; }

  Impl& impl_;
};

class DbusServer::Impl::Testing final : public sdbus::AdaptorInterfaces<io::tandem::Tandem1::Testing_adaptor> {
 public:
  Testing(Impl& impl, sdbus::IConnection& conn) : AdaptorInterfaces(conn, kPath), impl_(impl) { registerAdaptor(); }
  ~Testing() { unregisterAdaptor(); }

 private:
  Service& admin() {
    const Caller c = impl_.caller(getObject());
    if (!c.admin)
      throw sdbus::Error(std::string(kErrPrefix) + "NotAuthorized", "the Testing interface needs root or group '" +
                                                                         impl_.auth.admin_group + "'");
    return *impl_.service;
  }
  void SetForeignLoad(const uint64_t& bytes) override { unwrap(admin().testing_foreign_load(bytes)); }
  void FailAllocations(const uint32_t& n, const std::string& site) override {
    unwrap(admin().testing_fail_allocations(n, site));
  }
  void FailProbes(const uint32_t& n) override { unwrap(admin().testing_fail_probes(n)); }
  void SetReadingLag(const uint64_t& ms) override { unwrap(admin().testing_reading_lag(ms)); }
  void LoseDevice() override { unwrap(admin().testing_lose_device()); }
  void RecoverDevice() override { unwrap(admin().testing_recover_device()); }
  std::map<std::string, uint64_t> GetCounters() override { return admin().counters(); }

  Impl& impl_;
};

class DbusServer::Impl::Model final
    : public sdbus::AdaptorInterfaces<io::tandem::Tandem1::Model_adaptor, sdbus::Properties_adaptor> {
 public:
  Model(Impl& impl, sdbus::IConnection& conn, std::string name)
      : AdaptorInterfaces(conn, model_object_path(name)), impl_(impl), name_(std::move(name)) {
    registerAdaptor();
  }
  ~Model() { unregisterAdaptor(); }
  const std::string& name() const { return name_; }

 private:
  Dict view() { return impl_.service->model_view(name_); }
  template <class T>
  T field(const char* k) {
    auto d = view();
    auto it = d.find(k);
    if (it == d.end()) return T{};
    if (auto* x = std::get_if<T>(&it->second)) return *x;
    return T{};
  }
  std::string Name() override { return name_; }
  std::string Revision() override { return field<std::string>("revision"); }
  std::string Fingerprint() override { return field<std::string>("fingerprint"); }
  std::vector<std::map<std::string, sdbus::Variant>> Replicas() override {
    std::vector<std::map<std::string, sdbus::Variant>> out;
    for (const auto& r : impl_.service->replicas(name_)) {
      std::map<std::string, sdbus::Variant> m;
      m.emplace("device", sdbus::Variant(r.device));
      m.emplace("state", sdbus::Variant(std::string(replica_state_name(r.state))));
      if (r.reason != EvictReason::none) m.emplace("reason", sdbus::Variant(std::string(evict_reason_name(r.reason))));
      m.emplace("mode", sdbus::Variant(r.mode));
      m.emplace("layers", sdbus::Variant(r.layers));
      m.emplace("accel_bytes", sdbus::Variant(r.accel_bytes));
      m.emplace("host_bytes", sdbus::Variant(r.host_bytes));
      m.emplace("fingerprint", sdbus::Variant(r.fingerprint));
      if (!r.error.empty()) m.emplace("error", sdbus::Variant(r.error));
      out.push_back(std::move(m));
    }
    return out;
  }
  std::map<std::string, uint64_t> Placement() override {
    auto d = view();
    auto it = d.find("placement_bytes");
    if (it == d.end()) return {};
    if (auto* x = std::get_if<std::map<std::string, std::uint64_t>>(&it->second)) return *x;
    return {};
  }
  std::string Fallback() override { return field<std::string>("fallback"); }
  uint32_t MaxContext() override { return field<std::uint32_t>("max_context"); }
  std::string Template() override { return field<std::string>("template"); }
  std::string Kind() override {
    auto k = field<std::string>("kind");
    return k.empty() ? "llm" : k;
  }

  Impl& impl_;
  std::string name_;
};

Result<std::unique_ptr<DbusServer>> DbusServer::connect(const BusConfig& bus) {
  std::unique_ptr<DbusServer> s(new DbusServer());
  s->impl_ = std::make_unique<Impl>();
  s->impl_->bus_name = bus.name;
  try {
    switch (bus.kind) {
      case BusKind::system: s->impl_->conn = sdbus::createSystemBusConnection(); break;
      case BusKind::session: s->impl_->conn = sdbus::createSessionBusConnection(); break;
      case BusKind::address: s->impl_->conn = sdbus::createSessionBusConnectionWithAddress(bus.address); break;
    }
  } catch (const sdbus::Error& e) {
    const std::string where = bus.kind == BusKind::address ? "the bus at " + bus.address
                                                           : "the " + std::string(bus_kind_name(bus.kind)) + " bus";
    return fail(Errc::unavailable, "cannot connect to " + where + " (" + e.getMessage() +
                                       "); is dbus running? set [bus] kind/address in the config");
  }
  return s;
}

DbusServer::~DbusServer() {
  if (!impl_) return;
  impl_->models.clear();
  impl_->testing.reset();
  impl_->main.reset();
  impl_->bus_proxy.reset();
}

Status DbusServer::serve(Service* service, const DaemonConfig& cfg, bool testing, RingHub* rings) {
  impl_->service = service;
  impl_->rings = rings;
  impl_->auth = cfg.auth;
  try {
    impl_->main = std::make_unique<Impl::Main>(*impl_, *impl_->conn);
    if (testing) impl_->testing = std::make_unique<Impl::Testing>(*impl_, *impl_->conn);
    for (const auto& m : cfg.models) impl_->models.push_back(std::make_unique<Impl::Model>(*impl_, *impl_->conn, m.name));
    impl_->bus_proxy = sdbus::createProxy(*impl_->conn, "org.freedesktop.DBus", "/org/freedesktop/DBus");
    Impl* impl = impl_.get();
    impl_->bus_proxy->uponSignal("NameOwnerChanged")
        .onInterface("org.freedesktop.DBus")
        .call([impl](const std::string& name, const std::string& old_owner, const std::string& new_owner) {
          if (!name.empty() && name[0] == ':' && new_owner.empty()) {
            impl->creds_cache.erase(name);
            if (impl->service) impl->service->client_vanished(name);
            if (impl->rings && impl->rings->any_sessions()) impl->rings->client_vanished(name);
          }
          (void)old_owner;
        });
    impl_->bus_proxy->finishRegistration();
    impl_->conn->requestName(impl_->bus_name);
  } catch (const sdbus::Error& e) {
    return fail(Errc::unavailable, "cannot serve " + impl_->bus_name + ": " + e.getName() + ": " + e.getMessage() +
                                       " (another tandemd running, or the bus policy does not let this user own the name)");
  }
  return {};
}

sdbus::IConnection::PollData DbusServer::poll_data() const { return impl_->conn->getEventLoopPollData(); }

void DbusServer::process() {
  for (int i = 0; i < 10000; ++i) {
    bool more = false;
    try {
      more = impl_->conn->processPendingRequest();
    } catch (const std::exception& e) {
      log::error("D-Bus processing: {}", e.what());
    }
    if (!more) break;
  }
}

void DbusServer::release_name() {
  try {
    impl_->conn->releaseName(impl_->bus_name);
  } catch (const sdbus::Error& e) {
    log::warn("releasing {}: {}", impl_->bus_name, e.getMessage());
  }
}

void DbusServer::reload_auth(const AuthConfig& auth, const RingConfig& rings) {
  impl_->auth = auth;
  impl_->creds_cache.clear();
  if (impl_->rings) {
    Impl* impl = impl_.get();
    impl_->rings->reauthorize([impl](std::uint32_t uid) { return impl->resolve_uid(uid, {}).may_submit; }, rings);
  }
}

void DbusServer::job_update(const std::string& destination, JobId id, const std::string& kind, const Dict& data) {
  if (RingHub::is_ring_destination(destination)) {
    if (impl_->rings) impl_->rings->job_update(destination, id, kind, data);
    return;
  }
  if (!impl_->main || destination.empty()) return;
  try {
    auto& obj = impl_->main->object();
    auto sig = obj.createSignal(kIface, "JobUpdate");
    sig << static_cast<std::uint64_t>(id) << kind << to_variant_map(data);
    sig.setDestination(destination);
    obj.emitSignal(sig);
  } catch (const sdbus::Error& e) {
    log::debug("job {} update to {} not sent: {}", id, destination, e.getMessage());
  }
}

void DbusServer::degraded_changed(bool degraded, const std::string& reason, const Dict& details) {
  if (impl_->rings) impl_->rings->degraded_changed(degraded, reason, details);
  if (!impl_->main) return;
  try {
    impl_->main->emitDegradedModeChanged(degraded, reason, to_variant_map(details));
  } catch (const sdbus::Error& e) {
    log::warn("DegradedModeChanged not sent: {}", e.getMessage());
  }
}

void DbusServer::models_changed(const std::vector<std::string>& added, const std::vector<std::string>& removed) {
  auto& models = impl_->models;
  for (const auto& name : removed)
    models.erase(std::remove_if(models.begin(), models.end(), [&](const auto& m) { return m->name() == name; }),
                 models.end());
  try {
    for (const auto& name : added)
      if (std::none_of(models.begin(), models.end(), [&](const auto& m) { return m->name() == name; }))
        models.push_back(std::make_unique<Impl::Model>(*impl_, *impl_->conn, name));
    if (impl_->main) impl_->main->emitModelsChanged(added, removed);
  } catch (const sdbus::Error& e) {
    log::warn("ModelsChanged: {}", e.getMessage());
  }
}

void DbusServer::properties_changed(const std::vector<std::string>& names) {
  if (!impl_->main || names.empty()) return;
  try {
    impl_->main->object().emitPropertiesChangedSignal(kIface, names);
  } catch (const sdbus::Error& e) {
    log::warn("PropertiesChanged not sent: {}", e.getMessage());
  }
}

}  // namespace tandem::daemon
