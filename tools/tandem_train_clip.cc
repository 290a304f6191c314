// tandem-train-clip: trains the bundled default embedding model (CLIP layout, preset "clip-small") contrastively on
// rendered scenes with captions (src/modelgen/clip_data.h) so that the demo can index a folder of images and find
// "a blue circle". The model is written in Hugging Face's CLIPModel layout (modelgen::write_clip_model) with a CLIP
// tokenizer trained on the captions (vocab.json + merges.txt), plus training.json.
//
// The forward pass is torch::nn modules named and computed as transformers' CLIPModel (pre-LN encoder layers, q
// scaled by head_dim^-0.5, causal text mask, quick_gelu, pooling at the first EOS, class token + pre_layrnorm +
// post_layernorm, bias-free projections, L2 normalisation), so the parameters' names are the tensors' HF names and
// engine::ClipModel loads them unchanged; the tool checks that at the end. Deterministic for a given (seed, steps,
// thread count, library versions) unless --seconds cuts it short. docs/default-embedding-model.md.
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
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cli_args.h"
#include "train_util.h"
#include "core/text.h"
#include "engine/clip.h"
#include "image/image.h"
#include "modelgen/clip_data.h"
#include "modelgen/clip_writer.h"
#include "tokenizer/clip_vocab.h"
#include "tokenizer/model_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "weights/clip_layout.h"

namespace {

namespace fs = std::filesystem;
namespace cd = tandem::modelgen::clipdata;
using TrainTimer = std::chrono::steady_clock;

const char* kUsage =
    "usage: tandem-train-clip --out DIR [options]\n"
    "       tandem-train-clip --render DIR N [--scene-seed S] [--size PX]\n"
    "Trains the default embedding model (CLIP layout, preset clip-small) on rendered shapes with captions and writes\n"
    "it (config.json, model.safetensors, preprocessor_config.json, vocab.json, merges.txt, tokenizer.json) plus\n"
    "training.json; then checks that engine::ClipModel reproduces the training forward on the written files.\n"
    "  --steps N          optimizer steps (default 600)\n"
    "  --seconds S        also stop within S seconds of training: after 30 steps the step count is lowered to fit\n"
    "                     (the schedule follows); the result then depends on machine speed. Default 360, a cap that\n"
    "                     only a slow or busy machine reaches (0 = none)\n"
    "  --quick            a short run for tests: 150 steps of batch 64, 1 thread, no time cap (deterministic)\n"
    "  --seed N           init and caption-choice seed (default 1)\n"
    "  --threads N        worker threads, each taking a share of the batch (default 2; the float results depend on it)\n"
    "  --batch N          scenes per step (default 128)\n"
    "  --lr X             peak learning rate of AdamW (default 0.0005; 5% warmup, cosine decay to 10%)\n"
    "  --vocab N          tokenizer size cap (default 1024; BPE stops earlier when every caption word is one token)\n"
    "  --heldout N        held-out scenes scored at the end (default 200)\n"
    "  --eval-every N     held-out figures every N steps (default 100; 0 = only before and after)\n"
    "  --quiet            no progress lines on stderr\n"
    "  --render DIR N     write N scenes as PNGs named by content (0007-blue-circle.png) and exit\n"
    "  --scene-seed S     the scenes --render draws (default: the held-out seed, never trained on)\n"
    "  --size PX          --render image size (default 64, the model's input size)\n";

struct Config {
  std::string out;
  int steps = 600;
  double seconds = 360;
  bool quick = false;
  std::uint64_t seed = 1;
  int threads = 2;
  int batch = 128;
  double lr = 5e-4;  // 2e-3 collapses (every embedding alike, loss stuck at ln B); 1e-3 learns later
  double weight_decay = 0.1;
  double min_lr_frac = 0.1;
  double clip = 1.0;
  int vocab = 1024;
  int heldout = 200;
  int eval_every = 100;
  bool quiet = false;
  std::string render_dir;
  int render_n = 0;
  std::uint64_t scene_seed = cd::kHeldoutSeed;
  int size = static_cast<int>(cd::kImageSize);
};

struct TrainError {
  std::string message;
};

using tandem::train::cpu_model;
using tandem::train::fmt;
using tandem::train::seconds_since;

// ---- the model: transformers' CLIPModel, module for module -------------------------------------------------------

torch::Tensor quick_gelu(const torch::Tensor& x) { return x * torch::sigmoid(1.702 * x); }

struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int hidden, int heads_) : heads(heads_), head_dim(hidden / heads_) {
    k_proj = register_module("k_proj", torch::nn::Linear(hidden, hidden));
    v_proj = register_module("v_proj", torch::nn::Linear(hidden, hidden));
    q_proj = register_module("q_proj", torch::nn::Linear(hidden, hidden));
    out_proj = register_module("out_proj", torch::nn::Linear(hidden, hidden));
  }
  // x [B, T, hidden]; mask: additive [T, T] or undefined.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const std::int64_t B = x.size(0), T = x.size(1);
    auto split = [&](const torch::Tensor& t) { return t.view({B, T, heads, head_dim}).transpose(1, 2); };
    const torch::Tensor q = split(q_proj(x) * (1.0 / std::sqrt(static_cast<double>(head_dim))));
    const torch::Tensor k = split(k_proj(x)), v = split(v_proj(x));
    torch::Tensor s = torch::matmul(q, k.transpose(-1, -2));
    if (mask.defined()) s = s + mask;
    const torch::Tensor o = torch::matmul(torch::softmax(s, -1), v);
    return out_proj(o.transpose(1, 2).reshape({B, T, heads * head_dim}));
  }
  std::int64_t heads, head_dim;
  torch::nn::Linear k_proj{nullptr}, v_proj{nullptr}, q_proj{nullptr}, out_proj{nullptr};
};
TORCH_MODULE(Attention);

struct MlpImpl : torch::nn::Module {
  MlpImpl(int hidden, int inter) {
    fc1 = register_module("fc1", torch::nn::Linear(hidden, inter));
    fc2 = register_module("fc2", torch::nn::Linear(inter, hidden));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(quick_gelu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

torch::nn::LayerNorm layer_norm(int hidden, double eps) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden}).eps(eps));
}

struct EncoderLayerImpl : torch::nn::Module {
  EncoderLayerImpl(const tandem::weights::ClipTowerShape& s) {
    self_attn = register_module("self_attn", Attention(s.hidden, s.heads));
    layer_norm1 = register_module("layer_norm1", layer_norm(s.hidden, s.eps));
    mlp = register_module("mlp", Mlp(s.hidden, s.intermediate));
    layer_norm2 = register_module("layer_norm2", layer_norm(s.hidden, s.eps));
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& mask) {
    x = x + self_attn(layer_norm1(x), mask);
    return x + mlp(layer_norm2(x));
  }
  Attention self_attn{nullptr};
  torch::nn::LayerNorm layer_norm1{nullptr}, layer_norm2{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(EncoderLayer);

struct EncoderImpl : torch::nn::Module {
  explicit EncoderImpl(const tandem::weights::ClipTowerShape& s) {
    layers = register_module("layers", torch::nn::ModuleList());
    for (int i = 0; i < s.layers; ++i) layers->push_back(EncoderLayer(s));
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& mask) {
    for (const auto& l : *layers) x = l->as<EncoderLayer>()->forward(x, mask);
    return x;
  }
  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(Encoder);

struct TextEmbeddingsImpl : torch::nn::Module {
  TextEmbeddingsImpl(int vocab, const tandem::weights::ClipTowerShape& s) {
    token_embedding = register_module("token_embedding", torch::nn::Embedding(vocab, s.hidden));
    position_embedding = register_module("position_embedding", torch::nn::Embedding(s.positions, s.hidden));
  }
  torch::Tensor forward(const torch::Tensor& ids) {
    return token_embedding(ids) + position_embedding->weight.narrow(0, 0, ids.size(1)).unsqueeze(0);
  }
  torch::nn::Embedding token_embedding{nullptr}, position_embedding{nullptr};
};
TORCH_MODULE(TextEmbeddings);

struct TextTransformerImpl : torch::nn::Module {
  TextTransformerImpl(int vocab, const tandem::weights::ClipTowerShape& s) {
    embeddings = register_module("embeddings", TextEmbeddings(vocab, s));
    encoder = register_module("encoder", Encoder(s));
    final_layer_norm = register_module("final_layer_norm", layer_norm(s.hidden, s.eps));
  }
  // ids [B, T] (BOS ... EOS, padded after EOS), eos [B]: the first EOS position of each row → pooled [B, hidden].
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& eos) {
    const std::int64_t T = ids.size(1);
    const torch::Tensor mask = torch::full({T, T}, -std::numeric_limits<float>::infinity()).triu(1);
    const torch::Tensor h = final_layer_norm(encoder(embeddings(ids), mask));
    return h.index({torch::arange(ids.size(0)), eos});
  }
  TextEmbeddings embeddings{nullptr};
  Encoder encoder{nullptr};
  torch::nn::LayerNorm final_layer_norm{nullptr};
};
TORCH_MODULE(TextTransformer);

struct VisionEmbeddingsImpl : torch::nn::Module {
  VisionEmbeddingsImpl(const tandem::weights::ClipTowerShape& s, int channels, int patch, int positions) {
    class_embedding = register_parameter("class_embedding", torch::zeros({s.hidden}));
    patch_embedding = register_module(
        "patch_embedding",
        torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, s.hidden, patch).stride(patch).bias(false)));
    position_embedding = register_module("position_embedding", torch::nn::Embedding(positions, s.hidden));
  }
  torch::Tensor forward(const torch::Tensor& pixels) {
    const std::int64_t B = pixels.size(0);
    const torch::Tensor patches = patch_embedding(pixels).flatten(2).transpose(1, 2);  // [B, n, hidden]
    const torch::Tensor cls = class_embedding.view({1, 1, -1}).expand({B, 1, class_embedding.size(0)});
    return torch::cat({cls, patches}, 1) + position_embedding->weight.unsqueeze(0);
  }
  torch::Tensor class_embedding;
  torch::nn::Conv2d patch_embedding{nullptr};
  torch::nn::Embedding position_embedding{nullptr};
};
TORCH_MODULE(VisionEmbeddings);

struct VisionTransformerImpl : torch::nn::Module {
  VisionTransformerImpl(const tandem::weights::ClipTowerShape& s, int channels, int patch, int positions) {
    embeddings = register_module("embeddings", VisionEmbeddings(s, channels, patch, positions));
    pre_layrnorm = register_module("pre_layrnorm", layer_norm(s.hidden, s.eps));  // sic, as transformers
    encoder = register_module("encoder", Encoder(s));
    post_layernorm = register_module("post_layernorm", layer_norm(s.hidden, s.eps));
  }
  torch::Tensor forward(const torch::Tensor& pixels) {
    const torch::Tensor h = encoder(pre_layrnorm(embeddings(pixels)), torch::Tensor());
    return post_layernorm(h.select(1, 0));
  }
  VisionEmbeddings embeddings{nullptr};
  torch::nn::LayerNorm pre_layrnorm{nullptr}, post_layernorm{nullptr};
  Encoder encoder{nullptr};
};
TORCH_MODULE(VisionTransformer);

struct ClipImpl : torch::nn::Module {
  explicit ClipImpl(const tandem::weights::ClipConfig& c) {
    text_model = register_module("text_model", TextTransformer(c.vocab, c.text));
    vision_model = register_module("vision_model", VisionTransformer(c.vision, c.channels, c.patch_size,
                                                                     1 + c.patches()));
    visual_projection = register_module(
        "visual_projection", torch::nn::Linear(torch::nn::LinearOptions(c.vision.hidden, c.projection_dim).bias(false)));
    text_projection = register_module(
        "text_projection", torch::nn::Linear(torch::nn::LinearOptions(c.text.hidden, c.projection_dim).bias(false)));
    logit_scale = register_parameter("logit_scale", torch::full({}, c.logit_scale));
  }
  torch::Tensor embed_texts(const torch::Tensor& ids, const torch::Tensor& eos) {
    return torch::nn::functional::normalize(text_projection(text_model(ids, eos)),
                                            torch::nn::functional::NormalizeFuncOptions().dim(-1));
  }
  torch::Tensor embed_images(const torch::Tensor& pixels) {
    return torch::nn::functional::normalize(visual_projection(vision_model(pixels)),
                                            torch::nn::functional::NormalizeFuncOptions().dim(-1));
  }
  TextTransformer text_model{nullptr};
  VisionTransformer vision_model{nullptr};
  torch::nn::Linear visual_projection{nullptr}, text_projection{nullptr};
  torch::Tensor logit_scale;
};
TORCH_MODULE(Clip);

// transformers' CLIPPreTrainedModel._init_weights (initializer_factor 1): token / position embeddings N(0, 0.02),
// class embedding N(0, hidden^-0.5), patch embedding N(0, 0.02); attention q/k/v N(0, hidden^-0.5 · (2·layers)^-0.5),
// out_proj N(0, hidden^-0.5); fc1 N(0, (2·hidden)^-0.5), fc2 N(0, hidden^-0.5 · (2·layers)^-0.5); projections
// N(0, hidden^-0.5); biases 0; layer norms 1 / 0.
void init_weights(Clip& m, const tandem::weights::ClipConfig& c) {
  torch::NoGradGuard ng;
  for (auto& item : m->named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor& p = item.value();
    const bool text = name.rfind("text_model.", 0) == 0 || name == "text_projection.weight";
    const auto& s = text ? c.text : c.vision;
    const double h = s.hidden, L = s.layers;
    const double in_std = std::pow(h, -0.5) * std::pow(2 * L, -0.5), out_std = std::pow(h, -0.5);
    auto has = [&](const char* x) { return name.find(x) != std::string::npos; };
    if (name == "logit_scale") continue;
    if (has("norm")) p.fill_(name.ends_with(".weight") ? 1.0 : 0.0);
    else if (name.ends_with(".bias")) p.zero_();
    else if (has("class_embedding")) p.normal_(0, std::pow(h, -0.5));
    else if (has("embedding")) p.normal_(0, 0.02);
    else if (has("q_proj") || has("k_proj") || has("v_proj") || has("fc2")) p.normal_(0, in_std);
    else if (has("out_proj")) p.normal_(0, out_std);
    else if (has("fc1")) p.normal_(0, std::pow(2 * h, -0.5));
    else if (has("projection")) p.normal_(0, std::pow(h, -0.5));
    else throw TrainError{"internal: no init rule for " + name};
  }
}

// ---- data ----------------------------------------------------------------------------------------------------

// Token ids of captions, BOS ... EOS, through the tokenizer that is written with the model (cached: captions repeat).
class Captions {
 public:
  explicit Captions(const tandem::tok::Tokenizer& t) : tok_(t) {}
  const std::vector<std::int64_t>& ids(const std::string& text) {
    auto it = cache_.find(text);
    if (it != cache_.end()) return it->second;
    const auto v = tok_.encode(text, /*add_bos=*/true, /*add_eos=*/true);
    return cache_.emplace(text, std::vector<std::int64_t>(v.begin(), v.end())).first->second;
  }

 private:
  const tandem::tok::Tokenizer& tok_;
  std::unordered_map<std::string, std::vector<std::int64_t>> cache_;
};

struct TextBatch {
  torch::Tensor ids, eos;  // [B, T] padded with EOS, [B]
};

TextBatch text_batch(const std::vector<const std::vector<std::int64_t>*>& rows, std::int64_t eos_id,
                     std::int64_t max_positions) {
  std::size_t T = 0;
  for (const auto* r : rows) T = std::max(T, r->size());
  if (static_cast<std::int64_t>(T) > max_positions)
    throw TrainError{"a caption has " + std::to_string(T) + " tokens, the model " + std::to_string(max_positions)};
  TextBatch b{torch::full({static_cast<std::int64_t>(rows.size()), static_cast<std::int64_t>(T)}, eos_id, torch::kLong),
              torch::empty({static_cast<std::int64_t>(rows.size())}, torch::kLong)};
  auto ia = b.ids.accessor<std::int64_t, 2>();
  auto ea = b.eos.accessor<std::int64_t, 1>();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = *rows[i];
    for (std::size_t j = 0; j < r.size(); ++j) ia[static_cast<std::int64_t>(i)][static_cast<std::int64_t>(j)] = r[j];
    const auto e = std::find(r.begin(), r.end(), eos_id);
    if (e == r.end()) throw TrainError{"internal: a caption without EOS"};
    ea[static_cast<std::int64_t>(i)] = e - r.begin();
  }
  return b;
}

// [n, 3, S, S] through image::clip_preprocess (the daemon's preprocessing).
torch::Tensor pixel_batch(const std::vector<const tandem::image::Rgb8*>& imgs, const tandem::image::ClipPreprocess& pp) {
  const std::int64_t S = pp.crop;
  torch::Tensor t = torch::empty({static_cast<std::int64_t>(imgs.size()), 3, S, S});
  float* dst = t.data_ptr<float>();
  for (const auto* img : imgs) {
    const std::vector<float> chw = tandem::image::clip_preprocess(*img, pp);
    if (static_cast<std::int64_t>(chw.size()) != 3 * S * S) throw TrainError{"internal: preprocessing size"};
    dst = std::copy(chw.begin(), chw.end(), dst);
  }
  return t;
}

// ---- held-out evaluation ---------------------------------------------------------------------------------------

struct Heldout {
  std::vector<cd::Scene> pool;
  std::vector<cd::ShortQuery> queries;
  torch::Tensor pixels;          // [n, 3, S, S]
  TextBatch full, shorts;        // full captions (one per scene), short queries
};

struct Embeddings {
  torch::Tensor images, full, shorts;  // normalised rows
};

Embeddings embed_heldout(Clip& m, const Heldout& h) {
  torch::NoGradGuard ng;
  return {m->embed_images(h.pixels), m->embed_texts(h.full.ids, h.full.eos), m->embed_texts(h.shorts.ids, h.shorts.eos)};
}

std::span<const float> span_of(const torch::Tensor& t) {
  return {t.data_ptr<float>(), static_cast<std::size_t>(t.numel())};
}

cd::Retrieval score(const Heldout& h, const Embeddings& e) {
  const auto dim = static_cast<std::size_t>(e.images.size(1));
  const torch::Tensor i = e.images.contiguous(), f = e.full.contiguous(), s = e.shorts.contiguous();
  return cd::retrieval(h.pool, span_of(i), span_of(f), span_of(s), dim);
}

std::string rate_json(const cd::Rate& r) {
  return "{\"hit\": " + fmt(r.hit) + ", \"chance\": " + fmt(r.chance) + ", \"queries\": " + std::to_string(r.queries) +
         "}";
}

std::string retrieval_json(const cd::Retrieval& r, const std::string& indent) {
  return "{\n" + indent + "  \"text_to_image_top1\": " + rate_json(r.text_top1) + ",\n" + indent +
         "  \"text_to_image_top5\": " + rate_json(r.text_top5) + ",\n" + indent +
         "  \"short_query_top1\": " + rate_json(r.short_top1) + ",\n" + indent +
         "  \"short_query_top5\": " + rate_json(r.short_top5) + ",\n" + indent +
         "  \"image_to_image_top1\": " + rate_json(r.image_top1) + ",\n" + indent +
         "  \"image_to_image_top5\": " + rate_json(r.image_top5) + "\n" + indent + "}";
}

void print_retrieval(const char* what, const cd::Retrieval& r) {
  std::fprintf(stderr,
               "%s: text->image top-1 %.1f%% top-5 %.1f%% (chance %.1f%% / %.1f%%); \"a <colour> <shape>\" top-1 "
               "%.1f%% top-5 %.1f%% (chance %.1f%% / %.1f%%); image->image top-1 %.1f%% (chance %.1f%%)\n",
               what, 100 * r.text_top1.hit, 100 * r.text_top5.hit, 100 * r.text_top1.chance, 100 * r.text_top5.chance,
               100 * r.short_top1.hit, 100 * r.short_top5.hit, 100 * r.short_top1.chance, 100 * r.short_top5.chance,
               100 * r.image_top1.hit, 100 * r.image_top1.chance);
}

int render_mode(const Config& c) {
  std::error_code ec;
  fs::create_directories(c.render_dir, ec);
  if (ec) {
    std::fprintf(stderr, "tandem-train-clip: cannot create %s: %s\n", c.render_dir.c_str(), ec.message().c_str());
    return 1;
  }
  for (int i = 0; i < c.render_n; ++i) {
    const cd::Scene s = cd::render(c.scene_seed, static_cast<std::uint64_t>(i), static_cast<std::uint32_t>(c.size));
    auto png = tandem::image::encode_png(s.image);
    if (!png) {
      std::fprintf(stderr, "tandem-train-clip: %s\n", png.error().message.c_str());
      return 1;
    }
    const fs::path p = fs::path(c.render_dir) / cd::file_name(s);
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(png->data()), static_cast<std::streamsize>(png->size()));
    f.close();
    if (!f) {
      std::fprintf(stderr, "tandem-train-clip: cannot write %s\n", p.c_str());
      return 1;
    }
  }
  if (!c.quiet) std::fprintf(stderr, "wrote %d scenes (seed %llu, %d px) to %s\n", c.render_n,
                             static_cast<unsigned long long>(c.scene_seed), c.size, c.render_dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem;
  Config c;
  bool steps_set = false, seconds_set = false, batch_set = false, threads_set = false;
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
      else if (f == "--batch") c.batch = cli::parse_number<int>(f, a.value(), 2, 4096), batch_set = true;
      else if (f == "--lr") c.lr = cli::parse_number<double>(f, a.value(), 1e-7, 1.0);
      else if (f == "--vocab") c.vocab = cli::parse_number<int>(f, a.value(), 514, 49408);
      else if (f == "--heldout") c.heldout = cli::parse_number<int>(f, a.value(), 10, 100000);
      else if (f == "--eval-every") c.eval_every = cli::parse_number<int>(f, a.value(), 0, 10000000);
      else if (f == "--quiet") c.quiet = true;
      else if (f == "--render") {
        c.render_dir = a.value();
        c.render_n = cli::parse_number<int>(f, a.value(), 1, 1000000);
      } else if (f == "--scene-seed") c.scene_seed = cli::parse_number<std::uint64_t>(f, a.value(), 0, UINT64_MAX);
      else if (f == "--size") c.size = cli::parse_number<int>(f, a.value(), 8, 4096);
      else if (f == "-h" || f == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      } else {
        throw cli::ArgError{"unknown option " + std::string(f)};
      }
    }
    if (!c.render_dir.empty()) return render_mode(c);
    if (c.out.empty()) throw cli::ArgError{"--out DIR is required"};
  } catch (const cli::ArgError& e) {
    std::fprintf(stderr, "tandem-train-clip: %s\n%s", e.message.c_str(), kUsage);
    return 2;
  }
  if (c.quick) {
    if (!steps_set) c.steps = 150;
    if (!batch_set) c.batch = 64;
    if (!threads_set) c.threads = 1;
    if (!seconds_set) c.seconds = 0;
  }

  const auto t_start = TrainTimer::now();
  try {
    // As tandem-train: single-threaded ATen and OpenBLAS in each worker, large buffers kept in the heap.
    at::set_num_threads(1);
    using SetThreads = void (*)(int);
    if (const auto ob = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) ob(1);
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);

    // 1. The tokenizer: byte-level BPE on the training captions, written first so that training encodes with
    //    exactly what the daemon will load.
    std::error_code ec;
    fs::create_directories(c.out, ec);
    if (ec) throw TrainError{"cannot create " + c.out + ": " + ec.message()};
    const auto corpus = cd::caption_corpus(cd::kTrainSeed, 2000);
    const tok::ClipVocab vocab = tok::train_clip_bpe(corpus, static_cast<std::size_t>(c.vocab));
    if (auto s = tok::write_clip_tokenizer_files(c.out, vocab); !s) throw TrainError{s.error().message};
    auto tokr = tok::load_tokenizer_files(c.out);
    if (!tokr) throw TrainError{"reading back the tokenizer: " + tokr.error().message};
    const tok::Tokenizer& tokenizer = *tokr;
    const auto n_vocab = static_cast<int>(vocab.tokens.size());
    if (tokenizer.vocab_size() != n_vocab || tokenizer.bos_id() != n_vocab - 2 || tokenizer.eos_id() != n_vocab - 1)
      throw TrainError{"internal: the tokenizer read back has " + std::to_string(tokenizer.vocab_size()) +
                       " tokens, BOS " + std::to_string(tokenizer.bos_id()) + ", EOS " +
                       std::to_string(tokenizer.eos_id())};
    const double t_tokenizer = seconds_since(t_start);

    // 2. The shape: clip-small with the trained vocabulary; EOS is not 2, so pooling is at the first EOS.
    auto shape_r = modelgen::clip_preset("clip-small");
    if (!shape_r) throw TrainError{shape_r.error().message};
    modelgen::ClipShape shape = *shape_r;
    shape.vocab = n_vocab;
    shape.bos_id = n_vocab - 2;
    shape.eos_id = n_vocab - 1;
    shape.pad_id = n_vocab - 1;
    const weights::ClipConfig cfg = shape.config();
    image::ClipPreprocess pp;
    pp.size = pp.crop = static_cast<std::uint32_t>(shape.image_size);
    for (int i = 0; i < 3; ++i) {
      pp.mean[i] = shape.image_mean[static_cast<std::size_t>(i)];
      pp.std[i] = shape.image_std[static_cast<std::size_t>(i)];
    }
    if (static_cast<std::uint32_t>(shape.image_size) != cd::kImageSize)
      throw TrainError{"internal: the preset's image size is not the data set's"};
    Captions caps(tokenizer);
    const std::int64_t eos_id = shape.eos_id;

    // 3. The model, its replicas (same storage, their own autograd leaves) and the optimizer.
    torch::manual_seed(c.seed);
    Clip model(cfg);
    init_weights(model, cfg);
    const int workers = std::min(c.threads, c.batch);
    std::vector<Clip> reps{model};
    for (int w = 1; w < workers; ++w) {
      Clip r(cfg);
      auto src = model->named_parameters();
      for (auto& item : r->named_parameters()) item.value().set_data(src[item.key()]);
      reps.push_back(r);
    }
    std::vector<torch::Tensor> decay, no_decay;
    for (auto& item : model->named_parameters())
      (item.value().dim() >= 2 ? decay : no_decay).push_back(item.value());  // open_clip's rule: gains, biases, logit_scale undecayed
    std::vector<torch::Tensor> all_params = model->parameters();
    std::int64_t n_params = 0;
    for (const auto& p : all_params) n_params += p.numel();

    // Held-out pool.
    Heldout held;
    held.pool = cd::heldout_scenes(static_cast<std::size_t>(c.heldout));
    held.queries = cd::short_queries(held.pool);
    {
      std::vector<const image::Rgb8*> imgs;
      std::vector<const std::vector<std::int64_t>*> full, shorts;
      for (const auto& s : held.pool) {
        imgs.push_back(&s.image);
        full.push_back(&caps.ids(cd::full_caption(s)));
      }
      for (const auto& q : held.queries) shorts.push_back(&caps.ids(q.text));
      held.pixels = pixel_batch(imgs, pp);
      held.full = text_batch(full, eos_id, cfg.text.positions);
      held.shorts = text_batch(shorts, eos_id, cfg.text.positions);
    }
    const cd::Retrieval before = score(held, embed_heldout(model, held));
    if (!c.quiet) {
      std::fprintf(stderr,
                   "tandem-train-clip: tokenizer %d tokens (%zu merges) in %.2f s; model %.2fM parameters; %d "
                   "held-out scenes, %zu short queries\n",
                   n_vocab, vocab.merges.size(), t_tokenizer, static_cast<double>(n_params) / 1e6, c.heldout,
                   held.queries.size());
      print_retrieval("held-out at init", before);
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
    int warmup = std::max(1, steps / 20);
    auto lr_at = [&](int step) {
      if (step < warmup) return c.lr * (step + 1) / warmup;
      const double t = steps > warmup ? static_cast<double>(step - warmup) / (steps - warmup) : 1.0;
      return c.lr * (c.min_lr_frac + (1.0 - c.min_lr_frac) * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, t))));
    };
    const double max_scale = std::log(100.0);  // CLIP clamps the logit multiplier at 100

    // 4. Training. Step s uses scenes [s·B, (s+1)·B) of the training stream and one caption of each, drawn from
    //    mt19937_64(seed). Positives: caption i describes scene j when it is one of captions(scene j) — the
    //    duplicates a batch holds ("a red circle" twice) are positives too, not negatives (multi-positive InfoNCE,
    //    symmetric, soft targets).
    std::mt19937_64 rng(c.seed);
    std::vector<std::pair<int, cd::Retrieval>> curve;
    const auto t_train = TrainTimer::now();
    double loss_ema = 0, last_loss = 0, first_loss = 0, el_at_5 = 0;
    constexpr int kPlanAt = 30;  // --seconds replans the step count here
    int done = 0;
    bool cut = false;
    std::uint64_t next_scene = 0;
    for (int step = 0; step < steps; ++step) {
      const auto B = static_cast<std::size_t>(c.batch);
      std::vector<cd::Scene> scenes;
      scenes.reserve(B);
      std::vector<std::string> text(B);
      std::vector<const std::vector<std::int64_t>*> rows(B);
      for (std::size_t i = 0; i < B; ++i) {
        scenes.push_back(cd::render(cd::kTrainSeed, next_scene++));
        const auto cs = cd::captions(scenes.back());
        text[i] = cs[rng() % cs.size()];
        rows[i] = &caps.ids(text[i]);
      }
      torch::Tensor pos = torch::zeros({c.batch, c.batch});
      {
        auto pa = pos.accessor<float, 2>();
        for (std::size_t j = 0; j < B; ++j) {
          const auto cs = cd::captions(scenes[j]);
          const std::set<std::string> set(cs.begin(), cs.end());
          for (std::size_t i = 0; i < B; ++i)
            if (set.count(text[i])) pa[static_cast<std::int64_t>(i)][static_cast<std::int64_t>(j)] = 1;
        }
      }
      const double lr = lr_at(step);
      for (auto& g : opt.param_groups()) static_cast<AdamWOptions&>(g.options()).lr(lr);
      for (auto& r : reps)
        for (auto& p : r->parameters()) p.mutable_grad().reset();

      // Forward of each worker's slice, with its graph kept for the backward below.
      std::vector<torch::Tensor> img_emb(static_cast<std::size_t>(workers)), txt_emb(static_cast<std::size_t>(workers));
      std::vector<std::exception_ptr> errors(static_cast<std::size_t>(workers));
      auto slice = [&](int w) {
        return std::pair<std::size_t, std::size_t>{B * static_cast<std::size_t>(w) / static_cast<std::size_t>(workers),
                                                   B * static_cast<std::size_t>(w + 1) / static_cast<std::size_t>(workers)};
      };
      auto run = [&](const std::function<void(int)>& f) {
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
      };
      run([&](int w) {
        const auto [b0, b1] = slice(w);
        std::vector<const image::Rgb8*> imgs;
        std::vector<const std::vector<std::int64_t>*> r(rows.begin() + static_cast<std::ptrdiff_t>(b0),
                                                        rows.begin() + static_cast<std::ptrdiff_t>(b1));
        for (std::size_t i = b0; i < b1; ++i) imgs.push_back(&scenes[i].image);
        Clip& m = reps[static_cast<std::size_t>(w)];
        const TextBatch tb = text_batch(r, eos_id, cfg.text.positions);
        img_emb[static_cast<std::size_t>(w)] = m->embed_images(pixel_batch(imgs, pp));
        txt_emb[static_cast<std::size_t>(w)] = m->embed_texts(tb.ids, tb.eos);
      });
      // The loss on detached copies: its gradient with respect to each embedding row, and the logit scale's.
      std::vector<torch::Tensor> id, td;
      for (int w = 0; w < workers; ++w) {
        id.push_back(img_emb[static_cast<std::size_t>(w)].detach());
        td.push_back(txt_emb[static_cast<std::size_t>(w)].detach());
      }
      const torch::Tensor I = torch::cat(id).requires_grad_(true), Tx = torch::cat(td).requires_grad_(true);
      const torch::Tensor logits = model->logit_scale.exp() * torch::matmul(Tx, I.t());  // [text, image]
      const torch::Tensor t2i = pos / pos.sum(1, true), i2t = (pos / pos.sum(0, true)).t();
      const torch::Tensor loss = 0.5 * (-(t2i * torch::log_softmax(logits, 1)).sum(1).mean() -
                                        (i2t * torch::log_softmax(logits.t(), 1)).sum(1).mean());
      loss.backward();
      run([&](int w) {
        const auto [b0, b1] = slice(w);
        const auto n = static_cast<std::int64_t>(b1 - b0);
        torch::autograd::backward({img_emb[static_cast<std::size_t>(w)], txt_emb[static_cast<std::size_t>(w)]},
                                  {I.grad().narrow(0, static_cast<std::int64_t>(b0), n),
                                   Tx.grad().narrow(0, static_cast<std::int64_t>(b0), n)});
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
      }
      const double grad_norm = torch::nn::utils::clip_grad_norm_(all_params, c.clip);
      opt.step();
      {
        torch::NoGradGuard ng;
        model->logit_scale.clamp_(0, max_scale);
      }
      last_loss = loss.item<double>();
      if (step == 0) first_loss = last_loss;
      loss_ema = step == 0 ? last_loss : 0.95 * loss_ema + 0.05 * last_loss;
      done = step + 1;
      const double el = seconds_since(t_train);
      if (done == 5) el_at_5 = el;
      if (c.seconds > 0 && done == kPlanAt && steps > kPlanAt) {
        const double per_step = (el - el_at_5) / (kPlanAt - 5);  // the pace after the first steps' start-up
        const int fit = done + static_cast<int>(std::max(0.0, c.seconds - el) / per_step);
        if (fit < steps) {
          steps = std::max(fit, done);
          warmup = std::max(1, steps / 20);
          cut = true;
          if (!c.quiet)
            std::fprintf(stderr, "--seconds %.0f: %.3f s/step, training %d steps instead of %d\n", c.seconds,
                         per_step, steps, c.steps);
        }
      }
      if (!c.quiet && (done % 20 == 0 || done == steps || done == 1))
        std::fprintf(stderr, "step %5d/%d  loss %.4f  (avg %.4f)  scale %.2f  |g| %.3f  lr %.2e  %.2f s/step  %.1f s\n",
                     done, steps, last_loss, loss_ema, std::exp(model->logit_scale.item<double>()), grad_norm, lr,
                     el / done, el);
      if (c.eval_every > 0 && done % c.eval_every == 0 && done < steps) {
        const cd::Retrieval r = score(held, embed_heldout(model, held));
        curve.emplace_back(done, r);
        if (!c.quiet) print_retrieval(("held-out, step " + std::to_string(done)).c_str(), r);
      }
      if (c.seconds > 0 && el > c.seconds && done < steps) {
        cut = true;
        if (!c.quiet) std::fprintf(stderr, "--seconds %.0f reached after %d steps\n", c.seconds, done);
        break;
      }
    }
    const double train_seconds = seconds_since(t_train);
    const Embeddings final_emb = embed_heldout(model, held);
    const cd::Retrieval after = score(held, final_emb);
    curve.emplace_back(done, after);
    if (!c.quiet) print_retrieval("held-out after training", after);

    // 5. Write the model: every tensor from the module of the same name.
    std::map<std::string, torch::Tensor> named;
    for (auto& item : model->named_parameters()) named[item.key()] = item.value().detach().contiguous();
    modelgen::ClipWriteOptions wo;
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
    if (auto s = modelgen::write_clip_model(c.out, wo); !s)
      throw TrainError{std::string(errc_name(s.error().code)) + ": " + s.error().message};
    if (!missing.empty()) throw TrainError{"internal: no trained tensor for " + missing};
    if (named.size() != weights::clip_required_tensors(cfg).size())
      throw TrainError{"internal: the module has " + std::to_string(named.size()) + " parameters, the layout " +
                       std::to_string(weights::clip_required_tensors(cfg).size())};

    // 6. The equivalence check: the engine on the written files against the training forward, held-out pool.
    const auto t_check = TrainTimer::now();
    double max_diff = 0;
    cd::Retrieval engine_r;
    {
      auto em = engine::ClipModel::load(c.out, engine::ClipLoadOptions{});
      if (!em) throw TrainError{"engine::ClipModel cannot load " + c.out + ": " + em.error().message};
      auto to_tensor = [](const std::vector<std::vector<float>>& rows) {
        torch::Tensor t = torch::empty({static_cast<std::int64_t>(rows.size()),
                                        rows.empty() ? 0 : static_cast<std::int64_t>(rows[0].size())});
        float* d = t.data_ptr<float>();
        for (const auto& r : rows) {
          if (static_cast<std::int64_t>(r.size()) != t.size(1)) throw TrainError{"engine: ragged embeddings"};
          d = std::copy(r.begin(), r.end(), d);
        }
        return t;
      };
      std::vector<std::vector<std::int32_t>> full_ids, short_ids;
      for (const auto& s : held.pool) {
        const auto& v = caps.ids(cd::full_caption(s));
        full_ids.emplace_back(v.begin(), v.end());
      }
      for (const auto& q : held.queries) {
        const auto& v = caps.ids(q.text);
        short_ids.emplace_back(v.begin(), v.end());
      }
      std::vector<std::vector<float>> pixels;
      for (std::int64_t i = 0; i < held.pixels.size(0); ++i) {
        const torch::Tensor row = held.pixels[i].contiguous();
        pixels.emplace_back(row.data_ptr<float>(), row.data_ptr<float>() + row.numel());
      }
      auto ei = (*em)->embed_images(pixels);
      auto ef = (*em)->embed_texts(full_ids);
      auto es = (*em)->embed_texts(short_ids);
      if (!ei || !ef || !es)
        throw TrainError{"engine::ClipModel: " + (!ei ? ei.error().message : !ef ? ef.error().message : es.error().message)};
      const auto n = static_cast<std::int64_t>(held.pool.size());
      const Embeddings ee{to_tensor(*ei), to_tensor(*ef), to_tensor(*es)};
      if (ee.images.size(0) != n || ee.full.size(0) != n)
        throw TrainError{"engine::ClipModel returned another number of embeddings"};
      for (const auto& [a, b] : {std::pair{ee.images, final_emb.images}, std::pair{ee.full, final_emb.full},
                                 std::pair{ee.shorts, final_emb.shorts}}) {
        if (a.sizes() != b.sizes()) throw TrainError{"engine::ClipModel returned embeddings of another shape"};
        max_diff = std::max(max_diff, (a - b).abs().max().item<double>());
      }
      engine_r = score(held, ee);
    }
    const double check_seconds = seconds_since(t_check);
    if (!c.quiet)
      std::fprintf(stderr, "engine::ClipModel on the written model vs the training forward: max |diff| %.3g over %zu "
                   "image and %zu text embeddings (%.1f s)\n", max_diff, held.pool.size(),
                   held.pool.size() + held.queries.size(), check_seconds);
    const bool equivalent = max_diff <= 1e-3;

    const double total_seconds = seconds_since(t_start);
    std::ostringstream j;
    j << "{\n  \"generator\": \"tandem-train-clip\",\n  \"preset\": \"clip-small\",\n"
      << "  \"parameters\": " << n_params << ",\n  \"seed\": " << c.seed << ",\n  \"threads\": " << workers
      << ",\n  \"quick\": " << (c.quick ? "true" : "false") << ",\n  \"steps\": " << done
      << ",\n  \"steps_requested\": " << c.steps << ",\n  \"cut_by_time_budget\": " << (cut ? "true" : "false")
      << ",\n  \"batch\": " << c.batch << ",\n"
      << "  \"optimizer\": {\"name\": \"AdamW\", \"lr\": " << fmt(c.lr) << ", \"warmup_steps\": " << warmup
      << ", \"schedule\": \"cosine\", \"min_lr\": " << fmt(c.lr * c.min_lr_frac)
      << ", \"betas\": [0.9, 0.98], \"eps\": 1e-6, \"weight_decay\": " << fmt(c.weight_decay)
      << ", \"grad_clip\": " << fmt(c.clip) << "},\n"
      << "  \"loss\": {\"name\": \"symmetric multi-positive InfoNCE\", \"first\": " << fmt(first_loss)
      << ", \"final\": " << fmt(last_loss) << ", \"final_avg\": " << fmt(loss_ema)
      << ", \"logit_scale\": " << fmt(model->logit_scale.item<double>()) << "},\n"
      << "  \"tokenizer\": {\"tokens\": " << n_vocab << ", \"merges\": " << vocab.merges.size()
      << ", \"corpus_captions\": " << corpus.size() << "},\n"
      << "  \"data\": {\"train_seed\": " << cd::kTrainSeed << ", \"heldout_seed\": " << cd::kHeldoutSeed
      << ", \"scenes_seen\": " << next_scene << ", \"image_size\": " << cd::kImageSize << "},\n"
      << "  \"heldout\": {\n    \"scenes\": " << held.pool.size() << ",\n    \"before\": "
      << retrieval_json(before, "    ") << ",\n    \"after\": " << retrieval_json(after, "    ")
      << ",\n    \"by_step\": [";
    for (std::size_t i = 0; i < curve.size(); ++i)
      j << (i ? ", " : "") << "[" << curve[i].first << ", " << fmt(curve[i].second.text_top1.hit) << ", "
        << fmt(curve[i].second.text_top5.hit) << "]";
    j << "]\n  },\n"
      << "  \"engine_check\": {\"max_abs_diff\": " << fmt(max_diff) << ", \"tolerance\": 1e-3, \"passed\": "
      << (equivalent ? "true" : "false") << ", \"text_to_image_top1\": " << fmt(engine_r.text_top1.hit) << "},\n"
      << "  \"seconds\": {\"tokenizer\": " << fmt(t_tokenizer) << ", \"train\": " << fmt(train_seconds)
      << ", \"engine_check\": " << fmt(check_seconds) << ", \"total\": " << fmt(total_seconds) << "},\n"
      << "  \"cpu\": \"" << json_escape(cpu_model()) << "\",\n  \"hardware_threads\": "
      << std::thread::hardware_concurrency() << ",\n  \"libtorch\": \"" << TORCH_VERSION << "\"\n}\n";
    {
      std::ofstream f(fs::path(c.out) / "training.json", std::ios::binary | std::ios::trunc);
      f << j.str();
      f.close();
      if (!f) throw TrainError{"cannot write " + (fs::path(c.out) / "training.json").string()};
    }
    if (!equivalent) {
      // Nothing may load a model the engine does not compute as trained (scripts/demo.sh retrains without it).
      fs::rename(fs::path(c.out) / "model.safetensors", fs::path(c.out) / "model.safetensors.rejected", ec);
      throw TrainError{"engine::ClipModel differs from the training forward by " + fmt(max_diff) +
                       " (> 1e-3); model.safetensors renamed to model.safetensors.rejected"};
    }
    std::printf("wrote %s: %d steps in %.1f s (total %.1f s), loss %.4f -> %.4f; held-out text->image top-1 %.1f%% "
                "top-5 %.1f%% (chance %.1f%% / %.1f%%), engine max |diff| %.2g\n",
                c.out.c_str(), done, train_seconds, total_seconds, first_loss, loss_ema, 100 * after.text_top1.hit,
                100 * after.text_top5.hit, 100 * after.text_top1.chance, 100 * after.text_top5.chance, max_diff);
    return 0;
  } catch (const TrainError& e) {
    std::fprintf(stderr, "tandem-train-clip: %s\n", e.message.c_str());
    return 1;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "tandem-train-clip: libtorch: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-train-clip: %s\n", e.what());
    return 1;
  }
}
