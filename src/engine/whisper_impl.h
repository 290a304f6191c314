// WhisperModel::Impl and WhisperSession::State, shared by whisper.cc (loading, placement, sessions) and
// whisper_forward.cc (encoder, decoder). The files, worker pool, accelerator and the shared building blocks are
// EncoderModelBase's (encoder_model.h); the decoder's self-attention K/V live in the paged KvPool the LLM uses too
// (kv_pool.h). Engine-internal; includes ATen's Tensor type.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "engine/encoder_model.h"
#include "engine/kv_pool.h"
#include "engine/weight.h"
#include "engine/whisper.h"

namespace tandem::engine {

// One attention block: q, v, out with biases; k without (Whisper).
struct WhisperAttn {
  Weight wq, wk, wv, wo;
  at::Tensor bq, bv, bo;
};

// One layer: pre-LN self-attention, (decoder) pre-LN cross-attention, pre-LN fc1 → gelu → fc2.
struct WhisperLayer {
  at::Tensor ln1_w, ln1_b, lnx_w, lnx_b, ln2_w, ln2_b, b1, b2;
  WhisperAttn self, cross;
  Weight w1, w2;
  bool decoder = false;
};

struct WhisperModel::Impl : EncoderModelBase {
  WhisperConfig cfg;
  WhisperLoadOptions opts;
  WhisperLoadStats stats;
  std::string fingerprint;

  Weight conv1, conv2;          // [d, n_mels · 3], [d, d · 3]: (channel, tap) order, the conv weight's
  at::Tensor conv1_b, conv2_b;  // f32 [d]
  at::Tensor enc_pos, dec_pos;  // f32 [source positions, d], [target positions, d]
  std::vector<WhisperLayer> enc, dec;
  at::Tensor enc_ln_w, enc_ln_b, dec_ln_w, dec_ln_b;
  Weight embed;  // [vocab, d]: rows read on the CPU; also the output head unless proj_out is present
  Weight proj;   // proj_out.weight when the file has it (rows == 0 otherwise)

  const Weight& head() const { return proj.rows > 0 ? proj : embed; }
  std::vector<Weight*> all_matrices();
  std::vector<at::Tensor*> all_vectors();
  Status place_on_accelerator();

  // The decoder's self-attention KV pool (kv_pool.h): per decoder layer K and V of [blocks × block_size, d], f32,
  // on the accelerator when there is one. Sessions hold block tables in it (their SeqId).
  std::unique_ptr<KvPool> kv;
  std::atomic<gen::SeqId> next_seq{1};
  Status make_kv_pool();  // in the load's guard, after the placement

  // Workspace estimates (f32 activations): one window's encoder peak, one decode call of `n` tokens; a session's
  // cross-attention K/V and its largest share of the pool (max_target_positions tokens in whole blocks).
  std::uint64_t encode_ws() const;
  std::uint64_t decode_ws(std::int64_t n) const;
  std::uint64_t cross_kv_bytes() const;
  std::uint64_t self_kv_bytes() const;

  // whisper_forward.cc. Activations are f32 [rows, features], on the accelerator when there is one; linear and gelu
  // are EncoderModelBase's (one product over all rows), layer norm with the model's eps.
  using EncoderModelBase::layer_norm;
  at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const {
    return layer_norm(x, w, b, cfg.eps);
  }
  // Multi-head attention of q [n, d] over k, v [m, d] (prefix rows). causal: query i sees keys j ≤ past + i
  // (accelerator only; on the CPU the causal one is self_attention's).
  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int heads, bool causal,
                       std::int64_t past);
  // The decoder's causal self-attention of q [n, d] (positions past …) over decoder layer `layer`'s pool rows at
  // `slots` (positions 0 … past + n − 1; `slots_t` the same as a long tensor on the pool's device). CPU: the
  // row kernel reads the pool in place through the slots; accelerator: the rows gathered, then attention().
  at::Tensor self_attention(const at::Tensor& q, std::size_t layer, const std::vector<std::int64_t>& slots,
                            const at::Tensor& slots_t, std::int64_t past);
  // CPU: K as [heads · m, hd] (head-major) and V transposed as [heads · hd, m], the layouts attention_cpu reads.
  std::pair<at::Tensor, at::Tensor> head_layout(const at::Tensor& k, const at::Tensor& v, int heads) const;
  // CPU, no mask: per head scores = cpu_linear(q_h, K_h), softmax per row, out_h = cpu_linear(P, V_hᵀ). Every row
  // is computed the same way whatever the other rows.
  at::Tensor attention_cpu(const at::Tensor& q, const at::Tensor& kh, const at::Tensor& vt, int heads);
  // Conv1d (kernel 3, padding 1) over x given channel-major [cin, frames] (chan_major) or time-major [frames, cin].
  at::Tensor conv(const at::Tensor& x, bool chan_major, const Weight& w, const at::Tensor& b, int stride);
  // The encoder over one window's mel (f32 CPU [n_mels, frames]) → [source positions, d].
  at::Tensor encoder(const at::Tensor& mel, const std::atomic<bool>* cancel);
};

struct WhisperSession::State {
  std::shared_ptr<WhisperModel> model;
  device::Allocation kv_alloc;  // the accelerator's accounting of the cross K/V below (released after them)
  // Per decoder layer: on an accelerator [source positions, d] each; on the CPU head_layout's K and Vᵀ.
  std::vector<at::Tensor> cross_k, cross_v;
  gen::SeqId id = 0;  // the self-attention K/V: this block table in the model's pool, positions < fed valid
  std::size_t fed = 0;
  bool encoded = false;
};

}  // namespace tandem::engine
