// tandem-train-clip end to end (docs/default-embedding-model.md): `--quick` trains a model in seconds; the daemon's
// path — engine::ClipModel on the written directory, its tokenizer files, preprocessor_config.json through
// image::clip_preprocess — retrieves held-out scenes far above chance; a second run writes the same bytes; --render
// writes the scenes it names. The tool's path comes from TANDEM_TRAIN_CLIP (tests/tools/meson.build).
//
// Why the thresholds cannot flake: the quick run is a pure function of its inputs — fixed seeds (init, caption choice,
// scene stream, held-out pool), a fixed step count (no time budget), one worker thread with single-threaded ATen and
// OpenBLAS — so on one machine it gives the same model every time (ModelIsDeterministic checks that). Another CPU
// may round differently (OpenBLAS picks kernels per CPU), so the thresholds sit far below the measured figures and
// far above chance (see each EXPECT).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/temp_dir.h"
#include "core/sha256.h"
#include "engine/clip.h"
#include "image/image.h"
#include "modelgen/clip_data.h"
#include "tokenizer/model_tokenizer.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
namespace cd = modelgen::clipdata;

std::string tool() {
  const char* p = std::getenv("TANDEM_TRAIN_CLIP");
  return p ? p : "";
}

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs the tool with `args`; returns its exit status (-1 when it did not exit normally).
int run_tool(const std::vector<std::string>& args) {
  std::string cmd = "'" + tool() + "'";
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " >/dev/null 2>&1";
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

class TrainClip : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_FALSE(tool().empty()) << "TANDEM_TRAIN_CLIP is not set";
    auto made = tandem::core::make_temp_dir("tandem-train-clip-test");
    ASSERT_TRUE(made.ok()) << made.error().message;
    dir_ = new std::string(*made);
    rc_ = run_tool({"--quick", "--quiet", "--out", *dir_ + "/a"});
  }
  static void TearDownTestSuite() {
    if (dir_) fs::remove_all(*dir_);
    delete dir_;
    dir_ = nullptr;
  }
  static std::string* dir_;
  static int rc_;
};
std::string* TrainClip::dir_ = nullptr;
int TrainClip::rc_ = -1;

TEST_F(TrainClip, QuickModelRetrievesHeldOutScenes) {
  ASSERT_EQ(rc_, 0) << "tandem-train-clip --quick failed (it also fails when the engine check does)";
  const std::string m = *dir_ + "/a";
  for (const char* f : {"config.json", "model.safetensors", "preprocessor_config.json", "vocab.json", "merges.txt",
                        "training.json"})
    EXPECT_TRUE(fs::exists(fs::path(m) / f)) << f;

  // The daemon's path: engine, tokenizer files, preprocessor_config.json.
  auto model = engine::ClipModel::load(m, engine::ClipLoadOptions{});
  ASSERT_TRUE(model) << model.error().message;
  auto tok = tok::load_tokenizer_files(m);
  ASSERT_TRUE(tok) << tok.error().message;
  auto pp = image::clip_preprocess_from_json(read(fs::path(m) / "preprocessor_config.json"));
  ASSERT_TRUE(pp) << pp.error().message;
  EXPECT_EQ(pp->crop, cd::kImageSize);

  const auto pool = cd::heldout_scenes(200);
  const auto queries = cd::short_queries(pool);
  std::vector<std::vector<float>> pixels;
  std::vector<std::vector<std::int32_t>> full, shorts;
  auto ids = [&](const std::string& text) {
    const auto v = tok->encode(text, /*add_bos=*/true, /*add_eos=*/true);
    return std::vector<std::int32_t>(v.begin(), v.end());
  };
  for (const auto& s : pool) {
    pixels.push_back(image::clip_preprocess(s.image, *pp));
    full.push_back(ids(cd::full_caption(s)));
  }
  for (const auto& q : queries) shorts.push_back(ids(q.text));
  auto ei = (*model)->embed_images(pixels);
  auto ef = (*model)->embed_texts(full);
  auto es = (*model)->embed_texts(shorts);
  ASSERT_TRUE(ei && ef && es);
  auto flat = [](const std::vector<std::vector<float>>& rows) {
    std::vector<float> v;
    for (const auto& r : rows) v.insert(v.end(), r.begin(), r.end());
    return v;
  };
  const std::size_t dim = (*ei)[0].size();
  const auto fi = flat(*ei), ff = flat(*ef), fsh = flat(*es);
  const cd::Retrieval r = cd::retrieval(pool, fi, ff, fsh, dim);
  std::printf("quick model, 200 held-out scenes: full caption -> image top-1 %.3f top-5 %.3f (chance %.3f / %.3f); "
              "\"a <colour> <shape>\" top-1 %.3f top-5 %.3f (chance %.3f / %.3f); image -> image top-1 %.3f "
              "(chance %.3f), top-5 %.3f (chance %.3f)\n",
              r.text_top1.hit, r.text_top5.hit, r.text_top1.chance, r.text_top5.chance, r.short_top1.hit,
              r.short_top5.hit, r.short_top1.chance, r.short_top5.chance, r.image_top1.hit, r.image_top1.chance,
              r.image_top5.hit, r.image_top5.chance);

  // Margins. Measured on the build machine (docs/default-embedding-model.md, "Tests"): full caption top-5 0.255
  // (chance 0.027), "a <colour> <shape>" top-5 0.467 (chance 0.148), image -> image top-5 0.164 (chance
  // 0.059). Each threshold is a multiple of its chance level well under the measured figure.
  EXPECT_GE(r.text_top5.hit, 4 * r.text_top5.chance);
  EXPECT_GE(r.short_top5.hit, 2 * r.short_top5.chance);
  EXPECT_GE(r.image_top5.hit, 1.5 * r.image_top5.chance);

  // The tool's own figures (training forward) agree with the engine's, and its equivalence check passed.
  const auto j = nlohmann::json::parse(read(fs::path(m) / "training.json"));
  EXPECT_TRUE(j["engine_check"]["passed"].get<bool>());
  EXPECT_LE(j["engine_check"]["max_abs_diff"].get<double>(), 1e-3);
  EXPECT_EQ(j["steps"].get<int>(), 150);
  EXPECT_FALSE(j["cut_by_time_budget"].get<bool>());
  // A rank can flip between two near-equal scores (|diff| ~1e-7): allow one query either way.
  EXPECT_NEAR(j["heldout"]["after"]["text_to_image_top5"]["hit"].get<double>(), r.text_top5.hit, 1.0 / 200 + 1e-9);
  EXPECT_NEAR(j["heldout"]["after"]["short_query_top5"]["hit"].get<double>(), r.short_top5.hit,
              1.0 / static_cast<double>(queries.size()) + 1e-9);
}

// Same inputs, same bytes: the reason the thresholds above cannot flake on a given machine.
TEST_F(TrainClip, ModelIsDeterministic) {
  ASSERT_EQ(rc_, 0);
  ASSERT_EQ(run_tool({"--quick", "--quiet", "--out", *dir_ + "/b"}), 0);
  for (const char* f : {"model.safetensors", "config.json", "vocab.json", "merges.txt"})
    EXPECT_EQ(Sha256::hex(Sha256::of(read(fs::path(*dir_) / "a" / f))),
              Sha256::hex(Sha256::of(read(fs::path(*dir_) / "b" / f))))
        << f;
}

// --render writes the held-out scenes by default, named by content, as PNGs that decode to the rendered pixels.
TEST_F(TrainClip, RenderWritesNamedScenes) {
  const std::string out = *dir_ + "/images";
  ASSERT_EQ(run_tool({"--render", out, "12"}), 0);
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(out)) {
    (void)e;
    ++n;
  }
  EXPECT_EQ(n, 12u);
  for (std::uint64_t i = 0; i < 12; ++i) {
    const cd::Scene s = cd::render(cd::kHeldoutSeed, i);
    const std::string bytes = read(fs::path(out) / cd::file_name(s));
    ASSERT_FALSE(bytes.empty()) << cd::file_name(s);
    auto img = image::decode(std::span(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()));
    ASSERT_TRUE(img) << img.error().message;
    EXPECT_EQ(img->pixels, s.image.pixels) << cd::file_name(s);
  }
  EXPECT_EQ(run_tool({"--render", out}), 2);  // a missing count is a usage error
  EXPECT_EQ(run_tool({"--out", *dir_ + "/c", "--frobnicate"}), 2);
}

}  // namespace
}  // namespace tandem
