// write_whisper_tokenizer (whisper_tokens.h): a GPT-2-style byte-level BPE trained on a corpus plus Whisper's
// specials, written as the tokenizer.json / tokenizer_config.json pair of a Hugging Face Whisper checkpoint.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <unordered_map>

#include "tokenizer/bpe_learn.h"
#include "tokenizer/bpe_vocab.h"
#include "tokenizer/unicode.h"
#include "tokenizer/whisper_tokens.h"

namespace tandem::tok {
namespace {

using OJson = nlohmann::ordered_json;

// GPT-2's bytes_to_unicode order: the printable bytes 33-126, 161-172, 174-255, then the others ascending.
std::array<std::uint8_t, 256> gpt2_byte_order() {
  std::array<std::uint8_t, 256> o{};
  std::size_t n = 0;
  auto printable = [](int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); };
  for (int pass = 0; pass < 2; ++pass) {
    for (int b = 0; b < 256; ++b) {
      if (printable(b) == (pass == 0)) o[n++] = static_cast<std::uint8_t>(b);
    }
  }
  return o;
}

// The corpus split by the GPT-2 regex (ByteLevel use_regex), each piece with its count, sorted by bytes.
Result<std::vector<std::pair<std::string, std::int64_t>>> count_words(std::span<const std::string> corpus) {
  const auto regexes = bpe_pre_regexes("gpt-2");
  if (regexes.size() != 1) return fail(Errc::format_error, "GPT-2 pre-tokenizer regex: expected exactly one");
  auto re = detail::Regex::compile(regexes[0], "GPT-2 pre-tokenizer regex");
  if (!re.ok()) return fail(std::move(re).error());
  std::unordered_map<std::string, std::int64_t> counts;
  std::vector<std::pair<std::size_t, std::size_t>> m;
  for (const std::string& raw : corpus) {
    const std::string text = detail::utf8_sanitize(raw);
    m.clear();
    re->find_all(text, m);
    std::size_t at = 0;
    for (auto [b, e] : m) {
      if (b > at) ++counts[text.substr(at, b - at)];
      ++counts[text.substr(b, e - b)];
      at = e;
    }
    if (at < text.size()) ++counts[text.substr(at)];
  }
  std::vector<std::pair<std::string, std::int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());
  return sorted;
}

OJson added_token(std::size_t id, const std::string& content) {
  return OJson{{"id", id},         {"content", content}, {"single_word", false}, {"lstrip", false},
               {"rstrip", false},  {"normalized", false}, {"special", true}};
}

OJson template_item(const char* kind, const std::string& id) {
  return OJson{{kind, OJson{{"id", id}, {"type_id", 0}}}};
}

Status put_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return fail(Errc::io_error, path + ": cannot create");
  f << bytes;
  f.close();
  if (!f) return fail(Errc::io_error, path + ": write error");
  return {};
}

}  // namespace

Result<int> write_whisper_tokenizer(const std::string& dir, std::span<const std::string> corpus,
                                    const WhisperTokenizerWrite& opts) {
  const auto langs = whisper_languages();
  if (opts.languages < 0 || static_cast<std::size_t>(opts.languages) > langs.size()) {
    return fail(Errc::invalid_argument, "write_whisper_tokenizer: languages must be 0.." +
                                            std::to_string(langs.size()) + ", not " + std::to_string(opts.languages));
  }

  // Byte tokens in GPT-2's order, then the learned merges.
  const auto& alpha = detail::ByteAlphabet::get();
  const auto order = gpt2_byte_order();
  std::array<int, 256> base_of{};
  std::vector<std::string> tokens;
  std::unordered_map<std::string, int> id_of;
  for (int k = 0; k < 256; ++k) {
    tokens.push_back(alpha.byte_to_utf8[order[static_cast<std::size_t>(k)]]);
    base_of[order[static_cast<std::size_t>(k)]] = k;
    id_of.emplace(tokens.back(), k);
  }
  auto words = count_words(corpus);
  if (!words.ok()) return fail(std::move(words).error());
  std::vector<std::vector<int>> syms;
  std::vector<std::int64_t> freq;
  for (const auto& [w, c] : *words) {
    std::vector<int> s;
    for (char ch : w) s.push_back(base_of[static_cast<unsigned char>(ch)]);
    syms.push_back(std::move(s));
    freq.push_back(c);
  }
  std::vector<std::pair<std::string, std::string>> merges;
  detail::learn_bpe_merges(syms, freq, tokens, id_of, merges, std::max<std::size_t>(opts.vocab_tokens, 256), 1,
                           SIZE_MAX);

  // Specials in Whisper's order.
  const std::size_t n_text = tokens.size();
  std::vector<std::string> specials{"<|endoftext|>", "<|startoftranscript|>"};
  for (int k = 0; k < opts.languages; ++k) {
    specials.push_back("<|" + std::string(langs[static_cast<std::size_t>(k)].code) + "|>");
  }
  for (const char* s : {"<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
                        "<|notimestamps|>"}) {
    specials.emplace_back(s);
  }
  for (int i = 0; i < kWhisperTimestampCount; ++i) {
    const int hundredths = i * 2;
    const int frac = hundredths % 100;
    specials.push_back("<|" + std::to_string(hundredths / 100) + "." + (frac < 10 ? "0" : "") +
                       std::to_string(frac) + "|>");
  }
  const std::size_t total = n_text + specials.size();
  auto special_id = [&](std::string_view name) {
    return n_text + static_cast<std::size_t>(std::find(specials.begin(), specials.end(), name) - specials.begin());
  };

  OJson j = OJson::object();
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  OJson added = OJson::array();
  for (std::size_t k = 0; k < specials.size(); ++k) added.push_back(added_token(n_text + k, specials[k]));
  j["added_tokens"] = std::move(added);
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = OJson{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                             {"use_regex", true}};
  const std::string sot = "<|startoftranscript|>", nots = "<|notimestamps|>", eot = "<|endoftext|>";
  OJson single = OJson::array({template_item("SpecialToken", sot), template_item("SpecialToken", nots),
                               template_item("Sequence", "A"), template_item("SpecialToken", eot)});
  OJson pair = OJson::array({template_item("SpecialToken", sot), template_item("SpecialToken", nots),
                             template_item("Sequence", "A"), template_item("Sequence", "B"),
                             template_item("SpecialToken", eot)});
  OJson sp = OJson::object();
  for (const std::string& name : {sot, nots, eot}) {
    sp[name] = OJson{{"id", name}, {"ids", OJson::array({special_id(name)})}, {"tokens", OJson::array({name})}};
  }
  j["post_processor"] = OJson{{"type", "TemplateProcessing"}, {"single", std::move(single)},
                              {"pair", std::move(pair)}, {"special_tokens", std::move(sp)}};
  j["decoder"] = OJson{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                       {"use_regex", true}};
  OJson model = OJson::object();
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = nullptr;
  model["continuing_subword_prefix"] = "";
  model["end_of_word_suffix"] = "";
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  OJson vocab = OJson::object();
  for (std::size_t i = 0; i < n_text; ++i) vocab[tokens[i]] = i;
  model["vocab"] = std::move(vocab);
  OJson mj = OJson::array();
  for (const auto& [a, b] : merges) mj.push_back(a + " " + b);
  model["merges"] = std::move(mj);
  j["model"] = std::move(model);

  const OJson config{{"add_prefix_space", false},  {"bos_token", eot},        {"eos_token", eot},
                     {"unk_token", eot},           {"pad_token", eot},        {"model_max_length", 448},
                     {"errors", "replace"},        {"tokenizer_class", "WhisperTokenizer"}};

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return fail(Errc::io_error, dir + ": cannot create (" + ec.message() + ")");
  TANDEM_TRY(put_file(dir + "/tokenizer.json", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
  TANDEM_TRY(put_file(dir + "/tokenizer_config.json", config.dump(2) + "\n"));
  return static_cast<int>(total);
}

}  // namespace tandem::tok
