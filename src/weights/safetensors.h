// safetensors over mmap: the header is untrusted input. Every violation is a typed error naming the file and the
// tensor; a file either opens completely valid or not at all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"

namespace tandem::weights {

enum class DType : std::uint8_t { f64, f32, f16, bf16, i64, i32, i16, i8, u8, boolean };

std::string_view dtype_name(DType d);          // safetensors spelling: "F32", "BF16", ...
std::size_t dtype_size(DType d);
Result<DType> parse_dtype(std::string_view s);  // unsupported for unknown spellings

// A read-only private mapping of a whole file. Non-copyable, movable.
class MappedFile {
 public:
  static Result<MappedFile> open(const std::string& path);
  MappedFile(MappedFile&&) noexcept;
  MappedFile& operator=(MappedFile&&) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Touch every page (MAP_POPULATE-like) so later reads do not fault; returns bytes touched.
  std::size_t prefault() const;
  // madvise(MADV_WILLNEED) over the whole range.
  void advise_willneed() const;

 private:
  MappedFile() = default;
  std::string path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// Content identity without reading every byte: SHA-256 (hex) over 64 evenly spaced 4 KiB windows of each file, plus
// its last 4 KiB. With a header digest this tells apart checkpoints of the same shape (a fine-tune changes all
// weights); a change confined to unsampled bytes goes unseen. For fingerprints (engine/model.cc, engine/clip.cc).
std::string sampled_content_digest(const std::vector<const MappedFile*>& files);

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // byte offset relative to the start of the data section
  std::uint64_t end = 0;
  std::uint64_t numel() const;
  std::uint64_t nbytes() const { return end - begin; }
};

class SafetensorsFile {
 public:
  // Limits: header length <= 100 MiB and inside the file; valid JSON object; each entry has a known dtype, a
  // shape of non-negative dims whose product × element size equals end − begin, 0 <= begin <= end <= data size;
  // ranges do not overlap. "__metadata__" must map strings to strings.
  static Result<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::span<const std::byte> bytes(const TensorInfo& t) const;  // zero-copy view into the mapping
  std::span<const std::byte> header_bytes() const;                // the raw JSON header (for identities)
  const MappedFile& file() const { return file_; }

 private:
  explicit SafetensorsFile(MappedFile f) : file_(std::move(f)) {}
  MappedFile file_;
  std::uint64_t header_len_ = 0;
  std::vector<TensorInfo> tensors_;  // sorted by name
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> data;  // must be numel × dtype_size bytes
};

// Writes a valid safetensors file (header padded to 8 bytes, tensors in the given order). Used by the model tool
// and by tests that build malformed variants on purpose.
Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace tandem::weights
