// Transcriber: the model's generation config, the options, the prompt and openai/whisper's per-window loop
// (language detection, no-speech probability, temperature fallback, silence skip, segments, seek).
#include "speech/transcriber.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <nlohmann/json.hpp>

#include "audio/mel.h"
#include "core/text.h"
#include "speech/decode.h"

namespace tandem::speech {
namespace {

constexpr int kHop = 160;                // samples per mel frame
constexpr int kSamplesPerTimestamp = 320;  // 0.02 s: two mel frames per audio position

using nlohmann::json;

std::string trim(std::string_view s) {
  const auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return std::string(s);
}

Failure config_error(std::string_view key, std::string_view what) {
  return fail(Errc::format_error, "generation_config.json: \"" + std::string(key) + "\" " + std::string(what));
}

// A list of token ids: −1 entries (openai's "non-speech symbols") are skipped, others must be model ids.
Result<std::vector<TokenId>> read_id_list(const json& doc, const char* key, int vocab) {
  const json& v = doc.at(key);
  if (!v.is_array()) return config_error(key, "is not an array of token ids");
  std::vector<TokenId> ids;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const json& e = v[i];
    if (!e.is_number_integer()) return config_error(key, "element " + std::to_string(i) + " is not an integer");
    const auto id = e.get<std::int64_t>();
    if (id == -1) continue;
    if (id < 0 || id >= vocab) {
      return config_error(key, "element " + std::to_string(i) + " = " + std::to_string(id) +
                                   " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
    ids.push_back(static_cast<TokenId>(id));
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

struct GenerationConfig {
  std::optional<std::vector<TokenId>> suppress, begin_suppress;
  std::optional<int> max_initial_timestamp_index;
  std::optional<bool> is_multilingual;
};

Result<GenerationConfig> parse_generation_config(std::string_view text, const tok::WhisperSpecials& sp, int vocab) {
  GenerationConfig g;
  if (text.empty()) return g;
  if (json_nesting_depth(text, 64) > 32) return fail(Errc::parse_error, "generation_config.json: nested too deep");
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return fail(Errc::parse_error, "generation_config.json: not valid JSON");
  if (!doc.is_object()) return fail(Errc::parse_error, "generation_config.json: not a JSON object");
  if (doc.contains("suppress_tokens") && !doc["suppress_tokens"].is_null()) {
    auto r = read_id_list(doc, "suppress_tokens", vocab);
    if (!r.ok()) return fail(std::move(r).error());
    g.suppress = std::move(r).value();
  }
  if (doc.contains("begin_suppress_tokens") && !doc["begin_suppress_tokens"].is_null()) {
    auto r = read_id_list(doc, "begin_suppress_tokens", vocab);
    if (!r.ok()) return fail(std::move(r).error());
    g.begin_suppress = std::move(r).value();
  }
  if (doc.contains("max_initial_timestamp_index") && !doc["max_initial_timestamp_index"].is_null()) {
    const json& v = doc["max_initial_timestamp_index"];
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > 100000) {
      return config_error("max_initial_timestamp_index", "is not an integer in [0, 100000]");
    }
    g.max_initial_timestamp_index = static_cast<int>(v.get<std::int64_t>());
  }
  if (doc.contains("no_timestamps_token_id") && !doc["no_timestamps_token_id"].is_null()) {
    const json& v = doc["no_timestamps_token_id"];
    if (!v.is_number_integer()) return config_error("no_timestamps_token_id", "is not an integer");
    if (v.get<std::int64_t>() != sp.notimestamps) {
      return config_error("no_timestamps_token_id", "= " + std::to_string(v.get<std::int64_t>()) +
                                                        " but the tokenizer's <|notimestamps|> is " +
                                                        std::to_string(sp.notimestamps));
    }
  }
  if (doc.contains("is_multilingual") && !doc["is_multilingual"].is_null()) {
    const json& v = doc["is_multilingual"];
    if (!v.is_boolean()) return config_error("is_multilingual", "is not a boolean");
    g.is_multilingual = v.get<bool>();
  }
  return g;
}

// "de" or "german" → "de"; "" when unknown.
std::string language_code_of(std::string_view given) {
  std::string lower(given);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const tok::WhisperLanguage& l : tok::whisper_languages()) {
    if (lower == l.code || lower == l.name) return std::string(l.code);
  }
  return {};
}

Status check_id(TokenId id, const char* name, int vocab) {
  if (id < 0 || id >= vocab) {
    return fail(Errc::invalid_argument, std::string("the tokenizer's ") + name + " (" + std::to_string(id) +
                                            ") is outside the model's vocabulary of " + std::to_string(vocab));
  }
  return {};
}

double softmax_prob(std::span<const float> logits, TokenId id) {
  if (id < 0 || static_cast<std::size_t>(id) >= logits.size()) return 0.0;
  const double lse = detail::log_sum_exp(logits);
  if (!std::isfinite(lse)) return 0.0;
  return std::exp(static_cast<double>(logits[static_cast<std::size_t>(id)]) - lse);
}

Result<std::vector<float>> feed(DecoderSession& s, std::span<const TokenId> tokens, std::size_t vocab,
                                const std::atomic<bool>* cancel) {
  auto r = s.decode(tokens, cancel);
  if (!r.ok()) return fail(std::move(r).error());
  if (r->size() != vocab) {
    return fail(Errc::internal, "decoder session returned " + std::to_string(r->size()) + " logits, expected " +
                                    std::to_string(vocab));
  }
  return r;
}

struct Split {
  std::vector<Segment> segments;
  std::uint64_t advance = 0;  // samples
};

// openai/whisper transcribe.py: segments at consecutive timestamp pairs; the seek goes to the last complete
// segment's end unless the window ends with a single timestamp (nothing after it: the whole window is done).
Split split_segments(std::span<const TokenId> tokens, const tok::WhisperSpecials& sp, double offset_s,
                     std::uint64_t segment_samples) {
  Split out;
  const auto is_ts = [&](TokenId id) { return sp.is_timestamp(id); };
  const std::size_t n = tokens.size();
  const bool single_ending = n >= 2 && !is_ts(tokens[n - 2]) && is_ts(tokens[n - 1]);
  std::vector<std::size_t> slices;
  for (std::size_t i = 1; i < n; ++i) {
    if (is_ts(tokens[i - 1]) && is_ts(tokens[i])) slices.push_back(i);
  }
  const auto make = [&](std::span<const TokenId> t, double start, double end) {
    Segment s;
    s.start = start;
    s.end = end;
    s.tokens.assign(t.begin(), t.end());
    return s;
  };
  if (!slices.empty()) {
    if (single_ending) slices.push_back(n);
    std::size_t last = 0;
    for (std::size_t cut : slices) {
      const auto piece = tokens.subspan(last, cut - last);
      out.segments.push_back(make(piece, offset_s + sp.timestamp_seconds(piece.front()),
                                  offset_s + sp.timestamp_seconds(piece.back())));
      last = cut;
    }
    if (single_ending) {
      out.advance = segment_samples;
    } else {
      const TokenId end_ts = tokens[last - 1];
      out.advance = static_cast<std::uint64_t>(end_ts - sp.timestamp_begin) * kSamplesPerTimestamp;
    }
  } else {
    double duration = static_cast<double>(segment_samples) / audio::kSampleRate;
    const auto last_ts = std::find_if(tokens.rbegin(), tokens.rend(), is_ts);
    if (last_ts != tokens.rend() && *last_ts != sp.timestamp_begin) duration = sp.timestamp_seconds(*last_ts);
    out.segments.push_back(make(tokens, offset_s, offset_s + duration));
    out.advance = segment_samples;
  }
  // A model that closes a segment at <|0.00|> must not hold the file in place.
  if (out.advance == 0) out.advance = segment_samples;
  return out;
}

}  // namespace

Result<Transcriber> Transcriber::create(const tok::Tokenizer& tok, const tok::WhisperSpecials& sp,
                                        ModelSpeechInfo model, std::string_view generation_config_json,
                                        TranscribeOptions opts) {
  if (model.n_mels < 1 || model.window_frames < 2 || model.window_frames > 1'000'000 ||
      model.max_target_positions < 8 || model.vocab < 1) {
    return fail(Errc::invalid_argument, "model speech info out of range (n_mels " + std::to_string(model.n_mels) +
                                            ", window_frames " + std::to_string(model.window_frames) +
                                            ", max_target_positions " + std::to_string(model.max_target_positions) +
                                            ", vocab " + std::to_string(model.vocab) + ")");
  }
  TANDEM_TRY(check_id(sp.eot, "<|endoftext|>", model.vocab));
  TANDEM_TRY(check_id(sp.sot, "<|startoftranscript|>", model.vocab));
  TANDEM_TRY(check_id(sp.startofprev, "<|startofprev|>", model.vocab));
  TANDEM_TRY(check_id(sp.notimestamps, "<|notimestamps|>", model.vocab));
  if (sp.timestamp_begin < 0 || sp.timestamp_count < 1 ||
      static_cast<std::int64_t>(sp.timestamp_begin) + sp.timestamp_count > model.vocab) {
    return fail(Errc::invalid_argument, "the tokenizer's timestamp tokens do not fit the model's vocabulary");
  }
  for (TokenId id : sp.languages) TANDEM_TRY(check_id(id, "language token", model.vocab));
  if (!sp.languages.empty()) {
    TANDEM_TRY(check_id(sp.transcribe, "<|transcribe|>", model.vocab));
    TANDEM_TRY(check_id(sp.translate, "<|translate|>", model.vocab));
  }

  if (opts.temperatures.empty()) return fail(Errc::invalid_argument, "temperatures: the ladder is empty");
  for (double t : opts.temperatures) {
    if (!std::isfinite(t) || t < 0 || t > 100) {
      return fail(Errc::invalid_argument, "temperatures: " + std::to_string(t) + " is outside [0, 100]");
    }
  }
  if (!std::isfinite(opts.max_initial_timestamp)) {
    return fail(Errc::invalid_argument, "max_initial_timestamp is not finite");
  }
  if (opts.max_new_tokens > static_cast<std::uint32_t>(model.max_target_positions)) {
    return fail(Errc::invalid_argument, "max_new_tokens " + std::to_string(opts.max_new_tokens) +
                                            " exceeds the model's " + std::to_string(model.max_target_positions) +
                                            " text positions");
  }

  auto g = parse_generation_config(generation_config_json, sp, model.vocab);
  if (!g.ok()) return fail(std::move(g).error());
  if (g->is_multilingual && *g->is_multilingual != !sp.languages.empty()) {
    return config_error("is_multilingual", *g->is_multilingual
                                               ? "is true but the tokenizer has no language tokens"
                                               : "is false but the tokenizer has language tokens");
  }

  Transcriber t;
  t.tok_ = &tok;
  t.sp_ = sp;
  t.model_ = model;
  t.cfg_.multilingual = !sp.languages.empty();
  if (!opts.language.empty()) {
    const std::string code = language_code_of(opts.language);
    if (!t.cfg_.multilingual) {
      if (code != "en") {
        return fail(Errc::invalid_argument, "language \"" + opts.language + "\": this model is English-only");
      }
    } else if (code.empty() || sp.language_id(code) < 0) {
      return fail(Errc::invalid_argument, "language \"" + opts.language + "\" is not one of this model's languages");
    }
    t.language_ = code;
  } else if (!t.cfg_.multilingual) {
    t.language_ = "en";
  } else if (sp.languages.size() == 1) {
    t.language_ = std::string(sp.language_code(sp.languages.front()));
  }
  if (opts.task == Task::translate && !t.cfg_.multilingual) {
    return fail(Errc::invalid_argument, "task translate: this model is English-only");
  }

  // openai SuppressTokens always adds the task and prompt specials; the model's list comes on top.
  t.cfg_.suppress = g->suppress.value_or(std::vector<TokenId>{});
  for (TokenId id : {sp.transcribe, sp.translate, sp.sot, sp.startofprev, sp.startoflm, sp.nospeech}) {
    if (id >= 0 && id < model.vocab) t.cfg_.suppress.push_back(id);
  }
  if (g->begin_suppress) {
    t.cfg_.begin_suppress = *g->begin_suppress;
  } else {  // openai SuppressBlank: " " and eot at the first sampled position
    t.cfg_.begin_suppress = tok::whisper_text_ids(tok, " ");
    t.cfg_.begin_suppress.push_back(sp.eot);
  }
  if (opts.max_initial_timestamp >= 0) {
    t.cfg_.max_initial_timestamp_index =
        static_cast<int>(std::lround(opts.max_initial_timestamp / tok::kWhisperTimestampSeconds));
  } else {
    t.cfg_.max_initial_timestamp_index = g->max_initial_timestamp_index.value_or(50);
  }
  // Timestamps past the window's length cannot be right (all 1501 fit a 30-s window).
  t.cfg_.max_timestamp_index = model.window_frames * kHop / kSamplesPerTimestamp;

  const std::string initial = trim(opts.initial_prompt);
  if (!initial.empty()) t.initial_prompt_ = tok::whisper_text_ids(tok, " " + initial);
  t.opts_ = std::move(opts);
  return t;
}

std::size_t Transcriber::window_samples() const {
  return static_cast<std::size_t>(model_.window_frames) * kHop;
}

std::uint32_t Transcriber::windows_estimate(std::size_t samples, int window_frames) {
  if (window_frames <= 0) return 0;
  const std::size_t ws = static_cast<std::size_t>(window_frames) * kHop;
  return static_cast<std::uint32_t>((samples + ws - 1) / ws);
}

std::vector<TokenId> Transcriber::prompt_tokens(std::span<const TokenId> prev, std::string_view language) const {
  std::vector<TokenId> p;
  const std::size_t keep = static_cast<std::size_t>(model_.max_target_positions / 2 - 1);
  if (!prev.empty()) {
    p.push_back(sp_.startofprev);
    const auto tail = prev.size() > keep ? prev.subspan(prev.size() - keep) : prev;
    p.insert(p.end(), tail.begin(), tail.end());
  }
  p.push_back(sp_.sot);
  if (cfg_.multilingual) {
    const TokenId lang = sp_.language_id(language);
    if (lang >= 0) p.push_back(lang);
    p.push_back(opts_.task == Task::translate ? sp_.translate : sp_.transcribe);
  }
  if (!opts_.timestamps) p.push_back(sp_.notimestamps);
  return p;
}

Result<WindowResult> Transcriber::window(const AudioView& view, const Checkpoint& ck, DecoderSession& session,
                                         const std::atomic<bool>* cancel) const {
  for (TokenId id : ck.prompt) {
    if (id < 0 || id >= model_.vocab) {
      return fail(Errc::invalid_argument, "checkpoint prompt token " + std::to_string(id) +
                                              " is outside the model's vocabulary");
    }
  }
  if (!ck.language.empty() && (cfg_.multilingual ? sp_.language_id(ck.language) < 0 : ck.language != "en")) {
    return fail(Errc::invalid_argument, "checkpoint language \"" + ck.language + "\" is not one of this model's");
  }
  if (view.total < view.first || view.samples.size() > view.total - view.first) {
    return fail(Errc::invalid_argument, "audio view of " + std::to_string(view.samples.size()) + " samples from " +
                                            std::to_string(view.first) + " past its total " +
                                            std::to_string(view.total));
  }
  WindowResult out;
  out.next = ck;
  if (ck.finished || (view.complete && ck.seek >= view.total)) {
    out.next.finished = true;
    return out;
  }
  const std::size_t ws = window_samples();
  const std::uint64_t need_end = std::min<std::uint64_t>(ck.seek + ws, view.total);
  if (ck.seek < view.first || need_end > view.first + view.samples.size() ||
      (!view.complete && view.total < ck.seek + ws)) {
    return fail(Errc::invalid_argument,
                "the window at sample " + std::to_string(ck.seek) + " needs samples up to " +
                    std::to_string(view.complete ? need_end : ck.seek + ws) + "; the view holds [" +
                    std::to_string(view.first) + ", " + std::to_string(view.first + view.samples.size()) + ")" +
                    (view.complete ? "" : " of an unfinished stream"));
  }
  const std::span<const float> pcm = view.samples;
  const std::size_t at = static_cast<std::size_t>(ck.seek - view.first);
  if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
    return fail(Errc::cancelled, "transcription cancelled");
  }
  const std::uint64_t segment_samples = std::min<std::uint64_t>(ws, view.total - ck.seek);
  const audio::LogMel mel_fn(audio::MelSpec{model_.n_mels, 400, kHop, audio::kSampleRate});
  // Samples past need_end are never read: a window depends only on its own samples (zeros past the audio's end).
  const std::vector<float> mel =
      mel_fn.window(pcm.first(static_cast<std::size_t>(need_end - view.first)), at, ws);
  TANDEM_TRY(session.encode(mel, cancel));
  const auto vocab = static_cast<std::size_t>(model_.vocab);

  // Language: given, carried in the checkpoint, or detected from the logits after <|startoftranscript|> alone.
  std::string language = ck.language.empty() ? language_ : ck.language;
  std::vector<float> sot_alone;
  if (language.empty()) {
    auto r = feed(session, std::span<const TokenId>(&sp_.sot, 1), vocab, cancel);
    if (!r.ok()) return fail(std::move(r).error());
    sot_alone = std::move(r).value();
    TokenId best = sp_.languages.front();
    for (TokenId id : sp_.languages) {
      if (sot_alone[static_cast<std::size_t>(id)] > sot_alone[static_cast<std::size_t>(best)]) best = id;
    }
    language = std::string(sp_.language_code(best));
  }

  // The prompt, fed up to <|startoftranscript|> first: its logits there give no_speech_prob (openai/whisper).
  const bool first_window = ck.windows_done == 0 && ck.prompt.empty();
  const std::vector<TokenId>& prev = first_window ? initial_prompt_ : ck.prompt;
  const std::vector<TokenId> prompt = prompt_tokens(prev, language);
  const std::size_t sot_index =
      static_cast<std::size_t>(std::find(prompt.begin(), prompt.end(), sp_.sot) - prompt.begin());
  std::vector<float> at_sot;
  if (!sot_alone.empty() && sot_index == 0) {
    at_sot = std::move(sot_alone);  // the detection pass already fed exactly [sot]
  } else {
    session.rewind(0);
    auto r = feed(session, std::span<const TokenId>(prompt).first(sot_index + 1), vocab, cancel);
    if (!r.ok()) return fail(std::move(r).error());
    at_sot = std::move(r).value();
  }
  const double no_speech_prob = softmax_prob(at_sot, sp_.nospeech);
  std::vector<float> first = at_sot;
  if (sot_index + 1 < prompt.size()) {
    auto r = feed(session, std::span<const TokenId>(prompt).subspan(sot_index + 1), vocab, cancel);
    if (!r.ok()) return fail(std::move(r).error());
    first = std::move(r).value();
  }

  // Temperature fallback (transcribe.py decode_with_fallback).
  const detail::Rules rules{&sp_, &cfg_, opts_.timestamps};
  detail::AttemptParams params;
  params.max_new_tokens = opts_.max_new_tokens != 0 ? opts_.max_new_tokens
                                                    : static_cast<std::size_t>(model_.max_target_positions / 2);
  params.max_positions = static_cast<std::size_t>(model_.max_target_positions);
  params.eot = sp_.eot;
  detail::Attempt kept;
  double ratio = 0;
  std::string text;
  for (std::size_t i = 0; i < opts_.temperatures.size(); ++i) {
    session.rewind(prompt.size());
    params.temperature = opts_.temperatures[i];
    params.seed = detail::window_seed(opts_.seed, ck.seek, i);
    auto a = detail::run_attempt(session, first, rules, params, cancel);
    if (!a.ok()) return fail(std::move(a).error());
    kept = std::move(a).value();
    std::vector<TokenId> text_ids;
    for (TokenId id : kept.tokens) {
      if (!sp_.is_timestamp(id)) text_ids.push_back(id);
    }
    text = tok_->decode(text_ids);
    ratio = compression_ratio(text);
    bool needs_fallback = ratio > opts_.compression_ratio_threshold || kept.avg_logprob < opts_.logprob_threshold;
    if (no_speech_prob > opts_.no_speech_threshold && kept.avg_logprob < opts_.logprob_threshold) {
      needs_fallback = false;  // silence: the skip below handles it
    }
    if (!needs_fallback) break;
  }
  out.temperature = kept.temperature;
  out.next.language = language;
  out.next.windows_done = ck.windows_done + 1;

  bool skip = no_speech_prob > opts_.no_speech_threshold;
  if (kept.avg_logprob > opts_.logprob_threshold) skip = false;
  const std::size_t keep = static_cast<std::size_t>(model_.max_target_positions / 2 - 1);
  if (skip) {
    out.skipped_silence = true;
    out.next.seek = ck.seek + segment_samples;
    out.next.prompt = prev;
    if (out.next.prompt.size() > keep) {
      out.next.prompt.erase(out.next.prompt.begin(), out.next.prompt.end() - static_cast<std::ptrdiff_t>(keep));
    }
  } else {
    const double offset_s = static_cast<double>(ck.seek) / audio::kSampleRate;
    Split split = split_segments(kept.tokens, sp_, offset_s, segment_samples);
    std::vector<TokenId> history = prev;
    // Times past the end of the audio (a last window is zero-padded to its full length) are clamped to it: a segment
    // never ends after the file does.
    const double audio_end = static_cast<double>(view.total) / audio::kSampleRate;
    for (Segment& s : split.segments) {
      s.start = std::min(s.start, audio_end);
      s.end = std::min(s.end, audio_end);
      std::vector<TokenId> text_ids;
      for (TokenId id : s.tokens) {
        if (!sp_.is_timestamp(id)) text_ids.push_back(id);
      }
      s.text = tok_->decode(text_ids);
      if (s.start == s.end || trim(s.text).empty()) continue;  // openai clears these; we drop them
      s.avg_logprob = kept.avg_logprob;
      s.no_speech_prob = no_speech_prob;
      s.compression_ratio = ratio;
      s.temperature = kept.temperature;
      history.insert(history.end(), s.tokens.begin(), s.tokens.end());
      out.segments.push_back(std::move(s));
    }
    if (!opts_.condition_on_previous_text || kept.temperature > 0.5) history.clear();
    if (history.size() > keep) history.erase(history.begin(), history.end() - static_cast<std::ptrdiff_t>(keep));
    out.next.prompt = std::move(history);
    out.next.seek = ck.seek + split.advance;
    out.next.segments_done = ck.segments_done + static_cast<std::uint32_t>(out.segments.size());
  }
  out.next.finished = view.complete && out.next.seek >= view.total;
  return out;
}

}  // namespace tandem::speech
