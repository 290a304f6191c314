// Internal: a bounds-checked reader for the protobuf wire format, and the subset of sentencepiece's ModelProto
// (sentencepiece_model.proto) that the BPE tokenizer needs. Not part of the public tokenizer API.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace tandem::tok::detail {

// TrainerSpec.ModelType
inline constexpr int kModelUnigram = 1;
inline constexpr int kModelBpe = 2;
inline constexpr int kModelWord = 3;
inline constexpr int kModelChar = 4;

struct ProtoPiece {
  std::string piece;  // field 1
  float score = 0.0F;  // field 2
  int type = 1;        // field 3, default NORMAL
};

// Defaults are the proto2 defaults of sentencepiece_model.proto.
struct ProtoTrainerSpec {
  int model_type = kModelUnigram;             // 3
  bool treat_whitespace_as_suffix = false;    // 24
  bool byte_fallback = false;                 // 35
  std::int32_t unk_id = 0;                    // 40
  std::int32_t bos_id = 1;                    // 41
  std::int32_t eos_id = 2;                    // 42
  std::int32_t pad_id = -1;                   // 43
  std::string unk_surface = " \xE2\x81\x87 ";  // 44
  std::string unk_piece;                      // 45 (empty = "<unk>")
  std::string bos_piece;                      // 46 (empty = "<s>")
  std::string eos_piece;                      // 47 (empty = "</s>")
  std::string pad_piece;                      // 48 (empty = "<pad>")
};

struct ProtoNormalizerSpec {
  std::string name;                   // 1
  std::string precompiled_charsmap;   // 2
  bool add_dummy_prefix = true;       // 3
  bool remove_extra_whitespaces = true;  // 4
  bool escape_whitespaces = true;     // 5
};

struct ProtoModel {
  std::vector<ProtoPiece> pieces;        // 1
  ProtoTrainerSpec trainer_spec;         // 2
  ProtoNormalizerSpec normalizer_spec;   // 3
  bool has_denormalizer = false;         // 5
  ProtoNormalizerSpec denormalizer_spec;
};

// Parses a serialized ModelProto. Errors are Errc::parse_error (malformed wire format: truncated varints,
// lengths past the end, groups, wrong wire type for a known field). Unknown fields are skipped; repeated
// occurrences of a singular message field are merged, of a scalar field the last one wins (protobuf rules).
Result<ProtoModel> parse_model_proto(std::string_view bytes);

// Builders for the wire format, used by tests to construct model files.
void put_varint(std::string& out, std::uint64_t v);
void put_tag(std::string& out, int field, int wire_type);
void put_len_field(std::string& out, int field, std::string_view payload);
void put_varint_field(std::string& out, int field, std::uint64_t v);
void put_float_field(std::string& out, int field, float v);

}  // namespace tandem::tok::detail
