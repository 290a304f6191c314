// CLIP tokenizers from vocab.json + merges.txt (Tokenizer::from_vocab_merges) and CLIP's text pipeline
// (clip_text.h). The files are untrusted: every entry is checked and errors name the file and the key or line.
#include <nlohmann/json.hpp>

#include <unordered_map>

#include "tokenizer/bpe_model.h"
#include "tokenizer/clip_text.h"
#include "tokenizer/clip_vocab.h"
#include "tokenizer/tokenizer.h"

namespace tandem::tok {
namespace detail {

const char* const kClipSplitRegex =
    R"(<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+)";

namespace {

using Json = nlohmann::json;

constexpr std::size_t kMaxFileBytes = 512u << 20;
constexpr std::int64_t kMaxId = (4 << 20) - 1;

const Regex& clip_regex(int which) {
  static const Regex split = std::move(Regex::compile(kClipSplitRegex, "the CLIP regex")).value();
  static const Regex space = std::move(Regex::compile("\\s+", "the whitespace regex")).value();
  return which == 0 ? split : space;
}

// vocab.json: one flat object of token → integer id. Anything else stops the parse with `error` set.
class VocabSax : public nlohmann::json_sax<Json> {
 public:
  std::vector<std::pair<std::string, std::int64_t>> items;
  std::string error;  // after the origin
  bool syntax_error = false;

  bool null() override { return value("null"); }
  bool boolean(bool) override { return value("a boolean"); }
  bool number_integer(number_integer_t v) override { return id(v); }
  bool number_unsigned(number_unsigned_t v) override {
    return id(v > static_cast<number_unsigned_t>(kMaxId) ? kMaxId + 1 : static_cast<std::int64_t>(v));
  }
  bool number_float(number_float_t, const string_t&) override { return value("a number"); }
  bool string(string_t&) override { return value("a string"); }
  bool binary(binary_t&) override { return value("binary"); }
  bool start_object(std::size_t) override {
    if (depth_++ == 0) return true;
    return value("an object");
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override { return value("an array"); }
  bool end_array() override { return true; }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    syntax_error = true;
    return false;
  }

 private:
  bool value(const char* kind) {
    error = depth_ == 0 ? std::string("the top level must be an object, got ") + kind
                        : "['" + key_ + "'] must be an integer id, got " + kind;
    return false;
  }
  bool id(std::int64_t v) {
    if (depth_ == 0) return value("an integer");
    items.emplace_back(std::move(key_), v);
    return true;
  }
  int depth_ = 0;
  std::string key_;
};

std::string json_string(const std::string& s) { return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace

std::vector<std::string> clip_split(std::string_view text) {
  std::string s = normalize(utf8_sanitize(text), NormalForm::nfc);
  std::vector<std::pair<std::size_t, std::size_t>> m;
  clip_regex(1).find_all(s, m);
  if (!m.empty()) {
    std::string r;
    std::size_t at = 0;
    for (auto [b, e] : m) {
      r.append(s, at, b - at);
      r += ' ';
      at = e;
    }
    r.append(s, at, std::string::npos);
    s = std::move(r);
  }
  s = to_lower(s);
  m.clear();
  clip_regex(0).find_all(s, m);
  std::vector<std::string> out;
  out.reserve(m.size());
  for (auto [b, e] : m) out.emplace_back(s.substr(b, e - b));
  return out;
}

std::string clip_components_json(const std::string& bos, std::int64_t bos_id, const std::string& eos,
                                 std::int64_t eos_id) {
  return std::string(R"({"normalizer":{"type":"Sequence","normalizers":[{"type":"NFC"},)") +
         R"({"type":"Replace","pattern":{"Regex":"\\s+"},"content":" "},{"type":"Lowercase"}]},)" +
         R"("pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":)" +
         json_string(kClipSplitRegex) + R"(},"behavior":"Removed","invert":true},)" +
         R"({"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]},)" +
         R"("post_processor":{"type":"RobertaProcessing","sep":[)" + json_string(eos) + "," + std::to_string(eos_id) +
         R"(],"cls":[)" + json_string(bos) + "," + std::to_string(bos_id) +
         R"(],"trim_offsets":false,"add_prefix_space":false},)" +
         R"("decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true}})";
}

}  // namespace detail

Result<Tokenizer> Tokenizer::from_vocab_merges(std::string_view vocab_json, std::string_view merges_txt,
                                               const VocabMergesOptions& options) {
  const std::string& vo = options.vocab_origin;
  const std::string& mo = options.merges_origin;
  auto bad = [](Errc c, const std::string& origin, const std::string& what) {
    return fail(c, origin + ": " + what);
  };
  // vocab.json
  if (vocab_json.size() > detail::kMaxFileBytes) return bad(Errc::format_error, vo, "is too large");
  if (!detail::utf8_valid(vocab_json)) return bad(Errc::parse_error, vo, "is not valid UTF-8");
  detail::VocabSax sax;
  bool parsed = false;
  try {
    parsed = detail::Json::sax_parse(vocab_json.begin(), vocab_json.end(), &sax,
                                     nlohmann::json::input_format_t::json, true);
  } catch (const std::exception& e) {
    return bad(Errc::parse_error, vo, e.what());
  }
  if (!sax.error.empty()) return bad(Errc::format_error, vo, sax.error);
  if (!parsed || sax.syntax_error) return bad(Errc::parse_error, vo, "is not valid JSON");
  if (sax.items.empty()) return bad(Errc::format_error, vo, "is empty");
  if (sax.items.size() > static_cast<std::size_t>(detail::kMaxId)) return bad(Errc::format_error, vo, "is too large");
  auto m = std::make_unique<detail::BpeModel>();
  m->origin = vo;
  m->tokens.resize(sax.items.size());
  std::unordered_map<std::string, TokenId> id_of;
  id_of.reserve(sax.items.size());
  for (auto& [tok, id] : sax.items) {
    const std::string key = "['" + tok + "']";
    if (tok.empty()) return bad(Errc::format_error, vo, "[''] is an empty token");
    if (id < 0 || static_cast<std::size_t>(id) >= sax.items.size()) {
      return bad(Errc::format_error, vo, key + " id " + std::to_string(id) + " is out of range [0, " +
                                             std::to_string(sax.items.size() - 1) + "] (ids must be dense)");
    }
    std::string& slot = m->tokens[static_cast<std::size_t>(id)];
    if (!slot.empty()) {
      return bad(Errc::format_error, vo, key + " id " + std::to_string(id) + " is given to both '" + slot + "' and '" +
                                             tok + "'");
    }
    if (!id_of.emplace(tok, static_cast<TokenId>(id)).second) {
      return bad(Errc::format_error, vo, key + " appears twice");
    }
    slot = std::move(tok);
  }
  sax.items.clear();
  sax.items.shrink_to_fit();
  // (n distinct ids in [0, n) are dense.)

  // The flavour.
  bool clip = options.flavor == VocabMergesFlavor::clip;
  if (options.flavor == VocabMergesFlavor::detect) {
    for (const std::string& t : m->tokens) {
      if (t.size() > kClipWordEnd.size() && t.compare(t.size() - kClipWordEnd.size(), kClipWordEnd.size(),
                                                      kClipWordEnd) == 0) {
        clip = true;
        break;
      }
    }
    if (!clip) {
      return bad(Errc::unsupported, vo, "has no word-final '</w>' tokens: only CLIP's vocab.json + merges.txt is "
                                        "read (GPT-2-style models need their tokenizer.json)");
    }
  }

  // merges.txt
  if (merges_txt.size() > detail::kMaxFileBytes) return bad(Errc::format_error, mo, "is too large");
  if (!detail::utf8_valid(merges_txt)) return bad(Errc::parse_error, mo, "is not valid UTF-8");
  std::string joined;
  std::size_t line_no = 0;
  for (std::size_t at = 0; at < merges_txt.size();) {
    std::size_t nl = merges_txt.find('\n', at);
    if (nl == std::string_view::npos) nl = merges_txt.size();
    std::string_view line = merges_txt.substr(at, nl - at);
    at = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line_no == 1 && line.substr(0, 8) == "#version") continue;
    if (line.empty()) continue;
    const std::string where = "line " + std::to_string(line_no) + " '" + std::string(line) + "'";
    const std::size_t sp = line.find(' ');
    if (sp == 0 || sp == std::string_view::npos || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string_view::npos) {
      return bad(Errc::format_error, mo, where + " is not two tokens separated by one space");
    }
    std::string a(line.substr(0, sp)), b(line.substr(sp + 1));
    if (id_of.count(a) == 0 || id_of.count(b) == 0) {
      return bad(Errc::format_error, mo, where + " names '" + (id_of.count(a) == 0 ? a : b) +
                                             "', which is not in " + vo);
    }
    joined = a + b;
    if (id_of.count(joined) == 0) {
      return bad(Errc::format_error, mo, where + ": the result '" + joined + "' is not in " + vo);
    }
    m->merge_text.emplace_back(std::move(a), std::move(b));
  }

  // The specials, the components.
  const auto bos = id_of.find(std::string(kClipBos));
  const auto eos = id_of.find(std::string(kClipEos));
  if (bos == id_of.end() || eos == id_of.end()) {
    return bad(Errc::format_error, vo, "has no '" + std::string(bos == id_of.end() ? kClipBos : kClipEos) +
                                           "' token (CLIP's BOS and EOS)");
  }
  m->types.assign(m->tokens.size(), PieceType::normal);
  for (TokenId id : {bos->second, eos->second}) {
    m->types[static_cast<std::size_t>(id)] = PieceType::control;
    m->added.push_back(detail::AddedToken{id, m->tokens[static_cast<std::size_t>(id)], true, false, false, false});
  }
  m->end_of_word_suffix = std::string(kClipWordEnd);
  m->decode_suffix = m->end_of_word_suffix;
  try {
    TANDEM_TRY(detail::read_hf_components(
        detail::clip_components_json(std::string(kClipBos), bos->second, std::string(kClipEos), eos->second), *m));
  } catch (const std::exception& e) {
    return fail(Errc::internal, vo + ": " + e.what());
  }
  m->unk = eos->second;  // transformers' CLIPTokenizer: unk = pad = <|endoftext|>
  m->pad = eos->second;
  TANDEM_TRY(m->finish());
  ClipVocab cv{m->tokens, m->merge_text};
  auto json = clip_hf_json(cv);
  if (!json.ok()) return fail(std::move(json).error());
  m->model_bytes = std::move(*json);
  return Tokenizer(std::move(m));
}

}  // namespace tandem::tok
