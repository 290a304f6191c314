// Daemon side of a session's completion ring. post() never blocks: what does not fit in the CQ or the response
// data area waits in a bounded backlog (kCqBacklog set in shared memory; flush() moves it when the client's head
// advances). Token batches of one job waiting next to each other in the backlog are merged. When the backlog's
// bytes pass the limit, token data is dropped instead of queued: the job's next token completion carries kCqeGap,
// overflow_tokens counts what was dropped and kCqOverflowed is set (the text stays readable with GetJob). Every other
// completion (accepted, routed, ..., finished, errors) is always kept: their number is bounded by the session's
// in-flight jobs. The client's head is read, validated (within [what it had, our tail]) and never trusted further.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "ring/layout.h"

namespace tandem::ring {

struct Completion {
  CompletionEntry entry{};          // data_offset / data_length are filled when written
  std::vector<std::uint8_t> data;   // the payload (record, or ids + text for tokens)
};

// A token batch: ids then text, step = index of the first id in the job's output.
Completion token_completion(std::uint64_t user_data, std::uint64_t job_id, std::uint32_t step,
                            const std::vector<std::int32_t>& ids, std::string_view text);
Completion record_completion(Kind kind, std::uint64_t user_data, std::uint64_t job_id, std::vector<std::uint8_t> record,
                             ErrorCode error = ErrorCode::none);

struct WriterStats {
  std::uint64_t posted = 0;        // completions handed to post()
  std::uint64_t written = 0;       // completions written to the CQ
  std::uint64_t merged = 0;        // token batches merged into a waiting one
  std::uint64_t dropped_tokens = 0;
  std::uint64_t backlog_peak_bytes = 0;
};

class CompletionWriter {
 public:
  CompletionWriter() = default;
  CompletionWriter(View view, std::uint64_t max_backlog_bytes);

  // Queues (and writes what fits). Fails (Fault::cq_index) when the client's head is invalid.
  Fault post(Completion c);
  // Writes waiting completions that fit now. Fault::cq_index on an invalid head.
  Fault flush();
  bool backlogged() const { return !backlog_.empty(); }
  std::size_t backlog_entries() const { return backlog_.size(); }
  std::uint64_t backlog_bytes() const { return backlog_bytes_; }
  // Something was written since the last call and the client asked to be woken (kCqNeedWakeup after a full fence).
  bool take_wakeup();
  const WriterStats& stats() const { return stats_; }
  std::uint32_t tail() const { return tail_; }

 private:
  Fault reap_head();
  bool write_one(Completion& c);
  void publish_flags();

  View view_;
  std::uint64_t max_backlog_bytes_ = 0;
  std::uint32_t tail_ = 0;           // private; the shared copy is written
  std::uint32_t seen_head_ = 0;      // the client's head as last validated
  std::vector<std::uint64_t> ends_;  // per CQ slot: response-area end position after that entry's data
  CircularArena arena_;
  std::deque<Completion> backlog_;
  std::uint64_t backlog_bytes_ = 0;
  std::map<std::uint64_t, std::uint32_t> gap_;  // job → step from which the next token batch must say kCqeGap
  bool wrote_since_wakeup_ = false;
  std::uint32_t published_flags_ = 0;
  WriterStats stats_;
};

}  // namespace tandem::ring
