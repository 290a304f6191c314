// Shared helpers of the ring tests: a real session (memfd + mapping + the two doorbell pipes, as the daemon makes it),
// hand-built submission entries, records, and a poll on a doorbell.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ring/client_ring.h"
#include "ring/layout.h"
#include "ring/record.h"

namespace tandem::ring::test {

inline void check_sys(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string(what) + ": " + std::strerror(errno));
}

// One session as OpenSession creates it. Pipes: sq_db[1] is the client's (it rings the daemon), sq_db[0] the
// daemon's; cq_db[1] the daemon's, cq_db[0] the client's. All non-blocking and close-on-exec.
struct TestSession {
  int memfd = -1;
  std::uint8_t* base = nullptr;
  Layout layout;
  int sq_db[2] = {-1, -1};
  int cq_db[2] = {-1, -1};

  static std::unique_ptr<TestSession> create(const LayoutRequest& req, std::uint64_t session_id = 1,
                                             const LayoutLimits& limits = {}) {
    auto s = std::make_unique<TestSession>();
    auto l = compute_layout(req, limits);
    if (!l) throw std::runtime_error("compute_layout: " + l.error().message);
    s->layout = *l;
    s->layout.session_id = session_id;
    s->memfd = ::memfd_create("tandem-ring-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    check_sys(s->memfd >= 0, "memfd_create");
    check_sys(::ftruncate(s->memfd, static_cast<off_t>(s->layout.total_size)) == 0, "ftruncate");
    check_sys(::fcntl(s->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0, "F_ADD_SEALS");
    void* p = ::mmap(nullptr, s->layout.total_size, PROT_READ | PROT_WRITE, MAP_SHARED, s->memfd, 0);
    check_sys(p != MAP_FAILED, "mmap");
    s->base = static_cast<std::uint8_t*>(p);
    initialize(s->base, s->layout);
    check_sys(::pipe2(s->sq_db, O_NONBLOCK | O_CLOEXEC) == 0, "pipe2");
    check_sys(::pipe2(s->cq_db, O_NONBLOCK | O_CLOEXEC) == 0, "pipe2");
    return s;
  }

  ~TestSession() {
    if (base) ::munmap(base, layout.total_size);
    for (int fd : {memfd, sq_db[0], sq_db[1], cq_db[0], cq_db[1]})
      if (fd >= 0) ::close(fd);
  }

  View view() const { return View{base, layout}; }
  SqControl* sq() const { return view().sq(); }
  CqControl* cq() const { return view().cq(); }

  // A client over duplicates of the client's fds (RingClient owns what it is given).
  std::unique_ptr<RingClient> client(SpinPolicy spin = {}) const {
    auto c = RingClient::attach(::fcntl(memfd, F_DUPFD_CLOEXEC, 0), ::fcntl(sq_db[1], F_DUPFD_CLOEXEC, 0),
                                ::fcntl(cq_db[0], F_DUPFD_CLOEXEC, 0), spin);
    if (!c) throw std::runtime_error("RingClient::attach: " + c.error().message);
    return std::move(*c);
  }

  // Client-side hand-written entry i (slot i & mask) and tail publication, for the consumer tests.
  void put_entry(std::uint32_t index, const SubmissionEntry& e) const {
    std::memcpy(view().sqes() + (index & (layout.sq_entries - 1)), &e, sizeof e);
  }
  void put_data(std::uint64_t offset, const std::vector<std::uint8_t>& bytes) const {
    std::memcpy(view().request_data() + offset, bytes.data(), bytes.size());
  }
  void set_sq_tail(std::uint32_t t) const { store_release(&sq()->tail, t); }
  void set_cq_head(std::uint32_t h) const { store_release(&cq()->head, h); }
};

inline SubmissionEntry nop_entry(std::uint64_t user_data) {
  SubmissionEntry e{};
  e.opcode = static_cast<std::uint8_t>(Opcode::nop);
  e.user_data = user_data;
  return e;
}
inline SubmissionEntry cancel_entry(std::uint64_t user_data, std::uint64_t job) {
  SubmissionEntry e{};
  e.opcode = static_cast<std::uint8_t>(Opcode::cancel);
  e.user_data = user_data;
  e.job_id = job;
  return e;
}
inline SubmissionEntry submit_entry(std::uint64_t user_data, std::uint64_t offset, std::uint32_t length) {
  SubmissionEntry e{};
  e.opcode = static_cast<std::uint8_t>(Opcode::submit);
  e.user_data = user_data;
  e.data_offset = offset;
  e.data_length = length;
  return e;
}

inline std::vector<std::uint8_t> simple_request(const std::string& prompt, std::uint64_t max_tokens = 16) {
  return RecordWriter().add("model", "m").add("prompt", std::string_view(prompt)).add("max_tokens", max_tokens).take();
}

// Bytes pending in a (non-blocking) pipe, drained.
inline std::size_t drain(int fd) {
  std::size_t n = 0;
  char buf[256];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r <= 0) break;
    n += static_cast<std::size_t>(r);
  }
  return n;
}

inline bool readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

}  // namespace tandem::ring::test
