// Ring sessions in the daemon (docs/rings.md): OpenSession creates a sealed memfd laid out by ring/layout.h and two
// doorbell pipes; the session belongs to the caller (its credentials as established for Submit, its bus name).
// The loop thread drains each session's submission ring, turns submit records into SubmitRequests (the same option
// table as D-Bus, daemon/submit_options.h) and calls the Service as the session's owner, and writes every job update
// of the session's jobs to its completion ring instead of a D-Bus signal. The answers to submit and cancel wait for
// Service::after_commit: an `accepted` completion is written only once the job's accept is durable (group commit,
// docs/journal.md). A `transcribe` (ABI 1.2) is placed the same way; its segment, progress and audio_info updates
// follow its `accepted`, and `audio` chunks of a live stream go to Service::append_audio (answered only when refused;
// a session that ends closes its streams). A protocol error ends that session only,
// counted and logged; its jobs keep running to a terminal state readable with GetJob. An `embed` (ABI 1.1) calls
// Service::embed and is answered by one `embedded` completion (the vectors) or `error` when the job ends.
//
// Torch-free and D-Bus-free: the D-Bus layer calls open()/close()/client_vanished() and passes the fds on; tandemd's
// loop polls fds() and calls process(). Single-threaded (the loop thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"
#include "daemon/config.h"
#include "daemon/service.h"
#include "daemon/values.h"
#include "ring/completion_writer.h"
#include "ring/consumer.h"
#include "ring/layout.h"

namespace tandem::daemon {

// Fds handed to the client; the hub keeps its own ends. The caller sends them and then closes them.
struct SessionFds {
  int memfd = -1;
  int sq_doorbell_write = -1;  // client writes a byte here when kSqNeedWakeup is set
  int cq_doorbell_read = -1;   // client polls this when it sleeps
  void close_all();
};

struct OpenedSession {
  std::uint64_t session_id = 0;
  SessionFds fds;
  Dict layout;  // session_id, abi_major/minor, features, sizes and offsets (as in the header)
};

class RingHub {
 public:
  RingHub(Service* service, RingConfig cfg);
  ~RingHub();

  // Errors: permission_denied (may not submit), queue_full (session limits; message says which), invalid_argument
  // (option out of range / unknown), unavailable (rings disabled, draining), io_error (memfd/pipe/mmap failed).
  Result<OpenedSession> open(const Caller& c, const Dict& options);
  // Only the owner (same bus name) or root may close. The session's jobs keep running.
  Status close(const Caller& c, std::uint64_t session_id);
  void client_vanished(const std::string& bus_name);
  // SIGHUP: sessions whose uid may no longer submit are closed; new limits apply to new sessions.
  void reauthorize(const std::function<bool(std::uint32_t uid)>& may_submit, const RingConfig& cfg);
  // Drain: every session is closed (state closed, doorbell rung); queued ring work is not read anymore.
  void close_all(const std::string& why);

  // Job updates addressed to a session ("ring:<id>" destinations) — the service's observer calls this first.
  static bool is_ring_destination(const std::string& destination);
  void job_update(const std::string& destination, JobId id, const std::string& kind, const Dict& data);
  // Degraded mode changed: a `degraded_mode` completion to every open session (in order with their job updates).
  void degraded_changed(bool degraded, const std::string& reason, const Dict& details);

  // --- loop ---
  // Reads every session's submissions (bounded per pass), flushes backlogs, rings doorbells. True if anything was
  // read or written (the loop keeps spinning a while after activity).
  bool process();
  // Before sleeping: sets kSqNeedWakeup on every session, then re-checks; false = work is pending, do not sleep.
  bool prepare_sleep();
  // After waking: clears kSqNeedWakeup and drains the doorbells that poll() reported.
  void finish_sleep();
  // The read ends of the SQ doorbells, for poll().
  std::vector<int> fds() const;
  bool any_sessions() const { return !sessions_.empty(); }
  std::chrono::nanoseconds spin_budget() const;
  // A session opened or ended since the last call (the loop then emits PropertiesChanged for Rings).
  bool take_changed() {
    const bool c = changed_;
    changed_ = false;
    return c;
  }

  // For the Sessions property and the counters: per-session rows and totals.
  std::vector<Dict> sessions_view() const;
  std::map<std::string, std::uint64_t> counters() const;

 private:
  struct Session;
  void handle(Session& s, ring::Command&& cmd);
  // An embed command (ring_hub_embed.cc): Service::embed with a callback that posts one `embedded` or `error`
  // completion to the session if it is still open then.
  void handle_embed(std::uint64_t session_id, const Caller& caller, ring::Command&& cmd);
  // A job-creating call made as the session's owner (submit, transcribe): its updates produced during the call are
  // held, and `accepted` (then those updates) is written once the accept is durable (Service::after_commit).
  void place(Session& s, std::uint64_t user_data, const std::function<Result<Dict>()>& call);
  void post_to(std::uint64_t session_id, ring::Completion c);  // dropped when the session is gone
  std::uint64_t max_completion_bytes(std::uint64_t session_id);  // 0 when the session is gone
  void post(Session& s, ring::Completion c);
  // Writes what a session's backlog can write now (ending the session on a bad client head); true if anything
  // happened (written, or the session ended).
  bool flush_backlog(Session& s);
  void end_session(Session& s, ring::SessionState state, ring::Fault fault, const std::string& why);
  void reap_closed();
  Session* find_session(const std::string& destination);
  Session* find_open(std::uint64_t session_id);  // an open session by id (after_commit callbacks), or null
  void finish_existing(Session& s, JobId job);

  Service* service_;
  RingConfig cfg_;
  std::map<std::uint64_t, std::unique_ptr<Session>> sessions_;
  std::uint64_t next_id_ = 1;
  std::map<std::string, std::uint64_t> counters_;
  bool changed_ = false;
};

}  // namespace tandem::daemon
