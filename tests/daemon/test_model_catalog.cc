// ModelCatalog (src/daemon/model_catalog.cc): the served model set across configuration reloads — add, remove,
// replace (settings changed), retune (keep_alive / priority only), changes of mind while a load or a removal is under
// way, failed loads, what new jobs are told, counters.
#include "daemon/model_catalog.h"

#include <set>

#include <gtest/gtest.h>

namespace tandem::daemon {
namespace {

Clock::time_point at(int ms) { return Clock::time_point{} + std::chrono::milliseconds(ms); }

ModelConfig model(const std::string& name, const std::string& dir = "") {
  ModelConfig m;
  m.name = name;
  m.dir = dir.empty() ? "/models/" + name : dir;
  return m;
}

std::vector<std::string> names(const std::vector<ModelConfig>& v) {
  std::vector<std::string> out;
  for (const auto& m : v) out.push_back(m.name);
  return out;
}

using Names = std::vector<std::string>;

struct Fixture : ::testing::Test {
  ModelCatalog c;
  std::set<std::string> busy;
  void SetUp() override { c.start({model("chat"), model("clip")}, at(0)); }
  ModelPresence presence(const std::string& n) { return c.find(n)->presence; }
  Names removable() { return c.removable([&](const std::string& n) { return busy.count(n) != 0; }); }
};

TEST(ModelPresenceNames, AreTheWireStrings) {
  EXPECT_EQ(model_presence_name(ModelPresence::adding), "adding");
  EXPECT_EQ(model_presence_name(ModelPresence::serving), "serving");
  EXPECT_EQ(model_presence_name(ModelPresence::removing), "removing");
  EXPECT_EQ(model_presence_name(ModelPresence::failed), "failed");
}

// One reconfiguration from {chat, clip} serving: what each wanted list asks for.
TEST_F(Fixture, ReconfigurePlansByTable) {
  ModelConfig chat_retuned = model("chat");
  chat_retuned.keep_alive_s = 300;
  chat_retuned.priority = 5;
  ModelConfig chat_moved = model("chat", "/models/chat-v2");
  ModelConfig chat_dtype = model("chat");
  chat_dtype.dtype = "bf16";
  ModelConfig chat_kv = model("chat");
  chat_kv.kv_cache = "f32";
  struct Row {
    const char* what;
    std::vector<ModelConfig> wanted;
    Names load, remove, retune;
  } rows[] = {
      {"unchanged", {model("chat"), model("clip")}, {}, {}, {}},
      {"order does not matter", {model("clip"), model("chat")}, {}, {}, {}},
      {"one added", {model("chat"), model("clip"), model("asr")}, {"asr"}, {}, {}},
      {"one removed", {model("chat")}, {}, {"clip"}, {}},
      {"added and removed", {model("chat"), model("asr")}, {"asr"}, {"clip"}, {}},
      {"keep_alive and priority only", {chat_retuned, model("clip")}, {}, {}, {"chat"}},
      {"dir changed: replaced", {chat_moved, model("clip")}, {}, {"chat"}, {}},
      {"dtype changed: replaced", {chat_dtype, model("clip")}, {}, {"chat"}, {}},
      {"kv_cache changed: replaced", {chat_kv, model("clip")}, {}, {"chat"}, {}},
  };
  for (const auto& row : rows) {
    ModelCatalog k;
    k.start({model("chat"), model("clip")}, at(0));
    const auto p = k.reconfigure(row.wanted, at(10));
    EXPECT_EQ(names(p.load), row.load) << row.what;
    EXPECT_EQ(p.remove, row.remove) << row.what;
    EXPECT_EQ(p.retune, row.retune) << row.what;
    EXPECT_TRUE(p.kept.empty()) << row.what;
  }
}

TEST_F(Fixture, AddedModelIsRefusedUntilItsLoadSucceeds) {
  c.reconfigure({model("chat"), model("clip"), model("asr")}, at(10));
  EXPECT_EQ(presence("asr"), ModelPresence::adding);
  EXPECT_TRUE(c.changing());
  auto st = c.admits("asr");
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::unavailable);
  EXPECT_NE(st.error().message.find("being loaded"), std::string::npos);
  EXPECT_EQ(c.loaded("asr", {}, at(20)), ModelCatalog::LoadOutcome::serve);
  EXPECT_EQ(presence("asr"), ModelPresence::serving);
  EXPECT_TRUE(c.admits("asr"));
  EXPECT_FALSE(c.changing());
  EXPECT_EQ(c.counters().added, 1u);
  // A reload with the same list does nothing more.
  const auto p = c.reconfigure({model("chat"), model("clip"), model("asr")}, at(30));
  EXPECT_TRUE(p.load.empty() && p.remove.empty() && p.retune.empty());
}

TEST_F(Fixture, FailedLoadIsReportedAndTriedAgainByTheNextReload) {
  c.reconfigure({model("chat"), model("clip"), model("asr")}, at(10));
  EXPECT_EQ(c.loaded("asr", fail(Errc::format_error, "config.json: no model_type"), at(20)),
            ModelCatalog::LoadOutcome::discard);
  EXPECT_EQ(presence("asr"), ModelPresence::failed);
  auto st = c.admits("asr");
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::unavailable);
  EXPECT_NE(st.error().message.find("no model_type"), std::string::npos);
  EXPECT_EQ(c.counters().add_failures, 1u);
  EXPECT_FALSE(c.changing());
  // Fixed and reloaded: loaded again.
  EXPECT_EQ(names(c.reconfigure({model("chat"), model("clip"), model("asr")}, at(30)).load), Names{"asr"});
  EXPECT_EQ(presence("asr"), ModelPresence::adding);
  // Or taken out of the configuration: forgotten.
  c.loaded("asr", fail(Errc::format_error, "still broken"), at(40));
  EXPECT_TRUE(c.reconfigure({model("chat"), model("clip")}, at(50)).remove.empty());
  EXPECT_EQ(c.find("asr"), nullptr);
  EXPECT_TRUE(c.admits("asr"));  // unknown to the catalog: the backend says unknown model
}

TEST_F(Fixture, RemovedModelWaitsForItsJobs) {
  busy = {"clip"};
  EXPECT_EQ(c.reconfigure({model("chat")}, at(10)).remove, Names{"clip"});
  auto st = c.admits("clip");
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::not_found);
  EXPECT_NE(st.error().message.find("being removed"), std::string::npos);
  EXPECT_TRUE(removable().empty());
  busy.clear();
  EXPECT_EQ(removable(), Names{"clip"});
  EXPECT_EQ(c.removed("clip", at(20)), std::nullopt);
  EXPECT_EQ(c.find("clip"), nullptr);
  EXPECT_EQ(c.counters().removed, 1u);
  EXPECT_FALSE(c.changing());
}

TEST_F(Fixture, ReplacedModelIsRemovedThenLoadedWithTheNewSettings) {
  const ModelConfig v2 = model("chat", "/models/chat-v2");
  EXPECT_EQ(c.reconfigure({v2, model("clip")}, at(10)).remove, Names{"chat"});
  auto st = c.admits("chat");
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::unavailable);  // it comes back
  EXPECT_NE(st.error().message.find("replaced"), std::string::npos);
  EXPECT_EQ(removable(), Names{"chat"});
  auto again = c.removed("chat", at(20));
  ASSERT_TRUE(again);
  EXPECT_EQ(again->dir, "/models/chat-v2");
  EXPECT_EQ(presence("chat"), ModelPresence::adding);
  EXPECT_EQ(c.loaded("chat", {}, at(30)), ModelCatalog::LoadOutcome::serve);
  EXPECT_EQ(c.find("chat")->config.dir, "/models/chat-v2");
  EXPECT_EQ(c.counters().replaced, 1u);
  EXPECT_EQ(c.counters().removed, 0u);
}

TEST_F(Fixture, RemovingModelWantedAgainServesAgain) {
  busy = {"clip"};
  c.reconfigure({model("chat")}, at(10));
  const auto p = c.reconfigure({model("chat"), model("clip")}, at(20));
  EXPECT_EQ(p.kept, Names{"clip"});
  EXPECT_TRUE(p.load.empty());
  EXPECT_EQ(presence("clip"), ModelPresence::serving);
  EXPECT_TRUE(c.admits("clip"));
  EXPECT_TRUE(removable().empty());
  // Wanted again with new settings: it stays removing and is replaced.
  c.reconfigure({model("chat")}, at(30));
  const auto q = c.reconfigure({model("chat"), model("clip", "/models/clip-v2")}, at(40));
  EXPECT_TRUE(q.kept.empty() && q.load.empty());
  EXPECT_EQ(presence("clip"), ModelPresence::removing);
  busy.clear();
  ASSERT_EQ(removable(), Names{"clip"});
  EXPECT_EQ(c.removed("clip", at(50))->dir, "/models/clip-v2");
}

TEST_F(Fixture, ChangesOfMindWhileLoading) {
  c.reconfigure({model("chat"), model("clip"), model("asr")}, at(10));
  // Taken out while loading: the load's result is thrown away.
  c.reconfigure({model("chat"), model("clip")}, at(20));
  EXPECT_EQ(c.loaded("asr", {}, at(30)), ModelCatalog::LoadOutcome::discard);
  EXPECT_EQ(c.find("asr"), nullptr);
  EXPECT_EQ(c.counters().added, 0u);
  // Settings changed while loading: loaded again with the new ones.
  c.reconfigure({model("chat"), model("clip"), model("asr")}, at(40));
  c.reconfigure({model("chat"), model("clip"), model("asr", "/models/asr-v2")}, at(50));
  EXPECT_EQ(c.loaded("asr", {}, at(60)), ModelCatalog::LoadOutcome::reload);
  EXPECT_EQ(c.find("asr")->config.dir, "/models/asr-v2");
  EXPECT_EQ(presence("asr"), ModelPresence::adding);
  EXPECT_EQ(c.loaded("asr", {}, at(70)), ModelCatalog::LoadOutcome::serve);
  // Changed and changed back while loading: the load under way is the wanted one.
  c.reconfigure({model("chat"), model("clip"), model("asr"), model("tts")}, at(80));
  c.reconfigure({model("chat"), model("clip"), model("asr"), model("tts", "/x")}, at(90));
  c.reconfigure({model("chat"), model("clip"), model("asr"), model("tts")}, at(100));
  EXPECT_EQ(c.loaded("tts", {}, at(110)), ModelCatalog::LoadOutcome::serve);
  // Removed and added back while loading: kept.
  c.reconfigure({model("chat"), model("clip"), model("asr"), model("tts"), model("x")}, at(120));
  c.reconfigure({model("chat"), model("clip"), model("asr"), model("tts")}, at(130));
  c.reconfigure({model("chat"), model("clip"), model("asr"), model("tts"), model("x")}, at(140));
  EXPECT_EQ(c.loaded("x", {}, at(150)), ModelCatalog::LoadOutcome::serve);
}

TEST_F(Fixture, EventsForUnknownOrWrongStateAreIgnored) {
  EXPECT_EQ(c.loaded("nope", {}, at(10)), ModelCatalog::LoadOutcome::discard);
  EXPECT_EQ(c.loaded("chat", {}, at(10)), ModelCatalog::LoadOutcome::discard);  // serving: not loading
  EXPECT_EQ(presence("chat"), ModelPresence::serving);
  EXPECT_EQ(c.removed("chat", at(10)), std::nullopt);  // serving: not removing
  EXPECT_EQ(presence("chat"), ModelPresence::serving);
  EXPECT_EQ(c.counters().removed, 0u);
}

TEST_F(Fixture, ListIsInNameOrder) {
  c.reconfigure({model("zeta"), model("chat"), model("alpha")}, at(10));
  Names got;
  for (const auto& e : c.list()) got.push_back(e.name);
  EXPECT_EQ(got, (Names{"alpha", "chat", "clip", "zeta"}));
  EXPECT_EQ(presence("clip"), ModelPresence::removing);
}

}  // namespace
}  // namespace tandem::daemon
