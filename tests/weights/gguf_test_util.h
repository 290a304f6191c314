// Helpers for the GGUF tests: a tiny Llama written with GgufWriter, a raw byte builder for malformed files, and the
// location of ../shared (real GGUF files; tests that need it skip when it is absent).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "kernels/types.h"
#include "weights/gguf.h"
#include "weights/gguf_model.h"

namespace tandem::weights::testing {

// ../shared from the source tree, or $TANDEM_SHARED_DIR.
inline std::string shared_dir() {
  if (const char* e = std::getenv("TANDEM_SHARED_DIR"); e != nullptr && *e != '\0') return e;
#ifdef TANDEM_SOURCE_DIR
  return std::string(TANDEM_SOURCE_DIR) + "/../shared";
#else
  return "../shared";
#endif
}

inline bool file_exists(const std::string& p) { return std::ifstream(p).good(); }

#define SKIP_WITHOUT(path)                            \
  if (!::tandem::weights::testing::file_exists(path)) \
  GTEST_SKIP() << (path) << " is absent: the real-data GGUF tests need ../shared/models (or TANDEM_SHARED_DIR)"

// Little-endian byte builder for hand-made (often malformed) GGUF files.
struct Raw {
  std::string b;
  Raw& u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
    return *this;
  }
  Raw& u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
    return *this;
  }
  Raw& str(std::string_view s) {
    u64(s.size());
    b.append(s);
    return *this;
  }
  Raw& bytes(std::size_t n, char c = '\0') {
    b.append(n, c);
    return *this;
  }
  Raw& pad(std::size_t alignment) {
    b.resize((b.size() + alignment - 1) / alignment * alignment, '\0');
    return *this;
  }
  // "GGUF", version, counts.
  static Raw header(std::uint64_t n_tensors, std::uint64_t n_kv, std::uint32_t version = 3) {
    Raw r;
    r.b = "GGUF";
    r.u32(version).u64(n_tensors).u64(n_kv);
    return r;
  }
};

inline std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// Tiny Llama dimensions: hidden 32, FFN 64, 2 layers, 2 heads, 1 KV head, head_dim 16, context 128.
struct TinyShape {
  int hidden = 32, inter = 64, layers = 2, heads = 2, kv_heads = 1, ctx = 128;
  int head_dim() const { return hidden / heads; }
};

// A SentencePiece-style vocabulary: <unk>, <s>, </s>, the 256 byte pieces, then a few merges of "hello world".
inline std::vector<std::string> tiny_vocab() {
  std::vector<std::string> v = {"<unk>", "<s>", "</s>"};
  char buf[8];
  for (int i = 0; i < 256; ++i) {
    std::snprintf(buf, sizeof buf, "<0x%02X>", i);
    v.push_back(buf);
  }
  for (const char* p : {"\xE2\x96\x81", "h", "e", "l", "o", "w", "r", "d", "\xE2\x96\x81h", "ll", "\xE2\x96\x81w", "or",
                        "ld", "\xE2\x96\x81he", "llo", "\xE2\x96\x81hello", "\xE2\x96\x81wor", "\xE2\x96\x81world"}) {
    v.push_back(p);
  }
  return v;
}
inline int tiny_vocab_id(std::string_view piece) {
  const auto v = tiny_vocab();
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] == piece) return static_cast<int>(i);
  }
  return -1;
}

// Deterministic bytes for a tensor of `n` bytes.
inline std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> out(n);
  std::uint32_t x = 2654435761u * (seed + 1);
  for (auto& b : out) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<std::byte>(x & 0xFF);
  }
  return out;
}

// A GGUF Llama of TinyShape with matrices of `matrix_type` (f32, f16, bf16 or q8_0: rows of 32/64 elements), f32
// norms, the tiny SentencePiece vocabulary. `tied`: no output.weight.
// `replace`: tensors written instead with (ggml type id, GGUF ne, bytes) — for wrong types and shapes; an empty ne
// leaves the tensor out.
struct RawTensor {
  std::uint32_t ggml_type;
  std::vector<std::uint64_t> ne;
  std::vector<std::byte> data;
};
inline GgufWriter tiny_gguf(kernels::WType matrix_type = kernels::WType::f32, bool tied = false, TinyShape s = {},
                            const std::map<std::string, RawTensor>& replace = {}) {
  GgufWriter w;
  const auto vocab = tiny_vocab();
  const auto nv = static_cast<std::int64_t>(vocab.size());
  w.set("general.architecture", GgufValue::of_string("llama"));
  w.set("general.name", GgufValue::of_string("tiny"));
  w.set("llama.context_length", GgufValue::of_uint(GgufType::u32, static_cast<std::uint64_t>(s.ctx)));
  w.set("llama.embedding_length", GgufValue::of_uint(GgufType::u32, static_cast<std::uint64_t>(s.hidden)));
  w.set("llama.block_count", GgufValue::of_uint(GgufType::u32, static_cast<std::uint64_t>(s.layers)));
  w.set("llama.feed_forward_length", GgufValue::of_uint(GgufType::u32, static_cast<std::uint64_t>(s.inter)));
  w.set("llama.attention.head_count", GgufValue::of_uint(GgufType::u32, static_cast<std::uint64_t>(s.heads)));
  w.set("llama.attention.head_count_kv", GgufValue::of_uint(GgufType::u32, static_cast<std::uint64_t>(s.kv_heads)));
  w.set("llama.rope.freq_base", GgufValue::of_float(GgufType::f32, 10000.0));
  w.set("llama.attention.layer_norm_rms_epsilon", GgufValue::of_float(GgufType::f32, 1e-5));
  w.set("llama.rope.dimension_count", GgufValue::of_uint(GgufType::u32, static_cast<std::uint64_t>(s.head_dim())));
  w.set("tokenizer.ggml.model", GgufValue::of_string("llama"));
  w.set("tokenizer.ggml.tokens", GgufValue::of_strings(vocab));
  std::vector<float> scores(vocab.size(), 0.0F);
  std::vector<std::int32_t> types(vocab.size(), 1);
  types[0] = 2;
  types[1] = types[2] = 3;
  for (int i = 3; i < 259; ++i) types[static_cast<std::size_t>(i)] = 6;
  for (std::size_t i = 259; i < vocab.size(); ++i) scores[i] = -static_cast<float>(i - 259);
  // Longer merges must win: score by length.
  for (std::size_t i = 259; i < vocab.size(); ++i) scores[i] = static_cast<float>(vocab[i].size()) - 100.0F;
  w.set("tokenizer.ggml.scores", GgufValue::of_f32s(scores));
  w.set("tokenizer.ggml.token_type", GgufValue::of_i32s(types));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::of_uint(GgufType::u32, 1));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::of_uint(GgufType::u32, 2));
  w.set("tokenizer.ggml.add_bos_token", GgufValue::of_bool(true));
  w.set("tokenizer.ggml.add_eos_token", GgufValue::of_bool(false));

  unsigned seed = 0;
  auto add = [&](const std::string& name, kernels::WType t, std::vector<std::int64_t> shape) {
    if (auto it = replace.find(name); it != replace.end()) {
      if (it->second.ne.empty()) return;  // left out
      const Status st = w.add_tensor(name, it->second.ggml_type, it->second.ne, it->second.data);
      EXPECT_TRUE(st.ok()) << name << ": " << (st.ok() ? "" : st.error().message);
      return;
    }
    const std::size_t bytes =
        kernels::row_bytes(t, shape.back()) * static_cast<std::size_t>(shape.size() == 2 ? shape[0] : 1);
    const auto data = pattern(bytes, seed++);
    const Status st = w.add_tensor(name, t, shape, data);
    EXPECT_TRUE(st.ok()) << name << ": " << (st.ok() ? "" : st.error().message);
  };
  const std::int64_t h = s.hidden, f = s.inter, q = std::int64_t{s.heads} * s.head_dim(),
                     kv = std::int64_t{s.kv_heads} * s.head_dim();
  add("token_embd.weight", matrix_type, {nv, h});
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", kernels::WType::f32, {h});
    add(p + "attn_q.weight", matrix_type, {q, h});
    add(p + "attn_k.weight", matrix_type, {kv, h});
    add(p + "attn_v.weight", matrix_type, {kv, h});
    add(p + "attn_output.weight", matrix_type, {h, q});
    add(p + "ffn_norm.weight", kernels::WType::f32, {h});
    add(p + "ffn_gate.weight", matrix_type, {f, h});
    add(p + "ffn_up.weight", matrix_type, {f, h});
    add(p + "ffn_down.weight", matrix_type, {h, f});
  }
  add("output_norm.weight", kernels::WType::f32, {h});
  if (!tied) add("output.weight", matrix_type, {nv, h});
  return w;
}

}  // namespace tandem::weights::testing
