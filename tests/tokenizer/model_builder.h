// Test helper: serializes a detail::ProtoModel back to ModelProto bytes, and derives model variants from the
// Llama 2 vocabulary (user-defined / unused pieces, other normalizer settings) to exercise code paths the
// plain Llama model never takes.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "tokenizer/model_proto.h"

namespace tandem::tok::testing {

#ifndef TANDEM_LLAMA2_TOKENIZER
#error "TANDEM_LLAMA2_TOKENIZER must name data/tokenizer/llama2/tokenizer.model"
#endif
inline const char* llama2_model_path() { return TANDEM_LLAMA2_TOKENIZER; }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string serialize_piece(const detail::ProtoPiece& p) {
  std::string s;
  detail::put_len_field(s, 1, p.piece);
  detail::put_float_field(s, 2, p.score);
  if (p.type != 1) detail::put_varint_field(s, 3, static_cast<std::uint64_t>(static_cast<std::int64_t>(p.type)));
  return s;
}

inline std::uint64_t as_varint(std::int32_t v) { return static_cast<std::uint64_t>(static_cast<std::int64_t>(v)); }

inline std::string serialize_model(const detail::ProtoModel& m) {
  using namespace detail;
  std::string out;
  for (const auto& p : m.pieces) put_len_field(out, 1, serialize_piece(p));
  const auto& t = m.trainer_spec;
  std::string ts;
  put_varint_field(ts, 3, as_varint(t.model_type));
  put_varint_field(ts, 24, t.treat_whitespace_as_suffix ? 1 : 0);
  put_varint_field(ts, 35, t.byte_fallback ? 1 : 0);
  put_varint_field(ts, 40, as_varint(t.unk_id));
  put_varint_field(ts, 41, as_varint(t.bos_id));
  put_varint_field(ts, 42, as_varint(t.eos_id));
  put_varint_field(ts, 43, as_varint(t.pad_id));
  put_len_field(out, 2, ts);
  const auto& n = m.normalizer_spec;
  std::string ns;
  put_len_field(ns, 1, n.name);
  put_varint_field(ns, 3, n.add_dummy_prefix ? 1 : 0);
  put_varint_field(ns, 4, n.remove_extra_whitespaces ? 1 : 0);
  put_varint_field(ns, 5, n.escape_whitespaces ? 1 : 0);
  put_len_field(out, 3, ns);
  return out;
}

// A small hand-made BPE model: <unk>, <s>, </s>, the given normal pieces (score = -index), optional bytes.
inline detail::ProtoModel tiny_model(const std::vector<std::string>& normal, bool byte_fallback) {
  detail::ProtoModel m;
  m.pieces.push_back({"<unk>", 0.0F, 2});
  m.pieces.push_back({"<s>", 0.0F, 3});
  m.pieces.push_back({"</s>", 0.0F, 3});
  if (byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", b);
      m.pieces.push_back({buf, 0.0F, 6});
    }
  }
  float score = 0.0F;
  for (const auto& p : normal) m.pieces.push_back({p, score -= 1.0F, 1});
  m.trainer_spec.model_type = detail::kModelBpe;
  m.trainer_spec.byte_fallback = byte_fallback;
  m.normalizer_spec.name = "identity";
  m.normalizer_spec.remove_extra_whitespaces = false;
  return m;
}

// Named variants of the Llama 2 model.
struct Variant {
  std::string name;
  std::string bytes;
};

inline std::vector<Variant> llama_variants(const std::string& llama_bytes) {
  auto base = detail::parse_model_proto(llama_bytes);
  std::vector<Variant> out;
  if (!base) return out;
  auto add = [&](std::string name, const detail::ProtoModel& m) { out.push_back({std::move(name), serialize_model(m)}); };
  {
    auto m = *base;
    m.normalizer_spec.remove_extra_whitespaces = true;
    add("remove_extra_whitespaces", m);
  }
  {
    auto m = *base;
    m.normalizer_spec.add_dummy_prefix = false;
    add("no_dummy_prefix", m);
  }
  {
    auto m = *base;
    m.trainer_spec.treat_whitespace_as_suffix = true;
    m.normalizer_spec.remove_extra_whitespaces = true;
    add("ws_suffix", m);
  }
  {
    auto m = *base;
    m.normalizer_spec.escape_whitespaces = false;
    add("no_escape_whitespaces", m);
  }
  {  // no byte fallback: drop byte pieces → unknown characters become (merged runs of) <unk>
    auto m = *base;
    m.trainer_spec.byte_fallback = false;
    std::vector<detail::ProtoPiece> kept;
    for (auto& p : m.pieces) {
      if (p.type != 6) kept.push_back(p);
    }
    m.pieces = std::move(kept);
    add("no_byte_fallback", m);
  }
  {  // every 5th multi-character normal piece unused → BPE resegmentation
    auto m = *base;
    int k = 0;
    for (auto& p : m.pieces) {
      if (p.type == 1 && p.piece.size() > 1 && (k++ % 5) == 0) p.type = 5;
    }
    add("unused_pieces", m);
  }
  {  // a high-scoring piece spanning "x▁": the tokenizer must give up its per-word segmentation
    auto m = *base;
    m.pieces.push_back({"s\xE2\x96\x81the", 0.0F, 1});
    m.pieces.push_back({"e\xE2\x96\x81", -1.0F, 1});
    add("cross_whitespace_pieces", m);
  }
  {  // user-defined symbols (some existing pieces, some new ones, one containing a space)
    auto m = *base;
    for (auto& p : m.pieces) {
      if (p.piece == "ing" || p.piece == "\xE2\x96\x81the" || p.piece == "http" || p.piece == "::") p.type = 4;
    }
    for (const char* s : {"<tool>", "<|eot|>", "a b", "\xE4\xB8\xAD\xE6\x96\x87", "<tool_call>"}) {
      m.pieces.push_back({s, 0.0F, 4});
    }
    add("user_defined", m);
  }
  return out;
}

}  // namespace tandem::tok::testing
