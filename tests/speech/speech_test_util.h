// Test helpers for the speech library: a Whisper-style tokenizer written into a temporary directory, noise PCM,
// and ScriptedSession — a DecoderSession whose logits follow a per-window script. A window is recognised by the
// hash of the mel it is given (the test computes the hash at the seek it expects, so a wrong seek shows up as an
// unscripted window); the decode attempt is the number of rewinds back to the prompt's end since encode().
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/temp_dir.h"
#include "audio/mel.h"
#include "speech/session.h"
#include "speech/transcriber.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/whisper_tokens.h"

namespace tandem::speech::testing {

template <class T>
T must(Result<T> r) {
  if (!r.ok()) {
    ADD_FAILURE() << r.error().message;
    std::abort();
  }
  return std::move(r).value();
}

// Scratch space removed with its contents when the test ends.
using TempDir = ::tandem::core::TempDir;

// A written Whisper tokenizer: `languages` language tokens (0: English-only), its specials and vocabulary size.
struct Vocab {
  tok::Tokenizer tok;
  tok::WhisperSpecials sp;
  int total = 0;
};
inline std::unique_ptr<Vocab> make_vocab(int languages) {
  TempDir dir;
  std::vector<std::string> corpus;
  for (int k = 0; k < 20; ++k) {
    corpus.push_back("hello world again and the end. la la la, this is a transcription test number " +
                     std::to_string(k));
  }
  const int total = must(tok::write_whisper_tokenizer(dir.path(), corpus, {300, languages}));
  tok::Tokenizer t = must(tok::load_tokenizer_files(dir.path()));
  tok::WhisperSpecials sp = must(tok::whisper_specials(t, total));
  return std::unique_ptr<Vocab>(new Vocab{std::move(t), std::move(sp), total});
}

constexpr int kMels = 16;
constexpr int kFrames = 200;             // a 2-s window
constexpr std::size_t kWindow = 32000;   // samples
constexpr int kPositions = 448;

inline ModelSpeechInfo model_info(const Vocab& v) { return ModelSpeechInfo{kMels, kFrames, kPositions, v.total}; }

// Deterministic noise: every offset gives a different mel window.
inline std::vector<float> noise(std::size_t n, std::uint32_t seed = 12345) {
  std::vector<float> pcm(n);
  std::uint32_t x = seed;
  for (float& s : pcm) {
    x = x * 1664525u + 1013904223u;
    s = (static_cast<float>(x >> 8) / 16777216.0f - 0.5f) * 0.2f;
  }
  return pcm;
}

inline std::uint64_t hash_floats(std::span<const float> v) {
  std::uint64_t h = 1469598103934665603ull;
  for (float f : v) {
    std::uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    h = (h ^ bits) * 1099511628211ull;
  }
  return h;
}

// The hash of the window the transcriber should encode at `seek`.
inline std::uint64_t window_hash(std::span<const float> pcm, std::uint64_t seek) {
  const audio::LogMel mel(audio::MelSpec{kMels, 400, 160, audio::kSampleRate});
  return hash_floats(mel.window(pcm, static_cast<std::size_t>(seek), kWindow));
}

// What the model "wants" at one step.
struct Want {
  TokenId id = -1;
  float peak = 10;
  bool flat = false;        // eight text competitors 0.1 below the peak: log-prob ≈ −2.1
  float ts_level = -30;     // every timestamp's logit when the wanted token is not a timestamp
};

struct WindowScript {
  std::string language = "en";        // preferred after <|startoftranscript|> alone
  float nospeech_logit = -10;         // at the <|startoftranscript|> position
  std::vector<std::vector<Want>> attempts;  // per decode attempt; the last one repeats
};

class ScriptedSession : public DecoderSession {
 public:
  ScriptedSession(const tok::WhisperSpecials& sp, int vocab, std::map<std::uint64_t, WindowScript> scripts)
      : sp_(sp), vocab_(vocab), scripts_(std::move(scripts)) {}

  Status encode(std::span<const float> mel, const std::atomic<bool>*) override {
    ++encodes;
    if (fail_encode_at == encodes) return fail(Errc::device_lost, "scripted device loss");
    if (mel.size() != static_cast<std::size_t>(kMels) * kFrames) {
      return fail(Errc::invalid_argument, "mel of " + std::to_string(mel.size()) + " floats");
    }
    const auto it = scripts_.find(hash_floats(mel));
    if (it == scripts_.end()) return fail(Errc::invalid_argument, "unscripted window");
    script_ = &it->second;
    fed_.clear();
    attempt_ = 0;
    prompt_end_.reset();
    return {};
  }

  Result<std::vector<float>> decode(std::span<const TokenId> tokens, const std::atomic<bool>*) override {
    if (script_ == nullptr) return fail(Errc::invalid_argument, "decode before encode");
    if (tokens.empty() || fed_.size() + tokens.size() > static_cast<std::size_t>(kPositions)) {
      return fail(Errc::invalid_argument, "bad feed");
    }
    for (TokenId id : tokens) {
      if (id < 0 || id >= vocab_) return fail(Errc::invalid_argument, "id out of range");
    }
    ++decodes;
    if (fail_decode_at == decodes) return fail(Errc::out_of_memory, "scripted allocation failure");
    if (cancel_at_decode == decodes && cancel_flag != nullptr) cancel_flag->store(true);
    fed_.insert(fed_.end(), tokens.begin(), tokens.end());
    return logits();
  }

  void rewind(std::size_t n) override {
    if (prompt_end_ && n == *prompt_end_ && n < fed_.size()) ++attempt_;
    fed_.resize(std::min(n, fed_.size()));
  }
  std::size_t fed() const override { return fed_.size(); }

  // The fed sequence at each window's first sampled step (the decoder prompt), in order.
  std::vector<std::vector<TokenId>> prompts;
  int encodes = 0, decodes = 0, detections = 0;
  int fail_encode_at = 0, fail_decode_at = 0, cancel_at_decode = 0;
  std::atomic<bool>* cancel_flag = nullptr;

 private:
  bool control(TokenId id) const {
    return id == sp_.transcribe || id == sp_.translate || id == sp_.notimestamps ||
           std::find(sp_.languages.begin(), sp_.languages.end(), id) != sp_.languages.end();
  }

  std::vector<float> logits() {
    std::vector<float> l(static_cast<std::size_t>(vocab_), -30.0f);
    if (fed_.back() == sp_.sot) {
      if (fed_.size() == 1) ++detections;
      const TokenId lang = sp_.language_id(script_->language);
      if (lang >= 0) l[static_cast<std::size_t>(lang)] = 10;
      l[static_cast<std::size_t>(sp_.nospeech)] = script_->nospeech_logit;
      return l;
    }
    if (!prompt_end_) {
      const auto sot = std::find(fed_.begin(), fed_.end(), sp_.sot);
      std::size_t end = static_cast<std::size_t>(sot - fed_.begin()) + 1;
      while (end < fed_.size() && control(fed_[end])) ++end;
      if (end != fed_.size()) return l;  // not at the prompt's end: nobody samples from these
      prompt_end_ = end;
      prompts.push_back(fed_);
    }
    const std::size_t step = fed_.size() - *prompt_end_;
    const auto& attempts = script_->attempts;
    const auto& wants = attempts[std::min<std::size_t>(attempt_, attempts.size() - 1)];
    const Want w = step < wants.size() ? wants[step] : Want{sp_.eot};
    const auto at = [&](TokenId id) -> float& { return l[static_cast<std::size_t>(id)]; };
    if (sp_.is_timestamp(w.id)) {
      for (int k = 0; k < sp_.timestamp_count; ++k) {
        at(sp_.timestamp_begin + k) = w.peak - 5.0f * static_cast<float>(std::abs(sp_.timestamp_begin + k - w.id));
      }
      at(sp_.eot) = 0;
    } else {
      for (int k = 0; k < sp_.timestamp_count; ++k) at(sp_.timestamp_begin + k) = w.ts_level;
      at(w.id) = w.peak;
      if (w.flat) {
        int added = 0;
        for (TokenId c = 1; added < 8; ++c) {
          if (c == w.id) continue;
          at(c) = w.peak - 0.1f;
          ++added;
        }
      }
    }
    return l;
  }

  tok::WhisperSpecials sp_;
  int vocab_;
  std::map<std::uint64_t, WindowScript> scripts_;
  const WindowScript* script_ = nullptr;
  std::vector<TokenId> fed_;
  std::size_t attempt_ = 0;
  std::optional<std::size_t> prompt_end_;
};

// Script building: timestamps, text (its token ids), eot.
struct ScriptBuilder {
  const Vocab& v;
  std::vector<Want> wants;
  ScriptBuilder& ts(double seconds) {
    wants.push_back(Want{v.sp.timestamp_token(seconds)});
    return *this;
  }
  ScriptBuilder& text(std::string_view t, bool flat = false) {
    for (TokenId id : tok::whisper_text_ids(v.tok, t)) wants.push_back(Want{id, 10, flat});
    return *this;
  }
  ScriptBuilder& want(Want w) {
    wants.push_back(w);
    return *this;
  }
  ScriptBuilder& eot(bool flat = false) {
    wants.push_back(Want{v.sp.eot, 10, flat});
    return *this;
  }
  std::vector<Want> done() const { return wants; }
};

}  // namespace tandem::speech::testing
