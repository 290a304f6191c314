// Whisper speech-model speed (engine/whisper.h, speech/transcriber.h): the encode of one 30-s window, the decode
// per token, one window's work (encode + a greedy decode of kWindowTokens tokens) and whole transcriptions through
// speech::Transcriber (window loop, greedy, timestamps), on the CPU (Tandem's kernels, 1 and 2 threads) and on the
// simulated accelerator (ATen on this CPU, 1 thread), for
//   whisper-test    the test preset with its tokenizer (write_whisper_test_model), random weights; transcribes 60 s
//                   of generated tones;
//   whisper-tiny    openai/whisper-tiny's shape (vocab 51865) with random weights and no tokenizer: the engine
//                   only (encode, decode, window);
//   whisper-default build/models/whisper-default (or the directory in $TANDEM_BENCH_WHISPER_DEFAULT) when it
//                   exists (skipped otherwise); transcribes espeak-ng speech when espeak-ng is installed (skipped
//                   otherwise); the transcript's start is the benchmark's label.
// Counters: encode_ms, ms_per_token, rtf (audio seconds per wall second; for "window" a 30-s window per
// iteration), and vs_cpu1 (this device's speed over the 1-thread CPU's, when that ran earlier in the same process).
// Models are written once to /tmp/tandem-bench-models/whisper-*. docs/speech-model.md, "Benchmarks".
//   bench_whisper [--benchmark_filter=...] [--benchmark_min_time=0.5]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numbers>
#include <sstream>
#include <string>
#include <vector>

#include "audio/audio.h"
#include "audio/mel.h"
#include "core/clock.h"
#include "device/simulated.h"
#include "engine/whisper.h"
#include "modelgen/whisper_writer.h"
#include "speech/transcriber.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/whisper_tokens.h"

using namespace tandem;

namespace {

namespace fs = std::filesystem;
using SteadyTime = std::chrono::steady_clock;

constexpr int kWindowTokens = 64;  // tokens of the "window" benchmark's greedy decode (fewer when positions are few)
constexpr double kTonesSeconds = 60;

enum class Dev { cpu1, cpu2, sim };
const char* dev_name(Dev d) { return d == Dev::cpu1 ? "cpu1" : d == Dev::cpu2 ? "cpu2" : "sim"; }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A model on disk with what the transcriber needs (the tokenizer when there is one).
struct Files {
  std::string dir;
  std::unique_ptr<tok::Tokenizer> tok;  // null: engine-only benchmarks
  tok::WhisperSpecials sp;
  std::string generation_config;
  std::string error;  // non-empty: every benchmark of this model is skipped with it
};

const Files& files(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Files>> cache;
  if (auto it = cache.find(name); it != cache.end()) return *it->second;
  auto f = std::make_unique<Files>();
  if (name == "whisper-default") {
    const char* env = std::getenv("TANDEM_BENCH_WHISPER_DEFAULT");
    f->dir = env != nullptr && *env != '\0' ? std::string(env)
                                            : std::string(TANDEM_SOURCE_DIR) + "/build/models/whisper-default";
    if (!fs::exists(f->dir + "/config.json")) f->error = f->dir + " does not exist (train the default speech model)";
  } else {
    f->dir = "/tmp/tandem-bench-models/" + name;
    const bool with_tokenizer = name == "whisper-test";
    if (!fs::exists(f->dir + "/model.safetensors") || (with_tokenizer && !fs::exists(f->dir + "/tokenizer.json"))) {
      auto shape = modelgen::whisper_preset(name);
      if (!shape) {
        f->error = shape.error().message;
      } else {
        modelgen::WhisperWriteOptions o;
        o.shape = *shape;
        std::string err;
        if (with_tokenizer) {
          auto w = modelgen::write_whisper_test_model(f->dir, o, modelgen::whisper_test_corpus());
          if (!w) err = w.error().message;
        } else if (auto st = modelgen::write_whisper_model(f->dir, o); !st) {
          err = st.error().message;
        }
        if (!err.empty()) f->error = "writing " + f->dir + ": " + err;
      }
    }
  }
  if (f->error.empty() && fs::exists(f->dir + "/tokenizer.json")) {
    auto cfg = weights::parse_whisper_config(read_file(f->dir + "/config.json"));
    auto t = tok::load_tokenizer_files(f->dir);
    if (!cfg) {
      f->error = cfg.error().message;
    } else if (!t) {
      f->error = "tokenizer: " + t.error().message;
    } else {
      f->tok = std::make_unique<tok::Tokenizer>(std::move(t).value());
      auto sp = tok::whisper_specials(*f->tok, cfg->vocab);
      if (!sp) f->error = "specials: " + sp.error().message;
      else f->sp = std::move(sp).value();
      if (fs::exists(f->dir + "/generation_config.json"))
        f->generation_config = read_file(f->dir + "/generation_config.json");
    }
  }
  return *(cache[name] = std::move(f));
}

// The loaded model, one session with a window encoded, and the mel of that window.
struct Loaded {
  std::shared_ptr<engine::WhisperModel> model;
  std::unique_ptr<engine::WhisperSession> session;
  std::vector<float> mel;
  std::vector<std::int32_t> prompt;  // <|startoftranscript|> (+ language, task tokens when there is a tokenizer)
  std::string error;
};

// 30 s of a few tones with gaps: not speech, but a mel with structure.
std::vector<float> tones(double seconds) {
  std::vector<float> pcm(static_cast<std::size_t>(seconds * audio::kSampleRate));
  for (std::size_t i = 0; i < pcm.size(); ++i) {
    const double t = static_cast<double>(i) / audio::kSampleRate;
    const int note = static_cast<int>(t / 0.75);
    if (note % 4 == 3) continue;  // a gap every fourth note
    const double f = 220.0 * std::pow(2.0, (note * 5 % 12) / 12.0);
    pcm[i] = static_cast<float>(0.3 * std::sin(2 * std::numbers::pi * f * t) +
                                0.1 * std::sin(2 * std::numbers::pi * 3 * f * t));
  }
  return pcm;
}

Loaded& loaded(const std::string& name, Dev dev) {
  static std::map<std::string, std::unique_ptr<Loaded>> cache;
  const std::string key = name + "/" + dev_name(dev);
  if (auto it = cache.find(key); it != cache.end()) return *it->second;
  auto l = std::make_unique<Loaded>();
  const Files& f = files(name);
  if (!f.error.empty()) {
    l->error = f.error;
    return *(cache[key] = std::move(l));
  }
  engine::WhisperLoadOptions lo;
  lo.threads = dev == Dev::cpu2 ? 2 : 1;
  if (dev == Dev::sim) {
    device::SimulatedConfig sc;
    sc.capacity_bytes = 16ull << 30;
    lo.accelerator = std::make_shared<device::SimulatedDevice>(sc, std::make_shared<SteadyClock>());
  }
  auto m = engine::WhisperModel::load(f.dir, lo);
  if (!m) {
    l->error = "load: " + m.error().message;
    return *(cache[key] = std::move(l));
  }
  l->model = *m;
  auto s = l->model->new_session();
  if (!s) {
    l->error = "session: " + s.error().message;
    return *(cache[key] = std::move(l));
  }
  l->session = std::move(s).value();
  const auto& c = l->model->config();
  const audio::LogMel mel(audio::MelSpec{c.n_mels, 400, 160, audio::kSampleRate});
  l->mel = mel.window(tones(30), 0, static_cast<std::size_t>(l->model->window_frames()) * 160);
  if (f.tok) {
    l->prompt.push_back(f.sp.sot);
    if (f.sp.multilingual()) l->prompt.insert(l->prompt.end(), {f.sp.language_id("en"), f.sp.transcribe});
  } else {
    l->prompt.push_back(c.decoder_start_id >= 0 ? c.decoder_start_id : 0);
  }
  return *(cache[key] = std::move(l));
}

// Speed of the 1-thread CPU per (model, benchmark), for vs_cpu1 on the other devices.
std::map<std::string, double>& cpu1_rate() {
  static std::map<std::string, double> m;
  return m;
}

// `rate`: work per second (higher = faster). Records it for cpu1, reports vs_cpu1 for the others.
void compare(benchmark::State& state, const std::string& what, Dev dev, double rate) {
  if (dev == Dev::cpu1) {
    cpu1_rate()[what] = rate;
  } else if (auto it = cpu1_rate().find(what); it != cpu1_rate().end() && it->second > 0) {
    state.counters["vs_cpu1"] = rate / it->second;
  }
}

double seconds_since(SteadyTime::time_point t0) {
  return std::chrono::duration<double>(SteadyTime::now() - t0).count();
}

// Greedy argmax (lowest id of the maximum).
std::int32_t argmax(const std::vector<float>& v) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best]) best = i;
  return static_cast<std::int32_t>(best);
}

// Feeds the prompt, then `n` greedy tokens one at a time. Returns false (with the error set on `state`) on failure.
bool greedy(benchmark::State& state, Loaded& l, int n) {
  l.session->rewind(0);
  auto logits = l.session->decode(l.prompt, nullptr);
  for (int i = 0; logits && i < n; ++i) {
    const std::int32_t id = argmax(*logits);
    logits = l.session->decode(std::span<const std::int32_t>(&id, 1), nullptr);
  }
  if (!logits) state.SkipWithError(("decode: " + logits.error().message).c_str());
  return logits.ok();
}

int window_tokens(const Loaded& l) {
  return std::min<int>(kWindowTokens, l.model->config().target_positions - static_cast<int>(l.prompt.size()) - 1);
}

void bench_encode(benchmark::State& state, const std::string& name, Dev dev) {
  Loaded& l = loaded(name, dev);
  if (!l.error.empty()) return state.SkipWithError(l.error.c_str());
  double total = 0;
  for (auto _ : state) {
    const auto t0 = SteadyTime::now();
    if (auto st = l.session->encode(l.mel, nullptr); !st) return state.SkipWithError(st.error().message.c_str());
    total += seconds_since(t0);
  }
  const double per = total / static_cast<double>(state.iterations());
  state.counters["encode_ms"] = per * 1e3;
  compare(state, name + "/encode", dev, 1.0 / per);
}

// Per iteration: the prompt, then n greedy tokens after an encoded window (the encode is outside the timing).
void bench_decode(benchmark::State& state, const std::string& name, Dev dev) {
  Loaded& l = loaded(name, dev);
  if (!l.error.empty()) return state.SkipWithError(l.error.c_str());
  if (auto st = l.session->encode(l.mel, nullptr); !st) return state.SkipWithError(st.error().message.c_str());
  const int n = window_tokens(l);
  double total = 0;
  for (auto _ : state) {
    const auto t0 = SteadyTime::now();
    if (!greedy(state, l, n)) return;
    total += seconds_since(t0);
  }
  const double per_token = total / static_cast<double>(state.iterations()) / (n + 1);
  state.counters["ms_per_token"] = per_token * 1e3;
  state.counters["tokens"] = n + 1;  // decode calls per iteration (the prompt's counts as one)
  compare(state, name + "/decode", dev, 1.0 / per_token);
}

// One window's work: encode + the prompt + n greedy tokens; rtf = 30 s of audio per iteration over wall time.
void bench_window(benchmark::State& state, const std::string& name, Dev dev) {
  Loaded& l = loaded(name, dev);
  if (!l.error.empty()) return state.SkipWithError(l.error.c_str());
  const int n = window_tokens(l);
  double total = 0;
  for (auto _ : state) {
    const auto t0 = SteadyTime::now();
    if (auto st = l.session->encode(l.mel, nullptr); !st) return state.SkipWithError(st.error().message.c_str());
    if (!greedy(state, l, n)) return;
    total += seconds_since(t0);
  }
  const double window_s = l.model->window_frames() * 160.0 / audio::kSampleRate;
  const double rtf = window_s * static_cast<double>(state.iterations()) / total;
  state.counters["rtf"] = rtf;
  state.counters["tokens"] = n;
  compare(state, name + "/window", dev, rtf);
}

// The audio a model transcribes: tones for the test model, espeak-ng speech for the default model.
struct Audio {
  std::vector<float> pcm;
  std::string error;
};

const Audio& audio_for(const std::string& name) {
  static std::map<std::string, Audio> cache;
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  Audio a;
  if (name != "whisper-default") {
    a.pcm = tones(kTonesSeconds);
  } else {
    const std::string wav = "/tmp/tandem-bench-models/whisper-default-speech.wav";
    fs::create_directories("/tmp/tandem-bench-models");
    const std::string cmd =
        "espeak-ng -v en -s 150 -w " + wav +
        " 'The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step. "
        "Please call me back when you have a moment, and bring the report from last week. The weather today is "
        "cloudy with a chance of rain in the afternoon, so take an umbrella.' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0 || !fs::exists(wav)) {
      a.error = "espeak-ng is not available (apt-get install espeak-ng) or failed";
    } else {
      const std::string bytes = read_file(wav);
      auto pcm = audio::decode_audio(
          std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()));
      if (!pcm) a.error = "decoding espeak-ng's WAV: " + pcm.error().message;
      else a.pcm = std::move(pcm->samples);
    }
  }
  return cache[name] = std::move(a);
}

// A whole file through speech::Transcriber (greedy: temperature 0 only, timestamps, English), window by window.
void bench_transcribe(benchmark::State& state, const std::string& name, Dev dev) {
  Loaded& l = loaded(name, dev);
  if (!l.error.empty()) return state.SkipWithError(l.error.c_str());
  const Files& f = files(name);
  if (!f.tok) return state.SkipWithError("no tokenizer");
  const Audio& a = audio_for(name);
  if (!a.error.empty()) return state.SkipWithError(a.error.c_str());
  const auto& c = l.model->config();
  speech::TranscribeOptions o;
  o.temperatures = {0.0};
  o.language = f.sp.multilingual() ? "en" : "";
  speech::ModelSpeechInfo info{c.n_mels, l.model->window_frames(), c.target_positions, c.vocab};
  auto tr = speech::Transcriber::create(*f.tok, f.sp, info, f.generation_config, o);
  if (!tr) return state.SkipWithError(("transcriber: " + tr.error().message).c_str());
  double total = 0;
  std::size_t windows = 0, segments = 0, tokens = 0, skipped = 0;
  std::string text;
  for (auto _ : state) {
    windows = segments = tokens = skipped = 0;
    std::vector<speech::Segment> all;
    const auto t0 = SteadyTime::now();
    speech::Checkpoint ck;
    while (!ck.finished) {
      auto w = tr->window(a.pcm, ck, *l.session, nullptr);
      if (!w) return state.SkipWithError(("window: " + w.error().message).c_str());
      ++windows;
      skipped += w->skipped_silence ? 1 : 0;
      for (auto& s : w->segments) {
        tokens += s.tokens.size();
        all.push_back(std::move(s));
      }
      ck = w->next;
    }
    total += seconds_since(t0);
    segments = all.size();
    text = speech::to_text(all);
  }
  const double audio_s = static_cast<double>(a.pcm.size()) / audio::kSampleRate;
  const double rtf = audio_s * static_cast<double>(state.iterations()) / total;
  state.counters["rtf"] = rtf;
  state.counters["audio_s"] = audio_s;
  state.counters["windows"] = static_cast<double>(windows);  // window() calls, the final finished one included
  state.counters["silent"] = static_cast<double>(skipped);
  state.counters["segments"] = static_cast<double>(segments);
  state.counters["seg_tokens"] = static_cast<double>(tokens);
  if (name == "whisper-default") {
    std::string label = text.substr(0, 80);
    for (char& ch : label)
      if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) > 0x7e) ch = '?';
    state.SetLabel(label);
  }
  compare(state, name + "/transcribe", dev, rtf);
}

void register_all() {
  using Fn = void (*)(benchmark::State&, const std::string&, Dev);
  struct Kind { const char* what; Fn fn; bool needs_tokenizer; };
  const Kind kinds[] = {{"encode", bench_encode, false}, {"decode", bench_decode, false},
                        {"window", bench_window, false}, {"transcribe", bench_transcribe, true}};
  for (const char* model : {"whisper-test", "whisper-tiny", "whisper-default"})
    for (const Kind& k : kinds) {
      if (k.needs_tokenizer && std::string(model) == "whisper-tiny") continue;  // no trained tokenizer
      for (Dev dev : {Dev::cpu1, Dev::cpu2, Dev::sim}) {
        const std::string name = std::string("Whisper/") + model + "/" + dev_name(dev) + "/" + k.what;
        const std::string m = model;
        const Fn fn = k.fn;
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { fn(s, m, dev); })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
    }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
