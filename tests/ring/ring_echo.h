// An echo "daemon" and a checking client for the two-process and threaded tests.
//
// EchoDaemon serves sessions the way tandemd's ring hub does, minus the engine: per session a SubmissionConsumer and a
// CompletionWriter; each submit is parsed with request_from_record and answered with accepted, kBatches token
// batches of kBatchTokens ids (id == step) and finished; a nop with nop, a cancel with cancel_result. When idle it
// spins briefly, then sets kSqNeedWakeup, re-checks, and sleeps on the SQ doorbells; after a pass it rings a client's
// CQ doorbell when the writer says the client sleeps. A protocol fault fails that session only; a hung-up SQ
// doorbell (the client's end closed: it exited or was killed) closes it.
//
// run_echo_client drives a RingClient: keeps the SQ full, waits (spin-then-sleep) for completions, and checks that
// every job gets exactly accepted, tokens with contiguous steps 0..kBatches*kBatchTokens-1, then finished — once.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "daemon/submit_options.h"
#include "ring/client_ring.h"
#include "ring/completion_writer.h"
#include "ring/consumer.h"

namespace tandem::ring::test {

inline constexpr std::uint32_t kBatches = 3;
inline constexpr std::uint32_t kBatchTokens = 2;
inline constexpr std::uint64_t kNopBit = 1ull << 63;

class EchoDaemon {
 public:
  struct Session {
    View view;
    int sq_doorbell = -1;  // read end (ours)
    int cq_doorbell = -1;  // write end (ours)
    SubmissionConsumer consumer;
    CompletionWriter writer;
    std::uint64_t submits = 0, nops = 0, cancels = 0, bad_requests = 0;
    std::uint64_t next_job = 1;
    bool ended = false;        // failed or closed: not served any more
    bool hung_up = false;      // the client's doorbell end went away
    Fault fault = Fault::none;
    std::string detail;
  };

  std::size_t add(View view, int sq_doorbell_read, int cq_doorbell_write, std::uint64_t max_backlog = 1 << 20) {
    auto s = std::make_unique<Session>();
    s->view = view;
    s->sq_doorbell = sq_doorbell_read;
    s->cq_doorbell = cq_doorbell_write;
    s->consumer = SubmissionConsumer(view);
    s->writer = CompletionWriter(view, max_backlog);
    sessions_.push_back(std::move(s));
    return sessions_.size() - 1;
  }
  Session& session(std::size_t i) { return *sessions_[i]; }
  std::size_t size() const { return sessions_.size(); }

  // Statistics of the sleep protocol.
  std::uint64_t sleeps = 0, doorbells_rung = 0, lost_wakeups = 0, passes = 0;

  // One pass over every live session. True when something was done.
  bool pass() {
    ++passes;
    bool worked = false;
    for (std::size_t i = 0; i < sessions_.size(); ++i) {
      Session& s = *sessions_[i];
      if (s.ended) continue;
      if (Fault f = s.writer.flush(); f != Fault::none) {
        end(s, SessionState::failed, f, "flush");
        continue;
      }
      if (s.consumer.pending()) {
        worked = true;
        ConsumeResult r = s.consumer.consume(64);
        for (auto& c : r.commands) serve(i, s, c);
        if (r.fault != Fault::none) {
          end(s, SessionState::failed, r.fault, r.detail);
          continue;
        }
      }
      if (s.writer.take_wakeup()) ring(s);
    }
    if ((passes & 63) == 0) check_hangups(0);
    return worked;
  }

  // Serves until done() or the deadline. Returns false on deadline.
  bool run(const std::function<bool()>& done, std::chrono::seconds limit,
           std::chrono::microseconds spin = std::chrono::microseconds(50)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    auto idle_since = std::chrono::steady_clock::now();
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      if (pass()) {
        idle_since = std::chrono::steady_clock::now();
        continue;
      }
      if (std::chrono::steady_clock::now() - idle_since < spin) {
        std::this_thread::yield();
        continue;
      }
      sleep_on_doorbells(deadline);
      idle_since = std::chrono::steady_clock::now();
    }
    return true;
  }

  // Everything posted has been written (nothing waits in a backlog).
  bool drained(std::size_t i) const { return !sessions_[i]->writer.backlogged(); }

 private:
  void serve(std::size_t index, Session& s, Command& c) {
    Fault f = Fault::none;
    switch (c.op) {
      case Opcode::nop:
        ++s.nops;
        f = s.writer.post(record_completion(Kind::nop, c.user_data, 0, {}));
        break;
      case Opcode::cancel:
        ++s.cancels;
        f = s.writer.post(record_completion(Kind::cancel_result, c.user_data, c.job_id,
                                            RecordWriter().add("state", "completed").take()));
        break;
      case Opcode::submit: {
        ++s.submits;
        auto req = daemon::request_from_record(c.record);
        if (!req || req->model.empty() || req->prompt.empty()) {
          ++s.bad_requests;
          f = s.writer.post(record_completion(Kind::error, c.user_data, 0,
                                              RecordWriter().add("error", "InvalidArgument").take(),
                                              ErrorCode::invalid_argument));
          break;
        }
        const std::uint64_t job = (std::uint64_t{index} << 40) | s.next_job++;
        f = s.writer.post(record_completion(Kind::accepted, c.user_data, job,
                                            RecordWriter().add("job_id", job).take()));
        for (std::uint32_t b = 0; b < kBatches && f == Fault::none; ++b) {
          const std::uint32_t step = b * kBatchTokens;
          std::vector<std::int32_t> ids;
          for (std::uint32_t k = 0; k < kBatchTokens; ++k) ids.push_back(static_cast<std::int32_t>(step + k));
          f = s.writer.post(token_completion(c.user_data, job, step, ids, "t" + std::to_string(step)));
        }
        if (f == Fault::none)
          f = s.writer.post(record_completion(
              Kind::finished, c.user_data, job,
              RecordWriter().add("state", "completed").add("tokens_total", std::uint64_t{kBatches * kBatchTokens}).take()));
        break;
      }
    }
    if (f != Fault::none) end(s, SessionState::failed, f, "post");
  }

  void ring(Session& s) {
    const char one = 1;
    // EAGAIN: a wake-up is pending anyway; EPIPE: the client is gone (SIGPIPE is ignored, as in tandemd).
    if (::write(s.cq_doorbell, &one, 1) == 1) ++doorbells_rung;
  }

  void end(Session& s, SessionState st, Fault f, std::string detail) {
    if (s.ended) return;
    s.ended = true;
    s.fault = f;
    s.detail = std::move(detail);
    store_release(&s.view.sq()->fault, static_cast<std::uint32_t>(f));
    store_release(&s.view.sq()->state, static_cast<std::uint32_t>(st));
    ring(s);
  }

  // Polls the SQ doorbells; a hang-up (every write end closed) closes the session.
  int check_hangups(int timeout_ms) {
    std::vector<pollfd> fds;
    std::vector<Session*> who;
    for (auto& s : sessions_) {
      if (s->ended) continue;
      fds.push_back({s->sq_doorbell, POLLIN, 0});
      who.push_back(s.get());
    }
    if (fds.empty()) return 0;
    const int r = ::poll(fds.data(), fds.size(), timeout_ms);
    for (std::size_t k = 0; r > 0 && k < fds.size(); ++k) {
      if (fds[k].revents & POLLIN) {
        char buf[256];
        while (::read(fds[k].fd, buf, sizeof buf) > 0) {
        }
      }
      if ((fds[k].revents & (POLLHUP | POLLERR)) && !(fds[k].revents & POLLIN)) {
        who[k]->hung_up = true;
        end(*who[k], SessionState::closed, Fault::none, "client hung up");
      }
    }
    return r;
  }

  void sleep_on_doorbells(std::chrono::steady_clock::time_point deadline) {
    for (auto& s : sessions_)
      if (!s->ended) fetch_or(&s->view.sq()->flags, kSqNeedWakeup);
    full_fence();
    // Re-check after announcing the sleep: a client that published before seeing the flag does not ring.
    bool work = false;
    for (auto& s : sessions_)
      if (!s->ended && (s->consumer.pending() || s->writer.backlogged())) work = true;
    if (!work || all_backlog_stuck()) {
      ++sleeps;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      // The timeout is a safety net, not the mechanism: waking by timeout with work waiting is a lost wake-up.
      const int timeout = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(left.count(), 2000)));
      const int r = check_hangups(timeout);
      if (r == 0) {
        for (auto& s : sessions_)
          if (!s->ended && s->consumer.pending()) ++lost_wakeups;
      }
    }
    for (auto& s : sessions_) fetch_and(&s->view.sq()->flags, ~kSqNeedWakeup);
  }

  // Backlogged sessions whose client has not moved its head: nothing to do until it rings.
  bool all_backlog_stuck() {
    for (auto& s : sessions_) {
      if (s->ended) continue;
      if (s->consumer.pending()) return false;
      if (s->writer.backlogged()) {
        const auto before = s->writer.tail();
        if (s->writer.flush() != Fault::none) return false;
        if (s->writer.tail() != before) return false;  // it moved: more work
      }
    }
    return true;
  }

  std::vector<std::unique_ptr<Session>> sessions_;
};

struct EchoClientResult {
  bool ok = true;
  std::string error;
  std::uint64_t jobs_done = 0, events = 0, nops = 0, queue_full = 0;
};

// Submits `jobs` submits (and a nop every 64th) and checks every completion. Returns at the first inconsistency.
inline EchoClientResult run_echo_client(RingClient& c, std::uint64_t jobs, std::chrono::seconds limit) {
  EchoClientResult res;
  struct Job {
    int stage = 0;  // 0 submitted, 1 accepted, 2 finished
    std::uint64_t job_id = 0;
    std::uint32_t next_step = 0;
  };
  std::vector<Job> st(jobs);
  std::uint64_t next = 0, nops_sent = 0;
  auto fail = [&](std::string why) {
    res.ok = false;
    res.error = std::move(why);
    return res;
  };
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<Event> ev;
  while (res.jobs_done < jobs || res.nops < nops_sent) {
    if (std::chrono::steady_clock::now() > deadline)
      return fail("deadline: " + std::to_string(res.jobs_done) + "/" + std::to_string(jobs) + " jobs done");
    while (next < jobs) {
      Status s;
      if (next % 64 == 63 && nops_sent <= next / 64) {
        s = c.nop(kNopBit | nops_sent);
        if (s.ok()) {
          ++nops_sent;
          continue;
        }
      } else {
        const std::string prompt = "job " + std::to_string(next);
        s = c.submit(next, RecordWriter().add("model", "m").add("prompt", std::string_view(prompt))
                               .add("max_tokens", std::uint64_t{kBatches * kBatchTokens}).bytes());
        if (s.ok()) {
          ++next;
          continue;
        }
      }
      if (s.error().code != Errc::queue_full) return fail("submit: " + s.error().message);
      ++res.queue_full;
      break;
    }
    ev.clear();
    auto n = c.wait(ev, std::chrono::milliseconds(500));
    if (!n) return fail("wait: " + n.error().message);
    if (*n == 0 && c.state() != SessionState::open)
      return fail("session " + std::string(session_state_name(c.state())) + " (" + std::string(fault_name(c.fault())) + ")");
    for (const auto& e : ev) {
      ++res.events;
      const auto ud = e.entry.user_data;
      if (ud & kNopBit) {
        if (e.kind() != Kind::nop) return fail("nop answered with " + std::string(kind_name(e.kind())));
        if ((ud & ~kNopBit) != res.nops) return fail("nop out of order");
        ++res.nops;
        continue;
      }
      if (ud >= next) return fail("completion for a job never submitted: " + std::to_string(ud));
      Job& j = st[ud];
      const std::string where = "job " + std::to_string(ud) + ": ";
      switch (e.kind()) {
        case Kind::accepted: {
          if (j.stage != 0) return fail(where + "accepted twice or late");
          auto r = parse_record(e.data);
          if (!r.ok() || !r.find("job_id") || std::get<std::uint64_t>(r.find("job_id")->value) != e.entry.job_id)
            return fail(where + "bad accepted record");
          j.stage = 1;
          j.job_id = e.entry.job_id;
          break;
        }
        case Kind::tokens: {
          if (j.stage != 1) return fail(where + "tokens outside accepted..finished");
          if (e.entry.job_id != j.job_id) return fail(where + "job id changed");
          if (e.entry.step != j.next_step)
            return fail(where + "step " + std::to_string(e.entry.step) + ", expected " + std::to_string(j.next_step));
          if (e.entry.flags != 0) return fail(where + "unexpected flags (gap?)");
          if (e.data.size() != e.entry.count * 4u + e.entry.text_length) return fail(where + "token sizes");
          for (std::uint32_t k = 0; k < e.entry.count; ++k) {
            std::int32_t id;
            std::memcpy(&id, e.data.data() + 4 * k, 4);
            if (id != static_cast<std::int32_t>(j.next_step + k)) return fail(where + "token id mismatch");
          }
          j.next_step += e.entry.count;
          break;
        }
        case Kind::finished: {
          if (j.stage != 1) return fail(where + "finished twice or before accepted");
          if (j.next_step != kBatches * kBatchTokens)
            return fail(where + "finished after " + std::to_string(j.next_step) + " tokens");
          j.stage = 2;
          ++res.jobs_done;
          break;
        }
        default:
          return fail(where + "unexpected " + std::string(kind_name(e.kind())));
      }
    }
  }
  if (c.overflow_tokens() != 0) return fail("tokens were dropped");
  return res;
}

}  // namespace tandem::ring::test
