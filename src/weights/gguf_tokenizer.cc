// GGUF tokenizer.ggml.* <-> tok::BpeVocab (gguf_tokenizer.h).
#include "weights/gguf_tokenizer.h"

#include <string>

#include "weights/model_limits.h"

namespace tandem::weights {
namespace {

std::string show(const GgufValue& v) {
  if (v.type == GgufType::array) {
    return "an array of " + std::string(gguf_type_name(v.elem_type)) + " of length " + std::to_string(v.count);
  }
  return "a " + std::string(gguf_type_name(v.type));
}

}  // namespace

Result<tok::BpeVocab> bpe_vocab_from_gguf(const GgufFile& f) {
  auto err = [&](const std::string& key, const std::string& what) {
    return fail(Errc::format_error, f.path() + ": key '" + key + "' " + what);
  };
  const GgufValue* model = f.find("tokenizer.ggml.model");
  if (model == nullptr) return fail(Errc::format_error, f.path() + ": has no tokenizer (key 'tokenizer.ggml.model' is missing)");
  if (model->type != GgufType::string) return err("tokenizer.ggml.model", "must be a string, got " + show(*model));
  if (model->str != "gpt2") {
    return fail(Errc::unsupported, f.path() + ": tokenizer.ggml.model \"" + model->str.substr(0, 64) +
                                       "\" is not a BPE (\"gpt2\") vocabulary");
  }
  tok::BpeVocab v;
  if (const GgufValue* pre = f.find("tokenizer.ggml.pre")) {
    if (pre->type != GgufType::string) return err("tokenizer.ggml.pre", "must be a string, got " + show(*pre));
    v.pre = pre->str;
  }
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  if (tokens == nullptr) return err("tokenizer.ggml.tokens", "is missing");
  if (tokens->type != GgufType::array || tokens->elem_type != GgufType::string) {
    return err("tokenizer.ggml.tokens", "must be an array of strings, got " + show(*tokens));
  }
  const std::uint64_t n = tokens->count;
  if (n == 0) return err("tokenizer.ggml.tokens", "is empty");
  if (n > static_cast<std::uint64_t>(limits::kMaxVocab) || tokens->strings.size() != n) {
    return err("tokenizer.ggml.tokens", "has " + std::to_string(n) + " tokens, more than " + std::to_string(limits::kMaxVocab));
  }
  v.tokens = tokens->strings;
  v.types.assign(static_cast<std::size_t>(n), tok::PieceType::normal);
  if (const GgufValue* types = f.find("tokenizer.ggml.token_type")) {
    const bool ints = types->type == GgufType::array && types->elem_type != GgufType::f32 &&
                      types->elem_type != GgufType::f64 && types->elem_type != GgufType::boolean &&
                      gguf_scalar_size(types->elem_type) != 0;
    if (!ints || types->count != n) {
      return err("tokenizer.ggml.token_type",
                 "must be an array of " + std::to_string(n) + " integers (one per token), got " + show(*types));
    }
    for (std::uint64_t k = 0; k < n; ++k) {
      const auto t = types->int_at(k);
      if (!t || *t < 0 || *t > 6) {
        return err("tokenizer.ggml.token_type", "element " + std::to_string(k) + " is " +
                                                    (t ? std::to_string(*t) : std::string("invalid")) +
                                                    ", not a token type 0-6");
      }
      v.types[static_cast<std::size_t>(k)] = *t == 0 ? tok::PieceType::normal : static_cast<tok::PieceType>(*t);
    }
  }
  const GgufValue* merges = f.find("tokenizer.ggml.merges");
  if (merges == nullptr) return err("tokenizer.ggml.merges", "is missing");
  if (merges->type != GgufType::array || merges->elem_type != GgufType::string ||
      merges->strings.size() != merges->count) {
    return err("tokenizer.ggml.merges", "must be an array of strings, got " + show(*merges));
  }
  v.merges.reserve(merges->strings.size());
  for (std::size_t k = 0; k < merges->strings.size(); ++k) {
    const std::string& m = merges->strings[k];
    const auto sp = m.find(' ', 1);  // llama.cpp: the first space after the first character separates the two
    if (sp == std::string::npos || sp + 1 >= m.size()) {
      return err("tokenizer.ggml.merges", "element " + std::to_string(k) + " is not two tokens separated by a space");
    }
    v.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
  }
  const std::int64_t max_id = static_cast<std::int64_t>(n) - 1;
  auto id = [&](const char* key, tok::TokenId* out) -> Status {
    const GgufValue* x = f.find(key);
    if (x == nullptr) return {};
    const auto i = x->as_i64();
    if (!i || *i < 0 || *i > max_id) {
      return err(key, "must be a token id in [0, " + std::to_string(max_id) + "], got " + show(*x));
    }
    *out = static_cast<tok::TokenId>(*i);
    return {};
  };
  TANDEM_TRY(id("tokenizer.ggml.bos_token_id", &v.bos));
  TANDEM_TRY(id("tokenizer.ggml.eos_token_id", &v.eos));
  TANDEM_TRY(id("tokenizer.ggml.eot_token_id", &v.eot));
  TANDEM_TRY(id("tokenizer.ggml.unknown_token_id", &v.unk));
  TANDEM_TRY(id("tokenizer.ggml.padding_token_id", &v.pad));
  for (auto [key, out] : {std::pair{"tokenizer.ggml.add_bos_token", &v.add_bos},
                          std::pair{"tokenizer.ggml.add_eos_token", &v.add_eos}}) {
    if (const GgufValue* b = f.find(key)) {
      if (b->type != GgufType::boolean) return err(key, "must be a bool, got " + show(*b));
      *out = b->u != 0;
    }
  }
  return v;
}

void write_bpe_vocab_to_gguf(GgufWriter& w, const tok::BpeVocab& v) {
  w.set("tokenizer.ggml.model", GgufValue::of_string("gpt2"));
  w.set("tokenizer.ggml.pre", GgufValue::of_string(v.pre));
  w.set("tokenizer.ggml.tokens", GgufValue::of_strings(v.tokens));
  std::vector<std::int32_t> types(v.tokens.size(), 1);
  for (std::size_t i = 0; i < v.types.size() && i < types.size(); ++i) types[i] = static_cast<std::int32_t>(v.types[i]);
  w.set("tokenizer.ggml.token_type", GgufValue::of_i32s(types));
  std::vector<std::string> merges;
  merges.reserve(v.merges.size());
  for (const auto& [a, b] : v.merges) merges.push_back(a + " " + b);
  w.set("tokenizer.ggml.merges", GgufValue::of_strings(std::move(merges)));
  for (auto [key, id] : {std::pair{"tokenizer.ggml.bos_token_id", v.bos}, std::pair{"tokenizer.ggml.eos_token_id", v.eos},
                         std::pair{"tokenizer.ggml.eot_token_id", v.eot},
                         std::pair{"tokenizer.ggml.unknown_token_id", v.unk},
                         std::pair{"tokenizer.ggml.padding_token_id", v.pad}}) {
    if (id >= 0) w.set(key, GgufValue::of_uint(GgufType::u32, static_cast<std::uint64_t>(id)));
  }
  w.set("tokenizer.ggml.add_bos_token", GgufValue::of_bool(v.add_bos));
  w.set("tokenizer.ggml.add_eos_token", GgufValue::of_bool(v.add_eos));
}

namespace {
constexpr std::string_view kPhantom = "\xE2\x96\x81";  // U+2581
bool bracketed(std::string_view t) { return t.size() >= 2 && t.front() == '[' && t.back() == ']'; }
}  // namespace

Result<std::vector<std::string>> wordpiece_tokens_from_gguf(const GgufFile& f) {
  auto err = [&](const std::string& key, const std::string& what) {
    return fail(Errc::format_error, f.path() + ": key '" + key + "' " + what);
  };
  const GgufValue* model = f.find("tokenizer.ggml.model");
  if (model == nullptr) return fail(Errc::format_error, f.path() + ": has no tokenizer (key 'tokenizer.ggml.model' is missing)");
  if (model->type != GgufType::string) return err("tokenizer.ggml.model", "must be a string, got " + show(*model));
  if (model->str != "bert") {
    return fail(Errc::unsupported, f.path() + ": tokenizer.ggml.model \"" + model->str.substr(0, 64) +
                                       "\" is not a WordPiece (\"bert\") vocabulary");
  }
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  if (tokens == nullptr) return err("tokenizer.ggml.tokens", "is missing");
  if (tokens->type != GgufType::array || tokens->elem_type != GgufType::string || tokens->strings.size() != tokens->count)
    return err("tokenizer.ggml.tokens", "must be an array of strings, got " + show(*tokens));
  if (tokens->count == 0) return err("tokenizer.ggml.tokens", "is empty");
  if (tokens->count > static_cast<std::uint64_t>(limits::kMaxVocab))
    return err("tokenizer.ggml.tokens", "has more than " + std::to_string(limits::kMaxVocab) + " tokens");
  std::vector<std::string> out;
  out.reserve(tokens->strings.size());
  for (const std::string& t : tokens->strings) {
    if (t.starts_with(kPhantom))
      out.push_back(t.substr(kPhantom.size()));
    else if (bracketed(t))
      out.push_back(t);
    else
      out.push_back("##" + t);
  }
  return out;
}

std::vector<std::string> wordpiece_tokens_to_gguf(const std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  out.reserve(tokens.size());
  for (const std::string& t : tokens) {
    if (bracketed(t))
      out.push_back(t);
    else if (t.starts_with("##"))
      out.push_back(t.substr(2));
    else
      out.push_back(std::string(kPhantom) + t);
  }
  return out;
}

}  // namespace tandem::weights
