// EngineBackend, embedding models (kind embedding; docs/embeddings.md): a CLIP-layout model (config.json model_type
// "clip" / architectures CLIPModel, or a GGUF with general.architecture "clip": texts and images) or a BERT-family
// text encoder (model_type "bert" / "nomic_bert", architectures BertModel / NomicBertModel, GGUF "bert" /
// "nomic-bert": texts) per [[model]] whose files say so, a CPU replica (the mmap'd weights) and — when there is an
// accelerator and the model wants it — a GPU replica (EmbedModel either way). A job runs on one replica: the texts
// were tokenized on the loop thread (Service::embed), the images are decoded and preprocessed here, on the worker.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "daemon/engine_backend.h"
#include "daemon/embed_model.h"
#include "daemon/engine_backend_replicas.h"
#include "daemon/log.h"
#include "engine/bert.h"
#include "engine/clip.h"
#include "image/image.h"
#include "tokenizer/model_tokenizer.h"
#include "weights/gguf.h"

namespace tandem::daemon {

using SteadyTime = std::chrono::steady_clock;

struct EngineBackend::EmbedEntry : ReplicaPair<EmbedModel> {
  EmbedFamily family = EmbedFamily::clip;
  EmbedModel::Options cpu_opts, gpu_opts;
  std::unique_ptr<tok::Tokenizer> tokenizer;  // CLIP's (a BERT-family model carries its WordPiece tokenizer)
  image::ClipPreprocess preprocess;           // CLIP's
  // One forward at a time per replica: a job is already a batch (its inputs run together), and the replica's
  // scratch is per model. Jobs on the two replicas run in parallel.
  std::mutex cpu_run_mu, gpu_run_mu;
};

namespace {

// The largest tower's shape, for the estimator: an embedding job's peak is one forward of its inputs through the
// wider tower (activations only; policy::ModelShape::encoder_only).
policy::ModelShape embed_shape(const std::string& name, const EmbedModel& m, std::uint32_t act_bytes,
                               std::uint64_t weight_bytes) {
  const EmbedModel::Shape& t = m.shape();
  policy::ModelShape s;
  s.name = name;
  s.encoder_only = true;
  s.layers = static_cast<std::uint32_t>(t.layers);
  s.hidden = static_cast<std::uint32_t>(t.hidden);
  s.intermediate = static_cast<std::uint32_t>(t.intermediate);
  s.heads = static_cast<std::uint32_t>(t.heads);
  s.kv_heads = s.heads;
  s.head_dim = static_cast<std::uint32_t>(t.hidden / std::max(1, t.heads));
  s.vocab = static_cast<std::uint32_t>(t.vocab);
  s.weight_bits = act_bytes * 8;
  s.kv_elem_bytes = act_bytes;
  s.act_elem_bytes = act_bytes;
  s.weights_bytes_override = weight_bytes;
  return s;
}

// An embedding replica's warm-up (WarmupReport::units, docs/policy.md §6 "Fixed-duration jobs"): one text (and one
// image, with a vision tower) unmeasured (page faults of the mapped weights, lazy initialisation, the accelerator's
// kernels), then a batch of 4 texts of 16 tokens (a search query's length) and one of 2 images, timed. nullopt
// (logged) when a forward fails: the jobs' ETAs then come from the first runs.
std::optional<WarmupReport> warm_up_embed(const std::string& name, EmbedModel& m, policy::Device route) {
  const EmbedModel::Shape& sh = m.shape();
  const char* where = route == policy::Device::cpu ? "CPU" : "GPU";
  const int len = std::min(16, sh.text_positions);
  if (len < 2 || sh.vocab < 4) return std::nullopt;
  std::int32_t first = -1, last = -1;
  if (const engine::ClipModel* c = m.clip()) {
    first = c->config().bos_id;
    last = c->config().eos_id;
  } else {
    first = m.bert()->tokenizer().cls_id();
    last = m.bert()->tokenizer().sep_id();
  }
  auto text = [&](int k) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(len));
    for (int i = 0; i < len; ++i) ids[static_cast<std::size_t>(i)] = 1 + (i * 7919 + k * 31) % (sh.vocab - 2);
    if (first >= 0 && first < sh.vocab) ids.front() = first;
    if (last >= 0 && last < sh.vocab) ids.back() = last;
    return ids;
  };
  const std::size_t px = static_cast<std::size_t>(sh.channels) * static_cast<std::size_t>(sh.image_size) *
                         static_cast<std::size_t>(sh.image_size);
  auto image = [&](int k) {
    std::vector<float> p(px);
    for (std::size_t i = 0; i < px; ++i) p[i] = static_cast<float>(static_cast<int>((i * 37 + k * 11) % 41) - 20) / 20.0F;
    return p;
  };
  auto fail_note = [&](const Error& e) {
    log::warn("embedding model {}: no {} warm-up ({}): its ETAs come from its first jobs", name, where, e.message);
    return std::nullopt;
  };
  {  // unmeasured
    const std::vector<std::vector<std::int32_t>> t1{text(0)};
    if (auto v = m.embed_texts(t1); !v) return fail_note(v.error());
    const std::vector<std::vector<float>> i1{image(0)};
    if (m.has_images())
      if (auto v = m.embed_images(i1); !v) return fail_note(v.error());
  }
  WarmupReport w;
  w.model = name;
  w.route = route;
  std::vector<std::vector<std::int32_t>> texts;
  for (int k = 1; k <= 4; ++k) texts.push_back(text(k));
  auto t0 = SteadyTime::now();
  if (auto v = m.embed_texts(texts); !v) return fail_note(v.error());
  w.units.push_back({policy::WorkUnit::text, 4, std::chrono::duration_cast<Clock::duration>(SteadyTime::now() - t0)});
  if (!m.has_images()) {
    log::info("embedding model {}: {} replica measured at load: {:.1f} ms per text", name, where,
              std::chrono::duration<double, std::milli>(w.units[0].took).count() / 4);
    return w;
  }
  const std::vector<std::vector<float>> images{image(1), image(2)};
  t0 = SteadyTime::now();
  if (auto v = m.embed_images(images); !v) return fail_note(v.error());
  w.units.push_back({policy::WorkUnit::image, 2, std::chrono::duration_cast<Clock::duration>(SteadyTime::now() - t0)});
  log::info("embedding model {}: {} replica measured at load: {:.1f} ms per text, {:.1f} ms per image", name, where,
            std::chrono::duration<double, std::milli>(w.units[0].took).count() / 4,
            std::chrono::duration<double, std::milli>(w.units[1].took).count() / 2);
  return w;
}

}  // namespace

namespace {

// The embedding family a model path holds (its config.json, or its GGUF's general.architecture); nullopt for
// anything else (an LLM, a speech model: their loaders report broken files).
std::optional<EmbedFamily> embedding_family(const std::string& path) {
  std::error_code ec;
  std::string file = path;
  if (std::filesystem::is_directory(path, ec)) {
    const std::string cfg = path + "/config.json";
    if (std::filesystem::exists(cfg, ec)) {
      const std::string text = read_small_file(cfg);
      auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) return std::nullopt;
      const std::string mt = j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
      if (mt == "clip") return EmbedFamily::clip;
      if (mt == "bert" || mt == "nomic_bert") return EmbedFamily::bert;
      if (j.contains("architectures") && j["architectures"].is_array())
        for (const auto& a : j["architectures"]) {
          if (!a.is_string()) continue;
          if (a.get<std::string>() == "CLIPModel") return EmbedFamily::clip;
          if (a.get<std::string>() == "BertModel" || a.get<std::string>() == "NomicBertModel") return EmbedFamily::bert;
        }
      return std::nullopt;
    }
    // A directory with one .gguf (weights::ModelDir's rule).
    std::string found;
    for (const auto& de : std::filesystem::directory_iterator(path, ec))
      if (de.path().extension() == ".gguf") {
        if (!found.empty()) return std::nullopt;
        found = de.path().string();
      }
    if (found.empty()) return std::nullopt;
    file = found;
  }
  if (std::filesystem::path(file).extension() != ".gguf") return std::nullopt;
  auto g = weights::GgufFile::open(file);
  if (!g) return std::nullopt;
  const auto* arch = g->find("general.architecture");
  if (!arch) return std::nullopt;
  if (arch->str == "clip") return EmbedFamily::clip;
  if (arch->str == "bert" || arch->str == "nomic-bert") return EmbedFamily::bert;
  return std::nullopt;
}

}  // namespace

Result<bool> EngineBackend::is_embedding_model(const std::string& path) { return embedding_family(path).has_value(); }

Result<ModelInfo> EngineBackend::prepare_embedding(const ModelConfig& mc, const std::function<void(const std::string&)>& progress,
                                            std::shared_ptr<EmbedEntry>& out, std::vector<WarmupReport>& warmups) {
  auto e = std::make_shared<EmbedEntry>();
  e->cfg = mc;
  e->family = embedding_family(mc.dir).value_or(EmbedFamily::clip);
  auto ro = replica_options<EmbedModel::Options>(mc, accel_);
  if (!ro) return fail(std::move(ro).error());
  const auto* dt = &ro->dtype;
  e->cpu_opts = ro->cpu;
  e->gpu_opts = ro->gpu;
  e->gpu_wanted = ro->gpu_wanted;

  if (progress) progress("loading embedding model " + mc.name + " (CPU replica)");
  const auto t0 = SteadyTime::now();
  auto m = EmbedModel::load(e->family, mc.dir, e->cpu_opts);
  if (!m) return fail(m.error().code, "model " + mc.name + ": " + m.error().message);
  e->cpu = std::move(m).value();
  const EmbedModel::Shape& sh = e->cpu->shape();
  std::error_code ec;
  if (const engine::ClipModel* clip = e->cpu->clip()) {
    // The tokenizer: the model directory's (tokenizer.json, else vocab.json + merges.txt); for a .gguf file, the
    // directory it is in.
    const std::string tok_dir =
        std::filesystem::is_directory(mc.dir, ec) ? mc.dir : std::filesystem::path(mc.dir).parent_path().string();
    auto tk = tok::load_tokenizer_files(tok_dir);
    if (!tk) return fail(tk.error().code, "model " + mc.name + ": its tokenizer: " + tk.error().message);
    e->tokenizer = std::make_unique<tok::Tokenizer>(std::move(tk).value());
    // Preprocessing: preprocessor_config.json when present, else the model's image size with CLIP's mean/std.
    const auto& c = clip->config();
    e->preprocess.size = static_cast<std::uint32_t>(c.image_size);
    e->preprocess.crop = static_cast<std::uint32_t>(c.image_size);
    for (int i = 0; i < 3 && i < static_cast<int>(c.image_mean.size()) && i < static_cast<int>(c.image_std.size()); ++i) {
      e->preprocess.mean[i] = c.image_mean[static_cast<std::size_t>(i)];
      e->preprocess.std[i] = c.image_std[static_cast<std::size_t>(i)];
    }
    const std::string pp = tok_dir + "/preprocessor_config.json";
    if (std::filesystem::exists(pp, ec)) {
      auto p = image::clip_preprocess_from_json(read_small_file(pp));
      if (!p) return fail(p.error().code, "model " + mc.name + ": " + pp + ": " + p.error().message);
      e->preprocess = *p;
    }
    if (e->preprocess.crop != static_cast<std::uint32_t>(c.image_size))
      return fail(Errc::format_error, "model " + mc.name + ": preprocessor crop " + std::to_string(e->preprocess.crop) +
                                          " differs from the vision tower's image_size " + std::to_string(c.image_size));
  }

  ModelInfo info;
  info.name = mc.name;
  info.kind = ModelKind::embedding;
  info.embedding.dim = static_cast<std::uint32_t>(sh.dim);
  info.embedding.text_positions = static_cast<std::uint32_t>(sh.text_positions);
  info.embedding.image_size = static_cast<std::uint32_t>(sh.image_size);
  info.embedding.image_tokens = static_cast<std::uint32_t>(sh.image_tokens);
  info.embedding.image = e->cpu->has_images();
  const std::uint32_t act = *dt == engine::ComputeDType::bf16 || *dt == engine::ComputeDType::f16 ? 2 : 4;
  info.shape = embed_shape(mc.name, *e->cpu, act, e->cpu->stats().weight_bytes);
  info.revision = mc.revision;
  info.dtype = std::string(engine::compute_dtype_name(*dt));
  info.max_context = static_cast<std::uint32_t>(sh.text_positions);
  info.weight_bytes = e->cpu->stats().weight_bytes;
  info.gpu_configured = e->gpu_wanted;
  info.gpu_layers = static_cast<std::uint32_t>(sh.layers);
  info.fingerprint = e->cpu->fingerprint();
  if (const engine::BertModel* b = e->cpu->bert())
    log::info("embedding model {}: CPU replica ready in {} ms ({} text encoder, dim {}, {} pooling, {} tokens, "
              "fingerprint {})", mc.name,
              std::chrono::duration_cast<std::chrono::milliseconds>(SteadyTime::now() - t0).count(),
              weights::bert_family_name(b->config().family), info.embedding.dim,
              weights::bert_pooling_name(b->config().pooling), sh.text_positions, info.fingerprint);
  else
    log::info("embedding model {}: CPU replica ready in {} ms (dim {}, image {} px, fingerprint {})", mc.name,
              std::chrono::duration_cast<std::chrono::milliseconds>(SteadyTime::now() - t0).count(),
              info.embedding.dim, info.embedding.image_size, info.fingerprint);
  if (auto w = warm_up_embed(mc.name, *e->cpu, policy::Device::cpu)) warmups.push_back(std::move(*w));
  if (e->gpu_wanted) {
    if (progress) progress("loading embedding model " + mc.name + " (GPU replica)");
    if (auto st = load_embed_gpu(*e); !st) {
      log::warn("embedding model {}: no GPU replica ({}); it serves on the CPU", mc.name, st.error().message);
    } else if (auto g = e->gpu_for_run(accel_.get())) {
      if (auto w = warm_up_embed(mc.name, *g, policy::Device::gpu)) warmups.push_back(std::move(*w));
    }
  }
  out = std::move(e);
  return info;
}

Status EngineBackend::load_embed_gpu(EmbedEntry& e) {
  return e.load_gpu(accel_.get(), "embedding", [&] { return EmbedModel::load(e.family, e.cfg.dir, e.gpu_opts); });
}

bool EngineBackend::embed_gpu_lost(const EmbedEntry& e) const { return e.gpu_lost(accel_.get()); }

std::shared_ptr<EngineBackend::EmbedEntry> EngineBackend::embed_entry(const std::string& name) const {
  std::shared_lock lock(set_mu_);
  for (const auto& e : embed_entries_)
    if (e->cfg.name == name) return e;
  return nullptr;
}

Result<EmbedTokens> EngineBackend::embed_tokens(const std::string& model, const std::string& text, bool truncate) {
  auto e = embed_entry(model);
  if (!e) return fail(entry(model) ? Errc::unsupported : Errc::not_found,
                      entry(model) ? "model " + model + " is not an embedding model" : "unknown model '" + model + "'");
  const auto positions = static_cast<std::size_t>(e->cpu->shape().text_positions);
  if (const engine::BertModel* b = e->cpu->bert()) {
    // [CLS] + WordPiece + [SEP]
    EmbedTokens out;
    const auto full = b->tokenizer().encode(text);
    if (full.size() <= positions) {
      out.ids.assign(full.begin(), full.end());
      return out;
    }
    if (!truncate)
      return fail(Errc::invalid_argument, "a text is " + std::to_string(full.size()) + " tokens; model " + model +
                                              " takes at most " + std::to_string(positions) + " (truncate=false)");
    const auto cut = b->tokenizer().encode(text, positions);
    out.ids.assign(cut.begin(), cut.end());
    out.truncated = true;
    return out;
  }
  tok::EncodeOptions o;
  o.add_bos = true;
  o.add_eos = true;
  auto full = e->tokenizer->encode(text, o);
  EmbedTokens out;
  if (full.size() <= positions) {
    out.ids = std::move(full);
    return out;
  }
  if (!truncate)
    return fail(Errc::invalid_argument, "a text is " + std::to_string(full.size()) + " tokens; model " + model +
                                            " takes at most " + std::to_string(positions) + " (truncate=false)");
  o.max_tokens = positions;
  out.ids = e->tokenizer->encode(text, o);
  out.truncated = true;
  return out;
}

Result<EmbedTokens> EngineBackend::embed_token_ids(const std::string& model, const std::vector<std::int64_t>& ids,
                                                   bool truncate) {
  auto e = embed_entry(model);
  if (!e) return fail(entry(model) ? Errc::unsupported : Errc::not_found,
                      entry(model) ? "model " + model + " is not an embedding model" : "unknown model '" + model + "'");
  TokenId bos = -1, eos = -1;
  std::int64_t vocab = e->cpu->shape().vocab;
  if (const engine::BertModel* b = e->cpu->bert()) {
    bos = b->tokenizer().cls_id();
    eos = b->tokenizer().sep_id();
    vocab = std::min<std::int64_t>(vocab, b->tokenizer().vocab_size());
  } else {
    bos = e->tokenizer->bos_id();
    eos = e->tokenizer->eos_id();
    vocab = std::min<std::int64_t>(vocab, e->tokenizer->vocab_size());
  }
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::int64_t id = ids[i];
    if (id < 0 || id >= vocab)
      return fail(Errc::invalid_argument, "token " + std::to_string(i) + " is " + std::to_string(id) + "; model " +
                                              model + " has ids 0.." + std::to_string(vocab - 1));
    if (id == bos || id == eos)
      return fail(Errc::invalid_argument, "token " + std::to_string(i) + " (" + std::to_string(id) + ") is model " +
                                              model + "'s " + (id == bos ? "BOS / [CLS]" : "EOS / [SEP]") +
                                              ": give the text's ids without special tokens (they are added)");
  }
  const auto positions = static_cast<std::size_t>(e->cpu->shape().text_positions);
  const std::size_t specials = (bos >= 0 ? 1u : 0u) + (eos >= 0 ? 1u : 0u);
  EmbedTokens out;
  std::size_t keep = ids.size();
  if (ids.size() + specials > positions) {
    if (!truncate)
      return fail(Errc::invalid_argument, "a token input is " + std::to_string(ids.size() + specials) +
                                              " tokens with BOS/EOS; model " + model + " takes at most " +
                                              std::to_string(positions) + " (truncate=false)");
    keep = positions > specials ? positions - specials : 0;
    out.truncated = true;
  }
  out.ids.reserve(keep + specials);
  if (bos >= 0) out.ids.push_back(bos);
  for (std::size_t i = 0; i < keep; ++i) out.ids.push_back(static_cast<TokenId>(ids[i]));
  if (eos >= 0) out.ids.push_back(eos);
  return out;
}

RunResult EngineBackend::embed(const EmbedSpec& spec, const std::atomic<bool>& cancel) {
  RunResult out;
  out.finish_reason = "error";
  auto e = embed_entry(spec.route.model);
  if (!e) {
    out.status = fail(Errc::not_found, "unknown embedding model '" + spec.route.model + "'");
    return out;
  }
  const bool on_gpu = spec.route.device != policy::Device::cpu;
  std::shared_ptr<EmbedModel> m;
  if (on_gpu) {
    m = e->gpu_for_run(accel_.get());
    if (!m) {
      out.status = fail(Errc::device_lost, "the GPU replica of " + spec.route.model + " is not available");
      out.accelerator_fault = true;
      return out;
    }
  } else {
    m = e->cpu;
  }
  // Decode and preprocess every image first: a bad one fails the job before any forward (typed, with its index).
  std::vector<std::vector<float>> pixels;
  pixels.reserve(spec.images.size());
  image::DecodeLimits lim;
  lim.max_bytes = max_image_bytes_;
  lim.max_pixels = max_image_pixels_;
  for (std::size_t i = 0; i < spec.images.size(); ++i) {
    if (cancel.load(std::memory_order_relaxed)) {
      out.status = {};
      out.finish_reason = "cancelled";
      return out;
    }
    auto img = image::decode(*spec.images[i], lim);
    if (!img) {
      const std::string which = i < spec.image_names.size() ? spec.image_names[i] : "image " + std::to_string(i);
      out.status = fail(Errc::invalid_argument, which + ": " + img.error().message);
      out.failed_input = static_cast<std::uint32_t>(spec.texts.size() + i);
      return out;
    }
    pixels.push_back(image::clip_preprocess(*img, e->preprocess));
  }
  auto fail_with = [&](Error err) {
    if (err.code == Errc::cancelled) {  // polled between layers: a cancelled job, not a failed one
      out.status = {};
      out.vectors.clear();
      out.finish_reason = "cancelled";
      return out;
    }
    out.accelerator_fault = on_gpu && (accel_fault(err.code) || embed_gpu_lost(*e));
    out.status = fail(std::move(err));
    return out;
  };
  const auto t0 = SteadyTime::now();
  std::lock_guard run_lock(on_gpu ? e->gpu_run_mu : e->cpu_run_mu);
  if (!spec.texts.empty()) {
    const auto t1 = SteadyTime::now();
    auto v = m->embed_texts(spec.texts, &cancel);
    if (!v) return fail_with(std::move(v).error());
    for (auto& x : *v) out.vectors.push_back(std::move(x));
    out.text_time = SteadyTime::now() - t1;
  }
  if (!pixels.empty() && !cancel.load(std::memory_order_relaxed)) {
    const auto t1 = SteadyTime::now();
    auto v = m->embed_images(pixels, &cancel);
    if (!v) return fail_with(std::move(v).error());
    for (auto& x : *v) out.vectors.push_back(std::move(x));
    out.image_time = SteadyTime::now() - t1;
  }
  out.decode_time = SteadyTime::now() - t0;
  if (cancel.load(std::memory_order_relaxed) && out.vectors.size() < spec.texts.size() + spec.images.size()) {
    out.vectors.clear();
    out.finish_reason = "cancelled";
    return out;
  }
  out.finish_reason = "embedded";
  return out;
}

std::vector<ReplicaInfo> EngineBackend::embed_replicas(const EmbedEntry& e) const {
  return e.infos(accel_.get(), [](const EmbedModel& m) { return m.shape().layers; });
}

std::uint64_t EngineBackend::embed_gpu_bytes(const EmbedEntry& e) const { return e.gpu_bytes(accel_.get()); }

bool EngineBackend::embed_gpu_ready(const EmbedEntry& e) const { return e.gpu_ready(accel_.get()); }

Status EngineBackend::reload_embed_gpu() {
  Status first;
  for (auto& e : snapshot(embed_entries_))
    if (auto st = e->reload(accel_.get(), "embedding", [&] { return EmbedModel::load(e->family, e->cfg.dir, e->gpu_opts); });
        !st && first)
      first = st;
  return first;
}

Result<std::uint64_t> EngineBackend::evict_embed_gpu(EmbedEntry& e) { return e.evict(accel_.get()); }

}  // namespace tandem::daemon
