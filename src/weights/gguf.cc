#include "weights/gguf.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "weights/gguf_internal.h"
#include "weights/json_util.h"

namespace tandem::weights {

using namespace gguf_detail;

namespace {

// Limits for untrusted files (docs/model-format.md). Strings hold chat templates (tens of KiB at most today);
// names and keys are short. Total string-array elements bound the vector<string> the reader builds (a vocabulary
// has up to ~260k tokens, BPE merges as many again); nested arrays (rare) have their own small budget.
constexpr std::uint64_t kMaxStringBytes = 1ull << 20;
constexpr std::uint64_t kMaxNameBytes = 65535;
constexpr std::uint64_t kMaxStringElements = 1ull << 22;
constexpr std::uint64_t kMaxNestedElements = 1ull << 16;
constexpr int kMaxArrayDepth = 8;
// Smallest encodings, to reject counts that cannot fit in the rest of the file before looping over them.
constexpr std::uint64_t kMinKvBytes = 8 + 1 + 4 + 1;                  // key length, 1-byte key, type, u8 value
constexpr std::uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;  // name, n_dims, one dim, type, offset

// ggml_type ids → block layout (ggml.c type_traits). Removed ids (4, 5, 31–33, 36–38) stay unknown.
struct GgmlRow {
  std::uint32_t id;
  GgmlTypeInfo info;
};
constexpr GgmlRow kGgmlTypes[] = {
    {0, {"f32", 1, 4}},         {1, {"f16", 1, 2}},         {2, {"q4_0", 32, 18}},      {3, {"q4_1", 32, 20}},
    {6, {"q5_0", 32, 22}},      {7, {"q5_1", 32, 24}},      {8, {"q8_0", 32, 34}},      {9, {"q8_1", 32, 36}},
    {10, {"q2_K", 256, 84}},    {11, {"q3_K", 256, 110}},   {12, {"q4_K", 256, 144}},   {13, {"q5_K", 256, 176}},
    {14, {"q6_K", 256, 210}},   {15, {"q8_K", 256, 292}},   {16, {"iq2_xxs", 256, 66}}, {17, {"iq2_xs", 256, 74}},
    {18, {"iq3_xxs", 256, 98}}, {19, {"iq1_s", 256, 50}},   {20, {"iq4_nl", 32, 18}},   {21, {"iq3_s", 256, 110}},
    {22, {"iq2_s", 256, 82}},   {23, {"iq4_xs", 256, 136}}, {24, {"i8", 1, 1}},         {25, {"i16", 1, 2}},
    {26, {"i32", 1, 4}},        {27, {"i64", 1, 8}},        {28, {"f64", 1, 8}},        {29, {"iq1_m", 256, 56}},
    {30, {"bf16", 1, 2}},       {34, {"tq1_0", 256, 54}},   {35, {"tq2_0", 256, 66}},   {39, {"mxfp4", 32, 17}},
};

bool is_number_type(GgufType t) { return gguf_scalar_size(t) != 0; }


std::uint64_t le(const std::byte* p, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
  return v;
}

// A bounds-checked cursor over the file. Messages: "<origin>: <context>: <what> (at offset N)".
class Cursor {
 public:
  Cursor(std::span<const std::byte> b, const std::string& origin) : b_(b), origin_(origin) {}

  std::uint64_t pos() const { return pos_; }
  std::uint64_t left() const { return b_.size() - pos_; }

  Failure error(const std::string& ctx, const std::string& what, Errc code = Errc::format_error) const {
    return fail(code,
                origin_ + ": " + ctx + (ctx.empty() ? "" : ": ") + what + " (at offset " + std::to_string(pos_) + ")");
  }

  Result<std::uint64_t> uint(int n, const std::string& ctx, const char* what) {
    if (left() < static_cast<std::uint64_t>(n)) {
      return error(ctx, std::string("file ends inside the ") + what + " (" + std::to_string(n) + " bytes needed, " +
                            std::to_string(left()) + " left)");
    }
    const std::uint64_t v = le(b_.data() + pos_, n);
    pos_ += static_cast<std::uint64_t>(n);
    return v;
  }

  Result<std::string> str(const std::string& ctx, const char* what, std::uint64_t max_len) {
    auto n = uint(8, ctx, what);
    if (!n) return fail(std::move(n).error());
    if (*n > max_len) {
      return error(ctx, std::string(what) + " length " + std::to_string(*n) + " exceeds the limit of " +
                            std::to_string(max_len) + " bytes");
    }
    if (*n > left()) {
      return error(ctx, std::string(what) + " length " + std::to_string(*n) + " runs past the end of the file (" +
                            std::to_string(left()) + " bytes left)");
    }
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), static_cast<std::size_t>(*n));
    pos_ += *n;
    return s;
  }

  std::string_view bytes(std::uint64_t n) {
    std::string_view v(reinterpret_cast<const char*>(b_.data() + pos_), static_cast<std::size_t>(n));
    pos_ += n;
    return v;
  }

 private:
  std::span<const std::byte> b_;
  const std::string& origin_;
  std::uint64_t pos_ = 0;
};

#define GGUF_ASSIGN(lhs, expr)                             \
  do {                                                     \
    auto _r = (expr);                                      \
    if (!_r) return ::tandem::fail(std::move(_r).error()); \
    lhs = std::move(*_r);                                  \
  } while (0)

struct Budget {
  std::uint64_t strings = kMaxStringElements;
  std::uint64_t nested = kMaxNestedElements;
};

Status read_value(Cursor& c, GgufType type, const std::string& ctx, int depth, Budget& budget, GgufValue& v);

Status read_array(Cursor& c, const std::string& ctx, int depth, Budget& budget, GgufValue& v) {
  if (depth >= kMaxArrayDepth) {
    return c.error(ctx, "arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels");
  }
  std::uint64_t et = 0;
  GGUF_ASSIGN(et, c.uint(4, ctx, "array element type"));
  if (et > static_cast<std::uint64_t>(GgufType::f64)) {
    return c.error(ctx, "unknown array element type " + std::to_string(et));
  }
  v.elem_type = static_cast<GgufType>(et);
  GGUF_ASSIGN(v.count, c.uint(8, ctx, "array length"));
  const std::uint64_t n = v.count;
  const std::string arr = "array of " + std::to_string(n) + " " + std::string(gguf_type_name(v.elem_type));
  if (is_number_type(v.elem_type)) {
    const std::uint64_t sz = gguf_scalar_size(v.elem_type);
    if (n > c.left() / sz) {
      return c.error(ctx, arr + " needs " + std::to_string(n) + " × " + std::to_string(sz) + " bytes, only " +
                              std::to_string(c.left()) + " left in the file");
    }
    v.raw.assign(c.bytes(n * sz));
    if (v.elem_type == GgufType::boolean) {
      for (std::uint64_t k = 0; k < n; ++k) {
        if (static_cast<unsigned char>(v.raw[k]) > 1) {
          return c.error(ctx, "bool array element " + std::to_string(k) + " is " +
                                  std::to_string(static_cast<unsigned char>(v.raw[k])) + ", not 0 or 1");
        }
      }
    }
    return {};
  }
  if (v.elem_type == GgufType::string) {
    if (n > c.left() / 8) {
      return c.error(ctx, arr + " needs at least " + std::to_string(n) + " × 8 bytes, only " +
                              std::to_string(c.left()) + " left in the file");
    }
    if (n > budget.strings) {
      return c.error(ctx, arr + ": more string-array elements in the file than the limit of " +
                              std::to_string(kMaxStringElements));
    }
    budget.strings -= n;
    v.strings.reserve(static_cast<std::size_t>(n));
    for (std::uint64_t k = 0; k < n; ++k) {
      std::string s;
      GGUF_ASSIGN(s, c.str(ctx + " element " + std::to_string(k), "string", kMaxStringBytes));
      v.strings.push_back(std::move(s));
    }
    return {};
  }
  // Arrays of arrays: each element is (u32 type, u64 count, data), at least 12 bytes.
  if (n > c.left() / 12) {
    return c.error(ctx, arr + " needs at least " + std::to_string(n) + " × 12 bytes, only " + std::to_string(c.left()) +
                            " left in the file");
  }
  if (n > budget.nested) {
    return c.error(
        ctx, arr + ": more nested-array elements in the file than the limit of " + std::to_string(kMaxNestedElements));
  }
  budget.nested -= n;
  v.arrays.reserve(static_cast<std::size_t>(n));
  for (std::uint64_t k = 0; k < n; ++k) {
    GgufValue item;
    TANDEM_TRY(read_value(c, GgufType::array, ctx + " element " + std::to_string(k), depth + 1, budget, item));
    v.arrays.push_back(std::move(item));
  }
  return {};
}

Status read_value(Cursor& c, GgufType type, const std::string& ctx, int depth, Budget& budget, GgufValue& v) {
  v.type = type;
  switch (type) {
    case GgufType::u8:
    case GgufType::u16:
    case GgufType::u32:
    case GgufType::u64: GGUF_ASSIGN(v.u, c.uint(static_cast<int>(gguf_scalar_size(type)), ctx, "value")); return {};
    case GgufType::i8:
    case GgufType::i16:
    case GgufType::i32:
    case GgufType::i64: {
      const int n = static_cast<int>(gguf_scalar_size(type));
      std::uint64_t bits = 0;
      GGUF_ASSIGN(bits, c.uint(n, ctx, "value"));
      if (n < 8 && (bits >> (8 * n - 1)) != 0) bits |= ~std::uint64_t{0} << (8 * n);  // sign-extend
      v.i = static_cast<std::int64_t>(bits);
      return {};
    }
    case GgufType::f32: {
      std::uint64_t bits = 0;
      GGUF_ASSIGN(bits, c.uint(4, ctx, "value"));
      const auto b32 = static_cast<std::uint32_t>(bits);
      float x = 0;
      std::memcpy(&x, &b32, 4);
      v.f = x;
      return {};
    }
    case GgufType::f64: {
      std::uint64_t bits = 0;
      GGUF_ASSIGN(bits, c.uint(8, ctx, "value"));
      std::memcpy(&v.f, &bits, 8);
      return {};
    }
    case GgufType::boolean:
      GGUF_ASSIGN(v.u, c.uint(1, ctx, "value"));
      if (v.u > 1) return c.error(ctx, "bool value is " + std::to_string(v.u) + ", not 0 or 1");
      return {};
    case GgufType::string: GGUF_ASSIGN(v.str, c.str(ctx, "string", kMaxStringBytes)); return {};
    case GgufType::array: return read_array(c, ctx, depth, budget, v);
  }
  return c.error(ctx, "unknown value type " + std::to_string(static_cast<std::uint32_t>(type)));
}

template <class T>
std::vector<std::uint32_t> sorted_order(const std::vector<T>& items, std::string_view (*key)(const T&)) {
  std::vector<std::uint32_t> order(items.size());
  for (std::uint32_t k = 0; k < order.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(),
            [&](std::uint32_t a, std::uint32_t b) { return key(items[a]) < key(items[b]); });
  return order;
}

std::string_view kv_key(const std::pair<std::string, GgufValue>& kv) { return kv.first; }
std::string_view tensor_key(const GgufTensorInfo& t) { return t.name; }

}  // namespace

// --- shared with the writer (gguf_internal.h) -----------------------------------------------------------------

namespace gguf_detail {

std::string dims_str(const std::vector<std::uint64_t>& ne) {
  std::string s = "[";
  for (std::size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

// Bytes of a tensor of a known ggml type: row_bytes(ne0) × rows. nullopt with `why` set on a bad shape.
std::optional<std::uint64_t> tensor_bytes(const GgmlTypeInfo& ti, const std::vector<std::uint64_t>& ne,
                                          std::string& why) {
  const auto blk = static_cast<std::uint64_t>(ti.block_elems);
  if (ne[0] % blk != 0) {
    why = "row length ne[0] = " + std::to_string(ne[0]) + " is not a multiple of the " + std::string(ti.name) +
          " block size " + std::to_string(blk);
    return std::nullopt;
  }
  std::uint64_t n = (ne[0] / blk);
  bool overflow = __builtin_mul_overflow(n, static_cast<std::uint64_t>(ti.block_bytes), &n);
  for (std::size_t d = 1; d < ne.size(); ++d) overflow = overflow || __builtin_mul_overflow(n, ne[d], &n);
  if (std::find(ne.begin(), ne.end(), 0) != ne.end()) return 0;
  if (overflow) {
    why = "size of " + dims_str(ne) + " " + std::string(ti.name) + " overflows 64 bits";
    return std::nullopt;
  }
  return n;
}

// The little-endian bytes of scalar `v` as type t.
void put_scalar(std::string& out, GgufType t, const GgufValue& v) {
  std::uint64_t bits = 0;
  switch (t) {
    case GgufType::u8:
    case GgufType::u16:
    case GgufType::u32:
    case GgufType::u64:
    case GgufType::boolean: bits = v.u; break;
    case GgufType::i8:
    case GgufType::i16:
    case GgufType::i32:
    case GgufType::i64: bits = static_cast<std::uint64_t>(v.i); break;
    case GgufType::f32: {
      const auto x = static_cast<float>(v.f);
      std::uint32_t b = 0;
      std::memcpy(&b, &x, 4);
      bits = b;
      break;
    }
    case GgufType::f64: std::memcpy(&bits, &v.f, 8); break;
    case GgufType::string:
    case GgufType::array: return;
  }
  for (std::size_t k = 0; k < gguf_scalar_size(t); ++k) out.push_back(static_cast<char>((bits >> (8 * k)) & 0xFF));
}

}  // namespace gguf_detail

// --- values -------------------------------------------------------------------------------------------------------

std::string_view gguf_type_name(GgufType t) {
  static constexpr std::string_view kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                                "bool", "string", "array", "u64", "i64", "f64"};
  const auto k = static_cast<std::uint32_t>(t);
  return k < std::size(kNames) ? kNames[k] : "?";
}

std::size_t gguf_scalar_size(GgufType t) {
  switch (t) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean: return 1;
    case GgufType::u16:
    case GgufType::i16: return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32: return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64: return 8;
    case GgufType::string:
    case GgufType::array: return 0;
  }
  return 0;
}

GgufValue GgufValue::of_uint(GgufType t, std::uint64_t v) {
  GgufValue x;
  x.type = t;
  const std::size_t n = gguf_scalar_size(t);
  x.u = n >= 8 ? v : v & ((std::uint64_t{1} << (8 * n)) - 1);
  return x;
}

GgufValue GgufValue::of_int(GgufType t, std::int64_t v) {
  GgufValue x;
  x.type = t;
  const std::size_t n = gguf_scalar_size(t);
  if (n < 8) {  // truncate to the width, then sign-extend back
    auto bits = static_cast<std::uint64_t>(v) & ((std::uint64_t{1} << (8 * n)) - 1);
    if ((bits >> (8 * n - 1)) != 0) bits |= ~std::uint64_t{0} << (8 * n);
    v = static_cast<std::int64_t>(bits);
  }
  x.i = v;
  return x;
}

GgufValue GgufValue::of_float(GgufType t, double v) {
  GgufValue x;
  x.type = t;
  x.f = t == GgufType::f32 ? static_cast<double>(static_cast<float>(v)) : v;
  return x;
}

GgufValue GgufValue::of_bool(bool v) {
  GgufValue x;
  x.type = GgufType::boolean;
  x.u = v ? 1 : 0;
  return x;
}

GgufValue GgufValue::of_string(std::string v) {
  GgufValue x;
  x.type = GgufType::string;
  x.str = std::move(v);
  return x;
}


GgufValue GgufValue::of_array(GgufType elem, const std::vector<GgufValue>& items) {
  GgufValue x;
  x.type = GgufType::array;
  x.elem_type = elem;
  x.count = items.size();
  if (elem == GgufType::string) {
    for (const auto& it : items) x.strings.push_back(it.str);
  } else if (elem == GgufType::array) {
    x.arrays = items;
  } else {
    for (const auto& it : items) put_scalar(x.raw, elem, it);
  }
  return x;
}

GgufValue GgufValue::of_strings(std::vector<std::string> items) {
  GgufValue x;
  x.type = GgufType::array;
  x.elem_type = GgufType::string;
  x.count = items.size();
  x.strings = std::move(items);
  return x;
}

GgufValue GgufValue::of_f32s(std::span<const float> items) {
  GgufValue x;
  x.type = GgufType::array;
  x.elem_type = GgufType::f32;
  x.count = items.size();
  x.raw.resize(items.size() * 4);
  for (std::size_t k = 0; k < items.size(); ++k) {
    std::uint32_t b = 0;
    std::memcpy(&b, &items[k], 4);
    for (int j = 0; j < 4; ++j) x.raw[4 * k + static_cast<std::size_t>(j)] = static_cast<char>((b >> (8 * j)) & 0xFF);
  }
  return x;
}

GgufValue GgufValue::of_i32s(std::span<const std::int32_t> items) {
  GgufValue x;
  x.type = GgufType::array;
  x.elem_type = GgufType::i32;
  x.count = items.size();
  x.raw.resize(items.size() * 4);
  for (std::size_t k = 0; k < items.size(); ++k) {
    const auto b = static_cast<std::uint32_t>(items[k]);
    for (int j = 0; j < 4; ++j) x.raw[4 * k + static_cast<std::size_t>(j)] = static_cast<char>((b >> (8 * j)) & 0xFF);
  }
  return x;
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::u8:
    case GgufType::u16:
    case GgufType::u32:
    case GgufType::u64:
    case GgufType::i8:
    case GgufType::i16:
    case GgufType::i32:
    case GgufType::i64: return true;
    default: return false;
  }
}

namespace {
bool is_unsigned(GgufType t) {
  return t == GgufType::u8 || t == GgufType::u16 || t == GgufType::u32 || t == GgufType::u64;
}
}  // namespace

std::optional<std::uint64_t> GgufValue::as_u64() const {
  if (!is_integer()) return std::nullopt;
  if (is_unsigned(type)) return u;
  if (i < 0) return std::nullopt;
  return static_cast<std::uint64_t>(i);
}

std::optional<std::int64_t> GgufValue::as_i64() const {
  if (!is_integer()) return std::nullopt;
  if (!is_unsigned(type)) return i;
  if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
  return static_cast<std::int64_t>(u);
}

std::optional<double> GgufValue::as_f64() const {
  if (type == GgufType::f32 || type == GgufType::f64) return f;
  if (!is_integer()) return std::nullopt;
  return is_unsigned(type) ? static_cast<double>(u) : static_cast<double>(i);
}

std::optional<std::int64_t> GgufValue::int_at(std::uint64_t k) const {
  if (type != GgufType::array || k >= count) return std::nullopt;
  const std::size_t sz = gguf_scalar_size(elem_type);
  if (sz == 0 || elem_type == GgufType::f32 || elem_type == GgufType::f64 || raw.size() < (k + 1) * sz) {
    return std::nullopt;
  }
  const std::uint64_t bits = le(reinterpret_cast<const std::byte*>(raw.data()) + k * sz, static_cast<int>(sz));
  if (is_unsigned(elem_type) || elem_type == GgufType::boolean) {
    if (bits > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
    return static_cast<std::int64_t>(bits);
  }
  std::uint64_t x = bits;
  if (sz < 8 && (x >> (8 * sz - 1)) != 0) x |= ~std::uint64_t{0} << (8 * sz);
  return static_cast<std::int64_t>(x);
}

std::optional<double> GgufValue::float_at(std::uint64_t k) const {
  if (type != GgufType::array || k >= count) return std::nullopt;
  const auto* p = reinterpret_cast<const std::byte*>(raw.data());
  if (elem_type == GgufType::f32 && raw.size() >= (k + 1) * 4) {
    const auto b = static_cast<std::uint32_t>(le(p + k * 4, 4));
    float x = 0;
    std::memcpy(&x, &b, 4);
    return x;
  }
  if (elem_type == GgufType::f64 && raw.size() >= (k + 1) * 8) {
    const std::uint64_t b = le(p + k * 8, 8);
    double x = 0;
    std::memcpy(&x, &b, 8);
    return x;
  }
  return std::nullopt;
}

// --- ggml types ---------------------------------------------------------------------------------------------------

GgmlTypeInfo ggml_type_info(std::uint32_t ggml_type) {
  for (const auto& r : kGgmlTypes) {
    if (r.id == ggml_type) return r.info;
  }
  return {};
}

std::string ggml_type_label(std::uint32_t ggml_type) {
  const GgmlTypeInfo ti = ggml_type_info(ggml_type);
  return ti.block_elems > 0 ? std::string(ti.name) : "ggml type " + std::to_string(ggml_type);
}

std::uint64_t GgufTensorInfo::rows() const {
  std::uint64_t r = 1;
  for (std::size_t d = 1; d < ne.size(); ++d) r *= ne[d];  // validated not to overflow
  return r;
}

std::vector<std::int64_t> GgufTensorInfo::hf_shape() const { return std::vector<std::int64_t>(ne.rbegin(), ne.rend()); }

// --- reader -------------------------------------------------------------------------------------------------------

Result<GgufFile> GgufFile::open(const std::string& path) {
  auto mf = MappedFile::open(path);
  if (!mf) return fail(std::move(mf).error());
  GgufFile f;
  f.origin_ = path;
  f.file_.emplace(std::move(*mf));
  TANDEM_TRY(f.parse_all());
  return f;
}

Result<GgufFile> GgufFile::parse(std::span<const std::byte> bytes, std::string origin) {
  GgufFile f;
  f.origin_ = std::move(origin);
  f.owned_.assign(bytes.begin(), bytes.end());
  TANDEM_TRY(f.parse_all());
  return f;
}

std::span<const std::byte> GgufFile::bytes() const {
  if (file_) return {file_->data(), file_->size()};
  return {owned_.data(), owned_.size()};
}

Status GgufFile::parse_all() {
  const auto all = bytes();
  Cursor c(all, origin_);
  if (all.size() < 4 || std::memcmp(all.data(), "GGUF", 4) != 0) {
    return fail(Errc::format_error, origin_ + ": not a GGUF file (the first 4 bytes are not \"GGUF\"; file is " +
                                        std::to_string(all.size()) + " bytes)");
  }
  c.bytes(4);
  std::uint64_t v = 0;
  GGUF_ASSIGN(v, c.uint(4, "header", "version"));
  if (v == 1) {
    return fail(Errc::unsupported, origin_ +
                                       ": GGUF version 1 is not supported (versions 2 and 3 are; convert the "
                                       "model again with a current llama.cpp)");
  }
  if (v != 2 && v != 3) {
    const bool big_endian = v == 0x02000000u || v == 0x03000000u;
    return fail(Errc::unsupported, origin_ + ": GGUF version " + std::to_string(v) + " is not supported" +
                                       (big_endian ? " (a big-endian file)" : "") + "; versions 2 and 3 are");
  }
  version_ = static_cast<std::uint32_t>(v);
  std::uint64_t n_tensors = 0;
  std::uint64_t n_kv = 0;
  GGUF_ASSIGN(n_tensors, c.uint(8, "header", "tensor count"));
  GGUF_ASSIGN(n_kv, c.uint(8, "header", "metadata count"));
  if (n_kv > c.left() / kMinKvBytes) {
    return c.error("header", "metadata count " + std::to_string(n_kv) + " cannot fit in the " +
                                 std::to_string(c.left()) + " bytes left");
  }
  if (n_tensors > c.left() / kMinTensorInfoBytes) {
    return c.error("header", "tensor count " + std::to_string(n_tensors) + " cannot fit in the " +
                                 std::to_string(c.left()) + " bytes left");
  }

  // Metadata.
  Budget budget;
  for (std::uint64_t k = 0; k < n_kv; ++k) {
    std::string key;
    GGUF_ASSIGN(key, c.str("metadata entry " + std::to_string(k), "key", kMaxNameBytes));
    if (key.empty()) return c.error("metadata entry " + std::to_string(k), "empty key");
    const std::string ctx = "key " + detail::printable(key);
    std::uint64_t t = 0;
    GGUF_ASSIGN(t, c.uint(4, ctx, "value type"));
    if (t > static_cast<std::uint64_t>(GgufType::f64)) return c.error(ctx, "unknown value type " + std::to_string(t));
    GgufValue val;
    TANDEM_TRY(read_value(c, static_cast<GgufType>(t), ctx, 0, budget, val));
    metadata_.emplace_back(std::move(key), std::move(val));
  }
  key_order_ = sorted_order(metadata_, &kv_key);
  for (std::size_t k = 1; k < key_order_.size(); ++k) {
    const std::string& a = metadata_[key_order_[k - 1]].first;
    if (a == metadata_[key_order_[k]].first) {
      return fail(Errc::format_error, origin_ + ": key " + detail::printable(a) + " appears twice in the metadata");
    }
  }
  if (const GgufValue* al = find("general.alignment")) {
    if (al->type != GgufType::u32) {
      return fail(Errc::format_error,
                  origin_ + ": key 'general.alignment' must be a u32, got " + std::string(gguf_type_name(al->type)));
    }
    if (al->u == 0 || (al->u & (al->u - 1)) != 0) {
      return fail(Errc::format_error,
                  origin_ + ": key 'general.alignment' must be a power of two, got " + std::to_string(al->u));
    }
    alignment_ = al->u;
  } else {
    alignment_ = kDefaultAlignment;
  }

  // Tensor infos.
  for (std::uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo t;
    GGUF_ASSIGN(t.name, c.str("tensor info " + std::to_string(k), "name", kMaxNameBytes));
    if (t.name.empty()) return c.error("tensor info " + std::to_string(k), "empty tensor name");
    const std::string ctx = "tensor " + detail::printable(t.name);
    std::uint64_t nd = 0;
    GGUF_ASSIGN(nd, c.uint(4, ctx, "n_dims"));
    if (nd < 1 || nd > kMaxDims) {
      return c.error(ctx, "n_dims is " + std::to_string(nd) + ", must be 1 to " + std::to_string(kMaxDims));
    }
    for (std::uint64_t d = 0; d < nd; ++d) {
      std::uint64_t x = 0;
      GGUF_ASSIGN(x, c.uint(8, ctx, "dimension"));
      if (x > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        return c.error(ctx, "dimension " + std::to_string(d) + " is " + std::to_string(x) + ", above 2^63 - 1");
      }
      t.ne.push_back(x);
    }
    std::uint64_t numel = 1;
    bool overflow = false;
    for (auto x : t.ne) overflow = overflow || __builtin_mul_overflow(numel, x, &numel);
    if (std::find(t.ne.begin(), t.ne.end(), 0) == t.ne.end() &&
        (overflow || numel > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))) {
      return c.error(ctx, "element count of dims " + dims_str(t.ne) + " overflows 63 bits");
    }
    std::uint64_t ty = 0;
    GGUF_ASSIGN(ty, c.uint(4, ctx, "ggml type"));
    t.ggml_type = static_cast<std::uint32_t>(ty);
    GGUF_ASSIGN(t.offset, c.uint(8, ctx, "data offset"));
    t.wtype = kernels::wtype_from_ggml(static_cast<int>(t.ggml_type));
    const GgmlTypeInfo ti = ggml_type_info(t.ggml_type);
    t.size_known = ti.block_elems > 0;
    if (t.size_known) {
      std::string why;
      const auto nb = tensor_bytes(ti, t.ne, why);
      if (!nb) return c.error(ctx, why);
      t.nbytes = *nb;
    }
    tensors_.push_back(std::move(t));
  }
  header_end_ = c.pos();
  data_offset_ = (header_end_ + alignment_ - 1) / alignment_ * alignment_;
  tensor_order_ = sorted_order(tensors_, &tensor_key);
  for (std::size_t k = 1; k < tensor_order_.size(); ++k) {
    const std::string& a = tensors_[tensor_order_[k - 1]].name;
    if (a == tensors_[tensor_order_[k]].name) {
      return fail(Errc::format_error,
                  origin_ + ": tensor " + detail::printable(a) + " appears twice in the tensor infos");
    }
  }
  if (tensors_.empty()) return {};
  if (data_offset_ > all.size()) {
    return fail(Errc::format_error, origin_ + ": the data section would start at offset " +
                                        std::to_string(data_offset_) + " (header end " + std::to_string(header_end_) +
                                        " aligned to " + std::to_string(alignment_) + "), past the end of the " +
                                        std::to_string(all.size()) + "-byte file");
  }
  const std::uint64_t data_size = all.size() - data_offset_;
  for (const auto& t : tensors_) {
    const std::string where = origin_ + ": tensor " + detail::printable(t.name);
    if (t.offset % alignment_ != 0) {
      return fail(Errc::format_error, where + ": data offset " + std::to_string(t.offset) +
                                          " is not a multiple of the alignment " + std::to_string(alignment_));
    }
    if (t.offset > data_size || t.nbytes > data_size - t.offset) {
      return fail(Errc::format_error, where + ": data [" + std::to_string(t.offset) + ", +" + std::to_string(t.nbytes) +
                                          " bytes) runs past the end of the data section (" +
                                          std::to_string(data_size) + " bytes)");
    }
  }
  std::vector<const GgufTensorInfo*> by_offset;
  for (const auto& t : tensors_) {
    if (t.nbytes > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const GgufTensorInfo* a, const GgufTensorInfo* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->nbytes < b->nbytes;
  });
  for (std::size_t k = 1; k < by_offset.size(); ++k) {
    const GgufTensorInfo& p = *by_offset[k - 1];
    const GgufTensorInfo& q = *by_offset[k];
    if (q.offset < p.offset + p.nbytes) {
      return fail(Errc::format_error, origin_ + ": tensor " + detail::printable(q.name) + " bytes [" +
                                          std::to_string(q.offset) + ", " + std::to_string(q.offset + q.nbytes) +
                                          ") overlap tensor " + detail::printable(p.name) + " bytes [" +
                                          std::to_string(p.offset) + ", " + std::to_string(p.offset + p.nbytes) + ")");
    }
  }
  return {};
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = std::lower_bound(key_order_.begin(), key_order_.end(), key,
                             [&](std::uint32_t k, std::string_view x) { return metadata_[k].first < x; });
  return it != key_order_.end() && metadata_[*it].first == key ? &metadata_[*it].second : nullptr;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = std::lower_bound(tensor_order_.begin(), tensor_order_.end(), name,
                             [&](std::uint32_t k, std::string_view x) { return tensors_[k].name < x; });
  return it != tensor_order_.end() && tensors_[*it].name == name ? &tensors_[*it] : nullptr;
}

std::span<const std::byte> GgufFile::raw_tensor_bytes(const GgufTensorInfo& t) const {
  if (!t.size_known || t.nbytes == 0) return {};
  return bytes().subspan(static_cast<std::size_t>(data_offset_ + t.offset), static_cast<std::size_t>(t.nbytes));
}

Result<std::span<const std::byte>> GgufFile::tensor_data(const GgufTensorInfo& t) const {
  if (!t.wtype) {
    return fail(Errc::unsupported, origin_ + ": tensor " + detail::printable(t.name) + " has type " +
                                       ggml_type_label(t.ggml_type) +
                                       ", which Tandem does not compute with (supported: f32, f16, bf16, q8_0, q4_0, "
                                       "q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs)");
  }
  return raw_tensor_bytes(t);
}

std::span<const std::byte> GgufFile::header_bytes() const {
  return bytes().subspan(0, static_cast<std::size_t>(header_end_));
}

#undef GGUF_ASSIGN

}  // namespace tandem::weights
