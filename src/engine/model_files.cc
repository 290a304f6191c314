// The weight files of an encoder-style model (model_files.h).
#include "engine/model_files.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <system_error>

#include "core/sha256.h"
#include "generation/fingerprint.h"
#include "kernels/quant.h"

namespace tandem::engine {

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

std::string hf_dir_of(const std::string& path) {
  std::string dir = path;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

Status ModelFiles::open(const std::string& path, const std::function<Status()>& on_gguf,
                        const std::function<Status(const std::string& dir, const std::string& config_text)>& on_hf) {
  if (const std::string gpath = gguf_path_of(path); !gpath.empty()) {
    TANDEM_TRY(open_gguf(gpath));
    return on_gguf();
  }
  const std::string dir = hf_dir_of(path);
  auto text = read_text(dir + "/config.json", false);
  if (!text) return fail(std::move(text).error());
  TANDEM_TRY(on_hf(dir, *text));
  return open_safetensors(dir, *text);
}

Status ModelFiles::open_gguf(const std::string& gguf_path) {
  auto f = weights::GgufFile::open(gguf_path);
  if (!f) return fail(std::move(f).error());
  gguf.emplace(std::move(f).value());
  files.push_back(gguf->mapped_file());
  origin = gguf_path;
  const auto hb = gguf->header_bytes();
  header_id = Sha256::hex(Sha256().update(hb).finish()) + ":" + std::to_string(gguf->file_size());
  return {};
}

Status ModelFiles::open_safetensors(const std::string& dir, const std::string& config_text) {
  auto w = weights::open_safetensors_weights(dir);
  if (!w) return fail(std::move(w).error());
  st.emplace(std::move(w).value());
  for (const auto& s : st->shards) {
    files.push_back(&s.file());
    origin += (origin.empty() ? "" : ", ") + s.path();
    const auto hb = s.header_bytes();
    header_id += Sha256::hex(Sha256().update(hb).finish()) + ":" + std::to_string(s.file().size()) + ";";
  }
  header_id += Sha256::hex(Sha256::of(config_text));
  return {};
}

const weights::TensorView* ModelFiles::find(const std::string& name) const {
  if (!gguf) return st->find(name);
  auto it = std::lower_bound(gguf_views.begin(), gguf_views.end(), name,
                             [](const weights::TensorView& t, const std::string& n) { return t.name < n; });
  return it != gguf_views.end() && it->name == name ? &*it : nullptr;
}

Result<TensorMap> ModelFiles::resolve(
    const TensorShapes& required, const std::function<bool(const std::string&, const weights::TensorView*)>& tolerated) const {
  TensorMap tv;
  for (const auto& [name, shape] : required) {
    const weights::TensorView* t = find(name);
    if (t == nullptr) {
      if (tolerated && tolerated(name, nullptr)) continue;
      return fail(Errc::format_error, origin + ": required tensor '" + name + "' " + shape_str(shape) + " is missing");
    }
    if (t->shape != shape && !(tolerated && tolerated(name, t)))
      return fail(Errc::format_error, origin + ": tensor '" + name + "' has shape " + shape_str(t->shape) + ", expected " +
                                          shape_str(shape) + " from the configuration");
    if (!t->type_supported)
      return fail(Errc::unsupported, origin + ": tensor '" + name + "' has dtype " + std::string(weights::dtype_name(t->dtype)) +
                                         ", which Tandem does not compute with");
    tv[name] = t;
  }
  return tv;
}

void ModelFiles::prefault() const {
  for (const weights::MappedFile* f : files) f->prefault();
}

std::string ModelFiles::fingerprint_digest(const std::string& architecture, const std::string& revision,
                                           const std::vector<Weight*>& matrices) const {
  std::map<kernels::WType, int> types;
  for (const Weight* x : matrices) types[x->type]++;
  std::string held;
  for (kernels::WType t : kernels::kAllWTypes)
    if (types.count(t)) held += (held.empty() ? "" : ",") + std::string(kernels::wtype_name(t)) + ":" + std::to_string(types[t]);
  return gen::Fingerprint::make({{"architecture", architecture},
                                 {"weights", header_id + ";" + weights::sampled_content_digest(files)},
                                 {"revision", revision},
                                 {"weights_types", held}})
      .digest;
}

at::Tensor WeightBuilder::rows_f32(const std::string& name) {
  const Weight e = make_weight(*tv.at(name), ComputeDType::auto_, copied);
  std::vector<std::int64_t> ids(static_cast<std::size_t>(e.rows));
  std::iota(ids.begin(), ids.end(), 0);
  return embedding_rows(e, ids);
}

}  // namespace tandem::engine
