// SHA-256 against the FIPS 180-4 / NIST CAVP example vectors, plus chunked-update equivalence.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/sha256.h"

namespace tandem {
namespace {

std::string hex_of(std::string_view s) { return Sha256::hex(Sha256::of(s)); }

TEST(Sha256, Empty) { EXPECT_EQ(hex_of(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"); }

TEST(Sha256, Abc) { EXPECT_EQ(hex_of("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"); }

TEST(Sha256, TwoBlock448Bits) {
  EXPECT_EQ(hex_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, TwoBlock896Bits) {
  EXPECT_EQ(hex_of("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmn"
                   "opqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

TEST(Sha256, MillionA) {
  const std::string a(1000000, 'a');
  EXPECT_EQ(hex_of(a), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Same input fed in uneven chunks.
  Sha256 h;
  std::size_t pos = 0, step = 1;
  while (pos < a.size()) {
    const std::size_t n = std::min(step, a.size() - pos);
    h.update(std::string_view(a).substr(pos, n));
    pos += n;
    step = step * 3 % 1000 + 1;
  }
  EXPECT_EQ(Sha256::hex(h.finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, ByteSpanOverload) {
  std::vector<std::byte> v(1000);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::byte>(i % 251);
  Sha256 h;
  h.update(std::span<const std::byte>(v));
  EXPECT_EQ(Sha256::hex(h.finish()), "4e4c294b331f7a2099a379bec34b9f9fc03dc46ab465d998f4d683da53487e6d");
}

// Every split point of messages around the padding boundaries (55/56/63/64/65 bytes, several blocks) gives the same
// digest as the one-shot hash.
TEST(Sha256, ChunkedUpdatesMatchOneShot) {
  for (std::size_t len : {0u, 1u, 55u, 56u, 57u, 63u, 64u, 65u, 119u, 120u, 128u, 200u}) {
    std::string msg(len, '\0');
    for (std::size_t i = 0; i < len; ++i) msg[i] = static_cast<char>('A' + (i * 7) % 26);
    const auto want = Sha256::of(msg);
    for (std::size_t cut1 = 0; cut1 <= len; ++cut1) {
      const std::size_t cut2 = cut1 + (len - cut1) / 2;
      Sha256 h;
      h.update(std::string_view(msg).substr(0, cut1));
      h.update(std::string_view(msg).substr(cut1, cut2 - cut1));
      h.update(std::string_view());
      h.update(std::string_view(msg).substr(cut2));
      ASSERT_EQ(h.finish(), want) << "len " << len << " cut " << cut1 << "/" << cut2;
    }
  }
}

TEST(Sha256, HexIsLowercase64Chars) {
  const auto s = hex_of("x");
  EXPECT_EQ(s.size(), 64u);
  EXPECT_EQ(s.find_first_not_of("0123456789abcdef"), std::string::npos);
}

}  // namespace
}  // namespace tandem
