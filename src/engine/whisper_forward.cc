// The Whisper encoder and decoder (Hugging Face WhisperEncoder / WhisperDecoder semantics). On the CPU: matrix
// products through Tandem's kernels (cpu_linear: row-independent), the convolutions as im2col + cpu_linear,
// unmasked attention (encoder, cross) as two cpu_linear products per head around a per-row softmax, the decoder's
// causal self-attention (over the paged KV pool, read in place through the session's slots), layer norm and gelu as
// per-row loops (scores in double), so a row's values do not depend on how many rows a call carries or on the block
// size: feeding tokens one at a time gives the logits of feeding them at once. On an accelerator: ATen (matrices
// expanded one at a time, dequant.h; at::conv1d; attention per head over the pool's rows gathered by index_select).
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <cmath>
#include <limits>

#include "engine/dequant.h"
#include "engine/encoder_rows.h"
#include "engine/whisper_impl.h"

namespace tandem::engine {

std::pair<at::Tensor, at::Tensor> WhisperModel::Impl::head_layout(const at::Tensor& k, const at::Tensor& v,
                                                                   int heads) const {
  const std::int64_t m = k.size(0), d = k.size(1), hd = d / heads;
  return {k.view({m, heads, hd}).transpose(0, 1).contiguous().view({heads * m, hd}),
          v.view({m, heads, hd}).permute({1, 2, 0}).contiguous().view({heads * hd, m})};
}

at::Tensor WhisperModel::Impl::attention_cpu(const at::Tensor& q, const at::Tensor& kh, const at::Tensor& vt, int heads) {
  const std::int64_t n = q.size(0), d = q.size(1), hd = d / heads, m = kh.size(0) / heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  at::Tensor out = at::empty({n, d}, q.options());
  for (int h = 0; h < heads; ++h) {
    Weight wk, wv;
    wk.type = wv.type = kernels::WType::f32;
    wk.rows = m, wk.cols = hd, wk.data = reinterpret_cast<const std::byte*>(kh.data_ptr<float>() + h * m * hd);
    wv.rows = hd, wv.cols = m, wv.data = reinterpret_cast<const std::byte*>(vt.data_ptr<float>() + h * hd * m);
    at::Tensor sc = cpu_linear(q.narrow(1, h * hd, hd).contiguous(), wk, *pool, act_buf);  // [n, m]
    float* sp = sc.data_ptr<float>();
    auto softmax = [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t i = r0; i < r1; ++i) {
        float* r = sp + i * m;
        float mx = r[0];
        for (std::int64_t j = 1; j < m; ++j) mx = std::max(mx, r[j]);
        double sum = 0;
        for (std::int64_t j = 0; j < m; ++j) sum += (r[j] = static_cast<float>(std::exp((static_cast<double>(r[j]) - mx) * scale)));
        const double inv = 1.0 / sum;
        for (std::int64_t j = 0; j < m; ++j) r[j] = static_cast<float>(r[j] * inv);
      }
    };
    const std::int64_t parts = n * m < (1 << 16) ? 1 : pool->size();
    if (parts == 1) softmax(0, n);
    else pool->run([&](int c) { softmax(n * c / parts, n * (c + 1) / parts); });
    out.narrow(1, h * hd, hd).copy_(cpu_linear(sc, wv, *pool, act_buf));
  }
  return out;
}

at::Tensor WhisperModel::Impl::attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int heads,
                                         bool causal, std::int64_t past) {
  const std::int64_t n = q.size(0), m = k.size(0), d = q.size(1), hd = d / heads;
  if (!on_accel()) {  // unmasked (the encoder's self-attention; the decoder's causal one is self_attention's)
    const auto [kh, vt] = head_layout(k, v, heads);
    return attention_cpu(q, kh, vt, heads);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<at::Tensor> outs;
  for (int h = 0; h < heads; ++h) {
    const at::Tensor qh = q.narrow(1, h * hd, hd), kh = k.narrow(1, h * hd, hd), vh = v.narrow(1, h * hd, hd);
    at::Tensor sc = at::matmul(qh, kh.t()).mul_(scale);  // [n, m]
    if (causal && n > 1) {
      // Query i (position past + i) sees keys j <= past + i.
      const at::Tensor mask = at::ones({n, m}, sc.options().dtype(at::kBool)).triu(past + 1);
      sc.masked_fill_(mask, -std::numeric_limits<float>::infinity());
    }
    outs.push_back(at::matmul(at::softmax(sc, -1), vh));
  }
  return at::cat(outs, 1);
}

at::Tensor WhisperModel::Impl::self_attention(const at::Tensor& q, std::size_t layer, const std::vector<std::int64_t>& slots,
                                              const at::Tensor& slots_t, std::int64_t past) {
  const int heads = cfg.decoder_heads;
  if (on_accel()) {
    const auto [k, v] = kv->read(layer, slots_t);
    return attention(q, k, v, heads, true, past);
  }
  const std::int64_t n = q.size(0), m = static_cast<std::int64_t>(slots.size()), d = q.size(1);
  const at::Tensor qc = q.contiguous();
  at::Tensor out = at::empty({n, d}, q.options());
  const float *qp = qc.data_ptr<float>(), *kp = kv->k(layer).data_ptr<float>(), *vp = kv->v(layer).data_ptr<float>();
  float* op = out.data_ptr<float>();
  // Small attentions (a decode step) run on the calling thread: waking the pool costs more than they do.
  const std::int64_t parts = n * m * d < (1 << 18) ? 1 : pool->size();
  if (parts == 1) {
    attention_rows(qp, kp, vp, op, 0, n, m, d, heads, true, past, slots.data());
    return out;
  }
  pool->run([&](int c) {
    attention_rows(qp, kp, vp, op, n * c / parts, n * (c + 1) / parts, m, d, heads, true, past, slots.data());
  });
  return out;
}

at::Tensor WhisperModel::Impl::conv(const at::Tensor& x, bool chan_major, const Weight& w, const at::Tensor& b, int stride) {
  const std::int64_t cin = chan_major ? x.size(0) : x.size(1), frames = chan_major ? x.size(1) : x.size(0);
  const std::int64_t out_frames = (frames + 2 - 3) / stride + 1;
  if (!on_accel()) {
    // im2col: row t holds (channel, tap) in the weight's order, input frame t·stride + tap − 1 (zero outside).
    const at::Tensor xc = x.contiguous();
    at::Tensor cols = at::zeros({out_frames, cin * 3}, x.options());
    const float* xp = xc.data_ptr<float>();
    float* cp = cols.data_ptr<float>();
    for (std::int64_t t = 0; t < out_frames; ++t) {
      float* row = cp + t * cin * 3;
      for (int tap = 0; tap < 3; ++tap) {
        const std::int64_t f = t * stride + tap - 1;
        if (f < 0 || f >= frames) continue;
        for (std::int64_t c = 0; c < cin; ++c) row[c * 3 + tap] = chan_major ? xp[c * frames + f] : xp[f * cin + c];
      }
    }
    return gelu(linear(cols, w, b));
  }
  const at::Tensor m = dequantize_aten(w.dev, w.type, w.cols, at::kFloat).view({w.rows, cin, 3});
  const at::Tensor in = (chan_major ? x : x.t()).unsqueeze(0);
  return at::gelu(at::conv1d(in, m, b, {stride}, {1})[0].t().contiguous());
}

at::Tensor WhisperModel::Impl::encoder(const at::Tensor& mel, const std::atomic<bool>* cancel) {
  at::Tensor x = conv(on_accel() ? mel.to(accel_dev) : mel, true, conv1, conv1_b, 1);
  x = conv(x, false, conv2, conv2_b, 2);
  x = x + enc_pos;
  for (const WhisperLayer& l : enc) {
    throw_if_cancelled(cancel);
    if (on_accel()) {
      Status s = accel->check(device::Site::prefill);
      if (!s.ok()) throw Error(std::move(s).error());
    }
    at::Tensor h = layer_norm(x, l.ln1_w, l.ln1_b);
    const at::Tensor q = linear(h, l.self.wq, l.self.bq), k = linear(h, l.self.wk, at::Tensor()),
                     v = linear(h, l.self.wv, l.self.bv);
    x = x + linear(attention(q, k, v, cfg.encoder_heads, false, 0), l.self.wo, l.self.bo);
    h = layer_norm(x, l.ln2_w, l.ln2_b);
    x = x + linear(gelu(linear(h, l.w1, l.b1)), l.w2, l.b2);
  }
  return layer_norm(x, enc_ln_w, enc_ln_b);
}

namespace {

// Runs `body` under EncoderModelBase::guarded; a session's K/V accounting (`s`, when given) must still be valid.
template <class T, class F>
Result<T> guarded(WhisperModel::Impl& im, const WhisperSession::State* s, std::uint64_t ws_bytes, device::Site site,
                  const char* op, F&& body) {
  return im.guarded<T>(ws_bytes, site, op, "Whisper", s ? &s->kv_alloc : nullptr, std::forward<F>(body));
}

Status check_mel(const WhisperConfig& c, std::size_t got) {
  const std::size_t want = static_cast<std::size_t>(c.n_mels) * static_cast<std::size_t>(c.window_frames());
  if (got == want) return {};
  return fail(Errc::invalid_argument, "encode: " + std::to_string(got) + " floats; a window is " + std::to_string(c.n_mels) +
                                          " mel bins x " + std::to_string(c.window_frames()) + " frames = " + std::to_string(want));
}

at::Tensor mel_tensor(const WhisperConfig& c, std::span<const float> mel) {
  return at::from_blob(const_cast<float*>(mel.data()), {c.n_mels, c.window_frames()}, at::kFloat);
}

}  // namespace

Result<std::vector<float>> WhisperModel::encoder_output(std::span<const float> mel, const std::atomic<bool>* cancel) {
  Impl& im = *impl_;
  TANDEM_TRY(check_mel(im.cfg, mel.size()));
  return guarded<std::vector<float>>(im, nullptr, im.encode_ws(), device::Site::prefill, "encode", [&] {
    const at::Tensor out = im.encoder(mel_tensor(im.cfg, mel), cancel).to(at::kCPU).contiguous();
    return Result<std::vector<float>>(std::vector<float>(out.data_ptr<float>(), out.data_ptr<float>() + out.numel()));
  });
}

Status WhisperSession::encode(std::span<const float> mel, const std::atomic<bool>* cancel) {
  State& s = *st_;
  WhisperModel::Impl& im = *s.model->impl_;
  const WhisperConfig& c = im.cfg;
  TANDEM_TRY(check_mel(c, mel.size()));
  // A failed or cancelled encode leaves no usable window; the decoder's blocks go back to the pool.
  s.encoded = false;
  s.fed = 0;
  im.kv->truncate(s.id, 0);
  auto r = guarded<bool>(im, &s, im.encode_ws(), device::Site::prefill, "encode", [&] {
    const at::Tensor out = im.encoder(mel_tensor(c, mel), cancel);
    for (std::size_t i = 0; i < im.dec.size(); ++i) {
      throw_if_cancelled(cancel);
      const WhisperAttn& a = im.dec[i].cross;
      const at::Tensor k = im.linear(out, a.wk, at::Tensor()), v = im.linear(out, a.wv, a.bv);
      if (im.on_accel()) {
        s.cross_k[i].copy_(k);
        s.cross_v[i].copy_(v);
      } else {
        const auto [kh, vt] = im.head_layout(k, v, c.decoder_heads);
        s.cross_k[i].copy_(kh);
        s.cross_v[i].copy_(vt);
      }
    }
    return Result<bool>(true);
  });
  if (!r) return fail(std::move(r).error());
  s.encoded = true;
  return {};
}

Result<std::vector<float>> WhisperSession::decode(std::span<const std::int32_t> tokens, const std::atomic<bool>* cancel) {
  State& s = *st_;
  WhisperModel::Impl& im = *s.model->impl_;
  const WhisperConfig& c = im.cfg;
  if (!s.encoded) return fail(Errc::invalid_argument, "decode: no window encoded (call encode first)");
  if (tokens.empty()) return fail(Errc::invalid_argument, "decode: no tokens");
  if (s.fed + tokens.size() > static_cast<std::size_t>(c.target_positions))
    return fail(Errc::invalid_argument, "decode: " + std::to_string(s.fed) + " tokens fed + " + std::to_string(tokens.size()) +
                                            " exceed the model's " + std::to_string(c.target_positions) + " text positions");
  std::vector<std::int64_t> ids;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.vocab)
      return fail(Errc::invalid_argument, "decode: token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                                              " is outside the vocabulary of " + std::to_string(c.vocab));
    ids.push_back(tokens[i]);
  }
  const auto n = static_cast<std::int64_t>(tokens.size());
  const auto past = static_cast<std::int64_t>(s.fed);
  // The blocks for positions [past, past + n) (all-or-nothing; kv_exhausted leaves the session as it was), and the
  // slot of every position the attention reads. A failed call gives back the blocks it took.
  auto slots = im.kv->reserve(s.id, past + n);
  if (!slots) return fail(std::move(slots).error());
  auto r = guarded<std::vector<float>>(im, &s, im.decode_ws(n), device::Site::decode, "decode", [&] {
    const auto lopt = at::TensorOptions().dtype(at::kLong);
    at::Tensor all = at::tensor(*slots, lopt);
    if (im.on_accel() && im.accel_dev.is_cuda()) all = all.to(im.accel_dev);
    const at::Tensor fresh = all.narrow(0, past, n);
    at::Tensor x = embedding_rows(im.embed, ids);
    if (c.scale_embedding) x.mul_(static_cast<float>(std::sqrt(static_cast<double>(c.d_model))));
    if (im.on_accel()) x = x.to(im.accel_dev);
    x = x + im.dec_pos.narrow(0, past, n);
    for (std::size_t i = 0; i < im.dec.size(); ++i) {
      throw_if_cancelled(cancel);
      if (im.on_accel()) {
        Status st = im.accel->check(device::Site::decode);
        if (!st.ok()) throw Error(std::move(st).error());
      }
      const WhisperLayer& l = im.dec[i];
      at::Tensor h = im.layer_norm(x, l.ln1_w, l.ln1_b);
      const at::Tensor q = im.linear(h, l.self.wq, l.self.bq);
      im.kv->write(i, fresh, im.linear(h, l.self.wk, at::Tensor()), im.linear(h, l.self.wv, l.self.bv));
      const at::Tensor a = im.self_attention(q, i, *slots, all, past);
      x = x + im.linear(a, l.self.wo, l.self.bo);
      h = im.layer_norm(x, l.lnx_w, l.lnx_b);
      const at::Tensor cq = im.linear(h, l.cross.wq, l.cross.bq);
      const at::Tensor ca = im.on_accel() ? im.attention(cq, s.cross_k[i], s.cross_v[i], c.decoder_heads, false, 0)
                                          : im.attention_cpu(cq, s.cross_k[i], s.cross_v[i], c.decoder_heads);
      x = x + im.linear(ca, l.cross.wo, l.cross.bo);
      h = im.layer_norm(x, l.ln2_w, l.ln2_b);
      x = x + im.linear(im.gelu(im.linear(h, l.w1, l.b1)), l.w2, l.b2);
    }
    const at::Tensor last = im.layer_norm(x.narrow(0, n - 1, 1).contiguous(), im.dec_ln_w, im.dec_ln_b);
    const at::Tensor logits = im.linear(last, im.head(), at::Tensor()).to(at::kCPU).contiguous();
    return Result<std::vector<float>>(std::vector<float>(logits.data_ptr<float>(), logits.data_ptr<float>() + logits.numel()));
  });
  if (!r) {
    im.kv->truncate(s.id, past);
    return r;
  }
  s.fed += tokens.size();
  return r;
}

}  // namespace tandem::engine
