#include "ring/consumer.h"

#include <cstring>

namespace tandem::ring {

namespace {

bool all_zero(const std::uint8_t* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

}  // namespace

bool SubmissionConsumer::pending() const {
  if (!view_.base) return false;
  return load_acquire(&view_.sq()->tail) != head_;
}

ConsumeResult SubmissionConsumer::consume(std::uint32_t max) {
  ConsumeResult out;
  if (!view_.base) return out;
  const Layout& l = view_.layout;
  const std::uint32_t tail = load_acquire(&view_.sq()->tail);
  const std::uint32_t available = tail - head_;
  if (available > l.sq_entries) {
    out.fault = Fault::sq_index;
    out.detail = "SQ tail " + std::to_string(tail) + " is " + std::to_string(available) +
                 " entries ahead of head " + std::to_string(head_) + " (capacity " + std::to_string(l.sq_entries) + ")";
    return out;
  }
  const std::uint32_t n = std::min(available, max);
  const std::uint32_t mask = l.sq_entries - 1;
  auto fault = [&](Fault f, std::string detail) {
    out.fault = f;
    out.detail = "entry " + std::to_string(head_) + ": " + std::move(detail);
  };
  for (std::uint32_t i = 0; i < n && out.fault == Fault::none; ++i) {
    SubmissionEntry e;
    std::memcpy(&e, view_.sqes() + (head_ & mask), sizeof e);  // copy out, then validate the copy
    ++out.consumed;
    if (e.flags != 0 || e.reserved0 != 0 || !all_zero(e.reserved, sizeof e.reserved)) {
      fault(Fault::reserved, "reserved field or flag bits set");
      ++head_;  // the faulty entry is consumed, like every other fault's
      break;
    }
    Command c;
    c.user_data = e.user_data;
    switch (static_cast<Opcode>(e.opcode)) {
      case Opcode::nop:
      case Opcode::cancel:
        if (e.data_length != 0 || e.data_offset != 0) {
          fault(Fault::length, "this opcode takes no data");
          break;
        }
        if (static_cast<Opcode>(e.opcode) == Opcode::nop && e.job_id != 0) {
          fault(Fault::reserved, "nop with a job id");
          break;
        }
        c.op = static_cast<Opcode>(e.opcode);
        c.job_id = e.job_id;
        out.commands.push_back(std::move(c));
        break;
      case Opcode::submit:
      case Opcode::embed:
      case Opcode::transcribe:
      case Opcode::audio: {
        const auto op = static_cast<Opcode>(e.opcode);
        const char* name = op == Opcode::submit ? "submit"
                           : op == Opcode::embed ? "embed"
                           : op == Opcode::transcribe ? "transcribe"
                                                      : "audio";
        if (op == Opcode::audio ? e.job_id == 0 : e.job_id != 0) {
          fault(Fault::reserved, std::string(name) + (op == Opcode::audio ? " without a job id" : " with a job id"));
          break;
        }
        c.job_id = e.job_id;
        if (e.data_length == 0 || e.data_length > l.max_request_bytes) {
          fault(Fault::length, std::string(name) + " data_length " + std::to_string(e.data_length) + " not in [1," +
                                   std::to_string(l.max_request_bytes) + "]");
          break;
        }
        if (e.data_offset > l.request_data_size || e.data_length > l.request_data_size - e.data_offset) {
          fault(Fault::offset, "data [" + std::to_string(e.data_offset) + ", +" + std::to_string(e.data_length) +
                                   ") outside the request area of " + std::to_string(l.request_data_size) + " bytes");
          break;
        }
        scratch_.resize(e.data_length);
        std::memcpy(scratch_.data(), view_.request_data() + e.data_offset, e.data_length);
        ParsedRecord r = parse_record(scratch_, limits_);
        if (!r.ok()) {
          fault(r.error->fault, r.error->message);
          break;
        }
        c.op = static_cast<Opcode>(e.opcode);
        c.record = std::move(r.fields);
        out.commands.push_back(std::move(c));
        break;
      }
      default:
        fault(Fault::opcode, "unknown opcode " + std::to_string(e.opcode));
        break;
    }
    ++head_;
  }
  if (out.consumed > 0) {
    store_release(&view_.sq()->head, head_);
    auto* counter = &view_.sq()->entries_consumed;
    store_relaxed64(counter, load_relaxed64(counter) + out.consumed);
  }
  return out;
}

}  // namespace tandem::ring
