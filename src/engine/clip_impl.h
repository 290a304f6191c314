// ClipModel::Impl, shared by clip.cc (loading, placement, accessors) and clip_forward.cc (the encoders). The files,
// pool, accelerator and the shared building blocks are EncoderModelBase's (encoder_model.h). Engine-internal;
// includes ATen's Tensor type.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <string>
#include <vector>

#include "engine/clip.h"
#include "engine/encoder_model.h"
#include "engine/weight.h"

namespace tandem::engine {

// One encoder layer: pre-LN attention with biases, pre-LN MLP (fc1 → act → fc2). Vectors are f32 (CPU tensors, or
// device copies on an accelerator).
struct ClipLayer {
  at::Tensor ln1_w, ln1_b, ln2_w, ln2_b, bq, bk, bv, bo, b1, b2;
  Weight wq, wk, wv, wo, w1, w2;
  std::vector<Weight*> matrices() { return {&wq, &wk, &wv, &wo, &w1, &w2}; }
  std::vector<at::Tensor*> vectors() { return {&ln1_w, &ln1_b, &ln2_w, &ln2_b, &bq, &bk, &bv, &bo, &b1, &b2}; }
};

struct ClipTower {
  ClipTowerShape shape;
  std::vector<ClipLayer> layers;
};

struct ClipModel::Impl : EncoderModelBase {
  ClipConfig cfg;
  ClipLoadOptions opts;
  ClipLoadStats stats;
  std::string fingerprint;

  Weight token_embd;        // read on the CPU, row by row (any type)
  at::Tensor text_pos;      // f32 [text positions, text hidden]
  at::Tensor vision_pos;    // f32 [1 + patches, vision hidden]
  at::Tensor class_embd;    // f32 [vision hidden]
  Weight patch;             // [vision hidden, channels · patch · patch], (c, y, x) order
  at::Tensor final_w, final_b, pre_w, pre_b, post_w, post_b;
  Weight text_proj, visual_proj;
  ClipTower text, vision;

  std::vector<Weight*> all_matrices();
  std::vector<at::Tensor*> all_vectors();
  Status place_on_accelerator();

  // clip_forward.cc. `rows`: every item's rows in item order (f32 [R, hidden]); `lens`: each item's row count.
  at::Tensor tower(const ClipTower& t, at::Tensor x, const std::vector<std::int64_t>& lens, bool causal,
                   const std::atomic<bool>* cancel);
  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int heads,
                       const std::vector<std::int64_t>& lens, bool causal) const;
  at::Tensor activation(const at::Tensor& x, const std::string& act) const;
  // One embed call under EncoderModelBase::guarded (Site::prefill).
  template <class F>
  Result<std::vector<std::vector<float>>> guarded(std::uint64_t ws_bytes, const char* op, F&& body) {
    return EncoderModelBase::guarded<std::vector<std::vector<float>>>(ws_bytes, device::Site::prefill, op, "CLIP", nullptr,
                                                                      std::forward<F>(body));
  }
  // Projection and L2 normalisation of one pooled row per item.
  std::vector<std::vector<float>> project(const at::Tensor& pooled, const Weight& proj);
};

}  // namespace tandem::engine
