// EmbedModel (embed_model.h).
#include "daemon/embed_model.h"

#include "engine/bert.h"
#include "engine/clip.h"

namespace tandem::daemon {

EmbedModel::~EmbedModel() = default;

namespace {

// The engine's load options of either family from one replica's.
template <class EngineOptions>
EngineOptions engine_options(const EmbedModel::Options& o) {
  EngineOptions e;
  e.dtype = o.dtype;
  e.threads = o.threads;
  e.accelerator = o.accelerator;
  e.revision = o.revision;
  return e;
}

}  // namespace

Result<std::shared_ptr<EmbedModel>> EmbedModel::load(EmbedFamily family, const std::string& path, const Options& o) {
  auto m = std::shared_ptr<EmbedModel>(new EmbedModel());
  m->family_ = family;
  Shape& s = m->shape_;
  if (family == EmbedFamily::clip) {
    auto c = engine::ClipModel::load(path, engine_options<engine::ClipLoadOptions>(o));
    if (!c) return fail(std::move(c).error());
    m->clip_ = std::move(c).value();
    const auto& cfg = m->clip_->config();
    const auto& t = cfg.vision.hidden >= cfg.text.hidden ? cfg.vision : cfg.text;
    s.dim = cfg.projection_dim;
    s.text_positions = cfg.text.positions;
    s.vocab = cfg.vocab;
    s.layers = cfg.text.layers + cfg.vision.layers;
    s.hidden = t.hidden;
    s.intermediate = t.intermediate;
    s.heads = t.heads;
    s.image_size = cfg.image_size;
    s.image_tokens = cfg.vision.positions;
    s.channels = cfg.channels;
  } else {
    auto b = engine::BertModel::load(path, engine_options<engine::BertLoadOptions>(o));
    if (!b) return fail(std::move(b).error());
    m->bert_ = std::move(b).value();
    const auto& cfg = m->bert_->config();
    s.dim = cfg.hidden;
    s.text_positions = cfg.positions;
    s.vocab = cfg.vocab;
    s.layers = cfg.layers;
    s.hidden = cfg.hidden;
    s.intermediate = cfg.intermediate;
    s.heads = cfg.heads;
  }
  return m;
}

EmbedModel::Stats EmbedModel::stats() const {
  Stats s;
  if (clip_) {
    const auto& c = clip_->stats();
    s = {c.weight_bytes, c.accel_weight_bytes, c.resident_copy_bytes};
  } else {
    const auto& b = bert_->stats();
    s = {b.weight_bytes, b.accel_weight_bytes, b.resident_copy_bytes};
  }
  return s;
}

std::string EmbedModel::fingerprint() const { return clip_ ? clip_->fingerprint() : bert_->fingerprint(); }

Result<std::vector<std::vector<float>>> EmbedModel::embed_texts(std::span<const std::vector<std::int32_t>> ids,
                                                                const std::atomic<bool>* cancel) {
  return clip_ ? clip_->embed_texts(ids, cancel) : bert_->embed_ids(ids, cancel);
}

Result<std::vector<std::vector<float>>> EmbedModel::embed_images(std::span<const std::vector<float>> pixels,
                                                                 const std::atomic<bool>* cancel) {
  if (!clip_) return fail(Errc::unsupported, "a text embedding model has no image encoder");
  return clip_->embed_images(pixels, cancel);
}

}  // namespace tandem::daemon
