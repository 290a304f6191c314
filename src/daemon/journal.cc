// JobJournal: the journal file (open, replay, appends, syncs, compaction); docs/journal.md. The record codec is
// journal_codec.cc.
#include "daemon/journal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "daemon/journal_codec.h"

namespace tandem::daemon {

using namespace journal_codec;

namespace {

constexpr const char* kJournalName = "journal";
constexpr const char* kTmpName = "journal.tmp";
constexpr const char* kTornName = "journal.torn";
constexpr std::size_t kCompactChunk = 4u << 20;

// --- file helpers -------------------------------------------------------------------------------------------------

Failure io_fail(const std::string& what, const std::string& path, int err) {
  return fail(Errc::io_error, what + " " + path + ": " + std::strerror(err));
}

// mkdir -p with mode 0700 for every directory it creates.
Status make_dirs(const std::string& dir) {
  std::string prefix;
  std::size_t pos = 0;
  while (pos <= dir.size()) {
    std::size_t next = dir.find('/', pos);
    if (next == std::string::npos) next = dir.size();
    prefix = dir.substr(0, next);
    pos = next + 1;
    if (prefix.empty() || prefix == "." || prefix == "..") continue;
    if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) return io_fail("cannot create directory", prefix, errno);
  }
  return {};
}

// Writes all of `data` (several write calls if the kernel returns short; only for files nobody reads yet).
bool write_fully(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) {
      errno = ENOSPC;
      return false;
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

}  // namespace

// --- JobJournal --------------------------------------------------------------------------------------------------

JobJournal::~JobJournal() {
  if (fd_ >= 0) {
    if (commit_pending() && opts_.fsync) (void)sync_file();
    ::close(fd_);
  }
  if (dir_fd_ >= 0) ::close(dir_fd_);  // releases the flock
}

Result<std::unique_ptr<JobJournal>> JobJournal::open(Options opts) {
  if (opts.dir.empty()) return fail(Errc::invalid_argument, "journal: dir is empty");
  if (opts.max_bytes < (64u << 10)) {
    return fail(Errc::invalid_argument, "journal: max_bytes " + std::to_string(opts.max_bytes) + " < 65536");
  }
  if (opts.max_jobs < 1) return fail(Errc::invalid_argument, "journal: max_jobs is 0, must be >= 1");
  if (opts.retention.count() < 0 || opts.retention.count() > (std::int64_t{1} << 40)) {
    return fail(Errc::invalid_argument, "journal: retention " + std::to_string(opts.retention.count()) +
                                            " s outside [0, 2^40]");
  }
  TANDEM_TRY(make_dirs(opts.dir));
  std::unique_ptr<JobJournal> jr(new JobJournal(std::move(opts)));
  const std::string& dir = jr->opts_.dir;
  const std::string path = dir + "/" + kJournalName;

  jr->dir_fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (jr->dir_fd_ < 0) return io_fail("cannot open directory", dir, errno);
  if (::flock(jr->dir_fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return fail(Errc::io_error, "journal directory " + dir + " is in use by another JobJournal (flock)");
    }
    return io_fail("cannot lock directory", dir, errno);
  }
  // A journal.tmp is a compaction that did not reach its rename: the journal itself is still complete.
  if (::unlinkat(jr->dir_fd_, kTmpName, 0) == 0) {
    jr->stats_.stale_tmp_removed = 1;
  } else if (errno != ENOENT) {
    return io_fail("cannot remove stale", dir + "/" + kTmpName, errno);
  }

  jr->fd_ = ::openat(jr->dir_fd_, kJournalName, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (jr->fd_ < 0) return io_fail("cannot open", path, errno);
  struct stat st {};
  if (::fstat(jr->fd_, &st) != 0) return io_fail("cannot stat", path, errno);
  if (!S_ISREG(st.st_mode)) return fail(Errc::io_error, path + " is not a regular file");
  if (jr->opts_.fsync && ::fsync(jr->dir_fd_) != 0) return io_fail("cannot fsync directory", dir, errno);

  // Replay straight from a read-only mapping (no copy of a large journal); the flock keeps other writers away.
  std::string_view view;
  void* map = nullptr;
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size > 0) {
    map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, jr->fd_, 0);
    if (map == MAP_FAILED) return io_fail("cannot mmap", path, errno);
    ::madvise(map, size, MADV_SEQUENTIAL);
    view = std::string_view(static_cast<const char*>(map), size);
  }
  jr->replay(view);
  if (map != nullptr) ::munmap(map, size);
  if (jr->stats_.torn_tail_bytes > 0) {
    if (::ftruncate(jr->fd_, static_cast<off_t>(jr->file_bytes_)) != 0) {
      return io_fail("cannot truncate the torn tail of", path, errno);
    }
    if (jr->opts_.fsync && jr->sync_file() != 0) return io_fail("cannot fdatasync", path, errno);
  }
  jr->durable_bytes_ = jr->file_bytes_;
  jr->appended_since_compact_ = jr->opts_.max_bytes / 2;  // an oversized journal compacts at the first append
  jr->accepted_since_compact_ = jr->opts_.max_jobs / 2;
  return jr;
}

void JobJournal::replay(std::string_view view) {
  std::size_t pos = 0;
  while (pos < view.size()) {
    std::uint8_t type = 0;
    std::string_view payload;
    if (check_frame(view, pos, type, payload) != FrameState::ok) {
      const std::size_t next = find_next_frame(view, pos + 1);
      if (next == std::string_view::npos) break;  // torn tail from pos
      ++stats_.corrupt_records;
      stats_.corrupt_bytes += next - pos;
      pos = next;
      continue;
    }
    pos += kJournalHeaderBytes + payload.size();
    ++stats_.records;
    if (!known_type(type)) {
      ++stats_.unknown_records;
      continue;
    }
    const auto rt = static_cast<JournalRecord>(type);
    Rec rec;
    if (!decode(rt, payload, rec)) {
      ++stats_.corrupt_records;
      continue;
    }
    Status st = check(rt, rec);
    if (!st.ok()) {
      if (st.error().code == Errc::not_found) {
        ++stats_.unknown_records;
      } else {
        ++stats_.corrupt_records;
      }
      continue;
    }
    apply(rt, std::move(rec), payload);
  }

  if (pos < view.size()) {
    stats_.torn_tail_offset = pos;
    stats_.torn_tail_bytes = view.size() - pos;
    // Keep the cut bytes for a post-mortem; failing to is not a reason to keep the daemon down.
    int tfd = ::openat(dir_fd_, kTornName, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (tfd >= 0) {
      (void)write_fully(tfd, view.substr(pos));
      ::close(tfd);
    }
  }
  file_bytes_ = pos;
  stats_.jobs = jobs_.size();
  for (const auto& [id, j] : jobs_) {
    if (!j.terminal()) ++stats_.recovered_nonterminal;
  }
}

Status JobJournal::check(JournalRecord type, const Rec& r) const {
  TANDEM_TRY(validate_fields(type, r.job));
  if (type == JournalRecord::meta) return {};
  const std::string job = "journal: job " + std::to_string(r.job.id);
  auto it = jobs_.find(r.job.id);
  if (type == JournalRecord::accepted) {
    if (it != jobs_.end()) return fail(Errc::duplicate, job + " was already accepted");
    return {};
  }
  if (it == jobs_.end()) return fail(Errc::not_found, job + " is unknown");
  if (type == JournalRecord::output) return {};
  if (it->second.terminal()) {
    return fail(Errc::illegal_transition, job + " is already " + it->second.phase);
  }
  return {};
}

void JobJournal::apply(JournalRecord type, Rec&& r, std::string_view payload) {
  JournalJob& in = r.job;
  auto push_history = [](JournalJob& j, std::string entry) {
    if (j.history_json.size() >= kJournalHistoryLimit) {
      j.history_json.erase(j.history_json.begin(),
                           j.history_json.begin() + static_cast<std::ptrdiff_t>(j.history_json.size() -
                                                                                  kJournalHistoryLimit + 1));
    }
    j.history_json.push_back(std::move(entry));
  };
  switch (type) {
    case JournalRecord::meta:
      max_job_id_ = std::max(max_job_id_, r.max_job_id);
      return;
    case JournalRecord::accepted: {
      JournalJob j;
      j.id = in.id;
      j.model = std::move(in.model);
      j.idempotency_key = std::move(in.idempotency_key);
      j.request_digest = in.request_digest;
      j.owner_uid = in.owner_uid;
      j.request_json = std::move(in.request_json);
      j.accepted_unix_ms = r.at;
      max_job_id_ = std::max(max_job_id_, j.id);
      latest_unix_ms_ = std::max(latest_unix_ms_, r.at);
      ++accepted_since_compact_;
      jobs_.emplace(j.id, std::move(j));
      return;
    }
    default:
      break;
  }
  JournalJob& j = jobs_.at(in.id);
  switch (type) {
    case JournalRecord::transition:
      j.phase = std::move(in.phase);
      j.reason = std::move(in.reason);
      if (!in.route_json.empty()) j.route_json = std::move(in.route_json);
      j.attempts = in.attempts;
      push_history(j, std::string(payload));
      latest_unix_ms_ = std::max(latest_unix_ms_, r.at);
      return;
    case JournalRecord::checkpoint:
    case JournalRecord::output:
      j.tokens = std::move(in.tokens);
      j.text = std::move(in.text);
      return;
    case JournalRecord::outcome:
      j.phase = std::move(in.phase);
      j.reason = std::move(in.reason);
      j.tokens = std::move(in.tokens);
      j.text = std::move(in.text);
      j.error_code = std::move(in.error_code);
      j.error_message = std::move(in.error_message);
      j.retry_after_ms = in.retry_after_ms;
      j.finish_reason = std::move(in.finish_reason);
      j.finished_unix_ms = r.at;
      push_history(j, outcome_history_entry(j, r.at));
      latest_unix_ms_ = std::max(latest_unix_ms_, r.at);
      return;
    case JournalRecord::restore:
      j.phase = std::move(in.phase);
      j.reason = std::move(in.reason);
      j.route_json = std::move(in.route_json);
      j.history_json = std::move(in.history_json);
      j.attempts = in.attempts;
      j.error_code = std::move(in.error_code);
      j.error_message = std::move(in.error_message);
      j.retry_after_ms = in.retry_after_ms;
      j.finish_reason = std::move(in.finish_reason);
      j.finished_unix_ms = in.finished_unix_ms;
      latest_unix_ms_ = std::max(latest_unix_ms_, j.finished_unix_ms);
      return;
    case JournalRecord::accepted:
    case JournalRecord::meta:
      return;
  }
}

Status JobJournal::append(JournalRecord type, Rec&& r) {
  if (broken_) {
    return fail(Errc::io_error, "journal " + opts_.dir + "/" + kJournalName +
                                    " could not be cut back after a failed sync; nothing more is written (restart)");
  }
  if (Status st = check(type, r); !st.ok()) {
    Error e = std::move(st).error();
    if (e.code == Errc::not_found) e.code = Errc::invalid_argument;
    return fail(std::move(e));
  }
  auto payload = encode(type, r.job, r.at, r.max_job_id);
  if (!payload.ok()) return fail(std::move(payload).error());
  if (payload->size() > kJournalMaxPayload) {
    return fail(Errc::invalid_argument, "journal: record for job " + std::to_string(r.job.id) + " is " +
                                            std::to_string(payload->size()) + " bytes, more than 16 MiB");
  }
  const std::string frame = frame_journal_record(static_cast<std::uint8_t>(type), *payload);
  const std::string path = opts_.dir + "/" + kJournalName;
  const auto before = static_cast<off_t>(file_bytes_);
  if (fail_writes_ > 0) {  // testing_fail_writes: as a write() that failed before writing a byte
    --fail_writes_;
    ++write_stats_.append_failures;
    return io_fail("cannot append to", path, EIO);
  }
  ssize_t n;
  do {
    n = ::write(fd_, frame.data(), frame.size());  // O_APPEND: one write of the whole record
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(frame.size())) {
    const int err = n < 0 ? errno : ENOSPC;
    ++write_stats_.append_failures;
    if (n > 0) (void)::ftruncate(fd_, before);
    return io_fail("cannot append to", path, err);
  }
  file_bytes_ += frame.size();
  appended_since_compact_ += frame.size();
  ++appended_seq_;
  if (type != JournalRecord::meta && !undo_.count(r.job.id)) {  // the job as the last commit left it
    auto it = jobs_.find(r.job.id);
    undo_.emplace(r.job.id, it == jobs_.end() ? std::nullopt : std::optional<JournalJob>(it->second));
  }
  apply(type, std::move(r), *payload);
  maybe_compact();
  return {};
}

Status JobJournal::accepted(const JournalJob& job) {
  Rec r;
  r.job.id = job.id;
  r.job.model = job.model;
  r.job.idempotency_key = job.idempotency_key;
  r.job.request_digest = job.request_digest;
  r.job.owner_uid = job.owner_uid;
  r.job.request_json = job.request_json;
  r.at = job.accepted_unix_ms;
  return append(JournalRecord::accepted, std::move(r));
}

Status JobJournal::transition(std::uint64_t id, std::string phase, std::string reason, std::string route_json,
                              std::int64_t at_unix_ms, std::uint32_t attempts) {
  Rec r;
  r.job.id = id;
  r.job.phase = std::move(phase);
  r.job.reason = std::move(reason);
  r.job.route_json = std::move(route_json);
  r.job.attempts = attempts;
  r.at = at_unix_ms;
  return append(JournalRecord::transition, std::move(r));
}

Status JobJournal::checkpoint(std::uint64_t id, const std::vector<std::int32_t>& tokens, const std::string& text) {
  Rec r;
  r.job.id = id;
  r.job.tokens = tokens;
  r.job.text = text;
  return append(JournalRecord::checkpoint, std::move(r));
}

Status JobJournal::outcome(std::uint64_t id, std::string phase, std::string reason,
                           const std::vector<std::int32_t>& tokens, const std::string& text, std::string error_code,
                           std::string error_message, std::int64_t retry_after_ms, std::string finish_reason,
                           std::int64_t at_unix_ms) {
  if (auto it = jobs_.find(id); it != jobs_.end() && it->second.terminal()) {
    const JournalJob& j = it->second;
    if (j.phase == phase && j.reason == reason && j.tokens == tokens && j.text == text &&
        j.error_code == error_code && j.error_message == error_message && j.retry_after_ms == retry_after_ms &&
        j.finish_reason == finish_reason) {
      return {};  // the same outcome again: already stored
    }
    return fail(Errc::illegal_transition, "journal: job " + std::to_string(id) + " already has outcome " + j.phase);
  }
  Rec r;
  r.job.id = id;
  r.job.phase = std::move(phase);
  r.job.reason = std::move(reason);
  r.job.tokens = tokens;
  r.job.text = text;
  r.job.error_code = std::move(error_code);
  r.job.error_message = std::move(error_message);
  r.job.retry_after_ms = retry_after_ms;
  r.job.finish_reason = std::move(finish_reason);
  r.job.finished_unix_ms = at_unix_ms;
  r.at = at_unix_ms;
  return append(JournalRecord::outcome, std::move(r));
}

int JobJournal::sync_file() {
  ++write_stats_.fdatasyncs;
  return opts_.sync_hook ? opts_.sync_hook(fd_) : ::fdatasync(fd_);
}

void JobJournal::mark_durable() {
  const std::uint64_t n = appended_seq_ - durable_seq_;
  if (n > 0) {
    ++write_stats_.commits;
    write_stats_.records_committed += n;
    write_stats_.max_records_per_commit = std::max(write_stats_.max_records_per_commit, n);
  }
  durable_seq_ = appended_seq_;
  durable_bytes_ = file_bytes_;
  undo_.clear();
}

Status JobJournal::commit() { return commit_now(/*force=*/false); }

Status JobJournal::sync() { return commit_now(/*force=*/true); }

Status JobJournal::commit_now(bool force) {
  const std::string path = opts_.dir + "/" + kJournalName;
  if (broken_) return fail(Errc::io_error, "journal " + path + " could not be cut back after a failed sync");
  if (!force && (!commit_pending() || !opts_.fsync)) {
    mark_durable();
    return {};
  }
  if (sync_file() == 0) {
    mark_durable();
    return {};
  }
  // Not durable, and after a failed fdatasync the page cache cannot be trusted to reach the disk either: cut the
  // window off the file, so none of it can come back at replay, and forget it in memory.
  const int err = errno;
  ++write_stats_.commit_failures;
  write_stats_.records_rolled_back += appended_seq_ - durable_seq_;
  for (auto& [id, before] : undo_) {
    if (before) {
      jobs_[id] = std::move(*before);
    } else {
      jobs_.erase(id);
    }
  }
  undo_.clear();
  appended_seq_ = durable_seq_;
  std::string cut_error;
  if (file_bytes_ != durable_bytes_) {
    if (::ftruncate(fd_, static_cast<off_t>(durable_bytes_)) != 0) {
      cut_error = std::string("; cutting it back failed too: ") + std::strerror(errno);
    } else if (opts_.fsync && sync_file() != 0) {
      cut_error = std::string("; syncing the cut failed too: ") + std::strerror(errno);
    }
    file_bytes_ = durable_bytes_;
  }
  if (!cut_error.empty()) broken_ = true;
  return fail(Errc::io_error, "cannot fdatasync " + path + ": " + std::strerror(err) +
                                  " (the records since the last commit were undone" + cut_error + ")");
}

void JobJournal::maybe_compact() {
  const bool by_bytes = file_bytes_ > opts_.max_bytes && appended_since_compact_ >= opts_.max_bytes / 2;
  const std::uint64_t job_cap = std::uint64_t{opts_.max_jobs} + opts_.max_jobs / 2;
  const bool by_jobs =
      jobs_.size() > job_cap && accepted_since_compact_ >= std::max<std::uint64_t>(1, opts_.max_jobs / 2);
  if (!by_bytes && !by_jobs) return;
  // Counted from the attempt, not the success: a failing compaction (disk full) is not retried on every append.
  appended_since_compact_ = 0;
  accepted_since_compact_ = 0;
  auto_compact_status_ = compact(latest_unix_ms_);
}

Status JobJournal::compact(std::int64_t now_unix_ms) {
  // Which jobs go.
  const std::int64_t retention_ms = opts_.retention.count() * 1000;
  const std::int64_t cutoff = now_unix_ms < std::numeric_limits<std::int64_t>::min() + retention_ms
                                  ? std::numeric_limits<std::int64_t>::min()
                                  : now_unix_ms - retention_ms;
  std::vector<std::uint64_t> drop;
  std::vector<std::pair<std::int64_t, std::uint64_t>> terminal_kept;
  std::size_t kept = 0;
  for (const auto& [id, j] : jobs_) {
    if (j.terminal() && j.finished_unix_ms < cutoff) {
      drop.push_back(id);
      continue;
    }
    ++kept;
    if (j.terminal()) terminal_kept.emplace_back(j.finished_unix_ms, id);
  }
  if (kept > opts_.max_jobs) {
    std::sort(terminal_kept.begin(), terminal_kept.end());
    for (std::size_t i = 0; i < terminal_kept.size() && kept > opts_.max_jobs; ++i, --kept) {
      drop.push_back(terminal_kept[i].second);
    }
  }
  std::sort(drop.begin(), drop.end());
  auto dropped = [&](std::uint64_t id) { return std::binary_search(drop.begin(), drop.end(), id); };

  // journal.tmp: meta, then per kept job accepted + restore (+ output).
  const std::string tmp_path = opts_.dir + "/" + kTmpName;
  int tfd = ::openat(dir_fd_, kTmpName, O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (tfd < 0) return io_fail("cannot create", tmp_path, errno);
  auto abandon = [&](Failure f) -> Failure {
    ::close(tfd);
    ::unlinkat(dir_fd_, kTmpName, 0);
    return f;
  };
  std::string chunk;
  std::uint64_t total = 0;
  auto add = [&](JournalRecord type, const JournalJob& j, std::int64_t at) -> Status {
    auto payload = encode(type, j, at, max_job_id_);
    if (!payload.ok()) return fail(std::move(payload).error());
    if (type == JournalRecord::restore) {
      // History is informational: the oldest entries give way if the record would be too large.
      for (std::size_t skip = 1; payload->size() > kJournalMaxPayload && skip <= j.history_json.size(); ++skip) {
        payload = encode(type, j, at, max_job_id_, skip);
        if (!payload.ok()) return fail(std::move(payload).error());
      }
    }
    if (payload->size() > kJournalMaxPayload) {
      return fail(Errc::internal, "journal: compaction record of job " + std::to_string(j.id) + " exceeds 16 MiB");
    }
    chunk += frame_journal_record(static_cast<std::uint8_t>(type), *payload);
    if (chunk.size() >= kCompactChunk) {
      if (!write_fully(tfd, chunk)) return io_fail("cannot write", tmp_path, errno);
      total += chunk.size();
      chunk.clear();
    }
    return {};
  };
  if (Status st = add(JournalRecord::meta, JournalJob{}, 0); !st.ok()) return abandon(fail(std::move(st).error()));
  for (const auto& [id, j] : jobs_) {
    if (dropped(id)) continue;
    Status st = add(JournalRecord::accepted, j, j.accepted_unix_ms);
    if (st.ok()) st = add(JournalRecord::restore, j, 0);
    if (st.ok() && (!j.tokens.empty() || !j.text.empty())) st = add(JournalRecord::output, j, 0);
    if (!st.ok()) return abandon(fail(std::move(st).error()));
  }
  if (!chunk.empty()) {
    if (!write_fully(tfd, chunk)) return abandon(io_fail("cannot write", tmp_path, errno));
    total += chunk.size();
    chunk.clear();
  }
  if (opts_.fsync && ::fsync(tfd) != 0) return abandon(io_fail("cannot fsync", tmp_path, errno));
  if (::renameat(dir_fd_, kTmpName, dir_fd_, kJournalName) != 0) {
    return abandon(io_fail("cannot rename " + tmp_path + " over", opts_.dir + "/" + kJournalName, errno));
  }
  // From here the new file is the journal, whatever happens next.
  ::close(fd_);
  fd_ = tfd;
  file_bytes_ = total;
  appended_since_compact_ = 0;
  accepted_since_compact_ = 0;
  for (std::uint64_t id : drop) jobs_.erase(id);
  // The new file holds every record appended so far and was fsynced (a pending window included); a failed commit
  // can no longer cut anything off it. A journal broken by a failed cut is whole again.
  mark_durable();
  broken_ = false;
  if (opts_.fsync && ::fsync(dir_fd_) != 0) return io_fail("cannot fsync directory", opts_.dir, errno);
  return {};
}

}  // namespace tandem::daemon
