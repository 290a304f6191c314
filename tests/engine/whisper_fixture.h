// Helpers shared by the Whisper model's tests (test_whisper.cc: the CPU forward against an ATen reference, paging,
// files; test_whisper_device.cc: the simulated accelerator and CUDA): the generated test model, sessions, a mel input,
// the plain-ATen reference forward and the logits' relative difference.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/whisper.h"
#include "engine_test_util.h"
#include "modelgen/whisper_writer.h"
#include "weights/safetensors.h"

namespace tandem::engine::whisper_test {

inline std::string tmp_dir(const std::string& name) { return test::fresh_dir("whisper", name); }

inline modelgen::WhisperShape test_shape() { return *modelgen::whisper_preset("whisper-test"); }

inline std::string write_model(const std::string& name, modelgen::WhisperShape s = test_shape(), std::uint64_t seed = 7) {
  const std::string dir = tmp_dir(name);
  modelgen::WhisperWriteOptions o;
  o.shape = std::move(s);
  o.seed = seed;
  EXPECT_TRUE(modelgen::write_whisper_model(dir, o).ok());
  return dir;
}

inline std::shared_ptr<WhisperModel> load(const std::string& path, WhisperLoadOptions o = {}) {
  return test::load_ok<WhisperModel>(path, o);
}

inline std::unique_ptr<WhisperSession> session(WhisperModel& m) {
  auto s = m.new_session();
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
  return s.ok() ? std::move(s).value() : nullptr;
}

// A log-mel-like window (values in about [-1, 1.5]), different per `k`.
inline std::vector<float> mel(const WhisperConfig& c, int k) {
  std::vector<float> m(static_cast<std::size_t>(c.n_mels) * c.window_frames());
  for (int b = 0; b < c.n_mels; ++b)
    for (int f = 0; f < c.window_frames(); ++f)
      m[static_cast<std::size_t>(b) * c.window_frames() + f] =
          0.25F + 1.2F * std::sin(0.013F * f * (1 + k) + 0.7F * b) * std::cos(0.002F * f + 0.3F * k);
  return m;
}

inline std::string read(const std::string& path) { return test::read_file(path); }

// --- Independent reference: the HF modules written with ATen ops over the safetensors (f32). ---
struct Ref {
  weights::SafetensorsFile f;
  WhisperConfig c;
  at::Tensor t(const std::string& name) const { return test::f32_tensor(f, name); }
  at::Tensor lin(const at::Tensor& x, const std::string& p, bool bias = true) const {
    return at::linear(x, t(p + ".weight"), bias ? t(p + ".bias") : at::Tensor());
  }
  at::Tensor ln(const at::Tensor& x, const std::string& p) const {
    return at::layer_norm(x, {c.d_model}, t(p + ".weight"), t(p + ".bias"), 1e-5);
  }
  // WhisperAttention: q scaled after its projection, k without bias.
  at::Tensor mha(const at::Tensor& xq, const at::Tensor& xkv, const std::string& p, int heads, bool causal) const {
    const std::int64_t n = xq.size(0), m = xkv.size(0), hd = c.d_model / heads;
    auto split = [&](const at::Tensor& v, std::int64_t L) { return v.view({L, heads, hd}).transpose(0, 1); };
    at::Tensor q = split(lin(xq, p + ".q_proj") * std::pow(static_cast<double>(hd), -0.5), n);
    at::Tensor k = split(lin(xkv, p + ".k_proj", false), m), v = split(lin(xkv, p + ".v_proj"), m);
    at::Tensor sc = at::matmul(q, k.transpose(1, 2));
    if (causal) sc = sc + at::full({n, m}, -std::numeric_limits<float>::infinity()).triu(1);
    at::Tensor o = at::matmul(at::softmax(sc, -1), v).transpose(0, 1).reshape({n, c.d_model});
    return lin(o, p + ".out_proj");
  }
  at::Tensor encoder(const std::vector<float>& mel) const {
    at::Tensor x = at::from_blob(const_cast<float*>(mel.data()), {1, c.n_mels, c.window_frames()}, at::kFloat);
    x = at::gelu(at::conv1d(x, t("model.encoder.conv1.weight"), t("model.encoder.conv1.bias"), 1, 1));
    x = at::gelu(at::conv1d(x, t("model.encoder.conv2.weight"), t("model.encoder.conv2.bias"), 2, 1));
    x = x[0].t() + t("model.encoder.embed_positions.weight");
    for (int i = 0; i < c.encoder_layers; ++i) {
      const std::string l = "model.encoder.layers." + std::to_string(i) + ".";
      at::Tensor h = ln(x, l + "self_attn_layer_norm");
      x = x + mha(h, h, l + "self_attn", c.encoder_heads, false);
      x = x + lin(at::gelu(lin(ln(x, l + "final_layer_norm"), l + "fc1")), l + "fc2");
    }
    return ln(x, "model.encoder.layer_norm");
  }
  // The logits at every position for `ids` fed at once from position 0: [L, vocab].
  at::Tensor decoder(const at::Tensor& enc, const std::vector<std::int32_t>& ids) const {
    const auto L = static_cast<std::int64_t>(ids.size());
    std::vector<std::int64_t> i64(ids.begin(), ids.end());
    at::Tensor emb = t("model.decoder.embed_tokens.weight");
    at::Tensor x = emb.index_select(0, at::tensor(i64, at::kLong));
    if (c.scale_embedding) x = x * std::sqrt(static_cast<double>(c.d_model));
    x = x + t("model.decoder.embed_positions.weight").narrow(0, 0, L);
    for (int i = 0; i < c.decoder_layers; ++i) {
      const std::string l = "model.decoder.layers." + std::to_string(i) + ".";
      at::Tensor h = ln(x, l + "self_attn_layer_norm");
      x = x + mha(h, h, l + "self_attn", c.decoder_heads, true);
      x = x + mha(ln(x, l + "encoder_attn_layer_norm"), enc, l + "encoder_attn", c.decoder_heads, false);
      x = x + lin(at::gelu(lin(ln(x, l + "final_layer_norm"), l + "fc1")), l + "fc2");
    }
    x = ln(x, "model.decoder.layer_norm");
    return at::matmul(x, (f.find("proj_out.weight") ? t("proj_out.weight") : emb).t());
  }
};

inline Ref reference(const std::string& dir) {
  auto f = weights::SafetensorsFile::open(dir + "/model.safetensors");
  EXPECT_TRUE(f.ok());
  return Ref{std::move(f).value(), *weights::parse_whisper_config(read(dir + "/config.json"))};
}

inline std::vector<float> row(const at::Tensor& t, std::int64_t i) {
  const at::Tensor r = t[i].contiguous();
  return std::vector<float>(r.data_ptr<float>(), r.data_ptr<float>() + r.numel());
}

// max |a − b| / max |b|.
inline double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0, m = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, std::abs(double(a[i]) - b[i]));
    m = std::max(m, std::abs(double(b[i])));
  }
  return m > 0 ? d / m : d;
}

inline const std::vector<std::int32_t> kTokens{297, 5, 17, 42, 250, 3, 99, 296, 11, 12};

}  // namespace tandem::engine::whisper_test
