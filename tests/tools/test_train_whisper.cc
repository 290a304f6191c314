// tandem-train-whisper end to end (docs/default-speech-model.md): `--quick` speaks 16 sentences with espeak-ng and
// trains 20 steps; the loss falls, the written directory is what the daemon loads (engine::WhisperModel, the
// tokenizer with its Whisper specials, a preprocessor_config.json whose window is the model's), the engine reproduced
// the training forward, a second run writes the same bytes, and --render writes held-out WAVs with their transcripts.
// The tool's path comes from TANDEM_TRAIN_WHISPER (tests/tools/meson.build). Skipped when espeak-ng is missing.
//
// The quick run is a pure function of its inputs (fixed seeds for the sentences, voices, windows and init, a fixed
// step count, one worker thread with single-threaded ATen and OpenBLAS; espeak-ng is deterministic), so on one
// machine it gives the same model every time (ModelIsDeterministic checks that). Its word error rate is not checked:
// 20 steps learn the grammar's token statistics, not speech (the default run's figures are in the doc).
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
#include "audio/audio.h"
#include "core/sha256.h"
#include "engine/whisper.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/whisper_tokens.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::string tool() {
  const char* p = std::getenv("TANDEM_TRAIN_WHISPER");
  return p ? p : "";
}

bool have_espeak() { return std::system("command -v espeak-ng >/dev/null 2>&1") == 0; }

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int run_tool(const std::vector<std::string>& args) {
  std::string cmd = "'" + tool() + "'";
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " >/dev/null 2>&1";
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

class TrainWhisper : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (tool().empty() || !have_espeak()) return;
    auto made = tandem::core::make_temp_dir("tandem-train-whisper-test");
    ASSERT_TRUE(made.ok()) << made.error().message;
    dir_ = new std::string(*made);
    rc_ = run_tool({"--quick", "--quiet", "--out", *dir_ + "/a"});
  }
  static void TearDownTestSuite() {
    if (dir_) fs::remove_all(*dir_);
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    ASSERT_FALSE(tool().empty()) << "TANDEM_TRAIN_WHISPER is not set";
    if (!have_espeak()) GTEST_SKIP() << "espeak-ng is not installed (apt-get install espeak-ng): no speech to train on";
  }
  static std::string* dir_;
  static int rc_;
};
std::string* TrainWhisper::dir_ = nullptr;
int TrainWhisper::rc_ = -1;

TEST_F(TrainWhisper, QuickRunWritesAModelTheEngineComputesAsTrained) {
  ASSERT_EQ(rc_, 0) << "tandem-train-whisper --quick failed (it also fails when the engine check does)";
  const fs::path m = fs::path(*dir_) / "a";
  for (const char* f : {"config.json", "model.safetensors", "preprocessor_config.json", "generation_config.json",
                        "tokenizer.json", "tokenizer_config.json", "training.json"})
    EXPECT_TRUE(fs::exists(m / f)) << f;

  const auto j = nlohmann::json::parse(read(m / "training.json"));
  EXPECT_EQ(j["steps"].get<int>(), 20);
  EXPECT_FALSE(j["cut_by_time_budget"].get<bool>());
  // The loss falls: the first step's against the running mean at the end (measured 335 -> 62: the CTC term dominates at first).
  EXPECT_LT(j["loss"]["final_avg"].get<double>(), 0.8 * j["loss"]["first"].get<double>());
  EXPECT_TRUE(j["engine_check"]["passed"].get<bool>());
  EXPECT_LE(j["engine_check"]["max_abs_diff"].get<double>(), 1e-3);
  EXPECT_GE(j["engine_check"]["positions"].get<int>(), 10);
  EXPECT_EQ(j["heldout_wer"]["timestamps"]["files"].get<int>(), j["data"]["heldout_sentences"].get<int>());
  EXPECT_GT(j["heldout_wer"]["timestamps"]["words"].get<int>(), 0);

  // The daemon's path: the engine loads the directory; the window is the preprocessor's; the tokenizer is
  // English-only Whisper with all 1501 timestamps inside the model's vocabulary.
  auto model = engine::WhisperModel::load(m.string(), engine::WhisperLoadOptions{});
  ASSERT_TRUE(model) << model.error().message;
  const auto pre = nlohmann::json::parse(read(m / "preprocessor_config.json"));
  EXPECT_EQ(pre["nb_max_frames"].get<int>(), (*model)->window_frames());
  EXPECT_EQ(pre["n_samples"].get<int>(), (*model)->window_frames() * 160);
  EXPECT_EQ(pre["chunk_length"].get<int>() * 100, (*model)->window_frames());
  EXPECT_EQ(pre["feature_size"].get<int>(), (*model)->config().n_mels);
  auto tok = tok::load_tokenizer_files(m.string());
  ASSERT_TRUE(tok) << tok.error().message;
  auto sp = tok::whisper_specials(*tok, (*model)->config().vocab);
  ASSERT_TRUE(sp) << sp.error().message;
  ASSERT_EQ(sp->languages.size(), 1u);
  EXPECT_EQ(sp->language_code(sp->languages[0]), "en");
  EXPECT_EQ(sp->timestamp_count, tok::kWhisperTimestampCount);
  EXPECT_EQ((*model)->config().decoder_start_id, sp->sot);
  EXPECT_EQ((*model)->config().eos_id, sp->eot);
  // Grammar words are single tokens (with their leading space).
  EXPECT_EQ(tok::whisper_text_ids(*tok, " fox").size(), 1u);
  EXPECT_EQ(tok::whisper_text_ids(*tok, " boxes").size(), 1u);

  // The engine runs a window of the model's size and returns logits over the whole vocabulary.
  auto s = (*model)->new_session();
  ASSERT_TRUE(s) << s.error().message;
  std::vector<float> mel(static_cast<std::size_t>((*model)->config().n_mels * (*model)->window_frames()), -0.5F);
  ASSERT_TRUE((*s)->encode(mel, nullptr));
  const std::vector<std::int32_t> prompt{sp->sot, sp->languages[0], sp->transcribe};
  auto logits = (*s)->decode(prompt, nullptr);
  ASSERT_TRUE(logits) << logits.error().message;
  EXPECT_EQ(static_cast<int>(logits->size()), (*model)->config().vocab);
}

// Same inputs, same bytes: the reason the quick run's figures are stable on a machine.
TEST_F(TrainWhisper, ModelIsDeterministic) {
  ASSERT_EQ(rc_, 0);
  ASSERT_EQ(run_tool({"--quick", "--quiet", "--out", *dir_ + "/b"}), 0);
  for (const char* f : {"model.safetensors", "config.json", "tokenizer.json", "preprocessor_config.json"})
    EXPECT_EQ(Sha256::hex(Sha256::of(read(fs::path(*dir_) / "a" / f))),
              Sha256::hex(Sha256::of(read(fs::path(*dir_) / "b" / f))))
        << f;
}

// --render writes held-out sentences as espeak-ng WAVs and a transcripts.txt naming them; the first is espeak-ng's
// plain default voice.
TEST_F(TrainWhisper, RenderWritesHeldOutSpeech) {
  const fs::path out = fs::path(*dir_) / "speech";
  ASSERT_EQ(run_tool({"--render", out.string(), "3"}), 0);
  std::istringstream lines(read(out / "transcripts.txt"));
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    const auto t1 = line.find('\t'), t2 = line.rfind('\t');
    ASSERT_NE(t1, std::string::npos) << line;
    ASSERT_NE(t1, t2) << line;
    const std::string file = line.substr(0, t1), text = line.substr(t1 + 1, t2 - t1 - 1), voice = line.substr(t2 + 1);
    EXPECT_EQ(file, "000" + std::to_string(n) + ".wav");
    EXPECT_GE(std::count(text.begin(), text.end(), ' '), 3) << text;
    EXPECT_EQ(text.back(), '.');
    if (n == 0) {
      EXPECT_EQ(voice, "en -s 175 -p 50");
    }
    const std::string bytes = read(out / file);
    auto pcm = audio::decode_audio(std::span(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()));
    ASSERT_TRUE(pcm) << file << ": " << pcm.error().message;
    EXPECT_GT(pcm->seconds(), 1.0) << file;
    EXPECT_LT(pcm->seconds(), 6.0) << file;
    ++n;
  }
  EXPECT_EQ(n, 3);
  EXPECT_EQ(run_tool({"--render", out.string()}), 2);  // a missing count is a usage error
  EXPECT_EQ(run_tool({"--out", *dir_ + "/c", "--frobnicate"}), 2);
}

}  // namespace
}  // namespace tandem
