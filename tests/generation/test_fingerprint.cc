#include <gtest/gtest.h>

#include "generation/fingerprint.h"

using tandem::gen::Fingerprint;

TEST(Fingerprint, StableAndSensitive) {
  auto a = Fingerprint::make({{"tokenizer", "abc"}, {"compute_dtype", "f32"}});
  auto b = Fingerprint::make({{"tokenizer", "abc"}, {"compute_dtype", "f32"}});
  auto c = Fingerprint::make({{"tokenizer", "abc"}, {"compute_dtype", "bf16"}});
  EXPECT_EQ(a.digest, b.digest);
  EXPECT_NE(a.digest, c.digest);
  EXPECT_EQ(a.digest.rfind("tfp1-", 0), 0u);
  EXPECT_EQ(a.digest.size(), 5u + 32u);
  EXPECT_EQ(a.diff(c), std::vector<std::string>{"compute_dtype"});
  EXPECT_TRUE(a.diff(b).empty());
  // Shifting text between fields changes the digest (length-prefixed encoding).
  auto d = Fingerprint::make({{"a", "bc"}, {"d", ""}});
  auto e = Fingerprint::make({{"a", "b"}, {"d", "c"}});
  EXPECT_NE(d.digest, e.digest);
  auto f = Fingerprint::make({{"tokenizer", "abc"}});
  EXPECT_EQ(a.diff(f), std::vector<std::string>{"compute_dtype"});
}
