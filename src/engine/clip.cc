// Loading a CLIP model, its placement on an accelerator and its accessors (the encoders are clip_forward.cc).
#include "engine/clip.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <system_error>

#include "core/sha256.h"
#include "engine/clip_impl.h"
#include "engine/dequant.h"
#include "generation/fingerprint.h"
#include "kernels/quant.h"

namespace tandem::engine {

namespace {

using Clock = std::chrono::steady_clock;
using kernels::WType;

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Result<std::string> read_text(const std::string& path, bool optional) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    if (optional) return std::string();
    return fail(Errc::not_found, path + ": not found");
  }
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return fail(Errc::io_error, path + ": " + ec.message());
  if (size > (64u << 20)) return fail(Errc::format_error, path + ": larger than 64 MiB");
  std::ifstream f(path, std::ios::binary);
  std::string text(static_cast<std::size_t>(size), '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (!f) return fail(Errc::io_error, path + ": read error");
  return text;
}

// A GGUF path: the file itself, or a directory without config.json holding exactly one .gguf ("" otherwise).
std::string gguf_path_of(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return path;
  if (!fs::is_directory(path, ec) || fs::exists(fs::path(path) / "config.json", ec)) return {};
  std::string found;
  for (const auto& e : fs::directory_iterator(path, ec))
    if (e.path().extension() == ".gguf") {
      if (!found.empty()) return {};
      found = e.path().string();
    }
  return found;
}

std::uint64_t tensor_bytes(const at::Tensor& t) {
  return static_cast<std::uint64_t>(t.numel()) * static_cast<std::uint64_t>(t.element_size());
}

}  // namespace

Result<ClipConfig> parse_clip_config(const std::string& config_json_text) {
  return weights::parse_clip_config(config_json_text, "config.json");
}

std::vector<Weight*> ClipModel::Impl::all_matrices() {
  std::vector<Weight*> out{&patch, &text_proj, &visual_proj};
  for (ClipTower* t : {&text, &vision})
    for (ClipLayer& l : t->layers)
      for (Weight* w : l.matrices()) out.push_back(w);
  return out;
}

std::vector<at::Tensor*> ClipModel::Impl::all_vectors() {
  std::vector<at::Tensor*> out{&text_pos, &vision_pos, &class_embd, &final_w, &final_b, &pre_w, &pre_b, &post_w, &post_b};
  for (ClipTower* t : {&text, &vision})
    for (ClipLayer& l : t->layers)
      for (at::Tensor* v : l.vectors()) out.push_back(v);
  return out;
}

// Every matrix at its held size and every vector (f32) goes to the accelerator, accounted first as one
// allocation; the token embedding stays in the CPU mapping (rows are looked up there and copied per call).
Status ClipModel::Impl::place_on_accelerator() {
  accel_dev = accel->kind() == device::Kind::cuda ? at::Device(at::kCUDA, static_cast<at::DeviceIndex>(accel->torch_index()))
                                                 : at::Device(at::kCPU);
  std::uint64_t bytes = 0;
  for (Weight* w : all_matrices()) {
    bytes += w->bytes();
    dequant_ws = std::max(dequant_ws, dequantize_aten_workspace(w->type, w->rows, w->cols, 4));
  }
  for (at::Tensor* v : all_vectors()) bytes += tensor_bytes(*v);
  auto a = accel->allocate(bytes, device::Site::weights);
  if (!a) {
    Error e = std::move(a).error();
    e.message = "CLIP weights on " + accel->name() + ": " + e.message;
    return fail(std::move(e));
  }
  accel_allocs.push_back(std::move(a).value());
  for (Weight* w : all_matrices()) w->dev = accel_dev.is_cuda() ? w->cpu_tensor().to(accel_dev) : w->cpu_tensor().clone();
  for (at::Tensor* v : all_vectors()) *v = accel_dev.is_cuda() ? v->to(accel_dev) : v->clone();
  stats.accel_weight_bytes = bytes;
  return {};
}

ClipModel::ClipModel() = default;
ClipModel::~ClipModel() = default;

Result<std::shared_ptr<ClipModel>> ClipModel::load(const std::string& path, const ClipLoadOptions& opts) {
  const auto t0 = Clock::now();
  if (opts.threads < 1 || opts.threads > 256)
    return fail(Errc::invalid_argument, "threads must be in [1, 256], got " + std::to_string(opts.threads));
  if (opts.accelerator && opts.accelerator->lost())
    return fail(Errc::device_lost, opts.accelerator->name() + ": device lost; cannot load onto it");

  auto m = std::shared_ptr<ClipModel>(new ClipModel());
  m->impl_ = std::make_unique<Impl>();
  Impl& im = *m->impl_;
  im.opts = opts;
  std::string origin;         // names the weight file(s) in messages
  std::string header_id;      // config text / GGUF header, for the fingerprint
  std::function<const weights::TensorView*(const std::string&)> find;
  const std::string gpath = gguf_path_of(path);
  if (!gpath.empty()) {
    auto f = weights::GgufFile::open(gpath);
    if (!f) return fail(std::move(f).error());
    im.gguf.emplace(std::move(f).value());
    auto c = weights::clip_config_from_gguf(*im.gguf);
    if (!c) return fail(std::move(c).error());
    im.cfg = std::move(c).value();
    auto views = weights::clip_tensor_views_from_gguf(*im.gguf, im.cfg);
    if (!views) return fail(std::move(views).error());
    im.gguf_views = std::move(views).value();
    im.files.push_back(im.gguf->mapped_file());
    origin = gpath;
    const auto hb = im.gguf->header_bytes();
    header_id = Sha256::hex(Sha256().update(hb).finish()) + ":" + std::to_string(im.gguf->file_size());
    find = [&im](const std::string& name) -> const weights::TensorView* {
      auto it = std::lower_bound(im.gguf_views.begin(), im.gguf_views.end(), name,
                                 [](const weights::TensorView& t, const std::string& n) { return t.name < n; });
      return it != im.gguf_views.end() && it->name == name ? &*it : nullptr;
    };
  } else {
    std::string dir = path;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    auto text = read_text(dir + "/config.json", false);
    if (!text) return fail(std::move(text).error());
    auto c = weights::parse_clip_config(*text, dir + "/config.json");
    if (!c) return fail(std::move(c).error());
    im.cfg = std::move(c).value();
    auto pre = read_text(dir + "/preprocessor_config.json", true);
    if (!pre) return fail(std::move(pre).error());
    if (!pre->empty()) TANDEM_TRY(weights::parse_clip_preprocessor(*pre, dir + "/preprocessor_config.json", im.cfg));
    auto st = weights::open_safetensors_weights(dir);
    if (!st) return fail(std::move(st).error());
    im.st.emplace(std::move(st).value());
    for (const auto& s : im.st->shards) {
      im.files.push_back(&s.file());
      origin += (origin.empty() ? "" : ", ") + s.path();
      const auto hb = s.header_bytes();
      header_id += Sha256::hex(Sha256().update(hb).finish()) + ":" + std::to_string(s.file().size()) + ";";
    }
    header_id += Sha256::hex(Sha256::of(*text));
    find = [&im](const std::string& name) { return im.st->find(name); };
  }
  const ClipConfig& cfg = im.cfg;

  // Every tensor the config implies, with its shape and a type Tandem computes with (a GGUF file has no
  // logit_scale tensor: clip.logit_scale or the default).
  std::map<std::string, const weights::TensorView*> tv;
  for (const auto& [name, shape] : weights::clip_required_tensors(cfg)) {
    const weights::TensorView* t = find(name);
    if (t == nullptr) {
      if (name == "logit_scale" && im.gguf) continue;
      return fail(Errc::format_error, origin + ": required tensor '" + name + "' " + shape_str(shape) + " is missing");
    }
    if (t->shape != shape && !(name == "logit_scale" && t->shape == std::vector<std::int64_t>{1}))
      return fail(Errc::format_error, origin + ": tensor '" + name + "' has shape " + shape_str(t->shape) + ", expected " +
                                          shape_str(shape) + " from the configuration");
    if (!t->type_supported)
      return fail(Errc::unsupported, origin + ": tensor '" + name + "' has dtype " + std::string(weights::dtype_name(t->dtype)) +
                                         ", which Tandem does not compute with");
    tv[name] = t;
  }
  if (const auto it = tv.find("logit_scale"); it != tv.end())
    kernels::dequantize_row(it->second->type, it->second->data.data(), &im.cfg.logit_scale, 1);
  for (const auto& [name, t] : tv) im.stats.weight_bytes += t->data.size();

  try {
    c10::InferenceMode guard;
    Model::init_compute_thread();
    im.pool = std::make_unique<WorkerPool>(opts.threads, [] { Model::init_compute_thread(); });
    std::uint64_t copied = 0;
    auto w = [&](const std::string& name) { return make_weight(*tv.at(name), opts.dtype, copied); };
    auto vec = [&](const std::string& name) { return vector_f32(*tv.at(name)); };
    auto rows_f32 = [&](const std::string& name) {
      const Weight e = make_weight(*tv.at(name), ComputeDType::auto_, copied);
      std::vector<std::int64_t> ids(static_cast<std::size_t>(e.rows));
      std::iota(ids.begin(), ids.end(), 0);
      return embedding_rows(e, ids);
    };
    im.token_embd = w("text_model.embeddings.token_embedding.weight");
    im.text_pos = rows_f32("text_model.embeddings.position_embedding.weight");
    im.vision_pos = rows_f32("vision_model.embeddings.position_embedding.weight");
    im.class_embd = vec("vision_model.embeddings.class_embedding");
    {
      weights::TensorView p = *tv.at("vision_model.embeddings.patch_embedding.weight");
      p.shape = {cfg.vision.hidden, static_cast<std::int64_t>(cfg.channels) * cfg.patch_size * cfg.patch_size};
      im.patch = make_weight(p, opts.dtype, copied);
    }
    im.final_w = vec("text_model.final_layer_norm.weight");
    im.final_b = vec("text_model.final_layer_norm.bias");
    im.pre_w = vec("vision_model.pre_layrnorm.weight");
    im.pre_b = vec("vision_model.pre_layrnorm.bias");
    im.post_w = vec("vision_model.post_layernorm.weight");
    im.post_b = vec("vision_model.post_layernorm.bias");
    im.text_proj = w("text_projection.weight");
    im.visual_proj = w("visual_projection.weight");
    for (auto [t, s, prefix] : {std::tuple{&im.text, &cfg.text, "text_model."}, std::tuple{&im.vision, &cfg.vision, "vision_model."}}) {
      t->shape = *s;
      for (int i = 0; i < s->layers; ++i) {
        const std::string p = std::string(prefix) + "encoder.layers." + std::to_string(i) + ".";
        ClipLayer l;
        l.ln1_w = vec(p + "layer_norm1.weight");
        l.ln1_b = vec(p + "layer_norm1.bias");
        l.ln2_w = vec(p + "layer_norm2.weight");
        l.ln2_b = vec(p + "layer_norm2.bias");
        l.wq = w(p + "self_attn.q_proj.weight");
        l.bq = vec(p + "self_attn.q_proj.bias");
        l.wk = w(p + "self_attn.k_proj.weight");
        l.bk = vec(p + "self_attn.k_proj.bias");
        l.wv = w(p + "self_attn.v_proj.weight");
        l.bv = vec(p + "self_attn.v_proj.bias");
        l.wo = w(p + "self_attn.out_proj.weight");
        l.bo = vec(p + "self_attn.out_proj.bias");
        l.w1 = w(p + "mlp.fc1.weight");
        l.b1 = vec(p + "mlp.fc1.bias");
        l.w2 = w(p + "mlp.fc2.weight");
        l.b2 = vec(p + "mlp.fc2.bias");
        t->layers.push_back(std::move(l));
      }
    }
    im.stats.resident_copy_bytes = copied;
    if (opts.accelerator) {
      im.accel = opts.accelerator;
      TANDEM_TRY(im.place_on_accelerator());
    }
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    const bool oom = what.find("alloc") != std::string::npos || what.find("memory") != std::string::npos;
    return fail(oom ? Errc::out_of_memory : Errc::internal, path + ": loading CLIP weights failed: " + what);
  } catch (const std::bad_alloc&) {
    return fail(Errc::out_of_memory, path + ": out of host memory while loading CLIP weights");
  } catch (const std::system_error& e) {
    return fail(Errc::internal, path + ": cannot start worker threads: " + e.what());
  }
  if (opts.prefault)
    for (const weights::MappedFile* f : im.files) f->prefault();

  // Fingerprint: what decides the vectors.
  std::ostringstream arch;
  arch.precision(17);
  for (const ClipTowerShape* s : {&cfg.text, &cfg.vision})
    arch << s->hidden << "," << s->intermediate << "," << s->layers << "," << s->heads << "," << s->positions << ","
         << s->eps << "," << s->act << ";";
  arch << "vocab=" << cfg.vocab << ";proj=" << cfg.projection_dim << ";image=" << cfg.image_size << ";patch="
       << cfg.patch_size << ";channels=" << cfg.channels << ";eos=" << cfg.eos_id << ";legacy=" << cfg.legacy_eos_argmax;
  std::map<WType, int> types;
  types[im.token_embd.type]++;
  for (Weight* x : im.all_matrices()) types[x->type]++;
  std::string held;
  for (WType t : kernels::kAllWTypes)
    if (types.count(t)) held += (held.empty() ? "" : ",") + std::string(kernels::wtype_name(t)) + ":" + std::to_string(types[t]);
  im.fingerprint = gen::Fingerprint::make({{"architecture", "clip;" + arch.str()},
                                           {"weights", header_id + ";" + weights::sampled_content_digest(im.files)},
                                           {"revision", opts.revision},
                                           {"weights_types", held}})
                       .digest;
  im.stats.total_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return m;
}

const ClipConfig& ClipModel::config() const { return impl_->cfg; }
const ClipLoadStats& ClipModel::stats() const { return impl_->stats; }
std::string ClipModel::fingerprint() const { return impl_->fingerprint; }
device::Device* ClipModel::accelerator() const { return impl_->accel.get(); }

// Per row: the residual, its norm, q, k, v, the attention output and the projection (7 · hidden), the MLP's two
// intermediate tensors (2 · intermediate); per item and head the scores and probabilities (2 · L²); f32. Plus the
// expansion of one matrix on an accelerator.
std::uint64_t ClipModel::activation_bytes(int texts, int images) const {
  const Impl& im = *impl_;
  auto tower = [](const ClipTowerShape& s, std::uint64_t items, std::uint64_t len) {
    const std::uint64_t rows = items * len;
    return rows * (7 * static_cast<std::uint64_t>(s.hidden) + 2 * static_cast<std::uint64_t>(s.intermediate)) * 4 +
           items * static_cast<std::uint64_t>(s.heads) * len * len * 8;
  };
  std::uint64_t b = 0;
  if (texts > 0) b += tower(im.cfg.text, static_cast<std::uint64_t>(texts), static_cast<std::uint64_t>(im.cfg.text.positions));
  if (images > 0) {
    const auto n = static_cast<std::uint64_t>(images);
    b += tower(im.cfg.vision, n, static_cast<std::uint64_t>(im.cfg.vision.positions)) +
         n * static_cast<std::uint64_t>(im.cfg.channels) * im.cfg.image_size * im.cfg.image_size * 4 * 2;
  }
  if (b > 0 && im.accel) b += im.dequant_ws;
  return b;
}

}  // namespace tandem::engine
