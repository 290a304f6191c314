// Internal to the journal library (journal.cc, journal_codec.cc): the record codec shared by the writer and replay.
// Framing (check_frame, find_next_frame), field validation, payload encoding; JobJournal::decode is in
// journal_codec.cc too. Not for use outside src/daemon/journal*.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/result.h"
#include "daemon/journal.h"

namespace tandem::daemon {

// One decoded record. `job` carries the fields of its type (see encode()); `at` is the transition/outcome time.
struct JobJournal::Rec {
  JournalJob job;
  std::int64_t at = 0;
  std::uint64_t max_job_id = 0;  // meta
};

namespace journal_codec {

// Frame check at `pos`: ok (fills type/payload), short (the buffer ends inside it), bad.
enum class FrameState { ok, short_read, bad };

FrameState check_frame(std::string_view buf, std::size_t pos, std::uint8_t& type, std::string_view& payload);
// Next offset after `from` where a complete record with a valid CRC starts, or npos.
std::size_t find_next_frame(std::string_view buf, std::size_t from);
bool known_type(std::uint8_t t);
// Field validation shared by append (invalid_argument) and replay (corrupt record).
Status validate_fields(JournalRecord type, const JournalJob& j);
// Payload JSON of a record of `type` from `j` (history entries before `history_skip` are left out of a restore).
Result<std::string> encode(JournalRecord type, const JournalJob& j, std::int64_t at, std::uint64_t max_job_id,
                           std::size_t history_skip = 0);
// The history entry an outcome adds: {"id","phase","reason","at"}.
std::string outcome_history_entry(const JournalJob& j, std::int64_t at);

}  // namespace journal_codec
}  // namespace tandem::daemon
