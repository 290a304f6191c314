// Client side of a ring session (pure: the memfd and the two doorbell pipe ends come from OpenSession over D-Bus,
// see client::Client::open_session and client::RingSession). Maps the memfd, checks the header, produces submission
// entries (payloads go through a circular arena in the request area, reclaimed as the daemon's head advances) and
// consumes completions, copying each out. Waiting is spin-then-sleep with an adaptive spin budget: an active client
// sees the daemon's answer without a system call, an idle one sleeps on the CQ doorbell and costs no CPU.
//
// Single-threaded: one thread submits and reaps (use one session per thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/result.h"
#include "ring/layout.h"

namespace tandem::ring {

struct Event {
  CompletionEntry entry{};
  std::vector<std::uint8_t> data;  // copied out of the response area

  Kind kind() const { return static_cast<Kind>(entry.kind); }
};

struct SpinPolicy {
  std::chrono::nanoseconds initial{20'000};
  std::chrono::nanoseconds min{0};
  std::chrono::nanoseconds max{200'000};
};

class RingClient {
 public:
  // Takes ownership of the three fds (closed on failure too): the memfd, the write end of the SQ doorbell pipe and
  // the read end of the CQ doorbell pipe (both non-blocking).
  static Result<std::unique_ptr<RingClient>> attach(int memfd, int sq_doorbell, int cq_doorbell, SpinPolicy spin = {});
  ~RingClient();
  RingClient(const RingClient&) = delete;
  RingClient& operator=(const RingClient&) = delete;

  const Layout& layout() const { return view_.layout; }
  std::uint64_t session_id() const { return view_.layout.session_id; }

  // Errors: queue_full (no SQ slot or request-area room now: reap completions, then retry), invalid_argument (record
  // larger than max_request_bytes or empty), unavailable (the session is no longer open).
  Status submit(std::uint64_t user_data, std::span<const std::uint8_t> record);
  // An embed record (ABI 1.1; the same errors as submit). Answered with one `embedded` or `error` completion.
  Status embed(std::uint64_t user_data, std::span<const std::uint8_t> record);
  // ABI 1.2: a transcribe record (a file or a stream's format), answered like submit; and one chunk of a stream's
  // PCM as an audio record (offset, pcm, end) for the job its `accepted` named, answered only when refused.
  Status transcribe(std::uint64_t user_data, std::span<const std::uint8_t> record);
  Status audio(std::uint64_t user_data, std::uint64_t job_id, std::span<const std::uint8_t> record);
  Status cancel(std::uint64_t user_data, std::uint64_t job_id);
  Status nop(std::uint64_t user_data);

  // Copies out the completions that are there (at most max). Errors: format_error when the daemon's entries are
  // inconsistent (never expected; the session should be dropped).
  Result<std::size_t> reap(std::vector<Event>& out, std::size_t max = SIZE_MAX);
  // reap(), waiting up to `timeout` for at least one completion; returns 0 on timeout, when the session ended
  // (check state()) or when extra_fd (if >= 0) became readable.
  Result<std::size_t> wait(std::vector<Event>& out, std::chrono::nanoseconds timeout, int extra_fd = -1);

  // The daemon's word (SqControl::state); `closed` also when the daemon went away without one (EOF on the
  // completion doorbell, seen while waiting).
  SessionState state() const;
  Fault fault() const;
  std::uint64_t overflow_tokens() const;
  std::uint32_t in_flight_submissions() const;  // entries the daemon has not read yet
  std::chrono::nanoseconds spin_budget() const { return spin_; }
  struct Stats { std::uint64_t spins_hit = 0, sleeps = 0, doorbells_rung = 0, submit_full = 0; };
  const Stats& stats() const { return stats_; }

 private:
  RingClient() = default;
  Status push(const SubmissionEntry& e, std::span<const std::uint8_t> data);
  bool reclaim();
  void ring_sq_doorbell_if_needed();
  bool cq_nonempty() const;

  View view_;
  std::size_t mapped_ = 0;
  int memfd_ = -1, sq_db_ = -1, cq_db_ = -1;
  std::uint32_t sq_tail_ = 0, sq_seen_head_ = 0, cq_head_ = 0;
  std::vector<std::uint64_t> sq_ends_;
  CircularArena arena_;
  SpinPolicy policy_;
  std::chrono::nanoseconds spin_{};
  Stats stats_;
  bool peer_gone_ = false;  // EOF on the completion doorbell: the daemon closed it or died
};

}  // namespace tandem::ring
