// Whisper's special tokens (whisper_tokens.h): the language table, finding the specials in a tokenizer, and the
// text-only encoding.
#include "tokenizer/whisper_tokens.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace tandem::tok {
namespace {

// openai/whisper's LANGUAGES, in token order.
constexpr std::array<WhisperLanguage, 100> kLanguages{{
    {"en", "english"},    {"zh", "chinese"},      {"de", "german"},         {"es", "spanish"},
    {"ru", "russian"},    {"ko", "korean"},       {"fr", "french"},         {"ja", "japanese"},
    {"pt", "portuguese"}, {"tr", "turkish"},      {"pl", "polish"},         {"ca", "catalan"},
    {"nl", "dutch"},      {"ar", "arabic"},       {"sv", "swedish"},        {"it", "italian"},
    {"id", "indonesian"}, {"hi", "hindi"},        {"fi", "finnish"},        {"vi", "vietnamese"},
    {"he", "hebrew"},     {"uk", "ukrainian"},    {"el", "greek"},          {"ms", "malay"},
    {"cs", "czech"},      {"ro", "romanian"},     {"da", "danish"},         {"hu", "hungarian"},
    {"ta", "tamil"},      {"no", "norwegian"},    {"th", "thai"},           {"ur", "urdu"},
    {"hr", "croatian"},   {"bg", "bulgarian"},    {"lt", "lithuanian"},     {"la", "latin"},
    {"mi", "maori"},      {"ml", "malayalam"},    {"cy", "welsh"},          {"sk", "slovak"},
    {"te", "telugu"},     {"fa", "persian"},      {"lv", "latvian"},        {"bn", "bengali"},
    {"sr", "serbian"},    {"az", "azerbaijani"},  {"sl", "slovenian"},      {"kn", "kannada"},
    {"et", "estonian"},   {"mk", "macedonian"},   {"br", "breton"},         {"eu", "basque"},
    {"is", "icelandic"},  {"hy", "armenian"},     {"ne", "nepali"},         {"mn", "mongolian"},
    {"bs", "bosnian"},    {"kk", "kazakh"},       {"sq", "albanian"},       {"sw", "swahili"},
    {"gl", "galician"},   {"mr", "marathi"},      {"pa", "punjabi"},        {"si", "sinhala"},
    {"km", "khmer"},      {"sn", "shona"},        {"yo", "yoruba"},         {"so", "somali"},
    {"af", "afrikaans"},  {"oc", "occitan"},      {"ka", "georgian"},       {"be", "belarusian"},
    {"tg", "tajik"},      {"sd", "sindhi"},       {"gu", "gujarati"},       {"am", "amharic"},
    {"yi", "yiddish"},    {"lo", "lao"},          {"uz", "uzbek"},          {"fo", "faroese"},
    {"ht", "haitian creole"}, {"ps", "pashto"},   {"tk", "turkmen"},        {"nn", "nynorsk"},
    {"mt", "maltese"},    {"sa", "sanskrit"},     {"lb", "luxembourgish"},  {"my", "myanmar"},
    {"bo", "tibetan"},    {"tl", "tagalog"},      {"mg", "malagasy"},       {"as", "assamese"},
    {"tt", "tatar"},      {"haw", "hawaiian"},    {"ln", "lingala"},        {"ha", "hausa"},
    {"ba", "bashkir"},    {"jw", "javanese"},     {"su", "sundanese"},      {"yue", "cantonese"},
}};

// "<|0.00|>" … "<|30.00|>": step i is i · 0.02 s, printed with two decimals.
std::string timestamp_spelling(int i) {
  const int hundredths = i * 2;
  const int frac = hundredths % 100;
  return "<|" + std::to_string(hundredths / 100) + "." + (frac < 10 ? "0" : "") + std::to_string(frac) + "|>";
}

// Whether text[at..) starts a timestamp-shaped spelling "<|d+.dd|>"; its length, else 0.
std::size_t timestamp_shape(std::string_view text, std::size_t at) {
  auto digit = [&](std::size_t k) { return k < text.size() && text[k] >= '0' && text[k] <= '9'; };
  if (text.compare(at, 2, "<|") != 0) return 0;
  std::size_t k = at + 2;
  if (!digit(k)) return 0;
  while (digit(k)) ++k;
  if (k >= text.size() || text[k] != '.' || !digit(k + 1) || !digit(k + 2)) return 0;
  k += 3;
  if (text.compare(k, 2, "|>") != 0) return 0;
  return k + 2 - at;
}

}  // namespace

std::span<const WhisperLanguage> whisper_languages() { return kLanguages; }

bool WhisperSpecials::multilingual() const { return languages.size() > 1; }

TokenId WhisperSpecials::language_id(std::string_view code) const {
  for (std::size_t i = 0; i < languages.size() && i < kLanguages.size(); ++i) {
    if (kLanguages[i].code == code) return languages[i];
  }
  return -1;
}

std::string_view WhisperSpecials::language_code(TokenId id) const {
  for (std::size_t i = 0; i < languages.size() && i < kLanguages.size(); ++i) {
    if (languages[i] == id) return kLanguages[i].code;
  }
  return {};
}

bool WhisperSpecials::is_timestamp(TokenId id) const {
  return timestamp_begin >= 0 && id >= timestamp_begin && id - timestamp_begin < timestamp_count;
}

double WhisperSpecials::timestamp_seconds(TokenId id) const {
  return static_cast<double>(id - timestamp_begin) * kWhisperTimestampSeconds;
}

TokenId WhisperSpecials::timestamp_token(double seconds) const {
  if (timestamp_begin < 0 || timestamp_count <= 0) return -1;
  const double steps = std::isnan(seconds) ? 0.0 : std::round(seconds / kWhisperTimestampSeconds);
  const double k = std::clamp(steps, 0.0, static_cast<double>(timestamp_count - 1));
  return timestamp_begin + static_cast<TokenId>(k);
}

Result<WhisperSpecials> whisper_specials(const Tokenizer& tok, int model_vocab) {
  WhisperSpecials s;
  auto find = [&](std::initializer_list<std::string_view> names, TokenId& out) -> Status {
    for (std::string_view n : names) {
      if (auto id = tok.piece_to_id(n)) {
        out = *id;
        return {};
      }
    }
    return fail(Errc::format_error, "Whisper tokenizer: special token '" + std::string(*names.begin()) +
                                        "' is missing");
  };
  TANDEM_TRY(find({"<|endoftext|>"}, s.eot));
  TANDEM_TRY(find({"<|startoftranscript|>"}, s.sot));
  TANDEM_TRY(find({"<|translate|>"}, s.translate));
  TANDEM_TRY(find({"<|transcribe|>"}, s.transcribe));
  TANDEM_TRY(find({"<|startoflm|>"}, s.startoflm));
  TANDEM_TRY(find({"<|startofprev|>"}, s.startofprev));
  TANDEM_TRY(find({"<|nospeech|>", "<|nocaptions|>"}, s.nospeech));
  TANDEM_TRY(find({"<|notimestamps|>"}, s.notimestamps));

  for (const WhisperLanguage& l : kLanguages) {
    const auto id = tok.piece_to_id("<|" + std::string(l.code) + "|>");
    if (!id) break;
    if (!s.languages.empty() && *id != s.languages.back() + 1) {
      return fail(Errc::format_error, "Whisper tokenizer: language token '<|" + std::string(l.code) + "|>' has id " +
                                          std::to_string(*id) + ", not " + std::to_string(s.languages.back() + 1) +
                                          " (language ids must be consecutive)");
    }
    s.languages.push_back(*id);
  }
  for (std::size_t k = s.languages.size(); k < kLanguages.size(); ++k) {
    if (tok.piece_to_id("<|" + std::string(kLanguages[k].code) + "|>")) {
      return fail(Errc::format_error, "Whisper tokenizer: language token '<|" + std::string(kLanguages[k].code) +
                                          "|>' is present but '<|" + std::string(kLanguages[s.languages.size()].code) +
                                          "|>' before it is missing");
    }
  }
  // openai's English-only checkpoints use the GPT-2 vocabulary and prompt without language / task tokens.
  if (s.eot == 50256 && model_vocab == 51864) s.languages.clear();

  if (const auto first = tok.piece_to_id(timestamp_spelling(0))) {
    s.timestamp_begin = *first;
    int n = 1;
    for (; n < kWhisperTimestampCount; ++n) {
      const std::string sp = timestamp_spelling(n);
      const auto id = tok.piece_to_id(sp);
      if (!id) break;
      if (*id != s.timestamp_begin + n) {
        return fail(Errc::format_error, "Whisper tokenizer: timestamp token '" + sp + "' has id " +
                                            std::to_string(*id) + ", not " + std::to_string(s.timestamp_begin + n) +
                                            " (timestamp ids must be consecutive)");
      }
    }
    s.timestamp_count = n;
  } else {
    s.timestamp_begin = s.notimestamps + 1;
    s.timestamp_count = model_vocab - s.timestamp_begin;
    if (s.timestamp_count > 0 && tok.vocab_size() > s.timestamp_begin) {
      return fail(Errc::format_error, "Whisper tokenizer: no '<|0.00|>' token, but token " +
                                          std::to_string(s.timestamp_begin) + " ('" + tok.piece(s.timestamp_begin) +
                                          "') lies where the timestamps begin (after <|notimestamps|>)");
    }
  }
  if (s.timestamp_count <= 0 || model_vocab < s.timestamp_begin + s.timestamp_count ||
      model_vocab < tok.vocab_size()) {
    return fail(Errc::format_error, "Whisper tokenizer: model vocabulary size " + std::to_string(model_vocab) +
                                        " is too small for the timestamps (they begin at " +
                                        std::to_string(s.timestamp_begin) + ", tokenizer size " +
                                        std::to_string(tok.vocab_size()) + ")");
  }
  return s;
}

std::vector<TokenId> whisper_text_ids(const Tokenizer& tok, std::string_view text) {
  // A timestamp spelling that is a non-special added token would be matched by encode(): split it after its "<|".
  // That is a pre-token boundary of the GPT-2 regex ("<|" is a punctuation run, a digit follows), so the parts
  // encode to the ids of the whole text encoded as plain text.
  std::vector<TokenId> out;
  std::size_t from = 0;
  for (std::size_t at = text.find("<|"); at != std::string_view::npos; at = text.find("<|", at + 1)) {
    const std::size_t len = timestamp_shape(text, at);
    if (len == 0) continue;
    const auto id = tok.piece_to_id(text.substr(at, len));
    if (!id || tok.type(*id) == PieceType::control) continue;
    const auto part = tok.encode(text.substr(from, at + 2 - from), EncodeOptions{});
    out.insert(out.end(), part.begin(), part.end());
    from = at + 2;
  }
  const auto rest = tok.encode(text.substr(from), EncodeOptions{});
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

}  // namespace tandem::tok
