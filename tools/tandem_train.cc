// tandem-train: trains the bundled default model (preset "tiny", Llama architecture, tied embeddings) on plain
// English text — by default the license texts every Debian system ships in /usr/share/common-licenses — so that
// the demo model prints readable words instead of noise. The training forward pass is the engine's math
// (src/engine/model.cc: f32 RMSNorm, rotate_half RoPE, GQA, SwiGLU, tied LM head) written with LibTorch autograd.
// Deterministic for a given (corpus, seed, steps, thread count, library versions) unless --seconds cuts it short.
#include <torch/torch.h>

#include <dlfcn.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_args.h"
#include "data_dir.h"
#include "core/sha256.h"
#include "core/text.h"
#include "modelgen/modelgen.h"
#include "tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const char* kUsage =
    "usage: tandem-train --out DIR [options]\n"
    "Trains the default model (preset tiny) on English text and writes it like tandem-mkmodel, plus training.json.\n"
    "  --corpus PATH      text file, or directory whose regular files are all used (repeatable;\n"
    "                     default /usr/share/common-licenses). Identical files are used once.\n"
    "  --steps N          optimizer steps (default 600)\n"
    "  --seconds S        also stop within S seconds of training: after 10 steps the step count is lowered to fit\n"
    "                     (the schedule follows). The result then depends on machine speed (not deterministic).\n"
    "  --seed N           init and sampling seed (default 1)\n"
    "  --threads N        worker threads, each taking a share of the batch (default 2; the float results\n"
    "                     depend on it)\n"
    "  --batch N          windows per step (default 16)\n"
    "  --seq-len N        tokens per window (default 128)\n"
    "  --lr X             peak learning rate of AdamW (default 0.003; 5% warmup, cosine decay to 10%)\n"
    "  --preset NAME      model shape: tiny (default) or test\n"
    "  --tokenizer PATH   tokenizer.model (default: the bundled Llama 2 tokenizer)\n"
    "  --sample-prompt T  prompt of the greedy sample printed and stored in training.json\n"
    "                     (default \"This program is free software\")\n"
    "  --sample-tokens N  length of that sample (default 40; 0 = none)\n"
    "  --eval-every N     held-out loss every N steps (default 100; 0 = only before and after)\n"
    "  --quiet            no progress lines on stderr\n";

struct Config {
  std::string out;
  std::vector<std::string> corpus;
  int steps = 600;
  double seconds = 0;  // 0 = no time budget
  std::uint64_t seed = 1;
  int threads = 2;
  int batch = 16;
  int seq_len = 128;
  double lr = 3e-3;
  double weight_decay = 0.1;
  double min_lr_frac = 0.1;
  double clip = 1.0;
  std::string preset = "tiny";
  std::string tokenizer = tandem::tools::bundled_data("tokenizer/llama2/tokenizer.model");
  std::string sample_prompt = "This program is free software";
  int sample_tokens = 40;
  int eval_every = 100;
  bool quiet = false;
};

struct TrainError {
  std::string message;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }


std::string fmt_double(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

// ---- corpus --------------------------------------------------------------------------------------------------

struct CorpusFile {
  std::string path;
  std::string sha256;
  std::uint64_t bytes = 0;
  std::uint64_t tokens = 0;  // including the BOS in front
  std::string duplicate_of;  // non-empty: same content as that file, not used
};

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw TrainError{"cannot open " + p.string()};
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw TrainError{"cannot read " + p.string()};
  return ss.str();
}

// Expands the --corpus arguments into files (a directory contributes its regular files, symlinks followed, sorted
// by name), reads them, and drops content seen before.
std::vector<std::pair<CorpusFile, std::string>> load_corpus(const std::vector<std::string>& args) {
  std::vector<fs::path> paths;
  for (const auto& a : args) {
    std::error_code ec;
    const auto st = fs::status(a, ec);
    if (ec || !fs::exists(st)) throw TrainError{"--corpus: " + a + " does not exist"};
    if (fs::is_directory(st)) {
      // Symlinks are resolved (GPL -> GPL-3): each file is named by its real path and listed once.
      std::vector<fs::path> in_dir;
      for (const auto& e : fs::directory_iterator(a, ec)) {
        std::error_code ec2;
        if (!fs::is_regular_file(e.path(), ec2)) continue;
        fs::path real = fs::canonical(e.path(), ec2);
        in_dir.push_back(ec2 ? e.path() : real);
      }
      if (ec) throw TrainError{"--corpus: cannot list " + a + ": " + ec.message()};
      if (in_dir.empty()) throw TrainError{"--corpus: directory " + a + " has no regular files"};
      std::sort(in_dir.begin(), in_dir.end());
      in_dir.erase(std::unique(in_dir.begin(), in_dir.end()), in_dir.end());
      paths.insert(paths.end(), in_dir.begin(), in_dir.end());
    } else if (fs::is_regular_file(st)) {
      paths.emplace_back(a);
    } else {
      throw TrainError{"--corpus: " + a + " is neither a regular file nor a directory"};
    }
  }
  std::vector<std::pair<CorpusFile, std::string>> out;
  std::map<std::string, std::string> seen;  // sha256 -> first path
  for (const auto& p : paths) {
    std::string text = read_file(p);
    if (text.find('\0') != std::string::npos)
      throw TrainError{"--corpus: " + p.string() + " is not a text file (NUL bytes)"};
    CorpusFile cf;
    cf.path = p.string();
    cf.bytes = text.size();
    cf.sha256 = tandem::Sha256::hex(tandem::Sha256::of(text));
    if (auto it = seen.find(cf.sha256); it != seen.end()) {
      cf.duplicate_of = it->second;
      text.clear();
    } else {
      seen.emplace(cf.sha256, cf.path);
    }
    out.emplace_back(std::move(cf), std::move(text));
  }
  return out;
}

// ---- model ---------------------------------------------------------------------------------------------------

struct LayerW {
  torch::Tensor attn_norm, wq, wk, wv, wo, mlp_norm, gate, up, down;
};

struct Params {
  torch::Tensor embed_full;  // [vocab, hidden], not trained directly: the used rows live in `embed`
  torch::Tensor embed;       // [used, hidden] = embed_full rows of the token ids that occur in the corpus
  torch::Tensor final_norm;
  std::vector<LayerW> layers;
  torch::Tensor inv_freq;  // [head_dim / 2]
};

struct Dims {
  std::int64_t hidden, heads, kv_heads, head_dim, inter;
  double eps;
};

// The trained tensors in a fixed order.
std::vector<torch::Tensor*> param_slots(Params& p) {
  std::vector<torch::Tensor*> v{&p.embed, &p.final_norm};
  for (auto& l : p.layers)
    for (auto* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.mlp_norm, &l.gate, &l.up, &l.down}) v.push_back(t);
  return v;
}

// A worker's view of the parameters: same storage (the optimizer's in-place updates show through), its own
// autograd leaves, so each worker's backward fills its own .grad.
Params replica(const Params& p) {
  Params r = p;
  r.embed_full = torch::Tensor();
  for (auto* t : param_slots(r)) *t = t->detach().requires_grad_(true);
  return r;
}

torch::Tensor rmsnorm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  return x * torch::rsqrt(x.pow(2).mean({-1}, /*keepdim=*/true) + eps) * w;
}

// HF rotate_half RoPE; x: [B, T, heads, hd], cos/sin: [T, hd].
torch::Tensor rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const std::int64_t half = x.size(-1) / 2;
  const torch::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  const torch::Tensor rot = torch::cat({-x2, x1}, -1);
  return x * cos.unsqueeze(1) + rot * sin.unsqueeze(1);
}

// Final hidden states [B, T, hidden] for token ids [B, T] (ids index `emb`), positions 0..T-1, causal.
torch::Tensor forward(const Params& p, const Dims& d, const torch::Tensor& emb, const torch::Tensor& ids,
                      const torch::Tensor& mask) {
  const std::int64_t B = ids.size(0), T = ids.size(1), g = d.heads / d.kv_heads;
  torch::Tensor x = emb.index_select(0, ids.reshape({-1})).view({B, T, d.hidden});
  const torch::Tensor pos = torch::arange(T, torch::kFloat);
  const torch::Tensor freqs = torch::outer(pos, p.inv_freq);
  const torch::Tensor e = torch::cat({freqs, freqs}, -1);
  const torch::Tensor cos = e.cos(), sin = e.sin();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.head_dim));
  for (const LayerW& l : p.layers) {
    const torch::Tensor h = rmsnorm(x, l.attn_norm, d.eps);
    const torch::Tensor q = rope(torch::matmul(h, l.wq.t()).view({B, T, d.heads, d.head_dim}), cos, sin);
    const torch::Tensor k = rope(torch::matmul(h, l.wk.t()).view({B, T, d.kv_heads, d.head_dim}), cos, sin);
    const torch::Tensor v = torch::matmul(h, l.wv.t()).view({B, T, d.kv_heads, d.head_dim});
    // q head h attends with kv head h / g (the engine's view({n, kvh, g, hd})).
    const torch::Tensor qh = q.view({B, T, d.kv_heads, g, d.head_dim}).permute({0, 2, 3, 1, 4});  // [B,kvh,g,T,hd]
    const torch::Tensor kh = k.permute({0, 2, 1, 3}).unsqueeze(2);                                // [B,kvh,1,T,hd]
    const torch::Tensor vh = v.permute({0, 2, 1, 3}).unsqueeze(2);
    const torch::Tensor scores = torch::matmul(qh, kh.transpose(-1, -2)) * scale + mask;  // [B,kvh,g,T,T]
    const torch::Tensor att = torch::matmul(torch::softmax(scores, -1), vh);              // [B,kvh,g,T,hd]
    const torch::Tensor merged = att.permute({0, 3, 1, 2, 4}).reshape({B, T, d.heads * d.head_dim});
    x = x + torch::matmul(merged, l.wo.t());
    const torch::Tensor h2 = rmsnorm(x, l.mlp_norm, d.eps);
    x = x + torch::matmul(torch::silu(torch::matmul(h2, l.gate.t())) * torch::matmul(h2, l.up.t()), l.down.t());
  }
  return rmsnorm(x, p.final_norm, d.eps);
}

torch::Tensor causal_mask(std::int64_t T) {
  return torch::full({T, T}, -std::numeric_limits<float>::infinity()).triu(1);
}

// Windows of the token stream: input = [BOS, s[i+1], ..., s[i+T-1]], target = [s[i+1], ..., s[i+T]]. Every window
// starts with BOS like every engine prompt does; targets that are BOS (a document start) are not scored.
struct Batch {
  torch::Tensor input, target;
};

Batch make_batch(const std::vector<std::int64_t>& stream, const std::vector<std::size_t>& starts, int T,
                 std::int64_t bos) {
  const auto B = static_cast<std::int64_t>(starts.size());
  torch::Tensor in = torch::empty({B, T}, torch::kLong), tg = torch::empty({B, T}, torch::kLong);
  auto ia = in.accessor<std::int64_t, 2>();
  auto ta = tg.accessor<std::int64_t, 2>();
  for (std::int64_t b = 0; b < B; ++b) {
    const std::size_t s = starts[static_cast<std::size_t>(b)];
    for (int j = 0; j < T; ++j) {
      ia[b][j] = j == 0 ? bos : stream[s + static_cast<std::size_t>(j)];
      const std::int64_t t = stream[s + static_cast<std::size_t>(j) + 1];
      ta[b][j] = t == bos ? -100 : t;
    }
  }
  return {in, tg};
}

torch::Tensor loss_of(const torch::Tensor& hidden, const torch::Tensor& head, const torch::Tensor& target) {
  const torch::Tensor logits = torch::matmul(hidden.reshape({-1, hidden.size(-1)}), head.t());
  return torch::nn::functional::cross_entropy(logits, target.reshape({-1}),
                                              torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
}

// Greedy continuation with the training forward pass over the whole vocabulary (no KV cache: the prefix is
// recomputed each step). tandem-generate on the written model must print the same tokens.
std::vector<std::int64_t> greedy(const Params& p, const Dims& d, const torch::Tensor& full,
                                 std::vector<std::int64_t> ids, int n) {
  torch::NoGradGuard ng;
  std::vector<std::int64_t> out;
  for (int i = 0; i < n; ++i) {
    const auto T = static_cast<std::int64_t>(ids.size());
    const torch::Tensor h = forward(p, d, full, torch::tensor(ids, torch::kLong).view({1, T}), causal_mask(T));
    const std::int64_t next = torch::matmul(h[0][T - 1], full.t()).argmax().item<std::int64_t>();
    out.push_back(next);
    ids.push_back(next);
  }
  return out;
}

struct Eval {
  double loss = 0;          // mean over scored tokens, softmax over the tokens used by the corpus
  double loss_full = 0;     // same, softmax over the whole vocabulary
  double unused_wins = 0;   // fraction of positions whose full-vocabulary argmax is a token outside the corpus
  std::int64_t tokens = 0;  // scored tokens
};

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem;
  Config c;
  try {
    cli::Args a(argc, argv);
    while (a.next()) {
      const auto f = a.flag();
      if (f == "--out") c.out = a.value();
      else if (f == "--corpus") c.corpus.emplace_back(a.value());
      else if (f == "--steps") c.steps = cli::parse_number<int>(f, a.value(), 1, 1000000);
      else if (f == "--seconds") c.seconds = cli::parse_number<double>(f, a.value(), 1, 1e7);
      else if (f == "--seed") c.seed = cli::parse_number<std::uint64_t>(f, a.value(), 0, UINT64_MAX);
      else if (f == "--threads") c.threads = cli::parse_number<int>(f, a.value(), 1, 256);
      else if (f == "--batch") c.batch = cli::parse_number<int>(f, a.value(), 1, 4096);
      else if (f == "--seq-len") c.seq_len = cli::parse_number<int>(f, a.value(), 2, 65536);
      else if (f == "--lr") c.lr = cli::parse_number<double>(f, a.value(), 1e-7, 1.0);
      else if (f == "--preset") c.preset = a.value();
      else if (f == "--tokenizer") c.tokenizer = a.value();
      else if (f == "--sample-prompt") c.sample_prompt = a.value();
      else if (f == "--sample-tokens") c.sample_tokens = cli::parse_number<int>(f, a.value(), 0, 1000);
      else if (f == "--eval-every") c.eval_every = cli::parse_number<int>(f, a.value(), 0, 1000000);
      else if (f == "--quiet") c.quiet = true;
      else if (f == "-h" || f == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      } else {
        throw cli::ArgError{"unknown option " + std::string(f)};
      }
    }
    if (c.out.empty()) throw cli::ArgError{"--out DIR is required"};
    if (c.preset != "tiny" && c.preset != "test")
      throw cli::ArgError{"--preset: '" + c.preset + "' is not one of tiny, test"};
  } catch (const cli::ArgError& e) {
    std::fprintf(stderr, "tandem-train: %s\n%s", e.message.c_str(), kUsage);
    return 2;
  }
  if (c.corpus.empty()) c.corpus.emplace_back("/usr/share/common-licenses");

  auto shape_r = modelgen::preset(c.preset);
  if (!shape_r) {
    std::fprintf(stderr, "tandem-train: %s\n", shape_r.error().message.c_str());
    return 2;
  }
  modelgen::Shape shape = *shape_r;
  shape.tied = true;  // the trainer's forward uses the embedding matrix as LM head (see above)
  if (c.seq_len > shape.max_positions) {
    std::fprintf(stderr, "tandem-train: --seq-len: %d is more than the model's %d positions\n", c.seq_len,
                 shape.max_positions);
    return 2;
  }

  const auto t_start = Clock::now();
  try {
    // Threads: --threads data-parallel workers, each running its share of the batch's windows with
    // single-threaded ATen and OpenBLAS; their gradients are summed in a fixed order. Measured on 2 cores:
    // ATen's OpenMP and OpenBLAS's threads give little here (the matrices are small) and collapse when another
    // process takes a core (spin-waiting pools), and OpenBLAS threading changes the float results.
    at::set_num_threads(1);
    using SetThreads = void (*)(int);
    if (const auto ob = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) ob(1);
    // Each step allocates and frees the same few large buffers (logits, activations, gradients). glibc would
    // mmap/munmap them every time, and the page faults plus zeroing of fresh pages cost ~25% of a step: keep them
    // in the heap instead.
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    using SetThreads = void (*)(int);
    if (const auto ob = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) ob(1);

    auto tok = tok::Tokenizer::load_file(c.tokenizer);
    if (!tok) throw TrainError{tok.error().message};
    if (tok->vocab_size() != shape.vocab)
      throw TrainError{c.tokenizer + ": vocabulary of " + std::to_string(tok->vocab_size()) +
                       " tokens, the model has " + std::to_string(shape.vocab)};
    const std::int64_t bos = tok->bos_id();
    if (bos < 0) throw TrainError{c.tokenizer + ": the tokenizer has no BOS token"};

    // Corpus → one stream of token ids, BOS before each document.
    auto files = load_corpus(c.corpus);
    std::vector<std::int64_t> stream;
    std::uint64_t corpus_bytes = 0;
    for (auto& [cf, text] : files) {
      if (!cf.duplicate_of.empty()) continue;
      const auto ids = tok->encode(text, /*add_bos=*/true);
      cf.tokens = ids.size();
      corpus_bytes += cf.bytes;
      stream.insert(stream.end(), ids.begin(), ids.end());
    }
    const double t_tokenize = seconds_since(t_start);
    const auto T = static_cast<std::size_t>(c.seq_len);
    const std::size_t split = stream.size() - stream.size() / 20;  // last ~5% held out
    if (split < T + 2 || stream.size() - split < T + 1)
      throw TrainError{"corpus too small: " + std::to_string(stream.size()) + " tokens; need at least " +
                       std::to_string(20 * (T + 1)) + " for --seq-len " + std::to_string(T)};

    // Restrict the softmax to the token ids the corpus uses (the 32000-row tied head would dominate the cost).
    std::vector<std::int64_t> used(stream.begin(), stream.end());
    used.push_back(bos);
    std::sort(used.begin(), used.end());
    used.erase(std::unique(used.begin(), used.end()), used.end());
    std::vector<std::int64_t> local(static_cast<std::size_t>(shape.vocab), -1);
    for (std::size_t i = 0; i < used.size(); ++i)
      local[static_cast<std::size_t>(used[i])] = static_cast<std::int64_t>(i);
    std::vector<std::int64_t> lstream(stream.size());
    for (std::size_t i = 0; i < stream.size(); ++i) lstream[i] = local[static_cast<std::size_t>(stream[i])];
    const std::int64_t lbos = local[static_cast<std::size_t>(bos)];
    const torch::Tensor used_t = torch::tensor(used, torch::kLong);

    if (!c.quiet)
      std::fprintf(stderr,
                   "tandem-train: corpus %zu files, %llu bytes, %zu tokens (%zu train, %zu held out), %zu distinct "
                   "tokens; tokenized in %.2f s\n",
                   static_cast<std::size_t>(std::count_if(files.begin(), files.end(),
                                                          [](const auto& f) { return f.first.duplicate_of.empty(); })),
                   static_cast<unsigned long long>(corpus_bytes), stream.size(), split, stream.size() - split,
                   used.size(), t_tokenize);

    // Parameters: N(0, 0.02) matrices (residual outputs scaled by 1/sqrt(2·layers)), ones for norms.
    torch::manual_seed(c.seed);
    const Dims d{shape.hidden, shape.heads, shape.kv_heads, shape.hidden / shape.heads, shape.intermediate,
                 shape.rms_eps};
    Params p;
    std::vector<torch::Tensor> decay, no_decay;
    {
      torch::NoGradGuard ng;
      const double std0 = 0.02, std_out = 0.02 / std::sqrt(2.0 * shape.layers);
      auto mat = [](std::int64_t r, std::int64_t k, double s) { return torch::randn({r, k}) * s; };
      p.embed_full = mat(shape.vocab, d.hidden, std0);
      p.embed = p.embed_full.index_select(0, used_t).clone();
      p.final_norm = torch::ones({d.hidden});
      for (int i = 0; i < shape.layers; ++i) {
        LayerW l;
        l.attn_norm = torch::ones({d.hidden});
        l.wq = mat(d.heads * d.head_dim, d.hidden, std0);
        l.wk = mat(d.kv_heads * d.head_dim, d.hidden, std0);
        l.wv = mat(d.kv_heads * d.head_dim, d.hidden, std0);
        l.wo = mat(d.hidden, d.heads * d.head_dim, std_out);
        l.mlp_norm = torch::ones({d.hidden});
        l.gate = mat(d.inter, d.hidden, std0);
        l.up = mat(d.inter, d.hidden, std0);
        l.down = mat(d.hidden, d.inter, std_out);
        p.layers.push_back(l);
      }
      std::vector<double> inv(static_cast<std::size_t>(d.head_dim / 2));
      for (std::size_t i = 0; i < inv.size(); ++i)
        inv[i] = 1.0 / std::pow(shape.rope_theta, (2.0 * static_cast<double>(i)) / static_cast<double>(d.head_dim));
      p.inv_freq = torch::tensor(inv, torch::kDouble).to(torch::kFloat);
    }
    decay.push_back(p.embed);
    no_decay.push_back(p.final_norm);
    for (auto& l : p.layers) {
      for (auto* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down}) decay.push_back(*t);
      no_decay.push_back(l.attn_norm);
      no_decay.push_back(l.mlp_norm);
    }
    std::vector<torch::Tensor> all_params = decay;
    all_params.insert(all_params.end(), no_decay.begin(), no_decay.end());
    for (auto& t : all_params) t.requires_grad_(true);

    // Held-out evaluation: consecutive windows over the last 5% of the stream.
    std::vector<std::size_t> eval_starts;
    for (std::size_t s = split; s + T + 1 <= stream.size(); s += T) eval_starts.push_back(s);
    const Batch eval_local = make_batch(lstream, eval_starts, c.seq_len, lbos);
    const Batch eval_full = make_batch(stream, eval_starts, c.seq_len, bos);
    const torch::Tensor mask = causal_mask(c.seq_len);
    // `full`: also score with the softmax over the whole vocabulary (the engine's view; 32000-row head, so only
    // after training) and count positions where a token that never occurs in the corpus would win.
    auto evaluate = [&](bool full_vocab) {
      torch::NoGradGuard ng;
      Eval e;
      e.loss = loss_of(forward(p, d, p.embed, eval_local.input, mask), p.embed, eval_local.target).item<double>();
      e.tokens = eval_local.target.ne(-100).sum().item<std::int64_t>();
      if (!full_vocab) return e;
      torch::Tensor full = p.embed_full.clone();
      full.index_copy_(0, used_t, p.embed);
      // In slices of 4 windows: the full-vocabulary logits of all held-out tokens would take ~0.4 GB.
      const torch::Tensor is_used = torch::zeros({shape.vocab}, torch::kBool).index_fill_(0, used_t, true);
      double loss_sum = 0, unused = 0;
      const std::int64_t W = eval_full.input.size(0);
      for (std::int64_t w0 = 0; w0 < W; w0 += 4) {
        const std::int64_t n = std::min<std::int64_t>(4, W - w0);
        const torch::Tensor h =
            forward(p, d, full, eval_full.input.narrow(0, w0, n), mask).reshape({-1, d.hidden});
        const torch::Tensor logits = torch::matmul(h, full.t());
        const torch::Tensor tg = eval_full.target.narrow(0, w0, n).reshape({-1});
        namespace F = torch::nn::functional;
        loss_sum += F::cross_entropy(logits, tg, F::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum))
                        .item<double>();
        unused += static_cast<double>(
            is_used.index_select(0, logits.argmax(-1)).logical_not().sum().item<std::int64_t>());
      }
      e.loss_full = loss_sum / static_cast<double>(std::max<std::int64_t>(1, e.tokens));
      e.unused_wins = unused / static_cast<double>(eval_full.target.numel());
      return e;
    };
    const Eval before = evaluate(false);
    if (!c.quiet)
      std::fprintf(stderr, "held-out before: loss %.4f over %lld tokens\n", before.loss,
                   static_cast<long long>(before.tokens));

    using torch::optim::AdamW;
    using torch::optim::AdamWOptions;
    std::vector<torch::optim::OptimizerParamGroup> groups;
    auto adamw = [&](double wd) {
      return std::make_unique<AdamWOptions>(AdamWOptions(c.lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(wd));
    };
    groups.emplace_back(decay, adamw(c.weight_decay));
    groups.emplace_back(no_decay, adamw(0));
    AdamW opt(std::move(groups), AdamWOptions(c.lr));

    int steps = c.steps;
    int warmup = std::max(1, c.steps / 20);
    auto lr_at = [&](int step) {  // step counts from 0
      if (step < warmup) return c.lr * (step + 1) / warmup;
      const double t = steps > warmup ? static_cast<double>(step - warmup) / (steps - warmup) : 1.0;
      return c.lr * (c.min_lr_frac + (1.0 - c.min_lr_frac) * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, t))));
    };

    const int workers = std::min(c.threads, c.batch);
    std::vector<Params> reps;
    for (int w = 0; w < workers; ++w) reps.push_back(replica(p));
    const std::vector<torch::Tensor*> master_slots = param_slots(p);
    std::mt19937_64 rng(c.seed);
    std::vector<std::pair<int, double>> curve{{0, before.loss}};  // held-out loss by step
    const std::size_t n_starts = split - T;  // window [s, s+T] lies inside the training part
    const auto t_train = Clock::now();
    double loss_ema = 0, last_loss = 0;
    int done = 0;
    bool cut = false;
    for (int step = 0; step < steps; ++step) {
      std::vector<std::size_t> starts(static_cast<std::size_t>(c.batch));
      for (auto& s : starts) s = static_cast<std::size_t>(rng() % n_starts);
      const Batch b = make_batch(lstream, starts, c.seq_len, lbos);
      const double lr = lr_at(step);
      for (auto& g : opt.param_groups()) static_cast<AdamWOptions&>(g.options()).lr(lr);
      const double scored = std::max<double>(1.0, static_cast<double>(b.target.ne(-100).sum().item<std::int64_t>()));
      std::vector<double> part_loss(static_cast<std::size_t>(workers), 0.0);
      std::vector<std::exception_ptr> errors(static_cast<std::size_t>(workers));
      auto work = [&](int w) {
        try {
          Params& r = reps[static_cast<std::size_t>(w)];
          for (auto* t : param_slots(r)) t->mutable_grad().reset();
          const std::int64_t b0 = c.batch * w / workers, b1 = c.batch * (w + 1) / workers;
          const torch::Tensor in = b.input.slice(0, b0, b1), tg = b.target.slice(0, b0, b1);
          const torch::Tensor h = forward(r, d, r.embed, in, mask);
          const torch::Tensor logits = torch::matmul(h.reshape({-1, d.hidden}), r.embed.t());
          namespace F = torch::nn::functional;
          const auto opts = F::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum);
          const torch::Tensor loss = F::cross_entropy(logits, tg.reshape({-1}), opts) / scored;
          loss.backward();
          part_loss[static_cast<std::size_t>(w)] = loss.item<double>();
        } catch (...) {
          errors[static_cast<std::size_t>(w)] = std::current_exception();
        }
      };
      {
        std::vector<std::thread> pool;
        for (int w = 1; w < workers; ++w) pool.emplace_back(work, w);
        work(0);
        for (auto& t : pool) t.join();
      }
      for (auto& e : errors)
        if (e) std::rethrow_exception(e);
      {
        torch::NoGradGuard ng;
        for (std::size_t i = 0; i < master_slots.size(); ++i) {
          torch::Tensor g = param_slots(reps[0])[i]->grad().clone();
          for (std::size_t w = 1; w < reps.size(); ++w) g.add_(param_slots(reps[w])[i]->grad());
          master_slots[i]->mutable_grad() = g;
        }
      }
      double loss_sum = 0;
      for (double l : part_loss) loss_sum += l;
      torch::nn::utils::clip_grad_norm_(all_params, c.clip);
      opt.step();
      last_loss = loss_sum;
      loss_ema = step == 0 ? last_loss : 0.9 * loss_ema + 0.1 * last_loss;
      done = step + 1;
      const double el = seconds_since(t_train);
      if (c.seconds > 0 && done == 10 && steps > 10) {
        const double per_step = el / done;
        const int fit = done + static_cast<int>(std::max(0.0, (c.seconds - el)) / per_step);
        if (fit < steps) {
          steps = std::max(fit, done);
          warmup = std::max(1, steps / 20);  // the schedule is re-planned over the new step count
          cut = true;
          if (!c.quiet)
            std::fprintf(stderr, "--seconds %.0f: %.3f s/step, training %d steps instead of %d\n", c.seconds,
                         per_step, steps, c.steps);
        }
      }
      if (!c.quiet && (done % 20 == 0 || done == steps || done == 1))
        std::fprintf(stderr, "step %5d/%d  loss %.4f  (avg %.4f)  lr %.2e  %.0f tok/s  %.1f s\n", done, steps,
                     last_loss, loss_ema, lr, static_cast<double>(done) * c.batch * c.seq_len / el, el);
      if (c.eval_every > 0 && done % c.eval_every == 0 && done < steps) {
        const Eval e = evaluate(false);
        curve.emplace_back(done, e.loss);
        if (!c.quiet) std::fprintf(stderr, "step %5d  held-out loss %.4f\n", done, e.loss);
      }
      if (c.seconds > 0 && el > c.seconds && done < steps) {
        cut = true;
        if (!c.quiet) std::fprintf(stderr, "--seconds %.0f reached after %d steps\n", c.seconds, done);
        break;
      }
    }
    const double train_seconds = seconds_since(t_train);
    const Eval after = evaluate(true);
    curve.emplace_back(done, after.loss);
    if (!c.quiet)
      std::fprintf(stderr,
                   "held-out after:  loss %.4f (corpus tokens) / %.4f (full vocabulary); argmax outside the corpus "
                   "vocabulary at %.2f%% of positions\n",
                   after.loss, after.loss_full, 100.0 * after.unused_wins);

    // Write the model: trained rows into the full embedding; unused rows keep their N(0, 0.02) init.
    std::map<std::string, torch::Tensor> named;
    std::string sample_text;
    std::vector<std::int64_t> sample_ids;
    {
      torch::NoGradGuard ng;
      torch::Tensor full = p.embed_full.clone();
      full.index_copy_(0, used_t, p.embed.detach());
      if (c.sample_tokens > 0) {
        const auto prompt = tok->encode(c.sample_prompt, /*add_bos=*/true);
        if (prompt.size() + static_cast<std::size_t>(c.sample_tokens) > static_cast<std::size_t>(shape.max_positions))
          throw TrainError{"--sample-prompt/--sample-tokens: " + std::to_string(prompt.size()) + " + " +
                           std::to_string(c.sample_tokens) + " tokens exceed the model's " +
                           std::to_string(shape.max_positions) + " positions"};
        sample_ids = greedy(p, d, full, std::vector<std::int64_t>(prompt.begin(), prompt.end()), c.sample_tokens);
        const std::vector<tok::TokenId> gen(sample_ids.begin(), sample_ids.end());
        sample_text = tok->decode(gen);
        if (!c.quiet)
          std::fprintf(stderr, "greedy sample (training forward): \"%s\" ->\n%s\n", c.sample_prompt.c_str(),
                       sample_text.c_str());
      }
      named["model.embed_tokens.weight"] = full;
      named["model.norm.weight"] = p.final_norm.detach();
      for (std::size_t i = 0; i < p.layers.size(); ++i) {
        const std::string pre = "model.layers." + std::to_string(i) + ".";
        const LayerW& l = p.layers[i];
        named[pre + "input_layernorm.weight"] = l.attn_norm.detach();
        named[pre + "self_attn.q_proj.weight"] = l.wq.detach();
        named[pre + "self_attn.k_proj.weight"] = l.wk.detach();
        named[pre + "self_attn.v_proj.weight"] = l.wv.detach();
        named[pre + "self_attn.o_proj.weight"] = l.wo.detach();
        named[pre + "post_attention_layernorm.weight"] = l.mlp_norm.detach();
        named[pre + "mlp.gate_proj.weight"] = l.gate.detach();
        named[pre + "mlp.up_proj.weight"] = l.up.detach();
        named[pre + "mlp.down_proj.weight"] = l.down.detach();
      }
    }
    modelgen::Options mo;
    mo.shape = shape;
    mo.dtype = weights::DType::f32;
    mo.tokenizer_model = c.tokenizer;
    std::string missing;
    mo.source = [&](const std::string& name, std::vector<float>& out) {
      const auto it = named.find(name);
      if (it == named.end() || static_cast<std::size_t>(it->second.numel()) != out.size()) {
        missing += (missing.empty() ? "" : ", ") + name;
        return;
      }
      const torch::Tensor t = it->second.contiguous().to(torch::kFloat);
      std::copy_n(t.data_ptr<float>(), out.size(), out.begin());
    };
    if (auto s = modelgen::write_model(c.out, mo); !s)
      throw TrainError{std::string(errc_name(s.error().code)) + ": " + s.error().message};
    if (!missing.empty()) throw TrainError{"internal: no trained tensor for " + missing};

    const double total_seconds = seconds_since(t_start);
    std::ostringstream j;
    j << "{\n  \"generator\": \"tandem-train\",\n  \"preset\": \"" << json_escape(c.preset) << "\",\n"
      << "  \"seed\": " << c.seed << ",\n  \"threads\": " << c.threads << ",\n"
      << "  \"steps\": " << done << ",\n  \"steps_requested\": " << c.steps << ",\n"
      << "  \"cut_by_time_budget\": " << (cut ? "true" : "false") << ",\n"
      << "  \"batch\": " << c.batch << ",\n  \"seq_len\": " << c.seq_len << ",\n"
      << "  \"optimizer\": {\"name\": \"AdamW\", \"lr\": " << fmt_double(c.lr) << ", \"warmup_steps\": " << warmup
      << ", \"schedule\": \"cosine\", \"min_lr\": " << fmt_double(c.lr * c.min_lr_frac)
      << ", \"betas\": [0.9, 0.95], \"weight_decay\": " << fmt_double(c.weight_decay)
      << ", \"grad_clip\": " << fmt_double(c.clip) << "},\n"
      << "  \"tokenizer\": \"" << json_escape(c.tokenizer) << "\",\n"
      << "  \"corpus\": {\n    \"bytes\": " << corpus_bytes << ",\n    \"tokens\": " << stream.size()
      << ",\n    \"train_tokens\": " << split << ",\n    \"heldout_tokens\": " << stream.size() - split
      << ",\n    \"distinct_tokens\": " << used.size() << ",\n    \"files\": [";
    for (std::size_t i = 0; i < files.size(); ++i) {
      const auto& f = files[i].first;
      j << (i ? ",\n" : "\n") << "      {\"path\": \"" << json_escape(f.path) << "\", \"bytes\": " << f.bytes
        << ", \"sha256\": \"" << f.sha256 << "\"";
      if (f.duplicate_of.empty()) j << ", \"tokens\": " << f.tokens;
      else j << ", \"duplicate_of\": \"" << json_escape(f.duplicate_of) << "\"";
      j << "}";
    }
    j << "\n    ]\n  },\n"
      << "  \"loss\": {\n    \"train_final\": " << fmt_double(last_loss) << ",\n    \"train_final_avg\": "
      << fmt_double(loss_ema) << ",\n    \"heldout_before\": " << fmt_double(before.loss)
      << ",\n    \"heldout_after\": " << fmt_double(after.loss)
      << ",\n    \"heldout_after_full_vocab\": " << fmt_double(after.loss_full)
      << ",\n    \"heldout_argmax_outside_corpus_vocab\": " << fmt_double(after.unused_wins)
      << ",\n    \"heldout_tokens_scored\": " << after.tokens << ",\n    \"heldout_by_step\": [";
    for (std::size_t i = 0; i < curve.size(); ++i)
      j << (i ? ", " : "") << "[" << curve[i].first << ", " << fmt_double(curve[i].second) << "]";
    j << "]\n  },\n"
      << "  \"sample\": {\"prompt\": \"" << json_escape(c.sample_prompt) << "\", \"greedy_text\": \""
      << json_escape(sample_text) << "\", \"greedy_ids\": [";
    for (std::size_t i = 0; i < sample_ids.size(); ++i) j << (i ? "," : "") << sample_ids[i];
    j << "]},\n"
      << "  \"seconds\": {\"tokenize\": " << fmt_double(t_tokenize) << ", \"train\": " << fmt_double(train_seconds)
      << ", \"total\": " << fmt_double(total_seconds) << "},\n"
      << "  \"libtorch\": \"" << TORCH_VERSION << "\"\n}\n";
    {
      std::ofstream f(fs::path(c.out) / "training.json", std::ios::binary | std::ios::trunc);
      f << j.str();
      f.close();
      if (!f) throw TrainError{"cannot write " + (fs::path(c.out) / "training.json").string()};
    }
    std::printf("wrote %s: %d steps in %.1f s (total %.1f s), train loss %.4f, held-out loss %.4f -> %.4f\n",
                c.out.c_str(), done, train_seconds, total_seconds, loss_ema, before.loss, after.loss);
    return 0;
  } catch (const TrainError& e) {
    std::fprintf(stderr, "tandem-train: %s\n", e.message.c_str());
    return 1;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "tandem-train: libtorch: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-train: %s\n", e.what());
    return 1;
  }
}
