// tandemd's configuration files: drop-ins (order, key-by-key override, model merge), errors naming the file
// that set the key, missing files, and the shipped config/*.toml files.
#include "test_config_util.h"

#include <regex>
#include <set>
#include <sstream>

namespace tandem::daemon {
namespace {

using namespace config_test;

// ---- files and drop-ins -----------------------------------------------------------------------------------------

TEST(DaemonConfig, DropInsOverrideKeyByKeyAndMergeModelsByName) {
  TempDir tmp;
  const std::string main = tmp.write("etc/tandemd.toml", R"(
default_model = "big"
[device]
kind = "simulated"
poll_interval_ms = 100
[ladder]
order = ["admit", "delay", "reduce", "reject"]
max_delay_ms = 1000
[[model]]
name = "big"
dir = "models/big"
cpu_threads = 2
[model.sampling]
temperature = 0.7
stop = ["A", "B"]
)");
  const std::string first = tmp.write("etc/tandemd.d/10-first.toml", R"(
[device]
poll_interval_ms = 200
[ladder]
order = ["admit", "reject"]
[[model]]
name = "big"
cpu_threads = 4
[model.sampling]
stop = ["C"]
[[model]]
name = "small"
dir = "small"
)");
  const std::string second = tmp.write("etc/tandemd.d/20-second.toml", R"(
[device]
poll_interval_ms = 300
[[model]]
name = "big"
fallback = "small"
)");
  tmp.write("etc/tandemd.d/README", "not toml = [");
  tmp.write("etc/tandemd.d/.hidden.toml", "not toml = [");
  tmp.write("etc/tandemd.d/30-old.toml.dpkg-old", "not toml = [");
  fs::create_directories(tmp.path() / "etc/tandemd.d/40-dir.toml");

  auto r = load_config(main);
  ASSERT_TRUE(r.ok()) << message(r);
  const DaemonConfig& c = *r;
  EXPECT_EQ(c.sources, (std::vector<std::string>{main, first, second}));
  EXPECT_EQ(c.device.kind, AccelKind::simulated);  // untouched by the drop-ins
  EXPECT_EQ(c.device.poll_interval, 300ms);        // the last file wins
  EXPECT_EQ(c.policy.ladder.order, (std::vector<policy::Rung>{policy::Rung::admit, policy::Rung::reject}));
  EXPECT_EQ(c.policy.ladder.max_delay, 1s);
  ASSERT_EQ(c.models.size(), 2u);
  const ModelConfig& big = c.models[0];
  EXPECT_EQ(big.name, "big");
  EXPECT_EQ(big.dir, (tmp.path() / "etc/models/big").string());  // relative to the main file
  EXPECT_EQ(big.cpu_threads, 4);
  EXPECT_EQ(big.sampling.temperature, 0.7);                    // merged, not replaced
  EXPECT_EQ(big.sampling.stop, std::vector<std::string>{"C"});  // lists replace
  EXPECT_EQ(big.fallback, "small");
  const ModelConfig& small = c.models[1];
  EXPECT_EQ(small.name, "small");
  EXPECT_EQ(small.dir, (tmp.path() / "etc/tandemd.d/small").string());  // relative to the drop-in
  EXPECT_EQ(c.default_model, "big");
}

TEST(DaemonConfig, DropInsAreReadInNameOrder) {
  TempDir tmp;
  const std::string main = tmp.write("tandemd.toml", std::string("[device]\npoll_interval_ms = 50\n") + kModel);
  tmp.write("tandemd.d/2-x.toml", "[device]\npoll_interval_ms = 2000\n");
  tmp.write("tandemd.d/10-y.toml", "[device]\npoll_interval_ms = 1000\n");
  auto r = load_config(main);
  ASSERT_TRUE(r.ok()) << message(r);
  EXPECT_EQ(r->device.poll_interval, 2000ms);  // "2-x" sorts after "10-y"
  ASSERT_EQ(r->sources.size(), 3u);
  EXPECT_THAT(r->sources[1], testing::EndsWith("10-y.toml"));
  EXPECT_THAT(r->sources[2], testing::EndsWith("2-x.toml"));
}

TEST(DaemonConfig, AnExplicitDropInDirectoryReplacesTheDefaultOne) {
  TempDir tmp;
  const std::string main = tmp.write("tandemd.toml", kModel);
  tmp.write("tandemd.d/10.toml", "[device]\ncuda_index = 1\n");
  tmp.write("other/10.toml", "[device]\ncuda_index = 2\n");
  auto r = load_config(main, (tmp.path() / "other").string());
  ASSERT_TRUE(r.ok()) << message(r);
  EXPECT_EQ(r->device.cuda_index, 2);
}

TEST(DaemonConfig, ErrorsNameTheFileThatSetTheKey) {
  TempDir tmp;
  const std::string main = tmp.write("tandemd.toml", std::string("default_model = \"m\"\n") + kModel);
  {
    const std::string bad = tmp.write("tandemd.d/30-bad.toml", "[device]\ncuda_index = 99\n");
    auto r = load_config(main);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message, bad + ": device.cuda_index: must be in [0,63], got 99");
    fs::remove(bad);
  }
  {
    // Cross-field: the default max_retry_after_ms is now too small; blame the file that moved the other bound.
    const std::string bad = tmp.write("tandemd.d/40-retry.toml", "[ladder]\ndefault_retry_after_ms = 400000\n");
    auto r = load_config(main);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message,
              bad + ": ladder.max_retry_after_ms: must be >= default_retry_after_ms (400s), got 300s");
    fs::remove(bad);
  }
  {
    const std::string bad = tmp.write("tandemd.d/50-fallback.toml", "[[model]]\nname = \"m\"\nfallback = \"x\"\n");
    auto r = load_config(main);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message,
              bad + ": model[\"m\"].fallback: must be \"\" or the name of another [[model]] (none), got \"x\"");
    fs::remove(bad);
  }
  {
    const std::string bad = tmp.write("tandemd.d/60-syntax.toml", "[device\n");
    auto r = load_config(main);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, Errc::parse_error);
    EXPECT_THAT(r.error().message, StartsWith(bad + ":1:"));
    fs::remove(bad);
  }
  {
    // A model added by a drop-in without a dir: blame the drop-in that named it.
    const std::string bad = tmp.write("tandemd.d/70-nodir.toml", "[[model]]\nname = \"n\"\n");
    auto r = load_config(main);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message, bad + ": model[\"n\"].dir: must be a non-empty path, got \"\"");
    fs::remove(bad);
  }
  auto ok = load_config(main);
  EXPECT_TRUE(ok.ok()) << message(ok);
}

TEST(DaemonConfig, MissingFiles) {
  TempDir tmp;
  auto missing = load_config((tmp.path() / "nope.toml").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, Errc::not_found);
  EXPECT_THAT(missing.error().message, HasSubstr("nope.toml"));

  const std::string main = tmp.write("tandemd.toml", kModel);
  auto no_dropins = load_config(main);  // tandemd.d does not exist: fine
  ASSERT_TRUE(no_dropins.ok()) << message(no_dropins);
  EXPECT_EQ(no_dropins->sources, std::vector<std::string>{main});
  auto explicit_missing = load_config(main, (tmp.path() / "nowhere").string());
  EXPECT_TRUE(explicit_missing.ok()) << message(explicit_missing);

  const std::string not_a_dir = tmp.write("file.d", "x");
  auto bad_dir = load_config(main, not_a_dir);
  ASSERT_FALSE(bad_dir.ok());
  EXPECT_EQ(bad_dir.error().code, Errc::io_error);
  EXPECT_THAT(bad_dir.error().message, HasSubstr("not a directory"));

  auto dir_as_file = load_config(tmp.path().string());
  ASSERT_FALSE(dir_as_file.ok());
  EXPECT_EQ(dir_as_file.error().code, Errc::io_error);
}

// ---- the shipped files ------------------------------------------------------------------------------------------

const fs::path kSourceRoot = TANDEM_SOURCE_ROOT;

// Turns the commented-out settings ("#key = value", "#[section]": '#' directly followed by the key) into settings;
// prose comments start with "# ".
std::string uncomment_settings(const std::string& text) {
  std::istringstream in(text);
  std::string out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > 1 && line[0] == '#' && ((line[1] >= 'a' && line[1] <= 'z') || line[1] == '[')) line.erase(0, 1);
    out += line + "\n";
  }
  return out;
}

// "section.key" for every "key = value" line.
std::set<std::string> keys_of(const std::string& text) {
  std::set<std::string> keys;
  std::istringstream in(text);
  std::string line;
  std::string section;
  static const std::regex header(R"(^\[\[?([a-z_.]+)\]\]?\s*(#.*)?$)");
  static const std::regex setting(R"(^([a-z_]+) = )");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, header)) {
      section = m[1];
    } else if (std::regex_search(line, m, setting)) {
      keys.insert(section.empty() ? std::string(m[1]) : section + "." + std::string(m[1]));
    }
  }
  return keys;
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ShippedConfig, TheDefaultFileLoads) {
  TempDir empty;
  const fs::path file = kSourceRoot / "config/tandemd.toml";
  auto r = load_config(file.string(), empty.path().string());
  ASSERT_TRUE(r.ok()) << message(r);
  ASSERT_FALSE(r->models.empty());
  EXPECT_TRUE(r->validate().ok());
}

// The commented-out values in config/tandemd.toml are the defaults, and every key is shown.
TEST(ShippedConfig, TheDefaultFileShowsEveryKeyWithItsDefault) {
  const fs::path file = kSourceRoot / "config/tandemd.toml";
  const std::string uncommented = uncomment_settings(read(file));
  auto r = parse_config(uncommented, file.string());
  ASSERT_TRUE(r.ok()) << message(r);
  ASSERT_EQ(r->models.size(), 1u);
  DaemonConfig want;
  ModelConfig m;
  m.name = r->models[0].name;
  m.dir = r->models[0].dir;
  want.models = {m};
  want.default_model = r->default_model;
  expect_same(*r, want);

  const std::set<std::string> shown = keys_of(uncommented);
  EXPECT_GE(keys_of(render_config(want)).size(), 91u);  // the scanner sees every key (91 when this was written)
  for (const auto& key : keys_of(render_config(want))) EXPECT_TRUE(shown.count(key)) << key << " is not shown";
  for (const auto& key : shown) EXPECT_TRUE(keys_of(render_config(want)).count(key)) << key << " is not a key";
}

TEST(ShippedConfig, EveryExampleLoads) {
  TempDir empty;
  std::map<std::string, DaemonConfig> loaded;
  for (const auto& entry : fs::directory_iterator(kSourceRoot / "config/examples")) {
    if (entry.path().extension() != ".toml") continue;
    auto r = load_config(entry.path().string(), empty.path().string());
    ASSERT_TRUE(r.ok()) << message(r);
    // Loading does not look at model directories (the daemon checks them at start).
    loaded.emplace(entry.path().filename().string(), std::move(*r));
  }
  for (const char* name : {"workstation-cuda.toml", "home-server-two-models.toml", "cpu-only.toml",
                           "simulated-demo.toml"}) {
    EXPECT_TRUE(loaded.count(name)) << name;
  }
  if (loaded.count("workstation-cuda.toml")) {
    EXPECT_EQ(loaded["workstation-cuda.toml"].device.kind, AccelKind::cuda);
  }
  if (loaded.count("cpu-only.toml")) {
    const auto& c = loaded["cpu-only.toml"];
    EXPECT_EQ(c.device.kind, AccelKind::none);
    for (const auto& m : c.models) EXPECT_FALSE(m.gpu) << m.name;
  }
  if (loaded.count("home-server-two-models.toml")) {
    const auto& c = loaded["home-server-two-models.toml"];
    ASSERT_GE(c.models.size(), 2u);
    bool has_fallback = false;
    for (const auto& m : c.models) has_fallback |= !m.fallback.empty() && c.find_model(m.fallback) != nullptr;
    EXPECT_TRUE(has_fallback);
  }
  if (loaded.count("simulated-demo.toml")) {
    const auto& c = loaded["simulated-demo.toml"];
    EXPECT_EQ(c.device.kind, AccelKind::simulated);
    EXPECT_EQ(c.device.sim_capacity_bytes, 2ull << 30);
    EXPECT_NE(c.bus.kind, BusKind::system);
  }
}

}  // namespace
}  // namespace tandem::daemon
