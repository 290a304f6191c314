// tandem-train-whisper: trains the bundled default speech model (Hugging Face WhisperForConditionalGeneration layout,
// small and with a short window) on sentences of a small English grammar spoken by espeak-ng, so that the demo can
// transcribe a sentence espeak-ng speaks. Writes the model with modelgen::write_whisper_model, a Whisper tokenizer
// trained on the grammar (tok::write_whisper_tokenizer, English only), preprocessor_config.json for the window,
// generation_config.json and training.json.
//
// The forward pass is torch::nn modules named and computed as transformers' Whisper (conv1/conv2 + erf GELU,
// sinusoidal encoder positions, pre-LN layers, k_proj without bias, q scaled by head_dim^-0.5, learned decoder
// positions, cross-attention, final layer norms, logits tied to embed_tokens), so the parameters' names are the HF
// tensor names and engine::WhisperModel loads them unchanged; the tool checks that, then measures the held-out word
// error rate through speech::Transcriber on the engine (the daemon's path). Deterministic for a given (seed, steps,
// thread count, library versions) unless --seconds cuts it short. docs/default-speech-model.md.
#include <torch/torch.h>

#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "audio/mel.h"
#include "cli_args.h"
#include "train_util.h"
#include "core/text.h"
#include "engine/whisper.h"
#include "modelgen/whisper_writer.h"
#include "speech/transcriber.h"
#include "tandem_train_whisper_data.h"
#include "tandem_train_whisper_model.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/whisper_tokens.h"
#include "weights/whisper_layout.h"

namespace {

namespace fs = std::filesystem;
namespace sd = tandem::speechdata;
using TrainTimer = std::chrono::steady_clock;

const char* kUsage =
    "usage: tandem-train-whisper --out DIR [options]\n"
    "       tandem-train-whisper --render DIR N\n"
    "Trains the default speech model (Whisper layout, 4-s window) on generated sentences spoken by espeak-ng and\n"
    "writes it (config.json, model.safetensors, preprocessor_config.json, generation_config.json, tokenizer.json,\n"
    "tokenizer_config.json) plus training.json; checks that engine::WhisperModel reproduces the training forward and\n"
    "measures the held-out word error rate through speech::Transcriber on the engine.\n"
    "  --steps N          optimizer steps (default 6000: ~15 min on 2 idle cores)\n"
    "  --seconds S        also stop within S seconds of training: after 20 steps the step count is lowered to fit\n"
    "                     (the schedule follows); the result then depends on machine speed. Default 3600 (0 = none)\n"
    "  --quick            a short run for tests: 16 sentences, 20 steps of batch 8, 1 thread, no time cap\n"
    "  --seed N           init and window-choice seed (default 1)\n"
    "  --threads N        worker threads, each taking a share of the batch (default 2; the float results depend on it)\n"
    "  --batch N          windows per step (default 8)\n"
    "  --lr X             peak learning rate of AdamW (default 0.002; warmup, cosine decay to 5%)\n"
    "  --ctc-weight X     weight of the auxiliary CTC loss on the encoder output (default 1; 0 = none)\n"
    "  --sentences N      training sentences spoken (default 4800)\n"
    "  --heldout N        held-out sentences transcribed at the end (default 200)\n"
    "  --eval-every N     held-out teacher-forced loss every N steps (default 100; 0 = none)\n"
    "  --espeak PATH      the espeak-ng program (default espeak-ng)\n"
    "  --quiet            no progress lines on stderr\n"
    "  --render DIR N     speak N held-out sentences into DIR (0000.wav ...) with transcripts.txt and exit\n";

struct Config {
  std::string out;
  int steps = 6000;
  double seconds = 3600;
  bool quick = false;
  std::uint64_t seed = 1;
  int threads = 2;
  int batch = 8;
  double lr = 2e-3;
  double weight_decay = 0.05;
  double min_lr_frac = 0.05;
  double clip = 1.0;
  double ctc_weight = 1.0;  // the auxiliary CTC loss on the encoder (training only; its head is not written)
  int sentences = 4800;
  int heldout = 200;
  int eval_every = 100;
  bool quiet = false;
  std::string espeak = "espeak-ng";
  std::string render_dir;
  int render_n = 0;
  // The shape (docs/default-speech-model.md).
  int d_model = 192, layers_enc = 2, layers_dec = 2, heads = 4, ffn = 768, window_s = 4, target = 96;
  int vocab_tokens = 600;
};

struct TrainError {
  std::string message;
};

using tandem::train::cpu_model;
using tandem::train::fmt;
using tandem::train::seconds_since;

using namespace tandem::trainwhisper;

// ---- batches ----------------------------------------------------------------------------------------------------

struct Batch {
  torch::Tensor mel, ids, labels;  // [B, n_mels, frames], [B, T] (padded with eot), [B, T] (padded with kIgnore)
  torch::Tensor ctc, ctc_len, ctc_mask;  // [B, L] CTC classes (text id + 1), [B] lengths, [B] 1 = used
};

Batch make_batch(const std::vector<const sd::Example*>& ex, const tandem::audio::LogMel& mel, int n_mels,
                 std::int64_t frames, std::int32_t pad) {
  const auto B = static_cast<std::int64_t>(ex.size());
  std::int64_t T = 0;
  for (const auto* e : ex) T = std::max<std::int64_t>(T, static_cast<std::int64_t>(e->input.size()));
  Batch b;
  b.mel = torch::empty({B, n_mels, frames});
  b.ids = torch::full({B, T}, pad, torch::kLong);
  b.labels = torch::full({B, T}, sd::kIgnore, torch::kLong);
  float* m = b.mel.data_ptr<float>();
  auto ia = b.ids.accessor<std::int64_t, 2>();
  auto la = b.labels.accessor<std::int64_t, 2>();
  for (std::int64_t i = 0; i < B; ++i) {
    const sd::Example& e = *ex[static_cast<std::size_t>(i)];
    const std::vector<float> w = mel.window(e.pcm, 0, e.pcm.size());
    if (static_cast<std::int64_t>(w.size()) != n_mels * frames) throw TrainError{"internal: mel window size"};
    m = std::copy(w.begin(), w.end(), m);
    for (std::size_t j = 0; j < e.input.size(); ++j) {
      ia[i][static_cast<std::int64_t>(j)] = e.input[j];
      la[i][static_cast<std::int64_t>(j)] = e.labels[j];
    }
  }
  std::int64_t L = 1;
  for (const auto* e : ex) L = std::max<std::int64_t>(L, static_cast<std::int64_t>(e->ctc.size()));
  b.ctc = torch::ones({B, L}, torch::kLong);
  b.ctc_len = torch::zeros({B}, torch::kLong);
  b.ctc_mask = torch::zeros({B});
  auto ca = b.ctc.accessor<std::int64_t, 2>();
  for (std::int64_t i = 0; i < B; ++i) {
    const sd::Example& e = *ex[static_cast<std::size_t>(i)];
    for (std::size_t j = 0; j < e.ctc.size(); ++j) ca[i][static_cast<std::int64_t>(j)] = e.ctc[j] + 1;
    b.ctc_len[i] = static_cast<std::int64_t>(e.ctc.size());
    b.ctc_mask[i] = e.cut ? 0.0 : 1.0;  // a cut-off sentence is heard but not in the target
  }
  return b;
}

std::int64_t label_count(const std::vector<const sd::Example*>& ex) {
  std::int64_t n = 0;
  for (const auto* e : ex)
    for (auto l : e->labels) n += l != sd::kIgnore;
  return n;
}

// Runs f(w) for w in [0, workers) on that many threads, rethrowing the first failure.
void run_workers(int workers, const std::function<void(int)>& f) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(workers));
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back([&, w] {
    try {
      f(w);
    } catch (...) {
      errors[static_cast<std::size_t>(w)] = std::current_exception();
    }
  });
  try {
    f(0);
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (auto& t : pool) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

std::pair<std::size_t, std::size_t> slice(std::size_t n, int w, int workers) {
  return {n * static_cast<std::size_t>(w) / static_cast<std::size_t>(workers),
          n * static_cast<std::size_t>(w + 1) / static_cast<std::size_t>(workers)};
}

// Teacher-forced held-out loss and token accuracy on fixed windows (training forward).
std::pair<double, double> heldout_loss(Whisper& m, const std::vector<sd::Example>& ex, const tandem::audio::LogMel& mel,
                                       int n_mels, std::int64_t frames, std::int32_t pad) {
  torch::NoGradGuard ng;
  double loss = 0, right = 0, n = 0;
  for (std::size_t b = 0; b < ex.size(); b += 16) {
    std::vector<const sd::Example*> part;
    for (std::size_t i = b; i < std::min(ex.size(), b + 16); ++i) part.push_back(&ex[i]);
    const Batch bt = make_batch(part, mel, n_mels, frames, pad);
    const torch::Tensor logits = m->forward(bt.mel, bt.ids);
    const torch::Tensor flat = logits.reshape({-1, logits.size(-1)}), lab = bt.labels.reshape({-1});
    loss += torch::nn::functional::cross_entropy(
                flat, lab, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(sd::kIgnore).reduction(torch::kSum))
                .item<double>();
    const torch::Tensor valid = lab.ne(sd::kIgnore);
    right += (flat.argmax(-1).eq(lab) & valid).sum().item<double>();
    n += valid.sum().item<double>();
  }
  return {loss / std::max(n, 1.0), right / std::max(n, 1.0)};
}

// ---- the engine: equivalence check and transcription --------------------------------------------------------------

struct Transcript {
  std::string reference, hypothesis, voice;
  double seconds = 0;  // the audio's length
  std::vector<tandem::speech::Segment> segments;
};

int render_mode(const Config& c) {
  try {
    sd::render_heldout(c.render_dir, c.render_n, c.espeak, Config{}.sentences);
    if (!c.quiet) std::fprintf(stderr, "wrote %d held-out sentences to %s\n", c.render_n, c.render_dir.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-train-whisper: %s\n", e.what());
  }
  return 1;
}

// Transcribes `pcm` (16 kHz) window by window through speech::Transcriber on an engine session.
std::vector<tandem::speech::Segment> transcribe(const tandem::speech::Transcriber& tr, tandem::engine::WhisperSession& s,
                                                const std::vector<float>& pcm) {
  tandem::speech::Checkpoint ck;
  std::vector<tandem::speech::Segment> out;
  for (int guard = 0; !ck.finished && guard < 1000; ++guard) {
    auto r = tr.window(pcm, ck, s, nullptr);
    if (!r) throw TrainError{"speech::Transcriber: " + r.error().message};
    out.insert(out.end(), r->segments.begin(), r->segments.end());
    ck = r->next;
  }
  return out;
}

struct WerResult {
  sd::WordErrors errors;
  std::size_t files = 0, exact = 0;
  double audio_seconds = 0, wall_seconds = 0;
  std::vector<Transcript> samples;
  double wer() const { return errors.words ? static_cast<double>(errors.errors) / static_cast<double>(errors.words) : 0; }
};

std::string wer_json(const WerResult& w) {
  std::ostringstream j;
  j << "{\"wer\": " << fmt(w.wer()) << ", \"word_errors\": " << w.errors.errors << ", \"words\": " << w.errors.words
    << ", \"files\": " << w.files << ", \"exact_files\": " << w.exact << ", \"audio_seconds\": " << fmt(w.audio_seconds)
    << ", \"engine_seconds\": " << fmt(w.wall_seconds) << ", \"real_time_factor\": "
    << fmt(w.wall_seconds > 0 ? w.audio_seconds / w.wall_seconds : 0) << "}";
  return j.str();
}

int run_training(const Config& c) {
  using namespace tandem;
  const auto t_start = TrainTimer::now();
  std::string tmp;
  try {
    // As tandem-train-clip: single-threaded ATen and OpenBLAS in each worker, large buffers kept in the heap.
    at::set_num_threads(1);
    using SetThreads = void (*)(int);
    if (const auto ob = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) ob(1);
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    std::error_code ec;
    fs::create_directories(c.out, ec);
    if (ec) throw TrainError{"cannot create " + c.out + ": " + ec.message()};
    {
      std::string t = (fs::temp_directory_path() / "tandem-train-whisper.XXXXXX").string();
      if (!mkdtemp(t.data())) throw TrainError{"cannot create a temporary directory"};
      tmp = t;
    }

    // 1. Speech: the training sentences, then held-out sentences that are not among them.
    const double W = c.window_s;
    const auto window_samples = static_cast<std::size_t>(c.window_s * 16000);
    const double max_speech = W - 0.35;  // the evaluation window puts 0.3 s before the sentence
    sd::SynthStats train_stats, held_stats;
    const auto t_synth = TrainTimer::now();
    std::vector<sd::Utterance> pool = sd::synthesize(c.espeak, sd::kTrainSeed, 0, static_cast<std::size_t>(c.sentences), 25,
                                                     max_speech, nullptr, c.threads, tmp, train_stats);
    std::vector<std::string> train_texts;
    for (int i = 0; i < c.sentences; ++i) train_texts.push_back(sd::sentence(sd::kTrainSeed, static_cast<std::uint64_t>(i)));
    std::vector<sd::Utterance> held = sd::synthesize(c.espeak, sd::kHeldoutSeed, 0,
                                                     static_cast<std::size_t>(c.heldout + c.heldout / 5 + 4), 10,
                                                     max_speech, &train_texts, c.threads, tmp, held_stats);
    if (static_cast<int>(held.size()) > c.heldout) held.resize(static_cast<std::size_t>(c.heldout));
    if (pool.size() < 2 || held.empty()) throw TrainError{"espeak-ng gave too few sentences"};
    const double synth_seconds = seconds_since(t_synth);
    if (!c.quiet)
      std::fprintf(stderr, "tandem-train-whisper: %zu training sentences (%.0f s of speech, %zu espeak-ng calls, %zu "
                   "dropped as too long) and %zu held-out in %.1f s\n", pool.size(), train_stats.seconds,
                   train_stats.calls, train_stats.dropped_long, held.size(), synth_seconds);

    // 2. The tokenizer: byte-level BPE on the training sentences and the grammar's words, English only.
    std::vector<std::string> corpus = sd::vocabulary_sentences();
    for (const auto& t : train_texts) corpus.push_back(" " + t);
    auto vocab_r = tok::write_whisper_tokenizer(c.out, corpus, {static_cast<std::size_t>(c.vocab_tokens), 1});
    if (!vocab_r) throw TrainError{"tokenizer: " + vocab_r.error().message};
    auto tokr = tok::load_tokenizer_files(c.out);
    if (!tokr) throw TrainError{"reading back the tokenizer: " + tokr.error().message};
    const tok::Tokenizer& tokenizer = *tokr;
    auto spr = tok::whisper_specials(tokenizer, *vocab_r);
    if (!spr) throw TrainError{"tokenizer specials: " + spr.error().message};
    const tok::WhisperSpecials& wsp = *spr;
    if (wsp.languages.size() != 1) throw TrainError{"internal: the tokenizer should have exactly one language"};
    sd::Specials sp;
    sp.eot = wsp.eot, sp.sot = wsp.sot, sp.en = wsp.languages[0], sp.transcribe = wsp.transcribe;
    sp.startofprev = wsp.startofprev, sp.nospeech = wsp.nospeech, sp.notimestamps = wsp.notimestamps;
    sp.timestamp_begin = wsp.timestamp_begin;
    auto ids_of = [&](const std::vector<sd::Utterance>& us) {
      std::vector<sd::TextIds> v;
      for (const auto& u : us) {
        const auto t = tok::whisper_text_ids(tokenizer, " " + u.text);
        v.emplace_back(t.begin(), t.end());
      }
      return v;
    };
    const std::vector<sd::TextIds> pool_ids = ids_of(pool), held_ids = ids_of(held);
    std::size_t max_text = 0;
    for (const auto& v : pool_ids) max_text = std::max(max_text, v.size());

    // 3. The shape.
    modelgen::WhisperShape shape;
    shape.d_model = c.d_model;
    shape.encoder_layers = c.layers_enc;
    shape.decoder_layers = c.layers_dec;
    shape.encoder_heads = shape.decoder_heads = c.heads;
    shape.encoder_ffn = shape.decoder_ffn = c.ffn;
    shape.n_mels = 80;
    shape.source_positions = c.window_s * 50;
    shape.target_positions = c.target;
    shape.vocab = *vocab_r;
    shape.eos_id = shape.bos_id = shape.pad_id = wsp.eot;
    shape.decoder_start_id = wsp.sot;
    shape.no_timestamps_id = wsp.notimestamps;
    const weights::WhisperConfig cfg = shape.config();
    const std::int64_t frames = cfg.window_frames();
    const audio::LogMel mel(audio::MelSpec{cfg.n_mels, 400, 160, audio::kSampleRate});

    // 4. The model, its replicas (same storage, their own autograd leaves) and the optimizer.
    torch::manual_seed(c.seed);
    Whisper model(cfg);
    init_weights(model, cfg);
    const int workers = std::min(c.threads, c.batch);
    std::vector<Whisper> reps{model};
    for (int w = 1; w < workers; ++w) {
      Whisper r(cfg);
      auto src = model->named_parameters();
      for (auto& item : r->named_parameters()) {
        item.value().set_data(src[item.key()]);
        item.value().set_requires_grad(src[item.key()].requires_grad());
      }
      reps.push_back(r);
    }
    // The auxiliary CTC head over the encoder output: blank + the text tokens (ids below <|endoftext|>).
    const int ctc_classes = wsp.eot + 1;
    std::vector<torch::nn::Linear> ctc_heads{torch::nn::Linear(cfg.d_model, ctc_classes)};
    {
      torch::NoGradGuard ng;
      ctc_heads[0]->weight.normal_(0, 0.02);
      ctc_heads[0]->bias.zero_();
    }
    for (int w = 1; w < workers; ++w) {
      torch::nn::Linear h(cfg.d_model, ctc_classes);
      h->weight.set_data(ctc_heads[0]->weight);
      h->bias.set_data(ctc_heads[0]->bias);
      ctc_heads.push_back(h);
    }
    std::vector<torch::Tensor> decay, no_decay, trained;
    std::int64_t n_params = 0;
    for (auto& item : model->named_parameters()) {
      n_params += item.value().numel();
      if (!item.value().requires_grad()) continue;
      trained.push_back(item.value());
      (item.value().dim() >= 2 ? decay : no_decay).push_back(item.value());
    }
    if (c.ctc_weight > 0) {
      decay.push_back(ctc_heads[0]->weight);
      no_decay.push_back(ctc_heads[0]->bias);
      trained.push_back(ctc_heads[0]->weight);
      trained.push_back(ctc_heads[0]->bias);
    }
    using torch::optim::AdamW;
    using torch::optim::AdamWOptions;
    auto adamw = [&](double wd) {
      return std::make_unique<AdamWOptions>(AdamWOptions(c.lr).betas({0.9, 0.98}).eps(1e-6).weight_decay(wd));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, adamw(c.weight_decay));
    groups.emplace_back(no_decay, adamw(0));
    AdamW opt(std::move(groups), AdamWOptions(c.lr));
    int steps = c.steps;
    int warmup = std::max(1, steps / 12);
    auto lr_at = [&](int step) {
      if (step < warmup) return c.lr * (step + 1) / warmup;
      const double t = steps > warmup ? static_cast<double>(step - warmup) / (steps - warmup) : 1.0;
      return c.lr * (c.min_lr_frac + (1.0 - c.min_lr_frac) * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, t))));
    };

    // Held-out windows composed as in training (two sentences, cut-off sentences, prompts, silence).
    const sd::Mix mix;
    const auto max_tokens = static_cast<std::size_t>(cfg.target_positions);
    std::vector<sd::Example> held_windows;
    {
      sd::Rng hr(sd::kHeldoutSeed);
      for (int i = 0; i < std::min(64, 4 * static_cast<int>(held.size())); ++i)
        held_windows.push_back(sd::compose(hr, held, held_ids, sp, mix, window_samples, max_tokens));
    }
    if (!c.quiet)
      std::fprintf(stderr, "tandem-train-whisper: tokenizer %d tokens (longest sentence %zu text tokens); model d %d, "
                   "%d+%d layers, %d heads, ffn %d, %d-s window (%lld source positions), %d text positions: %.2fM "
                   "parameters\n", *vocab_r, max_text, cfg.d_model, cfg.encoder_layers, cfg.decoder_layers, c.heads,
                   c.ffn, c.window_s, static_cast<long long>(cfg.source_positions), cfg.target_positions,
                   static_cast<double>(n_params) / 1e6);

    // 5. Training: step s draws its windows from Rng(seed) in order; each worker computes the log-mels, forward and
    //    backward of its share; the gradients are summed into the master copy.
    sd::Rng rng(c.seed * 0x9e3779b97f4a7c15ULL + 17);
    std::vector<std::pair<int, double>> curve, held_curve;
    const auto t_train = TrainTimer::now();
    double loss_ema = 0, last_loss = 0, first_loss = 0, el_at_5 = 0;
    constexpr int kPlanAt = 20;
    int done = 0;
    bool cut = false;
    std::size_t windows_seen = 0;
    for (int step = 0; step < steps; ++step) {
      std::vector<sd::Example> ex;
      for (int i = 0; i < c.batch; ++i) ex.push_back(sd::compose(rng, pool, pool_ids, sp, mix, window_samples, max_tokens));
      windows_seen += ex.size();
      std::vector<const sd::Example*> all;
      for (const auto& e : ex) all.push_back(&e);
      const double n_labels = static_cast<double>(label_count(all));
      const double lr = lr_at(step);
      for (auto& g : opt.param_groups()) static_cast<AdamWOptions&>(g.options()).lr(lr);
      for (auto& r : reps)
        for (auto& p : r->parameters()) p.mutable_grad().reset();
      for (auto& h : ctc_heads)
        for (auto& p : h->parameters()) p.mutable_grad().reset();
      double n_ctc = 0;
      for (const auto* e : all) n_ctc += e->cut ? 0 : 1;
      std::vector<double> losses(static_cast<std::size_t>(workers), 0.0);
      run_workers(workers, [&](int w) {
        const auto [b0, b1] = slice(all.size(), w, workers);
        if (b0 == b1) return;
        std::vector<const sd::Example*> part(all.begin() + static_cast<std::ptrdiff_t>(b0),
                                             all.begin() + static_cast<std::ptrdiff_t>(b1));
        const Batch bt = make_batch(part, mel, cfg.n_mels, frames, sp.eot);
        Whisper& m = reps[static_cast<std::size_t>(w)];
        const torch::Tensor enc = m->model->encoder(bt.mel);
        const torch::Tensor logits = m->model->decoder(bt.ids, enc);
        torch::Tensor loss =
            torch::nn::functional::cross_entropy(
                logits.reshape({-1, logits.size(-1)}), bt.labels.reshape({-1}),
                torch::nn::functional::CrossEntropyFuncOptions().ignore_index(sd::kIgnore).reduction(torch::kSum)) /
            n_labels;
        if (c.ctc_weight > 0 && n_ctc > 0) {
          const torch::Tensor lp = torch::log_softmax(ctc_heads[static_cast<std::size_t>(w)](enc), -1).transpose(0, 1);
          const torch::Tensor in_len = torch::full({enc.size(0)}, enc.size(1), torch::kLong);
          const torch::Tensor per = torch::ctc_loss(lp, bt.ctc, in_len, bt.ctc_len, 0, at::Reduction::None, true);
          loss = loss + c.ctc_weight * (per / bt.ctc_len.clamp_min(1).to(torch::kFloat) * bt.ctc_mask).sum() / n_ctc;
        }
        loss.backward();
        losses[static_cast<std::size_t>(w)] = loss.item<double>();
      });
      {
        torch::NoGradGuard ng;
        auto master = model->named_parameters();
        for (int w = 1; w < workers; ++w)
          for (auto& item : reps[static_cast<std::size_t>(w)]->named_parameters()) {
            const torch::Tensor& pg = item.value().grad();
            if (!pg.defined()) continue;
            auto& g = master[item.key()].mutable_grad();
            if (g.defined()) g.add_(pg);
            else g = pg.clone();
          }
        for (int w = 1; w < workers; ++w)
          for (auto [dst, src] : {std::pair{ctc_heads[0]->weight, ctc_heads[static_cast<std::size_t>(w)]->weight},
                                  std::pair{ctc_heads[0]->bias, ctc_heads[static_cast<std::size_t>(w)]->bias}}) {
            if (!src.grad().defined()) continue;
            if (dst.grad().defined()) dst.mutable_grad().add_(src.grad());
            else dst.mutable_grad() = src.grad().clone();
          }
      }
      const double grad_norm = torch::nn::utils::clip_grad_norm_(trained, c.clip);
      opt.step();
      last_loss = 0;
      for (double l : losses) last_loss += l;
      if (step == 0) first_loss = last_loss;
      loss_ema = step == 0 ? last_loss : 0.9 * loss_ema + 0.1 * last_loss;
      done = step + 1;
      if (done % 10 == 0 || done == 1) curve.emplace_back(done, loss_ema);
      const double el = seconds_since(t_train);
      if (done == 5) el_at_5 = el;
      if (c.seconds > 0 && done == kPlanAt && steps > kPlanAt) {
        const double per_step = (el - el_at_5) / (kPlanAt - 5);
        const int fit = done + static_cast<int>(std::max(0.0, c.seconds - el) / per_step);
        if (fit < steps) {
          steps = std::max(fit, done);
          warmup = std::min(warmup, std::max(1, steps / 12));
          cut = true;
          if (!c.quiet)
            std::fprintf(stderr, "--seconds %.0f: %.3f s/step, training %d steps instead of %d\n", c.seconds, per_step,
                         steps, c.steps);
        }
      }
      if (!c.quiet && (done % 10 == 0 || done == steps || done == 1))
        std::fprintf(stderr, "step %5d/%d  loss %.4f  (avg %.4f)  |g| %.3f  lr %.2e  %.2f s/step  %.1f s\n", done, steps,
                     last_loss, loss_ema, grad_norm, lr, el / done, el);
      if (c.eval_every > 0 && done % c.eval_every == 0 && done < steps) {
        const auto [hl, acc] = heldout_loss(model, held_windows, mel, cfg.n_mels, frames, sp.eot);
        held_curve.emplace_back(done, hl);
        if (!c.quiet) std::fprintf(stderr, "held-out, step %d: loss %.4f, token accuracy %.3f\n", done, hl, acc);
      }
      if (c.seconds > 0 && el > c.seconds && done < steps) {
        cut = true;
        if (!c.quiet) std::fprintf(stderr, "--seconds %.0f reached after %d steps\n", c.seconds, done);
        break;
      }
    }
    const double train_seconds = seconds_since(t_train);
    const auto [held_loss, held_acc] = heldout_loss(model, held_windows, mel, cfg.n_mels, frames, sp.eot);
    held_curve.emplace_back(done, held_loss);
    if (!c.quiet)
      std::fprintf(stderr, "held-out after %d steps (%.1f s): loss %.4f, token accuracy %.3f\n", done, train_seconds,
                   held_loss, held_acc);

    // 6. Write the model: every tensor from the module of the same name; the preprocessor's window is the model's.
    std::map<std::string, torch::Tensor> named;
    for (auto& item : model->named_parameters()) named[item.key()] = item.value().detach().contiguous();
    modelgen::WhisperWriteOptions wo;
    wo.shape = shape;
    wo.dtype = weights::DType::f32;
    wo.seed = c.seed;
    std::string missing;
    wo.source = [&](const std::string& name, std::vector<float>& out) {
      const auto it = named.find(name);
      if (it == named.end() || static_cast<std::size_t>(it->second.numel()) != out.size()) {
        missing += (missing.empty() ? "" : ", ") + name;
        return;
      }
      std::copy_n(it->second.data_ptr<float>(), out.size(), out.begin());
    };
    if (auto s = modelgen::write_whisper_model(c.out, wo); !s)
      throw TrainError{std::string(errc_name(s.error().code)) + ": " + s.error().message};
    if (!missing.empty()) throw TrainError{"internal: no trained tensor for " + missing};
    if (named.size() != weights::whisper_required_tensors(cfg).size())
      throw TrainError{"internal: the module has " + std::to_string(named.size()) + " parameters, the layout " +
                       std::to_string(weights::whisper_required_tensors(cfg).size())};
    {
      std::ostringstream pre;
      pre << "{\n  \"feature_extractor_type\": \"WhisperFeatureExtractor\",\n  \"feature_size\": " << cfg.n_mels
          << ",\n  \"sampling_rate\": 16000,\n  \"hop_length\": 160,\n  \"n_fft\": 400,\n  \"chunk_length\": "
          << c.window_s << ",\n  \"n_samples\": " << window_samples << ",\n  \"nb_max_frames\": " << frames
          << ",\n  \"padding_side\": \"right\",\n  \"padding_value\": 0.0,\n  \"return_attention_mask\": false,\n"
          << "  \"processor_class\": \"WhisperProcessor\"\n}\n";
      sd::write_text(fs::path(c.out) / "preprocessor_config.json", pre.str());
    }

    // 7. The equivalence check: engine::WhisperModel on the written files against the training forward, every
    //    position of one held-out window fed one token at a time.
    const auto t_check = TrainTimer::now();
    auto em = engine::WhisperModel::load(c.out, engine::WhisperLoadOptions{});
    if (!em) throw TrainError{"engine::WhisperModel cannot load " + c.out + ": " + em.error().message};
    auto sess_r = (*em)->new_session();
    if (!sess_r) throw TrainError{"engine::WhisperModel::new_session: " + sess_r.error().message};
    engine::WhisperSession& session = **sess_r;
    double max_diff = 0;
    std::size_t compared = 0;
    {
      const sd::Example ex = sd::single(held[0], held_ids[0], sp, window_samples, true);
      const Batch bt = make_batch({&ex}, mel, cfg.n_mels, frames, sp.eot);
      torch::Tensor ref;
      {
        torch::NoGradGuard ng;
        ref = model->forward(bt.mel, bt.ids)[0].contiguous();  // [T, vocab]
      }
      const torch::Tensor m0 = bt.mel[0].contiguous();
      if (auto s = session.encode(std::span<const float>(m0.data_ptr<float>(), static_cast<std::size_t>(m0.numel())),
                                  nullptr);
          !s)
        throw TrainError{"engine encode: " + s.error().message};
      for (std::size_t i = 0; i < ex.input.size(); ++i) {
        const std::int32_t t = ex.input[i];
        auto lg = session.decode(std::span<const std::int32_t>(&t, 1), nullptr);
        if (!lg) throw TrainError{"engine decode: " + lg.error().message};
        const torch::Tensor row = ref[static_cast<std::int64_t>(i)];
        if (static_cast<std::int64_t>(lg->size()) != row.numel()) throw TrainError{"engine: logits of another width"};
        const torch::Tensor e = torch::from_blob(lg->data(), {row.numel()});
        max_diff = std::max(max_diff, (e - row).abs().max().item<double>());
        ++compared;
      }
    }
    const double check_seconds = seconds_since(t_check);
    const bool equivalent = max_diff <= 1e-3;
    if (!c.quiet)
      std::fprintf(stderr, "engine::WhisperModel on the written model vs the training forward: max |diff| %.3g over %zu "
                   "positions (%.1f s)\n", max_diff, compared, check_seconds);

    // 8. Held-out word error rate through speech::Transcriber on the engine: each sentence alone (0.3 s of silence
    //    before and after), with and without timestamps, and files of three sentences (windows and seeks).
    std::string gen_config;
    {
      std::ifstream f(fs::path(c.out) / "generation_config.json", std::ios::binary);
      std::ostringstream ss;
      ss << f.rdbuf();
      gen_config = ss.str();
    }
    const speech::ModelSpeechInfo info{cfg.n_mels, static_cast<int>(frames), cfg.target_positions, cfg.vocab};
    auto eval = [&](bool timestamps, int per_file, std::size_t files) {
      speech::TranscribeOptions to;
      to.timestamps = timestamps;
      auto tr = speech::Transcriber::create(tokenizer, wsp, info, gen_config, to);
      if (!tr) throw TrainError{"speech::Transcriber::create: " + tr.error().message};
      WerResult r;
      for (std::size_t f = 0; f < files; ++f) {
        std::vector<const sd::Utterance*> us;
        std::string ref;
        for (int k = 0; k < per_file; ++k) {
          const auto& u = held[(f * static_cast<std::size_t>(per_file) + static_cast<std::size_t>(k)) % held.size()];
          us.push_back(&u);
          ref += (ref.empty() ? "" : " ") + u.text;
        }
        const std::vector<float> pcm = sd::with_silence(us, 0.3, 0.6, 0.3);
        const auto t0 = TrainTimer::now();
        const auto segs = transcribe(*tr, session, pcm);
        r.wall_seconds += seconds_since(t0);
        r.audio_seconds += static_cast<double>(pcm.size()) / 16000.0;
        Transcript t{ref, speech::to_text(segs), us[0]->voice.describe(), static_cast<double>(pcm.size()) / 16000.0, segs};
        const sd::WordErrors we = sd::word_errors(t.reference, t.hypothesis);
        r.errors.errors += we.errors;
        r.errors.words += we.words;
        r.exact += we.errors == 0;
        ++r.files;
        if (r.samples.size() < 8) r.samples.push_back(std::move(t));
      }
      return r;
    };
    const auto t_eval = TrainTimer::now();
    const WerResult wer_ts = eval(true, 1, held.size());
    const WerResult wer_nts = eval(false, 1, held.size());
    const WerResult wer_long = eval(true, 3, std::max<std::size_t>(1, held.size() / 10));
    const double eval_seconds = seconds_since(t_eval);
    if (!c.quiet) {
      std::fprintf(stderr, "held-out WER through speech::Transcriber on the engine: %.2f%% (%zu/%zu words, %zu of %zu "
                   "sentences exact) with timestamps, %.2f%% without; %.2f%% on %zu files of three sentences; real-time "
                   "factor %.1fx (%.1f s)\n", 100 * wer_ts.wer(), wer_ts.errors.errors, wer_ts.errors.words,
                   wer_ts.exact, wer_ts.files, 100 * wer_nts.wer(), 100 * wer_long.wer(), wer_long.files,
                   wer_ts.audio_seconds / std::max(wer_ts.wall_seconds, 1e-9), eval_seconds);
      for (const auto& t : wer_ts.samples)
        std::fprintf(stderr, "  ref: %s\n  hyp: %s\n", t.reference.c_str(), t.hypothesis.c_str());
    }

    // 9. training.json.
    const double total_seconds = seconds_since(t_start);
    std::ostringstream j;
    auto samples_json = [&](const WerResult& w) {
      std::ostringstream s;
      s << "[";
      for (std::size_t i = 0; i < w.samples.size(); ++i) {
        const auto& t = w.samples[i];
        s << (i ? ",\n      " : "\n      ") << "{\"reference\": \"" << json_escape(t.reference) << "\", \"hypothesis\": \""
          << json_escape(t.hypothesis) << "\", \"voice\": \"" << json_escape(t.voice) << "\", \"segments\": [";
        for (std::size_t k = 0; k < t.segments.size(); ++k)
          s << (k ? ", " : "") << "[" << fmt(t.segments[k].start) << ", " << fmt(t.segments[k].end) << "]";
        s << "]}";
      }
      s << "]";
      return s.str();
    };
    j << "{\n  \"generator\": \"tandem-train-whisper\",\n  \"parameters\": " << n_params << ",\n  \"shape\": {\"d_model\": "
      << cfg.d_model << ", \"encoder_layers\": " << cfg.encoder_layers << ", \"decoder_layers\": " << cfg.decoder_layers
      << ", \"heads\": " << c.heads << ", \"ffn\": " << c.ffn << ", \"n_mels\": " << cfg.n_mels
      << ", \"window_seconds\": " << c.window_s << ", \"source_positions\": " << cfg.source_positions
      << ", \"target_positions\": " << cfg.target_positions << ", \"vocab\": " << cfg.vocab << "},\n"
      << "  \"seed\": " << c.seed << ",\n  \"threads\": " << workers << ",\n  \"quick\": " << (c.quick ? "true" : "false")
      << ",\n  \"steps\": " << done << ",\n  \"steps_requested\": " << c.steps << ",\n  \"cut_by_time_budget\": "
      << (cut ? "true" : "false") << ",\n  \"batch\": " << c.batch << ",\n  \"windows_seen\": " << windows_seen << ",\n"
      << "  \"optimizer\": {\"name\": \"AdamW\", \"lr\": " << fmt(c.lr) << ", \"warmup_steps\": " << warmup
      << ", \"schedule\": \"cosine\", \"min_lr\": " << fmt(c.lr * c.min_lr_frac)
      << ", \"betas\": [0.9, 0.98], \"eps\": 1e-6, \"weight_decay\": " << fmt(c.weight_decay)
      << ", \"grad_clip\": " << fmt(c.clip) << "},\n"
      << "  \"loss\": {\"name\": \"token cross-entropy (teacher forcing)\", \"first\": " << fmt(first_loss)
      << ", \"final\": " << fmt(last_loss) << ", \"final_avg\": " << fmt(loss_ema) << ", \"by_step\": [";
    for (std::size_t i = 0; i < curve.size(); ++i) j << (i ? ", " : "") << "[" << curve[i].first << ", " << fmt(curve[i].second) << "]";
    j << "]},\n  \"heldout_teacher_forced\": {\"windows\": " << held_windows.size() << ", \"loss\": " << fmt(held_loss)
      << ", \"token_accuracy\": " << fmt(held_acc) << ", \"by_step\": [";
    for (std::size_t i = 0; i < held_curve.size(); ++i)
      j << (i ? ", " : "") << "[" << held_curve[i].first << ", " << fmt(held_curve[i].second) << "]";
    j << "]},\n  \"tokenizer\": {\"tokens\": " << cfg.vocab << ", \"text_tokens_cap\": " << c.vocab_tokens
      << ", \"languages\": [\"en\"], \"longest_sentence_tokens\": " << max_text << "},\n"
      << "  \"data\": {\"train_seed\": " << sd::kTrainSeed << ", \"heldout_seed\": " << sd::kHeldoutSeed
      << ", \"train_sentences\": " << pool.size() << ", \"train_speech_seconds\": " << fmt(train_stats.seconds)
      << ", \"dropped_too_long\": " << train_stats.dropped_long << ", \"espeak_calls\": " << train_stats.calls + held_stats.calls
      << ", \"split_fallbacks\": " << train_stats.split_fallbacks + held_stats.split_fallbacks
      << ", \"heldout_sentences\": " << held.size() << "},\n"
      << "  \"engine_check\": {\"max_abs_diff\": " << fmt(max_diff) << ", \"positions\": " << compared
      << ", \"tolerance\": 1e-3, \"passed\": " << (equivalent ? "true" : "false") << "},\n"
      << "  \"heldout_wer\": {\n    \"timestamps\": " << wer_json(wer_ts) << ",\n    \"no_timestamps\": "
      << wer_json(wer_nts) << ",\n    \"three_sentence_files\": " << wer_json(wer_long)
      << ",\n    \"samples\": " << samples_json(wer_ts) << ",\n    \"three_sentence_samples\": " << samples_json(wer_long)
      << "\n  },\n"
      << "  \"seconds\": {\"speech\": " << fmt(synth_seconds) << ", \"train\": " << fmt(train_seconds)
      << ", \"engine_check\": " << fmt(check_seconds) << ", \"wer\": " << fmt(eval_seconds) << ", \"total\": "
      << fmt(total_seconds) << "},\n"
      << "  \"cpu\": \"" << json_escape(cpu_model()) << "\",\n  \"hardware_threads\": " << std::thread::hardware_concurrency()
      << ",\n  \"libtorch\": \"" << TORCH_VERSION << "\"\n}\n";
    sd::write_text(fs::path(c.out) / "training.json", j.str());
    fs::remove_all(tmp, ec);
    tmp.clear();
    if (!equivalent) {
      // Nothing may load a model the engine does not compute as trained.
      fs::rename(fs::path(c.out) / "model.safetensors", fs::path(c.out) / "model.safetensors.rejected", ec);
      throw TrainError{"engine::WhisperModel differs from the training forward by " + fmt(max_diff) +
                       " (> 1e-3); model.safetensors renamed to model.safetensors.rejected"};
    }
    std::printf("wrote %s: %d steps in %.1f s (total %.1f s), loss %.4f -> %.4f; held-out WER %.2f%% on %zu sentences "
                "(%.2f%% without timestamps, %.2f%% on three-sentence files), engine max |diff| %.2g\n",
                c.out.c_str(), done, train_seconds, total_seconds, first_loss, loss_ema, 100 * wer_ts.wer(), wer_ts.files,
                100 * wer_nts.wer(), 100 * wer_long.wer(), max_diff);
    return 0;
  } catch (const TrainError& e) {
    std::fprintf(stderr, "tandem-train-whisper: %s\n", e.message.c_str());
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "tandem-train-whisper: libtorch: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-train-whisper: %s\n", e.what());
  }
  if (!tmp.empty()) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem;
  Config c;
  bool steps_set = false, seconds_set = false, batch_set = false, threads_set = false, sentences_set = false,
       heldout_set = false;
  try {
    cli::Args a(argc, argv);
    while (a.next()) {
      const auto f = a.flag();
      if (f == "--out") c.out = a.value();
      else if (f == "--steps") c.steps = cli::parse_number<int>(f, a.value(), 1, 10000000), steps_set = true;
      else if (f == "--seconds") c.seconds = cli::parse_number<double>(f, a.value(), 0, 1e7), seconds_set = true;
      else if (f == "--quick") c.quick = true;
      else if (f == "--seed") c.seed = cli::parse_number<std::uint64_t>(f, a.value(), 0, UINT64_MAX);
      else if (f == "--threads") c.threads = cli::parse_number<int>(f, a.value(), 1, 256), threads_set = true;
      else if (f == "--batch") c.batch = cli::parse_number<int>(f, a.value(), 1, 4096), batch_set = true;
      else if (f == "--lr") c.lr = cli::parse_number<double>(f, a.value(), 1e-7, 1.0);
      else if (f == "--ctc-weight") c.ctc_weight = cli::parse_number<double>(f, a.value(), 0, 100);
      else if (f == "--sentences") c.sentences = cli::parse_number<int>(f, a.value(), 4, 1000000), sentences_set = true;
      else if (f == "--heldout") c.heldout = cli::parse_number<int>(f, a.value(), 1, 100000), heldout_set = true;
      else if (f == "--eval-every") c.eval_every = cli::parse_number<int>(f, a.value(), 0, 10000000);
      else if (f == "--espeak") c.espeak = a.value();
      else if (f == "--quiet") c.quiet = true;
      else if (f == "--render") {
        c.render_dir = a.value();
        c.render_n = cli::parse_number<int>(f, a.value(), 1, 100000);
      } else if (f == "-h" || f == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      } else {
        throw cli::ArgError{"unknown option " + std::string(f)};
      }
    }
    if (!c.render_dir.empty()) return render_mode(c);
    if (c.out.empty()) throw cli::ArgError{"--out DIR is required"};
  } catch (const cli::ArgError& e) {
    std::fprintf(stderr, "tandem-train-whisper: %s\n%s", e.message.c_str(), kUsage);
    return 2;
  }
  if (c.quick) {
    if (!steps_set) c.steps = 20;
    if (!batch_set) c.batch = 8;
    if (!threads_set) c.threads = 1;
    if (!seconds_set) c.seconds = 0;
    if (!sentences_set) c.sentences = 16;
    if (!heldout_set) c.heldout = 4;
    c.eval_every = 0;
  }
  return run_training(c);
}
