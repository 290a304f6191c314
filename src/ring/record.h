// Records: the typed key/value payloads of ring submissions and completions (abi.h FieldType; docs/rings.md).
// The parser is the daemon's first line against hostile bytes: it never reads outside the span it is given, rejects
// any framing error, bad key, duplicate key, wrong value size, non-finite double or invalid UTF-8, and bounds the
// number of fields and list elements. Pure (no I/O, no allocation beyond the result).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/result.h"
#include "ring/abi.h"

namespace tandem::ring {

using ByteList = std::vector<std::vector<std::uint8_t>>;
// The alternatives in FieldType order (index + 1 == the wire type).
using FieldValue = std::variant<bool, std::uint64_t, std::int64_t, double, std::string, std::vector<std::string>,
                                std::vector<std::int32_t>, std::vector<float>, ByteList>;

struct Field {
  std::string key;
  FieldValue value;
  friend bool operator==(const Field&, const Field&) = default;
};

struct RecordLimits {
  std::size_t max_fields = 128;
  std::size_t max_list_elements = 1u << 20;
};

// Why a record did not parse: Fault::record (framing, key, duplicate, size, value) or Fault::utf8.
struct RecordError {
  Fault fault = Fault::record;
  std::string message;
};

struct ParsedRecord {
  std::vector<Field> fields;  // in wire order
  std::optional<RecordError> error;
  bool ok() const { return !error.has_value(); }
  const Field* find(std::string_view key) const;
};

ParsedRecord parse_record(std::span<const std::uint8_t> bytes, const RecordLimits& limits = {});

// "string", "uint64", ... (for error messages).
std::string_view field_type_name(const FieldValue& v);

// Builds a record. Keys must be [a-z0-9_]{1,64} (checked with assert: keys are the writer's own constants).
class RecordWriter {
 public:
  RecordWriter& add(std::string_view key, bool v);
  RecordWriter& add(std::string_view key, std::uint64_t v);
  RecordWriter& add(std::string_view key, std::int64_t v);
  RecordWriter& add(std::string_view key, double v);
  RecordWriter& add(std::string_view key, std::string_view v);
  RecordWriter& add(std::string_view key, const char* v) { return add(key, std::string_view(v)); }
  RecordWriter& add(std::string_view key, const std::string& v) { return add(key, std::string_view(v)); }
  RecordWriter& add(std::string_view key, const std::vector<std::string>& v);
  RecordWriter& add(std::string_view key, const std::vector<std::int32_t>& v);
  RecordWriter& add(std::string_view key, const std::vector<float>& v);
  // float32_list from consecutive spans (the embedded vectors: count × dim floats without a copy into one vector).
  RecordWriter& add_float32_rows(std::string_view key, const std::vector<std::vector<float>>& rows);
  RecordWriter& add(std::string_view key, const ByteList& v);
  RecordWriter& add(std::string_view key, const FieldValue& v);

  const std::vector<std::uint8_t>& bytes() const { return out_; }
  std::vector<std::uint8_t> take() { return std::move(out_); }
  bool empty() const { return out_.empty(); }

 private:
  void header(FieldType t, std::string_view key, std::size_t value_length);
  void raw(const void* p, std::size_t n);
  std::vector<std::uint8_t> out_;
};

bool valid_key(std::string_view key);

}  // namespace tandem::ring
