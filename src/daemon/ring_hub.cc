#include "daemon/ring_hub.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>

#include "daemon/log.h"
#include "daemon/ring_hub_internal.h"
#include "daemon/transcribe_record.h"
#include "ring/completion_writer.h"
#include "ring/consumer.h"
#include "ring/record.h"

namespace tandem::daemon {

using ring::Fault;
using ring::Kind;
using ring::SessionState;

namespace {

constexpr std::string_view kPrefix = "ring:";

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

std::int64_t now_unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One byte on the client's completion doorbell. EAGAIN (a full pipe) is fine: a wake-up is pending anyway.
void ring_doorbell(int fd) {
  const char one = 1;
  (void)!::write(fd, &one, 1);
}

Failure sys_fail(const char* what) {
  return fail(Errc::io_error, std::string("cannot open a ring session: ") + what + ": " + std::strerror(errno));
}

}  // namespace

namespace ring_detail {

// Dict → record: scalars and lists (maps and history rows stay on D-Bus: GetJob).
std::vector<std::uint8_t> to_record(const Dict& d) {
  ring::RecordWriter w;
  for (const auto& [k, v] : d) {
    if (!ring::valid_key(k)) continue;
    std::visit(
        [&, key = std::string_view(k)](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::uint64_t> ||
                        std::is_same_v<T, std::int64_t> || std::is_same_v<T, double> ||
                        std::is_same_v<T, std::vector<std::string>> || std::is_same_v<T, std::vector<std::int32_t>>)
            w.add(key, x);
          else if constexpr (std::is_same_v<T, std::uint32_t>)
            w.add(key, std::uint64_t{x});
          else if constexpr (std::is_same_v<T, std::string>)
            w.add(key, std::string_view(x));
        },
        v);
  }
  return w.take();
}

ring::ErrorCode error_code(Errc e, bool job) {
  using ring::ErrorCode;
  switch (e) {
    case Errc::invalid_argument:
    case Errc::parse_error:
    case Errc::format_error: return ErrorCode::invalid_argument;
    case Errc::not_found: return job ? ErrorCode::unknown_job : ErrorCode::unknown_model;
    case Errc::permission_denied: return ErrorCode::not_authorized;
    case Errc::rejected: return ErrorCode::busy;
    case Errc::queue_full: return ErrorCode::queue_full;
    case Errc::host_memory: return ErrorCode::host_memory;
    case Errc::resumable: return ErrorCode::resumable;
    case Errc::incompatible: return ErrorCode::incompatible;
    case Errc::duplicate: return ErrorCode::duplicate;
    case Errc::illegal_transition:
    case Errc::cancelled: return ErrorCode::illegal_state;
    case Errc::unavailable:
    case Errc::device_lost: return ErrorCode::unavailable;
    case Errc::unsupported: return ErrorCode::not_supported;
    case Errc::timeout: return ErrorCode::timeout;
    default: return ErrorCode::internal;
  }
}

// The service's messages end with "; key=value" facts (retry_after_ms, job, tokens): lift them into fields.
ring::Completion error_completion(std::uint64_t user_data, const Error& e, bool job_op, std::uint64_t job_id) {
  const auto code = error_code(e.code, job_op);
  ring::RecordWriter w;
  w.add("error", ring::error_code_name(code));
  std::string message = e.message;
  for (const char* fact : {"retry_after_ms", "job", "tokens"}) {
    const std::string needle = std::string("; ") + fact + "=";
    const auto pos = message.find(needle);
    if (pos == std::string::npos) continue;
    std::size_t end = pos + needle.size();
    std::uint64_t v = 0;
    bool digits = false;
    while (end < message.size() && message[end] >= '0' && message[end] <= '9' && v < (1ull << 60)) {
      v = v * 10 + static_cast<std::uint64_t>(message[end] - '0');
      ++end;
      digits = true;
    }
    if (digits) w.add(fact, v);
  }
  if (const auto cut = message.find("; "); cut != std::string::npos && message.find('=', cut) != std::string::npos)
    message.resize(cut);
  w.add("message", std::string_view(message));
  return ring::record_completion(Kind::error, user_data, job_id, w.take(), code);
}

}  // namespace ring_detail

using ring_detail::error_completion;
using ring_detail::to_record;

void SessionFds::close_all() {
  close_fd(memfd);
  close_fd(sq_doorbell_write);
  close_fd(cq_doorbell_read);
}

struct RingHub::Session {
  std::uint64_t id = 0;
  std::string destination;  // "ring:<id>"
  Caller caller;
  void* base = nullptr;
  std::size_t size = 0;
  int sq_doorbell_read = -1;   // ours: the client rings it
  int cq_doorbell_write = -1;  // ours: we ring the client
  ring::View view;
  ring::SubmissionConsumer consumer;
  ring::CompletionWriter writer;
  std::map<JobId, std::uint64_t> user_data;  // job → the user_data of its submit
  // While a submit runs: updates the service emits for the new job are held so `accepted` (the placement) is first.
  bool in_submit = false;
  std::vector<std::tuple<JobId, std::string, Dict>> held;
  SessionState state = SessionState::open;
  std::int64_t opened_unix_ms = 0;
  std::uint64_t submissions = 0, cancels = 0, nops = 0, jobs = 0, embeds = 0, transcribes = 0, audio_chunks = 0;

  ~Session() {
    if (base) ::munmap(base, size);
    close_fd(sq_doorbell_read);
    close_fd(cq_doorbell_write);
  }
};

RingHub::RingHub(Service* service, RingConfig cfg) : service_(service), cfg_(std::move(cfg)) {}

RingHub::~RingHub() = default;

bool RingHub::is_ring_destination(const std::string& destination) { return destination.starts_with(kPrefix); }

Result<OpenedSession> RingHub::open(const Caller& c, const Dict& options) {
  if (!cfg_.enabled) return fail(Errc::unavailable, "ring sessions are disabled ([rings] enabled = false)");
  if (!c.may_submit) return fail(Errc::permission_denied, "uid " + std::to_string(c.uid) + " may not submit jobs");
  ring::LayoutRequest req;
  for (const auto& [k, v] : options) {
    std::uint64_t x = 0;
    if (const auto* u = std::get_if<std::uint64_t>(&v)) x = *u;
    else if (const auto* u32 = std::get_if<std::uint32_t>(&v)) x = *u32;
    else return fail(Errc::invalid_argument, "OpenSession option '" + k.substr(0, 64) + "' must be an unsigned integer");
    if (k == "sq_entries" || k == "cq_entries") {
      if (x > 0xffffffffu) return fail(Errc::invalid_argument, k + " is too large");
      (k == "sq_entries" ? req.sq_entries : req.cq_entries) = static_cast<std::uint32_t>(x);
    } else if (k == "request_data_bytes") {
      req.request_data_bytes = x;
    } else if (k == "response_data_bytes") {
      req.response_data_bytes = x;
    } else {
      return fail(Errc::invalid_argument, "unknown OpenSession option '" + k.substr(0, 64) +
                                              "' (known: sq_entries, cq_entries, request_data_bytes, "
                                              "response_data_bytes)");
    }
  }
  std::uint32_t mine = 0;
  for (const auto& [id, s] : sessions_) mine += s->caller.uid == c.uid && s->state == SessionState::open;
  if (sessions_.size() >= cfg_.max_sessions)
    return fail(Errc::queue_full, "at most " + std::to_string(cfg_.max_sessions) +
                                      " ring sessions ([rings] max_sessions); retry_after_ms=1000");
  if (mine >= cfg_.max_sessions_per_user)
    return fail(Errc::queue_full, "at most " + std::to_string(cfg_.max_sessions_per_user) +
                                      " ring sessions per user ([rings] max_sessions_per_user)");
  ring::LayoutLimits lim;
  lim.default_sq_entries = cfg_.default_sq_entries;
  lim.default_cq_entries = cfg_.default_cq_entries;
  lim.max_sq_entries = cfg_.max_sq_entries;
  lim.max_cq_entries = cfg_.max_cq_entries;
  lim.default_request_data_bytes = lim.default_response_data_bytes = cfg_.default_data_bytes;
  lim.max_request_data_bytes = lim.max_response_data_bytes = cfg_.max_data_bytes;
  auto layout = ring::compute_layout(req, lim);
  if (!layout) return fail(std::move(layout).error());
  const std::uint64_t id = next_id_++;
  layout->session_id = id;

  auto s = std::make_unique<Session>();
  s->id = id;
  s->destination = std::string(kPrefix) + std::to_string(id);
  s->caller = c;
  s->caller.reply_to = s->destination;
  s->opened_unix_ms = now_unix_ms();

  OpenedSession out;
  out.session_id = id;
  out.fds.memfd = ::memfd_create("tandem-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (out.fds.memfd < 0) return sys_fail("memfd_create");
  auto cleanup = [&] { out.fds.close_all(); };
  if (::ftruncate(out.fds.memfd, static_cast<off_t>(layout->total_size)) != 0) {
    cleanup();
    return sys_fail("ftruncate");
  }
  // Sealed before anyone else sees it: the client can neither shrink it under our mapping (SIGBUS) nor grow it.
  if (::fcntl(out.fds.memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    cleanup();
    return sys_fail("F_ADD_SEALS");
  }
  s->size = static_cast<std::size_t>(layout->total_size);
  s->base = ::mmap(nullptr, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, out.fds.memfd, 0);
  if (s->base == MAP_FAILED) {
    s->base = nullptr;
    cleanup();
    return sys_fail("mmap");
  }
  ring::initialize(s->base, *layout);
  int sq[2], cq[2];
  if (::pipe2(sq, O_NONBLOCK | O_CLOEXEC) != 0) {
    cleanup();
    return sys_fail("pipe2");
  }
  if (::pipe2(cq, O_NONBLOCK | O_CLOEXEC) != 0) {
    ::close(sq[0]);
    ::close(sq[1]);
    cleanup();
    return sys_fail("pipe2");
  }
  s->sq_doorbell_read = sq[0];
  out.fds.sq_doorbell_write = sq[1];
  out.fds.cq_doorbell_read = cq[0];
  s->cq_doorbell_write = cq[1];
  s->view = ring::View{static_cast<std::uint8_t*>(s->base), *layout};
  ring::RecordLimits rl;
  rl.max_fields = 2 * kMaxOptions + 8;
  s->consumer = ring::SubmissionConsumer(s->view, rl);
  s->writer = ring::CompletionWriter(s->view, cfg_.max_backlog_bytes);

  const auto& l = *layout;
  out.layout = Dict{{"session_id", id},
                    {"abi_major", std::uint32_t{ring::kAbiMajor}},
                    {"abi_minor", std::uint32_t{ring::kAbiMinor}},
                    {"features", l.features},
                    {"total_size", l.total_size},
                    {"sq_entries", l.sq_entries},
                    {"cq_entries", l.cq_entries},
                    {"request_data_bytes", l.request_data_size},
                    {"response_data_bytes", l.response_data_size},
                    {"max_request_bytes", l.max_request_bytes},
                    {"max_backlog_bytes", cfg_.max_backlog_bytes}};
  log::info("ring session {} opened by {} (uid {}): {} SQ / {} CQ entries, {} + {} data bytes", id, c.bus_name, c.uid,
            l.sq_entries, l.cq_entries, l.request_data_size, l.response_data_size);
  ++counters_["ring_sessions_opened"];
  changed_ = true;
  sessions_.emplace(id, std::move(s));
  return out;
}

Status RingHub::close(const Caller& c, std::uint64_t session_id) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || it->second->state != SessionState::open)
    return fail(Errc::not_found, "no open ring session " + std::to_string(session_id));
  Session& s = *it->second;
  if (s.caller.bus_name != c.bus_name && !(c.admin && c.uid == 0))
    return fail(Errc::permission_denied, "ring session " + std::to_string(session_id) + " belongs to another client");
  end_session(s, SessionState::closed, Fault::none, "closed by its owner");
  reap_closed();
  return {};
}

void RingHub::client_vanished(const std::string& bus_name) {
  bool any = false;
  for (auto& [id, s] : sessions_)
    if (s->state == SessionState::open && s->caller.bus_name == bus_name) {
      end_session(*s, SessionState::closed, Fault::none, "its owner " + bus_name + " left the bus");
      any = true;
    }
  if (any) reap_closed();
}

void RingHub::reauthorize(const std::function<bool(std::uint32_t)>& may_submit, const RingConfig& cfg) {
  cfg_ = cfg;
  for (auto& [id, s] : sessions_) {
    if (s->state != SessionState::open) continue;
    // Limits (sizes, backlog) in force when a session opened stay with it; authorization is checked again now.
    if (!cfg_.enabled || !may_submit(s->caller.uid))
      end_session(*s, SessionState::closed, Fault::none,
                  !cfg_.enabled ? "ring sessions were disabled" : "its user may no longer submit");
  }
  reap_closed();
}

void RingHub::close_all(const std::string& why) {
  for (auto& [id, s] : sessions_)
    if (s->state == SessionState::open) end_session(*s, SessionState::closed, Fault::none, why);
  reap_closed();
}

RingHub::Session* RingHub::find_session(const std::string& destination) {
  if (!is_ring_destination(destination)) return nullptr;
  std::uint64_t id = 0;
  for (char ch : std::string_view(destination).substr(kPrefix.size())) {
    if (ch < '0' || ch > '9') return nullptr;
    id = id * 10 + static_cast<std::uint64_t>(ch - '0');
  }
  auto it = sessions_.find(id);
  return it == sessions_.end() || it->second->state != SessionState::open ? nullptr : it->second.get();
}

void RingHub::post(Session& s, ring::Completion c) {
  if (s.state != SessionState::open) return;
  ++counters_["ring_completions"];
  if (c.entry.kind == static_cast<std::uint8_t>(Kind::tokens)) counters_["ring_tokens"] += c.entry.count;
  if (Fault f = s.writer.post(std::move(c)); f != Fault::none) {
    end_session(s, SessionState::failed, f, "the client's completion head is out of range");
    return;
  }
  if (s.writer.take_wakeup()) ring_doorbell(s.cq_doorbell_write);
}

void RingHub::job_update(const std::string& destination, JobId id, const std::string& kind, const Dict& data) {
  // A ring job's `accepted` is the completion written from its placement (handle()), never this update.
  if (kind == "accepted") return;
  Session* s = find_session(destination);
  if (!s) return;
  if (s->in_submit) {
    s->held.emplace_back(id, kind, data);
    return;
  }
  const auto ud = s->user_data.find(id);
  const std::uint64_t user_data = ud == s->user_data.end() ? 0 : ud->second;
  if (kind == "tokens") {
    const auto text = data.find("text");
    const auto ids = data.find("tokens");
    const auto step = data.find("step");
    const std::string empty_text;
    const std::vector<std::int32_t> no_ids;
    const auto& t = text != data.end() && std::holds_alternative<std::string>(text->second)
                        ? std::get<std::string>(text->second)
                        : empty_text;
    const auto& v = ids != data.end() && std::holds_alternative<std::vector<std::int32_t>>(ids->second)
                        ? std::get<std::vector<std::int32_t>>(ids->second)
                        : no_ids;
    const std::uint32_t st = step != data.end() && std::holds_alternative<std::uint32_t>(step->second)
                                 ? std::get<std::uint32_t>(step->second)
                                 : 0;
    post(*s, ring::token_completion(user_data, id, st, v, t));
    return;
  }
  Kind k;
  if (kind == "degraded_mode") {
    post(*s, ring::record_completion(Kind::degraded_mode, 0, 0, to_record(data)));
    return;
  }
  if (kind == "accepted") k = Kind::accepted;
  else if (kind == "routed") k = Kind::routed;
  else if (kind == "started") k = Kind::started;
  else if (kind == "migrated") k = Kind::migrated;
  else if (kind == "finished") k = Kind::finished;
  else if (kind == "segment") k = Kind::segment;
  else if (kind == "progress") k = Kind::progress;
  else if (kind == "audio") k = Kind::audio_info;
  else return;  // a kind this ABI does not carry (D-Bus has it)
  Dict d = data;
  if (k == Kind::finished) d.erase("text");  // streamed already; GetJob has the whole text
  post(*s, ring::record_completion(k, user_data, id, to_record(d)));
  if (k == Kind::finished) s->user_data.erase(id);
}

void RingHub::degraded_changed(bool degraded, const std::string& reason, const Dict& details) {
  Dict d = details;
  d["degraded"] = degraded;
  d["reason"] = reason;
  const auto record = to_record(d);
  for (auto& [id, s] : sessions_) {
    if (s->state != SessionState::open) continue;
    auto c = ring::record_completion(Kind::degraded_mode, 0, 0, record);
    if (s->in_submit) {  // keep it ahead of the submitting job's own updates
      s->held.emplace_back(0, "degraded_mode", d);
      continue;
    }
    post(*s, std::move(c));
  }
}

void RingHub::handle(Session& s, ring::Command&& cmd) {
  switch (cmd.op) {
    case ring::Opcode::nop:
      ++s.nops;
      post(s, ring::record_completion(Kind::nop, cmd.user_data, 0, {}));
      return;
    case ring::Opcode::cancel: {
      ++s.cancels;
      auto r = service_->cancel(s.caller, cmd.job_id);
      if (!r) {
        post(s, error_completion(cmd.user_data, r.error(), /*job_op=*/true, cmd.job_id));
        return;
      }
      // A cancelled queued job's outcome is journaled: the answer waits for the commit that covers it.
      service_->after_commit([this, sid = s.id, ud = cmd.user_data, job = cmd.job_id, state = *r](const Status& st) {
        Session* sess = find_open(sid);
        if (!sess) return;
        if (!st) {
          post(*sess, error_completion(ud, st.error(), /*job_op=*/true, job));
          return;
        }
        ring::RecordWriter w;
        w.add("state", std::string_view(state));
        post(*sess, ring::record_completion(Kind::cancel_result, ud, job, w.take()));
      });
      return;
    }
    case ring::Opcode::embed:
      ++s.embeds;
      ++counters_["ring_embeds"];
      handle_embed(s.id, s.caller, std::move(cmd));  // ring_hub_embed.cc
      return;
    case ring::Opcode::submit: {
      ++s.submissions;
      ++counters_["ring_submissions"];
      auto rr = request_from_record(cmd.record);
      if (!rr) {
        post(s, error_completion(cmd.user_data, rr.error(), false));
        return;
      }
      SubmitRequest req;
      req.model = std::move(rr->model);
      req.prompt = std::move(rr->prompt);
      for (auto& [role, content] : rr->messages) req.messages.push_back({std::move(role), std::move(content)});
      req.options = std::move(rr->options);
      place(s, cmd.user_data, [&] { return service_->submit(s.caller, req); });
      return;
    }
    case ring::Opcode::transcribe: {  // ABI 1.2: placed as a submit is; its segments follow its `accepted`
      ++s.transcribes;
      ++counters_["ring_transcribes"];
      auto req = transcribe_from_record(cmd.record);
      if (!req) {
        post(s, error_completion(cmd.user_data, req.error(), false));
        return;
      }
      place(s, cmd.user_data, [&] { return service_->transcribe(s.caller, *req); });
      return;
    }
    case ring::Opcode::audio: {  // ABI 1.2: a stream's chunk; answered only when refused
      ++s.audio_chunks;
      ++counters_["ring_audio_chunks"];
      auto chunk = audio_from_record(cmd.record);
      Status st = chunk ? service_->append_audio(s.caller, cmd.job_id, chunk->offset, chunk->pcm, chunk->end)
                        : Status(fail(chunk.error()));
      if (!st) post(s, error_completion(cmd.user_data, st.error(), /*job_op=*/true, cmd.job_id));
      return;
    }
  }
}

void RingHub::place(Session& s, std::uint64_t ud, const std::function<Result<Dict>()>& call) {
  s.in_submit = true;
  s.held.clear();
  auto placed = call();
  s.in_submit = false;
  auto held = std::move(s.held);
  s.held.clear();
  // A degraded-mode change the submit caused is announced before the job's own completions.
  for (auto& [id, kind, data] : held)
    if (kind == "degraded_mode") job_update(s.destination, id, kind, data);
  std::erase_if(held, [](const auto& h) { return std::get<1>(h) == "degraded_mode"; });
  if (!placed) {
    post(s, error_completion(ud, placed.error(), false));
    return;
  }
  const auto job = std::get<std::uint64_t>(placed->at("job_id"));
  const auto ex = placed->find("existing");
  const bool existing = ex != placed->end() && std::get<bool>(ex->second);
  s.user_data[job] = ud;
  // Updates of the session's other jobs go out now, in order; the new job's own follow its `accepted`.
  std::vector<std::tuple<JobId, std::string, Dict>> own;
  for (auto& h : held) {
    if (std::get<0>(h) == job) own.push_back(std::move(h));
    else job_update(s.destination, std::get<0>(h), std::get<1>(h), std::get<2>(h));
  }
  // Group commit: the `accepted` completion is written only once the commit covering the job's accept is
  // durable (tandemd commits once per loop iteration, after the whole ring drain); if it fails, an error.
  service_->after_commit([this, sid = s.id, ud, job, existing, own = std::move(own),
                          placement = std::move(placed).value()](const Status& st) {
    Session* sess = find_open(sid);
    if (!sess) return;
    if (!st) {
      if (!existing) sess->user_data.erase(job);
      post(*sess, error_completion(ud, st.error(), false));
      return;
    }
    ++sess->jobs;
    post(*sess, ring::record_completion(Kind::accepted, ud, job, to_record(placement)));
    for (const auto& [id, kind, data] : own) job_update(sess->destination, id, kind, data);
    if (existing) finish_existing(*sess, job);
  });
}

void RingHub::post_to(std::uint64_t session_id, ring::Completion c) {
  if (Session* s = find_open(session_id)) post(*s, std::move(c));
}

std::uint64_t RingHub::max_completion_bytes(std::uint64_t session_id) {
  Session* s = find_open(session_id);
  // The writer never writes a payload above half the response area (completion_writer.cc).
  return s ? s->view.layout.response_data_size / 2 : 0;
}

RingHub::Session* RingHub::find_open(std::uint64_t session_id) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || it->second->state != SessionState::open) return nullptr;
  return it->second.get();
}

// The same idempotency key named a job that already ended: its outcome follows the `accepted` at once.
void RingHub::finish_existing(Session& s, JobId job) {
  auto info = service_->get_job(s.caller, job);
  if (!info) return;
  const auto& state = std::get<std::string>(info->at("state"));
  if (state != "completed" && state != "cancelled" && state != "failed") return;
  Dict fin;
  for (const char* k : {"state", "reason", "finish_reason", "error_code", "error_message", "retry_after_ms"})
    if (auto it = info->find(k); it != info->end()) fin[k] = it->second;
  if (auto it = info->find("tokens"); it != info->end())
    if (const auto* ids = std::get_if<std::vector<std::int32_t>>(&it->second))
      fin["tokens_total"] = static_cast<std::uint32_t>(ids->size());
  job_update(s.destination, job, "finished", fin);
}

bool RingHub::process() {
  bool active = false;
  for (auto& [id, sp] : sessions_) {
    Session& s = *sp;
    if (s.state != SessionState::open) continue;
    auto got = s.consumer.consume(cfg_.max_entries_per_pass);
    if (got.consumed > 0) active = true;
    for (auto& cmd : got.commands) {
      handle(s, std::move(cmd));
      if (s.state != SessionState::open) break;
    }
    if (got.fault != Fault::none && s.state == SessionState::open) {
      end_session(s, SessionState::failed, got.fault, got.detail);
      continue;
    }
    if (flush_backlog(s)) active = true;
  }
  reap_closed();
  return active;
}

bool RingHub::flush_backlog(Session& s) {
  if (s.state != SessionState::open || !s.writer.backlogged()) return false;
  const auto before = s.writer.stats().written;
  if (Fault f = s.writer.flush(); f != Fault::none) {
    end_session(s, SessionState::failed, f, "the client's completion head is out of range");
    return true;
  }
  if (s.writer.stats().written == before) return false;
  if (s.writer.take_wakeup()) ring_doorbell(s.cq_doorbell_write);
  return true;
}

bool RingHub::prepare_sleep() {
  for (auto& [id, s] : sessions_) ring::fetch_or(&s->view.sq()->flags, ring::kSqNeedWakeup);
  ring::full_fence();
  // Re-check after the fence: a submission, or a client that consumed completions while a backlog waits (it saw
  // our flag clear and did not ring). Either way: do not sleep.
  bool work = false;
  for (auto& [id, s] : sessions_) {
    if (s->state != SessionState::open) continue;
    if (s->consumer.pending()) work = true;
    if (flush_backlog(*s)) work = true;
  }
  if (work) {
    finish_sleep();
    reap_closed();
    return false;
  }
  return true;
}

void RingHub::finish_sleep() {
  char buf[256];
  bool ended = false;
  for (auto& [id, s] : sessions_) {
    if (s->state != SessionState::open) continue;
    ring::fetch_and(&s->view.sq()->flags, ~ring::kSqNeedWakeup);
    for (;;) {
      const auto n = ::read(s->sq_doorbell_read, buf, sizeof buf);
      if (n > 0) continue;
      if (n == 0) {  // EOF: the client closed its end (it exited, or dropped the session without CloseSession)
        end_session(*s, SessionState::closed, Fault::none, "its submit doorbell was closed");
        ended = true;
      }
      break;
    }
  }
  if (ended) reap_closed();
}

std::vector<int> RingHub::fds() const {
  std::vector<int> out;
  out.reserve(sessions_.size());
  for (const auto& [id, s] : sessions_) out.push_back(s->sq_doorbell_read);
  return out;
}

std::chrono::nanoseconds RingHub::spin_budget() const {
  return sessions_.empty() ? std::chrono::nanoseconds{0}
                           : std::chrono::duration_cast<std::chrono::nanoseconds>(cfg_.max_spin);
}

void RingHub::end_session(Session& s, SessionState state, Fault fault, const std::string& why) {
  if (s.state != SessionState::open) return;
  s.state = state;
  changed_ = true;
  auto* sq = s.view.sq();
  ring::store_release(&sq->fault, static_cast<std::uint32_t>(fault));
  ring::store_release(&sq->state, static_cast<std::uint32_t>(state));
  ring_doorbell(s.cq_doorbell_write);
  service_->channel_closed(s.destination);
  if (state == SessionState::failed) {
    ++counters_["ring_sessions_failed"];
    ++counters_[std::string("ring_fault_") + std::string(ring::fault_name(fault))];
    log::warn("ring session {} of {} (uid {}) failed: {}: {}; its {} jobs continue (GetJob)", s.id, s.caller.bus_name,
              s.caller.uid, ring::fault_name(fault), why, s.user_data.size());
  } else {
    ++counters_["ring_sessions_closed"];
    log::info("ring session {} closed: {}", s.id, why);
  }
}

void RingHub::reap_closed() {
  for (auto it = sessions_.begin(); it != sessions_.end();)
    it = it->second->state == SessionState::open ? std::next(it) : sessions_.erase(it);
}

std::vector<Dict> RingHub::sessions_view() const {
  std::vector<Dict> out;
  for (const auto& [id, s] : sessions_) {
    const auto& st = s->writer.stats();
    out.push_back(Dict{{"session_id", id},
                       {"owner", s->caller.bus_name},
                       {"uid", s->caller.uid},
                       {"opened_unix_ms", s->opened_unix_ms},
                       {"submissions", s->submissions},
                       {"embeds", s->embeds},
                       {"transcribes", s->transcribes},
                       {"audio_chunks", s->audio_chunks},
                       {"jobs", s->jobs},
                       {"completions", st.written},
                       {"backlog_entries", static_cast<std::uint64_t>(s->writer.backlog_entries())},
                       {"tokens_dropped", st.dropped_tokens}});
  }
  return out;
}

std::map<std::string, std::uint64_t> RingHub::counters() const {
  auto c = counters_;
  c["ring_sessions_open"] = sessions_.size();
  return c;
}

}  // namespace tandem::daemon
