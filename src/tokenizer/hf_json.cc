// Reading a Hugging Face tokenizer.json (model BPE) into a BpeModel, and Tokenizer::from_hf_json /
// from_bpe_vocab. The file is untrusted: every key is type-checked and errors name the file and the key.
#include <nlohmann/json.hpp>

#include "tokenizer/bpe_model.h"
#include "tokenizer/tokenizer.h"

namespace tandem::tok {
namespace detail {

using Json = nlohmann::json;

namespace {

constexpr std::size_t kMaxJsonBytes = 512u << 20;
constexpr int kMaxDepth = 64;
constexpr std::int64_t kMaxId = (4 << 20) - 1;

// Nesting depth of JSON text (brackets outside strings), without building a tree.
int json_depth(std::string_view s) {
  int depth = 0, max_depth = 0;
  bool in_str = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_str) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_str = false;
      }
    } else if (c == '"') {
      in_str = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

std::string kind_of(const Json& v) {
  switch (v.type()) {
    case Json::value_t::object:
      return "object";
    case Json::value_t::array:
      return "array";
    case Json::value_t::string:
      return "string";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::null:
      return "null";
    case Json::value_t::number_float:
      return "number";
    default:
      return "integer";
  }
}

class Reader {
 public:
  explicit Reader(const std::string& origin) : origin_(origin) {}

  Failure bad(Errc code, const std::string& key, const std::string& what) const {
    return fail(code, origin_ + ": " + key + " " + what);
  }
  Failure wrong(const std::string& key, const Json& v, const char* want) const {
    return bad(Errc::format_error, key, std::string("must be ") + want + ", got " + kind_of(v));
  }
  // Optional members: absent or null → default.
  Result<bool> boolean(const Json& o, const char* k, const std::string& path, bool dflt) const {
    const auto it = o.find(k);
    if (it == o.end() || it->is_null()) return dflt;
    if (!it->is_boolean()) return wrong(path + "." + k, *it, "a boolean");
    return it->get<bool>();
  }
  Result<std::string> string(const Json& o, const char* k, const std::string& path, const char* dflt) const {
    const auto it = o.find(k);
    if (it == o.end() || it->is_null()) {
      if (dflt == nullptr) return bad(Errc::format_error, path + "." + k, "is missing");
      return std::string(dflt);
    }
    if (!it->is_string()) return wrong(path + "." + k, *it, "a string");
    return it->get<std::string>();
  }
  Result<std::int64_t> integer(const Json& o, const char* k, const std::string& path, std::int64_t lo,
                               std::int64_t hi, std::optional<std::int64_t> dflt) const {
    const auto it = o.find(k);
    if (it == o.end() || it->is_null()) {
      if (!dflt) return bad(Errc::format_error, path + "." + k, "is missing");
      return *dflt;
    }
    if (!it->is_number_integer()) return wrong(path + "." + k, *it, "an integer");
    const std::int64_t v = it->is_number_unsigned() && it->get<std::uint64_t>() > static_cast<std::uint64_t>(hi)
                               ? hi + 1
                               : it->get<std::int64_t>();
    if (v < lo || v > hi) {
      return bad(Errc::format_error, path + "." + k,
                 "= " + std::to_string(v) + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    return v;
  }
  // A {"String": s} or {"Regex": r} pattern.
  struct Pattern {
    std::string text;
    bool regex = false;
  };
  Result<Pattern> pattern(const Json& o, const std::string& path) const {
    const auto it = o.find("pattern");
    if (it == o.end() || !it->is_object()) {
      return bad(Errc::format_error, path + ".pattern", "must be an object {\"String\": ..} or {\"Regex\": ..}");
    }
    if (const auto s = it->find("String"); s != it->end() && s->is_string()) return Pattern{s->get<std::string>(), false};
    if (const auto r = it->find("Regex"); r != it->end() && r->is_string()) return Pattern{r->get<std::string>(), true};
    return bad(Errc::format_error, path + ".pattern", "must hold a string \"String\" or \"Regex\"");
  }

  const std::string& origin_;
};

#define HJ_ASSIGN(lhs, expr)                                  \
  do {                                                        \
    auto _r = (expr);                                         \
    if (!_r.ok()) return ::tandem::fail(std::move(_r).error()); \
    lhs = std::move(*_r);                                     \
  } while (0)

Status read_normalizer(const Reader& rd, const Json& n, const std::string& path, BpeModel& m) {
  if (n.is_null()) return {};
  if (!n.is_object()) return rd.wrong(path, n, "an object or null");
  std::string type;
  HJ_ASSIGN(type, rd.string(n, "type", path, nullptr));
  NormStep st;
  if (type == "NFC" || type == "NFKC" || type == "NFD" || type == "NFKD") {
    st.kind = NormStep::Kind::unicode;
    st.form = type == "NFC" ? NormalForm::nfc : type == "NFKC" ? NormalForm::nfkc : type == "NFD" ? NormalForm::nfd
                                                                                               : NormalForm::nfkd;
  } else if (type == "Lowercase") {
    st.kind = NormStep::Kind::lowercase;
  } else if (type == "Prepend") {
    st.kind = NormStep::Kind::prepend;
    HJ_ASSIGN(st.a, rd.string(n, "prepend", path, nullptr));
  } else if (type == "Replace") {
    Reader::Pattern p;
    HJ_ASSIGN(p, rd.pattern(n, path));
    HJ_ASSIGN(st.b, rd.string(n, "content", path, nullptr));
    st.a = p.text;
    st.kind = p.regex ? NormStep::Kind::replace_regex : NormStep::Kind::replace_string;
    if (p.regex) HJ_ASSIGN(st.regex, Regex::compile(p.text, rd.origin_ + ": " + path + ".pattern.Regex"));
  } else if (type == "Sequence") {
    const auto it = n.find("normalizers");
    if (it == n.end() || !it->is_array()) return rd.bad(Errc::format_error, path + ".normalizers", "must be an array");
    for (std::size_t k = 0; k < it->size(); ++k) {
      TANDEM_TRY(read_normalizer(rd, (*it)[k], path + ".normalizers[" + std::to_string(k) + "]", m));
    }
    return {};
  } else {
    return rd.bad(Errc::unsupported, path + ".type", "'" + type + "' is not a supported normalizer (NFC, NFKC, NFD, "
                                                     "NFKD, Lowercase, Prepend, Replace, Sequence)");
  }
  m.normalizers.push_back(std::move(st));
  return {};
}

Result<SplitBehavior> behavior_of(const Reader& rd, const std::string& b, const std::string& path) {
  if (b == "Isolated") return SplitBehavior::isolated;
  if (b == "Removed") return SplitBehavior::removed;
  if (b == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (b == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (b == "Contiguous") return SplitBehavior::contiguous;
  return rd.bad(Errc::format_error, path, "'" + b + "' is not a split behavior");
}

Result<PreStep::Prepend> prepend_of(const Reader& rd, const Json& o, const std::string& path) {
  std::string scheme;
  HJ_ASSIGN(scheme, rd.string(o, "prepend_scheme", path, ""));
  if (scheme.empty()) {  // older files: add_prefix_space
    bool add = true;
    HJ_ASSIGN(add, rd.boolean(o, "add_prefix_space", path, true));
    return add ? PreStep::Prepend::always : PreStep::Prepend::never;
  }
  if (scheme == "always") return PreStep::Prepend::always;
  if (scheme == "first") return PreStep::Prepend::first;
  if (scheme == "never") return PreStep::Prepend::never;
  return rd.bad(Errc::format_error, path + ".prepend_scheme", "'" + scheme + "' is not always/first/never");
}

constexpr std::string_view kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

Status read_pre(const Reader& rd, const Json& n, const std::string& path, BpeModel& m) {
  if (n.is_null()) return {};
  if (!n.is_object()) return rd.wrong(path, n, "an object or null");
  std::string type;
  HJ_ASSIGN(type, rd.string(n, "type", path, nullptr));
  PreStep st;
  if (type == "ByteLevel") {
    st.kind = PreStep::Kind::byte_level;
    HJ_ASSIGN(st.add_prefix_space, rd.boolean(n, "add_prefix_space", path, true));
    HJ_ASSIGN(st.use_regex, rd.boolean(n, "use_regex", path, true));
    if (st.use_regex) HJ_ASSIGN(st.regex, Regex::compile(kGpt2Regex, "the GPT-2 regex"));
  } else if (type == "Split") {
    st.kind = PreStep::Kind::split;
    Reader::Pattern p;
    HJ_ASSIGN(p, rd.pattern(n, path));
    st.pattern = p.text;
    if (p.regex) HJ_ASSIGN(st.regex, Regex::compile(p.text, rd.origin_ + ": " + path + ".pattern.Regex"));
    std::string b;
    HJ_ASSIGN(b, rd.string(n, "behavior", path, nullptr));
    HJ_ASSIGN(st.behavior, behavior_of(rd, b, path + ".behavior"));
    HJ_ASSIGN(st.invert, rd.boolean(n, "invert", path, false));
  } else if (type == "Digits") {
    st.kind = PreStep::Kind::digits;
    HJ_ASSIGN(st.individual_digits, rd.boolean(n, "individual_digits", path, false));
  } else if (type == "Metaspace") {
    st.kind = PreStep::Kind::metaspace;
    HJ_ASSIGN(st.replacement, rd.string(n, "replacement", path, "\xE2\x96\x81"));
    if (st.replacement.empty() || utf8_char_len(st.replacement, 0) != st.replacement.size()) {
      return rd.bad(Errc::format_error, path + ".replacement", "must be one character");
    }
    HJ_ASSIGN(st.prepend, prepend_of(rd, n, path));
    HJ_ASSIGN(st.split_on_replacement, rd.boolean(n, "split", path, true));
  } else if (type == "Sequence") {
    const auto it = n.find("pretokenizers");
    if (it == n.end() || !it->is_array()) return rd.bad(Errc::format_error, path + ".pretokenizers", "must be an array");
    for (std::size_t k = 0; k < it->size(); ++k) {
      TANDEM_TRY(read_pre(rd, (*it)[k], path + ".pretokenizers[" + std::to_string(k) + "]", m));
    }
    return {};
  } else {
    return rd.bad(Errc::unsupported, path + ".type", "'" + type + "' is not a supported pre-tokenizer (ByteLevel, "
                                                     "Split, Digits, Metaspace, Sequence)");
  }
  m.pre_steps.push_back(std::move(st));
  return {};
}

Status read_decoder(const Reader& rd, const Json& n, const std::string& path, BpeModel& m) {
  using K = BpeModel::DecodeStep::Kind;
  if (n.is_null()) return {};
  if (!n.is_object()) return rd.wrong(path, n, "an object or null");
  std::string type;
  HJ_ASSIGN(type, rd.string(n, "type", path, nullptr));
  if (type == "ByteLevel") {
    m.decoders.push_back({K::byte_level, {}, {}, 0});
  } else if (type == "ByteFallback") {
    m.decoders.push_back({K::byte_fallback, {}, {}, 0});
  } else if (type == "BPEDecoder") {  // CLIP: the word-final suffix → a space between words
    HJ_ASSIGN(m.decode_suffix, rd.string(n, "suffix", path, "</w>"));
    if (m.decode_suffix.empty()) return rd.bad(Errc::format_error, path + ".suffix", "is empty");
  } else if (type == "Fuse") {
    m.decoders.push_back({K::fuse, {}, {}, 0});
  } else if (type == "Replace") {
    Reader::Pattern p;
    HJ_ASSIGN(p, rd.pattern(n, path));
    if (p.regex) return rd.bad(Errc::unsupported, path + ".pattern", "a Regex Replace decoder is not supported");
    std::string content;
    HJ_ASSIGN(content, rd.string(n, "content", path, nullptr));
    m.decoders.push_back({K::replace, p.text, content, 0});
  } else if (type == "Strip") {
    std::string content;
    HJ_ASSIGN(content, rd.string(n, "content", path, nullptr));
    std::int64_t start = 0, stop = 0;
    HJ_ASSIGN(start, rd.integer(n, "start", path, 0, 1024, 0));
    HJ_ASSIGN(stop, rd.integer(n, "stop", path, 0, 1024, 0));
    if (stop != 0) return rd.bad(Errc::unsupported, path + ".stop", "a Strip decoder with stop > 0 is not supported");
    m.decoders.push_back({K::strip, content, {}, static_cast<int>(start)});
  } else if (type == "Metaspace") {
    std::string rep;
    HJ_ASSIGN(rep, rd.string(n, "replacement", path, "\xE2\x96\x81"));
    PreStep::Prepend pp{};
    HJ_ASSIGN(pp, prepend_of(rd, n, path));
    m.decoders.push_back({K::replace, rep, " ", 0});
    if (pp != PreStep::Prepend::never) {
      m.decoders.push_back({K::fuse, {}, {}, 0});
      m.decoders.push_back({K::strip, " ", {}, 1});
    }
  } else if (type == "Sequence") {
    const auto it = n.find("decoders");
    if (it == n.end() || !it->is_array()) return rd.bad(Errc::format_error, path + ".decoders", "must be an array");
    for (std::size_t k = 0; k < it->size(); ++k) {
      TANDEM_TRY(read_decoder(rd, (*it)[k], path + ".decoders[" + std::to_string(k) + "]", m));
    }
  } else {
    return rd.bad(Errc::unsupported, path + ".type", "'" + type + "' is not a supported decoder (ByteLevel, "
                                                     "BPEDecoder, Metaspace, ByteFallback, Fuse, Strip, Replace, "
                                                     "Sequence)");
  }
  return {};
}

// RobertaProcessing (CLIP's): "cls": [token, id] before the sequence = BOS, "sep": [token, id] after it = EOS.
Status read_roberta(const Reader& rd, const Json& n, const std::string& path, BpeModel& m) {
  if (m.adds_bos || m.adds_eos) return rd.bad(Errc::unsupported, path, "a second post-processor adding BOS / EOS");
  TokenId got[2] = {-1, -1};
  const char* keys[2] = {"cls", "sep"};
  for (int k = 0; k < 2; ++k) {
    const std::string kpath = path + "." + keys[k];
    const auto it = n.find(keys[k]);
    if (it == n.end() || !it->is_array() || it->size() != 2 || !(*it)[0].is_string() ||
        !(*it)[1].is_number_integer()) {
      return rd.bad(Errc::format_error, kpath, "must be [token, id]");
    }
    const std::string name = (*it)[0].get<std::string>();
    const std::int64_t id = (*it)[1].is_number_unsigned() && (*it)[1].get<std::uint64_t>() > static_cast<std::uint64_t>(kMaxId)
                                ? -1
                                : (*it)[1].get<std::int64_t>();
    if (id < 0 || static_cast<std::size_t>(id) >= m.tokens.size()) {
      return rd.bad(Errc::format_error, kpath, "id " + std::to_string(id) + " is out of range");
    }
    if (m.tokens[static_cast<std::size_t>(id)] != name) {
      return rd.bad(Errc::format_error, kpath, "names '" + name + "' but id " + std::to_string(id) + " is '" +
                                                   m.tokens[static_cast<std::size_t>(id)] + "'");
    }
    got[k] = static_cast<TokenId>(id);
  }
  m.bos = got[0];
  m.eos = got[1];
  m.adds_bos = m.adds_eos = true;
  return {};
}

// TemplateProcessing "single": [SpecialToken*, Sequence A, SpecialToken?] → BOS (+ bos_extra) / EOS.
Status read_post(const Reader& rd, const Json& n, const std::string& path, BpeModel& m) {
  if (n.is_null()) return {};
  if (!n.is_object()) return rd.wrong(path, n, "an object or null");
  std::string type;
  HJ_ASSIGN(type, rd.string(n, "type", path, nullptr));
  if (type == "ByteLevel") return {};
  if (type == "Sequence") {
    const auto it = n.find("processors");
    if (it == n.end() || !it->is_array()) return rd.bad(Errc::format_error, path + ".processors", "must be an array");
    for (std::size_t k = 0; k < it->size(); ++k) {
      TANDEM_TRY(read_post(rd, (*it)[k], path + ".processors[" + std::to_string(k) + "]", m));
    }
    return {};
  }
  if (type == "RobertaProcessing") return read_roberta(rd, n, path, m);
  if (type != "TemplateProcessing") {
    return rd.bad(Errc::unsupported, path + ".type", "'" + type + "' is not a supported post-processor "
                                                     "(TemplateProcessing, RobertaProcessing, ByteLevel, Sequence)");
  }
  const auto single = n.find("single");
  if (single == n.end() || !single->is_array()) return rd.bad(Errc::format_error, path + ".single", "must be an array");
  bool seen_seq = false;
  for (std::size_t k = 0; k < single->size(); ++k) {
    const Json& item = (*single)[k];
    const std::string ipath = path + ".single[" + std::to_string(k) + "]";
    if (!item.is_object()) return rd.wrong(ipath, item, "an object");
    if (item.contains("Sequence")) {
      if (seen_seq) return rd.bad(Errc::format_error, ipath, "a second Sequence in a single template");
      seen_seq = true;
      continue;
    }
    const auto sp = item.find("SpecialToken");
    if (sp == item.end() || !sp->is_object()) {
      return rd.bad(Errc::format_error, ipath, "must be {\"SpecialToken\": ..} or {\"Sequence\": ..}");
    }
    std::string name;
    HJ_ASSIGN(name, rd.string(*sp, "id", ipath + ".SpecialToken", nullptr));
    std::optional<TokenId> id;
    if (const auto st = n.find("special_tokens"); st != n.end() && st->is_object()) {
      if (const auto e = st->find(name); e != st->end() && e->is_object()) {
        if (const auto ids = e->find("ids"); ids != e->end() && ids->is_array()) {
          if (ids->size() != 1 || !(*ids)[0].is_number_integer()) {
            return rd.bad(Errc::unsupported, path + ".special_tokens." + name, "must map to exactly one id");
          }
          const std::int64_t v = (*ids)[0].get<std::int64_t>();
          if (v < 0 || v > kMaxId) return rd.bad(Errc::format_error, path + ".special_tokens." + name, "id out of range");
          id = static_cast<TokenId>(v);
        }
      }
    }
    if (!id) {
      for (std::size_t t = 0; t < m.tokens.size() && !id; ++t) {
        if (m.tokens[t] == name) id = static_cast<TokenId>(t);
      }
    }
    if (!id) return rd.bad(Errc::format_error, ipath, "names special token '" + name + "' that is not in the vocabulary");
    if (!seen_seq) {
      if (m.adds_bos) {  // Whisper's "<|startoftranscript|> <|notimestamps|> $A": the rest follow BOS
        m.bos_extra.push_back(*id);
        continue;
      }
      m.bos = *id;
      m.adds_bos = true;
    } else {
      if (m.adds_eos) return rd.bad(Errc::unsupported, ipath, "more than one special token after the sequence");
      m.eos = *id;
      m.adds_eos = true;
    }
  }
  if (!seen_seq) return rd.bad(Errc::format_error, path + ".single", "has no Sequence");
  return {};
}

template <class KeyFn>
Status set_token(const Reader& rd, BpeModel& m, std::int64_t id, const std::string& text, KeyFn key) {
  if (id < 0 || id > kMaxId) return rd.bad(Errc::format_error, key(), "id " + std::to_string(id) + " is out of range");
  const auto u = static_cast<std::size_t>(id);
  if (u >= m.tokens.size()) m.tokens.resize(std::max(u + 1, m.tokens.size() * 2));
  if (!m.tokens[u].empty() && m.tokens[u] != text) {
    return rd.bad(Errc::format_error, key(), "id " + std::to_string(id) + " is given to both '" + m.tokens[u] +
                                                 "' and '" + text + "'");
  }
  m.tokens[u] = text;
  return {};
}

// The normalizer, pre-tokenizer, decoder and post-processor of a tokenizer.json object (m.tokens already set).
Status read_components(const Reader& rd, const Json& j, BpeModel& m) {
  if (const auto n = j.find("normalizer"); n != j.end()) TANDEM_TRY(read_normalizer(rd, *n, "normalizer", m));
  if (const auto n = j.find("pre_tokenizer"); n != j.end()) TANDEM_TRY(read_pre(rd, *n, "pre_tokenizer", m));
  if (const auto n = j.find("decoder"); n != j.end()) TANDEM_TRY(read_decoder(rd, *n, "decoder", m));
  if (const auto n = j.find("post_processor"); n != j.end()) TANDEM_TRY(read_post(rd, *n, "post_processor", m));
  return {};
}


// Parses tokenizer.json with a SAX handler that builds the DOM for everything except model.vocab and model.merges,
// which are the bulk of a large file (150k entries each) and go straight into vectors (a DOM of them costs ~1 s).
// In the DOM those two keys are left null; `captured` says whether they were objects / arrays as expected.
struct Captured {
  bool vocab = false;
  bool merges = false;
  std::vector<std::pair<std::string, std::int64_t>> vocab_items;  // id -1: out of range
  std::vector<std::pair<std::string, std::string>> merge_items;
  std::string error;  // a content error found while capturing (the message after the origin)
};

class CaptureSax : public nlohmann::json_sax<Json> {
 public:
  CaptureSax(Json& root, Captured& c) : dom_(root, false), c_(c) {}
  bool syntax_error() const { return syntax_error_; }

  bool null() override { return scalar("null") && (mode_ != Mode::none || dom_.null()); }
  bool boolean(bool v) override { return scalar("boolean") && (mode_ != Mode::none || dom_.boolean(v)); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::vocab) return vocab_id(v);
    return scalar("integer") && (mode_ != Mode::none || dom_.number_integer(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::vocab) return vocab_id(v > static_cast<number_unsigned_t>(kMaxId) ? -1 : static_cast<std::int64_t>(v));
    return scalar("integer") && (mode_ != Mode::none || dom_.number_unsigned(v));
  }
  bool number_float(number_float_t v, const string_t& str) override {
    return scalar("number") && (mode_ != Mode::none || dom_.number_float(v, str));
  }
  bool binary(binary_t& v) override { return scalar("binary") && (mode_ != Mode::none || dom_.binary(v)); }
  bool string(string_t& v) override {
    if (mode_ == Mode::merges) {
      if (in_pair_) {
        if (pair_n_ < 2) pair_[pair_n_] = std::move(v);
        ++pair_n_;
        return true;
      }
      const auto sp = v.find(' ');
      if (sp == std::string::npos || v.find(' ', sp + 1) != std::string::npos) {
        return content("model.merges[" + std::to_string(c_.merge_items.size()) + "] '" + v +
                       "' is not two tokens separated by one space");
      }
      c_.merge_items.emplace_back(v.substr(0, sp), v.substr(sp + 1));
      return true;
    }
    return scalar("string") && (mode_ != Mode::none || dom_.string(v));
  }
  bool start_object(std::size_t n) override {
    ++depth_;
    const Mode p = take_pending();
    if (p == Mode::vocab) {
      mode_ = Mode::vocab;
      c_.vocab = true;
      return true;
    }
    if (mode_ != Mode::none) return content(where() + " must not hold an object");
    return dom_.start_object(n);
  }
  bool end_object() override {
    take_pending();
    --depth_;
    if (mode_ == Mode::vocab) {
      mode_ = Mode::none;
      return dom_.null();
    }
    return dom_.end_object();
  }
  bool start_array(std::size_t n) override {
    ++depth_;
    const Mode p = take_pending();
    if (p == Mode::merges) {
      mode_ = Mode::merges;
      c_.merges = true;
      return true;
    }
    if (mode_ == Mode::merges && !in_pair_) {
      in_pair_ = true;
      pair_n_ = 0;
      return true;
    }
    if (mode_ != Mode::none) return content(where() + " must not hold this array");
    return dom_.start_array(n);
  }
  bool end_array() override {
    take_pending();
    --depth_;
    if (mode_ == Mode::merges && in_pair_) {
      in_pair_ = false;
      if (pair_n_ != 2) return content(where() + " must be \"a b\" or [\"a\", \"b\"]");
      c_.merge_items.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      return true;
    }
    if (mode_ == Mode::merges) {
      mode_ = Mode::none;
      return dom_.null();
    }
    return dom_.end_array();
  }
  bool key(string_t& k) override {
    if (mode_ == Mode::vocab) {
      key_ = std::move(k);
      return true;
    }
    pending_ = Mode::none;
    if (depth_ == 1) top_key_ = k;
    if (depth_ == 2 && top_key_ == "model") pending_ = k == "vocab" ? Mode::vocab : k == "merges" ? Mode::merges : Mode::none;
    return dom_.key(k);
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    syntax_error_ = true;
    return false;
  }

 private:
  enum class Mode : std::uint8_t { none, vocab, merges };
  Mode take_pending() {
    const Mode p = pending_;
    pending_ = Mode::none;
    return p;
  }
  bool scalar(const char* kind) {
    take_pending();
    if (mode_ == Mode::none) return true;
    return content(where() + " must not be " + kind);
  }
  bool vocab_id(std::int64_t id) {
    c_.vocab_items.emplace_back(std::move(key_), id);
    return true;
  }
  std::string where() const {
    return mode_ == Mode::vocab ? "model.vocab['" + key_ + "']"
                                : "model.merges[" + std::to_string(c_.merge_items.size()) + "]";
  }
  bool content(std::string msg) {
    c_.error = std::move(msg);
    return false;
  }

  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  Captured& c_;
  Mode mode_ = Mode::none;
  Mode pending_ = Mode::none;
  int depth_ = 0;
  std::string top_key_;
  std::string key_;
  bool in_pair_ = false;
  int pair_n_ = 0;
  std::string pair_[2];
  bool syntax_error_ = false;
};

// pre_tokenizer_name() of a tokenizer.json: its normalizer and pre-tokenizer as canonical JSON.
std::string components_name(const Json& j) {
  Json desc = Json::object();
  desc["normalizer"] = j.value("normalizer", Json());
  desc["pre_tokenizer"] = j.value("pre_tokenizer", Json());
  return desc.dump();
}

}  // namespace

Status read_hf_json(std::string_view text, BpeModel& m) {
  const std::string& origin = m.origin;
  const Reader rd(origin);
  if (text.size() > kMaxJsonBytes) return fail(Errc::format_error, origin + ": tokenizer.json is too large");
  if (!utf8_valid(text)) return fail(Errc::parse_error, origin + ": tokenizer.json is not valid UTF-8");
  if (json_depth(text) > kMaxDepth) return fail(Errc::parse_error, origin + ": JSON nesting is too deep");
  Json j;
  Captured cap;
  CaptureSax sax(j, cap);
  const bool parsed = Json::sax_parse(text.begin(), text.end(), &sax, nlohmann::json::input_format_t::json, true);
  if (!cap.error.empty()) return fail(Errc::format_error, origin + ": " + cap.error);
  if (!parsed || sax.syntax_error()) return fail(Errc::parse_error, origin + ": tokenizer.json is not valid JSON");
  if (!j.is_object()) return rd.wrong("the top level", j, "an object");
  const auto model = j.find("model");
  if (model == j.end() || !model->is_object()) return rd.bad(Errc::format_error, "model", "is missing or not an object");
  std::string mtype;
  HJ_ASSIGN(mtype, rd.string(*model, "type", "model", model->contains("merges") ? "BPE" : ""));
  if (mtype != "BPE") {
    return rd.bad(Errc::unsupported, "model.type",
                  "'" + mtype + "' is not supported; only BPE (WordPiece, Unigram and WordLevel are not)");
  }
  {
    std::string v;
    HJ_ASSIGN(v, rd.string(*model, "continuing_subword_prefix", "model", ""));
    if (!v.empty()) return rd.bad(Errc::unsupported, "model.continuing_subword_prefix", "is not supported");
  }
  HJ_ASSIGN(m.end_of_word_suffix, rd.string(*model, "end_of_word_suffix", "model", ""));
  if (const auto d = model->find("dropout"); d != model->end() && !d->is_null() && !(d->is_number() && *d == 0)) {
    return rd.bad(Errc::unsupported, "model.dropout", "BPE dropout is not supported");
  }
  HJ_ASSIGN(m.byte_fallback, rd.boolean(*model, "byte_fallback", "model", false));
  HJ_ASSIGN(m.ignore_merges, rd.boolean(*model, "ignore_merges", "model", false));
  HJ_ASSIGN(m.fuse_unk, rd.boolean(*model, "fuse_unk", "model", false));

  if (!cap.vocab) return rd.bad(Errc::format_error, "model.vocab", "must be an object");
  if (cap.vocab_items.size() > static_cast<std::size_t>(kMaxId)) {
    return rd.bad(Errc::format_error, "model.vocab", "is too large");
  }
  m.tokens.resize(cap.vocab_items.size());
  for (const auto& item : cap.vocab_items) {
    const std::string& tok = item.first;
    TANDEM_TRY(set_token(rd, m, item.second, tok, [&] { return "model.vocab['" + tok + "']"; }));
  }
  cap.vocab_items.clear();
  cap.vocab_items.shrink_to_fit();

  if (const auto at = j.find("added_tokens"); at != j.end() && !at->is_null()) {
    if (!at->is_array()) return rd.wrong("added_tokens", *at, "an array");
    for (std::size_t k = 0; k < at->size(); ++k) {
      const Json& a = (*at)[k];
      const std::string path = "added_tokens[" + std::to_string(k) + "]";
      if (!a.is_object()) return rd.wrong(path, a, "an object");
      AddedToken t;
      std::int64_t id = 0;
      HJ_ASSIGN(id, rd.integer(a, "id", path, 0, kMaxId, std::nullopt));
      t.id = static_cast<TokenId>(id);
      HJ_ASSIGN(t.content, rd.string(a, "content", path, nullptr));
      if (t.content.empty()) return rd.bad(Errc::format_error, path + ".content", "is empty");
      HJ_ASSIGN(t.special, rd.boolean(a, "special", path, false));
      HJ_ASSIGN(t.lstrip, rd.boolean(a, "lstrip", path, false));
      HJ_ASSIGN(t.rstrip, rd.boolean(a, "rstrip", path, false));
      HJ_ASSIGN(t.single_word, rd.boolean(a, "single_word", path, false));
      TANDEM_TRY(set_token(rd, m, id, t.content, [&] { return path; }));
      m.added.push_back(std::move(t));
    }
  }
  while (!m.tokens.empty() && m.tokens.back().empty()) m.tokens.pop_back();  // the growth slack
  for (std::size_t i = 0; i < m.tokens.size(); ++i) {
    if (m.tokens[i].empty()) {
      return rd.bad(Errc::format_error, "model.vocab", "has no token with id " + std::to_string(i) + " (ids must be dense)");
    }
  }
  m.types.assign(m.tokens.size(), PieceType::normal);
  for (const AddedToken& a : m.added) {
    m.types[static_cast<std::size_t>(a.id)] = a.special ? PieceType::control : PieceType::user_defined;
  }
  std::string unk;
  HJ_ASSIGN(unk, rd.string(*model, "unk_token", "model", ""));

  if (const auto merges = model->find("merges"); merges != model->end() && !merges->is_null()) {
    return rd.wrong("model.merges", *merges, "an array");  // captured arrays are left null in the DOM
  }
  m.merge_text = std::move(cap.merge_items);

  TANDEM_TRY(read_components(rd, j, m));
  // A model with word-final suffixes and no BPEDecoder (openai/clip-vit-*'s file has a ByteLevel decoder): the suffix
  // becomes a space between words, as transformers' CLIPTokenizerFast wraps its decode.
  if (m.decode_suffix.empty()) m.decode_suffix = m.end_of_word_suffix;

  // Special ids by spelling when the post-processor does not name them.
  auto by_name = [&](std::initializer_list<std::string_view> names) -> TokenId {
    for (std::string_view nm : names) {
      for (const AddedToken& a : m.added) {
        if (a.special && a.content == nm) return a.id;
      }
    }
    return -1;
  };
  if (m.bos < 0) m.bos = by_name({"<s>", "<|begin_of_text|>", "<|startoftext|>", "<bos>"});
  if (m.eos < 0) m.eos = by_name({"</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>"});
  if (!unk.empty()) {
    bool found = false;
    for (std::size_t i = 0; i < m.tokens.size() && !found; ++i) {
      if (m.tokens[i] == unk) {
        m.unk = static_cast<TokenId>(i);
        found = true;
      }
    }
    if (!found) return rd.bad(Errc::format_error, "model.unk_token", "'" + unk + "' is not in the vocabulary");
    if (m.types[static_cast<std::size_t>(m.unk)] == PieceType::normal) {
      m.types[static_cast<std::size_t>(m.unk)] = PieceType::unknown;
    }
  }
  if (m.byte_fallback) {
    for (std::size_t i = 0; i < m.tokens.size(); ++i) {
      const std::string& t = m.tokens[i];
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && m.types[i] == PieceType::normal) {
        m.types[i] = PieceType::byte;
      }
    }
  }
  m.pre_name = components_name(j);
  return m.finish();
}

Status read_hf_components(std::string_view json_text, BpeModel& m) {
  const Reader rd(m.origin);
  const Json j = Json::parse(json_text);
  TANDEM_TRY(read_components(rd, j, m));
  m.pre_name = components_name(j);
  return {};
}

}  // namespace detail

Result<Tokenizer> Tokenizer::from_hf_json(std::string_view tokenizer_json, std::string origin) {
  auto m = std::make_unique<detail::BpeModel>();
  m->origin = std::move(origin);
  try {
    TANDEM_TRY(detail::read_hf_json(tokenizer_json, *m));
  } catch (const std::exception& e) {  // nlohmann on a value it rejects: not expected after the checks above
    return fail(Errc::parse_error, m->origin + ": " + e.what());
  }
  m->model_bytes.assign(tokenizer_json);
  return Tokenizer(std::move(m));
}

Result<Tokenizer> Tokenizer::from_bpe_vocab(const BpeVocab& v, std::string origin) {
  if (bpe_pre_regexes(v.pre).empty()) {
    return fail(Errc::unsupported, origin + ": pre-tokenizer '" + v.pre + "' (tokenizer.ggml.pre) is not supported");
  }
  if (!v.types.empty() && v.types.size() != v.tokens.size()) {
    return fail(Errc::format_error, origin + ": " + std::to_string(v.types.size()) + " token types for " +
                                        std::to_string(v.tokens.size()) + " tokens");
  }
  auto m = std::make_unique<detail::BpeModel>();
  m->origin = std::move(origin);
  // The vocabulary directly; the components from the same JSON that hf_json_from_bpe_vocab writes.
  m->tokens = v.tokens;
  m->types = v.types;
  if (m->types.empty()) m->types.assign(m->tokens.size(), PieceType::normal);
  for (std::size_t i = 0; i < m->tokens.size(); ++i) {
    const PieceType t = m->types[i];
    if (t == PieceType::control || t == PieceType::user_defined) {
      m->added.push_back(detail::AddedToken{static_cast<TokenId>(i), m->tokens[i], t == PieceType::control, false,
                                            false, false});
    }
  }
  m->merge_text = v.merges;
  m->ignore_merges = detail::bpe_pre_ignores_merges(v.pre);
  m->bos = v.bos;
  m->eos = v.eos;
  m->eot = v.eot;
  m->unk = v.unk;
  m->pad = v.pad;
  try {
    const detail::Json j = detail::Json::parse(detail::hf_json_components(v));
    const detail::Reader rd(m->origin);
    TANDEM_TRY(detail::read_components(rd, j, *m));
  } catch (const std::exception& e) {
    return fail(Errc::internal, m->origin + ": " + e.what());
  }
  m->bos = v.bos;  // the post-processor names the same ids; keep the vocabulary's even without add_bos
  m->eos = v.eos;
  m->adds_bos = v.add_bos && v.bos >= 0;
  m->adds_eos = v.add_eos && v.eos >= 0;
  m->pre_name = v.pre;
  TANDEM_TRY(m->finish());
  m->model_bytes = hf_json_from_bpe_vocab(v);
  return Tokenizer(std::move(m));
}

}  // namespace tandem::tok
