// The GGUF writer (weights/gguf.h): metadata and tensors in the order they were added, aligned, deterministic.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "weights/gguf.h"
#include "weights/gguf_internal.h"
#include "weights/json_util.h"

namespace tandem::weights {

using namespace gguf_detail;

// --- writer -------------------------------------------------------------------------------------------------------

GgufWriter::GgufWriter(std::uint32_t alignment, std::uint32_t version) : alignment_(alignment), version_(version) {}

void GgufWriter::set(std::string key, GgufValue value) {
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::move(key), std::move(value));
}

bool GgufWriter::erase(std::string_view key) {
  const auto it = std::find_if(metadata_.begin(), metadata_.end(), [&](const auto& kv) { return kv.first == key; });
  if (it == metadata_.end()) return false;
  metadata_.erase(it);
  return true;
}

Status GgufWriter::add_tensor(std::string name, std::uint32_t ggml_type, std::vector<std::uint64_t> ne,
                              std::span<const std::byte> data) {
  const std::string where = "GGUF writer: tensor " + detail::printable(name);
  if (name.empty()) return fail(Errc::invalid_argument, "GGUF writer: empty tensor name");
  if (ne.empty() || ne.size() > kMaxDims) {
    return fail(Errc::invalid_argument, where + ": " + std::to_string(ne.size()) + " dims (1 to 4 allowed)");
  }
  for (const auto& t : tensors_) {
    if (t.name == name) return fail(Errc::invalid_argument, where + " added twice");
  }
  const GgmlTypeInfo ti = ggml_type_info(ggml_type);
  if (ti.block_elems > 0) {
    std::string why;
    const auto nb = tensor_bytes(ti, ne, why);
    if (!nb) return fail(Errc::invalid_argument, where + ": " + why);
    if (*nb != data.size()) {
      return fail(Errc::invalid_argument, where + ": " + dims_str(ne) + " " + std::string(ti.name) + " needs " +
                                              std::to_string(*nb) + " bytes, got " + std::to_string(data.size()));
    }
  }
  tensors_.push_back(
      Tensor{std::move(name), ggml_type, std::move(ne), std::vector<std::byte>(data.begin(), data.end())});
  return {};
}

Status GgufWriter::add_tensor(std::string name, kernels::WType type, const std::vector<std::int64_t>& hf_shape,
                              std::span<const std::byte> data) {
  std::vector<std::uint64_t> ne;
  for (auto it = hf_shape.rbegin(); it != hf_shape.rend(); ++it) {
    if (*it < 0)
      return fail(Errc::invalid_argument, "GGUF writer: tensor " + detail::printable(name) + ": negative dim");
    ne.push_back(static_cast<std::uint64_t>(*it));
  }
  return add_tensor(std::move(name), static_cast<std::uint32_t>(kernels::traits(type).ggml_id), std::move(ne), data);
}

namespace {

void put_u(std::string& out, std::uint64_t v, int n) {
  for (int k = 0; k < n; ++k) out.push_back(static_cast<char>((v >> (8 * k)) & 0xFF));
}

void put_str(std::string& out, std::string_view s) {
  put_u(out, s.size(), 8);
  out.append(s);
}

Status put_value(std::string& out, const GgufValue& v, const std::string& key, bool with_type) {
  const auto bad = [&] {
    return fail(Errc::invalid_argument, "GGUF writer: key " + detail::printable(key) +
                                            ": inconsistent value (type, element type, count and elements disagree)");
  };
  if (with_type) put_u(out, static_cast<std::uint32_t>(v.type), 4);
  if (v.type == GgufType::string) {
    put_str(out, v.str);
    return {};
  }
  if (v.type != GgufType::array) {
    if (gguf_scalar_size(v.type) == 0) return bad();
    put_scalar(out, v.type, v);
    return {};
  }
  put_u(out, static_cast<std::uint32_t>(v.elem_type), 4);
  put_u(out, v.count, 8);
  if (v.elem_type == GgufType::string) {
    if (v.strings.size() != v.count) return bad();
    for (const auto& s : v.strings) put_str(out, s);
  } else if (v.elem_type == GgufType::array) {
    if (v.arrays.size() != v.count) return bad();
    for (const auto& a : v.arrays) {
      if (a.type != GgufType::array) return bad();
      TANDEM_TRY(put_value(out, a, key, false));
    }
  } else {
    const std::size_t sz = gguf_scalar_size(v.elem_type);
    if (sz == 0 || v.raw.size() != v.count * sz) return bad();
    out.append(v.raw);
  }
  return {};
}

}  // namespace

Result<std::string> GgufWriter::serialize() const {
  std::uint64_t alignment = alignment_;
  bool write_alignment = alignment_ != kDefaultAlignment;
  for (const auto& [k, v] : metadata_) {
    if (k.empty()) return fail(Errc::invalid_argument, "GGUF writer: empty key");
    if (k == "general.alignment") {
      if (v.type != GgufType::u32) return fail(Errc::invalid_argument, "GGUF writer: general.alignment must be a u32");
      alignment = v.u;
      write_alignment = false;
    }
  }
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return fail(Errc::invalid_argument,
                "GGUF writer: alignment " + std::to_string(alignment) + " is not a power of two");
  }
  std::string out;
  out.append("GGUF");
  put_u(out, version_, 4);
  put_u(out, tensors_.size(), 8);
  put_u(out, metadata_.size() + (write_alignment ? 1 : 0), 8);
  for (const auto& [k, v] : metadata_) {
    put_str(out, k);
    TANDEM_TRY(put_value(out, v, k, true));
  }
  if (write_alignment) {
    put_str(out, "general.alignment");
    TANDEM_TRY(put_value(out, GgufValue::of_uint(GgufType::u32, alignment), "general.alignment", true));
  }
  auto pad = [&](std::uint64_t n) { return (n + alignment - 1) / alignment * alignment; };
  std::uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_str(out, t.name);
    put_u(out, t.ne.size(), 4);
    for (auto d : t.ne) put_u(out, d, 8);
    put_u(out, t.ggml_type, 4);
    put_u(out, offset, 8);
    offset = pad(offset + t.data.size());
  }
  if (!tensors_.empty()) out.resize(pad(out.size()), '\0');
  for (const auto& t : tensors_) {
    out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
    out.resize(pad(out.size()), '\0');
  }
  return out;
}

Status GgufWriter::write(const std::string& path) const {
  auto bytes = serialize();
  if (!bytes) return fail(Errc::invalid_argument, path + ": " + bytes.error().message);
  const std::string tmp = path + ".tmp";
  std::FILE* fp = std::fopen(tmp.c_str(), "wb");
  if (fp == nullptr) return fail(Errc::io_error, tmp + ": cannot create: " + std::strerror(errno));
  bool ok = std::fwrite(bytes->data(), 1, bytes->size(), fp) == bytes->size();
  const int err = errno;
  if (std::fclose(fp) != 0) ok = false;
  if (!ok) {
    std::remove(tmp.c_str());
    return fail(Errc::io_error, tmp + ": write failed: " + std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    return fail(Errc::io_error, path + ": rename from " + tmp + " failed: " + std::strerror(e));
  }
  return {};
}

// --- Q/K row permutation ------------------------------------------------------------------------------------------

namespace {
Status permute_rows(std::span<const std::byte> in, std::span<std::byte> out, int n_heads, std::size_t row_bytes,
                    bool to_gguf) {
  const char* what = to_gguf ? "permute_qk_rows_for_gguf" : "unpermute_qk_rows_from_gguf";
  if (n_heads <= 0 || row_bytes == 0 || in.size() != out.size() || in.size() % row_bytes != 0) {
    return fail(Errc::invalid_argument, std::string(what) + ": " + std::to_string(in.size()) + " bytes in, " +
                                            std::to_string(out.size()) + " out, rows of " + std::to_string(row_bytes) +
                                            " bytes, " + std::to_string(n_heads) + " heads");
  }
  const std::size_t rows = in.size() / row_bytes;
  const auto heads = static_cast<std::size_t>(n_heads);
  if (rows % heads != 0 || (rows / heads) % 2 != 0) {
    return fail(Errc::invalid_argument, std::string(what) + ": " + std::to_string(rows) + " rows are not " +
                                            std::to_string(n_heads) + " heads of an even head_dim");
  }
  const std::size_t hd = rows / heads;
  for (std::size_t h = 0; h < heads; ++h) {
    for (std::size_t j = 0; j < hd / 2; ++j) {
      for (std::size_t s = 0; s < 2; ++s) {
        const std::size_t g = h * hd + 2 * j + s;       // GGUF row
        const std::size_t f = h * hd + s * hd / 2 + j;  // HF row
        const std::size_t src = to_gguf ? f : g;
        const std::size_t dst = to_gguf ? g : f;
        std::memcpy(out.data() + dst * row_bytes, in.data() + src * row_bytes, row_bytes);
      }
    }
  }
  return {};
}
}  // namespace

Status permute_qk_rows_for_gguf(std::span<const std::byte> hf, std::span<std::byte> gguf, int n_heads,
                                std::size_t row_bytes) {
  return permute_rows(hf, gguf, n_heads, row_bytes, true);
}

Status unpermute_qk_rows_from_gguf(std::span<const std::byte> gguf, std::span<std::byte> hf, int n_heads,
                                   std::size_t row_bytes) {
  return permute_rows(gguf, hf, n_heads, row_bytes, false);
}

}  // namespace tandem::weights
