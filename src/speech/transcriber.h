// The torch-free Whisper decoder (docs/speech-decoding.md): openai/whisper's transcribe loop one 30-s window at a
// time — log-mel of the window, language detection, the decode with Whisper's suppression and timestamp rules,
// temperature fallback, the no-speech skip, segments with absolute times and the seek to the next window — over a
// DecoderSession (speech/session.h) that holds the model. Everything a job needs to continue on another replica at
// a window boundary is in Checkpoint, so a resumed file gives exactly the segments of an uninterrupted one.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "speech/session.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/whisper_tokens.h"

namespace tandem::speech {

enum class Task : std::uint8_t { transcribe, translate };

// A threshold set to NaN is off (openai/whisper's None): every comparison with it is false.
struct TranscribeOptions {
  std::string language;  // "" = detect on the first window (multilingual models); a code ("de") or name ("german")
  Task task = Task::transcribe;
  bool timestamps = true;
  std::vector<double> temperatures{0.0, 0.2, 0.4, 0.6, 0.8, 1.0};  // fallback ladder, each in [0, 100]
  double compression_ratio_threshold = 2.4;  // zlib ratio of the window's text above this → retry hotter
  double logprob_threshold = -1.0;           // average log-prob below this → retry hotter
  double no_speech_threshold = 0.6;          // no_speech_prob above this with avg log-prob below logprob_threshold:
                                             // the window is silence (skipped)
  bool condition_on_previous_text = true;    // previous windows' tokens as the <|startofprev|> prompt
  std::string initial_prompt;                // text before the first window's prompt
  std::uint64_t seed = 0;                    // sampling at temperature > 0: draws depend on (seed, seek, T, step)
  double max_initial_timestamp = 1.0;        // seconds; negative = the model's max_initial_timestamp_index (else 1.0)
  std::uint32_t max_new_tokens = 0;          // per window; 0 = max_target_positions / 2
};

struct Segment {
  double start = 0, end = 0;     // seconds from the start of the file
  std::string text;              // decoded text tokens (leading space as the model wrote it)
  std::vector<TokenId> tokens;   // the segment's tokens including its timestamp tokens
  double avg_logprob = 0, no_speech_prob = 0, compression_ratio = 0, temperature = 0;  // of its window's decode
};

// Everything needed to continue a file at a window boundary on another replica (the job's checkpoint).
struct Checkpoint {
  std::uint64_t seek = 0;        // next window's first sample (16 kHz)
  std::vector<TokenId> prompt;   // previous tokens for <|startofprev|> (at most max_target_positions/2 − 1)
  std::string language;          // detected or given ("" until known)
  std::uint32_t windows_done = 0;
  std::uint32_t segments_done = 0;
  bool finished = false;

  friend bool operator==(const Checkpoint&, const Checkpoint&) = default;
};

// Compact JSON for the journal: {"v":1,"seek":…,"prompt":[…],"language":"…","windows_done":…,"segments_done":…,
// "finished":…}.
std::string encode_checkpoint(const Checkpoint& ck);
// Untrusted text: parse_error (not JSON, nested too deep), format_error naming the key (missing, wrong type, out of
// range, unknown version, a prompt longer than 4096 tokens, a language that is not UTF-8).
Result<Checkpoint> decode_checkpoint(std::string_view text);

struct WindowResult {
  std::vector<Segment> segments;  // this window's segments, in order, empty text dropped
  Checkpoint next;
  double temperature = 0;         // the temperature of the decode kept (the last one tried on fallback)
  bool skipped_silence = false;
};

// The audio a window reads: samples[0] is sample `first` of the stream (16 kHz mono), `total` samples exist so far,
// and `complete` says no more will come (a file, or a live stream whose end was sent). A window at seek needs the
// samples [seek, min(seek + window, total)); an incomplete view must hold a whole window from seek (a live stream
// waits for it), so a streamed file gives exactly the segments of the same samples sent as one file.
struct AudioView {
  std::span<const float> samples;
  std::uint64_t first = 0;
  std::uint64_t total = 0;
  bool complete = true;

  static AudioView whole(std::span<const float> pcm) { return AudioView{pcm, 0, pcm.size(), true}; }
};

struct ModelSpeechInfo {
  int n_mels = 80;
  int window_frames = 3000;          // mel frames per window (hop 160 → 30 s)
  int max_target_positions = 448;
  int vocab = 0;                     // the model's logits width
};

class Transcriber {
 public:
  // generation_config_json: the model's generation_config.json text ("" = none). Read: suppress_tokens (−1 entries
  // ignored: openai's non-speech symbol set is not expanded), begin_suppress_tokens (absent: " " and eot, openai's
  // SuppressBlank), max_initial_timestamp_index, no_timestamps_token_id (must equal the tokenizer's),
  // is_multilingual (must agree with the tokenizer's language tokens). Errors: parse_error / format_error naming the
  // key; invalid_argument for the model info or options (unknown language for this model, translate or a language
  // other than English on an English-only model, temperatures empty, negative or not finite, ...).
  static Result<Transcriber> create(const tok::Tokenizer& tok, const tok::WhisperSpecials& sp, ModelSpeechInfo model,
                                    std::string_view generation_config_json, TranscribeOptions opts);

  // Decodes the window of `pcm` (16 kHz mono) starting at ck.seek and returns its segments and the next checkpoint.
  // A finished checkpoint (or seek ≥ pcm.size()) returns no segments and a finished checkpoint without touching the
  // session. `cancel` polled between tokens: Errc::cancelled. Session errors pass through unchanged.
  // invalid_argument for a checkpoint this model cannot continue (a prompt id out of range, an unknown language).
  Result<WindowResult> window(std::span<const float> pcm, const Checkpoint& ck, DecoderSession& session,
                              const std::atomic<bool>* cancel) const {
    return window(AudioView::whole(pcm), ck, session, cancel);
  }
  // The same over part of a stream. invalid_argument when the view does not hold what the window needs (samples
  // before seek missing, or an incomplete view with less than a whole window from seek). A checkpoint is finished
  // only when the view is complete and the seek reached its end.
  Result<WindowResult> window(const AudioView& audio, const Checkpoint& ck, DecoderSession& session,
                              const std::atomic<bool>* cancel) const;

  // ceil(samples / window samples): windows for progress and ETA (a seek to a timestamp can add a few).
  static std::uint32_t windows_estimate(std::size_t samples, int window_frames);

  std::size_t window_samples() const;
  const TranscribeOptions& options() const { return opts_; }

  // The decoder's prompt for a window: [<|startofprev|>, last max_target_positions/2 − 1 of prev…] (when prev is
  // non-empty), <|startoftranscript|>, then the language and task tokens (multilingual models; none for
  // English-only ones), then <|notimestamps|> when !timestamps.
  std::vector<TokenId> prompt_tokens(std::span<const TokenId> prev, std::string_view language) const;

  // Internal configuration shared with the decode loop (decode.cc).
  struct Config {
    std::vector<TokenId> suppress;        // suppressed at every step
    std::vector<TokenId> begin_suppress;  // suppressed at the first sampled step
    int max_initial_timestamp_index = 50;
    int max_timestamp_index = 1500;       // the window's length in timestamp steps
    bool multilingual = false;            // language and task tokens in the prompt
  };

 private:
  Transcriber() = default;

  const tok::Tokenizer* tok_ = nullptr;
  tok::WhisperSpecials sp_;
  ModelSpeechInfo model_;
  TranscribeOptions opts_;
  Config cfg_;
  std::string language_;               // the options' language as a code ("" = detect)
  std::vector<TokenId> initial_prompt_;
};

// Subtitles and plain text of finished segments.
std::string to_srt(std::span<const Segment> segments);   // 1-based cues, HH:MM:SS,mmm --> HH:MM:SS,mmm
std::string to_vtt(std::span<const Segment> segments);   // "WEBVTT", cues HH:MM:SS.mmm --> HH:MM:SS.mmm
std::string to_text(std::span<const Segment> segments);  // segment texts joined, trimmed

// zlib ratio of `text` (bytes / compress2 bytes at the default level), 0 for empty text: openai's
// get_compression_ratio.
double compression_ratio(std::string_view text);

}  // namespace tandem::speech
