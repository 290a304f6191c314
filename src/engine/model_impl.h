// Model::Impl, the state of a loaded replica, shared by the engine's translation units: model.cc (loading, the
// forward pass, the accelerator placement: the methods declared here are defined there) and model_text.cc (the
// text side: tokenizer, prompt template, encode, stop ids, sampling defaults). Engine-internal. It includes ATen's
// Tensor type (the weights and KV pool are tensors) but no ATen operator headers.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/kv_pool.h"
#include "engine/model.h"
#include "generation/chat_template.h"
#include "engine/weight.h"
#include "engine/worker_pool.h"

namespace tandem::engine {

// One transformer layer's weights.
struct Layer {
  at::Tensor attn_norm, mlp_norm;  // f32 on the CPU; the activation dtype on the accelerator
  Weight wq, wk, wv, wo, w_gate, w_up, w_down;
  at::Tensor bq, bk, bv;  // q/k/v biases (Qwen2): f32 on the CPU, the activation dtype there; undefined when none
  at::Tensor qn, kn;      // per-head q/k RMSNorm weights [head_dim] (Qwen3, Gemma 3); undefined when none
  // Gemma's post-norms of the attention output and of the MLP output (mlp_norm is then pre_feedforward_layernorm);
  // undefined when none.
  at::Tensor attn_post_norm, mlp_post_norm;
  bool on_accel = false;
  // On an accelerator layer: the f32 CPU norms and biases, for the rows of offloaded sequences that run this layer
  // on the CPU (the matrices' CPU bytes stay mapped in Weight::data).
  at::Tensor attn_norm_cpu, mlp_norm_cpu, bq_cpu, bk_cpu, bv_cpu, qn_cpu, kn_cpu, attn_post_norm_cpu, mlp_post_norm_cpu;

  // The optional vectors (biases, q/k norms, post-norms), defined or not, in one order.
  std::vector<at::Tensor*> extra_vectors() { return {&bq, &bk, &bv, &qn, &kn, &attn_post_norm, &mlp_post_norm}; }

  std::vector<Weight*> matrices() { return {&wq, &wk, &wv, &wo, &w_gate, &w_up, &w_down}; }
};

// The tokenizer of a model directory or GGUF file (model_text.cc). `origin` names its source in messages.
struct LoadedTokenizer {
  tok::Tokenizer tokenizer;
  std::string origin;
};
Result<LoadedTokenizer> load_tokenizer(const weights::ModelDir& dir);

struct Model::Impl {
  // The opened files (mappings, headers, config): shared by the replicas of one model that load_beside made, so a
  // GPU replica restored next to a warm CPU one reads the pages already mapped instead of opening the files again.
  std::shared_ptr<const weights::ModelDir> dir_owner;
  const weights::ModelDir& dir;  // *dir_owner
  // The tokenizer, parsed from those files once and shared the same way (~10 ms of a 134M restore to parse again).
  std::shared_ptr<const tok::Tokenizer> tokenizer_owner;
  const tok::Tokenizer& tokenizer;  // *tokenizer_owner
  LoadOptions opts;
  LoadStats stats;
  gen::Fingerprint fingerprint;
  gen::TemplateKind templ = gen::TemplateKind::raw;
  // TemplateKind::model: the model's own chat_template, parsed; or why it cannot be used (encode_chat's error).
  std::shared_ptr<const gen::ChatTemplate> chat_template;
  std::optional<Error> chat_template_error;
  bool adds_bos = false;  // tok::model_adds_bos: tokenizer_config / GGUF setting, else the tokenizer's own
  // Activations and KV on the accelerator (f32, or the requested 16-bit dtype there); the CPU computes in f32.
  at::ScalarType dtype = at::kFloat;
  int max_context = 0;

  Weight embed, lm_head;  // lm_head aliases embed's bytes when tied
  at::Tensor final_norm;  // f32 (a device copy in `dtype` when the head runs on the accelerator)
  at::Tensor final_norm_cpu;  // f32 on the CPU (always)
  std::vector<Layer> layers;
  at::Tensor inv_freq;  // [head_dim / 2], f32
  at::Tensor inv_freq_local;  // sliding layers' (Gemma 3's rope_local_theta, unscaled); undefined when none
  float rope_mscale = 1.0F;  // cos/sin multiplier (Phi-3 LongRoPE's attention factor; 1 otherwise)
  bool longrope_long = false;  // LongRoPE: the long factors are in use (max_context > original)
  bool rope_interleaved = false;  // GGUF llama: rotate pairs (2i, 2i+1); HF: rotate halves (i, i + hd/2)
  std::vector<std::byte> act_buf;  // prepared activations of the current matmul (guarded by compute_mu)
  mutable std::vector<float> attn_scratch;  // a decode row's attention scores (guarded by compute_mu)
  std::uint64_t dequant_ws = 0;   // largest accelerator dequantization workspace of one matrix

  // Paged KV pool (kv_pool.h): per layer [num_blocks * block_size, kv_heads, head_dim] for K and for V.
  KvPool kv;
  std::atomic<gen::SeqId> next_seq{1};
  // Offloaded sequences (Sequence::gpu_layers_ < accel_layers): the K/V of their layers [gpu_layers, accel_layers)
  // in host memory, f32 [capacity, kv_heads, head_dim] per layer, grown by doubling. Guarded by compute_mu.
  struct HostKv {
    int from = 0;                          // first layer held here
    std::int64_t capacity = 0;             // positions
    std::vector<at::Tensor> k, v;          // index: layer - from
    std::vector<std::int64_t> slots;       // 0 .. capacity − 1: position j's row, for attention's in-place reads
  };
  std::map<gen::SeqId, HostKv> host_kv;

  std::unique_ptr<WorkerPool> pool;
  std::mutex compute_mu;  // one forward at a time per model: the pool and the KV pool tensors are shared

  // Accelerator placement (see LoadOptions::accelerator).
  std::shared_ptr<device::Device> accel;
  at::Device accel_dev{at::kCPU};
  int accel_layers = 0;
  bool head_on_accel = false;
  std::vector<device::Allocation> accel_allocs;  // weights and KV pool; void after a device loss
  device::Site current_site = device::Site::prefill;

  Impl(std::shared_ptr<const weights::ModelDir> d, std::shared_ptr<const tok::Tokenizer> t, LoadOptions o, int blocks)
      : dir_owner(std::move(d)), dir(*dir_owner), tokenizer_owner(std::move(t)), tokenizer(*tokenizer_owner),
        opts(std::move(o)), kv(blocks, opts.kv_block_size) {}

  const weights::ModelConfig& cfg() const { return dir.config(); }

  bool device_lost() const {
    if (!accel) return false;
    if (accel->lost()) return true;
    for (const auto& a : accel_allocs)
      if (!a.valid()) return true;
    return false;
  }

  // Text side (model_text.cc): the fingerprint components that decide how text becomes ids and when to stop.
  std::vector<std::pair<std::string, std::string>> text_fingerprint(const Model& m) const;
  // The prompt template (model_text.cc): the configured name when given ("model" requires a chat_template that
  // parses); else the model's own chat_template when it has one (an unparsable one is kept as
  // chat_template_error, so loading works and encode_chat reports it); else raw. Also sets adds_bos.
  Status select_template();

  // Compute side (model.cc).
  std::string held_type_summary();
  at::Tensor linear(const at::Tensor& x, const Weight& w);
  static at::Tensor biased(const at::Tensor& y, const at::Tensor& b);  // y + b when b is defined (in place)
  at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& w) const;
  std::pair<at::Tensor, at::Tensor> rope_tables(const std::vector<std::int64_t>& pos) const;
  at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) const;
  std::pair<at::Tensor, at::Tensor> rope_tables(const std::vector<std::int64_t>& pos, const at::Tensor& inv) const;
  // act(gate) × up with the configured activation (SiLU or GELU-tanh), in place into gate on the CPU.
  at::Tensor act_mul(const at::Tensor& gate, const at::Tensor& up) const;
  // What one item's attention reads in a layer: its keys and values ([L, kv heads, head_dim], positions 0..L-1)
  // or, with `slots`, the KV pool's storage and the slot of each of its positions (length of them), read in place.
  struct KvView {
    at::Tensor keys, values;
    const std::int64_t* slots = nullptr;
    std::int64_t length = 0;
  };
  // Causal attention of q [n, heads, head_dim] at positions pos0.. over `kv` → [n, heads · head_dim]. On the CPU
  // over the pool (an f32 query, an f32 or f16 pool) every row reads the pool in place through
  // kernels::attention_decode — a decode row as one call, a prompt chunk's rows per kv head (attention_rows) — so a
  // row's result is the same whatever chunk or batch it came in; otherwise ATen, over the gathered rows.
  at::Tensor attention(const at::Tensor& q, const KvView& kv, std::int64_t pos0, bool slides) const;
  // Whether attention() of an item's n rows of q over kv reads the pool in place (f32 query, an f32 or f16 pool on
  // the CPU; q: the step's rows, whose properties the item's share); decode_row: and n = 1. attention_row: one row's
  // attention (q: heads · head_dim contiguous floats) into out with the caller's scratch — no tensor made for either.
  static bool pool_rows(const at::Tensor& q, const KvView& kv);
  static bool decode_row(const at::Tensor& q, std::int64_t n, const KvView& kv);
  void attention_row(const float* q, std::int64_t heads, std::int64_t hd, const KvView& kv, std::int64_t pos0,
                     bool slides, std::vector<float>& scratch, float* out) const;
  // The n rows of q [n, heads, head_dim] (contiguous) at positions pos0.. over the pool, into out [n, heads · head_dim]:
  // per kv head, its query heads of every row, each (head, row) the very operations attention_row does for it (the
  // same kernel call restricted to one kv head: its slots scaled to that head's part of the pool rows), so the
  // result is attention_row's bit for bit. One kv head's keys and values stay in cache across the chunk's rows; the
  // (kv head, row) pairs are split across the worker pool.
  void attention_rows(const float* q, std::int64_t n, std::int64_t heads, std::int64_t hd, const KvView& kv,
                      std::int64_t pos0, bool slides, float* out) const;
  // cap · tanh(x / cap) in place (Gemma's soft-capping) when cap is set.
  static at::Tensor softcap(at::Tensor x, const std::optional<double>& cap);
  // One item of a ragged batch: n new tokens at positions pos0.. (see run()).
  struct RowSpan {
    std::int64_t pos0 = 0;
    std::int64_t n = 0;
    bool all_logits = false;
    int accel_until = 0;  // layers [0, accel_until) of this item run on the accelerator, the rest on the CPU
  };
  // One layer over the rows of some items: on the accelerator (`accel`) or on the CPU (f32, Tandem's kernels).
  // The rotary tables of a group of rows: global (every layer's, or the full-attention layers') and local (the
  // sliding layers' when they have their own base; else undefined).
  struct RopeRows {
    at::Tensor cos, sin, cos_local, sin_local;
  };
  template <class KvStep>
  at::Tensor layer(std::size_t li, at::Tensor x, const std::vector<RowSpan>& spans, const std::vector<std::size_t>& items,
                   bool accel, const RopeRows& rope, KvStep& kv_step);
  at::Tensor linear_on(const at::Tensor& x, const Weight& w, bool accel);
  // The rows of `items` in item order (with `last_rows`: one row per item, or all its rows with all_logits).
  at::Tensor linear_items(const at::Tensor& x, const Weight& w, bool accel, const std::vector<RowSpan>& spans,
                          const std::vector<std::size_t>& items, bool last_rows);
  template <class KvStep>
  at::Tensor run(const std::vector<std::int64_t>& ids, const std::vector<RowSpan>& spans, KvStep&& kv_step);
  Status place_on_accelerator();
};

}  // namespace tandem::engine
