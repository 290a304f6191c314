// it_ring.sh's driver of ring sessions against a real tandemd (bus from $TANDEM_BUS). Modes:
//
//   ring_tool many SESSIONS JOBS MAX_TOKENS
//       SESSIONS threads, each with its own bus connection and ring session, submit JOBS jobs each (pipelined; a
//       submit answered Busy/QueueFull/HostMemory is retried after its retry_after_ms), then check every job: exactly
//       one accepted, then contiguous token steps (no gap, no duplicate), exactly one finished (completed), nothing
//       after it, no job id twice; for a sample the streamed text and ids equal GetJob's. Prints one summary line.
//   ring_tool garbage FAULT
//       opens a session (raw fds from OpenSession, the memfd mapped here), submits one valid job by hand, then writes
//       the bad input of FAULT (opcode, reserved, length, offset, record, utf8, sq_index, cq_index) straight into the
//       mapping and rings the doorbell; waits for the session to fail and checks the fault. Prints
//       "session=<id> job=<id> state=<state> fault=<fault>".
//   ring_tool stream MAX_TOKENS
//       submits one long job through a ring session, prints "job <id>" after its first tokens, then keeps reading
//       until killed (it_ring.sh SIGKILLs it).
//   ring_tool hangup SECONDS
//       opens a session, closes its own submit doorbell (the write end) but stays on the bus and keeps the mapping for
//       SECONDS, then prints "session=<id> state=<state>".
//
// Exit: 0 when every check held, 1 with "ring_tool: FAIL: ..." lines on stderr otherwise, 2 on usage errors.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "client/ring_session.h"
#include "ring/client_ring.h"
#include "ring/layout.h"
#include "ring/record.h"

namespace tc = tandem::client;
namespace ring = tandem::ring;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

std::mutex g_out;
std::atomic<int> g_failures{0};

void failure(const std::string& what) {
  std::lock_guard lock(g_out);
  if (g_failures.fetch_add(1) < 40) std::cerr << "ring_tool: FAIL: " << what << "\n";
}

std::unique_ptr<tc::Client> connect() {
  auto spec = tc::bus_spec_from_env();
  if (!spec) {
    failure("bus: " + spec.error().message);
    return nullptr;
  }
  auto c = tc::Client::connect(*spec);
  if (!c) {
    failure("connect: " + c.error().message);
    return nullptr;
  }
  return std::move(c).value();
}

// --- many -----------------------------------------------------------------------------------------------------------

struct JobTrack {
  std::uint64_t job_id = 0;
  int accepted = 0, finished = 0, errors = 0, retries = 0;
  std::uint32_t next_step = 0;
  std::string text;
  std::vector<std::int32_t> tokens;
  std::string final_state;
  bool after_finished = false;
  Clock::time_point retry_at{};
  bool pending_retry = false;
};

struct SessionResult {
  std::uint64_t accepted = 0, finished = 0, tokens = 0, retries = 0, events = 0, no_hint = 0;
  std::map<std::string, std::uint64_t> retry_by_error;
  std::uint64_t hint_min = UINT64_MAX, hint_max = 0;
  std::map<std::uint64_t, JobTrack> jobs;  // by user_data
  bool ok = true;
};

void run_session(int index, int jobs, std::uint32_t max_tokens, SessionResult& res) {
  auto client = connect();
  if (!client) {
    res.ok = false;
    return;
  }
  tc::SessionOptions so;
  so.sq_entries = 64;
  so.cq_entries = 256;
  auto rs = tc::RingSession::open(*client, so);
  if (!rs) {
    failure("session " + std::to_string(index) + ": OpenSession: " + rs.error().message);
    res.ok = false;
    return;
  }
  auto& s = **rs;
  const std::uint64_t base = static_cast<std::uint64_t>(index + 1) << 32;
  constexpr int kWindow = 24;  // pipelined: 4 x 24 is past the queues, so some submits are Busy and retried
  int next = 0, in_flight = 0, done = 0;
  std::deque<std::uint64_t> retry;  // user_data waiting for their retry time
  auto request = [&](std::uint64_t ud) {
    tc::Request r;
    r.prompt = "Ring job " + std::to_string(ud & 0xffffffffu) + " of session " + std::to_string(index) + ":";
    r.options.max_tokens = max_tokens;
    r.options.seed = ud;
    r.options.temperature = 0.8;
    return r;
  };
  const auto deadline = Clock::now() + 240s;
  std::vector<tc::RingEvent> evs;
  while (done < jobs) {
    if (Clock::now() > deadline) {
      failure("session " + std::to_string(index) + ": timed out with " + std::to_string(done) + "/" +
              std::to_string(jobs) + " jobs finished");
      res.ok = false;
      return;
    }
    // Submit: due retries first, then new jobs, while the window and the ring have room.
    bool full = false;
    while (!full && in_flight < kWindow) {
      std::uint64_t ud = 0;
      if (!retry.empty() && res.jobs[retry.front()].retry_at <= Clock::now()) {
        ud = retry.front();
      } else if (next < jobs) {
        ud = base | static_cast<std::uint64_t>(next);
      } else {
        break;
      }
      auto st = s.submit(request(ud), ud);
      if (!st) {
        if (st.error().code == tandem::Errc::queue_full) {
          full = true;  // the ring is full: read first
          break;
        }
        failure("session " + std::to_string(index) + ": submit: " + st.error().message);
        res.ok = false;
        return;
      }
      if (!retry.empty() && retry.front() == ud) {
        retry.pop_front();
        res.jobs[ud].pending_retry = false;
      } else {
        res.jobs[ud];
        ++next;
      }
      ++in_flight;
    }
    evs.clear();
    auto n = s.wait(evs, 200ms);
    if (!n) {
      failure("session " + std::to_string(index) + ": wait: " + n.error().message);
      res.ok = false;
      return;
    }
    if (!s.open()) {
      failure("session " + std::to_string(index) + " ended: " + s.state_text());
      res.ok = false;
      return;
    }
    for (auto& ev : evs) {
      ++res.events;
      auto it = res.jobs.find(ev.user_data);
      if (it == res.jobs.end()) {
        failure("event " + ev.kind + " with an unknown user_data " + std::to_string(ev.user_data));
        continue;
      }
      JobTrack& t = it->second;
      if (t.finished) t.after_finished = true;
      if (ev.kind == "error") {
        --in_flight;
        const std::string name = ev.error ? ev.error->short_name() : "?";
        if (t.accepted) {
          failure("job " + std::to_string(t.job_id) + ": an error after accepted: " + name);
          continue;
        }
        if (name == "Busy" || name == "QueueFull" || name == "HostMemory") {
          ++t.retries;
          ++res.retries;
          ++res.retry_by_error[name];
          if (!ev.error->retry_after_ms) {
            ++res.no_hint;
            if (res.no_hint == 1) failure(name + " without retry_after_ms: " + ev.error->describe());
          }
          const auto hint = ev.error && ev.error->retry_after_ms ? *ev.error->retry_after_ms : 50;
          res.hint_min = std::min(res.hint_min, hint);
          res.hint_max = std::max(res.hint_max, hint);
          t.retry_at = Clock::now() + std::chrono::milliseconds(hint);
          t.pending_retry = true;
          retry.push_back(ev.user_data);
          continue;
        }
        failure("submit " + std::to_string(ev.user_data) + " failed: " + (ev.error ? ev.error->describe() : "?"));
        ++t.errors;
        ++done;
        continue;
      }
      if (ev.kind == "accepted") {
        ++t.accepted;
        ++res.accepted;
        if (t.accepted > 1) failure("user_data " + std::to_string(ev.user_data) + ": accepted twice");
        t.job_id = ev.job_id;
        if (!ev.accepted || ev.accepted->job_id != ev.job_id)
          failure("accepted of job " + std::to_string(ev.job_id) + " without a matching placement");
        continue;
      }
      if (!t.accepted) failure("job " + std::to_string(ev.job_id) + ": " + ev.kind + " before accepted");
      if (ev.job_id != t.job_id)
        failure("user_data " + std::to_string(ev.user_data) + ": event for job " + std::to_string(ev.job_id) +
                ", accepted as " + std::to_string(t.job_id));
      if (ev.kind == "tokens") {
        const auto& u = *ev.update;
        const auto step = u.step.value_or(~0u);
        const auto count = u.tokens ? u.tokens->size() : 0;
        if (ev.gap) failure("job " + std::to_string(t.job_id) + ": a GAP (tokens dropped) with small jobs");
        if (step != t.next_step)
          failure("job " + std::to_string(t.job_id) + ": token step " + std::to_string(step) + ", want " +
                  std::to_string(t.next_step) + (step < t.next_step ? " (duplicate)" : " (hole)"));
        t.next_step = step + static_cast<std::uint32_t>(count);
        if (u.tokens) t.tokens.insert(t.tokens.end(), u.tokens->begin(), u.tokens->end());
        if (u.text) t.text += *u.text;
        res.tokens += count;
      } else if (ev.kind == "finished") {
        ++t.finished;
        ++res.finished;
        if (t.finished > 1) failure("job " + std::to_string(t.job_id) + ": finished twice");
        t.final_state = ev.update && ev.update->state ? *ev.update->state : "?";
        if (ev.update && ev.update->tokens_total && *ev.update->tokens_total != t.next_step)
          failure("job " + std::to_string(t.job_id) + ": finished says tokens_total " +
                  std::to_string(*ev.update->tokens_total) + ", streamed " + std::to_string(t.next_step));
        --in_flight;
        ++done;
      } else if (ev.kind != "routed" && ev.kind != "started" && ev.kind != "migrated") {
        failure("job " + std::to_string(t.job_id) + ": unexpected event " + ev.kind);
      }
    }
  }
  // Sample: streamed text and ids == GetJob.
  int sampled = 0;
  for (auto& [ud, t] : res.jobs) {
    if (t.after_finished) failure("job " + std::to_string(t.job_id) + ": events after finished");
    if (t.accepted != 1 || t.finished != 1)
      failure("user_data " + std::to_string(ud) + ": accepted " + std::to_string(t.accepted) + " times, finished " +
              std::to_string(t.finished) + " times (want 1 and 1)");
    if (t.final_state != "completed") failure("job " + std::to_string(t.job_id) + " ended " + t.final_state);
    if ((ud & 0xffffffffu) % 25 != 0) continue;
    ++sampled;
    auto info = client->get_job(t.job_id);
    if (!info) {
      failure("GetJob(" + std::to_string(t.job_id) + "): " + info.error().message);
      continue;
    }
    if (info->text.value_or("<none>") != t.text)
      failure("job " + std::to_string(t.job_id) + ": streamed text '" + t.text + "' != GetJob text '" +
              info->text.value_or("<none>") + "'");
    if (!info->tokens || *info->tokens != t.tokens)
      failure("job " + std::to_string(t.job_id) + ": streamed ids != GetJob tokens");
  }
  if (sampled == 0) failure("session " + std::to_string(index) + ": no job sampled against GetJob");
}

int mode_many(int sessions, int jobs, std::uint32_t max_tokens) {
  const auto t0 = Clock::now();
  std::vector<SessionResult> results(static_cast<std::size_t>(sessions));
  std::vector<std::thread> threads;
  for (int i = 0; i < sessions; ++i)
    threads.emplace_back([&, i] { run_session(i, jobs, max_tokens, results[static_cast<std::size_t>(i)]); });
  for (auto& t : threads) t.join();
  SessionResult total;
  std::set<std::uint64_t> ids;
  std::uint64_t dup = 0;
  for (auto& r : results) {
    total.accepted += r.accepted;
    total.finished += r.finished;
    total.tokens += r.tokens;
    total.retries += r.retries;
    total.events += r.events;
    for (auto& [k, v] : r.retry_by_error) total.retry_by_error[k] += v;
    total.hint_min = std::min(total.hint_min, r.hint_min);
    total.hint_max = std::max(total.hint_max, r.hint_max);
    for (auto& [ud, t] : r.jobs)
      if (t.job_id && !ids.insert(t.job_id).second) ++dup;
    if (!r.ok) total.ok = false;
  }
  if (dup) failure(std::to_string(dup) + " job ids were given to two submissions");
  const std::uint64_t want = static_cast<std::uint64_t>(sessions) * static_cast<std::uint64_t>(jobs);
  if (total.accepted != want) failure("accepted " + std::to_string(total.accepted) + ", want " + std::to_string(want));
  if (total.finished != want) failure("finished " + std::to_string(total.finished) + ", want " + std::to_string(want));
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  std::cout << "sessions=" << sessions << " jobs=" << want << " accepted=" << total.accepted
            << " finished=" << total.finished << " distinct_ids=" << ids.size() << " tokens=" << total.tokens
            << " events=" << total.events << " retries=" << total.retries;
  for (auto& [k, v] : total.retry_by_error) std::cout << " " << k << "=" << v;
  if (total.retries) std::cout << " retry_after_ms=" << total.hint_min << ".." << total.hint_max;
  std::cout << " elapsed_ms=" << ms << std::endl;
  return g_failures.load() == 0 && total.ok ? 0 : 1;
}

// --- garbage --------------------------------------------------------------------------------------------------------

struct Mapping {
  void* base = MAP_FAILED;
  std::size_t size = 0;
  ~Mapping() {
    if (base != MAP_FAILED) ::munmap(base, size);
  }
};

ring::SubmissionEntry entry(ring::Opcode op, std::uint64_t ud) {
  ring::SubmissionEntry e{};
  e.opcode = static_cast<std::uint8_t>(op);
  e.user_data = ud;
  return e;
}

int mode_garbage(const std::string& fault_name) {
  auto client = connect();
  if (!client) return 1;
  auto h = client->open_session();
  if (!h) {
    failure("OpenSession: " + h.error().message);
    return 1;
  }
  const int memfd = h->memfd, sq_db = h->submit_doorbell;
  struct stat st{};
  if (::fstat(memfd, &st) != 0) {
    failure("fstat memfd");
    return 1;
  }
  Mapping m;
  m.size = static_cast<std::size_t>(st.st_size);
  m.base = ::mmap(nullptr, m.size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (m.base == MAP_FAILED) {
    failure(std::string("mmap: ") + std::strerror(errno));
    return 1;
  }
  auto l = ring::read_header(m.base, m.size);
  if (!l) {
    failure("header: " + l.error().message);
    return 1;
  }
  const ring::View v{static_cast<std::uint8_t*>(m.base), *l};
  const int db = ::fcntl(sq_db, F_DUPFD_CLOEXEC, 0);
  // A RingClient over duplicates reaps completions and sees the state; the SQ is written by hand below.
  auto rc = ring::RingClient::attach(::fcntl(memfd, F_DUPFD_CLOEXEC, 0), ::fcntl(sq_db, F_DUPFD_CLOEXEC, 0),
                                     ::fcntl(h->completion_doorbell, F_DUPFD_CLOEXEC, 0));
  if (!rc) {
    failure("attach: " + rc.error().message);
    return 1;
  }
  auto& cl = **rc;
  auto ring_doorbell = [&] {
    const char one = 1;
    (void)!::write(db, &one, 1);
  };
  auto put = [&](std::uint32_t i, const ring::SubmissionEntry& e) {
    std::memcpy(v.sqes() + (i & (l->sq_entries - 1)), &e, sizeof e);
  };
  auto set_tail = [&](std::uint32_t t) {
    ring::store_release(&v.sq()->tail, t);
    ring::full_fence();
    ring_doorbell();  // always: the daemon may sleep
  };
  // 1. A valid job, by hand: it must survive the session's failure.
  auto rec = ring::RecordWriter()
                 .add("prompt", "A job submitted before the garbage:")
                 .add("max_tokens", std::uint64_t{24})
                 .add("seed", std::uint64_t{3})
                 .take();
  std::memcpy(v.request_data(), rec.data(), rec.size());
  auto e = entry(ring::Opcode::submit, 7);
  e.data_length = static_cast<std::uint32_t>(rec.size());
  put(0, e);
  set_tail(1);
  std::vector<ring::Event> evs;
  std::uint64_t job = 0;
  const auto deadline = Clock::now() + 20s;
  while (!job && Clock::now() < deadline && cl.state() == ring::SessionState::open) {
    auto n = cl.wait(evs, 500ms);
    if (!n) {
      failure("wait: " + n.error().message);
      return 1;
    }
    for (const auto& ev : evs)
      if (ev.entry.user_data == 7 && ev.kind() == ring::Kind::accepted) job = ev.entry.job_id;
      else if (ev.entry.user_data == 7 && ev.kind() == ring::Kind::error) failure("the valid submit got an error");
  }
  if (!job) {
    failure("the valid submit was not accepted (state " +
            std::string(ring::session_state_name(cl.state())) + ")");
    return 1;
  }
  // 2. The garbage.
  ring::Fault want = ring::Fault::none;
  std::uint32_t tail = 1;
  auto payload = [&](std::vector<std::uint8_t> bytes) {
    const std::uint64_t off = l->request_data_size / 2;
    std::memcpy(v.request_data() + off, bytes.data(), bytes.size());
    auto s = entry(ring::Opcode::submit, 66);
    s.data_offset = off;
    s.data_length = static_cast<std::uint32_t>(bytes.size());
    put(tail++, s);
  };
  if (fault_name == "opcode") {
    want = ring::Fault::opcode;
    auto b = entry(ring::Opcode::nop, 66);
    b.opcode = 200;
    put(tail++, b);
  } else if (fault_name == "reserved") {
    want = ring::Fault::reserved;
    auto b = entry(ring::Opcode::nop, 66);
    b.reserved[5] = 0xff;
    put(tail++, b);
  } else if (fault_name == "length") {
    want = ring::Fault::length;
    auto b = entry(ring::Opcode::submit, 66);
    b.data_length = l->max_request_bytes + 1;
    put(tail++, b);
  } else if (fault_name == "offset") {
    want = ring::Fault::offset;
    auto b = entry(ring::Opcode::submit, 66);
    b.data_offset = l->request_data_size - 4;
    b.data_length = 64;
    put(tail++, b);
  } else if (fault_name == "record") {
    want = ring::Fault::record;
    auto r = ring::RecordWriter().add("prompt", "x").take();
    r[1] = 0;  // key length 0
    payload(r);
  } else if (fault_name == "utf8") {
    want = ring::Fault::utf8;
    payload(ring::RecordWriter().add("prompt", "\xff\xfe not utf-8").take());
  } else if (fault_name == "sq_index") {
    want = ring::Fault::sq_index;
    tail = 1 + l->sq_entries + 7;
  } else if (fault_name == "cq_index") {
    want = ring::Fault::cq_index;
    ring::store_release(&v.cq()->head, ring::load_acquire(&v.cq()->tail) + 5);
    put(tail++, entry(ring::Opcode::nop, 66));
  } else {
    std::cerr << "ring_tool: unknown fault '" << fault_name << "'\n";
    return 2;
  }
  set_tail(tail);
  const auto end = Clock::now() + 20s;
  while (cl.state() == ring::SessionState::open && Clock::now() < end) {
    evs.clear();
    if (want == ring::Fault::cq_index) {
      // Do not reap (our RingClient would move the head back into range): watch the state word.
      pollfd p{h->completion_doorbell, POLLIN, 0};
      (void)::poll(&p, 1, 100);
      continue;
    }
    auto n = cl.wait(evs, 500ms);
    if (!n) break;
  }
  const auto state = static_cast<ring::SessionState>(ring::load_acquire(&v.sq()->state));
  const auto fault = static_cast<ring::Fault>(ring::load_acquire(&v.sq()->fault));
  std::cout << "session=" << h->session_id << " job=" << job << " state=" << ring::session_state_name(state)
            << " fault=" << ring::fault_name(fault) << std::endl;
  if (state != ring::SessionState::failed)
    failure("want the session failed, it is " + std::string(ring::session_state_name(state)));
  if (fault != want)
    failure("want fault " + std::string(ring::fault_name(want)) + ", got " + std::string(ring::fault_name(fault)));
  if (cl.state() != ring::SessionState::failed || cl.fault() != want) failure("the client library disagrees");
  ::close(db);
  return g_failures.load() == 0 ? 0 : 1;
}

// --- stream (killed mid-stream) -------------------------------------------------------------------------------------

int mode_stream(std::uint32_t max_tokens) {
  auto client = connect();
  if (!client) return 1;
  auto rs = tc::RingSession::open(*client);
  if (!rs) {
    failure("OpenSession: " + rs.error().message);
    return 1;
  }
  auto& s = **rs;
  tc::Request r;
  r.prompt = "Tell a very long story about rings:";
  r.options.max_tokens = max_tokens;
  r.options.seed = 11;
  if (auto st = s.submit(r, 1); !st) {
    failure("submit: " + st.error().message);
    return 1;
  }
  std::uint64_t job = 0;
  bool printed = false;
  std::vector<tc::RingEvent> evs;
  for (;;) {
    evs.clear();
    auto n = s.wait(evs, 1s);
    if (!n) {
      failure("wait: " + n.error().message);
      return 1;
    }
    for (const auto& ev : evs) {
      if (ev.kind == "accepted") job = ev.job_id;
      if (ev.kind == "error") {
        failure("submit: " + (ev.error ? ev.error->describe() : std::string("?")));
        return 1;
      }
      if (ev.kind == "tokens" && job && !printed) {
        std::cout << "job " << job << std::endl;
        printed = true;
      }
      if (ev.kind == "finished") {
        failure("the job finished before the kill (make it longer)");
        return 1;
      }
    }
    if (!s.open()) {
      failure("the session ended: " + s.state_text());
      return 1;
    }
  }
}

// --- hangup ---------------------------------------------------------------------------------------------------------

int mode_hangup(int seconds) {
  auto client = connect();
  if (!client) return 1;
  auto h = client->open_session();
  if (!h) {
    failure("OpenSession: " + h.error().message);
    return 1;
  }
  ::close(h->submit_doorbell);
  h->submit_doorbell = -1;
  std::cout << "session=" << h->session_id << " doorbell closed" << std::endl;
  // Stay on the bus (answering nothing), holding the memfd and the completion doorbell.
  const auto end = Clock::now() + std::chrono::seconds(seconds);
  while (Clock::now() < end) (void)client->process(100ms);
  struct stat st{};
  (void)::fstat(h->memfd, &st);
  void* base = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_SHARED, h->memfd, 0);
  std::string state = "?";
  if (base != MAP_FAILED) {
    auto l = ring::read_header(base, static_cast<std::size_t>(st.st_size));
    if (l)
      state = ring::session_state_name(static_cast<ring::SessionState>(ring::load_acquire(
          &reinterpret_cast<const ring::SqControl*>(static_cast<const std::uint8_t*>(base) + l->sq_control_offset)
               ->state)));
    ::munmap(base, static_cast<std::size_t>(st.st_size));
  }
  std::cout << "session=" << h->session_id << " state=" << state << std::endl;
  return 0;
}

int usage() {
  std::cerr << "usage: ring_tool many SESSIONS JOBS MAX_TOKENS | garbage FAULT | stream MAX_TOKENS | hangup SECONDS\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> a(argv + 1, argv + argc);
  if (a.empty()) return usage();
  try {
    if (a[0] == "many" && a.size() == 4)
      return mode_many(std::stoi(a[1]), std::stoi(a[2]), static_cast<std::uint32_t>(std::stoul(a[3])));
    if (a[0] == "garbage" && a.size() == 2) return mode_garbage(a[1]);
    if (a[0] == "stream" && a.size() == 2) return mode_stream(static_cast<std::uint32_t>(std::stoul(a[1])));
    if (a[0] == "hangup" && a.size() == 2) return mode_hangup(std::stoi(a[1]));
  } catch (const std::exception& e) {
    std::cerr << "ring_tool: " << e.what() << "\n";
    return 2;
  }
  return usage();
}
