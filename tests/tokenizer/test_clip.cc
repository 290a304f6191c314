// CLIP's tokenizer (openai/clip-vit-* layout) on small vocabularies built here: hand-derived encodings (lowercasing,
// "</w>" word ends, contractions, single digits, punctuation runs, whitespace, non-ASCII letters, emoji as bytes),
// BOS / EOS and truncation to 77 with EOS kept last, decoding with spaces between words; vocab.json + merges.txt and
// the equivalent tokenizer.json (the written one, transformers' converter variant, a BPEDecoder variant) agree;
// train_clip_bpe round trips through the files and is deterministic; malformed files give typed errors. The real
// 49,408-token vocabulary is not available offline, so the algorithm is checked on these vocabularies.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "../weights/test_util.h"
#include "tokenizer/clip_vocab.h"
#include "tokenizer/tokenizer.h"

namespace tandem::tok::testing {
namespace {

using nlohmann::json;

Tokenizer must(Result<Tokenizer> r) {
  if (!r.ok()) {
    ADD_FAILURE() << r.error().message;
    std::abort();
  }
  return std::move(r).value();
}

// The 512 base tokens (bytes_to_unicode order, then with </w>), hand merges whose results follow in rank order, then
// the two specials last, as the real vocabulary is laid out.
ClipVocab small_vocab() {
  ClipVocab v;
  const ClipVocab base = train_clip_bpe({}, 0);
  v.tokens.assign(base.tokens.begin(), base.tokens.begin() + 512);
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{
           {"t", "h"}, {"h", "e</w>"}, {"th", "e</w>"}, {"c", "a"}, {"ca", "t</w>"}, {"i", "t</w>"}, {"'", "s</w>"},
           {"2", "0</w>"}, {"!", "!"}, {"!!", "!</w>"}, {"s", "a"}, {"sa", "t</w>"}, {"o", "n</w>"}, {"r", "e"},
           {"re", "d</w>"}, {"ð", "Ł"}, {"ðŁ", "ĺ"}, {"ðŁĺ", "Ģ</w>"}}) {
    v.merges.emplace_back(a, b);
    v.tokens.push_back(a + b);
  }
  v.tokens.emplace_back(kClipBos);
  v.tokens.emplace_back(kClipEos);
  return v;
}

const Tokenizer& clip() {
  static const Tokenizer t = [] {
    const ClipVocab v = small_vocab();
    return must(Tokenizer::from_vocab_merges(clip_vocab_json(v), clip_merges_txt(v)));
  }();
  return t;
}

std::vector<TokenId> ids_of(const Tokenizer& t, std::initializer_list<const char*> spellings) {
  std::vector<TokenId> out;
  for (const char* s : spellings) {
    const auto id = t.piece_to_id(s);
    EXPECT_TRUE(id.has_value()) << s;
    out.push_back(id.value_or(-1));
  }
  return out;
}

TEST(Clip, LayoutAndSpecials) {
  const Tokenizer& t = clip();
  EXPECT_EQ(t.kind(), TokenizerKind::bpe);
  EXPECT_EQ(t.vocab_size(), 512 + 18 + 2);
  EXPECT_EQ(t.piece(0), "!");  // bytes_to_unicode order, as the real vocab.json
  EXPECT_EQ(t.piece(256), "!</w>");
  EXPECT_EQ(t.bos_id(), 530);
  EXPECT_EQ(t.eos_id(), 531);
  EXPECT_EQ(t.eot_id(), 531);
  EXPECT_EQ(t.pad_id(), 531);
  EXPECT_EQ(t.unk_id(), 531);
  EXPECT_TRUE(t.adds_bos());
  EXPECT_EQ(t.special_ids(), (std::vector<TokenId>{530, 531}));
}

TEST(Clip, HandDerivedEncodings) {
  const Tokenizer& t = clip();
  // Lowercasing and </w> word ends; merges by rank.
  EXPECT_EQ(t.encode("A Cat"), ids_of(t, {"a</w>", "cat</w>"}));
  EXPECT_EQ(t.encode("THE cat sat on the red"),
            ids_of(t, {"the</w>", "cat</w>", "sat</w>", "on</w>", "the</w>", "red</w>"}));
  // Without </w>, "th" + "e" does not merge: a word "thed" ends with "d</w>".
  EXPECT_EQ(t.encode("thed"), ids_of(t, {"th", "e", "d</w>"}));
  // Contractions split off ("'s" is its own word).
  EXPECT_EQ(t.encode("it's"), ids_of(t, {"it</w>", "'s</w>"}));
  EXPECT_EQ(t.encode("IT'S"), t.encode("it's"));
  // Digits one by one: the merge "2 0</w>" never applies across words.
  EXPECT_EQ(t.encode("2024"), ids_of(t, {"2</w>", "0</w>", "2</w>", "4</w>"}));
  // Punctuation runs are one word.
  EXPECT_EQ(t.encode("cat!!!"), ids_of(t, {"cat</w>", "!!!</w>"}));
  EXPECT_EQ(t.encode("!!"), ids_of(t, {"!", "!</w>"}));  // "!!" as a word: only "! !</w>"-free merges apply
  // Whitespace runs (spaces, tabs, newlines) only separate words.
  EXPECT_EQ(t.encode("  a \n\t  cat\r\n"), t.encode("a cat"));
  EXPECT_TRUE(t.encode(" \n\t ").empty());
  // Non-ASCII letters: one word, bytes in the byte-level alphabet, lowercased first (É → é).
  EXPECT_EQ(t.encode("CAFÉ"), ids_of(t, {"ca", "f", "Ã", "©</w>"}));
  EXPECT_EQ(t.encode("café"), t.encode("CAFÉ"));
  // NFC first: e + U+0301 is é.
  EXPECT_EQ(t.encode("cafe\xCC\x81"), t.encode("café"));
  // Emoji: a non-letter run, as its four bytes (U+1F600 = F0 9F 98 80 → ð Ł ĺ Ģ), merged here.
  EXPECT_EQ(t.encode("\xF0\x9F\x98\x80"), ids_of(t, {"ðŁĺĢ</w>"}));
  EXPECT_EQ(t.encode("\xF0\x9F\x98\x81"), ids_of(t, {"ðŁĺ", "ģ</w>"}));
  // A letter run and a following emoji are separate words.
  EXPECT_EQ(t.encode("cat\xF0\x9F\x98\x80"), ids_of(t, {"cat</w>", "ðŁĺĢ</w>"}));
}

TEST(Clip, UnicodeLowercase) {
  const Tokenizer& t = clip();
  // Full lowercase mappings as Python's str.lower(): final sigma; İ → i + U+0307, and the combining dot (Mn, not a
  // letter) is then a word of its own.
  EXPECT_EQ(t.decode(t.encode("ΟΔΟΣ")), "οδος");
  EXPECT_EQ(t.decode(t.encode("İ")), "i \xCC\x87");
}

TEST(Clip, BosEosAndTruncation) {
  const Tokenizer& t = clip();
  const auto ids = t.encode("a cat", true, true);
  std::vector<TokenId> want{530};
  for (TokenId id : ids_of(t, {"a</w>", "cat</w>"})) want.push_back(id);
  want.push_back(531);
  EXPECT_EQ(ids, want);

  std::string long_text;
  for (int k = 0; k < 100; ++k) long_text += "cat ";
  EncodeOptions o;
  o.add_bos = o.add_eos = true;
  o.max_tokens = kClipContextLength;
  const auto cut = t.encode(long_text, o);
  ASSERT_EQ(cut.size(), 77u);
  EXPECT_EQ(cut.front(), 530);
  EXPECT_EQ(cut.back(), 531);  // the EOS (pooled position) stays last
  for (std::size_t k = 1; k + 1 < cut.size(); ++k) EXPECT_EQ(cut[k], *t.piece_to_id("cat</w>"));
  // Short texts are not padded or changed.
  EXPECT_EQ(t.encode("a cat", o), want);
  // Without EOS, simply the first max_tokens.
  o.add_eos = false;
  EXPECT_EQ(t.encode(long_text, o).size(), 77u);
  EXPECT_EQ(t.encode(long_text, o).back(), *t.piece_to_id("cat</w>"));
  // Text spelling a special token is text.
  for (TokenId id : t.encode("<|endoftext|>")) EXPECT_NE(t.type(id), PieceType::control);
}

TEST(Clip, DecodeRestoresSpaces) {
  const Tokenizer& t = clip();
  for (const auto& [in, out] : std::vector<std::pair<std::string, std::string>>{
           {"a cat sat on the red", "a cat sat on the red"},
           {"A  Cat\n\nSAT", "a cat sat"},
           {"it's", "it 's"},
           {"cat!!!", "cat !!!"},
           {"2024", "2 0 2 4"},
           {"Café \xF0\x9F\x98\x80", "café \xF0\x9F\x98\x80"},
           {"thed", "thed"}}) {
    const auto ids = t.encode(in, true, true);
    EXPECT_EQ(t.decode(ids), out) << in;
    StreamDecoder d(t);
    std::string streamed;
    for (TokenId id : ids) {
      const std::string piece = d.push(id);
      EXPECT_TRUE(piece.empty() || piece.back() != ' ') << "the space after a word waits for the next word";
      streamed += piece;
    }
    EXPECT_EQ(streamed + d.flush(), out) << in;
  }
  EXPECT_EQ(t.token_bytes(*t.piece_to_id("cat</w>")), "cat ");
  EXPECT_EQ(t.token_bytes(*t.piece_to_id("ca")), "ca");
}

const std::vector<std::string>& sample_texts() {
  static const std::vector<std::string> s = {
      "a photo of a cat", "A small RED circle on the left!", "it's 2024, isn't it?", "  spaces\t\tand\nnewlines  ",
      "Café déjà vu — naïve", "emoji \xF0\x9F\x98\x80\xF0\x9F\x98\x81 ok", "ΟΔΟΣ İstanbul 東京 ١٢٣", "x<|endoftext|>y",
      "...!!!???", "'s 're 've 'm 'll 'd 't", "", "\xFF\xFE bad utf8"};
  return s;
}

TEST(Clip, VocabMergesEqualsTokenizerJson) {
  const ClipVocab v = small_vocab();
  const Tokenizer& a = clip();
  auto js = clip_hf_json(v);
  ASSERT_TRUE(js.ok()) << js.error().message;
  const Tokenizer b = must(Tokenizer::from_hf_json(*js, "tokenizer.json"));
  EXPECT_EQ(a.model_bytes(), *js);
  EXPECT_EQ(a.pre_tokenizer_name(), b.pre_tokenizer_name());
  EXPECT_EQ(b.bos_id(), 530);
  EXPECT_EQ(b.eos_id(), 531);
  EXPECT_TRUE(b.adds_bos());
  // transformers' CLIPConverter writes the regex without the two specials and ByteLevel without use_regex (default
  // true: the GPT-2 regex inside each CLIP word changes nothing); the brief's layout has a BPEDecoder.
  json conv = json::parse(*js);
  conv["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
      R"('s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+)";
  conv["pre_tokenizer"]["pretokenizers"][1].erase("use_regex");
  const Tokenizer c = must(Tokenizer::from_hf_json(conv.dump(), "converter.json"));
  json bpedec = json::parse(*js);
  bpedec["decoder"] = json{{"type", "BPEDecoder"}, {"suffix", "</w>"}};
  const Tokenizer d = must(Tokenizer::from_hf_json(bpedec.dump(), "bpedecoder.json"));
  for (const std::string& s : sample_texts()) {
    const auto ids = a.encode(s, true, true);
    EXPECT_EQ(b.encode(s, true, true), ids) << s;
    EXPECT_EQ(d.encode(s, true, true), ids) << s;
    EXPECT_EQ(b.decode(ids), a.decode(ids)) << s;
    if (s.find("<|") == std::string::npos) {
      EXPECT_EQ(c.encode(s, true, true), ids) << s;
    }
  }
  // BPEDecoder alone (no ByteLevel decoder) keeps byte-level spellings, as Hugging Face does; ASCII is the same.
  const auto ascii = a.encode("a cat sat", true, true);
  EXPECT_EQ(d.decode(ascii), "a cat sat");
}

TEST(Clip, TrainWriteLoadRoundTrip) {
  const std::vector<std::string> corpus = {
      "a small red circle on the left", "a large blue square on the right", "a small green triangle at the top",
      "a red square and a blue circle", "two small circles on the left",  "a large triangle at the bottom"};
  const ClipVocab v = train_clip_bpe(corpus, 600);
  ASSERT_GE(v.tokens.size(), 514u);
  EXPECT_LE(v.tokens.size(), 600u);
  EXPECT_EQ(v.tokens[v.tokens.size() - 2], kClipBos);
  EXPECT_EQ(v.tokens.back(), kClipEos);
  EXPECT_EQ(v.tokens.size(), 514 + v.merges.size());
  for (std::size_t r = 0; r < v.merges.size(); ++r) EXPECT_EQ(v.tokens[512 + r], v.merges[r].first + v.merges[r].second);
  // Deterministic.
  const ClipVocab again = train_clip_bpe(corpus, 600);
  EXPECT_EQ(again.tokens, v.tokens);
  EXPECT_EQ(again.merges, v.merges);
  // A smaller size is a prefix of the larger one.
  const ClipVocab small = train_clip_bpe(corpus, 530);
  EXPECT_EQ(small.tokens.size(), 530u);
  EXPECT_TRUE(std::equal(small.merges.begin(), small.merges.end(), v.merges.begin()));

  weights::testing::TempDir dir;
  ASSERT_TRUE(write_clip_tokenizer_files(dir.path(), v).ok());
  const Tokenizer from_json = must(load_tokenizer_files(dir.path()));  // tokenizer.json first
  std::filesystem::remove(dir / "tokenizer.json");
  const Tokenizer from_files = must(load_tokenizer_files(dir.path()));  // then vocab.json + merges.txt
  EXPECT_EQ(from_json.vocab_size(), static_cast<int>(v.tokens.size()));
  EXPECT_EQ(from_files.vocab_size(), static_cast<int>(v.tokens.size()));
  for (const std::string& s : corpus) {
    const auto ids = from_files.encode(s, true, true);
    EXPECT_EQ(from_json.encode(s, true, true), ids) << s;
    EXPECT_EQ(from_files.decode(ids), s);
    EXPECT_EQ(from_json.decode(ids), s);
    EXPECT_LT(ids.size(), 2 + s.size() / 2) << "the trained merges shorten the captions";
  }
  // Frequent words became single tokens.
  EXPECT_EQ(from_files.encode("circle").size(), 1u);
  // Unseen text still encodes (bytes) and decodes.
  EXPECT_EQ(from_files.decode(from_files.encode("Zebra 42 \xF0\x9F\x98\x80")), "zebra 4 2 \xF0\x9F\x98\x80");
  // Without tokenizer.json the writer leaves it out.
  weights::testing::TempDir dir2;
  ASSERT_TRUE(write_clip_tokenizer_files(dir2.path(), v, false).ok());
  EXPECT_FALSE(std::filesystem::exists(dir2 / "tokenizer.json"));
  EXPECT_FALSE(write_clip_tokenizer_files(dir.path() + "/missing/sub", v).ok());
}

void expect_error(const Result<Tokenizer>& r, Errc code, const std::string& part) {
  ASSERT_FALSE(r.ok()) << part;
  EXPECT_EQ(r.error().code, code) << r.error().message;
  EXPECT_NE(r.error().message.find(part), std::string::npos) << r.error().message;
}

TEST(Clip, MalformedFiles) {
  const ClipVocab v = small_vocab();
  const std::string vj = clip_vocab_json(v);
  const std::string mt = clip_merges_txt(v);
  VocabMergesOptions o;
  o.vocab_origin = "/m/vocab.json";
  o.merges_origin = "/m/merges.txt";
  auto load = [&](const std::string& a, const std::string& b) { return Tokenizer::from_vocab_merges(a, b, o); };
  expect_error(load("{\"a\": 0", mt), Errc::parse_error, "/m/vocab.json");
  expect_error(load("\xFF", mt), Errc::parse_error, "/m/vocab.json: is not valid UTF-8");
  expect_error(load("[1, 2]", mt), Errc::format_error, "/m/vocab.json: the top level must be an object");
  expect_error(load("{\"a\": \"0\"}", mt), Errc::format_error, "['a'] must be an integer id");
  expect_error(load("{\"a\": {\"b\": 1}}", mt), Errc::format_error, "['a'] must be an integer id");
  expect_error(load("{\"a\": 0, \"b\": 0}", mt), Errc::format_error, "id 0 is given to both 'a' and 'b'");
  expect_error(load("{\"a\": 0, \"b\": 2}", mt), Errc::format_error, "(ids must be dense)");
  expect_error(load("{\"a\": 0, \"a\": 1}", mt), Errc::format_error, "['a'] appears twice");
  expect_error(load("{\"a\": -1}", mt), Errc::format_error, "out of range");
  expect_error(load("{}", mt), Errc::format_error, "is empty");
  expect_error(load("{\"a\": 0, \"b</w>\": 1}", ""), Errc::format_error, "has no '<|startoftext|>'");
  expect_error(load("{\"a\": 0, \"b\": 1}", ""), Errc::unsupported, "no word-final '</w>' tokens");
  o.flavor = VocabMergesFlavor::clip;
  expect_error(load("{\"a\": 0, \"b\": 1}", ""), Errc::format_error, "has no '<|startoftext|>'");
  o.flavor = VocabMergesFlavor::detect;
  expect_error(load(vj, mt + "a\n"), Errc::format_error, "/m/merges.txt: line 20 'a' is not two tokens");
  expect_error(load(vj, mt + "a  b\n"), Errc::format_error, "is not two tokens separated by one space");
  expect_error(load(vj, mt + "x y z\n"), Errc::format_error, "is not two tokens");
  expect_error(load(vj, mt + "a zz\n"), Errc::format_error, "names 'zz', which is not in /m/vocab.json");
  expect_error(load(vj, mt + "a b\n"), Errc::format_error, "the result 'ab' is not in /m/vocab.json");
  expect_error(load(vj, "\xC3"), Errc::parse_error, "/m/merges.txt: is not valid UTF-8");
  // Tolerated: no "#version" line, CRLF line ends, blank lines.
  std::string crlf;
  for (const auto& [a, b] : v.merges) crlf += a + " " + b + "\r\n\r\n";
  const Tokenizer t = must(load(vj, crlf));
  EXPECT_EQ(t.encode("the cat"), clip().encode("the cat"));

  // tokenizer.json: the CLIP parts are checked too.
  json j = json::parse(*clip_hf_json(v));
  json bad = j;
  bad["post_processor"]["cls"] = json::array({"<|startoftext|>", 5});
  expect_error(Tokenizer::from_hf_json(bad.dump(), "t.json"), Errc::format_error,
               "t.json: post_processor.cls names '<|startoftext|>' but id 5 is");
  bad["post_processor"]["cls"] = json::array({"<|startoftext|>", 99999});
  expect_error(Tokenizer::from_hf_json(bad.dump(), "t.json"), Errc::format_error, "post_processor.cls id 99999");
  bad["post_processor"]["cls"] = "x";
  expect_error(Tokenizer::from_hf_json(bad.dump(), "t.json"), Errc::format_error, "must be [token, id]");
  bad = j;
  bad["model"]["continuing_subword_prefix"] = "##";
  expect_error(Tokenizer::from_hf_json(bad.dump(), "t.json"), Errc::unsupported, "model.continuing_subword_prefix");
  bad = j;
  bad["model"]["end_of_word_suffix"] = 3;
  expect_error(Tokenizer::from_hf_json(bad.dump(), "t.json"), Errc::format_error, "model.end_of_word_suffix");
  bad = j;
  bad["decoder"] = json{{"type", "BPEDecoder"}, {"suffix", ""}};
  expect_error(Tokenizer::from_hf_json(bad.dump(), "t.json"), Errc::format_error, "decoder.suffix");
  bad = j;
  bad["model"]["merges"].push_back("c at</w>");
  expect_error(Tokenizer::from_hf_json(bad.dump(), "t.json"), Errc::format_error, "is not in the vocabulary");
}

TEST(Clip, LoadTokenizerFilesPrefersTokenizerJson) {
  weights::testing::TempDir dir;
  EXPECT_EQ(load_tokenizer_files(dir.path()).error().code, Errc::not_found);
  const ClipVocab v = small_vocab();
  ASSERT_TRUE(write_clip_tokenizer_files(dir.path(), v, false).ok());
  EXPECT_EQ(must(load_tokenizer_files(dir.path())).encode("the cat"), clip().encode("the cat"));
  { std::ofstream(dir / "merges.txt") << "a\n"; }
  expect_error(load_tokenizer_files(dir.path()), Errc::format_error, dir / "merges.txt");
  { std::ofstream(dir / "tokenizer.json") << *clip_hf_json(v); }
  EXPECT_EQ(must(load_tokenizer_files(dir.path())).encode("the cat"), clip().encode("the cat"));
}

}  // namespace
}  // namespace tandem::tok::testing
