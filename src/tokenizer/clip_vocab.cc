// CLIP vocabularies (clip_vocab.h): the text pipeline up to BPE, BPE training, and the vocab.json / merges.txt /
// tokenizer.json writers.
#include "tokenizer/clip_vocab.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <cstdint>
#include <unordered_map>

#include "tokenizer/bpe_learn.h"
#include "tokenizer/clip_text.h"
#include "tokenizer/unicode.h"

namespace tandem::tok {
namespace {

using OJson = nlohmann::ordered_json;

// GPT-2's bytes_to_unicode order: the printable bytes 33-126, 161-172, 174-255, then the others ascending.
const std::array<std::uint8_t, 256>& base_order() {
  static const std::array<std::uint8_t, 256> order = [] {
    std::array<std::uint8_t, 256> o{};
    std::size_t n = 0;
    auto printable = [](int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); };
    for (int b = 0; b < 256; ++b) {
      if (printable(b)) o[n++] = static_cast<std::uint8_t>(b);
    }
    for (int b = 0; b < 256; ++b) {
      if (!printable(b)) o[n++] = static_cast<std::uint8_t>(b);
    }
    return o;
  }();
  return order;
}

std::string quote_free_line(const std::string& a, const std::string& b) { return a + " " + b + "\n"; }

}  // namespace

std::vector<std::string> clip_words(std::string_view text) {
  std::vector<std::string> out;
  for (const std::string& w : detail::clip_split(text)) out.push_back(detail::bytes_to_alphabet(w));
  return out;
}

ClipVocab train_clip_bpe(const std::vector<std::string>& corpus, std::size_t vocab_size) {
  ClipVocab v;
  const auto& alpha = detail::ByteAlphabet::get();
  const auto& order = base_order();
  std::array<int, 256> base_of{};  // byte → base token id
  for (int k = 0; k < 256; ++k) {
    v.tokens.push_back(alpha.byte_to_utf8[order[static_cast<std::size_t>(k)]]);
    base_of[order[static_cast<std::size_t>(k)]] = k;
  }
  for (int k = 0; k < 256; ++k) v.tokens.push_back(v.tokens[static_cast<std::size_t>(k)] + std::string(kClipWordEnd));
  std::unordered_map<std::string, int> id_of;
  for (int k = 0; k < 512; ++k) id_of.emplace(v.tokens[static_cast<std::size_t>(k)], k);

  // Words (as raw bytes) with counts, in a deterministic order.
  std::unordered_map<std::string, std::int64_t> counts;
  for (const std::string& text : corpus) {
    for (std::string& w : detail::clip_split(text)) ++counts[std::move(w)];
  }
  std::vector<std::pair<std::string, std::int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::vector<int>> syms;
  std::vector<std::int64_t> freq;
  for (const auto& [w, c] : sorted) {
    if (w.empty()) continue;
    std::vector<int> s;
    for (char ch : w) s.push_back(base_of[static_cast<unsigned char>(ch)]);
    s.back() += 256;  // the word's last character carries </w>
    syms.push_back(std::move(s));
    freq.push_back(c);
  }

  const std::size_t target = std::max<std::size_t>(vocab_size, 514) - 2;  // the two specials come last
  detail::learn_bpe_merges(syms, freq, v.tokens, id_of, v.merges, target, 1, SIZE_MAX);
  v.tokens.emplace_back(kClipBos);
  v.tokens.emplace_back(kClipEos);
  return v;
}

std::string clip_vocab_json(const ClipVocab& v) {
  OJson j = OJson::object();
  for (std::size_t i = 0; i < v.tokens.size(); ++i) j[v.tokens[i]] = i;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string clip_merges_txt(const ClipVocab& v) {
  std::string out = "#version: 0.2\n";
  for (const auto& [a, b] : v.merges) out += quote_free_line(a, b);
  return out;
}

Result<std::string> clip_hf_json(const ClipVocab& v) {
  std::int64_t bos = -1, eos = -1;
  for (std::size_t i = 0; i < v.tokens.size(); ++i) {
    if (v.tokens[i] == kClipBos && bos < 0) bos = static_cast<std::int64_t>(i);
    if (v.tokens[i] == kClipEos && eos < 0) eos = static_cast<std::int64_t>(i);
  }
  if (bos < 0 || eos < 0) {
    return fail(Errc::format_error, "CLIP vocabulary: '" + std::string(bos < 0 ? kClipBos : kClipEos) +
                                        "' is not a token");
  }
  OJson j = OJson::parse(detail::clip_components_json(v.tokens[static_cast<std::size_t>(bos)], bos,
                                                      v.tokens[static_cast<std::size_t>(eos)], eos));
  OJson out = OJson::object();
  out["version"] = "1.0";
  out["truncation"] = nullptr;
  out["padding"] = nullptr;
  OJson added = OJson::array();
  for (std::int64_t id : {bos, eos}) {
    added.push_back(OJson{{"id", id}, {"content", v.tokens[static_cast<std::size_t>(id)]}, {"single_word", false},
                          {"lstrip", false}, {"rstrip", false}, {"normalized", true}, {"special", true}});
  }
  out["added_tokens"] = std::move(added);
  for (const char* k : {"normalizer", "pre_tokenizer", "post_processor", "decoder"}) out[k] = j[k];
  OJson model = OJson::object();
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = std::string(kClipEos);
  model["continuing_subword_prefix"] = "";
  model["end_of_word_suffix"] = std::string(kClipWordEnd);
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  OJson vocab = OJson::object();
  for (std::size_t i = 0; i < v.tokens.size(); ++i) vocab[v.tokens[i]] = i;
  model["vocab"] = std::move(vocab);
  OJson merges = OJson::array();
  for (const auto& [a, b] : v.merges) merges.push_back(a + " " + b);
  model["merges"] = std::move(merges);
  out["model"] = std::move(model);
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Status write_clip_tokenizer_files(const std::string& dir, const ClipVocab& v, bool with_tokenizer_json) {
  auto put = [&](const char* name, const std::string& bytes) -> Status {
    const std::string path = dir + "/" + name;
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) return fail(Errc::io_error, path + ": cannot create");
    f << bytes;
    f.close();
    if (!f) return fail(Errc::io_error, path + ": write error");
    return {};
  };
  std::string json;
  if (with_tokenizer_json) {
    auto j = clip_hf_json(v);
    if (!j.ok()) return fail(std::move(j).error());
    json = std::move(*j);
  }
  TANDEM_TRY(put("vocab.json", clip_vocab_json(v)));
  TANDEM_TRY(put("merges.txt", clip_merges_txt(v)));
  if (with_tokenizer_json) TANDEM_TRY(put("tokenizer.json", json));
  return {};
}

}  // namespace tandem::tok
