// GGUF (llama.cpp's model file format, versions 2 and 3) over mmap: a reader that treats the file as untrusted input
// and a writer that produces files llama.cpp reads. Tensor data is a zero-copy view into the mapping.
//
// Layout (all integers little-endian): "GGUF", u32 version, u64 tensor count, u64 metadata count, the metadata
// (key string, u32 value type, value), the tensor infos (name string, u32 n_dims, n_dims × u64 ne, u32 ggml type,
// u64 offset), padding to `general.alignment` (default 32), the data section. A string is u64 length + bytes.
// Every length, count, offset and size is checked against the file size with overflow-safe arithmetic; a file either
// opens completely valid or fails with a typed error naming the file, the key or tensor and what was wrong
// (docs/model-format.md, "GGUF").
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "kernels/types.h"
#include "weights/safetensors.h"

namespace tandem::weights {

// gguf_type: the metadata value types.
enum class GgufType : std::uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};
std::string_view gguf_type_name(GgufType t);  // "u8", ..., "array"; "?" for values outside the enum
// Bytes of one scalar value of type t in the file (0 for string and array).
std::size_t gguf_scalar_size(GgufType t);

// One metadata value. Scalars are in `u` (u8..u64, bool as 0/1), `i` (i8..i64) or `f` (f32, f64); strings in `str`.
// Arrays keep their element type and count; numbers and bools as the file's little-endian bytes in `raw` (read
// them with int_at / float_at), strings in `strings`, nested arrays in `arrays`.
struct GgufValue {
  GgufType type = GgufType::u32;
  std::uint64_t u = 0;
  std::int64_t i = 0;
  double f = 0.0;
  std::string str;
  GgufType elem_type = GgufType::u8;  // arrays only
  std::uint64_t count = 0;            // arrays only: number of elements
  std::string raw;                    // arrays of numbers / bools: count × gguf_scalar_size(elem_type) bytes
  std::vector<std::string> strings;   // arrays of strings
  std::vector<GgufValue> arrays;      // arrays of arrays

  // Builders (the writer's input; also what the reader produces).
  static GgufValue of_uint(GgufType t, std::uint64_t v);  // t: u8, u16, u32, u64 (v truncated to the type)
  static GgufValue of_int(GgufType t, std::int64_t v);    // t: i8, i16, i32, i64
  static GgufValue of_float(GgufType t, double v);        // t: f32, f64
  static GgufValue of_bool(bool v);
  static GgufValue of_string(std::string v);
  // An array of scalars of `elem` (numbers or bool) from the values' u / i / f fields, of strings, or of arrays.
  static GgufValue of_array(GgufType elem, const std::vector<GgufValue>& items);
  static GgufValue of_strings(std::vector<std::string> items);
  static GgufValue of_f32s(std::span<const float> items);
  static GgufValue of_i32s(std::span<const std::int32_t> items);

  bool is_integer() const;  // u8..u64, i8..i64 scalar
  // The scalar as an integer / number if it is one that fits (integers of any width; floats for as_f64 only).
  std::optional<std::uint64_t> as_u64() const;
  std::optional<std::int64_t> as_i64() const;
  std::optional<double> as_f64() const;  // f32, f64 or any integer
  // Element `k` of an array of numbers or bools (k < count): integers and bools as int64 (u64 above INT64_MAX:
  // nullopt), floats as double. nullopt for the other kind or an out-of-range k.
  std::optional<std::int64_t> int_at(std::uint64_t k) const;
  std::optional<double> float_at(std::uint64_t k) const;
};

// Every ggml tensor type id we know the block layout of (including the ones Tandem does not compute with, so their
// sizes are still validated). block_elems 0: not a ggml type we know.
struct GgmlTypeInfo {
  std::string_view name;  // ggml's spelling: "f32", "q4_K", "iq2_xxs", ...
  int block_elems = 0;
  std::size_t block_bytes = 0;
};
GgmlTypeInfo ggml_type_info(std::uint32_t ggml_type);
std::string ggml_type_label(std::uint32_t ggml_type);  // the name, or "ggml type N" when unknown

struct GgufTensorInfo {
  std::string name;
  std::vector<std::uint64_t> ne;  // GGUF order: ne[0] is the row length (contiguous), 1 <= ne.size() <= 4
  std::uint32_t ggml_type = 0;
  std::uint64_t offset = 0;  // relative to the data section; a multiple of the alignment
  std::uint64_t nbytes = 0;  // row_bytes(type, ne[0]) × rows; 0 when the type is unknown (see below)
  // The Tandem weight type; nullopt for a ggml type Tandem does not compute with (tensor_data() is then
  // `unsupported`). A ggml type with a known block layout is size-checked like any other; for an unknown id the
  // size cannot be known: only the offset is checked and nbytes is 0.
  std::optional<kernels::WType> wtype;
  bool size_known = true;

  std::uint64_t rows() const;                  // product of ne[1..]
  std::vector<std::int64_t> hf_shape() const;  // ne reversed (row-major, outermost first), as Hugging Face orders it
};

class GgufFile {
 public:
  // Maps `path` read-only and validates it (limits in docs/model-format.md). Errors: not_found, io_error (open /
  // mmap), format_error (anything malformed, named), unsupported (GGUF version 1 or > 3).
  static Result<GgufFile> open(const std::string& path);
  // The same over an in-memory copy of `bytes` (tests, the fuzz target); `origin` names it in messages.
  static Result<GgufFile> parse(std::span<const std::byte> bytes, std::string origin);

  GgufFile(GgufFile&&) noexcept = default;
  GgufFile& operator=(GgufFile&&) noexcept = default;

  const std::string& path() const { return origin_; }
  std::uint32_t version() const { return version_; }
  std::uint64_t alignment() const { return alignment_; }
  std::uint64_t data_offset() const { return data_offset_; }  // absolute offset of the data section
  std::uint64_t file_size() const { return bytes().size(); }

  // Metadata in file order; keys are unique.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;

  // Tensor infos in file order; names are unique.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  // Zero-copy view of a tensor's bytes. unsupported (naming the file, tensor and ggml type) for a type Tandem does
  // not compute with.
  Result<std::span<const std::byte>> tensor_data(const GgufTensorInfo& t) const;
  // The same without the type check (raw bytes of a size-known tensor; empty when the size is unknown).
  std::span<const std::byte> raw_tensor_bytes(const GgufTensorInfo& t) const;

  // The bytes before the data section: magic, counts, metadata, tensor infos (for identities).
  std::span<const std::byte> header_bytes() const;
  // The mapping (empty path-less MappedFile for parse()d files: use bytes()).
  const MappedFile* mapped_file() const { return file_ ? &*file_ : nullptr; }
  std::span<const std::byte> bytes() const;

 private:
  GgufFile() = default;
  Status parse_all();

  std::string origin_;
  std::optional<MappedFile> file_;
  std::vector<std::byte> owned_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t header_end_ = 0;   // end of the tensor infos
  std::uint64_t data_offset_ = 0;  // header_end_ rounded up to the alignment
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::vector<std::uint32_t> tensor_order_;  // indices of tensors_ sorted by name (lookup)
  std::vector<std::uint32_t> key_order_;     // indices of metadata_ sorted by key
};

// Writes GGUF files (version 3 by default, little-endian). Metadata and tensors appear in the order they were added,
// so equal input gives byte-identical output. An alignment other than 32 is also written as `general.alignment`
// (u32) unless the caller set that key. Tensor data is padded with zeros to the alignment.
class GgufWriter {
 public:
  explicit GgufWriter(std::uint32_t alignment = 32, std::uint32_t version = 3);

  // Adds or replaces a key (a replaced key keeps its first position).
  void set(std::string key, GgufValue value);
  // Removes a key; false if it was not set.
  bool erase(std::string_view key);
  // A tensor of `ggml_type` with GGUF dims `ne` (ne[0] = row length). For a ggml type with a known block layout,
  // data must be exactly row_bytes × rows (invalid_argument otherwise); for an unknown id any size is written.
  Status add_tensor(std::string name, std::uint32_t ggml_type, std::vector<std::uint64_t> ne,
                    std::span<const std::byte> data);
  // The same with a Tandem type and a shape in Hugging Face order (outermost first); the dims are reversed.
  Status add_tensor(std::string name, kernels::WType type, const std::vector<std::int64_t>& hf_shape,
                    std::span<const std::byte> data);

  // The whole file. invalid_argument for a bad alignment (not a power of two), duplicate or empty names, more than
  // 4 dims.
  Result<std::string> serialize() const;
  Status write(const std::string& path) const;  // io_error on failure; writes path.tmp and renames

 private:
  struct Tensor {
    std::string name;
    std::uint32_t ggml_type;
    std::vector<std::uint64_t> ne;
    std::vector<std::byte> data;
  };
  std::uint32_t alignment_;
  std::uint32_t version_;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<Tensor> tensors_;
};

// llama.cpp's convert_hf_to_gguf permutes the rows of q_proj / k_proj per head so that ggml's interleaved RoPE
// (rotating adjacent pairs) computes what Hugging Face's half-split RoPE computes: within each head of `head_dim`
// rows, GGUF row 2j + s is HF row s × head_dim/2 + j (s in {0, 1}, j < head_dim/2). Rows are independent byte ranges
// of `row_bytes` bytes, so this works for any weight type. `n_heads` is the number of heads of this matrix (the KV
// heads for k_proj). invalid_argument if the sizes do not match (rows = n_heads × head_dim, head_dim even).
Status permute_qk_rows_for_gguf(std::span<const std::byte> hf, std::span<std::byte> gguf, int n_heads,
                                std::size_t row_bytes);
// The inverse (GGUF → Hugging Face order).
Status unpermute_qk_rows_from_gguf(std::span<const std::byte> gguf, std::span<std::byte> hf, int n_heads,
                                   std::size_t row_bytes);

}  // namespace tandem::weights
