// The "What loads" table of docs/model-format.md, kept true: every "yes" cell (architecture preset × layout / GGUF
// recipe) is written with Tandem's own writers and loaded by the engine, which runs one forward on the CPU; every
// recipe tandem-quantize knows must have a column. The models are the presets' architectures at a width whose rows
// fit the 256-element super-blocks (hidden 256, FFN 512, one layer), so the k-quant and iq4 cells hold those types
// and not only their fallbacks.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "model_fixture.h"
#include "modelgen/gguf_convert.h"
#include "modelgen/modelgen.h"

namespace tandem {
namespace {

struct Table {
  std::vector<std::string> columns;                              // after the architecture column
  std::vector<std::pair<std::string, std::vector<std::string>>> rows;  // preset, cells
};

std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string c;
  while (std::getline(ss, c, '|')) {
    const auto b = c.find_first_not_of(' '), e = c.find_last_not_of(' ');
    out.push_back(b == std::string::npos ? "" : c.substr(b, e - b + 1));
  }
  if (!out.empty() && out.front().empty()) out.erase(out.begin());
  return out;
}

Table read_table() {
  std::ifstream f(std::string(TANDEM_SOURCE_DIR) + "/docs/model-format.md");
  std::string line;
  Table t;
  bool in = false;
  while (std::getline(f, line)) {
    if (line.rfind("<!-- what-loads", 0) == 0) {
      in = true;
      continue;
    }
    if (!in) continue;
    if (line.empty() || line[0] != '|') break;
    const auto c = cells(line);
    if (t.columns.empty()) {
      t.columns.assign(c.begin() + 1, c.end());
    } else if (c.size() > 1 && c[1] != "---") {
      const auto a = c[0].find('`'), b = c[0].rfind('`');
      t.rows.emplace_back(c[0].substr(a + 1, b - a - 1), std::vector<std::string>(c.begin() + 1, c.end()));
    }
  }
  return t;
}

TEST(WhatLoads, EveryCellOfTheDocumentedTableLoadsAndRuns) {
  const Table t = read_table();
  ASSERT_FALSE(t.columns.empty()) << "docs/model-format.md has no what-loads table";
  ASSERT_GE(t.rows.size(), 8u);
  // Every recipe tandem-quantize takes has a column.
  for (const char* r : {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M",
                        "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS"}) {
    ASSERT_TRUE(modelgen::parse_recipe(r).ok()) << r;
    EXPECT_NE(std::find(t.columns.begin(), t.columns.end(), r), t.columns.end()) << r << " has no column";
  }
  int loaded = 0;
  for (const auto& [preset, row] : t.rows) {
    ASSERT_EQ(row.size(), t.columns.size()) << preset;
    auto shape = modelgen::preset(preset);
    ASSERT_TRUE(shape.ok()) << preset << ": not a tandem-mkmodel preset";
    shape->hidden = 256;
    shape->intermediate = 512;
    shape->layers = 1;
    if (shape->head_dim > 0) shape->head_dim = 128;  // (Qwen3, Gemma: wider than hidden / heads)
    const auto bpe = modelgen::preset_bpe_vocab(preset);
    if (bpe) shape->vocab = static_cast<int>(bpe->tokens.size());  // (time: the embedding dominates the conversions)
    std::map<std::string, std::string> hf;
    for (const auto& [tag, dtype] : {std::pair{"f32", weights::DType::f32}, std::pair{"f16", weights::DType::f16},
                                     std::pair{"bf16", weights::DType::bf16}}) {
      modelgen::Options o;
      o.shape = *shape;
      o.dtype = dtype;
      o.tokenizer_model = testing::tokenizer_path();
      o.bpe = bpe;
      o.extra_pieces = modelgen::preset_extra_pieces(preset);
      o.chat_template = std::string(modelgen::preset_chat_template(preset));
      const std::string dir = testing::temp_root() + "/loads-" + preset + "-" + tag;
      ASSERT_TRUE(modelgen::write_model(dir, o).ok()) << preset << " " << tag;
      hf[tag] = dir;
    }
    for (std::size_t i = 0; i < t.columns.size(); ++i) {
      const std::string& col = t.columns[i];
      SCOPED_TRACE(preset + " × " + col);
      ASSERT_TRUE(row[i] == "yes" || row[i] == "no") << "cell '" << row[i] << "'";
      if (row[i] != "yes") continue;
      std::string path;
      if (col.rfind("HF ", 0) == 0) {
        path = hf.at(col.substr(3));
      } else {
        auto r = modelgen::parse_recipe(col);
        ASSERT_TRUE(r.ok()) << "column '" << col << "' is not a recipe";
        path = testing::temp_root() + "/loads-" + preset + "-" + col + ".gguf";
        auto st = modelgen::convert_to_gguf(hf.at("f16"), path, *r, 2);
        ASSERT_TRUE(st.ok()) << st.error().message;
        // The recipe's main type is really in the file (not only fallbacks).
        bool has = false;
        for (const auto& [name, type] : st->types) has = has || type == modelgen::recipe_default_type(*r);
        EXPECT_TRUE(has) << "no " << kernels::wtype_name(modelgen::recipe_default_type(*r)) << " tensor";
      }
      engine::LoadOptions lo;
      lo.max_context = 32;
      auto m = testing::load(path, lo);
      ASSERT_TRUE(m) << path;
      auto seq = m->new_sequence();
      ASSERT_TRUE(seq.ok());
      auto logits = m->forward(**seq, std::vector<int>{1, 100, 200, 300});
      ASSERT_TRUE(logits.ok()) << logits.error().message;
      for (float v : *logits) ASSERT_TRUE(std::isfinite(v));
      ++loaded;
    }
  }
  std::printf("[ report ] %d cells of the what-loads table loaded and ran\n", loaded);
}

}  // namespace
}  // namespace tandem
