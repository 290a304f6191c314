// The CLIP encoders (Hugging Face CLIPTextTransformer / CLIPVisionTransformer semantics). On the CPU: matrix
// products through Tandem's kernels (cpu_linear: row-independent), layer norm, attention and the activation as
// plain per-row / per-item loops, so an input's vector does not depend on what else is in the batch. On an
// accelerator: ATen (matrices expanded from their stored blocks one at a time, dequant.h), attention per item.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <cmath>
#include <limits>

#include "engine/clip_impl.h"
#include "engine/encoder_rows.h"

namespace tandem::engine {

namespace {

// CLIP's quick GELU (x · sigmoid(1.702 x)), in place.
void quick_gelu_rows(float* x, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) x[i] = static_cast<float>(x[i] / (1.0 + std::exp(-1.702 * x[i])));
}

std::vector<float> normalized(const float* p, std::int64_t n) {
  double ss = 0;
  for (std::int64_t i = 0; i < n; ++i) ss += static_cast<double>(p[i]) * p[i];
  const double inv = ss > 0 ? 1.0 / std::sqrt(ss) : 0.0;
  std::vector<float> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = static_cast<float>(p[i] * inv);
  return out;
}

}  // namespace

at::Tensor ClipModel::Impl::attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int heads,
                                      const std::vector<std::int64_t>& lens, bool causal) const {
  const std::int64_t H = q.size(1), hd = H / heads;
  if (!on_accel()) {
    at::Tensor out = at::empty_like(q);
    std::int64_t off = 0;
    for (std::int64_t L : lens) {  // each item's rows attend to that item's rows only
      attention_rows(q.data_ptr<float>() + off * H, k.data_ptr<float>() + off * H, v.data_ptr<float>() + off * H,
                     out.data_ptr<float>() + off * H, 0, L, L, H, heads, causal, 0);
      off += L;
    }
    return out;
  }
  std::vector<at::Tensor> parts;
  std::int64_t off = 0;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  for (std::int64_t L : lens) {
    auto split = [&](const at::Tensor& t) { return t.narrow(0, off, L).view({L, heads, hd}).transpose(0, 1); };
    at::Tensor sc = at::matmul(split(q), split(k).transpose(1, 2)).mul_(scale);  // [heads, L, L]
    if (causal) sc.masked_fill_(at::ones({L, L}, sc.options().dtype(at::kBool)).triu(1), -std::numeric_limits<float>::infinity());
    at::Tensor o = at::matmul(at::softmax(sc, -1), split(v));  // [heads, L, hd]
    parts.push_back(o.transpose(0, 1).reshape({L, H}));
    off += L;
  }
  return at::cat(parts, 0);
}

at::Tensor ClipModel::Impl::activation(const at::Tensor& x, const std::string& act) const {
  if (act == "gelu") return gelu(x);
  if (!on_accel()) {
    quick_gelu_rows(x.data_ptr<float>(), x.numel());
    return x;
  }
  return x * at::sigmoid(x * 1.702);
}

at::Tensor ClipModel::Impl::tower(const ClipTower& t, at::Tensor x, const std::vector<std::int64_t>& lens, bool causal,
                                  const std::atomic<bool>* cancel) {
  const ClipTowerShape& s = t.shape;
  for (const ClipLayer& l : t.layers) {
    throw_if_cancelled(cancel);
    if (on_accel()) {
      Status st = accel->check(device::Site::prefill);
      if (!st.ok()) throw Error(std::move(st).error());
    }
    at::Tensor h = layer_norm(x, l.ln1_w, l.ln1_b, s.eps);
    const at::Tensor q = linear(h, l.wq, l.bq, lens), k = linear(h, l.wk, l.bk, lens), v = linear(h, l.wv, l.bv, lens);
    const at::Tensor a = attention(q, k, v, s.heads, lens, causal);
    x = x + linear(a, l.wo, l.bo, lens);
    h = layer_norm(x, l.ln2_w, l.ln2_b, s.eps);
    h = activation(linear(h, l.w1, l.b1, lens), s.act);
    x = x + linear(h, l.w2, l.b2, lens);
  }
  return x;
}

std::vector<std::vector<float>> ClipModel::Impl::project(const at::Tensor& pooled, const Weight& proj) {
  const std::vector<std::int64_t> ones(static_cast<std::size_t>(pooled.size(0)), 1);
  const at::Tensor y = linear(pooled, proj, at::Tensor(), ones).to(at::kCPU).contiguous();
  std::vector<std::vector<float>> out;
  for (std::int64_t i = 0; i < y.size(0); ++i) out.push_back(normalized(y.data_ptr<float>() + i * y.size(1), y.size(1)));
  return out;
}

Result<std::vector<std::vector<float>>> ClipModel::embed_texts(std::span<const std::vector<std::int32_t>> ids,
                                                               const std::atomic<bool>* cancel) {
  Impl& im = *impl_;
  const ClipConfig& c = im.cfg;
  if (ids.empty()) return std::vector<std::vector<float>>{};
  std::vector<std::int64_t> lens, flat, eot;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto& t = ids[i];
    if (t.empty() || t.size() > static_cast<std::size_t>(c.text.positions))
      return fail(Errc::invalid_argument, "text " + std::to_string(i) + ": " + std::to_string(t.size()) +
                                              " tokens; must be 1.." + std::to_string(c.text.positions));
    std::int64_t pos = -1, best = 0;
    for (std::size_t j = 0; j < t.size(); ++j) {
      if (t[j] < 0 || t[j] >= c.vocab)
        return fail(Errc::invalid_argument, "text " + std::to_string(i) + ": token id " + std::to_string(t[j]) +
                                                " at position " + std::to_string(j) + " is outside the vocabulary of " +
                                                std::to_string(c.vocab));
      flat.push_back(t[j]);
      if (c.legacy_eos_argmax) {
        if (j == 0 || t[j] > best) best = t[j], pos = static_cast<std::int64_t>(j);
      } else if (pos < 0 && c.eos_id >= 0 && t[j] == c.eos_id) {
        pos = static_cast<std::int64_t>(j);
      }
    }
    lens.push_back(static_cast<std::int64_t>(t.size()));
    eot.push_back(pos >= 0 ? pos : static_cast<std::int64_t>(t.size()) - 1);
  }
  return im.guarded(activation_bytes(static_cast<int>(ids.size()), 0), "embed_texts", [&] {
    at::Tensor x = embedding_rows(im.token_embd, flat);
    std::vector<std::int64_t> pos_ids;
    for (std::int64_t L : lens)
      for (std::int64_t p = 0; p < L; ++p) pos_ids.push_back(p);
    const at::Tensor pidx = at::tensor(pos_ids, at::TensorOptions().dtype(at::kLong));
    if (im.on_accel()) {
      x = x.to(im.accel_dev);
      x = x + im.text_pos.index_select(0, pidx.to(im.accel_dev));
    } else {
      x = x + im.text_pos.index_select(0, pidx);
    }
    x = im.tower(im.text, x, lens, true, cancel);
    std::vector<std::int64_t> rows;
    std::int64_t off = 0;
    for (std::size_t i = 0; i < lens.size(); ++i) rows.push_back(off + eot[i]), off += lens[i];
    const at::Tensor ridx = at::tensor(rows, at::TensorOptions().dtype(at::kLong)).to(x.device());
    const at::Tensor pooled = im.layer_norm(x.index_select(0, ridx).contiguous(), im.final_w, im.final_b, c.text.eps);
    return Result<std::vector<std::vector<float>>>(im.project(pooled, im.text_proj));
  });
}

Result<std::vector<std::vector<float>>> ClipModel::embed_images(std::span<const std::vector<float>> pixels,
                                                                const std::atomic<bool>* cancel) {
  Impl& im = *impl_;
  const ClipConfig& c = im.cfg;
  if (pixels.empty()) return std::vector<std::vector<float>>{};
  const std::int64_t S = c.image_size, P = c.patch_size, C = c.channels, g = S / P, np = g * g;
  const std::int64_t per = C * P * P;
  for (std::size_t i = 0; i < pixels.size(); ++i)
    if (pixels[i].size() != static_cast<std::size_t>(C * S * S))
      return fail(Errc::invalid_argument, "image " + std::to_string(i) + ": " + std::to_string(pixels[i].size()) +
                                              " floats; must be " + std::to_string(C) + "x" + std::to_string(S) + "x" +
                                              std::to_string(S) + " (CHW)");
  const auto B = static_cast<std::int64_t>(pixels.size());
  return im.guarded(activation_bytes(0, static_cast<int>(B)), "embed_images", [&] {
    // The patches in grid order (row-major), each flattened (c, y, x) as the convolution weight is.
    at::Tensor patches = at::empty({B * np, per}, at::TensorOptions().dtype(at::kFloat));
    float* pp = patches.data_ptr<float>();
    for (std::int64_t b = 0; b < B; ++b) {
      const float* img = pixels[static_cast<std::size_t>(b)].data();
      for (std::int64_t gy = 0; gy < g; ++gy)
        for (std::int64_t gx = 0; gx < g; ++gx) {
          float* o = pp + ((b * np) + gy * g + gx) * per;
          for (std::int64_t ch = 0; ch < C; ++ch)
            for (std::int64_t y = 0; y < P; ++y)
              for (std::int64_t xx = 0; xx < P; ++xx)
                *o++ = img[(ch * S + gy * P + y) * S + gx * P + xx];
        }
    }
    const std::vector<std::int64_t> patch_lens(static_cast<std::size_t>(B), np);
    if (im.on_accel()) patches = patches.to(im.accel_dev);
    const at::Tensor emb = im.linear(patches, im.patch, at::Tensor(), patch_lens).view({B, np, -1});
    const std::int64_t H = c.vision.hidden;
    at::Tensor x = at::cat({im.class_embd.view({1, 1, H}).expand({B, 1, H}), emb}, 1) + im.vision_pos.unsqueeze(0);
    x = x.reshape({B * (np + 1), H}).contiguous();
    const std::vector<std::int64_t> lens(static_cast<std::size_t>(B), np + 1);
    x = im.layer_norm(x, im.pre_w, im.pre_b, c.vision.eps);
    x = im.tower(im.vision, x, lens, false, cancel);
    const at::Tensor cls = x.view({B, np + 1, H}).select(1, 0).contiguous();
    const at::Tensor pooled = im.layer_norm(cls, im.post_w, im.post_b, c.vision.eps);
    return Result<std::vector<std::vector<float>>>(im.project(pooled, im.visual_proj));
  });
}

}  // namespace tandem::engine
