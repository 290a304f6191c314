#include "core/text.h"
#include "daemon/journal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

namespace tandem::daemon {

namespace {

using Json = nlohmann::json;

constexpr char kMagic[4] = {'T', 'J', 'R', '1'};
constexpr const char* kJournalName = "journal";
constexpr const char* kTmpName = "journal.tmp";
constexpr const char* kTornName = "journal.torn";
// Deepest payload we write: object -> array -> object -> string (a restore record's history). Anything deeper is
// corruption, rejected before nlohmann recurses into it.
constexpr int kMaxDepth = 4;
constexpr std::size_t kCompactChunk = 4u << 20;

// --- CRC-32C -----------------------------------------------------------------------------------------------------

// Slicing-by-8: table[0] is the classic byte table, table[k][i] advances table[k-1][i] by one more zero byte.
using CrcTables = std::array<std::array<std::uint32_t, 256>, 8>;
constexpr CrcTables make_crc_tables() {
  CrcTables t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[0][i] = c;
  }
  for (std::size_t k = 1; k < 8; ++k) {
    for (std::uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xffu];
  }
  return t;
}
constexpr CrcTables kCrc = make_crc_tables();

std::uint32_t load_u32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return std::uint32_t{u[0]} | std::uint32_t{u[1]} << 8 | std::uint32_t{u[2]} << 16 | std::uint32_t{u[3]} << 24;
}

void store_u32(char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xffu);
}

// --- strings that may not be UTF-8 ---------------------------------------------------------------------------------


constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  std::size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    std::uint32_t v = std::uint32_t{p[i]} << 16 | std::uint32_t{p[i + 1]} << 8 | p[i + 2];
    for (int k = 3; k >= 0; --k) out += kB64[(v >> (6 * k)) & 63];
  }
  if (std::size_t rest = in.size() - i; rest > 0) {
    std::uint32_t v = std::uint32_t{p[i]} << 16 | (rest == 2 ? std::uint32_t{p[i + 1]} << 8 : 0);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += rest == 2 ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::string> base64_decode(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (std::size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    int pad = 0;
    if (last && in[i + 3] == '=') pad = in[i + 2] == '=' ? 2 : 1;
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      int d = k >= 4 - pad ? 0 : val(in[i + k]);
      if (d < 0) return std::nullopt;
      v = v << 6 | static_cast<std::uint32_t>(d);
    }
    out += static_cast<char>((v >> 16) & 0xff);
    if (pad < 2) out += static_cast<char>((v >> 8) & 0xff);
    if (pad < 1) out += static_cast<char>(v & 0xff);
  }
  return out;
}

// A byte string goes in as "key" when it is UTF-8 (readable with jq), else as "key_b64" (byte-exact either way).
void put_str(Json& j, const std::string& key, const std::string& s) {
  if (tandem::valid_utf8(s)) {
    j[key] = s;
  } else {
    j[key + "_b64"] = base64_encode(s);
  }
}

bool get_str(const Json& j, const std::string& key, std::string& out) {
  auto a = j.find(key);
  auto b = j.find(key + "_b64");
  if ((a == j.end()) == (b == j.end())) return false;  // exactly one of them
  if (a != j.end()) {
    if (!a->is_string()) return false;
    out = a->get<std::string>();
    return true;
  }
  if (!b->is_string()) return false;
  auto d = base64_decode(b->get_ref<const std::string&>());
  if (!d) return false;
  out = std::move(*d);
  return true;
}

bool get_u64(const Json& j, const char* key, std::uint64_t& out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) return false;
  out = it->get<std::uint64_t>();
  return true;
}

bool get_u32(const Json& j, const char* key, std::uint32_t& out) {
  std::uint64_t v = 0;
  if (!get_u64(j, key, v) || v > std::numeric_limits<std::uint32_t>::max()) return false;
  out = static_cast<std::uint32_t>(v);
  return true;
}

bool get_i64(const Json& j, const char* key, std::int64_t& out) {
  auto it = j.find(key);
  if (it == j.end()) return false;
  if (it->is_number_unsigned()) {
    auto v = it->get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return false;
    out = static_cast<std::int64_t>(v);
    return true;
  }
  if (!it->is_number_integer()) return false;
  out = it->get<std::int64_t>();
  return true;
}

bool get_tokens(const Json& j, std::vector<std::int32_t>& out) {
  auto it = j.find("tokens");
  if (it == j.end() || !it->is_array()) return false;
  out.clear();
  out.reserve(it->size());
  for (const auto& v : *it) {
    if (!v.is_number_integer()) return false;
    std::int64_t t = 0;
    if (v.is_number_unsigned()) {
      auto u = v.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max())) return false;
      t = static_cast<std::int64_t>(u);
    } else {
      t = v.get<std::int64_t>();
      if (t < std::numeric_limits<std::int32_t>::min() || t > std::numeric_limits<std::int32_t>::max()) return false;
    }
    out.push_back(static_cast<std::int32_t>(t));
  }
  return true;
}


// --- phases -------------------------------------------------------------------------------------------------------

constexpr std::string_view kNonTerminal[] = {"queued", "running", "retrying", "migrating"};
constexpr std::string_view kTerminal[] = {"completed", "failed", "cancelled"};
constexpr std::string_view kFinishReasons[] = {"eos", "stop_string", "max_tokens", "context_full"};

template <std::size_t N>
bool one_of(std::string_view s, const std::string_view (&set)[N]) {
  return std::find(std::begin(set), std::end(set), s) != std::end(set);
}

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

std::uint32_t crc32c(std::string_view data, std::uint32_t crc) noexcept {
  crc = ~crc;
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  std::size_t n = data.size();
  for (; n >= 8; n -= 8, p += 8) {
    const std::uint32_t lo = crc ^ (std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 |
                                    std::uint32_t{p[3]} << 24);
    crc = kCrc[7][lo & 0xffu] ^ kCrc[6][(lo >> 8) & 0xffu] ^ kCrc[5][(lo >> 16) & 0xffu] ^ kCrc[4][lo >> 24] ^
          kCrc[3][p[4]] ^ kCrc[2][p[5]] ^ kCrc[1][p[6]] ^ kCrc[0][p[7]];
  }
  for (; n > 0; --n, ++p) crc = kCrc[0][(crc ^ *p) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

std::string frame_journal_record(std::uint8_t type, std::string_view payload) {
  std::string out(kJournalHeaderBytes, '\0');
  std::memcpy(out.data(), kMagic, 4);
  store_u32(out.data() + 4, static_cast<std::uint32_t>(payload.size()));
  out[12] = static_cast<char>(type);
  std::uint32_t crc = crc32c(payload, crc32c(std::string_view(out.data() + 12, 4)));
  store_u32(out.data() + 8, crc);
  out.append(payload);
  return out;
}

bool is_journal_phase(std::string_view phase) noexcept {
  return one_of(phase, kNonTerminal) || one_of(phase, kTerminal);
}

bool is_terminal_journal_phase(std::string_view phase) noexcept { return one_of(phase, kTerminal); }

bool JournalJob::terminal() const { return is_terminal_journal_phase(phase); }

// One decoded record. `job` carries the fields of its type (see encode()); `at` is the transition/outcome time.
struct JobJournal::Rec {
  JournalJob job;
  std::int64_t at = 0;
  std::uint64_t max_job_id = 0;  // meta
};

namespace {

// Frame check at `pos`: ok (fills type/payload), short (the buffer ends inside it), bad.
enum class FrameState { ok, short_read, bad };

FrameState check_frame(std::string_view buf, std::size_t pos, std::uint8_t& type, std::string_view& payload) {
  const std::size_t avail = buf.size() - pos;
  if (avail < 4) return std::memcmp(buf.data() + pos, kMagic, avail) == 0 ? FrameState::short_read : FrameState::bad;
  if (std::memcmp(buf.data() + pos, kMagic, 4) != 0) return FrameState::bad;
  if (avail < kJournalHeaderBytes) return FrameState::short_read;
  const char* h = buf.data() + pos;
  const std::uint32_t len = load_u32(h + 4);
  if (len > kJournalMaxPayload || h[13] != 0 || h[14] != 0 || h[15] != 0) return FrameState::bad;
  if (avail - kJournalHeaderBytes < len) return FrameState::short_read;
  payload = std::string_view(h + kJournalHeaderBytes, len);
  if (crc32c(payload, crc32c(std::string_view(h + 12, 4))) != load_u32(h + 8)) return FrameState::bad;
  type = static_cast<std::uint8_t>(h[12]);
  return FrameState::ok;
}

// Next offset after `from` where a complete record with a valid CRC starts, or npos.
std::size_t find_next_frame(std::string_view buf, std::size_t from) {
  const std::string_view magic(kMagic, 4);
  while (from < buf.size()) {
    std::size_t at = buf.find(magic, from);
    if (at == std::string_view::npos) return at;
    std::uint8_t type;
    std::string_view payload;
    if (check_frame(buf, at, type, payload) == FrameState::ok) return at;
    from = at + 1;
  }
  return std::string_view::npos;
}

bool known_type(std::uint8_t t) { return t >= 1 && t <= 7; }

// Field validation shared by append (invalid_argument) and replay (corrupt record).
Status validate_fields(JournalRecord type, const JournalJob& j) {
  auto bad = [&](const std::string& what) {
    return fail(Errc::invalid_argument, "journal record for job " + std::to_string(j.id) + ": " + what);
  };
  if (type == JournalRecord::meta) return {};
  if (j.id == 0) return bad("job id 0");
  switch (type) {
    case JournalRecord::accepted:
      if (j.model.size() > kJournalMaxName) return bad("model longer than 1024 bytes");
      if (j.idempotency_key.size() > kJournalMaxName) return bad("idempotency_key longer than 1024 bytes");
      return {};
    case JournalRecord::transition:
      if (!one_of(j.phase, kNonTerminal)) {
        return bad("transition phase '" + j.phase.substr(0, 64) + "' is not one of queued|running|retrying|migrating");
      }
      if (j.reason.size() > kJournalMaxReason) return bad("reason longer than 4096 bytes");
      if (j.route_json.size() > kJournalMaxSideJson) return bad("route_json longer than 65536 bytes");
      return {};
    case JournalRecord::outcome:
    case JournalRecord::restore: {
      if (type == JournalRecord::outcome && !one_of(j.phase, kTerminal)) {
        return bad("outcome phase '" + j.phase.substr(0, 64) + "' is not one of completed|failed|cancelled");
      }
      if (type == JournalRecord::restore && !is_journal_phase(j.phase)) {
        return bad("phase '" + j.phase.substr(0, 64) + "' is unknown");
      }
      if (j.reason.size() > kJournalMaxReason) return bad("reason longer than 4096 bytes");
      if (j.route_json.size() > kJournalMaxSideJson) return bad("route_json longer than 65536 bytes");
      if (j.error_code.size() > kJournalMaxErrorCode) return bad("error_code longer than 256 bytes");
      if (j.error_message.size() > kJournalMaxSideJson) return bad("error_message longer than 65536 bytes");
      if (j.retry_after_ms < 0) return bad("retry_after_ms < 0");
      if (j.history_json.size() > kJournalHistoryLimit) return bad("more than 64 history entries");
      if (j.phase == "completed") {
        if (!one_of(j.finish_reason, kFinishReasons)) {
          return bad("completed needs finish_reason eos|stop_string|max_tokens|context_full, got '" +
                     j.finish_reason.substr(0, 64) + "'");
        }
      } else if (!j.finish_reason.empty()) {
        return bad("finish_reason is only for completed");
      }
      if (j.phase == "failed" && j.error_code.empty()) return bad("failed needs an error_code");
      return {};
    }
    case JournalRecord::checkpoint:
    case JournalRecord::output:
    case JournalRecord::meta:
      return {};
  }
  return {};
}

// Payload JSON of a record of `type` from `j` (history entries before `history_skip` are left out of a restore).
Result<std::string> encode(JournalRecord type, const JournalJob& j, std::int64_t at, std::uint64_t max_job_id,
                           std::size_t history_skip = 0) {
  Json o = Json::object();
  try {
    if (type == JournalRecord::meta) {
      o["max_job_id"] = max_job_id;
      return o.dump();
    }
    o["id"] = j.id;
    switch (type) {
      case JournalRecord::accepted:
        put_str(o, "model", j.model);
        put_str(o, "key", j.idempotency_key);
        o["digest"] = j.request_digest;
        o["uid"] = j.owner_uid;
        put_str(o, "request", j.request_json);
        o["at"] = at;
        break;
      case JournalRecord::transition:
        put_str(o, "phase", j.phase);
        put_str(o, "reason", j.reason);
        put_str(o, "route", j.route_json);
        o["at"] = at;
        o["attempts"] = j.attempts;
        break;
      case JournalRecord::checkpoint:
      case JournalRecord::output:
        o["tokens"] = j.tokens;
        put_str(o, "text", j.text);
        break;
      case JournalRecord::outcome:
        put_str(o, "phase", j.phase);
        put_str(o, "reason", j.reason);
        o["tokens"] = j.tokens;
        put_str(o, "text", j.text);
        put_str(o, "error_code", j.error_code);
        put_str(o, "error_message", j.error_message);
        o["retry_after_ms"] = j.retry_after_ms;
        put_str(o, "finish_reason", j.finish_reason);
        o["at"] = at;
        break;
      case JournalRecord::restore: {
        put_str(o, "phase", j.phase);
        put_str(o, "reason", j.reason);
        put_str(o, "route", j.route_json);
        Json h = Json::array();
        for (std::size_t i = history_skip; i < j.history_json.size(); ++i) {
          Json e = Json::object();
          put_str(e, "e", j.history_json[i]);
          h.push_back(std::move(e));
        }
        o["history"] = std::move(h);
        o["attempts"] = j.attempts;
        put_str(o, "error_code", j.error_code);
        put_str(o, "error_message", j.error_message);
        o["retry_after_ms"] = j.retry_after_ms;
        put_str(o, "finish_reason", j.finish_reason);
        o["finished_at"] = j.finished_unix_ms;
        break;
      }
      case JournalRecord::meta:
        break;
    }
    return o.dump();
  } catch (const std::exception& e) {
    return fail(Errc::internal, std::string("journal: cannot encode a record: ") + e.what());
  }
}

// The history entry an outcome adds: {"id","phase","reason","at"}.
std::string outcome_history_entry(const JournalJob& j, std::int64_t at) {
  Json o = Json::object();
  o["id"] = j.id;
  put_str(o, "phase", j.phase);
  put_str(o, "reason", j.reason);
  o["at"] = at;
  try {
    return o.dump();
  } catch (const std::exception&) {
    return "{}";
  }
}

}  // namespace

// --- JobJournal --------------------------------------------------------------------------------------------------

JobJournal::~JobJournal() {
  if (fd_ >= 0) {
    if (unsynced_ && opts_.fsync) ::fdatasync(fd_);
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
    if (jr->opts_.fsync && ::fdatasync(jr->fd_) != 0) return io_fail("cannot fdatasync", path, errno);
  }
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

bool JobJournal::decode(JournalRecord type, std::string_view payload, Rec& r) {
  if (tandem::json_nesting_depth(payload, kMaxDepth) > kMaxDepth) return false;
  Json o;
  try {
    o = Json::parse(payload, nullptr, /*allow_exceptions=*/false);
  } catch (const std::exception&) {
    return false;
  }
  if (!o.is_object()) return false;
  JournalJob& j = r.job;
  if (type == JournalRecord::meta) {
    if (!get_u64(o, "max_job_id", r.max_job_id)) return false;
    return true;
  }
  if (!get_u64(o, "id", j.id)) return false;
  bool ok = true;
  switch (type) {
    case JournalRecord::accepted:
      ok = get_str(o, "model", j.model) && get_str(o, "key", j.idempotency_key) &&
           get_u64(o, "digest", j.request_digest) && get_u32(o, "uid", j.owner_uid) &&
           get_str(o, "request", j.request_json) && get_i64(o, "at", r.at);
      j.accepted_unix_ms = r.at;
      break;
    case JournalRecord::transition:
      ok = get_str(o, "phase", j.phase) && get_str(o, "reason", j.reason) && get_str(o, "route", j.route_json) &&
           get_i64(o, "at", r.at) && get_u32(o, "attempts", j.attempts);
      break;
    case JournalRecord::checkpoint:
    case JournalRecord::output:
      ok = get_tokens(o, j.tokens) && get_str(o, "text", j.text);
      break;
    case JournalRecord::outcome:
      ok = get_str(o, "phase", j.phase) && get_str(o, "reason", j.reason) && get_tokens(o, j.tokens) &&
           get_str(o, "text", j.text) && get_str(o, "error_code", j.error_code) &&
           get_str(o, "error_message", j.error_message) && get_i64(o, "retry_after_ms", j.retry_after_ms) &&
           get_str(o, "finish_reason", j.finish_reason) && get_i64(o, "at", r.at);
      j.finished_unix_ms = r.at;
      break;
    case JournalRecord::restore: {
      ok = get_str(o, "phase", j.phase) && get_str(o, "reason", j.reason) && get_str(o, "route", j.route_json) &&
           get_u32(o, "attempts", j.attempts) && get_str(o, "error_code", j.error_code) &&
           get_str(o, "error_message", j.error_message) && get_i64(o, "retry_after_ms", j.retry_after_ms) &&
           get_str(o, "finish_reason", j.finish_reason) && get_i64(o, "finished_at", j.finished_unix_ms);
      auto h = o.find("history");
      if (!ok || h == o.end() || !h->is_array() || h->size() > kJournalHistoryLimit) return false;
      for (const auto& e : *h) {
        std::string s;
        if (!e.is_object() || !get_str(e, "e", s)) return false;
        j.history_json.push_back(std::move(s));
      }
      break;
    }
    case JournalRecord::meta:
      break;
  }
  if (!ok || !validate_fields(type, j).ok()) return false;
  return true;
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

Status JobJournal::append(JournalRecord type, Rec&& r, bool sync_now) {
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
  ssize_t n;
  do {
    n = ::write(fd_, frame.data(), frame.size());  // O_APPEND: one write of the whole record
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(frame.size())) {
    const int err = n < 0 ? errno : ENOSPC;
    if (n > 0) (void)::ftruncate(fd_, before);
    return io_fail("cannot append to", path, err);
  }
  if (sync_now && opts_.fsync && ::fdatasync(fd_) != 0) {
    const int err = errno;
    (void)::ftruncate(fd_, before);  // not durable: the caller refuses the job, so it must not come back at replay
    return io_fail("cannot fdatasync", path, err);
  }
  file_bytes_ += frame.size();
  appended_since_compact_ += frame.size();
  unsynced_ = !(sync_now && opts_.fsync);
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
  return append(JournalRecord::accepted, std::move(r), /*sync_now=*/true);
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
  return append(JournalRecord::transition, std::move(r), /*sync_now=*/false);
}

Status JobJournal::checkpoint(std::uint64_t id, const std::vector<std::int32_t>& tokens, const std::string& text) {
  Rec r;
  r.job.id = id;
  r.job.tokens = tokens;
  r.job.text = text;
  return append(JournalRecord::checkpoint, std::move(r), /*sync_now=*/false);
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
  return append(JournalRecord::outcome, std::move(r), /*sync_now=*/true);
}

Status JobJournal::sync() {
  if (::fdatasync(fd_) != 0) return io_fail("cannot fdatasync", opts_.dir + "/" + kJournalName, errno);
  unsynced_ = false;
  return {};
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
  unsynced_ = !opts_.fsync;
  for (std::uint64_t id : drop) jobs_.erase(id);
  if (opts_.fsync && ::fsync(dir_fd_) != 0) return io_fail("cannot fsync directory", opts_.dir, errno);
  return {};
}

}  // namespace tandem::daemon
