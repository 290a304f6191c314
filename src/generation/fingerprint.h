// Replica fingerprint: one stable hash over everything that must match for two replicas (GPU and CPU) to produce
// the same tokens for the same request: model config, tokenizer bytes, weights identity, compute dtype
// (quantization semantics), prompt template, default sampling and stop rules. Kept as named components too, so a
// mismatch can be explained ("compute_dtype: bf16 vs f32").
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tandem::gen {

struct Fingerprint {
  std::vector<std::pair<std::string, std::string>> components;  // (name, canonical value), fixed order
  std::string digest;  // "tfp1-" + first 32 hex chars of SHA-256 over the components

  static Fingerprint make(std::vector<std::pair<std::string, std::string>> components);
  // Names of the components whose values differ (or that only one side has).
  std::vector<std::string> diff(const Fingerprint& other) const;
  bool operator==(const Fingerprint& o) const { return digest == o.digest; }
};

}  // namespace tandem::gen
