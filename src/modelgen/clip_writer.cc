#include "modelgen/clip_writer.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "generation/rng.h"
#include "kernels/quant.h"
#include "weights/gguf.h"
#include "modelgen/modelgen.h"
#include "tokenizer/clip_vocab.h"

namespace tandem::modelgen {

namespace fs = std::filesystem;

weights::ClipConfig ClipShape::config() const {
  weights::ClipConfig c;
  c.text = text;
  c.vision = vision;
  c.vocab = vocab;
  c.projection_dim = projection_dim;
  c.image_size = image_size;
  c.patch_size = patch_size;
  c.channels = channels;
  c.vision.positions = c.patches() + 1;
  c.eos_id = eos_id;
  c.bos_id = bos_id;
  c.legacy_eos_argmax = eos_id == 2;
  c.logit_scale = static_cast<float>(logit_scale_init);
  c.image_mean = image_mean;
  c.image_std = image_std;
  return c;
}

std::uint64_t ClipShape::parameters() const {
  std::uint64_t n = 0;
  for (const auto& [name, shape] : weights::clip_required_tensors(config())) {
    std::uint64_t k = 1;
    for (auto d : shape) k *= static_cast<std::uint64_t>(d);
    n += k;
  }
  return n;
}

Result<ClipShape> clip_preset(std::string_view name) {
  ClipShape s;
  if (name == "clip-b32") return s;
  if (name == "clip-test") {
    s.text = {32, 64, 2, 2, 16};
    s.vision = {32, 64, 2, 2, 0};
    s.vocab = 300;
    s.projection_dim = 16;
    s.image_size = 32;
    s.patch_size = 8;
    s.bos_id = 298;
    s.eos_id = 299;
    s.pad_id = 299;
    return s;
  }
  if (name == "clip-small") {
    s.text = {128, 512, 2, 4, 32};
    s.vision = {128, 512, 4, 4, 0};
    s.projection_dim = 128;
    s.image_size = 64;
    s.patch_size = 16;
    s.bos_id = 49406;
    s.eos_id = 49407;
    s.pad_id = 49407;
    return s;
  }
  return fail(Errc::invalid_argument, "unknown CLIP preset '" + std::string(name) + "' (clip-b32, clip-test, clip-small)");
}

namespace {

Status check(const ClipWriteOptions& o) {
  const ClipShape& s = o.shape;
  auto bad = [](const std::string& m) { return fail(Errc::invalid_argument, "CLIP shape: " + m); };
  for (const auto* t : {&s.text, &s.vision}) {
    const char* which = t == &s.text ? "text" : "vision";
    if (t->hidden < 1 || t->heads < 1 || t->hidden % t->heads != 0)
      return bad(std::string(which) + ": heads must divide hidden");
    if (t->layers < 1 || t->layers > 1024) return bad(std::string(which) + ": layers must be in [1, 1024]");
    if (t->intermediate < 1) return bad(std::string(which) + ": intermediate must be >= 1");
    if (t->act != "quick_gelu" && t->act != "gelu") return bad(std::string(which) + ": act must be quick_gelu or gelu");
  }
  if (s.text.positions < 2) return bad("text positions must be >= 2");
  if (s.vocab < 3) return bad("vocab must be >= 3");
  if (s.projection_dim < 1) return bad("projection_dim must be >= 1");
  if (s.patch_size < 1 || s.image_size < s.patch_size || s.image_size % s.patch_size != 0)
    return bad("patch_size must divide image_size");
  if (s.channels < 1 || s.channels > 16) return bad("channels must be in [1, 16]");
  for (std::int32_t id : {s.bos_id, s.eos_id, s.pad_id})
    if (id < -1 || id >= s.vocab) return bad("special ids must be in [-1, vocab)");
  if (s.image_mean.size() != 3 || s.image_std.size() != 3) return bad("image_mean / image_std need 3 values");
  if (o.dtype != weights::DType::f32 && o.dtype != weights::DType::f16 && o.dtype != weights::DType::bf16)
    return bad("dtype must be f32, f16 or bf16");
  return {};
}

Status write_text(const fs::path& p, const std::string& text) { return write_text_file(p.string(), text); }

std::string floats(const std::vector<float>& v) {
  std::ostringstream o;
  o.precision(9);
  o << "[";
  for (std::size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << v[i];
  o << "]";
  return o.str();
}

std::string tower_json(const weights::ClipTowerShape& t, const std::string& extra) {
  std::ostringstream o;
  o.precision(17);
  o << "{\n    \"hidden_size\": " << t.hidden << ",\n    \"intermediate_size\": " << t.intermediate
    << ",\n    \"num_hidden_layers\": " << t.layers << ",\n    \"num_attention_heads\": " << t.heads
    << ",\n    \"hidden_act\": \"" << t.act << "\",\n    \"layer_norm_eps\": " << t.eps << extra << "\n  }";
  return o.str();
}

}  // namespace

Status write_clip_model(const std::string& dir, const ClipWriteOptions& o) {
  TANDEM_TRY(check(o));
  const ClipShape& s = o.shape;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return fail(Errc::io_error, "cannot create " + dir + ": " + ec.message());

  auto id = [](std::int32_t v) { return v >= 0 ? std::to_string(v) : std::string("null"); };
  const char* torch_dtype = o.dtype == weights::DType::f32 ? "float32" : o.dtype == weights::DType::f16 ? "float16" : "bfloat16";
  std::ostringstream cfg;
  cfg.precision(17);
  cfg << "{\n  \"architectures\": [\"CLIPModel\"],\n  \"model_type\": \"clip\",\n  \"projection_dim\": "
      << s.projection_dim << ",\n  \"logit_scale_init_value\": " << s.logit_scale_init << ",\n  \"torch_dtype\": \""
      << torch_dtype << "\",\n  \"text_config\": "
      << tower_json(s.text, ",\n    \"model_type\": \"clip_text_model\",\n    \"vocab_size\": " + std::to_string(s.vocab) +
                                ",\n    \"max_position_embeddings\": " + std::to_string(s.text.positions) +
                                ",\n    \"projection_dim\": " + std::to_string(s.projection_dim) +
                                ",\n    \"bos_token_id\": " + id(s.bos_id) + ",\n    \"eos_token_id\": " + id(s.eos_id) +
                                ",\n    \"pad_token_id\": " + id(s.pad_id))
      << ",\n  \"vision_config\": "
      << tower_json(s.vision, ",\n    \"model_type\": \"clip_vision_model\",\n    \"image_size\": " +
                                  std::to_string(s.image_size) + ",\n    \"patch_size\": " + std::to_string(s.patch_size) +
                                  ",\n    \"num_channels\": " + std::to_string(s.channels) +
                                  ",\n    \"projection_dim\": " + std::to_string(s.projection_dim))
      << "\n}\n";
  TANDEM_TRY(write_text(fs::path(dir) / "config.json", cfg.str()));

  std::ostringstream pre;
  pre << "{\n  \"crop_size\": {\"height\": " << s.image_size << ", \"width\": " << s.image_size
      << "},\n  \"do_center_crop\": true,\n  \"do_convert_rgb\": true,\n  \"do_normalize\": true,\n"
      << "  \"do_rescale\": true,\n  \"do_resize\": true,\n  \"image_mean\": " << floats(s.image_mean)
      << ",\n  \"image_std\": " << floats(s.image_std)
      << ",\n  \"image_processor_type\": \"CLIPImageProcessor\",\n  \"resample\": 3,\n"
      << "  \"rescale_factor\": 0.00392156862745098,\n  \"size\": {\"shortest_edge\": " << s.image_size << "}\n}\n";
  TANDEM_TRY(write_text(fs::path(dir) / "preprocessor_config.json", pre.str()));

  const auto required = weights::clip_required_tensors(s.config());
  std::vector<std::vector<std::byte>> storage(required.size() + 2);
  std::vector<weights::TensorToWrite> all;
  std::vector<float> vals;
  for (std::size_t ti = 0; ti < required.size(); ++ti) {
    const auto& [name, shape] = required[ti];
    std::uint64_t numel = 1;
    for (auto d : shape) numel *= static_cast<std::uint64_t>(d);
    vals.assign(numel, 0.0F);
    const bool ln = name.find("layer_norm") != std::string::npos || name.find("layrnorm") != std::string::npos ||
                    name.find("layernorm") != std::string::npos;
    if (o.source) {
      o.source(name, vals);
      if (vals.size() != numel) return fail(Errc::invalid_argument, "weight source returned a wrong size for " + name);
    } else if (name == "logit_scale") {
      vals[0] = static_cast<float>(s.logit_scale_init);
    } else {
      // Uniform, keyed by (seed, tensor index) through Philox: matrices, embeddings and biases std 0.02; layer-norm
      // weights 1 ± (std 0.1) and biases std 0.1, so a forward that ignored them would show.
      const float a = (ln ? 0.1F : 0.02F) * std::sqrt(3.0F);
      const float base = ln && name.ends_with(".weight") ? 1.0F : 0.0F;
      fill_uniform(vals, base, a, o.seed, static_cast<std::uint32_t>(ti), 0xC11F);
    }
    const weights::DType dt = name == "logit_scale" ? weights::DType::f32 : o.dtype;
    auto& buf = storage[ti];
    encode_floats(vals, dt, buf);
    all.push_back({name, dt, shape, std::span<const std::byte>(buf)});
  }
  // The position_ids buffers older transformers versions saved (int64 [1, positions]); readers ignore them.
  for (int k = 0; k < 2; ++k) {
    const std::int64_t n = k == 0 ? s.text.positions : s.config().vision.positions;
    auto& buf = storage[required.size() + static_cast<std::size_t>(k)];
    buf.resize(static_cast<std::size_t>(n) * 8);
    for (std::int64_t i = 0; i < n; ++i) std::memcpy(buf.data() + i * 8, &i, 8);
    all.push_back({k == 0 ? "text_model.embeddings.position_ids" : "vision_model.embeddings.position_ids",
                   weights::DType::i64, {1, n}, std::span<const std::byte>(buf)});
  }
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"generator", "tandem-mkmodel"}};
  return weights::write_safetensors((fs::path(dir) / "model.safetensors").string(), all, meta);
}


Result<ConvertStats> convert_clip_to_gguf(const std::string& hf_dir, const std::string& out_file, Recipe r) {
  using kernels::WType;
  using weights::GgufType;
  using weights::GgufValue;
  if (r != Recipe::f32 && r != Recipe::f16 && r != Recipe::bf16 && r != Recipe::q8_0)
    return fail(Errc::unsupported, "CLIP GGUF: type " + std::string(recipe_name(r)) + " is not supported (F32, F16, BF16, Q8_0)");
  auto text = read_text_file(hf_dir + "/config.json");
  if (!text) return fail(std::move(text).error());
  auto cfg = weights::parse_clip_config(*text, hf_dir + "/config.json");
  if (!cfg) return fail(std::move(cfg).error());
  const weights::ClipConfig& c = *cfg;
  auto st = weights::open_safetensors_weights(hf_dir);
  if (!st) return fail(std::move(st).error());
  std::optional<std::vector<std::string>> tokens;
  if (fs::is_regular_file(hf_dir + "/vocab.json")) {
    auto vt = read_text_file(hf_dir + "/vocab.json");
    if (!vt) return fail(std::move(vt).error());
    auto t = weights::clip_vocab_tokens(*vt, hf_dir + "/vocab.json");
    if (!t) return fail(std::move(t).error());
    tokens = std::move(*t);
  }
  weights::ClipConfig pc = c;
  if (fs::is_regular_file(hf_dir + "/preprocessor_config.json")) {
    auto pt = read_text_file(hf_dir + "/preprocessor_config.json");
    if (!pt) return fail(std::move(pt).error());
    TANDEM_TRY(weights::parse_clip_preprocessor(*pt, hf_dir + "/preprocessor_config.json", pc));
  }

  // Metadata in convert_image_encoder_to_gguf.py's order, then Tandem's own keys.
  weights::GgufWriter w;
  auto u32 = [](std::int64_t v) { return GgufValue::of_uint(GgufType::u32, static_cast<std::uint64_t>(v)); };
  auto f32 = [](double v) { return GgufValue::of_float(GgufType::f32, v); };
  w.set("general.architecture", GgufValue::of_string("clip"));
  w.set("clip.has_text_encoder", GgufValue::of_bool(true));
  w.set("clip.has_vision_encoder", GgufValue::of_bool(true));
  w.set("clip.has_llava_projector", GgufValue::of_bool(false));
  w.set("general.file_type", u32(static_cast<std::int64_t>(r)));
  w.set("general.name", GgufValue::of_string(fs::path(hf_dir).filename().string()));
  w.set("general.description", GgufValue::of_string("two-tower CLIP model"));
  w.set("clip.text.context_length", u32(c.text.positions));
  w.set("clip.text.embedding_length", u32(c.text.hidden));
  w.set("clip.text.feed_forward_length", u32(c.text.intermediate));
  w.set("clip.text.projection_dim", u32(c.projection_dim));
  w.set("clip.text.attention.head_count", u32(c.text.heads));
  w.set("clip.text.attention.layer_norm_epsilon", f32(c.text.eps));
  w.set("clip.text.block_count", u32(c.text.layers));
  if (tokens) w.set("tokenizer.ggml.tokens", GgufValue::of_strings(*tokens));
  w.set("clip.vision.image_size", u32(c.image_size));
  w.set("clip.vision.patch_size", u32(c.patch_size));
  w.set("clip.vision.embedding_length", u32(c.vision.hidden));
  w.set("clip.vision.feed_forward_length", u32(c.vision.intermediate));
  w.set("clip.vision.projection_dim", u32(c.projection_dim));
  w.set("clip.vision.attention.head_count", u32(c.vision.heads));
  w.set("clip.vision.attention.layer_norm_epsilon", f32(c.vision.eps));
  w.set("clip.vision.block_count", u32(c.vision.layers));
  w.set("clip.vision.image_mean", GgufValue::of_f32s(pc.image_mean));
  w.set("clip.vision.image_std", GgufValue::of_f32s(pc.image_std));
  w.set("clip.use_gelu", GgufValue::of_bool(c.vision.act == "gelu"));
  w.set("clip.text.use_gelu", GgufValue::of_bool(c.text.act == "gelu"));
  w.set("clip.text.eos_token_id", GgufValue::of_int(GgufType::i32, c.eos_id));
  w.set("clip.text.bos_token_id", GgufValue::of_int(GgufType::i32, c.bos_id));
  w.set("clip.text.legacy_eos_argmax", GgufValue::of_bool(c.legacy_eos_argmax));

  ConvertStats stats;
  const WType fallback16 = r == Recipe::bf16 ? WType::bf16 : WType::f16;
  for (const auto& [name, shape] : weights::clip_required_tensors(c)) {
    const weights::TensorView* tv = st->find(name);
    if (!tv) return fail(Errc::format_error, hf_dir + ": required tensor '" + name + "' is missing");
    if (tv->shape != shape)
      return fail(Errc::format_error, hf_dir + ": tensor '" + name + "' has the wrong shape for config.json");
    if (!tv->type_supported)
      return fail(Errc::unsupported, hf_dir + ": tensor '" + name + "' is not F32, F16 or BF16");
    if (name == "logit_scale") {
      float v = 0;
      kernels::dequantize_row(tv->type, tv->data.data(), &v, 1);
      w.set("clip.logit_scale", f32(v));
      continue;
    }
    const auto g = weights::clip_gguf_name_from_hf(name);
    if (!g) return fail(Errc::internal, "no GGUF name for CLIP tensor '" + name + "'");
    // The converter's rule: 4-D (the patch convolution) f16, 2-D .weight in the file's type, the rest f32.
    const bool matrix = shape.size() == 2 && name.ends_with(".weight");
    WType type = WType::f32;
    if (r != Recipe::f32) {
      if (shape.size() == 4) type = fallback16;
      else if (matrix) type = r == Recipe::q8_0 && (shape[1] % 32 != 0 || name.find("position_embedding") != std::string::npos)
                                  ? WType::f16
                                  : recipe_default_type(r);
    }
    TANDEM_TRY(add_converted_tensor(w, *tv, *g, type, stats));
  }
  TANDEM_TRY(w.write(out_file));
  std::error_code ec;
  stats.file_bytes = fs::file_size(out_file, ec);
  return stats;
}

Result<ClipShape> write_clip_test_model(const std::string& dir, ClipWriteOptions o, std::size_t vocab_tokens) {
  static const char* colours[] = {"red", "green", "blue", "yellow", "purple", "orange", "white", "black"};
  static const char* shapes[] = {"circle", "square", "triangle", "ring", "star"};
  std::vector<std::string> corpus;
  for (const char* col : colours)
    for (const char* sh : shapes) {
      corpus.push_back(std::string("a ") + col + " " + sh + " on a plain background");
      corpus.push_back(std::string("two ") + col + " " + sh + "s, a picture");
    }
  const tok::ClipVocab vocab = tok::train_clip_bpe(corpus, vocab_tokens);
  const int n = static_cast<int>(vocab.tokens.size());
  o.shape.vocab = n;
  o.shape.bos_id = n - 2;
  o.shape.eos_id = n - 1;
  o.shape.pad_id = n - 1;
  if (auto s = write_clip_model(dir, o); !s) return fail(s.error());
  if (auto s = tok::write_clip_tokenizer_files(dir, vocab); !s) return fail(s.error());
  return o.shape;
}

}  // namespace tandem::modelgen
