#include "weights/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "core/sha256.h"
#include "weights/json_util.h"

namespace tandem::weights {

using detail::Json;

namespace {

constexpr std::uint64_t kMaxHeaderBytes = 100ull * 1024 * 1024;

struct DTypeSpelling {
  DType dtype;
  std::string_view name;
  std::size_t size;
};

constexpr DTypeSpelling kDTypes[] = {
    {DType::f64, "F64", 8}, {DType::f32, "F32", 4},      {DType::f16, "F16", 2}, {DType::bf16, "BF16", 2},
    {DType::i64, "I64", 8}, {DType::i32, "I32", 4},      {DType::i16, "I16", 2}, {DType::i8, "I8", 1},
    {DType::u8, "U8", 1},   {DType::boolean, "BOOL", 1},
};

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::uint64_t read_le64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
  return v;
}

}  // namespace

std::string_view dtype_name(DType d) {
  for (const auto& s : kDTypes) {
    if (s.dtype == d) return s.name;
  }
  return "?";
}

std::size_t dtype_size(DType d) {
  for (const auto& s : kDTypes) {
    if (s.dtype == d) return s.size;
  }
  return 0;
}

Result<DType> parse_dtype(std::string_view s) {
  for (const auto& d : kDTypes) {
    if (d.name == s) return d.dtype;
  }
  return fail(Errc::unsupported, "unknown dtype " + detail::printable(s));
}

// --- MappedFile ---------------------------------------------------------------------------------------------------

Result<MappedFile> MappedFile::open(const std::string& path) {
  // O_NONBLOCK: a FIFO planted in place of a shard must not hang the daemon; regular files ignore the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return fail(Errc::not_found, path + ": file not found");
    return fail(Errc::io_error, path + ": cannot open: " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return fail(Errc::io_error, path + ": fstat failed: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(Errc::io_error, path + ": not a regular file");
  }
  MappedFile f;
  f.path_ = path;
  f.size_ = static_cast<std::size_t>(st.st_size);
  if (f.size_ > 0) {  // mmap of length 0 is EINVAL; an empty file maps to (nullptr, 0)
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return fail(Errc::io_error, path + ": mmap failed: " + std::strerror(err));
    }
    f.data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
  return f;
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

std::string sampled_content_digest(const std::vector<const MappedFile*>& files) {
  Sha256 h;
  constexpr std::size_t kWindow = 4096, kWindows = 64;
  for (const MappedFile* f : files) {
    const std::byte* p = f->data();
    const std::size_t n = f->size();
    for (std::size_t i = 0; i < kWindows; ++i) {
      const std::size_t off = n > kWindow ? (n - kWindow) / kWindows * i : 0;
      h.update(std::span(p + off, std::min(kWindow, n - off)));
    }
    if (n > kWindow) h.update(std::span(p + n - kWindow, kWindow));
  }
  return Sha256::hex(h.finish());
}

std::size_t MappedFile::prefault() const {
  if (data_ == nullptr || size_ == 0) return 0;
  const long page_l = ::sysconf(_SC_PAGESIZE);
  const std::size_t page = page_l > 0 ? static_cast<std::size_t>(page_l) : 4096;
  const volatile std::byte* p = data_;
  std::byte sink{0};
  for (std::size_t off = 0; off < size_; off += page) sink ^= p[off];
  sink ^= p[size_ - 1];
  (void)sink;
  return size_;
}

void MappedFile::advise_willneed() const {
  if (data_ != nullptr && size_ > 0) ::madvise(const_cast<std::byte*>(data_), size_, MADV_WILLNEED);
}

// --- SafetensorsFile ----------------------------------------------------------------------------------------------

std::uint64_t TensorInfo::numel() const {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

namespace {

// Validates one tensor entry of the header. `where` is "<path>: tensor '<name>'".
Status parse_entry(const std::string& where, const Json& v, std::uint64_t data_size, TensorInfo& t) {
  if (!v.is_object()) {
    return fail(Errc::format_error, where + ": entry must be an object, got " + std::string(detail::json_kind(v)));
  }
  const auto dt = v.find("dtype");
  const auto sh = v.find("shape");
  const auto off = v.find("data_offsets");
  if (dt == v.end()) return fail(Errc::format_error, where + ": missing \"dtype\"");
  if (sh == v.end()) return fail(Errc::format_error, where + ": missing \"shape\"");
  if (off == v.end()) return fail(Errc::format_error, where + ": missing \"data_offsets\"");

  if (!dt->is_string()) {
    return fail(Errc::format_error, where + ": \"dtype\" must be a string, got " + std::string(detail::json_kind(*dt)));
  }
  auto dtype = parse_dtype(dt->get_ref<const std::string&>());
  if (!dtype) return fail(Errc::unsupported, where + ": " + dtype.error().message);
  t.dtype = *dtype;

  if (!sh->is_array()) {
    return fail(Errc::format_error, where + ": \"shape\" must be an array, got " + std::string(detail::json_kind(*sh)));
  }
  std::uint64_t numel = 1;
  bool overflow = false;
  t.shape.clear();
  t.shape.reserve(sh->size());
  for (const auto& d : *sh) {
    if (d.is_number_integer() && !d.is_number_unsigned() && d.get<std::int64_t>() < 0) {
      return fail(Errc::format_error,
                  where + ": negative dimension " + std::to_string(d.get<std::int64_t>()) + " in shape");
    }
    const auto dim = detail::json_int(d);
    if (!dim) {
      return fail(Errc::format_error, where + ": shape dimensions must be non-negative integers below 2^63, got " +
                                          std::string(detail::json_kind(d)) +
                                          (d.is_number() ? " " + d.dump() : std::string()));
    }
    t.shape.push_back(*dim);
    overflow = overflow || __builtin_mul_overflow(numel, static_cast<std::uint64_t>(*dim), &numel);
  }
  std::uint64_t nbytes = 0;
  overflow = overflow || __builtin_mul_overflow(numel, static_cast<std::uint64_t>(dtype_size(t.dtype)), &nbytes);
  // A zero dimension makes the product 0 whatever the rest overflowed to; recompute that case exactly.
  if (std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end()) {
    overflow = false;
    nbytes = 0;
  }
  if (overflow) return fail(Errc::format_error, where + ": shape " + shape_str(t.shape) + " overflows 64 bits");

  if (!off->is_array() || off->size() != 2) {
    return fail(Errc::format_error, where + ": \"data_offsets\" must be an array [begin, end]");
  }
  const auto b = detail::json_int((*off)[0]);
  const auto e = detail::json_int((*off)[1]);
  if (!b || !e || *b < 0 || *e < 0) {
    auto show = [](const Json& x) { return x.is_number() ? x.dump() : std::string(detail::json_kind(x)); };
    return fail(Errc::format_error, where + ": \"data_offsets\" must be two non-negative integers, got [" +
                                        show((*off)[0]) + ", " + show((*off)[1]) + "]");
  }
  t.begin = static_cast<std::uint64_t>(*b);
  t.end = static_cast<std::uint64_t>(*e);
  if (t.begin > t.end) {
    return fail(Errc::format_error,
                where + ": data_offsets begin " + std::to_string(t.begin) + " > end " + std::to_string(t.end));
  }
  if (t.end > data_size) {
    return fail(Errc::format_error, where + ": data_offsets end " + std::to_string(t.end) +
                                        " is past the end of the data section (" + std::to_string(data_size) +
                                        " bytes)");
  }
  if (nbytes != t.end - t.begin) {
    return fail(Errc::format_error, where + ": shape " + shape_str(t.shape) + " × " +
                                        std::to_string(dtype_size(t.dtype)) + " bytes (" +
                                        std::string(dtype_name(t.dtype)) + ") = " + std::to_string(nbytes) +
                                        " bytes, but data_offsets span " + std::to_string(t.end - t.begin));
  }
  return {};
}

}  // namespace

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto mf = MappedFile::open(path);
  if (!mf) return fail(std::move(mf).error());
  SafetensorsFile f(std::move(*mf));
  const std::uint64_t size = f.file_.size();
  if (size < 8) {
    return fail(Errc::format_error,
                path + ": file is " + std::to_string(size) + " bytes, too small for the 8-byte header length");
  }
  const std::uint64_t n = read_le64(f.file_.data());
  if (n > kMaxHeaderBytes) {
    return fail(Errc::format_error, path + ": header length " + std::to_string(n) + " exceeds the limit of " +
                                        std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (n > size - 8) {
    return fail(Errc::format_error, path + ": header length " + std::to_string(n) + " runs past the end of the " +
                                        std::to_string(size) + "-byte file");
  }
  if (n < 2) return fail(Errc::format_error, path + ": header length " + std::to_string(n) + " is too short");
  f.header_len_ = n;
  const std::uint64_t data_size = size - 8 - n;

  std::string dup;
  const std::string_view text(reinterpret_cast<const char*>(f.file_.data()) + 8, n);
  auto parsed = detail::parse_json(text, path + ": header", &dup);
  if (!parsed) return fail(std::move(parsed).error());
  const Json& h = *parsed;
  if (!h.is_object()) {
    return fail(Errc::format_error, path + ": header must be a JSON object, got " + std::string(detail::json_kind(h)));
  }
  if (!dup.empty())
    return fail(Errc::format_error, path + ": tensor " + detail::printable(dup) + " appears twice in the header");

  f.tensors_.reserve(h.size());
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) {
        return fail(Errc::format_error, path + ": \"__metadata__\" must be an object of strings, got " +
                                            std::string(detail::json_kind(*it)));
      }
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return fail(Errc::format_error, path + ": \"__metadata__\" value for " + detail::printable(m.key()) +
                                              " must be a string, got " + std::string(detail::json_kind(*m)));
        }
        f.metadata_.emplace(m.key(), m->get<std::string>());
      }
      continue;
    }
    if (name.empty()) return fail(Errc::format_error, path + ": tensor with an empty name");
    TensorInfo t;
    t.name = name;
    TANDEM_TRY(parse_entry(path + ": tensor " + detail::printable(name), *it, data_size, t));
    f.tensors_.push_back(std::move(t));
  }

  // Overlap check: sort by range; empty tensors occupy no bytes and cannot overlap.
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(f.tensors_.size());
  for (const auto& t : f.tensors_) {
    if (t.begin != t.end) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    const TensorInfo& cur = *by_offset[i];
    if (cur.begin < prev.end) {
      return fail(Errc::format_error, path + ": tensor " + detail::printable(cur.name) + " bytes [" +
                                          std::to_string(cur.begin) + ", " + std::to_string(cur.end) +
                                          ") overlap tensor " + detail::printable(prev.name) + " bytes [" +
                                          std::to_string(prev.begin) + ", " + std::to_string(prev.end) + ")");
    }
  }
  std::sort(f.tensors_.begin(), f.tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  return f;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, const std::string& n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

std::span<const std::byte> SafetensorsFile::bytes(const TensorInfo& t) const {
  if (t.begin == t.end) return {};
  return {file_.data() + 8 + header_len_ + t.begin, static_cast<std::size_t>(t.end - t.begin)};
}

std::span<const std::byte> SafetensorsFile::header_bytes() const {
  return {file_.data() + 8, static_cast<std::size_t>(header_len_)};
}

// --- writer -------------------------------------------------------------------------------------------------------

Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  Json h = Json::object();
  if (!metadata.empty()) {
    Json m = Json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") {
      return fail(Errc::invalid_argument, path + ": invalid tensor name " + detail::printable(t.name));
    }
    if (h.contains(t.name))
      return fail(Errc::invalid_argument, path + ": tensor " + detail::printable(t.name) + " given twice");
    std::uint64_t numel = 1;
    for (auto d : t.shape) {
      if (d < 0)
        return fail(Errc::invalid_argument, path + ": tensor " + detail::printable(t.name) + ": negative dimension");
      numel *= static_cast<std::uint64_t>(d);
    }
    if (numel * dtype_size(t.dtype) != t.data.size()) {
      return fail(Errc::invalid_argument,
                  path + ": tensor " + detail::printable(t.name) + ": shape " + shape_str(t.shape) + " needs " +
                      std::to_string(numel * dtype_size(t.dtype)) + " bytes, got " + std::to_string(t.data.size()));
    }
    h[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                 {"shape", t.shape},
                 {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');

  std::FILE* fp = std::fopen(path.c_str(), "wb");
  if (fp == nullptr) return fail(Errc::io_error, path + ": cannot create: " + std::strerror(errno));
  std::uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(header.size()) >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, fp) == 8 && std::fwrite(header.data(), 1, header.size(), fp) == header.size();
  for (const auto& t : tensors) {
    if (!ok) break;
    if (!t.data.empty()) ok = std::fwrite(t.data.data(), 1, t.data.size(), fp) == t.data.size();
  }
  const int err = errno;
  if (std::fclose(fp) != 0) ok = false;
  if (!ok) return fail(Errc::io_error, path + ": write failed: " + std::strerror(err));
  return {};
}

}  // namespace tandem::weights
