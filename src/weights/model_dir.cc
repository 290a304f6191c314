#include "weights/model_dir.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <utility>

#include "core/sha256.h"
#include "weights/json_fields.h"
#include "weights/json_util.h"
#include "weights/model_limits.h"

namespace tandem::weights {

namespace {

constexpr std::uint64_t kMaxJsonFileBytes = 64ull * 1024 * 1024;  // config / index / tokenizer_config / generation

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// Plain file name inside the model directory: no separators, no "..", no control characters.
bool plain_file_name(const std::string& s) {
  if (s.empty() || s == "." || s.size() > 255) return false;
  if (s.find('/') != std::string::npos || s.find("..") != std::string::npos) return false;
  return std::none_of(s.begin(), s.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x20; });
}

void put_u64(Sha256& h, std::uint64_t v) {
  std::byte b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<std::byte>(v >> (8 * i));
  h.update(std::span<const std::byte>(b, 8));
}

void put_str(Sha256& h, std::string_view s) {
  put_u64(h, s.size());
  h.update(s);
}

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

// --- ModelDir -----------------------------------------------------------------------------------------------------

std::vector<std::pair<std::string, std::vector<std::int64_t>>> ModelDir::required_tensors(const ModelConfig& c) {
  const std::int64_t hidden = c.hidden_size, inter = c.intermediate_size, vocab = c.vocab_size;
  const std::int64_t q = std::int64_t{c.num_heads} * c.head_dim, kv = std::int64_t{c.num_kv_heads} * c.head_dim;
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  out.reserve(3 + 12 * static_cast<std::size_t>(std::max(c.num_layers, 0)));
  out.push_back({"model.embed_tokens.weight", {vocab, hidden}});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out.push_back({p + "input_layernorm.weight", {hidden}});
    if (c.fused_projections) {
      out.push_back({p + "self_attn.qkv_proj.weight", {q + 2 * kv, hidden}});
    } else {
      out.push_back({p + "self_attn.q_proj.weight", {q, hidden}});
      out.push_back({p + "self_attn.k_proj.weight", {kv, hidden}});
      out.push_back({p + "self_attn.v_proj.weight", {kv, hidden}});
    }
    if (c.qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
      out.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
    }
    if (c.qkv_bias) {
      out.push_back({p + "self_attn.q_proj.bias", {q}});
      out.push_back({p + "self_attn.k_proj.bias", {kv}});
      out.push_back({p + "self_attn.v_proj.bias", {kv}});
    }
    out.push_back({p + "self_attn.o_proj.weight", {hidden, q}});
    out.push_back({p + "post_attention_layernorm.weight", {hidden}});
    if (c.post_norms) {  // Gemma: post_attention_layernorm normalises the attention output; the MLP has its own two
      out.push_back({p + "pre_feedforward_layernorm.weight", {hidden}});
      out.push_back({p + "post_feedforward_layernorm.weight", {hidden}});
    }
    if (c.fused_projections) {
      out.push_back({p + "mlp.gate_up_proj.weight", {2 * inter, hidden}});
    } else {
      out.push_back({p + "mlp.gate_proj.weight", {inter, hidden}});
      out.push_back({p + "mlp.up_proj.weight", {inter, hidden}});
    }
    out.push_back({p + "mlp.down_proj.weight", {hidden, inter}});
  }
  out.push_back({"model.norm.weight", {hidden}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {vocab, hidden}});
  return out;
}

Result<SafetensorsWeights> open_safetensors_weights(const std::string& dir) {
  SafetensorsWeights w;
  // Weights: a single model.safetensors (preferred when present, as in transformers) or an index with shards.
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  // For sharded models: tensor name -> shard file name from weight_map.
  std::map<std::string, std::string> weight_map;
  if (detail::is_regular_file(single)) {
    auto f = SafetensorsFile::open(single);
    if (!f) return fail(std::move(f).error());
    w.shards.push_back(std::move(*f));
  } else {
    auto text = detail::read_small_file(index_path, kMaxJsonFileBytes);
    if (!text) {
      if (text.error().code == Errc::not_found) {
        return fail(Errc::not_found, dir + ": neither model.safetensors nor model.safetensors.index.json found");
      }
      return fail(std::move(text).error());
    }
    Json j;
    ASSIGN_OR_RETURN(j, parse_object(*text, index_path));
    const auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object()) {
      return fail(Errc::format_error, index_path + ": weight_map must be an object of tensor name -> shard file");
    }
    if (wm->empty()) return fail(Errc::format_error, index_path + ": weight_map is empty");
    std::set<std::string> shard_names;  // sorted: the shard order used everywhere (ids, header_digest)
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it->is_string()) {
        return fail(Errc::format_error, index_path + ": weight_map entry for tensor " + detail::printable(it.key()) +
                                            " must be a string, got " + show(*it));
      }
      const std::string& shard = it->get_ref<const std::string&>();
      if (!plain_file_name(shard)) {
        return fail(Errc::format_error, index_path + ": tensor " + detail::printable(it.key()) + " names shard " +
                                            detail::printable(shard) +
                                            ", which is not a plain file name inside the model directory");
      }
      weight_map.emplace(it.key(), shard);
      shard_names.insert(shard);
    }
    for (const auto& name : shard_names) {
      const std::string p = dir + "/" + name;
      auto f = SafetensorsFile::open(p);
      if (!f) {
        if (f.error().code == Errc::not_found) {
          return fail(Errc::not_found, index_path + ": shard " + name + " listed in weight_map does not exist");
        }
        return fail(std::move(f).error());
      }
      w.shards.push_back(std::move(*f));
    }
  }

  // Tensor views over all shards; a name in two shards is ambiguous.
  std::map<std::string, int> where;
  for (int s = 0; s < static_cast<int>(w.shards.size()); ++s) {
    const auto& sf = w.shards[static_cast<std::size_t>(s)];
    for (const auto& t : sf.tensors()) {
      auto [it, inserted] = where.emplace(t.name, s);
      if (!inserted) {
        return fail(Errc::format_error, "tensor " + detail::printable(t.name) + " appears in two shards: " +
                                            w.shards[static_cast<std::size_t>(it->second)].path() + " and " +
                                            sf.path());
      }
      TensorView v{t.name, t.dtype, t.shape, sf.bytes(t), s};
      v.type_supported = t.dtype == DType::f32 || t.dtype == DType::f16 || t.dtype == DType::bf16;
      v.type = t.dtype == DType::f16    ? kernels::WType::f16
               : t.dtype == DType::bf16 ? kernels::WType::bf16
                                        : kernels::WType::f32;
      w.tensors.push_back(std::move(v));
    }
  }
  std::sort(w.tensors.begin(), w.tensors.end(),
            [](const TensorView& a, const TensorView& b) { return a.name < b.name; });

  // With an index, every listed tensor must be in the shard the index names.
  for (const auto& [name, shard] : weight_map) {
    auto it = where.find(name);
    const std::string& actual =
        it == where.end() ? std::string() : base_name(w.shards[static_cast<std::size_t>(it->second)].path());
    if (actual != shard) {
      return fail(Errc::format_error, index_path + ": weight_map puts tensor " + detail::printable(name) + " in " +
                                          shard + ", but " + dir + "/" + shard + " has no tensor " +
                                          detail::printable(name) +
                                          (actual.empty() ? "" : " (it is in " + actual + ")"));
    }
  }

  return w;
}

const TensorView* SafetensorsWeights::find(const std::string& name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const TensorView& t, const std::string& n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

Result<ModelDir> ModelDir::open(const std::string& dir_in) {
  ModelDir m;
  m.dir_ = dir_in;
  while (m.dir_.size() > 1 && m.dir_.back() == '/') m.dir_.pop_back();
  const std::string& dir = m.dir_;

  // A file is a GGUF model; so is a directory without config.json that holds exactly one *.gguf.
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return open_gguf(dir);
  if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && !detail::is_regular_file(dir + "/config.json")) {
    std::vector<std::string> ggufs;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0 && detail::is_regular_file(e.path())) {
        ggufs.push_back(name);
      }
    }
    std::sort(ggufs.begin(), ggufs.end());
    if (ggufs.size() == 1) return open_gguf(dir + "/" + ggufs[0]);
    if (ggufs.size() > 1) {
      std::string list;
      for (const auto& g : ggufs) list += (list.empty() ? "" : ", ") + g;
      return fail(Errc::format_error, dir + ": no config.json and " + std::to_string(ggufs.size()) +
                                          " .gguf files (" + list + "); name the one to use");
    }
  }

  // config.json (required), then the optional JSON side files.
  const std::string config_path = dir + "/config.json";
  ASSIGN_OR_RETURN(m.config_text_, detail::read_small_file(config_path, kMaxJsonFileBytes));
  ASSIGN_OR_RETURN(m.config_, ModelConfig::parse(m.config_text_, config_path));
  const ModelConfig& c = m.config_;
  {
    const std::string p = dir + "/generation_config.json";
    auto text = detail::read_small_file(p, kMaxJsonFileBytes);
    if (text) {
      ASSIGN_OR_RETURN(m.generation_, GenerationDefaults::parse(*text, p));
    } else if (text.error().code != Errc::not_found) {
      return fail(std::move(text).error());
    }
  }
  {
    const std::string p = dir + "/tokenizer_config.json";
    auto text = detail::read_small_file(p, kMaxJsonFileBytes);
    if (text) {
      ASSIGN_OR_RETURN(m.tokenizer_settings_, TokenizerSettings::parse(*text, p));
    } else if (text.error().code != Errc::not_found) {
      return fail(std::move(text).error());
    }
  }
  // The tokenizer: a SentencePiece tokenizer.model, or a Hugging Face tokenizer.json (BPE), at least one.
  if (!detail::is_regular_file(m.tokenizer_path()) && !detail::is_regular_file(m.tokenizer_json_path())) {
    return fail(Errc::not_found, dir + ": no tokenizer: neither tokenizer.model (SentencePiece) nor tokenizer.json "
                                       "(Hugging Face tokenizers) found");
  }

  {
    SafetensorsWeights w;
    ASSIGN_OR_RETURN(w, open_safetensors_weights(dir));
    m.shards_ = std::move(w.shards);
    m.tensors_ = std::move(w.tensors);
  }

  // Required tensors: present, implied shape, one float dtype.
  const TensorView* first = nullptr;
  for (const auto& [name, shape] : required_tensors(c)) {
    const TensorView* t = m.tensor(name);
    if (t == nullptr) {
      std::string files;
      for (const auto& s : m.shards_) files += (files.empty() ? "" : ", ") + s.path();
      return fail(Errc::format_error, files + ": required tensor '" + name + "' " + shape_str(shape) + " is missing");
    }
    const std::string& file = m.shards_[static_cast<std::size_t>(t->shard)].path();
    if (t->shape != shape) {
      return fail(Errc::format_error, file + ": tensor '" + name + "' has shape " + shape_str(t->shape) +
                                          ", expected " + shape_str(shape) + " from config.json");
    }
    if (t->dtype != DType::f32 && t->dtype != DType::f16 && t->dtype != DType::bf16) {
      return fail(Errc::unsupported, file + ": tensor '" + name + "' has dtype " + std::string(dtype_name(t->dtype)) +
                                         "; weights must be F32, F16 or BF16");
    }
    if (first == nullptr) {
      first = t;
    } else if (t->dtype != first->dtype) {
      return fail(Errc::format_error, file + ": tensor '" + name + "' has dtype " + std::string(dtype_name(t->dtype)) +
                                          " but '" + first->name + "' has " + std::string(dtype_name(first->dtype)) +
                                          "; all weights must share one dtype");
    }
  }
  m.dtype_ = first->dtype;  // required_tensors() is never empty
  if (c.fused_projections) TANDEM_TRY(m.add_fused_views(dir));
  return m;
}

Status ModelDir::add_fused_views(const std::string& origin) {
  const ModelConfig& c = config_;
  const std::int64_t q = std::int64_t{c.num_heads} * c.head_dim, kv = std::int64_t{c.num_kv_heads} * c.head_dim;
  const std::int64_t inter = c.intermediate_size;
  std::vector<TensorView> views;
  using Parts = std::initializer_list<std::pair<std::string, std::int64_t>>;  // (unfused name, rows)
  auto split = [&](const std::string& fused, Parts parts) -> Status {
    const TensorView* t = tensor(fused);  // present with the fused shape (checked as a required tensor)
    const std::size_t rb = kernels::row_bytes(t->type, t->shape[1]);
    std::int64_t row = 0;
    for (const auto& [name, rows] : parts) {
      if (tensor(name) != nullptr) {
        return fail(Errc::format_error, origin + ": tensor '" + name + "' is present next to the fused '" + fused +
                                            "' that holds its rows; the model must have one or the other");
      }
      TensorView v = *t;
      v.name = name;
      v.shape = {rows, t->shape[1]};
      v.data = t->data.subspan(static_cast<std::size_t>(row) * rb, static_cast<std::size_t>(rows) * rb);
      views.push_back(std::move(v));
      row += rows;
    }
    return {};
  };
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    TANDEM_TRY(split(p + "self_attn.qkv_proj.weight", {{p + "self_attn.q_proj.weight", q},
                                                      {p + "self_attn.k_proj.weight", kv},
                                                      {p + "self_attn.v_proj.weight", kv}}));
    TANDEM_TRY(split(p + "mlp.gate_up_proj.weight", {{p + "mlp.gate_proj.weight", inter},
                                                    {p + "mlp.up_proj.weight", inter}}));
  }
  for (auto& v : views) tensors_.push_back(std::move(v));
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorView& a, const TensorView& b) { return a.name < b.name; });
  return {};
}

double ModelConfig::longrope_attention_factor() const {
  if (rope_attention_factor) return *rope_attention_factor;
  const double s = static_cast<double>(max_position_embeddings) / rope_original_max_positions;
  if (s <= 1.0) return 1.0;
  return std::sqrt(1.0 + std::log(s) / std::log(static_cast<double>(rope_original_max_positions)));
}

const TensorView* ModelDir::tensor(const std::string& name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorView& t, const std::string& n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

std::uint64_t ModelDir::weight_bytes() const {
  std::uint64_t n = 0;
  for (const auto& [name, shape] : required_tensors(config_)) {
    if (const TensorView* t = tensor(name)) n += t->data.size();
  }
  return n;
}

std::uint64_t ModelDir::parameter_count() const {
  std::uint64_t n = 0;
  for (const auto& [name, shape] : required_tensors(config_)) {
    std::uint64_t p = 1;
    for (auto d : shape) p *= static_cast<std::uint64_t>(d);
    n += p;
  }
  return n;
}

std::string ModelDir::header_digest() const {
  Sha256 h;
  if (gguf_) {
    put_str(h, "tandem.weights.gguf.header.v1");
    put_u64(h, gguf_->file_size());
    const auto hb = gguf_->header_bytes();
    put_u64(h, hb.size());
    h.update(hb);
    return Sha256::hex(h.finish());
  }
  put_str(h, "tandem.weights.header.v1");
  put_str(h, config_text_);
  put_u64(h, shards_.size());
  for (const auto& s : shards_) {
    put_str(h, base_name(s.path()));
    put_u64(h, s.file().size());
    const auto hb = s.header_bytes();
    put_u64(h, hb.size());
    h.update(hb);
  }
  return Sha256::hex(h.finish());
}

std::string ModelDir::content_digest() const {
  Sha256 h;
  put_str(h, "tandem.weights.content.v1");
  for (const auto& [name, shape] : required_tensors(config_)) {
    const TensorView* t = tensor(name);
    put_str(h, name);
    const auto bytes = t != nullptr ? t->data : std::span<const std::byte>();
    put_u64(h, bytes.size());
    h.update(bytes);
  }
  return Sha256::hex(h.finish());
}

std::vector<const MappedFile*> ModelDir::mapped_files() const {
  std::vector<const MappedFile*> out;
  if (gguf_ && gguf_->mapped_file() != nullptr) out.push_back(gguf_->mapped_file());
  for (const auto& s : shards_) out.push_back(&s.file());
  return out;
}

Result<std::string> ModelDir::tokenizer_bytes() const {
  if (format_ == Format::gguf) {
    if (gguf_tokenizer_error_) return fail(*gguf_tokenizer_error_);
    return gguf_tokenizer_;
  }
  return detail::read_small_file(tokenizer_path(), kMaxJsonFileBytes);
}

std::string ModelDir::type_summary() const {
  std::map<kernels::WType, int> counts;
  for (const auto& [name, shape] : required_tensors(config_)) {
    if (const TensorView* t = tensor(name)) ++counts[t->type];
  }
  std::string out;
  for (const kernels::WType w : kernels::kAllWTypes) {
    const auto it = counts.find(w);
    if (it == counts.end()) continue;
    out += (out.empty() ? "" : ",") + std::string(kernels::wtype_name(w)) + ":" + std::to_string(it->second);
  }
  return out;
}

}  // namespace tandem::weights
