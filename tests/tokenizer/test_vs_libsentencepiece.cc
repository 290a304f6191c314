// Cross-check of the native tokenizer against Debian's libsentencepiece (the reference implementation).
// This executable links libsentencepiece and must never link LibTorch (TOOLCHAIN.md: their protobufs clash).
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "model_builder.h"
#include "tokenizer/tokenizer.h"

namespace tandem::tok {
namespace {

namespace fs = std::filesystem;
using testing::llama2_model_path;
using testing::read_file;

std::string escape(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

// Random strings from a fixed seed: ASCII, whitespace runs, Latin/Greek/Cyrillic, CJK, Arabic, emoji,
// combining marks, and a few malformed bytes.
std::string random_string(std::mt19937& rng) {
  static const std::vector<std::u32string> classes = {
      U"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
      U"           \t\n\r",
      U".,;:!?-_()[]{}<>/\\|@#$%^&*+=~`'\"",
      U"éèêëàâäçñöüßÆøåłşğıœ",
      U"αβγδεζηθλμπσωΑΒΓΔЖЗИЙКЛМНОПРСТабвгдеж",
      U"日本語中文字漢字测试数据한국어텍스트ひらがなカタカナ",
      U"مرحبابالعالمעבריתहिन्दीไทย",
      U"😀🎉👍🏽🇩🇪👨\u200D👩\u200D👧🦀🧠",
      U"\u0301\u0308\u200B\u200C\uFEFF\u00A0\u2581\uFFFD",
      U"\U00010348\U0001F9E0\U0002A6D6",
  };
  std::uniform_int_distribution<int> len_d(0, 40);
  std::uniform_int_distribution<std::size_t> cls_d(0, classes.size());  // == size: raw byte
  std::string out;
  const int len = len_d(rng);
  for (int i = 0; i < len; ++i) {
    const std::size_t c = cls_d(rng);
    if (c == classes.size()) {
      std::uniform_int_distribution<int> b(0, 255);
      out.push_back(static_cast<char>(b(rng)));
      continue;
    }
    const auto& chars = classes[c];
    std::uniform_int_distribution<std::size_t> pick(0, chars.size() - 1);
    const char32_t cp = chars[pick(rng)];
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

struct Corpus {
  std::vector<std::string> lines;   // lines of text files + random strings
  std::vector<std::string> files;   // whole files (long, multi-line inputs)
  std::size_t text_lines = 0;
};

const Corpus& corpus() {
  static const Corpus c = [] {
    Corpus c;
    std::unordered_set<std::string> seen;
    std::vector<fs::path> paths;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/usr/share/common-licenses", ec)) {
      if (e.is_regular_file()) paths.push_back(e.path());
    }
    for (const auto& e : fs::directory_iterator("/usr/share/doc", ec)) {
      const fs::path p = e.path() / "copyright";
      if (fs::is_regular_file(p, ec)) paths.push_back(p);
    }
    std::sort(paths.begin(), paths.end());
    for (const auto& p : paths) {
      std::string text = read_file(p.string());
      if (text.size() < 200000) c.files.push_back(text);
      std::size_t start = 0;
      while (start < text.size()) {
        std::size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        std::string line = text.substr(start, end - start);
        if (seen.insert(line).second) c.lines.push_back(std::move(line));  // distinct lines only
        start = end + 1;
      }
    }
    c.text_lines = c.lines.size();
    std::mt19937 rng(20240601);
    for (int i = 0; i < 5000; ++i) c.lines.push_back(random_string(rng));
    return c;
  }();
  return c;
}

struct Pair {
  Tokenizer native;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> lib;
};

Pair load_both(const std::string& bytes) {
  auto r = Tokenizer::from_bytes(bytes, "model");
  if (!r) {
    ADD_FAILURE() << r.error().message;
    std::abort();
  }
  auto lib = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto st = lib->LoadFromSerializedProto(bytes);
  if (!st.ok()) {
    ADD_FAILURE() << st.ToString();
    std::abort();
  }
  return Pair{std::move(r).value(), std::move(lib)};
}

// Compares encode ids and decode text for every input; returns the number of mismatches (first few printed).
std::size_t compare(const Pair& p, const std::vector<std::string>& inputs, const std::string& label) {
  std::size_t mismatches = 0;
  for (const auto& s : inputs) {
    const std::vector<int> want = p.lib->EncodeAsIds(s);
    const std::vector<TokenId> got = p.native.encode(s);
    const bool ids_ok = std::vector<int>(got.begin(), got.end()) == want;
    const std::string want_text = p.lib->DecodeIds(want);
    const std::string got_text = p.native.decode(want);
    const bool text_ok = want_text == got_text;
    if (!ids_ok || !text_ok) {
      if (++mismatches <= 10) {
        ADD_FAILURE() << label << (ids_ok ? " decode" : " encode") << " mismatch for \"" << escape(s)
                      << "\"\n  lib text:    \"" << escape(want_text) << "\"\n  native text: \"" << escape(got_text)
                      << "\"";
      }
    }
  }
  return mismatches;
}

TEST(VsLibSentencePiece, Llama2Corpus) {
  const Pair p = load_both(read_file(llama2_model_path()));
  EXPECT_EQ(p.native.vocab_size(), p.lib->GetPieceSize());
  EXPECT_EQ(p.native.bos_id(), p.lib->bos_id());
  EXPECT_EQ(p.native.eos_id(), p.lib->eos_id());
  EXPECT_EQ(p.native.unk_id(), p.lib->unk_id());
  EXPECT_EQ(p.native.pad_id(), p.lib->pad_id());
  for (int id = 0; id < p.native.vocab_size(); ++id) {
    ASSERT_EQ(p.native.piece(id), p.lib->IdToPiece(id));
    ASSERT_EQ(p.native.score(id), p.lib->GetScore(id));
    ASSERT_EQ(p.native.type(id) == PieceType::control, p.lib->IsControl(id));
    ASSERT_EQ(p.native.type(id) == PieceType::byte, p.lib->IsByte(id));
  }
  const Corpus& c = corpus();
  ASSERT_GT(c.text_lines, 2000U) << "too few text lines under /usr/share";
  const std::size_t line_mm = compare(p, c.lines, "llama2 line");
  const std::size_t file_mm = compare(p, c.files, "llama2 file");
  std::printf("[llama2] %zu lines (%zu distinct text lines, %zu random) + %zu whole files compared; mismatches: %zu lines, %zu files\n",
              c.lines.size(), c.text_lines, c.lines.size() - c.text_lines, c.files.size(), line_mm, file_mm);
  EXPECT_EQ(line_mm, 0U);
  EXPECT_EQ(file_mm, 0U);
}

TEST(VsLibSentencePiece, Llama2RandomIdDecode) {
  const Pair p = load_both(read_file(llama2_model_path()));
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> any(0, p.native.vocab_size() - 1);
  std::uniform_int_distribution<int> byte_id(3, 258);
  std::uniform_int_distribution<int> coin(0, 9);
  std::size_t mismatches = 0;
  for (int round = 0; round < 20000; ++round) {
    std::vector<int> ids;
    const int len = coin(rng) * 3;
    for (int i = 0; i < len; ++i) {
      const int k = coin(rng);
      ids.push_back(k < 4 ? byte_id(rng) : k == 4 ? (round % 3) : k == 5 ? 29871 : k == 6 ? 259 : any(rng));
    }
    const std::string want = p.lib->DecodeIds(ids);
    const std::string got = p.native.decode(ids);
    if (want != got && ++mismatches <= 10) {
      std::string list;
      for (int id : ids) list += std::to_string(id) + " ";
      ADD_FAILURE() << "decode mismatch for ids [" << list << "]\n  lib:    \"" << escape(want) << "\"\n  native: \""
                    << escape(got) << "\"";
    }
    StreamDecoder sd(p.native);
    std::string streamed;
    for (int id : ids) streamed += sd.push(id);
    streamed += sd.flush();
    EXPECT_EQ(streamed, got);
  }
  std::printf("[llama2] 20000 random id sequences decoded; mismatches: %zu\n", mismatches);
  EXPECT_EQ(mismatches, 0U);
}

TEST(VsLibSentencePiece, ModelVariants) {
  const Corpus& c = corpus();
  // A subset keeps the run short: every 4th line (text and random).
  std::vector<std::string> subset;
  for (std::size_t i = 0; i < c.lines.size(); i += 4) subset.push_back(c.lines[i]);
  for (const char* extra : {"  leading", "trailing  ", "a  b   c", "   ", " ", "<tool>x<|eot|>y<tool_call>", "a b", "a  b",
                            "the thing is interesting::http", "\xE4\xB8\xAD\xE6\x96\x87 text"}) {
    subset.push_back(extra);
  }
  for (const auto& v : testing::llama_variants(read_file(llama2_model_path()))) {
    const Pair p = load_both(v.bytes);
    const std::size_t mm = compare(p, subset, v.name);
    std::printf("[%s] %zu lines compared; mismatches: %zu\n", v.name.c_str(), subset.size(), mm);
    EXPECT_EQ(mm, 0U) << v.name;
  }
}

TEST(VsLibSentencePiece, EncodeThroughput) {
  const Pair p = load_both(read_file(llama2_model_path()));
  const Corpus& c = corpus();
  std::size_t bytes = 0;
  for (const auto& f : c.files) bytes += f.size();
  using clock = std::chrono::steady_clock;
  auto time = [&](auto&& fn) {
    const auto t0 = clock::now();
    std::size_t n = 0;
    for (const auto& f : c.files) n += fn(f);
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    return std::pair<double, std::size_t>{s, n};
  };
  const auto [lib_s, lib_n] = time([&](const std::string& s) { return p.lib->EncodeAsIds(s).size(); });
  const auto [nat_s, nat_n] = time([&](const std::string& s) { return p.native.encode(s).size(); });
  EXPECT_EQ(lib_n, nat_n);
  std::printf("[throughput] %.1f MB in %zu files: native %.1f MB/s, libsentencepiece %.1f MB/s (%zu tokens)\n",
              static_cast<double>(bytes) / 1e6, c.files.size(), static_cast<double>(bytes) / 1e6 / nat_s,
              static_cast<double>(bytes) / 1e6 / lib_s, nat_n);
}

}  // namespace
}  // namespace tandem::tok
