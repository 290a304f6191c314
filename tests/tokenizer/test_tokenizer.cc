// Native SentencePiece tokenizer: Llama 2 vocabulary, round trips, streaming decode, malformed models.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "model_builder.h"
#include "tokenizer/tokenizer.h"

namespace tandem::tok {
namespace {

using testing::llama2_model_path;
using testing::read_file;
using testing::serialize_model;
using testing::tiny_model;

const Tokenizer& llama() {
  static const Tokenizer* tok = [] {
    auto r = Tokenizer::load_file(llama2_model_path());
    if (!r) {
      ADD_FAILURE() << r.error().message;
      std::abort();
    }
    return new Tokenizer(std::move(r).value());
  }();
  return *tok;
}

std::string stream_decode(const Tokenizer& tok, const std::vector<TokenId>& ids) {
  StreamDecoder sd(tok);
  std::string out;
  for (TokenId id : ids) out += sd.push(id);
  out += sd.flush();
  return out;
}

// ---- Llama 2 vocabulary -----------------------------------------------------------------------------------

TEST(Llama2, Basics) {
  const Tokenizer& t = llama();
  EXPECT_EQ(t.vocab_size(), 32000);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.unk_id(), 0);
  EXPECT_EQ(t.pad_id(), -1);
  EXPECT_TRUE(t.add_dummy_prefix());
  EXPECT_EQ(t.piece(1), "<s>");
  EXPECT_EQ(t.type(1), PieceType::control);
  EXPECT_EQ(t.type(0), PieceType::unknown);
  EXPECT_EQ(t.type(13), PieceType::byte);
  EXPECT_EQ(t.piece(13), "<0x0A>");
  EXPECT_EQ(t.type(15043), PieceType::normal);
  EXPECT_EQ(t.piece_to_id("\xE2\x96\x81Hello"), 15043);
  EXPECT_EQ(t.piece_to_id("no such piece"), std::nullopt);
  EXPECT_EQ(t.model_bytes(), read_file(llama2_model_path()));
  EXPECT_LT(t.score(15043), 0.0F);
}

TEST(Llama2, KnownEncoding) {
  const Tokenizer& t = llama();
  const std::vector<TokenId> want = {15043, 3186, 29892, 2748, 2501, 263, 931};
  EXPECT_EQ(t.encode("Hello world, once upon a time"), want);
  std::vector<TokenId> with = want;
  with.insert(with.begin(), 1);
  with.push_back(2);
  EXPECT_EQ(t.encode("Hello world, once upon a time", true, true), with);
  EXPECT_EQ(t.decode(with), "Hello world, once upon a time");
}

TEST(Llama2, WhitespaceAndEdgeCases) {
  const Tokenizer& t = llama();
  EXPECT_TRUE(t.encode("").empty());
  EXPECT_EQ(t.encode("", true, true), (std::vector<TokenId>{1, 2}));
  EXPECT_EQ(t.encode(" Hello"), (std::vector<TokenId>{29871, 15043}));     // "▁" "▁Hello"
  EXPECT_EQ(t.encode("  Hello"), (std::vector<TokenId>{259, 15043}));      // "▁▁" "▁Hello"
  EXPECT_EQ(t.encode(" "), (std::vector<TokenId>{259}));
  EXPECT_EQ(t.encode("\n"), (std::vector<TokenId>{29871, 13}));            // "▁" <0x0A>
  EXPECT_EQ(t.encode("a\nb"), (std::vector<TokenId>{263, 13, 29890}));
  EXPECT_EQ(t.encode("\xF0\x9F\x98\x80"), (std::vector<TokenId>{29871, 243, 162, 155, 131}));  // byte fallback
  EXPECT_EQ(t.encode("\xFF"), (std::vector<TokenId>{29871, 30140}));      // malformed → U+FFFD piece
}

TEST(Llama2, DecodeRules) {
  const Tokenizer& t = llama();
  EXPECT_EQ(t.decode(std::vector<TokenId>{29871, 15043}), " Hello");  // only one dummy "▁" is removed
  EXPECT_EQ(t.decode(std::vector<TokenId>{1, 29871, 15043}), " Hello");
  EXPECT_EQ(t.decode(std::vector<TokenId>{29871}), "");
  EXPECT_EQ(t.decode(std::vector<TokenId>{0, 15043}), " \xE2\x81\x87  Hello");  // <unk> surface " ⁇ "
  EXPECT_EQ(t.decode(std::vector<TokenId>{229, 15043}), "\xEF\xBF\xBD Hello");   // lone 0xE2 → U+FFFD
  EXPECT_EQ(t.decode(std::vector<TokenId>{243, 162, 155}), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(t.decode(std::vector<TokenId>{35, 15043}), "  Hello");  // <0x20> then "▁Hello"
  EXPECT_EQ(t.decode(std::vector<TokenId>{1, 2, -5, 32000, 15043}), "Hello");  // out of range skipped
  EXPECT_EQ(t.decode(std::vector<TokenId>{}), "");
}

TEST(Llama2, TokenBytes) {
  const Tokenizer& t = llama();
  EXPECT_EQ(t.token_bytes(15043), " Hello");
  EXPECT_EQ(t.token_bytes(13), "\n");
  EXPECT_EQ(t.token_bytes(243), "\xF0");
  EXPECT_EQ(t.token_bytes(1), "");
  EXPECT_EQ(t.token_bytes(2), "");
  EXPECT_EQ(t.token_bytes(0), " \xE2\x81\x87 ");
  EXPECT_EQ(t.token_bytes(29892), ",");
  EXPECT_EQ(t.token_bytes(-1), "");
  EXPECT_EQ(t.token_bytes(99999), "");
}

const std::vector<std::string>& round_trip_samples() {
  static const std::vector<std::string> samples = {
      "Hello world, once upon a time",
      "Café déjà vu, naïve façade, Ærøskøbing, Straße",
      "日本語のテキストと中文文本，한국어 텍스트도",
      "مرحبا بالعالم، هذا نص عربي",
      "Здравствуй, мир! Ελληνικά",
      " leading space",
      "   three leading spaces",
      "multiple    inner     spaces",
      "trailing spaces   ",
      "\ttab\tseparated\tvalues\t",
      "line one\nline two\n\nline four\r\n",
      "\n\n\n",
      "emoji 😀🎉👍🏽 and flags 🇩🇪 and ZWJ 👨‍👩‍👧",
      "math ∑∫√∞ ≠ ≤ ≥ and symbols ©®™ ✓ ✗",
      "int main(int argc, char** argv) {\n  return argc > 1 ? 0 : -1;  // comment\n}\n",
      "def f(x):\n    return {'a': [1, 2, 3], \"b\": None}\n",
      "<s> </s> <unk> <0x0A> literal markers",
      "a",
      " ",
      "\xEF\xBF\xBD replacement char itself",
      "zero\xE2\x80\x8Bwidth\xE2\x80\x8Cjoiners",
      std::string("nul\0byte", 8),
  };
  return samples;
}

TEST(Llama2, RoundTrips) {
  const Tokenizer& t = llama();
  for (const auto& s : round_trip_samples()) {
    const auto ids = t.encode(s);
    EXPECT_EQ(t.decode(ids), s) << "sample: " << s;
    EXPECT_EQ(t.decode(t.encode(s, true, true)), s) << "sample with bos/eos: " << s;
    for (TokenId id : ids) EXPECT_TRUE(id >= 0 && id < t.vocab_size());
  }
}

TEST(Llama2, LiteralSpaceSymbolDecodesAsSpace) {
  // As in sentencepiece: a literal U+2581 in the input is indistinguishable from an escaped space.
  const Tokenizer& t = llama();
  EXPECT_EQ(t.decode(t.encode("a\xE2\x96\x81" "b")), "a b");
}

TEST(Llama2, TokenBytesConcatenateToText) {
  // Away from the start, the token bytes concatenate to the text (bytes of split characters included).
  const Tokenizer& t = llama();
  for (const auto& s : round_trip_samples()) {
    const auto ids = t.encode(s);
    std::string joined;
    for (TokenId id : ids) joined += t.token_bytes(id);
    EXPECT_EQ(joined, " " + s) << s;
  }
}

TEST(Llama2, StreamingEqualsFullDecodeForEveryPrefix) {
  const Tokenizer& t = llama();
  for (const auto& s : round_trip_samples()) {
    const auto ids = t.encode(s, true, false);
    for (std::size_t n = 0; n <= ids.size(); ++n) {
      const std::vector<TokenId> prefix(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n));
      EXPECT_EQ(stream_decode(t, prefix), t.decode(prefix)) << s << " prefix " << n;
    }
    // Pushes never emit a partial UTF-8 character (without flush).
    StreamDecoder sd(t);
    for (TokenId id : ids) {
      const std::string piece = sd.push(id);
      std::size_t i = 0;
      while (i < piece.size()) {
        const auto c = static_cast<unsigned char>(piece[i]);
        const std::size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        ASSERT_LE(i + len, piece.size()) << "partial character pushed for " << s;
        i += len;
      }
    }
  }
}

TEST(Llama2, StreamingRandomIdSequences) {
  const Tokenizer& t = llama();
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> any(0, t.vocab_size() - 1);
  std::uniform_int_distribution<int> byte_id(3, 258);
  std::uniform_int_distribution<int> coin(0, 9);
  for (int round = 0; round < 2000; ++round) {
    std::vector<TokenId> ids;
    const int len = 1 + coin(rng) * 2;
    for (int i = 0; i < len; ++i) {
      const int c = coin(rng);
      ids.push_back(c < 5 ? byte_id(rng) : c < 6 ? (c % 3) : c < 7 ? 29871 : any(rng));
    }
    ASSERT_EQ(stream_decode(t, ids), t.decode(ids)) << "round " << round;
  }
  StreamDecoder sd(t);
  EXPECT_EQ(sd.push(243), "");  // 0xF0: incomplete, held back
  EXPECT_EQ(sd.push(162), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD\xEF\xBF\xBD");
  sd.reset();
  EXPECT_EQ(sd.push(243), "");
  EXPECT_EQ(sd.push(162), "");
  EXPECT_EQ(sd.push(155), "");
  EXPECT_EQ(sd.push(131), "\xF0\x9F\x98\x80");
  EXPECT_EQ(sd.push(229), "");    // 0xE2 …
  EXPECT_EQ(sd.push(68), "\xEF\xBF\xBD" "A");  // … followed by 'A': cannot complete, emitted at once
}

TEST(Llama2, MoveKeepsWorking) {
  auto r = Tokenizer::load_file(llama2_model_path());
  ASSERT_TRUE(r.ok());
  Tokenizer a = std::move(r).value();
  Tokenizer b = std::move(a);
  EXPECT_EQ(b.encode("Hello"), (std::vector<TokenId>{15043}));
}

// ---- Small hand-made models --------------------------------------------------------------------------------

TEST(TinyModel, MergesByScoreLeftmostFirst) {
  // Scores: "ab" (-1) beats "bc" (-2); "abc" only reachable via "ab"+"c".
  auto m = tiny_model({"a", "b", "c", "ab", "bc", "abc", "\xE2\x96\x81"}, true);
  m.normalizer_spec.add_dummy_prefix = false;
  auto r = Tokenizer::from_bytes(serialize_model(m), "tiny");
  ASSERT_TRUE(r.ok()) << r.error().message;
  const Tokenizer& t = *r;
  const TokenId base = 3 + 256;
  EXPECT_EQ(t.encode("abc"), (std::vector<TokenId>{base + 5}));
  EXPECT_EQ(t.encode("bcab"), (std::vector<TokenId>{base + 4, base + 3}));
  EXPECT_EQ(t.encode("d"), (std::vector<TokenId>{3 + 'd'}));  // byte fallback
  EXPECT_EQ(t.decode(t.encode("abcd b")), "abcd b");
}

TEST(TinyModel, UnknownRunsMergeWithoutByteFallback) {
  auto m = tiny_model({"a", "\xE2\x96\x81"}, false);
  auto r = Tokenizer::from_bytes(serialize_model(m), "tiny");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->encode("axyza"), (std::vector<TokenId>{4, 3, 0, 3}));  // ▁ a <unk> a
  EXPECT_EQ(r->decode(r->encode("axyza")), "a \xE2\x81\x87 a");
}

// ---- Malformed models --------------------------------------------------------------------------------------

Errc load_error(std::string_view bytes) {
  auto r = Tokenizer::from_bytes(bytes, "test");
  EXPECT_FALSE(r.ok());
  return r.ok() ? Errc::internal : r.error().code;
}

TEST(Malformed, MissingFile) {
  auto r = Tokenizer::load_file("/nonexistent/tokenizer.model");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::io_error);
}

TEST(Malformed, DirectoryIsIoError) {
  auto r = Tokenizer::load_file("/tmp");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::io_error);
}

TEST(Malformed, WireFormatErrors) {
  EXPECT_EQ(load_error(std::string("\x0A", 1)), Errc::parse_error);             // key, no length
  EXPECT_EQ(load_error(std::string("\x0A\x05" "ab", 4)), Errc::parse_error);    // length past the end
  EXPECT_EQ(load_error(std::string("\x0A\xFF\xFF", 3)), Errc::parse_error);     // truncated varint
  EXPECT_EQ(load_error(std::string(12, '\xFF')), Errc::parse_error);            // over-long varint
  EXPECT_EQ(load_error(std::string("\x08\x01", 2)), Errc::parse_error);         // pieces as varint: wrong wire type
  EXPECT_EQ(load_error(std::string("\x0B", 1)), Errc::parse_error);             // group wire type
  EXPECT_EQ(load_error(std::string("\x00\x00", 2)), Errc::parse_error);         // field number 0
  EXPECT_EQ(load_error(std::string("\x0A\x02\x15\x00", 4)), Errc::parse_error); // truncated float in a piece
  EXPECT_EQ(load_error("garbage bytes, certainly not a protobuf"), Errc::parse_error);
  EXPECT_EQ(load_error(""), Errc::format_error);  // valid (empty) message without pieces
}

TEST(Malformed, TruncatedRealModel) {
  const std::string bytes = read_file(llama2_model_path());
  ASSERT_GT(bytes.size(), 1000U);
  EXPECT_EQ(load_error(bytes.substr(0, bytes.size() / 2)), Errc::parse_error);
  EXPECT_EQ(load_error(bytes.substr(0, 5)), Errc::parse_error);
  // Any cut: never a crash, always a typed error (a cut at a field boundary can parse but fail validation).
  for (std::size_t cut = 0; cut < bytes.size(); cut += 997) {
    auto r = Tokenizer::from_bytes(bytes.substr(0, cut), "cut");
    ASSERT_FALSE(r.ok());
    const Errc c = r.error().code;
    EXPECT_TRUE(c == Errc::parse_error || c == Errc::format_error || c == Errc::unsupported) << cut;
  }
}

TEST(Malformed, RandomCorruptionNeverCrashes) {
  const std::string bytes = read_file(llama2_model_path());
  std::mt19937 rng(99);
  std::uniform_int_distribution<std::size_t> pos(0, bytes.size() - 1);
  std::uniform_int_distribution<int> val(0, 255);
  int ok = 0;
  for (int round = 0; round < 200; ++round) {
    std::string b = bytes;
    for (int k = 0; k < 1 + round % 8; ++k) b[pos(rng)] = static_cast<char>(val(rng));
    auto r = Tokenizer::from_bytes(b, "fuzz");
    if (r.ok()) {
      ++ok;
      (void)r->decode(r->encode("some text \xF0\x9F\x98\x80 to encode"));
    }
  }
  SUCCEED() << ok << " corrupted models still loaded";
}

TEST(Malformed, UnigramIsUnsupported) {
  auto m = tiny_model({"a", "b"}, false);
  m.trainer_spec.model_type = detail::kModelUnigram;
  EXPECT_EQ(load_error(serialize_model(m)), Errc::unsupported);
  m.trainer_spec.model_type = detail::kModelChar;
  EXPECT_EQ(load_error(serialize_model(m)), Errc::unsupported);
  // No trainer_spec at all: proto default is UNIGRAM.
  std::string bytes;
  detail::put_len_field(bytes, 1, testing::serialize_piece({"<unk>", 0.0F, 2}));
  EXPECT_EQ(load_error(bytes), Errc::unsupported);
}

TEST(Malformed, PrecompiledCharsmapIsUnsupported) {
  auto m = tiny_model({"a"}, false);
  std::string bytes = serialize_model(m);
  std::string ns;
  detail::put_len_field(ns, 2, std::string("\x04\x00\x00\x00xxxxyy", 10));
  detail::put_len_field(bytes, 3, ns);  // merged into the existing NormalizerSpec
  EXPECT_EQ(load_error(bytes), Errc::unsupported);
}

TEST(Malformed, DuplicatePiece) {
  auto m = tiny_model({"a", "b", "a"}, false);
  auto r = Tokenizer::from_bytes(serialize_model(m), "dup");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::format_error);
  EXPECT_NE(r.error().message.find("already defined"), std::string::npos) << r.error().message;
}

TEST(Malformed, StructuralErrors) {
  {
    auto m = tiny_model({"a"}, false);
    m.pieces[0].type = 1;  // no <unk>
    EXPECT_EQ(load_error(serialize_model(m)), Errc::format_error);
  }
  {
    auto m = tiny_model({"a"}, false);
    m.pieces.push_back({"<unk2>", 0.0F, 2});  // two unknown pieces
    EXPECT_EQ(load_error(serialize_model(m)), Errc::format_error);
  }
  {
    auto m = tiny_model({"a", ""}, false);  // empty piece
    EXPECT_EQ(load_error(serialize_model(m)), Errc::format_error);
  }
  {
    auto m = tiny_model({"a"}, true);
    m.pieces.pop_back();
    m.pieces.pop_back();  // drops "a" and <0xFF>
    EXPECT_EQ(load_error(serialize_model(m)), Errc::format_error);
  }
  {
    auto m = tiny_model({"a"}, true);
    m.pieces[3 + 0x41].piece = "<0x4g>";  // bad byte piece
    EXPECT_EQ(load_error(serialize_model(m)), Errc::format_error);
  }
  {
    auto m = tiny_model({"a"}, false);
    m.pieces.push_back({"<0x41>", 0.0F, 6});  // byte piece without byte_fallback
    EXPECT_EQ(load_error(serialize_model(m)), Errc::format_error);
  }
  {
    auto m = tiny_model({"a"}, false);
    m.pieces[3].type = 9;  // unknown piece type
    EXPECT_EQ(load_error(serialize_model(m)), Errc::format_error);
  }
  {
    auto m = tiny_model({"a"}, false);
    m.trainer_spec.eos_id = 4;  // only 4 pieces
    EXPECT_EQ(load_error(serialize_model(m)), Errc::format_error);
    m.trainer_spec.eos_id = -7;
    EXPECT_EQ(load_error(serialize_model(m)), Errc::format_error);
  }
}

TEST(Malformed, UnknownFieldsAreSkipped) {
  auto m = tiny_model({"a"}, false);
  std::string bytes = serialize_model(m);
  detail::put_varint_field(bytes, 99, 12345);        // unknown varint field
  detail::put_len_field(bytes, 4, "self test data");  // self_test_data (ignored)
  detail::put_tag(bytes, 77, 1);                      // unknown fixed64
  bytes.append(8, '\x01');
  detail::put_float_field(bytes, 78, 1.5F);           // unknown fixed32
  auto r = Tokenizer::from_bytes(bytes, "extra");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->vocab_size(), 4);
  EXPECT_EQ(r->bos_id(), 1);
}

}  // namespace
}  // namespace tandem::tok
