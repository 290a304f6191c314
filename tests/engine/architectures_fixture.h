// What the architecture tests (test_architectures.cc, test_architectures_errors.cc) share: the GGUF file of a preset's
// test model, written once per process.
#pragma once

#include <filesystem>
#include <string>

#include "model_fixture.h"
#include "modelgen/gguf_convert.h"

namespace tandem::testing {

// The preset's model ("arch-<preset>", make_model) converted with recipe `r`.
inline std::string gguf_of(const std::string& preset, modelgen::Recipe r = modelgen::Recipe::f32) {
  const std::string hf = make_model("arch-" + preset, preset);
  const std::string out = testing::temp_root() + "/arch-" + preset + "-" +
                          std::string(modelgen::recipe_name(r)) + ".gguf";
  if (!std::filesystem::exists(out)) {
    auto st = modelgen::convert_to_gguf(hf, out, r);
    EXPECT_TRUE(st.ok()) << st.error().message;
  }
  return out;
}

}  // namespace tandem::testing
