// Daemon side of a session's submission ring: reads the client's tail once per pass, copies each entry and its
// payload out of shared memory, validates them, and hands out typed commands. The daemon's head lives here
// (private); the shared copy is only written. Any protocol error returns a Fault: the caller ends the session.
// Never blocks, never reads outside the view. Single-threaded (the daemon's loop thread).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ring/layout.h"
#include "ring/record.h"

namespace tandem::ring {

struct Command {
  Opcode op = Opcode::nop;
  std::uint64_t user_data = 0;
  std::uint64_t job_id = 0;   // cancel
  std::vector<Field> record;  // submit, embed
};

struct ConsumeResult {
  std::vector<Command> commands;  // valid entries read before any fault, in order
  Fault fault = Fault::none;
  std::string detail;             // what was wrong, for the log
  std::uint32_t consumed = 0;     // entries taken off the ring (including a faulty one)
};

class SubmissionConsumer {
 public:
  SubmissionConsumer() = default;
  SubmissionConsumer(View view, RecordLimits limits = {}) : view_(view), limits_(limits) {}

  // True when the client's tail differs from our head (an acquire load; no validation).
  bool pending() const;
  // Reads up to `max` entries. Publishes the new head (release) after the copies, so the client may reuse the slots
  // and their data. After a fault nothing more should be read from this session.
  ConsumeResult consume(std::uint32_t max);
  std::uint32_t head() const { return head_; }

 private:
  View view_;
  RecordLimits limits_;
  std::uint32_t head_ = 0;
  std::vector<std::uint8_t> scratch_;
};

}  // namespace tandem::ring
