// The pre-tokenizer regex table (llama.cpp's tokenizer.ggml.pre names), hf_json_from_bpe_vocab and the
// deterministic BPE trainer behind generate_bpe_vocab (bpe_vocab.h).
#include "tokenizer/bpe_vocab.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "tokenizer/unicode.h"

namespace tandem::tok {
namespace {

// The regexes, as llama.cpp's llm_tokenizer_bpe lists them per pre-tokenizer type.
constexpr const char* kLlama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
constexpr const char* kCjk = "[\xE4\xB8\x80-\xE9\xBE\xA5\xE0\xA0\x80-\xE4\xB8\x80\xEA\xB0\x80-\xED\x9F\xBF]+";  // [一-龥ࠀ-一가-퟿]+

struct PreEntry {
  const char* name;
  std::vector<std::string> regexes;
};

const std::vector<PreEntry>& pre_table() {
  static const std::vector<PreEntry> table = [] {
    const std::vector<std::string> llama3 = {kLlama3};
    const std::vector<std::string> gpt2 = {kGpt2};
    const std::vector<std::string> starcoder = {"\\p{N}", kGpt2};
    const std::vector<std::string> deepseek_llm = {
        "[\r\n]",
        "\\s?[A-Za-z\xC2\xB5\xC3\x80-\xC3\x96\xC3\x98-\xC3\xB6\xC3\xB8-\xC6\xBA\xC6\xBC-\xC6\xBF\xC7\x84-\xCA\x93"
        "\xCA\x95-\xCA\xAF\xCD\xB0-\xCD\xB3\xCD\xB6\xCD\xB7\xCD\xBB-\xCD\xBD\xCD\xBF\xCE\x86\xCE\x88-\xCE\x8A\xCE\x8C"
        "\xCE\x8E-\xCE\xA1\xCE\xA3-\xCF\xB5\xCF\xB7-\xD2\x81\xD2\x8A-\xD4\xAF\xD4\xB1-\xD5\x96\xE1\x82\xA0-\xE1\x83"
        "\x85\xE1\x8E\xA0-\xE1\x8F\xB5\xE1\x8F\xB8-\xE1\x8F\xBD\xE1\xB2\x90-\xE1\xB2\xBA\xE1\xB2\xBD-\xE1\xB2\xBF"
        "\xE1\xB4\x80-\xE1\xB4\xAB\xE1\xB5\xAB-\xE1\xB5\xB7\xE1\xB5\xB9-\xE1\xB6\x9A\xE1\xB8\x80-\xE1\xBC\x95\xE1"
        "\xBC\x98-\xE1\xBC\x9D\xE1\xBC\xA0-\xE1\xBD\x85\xE1\xBD\x88-\xE1\xBD\x8D\xE1\xBD\x90-\xE1\xBD\x97\xE1\xBD\x99"
        "\xE1\xBD\x9B\xE1\xBD\x9D\xE1\xBD\x9F-\xE1\xBD\xBD\xE1\xBE\x80-\xE1\xBE\xB4\xE1\xBE\xB6-\xE1\xBE\xBC\xE1\xBE"
        "\xBE\xE1\xBF\x82-\xE1\xBF\x84\xE1\xBF\x86-\xE1\xBF\x8C\xE1\xBF\x90-\xE1\xBF\x93\xE1\xBF\x96-\xE1\xBF\x9B\xE1"
        "\xBF\xA0-\xE1\xBF\xAC\xE1\xBF\xB2-\xE1\xBF\xB4\xE1\xBF\xB6-\xE1\xBF\xBC\xE2\x84\x82\xE2\x84\x87\xE2\x84\x8A-"
        "\xE2\x84\x93\xE2\x84\x95\xE2\x84\x99-\xE2\x84\x9D\xE2\x84\xA4\xE2\x84\xA6\xE2\x84\xA8\xE2\x84\xAA-\xE2\x84"
        "\xAD\xE2\x84\xAF-\xE2\x84\xB4\xE2\x84\xB9\xE2\x84\xBC-\xE2\x84\xBF\xE2\x85\x85-\xE2\x85\x89\xE2\x85\x8E\xE2"
        "\x86\x83\xE2\x86\x84\xE2\xB0\x80-\xE2\xB1\xBB\xE2\xB1\xBE-\xE2\xB3\xA4\xE2\xB3\xAB-\xE2\xB3\xAE\xE2\xB3\xB2"
        "\xE2\xB3\xB3\xEA\x99\x80-\xEA\x99\xAD\xEA\x9A\x80-\xEA\x9A\x9B\xEA\x9C\xA2-\xEA\x9D\xAF\xEA\x9D\xB1-\xEA\x9E"
        "\x87\xEA\x9E\x8B-\xEA\x9E\x8E\xEA\xAD\xB0-\xEA\xAE\xBF\xEF\xAC\x80-\xEF\xAC\x86\xEF\xAC\x93-\xEF\xAC\x97\xEF"
        "\xBC\xA1-\xEF\xBC\xBA\xEF\xBD\x81-\xEF\xBD\x9A\xF0\x90\x90\x80-\xF0\x90\x91\x8F\xF0\x90\x92\xB0-\xF0\x90\x93"
        "\x93\xF0\x90\x93\x98-\xF0\x90\x93\xBB\xF0\x90\xB2\x80-\xF0\x90\xB2\xB2\xF0\x90\xB3\x80-\xF0\x90\xB3\xB2\xF0"
        "\x91\xA2\xA0-\xF0\x91\xA3\x9F\xF0\x9E\xA4\x80-\xF0\x9E\xA5\x83]+",
        "\\s?[!-/:-~\xEF\xBC\x81-\xEF\xBC\x8F\xEF\xBC\x9A-\xEF\xBD\x9E\xE2\x80\x98-\xE2\x80\x9F\xE3\x80\x80-\xE3\x80"
        "\x82]+",
        "\\s+$",
        kCjk,
        "\\p{N}+",
    };
    const std::vector<std::string> deepseek_coder = {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", kCjk, "\\p{N}"};
    const std::vector<std::string> falcon = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2, "[0-9][0-9][0-9]"};
    const std::vector<std::string> dflt = {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"};
    return std::vector<PreEntry>{
        {"default", dflt},     {"llama-bpe", llama3},     {"llama3", llama3},         {"llama-v3", llama3},
        {"qwen2", {kQwen2}},   {"deepseek-llm", deepseek_llm}, {"deepseek-coder", deepseek_coder},
        {"falcon", falcon},    {"mpt", gpt2},             {"gpt-2", gpt2},            {"phi-2", gpt2},
        {"starcoder", starcoder}, {"refact", starcoder},  {"smollm", starcoder},
    };
  }();
  return table;
}

// A JSON string literal: quotes, backslashes and control characters escaped, invalid UTF-8 bytes as U+FFFD.
void put_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c == '"' || c == '\\') {
        out.push_back('\\');
        out.push_back(static_cast<char>(c));
      } else if (c < 0x20) {
        out += "\\u00";
        out.push_back(kHex[c >> 4]);
        out.push_back(kHex[c & 15]);
      } else {
        out.push_back(static_cast<char>(c));
      }
      ++i;
      continue;
    }
    const std::size_t n = detail::utf8_char_len(s, i);
    if (n == 0) {
      out.append(detail::kReplacementChar);
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  out.push_back('"');
}

}  // namespace

namespace detail {

bool bpe_pre_ignores_merges(const std::string& pre) { return pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3"; }

std::string hf_json_components(const BpeVocab& v) {
  using J = nlohmann::ordered_json;
  J j = J::object();
  j["normalizer"] = nullptr;
  J pres = J::array();
  for (const std::string& r : bpe_pre_regexes(v.pre)) {
    pres.push_back(J{{"type", "Split"}, {"pattern", J{{"Regex", r}}}, {"behavior", "Isolated"}, {"invert", false}});
  }
  pres.push_back(J{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}});
  j["pre_tokenizer"] = J{{"type", "Sequence"}, {"pretokenizers", std::move(pres)}};
  const bool bos = v.add_bos && v.bos >= 0 && static_cast<std::size_t>(v.bos) < v.tokens.size();
  const bool eos = v.add_eos && v.eos >= 0 && static_cast<std::size_t>(v.eos) < v.tokens.size();
  if (bos || eos) {
    J single = J::array();
    J specials = J::object();
    auto special = [&](TokenId id) {
      const std::string& name = v.tokens[static_cast<std::size_t>(id)];
      single.push_back(J{{"SpecialToken", J{{"id", name}, {"type_id", 0}}}});
      specials[name] = J{{"id", name}, {"ids", J::array({id})}, {"tokens", J::array({name})}};
    };
    if (bos) special(v.bos);
    single.push_back(J{{"Sequence", J{{"id", "A"}, {"type_id", 0}}}});
    if (eos) special(v.eos);
    j["post_processor"] = J{{"type", "TemplateProcessing"}, {"single", std::move(single)},
                            {"pair", nullptr}, {"special_tokens", std::move(specials)}};
  } else {
    j["post_processor"] = J{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
                            {"use_regex", false}};
  }
  j["decoder"] = J{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  return j.dump(-1, ' ', false, J::error_handler_t::replace);
}

}  // namespace detail

std::vector<std::string> bpe_pre_names() {
  std::vector<std::string> out;
  for (const auto& e : pre_table()) out.emplace_back(e.name);
  return out;
}

std::vector<std::string> bpe_pre_regexes(const std::string& pre) {
  for (const auto& e : pre_table()) {
    if (pre == e.name) return e.regexes;
  }
  return {};
}

std::string hf_json_from_bpe_vocab(const BpeVocab& v) {
  // Written by hand: a 150k-entry vocabulary through a JSON DOM costs far more than the loading it serves.
  std::string out;
  out.reserve(64 * v.tokens.size() + 1024);
  out += "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[";
  bool first = true;
  for (std::size_t i = 0; i < v.tokens.size(); ++i) {
    const PieceType t = i < v.types.size() ? v.types[i] : PieceType::normal;
    if (t != PieceType::control && t != PieceType::user_defined) continue;
    out += first ? "{\"id\":" : ",{\"id\":";
    first = false;
    out += std::to_string(i);
    out += ",\"content\":";
    put_string(out, v.tokens[i]);
    out += ",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":";
    out += t == PieceType::control ? "true}" : "false}";
  }
  out += "],";
  const std::string comp = detail::hf_json_components(v);  // {"normalizer":...,"decoder":...}
  out.append(comp, 1, comp.size() - 2);
  out += ",\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":";
  if (v.unk >= 0 && static_cast<std::size_t>(v.unk) < v.tokens.size()) {
    put_string(out, v.tokens[static_cast<std::size_t>(v.unk)]);
  } else {
    out += "null";
  }
  out += ",\"continuing_subword_prefix\":null,\"end_of_word_suffix\":null,\"fuse_unk\":false,"
         "\"byte_fallback\":false,\"ignore_merges\":";
  out += detail::bpe_pre_ignores_merges(v.pre) ? "true" : "false";
  out += ",\"vocab\":{";
  for (std::size_t i = 0; i < v.tokens.size(); ++i) {
    if (i != 0) out.push_back(',');
    put_string(out, v.tokens[i]);
    out.push_back(':');
    out += std::to_string(i);
  }
  out += "},\"merges\":[";
  for (std::size_t k = 0; k < v.merges.size(); ++k) {
    out += k == 0 ? "[" : ",[";
    put_string(out, v.merges[k].first);
    out.push_back(',');
    put_string(out, v.merges[k].second);
    out.push_back(']');
  }
  out += "]}}";
  return out;
}

}  // namespace tandem::tok
