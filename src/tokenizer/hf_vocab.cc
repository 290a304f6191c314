// bpe_vocab_from_hf_json (hf_vocab.h): a byte-level BPE tokenizer.json as a GGUF "gpt2" vocabulary, its
// pre-tokenizer identified as one of llama.cpp's pre names by comparing regex lists.
#include "tokenizer/hf_vocab.h"

#include <nlohmann/json.hpp>

#include "tokenizer/bpe_model.h"
#include "tokenizer/unicode.h"

namespace tandem::tok {
namespace {

constexpr std::string_view kCaseInsensitiveContractions = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
constexpr std::string_view kSpelledContractions = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";

// The escapes only (no aliases): \r \n \t → the characters, \s / \S → \p{White_Space} / \P{White_Space} (the
// loader's reading), the contraction group spelled out.
std::string canonical_escapes(std::string_view p) {
  std::string s(p);
  for (std::size_t at = 0; (at = s.find(kCaseInsensitiveContractions, at)) != std::string::npos;) {
    s.replace(at, kCaseInsensitiveContractions.size(), kSpelledContractions);
    at += kSpelledContractions.size();
  }
  std::string out;
  out.reserve(s.size() + 16);
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 >= s.size()) {
      out.push_back(s[i]);
      continue;
    }
    const char c = s[++i];
    switch (c) {
      case 'r': out.push_back('\r'); break;
      case 'n': out.push_back('\n'); break;
      case 't': out.push_back('\t'); break;
      case 's': out.append("\\p{White_Space}"); break;
      case 'S': out.append("\\P{White_Space}"); break;
      default:
        out.push_back('\\');
        out.push_back(c);
    }
  }
  return out;
}

const std::string& gpt2_regex() {
  static const std::string r = bpe_pre_regexes("gpt-2").at(0);
  return r;
}

// A step of the file's pre-tokenizer, described for error messages.
std::string split_kind(detail::SplitBehavior b) {
  switch (b) {
    case detail::SplitBehavior::removed: return "Removed";
    case detail::SplitBehavior::isolated: return "Isolated";
    case detail::SplitBehavior::merged_with_previous: return "MergedWithPrevious";
    case detail::SplitBehavior::merged_with_next: return "MergedWithNext";
    case detail::SplitBehavior::contiguous: return "Contiguous";
  }
  return "?";
}

// Equal regex lists: the first name of these, then the table's order.
const char* const kPreferredPre[] = {"llama-bpe", "qwen2", "gpt-2", "starcoder", "deepseek-llm", "deepseek-coder",
                                     "falcon", "default"};

// The names with their canonical lists, preferred names first.
const std::vector<std::pair<std::string, std::vector<std::string>>>& canonical_pre_table() {
  static const auto table = [] {
    std::vector<std::pair<std::string, std::vector<std::string>>> t;
    std::vector<std::string> names(std::begin(kPreferredPre), std::end(kPreferredPre));
    for (const std::string& n : bpe_pre_names())
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    for (const std::string& n : names) {
      std::vector<std::string> rs;
      for (const std::string& r : bpe_pre_regexes(n)) rs.push_back(canonical_pre_regex(r));
      if (!rs.empty()) t.emplace_back(n, std::move(rs));
    }
    return t;
  }();
  return table;
}

std::string clip(std::string s, std::size_t n = 600) {
  if (s.size() > n) {
    s.resize(n);
    while (!s.empty() && (static_cast<unsigned char>(s.back()) & 0xC0) == 0x80) s.pop_back();
    if (!s.empty() && static_cast<unsigned char>(s.back()) >= 0xC0) s.pop_back();
    s += "...";
  }
  return s;
}

// The pre name of the model's normalizer + pre-tokenizer + decoder, or unsupported.
Result<std::string> identify_pre(const detail::BpeModel& m, const std::string& origin) {
  using detail::PreStep;
  const std::string sp_style = " (a SentencePiece-style tokenizer.json: convert from tokenizer.model)";
  if (m.byte_fallback) return fail(Errc::unsupported, origin + ": model.byte_fallback is set" + sp_style);
  for (const PreStep& st : m.pre_steps) {
    if (st.kind == PreStep::Kind::metaspace) {
      return fail(Errc::unsupported, origin + ": the pre-tokenizer is Metaspace" + sp_style);
    }
  }
  bool byte_level = false;
  std::vector<std::string> regexes;
  for (const PreStep& st : m.pre_steps) {
    if (byte_level && st.kind != PreStep::Kind::byte_level) {
      return fail(Errc::unsupported, origin + ": pre_tokenizer: a step after ByteLevel has no llama.cpp pre name");
    }
    switch (st.kind) {
      case PreStep::Kind::byte_level:
        if (st.add_prefix_space) {
          return fail(Errc::unsupported, origin + ": pre_tokenizer: ByteLevel add_prefix_space cannot be written to "
                                                  "a GGUF \"gpt2\" vocabulary");
        }
        if (st.use_regex && !byte_level) regexes.push_back(canonical_pre_regex(gpt2_regex()));
        byte_level = true;
        break;
      case PreStep::Kind::split:
        if (!st.regex) {
          return fail(Errc::unsupported, origin + ": pre_tokenizer: a Split with a String pattern ('" + st.pattern +
                                             "') has no llama.cpp pre name");
        }
        if (st.behavior != detail::SplitBehavior::isolated || st.invert) {
          return fail(Errc::unsupported, origin + ": pre_tokenizer: a Split with behavior " + split_kind(st.behavior) +
                                             (st.invert ? " inverted" : "") +
                                             " has no llama.cpp pre name (only Isolated)");
        }
        regexes.push_back(canonical_pre_regex(st.pattern));
        break;
      case PreStep::Kind::digits:
        regexes.push_back(st.individual_digits ? "\\p{N}" : "\\p{N}+");
        break;
      case PreStep::Kind::metaspace:
        break;  // refused above
    }
  }
  if (!byte_level) {
    return fail(Errc::unsupported, origin + ": the pre-tokenizer has no ByteLevel step, so this is not a byte-level "
                                            "BPE tokenizer" + sp_style);
  }
  for (const auto& d : m.decoders) {
    if (d.kind != detail::BpeModel::DecodeStep::Kind::byte_level) {
      return fail(Errc::unsupported, origin + ": the decoder is not ByteLevel alone" + sp_style);
    }
  }
  if (m.decoders.empty()) return fail(Errc::unsupported, origin + ": the tokenizer has no ByteLevel decoder");
  for (const auto& n : m.normalizers) {
    if (n.kind != detail::NormStep::Kind::unicode || n.form != detail::NormalForm::nfc) {
      return fail(Errc::unsupported, origin + ": normalizer: only none or NFC can be written to a GGUF \"gpt2\" "
                                              "vocabulary; this one is " + clip(m.pre_name));
    }
  }
  for (const auto& [name, list] : canonical_pre_table()) {
    if (list == regexes) return name;
  }
  return fail(Errc::unsupported, origin + ": its pre-tokenizer matches none of llama.cpp's pre names: " +
                                     clip(m.pre_name));
}

// tokenizer_config.json's "<key>": a string or {"content": string}; "" when absent or otherwise.
std::string config_token(const nlohmann::json& c, const char* key) {
  const auto it = c.find(key);
  if (it == c.end()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto ct = it->find("content");
    if (ct != it->end() && ct->is_string()) return ct->get<std::string>();
  }
  return {};
}

}  // namespace

std::string canonical_pre_regex(std::string_view pattern) {
  static const std::string gpt2_hf = canonical_escapes(std::string(gpt2_regex()) + "|\\s+");
  static const std::string gpt2 = canonical_escapes(gpt2_regex());
  std::string c = canonical_escapes(pattern);
  if (c == gpt2_hf) return gpt2;  // the final \s+ only matches what the list's between-match pieces keep anyway
  return c;
}

Result<BpeVocab> bpe_vocab_from_hf_json(std::string_view tokenizer_json, std::string origin,
                                        std::string_view tokenizer_config_json) {
  detail::BpeModel m;
  m.origin = origin;
  try {
    TANDEM_TRY(detail::read_hf_json(tokenizer_json, m));
  } catch (const std::exception& e) {
    return fail(Errc::parse_error, origin + ": " + e.what());
  }
  if (!m.bos_extra.empty()) {
    return fail(Errc::unsupported, origin + ": post_processor: more than one special token before the sequence (a "
                                            "GGUF vocabulary has one BOS)");
  }
  BpeVocab v;
  auto pre = identify_pre(m, origin);
  if (!pre) return fail(std::move(pre).error());
  v.pre = std::move(*pre);

  std::vector<std::uint8_t> added(m.tokens.size(), 0);
  v.types.assign(m.tokens.size(), PieceType::normal);
  for (const detail::AddedToken& a : m.added) {
    const auto i = static_cast<std::size_t>(a.id);
    added[i] = 1;
    v.types[i] = a.special ? PieceType::control : PieceType::user_defined;
  }
  const auto& alphabet = detail::ByteAlphabet::get();
  for (std::size_t i = 0; i < m.tokens.size(); ++i) {
    if (added[i] != 0) continue;
    const std::string& t = m.tokens[i];
    for (std::size_t at = 0; at < t.size();) {
      std::size_t len = detail::utf8_char_len(t, at);
      const std::uint32_t cp = len == 0 ? 0xFFFFFFFFu : detail::utf8_decode(t, at, &len);
      if (len == 0 || cp >= alphabet.cp_to_byte.size() || alphabet.cp_to_byte[cp] < 0) {
        return fail(Errc::format_error, origin + ": model.vocab['" + clip(t, 80) + "'] (id " + std::to_string(i) +
                                            ") is not byte-level text (a character outside GPT-2's byte alphabet)");
      }
      at += len;
    }
  }
  v.tokens = std::move(m.tokens);
  v.merges = std::move(m.merge_text);
  v.bos = m.bos;
  v.eos = m.eos;
  v.unk = m.unk;
  v.add_bos = m.adds_bos && v.bos >= 0;
  v.add_eos = m.adds_eos && v.eos >= 0;
  auto special_named = [&](std::string_view name) -> TokenId {
    for (const detail::AddedToken& a : m.added)
      if (a.special && a.content == name) return a.id;
    return -1;
  };
  for (std::string_view n : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|eot|>", "<end_of_turn>", "<|endoftext|>"}) {
    const TokenId id = special_named(n);
    if (id >= 0) {
      v.eot = id == v.eos ? -1 : id;
      break;
    }
  }
  if (!tokenizer_config_json.empty()) {
    const nlohmann::json c = nlohmann::json::parse(tokenizer_config_json, nullptr, false);
    if (c.is_discarded() || !c.is_object()) {
      return fail(Errc::parse_error, origin + ": tokenizer_config.json is not a JSON object");
    }
    auto id_of = [&](const char* key) -> TokenId {
      const std::string s = config_token(c, key);
      if (s.empty()) return -1;
      for (std::size_t i = 0; i < v.tokens.size(); ++i)
        if (v.tokens[i] == s) return static_cast<TokenId>(i);
      return -1;
    };
    if (v.bos < 0) v.bos = id_of("bos_token");
    if (v.eos < 0) v.eos = id_of("eos_token");
    if (v.pad < 0) v.pad = id_of("pad_token");
    if (v.unk < 0) v.unk = id_of("unk_token");
    if (v.eot >= 0 && v.eot == v.eos) v.eot = -1;
    if (const auto it = c.find("add_bos_token"); it != c.end() && it->is_boolean()) {
      v.add_bos = it->get<bool>() && v.bos >= 0;
    }
    if (const auto it = c.find("add_eos_token"); it != c.end() && it->is_boolean()) {
      v.add_eos = it->get<bool>() && v.eos >= 0;
    }
  }
  return v;
}

}  // namespace tandem::tok
