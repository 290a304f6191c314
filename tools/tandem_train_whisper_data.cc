// tandem-train-whisper's data: the grammar, espeak-ng, the windows and their token targets, word error rate
// (tandem_train_whisper_data.h, docs/default-speech-model.md).
#include "tandem_train_whisper_data.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "audio/audio.h"

extern char** environ;

namespace tandem::speechdata {

namespace fs = std::filesystem;

std::uint64_t Rng::next() {
  std::uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
double Rng::uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
double Rng::uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
std::size_t Rng::below(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(next() % n); }
double Rng::normal() {
  const double u1 = std::max(uniform(), 1e-300), u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

namespace {

std::uint64_t mix(std::uint64_t a, std::uint64_t b) {
  Rng r(a * 0x9e3779b97f4a7c15ULL ^ (b + 0x632be59bd9b4e019ULL));
  r.next();
  return r.next();
}

// ---- the grammar ------------------------------------------------------------------------------------------------

struct Noun {
  const char* one;
  const char* many;
};
const Noun kNouns[] = {{"fox", "foxes"},     {"cat", "cats"},     {"dog", "dogs"},       {"bird", "birds"},
                       {"horse", "horses"},  {"mouse", "mice"},   {"frog", "frogs"},     {"bear", "bears"},
                       {"duck", "ducks"},    {"box", "boxes"},    {"ball", "balls"},     {"car", "cars"},
                       {"boat", "boats"},    {"hat", "hats"},     {"cup", "cups"},       {"book", "books"},
                       {"chair", "chairs"},  {"tree", "trees"},   {"house", "houses"},   {"apple", "apples"},
                       {"lamp", "lamps"},    {"key", "keys"},     {"clock", "clocks"},   {"shoe", "shoes"},
                       {"bag", "bags"},      {"train", "trains"}};
const char* kColours[] = {"red", "green", "blue", "yellow", "black", "white", "brown", "orange", "purple", "pink", "grey"};
const char* kAdjectives[] = {"big", "small", "old", "new", "happy", "tiny", "tall", "little", "quiet", "fast"};
const char* kNumbers[] = {"two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"};
struct Verb {
  const char* one;   // after a singular subject
  const char* many;  // after a plural subject
};
const Verb kVerbs[] = {{"sees", "see"},   {"likes", "like"},   {"finds", "find"},     {"takes", "take"},
                       {"wants", "want"}, {"has", "have"},     {"moves", "move"},     {"holds", "hold"},
                       {"follows", "follow"}, {"carries", "carry"}, {"watches", "watch"}, {"pushes", "push"}};
const char* kOneDets[] = {"the", "a", "my", "your", "this", "that", "one"};
const char* kManyDets[] = {"the", "my", "your", "some", "many", "these", "those"};
const char* kPreps[] = {"near", "under", "on", "behind", "in", "with"};
const char* kAdverbs[] = {"today", "again", "now", "here", "there"};

template <class T, std::size_t N>
const T& pick(Rng& r, const T (&a)[N]) {
  return a[r.below(N)];
}

bool vowel_start(const std::string& w) { return !w.empty() && std::strchr("aeiou", w[0]) != nullptr; }

// A noun phrase: determiner (or a number), up to two modifiers (an adjective before a colour), the noun.
void noun_phrase(Rng& r, bool plural, int max_mods, std::vector<std::string>& out) {
  std::vector<std::string> w;
  if (plural) w.push_back(r.chance(0.45) ? pick(r, kNumbers) : pick(r, kManyDets));
  else w.push_back(pick(r, kOneDets));
  const double u = r.uniform();
  const int mods = std::min(max_mods, u < 0.3 ? 0 : u < 0.75 ? 1 : 2);
  if (mods == 2) {
    w.push_back(pick(r, kAdjectives));
    w.push_back(pick(r, kColours));
  } else if (mods == 1) {
    w.push_back(r.chance(0.5) ? pick(r, kAdjectives) : pick(r, kColours));
  }
  const Noun& n = pick(r, kNouns);
  w.push_back(plural ? n.many : n.one);
  if (w[0] == "a" && vowel_start(w[1])) w[0] = "an";
  out.insert(out.end(), w.begin(), w.end());
}

std::string join_sentence(const std::vector<std::string>& w) {
  std::string s;
  for (std::size_t i = 0; i < w.size(); ++i) {
    std::string x = w[i];
    if (i == 0) x[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(x[0])));
    s += (i ? " " : "") + x;
  }
  return s + ".";
}

}  // namespace

std::string sentence(std::uint64_t seed, std::uint64_t index, int max_words) {
  Rng r(mix(seed, index));
  for (;;) {
    std::vector<std::string> w;
    const bool subj_plural = r.chance(0.35);
    noun_phrase(r, subj_plural, 1, w);
    const Verb& v = pick(r, kVerbs);
    w.push_back(subj_plural ? v.many : v.one);
    noun_phrase(r, r.chance(0.4), 2, w);
    const double t = r.uniform();
    if (t < 0.25) {
      w.push_back(pick(r, kPreps));
      w.push_back("the");
      if (r.chance(0.4)) w.push_back(pick(r, kColours));
      w.push_back(pick(r, kNouns).one);
    } else if (t < 0.4) {
      w.push_back(pick(r, kAdverbs));
    }
    if (static_cast<int>(w.size()) <= max_words) return join_sentence(w);
  }
}

std::vector<std::string> vocabulary_sentences() {
  std::vector<std::string> out;
  std::vector<std::string> words;
  for (const auto& n : kNouns) words.insert(words.end(), {n.one, n.many});
  for (const auto& v : kVerbs) words.insert(words.end(), {v.one, v.many});
  for (const char* x : kColours) words.push_back(x);
  for (const char* x : kAdjectives) words.push_back(x);
  for (const char* x : kNumbers) words.push_back(x);
  for (const char* x : kOneDets) words.push_back(x);
  for (const char* x : kManyDets) words.push_back(x);
  for (const char* x : kPreps) words.push_back(x);
  for (const char* x : kAdverbs) words.push_back(x);
  words.push_back("an");
  for (const auto& w : words) {
    std::string cap = w;
    cap[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(cap[0])));
    out.push_back(" " + cap + " " + w + " " + w + ".");
  }
  return out;
}

std::vector<std::string> normalize_words(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '\'') {
      cur += static_cast<char>(std::tolower(c));
    } else if (!cur.empty()) {
      out.push_back(cur);
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

WordErrors word_errors(const std::string& reference, const std::string& hypothesis) {
  const auto r = normalize_words(reference), h = normalize_words(hypothesis);
  std::vector<std::size_t> prev(h.size() + 1), cur(h.size() + 1);
  for (std::size_t j = 0; j <= h.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= r.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= h.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r[i - 1] == h[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return {prev[h.size()], r.size()};
}

// ---- espeak-ng --------------------------------------------------------------------------------------------------

std::string Voice::describe() const {
  return name + " -s " + std::to_string(speed) + " -p " + std::to_string(pitch);
}

Voice voice_for(std::uint64_t seed, std::uint64_t group) {
  // Voices and variants whose pauses are digital silence (the breathy female variants f1-f5 fill them with noise,
  // which the sentence splitter cannot cut; higher pitches stand in for them).
  static const char* kVoices[] = {"en", "en-us", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-us-nyc",
                                  "en-gb-x-gbclan", "en-gb-x-gbcwmd"};
  static const char* kVariants[] = {"m1", "m2", "m3", "m4", "m5", "m6", "m7", "klatt", "klatt2", "klatt4", "croak", "Andy"};
  Rng r(mix(seed ^ 0x766f696365ULL, group));
  Voice v;
  v.name = pick(r, kVoices);
  if (!r.chance(0.4)) v.name += std::string("+") + pick(r, kVariants);
  v.speed = 140 + static_cast<int>(r.below(61));  // 140..200 words per minute (espeak's default 175)
  v.pitch = 25 + static_cast<int>(r.below(56));   // 25..80 (default 50)
  return v;
}

namespace {

// espeak-ng opens its audio output even when it only writes a file, and libpulse, without XDG_RUNTIME_DIR (a
// service, a CI job, `sudo`), makes its runtime directory $TMPDIR/pulse-<id> and leaves it there for good (a link in
// ~/.config/pulse points at it). The children get PULSE_RUNTIME_PATH in a directory of this process's own instead,
// removed at exit. The environment is built once, before the first child, and read-only after.
class SpeakerEnv {
 public:
  SpeakerEnv() {
    for (char** e = environ; *e; ++e) vars_.emplace_back(*e);
    if (!std::getenv("XDG_RUNTIME_DIR") && !std::getenv("PULSE_RUNTIME_PATH")) {
      std::string t = (fs::temp_directory_path() / "tandem-espeak-runtime.XXXXXX").string();
      if (mkdtemp(t.data())) {
        dir_ = t;
        vars_.push_back("PULSE_RUNTIME_PATH=" + (fs::path(dir_) / "pulse").string());
      }
    }
    for (auto& v : vars_) envp_.push_back(v.data());
    envp_.push_back(nullptr);
  }
  ~SpeakerEnv() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  SpeakerEnv(const SpeakerEnv&) = delete;
  SpeakerEnv& operator=(const SpeakerEnv&) = delete;
  char* const* envp() const { return envp_.data(); }

 private:
  std::string dir_;
  std::vector<std::string> vars_;
  std::vector<char*> envp_;
};

const SpeakerEnv& speaker_env() {
  static const SpeakerEnv env;  // thread-safe first use; destroyed (its directory removed) at exit
  return env;
}

// Runs argv[0] with argv, stdout to /dev/null; returns the exit status (-1 when it could not run or was killed).
int run(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), speaker_env().envp());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int st = 0;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void put32(std::string& s, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
}
void put16(std::string& s, std::uint16_t v) {
  s += static_cast<char>(v & 0xff);
  s += static_cast<char>(v >> 8);
}

std::string wav_of(const std::int16_t* x, std::size_t n, int rate) {
  std::string s = "RIFF";
  put32(s, static_cast<std::uint32_t>(36 + 2 * n));
  s += "WAVEfmt ";
  put32(s, 16);
  put16(s, 1);
  put16(s, 1);
  put32(s, static_cast<std::uint32_t>(rate));
  put32(s, static_cast<std::uint32_t>(rate * 2));
  put16(s, 2);
  put16(s, 16);
  s += "data";
  put32(s, static_cast<std::uint32_t>(2 * n));
  s.append(reinterpret_cast<const char*>(x), 2 * n);  // little-endian host (x86-64, aarch64)
  return s;
}

struct Wav16 {
  int rate = 0;
  std::vector<std::int16_t> x;
};

// espeak-ng's output: RIFF, PCM 16-bit mono.
Wav16 parse_wav16(const std::string& b, const std::string& what) {
  auto u32 = [&](std::size_t o) {
    return static_cast<std::uint32_t>(static_cast<unsigned char>(b[o])) |
           static_cast<std::uint32_t>(static_cast<unsigned char>(b[o + 1])) << 8 |
           static_cast<std::uint32_t>(static_cast<unsigned char>(b[o + 2])) << 16 |
           static_cast<std::uint32_t>(static_cast<unsigned char>(b[o + 3])) << 24;
  };
  auto u16 = [&](std::size_t o) {
    return static_cast<std::uint16_t>(static_cast<unsigned char>(b[o]) | static_cast<unsigned char>(b[o + 1]) << 8);
  };
  if (b.size() < 12 || b.compare(0, 4, "RIFF") != 0 || b.compare(8, 4, "WAVE") != 0)
    throw std::runtime_error(what + ": not a WAV file");
  Wav16 w;
  bool fmt = false;
  for (std::size_t o = 12; o + 8 <= b.size();) {
    const std::string id = b.substr(o, 4);
    std::size_t len = u32(o + 4);
    const std::size_t body = o + 8;
    if (id == "fmt " && len >= 16 && body + 16 <= b.size()) {
      if (u16(body) != 1 || u16(body + 2) != 1 || u16(body + 14) != 16)
        throw std::runtime_error(what + ": not 16-bit mono PCM");
      w.rate = static_cast<int>(u32(body + 4));
      fmt = true;
    } else if (id == "data") {
      if (!fmt) throw std::runtime_error(what + ": data before fmt");
      len = std::min(len, b.size() - body);  // --stdout leaves the size unset
      w.x.resize(len / 2);
      std::memcpy(w.x.data(), b.data() + body, w.x.size() * 2);
      return w;
    }
    o = body + len + (len & 1);
  }
  throw std::runtime_error(what + ": no data chunk");
}

// The pieces of `x` between runs of at least `min_gap` exact zeros, each without its zero ends.
std::vector<std::pair<std::size_t, std::size_t>> split_at_pauses(const std::vector<std::int16_t>& x, std::size_t min_gap) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  std::size_t i = 0;
  const std::size_t n = x.size();
  while (i < n && x[i] == 0) ++i;
  while (i < n) {
    std::size_t start = i, last = i;  // last: one past the last non-zero sample seen
    while (i < n) {
      if (x[i] != 0) {
        last = ++i;
        continue;
      }
      std::size_t j = i;
      while (j < n && x[j] == 0) ++j;
      if (j - i >= min_gap || j == n) {
        i = j;
        break;
      }
      i = j;
    }
    out.emplace_back(start, last);
  }
  return out;
}

// 16-bit piece at `rate` → 16 kHz through audio::decode_audio (20 ms of zeros around it for the resampler's edges),
// near-silent ends trimmed, back to int16.
std::vector<std::int16_t> to_16k(const std::int16_t* x, std::size_t n, int rate) {
  const std::size_t pad = static_cast<std::size_t>(rate / 50);
  std::vector<std::int16_t> padded(n + 2 * pad, 0);
  std::copy_n(x, n, padded.begin() + static_cast<std::ptrdiff_t>(pad));
  const std::string wav = wav_of(padded.data(), padded.size(), rate);
  auto pcm = audio::decode_audio(std::span(reinterpret_cast<const std::uint8_t*>(wav.data()), wav.size()));
  if (!pcm) throw std::runtime_error("decode_audio: " + pcm.error().message);
  const auto& s = pcm->samples;
  std::size_t b = 0, e = s.size();
  const float floor = 2.0F / 32767.0F;
  while (b < e && std::fabs(s[b]) < floor) ++b;
  while (e > b && std::fabs(s[e - 1]) < floor) --e;
  std::vector<std::int16_t> out(e - b);
  for (std::size_t i = b; i < e; ++i)
    out[i - b] = static_cast<std::int16_t>(std::lround(std::clamp(s[i], -1.0F, 1.0F) * 32767.0F));
  return out;
}

std::vector<std::string> espeak_args(const std::string& espeak, const Voice& v, const std::string& wav) {
  return {espeak, "-v", v.name, "-s", std::to_string(v.speed), "-p", std::to_string(v.pitch), "-w", wav};
}

}  // namespace

std::string speak_wav(const std::string& espeak, const std::string& text, const Voice& voice, const std::string& tmp) {
  static std::atomic<std::uint64_t> counter{0};
  const fs::path wav = fs::path(tmp) / ("say-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + ".wav");
  auto args = espeak_args(espeak, voice, wav.string());
  args.push_back(text);
  if (run(args) != 0) throw std::runtime_error("espeak-ng failed (" + voice.describe() + "): " + text);
  std::string b = read_file(wav);
  fs::remove(wav);
  return b;
}

std::vector<Utterance> synthesize(const std::string& espeak, std::uint64_t seed, std::uint64_t first, std::size_t count,
                                  std::size_t group, double max_seconds, const std::vector<std::string>* exclude,
                                  int jobs, const std::string& tmp, SynthStats& stats) {
  std::set<std::string> skip;
  if (exclude) skip.insert(exclude->begin(), exclude->end());
  std::vector<std::string> texts;
  for (std::uint64_t i = first; i < first + count; ++i) {
    std::string s = sentence(seed, i);
    if (!skip.count(s)) texts.push_back(std::move(s));
  }
  group = std::max<std::size_t>(group, 1);
  const std::size_t groups = (texts.size() + group - 1) / group;
  std::vector<std::vector<Utterance>> out(groups);
  std::atomic<std::size_t> next{0};
  std::mutex mu;
  std::string error;
  std::size_t fallbacks = 0, calls = 0;
  auto worker = [&] {
    for (;;) {
      const std::size_t g = next++;
      if (g >= groups) return;
      try {
        const Voice v = voice_for(seed, first / group + g);
        const std::size_t b = g * group, e = std::min(texts.size(), b + group);
        const fs::path base = fs::path(tmp) / ("g" + std::to_string(seed % 100000) + "-" + std::to_string(first + b));
        {
          std::ofstream f(base.string() + ".txt", std::ios::binary | std::ios::trunc);
          for (std::size_t i = b; i < e; ++i) f << texts[i] << "\n";
          if (!f) throw std::runtime_error("cannot write " + base.string() + ".txt");
        }
        auto args = espeak_args(espeak, v, base.string() + ".wav");
        args.insert(args.end(), {"-f", base.string() + ".txt"});
        if (run(args) != 0) throw std::runtime_error("espeak-ng failed: " + v.describe());
        const Wav16 w = parse_wav16(read_file(base.string() + ".wav"), base.string() + ".wav");
        fs::remove(base.string() + ".wav");
        fs::remove(base.string() + ".txt");
        std::size_t local_calls = 1;
        const auto pieces = split_at_pauses(w.x, static_cast<std::size_t>(w.rate / 5));
        std::vector<Utterance> us;
        if (pieces.size() == e - b) {
          for (std::size_t i = b; i < e; ++i) {
            const auto [p0, p1] = pieces[i - b];
            us.push_back({texts[i], v, to_16k(w.x.data() + p0, p1 - p0, w.rate)});
          }
        } else {
          std::lock_guard l(mu);
          ++fallbacks;
        }
        if (us.empty()) {
          for (std::size_t i = b; i < e; ++i) {
            const Wav16 one = parse_wav16(speak_wav(espeak, texts[i], v, tmp), "espeak-ng output");
            ++local_calls;
            std::size_t p0 = 0, p1 = one.x.size();
            while (p0 < p1 && one.x[p0] == 0) ++p0;
            while (p1 > p0 && one.x[p1 - 1] == 0) --p1;
            us.push_back({texts[i], v, to_16k(one.x.data() + p0, p1 - p0, one.rate)});
          }
        }
        std::lock_guard l(mu);
        calls += local_calls;
        out[g] = std::move(us);
      } catch (const std::exception& ex) {
        std::lock_guard l(mu);
        if (error.empty()) error = ex.what();
        next = groups;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int j = 1; j < std::max(jobs, 1); ++j) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (!error.empty()) throw std::runtime_error(error);
  std::vector<Utterance> all;
  for (auto& g : out)
    for (auto& u : g) {
      if (u.seconds() > max_seconds || u.pcm.empty()) {
        ++stats.dropped_long;
        continue;
      }
      stats.seconds += u.seconds();
      all.push_back(std::move(u));
    }
  stats.calls += calls;
  stats.split_fallbacks += fallbacks;
  return all;
}

// ---- windows ----------------------------------------------------------------------------------------------------

std::int32_t Specials::timestamp(double seconds) const {
  const long k = std::lround(std::max(0.0, seconds) / 0.02);
  return timestamp_begin + static_cast<std::int32_t>(std::min(k, 1500L));
}

namespace {

struct Seq {
  std::vector<std::int32_t> tok;
  std::vector<bool> learn;  // tok[i] is a target (predicted from tok[i-1])
  void add(std::int32_t t, bool l) {
    tok.push_back(t);
    learn.push_back(l);
  }
};

void finish(Example& e, const Seq& s, std::int32_t first_label_override = -1, std::size_t override_at = 0) {
  e.input.assign(s.tok.begin(), s.tok.end() - 1);
  e.labels.assign(e.input.size(), kIgnore);
  for (std::size_t i = 1; i < s.tok.size(); ++i)
    if (s.learn[i]) e.labels[i - 1] = s.tok[i];
  if (first_label_override >= 0) e.labels[override_at] = first_label_override;
}

void add_audio(std::vector<float>& dst, std::size_t at, const std::vector<std::int16_t>& src, float gain) {
  for (std::size_t i = 0; i < src.size() && at + i < dst.size(); ++i)
    dst[at + i] += gain * static_cast<float>(src[i]) * (1.0F / 32767.0F);
}

}  // namespace

Example compose(Rng& rng, const std::vector<Utterance>& pool, const std::vector<TextIds>& ids, const Specials& sp,
                const Mix& mix, std::size_t window_samples, std::size_t max_tokens) {
  Example e;
  e.pcm.assign(window_samples, 0.0F);
  const double W = static_cast<double>(window_samples) / 16000.0;
  const float gain = static_cast<float>(std::exp(rng.uniform(std::log(0.15), std::log(1.2))));
  Seq s;
  // The <|startofprev|> prompt as speech::Transcriber builds it from earlier windows: their tokens (timestamped
  // segments or text), at most max_tokens / 2 − 1 of the last ones; never learned.
  if (rng.chance(mix.p_prev)) {
    const bool ts = rng.chance(0.6);
    std::vector<std::int32_t> prev;
    for (std::size_t k = 0, n = 1 + rng.below(3); k < n; ++k) {
      const std::size_t u = rng.below(ids.size());
      const double start = rng.uniform(0.0, 1.0);
      if (ts) prev.push_back(sp.timestamp(start));
      prev.insert(prev.end(), ids[u].begin(), ids[u].end());
      if (ts) prev.push_back(sp.timestamp(start + pool[u].seconds()));
    }
    const std::size_t cap = std::max<std::size_t>(max_tokens / 2, 2) - 1;
    const std::size_t keep = std::min(prev.size(), std::min(cap, 4 + rng.below(cap)));
    s.add(sp.startofprev, false);
    for (std::size_t i = prev.size() - keep; i < prev.size(); ++i) s.add(prev[i], false);
  }
  const std::size_t prompt_at = s.tok.size();  // the index of <|startoftranscript|>
  s.add(sp.sot, false);
  s.add(sp.en, true);
  s.add(sp.transcribe, false);
  e.timestamps = !rng.chance(mix.p_notimestamps);
  const bool silence = rng.chance(mix.p_silence);
  if (!e.timestamps) s.add(sp.notimestamps, false);
  if (silence) {
    e.silence = true;
    const double level = std::exp(rng.uniform(std::log(1e-4), std::log(3e-3)));
    if (rng.chance(0.5))
      for (auto& x : e.pcm) x = static_cast<float>(level * rng.normal());
    s.add(sp.eot, true);
    finish(e, s, sp.nospeech, prompt_at);
    return e;
  }
  // First sentence after a lead of silence; it always fits (the pool holds sentences up to W − 0.2 s).
  const double lead = rng.uniform(0.0, mix.max_lead);
  std::size_t u1 = rng.below(pool.size());
  for (int t = 0; t < 8 && lead + pool[u1].seconds() > W - 0.05; ++t) u1 = rng.below(pool.size());
  const double s1 = lead + pool[u1].seconds() > W - 0.05 ? 0.0 : lead;
  const auto at1 = static_cast<std::size_t>(std::lround(s1 * 16000));
  add_audio(e.pcm, at1, pool[u1].pcm, gain);
  const double e1 = s1 + pool[u1].seconds();
  struct Seg {
    double start, end;
    std::size_t u;
  };
  std::vector<Seg> segs{{s1, e1, u1}};
  bool cut = false;
  double cut_start = 0;
  if (rng.chance(mix.p_second)) {
    const double s2 = e1 + rng.uniform(0.15, 0.7);
    const std::size_t u2 = rng.below(pool.size());
    const double e2 = s2 + pool[u2].seconds();
    if (e2 <= W - 0.05) {
      add_audio(e.pcm, static_cast<std::size_t>(std::lround(s2 * 16000)), pool[u2].pcm, gain);
      segs.push_back({s2, e2, u2});
    } else if (e.timestamps && s2 < W - 0.3) {
      add_audio(e.pcm, static_cast<std::size_t>(std::lround(s2 * 16000)), pool[u2].pcm, gain);
      cut = true;
      cut_start = s2;
    }
  }
  if (rng.chance(mix.p_noise)) {
    const double level = std::exp(rng.uniform(std::log(1e-4), std::log(3e-3)));
    for (auto& x : e.pcm) x += static_cast<float>(level * rng.normal());
  }
  for (auto& x : e.pcm) x = std::clamp(x, -1.0F, 1.0F);
  // The body; a second segment or the prompt goes when the text positions cannot hold them.
  auto body_len = [&](std::size_t nseg) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < nseg; ++i) n += ids[segs[i].u].size() + (e.timestamps ? 2 : 0);
    return n + (cut ? 1 : 0) + 1;
  };
  while (s.tok.size() + body_len(segs.size()) > max_tokens + 1 && segs.size() > 1) {
    segs.pop_back();
    cut = false;
  }
  for (const Seg& g : segs) {
    if (e.timestamps) s.add(sp.timestamp(g.start), true);
    for (std::int32_t t : ids[g.u]) s.add(t, true);
    e.ctc.insert(e.ctc.end(), ids[g.u].begin(), ids[g.u].end());
    if (e.timestamps) s.add(sp.timestamp(g.end), true);
    e.text += (e.text.empty() ? "" : " ") + pool[g.u].text;
  }
  if (cut) s.add(sp.timestamp(cut_start), true);
  s.add(sp.eot, true);
  if (s.tok.size() > max_tokens + 1) {  // only a long prompt can get here: drop it
    Seq t;
    for (std::size_t i = prompt_at; i < s.tok.size(); ++i) t.add(s.tok[i], s.learn[i]);
    s = std::move(t);
  }
  e.segments = static_cast<int>(segs.size());
  e.cut = cut;
  finish(e, s);
  return e;
}

Example single(const Utterance& u, const TextIds& ids, const Specials& sp, std::size_t window_samples,
               bool timestamps) {
  Example e;
  e.pcm.assign(window_samples, 0.0F);
  const double lead = 0.3;
  add_audio(e.pcm, static_cast<std::size_t>(lead * 16000), u.pcm, 1.0F);
  Seq s;
  s.add(sp.sot, false);
  s.add(sp.en, true);
  s.add(sp.transcribe, false);
  e.timestamps = timestamps;
  if (!timestamps) s.add(sp.notimestamps, false);
  if (timestamps) s.add(sp.timestamp(lead), true);
  for (std::int32_t t : ids) s.add(t, true);
  e.ctc = ids;
  if (timestamps) s.add(sp.timestamp(lead + u.seconds()), true);
  s.add(sp.eot, true);
  e.text = u.text;
  e.segments = 1;
  finish(e, s);
  return e;
}

std::string wav_bytes(const std::vector<float>& pcm, int rate) {
  std::vector<std::int16_t> x(pcm.size());
  for (std::size_t i = 0; i < pcm.size(); ++i)
    x[i] = static_cast<std::int16_t>(std::lround(std::clamp(pcm[i], -1.0F, 1.0F) * 32767.0F));
  return wav_of(x.data(), x.size(), rate);
}

std::string write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) throw std::runtime_error("cannot write " + path);
  return path;
}

void render_heldout(const std::string& dir, int n, const std::string& espeak, int train_sentences) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create " + dir + ": " + ec.message());
  // The held-out stream minus the default run's training sentences (as the tool's own held-out set).
  std::set<std::string> train;
  for (int i = 0; i < train_sentences; ++i) train.insert(sentence(kTrainSeed, static_cast<std::uint64_t>(i)));
  std::string list;
  std::uint64_t idx = 0;
  for (int done = 0; done < n; ++idx) {
    const std::string text = sentence(kHeldoutSeed, idx);
    if (train.count(text)) continue;
    // The first file is espeak-ng's plain default voice (what `espeak-ng "..."` speaks); the others vary.
    Voice v = done == 0 ? Voice{"en", 175, 50} : voice_for(kHeldoutSeed, 1000000 + idx);
    char name[32];
    std::snprintf(name, sizeof name, "%04d.wav", done);
    write_text((fs::path(dir) / name).string(), speak_wav(espeak, text, v, dir));
    list += std::string(name) + "\t" + text + "\t" + v.describe() + "\n";
    ++done;
  }
  write_text((fs::path(dir) / "transcripts.txt").string(), list);
}

std::vector<float> with_silence(const std::vector<const Utterance*>& us, double lead, double gap, double tail) {
  std::vector<float> pcm(static_cast<std::size_t>(lead * 16000), 0.0F);
  for (std::size_t i = 0; i < us.size(); ++i) {
    if (i) pcm.resize(pcm.size() + static_cast<std::size_t>(gap * 16000), 0.0F);
    for (auto x : us[i]->pcm) pcm.push_back(static_cast<float>(x) / 32767.0F);
  }
  pcm.resize(pcm.size() + static_cast<std::size_t>(tail * 16000), 0.0F);
  return pcm;
}

}  // namespace tandem::speechdata
