// Loading a CLIP model, its placement on an accelerator and its accessors (the encoders are clip_forward.cc).
#include "engine/clip.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <chrono>
#include <sstream>
#include <tuple>

#include "engine/clip_impl.h"
#include "kernels/quant.h"

namespace tandem::engine {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

Result<ClipConfig> parse_clip_config(const std::string& config_json_text) {
  return weights::parse_clip_config(config_json_text, "config.json");
}

std::vector<Weight*> ClipModel::Impl::all_matrices() {
  std::vector<Weight*> out{&patch, &text_proj, &visual_proj};
  for (ClipTower* t : {&text, &vision})
    for (ClipLayer& l : t->layers)
      for (Weight* w : l.matrices()) out.push_back(w);
  return out;
}

std::vector<at::Tensor*> ClipModel::Impl::all_vectors() {
  std::vector<at::Tensor*> out{&text_pos, &vision_pos, &class_embd, &final_w, &final_b, &pre_w, &pre_b, &post_w, &post_b};
  for (ClipTower* t : {&text, &vision})
    for (ClipLayer& l : t->layers)
      for (at::Tensor* v : l.vectors()) out.push_back(v);
  return out;
}

// Every matrix at its held size and every vector (f32) goes to the accelerator, accounted first as one
// allocation; the token embedding stays in the CPU mapping (rows are looked up there and copied per call).
Status ClipModel::Impl::place_on_accelerator() {
  auto bytes = EncoderModelBase::place_on_accelerator(all_matrices(), all_vectors(), "CLIP");
  if (!bytes) return fail(std::move(bytes).error());
  stats.accel_weight_bytes = *bytes;
  return {};
}

ClipModel::ClipModel() = default;
ClipModel::~ClipModel() = default;

Result<std::shared_ptr<ClipModel>> ClipModel::load(const std::string& path, const ClipLoadOptions& opts) {
  const auto t0 = Clock::now();
  TANDEM_TRY(check_load_options(opts.threads, opts.accelerator));

  auto m = std::shared_ptr<ClipModel>(new ClipModel());
  m->impl_ = std::make_unique<Impl>();
  Impl& im = *m->impl_;
  im.opts = opts;
  auto on_gguf = [&im]() -> Status {
    auto c = weights::clip_config_from_gguf(*im.gguf);
    if (!c) return fail(std::move(c).error());
    im.cfg = std::move(c).value();
    auto views = weights::clip_tensor_views_from_gguf(*im.gguf, im.cfg);
    if (!views) return fail(std::move(views).error());
    im.gguf_views = std::move(views).value();
    return {};
  };
  auto on_hf = [&im](const std::string& dir, const std::string& text) -> Status {
    auto c = weights::parse_clip_config(text, dir + "/config.json");
    if (!c) return fail(std::move(c).error());
    im.cfg = std::move(c).value();
    auto pre = read_text(dir + "/preprocessor_config.json", true);
    if (!pre) return fail(std::move(pre).error());
    if (!pre->empty()) TANDEM_TRY(weights::parse_clip_preprocessor(*pre, dir + "/preprocessor_config.json", im.cfg));
    return {};
  };
  TANDEM_TRY(im.open(path, on_gguf, on_hf));
  const ClipConfig& cfg = im.cfg;

  // Every tensor the config implies, with its shape and a type Tandem computes with (a GGUF file has no
  // logit_scale tensor: clip.logit_scale or the default).
  auto resolved = im.resolve(weights::clip_required_tensors(cfg), [&im](const std::string& name, const weights::TensorView* t) {
    return name == "logit_scale" && (t == nullptr ? im.gguf.has_value() : t->shape == std::vector<std::int64_t>{1});
  });
  if (!resolved) return fail(std::move(resolved).error());
  const TensorMap& tv = *resolved;
  if (const auto it = tv.find("logit_scale"); it != tv.end())
    kernels::dequantize_row(it->second->type, it->second->data.data(), &im.cfg.logit_scale, 1);
  for (const auto& [name, t] : tv) im.stats.weight_bytes += t->data.size();

  TANDEM_TRY(guarded_load(path, "CLIP", [&]() -> Status {
    im.start_pool(opts.threads);
    WeightBuilder b{tv, opts.dtype, /*cpu_compute=*/!opts.accelerator};
    auto w = [&](const std::string& name) { return b.matrix(name); };
    auto vec = [&](const std::string& name) { return b.vector(name); };
    im.token_embd = w("text_model.embeddings.token_embedding.weight");
    im.text_pos = b.rows_f32("text_model.embeddings.position_embedding.weight");
    im.vision_pos = b.rows_f32("vision_model.embeddings.position_embedding.weight");
    im.class_embd = vec("vision_model.embeddings.class_embedding");
    {
      weights::TensorView p = *tv.at("vision_model.embeddings.patch_embedding.weight");
      p.shape = {cfg.vision.hidden, static_cast<std::int64_t>(cfg.channels) * cfg.patch_size * cfg.patch_size};
      im.patch = b.matrix(p);
    }
    im.final_w = vec("text_model.final_layer_norm.weight");
    im.final_b = vec("text_model.final_layer_norm.bias");
    im.pre_w = vec("vision_model.pre_layrnorm.weight");
    im.pre_b = vec("vision_model.pre_layrnorm.bias");
    im.post_w = vec("vision_model.post_layernorm.weight");
    im.post_b = vec("vision_model.post_layernorm.bias");
    im.text_proj = w("text_projection.weight");
    im.visual_proj = w("visual_projection.weight");
    for (auto [t, s, prefix] : {std::tuple{&im.text, &cfg.text, "text_model."}, std::tuple{&im.vision, &cfg.vision, "vision_model."}}) {
      t->shape = *s;
      for (int i = 0; i < s->layers; ++i) {
        const std::string p = std::string(prefix) + "encoder.layers." + std::to_string(i) + ".";
        ClipLayer l;
        l.ln1_w = vec(p + "layer_norm1.weight");
        l.ln1_b = vec(p + "layer_norm1.bias");
        l.ln2_w = vec(p + "layer_norm2.weight");
        l.ln2_b = vec(p + "layer_norm2.bias");
        l.wq = w(p + "self_attn.q_proj.weight");
        l.bq = vec(p + "self_attn.q_proj.bias");
        l.wk = w(p + "self_attn.k_proj.weight");
        l.bk = vec(p + "self_attn.k_proj.bias");
        l.wv = w(p + "self_attn.v_proj.weight");
        l.bv = vec(p + "self_attn.v_proj.bias");
        l.wo = w(p + "self_attn.out_proj.weight");
        l.bo = vec(p + "self_attn.out_proj.bias");
        l.w1 = w(p + "mlp.fc1.weight");
        l.b1 = vec(p + "mlp.fc1.bias");
        l.w2 = w(p + "mlp.fc2.weight");
        l.b2 = vec(p + "mlp.fc2.bias");
        t->layers.push_back(std::move(l));
      }
    }
    im.stats.resident_copy_bytes = b.copied;
    if (opts.accelerator) {
      im.accel = opts.accelerator;
      TANDEM_TRY(im.place_on_accelerator());
    }
    return {};
  }));
  if (opts.prefault) im.prefault();

  // Fingerprint: what decides the vectors.
  std::ostringstream arch;
  arch.precision(17);
  for (const ClipTowerShape* s : {&cfg.text, &cfg.vision})
    arch << s->hidden << "," << s->intermediate << "," << s->layers << "," << s->heads << "," << s->positions << ","
         << s->eps << "," << s->act << ";";
  arch << "vocab=" << cfg.vocab << ";proj=" << cfg.projection_dim << ";image=" << cfg.image_size << ";patch="
       << cfg.patch_size << ";channels=" << cfg.channels << ";eos=" << cfg.eos_id << ";legacy=" << cfg.legacy_eos_argmax;
  std::vector<Weight*> held = im.all_matrices();
  held.push_back(&im.token_embd);
  im.fingerprint = im.fingerprint_digest("clip;" + arch.str(), opts.revision, held);
  im.stats.total_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return m;
}

const ClipConfig& ClipModel::config() const { return impl_->cfg; }
const ClipLoadStats& ClipModel::stats() const { return impl_->stats; }
std::string ClipModel::fingerprint() const { return impl_->fingerprint; }
device::Device* ClipModel::accelerator() const { return impl_->accel.get(); }

// Per row: the residual, its norm, q, k, v, the attention output and the projection (7 · hidden), the MLP's two
// intermediate tensors (2 · intermediate); per item and head the scores and probabilities (2 · L²); f32. Plus the
// expansion of one matrix on an accelerator.
std::uint64_t ClipModel::activation_bytes(int texts, int images) const {
  const Impl& im = *impl_;
  auto tower = [](const ClipTowerShape& s, std::uint64_t items, std::uint64_t len) {
    const std::uint64_t rows = items * len;
    return rows * (7 * static_cast<std::uint64_t>(s.hidden) + 2 * static_cast<std::uint64_t>(s.intermediate)) * 4 +
           items * static_cast<std::uint64_t>(s.heads) * len * len * 8;
  };
  std::uint64_t b = 0;
  if (texts > 0) b += tower(im.cfg.text, static_cast<std::uint64_t>(texts), static_cast<std::uint64_t>(im.cfg.text.positions));
  if (images > 0) {
    const auto n = static_cast<std::uint64_t>(images);
    b += tower(im.cfg.vision, n, static_cast<std::uint64_t>(im.cfg.vision.positions)) +
         n * static_cast<std::uint64_t>(im.cfg.channels) * im.cfg.image_size * im.cfg.image_size * 4 * 2;
  }
  if (b > 0 && im.accel) b += im.dequant_ws;
  return b;
}

}  // namespace tandem::engine
