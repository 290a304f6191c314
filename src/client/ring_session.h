// A ring session for a C++ client (docs/rings.md): OpenSession over D-Bus, then submissions and their job updates
// through shared memory. Events come back decoded into the same views the D-Bus path uses (SubmitResult, JobUpdate,
// RemoteError), so a client such as `tandemctl run` handles both paths with one code path.
//
// Single-threaded, like Client. The Client must outlive the session (CloseSession is sent through it).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "client/client.h"
#include "ring/client_ring.h"

namespace tandem::client {

struct RingEvent {
  std::uint64_t user_data = 0;          // of the submission it answers (job events: of the job's submit)
  std::uint64_t job_id = 0;
  std::string kind;                     // accepted | routed | started | tokens | migrated | finished | error |
                                        // cancel_result | nop | degraded_mode | embedded | segment | progress |
                                        // audio (ABI 1.2; update.kind as the D-Bus JobUpdate names them)
  std::optional<SubmitResult> accepted; // kind accepted: the placement (as Submit returns it)
  std::optional<JobUpdate> update;      // routed, started, tokens, migrated, finished, segment, progress, audio
                                        // (as JobUpdate signals)
  std::optional<RemoteError> error;     // kind error: name "io.tandem.Tandem1.Error.<Name>", retry_after_ms, ...
  std::optional<std::string> cancel_state;  // kind cancel_result
  std::optional<DegradedChange> degraded;   // kind degraded_mode (as the DegradedModeChanged signal)
  std::optional<EmbedReply> embedded;       // kind embedded: the vectors and the result (as Client::embed returns)
  bool gap = false;                     // tokens: earlier tokens were dropped (overflow); GetJob has them
};

// The submit record for a request (docs/rings.md "Submit record").
std::vector<std::uint8_t> submit_record(const Request& r);
// The embed record (docs/rings.md "Embed record"): model, texts, images (the bytes, then the image_fds read from
// their offset to the end), options. Errors: invalid_argument (no inputs, a negative fd), io_error (an fd unreadable).
Result<std::vector<std::uint8_t>> embed_record(const EmbedRequest& r);
// The transcribe record (docs/rings.md "Transcribe record"): a file (audio, or audio_fd read to its end) or a stream's
// format, and the options. Errors: invalid_argument (no audio, or a file and a stream), io_error (the fd).
Result<std::vector<std::uint8_t>> transcribe_record(const TranscribeRequest& r);
// An audio record: one chunk of a stream's PCM at `offset` (bytes sent before it); `end` marks the last.
std::vector<std::uint8_t> audio_record(std::uint64_t offset, std::span<const std::uint8_t> pcm, bool end);
// One completion → event. Malformed records give kind "error" with name "...Error.Internal" (never expected).
RingEvent decode_event(const ring::Event& e);

class RingSession {
 public:
  // Errors: those of OpenSession (NotAuthorized, QueueFull, Unavailable, UnknownMethod on an older daemon, ...) and
  // of mapping it (incompatible ABI).
  static Result<std::unique_ptr<RingSession>> open(Client& client, const Client::SessionOptions& options = {},
                                                   ring::SpinPolicy spin = {});
  ~RingSession();  // CloseSession (best effort), unmap
  RingSession(const RingSession&) = delete;
  RingSession& operator=(const RingSession&) = delete;

  std::uint64_t id() const { return ring_->session_id(); }
  // queue_full: no room in the ring right now (reap events and retry); unavailable: the session ended.
  Result<void> submit(const Request& r, std::uint64_t user_data);
  // Embed (ABI 1.1): answered by one event, kind "embedded" (event.embedded) or "error". call_timeout is not used
  // (wait() bounds the waiting). Errors as submit, and those of embed_record(); invalid_argument when the record is
  // larger than the session's max_request_bytes (open the session with a larger request_data_bytes).
  Result<void> embed(const EmbedRequest& r, std::uint64_t user_data);
  // Transcribe (ABI 1.2): answered like submit (accepted or error, then the job's audio, segment, progress, ...,
  // finished as updates). A file must fit in one record (max_request_bytes).
  Result<void> transcribe(const TranscribeRequest& r, std::uint64_t user_data);
  // One chunk of a stream's PCM for `job` (its accepted): answered only when refused (an error event with this
  // user_data; resend from that chunk's offset — later chunks are refused too, see docs/rings.md).
  Result<void> audio(std::uint64_t job, std::uint64_t offset, std::span<const std::uint8_t> pcm, bool end,
                     std::uint64_t user_data);
  Result<void> cancel(std::uint64_t job_id, std::uint64_t user_data);
  Result<void> nop(std::uint64_t user_data);
  // Decoded events that are there now / after waiting up to timeout (0 on timeout or when extra_fd is readable).
  Result<std::size_t> poll(std::vector<RingEvent>& out);
  Result<std::size_t> wait(std::vector<RingEvent>& out, std::chrono::nanoseconds timeout, int extra_fd = -1);
  // Open, or why not ("failed (record)", "closed").
  bool open() const { return ring_->state() == ring::SessionState::open; }
  std::string state_text() const;
  ring::RingClient& raw() { return *ring_; }

 private:
  RingSession() = default;
  Client* client_ = nullptr;
  std::unique_ptr<ring::RingClient> ring_;
  std::vector<ring::Event> raw_;
};

}  // namespace tandem::client
