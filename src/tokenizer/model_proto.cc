#include "tokenizer/model_proto.h"

#include <cstring>

namespace tandem::tok::detail {
namespace {

constexpr int kWireVarint = 0;
constexpr int kWireFixed64 = 1;
constexpr int kWireLen = 2;
constexpr int kWireFixed32 = 5;

// A cursor over one message's bytes. Every read checks bounds; errors carry the message path and offset.
class Reader {
 public:
  Reader(std::string_view data, const char* what) : data_(data), what_(what) {}

  bool done() const { return pos_ >= data_.size(); }

  Failure error(const std::string& why) const {
    return fail(Errc::parse_error, std::string(what_) + ": " + why + " at offset " + std::to_string(pos_));
  }

  Result<std::uint64_t> varint() {
    std::uint64_t v = 0;
    for (int i = 0; i < 10; ++i) {
      if (pos_ >= data_.size()) return error("truncated varint");
      const auto b = static_cast<unsigned char>(data_[pos_++]);
      if (i == 9 && b > 1) return error("varint longer than 64 bits");
      v |= static_cast<std::uint64_t>(b & 0x7F) << (7 * i);
      if ((b & 0x80) == 0) return v;
    }
    return error("varint longer than 10 bytes");
  }

  // Reads a field key; returns false in `ok` position via Result.
  Result<std::pair<int, int>> key() {
    auto k = varint();
    if (!k) return fail(std::move(k).error());
    const std::uint64_t field = *k >> 3;
    const int wire = static_cast<int>(*k & 7);
    if (field == 0 || field > 536870911ULL) return error("invalid field number " + std::to_string(field));
    return std::pair<int, int>{static_cast<int>(field), wire};
  }

  Result<std::string_view> len_delimited() {
    auto n = varint();
    if (!n) return fail(std::move(n).error());
    if (*n > data_.size() - pos_) {
      return error("length " + std::to_string(*n) + " runs past the end (" + std::to_string(data_.size() - pos_) +
                   " bytes left)");
    }
    std::string_view out = data_.substr(pos_, static_cast<std::size_t>(*n));
    pos_ += static_cast<std::size_t>(*n);
    return out;
  }

  Result<std::uint32_t> fixed32() {
    if (data_.size() - pos_ < 4) return error("truncated fixed32");
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(data_[pos_ + i])) << (8 * i);
    pos_ += 4;
    return v;
  }

  Status skip(int wire) {
    switch (wire) {
      case kWireVarint: {
        auto v = varint();
        if (!v) return fail(std::move(v).error());
        return {};
      }
      case kWireFixed64:
        if (data_.size() - pos_ < 8) return error("truncated fixed64");
        pos_ += 8;
        return {};
      case kWireLen: {
        auto v = len_delimited();
        if (!v) return fail(std::move(v).error());
        return {};
      }
      case kWireFixed32:
        if (data_.size() - pos_ < 4) return error("truncated fixed32");
        pos_ += 4;
        return {};
      default:
        return error("unsupported wire type " + std::to_string(wire));
    }
  }

  Failure wrong_wire(int field, int wire) const {
    return error("field " + std::to_string(field) + " has wrong wire type " + std::to_string(wire));
  }

 private:
  std::string_view data_;
  const char* what_;
  std::size_t pos_ = 0;
};

#define TOK_READ(var, expr)                                    \
  auto var##_r = (expr);                                       \
  if (!var##_r.ok()) return fail(std::move(var##_r).error()); \
  auto var = *var##_r

Status expect_wire(Reader& r, int field, int wire, int expected) {
  if (wire != expected) return r.wrong_wire(field, wire);
  return {};
}

// Typed readers for one field of a message: check the wire type, then read.
Status read_int32(Reader& r, int field, int wire, std::int32_t& dst) {
  TANDEM_TRY(expect_wire(r, field, wire, kWireVarint));
  TOK_READ(v, r.varint());
  dst = static_cast<std::int32_t>(static_cast<std::uint32_t>(v));  // int32 truncation, as protobuf does
  return {};
}

Status read_bool(Reader& r, int field, int wire, bool& dst) {
  TANDEM_TRY(expect_wire(r, field, wire, kWireVarint));
  TOK_READ(v, r.varint());
  dst = v != 0;
  return {};
}

Status read_string(Reader& r, int field, int wire, std::string& dst) {
  TANDEM_TRY(expect_wire(r, field, wire, kWireLen));
  TOK_READ(s, r.len_delimited());
  dst.assign(s);
  return {};
}

Status parse_piece(std::string_view bytes, ProtoPiece& p) {
  Reader r(bytes, "ModelProto.pieces");
  while (!r.done()) {
    TOK_READ(k, r.key());
    const int field = k.first;
    const int wire = k.second;
    switch (field) {
      case 1: TANDEM_TRY(read_string(r, field, wire, p.piece)); break;
      case 2: {
        TANDEM_TRY(expect_wire(r, field, wire, kWireFixed32));
        TOK_READ(bits, r.fixed32());
        std::memcpy(&p.score, &bits, sizeof(float));
        break;
      }
      case 3: {
        std::int32_t type = 0;
        TANDEM_TRY(read_int32(r, field, wire, type));
        p.type = type;
        break;
      }
      default:
        TANDEM_TRY(r.skip(wire));
    }
  }
  return {};
}

Status parse_trainer(std::string_view bytes, ProtoTrainerSpec& t) {
  Reader r(bytes, "TrainerSpec");
  while (!r.done()) {
    TOK_READ(k, r.key());
    const int field = k.first;
    const int wire = k.second;
    switch (field) {
      case 3: TANDEM_TRY(read_int32(r, field, wire, t.model_type)); break;
      case 24: TANDEM_TRY(read_bool(r, field, wire, t.treat_whitespace_as_suffix)); break;
      case 35: TANDEM_TRY(read_bool(r, field, wire, t.byte_fallback)); break;
      case 40: TANDEM_TRY(read_int32(r, field, wire, t.unk_id)); break;
      case 41: TANDEM_TRY(read_int32(r, field, wire, t.bos_id)); break;
      case 42: TANDEM_TRY(read_int32(r, field, wire, t.eos_id)); break;
      case 43: TANDEM_TRY(read_int32(r, field, wire, t.pad_id)); break;
      case 44: TANDEM_TRY(read_string(r, field, wire, t.unk_surface)); break;
      case 45: TANDEM_TRY(read_string(r, field, wire, t.unk_piece)); break;
      case 46: TANDEM_TRY(read_string(r, field, wire, t.bos_piece)); break;
      case 47: TANDEM_TRY(read_string(r, field, wire, t.eos_piece)); break;
      case 48: TANDEM_TRY(read_string(r, field, wire, t.pad_piece)); break;
      default: TANDEM_TRY(r.skip(wire));
    }
  }
  return {};
}

Status parse_normalizer(std::string_view bytes, ProtoNormalizerSpec& n, const char* what) {
  Reader r(bytes, what);
  while (!r.done()) {
    TOK_READ(k, r.key());
    const int field = k.first;
    const int wire = k.second;
    switch (field) {
      case 1: TANDEM_TRY(read_string(r, field, wire, n.name)); break;
      case 2: TANDEM_TRY(read_string(r, field, wire, n.precompiled_charsmap)); break;
      case 3: TANDEM_TRY(read_bool(r, field, wire, n.add_dummy_prefix)); break;
      case 4: TANDEM_TRY(read_bool(r, field, wire, n.remove_extra_whitespaces)); break;
      case 5: TANDEM_TRY(read_bool(r, field, wire, n.escape_whitespaces)); break;
      default: TANDEM_TRY(r.skip(wire));
    }
  }
  return {};
}

}  // namespace

Result<ProtoModel> parse_model_proto(std::string_view bytes) {
  ProtoModel m;
  Reader r(bytes, "ModelProto");
  while (!r.done()) {
    TOK_READ(k, r.key());
    const int field = k.first;
    const int wire = k.second;
    switch (field) {
      case 1: {
        TANDEM_TRY(expect_wire(r, field, wire, kWireLen));
        TOK_READ(s, r.len_delimited());
        ProtoPiece p;
        TANDEM_TRY(parse_piece(s, p));
        m.pieces.push_back(std::move(p));
        break;
      }
      case 2: {
        TANDEM_TRY(expect_wire(r, field, wire, kWireLen));
        TOK_READ(s, r.len_delimited());
        TANDEM_TRY(parse_trainer(s, m.trainer_spec));
        break;
      }
      case 3: {
        TANDEM_TRY(expect_wire(r, field, wire, kWireLen));
        TOK_READ(s, r.len_delimited());
        TANDEM_TRY(parse_normalizer(s, m.normalizer_spec, "NormalizerSpec"));
        break;
      }
      case 5: {
        TANDEM_TRY(expect_wire(r, field, wire, kWireLen));
        TOK_READ(s, r.len_delimited());
        m.has_denormalizer = true;
        TANDEM_TRY(parse_normalizer(s, m.denormalizer_spec, "ModelProto.denormalizer_spec"));
        break;
      }
      default:
        TANDEM_TRY(r.skip(wire));
    }
  }
  return m;
}

#undef TOK_READ

void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_tag(std::string& out, int field, int wire_type) {
  put_varint(out, (static_cast<std::uint64_t>(field) << 3) | static_cast<std::uint64_t>(wire_type));
}

void put_len_field(std::string& out, int field, std::string_view payload) {
  put_tag(out, field, kWireLen);
  put_varint(out, payload.size());
  out.append(payload);
}

void put_varint_field(std::string& out, int field, std::uint64_t v) {
  put_tag(out, field, kWireVarint);
  put_varint(out, v);
}

void put_float_field(std::string& out, int field, float v) {
  put_tag(out, field, kWireFixed32);
  std::uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof(float));
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
}

}  // namespace tandem::tok::detail
