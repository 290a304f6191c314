// Helpers for the BPE tokenizer tests: llama.cpp's vocabulary test files (../shared/models/vocab), the tokenizers
// of those GGUF files, and a Llama-2-style tokenizer.json written from a SentencePiece tokenizer the way Hugging
// Face's converter (SentencePieceExtractor) writes one.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../weights/gguf_test_util.h"
#include "tokenizer/tokenizer.h"
#include "weights/gguf.h"
#include "weights/gguf_model.h"
#include "weights/gguf_tokenizer.h"

namespace tandem::tok::testing {

using weights::testing::shared_dir;

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct VocabCase {
  std::string text;
  std::vector<TokenId> ids;
};

// Cases separated by "\n__ggml_vocab_test__\n", one line of ids per case in the .out file.
inline std::vector<VocabCase> read_cases(const std::string& base) {
  const std::string inp = slurp(base + ".inp");
  const std::string out = slurp(base + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<VocabCase> cases;
  for (std::size_t at = 0;;) {
    const auto end = inp.find(sep, at);
    if (end == std::string::npos) break;
    cases.push_back({inp.substr(at, end - at), {}});
    at = end + sep.size();
  }
  std::istringstream lines(out);
  std::string line;
  for (auto& c : cases) {
    if (!std::getline(lines, line)) break;
    std::istringstream ids(line);
    for (long v = 0; ids >> v;) c.ids.push_back(static_cast<TokenId>(v));
  }
  return cases;
}

inline std::string vocab_path(const std::string& name) {
  return shared_dir() + "/models/vocab/ggml-vocab-" + name + ".gguf";
}

// The tokenizer of a vocabulary GGUF through the GGUF path: "gpt2" → BpeVocab, "llama" → SentencePiece.
inline Result<Tokenizer> gguf_tokenizer(const std::string& path) {
  auto f = weights::GgufFile::open(path);
  if (!f) return fail(std::move(f).error());
  const weights::GgufValue* m = f->find("tokenizer.ggml.model");
  if (m != nullptr && m->str == "gpt2") {
    auto v = weights::bpe_vocab_from_gguf(*f);
    if (!v) return fail(std::move(v).error());
    return Tokenizer::from_bpe_vocab(*v, path);
  }
  auto bytes = weights::sentencepiece_model_from_gguf(*f);
  if (!bytes) return fail(std::move(bytes).error());
  return Tokenizer::from_bytes(*bytes, path);
}

// A Llama-2-style tokenizer.json for a SentencePiece tokenizer: vocab, merges from the piece scores (for every
// piece, each split into two pieces in the vocabulary, ordered by the left and right ids, then all stably sorted
// by the piece's score, highest first, as transformers' SentencePieceExtractor), Prepend("▁") + Replace(" ", "▁")
// normalizer, no pre-tokenizer, byte_fallback + fuse_unk, control pieces as special added tokens and user-defined
// pieces as non-special ones, TemplateProcessing with BOS, decoders Replace / ByteFallback / Fuse / Strip.
inline std::string llama2_style_json(const Tokenizer& sp) {
  using J = nlohmann::json;
  const int n = sp.vocab_size();
  struct M {
    TokenId l, r;
    float score;
  };
  std::vector<M> merges;
  for (TokenId id = 0; id < n; ++id) {
    const std::string& p = sp.piece(id);
    std::vector<M> local;
    for (std::size_t i = 1; i < p.size(); ++i) {
      if ((static_cast<unsigned char>(p[i]) & 0xC0) == 0x80) continue;  // split between characters only
      const auto l = sp.piece_to_id(p.substr(0, i));
      const auto r = sp.piece_to_id(p.substr(i));
      if (l && r) local.push_back({*l, *r, sp.score(id)});
    }
    std::sort(local.begin(), local.end(), [](const M& a, const M& b) { return a.l != b.l ? a.l < b.l : a.r < b.r; });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(), [](const M& a, const M& b) { return a.score > b.score; });
  J vocab = J::object();
  J added = J::array();
  for (TokenId id = 0; id < n; ++id) {
    vocab[sp.piece(id)] = id;
    const PieceType t = sp.type(id);
    if (t == PieceType::control || t == PieceType::unknown || t == PieceType::user_defined) {
      added.push_back(J{{"id", id}, {"content", sp.piece(id)}, {"single_word", false}, {"lstrip", false},
                        {"rstrip", false}, {"normalized", false}, {"special", t != PieceType::user_defined}});
    }
  }
  J jm = J::array();
  for (const M& m : merges) jm.push_back(J::array({sp.piece(m.l), sp.piece(m.r)}));
  const std::string ws = "\xE2\x96\x81";
  J j;
  j["version"] = "1.0";
  j["added_tokens"] = added;
  j["normalizer"] = J{{"type", "Sequence"},
                      {"normalizers", J::array({J{{"type", "Prepend"}, {"prepend", ws}},
                                                J{{"type", "Replace"}, {"pattern", J{{"String", " "}}}, {"content", ws}}})}};
  j["pre_tokenizer"] = nullptr;
  const std::string bos = sp.bos_id() >= 0 ? sp.piece(sp.bos_id()) : "<s>";
  j["post_processor"] = J{{"type", "TemplateProcessing"},
                          {"single", J::array({J{{"SpecialToken", J{{"id", bos}, {"type_id", 0}}}},
                                               J{{"Sequence", J{{"id", "A"}, {"type_id", 0}}}}})},
                          {"pair", nullptr},
                          {"special_tokens", J{{bos, J{{"id", bos}, {"ids", J::array({sp.bos_id()})},
                                                       {"tokens", J::array({bos})}}}}}};
  j["decoder"] = J{{"type", "Sequence"},
                   {"decoders", J::array({J{{"type", "Replace"}, {"pattern", J{{"String", ws}}}, {"content", " "}},
                                          J{{"type", "ByteFallback"}}, J{{"type", "Fuse"}},
                                          J{{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  j["model"] = J{{"type", "BPE"},         {"dropout", nullptr},      {"unk_token", sp.piece(sp.unk_id())},
                 {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                 {"fuse_unk", true},      {"byte_fallback", true},   {"ignore_merges", false},
                 {"vocab", vocab},        {"merges", jm}};
  return j.dump();
}

// decode() of ids, and the same through a StreamDecoder one id at a time.
inline std::string stream_decode(const Tokenizer& t, const std::vector<TokenId>& ids) {
  StreamDecoder d(t);
  std::string out;
  for (TokenId id : ids) out += d.push(id);
  return out + d.flush();
}

}  // namespace tandem::tok::testing
