// modelgen::recipe_type: llama.cpp's per-tensor type rules (llama-quant.cpp's llama_tensor_get_type, no importance
// matrix, dense models), one row per rule, including those no preset reaches (head_count / head_count_kv >= 4) and
// the fallbacks for rows that are not multiples of the type's block. Whole files against llama-quantize's bytes are
// tested in tests/engine (QuantizeDigest) and tests/tools (quantize_llama_bytes.sh).
#include <gtest/gtest.h>

#include "modelgen/gguf_convert.h"

namespace tandem::modelgen {
namespace {

using kernels::WType;

struct Row {
  const char* recipe;
  const char* tensor;
  std::uint64_t cols;
  int index;  // attn_v / ffn_down position
  int count;  // their total
  int n_gqa;
  bool tied;
  WType want;
};

const Row kRows[] = {
    // The output matrix (or the tied embedding): q6_K, or q8_0 when the type's blocks do not fit its rows.
    {"Q2_K", "output.weight", 4096, 0, 0, 1, false, WType::q6_K},
    {"IQ4_NL", "output.weight", 4096, 0, 0, 1, false, WType::q6_K},
    {"Q3_K_M", "token_embd.weight", 4096, 0, 0, 1, true, WType::q6_K},
    {"Q3_K_M", "token_embd.weight", 4096, 0, 0, 1, false, WType::q3_K},  // untied: the default type
    {"Q4_K_M", "output.weight", 896, 0, 0, 1, false, WType::q8_0},       // Qwen2.5-0.5B's hidden size
    {"Q8_0", "output.weight", 4096, 0, 0, 1, false, WType::q8_0},
    // attn_v.
    {"Q2_K", "blk.0.attn_v.weight", 4096, 0, 32, 1, false, WType::q3_K},
    {"Q2_K", "blk.0.attn_v.weight", 4096, 0, 32, 4, false, WType::q4_K},
    {"Q3_K_M", "blk.1.attn_v.weight", 4096, 1, 32, 1, false, WType::q5_K},
    {"Q3_K_M", "blk.2.attn_v.weight", 4096, 2, 32, 1, false, WType::q4_K},
    {"Q3_K_L", "blk.9.attn_v.weight", 4096, 9, 32, 1, false, WType::q5_K},
    {"Q3_K_S", "blk.0.attn_v.weight", 4096, 0, 32, 8, false, WType::q3_K},
    {"IQ4_XS", "blk.5.attn_v.weight", 4096, 5, 32, 4, false, WType::q5_K},
    {"IQ4_XS", "blk.5.attn_v.weight", 4096, 5, 32, 2, false, WType::iq4_xs},
    {"IQ4_NL", "blk.5.attn_v.weight", 4096, 5, 32, 8, false, WType::q5_K},
    {"Q4_K_M", "blk.0.attn_v.weight", 4096, 0, 32, 1, false, WType::q6_K},   // use_more_bits: first eighth
    {"Q4_K_M", "blk.5.attn_v.weight", 4096, 5, 32, 1, false, WType::q4_K},   // (5 - 4) % 3 == 1
    {"Q4_K_M", "blk.6.attn_v.weight", 4096, 6, 32, 1, false, WType::q6_K},   // (6 - 4) % 3 == 2
    {"Q4_K_S", "blk.3.attn_v.weight", 4096, 3, 32, 1, false, WType::q5_K},
    // ffn_down.
    {"Q2_K", "blk.7.ffn_down.weight", 11008, 7, 32, 1, false, WType::q3_K},
    {"Q3_K_M", "blk.1.ffn_down.weight", 11008, 1, 32, 1, false, WType::q5_K},  // first sixteenth
    {"Q3_K_M", "blk.2.ffn_down.weight", 11008, 2, 32, 1, false, WType::q4_K},
    {"Q3_K_L", "blk.20.ffn_down.weight", 11008, 20, 32, 1, false, WType::q5_K},
    {"IQ4_NL", "blk.3.ffn_down.weight", 11008, 3, 32, 1, false, WType::q5_K},  // first eighth
    {"IQ4_NL", "blk.4.ffn_down.weight", 11008, 4, 32, 1, false, WType::iq4_nl},
    {"Q5_K_M", "blk.31.ffn_down.weight", 11008, 31, 32, 1, false, WType::q6_K},
    // attn_output (dense models).
    {"Q2_K", "blk.0.attn_output.weight", 4096, 0, 0, 1, false, WType::q3_K},
    {"Q3_K_M", "blk.0.attn_output.weight", 4096, 0, 0, 1, false, WType::q4_K},
    {"Q3_K_L", "blk.0.attn_output.weight", 4096, 0, 0, 1, false, WType::q5_K},
    {"Q3_K_S", "blk.0.attn_output.weight", 4096, 0, 0, 1, false, WType::q3_K},
    {"Q4_K_M", "blk.0.attn_output.weight", 4096, 0, 0, 1, false, WType::q4_K},
    // Phi-3's fused attn_qkv.
    {"Q3_K_M", "blk.0.attn_qkv.weight", 3072, 0, 0, 1, false, WType::q4_K},
    {"Q3_K_L", "blk.0.attn_qkv.weight", 3072, 0, 0, 1, false, WType::q4_K},
    {"Q4_K_M", "blk.0.attn_qkv.weight", 3072, 0, 0, 1, false, WType::q5_K},
    {"Q5_K_M", "blk.0.attn_qkv.weight", 3072, 0, 0, 1, false, WType::q6_K},
    // Fallbacks for rows that are not multiples of 256 (896: Qwen2.5-0.5B), then of 32 (f16).
    {"Q2_K", "blk.0.attn_q.weight", 896, 0, 0, 1, false, WType::iq4_nl},
    {"Q3_K_S", "blk.0.attn_q.weight", 896, 0, 0, 1, false, WType::iq4_nl},
    {"IQ4_XS", "blk.0.attn_q.weight", 896, 0, 0, 1, false, WType::iq4_nl},
    {"Q4_K_M", "blk.0.attn_q.weight", 896, 0, 0, 1, false, WType::q5_0},
    {"Q5_K_S", "blk.0.attn_q.weight", 896, 0, 0, 1, false, WType::q5_1},
    {"Q6_K", "blk.0.attn_q.weight", 896, 0, 0, 1, false, WType::q8_0},
    {"Q3_K_L", "blk.0.attn_v.weight", 896, 0, 32, 1, false, WType::q5_1},     // q5_K, then its fallback
    {"Q2_K", "blk.0.attn_q.weight", 80, 0, 0, 1, false, WType::f16},          // not even a multiple of 32
    {"IQ4_NL", "blk.0.attn_q.weight", 96, 0, 0, 1, false, WType::iq4_nl},
    // Norms and vectors are never quantized (and are F32).
    {"Q2_K", "blk.0.attn_norm.weight", 4096, 0, 0, 1, false, WType::f32},
};

TEST(RecipeType, FollowsLlamaQuantizesPerTensorRules) {
  for (const Row& r : kRows) {
    SCOPED_TRACE(std::string(r.recipe) + " " + r.tensor + " cols " + std::to_string(r.cols) + " gqa " +
                 std::to_string(r.n_gqa));
    auto recipe = parse_recipe(r.recipe);
    ASSERT_TRUE(recipe.ok());
    TensorSlot t;
    t.name = r.tensor;
    t.ne = std::string(r.tensor).find("norm") != std::string::npos ? std::vector<std::uint64_t>{r.cols}
                                                                   : std::vector<std::uint64_t>{r.cols, 64};
    t.stored = WType::f16;
    t.attn_v_index = t.ffn_down_index = r.index;
    t.attn_v_count = t.ffn_down_count = r.count;
    t.n_gqa = r.n_gqa;
    t.tied = r.tied;
    auto got = recipe_type(*recipe, t);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(kernels::wtype_name(*got), kernels::wtype_name(r.want));
  }
}

TEST(RecipeType, EveryRecipeNameRoundTripsAndUnknownOnesAreListed) {
  for (const char* name : {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M",
                           "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS"}) {
    auto r = parse_recipe(name);
    ASSERT_TRUE(r.ok()) << name;
    EXPECT_EQ(recipe_name(*r), name);
  }
  auto bad = parse_recipe("IQ2_XXS");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, Errc::invalid_argument);
  EXPECT_NE(bad.error().message.find("Q3_K_M"), std::string::npos) << bad.error().message;
}

}  // namespace
}  // namespace tandem::modelgen
