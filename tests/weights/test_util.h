// Helpers for the weights tests: a temp directory and a tiny valid Llama model written with write_safetensors.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/temp_dir.h"
#include "weights/model_dir.h"
#include "weights/safetensors.h"

namespace tandem::weights::testing {

using nlohmann::json;

// Scratch space removed with its contents when the test ends.
using TempDir = ::tandem::core::TempDir;

inline void write_file(const std::string& path, std::string_view bytes) {
  // Unlink first: rewriting a truncated file makes ext4 (auto_da_alloc) flush it on close, ~1 ms per write.
  std::remove(path.c_str());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A raw safetensors file: 8-byte little-endian length, the header text as given, then `data_bytes` bytes.
inline std::string raw_safetensors(const std::string& header, std::size_t data_bytes, std::uint64_t len_override = 0,
                                   bool override_len = false) {
  const std::uint64_t n = override_len ? len_override : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += header;
  out.append(data_bytes, '\x01');
  return out;
}

// Tiny model dimensions: hidden 8, intermediate 16, 2 layers, 2 heads, 1 kv head, head_dim 4, vocab 32.
inline json tiny_config() {
  return json{
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_size", 8},
      {"intermediate_size", 16},
      {"num_hidden_layers", 2},
      {"num_attention_heads", 2},
      {"num_key_value_heads", 1},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", 10000.0},
      {"rope_scaling", nullptr},
      {"vocab_size", 32},
      {"max_position_embeddings", 64},
      {"tie_word_embeddings", false},
      {"torch_dtype", "float32"},
      {"hidden_act", "silu"},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
  };
}

struct OwnedTensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> data;
};

// Required tensors of `cfg_json` filled with a deterministic byte pattern.
inline std::vector<OwnedTensor> tensors_for(const json& cfg_json, DType dtype = DType::f32) {
  auto cfg = ModelConfig::parse(cfg_json.dump(), "config.json");
  EXPECT_TRUE(cfg.ok()) << (cfg.ok() ? "" : cfg.error().message);
  std::vector<OwnedTensor> out;
  if (!cfg.ok()) return out;
  std::uint8_t seed = 0;
  for (auto& [name, shape] : ModelDir::required_tensors(*cfg)) {
    OwnedTensor t{name, dtype, shape, {}};
    std::size_t n = dtype_size(dtype);
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    t.data.resize(n);
    for (std::size_t i = 0; i < n; ++i) t.data[i] = static_cast<std::byte>(seed + i * 31);
    ++seed;
    out.push_back(std::move(t));
  }
  return out;
}

inline Status write_tensors(const std::string& path, const std::vector<OwnedTensor>& ts,
                            const std::map<std::string, std::string>& meta = {}) {
  std::vector<TensorToWrite> w;
  for (const auto& t : ts) w.push_back({t.name, t.dtype, t.shape, std::span<const std::byte>(t.data)});
  return write_safetensors(path, w, meta);
}

// Writes config.json, tokenizer.model and model.safetensors for `cfg`.
inline void write_model(const TempDir& dir, const json& cfg, const std::vector<OwnedTensor>& ts) {
  write_file(dir / "config.json", cfg.dump(2));
  write_file(dir / "tokenizer.model", "not parsed here");
  ASSERT_TRUE(write_tensors(dir / "model.safetensors", ts).ok());
}

inline void write_model(const TempDir& dir) {
  const json cfg = tiny_config();
  write_model(dir, cfg, tensors_for(cfg));
}

// The message names `needle` (file, tensor or key).
#define EXPECT_ERR(result, errc, needle)                                           \
  do {                                                                             \
    const auto& _res = (result);                                                   \
    ASSERT_FALSE(_res.ok()) << "expected an error";                                \
    EXPECT_EQ(_res.error().code, (errc)) << _res.error().message;                  \
    EXPECT_NE(_res.error().message.find(needle), std::string::npos)                \
        << "message does not name '" << (needle) << "': " << _res.error().message; \
  } while (0)

}  // namespace tandem::weights::testing
