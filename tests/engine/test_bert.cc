// BERT-family text encoders (engine/bert.h): the engine's vectors against a plain double-precision forward written
// here from transformers' BertModel and contrastors' NomicBertModel (post-LN layers, absolute or rotary positions,
// GELU or SwiGLU, mean or CLS pooling, L2 normalisation); the Hugging Face directory and its GGUF give the same
// vectors; a text's vector does not depend on its batch; the simulated accelerator agrees; bad input and files are
// typed errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "device/simulated.h"
#include "engine/bert.h"
#include "model_fixture.h"
#include "modelgen/bert_writer.h"
#include "weights/gguf.h"

namespace tandem {
namespace {

using weights::BertFamily;

std::string make_bert(const std::string& preset, std::uint64_t seed = 3) {
  const std::string dir = testing::temp_root() + "/bert-" + preset + "-" + std::to_string(seed);
  if (!std::filesystem::exists(dir + "/config.json")) {
    modelgen::BertWriteOptions o;
    o.config = *modelgen::bert_preset(preset);
    o.seed = seed;
    auto st = modelgen::write_bert_model(dir, o);
    EXPECT_TRUE(st.ok()) << st.error().message;
  }
  return dir;
}

std::shared_ptr<engine::BertModel> load_bert(const std::string& path, engine::BertLoadOptions o = {}) {
  auto m = engine::BertModel::load(path, o);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  return m.ok() ? *m : nullptr;
}

// --- the plain forward -------------------------------------------------------------------------------------------

class PlainBert {
 public:
  explicit PlainBert(const std::string& dir) {
    auto st = weights::open_safetensors_weights(dir);
    EXPECT_TRUE(st.ok());
    st_ = std::move(*st);
    std::ifstream f(dir + "/config.json");
    auto c = weights::parse_bert_config(std::string(std::istreambuf_iterator<char>(f), {}), "config.json");
    EXPECT_TRUE(c.ok());
    c_ = *c;
    std::ifstream p(dir + "/1_Pooling/config.json");
    EXPECT_TRUE(weights::parse_sentence_transformers_pooling(std::string(std::istreambuf_iterator<char>(p), {}), "p", c_).ok());
  }

  std::vector<double> embed(const std::vector<std::int32_t>& ids) const {
    const int n = static_cast<int>(ids.size()), H = c_.hidden, heads = c_.heads, hd = H / heads;
    const bool bert = c_.family == BertFamily::bert;
    std::vector<std::vector<double>> x(n);
    for (int i = 0; i < n; ++i) {
      x[i] = row("embeddings.word_embeddings.weight", ids[i]);
      add(x[i], row("embeddings.token_type_embeddings.weight", 0));
      if (bert) add(x[i], row("embeddings.position_embeddings.weight", i));
      x[i] = ln(x[i], bert ? "embeddings.LayerNorm" : "emb_ln");
    }
    for (int l = 0; l < c_.layers; ++l) {
      const std::string p = (bert ? "encoder.layer." : "encoder.layers.") + std::to_string(l) + ".";
      std::vector<std::vector<double>> q(n), k(n), v(n);
      for (int i = 0; i < n; ++i) {
        if (bert) {
          q[i] = lin(p + "attention.self.query", x[i], true);
          k[i] = lin(p + "attention.self.key", x[i], true);
          v[i] = lin(p + "attention.self.value", x[i], true);
        } else {
          const auto qkv = lin(p + "attn.Wqkv", x[i], false);
          q[i].assign(qkv.begin(), qkv.begin() + H);
          k[i].assign(qkv.begin() + H, qkv.begin() + 2 * H);
          v[i].assign(qkv.begin() + 2 * H, qkv.end());
          // rotary, half-split pairs (i, i + hd/2), base rotary_emb_base, position = token index
          for (auto* t : {&q[i], &k[i]})
            for (int h = 0; h < heads; ++h)
              for (int j = 0; j < hd / 2; ++j) {
                const double f = 1.0 / std::pow(c_.rope_theta, 2.0 * j / hd), a = i * f;
                double& x1 = (*t)[h * hd + j];
                double& x2 = (*t)[h * hd + j + hd / 2];
                const double r1 = x1 * std::cos(a) - x2 * std::sin(a), r2 = x2 * std::cos(a) + x1 * std::sin(a);
                x1 = r1;
                x2 = r2;
              }
        }
      }
      std::vector<std::vector<double>> nx(n);
      for (int i = 0; i < n; ++i) {
        std::vector<double> att(H, 0.0);
        for (int h = 0; h < heads; ++h) {
          std::vector<double> s(n);
          double mx = -1e300, z = 0;
          for (int j = 0; j < n; ++j) {
            double d = 0;
            for (int e = 0; e < hd; ++e) d += q[i][h * hd + e] * k[j][h * hd + e];
            s[j] = d / std::sqrt(static_cast<double>(hd));
            mx = std::max(mx, s[j]);
          }
          for (double& e : s) z += (e = std::exp(e - mx));
          for (int j = 0; j < n; ++j)
            for (int e = 0; e < hd; ++e) att[h * hd + e] += s[j] / z * v[j][h * hd + e];
        }
        auto o = lin(bert ? p + "attention.output.dense" : p + "attn.out_proj", att, bert);
        add(o, x[i]);
        auto h1 = ln(o, bert ? p + "attention.output.LayerNorm" : p + "norm1");
        std::vector<double> mid;
        if (bert) {
          mid = lin(p + "intermediate.dense", h1, true);
          for (double& e : mid) e = 0.5 * e * (1.0 + std::erf(e / std::sqrt(2.0)));
        } else {
          const auto up = lin(p + "mlp.fc11", h1, false);
          mid = lin(p + "mlp.fc12", h1, false);
          for (std::size_t e = 0; e < mid.size(); ++e) mid[e] = mid[e] / (1.0 + std::exp(-mid[e])) * up[e];
        }
        auto d = lin(bert ? p + "output.dense" : p + "mlp.fc2", mid, bert);
        add(d, h1);
        nx[i] = ln(d, bert ? p + "output.LayerNorm" : p + "norm2");
      }
      x = std::move(nx);
    }
    std::vector<double> pooled(H, 0.0);
    if (c_.pooling == weights::BertPooling::cls) {
      pooled = x[0];
    } else {
      for (int i = 0; i < n; ++i) add(pooled, x[i]);
      for (double& e : pooled) e /= n;
    }
    double ss = 0;
    for (double e : pooled) ss += e * e;
    for (double& e : pooled) e /= std::sqrt(ss);
    return pooled;
  }

 private:
  const float* t(const std::string& name) const {
    const weights::TensorView* tv = st_.find(name);
    EXPECT_TRUE(tv != nullptr) << name;
    return reinterpret_cast<const float*>(tv->data.data());
  }
  std::vector<double> row(const std::string& name, int r) const {
    const weights::TensorView* tv = st_.find(name);
    const auto cols = tv->shape[1];
    const float* p = t(name) + r * cols;
    return std::vector<double>(p, p + cols);
  }
  static void add(std::vector<double>& a, const std::vector<double>& b) {
    for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  }
  std::vector<double> lin(const std::string& name, const std::vector<double>& x, bool bias) const {
    const weights::TensorView* tv = st_.find(name + ".weight");
    const auto rows = static_cast<std::size_t>(tv->shape[0]), cols = static_cast<std::size_t>(tv->shape[1]);
    const float* w = t(name + ".weight");
    std::vector<double> y(rows, 0.0);
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t k = 0; k < cols; ++k) y[r] += static_cast<double>(w[r * cols + k]) * x[k];
      if (bias) y[r] += t(name + ".bias")[r];
    }
    return y;
  }
  std::vector<double> ln(const std::vector<double>& x, const std::string& name) const {
    double mean = 0, var = 0;
    for (double e : x) mean += e;
    mean /= static_cast<double>(x.size());
    for (double e : x) var += (e - mean) * (e - mean);
    var /= static_cast<double>(x.size());
    const double r = 1.0 / std::sqrt(var + static_cast<double>(static_cast<float>(c_.eps)));
    const float* w = t(name + ".weight");
    const float* b = t(name + ".bias");
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = (x[i] - mean) * r * w[i] + b[i];
    return y;
  }

  weights::SafetensorsWeights st_;
  weights::BertConfig c_;
};

double cosine(const std::vector<float>& a, const std::vector<double>& b) {
  double d = 0, na = 0, nb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d += a[i] * b[i], na += double(a[i]) * a[i], nb += b[i] * b[i];
  return d / std::sqrt(na * nb);
}

const std::vector<std::string> kTexts = {"What is the capital of France?", "search_query: red flower",
                                         "The weather in the mountains: rain, snow and wind.", "a"};

TEST(Bert, VectorsEqualAPlainForwardForBothFamilies) {
  for (const char* preset : {"bert-test", "nomic-test"}) {
    SCOPED_TRACE(preset);
    const std::string dir = make_bert(preset);
    auto m = load_bert(dir);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->config().family, std::string(preset) == "bert-test" ? BertFamily::bert : BertFamily::nomic_bert);
    const PlainBert plain(dir);
    auto got = m->embed_texts(kTexts);
    ASSERT_TRUE(got.ok()) << got.error().message;
    ASSERT_EQ(got->size(), kTexts.size());
    double worst = 1;
    for (std::size_t i = 0; i < kTexts.size(); ++i) {
      const auto ids = m->encode(kTexts[i]);
      const auto want = plain.embed(ids);
      ASSERT_EQ((*got)[i].size(), want.size());
      double ss = 0, md = 0;
      for (std::size_t e = 0; e < want.size(); ++e) {
        ss += double((*got)[i][e]) * (*got)[i][e];
        md = std::max(md, std::abs((*got)[i][e] - want[e]));
      }
      EXPECT_NEAR(ss, 1.0, 1e-5);
      EXPECT_LT(md, 1e-5) << kTexts[i];
      worst = std::min(worst, cosine((*got)[i], want));
    }
    EXPECT_GE(worst, 0.99999);
    std::printf("[ report ] %s: worst cosine to the plain double forward %.9f\n", preset, worst);
  }
}

// llama.cpp on the very files tandem-mkmodel --preset bert-test / nomic-test --format gguf writes (seed 1, F32): the
// vectors llama-embedding (c392e509, built natively; --embd-normalize 2, -c 64) printed for two texts, to 7
// significant digits. Tandem's tokenizer and forward must land on them: cosine >= 0.999 (the issue's bar) and, in
// practice, within the printed precision.
TEST(Bert, VectorsEqualLlamaCppsEmbeddingOnTheSameGguf) {
  struct Ref {
    const char* preset;
    const char* text;
    std::vector<float> v;
  };
  const Ref refs[] = {
      {"bert-test", "What is the capital of France?",
       {
         0.0524683, -0.3809462, 0.0344945, 0.0128075, 0.0326542, 0.0608984, -0.1119455, 0.0827747, -0.0603063,
         -0.0988901, 0.2500833, -0.050424, 0.0872071, -0.1106109, -0.107796, -0.0731215, 0.0155638, -0.0720699,
         0.1173788, -0.0845948, -0.0954042, 0.2119644, -0.1492977, -0.0271915, 0.0137963, -0.0493154, 0.0951874,
         -0.1866816, -0.232388, 0.1992884, 0.1176216, -0.0178408, -0.0191248, -0.1120698, 0.2018174, 0.0967091,
         0.2855724, -0.1459386, 0.012933, -0.2187143, -0.0445294, -0.0134013, 0.0892233, 0.0187531, -0.1370752,
         0.0125034, -0.0001549, 0.1234355, 0.0106025, 0.1380211, -0.1276168, -0.094937, -0.2020727, 0.0922569,
         0.0635588, 0.109043, 0.1180476, 0.0677043, 0.0113479, 0.1314517, 0.2079742, -0.0256115, 0.0664274,
         -0.031105}},
      {"bert-test", "searching documents, quickly!",
       {
         0.0531878, -0.3808301, 0.0355321, 0.0105533, 0.0335975, 0.0586876, -0.1115294, 0.0849646, -0.0609102,
         -0.0977703, 0.250254, -0.0503158, 0.0884799, -0.1133771, -0.1091541, -0.0737639, 0.0164857, -0.0728687,
         0.1162731, -0.0838285, -0.0938374, 0.2113596, -0.1505151, -0.0251425, 0.0142429, -0.0492717, 0.0935629,
         -0.1877039, -0.2314655, 0.1998031, 0.1171344, -0.0172474, -0.0205534, -0.1101095, 0.2030808, 0.0977906,
         0.2863562, -0.1453616, 0.0144231, -0.2174457, -0.0467211, -0.0125781, 0.0908259, 0.0189589, -0.136815,
         0.010873, -0.0001975, 0.1219557, 0.0141191, 0.1391841, -0.1283108, -0.0950447, -0.2031914, 0.0920738,
         0.0631296, 0.1081454, 0.1175191, 0.0678506, 0.0105166, 0.1300031, 0.206457, -0.0222529, 0.0655356,
         -0.0324962}},
      {"nomic-test", "What is the capital of France?",
       {
         -0.0966091, -0.1070991, -0.0232861, -0.0568711, 0.0281673, 0.2582061, -0.1180792, 0.0364592, -0.0483856,
         -0.0733559, 0.1422251, 0.0242969, 0.1544401, 0.0091883, 0.1609404, -0.1491736, -0.026193, 0.0354116,
         -0.0404592, 0.0854475, -0.0312799, 0.2203362, -0.2465553, 0.114372, -0.1150962, -0.0913468, 0.1061303,
         -0.129142, -0.1915189, -0.0582381, 0.3313722, -0.1375123, -0.109829, -0.0853638, 0.0449671, -0.107003,
         0.2808953, -0.0597243, -0.0083831, -0.1277393, 0.0343118, 0.0549232, 0.1338601, -0.0383886, -0.1718896,
         -0.1294254, -0.0827583, 0.2199313, 0.0424791, 0.1005117, -0.1042248, 0.0098149, -0.0945895, 0.1437375,
         -0.1722747, -0.0494046, 0.1123913, 0.0071532, -0.0684085, 0.0626439, 0.237801, -0.107198, 0.0707202,
         -0.0612747}},
      {"nomic-test", "searching documents, quickly!",
       {
         -0.1102931, -0.1229324, -0.0626893, -0.0270475, 0.0430836, 0.219998, -0.0868472, 0.038774, -0.0927226,
         -0.1141118, 0.1769181, 0.0250347, 0.174769, 0.0333927, 0.1797967, -0.1550348, -0.0185332, 0.0145863,
         0.0254816, 0.0667855, -0.1260425, 0.1943019, -0.1742386, 0.0803608, -0.1789681, -0.131861, 0.1396848,
         -0.1683938, -0.1474827, -0.0467359, 0.3230537, -0.1003593, -0.0619067, -0.133298, 0.0904565, -0.0437206,
         0.2125082, -0.0067804, -0.0107784, -0.1103107, 0.0342226, -0.02081, 0.1785794, -0.0969402, -0.1402518,
         -0.1100633, -0.1252367, 0.1799179, 0.0588068, 0.0773263, -0.0967039, -0.0138579, -0.0179138, 0.0966217,
         -0.101091, -0.0719238, 0.0764173, 0.0257633, -0.0568581, 0.0333004, 0.3855455, -0.0912617, 0.0290397,
         -0.1039453}},
  };
  for (const Ref& r : refs) {
    SCOPED_TRACE(std::string(r.preset) + ": " + r.text);
    const std::string dir = make_bert(r.preset, 1), file = dir + "-llamacpp.gguf";
    ASSERT_TRUE(modelgen::convert_bert_to_gguf(dir, file, modelgen::Recipe::f32).ok());
    auto m = load_bert(file);
    ASSERT_TRUE(m);
    auto v = m->embed_texts(std::vector<std::string>{r.text});
    ASSERT_TRUE(v.ok()) << v.error().message;
    ASSERT_EQ((*v)[0].size(), r.v.size());
    const std::vector<double> ref(r.v.begin(), r.v.end());
    const double cos = cosine((*v)[0], ref);
    double md = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) md = std::max(md, std::abs((*v)[0][i] - ref[i]));
    EXPECT_GE(cos, 0.999);
    EXPECT_LT(md, 1e-4);
    std::printf("[ report ] %s \"%s\": cosine to llama.cpp %.9f, largest difference %.2e\n", r.preset, r.text, cos, md);
  }
}

TEST(Bert, GgufGivesTheDirectorysVectorsAndQ8IsClose) {
  for (const char* preset : {"bert-test", "nomic-test"}) {
    SCOPED_TRACE(preset);
    const std::string dir = make_bert(preset);
    const std::string f32 = dir + "-F32.gguf", q8 = dir + "-Q8_0.gguf";
    ASSERT_TRUE(modelgen::convert_bert_to_gguf(dir, f32, modelgen::Recipe::f32).ok());
    ASSERT_TRUE(modelgen::convert_bert_to_gguf(dir, q8, modelgen::Recipe::q8_0).ok());
    auto a = load_bert(dir), b = load_bert(f32), q = load_bert(q8);
    ASSERT_TRUE(a && b && q);
    EXPECT_EQ(b->config().pooling, a->config().pooling);
    EXPECT_EQ(b->config().positions, a->config().positions);
    for (const std::string& t : kTexts) EXPECT_EQ(b->encode(t), a->encode(t)) << t;
    auto va = a->embed_texts(kTexts), vb = b->embed_texts(kTexts), vq = q->embed_texts(kTexts);
    ASSERT_TRUE(va.ok() && vb.ok() && vq.ok());
    for (std::size_t i = 0; i < kTexts.size(); ++i) {
      EXPECT_EQ((*va)[i], (*vb)[i]) << kTexts[i];
      const std::vector<double> ad((*va)[i].begin(), (*va)[i].end());
      EXPECT_GE(cosine((*vq)[i], ad), 0.999) << kTexts[i];
    }
    EXPECT_NE(a->fingerprint(), q->fingerprint());
  }
}

TEST(Bert, AVectorDoesNotDependOnItsBatchAndTheAcceleratorAgrees) {
  for (const char* preset : {"bert-test", "nomic-test"}) {
    SCOPED_TRACE(preset);
    const std::string dir = make_bert(preset);
    engine::BertLoadOptions two;
    two.threads = 2;
    auto m = load_bert(dir, two);
    ASSERT_TRUE(m);
    auto all = m->embed_texts(kTexts);
    ASSERT_TRUE(all.ok());
    for (std::size_t i = 0; i < kTexts.size(); ++i) {
      auto one = m->embed_texts(std::span(&kTexts[i], 1));
      ASSERT_TRUE(one.ok());
      EXPECT_EQ((*one)[0], (*all)[i]) << kTexts[i];
    }
    device::SimulatedConfig sc;
    sc.capacity_bytes = 1ull << 30;
    engine::BertLoadOptions lo;
    lo.accelerator = std::make_shared<device::SimulatedDevice>(sc, std::make_shared<SteadyClock>());
    auto acc = load_bert(dir, lo);
    ASSERT_TRUE(acc);
    EXPECT_GT(acc->stats().accel_weight_bytes, 0u);
    auto va = acc->embed_texts(kTexts);
    ASSERT_TRUE(va.ok()) << va.error().message;
    for (std::size_t i = 0; i < kTexts.size(); ++i) {
      const std::vector<double> d((*all)[i].begin(), (*all)[i].end());
      EXPECT_GE(cosine((*va)[i], d), 0.99999) << kTexts[i];
    }
    EXPECT_EQ(acc->fingerprint(), m->fingerprint());
  }
}

TEST(Bert, PoolingFollowsTheSentenceTransformersConfigAndPrefixedTensorsLoad) {
  const std::string src = make_bert("bert-test");
  auto cls = load_bert(src);
  ASSERT_TRUE(cls);
  EXPECT_EQ(cls->config().pooling, weights::BertPooling::cls);
  // The same weights with mean pooling, the pooling module under another directory named by modules.json, and the
  // tensors under BertForMaskedLM's "bert." prefix.
  const std::string dir = testing::temp_root() + "/bert-mean-prefixed";
  std::filesystem::create_directories(dir + "/pool");
  for (const char* f : {"config.json", "vocab.txt", "tokenizer_config.json"})
    std::filesystem::copy_file(src + "/" + f, dir + "/" + f, std::filesystem::copy_options::overwrite_existing);
  std::ofstream(dir + "/modules.json") << R"([{"idx": 1, "path": "pool", "type": "sentence_transformers.models.Pooling"}])";
  std::ofstream(dir + "/pool/config.json") << R"({"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": false})";
  {
    auto st = weights::open_safetensors_weights(src);
    ASSERT_TRUE(st.ok());
    std::vector<weights::TensorToWrite> out;
    for (const auto& t : st->tensors) out.push_back({"bert." + t.name, t.dtype, t.shape, t.data});
    ASSERT_TRUE(weights::write_safetensors(dir + "/model.safetensors", out).ok());
  }
  auto mean = load_bert(dir);
  ASSERT_TRUE(mean);
  EXPECT_EQ(mean->config().pooling, weights::BertPooling::mean);
  auto vc = cls->embed_texts(kTexts), vm = mean->embed_texts(kTexts);
  ASSERT_TRUE(vc.ok() && vm.ok());
  EXPECT_NE((*vc)[0], (*vm)[0]);
  EXPECT_NE(cls->fingerprint(), mean->fingerprint());
  // mean pooling by hand from the CLS model's machinery is not available; the plain forward checks it instead
  // (nomic-test pools by mean in VectorsEqualAPlainForwardForBothFamilies).
}

TEST(Bert, BadInputAndFilesAreTypedErrors) {
  const std::string dir = make_bert("bert-test");
  auto m = load_bert(dir);
  ASSERT_TRUE(m);
  const std::vector<std::vector<std::int32_t>> out_of_vocab{{2, 99999, 3}};
  auto r = m->embed_ids(out_of_vocab);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::invalid_argument);
  EXPECT_NE(r.error().message.find("outside the vocabulary"), std::string::npos);
  const std::vector<std::vector<std::int32_t>> too_long{std::vector<std::int32_t>(65, 5)};
  EXPECT_EQ(m->embed_ids(too_long).error().code, Errc::invalid_argument);
  // A long text is cut to the positions ([CLS] and [SEP] kept).
  std::string longtext;
  for (int i = 0; i < 200; ++i) longtext += "word ";
  const auto ids = m->encode(longtext);
  EXPECT_EQ(ids.size(), 64u);
  EXPECT_EQ(ids.back(), m->tokenizer().sep_id());
  EXPECT_TRUE(m->embed_texts(std::vector<std::string>{longtext}).ok());

  using json = nlohmann::json;
  std::ifstream f(dir + "/config.json");
  const json base = json::parse(f);
  auto parse = [](const json& j) { return weights::parse_bert_config(j.dump(), "config.json"); };
  json j = base;
  j["model_type"] = "roberta";
  EXPECT_EQ(parse(j).error().code, Errc::unsupported);
  j = base;
  j["hidden_act"] = "relu";
  EXPECT_NE(parse(j).error().message.find("hidden_act"), std::string::npos);
  j = base;
  j["position_embedding_type"] = "relative_key";
  EXPECT_EQ(parse(j).error().code, Errc::unsupported);
  j = base;
  j["num_attention_heads"] = 5;
  EXPECT_EQ(parse(j).error().code, Errc::format_error);
  weights::BertConfig c;
  EXPECT_EQ(weights::parse_sentence_transformers_pooling(R"({"pooling_mode_max_tokens": true})", "p", c).error().code,
            Errc::unsupported);
  EXPECT_EQ(weights::parse_sentence_transformers_pooling(R"({})", "p", c).error().code, Errc::format_error);
  EXPECT_EQ(weights::sentence_transformers_pooling_dir(
                R"([{"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"},
                    {"type": "sentence_transformers.models.Dense", "path": "2_Dense"}])", "modules.json")
                .error()
                .code,
            Errc::unsupported);
  EXPECT_EQ(weights::sentence_transformers_pooling_dir(
                R"([{"type": "sentence_transformers.models.Pooling", "path": "../etc"}])", "modules.json")
                .error()
                .code,
            Errc::format_error);

  // A missing tensor names it; a GGUF pooling type 0 (no pooling) is refused.
  const std::string broken = testing::temp_root() + "/bert-missing";
  std::filesystem::create_directories(broken);
  for (const char* f2 : {"config.json", "vocab.txt"})
    std::filesystem::copy_file(dir + "/" + f2, broken + "/" + f2, std::filesystem::copy_options::overwrite_existing);
  {
    auto st = weights::open_safetensors_weights(dir);
    std::vector<weights::TensorToWrite> out;
    for (const auto& t : st->tensors)
      if (t.name != "encoder.layer.1.output.dense.bias") out.push_back({t.name, t.dtype, t.shape, t.data});
    ASSERT_TRUE(weights::write_safetensors(broken + "/model.safetensors", out).ok());
  }
  auto bm = engine::BertModel::load(broken, {});
  ASSERT_FALSE(bm.ok());
  EXPECT_NE(bm.error().message.find("encoder.layer.1.output.dense.bias"), std::string::npos) << bm.error().message;
  const std::string g = dir + "-pool0.gguf";
  ASSERT_TRUE(modelgen::convert_bert_to_gguf(dir, g, modelgen::Recipe::f32).ok());
  {
    auto gf = weights::GgufFile::open(g);
    ASSERT_TRUE(gf.ok());
    weights::GgufWriter w;
    for (const auto& [k, v] : gf->metadata()) w.set(k, k == "bert.pooling_type" ? weights::GgufValue::of_uint(weights::GgufType::u32, 0) : v);
    for (const auto& t : gf->tensors()) {
      auto d = gf->tensor_data(t);
      ASSERT_TRUE(d.ok());
      ASSERT_TRUE(w.add_tensor(t.name, t.ggml_type, t.ne, *d).ok());
    }
    ASSERT_TRUE(w.write(g).ok());
  }
  auto pm = engine::BertModel::load(g, {});
  ASSERT_FALSE(pm.ok());
  EXPECT_EQ(pm.error().code, Errc::unsupported);
  EXPECT_NE(pm.error().message.find("pooling_type"), std::string::npos);
}

}  // namespace
}  // namespace tandem
