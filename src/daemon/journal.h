// The daemon's durable job journal: an append-only file `<state_dir>/journal` of CRC-framed JSON records, replayed
// at start so that every accepted job reaches a terminal state its client can read, also after a client crash or a
// daemon restart; idempotency keys are rebuilt from it and return the stored outcome instead of re-running.
// Torn tails are truncated, corrupt records in the middle are skipped and counted; neither is fatal. Compaction
// rewrites the file atomically (journal.tmp, fsync, rename, fsync of the directory). Group commit: appends only
// write(); commit() makes everything appended since the last commit durable with one fdatasync, or, when that fails,
// cuts the file back and undoes those records in memory. Format, fold rules, sync points and measured figures:
// docs/journal.md. Torch-free and D-Bus-free (core + nlohmann_json, which stays in the .cc).
//
// Thread-safety: none. One JobJournal is used from one thread (the daemon's control thread) at a time; the state
// directory is flock()ed, so a second JobJournal on the same directory (this or another process) is refused.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace tandem::daemon {

// --- framing layer ----------------------------------------------------------------------------------------------
// Record = 16-byte header + payload. Header, little-endian: "TJR1" (bytes 54 4A 52 31), u32 payload length,
// u32 CRC-32C over header bytes 12..15 (type + reserved) followed by the payload, u8 type, 3 reserved zero bytes.
inline constexpr std::size_t kJournalHeaderBytes = 16;
inline constexpr std::uint32_t kJournalMaxPayload = 16u << 20;  // larger: refused on append, corruption on read
inline constexpr std::size_t kJournalHistoryLimit = 64;         // JournalJob::history_json keeps the last 64

// Record types. Unknown types (a newer writer) are counted in ReplayStats::unknown_records and skipped.
enum class JournalRecord : std::uint8_t {
  accepted = 1,    // a job was accepted (durable at the next commit)
  transition = 2,  // a non-terminal phase change
  checkpoint = 3,  // tokens/text delivered so far
  outcome = 4,     // the terminal phase and its result (durable at the next commit)
  restore = 5,     // compaction: the folded state of a job after its `accepted` record
  output = 6,      // compaction: the folded tokens/text of a job (also allowed on a terminal job)
  meta = 7,        // compaction: {"max_job_id": N}, so ids of dropped jobs are never handed out again
};

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), table-driven. crc32c("123456789") == 0xE3069283.
// `crc` continues a previous value (0 to start).
std::uint32_t crc32c(std::string_view data, std::uint32_t crc = 0) noexcept;

// One framed record (header + payload) exactly as the journal writes it. No size check: tests use it to fabricate
// records, including oversized or unknown-type ones.
std::string frame_journal_record(std::uint8_t type, std::string_view payload);

// --- typed layer ------------------------------------------------------------------------------------------------
// The folded state of one job after replay.
struct JournalJob {
  std::uint64_t id = 0;
  std::string model;
  std::string idempotency_key;   // "" = none
  std::uint64_t request_digest = 0;
  std::uint32_t owner_uid = 0;
  std::string request_json;      // the validated request as the daemon serialized it (opaque here)
  std::int64_t accepted_unix_ms = 0;
  std::string phase = "queued";  // last phase written: queued|running|retrying|migrating|completed|failed|cancelled
  std::string reason;            // reason of the last transition
  std::string route_json;        // last non-empty route (opaque JSON text), "" if never routed
  std::vector<std::string> history_json;  // every transition record's JSON, then the outcome's, in order (last 64)
  std::vector<std::int32_t> tokens;       // last checkpoint / final tokens
  std::string text;                       // last checkpoint / final text
  std::string error_code, error_message;  // failed: the error
  std::int64_t retry_after_ms = 0;
  std::string finish_reason;              // completed: eos|stop_string|max_tokens|context_full
  std::int64_t finished_unix_ms = 0;      // 0 while not terminal
  std::uint32_t attempts = 0;

  bool terminal() const;

  friend bool operator==(const JournalJob&, const JournalJob&) = default;
};

// Whether `phase` is one of the seven names above / one of completed|failed|cancelled.
bool is_journal_phase(std::string_view phase) noexcept;
bool is_terminal_journal_phase(std::string_view phase) noexcept;

// Field limits, checked on append (invalid_argument) and on replay (corrupt record). They keep every compaction
// record under kJournalMaxPayload. request_json, tokens and text are bounded only by kJournalMaxPayload.
inline constexpr std::size_t kJournalMaxName = 1024;        // model, idempotency_key
inline constexpr std::size_t kJournalMaxReason = 4096;      // reason
inline constexpr std::size_t kJournalMaxErrorCode = 256;    // error_code
inline constexpr std::size_t kJournalMaxSideJson = 65536;   // route_json, error_message

class JobJournal {
 public:
  struct Options {
    std::string dir;                          // state directory; created (0700) with missing parents
    std::uint64_t max_bytes = 64 << 20;       // automatic compaction above this file size, >= 64 KiB
    std::chrono::seconds retention{86400};    // terminal jobs older than this are dropped by compaction, >= 0
    std::uint32_t max_jobs = 10000;           // compaction keeps at most this many jobs (non-terminal always), >= 1
    bool fsync = true;                        // false: no fdatasync/fsync on commits and compaction (tests, tmpfs)
    // The fdatasync of commit()/sync() (empty: ::fdatasync). Returns 0 or -1 with errno, like fdatasync; tests
    // inject failures (EIO) through it.
    std::function<int(int fd)> sync_hook;
  };
  // What the writer did since open (the daemon's counters; the tests count syncs with it).
  struct WriteStats {
    std::uint64_t fdatasyncs = 0;         // fdatasync calls on the journal file (commits, sync(), torn-tail cut)
    std::uint64_t commits = 0;            // commit()/sync() calls that covered at least one record and succeeded
    std::uint64_t records_committed = 0;  // records those commits covered
    std::uint64_t max_records_per_commit = 0;
    std::uint64_t commit_failures = 0;    // commits whose fdatasync failed (their records were cut back)
    std::uint64_t records_rolled_back = 0;
    std::uint64_t append_failures = 0;    // appends whose write() failed (disk full, EIO, testing_fail_writes)
  };
  struct ReplayStats {
    std::uint64_t records = 0;                // records with a valid frame and CRC
    std::uint64_t jobs = 0;                   // jobs after replay
    std::uint64_t torn_tail_bytes = 0;        // bytes truncated after the last good record (0: none)
    std::uint64_t torn_tail_offset = 0;       // where they started (= file size after open) when torn_tail_bytes > 0
    std::uint64_t corrupt_records = 0;        // bad regions skipped between good records + records failing validation
    std::uint64_t corrupt_bytes = 0;          // bytes of the bad regions (not of records failing validation)
    std::uint64_t unknown_records = 0;        // good records of an unknown type or for an unknown job id
    std::uint64_t recovered_nonterminal = 0;  // jobs not terminal in the file (the daemon decides what they become)
    std::uint64_t stale_tmp_removed = 0;      // 1 when a journal.tmp of an interrupted compaction was removed
  };

  // Opens (creating dir 0700 and file 0600), removes a stale journal.tmp, replays, truncates a torn tail (the cut
  // bytes are saved to journal.torn, best effort, replacing an older one). Jobs not terminal in the file are returned
  // as they were. Errors: invalid_argument (options), io_error (cannot create/open/lock/read/truncate).
  static Result<std::unique_ptr<JobJournal>> open(Options opts);
  ~JobJournal();  // fdatasync of uncommitted appends (when opts.fsync), closes
  JobJournal(const JobJournal&) = delete;
  JobJournal& operator=(const JobJournal&) = delete;

  const std::map<std::uint64_t, JournalJob>& jobs() const { return jobs_; }
  const ReplayStats& replay_stats() const { return stats_; }
  // Highest id ever accepted, also of jobs compaction dropped; the daemon hands out ids above it.
  std::uint64_t max_job_id() const { return max_job_id_; }

  // Appends: one write() each, no sync. A record is durable only after the next successful commit() (or sync(), or
  // a compaction); until then nothing that depends on it may leave the process (docs/journal.md, "Group commit").
  // On any error nothing changes in memory and the file is cut back to its previous size.
  // Errors: io_error (disk full etc.: the caller must then refuse the job), invalid_argument (unknown id, field
  // outside its limit, phase of the wrong kind, record > kJournalMaxPayload), duplicate (accepted: id exists),
  // illegal_transition (the job is terminal; a second outcome equal to the first, ignoring at_unix_ms, is a no-op).
  // Accepted copies id, model, idempotency_key, request_digest, owner_uid, request_json, accepted_unix_ms (id != 0).
  Status accepted(const JournalJob& job);
  // `phase`: queued|running|retrying|migrating. `route_json` "" keeps the previous route.
  Status transition(std::uint64_t id, std::string phase, std::string reason, std::string route_json,
                    std::int64_t at_unix_ms, std::uint32_t attempts);
  Status checkpoint(std::uint64_t id, const std::vector<std::int32_t>& tokens, const std::string& text);
  // `phase`: completed (finish_reason eos|stop_string|max_tokens|context_full), failed (error_code non-empty,
  // finish_reason "") or cancelled (finish_reason "").
  Status outcome(std::uint64_t id, std::string phase, std::string reason, const std::vector<std::int32_t>& tokens,
                 const std::string& text, std::string error_code, std::string error_message,
                 std::int64_t retry_after_ms, std::string finish_reason, std::int64_t at_unix_ms);

  // Group commit. Every appended record gets the next sequence number (1, 2, ...). commit() makes all of them
  // durable with one fdatasync (none when nothing is pending; none either with opts.fsync = false, which still
  // advances durable_seq). If the fdatasync fails, the records since the last commit are undone: the file is cut back
  // to its size at the last commit (and that cut synced), the jobs in memory return to their state at the last
  // commit (accepted ones disappear), appended_seq returns to durable_seq, and io_error is returned; the caller must
  // treat every one of those records as never written. If the cut itself fails, the journal is broken: every later
  // append and commit fails with io_error (the daemon must stop accepting; a restart replays what is on disk).
  Status commit();
  // commit() that always fdatasyncs, whatever opts.fsync says and even with nothing pending.
  Status sync();
  std::uint64_t appended_seq() const { return appended_seq_; }  // last record appended (0: none since open)
  std::uint64_t durable_seq() const { return durable_seq_; }    // last record a commit/sync/compaction covered
  bool commit_pending() const { return appended_seq_ != durable_seq_; }
  const WriteStats& write_stats() const { return write_stats_; }

  // Drops terminal jobs that finished before now - retention, then the oldest terminal ones (finished_unix_ms, id)
  // while more than max_jobs remain; non-terminal jobs are never dropped. Rewrites the file: journal.tmp with
  // meta + accepted/restore/output records per kept job, fsync, rename over journal, fsync the directory. A crash at
  // any point leaves either the old or the new file complete. Also runs from an append (with now = the latest
  // timestamp seen in any record) when the file exceeds max_bytes, at most once per max_bytes/2 appended, or when
  // more than max_jobs * 3/2 jobs are held, at most once per max_jobs/2 accepted. Errors: io_error (nothing changed,
  // or, if only the directory fsync failed, the new file is in use), internal (a record would exceed the limit).
  Status compact(std::int64_t now_unix_ms);
  // Result of the last automatic compaction (ok when none ran); its failure does not fail the append.
  const Status& auto_compact_status() const { return auto_compact_status_; }

  std::uint64_t file_bytes() const { return file_bytes_; }

  // Testing: the next `n` appends (any record type) that pass validation fail with io_error (EIO) before they write
  // anything, exactly as a failed write() does. Compaction and commits are not affected.
  void testing_fail_writes(std::uint32_t n) { fail_writes_ = n; }

 private:
  struct Rec;
  explicit JobJournal(Options opts) : opts_(std::move(opts)) {}
  void replay(std::string_view file);  // folds, counts; sets file_bytes_ to where a torn tail starts
  static bool decode(JournalRecord type, std::string_view payload, Rec& out);  // false: corrupt record
  Status check(JournalRecord type, const Rec& r) const;
  void apply(JournalRecord type, Rec&& r, std::string_view payload);
  Status append(JournalRecord type, Rec&& r);
  Status commit_now(bool force);
  int sync_file();                 // fdatasync through opts_.sync_hook, counted; 0 or -1 with errno
  void mark_durable();
  void maybe_compact();

  Options opts_;
  int dir_fd_ = -1;
  int fd_ = -1;
  std::map<std::uint64_t, JournalJob> jobs_;
  ReplayStats stats_;
  std::uint64_t max_job_id_ = 0;
  std::uint64_t file_bytes_ = 0;
  std::uint64_t appended_since_compact_ = 0;
  std::uint64_t accepted_since_compact_ = 0;
  std::int64_t latest_unix_ms_ = 0;
  // Group commit: the window since the last commit.
  std::uint64_t appended_seq_ = 0;
  std::uint64_t durable_seq_ = 0;
  std::uint64_t durable_bytes_ = 0;                              // file size at the last commit
  std::map<std::uint64_t, std::optional<JournalJob>> undo_;      // job → its state at the last commit (none: new)
  bool broken_ = false;                                          // a failed commit could not cut the file back
  std::uint32_t fail_writes_ = 0;                                // testing_fail_writes
  WriteStats write_stats_;
  Status auto_compact_status_;
};

}  // namespace tandem::daemon
