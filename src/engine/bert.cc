// BERT-family text encoders (bert.h): loading, placement and the forward (transformers' BertModel and contrastors'
// NomicBertModel semantics: post-LN layers, bidirectional attention per text; mean or CLS pooling; L2
// normalisation). On the CPU the matrix products go through Tandem's row-independent kernels and the norms,
// activations and attention through per-row loops, so a text's vector does not depend on its batch; on an
// accelerator ATen, attention per text.
#include "engine/bert.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <chrono>
#include <cmath>
#include <sstream>

#include "engine/encoder_model.h"
#include "kernels/rows.h"
#include "weights/gguf_tokenizer.h"

namespace tandem::engine {

namespace {

using Clock = std::chrono::steady_clock;
using weights::BertFamily;

struct BertLayer {
  Weight wq, wk, wv, wqkv, wo, w_up, w_gate, w_down;
  at::Tensor bq, bk, bv, bo, b_up, b_down, ln1_w, ln1_b, ln2_w, ln2_b;
  std::vector<Weight*> matrices(BertFamily f) {
    if (f == BertFamily::bert) return {&wq, &wk, &wv, &wo, &w_up, &w_down};
    return {&wqkv, &wo, &w_up, &w_gate, &w_down};
  }
  std::vector<at::Tensor*> vectors(BertFamily f) {
    if (f == BertFamily::bert) return {&bq, &bk, &bv, &bo, &b_up, &b_down, &ln1_w, &ln1_b, &ln2_w, &ln2_b};
    return {&ln1_w, &ln1_b, &ln2_w, &ln2_b};
  }
};

std::vector<float> l2_normalized(const float* p, std::int64_t n) {
  double ss = 0;
  for (std::int64_t i = 0; i < n; ++i) ss += static_cast<double>(p[i]) * p[i];
  const double inv = ss > 0 ? 1.0 / std::sqrt(ss) : 0.0;
  std::vector<float> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = static_cast<float>(p[i] * inv);
  return out;
}

// The tokenizer of a Hugging Face directory: tokenizer.json with a WordPiece model, else vocab.txt (lowercasing as
// tokenizer_config.json's do_lower_case says, true by default).
Result<tok::WordPieceTokenizer> hf_tokenizer(const std::string& dir) {
  auto json = read_text(dir + "/tokenizer.json", true);
  if (!json) return fail(std::move(json).error());
  if (!json->empty()) return tok::WordPieceTokenizer::from_hf_json(*json, dir + "/tokenizer.json");
  auto vocab = read_text(dir + "/vocab.txt", true);
  if (!vocab) return fail(std::move(vocab).error());
  if (vocab->empty()) return fail(Errc::not_found, dir + ": neither tokenizer.json nor vocab.txt");
  tok::WordPieceOptions o;
  auto tc = read_text(dir + "/tokenizer_config.json", true);
  if (!tc) return fail(std::move(tc).error());
  if (!tc->empty()) {
    auto lower = weights::tokenizer_do_lower_case(*tc, dir + "/tokenizer_config.json");
    if (!lower) return fail(std::move(lower).error());
    o.lowercase = o.strip_accents = *lower;
  }
  return tok::WordPieceTokenizer::from_vocab_txt(*vocab, dir + "/vocab.txt", o);
}

}  // namespace

struct BertModel::Impl : EncoderModelBase {
  weights::BertConfig cfg;
  BertLoadOptions opts;
  BertLoadStats stats;
  std::string fingerprint;
  std::optional<tok::WordPieceTokenizer> tokenizer;

  Weight word;                  // read on the CPU, row by row (any type)
  at::Tensor pos, type0;        // f32 [positions, H] (bert only), [H] (token type 0)
  at::Tensor emb_w, emb_b;      // the embeddings' layer norm
  at::Tensor inv_freq;          // nomic: [head_dim / 2]
  std::vector<BertLayer> layers;

  std::vector<Weight*> all_matrices() {
    std::vector<Weight*> out;
    for (BertLayer& l : layers)
      for (Weight* w : l.matrices(cfg.family)) out.push_back(w);
    return out;
  }
  std::vector<at::Tensor*> all_vectors() {
    std::vector<at::Tensor*> out{&type0, &emb_w, &emb_b};
    if (pos.defined()) out.push_back(&pos);
    for (BertLayer& l : layers)
      for (at::Tensor* v : l.vectors(cfg.family)) out.push_back(v);
    return out;
  }

  // The rotary tables of the rows (their positions within their text), f32 [R, head_dim / 2] on the CPU: computed
  // once per call, used by every layer's q and k.
  struct RopeTables {
    at::Tensor cos, sin;
  };
  RopeTables rope_tables(const std::vector<std::int64_t>& positions) const {
    const auto R = static_cast<std::int64_t>(positions.size()), half = static_cast<std::int64_t>(cfg.head_dim() / 2);
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    RopeTables t{at::empty({R, half}, f32), at::empty({R, half}, f32)};
    kernels::rope_table(positions.data(), R, inv_freq.data_ptr<float>(), half, 1.0F, t.cos.data_ptr<float>(),
                        t.sin.data_ptr<float>());
    return t;
  }

  // Rotary embedding (NEOX pairing, as contrastors' non-interleaved rotary) of rows [R, heads, hd].
  at::Tensor rope(at::Tensor x, const RopeTables& t) const {
    const std::int64_t R = x.size(0), heads = cfg.heads, hd = cfg.head_dim(), half = hd / 2;
    if (!on_accel()) {
      at::Tensor y = x.contiguous().view({R, heads, hd}).clone();
      kernels::rope_rows(y.data_ptr<float>(), R, heads, half, t.cos.data_ptr<float>(), t.sin.data_ptr<float>(), false);
      return y.view({R, heads * hd});
    }
    const at::Tensor c = t.cos.to(accel_dev).unsqueeze(1), s = t.sin.to(accel_dev).unsqueeze(1);
    const at::Tensor v = x.view({R, heads, hd});
    const at::Tensor x1 = v.narrow(-1, 0, half), x2 = v.narrow(-1, half, half);
    return at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1).reshape({R, heads * hd});
  }

  // Bidirectional attention within each text, with ATen on either device: a text's scores and weighted sums are
  // products over its own rows only, so its vector does not depend on the other texts of the call (the f32 GEMMs
  // of one shape give the same result every time). Scalar per-row loops in double (encoder_rows.h, CLIP's
  // choice) cost 4x more than the matrix products on 128-token passages.
  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const std::vector<std::int64_t>& lens) const {
    const std::int64_t H = q.size(1), heads = cfg.heads, hd = H / heads;
    std::vector<at::Tensor> parts;
    std::int64_t off = 0;
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    for (std::int64_t L : lens) {
      auto split = [&](const at::Tensor& t) { return t.narrow(0, off, L).reshape({L, heads, hd}).transpose(0, 1); };
      const at::Tensor sc = at::matmul(split(q), split(k).transpose(1, 2)).mul_(scale);
      parts.push_back(at::matmul(at::softmax(sc, -1), split(v)).transpose(0, 1).reshape({L, H}));
      off += L;
    }
    return parts.size() == 1 ? parts.front().contiguous() : at::cat(parts, 0);
  }

  at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) const {
    if (!on_accel()) {
      at::Tensor g = gate.contiguous();
      const at::Tensor u = up.contiguous();
      kernels::silu_mul(g.data_ptr<float>(), u.data_ptr<float>(), g.numel(), g.data_ptr<float>());
      return g;
    }
    return at::silu(gate) * up;
  }

  at::Tensor encode_rows(at::Tensor x, const std::vector<std::int64_t>& lens, const std::vector<std::int64_t>& positions,
                         const std::atomic<bool>* cancel) {
    const std::int64_t H = cfg.hidden;
    const RopeTables tables = cfg.family == BertFamily::nomic_bert ? rope_tables(positions) : RopeTables{};
    for (const BertLayer& l : layers) {
      throw_if_cancelled(cancel);
      if (on_accel()) {
        Status st = accel->check(device::Site::prefill);
        if (!st.ok()) throw Error(std::move(st).error());
      }
      at::Tensor q, k, v;
      if (cfg.family == BertFamily::bert) {
        q = linear(x, l.wq, l.bq, lens);
        k = linear(x, l.wk, l.bk, lens);
        v = linear(x, l.wv, l.bv, lens);
      } else {
        const at::Tensor qkv = linear(x, l.wqkv, at::Tensor(), lens);
        q = rope(qkv.narrow(1, 0, H), tables);
        k = rope(qkv.narrow(1, H, H), tables);
        v = qkv.narrow(1, 2 * H, H).contiguous();
      }
      const at::Tensor a = attention(q, k, v, lens);
      x = layer_norm(x + linear(a, l.wo, l.bo, lens), l.ln1_w, l.ln1_b, cfg.eps);
      at::Tensor h;
      if (cfg.family == BertFamily::bert)
        h = gelu(linear(x, l.w_up, l.b_up, lens));
      else
        h = swiglu(linear(x, l.w_gate, at::Tensor(), lens), linear(x, l.w_up, at::Tensor(), lens));
      x = layer_norm(x + linear(h, l.w_down, l.b_down, lens), l.ln2_w, l.ln2_b, cfg.eps);
    }
    return x;
  }
};

BertModel::BertModel() = default;
BertModel::~BertModel() = default;

Result<std::shared_ptr<BertModel>> BertModel::load(const std::string& path, const BertLoadOptions& opts) {
  const auto t0 = Clock::now();
  TANDEM_TRY(check_load_options(opts.threads, opts.accelerator));
  auto m = std::shared_ptr<BertModel>(new BertModel());
  m->impl_ = std::make_unique<Impl>();
  Impl& im = *m->impl_;
  im.opts = opts;
  auto on_gguf = [&im]() -> Status {
    auto c = weights::bert_config_from_gguf(*im.gguf);
    if (!c) return fail(std::move(c).error());
    im.cfg = std::move(c).value();
    auto views = weights::bert_tensor_views_from_gguf(*im.gguf, im.cfg);
    if (!views) return fail(std::move(views).error());
    im.gguf_views = std::move(views).value();
    auto toks = weights::wordpiece_tokens_from_gguf(*im.gguf);
    if (!toks) return fail(std::move(toks).error());
    auto t = tok::WordPieceTokenizer::from_tokens(std::move(toks).value(), im.gguf->path());
    if (!t) return fail(std::move(t).error());
    im.tokenizer.emplace(std::move(t).value());
    return {};
  };
  auto on_hf = [&im](const std::string& dir, const std::string& text) -> Status {
    auto c = weights::parse_bert_config(text, dir + "/config.json");
    if (!c) return fail(std::move(c).error());
    im.cfg = std::move(c).value();
    // sentence-transformers: modules.json names the pooling module's directory (1_Pooling by default).
    std::string pooling_dir = "1_Pooling";
    auto modules = read_text(dir + "/modules.json", true);
    if (!modules) return fail(std::move(modules).error());
    if (!modules->empty()) {
      auto pd = weights::sentence_transformers_pooling_dir(*modules, dir + "/modules.json");
      if (!pd) return fail(std::move(pd).error());
      if (!pd->empty()) pooling_dir = *pd;
    }
    auto pool = read_text(dir + "/" + pooling_dir + "/config.json", true);
    if (!pool) return fail(std::move(pool).error());
    if (!pool->empty())
      TANDEM_TRY(weights::parse_sentence_transformers_pooling(*pool, dir + "/" + pooling_dir + "/config.json", im.cfg));
    auto t = hf_tokenizer(dir);
    if (!t) return fail(std::move(t).error());
    im.tokenizer.emplace(std::move(t).value());
    return {};
  };
  TANDEM_TRY(im.open(path, on_gguf, on_hf));
  const weights::BertConfig& cfg = im.cfg;
  if (im.tokenizer->vocab_size() > cfg.vocab)
    return fail(Errc::format_error, im.tokenizer->origin() + ": " + std::to_string(im.tokenizer->vocab_size()) +
                                        " tokens but the model's vocabulary has " + std::to_string(cfg.vocab) + " rows");
  // BertForMaskedLM and friends keep the encoder under "bert.".
  const std::string prefix = !im.gguf && im.find("bert.embeddings.word_embeddings.weight") ? "bert." : "";
  TensorShapes required = weights::bert_required_tensors(cfg);
  for (auto& [name, shape] : required) name = prefix + name;
  auto resolved = im.resolve(required);
  if (!resolved) return fail(std::move(resolved).error());
  const TensorMap& tv = *resolved;
  for (const auto& [name, t] : tv) im.stats.weight_bytes += t->data.size();

  TANDEM_TRY(guarded_load(path, "BERT", [&]() -> Status {
    im.start_pool(opts.threads);
    WeightBuilder b{tv, opts.dtype, /*cpu_compute=*/!opts.accelerator};
    auto w = [&](const std::string& name) { return b.matrix(prefix + name); };
    auto vec = [&](const std::string& name) { return b.vector(prefix + name); };
    im.word = w("embeddings.word_embeddings.weight");
    im.type0 = b.rows_f32(prefix + "embeddings.token_type_embeddings.weight").select(0, 0).contiguous();
    if (cfg.family == BertFamily::bert) {
      im.pos = b.rows_f32(prefix + "embeddings.position_embeddings.weight");
      im.emb_w = vec("embeddings.LayerNorm.weight");
      im.emb_b = vec("embeddings.LayerNorm.bias");
    } else {
      im.emb_w = vec("emb_ln.weight");
      im.emb_b = vec("emb_ln.bias");
      std::vector<float> inv(static_cast<std::size_t>(cfg.head_dim() / 2));
      for (std::size_t i = 0; i < inv.size(); ++i)
        inv[i] = static_cast<float>(1.0 / std::pow(cfg.rope_theta, 2.0 * static_cast<double>(i) / cfg.head_dim()));
      im.inv_freq = at::tensor(inv, at::TensorOptions().dtype(at::kFloat));
    }
    for (int i = 0; i < cfg.layers; ++i) {
      BertLayer l;
      if (cfg.family == BertFamily::bert) {
        const std::string p = "encoder.layer." + std::to_string(i) + ".";
        l.wq = w(p + "attention.self.query.weight");
        l.bq = vec(p + "attention.self.query.bias");
        l.wk = w(p + "attention.self.key.weight");
        l.bk = vec(p + "attention.self.key.bias");
        l.wv = w(p + "attention.self.value.weight");
        l.bv = vec(p + "attention.self.value.bias");
        l.wo = w(p + "attention.output.dense.weight");
        l.bo = vec(p + "attention.output.dense.bias");
        l.ln1_w = vec(p + "attention.output.LayerNorm.weight");
        l.ln1_b = vec(p + "attention.output.LayerNorm.bias");
        l.w_up = w(p + "intermediate.dense.weight");
        l.b_up = vec(p + "intermediate.dense.bias");
        l.w_down = w(p + "output.dense.weight");
        l.b_down = vec(p + "output.dense.bias");
        l.ln2_w = vec(p + "output.LayerNorm.weight");
        l.ln2_b = vec(p + "output.LayerNorm.bias");
      } else {
        const std::string p = "encoder.layers." + std::to_string(i) + ".";
        l.wqkv = w(p + "attn.Wqkv.weight");
        l.wo = w(p + "attn.out_proj.weight");
        l.ln1_w = vec(p + "norm1.weight");
        l.ln1_b = vec(p + "norm1.bias");
        l.w_up = w(p + "mlp.fc11.weight");
        l.w_gate = w(p + "mlp.fc12.weight");
        l.w_down = w(p + "mlp.fc2.weight");
        l.ln2_w = vec(p + "norm2.weight");
        l.ln2_b = vec(p + "norm2.bias");
      }
      im.layers.push_back(std::move(l));
    }
    im.stats.resident_copy_bytes = b.copied;
    if (opts.accelerator) {
      im.accel = opts.accelerator;
      auto bytes = im.place_on_accelerator(im.all_matrices(), im.all_vectors(), "BERT");
      if (!bytes) return fail(std::move(bytes).error());
      im.stats.accel_weight_bytes = *bytes;
    }
    return {};
  }));
  if (opts.prefault) im.prefault();

  std::ostringstream arch;
  arch.precision(17);
  arch << weights::bert_family_name(cfg.family) << ";hidden=" << cfg.hidden << ";inter=" << cfg.intermediate
       << ";layers=" << cfg.layers << ";heads=" << cfg.heads << ";positions=" << cfg.positions << ";eps=" << cfg.eps
       << ";theta=" << cfg.rope_theta << ";vocab=" << cfg.vocab << ";pooling=" << weights::bert_pooling_name(cfg.pooling)
       << ";tokenizer=" << im.tokenizer->vocab_size() << ":" << im.tokenizer->options().lowercase
       << im.tokenizer->options().strip_accents << ":";
  {
    // the vocabulary decides the ids: a digest of its tokens
    std::uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < im.tokenizer->vocab_size(); ++i) {
      for (unsigned char ch : im.tokenizer->token(i)) h = (h ^ ch) * 1099511628211ull;
      h = (h ^ 0xFFu) * 1099511628211ull;
    }
    arch << std::hex << h << std::dec;
  }
  std::vector<Weight*> held = im.all_matrices();
  held.push_back(&im.word);
  im.fingerprint = im.fingerprint_digest("bert;" + arch.str(), opts.revision, held);
  im.stats.total_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return m;
}

const weights::BertConfig& BertModel::config() const { return impl_->cfg; }
const tok::WordPieceTokenizer& BertModel::tokenizer() const { return *impl_->tokenizer; }
const BertLoadStats& BertModel::stats() const { return impl_->stats; }
std::string BertModel::fingerprint() const { return impl_->fingerprint; }
device::Device* BertModel::accelerator() const { return impl_->accel.get(); }
int BertModel::dimensions() const { return impl_->cfg.hidden; }

std::vector<std::int32_t> BertModel::encode(std::string_view text) const {
  return impl_->tokenizer->encode(text, static_cast<std::size_t>(impl_->cfg.positions));
}

// Per row: the residual, q, k, v (or qkv), the attention output and its projection (≈ 7 · hidden) and the MLP's
// intermediates (3 · intermediate); per text and head the scores (2 · L²); f32. Plus one matrix's expansion on an
// accelerator.
std::uint64_t BertModel::activation_bytes(int texts, int tokens) const {
  const Impl& im = *impl_;
  const auto n = static_cast<std::uint64_t>(std::max(texts, 0)), L = static_cast<std::uint64_t>(std::max(tokens, 0));
  std::uint64_t b = n * L * (7 * static_cast<std::uint64_t>(im.cfg.hidden) + 3 * static_cast<std::uint64_t>(im.cfg.intermediate)) * 4 +
                    n * static_cast<std::uint64_t>(im.cfg.heads) * L * L * 8;
  if (b > 0 && im.accel) b += im.dequant_ws;
  return b;
}

Result<std::vector<std::vector<float>>> BertModel::embed_ids(std::span<const std::vector<std::int32_t>> ids,
                                                             const std::atomic<bool>* cancel) {
  Impl& im = *impl_;
  const weights::BertConfig& c = im.cfg;
  if (ids.empty()) return std::vector<std::vector<float>>{};
  std::vector<std::int64_t> lens, flat, positions;
  std::int64_t longest = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto& t = ids[i];
    if (t.size() < 2 || t.size() > static_cast<std::size_t>(c.positions))
      return fail(Errc::invalid_argument, "text " + std::to_string(i) + ": " + std::to_string(t.size()) +
                                              " tokens; must be 2.." + std::to_string(c.positions));
    for (std::size_t j = 0; j < t.size(); ++j) {
      if (t[j] < 0 || t[j] >= c.vocab)
        return fail(Errc::invalid_argument, "text " + std::to_string(i) + ": token id " + std::to_string(t[j]) +
                                                " at position " + std::to_string(j) + " is outside the vocabulary of " +
                                                std::to_string(c.vocab));
      flat.push_back(t[j]);
      positions.push_back(static_cast<std::int64_t>(j));
    }
    lens.push_back(static_cast<std::int64_t>(t.size()));
    longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(t.size()));
  }
  const std::uint64_t ws = activation_bytes(static_cast<int>(ids.size()), static_cast<int>(longest));
  return im.guarded<std::vector<std::vector<float>>>(ws, device::Site::prefill, "embed", "BERT", nullptr, [&] {
    at::Tensor x = embedding_rows(im.word, flat);  // f32 [R, H] on the CPU
    const at::Tensor pidx = at::tensor(positions, at::TensorOptions().dtype(at::kLong));
    if (im.on_accel()) {
      x = x.to(im.accel_dev);
      x = x + im.type0;
      if (im.pos.defined()) x = x + im.pos.index_select(0, pidx.to(im.accel_dev));
    } else {
      x = x + im.type0;
      if (im.pos.defined()) x = x + im.pos.index_select(0, pidx);
    }
    x = im.layer_norm(x.contiguous(), im.emb_w, im.emb_b, c.eps);
    x = im.encode_rows(x, lens, positions, cancel).to(at::kCPU).contiguous();
    std::vector<std::vector<float>> out;
    const std::int64_t H = c.hidden;
    const float* p = x.data_ptr<float>();
    std::int64_t off = 0;
    std::vector<float> pooled(static_cast<std::size_t>(H));
    for (std::int64_t L : lens) {
      if (c.pooling == weights::BertPooling::cls) {
        std::copy(p + off * H, p + (off + 1) * H, pooled.begin());
      } else {
        for (std::int64_t e = 0; e < H; ++e) {
          double s = 0;
          for (std::int64_t r = 0; r < L; ++r) s += p[(off + r) * H + e];
          pooled[static_cast<std::size_t>(e)] = static_cast<float>(s / static_cast<double>(L));
        }
      }
      out.push_back(l2_normalized(pooled.data(), H));
      off += L;
    }
    return Result<std::vector<std::vector<float>>>(std::move(out));
  });
}

Result<std::vector<std::vector<float>>> BertModel::embed_texts(std::span<const std::string> texts,
                                                               const std::atomic<bool>* cancel) {
  std::vector<std::vector<std::int32_t>> ids;
  ids.reserve(texts.size());
  for (const std::string& t : texts) ids.push_back(encode(t));
  return embed_ids(ids, cancel);
}

}  // namespace tandem::engine
