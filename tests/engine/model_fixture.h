// Builds test models once per test binary in a temporary directory.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>

#include "core/temp_dir.h"
#include "engine/model.h"
#include "modelgen/modelgen.h"

namespace tandem::testing {

inline std::string tokenizer_path() { return std::string(TANDEM_SOURCE_DIR) + "/data/tokenizer/llama2/tokenizer.model"; }

// The binary's scratch directory (removed when it exits): the models it writes.
inline std::string temp_root() { return core::scratch_root("test"); }

// Writes (once) a model named `name` from preset `preset` with the given dtype / shards / seed.
inline std::string make_model(const std::string& name, const std::string& preset = "test",
                              weights::DType dtype = weights::DType::f32, int shards = 1, std::uint64_t seed = 7,
                              const std::string& chat_template = "") {
  static std::map<std::string, std::string> made;
  if (auto it = made.find(name); it != made.end()) return it->second;
  modelgen::Options o;
  o.shape = *modelgen::preset(preset);
  o.dtype = dtype;
  o.shards = shards;
  o.seed = seed;
  o.tokenizer_model = tokenizer_path();
  o.extra_pieces = modelgen::preset_extra_pieces(preset);
  o.chat_template = chat_template;
  const std::string dir = temp_root() + "/" + name;
  auto s = modelgen::write_model(dir, o);
  EXPECT_TRUE(s.ok()) << s.error().message;
  made[name] = dir;
  return dir;
}

inline std::shared_ptr<engine::Model> load(const std::string& dir, engine::LoadOptions lo = {}) {
  auto m = engine::Model::load(dir, lo);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  return m.ok() ? *m : nullptr;
}

// Greedy decoding over the paged path: `ids` as one prefill, then `steps` argmax tokens (the last one is not fed
// back). `first` (optional) receives the prefill's logits. Failures are test failures; the tokens so far return.
inline std::vector<int> greedy(engine::Model& m, const std::vector<int>& ids, int steps,
                               std::vector<float>* first = nullptr) {
  auto seq = m.new_sequence();
  EXPECT_TRUE(seq.ok());
  std::vector<int> out;
  if (!seq.ok()) return out;
  auto logits = m.forward(**seq, ids);
  EXPECT_TRUE(logits.ok()) << (logits.ok() ? "" : logits.error().message);
  if (!logits.ok()) return out;
  if (first) *first = *logits;
  for (int s = 0; s < steps; ++s) {
    const auto& l = *logits;
    out.push_back(static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin()));
    if (s + 1 == steps) break;
    logits = m.forward(**seq, std::vector<int>{out.back()});
    if (!logits.ok()) break;
  }
  return out;
}

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b, std::size_t off_a = 0,
                          std::size_t off_b = 0, std::size_t n = 0) {
  if (n == 0) n = std::min(a.size() - off_a, b.size() - off_b);
  float m = 0;
  for (std::size_t i = 0; i < n; ++i) m = std::max(m, std::abs(a[off_a + i] - b[off_b + i]));
  return m;
}

}  // namespace tandem::testing
