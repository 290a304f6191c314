// The client library's parsing of what users type (client/format_parse.cc): sizes, durations, booleans and
// `tandemctl policy set` assignments typed by the XML's Policy keys. Split from test_client_format.cc.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "client/client.h"
#include "client/format.h"

namespace tandem::client {
namespace {

using sdbus::Variant;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// ---------------------------------------------------------------------------------------------------------------
// Sizes, durations, booleans

TEST(ParseSize, UnitsAndFractions) {
  struct Case {
    const char* text;
    std::uint64_t want;
  };
  const Case cases[] = {
      {"100", 100},
      {"6GiB", 6ull << 30},
      {"6gib", 6ull << 30},
      {"512 MiB", 512ull << 20},
      {"1.5GiB", 3ull << 29},
      {"4k", 4096},
      {"4KiB", 4096},
      {"1GB", 1000000000ull},
      {"2MB", 2000000ull},
      {"1T", 1ull << 40},
      {"0", 0},
      {"  64MiB  ", 64ull << 20},
      {"10B", 10},
  };
  for (const auto& c : cases) {
    auto r = parse_size(c.text);
    ASSERT_TRUE(r.ok()) << c.text << ": " << r.error().message;
    EXPECT_EQ(*r, c.want) << c.text;
  }
}

TEST(ParseSize, RejectsBadText) {
  for (const char* bad : {"", "GiB", "abc", "-1", "1.5", "1XB", "1.2.3GiB", "99999999999TiB", "18446744073709551616"}) {
    auto r = parse_size(bad);
    EXPECT_FALSE(r.ok()) << bad;
  }
}

TEST(ParseDuration, Units) {
  EXPECT_EQ(*parse_duration_ms("500"), 500u);
  EXPECT_EQ(*parse_duration_ms("500ms"), 500u);
  EXPECT_EQ(*parse_duration_ms("2s"), 2000u);
  EXPECT_EQ(*parse_duration_ms("1.5s"), 1500u);
  EXPECT_EQ(*parse_duration_ms("3min"), 180000u);
  EXPECT_EQ(*parse_duration_ms("3m"), 180000u);
  EXPECT_EQ(*parse_duration_ms("1h"), 3600000u);
  for (const char* bad : {"", "s", "1.5", "-5s", "5 fortnights", "1.5ms"})
    EXPECT_FALSE(parse_duration_ms(bad).ok()) << bad;
}

TEST(ParseBool, Words) {
  for (const char* t : {"true", "yes", "on", "1", "TRUE"}) EXPECT_TRUE(*parse_bool(t)) << t;
  for (const char* f : {"false", "no", "off", "0"}) EXPECT_FALSE(*parse_bool(f)) << f;
  EXPECT_FALSE(parse_bool("maybe").ok());
}

// ---------------------------------------------------------------------------------------------------------------
// Policy set

TEST(PolicySetting, ValuesAreTypedByKey) {
  auto mb = parse_policy_setting("margin_bytes=1GiB");
  ASSERT_TRUE(mb.ok()) << mb.error().message;
  EXPECT_EQ(mb->first, "margin_bytes");
  EXPECT_EQ(std::get<std::uint64_t>(mb->second), 1ull << 30);

  auto mf = parse_policy_setting("margin_fraction=0.1");
  ASSERT_TRUE(mf.ok());
  EXPECT_DOUBLE_EQ(std::get<double>(mf->second), 0.1);

  auto lo = parse_policy_setting("ladder_order=admit, delay,route_cpu,reject");
  ASSERT_TRUE(lo.ok());
  EXPECT_EQ(std::get<std::vector<std::string>>(lo->second),
            (std::vector<std::string>{"admit", "delay", "route_cpu", "reject"}));

  auto md = parse_policy_setting("max_delay_ms=5s");
  ASSERT_TRUE(md.ok());
  EXPECT_EQ(std::get<std::uint64_t>(md->second), 5000u);
  auto md2 = parse_policy_setting("max_delay_ms=250");
  ASSERT_TRUE(md2.ok());
  EXPECT_EQ(std::get<std::uint64_t>(md2->second), 250u);

  auto oe = parse_policy_setting("offload_enabled=no");
  ASSERT_TRUE(oe.ok());
  EXPECT_FALSE(std::get<bool>(oe->second));

  // Read-only keys (shown by `tandemctl policy`, refused by tandemd for writing) are refused here already.
  EXPECT_FALSE(parse_policy_setting("gpu_concurrency=2").ok());
  EXPECT_FALSE(parse_policy_setting("breaker_cooldown_ms=250").ok());

  auto hb = parse_policy_setting("host_budget_bytes=16GiB");
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(std::get<std::uint64_t>(hb->second), 16ull << 30);
}

TEST(PolicySetting, EveryKeyGoesOutWithTheXmlSignature) {
  const std::map<std::string, std::string> sample = {
      {"margin_bytes", "512MiB"},     {"margin_fraction", "0.05"}, {"ladder_order", "admit,reject"},
      {"max_delay_ms", "30000"},      {"offload_enabled", "true"}, {"allow_migration", "false"},
      {"host_budget_bytes", "8GiB"},
  };
  ASSERT_EQ(policy_keys().size(), sample.size());
  for (const auto& [key, sig] : policy_keys()) {
    auto it = sample.find(key);
    ASSERT_NE(it, sample.end()) << key;
    auto p = parse_policy_setting(key + "=" + it->second);
    ASSERT_TRUE(p.ok()) << key << ": " << p.error().message;
    EXPECT_EQ(to_dbus(p->second).peekValueType(), sig) << key;
  }
  // The whole map goes out as a{sv} with the same names.
  std::map<std::string, PolicyValue> values = {{"gpu_concurrency", std::uint32_t{3}}, {"margin_fraction", 0.2}};
  VariantMap m = to_dbus(values);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m.at("gpu_concurrency").peekValueType(), "u");
  EXPECT_EQ(m.at("gpu_concurrency").get<std::uint32_t>(), 3u);
  EXPECT_EQ(m.at("margin_fraction").peekValueType(), "d");
}

TEST(PolicySetting, Errors) {
  for (const char* bad :
       {"margin_bytes", "=1", "nope=1", "margin_bytes=lots", "margin_fraction=x", "margin_fraction=-1",
        "margin_bytes=-1", "max_delay_ms=1.5x", "host_budget_bytes=99999999999999999999999", "offload_enabled=maybe",
        "ladder_order=admit,,reject", "ladder_order=", "max_delay_ms=soon"}) {
    auto r = parse_policy_setting(bad);
    EXPECT_FALSE(r.ok()) << bad;
  }
  auto unknown = parse_policy_setting("margin=5");
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(contains(unknown.error().message, "margin_bytes")) << "lists the known keys";
}

}  // namespace
}  // namespace tandem::client
