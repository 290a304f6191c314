// The image index of `tandemctl index` / `tandemctl search` (docs/image-search.md): one SQLite file that maps image
// files to their embedding vectors, updated incrementally (path + mtime + size), and a brute-force cosine search.
// No D-Bus, no LibTorch: the vectors come from the caller (tandemctl gets them from tandemd's Embed).
//
// The file ($XDG_CACHE_HOME/tandem/image-index.sqlite3 by default):
//   meta    (key TEXT PRIMARY KEY, value TEXT): schema "1", model, fingerprint (the model's), dim
//   images  (path TEXT PRIMARY KEY, mtime_ns INTEGER, size INTEGER, vector BLOB, indexed_unix_ms INTEGER)
//           vector: dim float32, little-endian, unit norm (the daemon's vectors are L2-normalised)
//   errors  (path TEXT PRIMARY KEY, mtime_ns INTEGER, size INTEGER, message TEXT): files the daemon could not
//           embed (not an image, over the limits), not retried until their mtime or size changes
// A path is in at most one of images and errors. Paths are absolute (the root made absolute, no symlinks followed).
//
// Errors are typed: a file that is not an index (not SQLite, another schema, corrupt) -> Errc::format_error, an index
// of another schema version, model fingerprint or dim -> Errc::incompatible; both name the file. OpenOptions::rebuild
// deletes and recreates such a file. A stored vector of the wrong length is Errc::format_error, never read past.
//
// Threading: an ImageIndex is used from one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

struct sqlite3;

namespace tandem::client {

inline constexpr int kImageIndexSchema = 1;

// The model the vectors come from; an index holds vectors of exactly one.
struct IndexIdentity {
  std::string model;
  std::string fingerprint;  // the model's fingerprint (ListModels); "" if the daemon gives none
  std::uint32_t dim = 0;
  friend bool operator==(const IndexIdentity&, const IndexIdentity&) = default;
};

struct OpenOptions {
  bool create = true;    // a missing file is created (with its directory); false: Errc::not_found
  bool rebuild = false;  // delete the file first (also one that is corrupt, of another schema or model)
};

// One file found by a scan, or one row of the index.
struct FileStamp {
  std::string path;
  std::int64_t mtime_ns = 0;
  std::uint64_t size = 0;
  friend bool operator==(const FileStamp&, const FileStamp&) = default;
};

struct ScanProblem {
  std::string path;
  std::string message;  // e.g. "cannot open directory: Permission denied"
};

// plan_update(root): the scan diffed against the index's rows under root.
struct UpdatePlan {
  std::string root;                 // absolute
  std::vector<FileStamp> added;     // on disk, not in the index
  std::vector<FileStamp> changed;   // in the index (images or errors) with another mtime or size
  std::uint64_t unchanged = 0;      // indexed, same mtime and size
  std::uint64_t known_failures = 0;  // in errors with the same mtime and size: not retried
  std::vector<std::string> removed;  // in the index under root, no longer a matching file on disk
  std::vector<ScanProblem> problems;  // unreadable directories, files that could not be stat'ed (not fatal)
  std::uint64_t skipped_symlinks = 0;
  std::vector<FileStamp> to_embed() const;  // added + changed, sorted by path
};

// What apply() writes for one file: a vector, or the error that made the daemon refuse it.
struct IndexUpdate {
  FileStamp file;
  std::vector<float> vector;  // dim values (when error is empty)
  std::string error;          // non-empty: remembered in errors, the file's vector (if any) dropped
};

struct SearchHit {
  std::string path;
  float score = 0;  // cosine similarity (dot product of unit vectors)
};

struct IndexCounts {
  std::uint64_t images = 0, errors = 0;
};

// The default file: $XDG_CACHE_HOME/tandem/image-index.sqlite3, XDG_CACHE_HOME defaulting to $HOME/.cache (and the
// passwd entry's home without HOME). Errc::not_found when no home can be found.
Result<std::string> default_index_path();

// True for a name ending in .jpg, .jpeg or .png (any case).
bool is_image_name(std::string_view name);

// Reads the identity stored in an index file without checking it against a model (errors as ImageIndex::open).
Result<IndexIdentity> read_index_identity(const std::string& file);

class ImageIndex {
 public:
  // Opens (or creates) `file` for `identity` (dim > 0). See the header comment for the errors.
  static Result<std::unique_ptr<ImageIndex>> open(const std::string& file, const IndexIdentity& identity,
                                                  const OpenOptions& options = {});
  ~ImageIndex();
  ImageIndex(const ImageIndex&) = delete;
  ImageIndex& operator=(const ImageIndex&) = delete;

  const std::string& file() const { return file_; }
  const IndexIdentity& identity() const { return identity_; }

  // Scans root (a directory) recursively: regular files named *.jpg|*.jpeg|*.png, symlinks never followed, and
  // diffs them against the index. Errc::not_found / invalid_argument when root is missing / not a directory.
  Result<UpdatePlan> plan_update(const std::string& root);

  // Writes a batch in one transaction (all or nothing). A vector of the wrong length or with a non-finite value, or
  // an empty path, is Errc::invalid_argument and nothing is written.
  Result<void> apply(const std::vector<IndexUpdate>& batch);
  // Deletes these paths from images and errors, in one transaction.
  Result<void> remove(const std::vector<std::string>& paths);
  // Deletes every row whose file is gone or no longer a regular file (lstat); returns how many.
  Result<std::uint64_t> remove_missing();

  // The n best matches for a query of dim values (normalised here if it is not unit norm), best first; ties by path.
  // The vectors are loaded into memory on the first search after a change (load_vectors()).
  Result<std::vector<SearchHit>> search(const std::vector<float>& query, std::size_t n);
  // Loads (or reloads) every vector into memory; a blob of the wrong length is Errc::format_error naming the path.
  Result<void> load_vectors();

  Result<IndexCounts> counts();
  // The stored vector of one path (tests, search by an indexed image); not_found when it has none.
  Result<std::vector<float>> vector_of(const std::string& path);

 private:
  ImageIndex() = default;
  Result<void> exec(const char* sql);
  Error sql_error(const std::string& what) const;

  std::string file_;
  IndexIdentity identity_;
  sqlite3* db_ = nullptr;
  bool loaded_ = false;
  std::vector<std::string> paths_;  // loaded vectors: row i is paths_[i], matrix_[i*dim, (i+1)*dim)
  std::vector<float> matrix_;
};

// The scoring loop (exposed for the benchmark): scores[i] = dot(matrix row i, query), rows of dim floats.
void dot_rows(const float* matrix, std::size_t rows, std::size_t dim, const float* query, float* scores);

}  // namespace tandem::client
