// The forward pass of Model in LibTorch: the layer math (matmuls through Tandem's kernels on the CPU, ATen on an
// accelerator; row kernels for norms, rotary embedding and SiLU), the paged KV writes and reads, and the ragged
// batch of continuous batching (forward_batch). Loading and placement are in model.cc, the text side in
// model_text.cc.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <numeric>
#include <tuple>

#include "engine/dequant.h"
#include "engine/model.h"
#include "engine/model_impl.h"
#include "engine/weight.h"
#include "kernels/kernels.h"
#include "kernels/rows.h"
#include "engine/worker_pool.h"

namespace tandem::engine {

namespace {

// Thrown inside a forward when the accelerator reports a fault at a safe point; caught in Model::forward.
struct DeviceFault {
  Error error;
};

// Row operations of a prompt chunk (norms, rotary, SiLU) go to the worker pool in ranges of this many rows; a decode
// step's few rows stay on the calling thread (waking the workers would cost more than the rows).
constexpr std::int64_t kRowGrain = 16;

}  // namespace

// x @ W^T. On the CPU through Tandem's kernels (kernels.h): the activations are prepared once for the weight
// type (q8_0 / q8_K blocks, f16, bf16, f32), then the output rows are split across the model's worker pool.
// On the accelerator the stored blocks are expanded into a workspace matrix and multiplied with ATen.
at::Tensor Model::Impl::linear(const at::Tensor& x, const Weight& w) {
  if (w.dev.defined()) {
    const at::Tensor m = dequantize_aten(w.dev, w.type, w.cols, x.scalar_type());
    // One row (a decode step alone): a matrix-vector product. ATen's mm of a 1-row matrix goes to a GEMM that
    // repacks the whole weight matrix on every call (OpenBLAS 0.3.21), ~5x slower on the simulated device.
    if (x.size(0) == 1) return at::mv(m, x.select(0, 0)).unsqueeze(0);
    return at::matmul(x, m.t());
  }
  return cpu_linear(x, w, *pool, act_buf);
}

at::Tensor Model::Impl::biased(const at::Tensor& y, const at::Tensor& b) {
  if (!b.defined()) return y;
  return y.add_(b);  // y is a fresh matmul result: [n, rows] + [rows]
}

// RMSNorm of every row. CPU rows (f32) through the row kernel (kernels/rows.h: the same operations for a row whatever
// else is in the batch); accelerator rows with ATen in the activation dtype.
at::Tensor Model::Impl::rmsnorm(const at::Tensor& x, const at::Tensor& w) const {
  if (x.is_cpu() && w.is_cpu() && w.scalar_type() == at::kFloat) {
    const at::Tensor xf = x.to(at::kFloat).contiguous();
    at::Tensor out = at::empty_like(xf);
    const std::int64_t d = xf.size(1);
    const float* xp = xf.data_ptr<float>();
    float* op = out.data_ptr<float>();
    pool->split(xf.size(0), kRowGrain, [&](std::int64_t b, std::int64_t e) {
      kernels::rmsnorm_rows(xp + b * d, w.data_ptr<float>(), e - b, d, static_cast<float>(cfg().rms_norm_eps), op + b * d);
    });
    return out;
  }
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor r = at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + cfg().rms_norm_eps);
  return (xf * r).to(w.scalar_type()) * w;
}

// cos/sin tables for the absolute positions of the rows: [n, head_dim / 2] (the angle of pair i), f32 on the CPU.
std::pair<at::Tensor, at::Tensor> Model::Impl::rope_tables(const std::vector<std::int64_t>& pos) const {
  return rope_tables(pos, inv_freq);
}

std::pair<at::Tensor, at::Tensor> Model::Impl::rope_tables(const std::vector<std::int64_t>& pos,
                                                           const at::Tensor& inv) const {
  const auto n = static_cast<std::int64_t>(pos.size());
  const std::int64_t half = inv.size(0);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  at::Tensor cos = at::empty({n, half}, f32), sin = at::empty({n, half}, f32);
  kernels::rope_table(pos.data(), n, inv.data_ptr<float>(), half, rope_mscale, cos.data_ptr<float>(),
                      sin.data_ptr<float>());
  return {cos, sin};
}

// x: [n, heads, hd]; cos/sin: [n, hd / 2] broadcast over heads. Pair i is (i, i + hd/2) in the HF layout
// ("rotate_half") and (2i, 2i+1) in GGUF's (llama.cpp permutes Q/K rows when converting; the dot products of
// queries and keys are the same either way). CPU (f32): rotated in place by the row kernel.
at::Tensor Model::Impl::apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) const {
  const std::int64_t n = x.size(0), h = x.size(1), hd = x.size(2), half = hd / 2;
  if (x.is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous()) {
    float* xp = x.data_ptr<float>();
    const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
    pool->split(n, kRowGrain, [&](std::int64_t b, std::int64_t e) {
      kernels::rope_rows(xp + b * h * hd, e - b, h, half, cp + b * half, sp + b * half, rope_interleaved);
    });
    return x;
  }
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  at::Tensor out;
  if (rope_interleaved) {
    const at::Tensor p = xf.view({n, h, half, 2});
    const at::Tensor x1 = p.select(3, 0), x2 = p.select(3, 1);
    out = at::stack({x1 * c - x2 * s, x2 * c + x1 * s}, 3).view({n, h, hd});
  } else {
    const at::Tensor x1 = xf.narrow(-1, 0, half), x2 = xf.narrow(-1, half, half);
    out = at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
  }
  return out.to(x.scalar_type());
}

// act(gate) × up (SiLU, or Gemma's GELU-tanh): CPU rows (f32) through the row kernels, in place into `gate`;
// accelerator rows with ATen.
at::Tensor Model::Impl::act_mul(const at::Tensor& gate, const at::Tensor& up) const {
  const bool gelu = cfg().activation == weights::Activation::gelu_tanh;
  if (gate.is_cpu() && gate.scalar_type() == at::kFloat && gate.is_contiguous() && up.is_contiguous()) {
    const auto fn = gelu ? kernels::gelu_tanh_mul : kernels::silu_mul;
    const std::int64_t d = gate.dim() > 1 ? gate.size(-1) : gate.numel();
    float* g = gate.data_ptr<float>();
    const float* u = up.data_ptr<float>();
    pool->split(gate.numel() / d, kRowGrain, [&](std::int64_t b, std::int64_t e) { fn(g + b * d, u + b * d, (e - b) * d, g + b * d); });
    return gate;
  }
  return (gelu ? at::gelu(gate, "tanh") : at::silu(gate)) * up;
}

at::Tensor Model::Impl::softcap(at::Tensor x, const std::optional<double>& cap) {
  if (!cap) return x;
  if (x.is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous()) {
    kernels::softcap_rows(x.data_ptr<float>(), x.numel(), static_cast<float>(*cap));
    return x;
  }
  return x.div_(*cap).tanh_().mul_(*cap);
}

bool Model::Impl::pool_rows(const at::Tensor& q, const KvView& kv) {
  const at::ScalarType kv_type = kv.keys.scalar_type();
  return kv.slots != nullptr && q.is_cpu() && q.scalar_type() == at::kFloat &&
         (kv_type == at::kFloat || kv_type == at::kHalf) && kv.values.scalar_type() == kv_type &&
         kv.keys.is_contiguous() && kv.values.is_contiguous();
}

bool Model::Impl::decode_row(const at::Tensor& q, std::int64_t n, const KvView& kv) {
  return n == 1 && pool_rows(q, kv);
}

void Model::Impl::attention_row(const float* q, std::int64_t H, std::int64_t hd, const KvView& kv, std::int64_t pos0,
                                bool slides, std::vector<float>& scratch, float* out) const {
  const std::int64_t window = slides ? cfg().sliding_window.value_or(0) : 0;
  const double scale = cfg().attn_scale > 0.0 ? cfg().attn_scale : 1.0 / std::sqrt(static_cast<double>(hd));
  if (scratch.size() < static_cast<std::size_t>(kv.length)) scratch.resize(static_cast<std::size_t>(kv.length));
  const float cap = cfg().attn_softcap ? static_cast<float>(*cfg().attn_softcap) : 0.0F;
  if (kv.keys.scalar_type() == at::kHalf) {
    kernels::attention_decode(q, H, kv.keys.size(1), hd, static_cast<const std::uint16_t*>(kv.keys.data_ptr()),
                              static_cast<const std::uint16_t*>(kv.values.data_ptr()), kv.slots, pos0, window,
                              static_cast<float>(scale), cap, scratch.data(), out);
  } else {
    kernels::attention_decode(q, H, kv.keys.size(1), hd, kv.keys.data_ptr<float>(),
                              kv.values.data_ptr<float>(), kv.slots, pos0, window, static_cast<float>(scale), cap,
                              scratch.data(), out);
  }
}

void Model::Impl::attention_rows(const float* q, std::int64_t n, std::int64_t H, std::int64_t hd, const KvView& kv,
                                 std::int64_t pos0, bool slides, float* out) const {
  const std::int64_t kvh = kv.keys.size(1), group = H / kvh, qrow = H * hd;
  const std::int64_t window = slides ? cfg().sliding_window.value_or(0) : 0;
  const auto scale = static_cast<float>(cfg().attn_scale > 0.0 ? cfg().attn_scale
                                                                 : 1.0 / std::sqrt(static_cast<double>(hd)));
  const float cap = cfg().attn_softcap ? static_cast<float>(*cfg().attn_softcap) : 0.0F;
  const bool half = kv.keys.scalar_type() == at::kHalf;
  // Units (kv head g, row i) in the order g · n + i: a thread's range keeps a kv head's rows together.
  pool->split(kvh * n, 1, [&](std::int64_t u0, std::int64_t u1) {
    std::vector<std::int64_t> slots;  // kv head g's part of position j's pool row: a row of head_dim elements
    std::vector<float> scratch(static_cast<std::size_t>(kv.length));
    std::int64_t g_slots = -1;
    for (std::int64_t u = u0; u < u1; ++u) {
      const std::int64_t g = u / n, i = u % n, pos = pos0 + i;
      // The range's first row of a kv head reads its keys and values from memory; the next ones find them in cache.
      kernels::KvRows rows = kernels::KvRows::cached;
      if (g != g_slots) {
        slots.resize(static_cast<std::size_t>(kv.length));
        for (std::int64_t j = 0; j < kv.length; ++j) slots[static_cast<std::size_t>(j)] = kv.slots[j] * kvh + g;
        g_slots = g;
        rows = kernels::KvRows::cold;
      }
      const float* qg = q + i * qrow + g * group * hd;
      float* og = out + i * qrow + g * group * hd;
      if (half) {
        kernels::attention_decode(qg, group, 1, hd, static_cast<const std::uint16_t*>(kv.keys.data_ptr()),
                                  static_cast<const std::uint16_t*>(kv.values.data_ptr()), slots.data(), pos, window,
                                  scale, cap, scratch.data(), og, rows);
      } else {
        kernels::attention_decode(qg, group, 1, hd, kv.keys.data_ptr<float>(), kv.values.data_ptr<float>(),
                                  slots.data(), pos, window, scale, cap, scratch.data(), og, rows);
      }
    }
  });
}

// q: [n, H, hd] at positions pos0.., the keys/values of positions 0..L-1. Causal (and through the sliding window when
// the layer `slides`). → [n, H*hd]
at::Tensor Model::Impl::attention(const at::Tensor& q, const KvView& kv, std::int64_t pos0, bool slides) const {
  const std::int64_t window = slides ? cfg().sliding_window.value_or(0) : 0;
  const double scale = cfg().attn_scale > 0.0 ? cfg().attn_scale : 1.0 / std::sqrt(static_cast<double>(q.size(2)));
  if (decode_row(q, q.size(0), kv)) {
    // A decode row on the CPU: straight from the pool's rows (f16, or f32), no gather and no operator calls.
    at::Tensor out = at::empty({1, q.size(1) * q.size(2)}, q.options());
    const at::Tensor qc = q.contiguous();
    attention_row(qc.data_ptr<float>(), q.size(1), q.size(2), kv, pos0, slides, attn_scratch, out.data_ptr<float>());
    return out;
  }
  if (pool_rows(q, kv)) {
    at::Tensor out = at::empty({q.size(0), q.size(1) * q.size(2)}, q.options());
    const at::Tensor qc = q.contiguous();
    attention_rows(qc.data_ptr<float>(), q.size(0), q.size(1), q.size(2), kv, pos0, slides, out.data_ptr<float>());
    return out;
  }
  at::Tensor keys = kv.keys, values = kv.values;
  if (kv.slots != nullptr) {  // the item's rows gathered from the pool
    const at::Tensor idx = at::from_blob(const_cast<std::int64_t*>(kv.slots), {kv.length},
                                         at::TensorOptions().dtype(at::kLong))
                               .to(kv.keys.device());
    keys = kv.keys.index_select(0, idx);
    values = kv.values.index_select(0, idx);
  }
  const std::int64_t n = q.size(0), H = q.size(1), hd = q.size(2);
  const std::int64_t kvh = keys.size(1), L = keys.size(0), g = H / kvh;
  const at::Tensor qh = q.to(at::kFloat).view({n, kvh, g, hd}).permute({1, 2, 0, 3}).reshape({kvh, g * n, hd});
  const at::Tensor kt = keys.to(at::kFloat).permute({1, 2, 0});  // [kvh, hd, L]
  const at::Tensor vh = values.to(at::kFloat).permute({1, 0, 2});  // [kvh, L, hd]
  at::Tensor mask;
  if (n > 1 || pos0 + n < L || (window > 0 && L > window)) {
    // key j is visible to query i (absolute position pos0 + i) iff j <= pos0 + i, and with a sliding window W also
    // j > pos0 + i - W (the W most recent positions, the query's own included)
    const auto on = at::TensorOptions().device(q.device());
    const at::Tensor qi = at::arange(pos0, pos0 + n, on.dtype(at::kLong)).unsqueeze(1);
    const at::Tensor kj = at::arange(0, L, on.dtype(at::kLong)).unsqueeze(0);
    at::Tensor hidden = kj > qi;
    if (window > 0) hidden = hidden.logical_or(kj <= qi - window);
    mask = at::zeros({n, L}, on.dtype(at::kFloat)).masked_fill_(hidden, -std::numeric_limits<float>::infinity());
  }
  // KV heads [h0, h1): scores, mask, softmax, weighted values into their rows of `out`. Each head's values depend
  // on its own rows only, so on the CPU the heads are split across the worker pool (the same result as one call).
  at::Tensor out = at::empty({kvh, g * n, hd}, qh.options());  // [kvh, g*n, hd]
  const auto heads = [&](std::int64_t h0, std::int64_t h1) {
    const std::int64_t c = h1 - h0;
    at::Tensor scores = softcap(at::bmm(qh.narrow(0, h0, c), kt.narrow(0, h0, c)).mul_(scale), cfg().attn_softcap);
    if (mask.defined()) scores = scores.view({c, g, n, L}).add_(mask).view({c, g * n, L});
    at::Tensor part = out.narrow(0, h0, c);
    at::bmm_out(part, at::softmax(scores, -1), vh.narrow(0, h0, c));
  };
  if (q.is_cpu()) {
    pool->split(kvh, 1, [&](std::int64_t h0, std::int64_t h1) {
      c10::InferenceMode guard;  // thread-local: the workers' ATen calls run in it too
      heads(h0, h1);
    });
  } else {
    heads(0, kvh);
  }
  return out.view({kvh, g, n, hd}).permute({2, 0, 1, 3}).reshape({n, H * hd}).to(q.scalar_type());
}

at::Tensor Model::Impl::linear_on(const at::Tensor& x, const Weight& w, bool accel) {
  if (accel) return linear(x, w);
  return cpu_linear(x, w, *pool, act_buf);
}

// x @ W^T for the rows of several items. On the CPU and on CUDA one product over all rows (the CPU kernels are
// row-independent; cuBLAS picks its kernel by shape, docs/batching.md). On the simulated device (ATen's CPU BLAS)
// each item's rows get their own product — a matrix-vector product for one row, a GEMM for a chunk — exactly as
// when the item runs alone, since OpenBLAS's GEMM and GEMV round differently.
at::Tensor Model::Impl::linear_items(const at::Tensor& x, const Weight& w, bool accel, const std::vector<RowSpan>& spans,
                                     const std::vector<std::size_t>& items, bool last_rows) {
  if (!accel || accel_dev.is_cuda() || items.size() == 1) return linear_on(x, w, accel);
  std::vector<at::Tensor> parts;
  parts.reserve(items.size());
  std::int64_t off = 0;
  for (std::size_t i : items) {
    const std::int64_t n = last_rows && !spans[i].all_logits ? 1 : spans[i].n;
    parts.push_back(linear(x.narrow(0, off, n), w));
    off += n;
  }
  return at::cat(parts, 0);
}

// One transformer layer over the rows of `items` (their rows in item order in x). On the CPU (f32, Tandem's kernels,
// the CPU norms and biases) or on the accelerator (`accel`: the device copies in `dtype`).
template <class KvStep>
at::Tensor Model::Impl::layer(std::size_t li, at::Tensor x, const std::vector<RowSpan>& spans,
                              const std::vector<std::size_t>& items, bool accel, const RopeRows& rope,
                              KvStep& kv_step) {
  const auto& c = cfg();
  const Layer& l = layers[li];
  const bool cpu_copy = !accel && l.on_accel;  // an offloaded item's rows on an accelerator layer
  const at::Tensor& an = cpu_copy ? l.attn_norm_cpu : l.attn_norm;
  const at::Tensor& mn = cpu_copy ? l.mlp_norm_cpu : l.mlp_norm;
  const at::Tensor& bq = cpu_copy ? l.bq_cpu : l.bq;
  const at::Tensor& bk = cpu_copy ? l.bk_cpu : l.bk;
  const at::Tensor& bv = cpu_copy ? l.bv_cpu : l.bv;
  const at::Tensor& qn = cpu_copy ? l.qn_cpu : l.qn;
  const at::Tensor& kn = cpu_copy ? l.kn_cpu : l.kn;
  const at::Tensor& apn = cpu_copy ? l.attn_post_norm_cpu : l.attn_post_norm;
  const at::Tensor& mpn = cpu_copy ? l.mlp_post_norm_cpu : l.mlp_post_norm;
  const bool slides = c.layer_slides(static_cast<int>(li));
  const bool local = slides && rope.cos_local.defined();
  const at::Tensor& cos = local ? rope.cos_local : rope.cos;
  const at::Tensor& sin = local ? rope.sin_local : rope.sin;
  const std::int64_t N = x.size(0);
  const at::Tensor h = rmsnorm(x, an);
  auto lin = [&](const at::Tensor& in, const Weight& w) { return linear_items(in, w, accel, spans, items, false); };
  // Qwen3, Gemma 3: each head's q and k RMS-normalised over head_dim (one weight shared by the heads) before the rotation.
  auto head_norm = [&](const at::Tensor& t, const at::Tensor& w, std::int64_t heads) {
    if (!w.defined()) return t.view({N, heads, c.head_dim});
    return rmsnorm(t.view({N * heads, c.head_dim}), w).view({N, heads, c.head_dim});
  };
  // On the CPU q, k and v (and below gate and up) in one pass of the worker pool (cpu_linears: the same results).
  std::vector<at::Tensor> qkv;
  if (accel) qkv = {lin(h, l.wq), lin(h, l.wk), lin(h, l.wv)};
  else qkv = cpu_linears(h, {&l.wq, &l.wk, &l.wv}, *pool, act_buf);
  const at::Tensor q = apply_rope(head_norm(biased(qkv[0], bq), qn, c.num_heads), cos, sin);
  const at::Tensor k = apply_rope(head_norm(biased(qkv[1], bk), kn, c.num_kv_heads), cos, sin);
  const at::Tensor v = biased(qkv[2], bv).view({N, c.num_kv_heads, c.head_dim});
  at::Tensor attn;
  if (items.size() == 1) {
    attn = attention(q, kv_step(items[0], li, k, v, accel), spans[items[0]].pos0, slides);
  } else {
    // Every item's keys and values written first, in item order (the pool's bookkeeping stays on this thread).
    std::vector<KvView> views;
    views.reserve(items.size());
    std::int64_t off = 0;
    bool rows = true;
    for (std::size_t i : items) {
      const std::int64_t n = spans[i].n;
      views.push_back(kv_step(i, li, k.narrow(0, off, n), v.narrow(0, off, n), accel));
      rows = rows && decode_row(q, n, views.back());
      off += n;
    }
    if (rows) {
      // Decode rows only (continuous batching's steps): the items' attention on the worker pool, each row the
      // same kernel call as alone (the same result), each range with its own scratch.
      attn = at::empty({N, c.num_heads * c.head_dim}, q.options());
      float* out = attn.data_ptr<float>();
      const at::Tensor qc = q.contiguous();  // [N, heads, head_dim]: row r at r · heads · head_dim
      const float* qp = qc.data_ptr<float>();
      pool->split(static_cast<std::int64_t>(items.size()), 1, [&](std::int64_t b, std::int64_t e) {
        c10::InferenceMode guard;  // thread-local: the workers' ATen calls run in it too
        std::vector<float> scratch;
        for (std::int64_t r = b; r < e; ++r) {
          const auto ri = static_cast<std::size_t>(r);
          attention_row(qp + r * c.num_heads * c.head_dim, c.num_heads, c.head_dim, views[ri], spans[items[ri]].pos0,
                        slides, scratch, out + r * c.num_heads * c.head_dim);
        }
      });
    } else {
      std::vector<at::Tensor> parts;
      parts.reserve(items.size());
      off = 0;
      for (std::size_t j = 0; j < items.size(); ++j) {
        const std::int64_t n = spans[items[j]].n;
        parts.push_back(attention(q.narrow(0, off, n), views[j], spans[items[j]].pos0, slides));
        off += n;
      }
      attn = at::cat(parts, 0);
    }
  }
  // Gemma normalises each sub-layer's output (post-norms) before its residual add.
  auto post = [&](const at::Tensor& y, const at::Tensor& w) { return w.defined() ? rmsnorm(y, w) : y; };
  x = x + post(lin(attn, l.wo), apn);
  const at::Tensor h2 = rmsnorm(x, mn);
  std::vector<at::Tensor> gu;
  if (accel) gu = {lin(h2, l.w_gate), lin(h2, l.w_up)};
  else gu = cpu_linears(h2, {&l.w_gate, &l.w_up}, *pool, act_buf);
  x = x + post(lin(act_mul(gu[0], gu[1]), l.w_down), mpn);
  if (accel) {
    // A safe point: a device lost (or a fault injected) while this layer ran fails the forward here.
    if (auto st2 = this->accel->check(current_site); !st2) throw DeviceFault{std::move(st2).error()};
  }
  return x;
}

// The transformer over a ragged batch: `ids` are the new tokens of every item, item after item; item i has
// spans[i].n tokens at positions spans[i].pos0... The matmuls run once over all rows of a placement (row-independent
// kernels); norms, rotary embedding and SiLU run row by row (kernels/rows.h); attention runs per item over its own
// keys. Item i's rows run layers [0, accel_until) on the accelerator and the rest on the CPU (a replica placed on
// the CPU: 0; an offloaded sequence: its gpu_layers), so a step holds at most two groups of rows, one per
// placement, and rows move from the first to the second at their item's boundary.
// `kv_step(item, layer, k, v, accel)` stores the item's new K/V and returns the keys/values visible to it
// (positions 0 .. pos0+n-1). Returns, item after item, the logits of the item's last row (or of all its rows with
// all_logits), f32 on the CPU.
template <class KvStep>
at::Tensor Model::Impl::run(const std::vector<std::int64_t>& ids, const std::vector<RowSpan>& spans, KvStep&& kv_step) {
  const auto n_layers = static_cast<int>(layers.size());
  std::vector<std::int64_t> off(spans.size() + 1, 0);
  for (std::size_t i = 0; i < spans.size(); ++i) off[i + 1] = off[i] + spans[i].n;
  at::Tensor x_all = embedding_rows(embed, ids);
  if (cfg().embed_scale != 0.0) x_all = x_all * cfg().embed_scale;  // Gemma: rows × sqrt(hidden_size), in f32
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  // The rows of a group of items (in item order), and their rotary tables.
  struct Group {
    std::vector<std::size_t> items;
    at::Tensor x;
    RopeRows rope;
  };
  auto rows_of = [&](const std::vector<std::size_t>& items) {
    std::vector<std::int64_t> r;
    for (std::size_t i : items)
      for (std::int64_t j = off[i]; j < off[i + 1]; ++j) r.push_back(j);
    return r;
  };
  auto tables = [&](Group& g, bool accel) {
    std::vector<std::int64_t> pos;
    for (std::size_t i : g.items)
      for (std::int64_t j = 0; j < spans[i].n; ++j) pos.push_back(spans[i].pos0 + j);
    auto on_dev = [&](std::pair<at::Tensor, at::Tensor> t) {
      if (accel && accel_dev.is_cuda()) t = {t.first.to(accel_dev), t.second.to(accel_dev)};
      return t;
    };
    std::tie(g.rope.cos, g.rope.sin) = on_dev(rope_tables(pos));
    if (inv_freq_local.defined()) std::tie(g.rope.cos_local, g.rope.sin_local) = on_dev(rope_tables(pos, inv_freq_local));
  };
  auto take = [&](const std::vector<std::size_t>& items) {
    if (items.size() == spans.size()) return x_all;
    const auto r = rows_of(items);
    return x_all.index_select(0, at::tensor(r, lopt));
  };
  Group a, c;  // a: rows on the accelerator, c: rows on the CPU
  for (std::size_t i = 0; i < spans.size(); ++i) (spans[i].accel_until > 0 ? a : c).items.push_back(i);
  if (!a.items.empty()) {
    a.x = take(a.items);
    tables(a, true);
  }
  if (!c.items.empty()) {
    c.x = take(c.items);
    tables(c, false);
  }
  for (int li = 0; li < n_layers; ++li) {
    const Layer& l = layers[static_cast<std::size_t>(li)];
    // Items whose accelerator part ends here move their rows to the CPU group (f32), keeping item order there.
    if (!a.items.empty()) {
      std::vector<std::size_t> leave;
      for (std::size_t k = 0; k < a.items.size(); ++k)
        if (spans[a.items[k]].accel_until <= li) leave.push_back(k);
      if (!leave.empty()) {
        std::vector<std::int64_t> stay_rows, leave_rows;
        std::int64_t r = 0;
        std::vector<std::size_t> stay_items, leave_items;
        std::size_t li_idx = 0;
        for (std::size_t k = 0; k < a.items.size(); ++k) {
          const std::int64_t n = spans[a.items[k]].n;
          const bool goes = li_idx < leave.size() && leave[li_idx] == k;
          for (std::int64_t j = 0; j < n; ++j) (goes ? leave_rows : stay_rows).push_back(r + j);
          (goes ? leave_items : stay_items).push_back(a.items[k]);
          if (goes) ++li_idx;
          r += n;
        }
        const at::Tensor moved =
            a.x.index_select(0, at::tensor(leave_rows, lopt).to(a.x.device())).to(at::kCPU, at::kFloat);
        // merge into c in item order
        std::vector<std::size_t> merged = c.items;
        merged.insert(merged.end(), leave_items.begin(), leave_items.end());
        std::sort(merged.begin(), merged.end());
        at::Tensor joined = c.items.empty() ? moved : at::cat({c.x, moved}, 0);
        if (!c.items.empty()) {
          // joined rows are c's items then the moved ones: reorder to item order
          std::vector<std::size_t> order = c.items;
          order.insert(order.end(), leave_items.begin(), leave_items.end());
          std::vector<std::int64_t> start(spans.size(), 0);
          std::int64_t p = 0;
          for (std::size_t it : order) {
            start[it] = p;
            p += spans[it].n;
          }
          std::vector<std::int64_t> perm;
          for (std::size_t it : merged)
            for (std::int64_t j = 0; j < spans[it].n; ++j) perm.push_back(start[it] + j);
          joined = joined.index_select(0, at::tensor(perm, lopt));
        }
        c.items = std::move(merged);
        c.x = joined.contiguous();
        tables(c, false);
        a.items = std::move(stay_items);
        if (a.items.empty()) {
          a.x = at::Tensor();
        } else {
          a.x = a.x.index_select(0, at::tensor(stay_rows, lopt).to(a.x.device())).contiguous();
          tables(a, true);
        }
      }
    }
    if (!a.items.empty()) {
      const at::ScalarType st = dtype;
      if (a.x.device() != l.attn_norm.device() || a.x.scalar_type() != st) a.x = a.x.to(l.attn_norm.device(), st);
      a.x = layer(static_cast<std::size_t>(li), a.x, spans, a.items, true, a.rope, kv_step);
    }
    if (!c.items.empty()) {
      if (!c.x.is_cpu() || c.x.scalar_type() != at::kFloat) c.x = c.x.to(at::kCPU, at::kFloat);
      c.x = layer(static_cast<std::size_t>(li), c.x, spans, c.items, false, c.rope, kv_step);
    }
  }
  // The head: on the accelerator for rows that ran every layer there when it is placed there, else on the CPU.
  auto head = [&](Group& g, bool accel) {
    at::Tensor x = g.x;
    const at::ScalarType head_st = accel ? dtype : at::kFloat;
    const at::Device dev = accel ? final_norm.device() : at::Device(at::kCPU);
    if (x.device() != dev || x.scalar_type() != head_st) x = x.to(dev, head_st);
    bool every_row = true;
    for (std::size_t i : g.items) every_row = every_row && spans[i].all_logits;
    if (!every_row) {
      std::vector<std::int64_t> rows;
      std::int64_t r = 0;
      for (std::size_t i : g.items) {
        if (spans[i].all_logits)
          for (std::int64_t j = 0; j < spans[i].n; ++j) rows.push_back(r + j);
        else
          rows.push_back(r + spans[i].n - 1);
        r += spans[i].n;
      }
      x = rows.size() == 1 ? x.narrow(0, rows[0], 1) : x.index_select(0, at::tensor(rows, lopt).to(x.device()));
    }
    x = rmsnorm(x.contiguous(), accel ? final_norm : final_norm_cpu);
    const at::Tensor logits = every_row ? linear_items(x, lm_head, accel, spans, g.items, false)
                                        : linear_items(x, lm_head, accel, spans, g.items, true);
    return softcap(logits.to(at::kFloat).to(at::kCPU).contiguous(), cfg().final_softcap);
  };
  if (c.items.empty()) return head(a, head_on_accel);
  if (a.items.empty()) return head(c, false);
  // Both groups: logits back in item order.
  const at::Tensor la = head(a, head_on_accel), lc = head(c, false);
  std::vector<at::Tensor> parts;
  std::int64_t ra = 0, rc = 0;
  std::size_t ka = 0;
  for (std::size_t i = 0; i < spans.size(); ++i) {
    const std::int64_t rows = spans[i].all_logits ? spans[i].n : 1;
    if (ka < a.items.size() && a.items[ka] == i) {
      parts.push_back(la.narrow(0, ra, rows));
      ra += rows;
      ++ka;
    } else {
      parts.push_back(lc.narrow(0, rc, rows));
      rc += rows;
    }
  }
  return at::cat(parts, 0).contiguous();
}

namespace {

Result<std::vector<std::int64_t>> check_ids(std::span<const TokenId> tokens, int vocab) {
  if (tokens.empty()) return fail(Errc::invalid_argument, "forward: no tokens");
  std::vector<std::int64_t> ids(tokens.begin(), tokens.end());
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      return fail(Errc::invalid_argument, "token " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                                              " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  return ids;
}

Error map_torch_error(const std::string& what, std::string_view where) {
  const bool oom = what.find("not enough memory") != std::string::npos ||
                   what.find("out of memory") != std::string::npos ||
                   what.find("DefaultCPUAllocator") != std::string::npos;
  // Sticky CUDA errors (illegal address, launch failure, ECC, device unavailable) leave the context unusable.
  const bool cuda_fault = !oom && (what.find("CUDA error") != std::string::npos ||
                                   what.find("cudaError") != std::string::npos);
  return make_error(oom ? Errc::out_of_memory : cuda_fault ? Errc::device_lost : Errc::internal,
                    std::string(where) + ": " + what);
}

}  // namespace

Result<std::vector<float>> Model::forward(Sequence& seq, std::span<const TokenId> tokens, bool all_logits) {
  const BatchItem item{&seq, tokens, all_logits};
  auto out = forward_batch(std::span(&item, 1));
  if (!out) return fail(std::move(out).error());
  return std::move(out->front());
}

Result<std::vector<Result<std::vector<float>>>> Model::forward_batch(std::span<const BatchItem> items) {
  Impl& im = *impl_;
  std::vector<Result<std::vector<float>>> results;
  results.reserve(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) results.emplace_back(std::vector<float>{});
  if (items.empty()) return results;
  // One forward at a time per model; held from the block reservation to the last K/V write, so a release from
  // another thread (which takes this lock) cannot free blocks under a running forward.
  std::lock_guard compute(im.compute_mu);
  // Per item: validate and reserve its blocks. An item that fails here gets its own error and stays out of the step.
  struct Live {
    std::size_t index;
    std::int64_t pos0, n;
    std::vector<std::int64_t> slots;  // KV slot of every position 0 .. pos0+n-1
  };
  std::vector<Live> live;
  std::vector<std::int64_t> ids;
  std::vector<Impl::RowSpan> spans;
  bool any_prefill = false;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const BatchItem& it = items[i];
    Sequence& seq = *it.seq;
    if (seq.model_.get() != this) {
      results[i] = fail(Errc::invalid_argument, "forward: sequence belongs to another model");
      continue;
    }
    if (seq.released_) {
      results[i] = fail(Errc::invalid_argument, "forward: the sequence was released");
      continue;
    }
    auto checked = check_ids(it.tokens, im.cfg().vocab_size);
    if (!checked) {
      results[i] = fail(std::move(checked).error());
      continue;
    }
    bool dup = false;  // one sequence twice in a step would write its positions twice
    for (const Live& l : live) dup = dup || items[l.index].seq == it.seq;
    if (dup) {
      results[i] = fail(Errc::invalid_argument, "forward: a sequence appears twice in one batch");
      continue;
    }
    const std::int64_t pos0 = seq.length_;
    const auto n = static_cast<std::int64_t>(it.tokens.size());
    if (pos0 + n > im.max_context) {
      results[i] = fail(Errc::invalid_argument, "context overflow: " + std::to_string(pos0) + " cached + " +
                                                    std::to_string(n) + " new tokens > max context " +
                                                    std::to_string(im.max_context));
      continue;
    }
    auto slots = im.kv.reserve(seq.id_, pos0 + n);
    if (!slots) {
      results[i] = fail(std::move(slots).error());
      continue;
    }
    Live l{i, pos0, n, std::move(slots).value()};
    any_prefill = any_prefill || n > 1 || pos0 == 0;
    ids.insert(ids.end(), checked->begin(), checked->end());
    const int accel_until = !im.accel ? 0 : seq.gpu_layers_ >= 0 ? std::min(seq.gpu_layers_, im.accel_layers) : im.accel_layers;
    spans.push_back({pos0, n, it.all_logits, accel_until});
    live.push_back(std::move(l));
  }
  if (live.empty()) return results;
  const device::Site site = any_prefill ? device::Site::prefill : device::Site::decode;
  device::Allocation workspace;
  if (im.accel) {
    if (im.device_lost())
      return fail(Errc::device_lost, im.accel->name() + ": the model's device buffers were lost (driver reset); "
                                                         "reload the replica");
    TANDEM_TRY(im.accel->check(site));
    std::uint64_t bytes = 0;
    for (const Live& l : live) bytes += workspace_bytes(l.n, l.pos0 + l.n) - im.dequant_ws;
    auto ws = im.accel->allocate(bytes + im.dequant_ws, site);
    if (!ws) return fail(std::move(ws).error());
    workspace = std::move(ws).value();
  }
  try {
    c10::InferenceMode guard;
    im.current_site = site;
    const auto lopt = at::TensorOptions().dtype(at::kLong);
    std::vector<at::Tensor> all(live.size()), fresh(live.size()), all_acc(live.size()), fresh_acc(live.size());
    for (std::size_t i = 0; i < live.size(); ++i) {
      all[i] = at::tensor(live[i].slots, lopt);
      fresh[i] = all[i].narrow(0, live[i].pos0, live[i].n);
      if (im.accel_dev.is_cuda()) {
        all_acc[i] = all[i].to(im.accel_dev);
        fresh_acc[i] = all_acc[i].narrow(0, live[i].pos0, live[i].n);
      }
    }
    at::Tensor logits = im.run(ids, spans, [&](std::size_t item, std::size_t li, const at::Tensor& k, const at::Tensor& v,
                                               bool accel_rows) {
      if (!accel_rows && im.layers[li].on_accel) {
        // An offloaded sequence on an accelerator layer: its K/V of this layer live in host memory.
        const Live& l = live[item];
        auto& hk = im.host_kv[items[l.index].seq->id_];
        if (hk.k.empty()) {
          hk.from = spans[item].accel_until;
          hk.k.resize(static_cast<std::size_t>(im.accel_layers - hk.from));
          hk.v.resize(hk.k.size());
        }
        const std::int64_t need = l.pos0 + l.n;
        if (need > hk.capacity) {
          const std::int64_t cap = std::min<std::int64_t>(im.max_context, std::max<std::int64_t>(need, 2 * hk.capacity));
          const auto& c = im.cfg();
          for (std::size_t j = 0; j < hk.k.size(); ++j) {
            at::Tensor nk = at::empty({cap, c.num_kv_heads, c.head_dim}, at::TensorOptions().dtype(at::kFloat));
            at::Tensor nv = at::empty_like(nk);
            if (hk.capacity > 0) {
              nk.narrow(0, 0, l.pos0).copy_(hk.k[j].narrow(0, 0, l.pos0));
              nv.narrow(0, 0, l.pos0).copy_(hk.v[j].narrow(0, 0, l.pos0));
            }
            hk.k[j] = nk;
            hk.v[j] = nv;
          }
          hk.capacity = cap;
          hk.slots.resize(static_cast<std::size_t>(cap));
          std::iota(hk.slots.begin(), hk.slots.end(), std::int64_t{0});
        }
        const std::size_t j = li - static_cast<std::size_t>(hk.from);
        hk.k[j].narrow(0, l.pos0, l.n).copy_(k);
        hk.v[j].narrow(0, l.pos0, l.n).copy_(v);
        // Read in place by attention() as a pool whose position j is row j (the same kernels as the pool's rows).
        return Impl::KvView{hk.k[j], hk.v[j], hk.slots.data(), need};
      }
      const bool acc = im.kv.k(li).is_cuda();
      im.kv.write(li, acc ? fresh_acc[item] : fresh[item], k, v);
      if (im.kv.k(li).is_cpu()) {  // read in place by attention()
        const Live& l = live[item];
        return Impl::KvView{im.kv.k(li), im.kv.v(li), l.slots.data(), l.pos0 + l.n};
      }
      auto [keys, values] = im.kv.read(li, acc ? all_acc[item] : all[item]);
      return Impl::KvView{std::move(keys), std::move(values)};
    });
    const float* p = logits.data_ptr<float>();
    const std::int64_t vocab = logits.size(1);
    std::int64_t row = 0;
    for (std::size_t i = 0; i < live.size(); ++i) {
      const std::int64_t rows = spans[i].all_logits ? spans[i].n : 1;
      results[live[i].index] = std::vector<float>(p + row * vocab, p + (row + rows) * vocab);
      row += rows;
      items[live[i].index].seq->length_ = live[i].pos0 + live[i].n;
    }
    return results;
  } catch (const DeviceFault& f) {
    return fail(f.error);
  } catch (const c10::Error& e) {
    Error err = map_torch_error(e.what_without_backtrace(), "forward");
    if (im.accel && err.code == Errc::internal && !im.accel->check(site).ok()) err.code = Errc::device_lost;
    return fail(std::move(err));
  } catch (const std::bad_alloc&) {
    return fail(Errc::out_of_memory, "forward: out of host memory");
  }
}

Result<std::vector<float>> Model::forward_reference(std::span<const TokenId> tokens) {
  Impl& im = *impl_;
  auto ids = check_ids(tokens, im.cfg().vocab_size);
  if (!ids) return fail(std::move(ids).error());
  if (im.device_lost()) return fail(Errc::device_lost, im.accel->name() + ": the model's device buffers were lost");
  try {
    std::lock_guard compute(im.compute_mu);
    c10::InferenceMode guard;
    const std::vector<Impl::RowSpan> spans{{0, static_cast<std::int64_t>(ids->size()), true, im.accel ? im.accel_layers : 0}};
    at::Tensor logits = im.run(*ids, spans, [](std::size_t, std::size_t, const at::Tensor& k, const at::Tensor& v, bool) {
      return Impl::KvView{k, v};
    });
    const float* p = logits.data_ptr<float>();
    return std::vector<float>(p, p + logits.numel());
  } catch (const DeviceFault& f) {
    return fail(f.error);
  } catch (const c10::Error& e) {
    return fail(map_torch_error(e.what_without_backtrace(), "forward_reference"));
  }
}

}  // namespace tandem::engine
