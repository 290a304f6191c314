#include "generation/fingerprint.h"

#include "core/sha256.h"

namespace tandem::gen {

Fingerprint Fingerprint::make(std::vector<std::pair<std::string, std::string>> components) {
  Sha256 h;
  h.update("tandem-fingerprint-v1\n");
  for (const auto& [k, v] : components) {
    // Length-prefixed so no two component lists hash the same by shifting text between fields.
    h.update(std::to_string(k.size()) + ":" + k + "=" + std::to_string(v.size()) + ":");
    h.update(v);
    h.update("\n");
  }
  Fingerprint f;
  f.components = std::move(components);
  f.digest = "tfp1-" + Sha256::hex(h.finish()).substr(0, 32);
  return f;
}

std::vector<std::string> Fingerprint::diff(const Fingerprint& other) const {
  std::vector<std::string> out;
  for (const auto& [k, v] : components) {
    bool found = false;
    for (const auto& [k2, v2] : other.components)
      if (k2 == k) {
        found = true;
        if (v2 != v) out.push_back(k);
      }
    if (!found) out.push_back(k);
  }
  for (const auto& [k2, v2] : other.components) {
    bool found = false;
    for (const auto& [k, v] : components) found = found || k == k2;
    if (!found) out.push_back(k2);
  }
  return out;
}

}  // namespace tandem::gen
