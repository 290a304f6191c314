// The model of tandem-train-whisper (docs/default-speech-model.md): transformers' WhisperForConditionalGeneration as
// torch::nn modules whose parameter names are the Hugging Face tensor names, and its initialisation. Included by
// tools/tandem_train_whisper.cc only (the tool's one torch translation unit).
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "modelgen/whisper_writer.h"
#include "weights/whisper_layout.h"

namespace tandem::trainwhisper {

// ---- the model: transformers' WhisperForConditionalGeneration, module for module ------------------------------

struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int d, int heads_) : heads(heads_), head_dim(d / heads_) {
    k_proj = register_module("k_proj", torch::nn::Linear(torch::nn::LinearOptions(d, d).bias(false)));
    v_proj = register_module("v_proj", torch::nn::Linear(d, d));
    q_proj = register_module("q_proj", torch::nn::Linear(d, d));
    out_proj = register_module("out_proj", torch::nn::Linear(d, d));
  }
  // x [B, T, d] queries, kv [B, S, d] keys/values; mask additive [T, S] or undefined.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& kv, const torch::Tensor& mask) {
    const std::int64_t B = x.size(0), T = x.size(1), S = kv.size(1);
    const torch::Tensor q = (q_proj(x) * (1.0 / std::sqrt(static_cast<double>(head_dim))))
                                .view({B, T, heads, head_dim}).transpose(1, 2);
    const torch::Tensor k = k_proj(kv).view({B, S, heads, head_dim}).transpose(1, 2);
    const torch::Tensor v = v_proj(kv).view({B, S, heads, head_dim}).transpose(1, 2);
    torch::Tensor s = torch::matmul(q, k.transpose(-1, -2));
    if (mask.defined()) s = s + mask;
    const torch::Tensor o = torch::matmul(torch::softmax(s, -1), v);
    return out_proj(o.transpose(1, 2).reshape({B, T, heads * head_dim}));
  }
  std::int64_t heads, head_dim;
  torch::nn::Linear k_proj{nullptr}, v_proj{nullptr}, q_proj{nullptr}, out_proj{nullptr};
};
TORCH_MODULE(Attention);

torch::nn::LayerNorm layer_norm(int d) { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({d}).eps(1e-5)); }

struct EncoderLayerImpl : torch::nn::Module {
  EncoderLayerImpl(int d, int heads, int ffn) {
    self_attn = register_module("self_attn", Attention(d, heads));
    self_attn_layer_norm = register_module("self_attn_layer_norm", layer_norm(d));
    fc1 = register_module("fc1", torch::nn::Linear(d, ffn));
    fc2 = register_module("fc2", torch::nn::Linear(ffn, d));
    final_layer_norm = register_module("final_layer_norm", layer_norm(d));
  }
  torch::Tensor forward(torch::Tensor x) {
    const torch::Tensor h = self_attn_layer_norm(x);
    x = x + self_attn(h, h, torch::Tensor());
    return x + fc2(torch::gelu(fc1(final_layer_norm(x))));
  }
  Attention self_attn{nullptr};
  torch::nn::LayerNorm self_attn_layer_norm{nullptr}, final_layer_norm{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(EncoderLayer);

struct DecoderLayerImpl : torch::nn::Module {
  DecoderLayerImpl(int d, int heads, int ffn) {
    self_attn = register_module("self_attn", Attention(d, heads));
    self_attn_layer_norm = register_module("self_attn_layer_norm", layer_norm(d));
    encoder_attn = register_module("encoder_attn", Attention(d, heads));
    encoder_attn_layer_norm = register_module("encoder_attn_layer_norm", layer_norm(d));
    fc1 = register_module("fc1", torch::nn::Linear(d, ffn));
    fc2 = register_module("fc2", torch::nn::Linear(ffn, d));
    final_layer_norm = register_module("final_layer_norm", layer_norm(d));
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& enc, const torch::Tensor& causal) {
    const torch::Tensor h = self_attn_layer_norm(x);
    x = x + self_attn(h, h, causal);
    x = x + encoder_attn(encoder_attn_layer_norm(x), enc, torch::Tensor());
    return x + fc2(torch::gelu(fc1(final_layer_norm(x))));
  }
  Attention self_attn{nullptr}, encoder_attn{nullptr};
  torch::nn::LayerNorm self_attn_layer_norm{nullptr}, encoder_attn_layer_norm{nullptr}, final_layer_norm{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(DecoderLayer);

struct EncoderImpl : torch::nn::Module {
  explicit EncoderImpl(const tandem::weights::WhisperConfig& c) {
    conv1 = register_module("conv1", torch::nn::Conv1d(torch::nn::Conv1dOptions(c.n_mels, c.d_model, 3).padding(1)));
    conv2 = register_module("conv2",
                            torch::nn::Conv1d(torch::nn::Conv1dOptions(c.d_model, c.d_model, 3).stride(2).padding(1)));
    embed_positions = register_module("embed_positions", torch::nn::Embedding(c.source_positions, c.d_model));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int i = 0; i < c.encoder_layers; ++i) layers->push_back(EncoderLayer(c.d_model, c.encoder_heads, c.encoder_ffn));
    layer_norm = register_module("layer_norm", trainwhisper::layer_norm(c.d_model));
  }
  // Conv1d (kernel 3, padding 1) as im2col and one matrix product: Debian LibTorch 1.13's conv1d backward returned
  // garbage weight gradients here (norms of 1e8–1e11, different every run). x [B, C, F] → [B, d, F_out].
  static torch::Tensor conv(const torch::nn::Conv1d& m, const torch::Tensor& x, int stride) {
    const torch::Tensor cols = torch::constant_pad_nd(x, {1, 1}).unfold(2, 3, stride);  // [B, C, F_out, 3]
    const std::int64_t B = x.size(0), C = x.size(1), F = cols.size(2);
    const torch::Tensor flat = cols.permute({0, 2, 1, 3}).reshape({B, F, C * 3});
    return (torch::matmul(flat, m->weight.view({m->weight.size(0), C * 3}).t()) + m->bias).transpose(1, 2);
  }
  // mel [B, n_mels, frames] → [B, source_positions, d]
  torch::Tensor forward(const torch::Tensor& mel) {
    torch::Tensor x = torch::gelu(conv(conv2, torch::gelu(conv(conv1, mel, 1)), 2)).transpose(1, 2);
    x = x + embed_positions->weight.unsqueeze(0);
    for (const auto& l : *layers) x = l->as<EncoderLayer>()->forward(x);
    return layer_norm(x);
  }
  torch::nn::Conv1d conv1{nullptr}, conv2{nullptr};
  torch::nn::Embedding embed_positions{nullptr};
  torch::nn::ModuleList layers{nullptr};
  torch::nn::LayerNorm layer_norm{nullptr};
};
TORCH_MODULE(Encoder);

struct DecoderImpl : torch::nn::Module {
  explicit DecoderImpl(const tandem::weights::WhisperConfig& c) {
    embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab, c.d_model));
    embed_positions = register_module("embed_positions", torch::nn::Embedding(c.target_positions, c.d_model));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int i = 0; i < c.decoder_layers; ++i) layers->push_back(DecoderLayer(c.d_model, c.decoder_heads, c.decoder_ffn));
    layer_norm = register_module("layer_norm", trainwhisper::layer_norm(c.d_model));
  }
  // ids [B, T], enc [B, S, d] → logits [B, T, vocab] (tied head)
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& enc) {
    const std::int64_t T = ids.size(1);
    torch::Tensor x = embed_tokens(ids) + embed_positions->weight.narrow(0, 0, T).unsqueeze(0);
    const torch::Tensor causal = torch::full({T, T}, -std::numeric_limits<float>::infinity()).triu(1);
    for (const auto& l : *layers) x = l->as<DecoderLayer>()->forward(x, enc, causal);
    return torch::matmul(layer_norm(x), embed_tokens->weight.t());
  }
  torch::nn::Embedding embed_tokens{nullptr}, embed_positions{nullptr};
  torch::nn::ModuleList layers{nullptr};
  torch::nn::LayerNorm layer_norm{nullptr};
};
TORCH_MODULE(Decoder);

struct InnerImpl : torch::nn::Module {
  explicit InnerImpl(const tandem::weights::WhisperConfig& c) {
    encoder = register_module("encoder", Encoder(c));
    decoder = register_module("decoder", Decoder(c));
  }
  Encoder encoder{nullptr};
  Decoder decoder{nullptr};
};
TORCH_MODULE(Inner);

struct WhisperImpl : torch::nn::Module {
  explicit WhisperImpl(const tandem::weights::WhisperConfig& c) { model = register_module("model", Inner(c)); }
  torch::Tensor forward(const torch::Tensor& mel, const torch::Tensor& ids) {
    return model->decoder(ids, model->encoder(mel));
  }
  Inner model{nullptr};
};
TORCH_MODULE(Whisper);

// transformers' WhisperPreTrainedModel._init_weights (init_std 0.02) except the convolutions: linear and embedding
// weights N(0, 0.02), biases 0, layer norms 1 / 0; the encoder's positions are Whisper's sinusoids and stay fixed.
void init_weights(Whisper& m, const tandem::weights::WhisperConfig& c) {
  torch::NoGradGuard ng;
  for (auto& item : m->named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor& p = item.value();
    if (name == "model.encoder.embed_positions.weight") {
      const auto s = tandem::modelgen::whisper_sinusoids(c.source_positions, c.d_model);
      p.copy_(torch::from_blob(const_cast<float*>(s.data()), {c.source_positions, c.d_model}));
      p.set_requires_grad(false);
    } else if (name == "model.encoder.conv1.weight" || name == "model.encoder.conv2.weight") {
      // He init (std sqrt(2 / fan_in)) instead of 0.02: with 0.02 the convolutions' output is ~0.05 against
      // sinusoids of amplitude 1, and the model learned the grammar for hundreds of steps before it heard anything.
      p.normal_(0, std::sqrt(2.0 / static_cast<double>(p.size(1) * p.size(2))));
    } else if (name.find("layer_norm") != std::string::npos) {
      p.fill_(name.ends_with(".weight") ? 1.0 : 0.0);
    } else if (name.ends_with(".bias")) {
      p.zero_();
    } else {
      p.normal_(0, 0.02);
    }
  }
}

}  // namespace tandem::trainwhisper
