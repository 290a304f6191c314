#include "ring/client_ring.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tandem::ring {

namespace {

using Clock = std::chrono::steady_clock;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Doorbells are pipes (docs/rings.md "Doorbells"): one byte rings, any number of bytes may be pending.
// Returns false when the daemon's end is closed (EOF): the daemon is gone.
bool drain_doorbell(int fd) {
  char buf[256];
  for (;;) {
    const auto n = ::read(fd, buf, sizeof buf);
    if (n > 0) continue;
    return n != 0;
  }
}

}  // namespace

Result<std::unique_ptr<RingClient>> RingClient::attach(int memfd, int sq_doorbell, int cq_doorbell, SpinPolicy spin) {
  std::unique_ptr<RingClient> c(new RingClient());
  c->memfd_ = memfd;
  c->sq_db_ = sq_doorbell;
  c->cq_db_ = cq_doorbell;
  c->policy_ = spin;
  c->spin_ = spin.initial;
  struct stat st {};
  if (memfd < 0 || sq_doorbell < 0 || cq_doorbell < 0) return fail(Errc::invalid_argument, "ring session: missing fd");
  if (::fstat(memfd, &st) != 0) return fail(Errc::io_error, std::string("ring session: fstat: ") + std::strerror(errno));
  if (st.st_size <= 0 || static_cast<std::uint64_t>(st.st_size) > (1ull << 32))
    return fail(Errc::format_error, "ring session: memfd size " + std::to_string(st.st_size));
  void* p = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (p == MAP_FAILED) return fail(Errc::io_error, std::string("ring session: mmap: ") + std::strerror(errno));
  c->mapped_ = static_cast<std::size_t>(st.st_size);
  c->view_.base = static_cast<std::uint8_t*>(p);
  auto layout = read_header(p, c->mapped_);
  if (!layout) return fail(std::move(layout).error());
  c->view_.layout = *layout;
  c->sq_ends_.assign(layout->sq_entries, 0);
  c->arena_ = CircularArena(layout->request_data_size);
  // Resume from what is in the mapping (a fresh session: all zero).
  c->sq_tail_ = load_acquire(&c->view_.sq()->tail);
  c->sq_seen_head_ = load_acquire(&c->view_.sq()->head);
  c->cq_head_ = load_acquire(&c->view_.cq()->head);
  if (c->sq_tail_ != c->sq_seen_head_) return fail(Errc::format_error, "ring session already in use");
  return c;
}

RingClient::~RingClient() {
  if (view_.base) ::munmap(view_.base, mapped_);
  close_fd(memfd_);
  close_fd(sq_db_);
  close_fd(cq_db_);
}

SessionState RingClient::state() const {
  const auto st = static_cast<SessionState>(load_acquire(&view_.sq()->state));
  // The daemon died without saying so (its end of the completion doorbell closed): nothing will come any more.
  return st == SessionState::open && peer_gone_ ? SessionState::closed : st;
}

Fault RingClient::fault() const { return static_cast<Fault>(load_acquire(&view_.sq()->fault)); }

std::uint64_t RingClient::overflow_tokens() const { return load_relaxed64(&view_.cq()->overflow_tokens); }

std::uint32_t RingClient::in_flight_submissions() const { return sq_tail_ - load_acquire(&view_.sq()->head); }

bool RingClient::reclaim() {
  const std::uint32_t h = load_acquire(&view_.sq()->head);
  if (h == sq_seen_head_) return true;
  if (h - sq_seen_head_ > sq_tail_ - sq_seen_head_) return false;
  if (!arena_.release_to(sq_ends_[(h - 1) & (view_.layout.sq_entries - 1)])) return false;
  sq_seen_head_ = h;
  return true;
}

Status RingClient::push(const SubmissionEntry& e, std::span<const std::uint8_t> data) {
  if (state() != SessionState::open)
    return fail(Errc::unavailable, "ring session " + std::string(session_state_name(state())) +
                                       (state() == SessionState::failed ? std::string(" (") + std::string(fault_name(fault())) + ")" : ""));
  if (!reclaim()) return fail(Errc::format_error, "ring session: daemon head out of range");
  const Layout& l = view_.layout;
  if (sq_tail_ - sq_seen_head_ >= l.sq_entries) {
    ++stats_.submit_full;
    return fail(Errc::queue_full, "ring submission queue full");
  }
  SubmissionEntry entry = e;
  if (!data.empty()) {
    auto off = arena_.allocate(data.size());
    if (!off) {
      ++stats_.submit_full;
      return fail(Errc::queue_full, "ring request area full");
    }
    std::memcpy(view_.request_data() + *off, data.data(), data.size());
    entry.data_offset = *off;
    entry.data_length = static_cast<std::uint32_t>(data.size());
  }
  const std::uint32_t slot = sq_tail_ & (l.sq_entries - 1);
  std::memcpy(view_.sqes() + slot, &entry, sizeof entry);
  sq_ends_[slot] = arena_.end_position();
  ++sq_tail_;
  store_release(&view_.sq()->tail, sq_tail_);
  ring_sq_doorbell_if_needed();
  return {};
}

void RingClient::ring_sq_doorbell_if_needed() {
  full_fence();
  if (load_relaxed(&view_.sq()->flags) & kSqNeedWakeup) {
    const char one = 1;
    if (::write(sq_db_, &one, 1) == 1) ++stats_.doorbells_rung;  // EAGAIN: the pipe is full, a ring is pending anyway
  }
}

namespace {
Status check_record(std::span<const std::uint8_t> record, std::uint32_t max, const char* what) {
  if (record.empty()) return fail(Errc::invalid_argument, std::string("empty ") + what + " record");
  if (record.size() > max)
    return fail(Errc::invalid_argument, std::string(what) + " record of " + std::to_string(record.size()) +
                                            " bytes exceeds the session's max_request_bytes " + std::to_string(max));
  return {};
}
}  // namespace

Status RingClient::submit(std::uint64_t user_data, std::span<const std::uint8_t> record) {
  TANDEM_TRY(check_record(record, view_.layout.max_request_bytes, "submit"));
  SubmissionEntry e{};
  e.opcode = static_cast<std::uint8_t>(Opcode::submit);
  e.user_data = user_data;
  return push(e, record);
}

Status RingClient::embed(std::uint64_t user_data, std::span<const std::uint8_t> record) {
  TANDEM_TRY(check_record(record, view_.layout.max_request_bytes, "embed"));
  SubmissionEntry e{};
  e.opcode = static_cast<std::uint8_t>(Opcode::embed);
  e.user_data = user_data;
  return push(e, record);
}

Status RingClient::transcribe(std::uint64_t user_data, std::span<const std::uint8_t> record) {
  TANDEM_TRY(check_record(record, view_.layout.max_request_bytes, "transcribe"));
  SubmissionEntry e{};
  e.opcode = static_cast<std::uint8_t>(Opcode::transcribe);
  e.user_data = user_data;
  return push(e, record);
}

Status RingClient::audio(std::uint64_t user_data, std::uint64_t job_id, std::span<const std::uint8_t> record) {
  if (job_id == 0) return fail(Errc::invalid_argument, "audio needs the stream's job id (from its accepted)");
  TANDEM_TRY(check_record(record, view_.layout.max_request_bytes, "audio"));
  SubmissionEntry e{};
  e.opcode = static_cast<std::uint8_t>(Opcode::audio);
  e.user_data = user_data;
  e.job_id = job_id;
  return push(e, record);
}

Status RingClient::cancel(std::uint64_t user_data, std::uint64_t job_id) {
  SubmissionEntry e{};
  e.opcode = static_cast<std::uint8_t>(Opcode::cancel);
  e.user_data = user_data;
  e.job_id = job_id;
  return push(e, {});
}

Status RingClient::nop(std::uint64_t user_data) {
  SubmissionEntry e{};
  e.opcode = static_cast<std::uint8_t>(Opcode::nop);
  e.user_data = user_data;
  return push(e, {});
}

bool RingClient::cq_nonempty() const { return load_acquire(&view_.cq()->tail) != cq_head_; }

Result<std::size_t> RingClient::reap(std::vector<Event>& out, std::size_t max) {
  const Layout& l = view_.layout;
  const std::uint32_t tail = load_acquire(&view_.cq()->tail);
  const std::uint32_t available = tail - cq_head_;
  if (available > l.cq_entries) return fail(Errc::format_error, "ring session: completion tail out of range");
  const std::size_t n = std::min<std::size_t>(available, max);
  for (std::size_t i = 0; i < n; ++i) {
    Event ev;
    std::memcpy(&ev.entry, view_.cqes() + (cq_head_ & (l.cq_entries - 1)), sizeof ev.entry);
    const auto off = ev.entry.data_offset, len = std::uint64_t{ev.entry.data_length};
    if (off > l.response_data_size || len > l.response_data_size - off)
      return fail(Errc::format_error, "ring session: completion data outside the response area");
    if (ev.kind() == Kind::tokens && std::uint64_t{ev.entry.count} * 4 + ev.entry.text_length != len)
      return fail(Errc::format_error, "ring session: token completion sizes disagree");
    ev.data.assign(view_.response_data() + off, view_.response_data() + off + len);
    ++cq_head_;
    out.push_back(std::move(ev));
  }
  if (n > 0) {
    store_release(&view_.cq()->head, cq_head_);
    full_fence();  // store head, then load the daemon's flags (the daemon: store NEED_WAKEUP, fence, load our head)
    if (load_acquire(&view_.cq()->daemon_flags) & kCqBacklog) ring_sq_doorbell_if_needed();
  }
  return n;
}

Result<std::size_t> RingClient::wait(std::vector<Event>& out, std::chrono::nanoseconds timeout, int extra_fd) {
  auto got = reap(out);
  if (!got || *got > 0) return got;
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  // Spin.
  const auto spin_end = start + std::min(spin_, timeout);
  while (Clock::now() < spin_end) {
    for (int i = 0; i < 64; ++i) {
      if (cq_nonempty()) {
        ++stats_.spins_hit;
        spin_ = std::min(policy_.max, std::max(spin_ * 2, std::chrono::nanoseconds{1000}));
        return reap(out);
      }
      cpu_relax();
    }
    if (state() != SessionState::open) return reap(out);
  }
  // Sleep on the doorbell.
  for (;;) {
    fetch_or(&view_.cq()->client_flags, kCqNeedWakeup);
    full_fence();
    if (cq_nonempty() || state() != SessionState::open) break;
    const auto now = Clock::now();
    if (now >= deadline) break;
    ++stats_.sleeps;
    pollfd fds[2] = {{cq_db_, POLLIN, 0}, {extra_fd, POLLIN, 0}};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
    const int r = ::poll(fds, extra_fd >= 0 ? 2 : 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
    if (r < 0 && errno != EINTR) {
      fetch_and(&view_.cq()->client_flags, ~kCqNeedWakeup);
      return fail(Errc::io_error, std::string("ring session: poll: ") + std::strerror(errno));
    }
    if (r > 0 && (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) && !drain_doorbell(cq_db_)) peer_gone_ = true;
    if (peer_gone_) break;
    if (r > 0 && extra_fd >= 0 && fds[1].revents) break;
    if (cq_nonempty()) break;
  }
  fetch_and(&view_.cq()->client_flags, ~kCqNeedWakeup);
  // Had to sleep: spin less next time (an idle client converges to no spinning at all).
  spin_ = std::max(policy_.min, spin_ / 2);
  return reap(out);
}

}  // namespace tandem::ring
