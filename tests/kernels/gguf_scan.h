// Test-only GGUF (v2/v3) tensor-table scanner: just enough to find each tensor's name, shape, ggml type and bytes
// in a file, so the quantizer tests need not wait for the real reader (src/weights). Bounds-checked, but meant for
// trusted test files; errors come back as a message, not an exception.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace tandem::kernels::test {

struct GgufTensor {
  std::string name;
  std::vector<std::uint64_t> dims;  // ggml order: dims[0] is the row length
  std::uint32_t ggml_type = 0;
  std::uint64_t offset = 0;  // relative to the data section
};

struct GgufFile {
  std::vector<std::uint8_t> bytes;
  std::uint32_t version = 0;
  std::uint64_t alignment = 32;
  std::uint64_t data_start = 0;
  std::vector<GgufTensor> tensors;
  std::string error;  // non-empty: the scan failed here

  const GgufTensor* find(const std::string& name) const {
    for (const GgufTensor& t : tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }
  // The tensor's bytes from its offset; `size` bytes must fit in the file (nullptr otherwise).
  const std::uint8_t* data(const GgufTensor& t, std::uint64_t size) const {
    if (t.offset > bytes.size() || data_start > bytes.size() - t.offset) return nullptr;
    const std::uint64_t at = data_start + t.offset;
    if (size > bytes.size() - at) return nullptr;
    return bytes.data() + at;
  }
};

namespace gguf_detail {

class Cursor {
 public:
  explicit Cursor(const std::vector<std::uint8_t>& b) : b_(b) {}
  bool ok() const { return ok_; }
  std::uint64_t pos() const { return pos_; }

  template <typename T>
  T read() {
    T v{};
    if (!ok_ || sizeof(T) > b_.size() - pos_) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, b_.data() + pos_, sizeof(T));  // GGUF is little-endian, as is every machine we test on
    pos_ += sizeof(T);
    return v;
  }
  void skip(std::uint64_t n) {
    if (!ok_ || n > b_.size() - pos_) {
      ok_ = false;
      return;
    }
    pos_ += n;
  }
  std::string string() {
    const auto len = read<std::uint64_t>();
    if (!ok_ || len > b_.size() - pos_) {
      ok_ = false;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), len);
    pos_ += len;
    return s;
  }

 private:
  const std::vector<std::uint8_t>& b_;
  std::uint64_t pos_ = 0;
  bool ok_ = true;
};

// GGUF metadata value types.
enum : std::uint32_t {
  kU8 = 0, kI8, kU16, kI16, kU32, kI32, kF32, kBool, kString, kArray, kU64, kI64, kF64,
};

inline std::uint64_t scalar_size(std::uint32_t type) {
  switch (type) {
    case kU8: case kI8: case kBool: return 1;
    case kU16: case kI16: return 2;
    case kU32: case kI32: case kF32: return 4;
    case kU64: case kI64: case kF64: return 8;
    default: return 0;
  }
}

// Skips one value of `type`; returns false on an unknown type or a truncated file.
inline bool skip_value(Cursor& c, std::uint32_t type, int depth = 0) {
  if (type == kString) {
    c.string();
    return c.ok();
  }
  if (type == kArray) {
    if (depth > 4) return false;
    const auto elem = c.read<std::uint32_t>();
    const auto count = c.read<std::uint64_t>();
    if (!c.ok()) return false;
    const std::uint64_t size = scalar_size(elem);
    if (size != 0) {
      if (count > UINT64_MAX / size) return false;
      c.skip(count * size);
      return c.ok();
    }
    for (std::uint64_t i = 0; i < count; ++i) {
      if (!skip_value(c, elem, depth + 1)) return false;
    }
    return true;
  }
  const std::uint64_t size = scalar_size(type);
  if (size == 0) return false;
  c.skip(size);
  return c.ok();
}

}  // namespace gguf_detail

inline GgufFile scan_gguf(const std::string& path) {
  using namespace gguf_detail;
  GgufFile f;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    f.error = path + ": cannot open";
    return f;
  }
  f.bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  Cursor c(f.bytes);
  const auto magic = c.read<std::uint32_t>();
  f.version = c.read<std::uint32_t>();
  const auto n_tensors = c.read<std::uint64_t>();
  const auto n_kv = c.read<std::uint64_t>();
  if (!c.ok() || magic != 0x46554747u /* "GGUF" */ || (f.version != 2 && f.version != 3)) {
    f.error = path + ": not a GGUF v2/v3 file";
    return f;
  }
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = c.string();
    const auto type = c.read<std::uint32_t>();
    if (!c.ok()) break;
    if (key == "general.alignment" && type == kU32) {
      f.alignment = c.read<std::uint32_t>();
      if (f.alignment == 0 || (f.alignment & (f.alignment - 1)) != 0) {
        f.error = path + ": general.alignment is not a power of two";
        return f;
      }
    } else if (!skip_value(c, type)) {
      f.error = path + ": bad metadata value for key '" + key + "'";
      return f;
    }
  }
  for (std::uint64_t i = 0; i < n_tensors && c.ok(); ++i) {
    GgufTensor t;
    t.name = c.string();
    const auto n_dims = c.read<std::uint32_t>();
    if (n_dims > 4) {
      f.error = path + ": tensor '" + t.name + "' has more than 4 dimensions";
      return f;
    }
    for (std::uint32_t d = 0; d < n_dims; ++d) t.dims.push_back(c.read<std::uint64_t>());
    t.ggml_type = c.read<std::uint32_t>();
    t.offset = c.read<std::uint64_t>();
    f.tensors.push_back(std::move(t));
  }
  if (!c.ok()) {
    f.error = path + ": truncated header";
    return f;
  }
  f.data_start = (c.pos() + f.alignment - 1) / f.alignment * f.alignment;
  if (f.data_start > f.bytes.size()) f.error = path + ": no data section";
  return f;
}

}  // namespace tandem::kernels::test
