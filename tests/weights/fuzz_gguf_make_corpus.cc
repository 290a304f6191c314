// Writes the seed corpus of fuzz_gguf with GgufWriter (scripts/fuzz.sh runs it into build-fuzz/fuzz-seeds/gguf; the
// seeds are generated, not checked in):
//   fuzz_gguf_make_corpus DIR
// Every metadata value type with nested arrays and tensors of many ggml types; three tiny Llama models (q8_0 with a
// byte-fallback vocabulary and tied output; f16 untied with a small vocabulary, a chat template and rope scaling;
// q5_0 untied; iq4_nl untied); a tiny gemma3 (q/k norms, post-norms); a tiny BERT text encoder (llama.cpp's bert
// layout with a WordPiece vocabulary in its phantom-space spelling); a vocabulary-only file; a version-2 file with
// alignment 64.
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/types.h"
#include "weights/gguf.h"

using namespace tandem;
using namespace tandem::weights;

namespace {

std::vector<std::byte> bytes(std::size_t n, unsigned seed) {
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

void vocab(GgufWriter& w, bool byte_pieces) {
  std::vector<std::string> t = {"<unk>", "<s>", "</s>"};
  std::vector<std::int32_t> types = {2, 3, 3};
  if (byte_pieces) {
    char buf[8];
    for (int i = 0; i < 256; ++i) {
      std::snprintf(buf, sizeof buf, "<0x%02X>", i);
      t.push_back(buf);
      types.push_back(6);
    }
  }
  for (const char* p :
       {"\xE2\x96\x81", "H", "e", "l", "o", "\xE2\x96\x81H", "ll", "llo", "\xE2\x96\x81He", "<|user|>"}) {
    t.push_back(p);
    types.push_back(std::string(p) == "<|user|>" ? 4 : 1);
  }
  std::vector<float> scores(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) scores[i] = -static_cast<float>(i);
  w.set("tokenizer.ggml.model", GgufValue::of_string("llama"));
  w.set("tokenizer.ggml.tokens", GgufValue::of_strings(t));
  w.set("tokenizer.ggml.scores", GgufValue::of_f32s(scores));
  w.set("tokenizer.ggml.token_type", GgufValue::of_i32s(types));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::of_uint(GgufType::u32, 1));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::of_uint(GgufType::u32, 2));
  w.set("tokenizer.ggml.unknown_token_id", GgufValue::of_uint(GgufType::u32, 0));
  w.set("tokenizer.ggml.add_bos_token", GgufValue::of_bool(true));
  w.set("tokenizer.ggml.add_space_prefix", GgufValue::of_bool(true));
}

GgufWriter llama(kernels::WType mt, bool byte_pieces, bool tied) {
  GgufWriter w;
  const int hidden = 32, inter = 32, heads = 2, kv_heads = 1, hd = hidden / heads;
  w.set("general.architecture", GgufValue::of_string("llama"));
  w.set("llama.context_length", GgufValue::of_uint(GgufType::u32, 64));
  w.set("llama.embedding_length", GgufValue::of_uint(GgufType::u32, hidden));
  w.set("llama.block_count", GgufValue::of_uint(GgufType::u32, 1));
  w.set("llama.feed_forward_length", GgufValue::of_uint(GgufType::u32, inter));
  w.set("llama.attention.head_count", GgufValue::of_uint(GgufType::u32, heads));
  w.set("llama.attention.head_count_kv", GgufValue::of_uint(GgufType::u32, kv_heads));
  w.set("llama.rope.freq_base", GgufValue::of_float(GgufType::f32, 10000.0));
  w.set("llama.attention.layer_norm_rms_epsilon", GgufValue::of_float(GgufType::f32, 1e-5));
  w.set("llama.rope.dimension_count", GgufValue::of_uint(GgufType::u32, hd));
  vocab(w, byte_pieces);
  const std::int64_t nv = byte_pieces ? 269 : 13;
  unsigned seed = 0;
  auto add = [&](const char* name, kernels::WType t, std::vector<std::int64_t> shape) {
    const std::size_t rows = shape.size() == 2 ? static_cast<std::size_t>(shape[0]) : 1;
    const auto data = bytes(kernels::row_bytes(t, shape.back()) * rows, seed++);
    if (!w.add_tensor(name, t, shape, data).ok()) std::abort();
  };
  add("token_embd.weight", mt, {nv, hidden});
  add("blk.0.attn_norm.weight", kernels::WType::f32, {hidden});
  add("blk.0.attn_q.weight", mt, {heads * hd, hidden});
  add("blk.0.attn_k.weight", mt, {kv_heads * hd, hidden});
  add("blk.0.attn_v.weight", mt, {kv_heads * hd, hidden});
  add("blk.0.attn_output.weight", mt, {hidden, heads * hd});
  add("blk.0.ffn_norm.weight", kernels::WType::f32, {hidden});
  add("blk.0.ffn_gate.weight", mt, {inter, hidden});
  add("blk.0.ffn_up.weight", mt, {inter, hidden});
  add("blk.0.ffn_down.weight", mt, {hidden, inter});
  add("output_norm.weight", kernels::WType::f32, {hidden});
  if (!tied) add("output.weight", mt, {nv, hidden});
  return w;
}

// The llama seed renamed gemma3, with the tensors that architecture adds.
GgufWriter gemma3() {
  GgufWriter w = llama(kernels::WType::q8_0, false, true);
  w.set("general.architecture", GgufValue::of_string("gemma3"));
  const int hidden = 32, hd = 16;
  w.set("gemma3.context_length", GgufValue::of_uint(GgufType::u32, 64));
  w.set("gemma3.embedding_length", GgufValue::of_uint(GgufType::u32, hidden));
  w.set("gemma3.block_count", GgufValue::of_uint(GgufType::u32, 1));
  w.set("gemma3.feed_forward_length", GgufValue::of_uint(GgufType::u32, 32));
  w.set("gemma3.attention.head_count", GgufValue::of_uint(GgufType::u32, 2));
  w.set("gemma3.attention.head_count_kv", GgufValue::of_uint(GgufType::u32, 1));
  w.set("gemma3.attention.key_length", GgufValue::of_uint(GgufType::u32, hd));
  w.set("gemma3.attention.layer_norm_rms_epsilon", GgufValue::of_float(GgufType::f32, 1e-6));
  w.set("gemma3.attention.sliding_window", GgufValue::of_uint(GgufType::u32, 8));
  w.set("gemma3.rope.freq_base", GgufValue::of_float(GgufType::f32, 1e6));
  unsigned seed = 50;
  for (const char* n : {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"})
    if (!w.add_tensor(n, kernels::WType::f32, {hd}, bytes(hd * 4, seed++)).ok()) std::abort();
  for (const char* n : {"blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight"})
    if (!w.add_tensor(n, kernels::WType::f32, {hidden}, bytes(hidden * 4, seed++)).ok()) std::abort();
  return w;
}

// A one-layer BERT text encoder as llama.cpp's converter writes it.
GgufWriter bert() {
  GgufWriter w;
  const int hidden = 32, inter = 64;
  w.set("general.architecture", GgufValue::of_string("bert"));
  w.set("bert.context_length", GgufValue::of_uint(GgufType::u32, 16));
  w.set("bert.embedding_length", GgufValue::of_uint(GgufType::u32, hidden));
  w.set("bert.feed_forward_length", GgufValue::of_uint(GgufType::u32, inter));
  w.set("bert.block_count", GgufValue::of_uint(GgufType::u32, 1));
  w.set("bert.attention.head_count", GgufValue::of_uint(GgufType::u32, 2));
  w.set("bert.attention.layer_norm_epsilon", GgufValue::of_float(GgufType::f32, 1e-12));
  w.set("bert.attention.causal", GgufValue::of_bool(false));
  w.set("bert.pooling_type", GgufValue::of_uint(GgufType::u32, 1));
  const std::vector<std::string> toks = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "\xE2\x96\x81hello", "\xE2\x96\x81w",
                                         "or", "ld", "\xE2\x96\x81,", "\xE2\x96\x81\xE4\xB8\xAD"};
  w.set("tokenizer.ggml.model", GgufValue::of_string("bert"));
  w.set("tokenizer.ggml.tokens", GgufValue::of_strings(toks));
  w.set("tokenizer.ggml.token_type_count", GgufValue::of_uint(GgufType::u32, 2));
  w.set("tokenizer.ggml.padding_token_id", GgufValue::of_uint(GgufType::u32, 0));
  const std::int64_t nv = static_cast<std::int64_t>(toks.size());
  unsigned seed = 70;
  auto add = [&](const std::string& name, kernels::WType t, std::vector<std::int64_t> shape) {
    const std::size_t rows = shape.size() == 2 ? static_cast<std::size_t>(shape[0]) : 1;
    if (!w.add_tensor(name, t, shape, bytes(kernels::row_bytes(t, shape.back()) * rows, seed++)).ok()) std::abort();
  };
  const auto f32 = kernels::WType::f32, q8 = kernels::WType::q8_0;
  add("token_embd.weight", f32, {nv, hidden});
  add("token_types.weight", f32, {2, hidden});
  add("position_embd.weight", f32, {16, hidden});
  add("token_embd_norm.weight", f32, {hidden});
  add("token_embd_norm.bias", f32, {hidden});
  for (const char* m : {"attn_q", "attn_k", "attn_v", "attn_output"}) {
    add(std::string("blk.0.") + m + ".weight", q8, {hidden, hidden});
    add(std::string("blk.0.") + m + ".bias", f32, {hidden});
  }
  add("blk.0.attn_output_norm.weight", f32, {hidden});
  add("blk.0.attn_output_norm.bias", f32, {hidden});
  add("blk.0.ffn_up.weight", q8, {inter, hidden});
  add("blk.0.ffn_up.bias", f32, {inter});
  add("blk.0.ffn_down.weight", q8, {hidden, inter});
  add("blk.0.ffn_down.bias", f32, {hidden});
  add("blk.0.layer_output_norm.weight", f32, {hidden});
  add("blk.0.layer_output_norm.bias", f32, {hidden});
  return w;
}

GgufWriter all_types() {
  GgufWriter w;
  w.set("u8", GgufValue::of_uint(GgufType::u8, 200));
  w.set("i8", GgufValue::of_int(GgufType::i8, -5));
  w.set("u16", GgufValue::of_uint(GgufType::u16, 65000));
  w.set("i16", GgufValue::of_int(GgufType::i16, -300));
  w.set("u32", GgufValue::of_uint(GgufType::u32, 32));
  w.set("i32", GgufValue::of_int(GgufType::i32, -70000));
  w.set("f32", GgufValue::of_float(GgufType::f32, 1.5));
  w.set("bool", GgufValue::of_bool(true));
  w.set("str", GgufValue::of_string("hello"));
  w.set("u64", GgufValue::of_uint(GgufType::u64, 1ull << 40));
  w.set("i64", GgufValue::of_int(GgufType::i64, -(1ll << 40)));
  w.set("f64", GgufValue::of_float(GgufType::f64, 0.25));
  w.set("arr.u8", GgufValue::of_array(GgufType::u8, {GgufValue::of_uint(GgufType::u8, 1)}));
  w.set("arr.bool", GgufValue::of_array(GgufType::boolean, {GgufValue::of_bool(true), GgufValue::of_bool(false)}));
  w.set("arr.str", GgufValue::of_strings({"a", "bc", ""}));
  w.set("arr.nested", GgufValue::of_array(GgufType::array, {GgufValue::of_i32s(std::vector<std::int32_t>{1, 2}),
                                                            GgufValue::of_strings({"x"})}));
  const std::pair<std::uint32_t, std::vector<std::uint64_t>> ts[] = {
      {0, {4, 2}}, {1, {8}},       {30, {4}},    {8, {32}},    {2, {32}},    {6, {32}},    {3, {32}}, {7, {32}},
      {20, {32}},  {12, {256}},    {13, {256}},  {14, {256}},  {23, {256}},  {10, {256}},  {11, {256}},
  };
  unsigned seed = 100;
  for (const auto& [type, ne] : ts) {
    const GgmlTypeInfo ti = ggml_type_info(type);
    std::size_t n = ti.block_bytes * (ne[0] / static_cast<std::uint64_t>(ti.block_elems));
    for (std::size_t d = 1; d < ne.size(); ++d) n *= ne[d];
    if (!w.add_tensor("t." + std::string(ti.name), type, ne, bytes(n, seed++)).ok()) std::abort();
  }
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  GgufWriter f16 = llama(kernels::WType::f16, false, false);
  f16.set("tokenizer.chat_template", GgufValue::of_string("{% for m in messages %}<|user|>{{ m }}{% endfor %}"));
  f16.set("llama.rope.scaling.type", GgufValue::of_string("linear"));
  f16.set("llama.rope.scaling.factor", GgufValue::of_float(GgufType::f32, 2.0));
  const GgufWriter q5 = llama(kernels::WType::q5_0, false, false);
  const GgufWriter iq4 = llama(kernels::WType::iq4_nl, false, false);
  const GgufWriter g3 = gemma3();
  const GgufWriter bt = bert();
  GgufWriter voc;
  voc.set("general.architecture", GgufValue::of_string("llama"));
  vocab(voc, true);
  GgufWriter v2(64, 2);
  v2.set("general.architecture", GgufValue::of_string("llama"));
  if (!v2.add_tensor("t", 0, {3}, bytes(12, 9)).ok()) return 1;
  const std::pair<const char*, const GgufWriter*> seeds[] = {
      {"all_types.gguf", nullptr}, {"llama_q8_0_bytes_tied.gguf", nullptr},
      {"llama_f16.gguf", &f16},    {"vocab_only.gguf", &voc},
      {"v2_align64.gguf", &v2},    {"llama_q5_0.gguf", &q5}, {"llama_iq4_nl.gguf", &iq4},
      {"gemma3_q8_0.gguf", &g3},   {"bert_q8_0.gguf", &bt},
  };
  const GgufWriter types = all_types();
  const GgufWriter q8 = llama(kernels::WType::q8_0, true, true);
  for (const auto& [name, w] : seeds) {
    const GgufWriter& src = w != nullptr ? *w : std::string(name) == "all_types.gguf" ? types : q8;
    const Status st = src.write(dir + "/" + name);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.error().message.c_str());
      return 1;
    }
  }
  return 0;
}
