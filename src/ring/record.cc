#include "ring/record.h"

#include <cassert>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <type_traits>

#include "core/text.h"

namespace tandem::ring {

namespace {

template <class T>
T load(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

ParsedRecord failed(Fault f, std::string message) {
  ParsedRecord r;
  r.error = RecordError{f, std::move(message)};
  return r;
}

}  // namespace

bool valid_key(std::string_view key) {
  if (key.empty() || key.size() > kMaxKeyLength) return false;
  for (char c : key)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

const Field* ParsedRecord::find(std::string_view key) const {
  for (const auto& f : fields)
    if (f.key == key) return &f;
  return nullptr;
}

std::string_view field_type_name(const FieldValue& v) {
  static constexpr std::string_view names[] = {"boolean", "uint64", "int64", "float64", "string", "string_list",
                                               "int32_list", "float32_list", "bytes_list"};
  return names[v.index()];
}

ParsedRecord parse_record(std::span<const std::uint8_t> bytes, const RecordLimits& limits) {
  ParsedRecord out;
  std::set<std::string, std::less<>> seen;
  std::size_t pos = 0;
  const std::size_t n = bytes.size();
  while (pos < n) {
    if (out.fields.size() >= limits.max_fields)
      return failed(Fault::record, "more than " + std::to_string(limits.max_fields) + " fields");
    if (n - pos < kFieldHeaderSize)
      return failed(Fault::record, "truncated field header at byte " + std::to_string(pos));
    const std::uint8_t* h = bytes.data() + pos;
    const std::uint8_t type = h[0];
    const std::size_t key_len = h[1];
    const auto reserved = load<std::uint16_t>(h + 2);
    const std::size_t value_len = load<std::uint32_t>(h + 4);
    if (reserved != 0) return failed(Fault::record, "reserved bytes of the field at byte " + std::to_string(pos) + " are not zero");
    pos += kFieldHeaderSize;
    if (key_len > n - pos) return failed(Fault::record, "key runs past the end of the record");
    std::string_view key(reinterpret_cast<const char*>(bytes.data() + pos), key_len);
    if (!valid_key(key)) return failed(Fault::record, "bad key at byte " + std::to_string(pos) + " (want [a-z0-9_]{1,64})");
    pos += key_len;
    if (value_len > n - pos) return failed(Fault::record, "value of '" + std::string(key) + "' runs past the end of the record");
    const std::uint8_t* v = bytes.data() + pos;
    pos += value_len;
    if (!seen.emplace(key).second) return failed(Fault::record, "duplicate key '" + std::string(key) + "'");

    auto want = [&](std::size_t size) -> std::optional<ParsedRecord> {
      if (value_len != size)
        return failed(Fault::record, "'" + std::string(key) + "' must be " + std::to_string(size) + " bytes, got " +
                                         std::to_string(value_len));
      return std::nullopt;
    };
    Field f;
    f.key = std::string(key);
    switch (static_cast<FieldType>(type)) {
      case FieldType::boolean: {
        if (auto e = want(1)) return std::move(*e);
        if (v[0] > 1) return failed(Fault::record, "'" + f.key + "' is a boolean but holds " + std::to_string(v[0]));
        f.value = v[0] == 1;
        break;
      }
      case FieldType::uint64:
        if (auto e = want(8)) return std::move(*e);
        f.value = load<std::uint64_t>(v);
        break;
      case FieldType::int64:
        if (auto e = want(8)) return std::move(*e);
        f.value = load<std::int64_t>(v);
        break;
      case FieldType::float64: {
        if (auto e = want(8)) return std::move(*e);
        const double d = load<double>(v);
        if (!std::isfinite(d)) return failed(Fault::record, "'" + f.key + "' is not a finite number");
        f.value = d;
        break;
      }
      case FieldType::string: {
        std::string s(reinterpret_cast<const char*>(v), value_len);
        if (!valid_utf8(s)) return failed(Fault::utf8, "'" + f.key + "' is not valid UTF-8");
        f.value = std::move(s);
        break;
      }
      case FieldType::string_list: {
        std::vector<std::string> list;
        std::size_t p = 0;
        while (p < value_len) {
          if (list.size() >= limits.max_list_elements)
            return failed(Fault::record, "'" + f.key + "' has more than " + std::to_string(limits.max_list_elements) + " elements");
          if (value_len - p < 4) return failed(Fault::record, "'" + f.key + "': truncated element length");
          const std::size_t len = load<std::uint32_t>(v + p);
          p += 4;
          if (len > value_len - p) return failed(Fault::record, "'" + f.key + "': element runs past the value");
          std::string s(reinterpret_cast<const char*>(v + p), len);
          p += len;
          if (!valid_utf8(s)) return failed(Fault::utf8, "'" + f.key + "' element " + std::to_string(list.size()) + " is not valid UTF-8");
          list.push_back(std::move(s));
        }
        f.value = std::move(list);
        break;
      }
      case FieldType::int32_list: {
        if (value_len % 4 != 0) return failed(Fault::record, "'" + f.key + "' length is not a multiple of 4");
        if (value_len / 4 > limits.max_list_elements)
          return failed(Fault::record, "'" + f.key + "' has more than " + std::to_string(limits.max_list_elements) + " elements");
        std::vector<std::int32_t> ids(value_len / 4);
        if (!ids.empty()) std::memcpy(ids.data(), v, value_len);
        f.value = std::move(ids);
        break;
      }
      case FieldType::float32_list: {
        if (value_len % 4 != 0) return failed(Fault::record, "'" + f.key + "' length is not a multiple of 4");
        if (value_len / 4 > limits.max_list_elements)
          return failed(Fault::record, "'" + f.key + "' has more than " + std::to_string(limits.max_list_elements) + " elements");
        std::vector<float> xs(value_len / 4);
        if (!xs.empty()) std::memcpy(xs.data(), v, value_len);
        for (std::size_t i = 0; i < xs.size(); ++i)
          if (!std::isfinite(xs[i]))
            return failed(Fault::record, "'" + f.key + "' element " + std::to_string(i) + " is not a finite number");
        f.value = std::move(xs);
        break;
      }
      case FieldType::bytes_list: {
        ByteList list;
        std::size_t p = 0;
        while (p < value_len) {
          if (list.size() >= limits.max_list_elements)
            return failed(Fault::record, "'" + f.key + "' has more than " + std::to_string(limits.max_list_elements) + " elements");
          if (value_len - p < 4) return failed(Fault::record, "'" + f.key + "': truncated element length");
          const std::size_t len = load<std::uint32_t>(v + p);
          p += 4;
          if (len > value_len - p) return failed(Fault::record, "'" + f.key + "': element runs past the value");
          list.emplace_back(v + p, v + p + len);
          p += len;
        }
        f.value = std::move(list);
        break;
      }
      default:
        return failed(Fault::record, "'" + f.key + "' has unknown type " + std::to_string(type));
    }
    out.fields.push_back(std::move(f));
  }
  return out;
}

void RecordWriter::raw(const void* p, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(p);
  out_.insert(out_.end(), b, b + n);
}

void RecordWriter::header(FieldType t, std::string_view key, std::size_t value_length) {
  assert(valid_key(key));
  assert(value_length <= 0xffffffffu);
  const std::uint8_t h[4] = {static_cast<std::uint8_t>(t), static_cast<std::uint8_t>(key.size()), 0, 0};
  raw(h, 4);
  const auto len = static_cast<std::uint32_t>(value_length);
  raw(&len, 4);
  raw(key.data(), key.size());
}

RecordWriter& RecordWriter::add(std::string_view key, bool v) {
  header(FieldType::boolean, key, 1);
  const std::uint8_t b = v ? 1 : 0;
  raw(&b, 1);
  return *this;
}
RecordWriter& RecordWriter::add(std::string_view key, std::uint64_t v) {
  header(FieldType::uint64, key, 8);
  raw(&v, 8);
  return *this;
}
RecordWriter& RecordWriter::add(std::string_view key, std::int64_t v) {
  header(FieldType::int64, key, 8);
  raw(&v, 8);
  return *this;
}
RecordWriter& RecordWriter::add(std::string_view key, double v) {
  header(FieldType::float64, key, 8);
  raw(&v, 8);
  return *this;
}
RecordWriter& RecordWriter::add(std::string_view key, std::string_view v) {
  header(FieldType::string, key, v.size());
  raw(v.data(), v.size());
  return *this;
}
RecordWriter& RecordWriter::add(std::string_view key, const std::vector<std::string>& v) {
  std::size_t len = 0;
  for (const auto& s : v) len += 4 + s.size();
  header(FieldType::string_list, key, len);
  for (const auto& s : v) {
    const auto n = static_cast<std::uint32_t>(s.size());
    raw(&n, 4);
    raw(s.data(), s.size());
  }
  return *this;
}
RecordWriter& RecordWriter::add(std::string_view key, const std::vector<std::int32_t>& v) {
  header(FieldType::int32_list, key, v.size() * 4);
  if (!v.empty()) raw(v.data(), v.size() * 4);
  return *this;
}
RecordWriter& RecordWriter::add(std::string_view key, const std::vector<float>& v) {
  header(FieldType::float32_list, key, v.size() * 4);
  if (!v.empty()) raw(v.data(), v.size() * 4);
  return *this;
}
RecordWriter& RecordWriter::add_float32_rows(std::string_view key, const std::vector<std::vector<float>>& rows) {
  std::size_t n = 0;
  for (const auto& r : rows) n += r.size();
  header(FieldType::float32_list, key, n * 4);
  for (const auto& r : rows)
    if (!r.empty()) raw(r.data(), r.size() * 4);
  return *this;
}
RecordWriter& RecordWriter::add(std::string_view key, const ByteList& v) {
  std::size_t len = 0;
  for (const auto& b : v) len += 4 + b.size();
  header(FieldType::bytes_list, key, len);
  for (const auto& b : v) {
    const auto n = static_cast<std::uint32_t>(b.size());
    raw(&n, 4);
    if (!b.empty()) raw(b.data(), b.size());
  }
  return *this;
}
RecordWriter& RecordWriter::add(std::string_view key, const FieldValue& v) {
  std::visit(
      [&](const auto& x) {
        if constexpr (std::is_same_v<std::decay_t<decltype(x)>, std::string>) add(key, std::string_view(x));
        else add(key, x);
      },
      v);
  return *this;
}

}  // namespace tandem::ring
