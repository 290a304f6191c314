// Loading a Whisper model, its placement on an accelerator, its accessors and sessions (the forward passes are
// whisper_forward.cc).
#include "engine/whisper.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <sstream>

#include "engine/whisper_impl.h"

namespace tandem::engine {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

std::vector<Weight*> WhisperModel::Impl::all_matrices() {
  std::vector<Weight*> out{&conv1, &conv2, &embed};
  if (proj.rows > 0) out.push_back(&proj);
  for (auto* stack : {&enc, &dec})
    for (WhisperLayer& l : *stack) {
      for (WhisperAttn* a : {&l.self, &l.cross})
        if (a == &l.self || l.decoder)
          for (Weight* w : {&a->wq, &a->wk, &a->wv, &a->wo}) out.push_back(w);
      out.push_back(&l.w1);
      out.push_back(&l.w2);
    }
  return out;
}

std::vector<at::Tensor*> WhisperModel::Impl::all_vectors() {
  std::vector<at::Tensor*> out{&conv1_b, &conv2_b, &enc_pos, &dec_pos, &enc_ln_w, &enc_ln_b, &dec_ln_w, &dec_ln_b};
  for (auto* stack : {&enc, &dec})
    for (WhisperLayer& l : *stack) {
      for (at::Tensor* v : {&l.ln1_w, &l.ln1_b, &l.ln2_w, &l.ln2_b, &l.b1, &l.b2, &l.self.bq, &l.self.bv, &l.self.bo})
        out.push_back(v);
      if (l.decoder)
        for (at::Tensor* v : {&l.lnx_w, &l.lnx_b, &l.cross.bq, &l.cross.bv, &l.cross.bo}) out.push_back(v);
    }
  return out;
}

// Every matrix at its held size (the token embedding too: it is the output head) and every vector (f32) goes to
// the accelerator, accounted first as one allocation at Site::weights.
Status WhisperModel::Impl::place_on_accelerator() {
  auto bytes = EncoderModelBase::place_on_accelerator(all_matrices(), all_vectors(), "Whisper");
  if (!bytes) return fail(std::move(bytes).error());
  stats.accel_weight_bytes = *bytes;
  return {};
}

// Encoder peak for one window: the mel, conv1's im2col and output, conv2's im2col and output, per layer the
// residual, its norm, q, k, v, the attention output and projection (7 · d) and the FFN pair (2 · ffn), one head's
// scores and probabilities (2 · S²). The CPU kernels need less (per-row scores); the estimate covers both.
std::uint64_t WhisperModel::Impl::encode_ws() const {
  const std::uint64_t S = static_cast<std::uint64_t>(cfg.source_positions), F = 2 * S,
                      d = static_cast<std::uint64_t>(cfg.d_model), M = static_cast<std::uint64_t>(cfg.n_mels),
                      ffn = static_cast<std::uint64_t>(cfg.encoder_ffn);
  const std::uint64_t floats = M * F + F * 3 * M + F * d + S * 3 * d + S * d + S * (7 * d + 2 * ffn) + 2 * S * S;
  return floats * 4 + (accel ? dequant_ws : 0);
}

// One decode call of n tokens: per row 8 · d + ffn (residual, norm, q, k, v, attention, projection, cross query;
// FFN), one head's scores over max(S, T) keys (×2), and the logits row. On an accelerator also one layer's
// self-attention K and V gathered from the pool over up to T positions (the CPU reads the pool in place).
std::uint64_t WhisperModel::Impl::decode_ws(std::int64_t n) const {
  const std::uint64_t rows = static_cast<std::uint64_t>(std::max<std::int64_t>(n, 1)),
                      d = static_cast<std::uint64_t>(cfg.d_model), ffn = static_cast<std::uint64_t>(cfg.decoder_ffn),
                      T = static_cast<std::uint64_t>(cfg.target_positions),
                      keys = std::max(static_cast<std::uint64_t>(cfg.source_positions), T);
  const std::uint64_t floats = rows * (8 * d + ffn) + 2 * rows * keys + static_cast<std::uint64_t>(cfg.vocab);
  return floats * 4 + (accel ? 2 * T * d * 4 + dequant_ws : 0);
}

std::uint64_t WhisperModel::Impl::cross_kv_bytes() const {
  return 4ull * 2 * static_cast<std::uint64_t>(cfg.decoder_layers) * static_cast<std::uint64_t>(cfg.d_model) *
         static_cast<std::uint64_t>(cfg.source_positions);
}

std::uint64_t WhisperModel::Impl::self_kv_bytes() const {
  const std::uint64_t bs = static_cast<std::uint64_t>(kv->block_size());
  const std::uint64_t tokens = (static_cast<std::uint64_t>(cfg.target_positions) + bs - 1) / bs * bs;
  return 4ull * 2 * static_cast<std::uint64_t>(cfg.decoder_layers) * static_cast<std::uint64_t>(cfg.d_model) * tokens;
}

// The self-attention pool: kv_blocks blocks (default: max_sessions full sessions), per decoder layer K and V of
// [blocks · block_size, d] f32 where the model computes; each layer accounted at Site::kv_pool on an accelerator.
Status WhisperModel::Impl::make_kv_pool() {
  const std::int64_t per_session = (cfg.target_positions + opts.kv_block_size - 1) / opts.kv_block_size;
  const std::int64_t blocks = opts.kv_blocks > 0 ? opts.kv_blocks : per_session * opts.max_sessions;
  if (blocks > (std::int64_t{1} << 30)) return fail(Errc::invalid_argument, "kv_blocks too large");
  kv = std::make_unique<KvPool>(static_cast<int>(blocks), opts.kv_block_size);
  for (int i = 0; i < cfg.decoder_layers; ++i) {
    auto a = kv->add_layer({cfg.d_model}, at::kFloat, on_accel() ? accel_dev : at::Device(at::kCPU), accel.get());
    if (!a) {
      Error e = std::move(a).error();
      e.message = "Whisper decoder KV pool (layer " + std::to_string(i) + ") on " + accel->name() + ": " + e.message;
      return fail(std::move(e));
    }
    if (accel) accel_allocs.push_back(std::move(a).value());
  }
  stats.kv_pool_bytes = kv->bytes();
  stats.accel_kv_bytes = accel ? kv->bytes() : 0;
  return {};
}

WhisperModel::WhisperModel() = default;
WhisperModel::~WhisperModel() = default;

Result<std::shared_ptr<WhisperModel>> WhisperModel::load(const std::string& path, const WhisperLoadOptions& opts) {
  const auto t0 = Clock::now();
  TANDEM_TRY(check_load_options(opts.threads, opts.accelerator));
  if (opts.kv_block_size < 1 || opts.kv_block_size > 4096)
    return fail(Errc::invalid_argument, "kv_block_size must be in [1, 4096], got " + std::to_string(opts.kv_block_size));
  if (opts.max_sessions < 1 || opts.max_sessions > 4096)
    return fail(Errc::invalid_argument, "max_sessions must be in [1, 4096], got " + std::to_string(opts.max_sessions));
  if (opts.kv_blocks < 0) return fail(Errc::invalid_argument, "kv_blocks must be >= 0");

  auto m = std::shared_ptr<WhisperModel>(new WhisperModel());
  m->impl_ = std::make_unique<Impl>();
  Impl& im = *m->impl_;
  im.opts = opts;
  auto on_gguf = [&im]() -> Status {
    auto c = weights::whisper_config_from_gguf(*im.gguf);
    if (!c) return fail(std::move(c).error());
    im.cfg = std::move(c).value();
    im.gguf_views = weights::whisper_tensor_views_from_gguf(*im.gguf);
    return {};
  };
  auto on_hf = [&im](const std::string& dir, const std::string& text) -> Status {
    auto c = weights::parse_whisper_config(text, dir + "/config.json");
    if (!c) return fail(std::move(c).error());
    im.cfg = std::move(c).value();
    return {};
  };
  TANDEM_TRY(im.open(path, on_gguf, on_hf));
  const WhisperConfig& cfg = im.cfg;

  auto required = weights::whisper_required_tensors(cfg);
  const weights::TensorView* proj = im.find("proj_out.weight");
  if (proj) required.push_back({"proj_out.weight", {cfg.vocab, cfg.d_model}});
  auto resolved = im.resolve(required);
  if (!resolved) return fail(std::move(resolved).error());
  const TensorMap& tv = *resolved;
  for (const auto& [name, t] : tv) im.stats.weight_bytes += t->data.size();

  TANDEM_TRY(guarded_load(path, "Whisper", [&]() -> Status {
    im.start_pool(opts.threads);
    WeightBuilder b{tv, opts.dtype, /*cpu_compute=*/!opts.accelerator};
    auto w = [&](const std::string& name) { return b.matrix(name); };
    auto vec = [&](const std::string& name) { return b.vector(name); };
    auto conv = [&](const std::string& name) {
      weights::TensorView v = *tv.at(name);
      v.shape = {v.shape[0], v.shape[1] * v.shape[2]};
      return b.matrix(v);
    };
    im.conv1 = conv("model.encoder.conv1.weight");
    im.conv1_b = vec("model.encoder.conv1.bias");
    im.conv2 = conv("model.encoder.conv2.weight");
    im.conv2_b = vec("model.encoder.conv2.bias");
    im.enc_pos = b.rows_f32("model.encoder.embed_positions.weight");
    im.dec_pos = b.rows_f32("model.decoder.embed_positions.weight");
    im.embed = w("model.decoder.embed_tokens.weight");
    if (proj) im.proj = w("proj_out.weight");
    im.enc_ln_w = vec("model.encoder.layer_norm.weight");
    im.enc_ln_b = vec("model.encoder.layer_norm.bias");
    im.dec_ln_w = vec("model.decoder.layer_norm.weight");
    im.dec_ln_b = vec("model.decoder.layer_norm.bias");
    auto attn = [&](const std::string& p) {
      WhisperAttn a;
      a.wq = w(p + ".q_proj.weight");
      a.bq = vec(p + ".q_proj.bias");
      a.wk = w(p + ".k_proj.weight");
      a.wv = w(p + ".v_proj.weight");
      a.bv = vec(p + ".v_proj.bias");
      a.wo = w(p + ".out_proj.weight");
      a.bo = vec(p + ".out_proj.bias");
      return a;
    };
    for (bool decoder : {false, true}) {
      const int n = decoder ? cfg.decoder_layers : cfg.encoder_layers;
      for (int i = 0; i < n; ++i) {
        const std::string p = std::string(decoder ? "model.decoder" : "model.encoder") + ".layers." + std::to_string(i) + ".";
        WhisperLayer l;
        l.decoder = decoder;
        l.self = attn(p + "self_attn");
        l.ln1_w = vec(p + "self_attn_layer_norm.weight");
        l.ln1_b = vec(p + "self_attn_layer_norm.bias");
        if (decoder) {
          l.cross = attn(p + "encoder_attn");
          l.lnx_w = vec(p + "encoder_attn_layer_norm.weight");
          l.lnx_b = vec(p + "encoder_attn_layer_norm.bias");
        }
        l.ln2_w = vec(p + "final_layer_norm.weight");
        l.ln2_b = vec(p + "final_layer_norm.bias");
        l.w1 = w(p + "fc1.weight");
        l.b1 = vec(p + "fc1.bias");
        l.w2 = w(p + "fc2.weight");
        l.b2 = vec(p + "fc2.bias");
        (decoder ? im.dec : im.enc).push_back(std::move(l));
      }
    }
    im.stats.resident_copy_bytes = b.copied;
    if (opts.accelerator) {
      im.accel = opts.accelerator;
      TANDEM_TRY(im.place_on_accelerator());
    }
    return im.make_kv_pool();
  }));
  if (opts.prefault) im.prefault();

  std::ostringstream arch;
  arch << cfg.d_model << "," << cfg.encoder_layers << "," << cfg.decoder_layers << "," << cfg.encoder_heads << ","
       << cfg.decoder_heads << "," << cfg.encoder_ffn << "," << cfg.decoder_ffn << ";mels=" << cfg.n_mels
       << ";src=" << cfg.source_positions << ";tgt=" << cfg.target_positions << ";vocab=" << cfg.vocab
       << ";scale=" << cfg.scale_embedding << ";head=" << (im.proj.rows > 0 ? "proj_out" : "tied");
  im.fingerprint = im.fingerprint_digest("whisper;" + arch.str(), opts.revision, im.all_matrices());
  im.stats.total_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return m;
}

const WhisperConfig& WhisperModel::config() const { return impl_->cfg; }
const WhisperLoadStats& WhisperModel::stats() const { return impl_->stats; }
std::string WhisperModel::fingerprint() const { return impl_->fingerprint; }
device::Device* WhisperModel::accelerator() const { return impl_->accel.get(); }
int WhisperModel::window_frames() const { return impl_->cfg.window_frames(); }
std::uint64_t WhisperModel::session_kv_bytes() const { return impl_->cross_kv_bytes() + impl_->self_kv_bytes(); }
std::uint64_t WhisperModel::session_bytes() const {
  return std::max(impl_->encode_ws(), impl_->decode_ws(impl_->cfg.target_positions)) + session_kv_bytes();
}
KvStats WhisperModel::kv_stats() const { return impl_->kv->stats(); }

Result<std::unique_ptr<WhisperSession>> WhisperModel::new_session() {
  Impl& im = *impl_;
  auto s = std::make_unique<WhisperSession::State>();
  s->model = shared_from_this();
  const WhisperConfig& c = im.cfg;
  std::lock_guard lock(im.compute_mu);
  if (im.accel) {
    if (im.device_lost())
      return fail(Errc::device_lost, im.accel->name() + ": the Whisper model's device buffers were lost; reload it");
    auto a = im.accel->allocate(im.cross_kv_bytes(), device::Site::kv_pool);
    if (!a) return fail(std::move(a).error());
    s->kv_alloc = std::move(a).value();
  }
  try {
    c10::InferenceMode guard;
    const auto o = at::TensorOptions().dtype(at::kFloat).device(im.on_accel() ? im.accel_dev : at::Device(at::kCPU));
    for (int i = 0; i < c.decoder_layers; ++i) {
      const std::int64_t hd = c.d_model / c.decoder_heads;
      s->cross_k.push_back(im.on_accel() ? at::zeros({c.source_positions, c.d_model}, o)
                                         : at::zeros({c.decoder_heads * std::int64_t{c.source_positions}, hd}, o));
      s->cross_v.push_back(im.on_accel() ? at::zeros({c.source_positions, c.d_model}, o)
                                         : at::zeros({c.decoder_heads * hd, std::int64_t{c.source_positions}}, o));
    }
  } catch (const c10::Error& e) {
    return fail(Errc::out_of_memory, "Whisper session buffers: " + std::string(e.what_without_backtrace()));
  } catch (const std::bad_alloc&) {
    return fail(Errc::out_of_memory, "Whisper session buffers: out of host memory");
  }
  s->id = im.next_seq++;
  TANDEM_TRY(im.kv->create(s->id));
  return std::unique_ptr<WhisperSession>(new WhisperSession(std::move(s)));
}

WhisperSession::WhisperSession(std::unique_ptr<State> st) : st_(std::move(st)) {}
WhisperSession::~WhisperSession() { st_->model->impl_->kv->release(st_->id); }
std::size_t WhisperSession::fed() const { return st_->fed; }
void WhisperSession::rewind(std::size_t n) {
  st_->fed = std::min(n, st_->fed);
  st_->model->impl_->kv->truncate(st_->id, static_cast<std::int64_t>(st_->fed));
}

}  // namespace tandem::engine
