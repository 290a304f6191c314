// WordPiece (wordpiece.h): Hugging Face tokenizers' BertNormalizer, BertPreTokenizer and WordPiece model
// (tokenizers/src/normalizers/bert.rs, pre_tokenizers/bert.rs, models/wordpiece), with ICU for the character
// classes, NFD and lowercasing.
#include "tokenizer/wordpiece.h"

#include <unicode/uchar.h>

#include <nlohmann/json.hpp>
#include <unordered_map>

#include "tokenizer/unicode.h"

namespace tandem::tok {

namespace detail {
namespace {

bool is_bert_whitespace(std::uint32_t c) {
  return c == '\t' || c == '\n' || c == '\r' || is_whitespace_cp(c);
}

// Rust's char::is_other minus \t \n \r: categories Cc, Cf, Cs, Co, Cn.
bool is_bert_control(std::uint32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  const auto t = static_cast<UCharCategory>(u_charType(static_cast<UChar32>(c)));
  return t == U_CONTROL_CHAR || t == U_FORMAT_CHAR || t == U_SURROGATE || t == U_PRIVATE_USE_CHAR ||
         t == U_UNASSIGNED;
}

bool is_cjk(std::uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

bool is_bert_punctuation(std::uint32_t c) {
  if (c < 128) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  const auto t = static_cast<UCharCategory>(u_charType(static_cast<UChar32>(c)));
  return t == U_CONNECTOR_PUNCTUATION || t == U_DASH_PUNCTUATION || t == U_START_PUNCTUATION ||
         t == U_END_PUNCTUATION || t == U_INITIAL_PUNCTUATION || t == U_FINAL_PUNCTUATION || t == U_OTHER_PUNCTUATION;
}

template <class F>
void for_each_cp(std::string_view s, F&& f) {
  for (std::size_t i = 0; i < s.size();) {
    std::size_t len = 0;
    const std::uint32_t c = utf8_decode(s, i, &len);
    f(c);
    i += len;
  }
}

}  // namespace

std::vector<std::string> bert_words(std::string_view text, const WordPieceOptions& o) {
  std::string s = utf8_sanitize(text);
  if (o.clean_text || o.handle_chinese_chars) {
    std::string t;
    t.reserve(s.size());
    for_each_cp(s, [&](std::uint32_t c) {
      if (o.clean_text) {
        if (c == 0 || c == 0xFFFD || is_bert_control(c)) return;
        if (is_bert_whitespace(c)) c = ' ';
      }
      if (o.handle_chinese_chars && is_cjk(c)) {
        t.push_back(' ');
        append_utf8(t, c);
        t.push_back(' ');
      } else {
        append_utf8(t, c);
      }
    });
    s = std::move(t);
  }
  if (o.strip_accents) {
    const std::string d = normalize(s, NormalForm::nfd);
    std::string t;
    t.reserve(d.size());
    for_each_cp(d, [&](std::uint32_t c) {
      if (u_charType(static_cast<UChar32>(c)) != U_NON_SPACING_MARK) append_utf8(t, c);
    });
    s = std::move(t);
  }
  if (o.lowercase) s = to_lower(s);
  // Split on whitespace (removed), then isolate every punctuation character.
  std::vector<std::string> words;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty()) words.push_back(std::move(cur));
    cur.clear();
  };
  for (std::size_t i = 0; i < s.size();) {
    std::size_t len = 0;
    const std::uint32_t c = utf8_decode(s, i, &len);
    if (is_bert_whitespace(c)) {
      flush();
    } else if (is_bert_punctuation(c)) {
      flush();
      words.emplace_back(s.substr(i, len));
    } else {
      cur.append(s, i, len);
    }
    i += len;
  }
  flush();
  return words;
}

}  // namespace detail

struct WordPieceTokenizer::Impl {
  std::vector<std::string> tokens;
  std::unordered_map<std::string, std::int32_t> ids;
  WordPieceOptions opts;
  std::string origin;
  std::int32_t unk = -1, cls = -1, sep = -1, pad = -1;

  // One word's pieces (ids), or [UNK] alone.
  void word(std::string_view w, std::vector<std::int32_t>& out) const {
    std::vector<std::size_t> bounds;  // byte offsets of the character starts, then the end
    for (std::size_t i = 0; i < w.size();) {
      bounds.push_back(i);
      const std::size_t l = detail::utf8_char_len(w, i);
      i += l == 0 ? 1 : l;
    }
    const std::size_t nchars = bounds.size();
    bounds.push_back(w.size());
    if (static_cast<long>(nchars) > opts.max_input_chars_per_word) {
      out.push_back(unk);
      return;
    }
    const std::size_t mark = out.size();
    std::string key;
    for (std::size_t start = 0; start < nchars;) {
      std::size_t end = nchars;
      std::int32_t found = -1;
      for (; end > start; --end) {
        key.assign(start > 0 ? opts.continuing_prefix : std::string());
        key.append(w.substr(bounds[start], bounds[end] - bounds[start]));
        if (auto it = ids.find(key); it != ids.end()) {
          found = it->second;
          break;
        }
      }
      if (found < 0) {
        out.resize(mark);
        out.push_back(unk);
        return;
      }
      out.push_back(found);
      start = end;
    }
  }
};

WordPieceTokenizer::WordPieceTokenizer() : impl_(std::make_unique<Impl>()) {}
WordPieceTokenizer::WordPieceTokenizer(WordPieceTokenizer&&) noexcept = default;
WordPieceTokenizer& WordPieceTokenizer::operator=(WordPieceTokenizer&&) noexcept = default;
WordPieceTokenizer::~WordPieceTokenizer() = default;

Result<WordPieceTokenizer> WordPieceTokenizer::from_tokens(std::vector<std::string> tokens, std::string origin,
                                                           const WordPieceOptions& o) {
  WordPieceTokenizer t;
  Impl& im = *t.impl_;
  if (tokens.empty()) return fail(Errc::format_error, origin + ": the vocabulary is empty");
  if (tokens.size() > (1u << 24)) return fail(Errc::format_error, origin + ": more than 2^24 tokens");
  im.ids.reserve(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (!detail::utf8_valid(tokens[i]))
      return fail(Errc::format_error, origin + ": token " + std::to_string(i) + " is not valid UTF-8");
    if (!im.ids.emplace(tokens[i], static_cast<std::int32_t>(i)).second)
      return fail(Errc::format_error, origin + ": token " + std::to_string(i) + " (" +
                                          (tokens[i].size() <= 64 ? tokens[i] : "(long)") + ") appears twice");
  }
  im.tokens = std::move(tokens);
  im.opts = o;
  im.origin = std::move(origin);
  auto need = [&](const std::string& name, std::int32_t& id) -> Status {
    id = t.id_of(name);
    if (id < 0) return fail(Errc::format_error, im.origin + ": the vocabulary has no " + name + " token");
    return {};
  };
  TANDEM_TRY(need(o.unk, im.unk));
  TANDEM_TRY(need(o.cls, im.cls));
  TANDEM_TRY(need(o.sep, im.sep));
  im.pad = t.id_of(o.pad);
  if (o.max_input_chars_per_word < 1) return fail(Errc::format_error, im.origin + ": max_input_chars_per_word < 1");
  return t;
}

Result<WordPieceTokenizer> WordPieceTokenizer::from_vocab_txt(std::string_view text, std::string origin,
                                                              const WordPieceOptions& o) {
  std::vector<std::string> tokens;
  std::size_t i = 0;
  while (i < text.size()) {
    std::size_t nl = text.find('\n', i);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(i, nl - i);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    tokens.emplace_back(line);
    i = nl + 1;
  }
  return from_tokens(std::move(tokens), std::move(origin), o);
}

Result<WordPieceTokenizer> WordPieceTokenizer::from_hf_json(std::string_view text, std::string origin) {
  using nlohmann::json;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return fail(Errc::parse_error, origin + ": not JSON: " + e.what());
  }
  auto bad = [&](const std::string& key, const std::string& what) {
    return fail(Errc::format_error, origin + ": " + key + " " + what);
  };
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) return bad("model", "is missing");
  const json& m = j["model"];
  const std::string type = m.value("type", std::string());
  if (type != "WordPiece")
    return fail(Errc::unsupported, origin + ": model.type \"" + type.substr(0, 64) + "\" is not WordPiece");
  if (!m.contains("vocab") || !m["vocab"].is_object()) return bad("model.vocab", "must be an object of ids");
  WordPieceOptions o;
  try {
    if (m.contains("unk_token")) o.unk = m["unk_token"].get<std::string>();
    if (m.contains("continuing_subword_prefix")) o.continuing_prefix = m["continuing_subword_prefix"].get<std::string>();
    if (m.contains("max_input_chars_per_word")) o.max_input_chars_per_word = m["max_input_chars_per_word"].get<int>();
  } catch (const json::exception& e) {
    return bad("model", std::string("has a mistyped key: ") + e.what());
  }
  const json& v = m["vocab"];
  std::vector<std::string> tokens(v.size());
  std::vector<bool> seen(v.size(), false);
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it->is_number_integer()) return bad("model.vocab", "ids must be integers");
    const auto id = it->get<std::int64_t>();
    if (id < 0 || id >= static_cast<std::int64_t>(tokens.size()) || seen[static_cast<std::size_t>(id)])
      return bad("model.vocab", "ids must be 0 .. " + std::to_string(tokens.size() - 1) + " once each, got " +
                                    std::to_string(id));
    seen[static_cast<std::size_t>(id)] = true;
    tokens[static_cast<std::size_t>(id)] = it.key();
  }
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const json& n = j["normalizer"];
    if (!n.is_object() || n.value("type", std::string()) != "BertNormalizer")
      return fail(Errc::unsupported, origin + ": normalizer type \"" +
                                         (n.is_object() ? n.value("type", std::string()).substr(0, 64) : std::string()) +
                                         "\" is not supported with WordPiece (only BertNormalizer)");
    auto flag = [&](const char* key, bool dflt) -> Result<bool> {
      if (!n.contains(key) || n[key].is_null()) return dflt;
      if (!n[key].is_boolean()) return fail(Errc::format_error, origin + ": normalizer." + key + " must be a boolean");
      return n[key].get<bool>();
    };
    auto b = flag("lowercase", true);
    if (!b) return fail(std::move(b).error());
    o.lowercase = *b;
    b = flag("strip_accents", o.lowercase);  // null: follows lowercase
    if (!b) return fail(std::move(b).error());
    o.strip_accents = *b;
    b = flag("handle_chinese_chars", true);
    if (!b) return fail(std::move(b).error());
    o.handle_chinese_chars = *b;
    b = flag("clean_text", true);
    if (!b) return fail(std::move(b).error());
    o.clean_text = *b;
  }
  // [CLS] / [SEP] from the post-processor when it names them.
  if (j.contains("post_processor") && j["post_processor"].is_object()) {
    const json& p = j["post_processor"];
    const std::string pt = p.value("type", std::string());
    if (pt == "BertProcessing" && p.contains("cls") && p["cls"].is_array() && p.contains("sep") && p["sep"].is_array() &&
        !p["cls"].empty() && !p["sep"].empty() && p["cls"][0].is_string() && p["sep"][0].is_string()) {
      o.cls = p["cls"][0].get<std::string>();
      o.sep = p["sep"][0].get<std::string>();
    } else if (pt == "TemplateProcessing" && p.contains("single") && p["single"].is_array() && p["single"].size() >= 2) {
      const json& s = p["single"];
      auto special = [](const json& e) -> std::string {
        if (e.is_object() && e.contains("SpecialToken") && e["SpecialToken"].is_object())
          return e["SpecialToken"].value("id", std::string());
        return {};
      };
      if (const std::string c = special(s.front()); !c.empty()) o.cls = c;
      if (const std::string e = special(s.back()); !e.empty()) o.sep = e;
    }
  }
  return from_tokens(std::move(tokens), std::move(origin), o);
}

std::vector<std::string> WordPieceTokenizer::pieces(std::string_view text) const {
  std::vector<std::int32_t> ids;
  for (const std::string& w : detail::bert_words(text, impl_->opts)) impl_->word(w, ids);
  std::vector<std::string> out;
  out.reserve(ids.size());
  for (std::int32_t id : ids) out.push_back(impl_->tokens[static_cast<std::size_t>(id)]);
  return out;
}

std::vector<std::int32_t> WordPieceTokenizer::encode(std::string_view text, std::size_t max_tokens) const {
  std::vector<std::int32_t> ids{impl_->cls};
  for (const std::string& w : detail::bert_words(text, impl_->opts)) {
    impl_->word(w, ids);
    if (max_tokens > 0 && ids.size() >= max_tokens) break;  // (the rest would be cut anyway)
  }
  if (max_tokens >= 2 && ids.size() > max_tokens - 1) ids.resize(max_tokens - 1);
  ids.push_back(impl_->sep);
  return ids;
}

int WordPieceTokenizer::vocab_size() const { return static_cast<int>(impl_->tokens.size()); }
const std::string& WordPieceTokenizer::token(std::int32_t id) const {
  static const std::string kNone;
  return id >= 0 && id < vocab_size() ? impl_->tokens[static_cast<std::size_t>(id)] : kNone;
}
std::int32_t WordPieceTokenizer::id_of(std::string_view token) const {
  auto it = impl_->ids.find(std::string(token));
  return it == impl_->ids.end() ? -1 : it->second;
}
std::int32_t WordPieceTokenizer::cls_id() const { return impl_->cls; }
std::int32_t WordPieceTokenizer::sep_id() const { return impl_->sep; }
std::int32_t WordPieceTokenizer::unk_id() const { return impl_->unk; }
std::int32_t WordPieceTokenizer::pad_id() const { return impl_->pad; }
const WordPieceOptions& WordPieceTokenizer::options() const { return impl_->opts; }
const std::string& WordPieceTokenizer::origin() const { return impl_->origin; }

}  // namespace tandem::tok
