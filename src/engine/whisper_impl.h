// WhisperModel::Impl and WhisperSession::State, shared by whisper.cc (loading, placement, sessions) and
// whisper_forward.cc (encoder, decoder). Engine-internal; includes ATen's Tensor type.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/weight.h"
#include "engine/whisper.h"
#include "engine/worker_pool.h"
#include "weights/gguf.h"
#include "weights/model_dir.h"

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

struct WhisperModel::Impl {
  WhisperConfig cfg;
  WhisperLoadOptions opts;
  WhisperLoadStats stats;
  std::string fingerprint;

  std::optional<weights::SafetensorsWeights> st;
  std::optional<weights::GgufFile> gguf;
  std::vector<weights::TensorView> gguf_views;  // sorted by name
  std::vector<const weights::MappedFile*> files;

  Weight conv1, conv2;          // [d, n_mels · 3], [d, d · 3]: (channel, tap) order, the conv weight's
  at::Tensor conv1_b, conv2_b;  // f32 [d]
  at::Tensor enc_pos, dec_pos;  // f32 [source positions, d], [target positions, d]
  std::vector<WhisperLayer> enc, dec;
  at::Tensor enc_ln_w, enc_ln_b, dec_ln_w, dec_ln_b;
  Weight embed;  // [vocab, d]: rows read on the CPU; also the output head unless proj_out is present
  Weight proj;   // proj_out.weight when the file has it (rows == 0 otherwise)

  std::unique_ptr<WorkerPool> pool;
  std::vector<std::byte> act_buf;
  std::mutex compute_mu;  // one encode/decode at a time: the pool and act_buf are shared

  std::shared_ptr<device::Device> accel;
  at::Device accel_dev{at::kCPU};
  std::vector<device::Allocation> accel_allocs;
  std::uint64_t dequant_ws = 0;

  bool on_accel() const { return accel != nullptr; }
  bool device_lost() const {
    if (!accel) return false;
    if (accel->lost()) return true;
    for (const auto& a : accel_allocs)
      if (!a.valid()) return true;
    return false;
  }
  const Weight& head() const { return proj.rows > 0 ? proj : embed; }
  std::vector<Weight*> all_matrices();
  std::vector<at::Tensor*> all_vectors();
  Status place_on_accelerator();

  // Workspace estimates (f32 activations): one window's encoder peak, one decode call of `n` tokens, and the
  // persistent K/V of one session.
  std::uint64_t encode_ws() const;
  std::uint64_t decode_ws(std::int64_t n) const;
  std::uint64_t kv_bytes() const;

  // whisper_forward.cc. Activations are f32 [rows, features], on the accelerator when there is one.
  at::Tensor linear(const at::Tensor& x, const Weight& w, const at::Tensor& b);
  at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const;
  at::Tensor gelu(at::Tensor x) const;
  // Multi-head attention of q [n, d] over k, v [m, d] (prefix rows). causal: query i sees keys j ≤ past + i.
  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int heads, bool causal,
                       std::int64_t past);
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
  device::Allocation kv_alloc;  // the accelerator's accounting of the buffers below (released after them)
  // Per decoder layer: on an accelerator [source positions, d] each; on the CPU head_layout's K and Vᵀ.
  std::vector<at::Tensor> cross_k, cross_v;
  std::vector<at::Tensor> self_k, self_v;    // per decoder layer [target positions, d]; rows < fed are valid
  std::size_t fed = 0;
  bool encoded = false;
};

}  // namespace tandem::engine
