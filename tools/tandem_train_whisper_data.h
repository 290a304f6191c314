// The data of tandem-train-whisper (docs/default-speech-model.md): a small English grammar, its sentences spoken by
// espeak-ng, the training windows built from them (placement, gain, noise, two segments, a cut-off next sentence,
// silence) with their Whisper token targets, and word error rate. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::speechdata {

// The random stream every choice comes from: splitmix64, the same numbers on every machine (no <random>
// distributions, whose output is implementation-defined).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next();
  double uniform();                        // [0, 1)
  double uniform(double lo, double hi);    // [lo, hi)
  std::size_t below(std::size_t n);        // [0, n)
  bool chance(double p) { return uniform() < p; }
  double normal();                         // Box-Muller

 private:
  std::uint64_t s_;
};

inline constexpr std::uint64_t kTrainSeed = 1;
inline constexpr std::uint64_t kHeldoutSeed = 0x5eed0f4e1d07;

// Sentence `index` of the stream `seed`: "The red fox sees two green boxes." — a capital first letter, one final
// period, 4 to `max_words` words from the grammar (about 130 word forms).
std::string sentence(std::uint64_t seed, std::uint64_t index, int max_words = 8);
// Every word form of the grammar, each in a few sentence positions: added to the tokenizer's corpus so that no word
// of a held-out sentence is unseen by the BPE.
std::vector<std::string> vocabulary_sentences();
// Lower case, punctuation removed, words split on spaces.
std::vector<std::string> normalize_words(const std::string& text);

struct WordErrors {
  std::size_t errors = 0;  // substitutions + deletions + insertions (Levenshtein over words)
  std::size_t words = 0;   // reference words
};
WordErrors word_errors(const std::string& reference, const std::string& hypothesis);

// One espeak-ng setting: voice (+variant), words per minute, pitch.
struct Voice {
  std::string name;  // "en-us+m3"
  int speed = 175;
  int pitch = 50;
  std::string describe() const;  // "en-us+m3 -s 160 -p 42"
};
// The settings the training and held-out streams draw from (group `g` of stream `seed`). The demo's plain
// `espeak-ng "text"` (voice en, 175 wpm, pitch 50) lies inside the ranges.
Voice voice_for(std::uint64_t seed, std::uint64_t group);

struct Utterance {
  std::string text;
  Voice voice;
  std::vector<std::int16_t> pcm;  // 16 kHz mono, espeak's leading and trailing silence removed (scaled by 32767)
  double seconds() const { return static_cast<double>(pcm.size()) / 16000.0; }
};

struct SynthStats {
  std::size_t calls = 0, split_fallbacks = 0, dropped_long = 0;
  double seconds = 0;
};

// Speaks sentences [first, first + count) of stream `seed` with espeak-ng (`espeak` = the program), `group` sentences
// per call with one Voice (voice_for(seed, call index)); a call's output is split at its exact-zero pauses between
// sentences (a call whose pauses do not match its sentences is spoken again one sentence per call). Each piece is
// decoded and resampled to 16 kHz by audio::decode_audio, the daemon's path. Sentences whose speech is longer than
// `max_seconds` are dropped (counted in stats); so are sentences in `exclude` (the training set, for the held-out
// stream). `jobs` espeak-ng processes run at once; `tmp` holds their files. Throws std::runtime_error.
std::vector<Utterance> synthesize(const std::string& espeak, std::uint64_t seed, std::uint64_t first, std::size_t count,
                                  std::size_t group, double max_seconds, const std::vector<std::string>* exclude,
                                  int jobs, const std::string& tmp, SynthStats& stats);

// Runs espeak-ng once for `text` with `voice` and returns the WAV file's bytes (for --render and the tests).
std::string speak_wav(const std::string& espeak, const std::string& text, const Voice& voice, const std::string& tmp);

// Writes `text` to `path` (truncating); std::runtime_error "cannot write PATH" on failure. Returns the path.
std::string write_text(const std::string& path, const std::string& text);
// --render: speaks `n` held-out sentences (none of the first `train_sentences` training sentences) into `dir` as
// 0000.wav ... with transcripts.txt (file, text, voice); the first in espeak-ng's plain default voice.
void render_heldout(const std::string& dir, int n, const std::string& espeak, int train_sentences);
// The utterances one after another as float samples: `lead` s of silence, `gap` s between them, `tail` s after.
std::vector<float> with_silence(const std::vector<const Utterance*>& us, double lead, double gap, double tail);

// Whisper's special token ids of the written tokenizer.
struct Specials {
  std::int32_t eot = -1, sot = -1, en = -1, transcribe = -1, startofprev = -1, nospeech = -1, notimestamps = -1,
               timestamp_begin = -1;
  std::int32_t timestamp(double seconds) const;  // rounded to the 0.02-s grid
};

inline constexpr std::int32_t kIgnore = -100;

// One training or evaluation window: samples (window_samples long, zeros after the speech) and the decoder's
// teacher-forced input with the label of each position (kIgnore where nothing is learned).
struct Example {
  std::vector<float> pcm;
  std::vector<std::int32_t> input, labels;
  std::string text;       // the transcript (segments joined by a space)
  std::vector<std::int32_t> ctc;  // the text ids of every sentence in the window (the auxiliary CTC target)
  bool timestamps = false;
  int segments = 0;       // complete sentences in the window
  bool cut = false;       // a last sentence runs past the window's end (target: its start timestamp only)
  bool silence = false;
};

struct Mix {
  double p_silence = 0.04;      // a window of silence or noise: <|nospeech|> after <|startoftranscript|>
  double p_notimestamps = 0.3;  // <|notimestamps|> targets (else timestamped)
  double p_second = 0.35;       // try a second sentence after the first
  double p_prev = 0.15;         // a <|startofprev|> prompt of earlier text before <|startoftranscript|>
  double p_noise = 0.25;        // white noise under the window
  double max_lead = 0.8;        // seconds of silence before the first sentence, at most (generation_config: 1.0)
};

// Text ids of a transcript, as the decoder sees them (tok::whisper_text_ids with a leading space).
using TextIds = std::vector<std::int32_t>;

// Builds one window from `pool` (utterances and their text ids) with choices from `rng`.
Example compose(Rng& rng, const std::vector<Utterance>& pool, const std::vector<TextIds>& ids, const Specials& sp,
                const Mix& mix, std::size_t window_samples, std::size_t max_tokens);
// The evaluation window of one utterance: 0.3 s of silence, the sentence, zeros; timestamped target.
Example single(const Utterance& u, const TextIds& ids, const Specials& sp, std::size_t window_samples,
               bool timestamps);

// A 16-bit mono WAV of 16-kHz samples in [-1, 1].
std::string wav_bytes(const std::vector<float>& pcm, int rate = 16000);

}  // namespace tandem::speechdata
