#include "client/image_index.h"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

namespace tandem::client {

namespace {

std::string errno_text(int e) { return std::strerror(e); }

// SQLite's result code -> Errc: a file that is not a database or is corrupt is a format error.
Errc errc_for_sqlite(int rc) {
  switch (rc & 0xff) {
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT:
    case SQLITE_FORMAT:
    case SQLITE_SCHEMA:
    case SQLITE_MISMATCH:
      return Errc::format_error;
    case SQLITE_CANTOPEN:
    case SQLITE_IOERR:
    case SQLITE_READONLY:
    case SQLITE_FULL:
    case SQLITE_PERM:
    case SQLITE_AUTH:
      return Errc::io_error;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return Errc::unavailable;
    case SQLITE_NOMEM:
      return Errc::out_of_memory;
    default:
      return Errc::internal;
  }
}

// A prepared statement, finalized on scope exit.
class Stmt {
 public:
  Stmt() = default;
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  ~Stmt() { sqlite3_finalize(s_); }
  int prepare(sqlite3* db, const char* sql) { return sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  sqlite3_stmt* get() const { return s_; }
  void text(int i, std::string_view v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void i64(int i, std::int64_t v) { sqlite3_bind_int64(s_, i, v); }
  void blob(int i, const void* p, std::size_t n) {
    sqlite3_bind_blob(s_, i, p, static_cast<int>(n), SQLITE_TRANSIENT);
  }
  int step() { return sqlite3_step(s_); }
  void reset() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  std::string col_text(int i) const {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s_, i));
    return p ? std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(s_, i))) : std::string();
  }
  std::int64_t col_i64(int i) const { return sqlite3_column_int64(s_, i); }

 private:
  sqlite3_stmt* s_ = nullptr;
};

// float32 little-endian <-> host floats.
void floats_to_le(const float* in, std::size_t n, std::string& out) {
  out.resize(n * 4);
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(out.data(), in, n * 4);
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t u = std::bit_cast<std::uint32_t>(in[i]);
      for (int b = 0; b < 4; ++b) out[i * 4 + b] = static_cast<char>((u >> (8 * b)) & 0xff);
    }
  }
}

void le_to_floats(const void* in, std::size_t n, float* out) {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(out, in, n * 4);
  } else {
    const auto* p = static_cast<const unsigned char*>(in);
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t u = 0;
      for (int b = 0; b < 4; ++b) u |= static_cast<std::uint32_t>(p[i * 4 + b]) << (8 * b);
      out[i] = std::bit_cast<float>(u);
    }
  }
}

bool all_finite(const float* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}

std::int64_t stat_mtime_ns(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

std::int64_t now_unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// mkdir -p of the directory part of `file` (new directories 0700: a cache of the user's pictures).
Result<void> make_parent_dirs(const std::string& file) {
  auto slash = file.rfind('/');
  if (slash == std::string::npos || slash == 0) return {};
  std::string dir = file.substr(0, slash);
  for (std::size_t i = 1; i <= dir.size(); ++i) {
    if (i != dir.size() && dir[i] != '/') continue;
    std::string part = dir.substr(0, i);
    if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST)
      return fail(Errc::io_error, "cannot create " + part + ": " + errno_text(errno));
  }
  return {};
}

// The range of paths under `root` (absolute, no trailing slash unless "/"): [lo, hi).
std::pair<std::string, std::string> prefix_range(const std::string& root) {
  std::string lo = root == "/" ? "/" : root + "/";
  std::string hi = lo;
  hi.back() = static_cast<char>(hi.back() + 1);  // '/' + 1 = '0'
  return {lo, hi};
}

struct TableSpec {
  const char* name;
  std::vector<std::string> columns;
};

const TableSpec kTables[] = {
    {"meta", {"key", "value"}},
    {"images", {"path", "mtime_ns", "size", "vector", "indexed_unix_ms"}},
    {"errors", {"path", "mtime_ns", "size", "message"}},
};

constexpr const char* kCreateSql =
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE images (path TEXT PRIMARY KEY, mtime_ns INTEGER NOT NULL, size INTEGER NOT NULL,"
    " vector BLOB NOT NULL, indexed_unix_ms INTEGER NOT NULL);"
    "CREATE TABLE errors (path TEXT PRIMARY KEY, mtime_ns INTEGER NOT NULL, size INTEGER NOT NULL,"
    " message TEXT NOT NULL);";

// Checks that db is an image index (tables and columns) and reads its meta. `file` names it in errors.
Result<IndexIdentity> check_layout(sqlite3* db, const std::string& file, bool& empty) {
  auto sql_fail = [&](int rc, const std::string& what) {
    Errc code = errc_for_sqlite(rc);
    std::string m = file + ": " + what + ": " + sqlite3_errmsg(db);
    if (code == Errc::format_error) m = file + " is not a valid image index (" + sqlite3_errmsg(db) + ")";
    return fail(code, m);
  };
  std::set<std::string> tables;
  {
    Stmt st;
    int rc = st.prepare(db, "SELECT name FROM sqlite_master WHERE type = 'table'");
    if (rc != SQLITE_OK) return sql_fail(rc, "reading its tables");
    while ((rc = st.step()) == SQLITE_ROW) tables.insert(st.col_text(0));
    if (rc != SQLITE_DONE) return sql_fail(rc, "reading its tables");
  }
  empty = tables.empty();
  if (empty) return IndexIdentity{};
  for (const auto& t : kTables) {
    if (!tables.count(t.name)) {
      std::string have;
      for (const auto& n : tables) have += (have.empty() ? "" : ", ") + n;
      return fail(Errc::format_error, file + " is not an image index: no table '" + t.name + "' (it has " + have + ")");
    }
    Stmt st;
    std::string sql = std::string("PRAGMA table_info(") + t.name + ")";
    int rc = st.prepare(db, sql.c_str());
    if (rc != SQLITE_OK) return sql_fail(rc, "reading its columns");
    std::vector<std::string> cols;
    while ((rc = st.step()) == SQLITE_ROW) cols.push_back(st.col_text(1));
    if (rc != SQLITE_DONE) return sql_fail(rc, "reading its columns");
    if (cols != t.columns)
      return fail(Errc::format_error,
                  file + " is not an image index: table '" + t.name + "' has other columns than this tandemctl's");
  }
  std::map<std::string, std::string> meta;
  {
    Stmt st;
    int rc = st.prepare(db, "SELECT key, value FROM meta");
    if (rc != SQLITE_OK) return sql_fail(rc, "reading meta");
    while ((rc = st.step()) == SQLITE_ROW) meta[st.col_text(0)] = st.col_text(1);
    if (rc != SQLITE_DONE) return sql_fail(rc, "reading meta");
  }
  if (!meta.count("schema"))
    return fail(Errc::format_error, file + " is not an image index: meta has no schema version");
  if (meta["schema"] != std::to_string(kImageIndexSchema))
    return fail(Errc::incompatible, file + " is an image index of schema " + meta["schema"] + ", this tandemctl uses " +
                                        std::to_string(kImageIndexSchema));
  IndexIdentity id;
  id.model = meta["model"];
  id.fingerprint = meta["fingerprint"];
  const std::string& d = meta["dim"];
  char* end = nullptr;
  errno = 0;
  unsigned long v = d.empty() ? 0 : std::strtoul(d.c_str(), &end, 10);
  if (d.empty() || errno != 0 || *end != '\0' || v == 0 || v > 1u << 20)
    return fail(Errc::format_error, file + " is not a valid image index: meta dim '" + d + "' is not a width");
  id.dim = static_cast<std::uint32_t>(v);
  return id;
}

Result<void> remove_index_files(const std::string& file) {
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
    std::string f = file + suffix;
    if (::unlink(f.c_str()) != 0 && errno != ENOENT)
      return fail(Errc::io_error, "cannot remove " + f + ": " + errno_text(errno));
  }
  return {};
}

Result<sqlite3*> open_db(const std::string& file, int flags) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(file.c_str(), &db, flags | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string m = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return fail(errc_for_sqlite(rc) == Errc::format_error ? Errc::format_error : Errc::io_error,
                "cannot open the image index " + file + ": " + m);
  }
  sqlite3_busy_timeout(db, 10000);
  sqlite3_extended_result_codes(db, 1);
  return db;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------

Result<std::string> default_index_path() {
  std::string base;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && x[0] == '/') {
    base = x;
  } else {
    std::string home;
    if (const char* h = std::getenv("HOME"); h && h[0] == '/') home = h;
    if (home.empty()) {
      struct passwd pw {};
      struct passwd* res = nullptr;
      std::vector<char> buf(16384);
      if (getpwuid_r(::getuid(), &pw, buf.data(), buf.size(), &res) == 0 && res && res->pw_dir &&
          res->pw_dir[0] == '/')
        home = res->pw_dir;
    }
    if (home.empty()) return fail(Errc::not_found, "no home directory (HOME, XDG_CACHE_HOME): use --index FILE");
    base = home + "/.cache";
  }
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return base + "/tandem/image-index.sqlite3";
}

bool is_image_name(std::string_view name) {
  auto dot = name.rfind('.');
  if (dot == std::string_view::npos || dot == 0) return false;
  std::string ext(name.substr(dot + 1));
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}

std::vector<FileStamp> UpdatePlan::to_embed() const {
  std::vector<FileStamp> out = added;
  out.insert(out.end(), changed.begin(), changed.end());
  std::sort(out.begin(), out.end(), [](const FileStamp& a, const FileStamp& b) { return a.path < b.path; });
  return out;
}

Result<IndexIdentity> read_index_identity(const std::string& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0)
    return fail(errno == ENOENT ? Errc::not_found : Errc::io_error,
                "no image index at " + file + " (" + errno_text(errno) + ")");
  auto db = open_db(file, SQLITE_OPEN_READONLY);
  if (!db.ok()) return fail(db.error());
  bool empty = false;
  auto id = check_layout(*db, file, empty);
  sqlite3_close(*db);
  if (id.ok() && empty) return fail(Errc::format_error, file + " is an empty database, not an image index");
  return id;
}

Result<std::unique_ptr<ImageIndex>> ImageIndex::open(const std::string& file, const IndexIdentity& identity,
                                                     const OpenOptions& options) {
  if (file.empty()) return fail(Errc::invalid_argument, "the image index file name is empty");
  if (identity.dim == 0 || identity.dim > (1u << 20))
    return fail(Errc::invalid_argument, "image index: dim " + std::to_string(identity.dim) + " is not a vector width");
  if (options.rebuild) {
    if (auto r = remove_index_files(file); !r.ok()) return fail(r.error());
  }
  struct stat st {};
  bool exists = ::stat(file.c_str(), &st) == 0;
  if (!exists && errno != ENOENT) return fail(Errc::io_error, "cannot stat " + file + ": " + errno_text(errno));
  if (exists && !S_ISREG(st.st_mode)) return fail(Errc::format_error, file + " is not a regular file");
  if (!exists) {
    if (!options.create)
      return fail(Errc::not_found, "no image index at " + file + " (run 'tandemctl index DIR' first)");
    if (auto r = make_parent_dirs(file); !r.ok()) return fail(r.error());
  }
  auto db = open_db(file, SQLITE_OPEN_READWRITE | (options.create ? SQLITE_OPEN_CREATE : 0));
  if (!db.ok()) return fail(db.error());
  std::unique_ptr<ImageIndex> ix(new ImageIndex());
  ix->db_ = *db;
  ix->file_ = file;
  ix->identity_ = identity;

  bool empty = false;
  auto stored = check_layout(ix->db_, file, empty);
  if (!stored.ok()) return fail(stored.error());
  if (empty) {
    if (auto r = ix->exec("PRAGMA journal_mode=WAL"); !r.ok()) return fail(r.error());
    if (auto r = ix->exec("BEGIN IMMEDIATE"); !r.ok()) return fail(r.error());
    if (auto r = ix->exec(kCreateSql); !r.ok()) return fail(r.error());
    Stmt st;
    if (st.prepare(ix->db_, "INSERT INTO meta (key, value) VALUES (?, ?)") != SQLITE_OK)
      return fail(ix->sql_error("writing meta"));
    const std::pair<const char*, std::string> rows[] = {{"schema", std::to_string(kImageIndexSchema)},
                                                        {"model", identity.model},
                                                        {"fingerprint", identity.fingerprint},
                                                        {"dim", std::to_string(identity.dim)}};
    for (const auto& [k, v] : rows) {
      st.text(1, k);
      st.text(2, v);
      if (st.step() != SQLITE_DONE) return fail(ix->sql_error("writing meta"));
      st.reset();
    }
    if (auto r = ix->exec("COMMIT"); !r.ok()) return fail(r.error());
    if (auto r = ix->exec("PRAGMA synchronous=NORMAL"); !r.ok()) return fail(r.error());
    return ix;
  }
  const IndexIdentity& have = *stored;
  if (have.dim != identity.dim)
    return fail(Errc::incompatible, file + " holds vectors of dim " + std::to_string(have.dim) + " (model " +
                                        have.model + "), not " + std::to_string(identity.dim) + " (model " +
                                        identity.model + ")");
  bool same_model = (have.fingerprint.empty() && identity.fingerprint.empty()) ? have.model == identity.model
                                                                                : have.fingerprint == identity.fingerprint;
  if (!same_model)
    return fail(Errc::incompatible, file + " was built with model " + have.model + " (fingerprint " +
                                        (have.fingerprint.empty() ? "none" : have.fingerprint) + "), not " +
                                        identity.model + " (fingerprint " +
                                        (identity.fingerprint.empty() ? "none" : identity.fingerprint) + ")");
  // A truncated or damaged file can pass the layout checks (the schema is on page 1): check the b-trees.
  {
    Stmt st;
    if (st.prepare(ix->db_, "PRAGMA quick_check") != SQLITE_OK) return fail(ix->sql_error("checking it"));
    int rc = st.step();
    if (rc != SQLITE_ROW) return fail(ix->sql_error("checking it"));
    std::string res = st.col_text(0);
    if (res != "ok") return fail(Errc::format_error, file + " is a corrupt image index (" + res + ")");
  }
  if (auto r = ix->exec("PRAGMA journal_mode=WAL"); !r.ok()) return fail(r.error());
  // A cache: a commit need not reach the disk before the next batch (WAL stays consistent; a power cut may lose the
  // last batches, which the next run embeds again).
  if (auto r = ix->exec("PRAGMA synchronous=NORMAL"); !r.ok()) return fail(r.error());
  return ix;
}

ImageIndex::~ImageIndex() { sqlite3_close(db_); }

Error ImageIndex::sql_error(const std::string& what) const {
  int rc = sqlite3_extended_errcode(db_);
  Errc code = errc_for_sqlite(rc);
  if (code == Errc::format_error) return Error{code, file_ + " is not a valid image index (" + sqlite3_errmsg(db_) + ")"};
  if (code == Errc::unavailable)
    return Error{code, file_ + " is locked by another process (" + std::string(sqlite3_errmsg(db_)) + ")"};
  return Error{code, file_ + ": " + what + ": " + sqlite3_errmsg(db_)};
}

Result<void> ImageIndex::exec(const char* sql) {
  char* msg = nullptr;
  int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &msg);
  sqlite3_free(msg);
  if (rc != SQLITE_OK) return fail(sql_error(std::string("running ") + sql));
  return {};
}

Result<UpdatePlan> ImageIndex::plan_update(const std::string& root_in) {
  UpdatePlan plan;
  char* real = ::realpath(root_in.c_str(), nullptr);
  if (!real)
    return fail(errno == ENOENT ? Errc::not_found : Errc::io_error, root_in + ": " + errno_text(errno));
  plan.root = real;
  std::free(real);
  struct stat rst {};
  if (::stat(plan.root.c_str(), &rst) != 0) return fail(Errc::io_error, plan.root + ": " + errno_text(errno));
  if (!S_ISDIR(rst.st_mode)) return fail(Errc::invalid_argument, root_in + " is not a directory");

  // Scan: directories never followed through symlinks (O_NOFOLLOW, fstatat without following).
  std::vector<FileStamp> found;
  std::vector<std::string> stack{plan.root};
  while (!stack.empty()) {
    std::string dir = std::move(stack.back());
    stack.pop_back();
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      plan.problems.push_back({dir, "cannot open directory: " + errno_text(errno)});
      continue;
    }
    DIR* d = ::fdopendir(fd);
    if (!d) {
      plan.problems.push_back({dir, "cannot read directory: " + errno_text(errno)});
      ::close(fd);
      continue;
    }
    const std::string base = dir == "/" ? "" : dir;
    std::vector<std::string> subdirs;
    for (;;) {
      errno = 0;
      struct dirent* e = ::readdir(d);
      if (!e) {
        if (errno != 0) plan.problems.push_back({dir, "cannot read directory: " + errno_text(errno)});
        break;
      }
      std::string_view name = e->d_name;
      if (name == "." || name == "..") continue;
      // d_type spares a stat for the files that are neither directories nor images.
      if (e->d_type == DT_REG && !is_image_name(name)) continue;
      struct stat st {};
      if (::fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno != ENOENT) plan.problems.push_back({base + "/" + std::string(name), errno_text(errno)});
        continue;
      }
      std::string path = base + "/" + std::string(name);
      if (S_ISLNK(st.st_mode)) {
        ++plan.skipped_symlinks;
      } else if (S_ISDIR(st.st_mode)) {
        subdirs.push_back(std::move(path));
      } else if (S_ISREG(st.st_mode) && is_image_name(name)) {
        found.push_back({std::move(path), stat_mtime_ns(st), static_cast<std::uint64_t>(st.st_size)});
      }
    }
    ::closedir(d);
    std::sort(subdirs.rbegin(), subdirs.rend());
    for (auto& s : subdirs) stack.push_back(std::move(s));
  }
  std::sort(found.begin(), found.end(), [](const FileStamp& a, const FileStamp& b) { return a.path < b.path; });

  // The index's rows under root.
  struct Known {
    FileStamp stamp;
    bool failed;
  };
  std::unordered_map<std::string, Known> known;
  auto [lo, hi] = prefix_range(plan.root);
  for (const char* sql : {"SELECT path, mtime_ns, size FROM images WHERE path >= ?1 AND path < ?2",
                          "SELECT path, mtime_ns, size FROM errors WHERE path >= ?1 AND path < ?2"}) {
    const bool failed = std::strstr(sql, "errors") != nullptr;
    Stmt st;
    if (st.prepare(db_, sql) != SQLITE_OK) return fail(sql_error("reading the index"));
    st.text(1, lo);
    st.text(2, hi);
    int rc;
    while ((rc = st.step()) == SQLITE_ROW) {
      FileStamp f{st.col_text(0), st.col_i64(1), static_cast<std::uint64_t>(st.col_i64(2))};
      std::string key = f.path;
      known.insert_or_assign(std::move(key), Known{std::move(f), failed});
    }
    if (rc != SQLITE_DONE) return fail(sql_error("reading the index"));
  }
  for (auto& f : found) {
    auto it = known.find(f.path);
    if (it == known.end()) {
      plan.added.push_back(std::move(f));
      continue;
    }
    if (it->second.stamp == f)
      ++(it->second.failed ? plan.known_failures : plan.unchanged);
    else
      plan.changed.push_back(std::move(f));
    known.erase(it);
  }
  for (auto& [path, k] : known) plan.removed.push_back(path);
  std::sort(plan.removed.begin(), plan.removed.end());
  return plan;
}

Result<void> ImageIndex::apply(const std::vector<IndexUpdate>& batch) {
  const std::size_t dim = identity_.dim;
  for (const auto& u : batch) {
    if (u.file.path.empty()) return fail(Errc::invalid_argument, "image index: an update without a path");
    if (u.file.size > static_cast<std::uint64_t>(INT64_MAX))
      return fail(Errc::invalid_argument, "image index: " + u.file.path + ": size out of range");
    if (!u.error.empty()) continue;
    if (u.vector.size() != dim)
      return fail(Errc::invalid_argument, "image index: the vector of " + u.file.path + " has " +
                                              std::to_string(u.vector.size()) + " values, the index's dim is " +
                                              std::to_string(dim));
    if (!all_finite(u.vector.data(), dim))
      return fail(Errc::invalid_argument, "image index: the vector of " + u.file.path + " has a non-finite value");
  }
  if (batch.empty()) return {};
  if (auto r = exec("BEGIN IMMEDIATE"); !r.ok()) return r;
  auto rollback = [&](Error e) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    return fail(std::move(e));
  };
  Stmt put_image, del_image, put_error, del_error;
  if (put_image.prepare(db_,
                        "INSERT OR REPLACE INTO images (path, mtime_ns, size, vector, indexed_unix_ms) "
                        "VALUES (?, ?, ?, ?, ?)") != SQLITE_OK ||
      del_image.prepare(db_, "DELETE FROM images WHERE path = ?") != SQLITE_OK ||
      put_error.prepare(db_, "INSERT OR REPLACE INTO errors (path, mtime_ns, size, message) VALUES (?, ?, ?, ?)") !=
          SQLITE_OK ||
      del_error.prepare(db_, "DELETE FROM errors WHERE path = ?") != SQLITE_OK)
    return rollback(sql_error("preparing the update"));
  const std::int64_t now = now_unix_ms();
  std::string blob;
  for (const auto& u : batch) {
    Stmt& put = u.error.empty() ? put_image : put_error;
    Stmt& del = u.error.empty() ? del_error : del_image;
    put.text(1, u.file.path);
    put.i64(2, u.file.mtime_ns);
    put.i64(3, static_cast<std::int64_t>(u.file.size));
    if (u.error.empty()) {
      floats_to_le(u.vector.data(), dim, blob);
      put.blob(4, blob.data(), blob.size());
      put.i64(5, now);
    } else {
      put.text(4, u.error);
    }
    if (put.step() != SQLITE_DONE) return rollback(sql_error("writing " + u.file.path));
    put.reset();
    del.text(1, u.file.path);
    if (del.step() != SQLITE_DONE) return rollback(sql_error("writing " + u.file.path));
    del.reset();
  }
  if (auto r = exec("COMMIT"); !r.ok()) return rollback(r.error());
  loaded_ = false;
  return {};
}

Result<void> ImageIndex::remove(const std::vector<std::string>& paths) {
  if (paths.empty()) return {};
  if (auto r = exec("BEGIN IMMEDIATE"); !r.ok()) return r;
  auto rollback = [&](Error e) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    return fail(std::move(e));
  };
  Stmt a, b;
  if (a.prepare(db_, "DELETE FROM images WHERE path = ?") != SQLITE_OK ||
      b.prepare(db_, "DELETE FROM errors WHERE path = ?") != SQLITE_OK)
    return rollback(sql_error("preparing the removal"));
  for (const auto& p : paths) {
    for (Stmt* s : {&a, &b}) {
      s->text(1, p);
      if (s->step() != SQLITE_DONE) return rollback(sql_error("removing " + p));
      s->reset();
    }
  }
  if (auto r = exec("COMMIT"); !r.ok()) return rollback(r.error());
  loaded_ = false;
  return {};
}

Result<std::uint64_t> ImageIndex::remove_missing() {
  std::vector<std::string> gone;
  Stmt st;
  if (st.prepare(db_, "SELECT path FROM images UNION ALL SELECT path FROM errors") != SQLITE_OK)
    return fail(sql_error("reading the index"));
  int rc;
  while ((rc = st.step()) == SQLITE_ROW) {
    std::string p = st.col_text(0);
    struct stat s {};
    if (::lstat(p.c_str(), &s) != 0 || !S_ISREG(s.st_mode)) gone.push_back(std::move(p));
  }
  if (rc != SQLITE_DONE) return fail(sql_error("reading the index"));
  if (auto r = remove(gone); !r.ok()) return fail(r.error());
  return static_cast<std::uint64_t>(gone.size());
}

Result<void> ImageIndex::load_vectors() {
  const std::size_t dim = identity_.dim;
  std::vector<std::string> paths;
  std::vector<float> matrix;
  Stmt n;
  if (n.prepare(db_, "SELECT count(*) FROM images") != SQLITE_OK || n.step() != SQLITE_ROW)
    return fail(sql_error("counting the images"));
  const auto rows = static_cast<std::size_t>(std::max<std::int64_t>(0, n.col_i64(0)));
  paths.reserve(rows);
  matrix.reserve(rows * dim);
  Stmt st;
  if (st.prepare(db_, "SELECT path, vector FROM images") != SQLITE_OK) return fail(sql_error("reading the vectors"));
  int rc;
  while ((rc = st.step()) == SQLITE_ROW) {
    std::string path = st.col_text(0);
    if (sqlite3_column_type(st.get(), 1) != SQLITE_BLOB)
      return fail(Errc::format_error, file_ + ": the vector of " + path + " is not a blob");
    const void* p = sqlite3_column_blob(st.get(), 1);
    const auto bytes = static_cast<std::size_t>(sqlite3_column_bytes(st.get(), 1));
    if (bytes != dim * 4)
      return fail(Errc::format_error, file_ + ": the vector of " + path + " has " + std::to_string(bytes) +
                                          " bytes, not " + std::to_string(dim * 4) + " (dim " + std::to_string(dim) +
                                          " float32)");
    const std::size_t at = matrix.size();
    matrix.resize(at + dim);
    le_to_floats(p, dim, matrix.data() + at);
    if (!all_finite(matrix.data() + at, dim))
      return fail(Errc::format_error, file_ + ": the vector of " + path + " has a non-finite value");
    paths.push_back(std::move(path));
  }
  if (rc != SQLITE_DONE) return fail(sql_error("reading the vectors"));
  paths_ = std::move(paths);
  matrix_ = std::move(matrix);
  loaded_ = true;
  return {};
}

// Eight independent accumulators per row, so the compiler can keep them in one vector register without reordering
// a single sum (no -ffast-math needed); an AVX2 clone is picked at load time where the CPU has it.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
void dot_rows(const float* matrix, std::size_t rows, std::size_t dim, const float* query, float* scores) {
  const std::size_t blocks = dim / 8 * 8;
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = matrix + r * dim;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (std::size_t k = 0; k < blocks; k += 8)
      for (int j = 0; j < 8; ++j) acc[j] += row[k + j] * query[k + j];
    float tail = 0;
    for (std::size_t k = blocks; k < dim; ++k) tail += row[k] * query[k];
    scores[r] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
  }
}

Result<std::vector<SearchHit>> ImageIndex::search(const std::vector<float>& query_in, std::size_t n) {
  const std::size_t dim = identity_.dim;
  if (query_in.size() != dim)
    return fail(Errc::invalid_argument, "search: the query has " + std::to_string(query_in.size()) +
                                            " values, the index's dim is " + std::to_string(dim));
  if (!all_finite(query_in.data(), dim)) return fail(Errc::invalid_argument, "search: the query has a non-finite value");
  double norm2 = 0;
  for (float v : query_in) norm2 += static_cast<double>(v) * v;
  if (!(norm2 > 0)) return fail(Errc::invalid_argument, "search: the query vector is zero");
  std::vector<float> query = query_in;
  if (std::abs(norm2 - 1.0) > 1e-4) {
    const float inv = static_cast<float>(1.0 / std::sqrt(norm2));
    for (float& v : query) v *= inv;
  }
  if (!loaded_) {
    if (auto r = load_vectors(); !r.ok()) return fail(r.error());
  }
  const std::size_t rows = paths_.size();
  std::vector<float> scores(rows);
  if (rows) dot_rows(matrix_.data(), rows, dim, query.data(), scores.data());
  std::vector<std::uint32_t> order(rows);
  for (std::size_t i = 0; i < rows; ++i) order[i] = static_cast<std::uint32_t>(i);
  auto better = [&](std::uint32_t a, std::uint32_t b) {
    if (scores[a] != scores[b]) return scores[a] > scores[b];
    return paths_[a] < paths_[b];
  };
  n = std::min(n, rows);
  if (n < rows) {
    std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(), better);
    order.resize(n);
  }
  std::sort(order.begin(), order.end(), better);
  std::vector<SearchHit> hits;
  hits.reserve(n);
  for (std::uint32_t i : order) hits.push_back({paths_[i], scores[i]});
  return hits;
}

Result<IndexCounts> ImageIndex::counts() {
  IndexCounts c;
  for (auto [sql, out] : {std::pair{"SELECT count(*) FROM images", &c.images},
                          std::pair{"SELECT count(*) FROM errors", &c.errors}}) {
    Stmt st;
    if (st.prepare(db_, sql) != SQLITE_OK || st.step() != SQLITE_ROW) return fail(sql_error("counting"));
    *out = static_cast<std::uint64_t>(st.col_i64(0));
  }
  return c;
}

Result<std::vector<float>> ImageIndex::vector_of(const std::string& path) {
  Stmt st;
  if (st.prepare(db_, "SELECT vector FROM images WHERE path = ?") != SQLITE_OK)
    return fail(sql_error("reading " + path));
  st.text(1, path);
  int rc = st.step();
  if (rc == SQLITE_DONE) return fail(Errc::not_found, path + " is not in the image index " + file_);
  if (rc != SQLITE_ROW) return fail(sql_error("reading " + path));
  const std::size_t dim = identity_.dim;
  const auto bytes = static_cast<std::size_t>(sqlite3_column_bytes(st.get(), 0));
  if (sqlite3_column_type(st.get(), 0) != SQLITE_BLOB || bytes != dim * 4)
    return fail(Errc::format_error, file_ + ": the vector of " + path + " has " + std::to_string(bytes) +
                                        " bytes, not " + std::to_string(dim * 4));
  std::vector<float> v(dim);
  le_to_floats(sqlite3_column_blob(st.get(), 0), dim, v.data());
  return v;
}

}  // namespace tandem::client
