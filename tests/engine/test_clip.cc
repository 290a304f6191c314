// The CLIP dual encoder (engine/clip.h): against an independent reference forward in plain ATen ops, EOT pooling,
// the causal mask, batch invariance, the simulated accelerator, dtypes and GGUF, malformed inputs.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "engine_test_util.h"
#include "device/simulated.h"
#include "engine/clip.h"
#include "modelgen/clip_writer.h"
#include "weights/safetensors.h"

namespace tandem::engine {
namespace {

namespace fs = std::filesystem;

std::string tmp_dir(const std::string& name) { return test::fresh_dir("clip", name); }

modelgen::ClipShape test_shape() { return *modelgen::clip_preset("clip-test"); }

std::string write_model(const std::string& name, modelgen::ClipShape s = test_shape(),
                        weights::DType dt = weights::DType::f32) {
  const std::string dir = tmp_dir(name);
  modelgen::ClipWriteOptions o;
  o.shape = std::move(s);
  o.dtype = dt;
  o.seed = 7;
  EXPECT_TRUE(modelgen::write_clip_model(dir, o).ok());
  return dir;
}

std::shared_ptr<ClipModel> load(const std::string& path, ClipLoadOptions o = {}) { return test::load_ok<ClipModel>(path, o); }

// Texts: [BOS] tokens [EOS] of various lengths (ids of clip-test: bos 298, eos 299).
std::vector<std::vector<std::int32_t>> texts(int n) {
  std::vector<std::vector<std::int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<std::int32_t> t{298};
    const int len = 1 + (i * 5) % 13;
    for (int j = 0; j < len; ++j) t.push_back((i * 37 + j * 11) % 290);
    t.push_back(299);
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<std::vector<float>> images(int n, int size = 32) {
  std::vector<std::vector<float>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<float> px(static_cast<std::size_t>(3 * size * size));
    for (std::size_t k = 0; k < px.size(); ++k) px[k] = std::sin(0.37F * static_cast<float>(k) + static_cast<float>(i));
    out.push_back(std::move(px));
  }
  return out;
}

// --- Independent reference: the HF modules written with ATen ops over the safetensors (f32). ---
struct Ref {
  weights::SafetensorsFile f;
  weights::ClipConfig c;
  at::Tensor t(const std::string& name) const { return test::f32_tensor(f, name); }
  at::Tensor act(const at::Tensor& x, const std::string& a) const {
    return a == "gelu" ? at::gelu(x) : x * at::sigmoid(1.702 * x);
  }
  // x [L, H]
  at::Tensor layers(at::Tensor x, const std::string& p, const weights::ClipTowerShape& s, bool causal) const {
    const std::int64_t L = x.size(0), H = s.hidden, hd = H / s.heads;
    for (int i = 0; i < s.layers; ++i) {
      const std::string l = p + "encoder.layers." + std::to_string(i) + ".";
      auto lin = [&](const at::Tensor& v, const std::string& n) {
        return at::linear(v, t(l + n + ".weight"), t(l + n + ".bias"));
      };
      at::Tensor h = at::layer_norm(x, {H}, t(l + "layer_norm1.weight"), t(l + "layer_norm1.bias"), s.eps);
      auto heads = [&](const at::Tensor& v) { return v.view({L, s.heads, hd}).transpose(0, 1); };
      at::Tensor q = heads(lin(h, "self_attn.q_proj")) * std::pow(static_cast<double>(hd), -0.5);
      at::Tensor k = heads(lin(h, "self_attn.k_proj")), v = heads(lin(h, "self_attn.v_proj"));
      at::Tensor sc = at::matmul(q, k.transpose(1, 2));
      if (causal) {
        at::Tensor mask = at::full({L, L}, -std::numeric_limits<float>::infinity()).triu(1);
        sc = sc + mask;
      }
      at::Tensor o = at::matmul(at::softmax(sc, -1), v).transpose(0, 1).reshape({L, H});
      x = x + lin(o, "self_attn.out_proj");
      h = at::layer_norm(x, {H}, t(l + "layer_norm2.weight"), t(l + "layer_norm2.bias"), s.eps);
      x = x + lin(act(lin(h, "mlp.fc1"), s.act), "mlp.fc2");
    }
    return x;
  }
  std::vector<float> text(const std::vector<std::int32_t>& ids) const {
    const auto L = static_cast<std::int64_t>(ids.size());
    std::vector<std::int64_t> i64(ids.begin(), ids.end());
    at::Tensor idx = at::tensor(i64, at::kLong);
    at::Tensor x = t("text_model.embeddings.token_embedding.weight").index_select(0, idx) +
                   t("text_model.embeddings.position_embedding.weight").narrow(0, 0, L);
    x = layers(x, "text_model.", c.text, true);
    x = at::layer_norm(x, {c.text.hidden}, t("text_model.final_layer_norm.weight"), t("text_model.final_layer_norm.bias"),
                       c.text.eps);
    std::int64_t pos = L - 1;
    if (c.legacy_eos_argmax) {
      pos = idx.argmax().item<std::int64_t>();
    } else {
      for (std::int64_t j = 0; j < L; ++j)
        if (ids[static_cast<std::size_t>(j)] == c.eos_id) { pos = j; break; }
    }
    at::Tensor e = at::matmul(t("text_projection.weight"), x[pos]);
    e = e / e.norm();
    return std::vector<float>(e.data_ptr<float>(), e.data_ptr<float>() + e.numel());
  }
  std::vector<float> image(const std::vector<float>& px) const {
    at::Tensor img = at::from_blob(const_cast<float*>(px.data()), {1, c.channels, c.image_size, c.image_size}, at::kFloat);
    at::Tensor pe = at::conv2d(img, t("vision_model.embeddings.patch_embedding.weight"), {}, c.patch_size);
    pe = pe.flatten(2).transpose(1, 2)[0];  // [patches, H]
    at::Tensor x = at::cat({t("vision_model.embeddings.class_embedding").unsqueeze(0), pe}, 0) +
                   t("vision_model.embeddings.position_embedding.weight");
    x = at::layer_norm(x, {c.vision.hidden}, t("vision_model.pre_layrnorm.weight"), t("vision_model.pre_layrnorm.bias"),
                       c.vision.eps);
    x = layers(x, "vision_model.", c.vision, false);
    at::Tensor pooled = at::layer_norm(x[0], {c.vision.hidden}, t("vision_model.post_layernorm.weight"),
                                       t("vision_model.post_layernorm.bias"), c.vision.eps);
    at::Tensor e = at::matmul(t("visual_projection.weight"), pooled);
    e = e / e.norm();
    return std::vector<float>(e.data_ptr<float>(), e.data_ptr<float>() + e.numel());
  }
};

Ref reference(const std::string& dir) {
  auto f = weights::SafetensorsFile::open(dir + "/model.safetensors");
  EXPECT_TRUE(f.ok());
  return Ref{std::move(f).value(), *parse_clip_config(test::read_file(dir + "/config.json"))};
}

std::vector<std::vector<std::int32_t>> one(std::vector<std::int32_t> v) { return {std::move(v)}; }

using test::max_diff;

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
  return ab / std::sqrt(aa * bb);
}

TEST(Clip, PresetsAndConfigRoundTrip) {
  const std::string dir = write_model("cfg");
  auto m = load(dir);
  ASSERT_TRUE(m);
  const ClipConfig& c = m->config();
  EXPECT_EQ(c.text.hidden, 32);
  EXPECT_EQ(c.text.positions, 16);
  EXPECT_EQ(c.vision.positions, 17);
  EXPECT_EQ(c.vocab, 300);
  EXPECT_EQ(c.projection_dim, 16);
  EXPECT_EQ(c.eos_id, 299);
  EXPECT_FALSE(c.legacy_eos_argmax);
  EXPECT_NEAR(c.logit_scale, 2.6592F, 1e-6);
  auto b32 = modelgen::clip_preset("clip-b32");
  ASSERT_TRUE(b32.ok());
  EXPECT_EQ(b32->config().vision.positions, 50);
  EXPECT_NEAR(static_cast<double>(b32->parameters()), 151.28e6, 0.1e6);  // openai/clip-vit-base-patch32
  EXPECT_FALSE(modelgen::clip_preset("clip-huge").ok());
}

TEST(Clip, MatchesTheReferenceForwardF32) {
  for (const char* act : {"quick_gelu", "gelu"}) {
    auto s = test_shape();
    s.text.act = s.vision.act = act;
    const std::string dir = write_model(std::string("ref-") + act, s);
    auto m = load(dir);
    ASSERT_TRUE(m);
    const Ref ref = reference(dir);
    const auto t = texts(5);
    auto got = m->embed_texts(t);
    ASSERT_TRUE(got.ok()) << got.error().message;
    for (std::size_t i = 0; i < t.size(); ++i) EXPECT_LT(max_diff((*got)[i], ref.text(t[i])), 1e-5) << act << " text " << i;
    const auto im = images(3);
    auto gi = m->embed_images(im);
    ASSERT_TRUE(gi.ok()) << gi.error().message;
    for (std::size_t i = 0; i < im.size(); ++i) EXPECT_LT(max_diff((*gi)[i], ref.image(im[i])), 1e-5) << act << " image " << i;
  }
}

TEST(Clip, VectorsAreUnitNorm) {
  auto m = load(write_model("norm"));
  ASSERT_TRUE(m);
  const auto vt = *m->embed_texts(texts(4));
  const auto vi = *m->embed_images(images(2));
  for (const auto& v : vt) {
    double n = 0;
    for (float x : v) n += double(x) * x;
    EXPECT_NEAR(n, 1.0, 1e-6);
  }
  for (const auto& v : vi) {
    double n = 0;
    for (float x : v) n += double(x) * x;
    EXPECT_NEAR(n, 1.0, 1e-6);
  }
}

TEST(Clip, EotPoolingAndTheCausalMask) {
  const std::string dir = write_model("eot");
  auto m = load(dir);
  ASSERT_TRUE(m);
  // Tokens after the first EOS do not change the vector (causal attention; pooled at the first EOS)...
  std::vector<std::int32_t> a{298, 5, 6, 7, 299, 10, 11}, b{298, 5, 6, 7, 299, 200, 3};
  auto va = m->embed_texts(one(a)), vb = m->embed_texts(one(b));
  ASSERT_TRUE(va.ok() && vb.ok());
  EXPECT_EQ((*va)[0], (*vb)[0]);
  // ...and equal the text cut after it; a token before it does.
  auto vc = m->embed_texts(one(std::vector<std::int32_t>{298, 5, 6, 7, 299}));
  EXPECT_EQ((*va)[0], (*vc)[0]);
  auto vd = m->embed_texts(one(std::vector<std::int32_t>{298, 5, 9, 7, 299}));
  EXPECT_NE((*va)[0], (*vd)[0]);
  // No EOS: the last position.
  const Ref ref = reference(dir);
  std::vector<std::int32_t> none{298, 5, 6, 7};
  EXPECT_LT(max_diff((*m->embed_texts(one(none)))[0], ref.text(none)), 1e-5);

  // Legacy eos_token_id 2: the argmax of the ids (here 250 at position 2, not the EOS at the end).
  auto s = test_shape();
  s.eos_id = 2;
  const std::string ldir = write_model("eot-legacy", s);
  auto lm = load(ldir);
  ASSERT_TRUE(lm);
  EXPECT_TRUE(lm->config().legacy_eos_argmax);
  const Ref lref = reference(ldir);
  std::vector<std::int32_t> l{298, 5, 299, 7, 2};
  EXPECT_LT(max_diff((*lm->embed_texts(one(l)))[0], lref.text(l)), 1e-5);
  std::vector<std::int32_t> l2{298, 5, 299, 100, 200};  // after the max: no effect
  EXPECT_EQ((*lm->embed_texts(one(l)))[0], (*lm->embed_texts(one(std::vector<std::int32_t>{298, 5, 299, 8, 9})))[0]);
  (void)l2;
}

TEST(Clip, BatchInvariantOnTheCpu) {
  for (int threads : {1, 2}) {
    ClipLoadOptions o;
    o.threads = threads;
    auto m = load(write_model("batch"), o);
    ASSERT_TRUE(m);
    const auto t = texts(16);
    const auto im = images(16);
    auto all_t = m->embed_texts(t);
    auto all_i = m->embed_images(im);
    ASSERT_TRUE(all_t.ok() && all_i.ok());
    for (std::size_t bs : {1U, 3U}) {
      for (std::size_t i = 0; i + bs <= 16; i += bs) {
        auto pt = m->embed_texts(std::span(t).subspan(i, bs));
        auto pi = m->embed_images(std::span(im).subspan(i, bs));
        ASSERT_TRUE(pt.ok() && pi.ok());
        for (std::size_t j = 0; j < bs; ++j) {
          EXPECT_EQ((*pt)[j], (*all_t)[i + j]) << "text " << i + j << " batch " << bs;
          EXPECT_EQ((*pi)[j], (*all_i)[i + j]) << "image " << i + j << " batch " << bs;
        }
      }
    }
  }
}

TEST(Clip, SimulatedAcceleratorMatchesTheCpu) {
  const std::string dir = write_model("sim");
  auto cpu = load(dir);
  auto sim = test::simulated_device(1ull << 30);
  ClipLoadOptions o;
  o.accelerator = sim;
  auto acc = load(dir, o);
  ASSERT_TRUE(cpu && acc);
  EXPECT_GT(acc->stats().accel_weight_bytes, 0U);
  EXPECT_EQ(sim->accounted_bytes(), acc->stats().accel_weight_bytes);
  EXPECT_EQ(acc->fingerprint(), cpu->fingerprint());
  const auto t = texts(6);
  const auto im = images(4);
  auto a = acc->embed_texts(t), b = cpu->embed_texts(t);
  auto ai = acc->embed_images(im), bi = cpu->embed_images(im);
  ASSERT_TRUE(a.ok() && b.ok() && ai.ok() && bi.ok()) << (a.ok() ? "" : a.error().message);
  for (std::size_t i = 0; i < t.size(); ++i) EXPECT_LT(max_diff((*a)[i], (*b)[i]), 1e-5);
  for (std::size_t i = 0; i < im.size(); ++i) EXPECT_LT(max_diff((*ai)[i], (*bi)[i]), 1e-5);
  // Refused workspace and a lost device are typed errors.
  sim->fail_at_site(device::Site::prefill);
  auto refused = acc->embed_texts(t);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, Errc::out_of_memory);
  sim->lose();
  auto lost = acc->embed_images(im);
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.error().code, Errc::device_lost);
}

#if defined(TANDEM_HAVE_CUDA)
// The same on the GPU (skips without one): fp32 on cuBLAS, only the summation order differs from the CPU.
TEST(Clip, CudaAcceleratorMatchesTheCpu) {
  TANDEM_REQUIRE_GPU(dev);
  const std::string dir = write_model("cuda");
  auto cpu = load(dir);
  ClipLoadOptions o;
  o.accelerator = dev;
  const std::uint64_t before = dev->accounted_bytes();
  auto acc = load(dir, o);
  ASSERT_TRUE(cpu && acc);
  EXPECT_EQ(dev->accounted_bytes() - before, acc->stats().accel_weight_bytes);
  const auto t = texts(6);
  const auto im = images(4);
  auto a = acc->embed_texts(t), b = cpu->embed_texts(t);
  auto ai = acc->embed_images(im), bi = cpu->embed_images(im);
  ASSERT_TRUE(a.ok() && b.ok() && ai.ok() && bi.ok()) << (a.ok() ? (ai.ok() ? "" : ai.error().message) : a.error().message);
  double worst = 0;
  for (std::size_t i = 0; i < t.size(); ++i) worst = std::max(worst, max_diff((*a)[i], (*b)[i]));
  for (std::size_t i = 0; i < im.size(); ++i) worst = std::max(worst, max_diff((*ai)[i], (*bi)[i]));
  EXPECT_LT(worst, 1e-4);
  std::printf("[ report ] CLIP on %s vs CPU: max |d| of unit vectors %.2e\n", dev->name().c_str(), worst);
  acc.reset();
  EXPECT_EQ(dev->accounted_bytes(), before);
}
#endif

TEST(Clip, RefusedWeightsFailTheLoad) {
  test::expect_weights_refused<ClipModel, ClipLoadOptions>(write_model("small-dev"));
}

TEST(Clip, F16AndQ8GgufAgainstF32) {
  const std::string dir = write_model("dtypes");
  auto f32 = load(dir);
  const auto t = texts(6);
  const auto im = images(4);
  auto rt = *f32->embed_texts(t);
  auto ri = *f32->embed_images(im);
  // GGUF F32: identical to the safetensors.
  const std::string g32 = dir + "/../clip-f32-" + std::to_string(::getpid()) + ".gguf";
  ASSERT_TRUE(modelgen::convert_clip_to_gguf(dir, g32, modelgen::Recipe::f32).ok());
  auto m32 = load(g32);
  ASSERT_TRUE(m32);
  EXPECT_EQ(*m32->embed_texts(t), rt);
  EXPECT_EQ(*m32->embed_images(im), ri);
  EXPECT_EQ(m32->config().eos_id, 299);
  EXPECT_NEAR(m32->config().logit_scale, f32->config().logit_scale, 1e-7);
  struct Case { modelgen::Recipe r; double min_cos; };
  for (const Case& c : {Case{modelgen::Recipe::f16, 0.999}, Case{modelgen::Recipe::q8_0, 0.99}}) {
    const std::string g = dir + "/../clip-" + std::string(modelgen::recipe_name(c.r)) + "-" + std::to_string(::getpid()) + ".gguf";
    auto st = modelgen::convert_clip_to_gguf(dir, g, c.r);
    ASSERT_TRUE(st.ok()) << st.error().message;
    auto m = load(g);
    ASSERT_TRUE(m);
    EXPECT_LT(m->stats().weight_bytes, f32->stats().weight_bytes);
    auto vt = *m->embed_texts(t);
    auto vi = *m->embed_images(im);
    for (std::size_t i = 0; i < t.size(); ++i) EXPECT_GE(cosine(vt[i], rt[i]), c.min_cos) << modelgen::recipe_name(c.r);
    for (std::size_t i = 0; i < im.size(); ++i) EXPECT_GE(cosine(vi[i], ri[i]), c.min_cos) << modelgen::recipe_name(c.r);
    fs::remove(g);
  }
  // f16 safetensors and a load-time conversion.
  auto m16 = load(write_model("f16", test_shape(), weights::DType::f16));
  auto v16 = *m16->embed_texts(t);
  for (std::size_t i = 0; i < t.size(); ++i) EXPECT_GE(cosine(v16[i], rt[i]), 0.999);
  ClipLoadOptions o;
  o.dtype = ComputeDType::bf16;
  auto mb = load(dir, o);
  EXPECT_GT(mb->stats().resident_copy_bytes, 0U);
  EXPECT_NE(mb->fingerprint(), f32->fingerprint());
  auto vb = *mb->embed_images(im);
  for (std::size_t i = 0; i < im.size(); ++i) EXPECT_GE(cosine(vb[i], ri[i]), 0.999);
  fs::remove(g32);
}

TEST(Clip, CancelledBetweenLayers) {
  auto m = load(write_model("cancel"));
  std::atomic<bool> cancel{true};
  auto r = m->embed_texts(texts(2), &cancel);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::cancelled);
}

TEST(Clip, BadInputsAreInvalidArguments) {
  auto m = load(write_model("inputs"));
  EXPECT_EQ(m->embed_texts(one(std::vector<std::int32_t>{})).error().code, Errc::invalid_argument);
  EXPECT_EQ(m->embed_texts(one(std::vector<std::int32_t>(17, 1))).error().code, Errc::invalid_argument);
  EXPECT_EQ(m->embed_texts(one(std::vector<std::int32_t>{298, 300})).error().code, Errc::invalid_argument);
  EXPECT_EQ(m->embed_images(std::vector<std::vector<float>>{std::vector<float>(10)}).error().code, Errc::invalid_argument);
  EXPECT_TRUE(m->embed_texts({}).ok());
}

TEST(Clip, MalformedConfigsAndTensorsAreTypedErrors) {
  // Bad config keys.
  const std::string base = R"({"projection_dim": 16, "text_config": {"hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 300, "max_position_embeddings": 16},
    "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
    "image_size": 32, "patch_size": 8}})";
  ASSERT_TRUE(parse_clip_config(base).ok());
  auto expect = [](const std::string& text, Errc code, const std::string& key) {
    test::expect_parse_error([](const std::string& t) { return parse_clip_config(t); }, text, code, key);
  };
  auto edit = [&](const std::string& from, const std::string& to) { return test::edited(base, from, to); };
  expect("{", Errc::parse_error, "config.json");
  expect(edit(R"("projection_dim": 16, )", ""), Errc::format_error, "projection_dim");
  expect(edit(R"("num_attention_heads": 2, "vocab_size")", R"("num_attention_heads": 3, "vocab_size")"),
         Errc::format_error, "text_config.num_attention_heads");
  expect(edit(R"("patch_size": 8)", R"("patch_size": 7)"), Errc::format_error, "vision_config.patch_size");
  expect(edit(R"("vocab_size": 300)", R"("vocab_size": "300")"), Errc::format_error, "text_config.vocab_size");
  expect(edit(R"("patch_size": 8})", R"("patch_size": 8, "hidden_act": "relu"})"), Errc::unsupported, "vision_config.hidden_act");
  expect(edit(R"("projection_dim": 16)", R"("model_type": "llama", "projection_dim": 16)"), Errc::unsupported, "model_type");

  // A missing tensor and a wrong shape, rewritten from a good model.
  const std::string dir = write_model("malformed");
  auto f = weights::SafetensorsFile::open(dir + "/model.safetensors");
  ASSERT_TRUE(f.ok());
  auto rewrite = [&](const std::string& name, const std::string& drop, std::vector<std::int64_t> shape) {
    const std::string d = tmp_dir(name);
    test::write_rewritten(*f, dir + "/config.json", d, drop, shape);
    return ClipModel::load(d, {});
  };
  auto missing = rewrite("missing", "vision_model.encoder.layers.1.mlp.fc2.bias", {});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, Errc::format_error);
  EXPECT_NE(missing.error().message.find("vision_model.encoder.layers.1.mlp.fc2.bias"), std::string::npos);
  auto shape = rewrite("shape", "text_model.encoder.layers.0.self_attn.k_proj.weight", {16, 32});
  ASSERT_FALSE(shape.ok());
  EXPECT_EQ(shape.error().code, Errc::format_error);
  EXPECT_NE(shape.error().message.find("text_model.encoder.layers.0.self_attn.k_proj.weight"), std::string::npos);
  auto none = ClipModel::load(tmp_dir("empty"), {});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, Errc::not_found);
}

}  // namespace
}  // namespace tandem::engine
