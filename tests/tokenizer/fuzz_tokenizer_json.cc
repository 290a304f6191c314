// libFuzzer target: the tokenizer.json parser, the merges, and BPE encode/decode on hostile input (scripts/fuzz.sh
// --target tokenizer runs it with ASan + UBSan). The first byte picks what the rest is:
//   'T'  text for a fixed byte-level tokenizer (llama-bpe regexes, specials): encode (plain, parse_special, as
//        trusted/untrusted pieces) and decode; for valid UTF-8 the decode must give the text back and streaming
//        decode must equal whole decode.
//   'M'  lines "a b" used as the merges of a small byte-level vocabulary whose tokens are every merge result:
//        loads or fails with a typed error; if it loads, encodes and decodes a text.
//   'K'  text for a fixed CLIP tokenizer (train_clip_bpe, vocab.json + merges.txt): encode with BOS / EOS and
//        truncation to 77 (EOS last), decode equal to streaming decode; the equivalent tokenizer.json gives the same ids.
//   'C'  CLIP files: "VOCAB_JSON\0MERGES_TXT", or without a NUL byte merges.txt lines for the fixed CLIP vocab.json:
//        Tokenizer::from_vocab_merges loads or fails with a typed error; if it loads, encode/decode.
//   else the whole input is a tokenizer.json: loads or fails with a typed error; if it loads, encode/decode.
// Anything else than "ok or a typed error" — a crash, a sanitizer report, a broken invariant (abort) — is a finding.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "tokenizer/clip_vocab.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace tandem;
using namespace tandem::tok;

void check(bool ok) {
  if (!ok) std::abort();
}

bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    std::uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (std::size_t k = 1; k < n; ++k) {
      const auto t = static_cast<unsigned char>(s[i + k]);
      if ((t & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (t & 0x3Fu);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
      return false;
    }
    i += n;
  }
  return true;
}

std::string stream(const Tokenizer& t, const std::vector<TokenId>& ids) {
  StreamDecoder d(t);
  std::string out;
  for (TokenId id : ids) out += d.push(id);
  return out + d.flush();
}

void exercise(const Tokenizer& t, std::string_view text) {
  for (const EncodeOptions& o : {EncodeOptions{}, EncodeOptions{true, true, true}}) {
    const auto ids = t.encode(text, o);
    for (TokenId id : ids) check(id >= 0 && id < t.vocab_size());
    check(stream(t, ids) == t.decode(ids));
  }
  const std::size_t half = text.size() / 2;
  const TextPiece pieces[] = {{text.substr(0, half), true}, {text.substr(half), false}};
  (void)t.encode_pieces(pieces);
  (void)t.eot_id();
  (void)t.special_ids();
}

const Tokenizer& fixed() {
  static const Tokenizer t = [] {
    auto r = Tokenizer::from_bpe_vocab(
        generate_bpe_vocab(600, "llama-bpe", {"<|begin_of_text|>", "<|eot_id|>", "<|endoftext|>"}, 3), "fixed");
    check(r.ok());
    return std::move(r).value();
  }();
  return t;
}

const ClipVocab& clip_vocab() {
  static const ClipVocab v = train_clip_bpe({"a small red circle on the left", "two blue squares, it's 2024!",
                                             "caf\xC3\xA9 na\xC3\xAFve \xF0\x9F\x98\x80 \xE6\x9D\xB1\xE4\xBA\xAC"},
                                            700);
  return v;
}

const Tokenizer& clip_files() {
  static const Tokenizer t = [] {
    auto r = Tokenizer::from_vocab_merges(clip_vocab_json(clip_vocab()), clip_merges_txt(clip_vocab()));
    check(r.ok());
    return std::move(r).value();
  }();
  return t;
}

const Tokenizer& clip_json() {
  static const Tokenizer t = [] {
    auto j = clip_hf_json(clip_vocab());
    check(j.ok());
    auto r = Tokenizer::from_hf_json(*j, "clip.json");
    check(r.ok());
    return std::move(r).value();
  }();
  return t;
}

void exercise_clip(std::string_view text) {
  const Tokenizer& t = clip_files();
  exercise(t, text);
  EncodeOptions o;
  o.add_bos = o.add_eos = true;
  o.max_tokens = kClipContextLength;
  const auto ids = t.encode(text, o);
  check(ids.size() >= 2 && ids.size() <= kClipContextLength);
  check(ids.front() == t.bos_id() && ids.back() == t.eos_id());
  check(clip_json().encode(text, o) == ids);
  const std::string d = t.decode(ids);
  check(d.empty() || (d.front() != ' ' && d.back() != ' '));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const std::string_view rest = in.substr(1);
  if (in[0] == 'T') {
    const Tokenizer& t = fixed();
    exercise(t, rest);
    if (valid_utf8(rest)) check(t.decode(t.encode(rest)) == rest);
    return 0;
  }
  if (in[0] == 'K') {
    exercise_clip(rest);
    return 0;
  }
  if (in[0] == 'C') {
    const std::size_t nul = rest.find('\0');
    const std::string vocab = nul == std::string_view::npos ? clip_vocab_json(clip_vocab()) : std::string(rest.substr(0, nul));
    const std::string_view merges = nul == std::string_view::npos ? rest : rest.substr(nul + 1);
    auto t = Tokenizer::from_vocab_merges(vocab, merges);
    if (!t.ok()) {
      check(!t.error().message.empty());
      return 0;
    }
    exercise(*t, "A small red circle, it's 2024! caf\xC3\xA9 \xF0\x9F\x98\x80\n\n  x");
    exercise(*t, merges.substr(0, 256));
    return 0;
  }
  std::string json;
  if (in[0] == 'M') {
    // Tokens: the 256 byte-level characters' pieces are not needed to load; the merge results are made tokens.
    std::vector<std::string> tokens;
    std::string merges = "[";
    std::size_t at = 0;
    while (at < rest.size() && tokens.size() < 2000) {
      std::size_t nl = rest.find('\n', at);
      if (nl == std::string_view::npos) nl = rest.size();
      const std::string line(rest.substr(at, nl - at));
      at = nl + 1;
      const auto sp = line.find(' ');
      if (sp == std::string::npos) continue;
      tokens.push_back(line.substr(0, sp));
      tokens.push_back(line.substr(sp + 1));
      tokens.push_back(line.substr(0, sp) + line.substr(sp + 1));
      auto quote = [](const std::string& s) {
        std::string q = "\"";
        for (char c : s) {
          if (c == '"' || c == '\\') q.push_back('\\');
          if (static_cast<unsigned char>(c) < 0x20) continue;
          q.push_back(c);
        }
        return q + "\"";
      };
      merges += (merges.size() > 1 ? "," : "") + quote(line);
      (void)quote;
    }
    merges += "]";
    json = "{\"model\":{\"type\":\"BPE\",\"vocab\":{";
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      std::string q;
      for (char c : tokens[i]) {
        if (c == '"' || c == '\\') q.push_back('\\');
        if (static_cast<unsigned char>(c) < 0x20) continue;
        q.push_back(c);
      }
      json += (i ? ",\"" : "\"") + q + "\":" + std::to_string(i);
    }
    json += "},\"merges\":" + merges + "},\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"ByteLevel\"}}";
  } else {
    json.assign(in);
  }
  auto t = Tokenizer::from_hf_json(json, "fuzz.json");
  if (!t.ok()) {
    check(!t.error().message.empty());
    return 0;
  }
  exercise(*t, "Hello <|eot_id|> w\xC3\xB6rld 12345 \xF0\x9F\x98\x80\n\n  x");
  exercise(*t, rest.substr(0, 256));
  return 0;
}
